//! `ksched journal tail`: the journal, decoded, with secrets hidden.

use std::time::Duration;

use clap::Args;
use ksched_core::events::{Input, JournalEntry};
use ksched_runtime::tail::PartitionTail;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use serde_json::json;

use super::output::{Format, clean, time};
use super::{CliResult, EXIT_FAILED, Failure, Target};

#[derive(Debug, Args)]
pub(crate) struct TailArgs {
    /// Keep printing new entries as they are committed.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Entries to show from the end of each journal partition.
    #[arg(long, short = 'n', default_value_t = 20)]
    pub lines: i64,
    /// Start at the beginning of the journal.
    #[arg(long, conflicts_with = "lines")]
    pub from_beginning: bool,
    /// Only entries that concern this job.
    #[arg(long)]
    pub job: Option<String>,
}

fn input_summary(input: &Input) -> String {
    let key = input
        .job_id()
        .map(str::to_owned)
        .or_else(|| match input {
            Input::Heartbeat(h) => Some(h.worker_id.clone()),
            _ => None,
        })
        .unwrap_or_default();
    format!("{}({key})", input.kind())
}

fn concerns(entry: &JournalEntry, job: &str) -> bool {
    entry.input.job_id() == Some(job) || entry.events.iter().any(|e| e.job_id() == Some(job))
}

pub(crate) fn tail(t: &Target, args: TailArgs) -> CliResult {
    t.check_credentials()?;
    let topic = format!("{}journal", t.prefix);
    let fail =
        |e: rdkafka::error::KafkaError| Failure::new(EXIT_FAILED, format!("reading {topic}: {e}"));
    let consumer: BaseConsumer = t
        .client_config()
        .set("group.id", "ksched-journal-tail")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .map_err(fail)?;
    let timeout = Duration::from_secs(10);
    let meta = consumer
        .fetch_metadata(Some(&topic), timeout)
        .map_err(fail)?;
    if let Some(e) = meta.topics().first().and_then(|m| m.error()) {
        let code = rdkafka::types::RDKafkaErrorCode::from(e);
        if code == rdkafka::types::RDKafkaErrorCode::TopicAuthorizationFailed {
            return Err(Failure::new(
                EXIT_FAILED,
                format!(
                    "not authorized to read {topic} ({code}): the journal holds every tenant's history; only the processor and auditors may read it (docs/security.md)"
                ),
            ));
        }
    }
    let partitions: Vec<i32> = meta
        .topics()
        .first()
        .map(|m| m.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    if partitions.is_empty() {
        return Err(Failure::new(
            EXIT_FAILED,
            format!(
                "topic {topic} does not exist at {} (check --prefix)",
                t.bootstrap
            ),
        ));
    }
    let reader = {
        let mut c = t.client_config();
        c.set("group.id", "ksched-journal-tail");
        c
    };
    let mut tails = Vec::new();
    let mut ends = std::collections::BTreeMap::new();
    for p in &partitions {
        let (low, high) = consumer
            .fetch_watermarks(&topic, *p, timeout)
            .map_err(fail)?;
        ends.insert(*p, high);
        let start = if args.from_beginning {
            low
        } else {
            (high - args.lines.max(0)).max(low)
        };
        tails.push(
            PartitionTail::new(&reader, &topic, *p, start)
                .map_err(|e| Failure::new(EXIT_FAILED, e.to_string()))?,
        );
    }
    // Without --follow, stop at the end each partition had when we started (the last offset
    // may be a transaction marker, which is never delivered).
    let mut done: std::collections::BTreeSet<i32> = ends
        .iter()
        .filter(|(_, end)| **end == 0)
        .map(|(p, _)| *p)
        .collect();
    let wait = Duration::from_millis(300 / tails.len().max(1) as u64);
    loop {
        if !args.follow && done.len() == ends.len() {
            return Ok(());
        }
        for tail in &mut tails {
            let end = ends.get(&tail.partition()).copied().unwrap_or(0);
            let polled = tail
                .poll(wait)
                .map_err(|e| Failure::new(EXIT_FAILED, e.to_string()))?;
            let Some(m) = polled else {
                if !args.follow && tail.next_offset() >= end - 1 {
                    done.insert(tail.partition());
                }
                continue;
            };
            if !args.follow && m.offset() >= end - 1 {
                done.insert(m.partition());
                if m.offset() >= end {
                    continue;
                }
            }
            let Some(payload) = m.payload() else { continue };
            let entry = match ksched_codec::decode::<JournalEntry>(payload) {
                Ok(e) => e.redacted(),
                Err(e) => {
                    eprintln!("offset {}: cannot decode: {e}", m.offset());
                    continue;
                }
            };
            if args.job.as_ref().is_some_and(|j| !concerns(&entry, j)) {
                continue;
            }
            match t.output {
                Format::Json => println!(
                    "{}",
                    json!({ "partition": m.partition(), "offset": m.offset(), "entry": entry })
                ),
                Format::Table => {
                    let events: Vec<String> = entry
                        .events
                        .iter()
                        .map(|e| match e.job_id().or(e.worker_id()) {
                            Some(id) => format!("{}({id})", e.name()),
                            None => e.name().to_owned(),
                        })
                        .collect();
                    println!(
                        "{:>8}  {}  {:<40} -> {}",
                        m.offset(),
                        time(entry.log_time),
                        clean(&input_summary(&entry.input)),
                        if events.is_empty() {
                            "-".to_owned()
                        } else {
                            clean(&events.join(" ")).into_owned()
                        }
                    );
                }
            }
        }
    }
}
