//! What the processor tells the rest of the process (health, metrics): caught up or not,
//! the journal watermark, and the Prometheus metrics.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use crate::metrics::Metrics;

/// Shared processor status.
#[derive(Debug)]
pub struct Status {
    /// Recovery finished and the processor consumes inputs.
    pub caught_up: AtomicBool,
    /// Last journal offset reflected in RocksDB (-1: none yet).
    pub watermark: AtomicI64,
    /// Wall-clock ms of the last successful commit (0: none yet).
    pub last_commit_ms: AtomicI64,
    pub metrics: Metrics,
}

impl Default for Status {
    fn default() -> Self {
        Status::new()
    }
}

impl Status {
    pub fn new() -> Status {
        Status {
            caught_up: AtomicBool::new(false),
            watermark: AtomicI64::new(-1),
            last_commit_ms: AtomicI64::new(0),
            metrics: Metrics::new(),
        }
    }

    pub fn set_caught_up(&self, v: bool) {
        self.caught_up.store(v, Ordering::Relaxed);
        self.metrics.caught_up.set(if v { 1.0 } else { 0.0 });
    }

    pub fn is_caught_up(&self) -> bool {
        self.caught_up.load(Ordering::Relaxed)
    }
}
