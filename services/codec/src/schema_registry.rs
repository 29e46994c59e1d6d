//! A client of a Schema Registry's Confluent-compatible REST API (Confluent Schema Registry,
//! Apicurio's `/apis/ccompat/v7`, Karapace): register a subject's schema, fetch a schema by
//! id, check compatibility. Blocking (ureq), with a timeout on every call.
//!
//! As a [`SchemaSource`] it is what the codec asks for the schema of a Confluent id it has
//! not seen. Every caller of that path is on a hot loop (the processor decoding its inputs),
//! and every id comes from a producer, possibly a hostile one, so lookups are bounded:
//! an id the registry does not have is not asked again for [`NOT_FOUND_FOR`]; after a
//! transport failure no lookup is tried for [`DOWN_FOR`] (each fails at once as unavailable);
//! and at most [`LOOKUPS_PER_SECOND`] lookups go out in any second.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::registry::{SchemaSource, SourceError};

/// How long an id the registry does not have is answered "not found" without asking again.
pub const NOT_FOUND_FOR: Duration = Duration::from_secs(30);
/// How long after a transport failure every lookup fails at once.
pub const DOWN_FOR: Duration = Duration::from_secs(5);
/// Most lookups of unknown ids per second.
pub const LOOKUPS_PER_SECOND: u32 = 50;

/// A Schema Registry's answer or the failure to get one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("the schema registry at {url} cannot be reached: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("the schema registry refused {what}: HTTP {status}: {message}")]
    Refused {
        what: String,
        status: u16,
        message: String,
    },
}

/// Subject names per Confluent's naming strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SubjectNameStrategy {
    /// `<topic>-value`: one subject per topic (the Confluent serializers' default). A topic
    /// that carries several record types has a union of them as its schema.
    #[default]
    Topic,
    /// The record's full name, e.g. `io.ksched.Dispatch`, whatever the topic.
    Record,
}

impl SubjectNameStrategy {
    /// The subject of `record` (full Avro name) on `topic`.
    pub fn subject(self, topic: &str, record: &str) -> String {
        match self {
            SubjectNameStrategy::Topic => format!("{topic}-value"),
            SubjectNameStrategy::Record => record.to_owned(),
        }
    }
}

/// The client; cheap to share (`Arc`).
#[derive(Debug)]
pub struct SchemaRegistryClient {
    base: String,
    agent: ureq::Agent,
    authorization: Option<String>,
    lookups: Mutex<Lookups>,
}

#[derive(Debug, Default)]
struct Lookups {
    not_found: HashMap<u32, (Instant, String)>,
    down_until: Option<(Instant, String)>,
    second: Option<Instant>,
    in_second: u32,
}

impl SchemaRegistryClient {
    /// A client of the registry at `url` (e.g. `http://127.0.0.1:8081/apis/ccompat/v7`);
    /// `basic_auth` is `user:password` (Confluent's `basic.auth.user.info`).
    pub fn new(url: &str, timeout: Duration, basic_auth: Option<&str>) -> SchemaRegistryClient {
        use base64::Engine as _;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .build()
            .into();
        SchemaRegistryClient {
            base: url.trim_end_matches('/').to_owned(),
            agent,
            authorization: basic_auth.map(|userinfo| {
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(userinfo)
                )
            }),
            lookups: Mutex::new(Lookups::default()),
        }
    }

    /// The base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    fn send(&self, method: &str, path: &str, body: Option<Value>) -> Result<(u16, Value), String> {
        let url = format!("{}{path}", self.base);
        let ct = "application/vnd.schemaregistry.v1+json";
        let resp = match body {
            None => {
                let mut r = self.agent.get(&url);
                if let Some(a) = &self.authorization {
                    r = r.header("Authorization", a);
                }
                r.header("Accept", ct).call()
            }
            Some(body) => {
                let mut r = if method == "PUT" {
                    self.agent.put(&url)
                } else {
                    self.agent.post(&url)
                };
                if let Some(a) = &self.authorization {
                    r = r.header("Authorization", a);
                }
                r.header("Content-Type", ct)
                    .header("Accept", ct)
                    .send(body.to_string())
            }
        };
        let mut resp = resp.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(16 * 1024 * 1024)
            .read_to_string()
            .unwrap_or_default();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, value))
    }

    fn call(
        &self,
        what: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, RegistryError> {
        let (status, value) =
            self.send(method, path, body)
                .map_err(|detail| RegistryError::Unreachable {
                    url: self.base.clone(),
                    detail,
                })?;
        if (200..300).contains(&status) {
            return Ok(value);
        }
        Err(RegistryError::Refused {
            what: what.to_owned(),
            status,
            message: value
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| value.to_string(), str::to_owned),
        })
    }

    /// Registers `schema` (Avro JSON) under `subject`; the id the registry gives it (the
    /// existing one when the subject has that schema already).
    pub fn register(&self, subject: &str, schema: &str) -> Result<u32, RegistryError> {
        let what = format!("registering a schema under subject {subject}");
        let v = self.call(
            &what,
            "POST",
            &format!("/subjects/{}/versions", encode_path(subject)),
            Some(json!({ "schema": schema, "schemaType": "AVRO" })),
        )?;
        id_of(&v).ok_or_else(|| RegistryError::Refused {
            what,
            status: 200,
            message: format!("no schema id in the answer {v}"),
        })
    }

    /// The versions registered under `subject`.
    pub fn versions(&self, subject: &str) -> Result<Vec<u32>, RegistryError> {
        let v = self.call(
            &format!("listing the versions of subject {subject}"),
            "GET",
            &format!("/subjects/{}/versions", encode_path(subject)),
            None,
        )?;
        Ok(v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Whether `schema` is compatible with `version` (a number or `latest`) under `subject`,
    /// per the subject's compatibility level; the registry's reasons when it is not.
    pub fn compatible(
        &self,
        subject: &str,
        version: &str,
        schema: &str,
    ) -> Result<Vec<String>, RegistryError> {
        let v = self.call(
            &format!("a compatibility check against subject {subject}"),
            "POST",
            &format!(
                "/compatibility/subjects/{}/versions/{}?verbose=true",
                encode_path(subject),
                encode_path(version)
            ),
            Some(json!({ "schema": schema, "schemaType": "AVRO" })),
        )?;
        if v.get("is_compatible").and_then(Value::as_bool) == Some(true) {
            return Ok(Vec::new());
        }
        let reasons = v
            .get("messages")
            .and_then(Value::as_array)
            .map(|m| m.iter().map(|x| x.to_string()).collect::<Vec<_>>())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| vec![v.to_string()]);
        Ok(reasons)
    }

    /// Sets `subject`'s compatibility level (e.g. `BACKWARD`).
    pub fn set_compatibility(&self, subject: &str, level: &str) -> Result<(), RegistryError> {
        self.call(
            &format!("setting the compatibility of subject {subject}"),
            "PUT",
            &format!("/config/{}", encode_path(subject)),
            Some(json!({ "compatibility": level })),
        )
        .map(|_| ())
    }

    /// The schema registered under `id`, asked of the registry (no caching, no limits).
    pub fn fetch(&self, id: u32) -> Result<String, RegistryError> {
        let v = self.call(
            &format!("a lookup of schema id {id}"),
            "GET",
            &format!("/schemas/ids/{id}"),
            None,
        )?;
        if let Some(t) = v.get("schemaType").and_then(Value::as_str)
            && t != "AVRO"
        {
            return Err(RegistryError::Refused {
                what: format!("schema id {id}"),
                status: 200,
                message: format!("it is a {t} schema, not Avro"),
            });
        }
        v.get("schema")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| RegistryError::Refused {
                what: format!("a lookup of schema id {id}"),
                status: 200,
                message: format!("no schema in the answer {v}"),
            })
    }
}

