//! Kafka client properties as Kafka's own tools take them: `-X key=value` flags and
//! `--command-config` files (`key=value` or `key: value` lines, `#` and `!` comments, a
//! trailing `\` continues a line), and which of them hold secrets.

/// Whether a librdkafka property holds a secret (passwords, keys, JAAS configs, OAuth client
/// secrets, unsecured OAUTHBEARER configs): masked wherever settings are shown (`--print-config`, `Debug`, logs).
pub fn is_secret_property(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "jaas",
        "ssl.key.pem",
        "private",
        "sasl.oauthbearer.config",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// Parses `key=value` (a `-X` flag).
pub fn parse_property(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
        _ => Err(format!("{text:?} is not key=value")),
    }
}

/// Parses the text of a properties file, in order.
pub fn parse_properties(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim_start();
        if pending.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with('!'))
        {
            continue;
        }
        if let Some(part) = line.strip_suffix('\\') {
            pending.push_str(part);
            continue;
        }
        pending.push_str(line);
        let full = std::mem::take(&mut pending);
        let at = full
            .find(['=', ':'])
            .ok_or_else(|| format!("line {}: {:?} is not key=value", n + 1, full.trim_end()))?;
        let key = full[..at].trim();
        if key.is_empty() {
            return Err(format!("line {}: a property without a key", n + 1));
        }
        out.push((key.to_owned(), full[at + 1..].trim().to_owned()));
    }
    if !pending.is_empty() {
        return Err("the last line ends with a continuation '\\'".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_properties_file_as_kafka_tools_write_it() {
        let text = "# client settings\n! also a comment\n\nsecurity.protocol=SASL_SSL\nsasl.mechanism: SCRAM-SHA-512\nsasl.username = ksched\nsasl.password=p=w:d\nssl.ca.location=/etc/\\\n  ca.pem\n";
        assert_eq!(
            parse_properties(text).unwrap(),
            [
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("sasl.username", "ksched"),
                ("sasl.password", "p=w:d"),
                ("ssl.ca.location", "/etc/ca.pem"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
    }

    #[test]
    fn a_line_without_a_value_is_refused_with_its_number() {
        let e = parse_properties("a=1\nsecurity.protocol\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        assert!(parse_properties("=x\n").is_err());
        assert!(parse_properties("a=\\").is_err());
    }

    #[test]
    fn flags_are_key_equals_value() {
        assert_eq!(
            parse_property("sasl.password=a=b").unwrap(),
            ("sasl.password".to_owned(), "a=b".to_owned())
        );
        assert!(parse_property("novalue").is_err());
        assert!(parse_property("=x").is_err());
    }

    #[test]
    fn secrets_are_recognised() {
        for k in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "sasl.jaas.config",
            "sasl.oauthbearer.client.secret",
            "ssl.key.pem",
            "SASL.PASSWORD",
        ] {
            assert!(is_secret_property(k), "{k}");
        }
        for k in [
            "security.protocol",
            "sasl.username",
            "ssl.ca.location",
            "sasl.mechanism",
            "sasl.oauthbearer.token.endpoint.url",
        ] {
            assert!(!is_secret_property(k), "{k}");
        }
    }
}
