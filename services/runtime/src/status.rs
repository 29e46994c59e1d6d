//! What the processor tells the rest of the process (health, metrics, the ticker): caught up
//! or not, stopped for good (fenced, replaced) or not, when it last judged time, the journal
//! watermark, and the Prometheus metrics.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use crate::metrics::Metrics;
use crate::processor::wall_clock_ms;

/// Shared processor status.
#[derive(Debug)]
pub struct Status {
    /// Recovery finished and the processor consumes inputs.
    pub caught_up: AtomicBool,
    /// Last journal offset reflected in RocksDB (-1: none yet).
    pub watermark: AtomicI64,
    /// Wall-clock ms of the last successful commit (0: none yet).
    pub last_commit_ms: AtomicI64,
    /// Wall-clock ms when the processor last judged a Tick (0: none yet). A processor that
    /// reads no Ticks is cut off from the log (or its ticker is), and is not ready.
    pub last_tick_ms: AtomicI64,
    /// This instance owns its shard and runs the processor; false while it stands by
    /// (`processor.lease`). True until a lease says otherwise.
    owner: AtomicBool,
    /// Why the processor stopped for good, once it has (another instance took over).
    stopped: Mutex<Option<String>>,
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
            last_tick_ms: AtomicI64::new(0),
            owner: AtomicBool::new(true),
            stopped: Mutex::new(None),
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

    pub fn set_owner(&self, v: bool) {
        self.owner.store(v, Ordering::Relaxed);
        self.metrics.shard_owner.set(i64::from(v));
    }

    pub fn is_owner(&self) -> bool {
        self.owner.load(Ordering::Relaxed)
    }

    pub fn tick_processed(&self) {
        self.last_tick_ms.store(wall_clock_ms(), Ordering::Relaxed);
    }

    /// Milliseconds since the processor last judged a Tick, if it ever did.
    pub fn since_last_tick_ms(&self) -> Option<i64> {
        let t = self.last_tick_ms.load(Ordering::Relaxed);
        (t > 0).then(|| wall_clock_ms().saturating_sub(t))
    }

    /// Marks the processor stopped for good, with the reason operators will read.
    pub fn set_stopped(&self, why: String) {
        self.set_caught_up(false);
        self.metrics.stopped.set(1);
        if let Ok(mut s) = self.stopped.lock() {
            s.get_or_insert(why);
        }
    }

    /// Why the processor stopped for good, if it did.
    pub fn stopped(&self) -> Option<String> {
        self.stopped.lock().ok().and_then(|s| s.clone())
    }
}