impl SchemaSource for SchemaRegistryClient {
    fn schema(&self, id: u32) -> Result<String, SourceError> {
        let now = Instant::now();
        {
            let mut l = self.lookups.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((until, why)) = &l.down_until {
                if now < *until {
                    return Err(SourceError::Unavailable(format!(
                        "{why} (not tried again for {} s after a failure)",
                        DOWN_FOR.as_secs()
                    )));
                }
                l.down_until = None;
            }
            if let Some((at, why)) = l.not_found.get(&id) {
                if now.duration_since(*at) < NOT_FOUND_FOR {
                    return Err(SourceError::NotFound(why.clone()));
                }
                l.not_found.remove(&id);
            }
            if l.second
                .is_none_or(|s| now.duration_since(s) >= Duration::from_secs(1))
            {
                l.second = Some(now);
                l.in_second = 0;
            }
            if l.in_second >= LOOKUPS_PER_SECOND {
                return Err(SourceError::Unavailable(format!(
                    "more than {LOOKUPS_PER_SECOND} lookups of unknown schema ids in one second"
                )));
            }
            l.in_second += 1;
        }
        let answer = self.fetch(id);
        let mut l = self.lookups.lock().unwrap_or_else(|p| p.into_inner());
        match answer {
            Ok(schema) => Ok(schema),
            Err(RegistryError::Unreachable { url, detail }) => {
                let why = format!("the schema registry at {url} cannot be reached: {detail}");
                l.down_until = Some((Instant::now() + DOWN_FOR, why.clone()));
                Err(SourceError::Unavailable(why))
            }
            Err(RegistryError::Refused {
                status, message, ..
            }) if status == 404 || status == 200 || status == 422 => {
                let why = format!("the schema registry does not have it ({message})");
                if l.not_found.len() >= 10_000 {
                    l.not_found.clear();
                }
                l.not_found.insert(id, (now, why.clone()));
                Err(SourceError::NotFound(why))
            }
            Err(e) => Err(SourceError::Unavailable(e.to_string())),
        }
    }
}

fn id_of(v: &Value) -> Option<u32> {
    v.get("id")
        .and_then(Value::as_u64)
        .and_then(|id| u32::try_from(id).ok())
}

/// Percent-encodes a subject for a URL path (subjects are topic or record names; the
/// registry takes any string).
fn encode_path(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_follow_the_naming_strategies() {
        assert_eq!(
            SubjectNameStrategy::Topic.subject("jobs.acme", "io.ksched.JobRequest"),
            "jobs.acme-value"
        );
        assert_eq!(
            SubjectNameStrategy::Record.subject("jobs.acme", "io.ksched.JobRequest"),
            "io.ksched.JobRequest"
        );
        assert_eq!(encode_path("a b/c-d.e"), "a%20b%2Fc-d.e");
    }

    #[test]
    fn an_unreachable_registry_is_not_asked_again_at_once() {
        // Nothing listens on port 9 of loopback (discard, not served here).
        let c = SchemaRegistryClient::new("http://127.0.0.1:9", Duration::from_secs(2), None);
        let first = c.schema(7).unwrap_err();
        assert!(matches!(first, SourceError::Unavailable(_)), "{first:?}");
        let started = Instant::now();
        let second = c.schema(8).unwrap_err();
        assert!(
            matches!(&second, SourceError::Unavailable(m) if m.contains("not tried again")),
            "{second:?}"
        );
        assert!(started.elapsed() < Duration::from_millis(100));
    }
}
