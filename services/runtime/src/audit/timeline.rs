//! `audit job` and `audit at`: one job's story, and the projection as of a moment.

use std::path::Path;

use ksched_core::events::{Event, JournalEntry};
use ksched_store::Store;

use crate::engine::Engine;
use crate::error::Result;
use crate::replay::{Flow, JournalRecord, Replayer};

use super::{Source, partition_u16};

/// One journal entry that concerns a job.
#[derive(Debug, Clone)]
pub struct TimelineItem {
    pub offset: i64,
    pub entry: JournalEntry,
}

/// Whether `e` is about `job_id` (its own event, or one naming it).
fn about(e: &Event, job_id: &str) -> bool {
    e.job_id() == Some(job_id)
        || matches!(e, Event::JobDuplicate(d) if d.existing_job_id == job_id)
        || matches!(e, Event::WorkerLost(l) if l.job_ids.iter().any(|j| j == job_id))
        || matches!(e, Event::JobRedriven(r) if r.new_job_id == job_id)
}

/// The record as a timeline item of `job_id` (its events about the job only, secrets
/// hidden), if it concerns the job.
fn item(rec: &JournalRecord, job_id: &str) -> Option<TimelineItem> {
    let entry = &rec.entry;
    if entry.input.job_id() != Some(job_id) && !entry.events.iter().any(|e| about(e, job_id)) {
        return None;
    }
    let mut entry = entry.redacted();
    entry.events.retain(|e| about(e, job_id));
    Some(TimelineItem {
        offset: rec.offset,
        entry,
    })
}

/// Every entry that concerns `job_id`, in journal order, secrets hidden; only the events of
/// each entry that concern the job are kept.
pub fn timeline(src: &Source, job_id: &str) -> Result<Vec<TimelineItem>> {
    let mut out = Vec::new();
    src.read(0, |rec| {
        out.extend(item(rec, job_id));
        Ok(Flow::Continue)
    })?;
    Ok(out)
}

/// [`timeline`], read only from around the job's acceptance to its last change (a margin of
/// `margin_ms` either side, the broker's record times), and at most `max_entries` entries
/// read: the console's job page, which must not read the whole journal for every view.
/// Returns the items and whether the read stopped at `max_entries`.
pub fn job_window(
    src: &Source,
    job_id: &str,
    from_ms: i64,
    until_ms: i64,
    margin_ms: i64,
    max_entries: usize,
) -> Result<(Vec<TimelineItem>, bool)> {
    let start = offset_at(src, from_ms.saturating_sub(margin_ms))?;
    let mut out = Vec::new();
    let mut read = 0usize;
    let mut cut = false;
    src.read(start, |rec| {
        read += 1;
        if rec.entry.log_time > until_ms.saturating_add(margin_ms) {
            return Ok(Flow::Stop);
        }
        if read > max_entries {
            cut = true;
            return Ok(Flow::Stop);
        }
        out.extend(item(rec, job_id));
        Ok(Flow::Continue)
    })?;
    Ok((out, cut))
}

/// The first journal offset whose record time is at or after `ms` (the end if none).
fn offset_at(src: &Source, ms: i64) -> Result<i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = crate::replay::with_reader_group(&src.client)
        .create()
        .map_err(crate::error::kafka("creating a journal reader"))?;
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(
        &src.topic,
        src.partition,
        rdkafka::Offset::Offset(ms.max(0)),
    )
    .map_err(crate::error::kafka("building an offset query"))?;
    let found = consumer
        .offsets_for_times(tpl, std::time::Duration::from_secs(10))
        .map_err(crate::error::kafka(
            "looking up the journal offset of a time",
        ))?;
    let offset = found
        .elements()
        .first()
        .map(|e| e.offset())
        .unwrap_or(rdkafka::Offset::End);
    match offset {
        rdkafka::Offset::Offset(o) => Ok(o),
        // No record that late: nothing to read.
        _ => src.end(),
    }
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
    let store = Store::open_for_rebuild(into, partition_u16(src.partition)?)?;
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
    // Not flushed: the callers read it and drop their scratch directory.
    Ok((engine.into_store()?, last))
}
