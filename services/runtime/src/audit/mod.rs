//! Replay-based audit (SPEC §8): every answer from the journal alone, with no scheduler
//! running, and nothing ever written to a live topic.
//!
//! - [`rebuild`]: the projection from offset 0, with the same `apply` as the processor;
//!   [`compare`] checks it against a live store or checkpoint, key by key.
//! - [`verify`]: re-runs `decide` on every recorded input and checks it reproduces the
//!   recorded entry byte for byte.
//! - [`timeline`]: everything the journal says about one job.
//! - [`replay_until`]: the projection as of a time or an offset.
//! - [`what_if`]: the recorded inputs decided under other pools or another policy, or with
//!   schedules paused.
//! - [`export_jsonl`] / [`export_avro`]: the journal for other systems, secrets hidden.

use std::time::Duration;

use ksched_core::events::Cause;
use rdkafka::ClientConfig;

use crate::error::{Error, Result};
use crate::replay::{Flow, JournalRecord, journal_watermarks, read_journal};

mod export;
pub mod isolated;
mod rebuild;
mod timeline;
mod verify;
mod what_if;

pub use export::{entry_json, export_avro, export_jsonl};
pub use rebuild::{Difference, RebuildReport, compare, rebuild};
pub use timeline::{TimelineItem, Until, job_window, replay_until, timeline};
pub use verify::{Divergence, VerifyReport, verify};
pub use what_if::{
    Alternative, Outcome, PausedSchedule, TenantWaits, WaitSummary, WhatIfReport, WhatIfRow,
    what_if,
};

/// Where the journal is.
#[derive(Debug, Clone)]
pub struct Source {
    pub client: ClientConfig,
    pub topic: String,
    pub partition: i32,
}

impl Source {
    fn read(&self, from: i64, f: impl FnMut(&JournalRecord) -> Result<Flow>) -> Result<(i64, i64)> {
        read_journal(&self.client, &self.topic, self.partition, from, f)
    }

    /// The journal's end (next offset) now.
    pub fn end(&self) -> Result<i64> {
        Ok(journal_watermarks(&self.client, &self.topic, self.partition)?.1)
    }
}

/// How far a replay has come, for progress displays.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub entries: u64,
    pub events: u64,
    pub offset: i64,
    /// The journal's end when the replay started.
    pub end: i64,
    pub elapsed: Duration,
}

impl Progress {
    pub fn events_per_sec(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Estimated time left, from the offset rate so far.
    pub fn eta(&self) -> Option<Duration> {
        let done = self.offset.max(1) as f64;
        let left = (self.end - self.offset).max(0) as f64;
        (done > 0.0).then(|| Duration::from_secs_f64(self.elapsed.as_secs_f64() * left / done))
    }
}

/// Reports a replay's progress to a callback, at most twice a second.
struct Reporting<F: FnMut(&Progress)> {
    report: F,
    end: i64,
    started: std::time::Instant,
    last: std::time::Instant,
}

impl<F: FnMut(&Progress)> Reporting<F> {
    /// From now, for a replay of `src` to its current end.
    fn start(src: &Source, report: F) -> Result<Reporting<F>> {
        let now = std::time::Instant::now();
        Ok(Reporting {
            report,
            end: src.end()?,
            started: now,
            last: now,
        })
    }

    /// `entries` and `events` done, the last at `offset`.
    fn done(&mut self, entries: u64, events: u64, offset: i64) {
        if self.last.elapsed() >= Duration::from_millis(500) {
            self.last = std::time::Instant::now();
            (self.report)(&Progress {
                entries,
                events,
                offset,
                end: self.end,
                elapsed: self.started.elapsed(),
            });
        }
    }

    fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

fn partition_u16(p: i32) -> Result<u16> {
    u16::try_from(p).map_err(|_| Error::Audit(format!("journal partition {p} out of range")))
}

/// Cause of an entry, shortened for tables.
pub fn cause_text(c: &Cause) -> String {
    format!("{}/{}@{}", c.topic, c.partition, c.offset)
}
