//! `audit export`: the journal for other systems, as JSON Lines or an Avro container,
//! secrets hidden.

use std::io::Write;

use ksched_core::events::JournalEntry;
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::replay::Flow;

use super::{Progress, Reporting, Source};

fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Byte arrays (payloads) as base64 strings, so exports stay readable.
fn payloads_as_base64(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, x) in map.iter_mut() {
                if k == "payload"
                    && let Value::Array(items) = x
                {
                    let bytes: Vec<u8> = items
                        .iter()
                        .filter_map(|i| i.as_u64().and_then(|u| u8::try_from(u).ok()))
                        .collect();
                    *x = Value::String(base64(&bytes));
                } else {
                    payloads_as_base64(x);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(payloads_as_base64),
        _ => {}
    }
}

/// A tagged enum value (`{"Submit": {...}}`) as `{"type": name, ...}`.
fn tagged(value: Value, name: &str) -> Value {
    let inner = match value {
        Value::Object(map) if map.len() == 1 => map.into_iter().next().map(|(_, v)| v),
        other => Some(other),
    };
    match inner {
        Some(Value::Object(mut fields)) => {
            fields.insert("type".into(), Value::String(name.to_owned()));
            Value::Object(fields)
        }
        other => json!({ "type": name, "value": other }),
    }
}

/// One journal record as exported JSON: secrets hidden, payloads base64, inputs and events
/// tagged with their record type.
pub fn entry_json(partition: i32, offset: i64, entry: &JournalEntry) -> Value {
    let e = entry.redacted();
    let input = tagged(
        serde_json::to_value(&e.input).unwrap_or(Value::Null),
        e.input.kind(),
    );
    let events: Vec<Value> = e
        .events
        .iter()
        .map(|ev| tagged(serde_json::to_value(ev).unwrap_or(Value::Null), ev.name()))
        .collect();
    let mut v = json!({
        "partition": partition,
        "offset": offset,
        "cause": { "topic": e.cause.topic, "partition": e.cause.partition, "offset": e.cause.offset },
        "log_time": e.log_time,
        "input": input,
        "events": events,
    });
    payloads_as_base64(&mut v);
    v
}

/// Writes the journal as JSON Lines; returns the number of entries.
pub fn export_jsonl(
    src: &Source,
    out: &mut dyn Write,
    progress: impl FnMut(&Progress),
) -> Result<u64> {
    let mut reporting = Reporting::start(src, progress)?;
    let (mut n, mut events) = (0, 0);
    src.read(0, |rec| {
        let line = entry_json(rec.partition, rec.offset, &rec.entry);
        writeln!(out, "{line}").map_err(crate::error::io("writing the export"))?;
        n += 1;
        events += rec.entry.events.len() as u64;
        reporting.done(n, events, rec.offset);
        Ok(Flow::Continue)
    })?;
    Ok(n)
}

/// Writes the journal as an Avro object container file (schema `io.ksched.JournalEntry`,
/// deflate), secrets hidden; returns the number of entries.
pub fn export_avro(
    src: &Source,
    out: &mut dyn Write,
    progress: impl FnMut(&Progress),
) -> Result<u64> {
    let mut reporting = Reporting::start(src, progress)?;
    let entry_schema = ksched_codec::registry()
        .current("io.ksched.JournalEntry")
        .ok_or_else(|| Error::Audit("no JournalEntry schema".into()))?
        .schema;
    let mut writer = apache_avro::Writer::with_codec(
        entry_schema,
        out,
        apache_avro::Codec::Deflate(Default::default()),
    )
    .map_err(|e| Error::Audit(format!("starting the Avro export: {e}")))?;
    writer
        .add_user_metadata("ksched.journal.topic".into(), src.topic.as_bytes())
        .map_err(|e| Error::Audit(e.to_string()))?;
    let (mut n, mut events) = (0, 0);
    src.read(0, |rec| {
        writer
            .append_ser(rec.entry.redacted())
            .map_err(|e| Error::Audit(format!("writing the Avro export: {e}")))?;
        n += 1;
        events += rec.entry.events.len() as u64;
        reporting.done(n, events, rec.offset);
        Ok(Flow::Continue)
    })?;
    writer
        .flush()
        .map_err(|e| Error::Audit(format!("writing the Avro export: {e}")))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(super::base64(input.as_bytes()), expected);
        }
    }
}
