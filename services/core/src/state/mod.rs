//! The projection: jobs, workers, queues, tenants, breakers, sagas, idempotency keys.
//!
//! `apply` (in `apply.rs`) is the only code that changes it. Queues, timers, tenant counts and
//! each worker's in-flight set are indexes derived from job records; they are maintained in one
//! place (`State::update_job`) so they can never disagree with the jobs they index.
//!
//! The state may be partial: the runtime keeps active jobs in memory and loads terminal jobs
//! and idempotency keys from RocksDB before deciding on an input that names them
//! ([`Prerequisites`]). Everything here is deterministic: no clock, and ordered maps wherever
//! an order can reach a decision or an output. The one hash map, the jobs by id ([`JobMap`]),
//! is keyed with a random seed per process and lets nothing read its order.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::events::JobState;
use crate::records::Millis;
use crate::rules::Rules;

mod backlog;
mod batches;
mod delays;
mod dependents;
mod index;
mod jobs;
mod lanes;
mod loading;
mod records;
mod schedules;
mod shares;
mod tracking;
mod waits;

pub use backlog::{Backlog, QueuedCounts, is_queued, is_resident, window_of};
pub use batches::{
    Batch, BatchKey, batch_dependency, batch_members, display_dependency, parse_batch_name,
};
pub use delays::{Coverage, DEFAULT_WINDOW, DelayKey, Delays, REFILL_CHUNK, delay_key_of};
pub use dependents::{DependentKey, Dependents, Settling, dependent_keys_of};
pub(crate) use index::Line;
pub use jobs::JobMap;
pub use lanes::{JobKey, LaneJobs, Stored, lane_keys_of};
pub use loading::{ColdStore, Prerequisites};
pub use records::*;
pub use shares::{FairKey, HeadAt, Heads, PoolShare, SHARE_UNIT, ShareKey, Turns, Walk};
pub use tracking::Dirty;
pub use waits::{DueTimer, TimerAt, WAIT_KINDS, Waits, due_of, wait_keys_of};

/// A rate limit bucket's identity: (tenant, key, rate). Jobs of one key under different
/// rates (topics sharing keys, or a rate changed) take tokens from buckets of their own.
pub type BucketKey = (String, String, crate::rules::Rate);

/// (tenant, topic, debounce key): one debounce window (SPEC §10).
pub type DebounceKey = (String, String, String);

/// A pool's lanes of one concurrency key and its limits: (pool, tenant, key and limits).
pub type KeyGroup = (String, String, KeyLimit);

