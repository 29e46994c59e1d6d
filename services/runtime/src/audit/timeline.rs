//! `audit job` and `audit at`: one job's story, and the projection as of a moment.

use std::path::Path;

use ksched_core::events::{Event, JournalEntry};
use ksched_store::Store;

use crate::engine::Engine;
use crate::error::Result;
use crate::replay::{Flow, Replayer};

use super::{Source, partition_u16};

/// One journal entry that concerns a job.
#[derive(Debug, Clone)]
pub struct TimelineItem {
    pub offset: i64,
    pub entry: JournalEntry,
}

fn concerns(entry: &JournalEntry, job_id: &str) -> bool {
    entry.input.job_id() == Some(job_id)
        || entry.events.iter().any(|e| {
            e.job_id() == Some(job_id)
                || matches!(e, Event::JobDuplicate(d) if d.existing_job_id == job_id)
                || matches!(e, Event::WorkerLost(l) if l.job_ids.iter().any(|j| j == job_id))
        })
}

/// Every entry that concerns `job_id`, in journal order, secrets hidden; only the events of
/// each entry that concern the job are kept.
pub fn timeline(src: &Source, job_id: &str) -> Result<Vec<TimelineItem>> {
    let mut out = Vec::new();
    src.read(0, |rec| {
        if concerns(&rec.entry, job_id) {
            let mut entry = rec.entry.redacted();
            entry.events.retain(|e| {
                e.job_id() == Some(job_id)
                    || matches!(e, Event::JobDuplicate(d) if d.existing_job_id == job_id)
                    || matches!(e, Event::WorkerLost(l) if l.job_ids.iter().any(|j| j == job_id))
            });
            out.push(TimelineItem {
                offset: rec.offset,
                entry,
            });
        }
        Ok(Flow::Continue)
    })?;
    Ok(out)
}

/// Up to where a time-travel replay goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// The entry at this journal offset is the last applied.
    Offset(i64),
    /// The last entry applied is the last whose log time is at or before this (ms).
    Time(i64),
}

/// Replays into a new store at `into` up to `until`; returns the store and the last offset
/// and log time applied.
pub fn replay_until(
    src: &Source,
    into: &Path,
    until: Until,
) -> Result<(Store, Option<(i64, i64)>)> {
    let store = Store::open(into, partition_u16(src.partition)?)?;
    let mut engine = Engine::open(store)?;
    let mut r = Replayer::new(&mut engine);
    let mut last = None;
    src.read(0, |rec| {
        let past = match until {
            Until::Offset(o) => rec.offset > o,
            Until::Time(t) => rec.entry.log_time > t,
        };
        if past {
            return Ok(Flow::Stop);
        }
        r.apply(rec.offset, &rec.entry)?;
        last = Some((rec.offset, rec.entry.log_time));
        Ok(Flow::Continue)
    })?;
    r.persist()?;
    Ok((engine.into_store(), last))
}
