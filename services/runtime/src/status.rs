//! What the processor tells the rest of the process (health, metrics, the ticker): caught up
//! or not, stopped for good (fenced, replaced) or not, when it last judged time, the journal
//! watermark, and the Prometheus metrics.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use crate::clock::wall_clock_ms;
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
    /// Wall-clock ms when the processor last judged a Tick (0: none yet). A processor that
    /// reads no Ticks is cut off from the log (or its ticker is), and is not ready.
    pub last_tick_ms: AtomicI64,
    /// This instance owns its shard and runs the processor; false while it stands by
    /// (`processor.lease`). True until a lease says otherwise.
    owner: AtomicBool,
    /// This instance stands by for the shard (tails its journal) while another owns it
    /// (`processor.standby_replicas`).
    standby: AtomicBool,
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
        Status::for_shard(None)
    }

    /// The status of one shard's processor; its metrics carry the shard's label when given.
    pub fn for_shard(shard: Option<i32>) -> Status {
        Status {
            caught_up: AtomicBool::new(false),
            watermark: AtomicI64::new(-1),
            last_commit_ms: AtomicI64::new(0),
            last_tick_ms: AtomicI64::new(0),
            owner: AtomicBool::new(true),
            standby: AtomicBool::new(false),
            stopped: Mutex::new(None),
            metrics: Metrics::for_shard(shard),
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

    pub fn set_standby(&self, v: bool) {
        self.standby.store(v, Ordering::Relaxed);
        self.metrics.shard_standby.set(i64::from(v));
    }

    pub fn is_standby(&self) -> bool {
        self.standby.load(Ordering::Relaxed)
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

/// The statuses of an instance's shards (index = shard), for what speaks for the whole
/// instance: health, the ticker, the metrics.
#[derive(Debug, Clone)]
pub struct Shards(pub Vec<Arc<Status>>);

impl Shards {
    /// `count` shards; with more than one, each one's metrics carry its `shard` label.
    pub fn new(count: i32) -> Shards {
        let labelled = count > 1;
        Shards(
            (0..count.max(1))
                .map(|s| Arc::new(Status::for_shard(labelled.then_some(s))))
                .collect(),
        )
    }

    /// One shard's status (shard 0's when out of range).
    pub fn get(&self, shard: i32) -> &Arc<Status> {
        usize::try_from(shard)
            .ok()
            .and_then(|s| self.0.get(s))
            .unwrap_or(&self.0[0])
    }

    fn owned(&self) -> impl Iterator<Item = &Arc<Status>> {
        self.0.iter().filter(|s| s.is_owner())
    }

    /// This instance runs the processor of at least one shard.
    pub fn is_owner(&self) -> bool {
        self.owned().next().is_some()
    }

    /// Every shard this instance owns has recovered and reads its inputs; owning none, every
    /// shard it stands by for has been read to the end of its journal (an instance that
    /// neither owns nor stands by for any shard has nothing to catch up).
    pub fn is_caught_up(&self) -> bool {
        if self.is_owner() {
            self.owned().all(|s| s.is_caught_up())
        } else {
            self.0
                .iter()
                .filter(|s| s.is_standby())
                .all(|s| s.is_caught_up())
        }
    }

    /// Why a shard's processor stopped for good, if one did.
    pub fn stopped(&self) -> Option<String> {
        self.0.iter().find_map(|s| s.stopped())
    }

    /// Milliseconds since the owned shard that judged a Tick longest ago did; None while
    /// one of them has judged none.
    pub fn since_last_tick_ms(&self) -> Option<i64> {
        let mut worst = None;
        for s in self.owned() {
            let ms = s.since_last_tick_ms()?;
            worst = Some(worst.map_or(ms, |w: i64| w.max(ms)));
        }
        worst
    }

    /// The shards this instance runs the processor of.
    pub fn owned_ids(&self) -> Vec<usize> {
        (0..self.0.len())
            .filter(|i| self.0[*i].is_owner())
            .collect()
    }

    /// The shards this instance stands by for.
    pub fn standby_ids(&self) -> Vec<usize> {
        (0..self.0.len())
            .filter(|i| !self.0[*i].is_owner() && self.0[*i].is_standby())
            .collect()
    }

    /// Each shard's journal watermark.
    pub fn watermarks(&self) -> Vec<i64> {
        self.0
            .iter()
            .map(|s| s.watermark.load(Ordering::Relaxed))
            .collect()
    }

    /// Every shard's metrics in one exposition.
    pub fn render_metrics(&self) -> String {
        crate::metrics::render_all(self.0.iter().map(|s| &s.metrics))
    }
}
