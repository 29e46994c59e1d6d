//! `audit verify`: every recorded input decided again, checked against its entry.

use std::path::Path;
use std::time::Duration;

use ksched_core::decide::Ctx;
use ksched_core::events::JournalEntry;
use ksched_policy::RegoEngine;
use ksched_store::Store;

use crate::engine::Engine;
use crate::error::Result;
use crate::replay::Flow;

use super::{Progress, Reporting, Source, partition_u16};

/// A recorded entry that `decide` does not reproduce.
#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    pub offset: i64,
    pub input: String,
    pub recorded: Vec<String>,
    pub recomputed: Vec<String>,
    pub detail: String,
}

#[derive(Debug, Clone)]
pub struct VerifyReport {
    pub entries: u64,
    pub events: u64,
    pub divergences: Vec<Divergence>,
    pub elapsed: Duration,
}

fn summary(entry: &JournalEntry) -> Vec<String> {
    entry
        .events
        .iter()
        .map(|e| match e.job_id().or(e.worker_id()) {
            Some(id) => format!("{}({id})", e.name()),
            None => e.name().to_owned(),
        })
        .collect()
}

/// Where two entries first differ, for the report.
fn first_difference(recorded: &JournalEntry, recomputed: &JournalEntry) -> String {
    if recorded.events.len() != recomputed.events.len() {
        return format!(
            "{} events recorded, {} recomputed",
            recorded.events.len(),
            recomputed.events.len()
        );
    }
    for (i, (a, b)) in recorded.events.iter().zip(&recomputed.events).enumerate() {
        if a != b {
            return format!("event {i} ({}): recorded {a:?}, recomputed {b:?}", a.name());
        }
    }
    "the events are equal but their encoding differs".into()
}

/// Re-runs `decide` over every recorded input, in journal order, from the state the recorded
/// events produce, and checks that it reproduces each entry byte for byte (when the entry was
/// written with the current schema; structurally otherwise). After a divergence it continues
/// from the recorded events, so one tampered entry is reported once. `scratch` holds the
/// working projection (an empty directory).
pub fn verify(
    src: &Source,
    scratch: &Path,
    policy: &RegoEngine,
    progress: impl FnMut(&Progress),
) -> Result<VerifyReport> {
    let store = Store::open_for_rebuild(scratch, partition_u16(src.partition)?)?;
    let mut reporting = Reporting::start(src, progress)?;
    let mut engine = Engine::open(store)?;
    let mut since_persist: Vec<JournalEntry> = Vec::new();
    let mut entries = 0u64;
    let mut events = 0u64;
    let mut last_offset = None;
    let mut divergences = Vec::new();
    let ctx = Ctx { policy };
    src.read(0, |rec| {
        let recorded = &rec.entry;
        let mut recomputed = engine.decide_again(&ctx, recorded)?;
        // An entry of an older decision format is judged by its events: the format only says
        // how to apply them, and this build writes its own.
        if recorded.format < ksched_core::events::DECISION_FORMAT {
            recomputed.format = recorded.format;
        }
        let writer_is_current = ksched_codec::registry()
            .split(&rec.raw)
            .ok()
            .and_then(|(w, _)| {
                ksched_codec::registry()
                    .current(&w.name)
                    .map(|c| c.fingerprint == w.fingerprint)
            })
            .unwrap_or(false);
        let same = if writer_is_current {
            // The Avro bodies, byte for byte: the header may be single-object or Confluent
            // (`schema_registry.output_format`), the body is the same either way.
            let registry = ksched_codec::registry();
            ksched_codec::encode(&recomputed).is_ok_and(|bytes| {
                matches!(
                    (registry.split(&bytes), registry.split(&rec.raw)),
                    (Ok((_, a)), Ok((_, b))) if a == b
                )
            })
        } else {
            recomputed == *recorded
        };
        if !same {
            divergences.push(Divergence {
                offset: rec.offset,
                input: format!(
                    "{}({})",
                    recorded.input.kind(),
                    recorded.input.job_id().unwrap_or("")
                ),
                recorded: summary(recorded),
                recomputed: summary(&recomputed),
                detail: first_difference(recorded, &recomputed),
            });
            // Continue from what the journal says happened, not from what we recomputed.
            engine.reload()?;
            for e in since_persist.iter().chain(std::iter::once(recorded)) {
                engine.fold(e)?;
            }
        }
        since_persist.push(recorded.clone());
        entries += 1;
        events += recorded.events.len() as u64;
        last_offset = Some(rec.offset);
        if engine.checkpoint_due() {
            engine.checkpoint(last_offset)?;
            since_persist.clear();
        }
        reporting.done(entries, events, rec.offset);
        Ok(Flow::Continue)
    })?;
    Ok(VerifyReport {
        entries,
        events,
        divergences,
        elapsed: reporting.elapsed(),
    })
}
