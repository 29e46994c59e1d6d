//! What the processor tells the rest of the process (health, metrics): caught up or not,
//! the journal watermark, batch and entry counters.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use ksched_core::events::JournalEntry;

/// Shared, lock-free processor status.
#[derive(Debug, Default)]
pub struct Status {
    /// Recovery finished and the processor consumes inputs.
    pub caught_up: AtomicBool,
    /// Last journal offset reflected in RocksDB (-1: none yet).
    pub watermark: AtomicI64,
    pub batches: AtomicU64,
    pub inputs: AtomicU64,
    pub events: AtomicU64,
    /// Sum of batch commit durations, in microseconds.
    pub commit_micros: AtomicU64,
}

impl Status {
    pub fn new() -> Status {
        Status {
            watermark: AtomicI64::new(-1),
            ..Status::default()
        }
    }

    pub(crate) fn record_batch(&self, _records: usize, took: Duration) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.commit_micros.fetch_add(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    pub(crate) fn record_entry(&self, entry: &JournalEntry) {
        self.inputs.fetch_add(1, Ordering::Relaxed);
        self.events
            .fetch_add(entry.events.len() as u64, Ordering::Relaxed);
    }
}
