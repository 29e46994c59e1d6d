//! ksched and a Schema Registry (docs/schema-evolution.md, "Schema Registry").
//!
//! At start, with `schema_registry.url` set, ksched registers the schema of every topic it
//! reads or writes under the configured subject naming strategy, and installs the registry
//! as the codec's source of schemas for Confluent ids it has not seen (so job records from
//! the Confluent serializers decode). With `output_format: confluent` the processor writes
//! the journal, the dispatch topics and the DLQ in the Confluent wire format with the ids
//! registered here ([`Framing`]).

use std::sync::Arc;
use std::time::Duration;

use ksched_codec::schema_registry::{RegistryError, SchemaRegistryClient};
use ksched_codec::{Framing, current_self_contained, registry, union_self_contained};
use tracing::info;

use crate::error::{Error, Result};
use crate::settings::{OutputFormat, Settings, SubjectStrategy};
use crate::topics::Topics;

/// The record types each of ksched's topics carries, in union order.
pub fn topic_records(topics: &Topics) -> Vec<(String, Vec<&'static str>)> {
    let mut out: Vec<(String, Vec<&'static str>)> = topics
        .jobs
        .iter()
        .map(|t| (t.clone(), vec!["io.ksched.JobRequest"]))
        .collect();
    out.push((
        topics.results.clone(),
        vec![
            "io.ksched.JobStarted",
            "io.ksched.JobProgress",
            "io.ksched.JobResult",
        ],
    ));
    out.push((topics.heartbeats.clone(), vec!["io.ksched.Heartbeat"]));
    out.push((
        topics.control.clone(),
        vec![
            "io.ksched.CancelJob",
            "io.ksched.ApproveJob",
            "io.ksched.RejectJob",
            "io.ksched.RedriveJob",
            "io.ksched.RescheduleJob",
            "io.ksched.ScheduleCommand",
        ],
    ));
    out.push((topics.journal.clone(), vec!["io.ksched.JournalEntry"]));
    out.push((topics.dlq.clone(), vec!["io.ksched.DeadLetter"]));
    for pool in &topics.pools {
        out.push((
            topics.dispatch(pool),
            vec!["io.ksched.Dispatch", "io.ksched.CancelDispatch"],
        ));
    }
    out
}

fn config_error(detail: String) -> Error {
    Error::Config {
        source_name: "schema_registry".into(),
        detail,
    }
}

/// The registry client of `settings`, installed as the codec's source of unknown ids; none
/// without `schema_registry.url`.
pub fn install(settings: &Settings) -> Result<Option<Arc<SchemaRegistryClient>>> {
    let sr = &settings.schema_registry;
    let Some(url) = &sr.url else {
        return Ok(None);
    };
    let userinfo = match &sr.basic_auth_file {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .map_err(|e| {
                    config_error(format!(
                        "basic_auth_file {}: cannot read it: {e}",
                        f.display()
                    ))
                })?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let client = Arc::new(SchemaRegistryClient::new(
        url,
        Duration::from_millis(sr.timeout_ms.max(1)),
        userinfo.as_deref(),
    ));
    registry().set_source(client.clone());
    Ok(Some(client))
}

/// Registers the schema of every topic ksched reads or writes (blocking), learns the ids,
/// and returns how the processor frames its outputs. Without a registry, single-object.
pub fn register(settings: &Settings, topics: &Topics) -> Result<Framing> {
    let Some(client) = install(settings)? else {
        return Ok(Framing::default());
    };
    let sr = &settings.schema_registry;
    let records = current_self_contained().map_err(|e| config_error(e.to_string()))?;
    let unreachable = |e: RegistryError| {
        config_error(format!(
            "{e}; ksched registers its schemas there at start: start the registry, or remove schema_registry.url"
        ))
    };
    let outputs: Vec<String> = [topics.journal.clone(), topics.dlq.clone()]
        .into_iter()
        .chain(topics.pools.iter().map(|p| topics.dispatch(p)))
        .collect();
    let confluent = sr.output_format == OutputFormat::Confluent;
    let mut framing = Framing::default();
    let mut registered = 0;
    for (topic, names) in topic_records(topics) {
        let written = confluent && outputs.contains(&topic);
        match sr.subject_name_strategy {
            SubjectStrategy::Topic => {
                let (schema, union) = if names.len() == 1 {
                    (records[names[0]].clone(), false)
                } else {
                    let u =
                        union_self_contained(&names).map_err(|e| config_error(e.to_string()))?;
                    (u, true)
                };
                let subject = format!("{topic}-value");
                let id = client.register(&subject, &schema).map_err(unreachable)?;
                registry()
                    .learn(id, &schema)
                    .map_err(|e| config_error(format!("subject {subject}: {e}")))?;
                registered += 1;
                if written {
                    for (i, name) in names.iter().enumerate() {
                        let branch = union.then(|| u32::try_from(i).unwrap_or(0));
                        framing.set_confluent(&topic, name, id, branch);
                    }
                }
            }
            SubjectStrategy::Record => {
                for name in names {
                    let schema = &records[name];
                    let id = client.register(name, schema).map_err(unreachable)?;
                    registry()
                        .learn(id, schema)
                        .map_err(|e| config_error(format!("subject {name}: {e}")))?;
                    registered += 1;
                    if written {
                        framing.set_confluent(&topic, name, id, None);
                    }
                }
            }
        }
    }
    info!(
        url = client.url(),
        subjects = registered,
        output_format = ?sr.output_format,
        "schemas registered"
    );
    Ok(framing)
}