/// Everything the scheduler knows.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// Log time of the last applied entry; decisions never go back in time.
    pub clock: Millis,
    /// Journal entries applied.
    pub entries: u64,
    pub config: Option<Arc<ActiveConfig>>,
    /// Boxed: the map's table holds a pointer per job instead of the whole record, which its
    /// spare slots would otherwise multiply (a backlog of a million pending jobs).
    pub jobs: JobMap,
    pub workers: BTreeMap<String, Worker>,
    pub breakers: BTreeMap<String, Breaker>,
    pub sagas: BTreeMap<String, Saga>,
    pub idempotency: BTreeMap<(String, String), IdempotencyEntry>,
    pub last_idempotency_prune: Millis,
    pub dead_letters_by_reason: BTreeMap<String, u64>,
    /// Jobs per state, over every job ever accepted (kept by transitions, so it stays right
    /// while terminal jobs live only in storage).
    pub jobs_by_state: BTreeMap<JobState, u64>,
    /// Derived: pool -> how many jobs wait in its queue (each is in one of its [`Lane`]s).
    pub queued: BTreeMap<String, u64>,
    /// Derived: the timers of jobs that are not queued, by due time.
    pub timers: BTreeSet<Timer>,
    /// Derived: queued jobs' timers (placement timeouts, deadlines, aging steps), of which
    /// memory may hold the first ones only ([`Waits`]). Aging steps are apart from the
    /// others, so that a backlog of them never stands before a deadline.
    pub waits: Waits,
    /// Derived: tenant -> SCHEDULED + DISPATCHED + RUNNING jobs.
    pub tenant_active: BTreeMap<String, i64>,
    /// The scheduler time timers and worker liveness were last judged at: the watermark of
    /// the last Tick (see [`crate::records::Tick::watermark`]). Never goes back.
    pub watermark: Millis,
    /// After a [`crate::events::ClockGap`]: evidence-based timeouts (worker loss, dispatch,
    /// running and placement timeouts) count from here at the earliest.
    pub liveness_floor: Millis,
    /// Derived: worker -> its SCHEDULED, DISPATCHED or RUNNING jobs, for workers the state
    /// has no record of (a job taken over after a rebalance before the worker's first
    /// heartbeat, or a worker that was forgotten). A worker's record takes them over when
    /// it appears, so no heartbeat ever scans the jobs.
    pub orphans: BTreeMap<String, BTreeSet<String>>,
    /// Derived: tenant -> its PENDING jobs in a queue (for the admission limit).
    pub tenant_pending: BTreeMap<String, i64>,
    /// Derived: queued jobs by the reason they wait ([`crate::reason::WaitReason`] codes;
    /// `other` for a code this build does not know), once a `JobWaiting` gave one.
    pub waiting_by_reason: BTreeMap<&'static str, i64>,
    /// Derived: pool -> worker records naming it (for `limits.max_workers_per_pool`).
    pub workers_by_pool: BTreeMap<String, u32>,
    /// Derived: pool -> lane -> its jobs in the pool's queue ([`Lane`]), of which memory may
    /// hold the first ones only ([`LaneJobs`]).
    pub lanes: BTreeMap<String, BTreeMap<Lane, LaneJobs>>,
    /// Derived: pool -> each lane's first job, by tenant and priority, in fair share order
    /// ([`Heads`]): what a scheduling pass walks. Lanes with a concurrency key stand here
    /// by their group's first job only, and not while the key is at its limit (then in
    /// `parked`).
    pub lane_heads: BTreeMap<String, Heads>,
    /// Derived: pool -> the first heads of key groups whose concurrency key is at its limit
    /// (SPEC §10): no pass looks at them until a job of the key ends, which moves them back.
    pub parked: BTreeMap<String, BTreeSet<(QueueKey, Lane)>>,
    /// Derived: tenant -> concurrency key -> its SCHEDULED + DISPATCHED + RUNNING jobs.
    pub key_active: BTreeMap<String, BTreeMap<String, i64>>,
    /// Derived: (tenant, concurrency key) -> its jobs queued or active: the live keys
    /// (`limits.max_concurrency_keys`).
    pub key_live: BTreeMap<(String, String), i64>,
    /// Derived: (pool, tenant, key, limit) -> the heads of the lanes of that concurrency
    /// key and limit in the pool; only the first of them is in `lane_heads` or `parked`.
    pub key_groups: BTreeMap<KeyGroup, BTreeSet<(QueueKey, Lane)>>,
    /// Derived: (tenant, concurrency key) -> the (pool, limits) of each of its groups.
    pub groups_of_key: BTreeMap<(String, String), BTreeSet<(String, KeyLimit)>>,
    /// (tenant, key, rate) -> the key's token bucket under that rate, while it is not
    /// full (SPEC §10).
    pub buckets: BTreeMap<BucketKey, Bucket>,
    /// Derived: when each bucket next frees or fills ([`Bucket::next_change`]), which the
    /// first entry at or after that time acts on.
    pub bucket_changes: BTreeSet<(Millis, BucketKey)>,
    /// (pool, priority rank) -> its fair share between tenants ([`PoolShare`], SPEC §10).
    pub shares: BTreeMap<ShareKey, PoolShare>,
    /// Open debounce windows (SPEC §10), until a Tick reaches their due time.
    pub debounces: BTreeMap<DebounceKey, Debounce>,
    /// Derived: open debounce windows by due time.
    pub debounces_due: BTreeSet<(Millis, DebounceKey)>,
    /// Pools with a lane moved out of `parked` by the entry being decided, which the decider
    /// then passes over. Bookkeeping of one entry: cleared at the next, not projected.
    pub woken: BTreeSet<String>,
    /// Derived: DELAYED jobs by due time, those the window reaches ([`Delays`]); the rest
    /// are in storage. A cache of what the jobs say: not part of the projection's equality.
    pub delays: Delays,
    /// Derived: BLOCKED jobs by the jobs they wait for, those whose records memory holds
    /// ([`Dependents`]); the rest are in storage. A cache of what the jobs say: not part of
    /// the projection's equality.
    pub dependents: Dependents,
    /// Ended jobs that are waited for, until every job waiting for them has been told of
    /// their end (SPEC §11).
    pub settling: BTreeMap<String, Settling>,
    /// Jobs that began settling in the entry being decided (bookkeeping of one entry).
    pub fresh_settling: BTreeSet<String>,
    /// Batches open, or ended within `limits.batch_retention_ms` (SPEC §11): all in memory,
    /// at most `limits.max_batches` a shard.
    pub batches: BTreeMap<BatchKey, Batch>,
    /// Derived: batches by when a Tick next acts on them ([`Batch::due`]).
    pub batches_due: BTreeSet<(Millis, BatchKey)>,
    /// Schedules by [`crate::schedule::schedule_key`] (all in memory: at most
    /// `limits.max_schedules` a shard).
    pub schedules: BTreeMap<String, Schedule>,
    /// Derived: active schedules by their next firing.
    pub schedules_due: BTreeSet<(Millis, String)>,
    /// Derived: active schedules with a firing waiting for their previous run (BUFFER_ONE).
    pub schedules_buffered: BTreeSet<String>,
    /// Queued records that may leave memory, and lanes whose windows may need reading back
    /// ([`Backlog`]): bookkeeping of what memory holds, not part of the projection.
    pub backlog: Backlog,
    /// Changed keys, when the owner tracks them (the runtime does; tests and audits need not).
    pub dirty: Option<Dirty>,
    /// Terminal jobs in memory, which [`State::evict_cold`] may drop (bookkeeping, like
    /// `dirty`: not part of the projection).
    cold: BTreeSet<String>,
}

impl PartialEq for State {
    /// Projection equality: everything but the dirty-key bookkeeping.
    fn eq(&self, other: &Self) -> bool {
        self.clock == other.clock
            && self.entries == other.entries
            && self.config == other.config
            && self.jobs == other.jobs
            && self.workers == other.workers
            && self.breakers == other.breakers
            && self.sagas == other.sagas
            && self.schedules == other.schedules
            && self.idempotency == other.idempotency
            && self.last_idempotency_prune == other.last_idempotency_prune
            && self.watermark == other.watermark
            && self.liveness_floor == other.liveness_floor
            && self.orphans == other.orphans
            && self.tenant_pending == other.tenant_pending
            && self.waiting_by_reason == other.waiting_by_reason
            && self.workers_by_pool == other.workers_by_pool
            && self.lanes == other.lanes
            && self.lane_heads == other.lane_heads
            && self.parked == other.parked
            && self.key_active == other.key_active
            && self.key_live == other.key_live
            && self.key_groups == other.key_groups
            && self.groups_of_key == other.groups_of_key
            && self.buckets == other.buckets
            && self.bucket_changes == other.bucket_changes
            && self.shares == other.shares
            && self.debounces == other.debounces
            && self.debounces_due == other.debounces_due
            && self.settling == other.settling
            && self.batches == other.batches
            && self.batches_due == other.batches_due
            && self.dead_letters_by_reason == other.dead_letters_by_reason
            && self.jobs_by_state == other.jobs_by_state
            && self.queued == other.queued
            && self.timers == other.timers
            && self.waits == other.waits
            && self.tenant_active == other.tenant_active
    }
}

impl State {
    pub fn new() -> State {
        State::default()
    }

    /// A state that records which keys change, for incremental persistence.
    pub fn tracking_changes() -> State {
        State {
            dirty: Some(Dirty::default()),
            ..State::default()
        }
    }

    pub fn rules(&self) -> Option<&Rules> {
        self.config.as_deref().map(|c| &c.rules)
    }

    /// Opens (or moves on) the debounce window of `key`.
    pub(crate) fn open_debounce(&mut self, key: DebounceKey, window: Debounce) {
        if let Some(old) = self.debounces.get(&key) {
            self.debounces_due.remove(&(old.due, key.clone()));
        }
        self.debounces_due.insert((window.due, key.clone()));
        self.mark_debounce(&key);
        self.debounces.insert(key, window);
    }

    /// Closes every debounce window due by `through`.
    pub(crate) fn close_debounces(&mut self, through: Millis) {
        while let Some((due, key)) = self.debounces_due.first().cloned() {
            if due > through {
                break;
            }
            self.debounces_due.pop_first();
            self.debounces.remove(&key);
            self.mark_debounce(&key);
        }
    }

    /// Files the debounce windows loaded from storage by due time.
    pub fn index_debounces(&mut self) {
        self.debounces_due = (self.debounces.iter())
            .map(|(k, d)| (d.due, k.clone()))
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse() {
        assert_eq!(parse_bytes("512"), Some(512));
        assert_eq!(parse_bytes("2Ki"), Some(2048));
        assert_eq!(parse_bytes("1.5Gi"), Some(1_610_612_736));
        assert_eq!(parse_bytes("3M"), Some(3_000_000));
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(parse_bytes("-1"), None);
    }
}
