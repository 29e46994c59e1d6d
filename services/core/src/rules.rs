//! The settings decisions depend on: routing (topics -> pools), strategies, timeouts,
//! retries, thresholds, breaker tuning, tenant limits.
//!
//! Rules reach the core only through the journal (a `Reconfigure` input), so a replay or an
//! audit decides with exactly the rules that were in force. The runtime builds them from
//! `config/pools.yaml` and `config/ksched.yaml`; `to_canonical_json` is what is journaled.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How a pool picks workers (SPEC §3.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StrategyKind {
    /// Lowest `active_jobs + cpu/100 + gpu/100`; ties to the lowest worker_id.
    #[default]
    LeastLoaded,
    /// Credit-based: a worker takes at most `max_parallel_jobs - active_jobs` jobs; the worker
    /// with the most credit wins.
    Throttled,
    /// Best-fit bin-packing of the job's `memory` label against the worker's free memory.
    Capacity,
}

impl StrategyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StrategyKind::LeastLoaded => "least_loaded",
            StrategyKind::Throttled => "throttled",
            StrategyKind::Capacity => "capacity",
        }
    }
}

/// One worker pool.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolRules {
    /// Capabilities the pool offers; a job is eligible only if every capability in its
    /// `meta.requires` is listed here (case-insensitive).
    pub requires: Vec<String>,
    /// Worker selection strategy for this pool.
    pub strategy: StrategyKind,
    /// Worker ids that may heartbeat for this pool: exact ids or patterns with `*` (any
    /// characters), e.g. `gpu-*`. A heartbeat from any other id is refused
    /// (`invalid_heartbeat`). Empty: any id.
    pub workers: Vec<String>,
    /// The shard (journal partition) that schedules this pool. None: a stable hash of the
    /// pool's name ([`shard_of_pool`]). Left out of the journaled rules when not set, so
    /// rules written before shards existed keep their id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
    /// Priority aging (SPEC §10): a job queued here that has waited `after` gains one
    /// priority, and one more for each `after` it waits on, up to `up_to`. None: jobs keep
    /// their priority. Left out of the journaled rules when not set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aging: Option<AgingRule>,
}

/// A pool's priority aging (SPEC §10), so that no job waits for ever behind a stream of
/// jobs of higher priority: a BATCH job that has waited `after` in the queue goes on as
/// INTERACTIVE, and after twice `after` as CRITICAL (unless `up_to` stops it sooner). It
/// keeps its place by age, so it runs before the jobs of its new priority queued after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgingRule {
    /// How long a job waits for each priority it gains: a span, `30s`, `5m`; at least 1s.
    pub after: String,
    /// The highest priority aging gives. Default CRITICAL.
    #[serde(default = "AgingRule::default_up_to")]
    pub up_to: crate::records::Priority,
}

impl AgingRule {
    /// The shortest `after`: each step is a journaled event per waiting job.
    pub const MIN_AFTER_MS: i64 = 1_000;

    fn default_up_to() -> crate::records::Priority {
        crate::records::Priority::Critical
    }

    /// `after` in milliseconds (0 if it is not valid; validation refuses that).
    pub fn after_ms(&self) -> i64 {
        span_ms(&self.after)
    }

    fn check(&self, pool: &str) -> Result<(), RulesError> {
        parse_period_ms(&self.after)
            .map_err(|e| RulesError(format!("pool {pool}: aging after {e}")))?;
        if self.after_ms() < Self::MIN_AFTER_MS {
            return Err(RulesError(format!(
                "pool {pool}: aging after {:?} must be at least 1s",
                self.after
            )));
        }
        Ok(())
    }
}

/// Limits for one tenant. Under `tenants`, the entry `"*"` holds the defaults for every
/// tenant (listed or not) that does not set a limit itself.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantRules {
    /// Most SCHEDULED + DISPATCHED + RUNNING jobs at once; a policy constraint overrides it.
    pub max_concurrent_jobs: Option<i32>,
    /// Most PENDING jobs queued at once; overrides `limits.max_pending_per_tenant`.
    pub max_pending_jobs: Option<i64>,
    /// The tenant's weight in each pool's fair share (SPEC §10): tenants with jobs waiting
    /// at one priority are placed in proportion to their weights. 1 to
    /// [`MAX_SHARE_WEIGHT`]; default 1. Left out of the journaled rules when not set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// The largest fair share weight a tenant may have.
pub const MAX_SHARE_WEIGHT: u32 = 1_000;

/// Timers (all in milliseconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Timing {
    /// A job still unplaced this long after it was queued is dead-lettered. Default 5 min.
    pub placement_timeout_ms: i64,
    /// A worker without a heartbeat for this long is lost. Default 15 s.
    pub worker_ttl_ms: i64,
    /// DISPATCHED without a JobStarted for this long times out. Default 60 s.
    pub dispatch_timeout_ms: i64,
    /// RUNNING without progress or heartbeat evidence for this long times out. Default 5 min.
    pub running_timeout_ms: i64,
    /// How long an idempotency key is remembered. Default 7 days.
    pub idempotency_retention_ms: i64,
    /// A jump of scheduler time (the Tick watermark) larger than this means inputs could not
    /// be read in between (broker outage, scheduler down, a partition without a leader):
    /// evidence-based timeouts then count from after the jump (a `ClockGap`). Must be below
    /// `worker_ttl_ms` and well above the tick interval. Default 5 s.
    pub clock_gap_ms: i64,
    /// A lost worker's record is dropped this long after its last heartbeat. Default 1 h.
    pub worker_retention_ms: i64,
    /// A schedule's firing is on time while scheduler time is at most this far past it; an
    /// older one was missed (ksched down, the schedule paused) and its catch-up policy
    /// decides. Default 30 s.
    pub schedule_grace_ms: i64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            placement_timeout_ms: 5 * 60_000,
            worker_ttl_ms: 15_000,
            dispatch_timeout_ms: 60_000,
            running_timeout_ms: 5 * 60_000,
            idempotency_retention_ms: 7 * 24 * 3_600_000,
            clock_gap_ms: 5_000,
            worker_retention_ms: 3_600_000,
            schedule_grace_ms: 30_000,
        }
    }
}

/// Retries of FAILED_RETRYABLE attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryRules {
    /// Retries after the first attempt, unless policy sets `max_retries`. Default 3.
    pub max_retries: i32,
    /// Backoff before the first retry, in ms. Default 1000.
    pub initial_backoff_ms: i64,
    /// Backoff cap, in ms. Default 30000.
    pub max_backoff_ms: i64,
    /// Jitter added on top of the backoff, as a fraction of it (0.0-1.0), derived from
    /// job_id and attempt so replays agree. Default 0.2.
    pub jitter_ratio: f64,
}

impl Default for RetryRules {
    fn default() -> Self {
        RetryRules {
            max_retries: 3,
            initial_backoff_ms: 1_000,
            max_backoff_ms: 30_000,
            jitter_ratio: 0.2,
        }
    }
}

/// When a worker counts as overloaded and is skipped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Overload {
    /// Percent; a worker at or above it is skipped. Default 90.
    pub cpu_load: f64,
    /// Percent; a worker at or above it is skipped. Default 90.
    pub gpu_utilization: f64,
}

impl Default for Overload {
    fn default() -> Self {
        Overload {
            cpu_load: 90.0,
            gpu_utilization: 90.0,
        }
    }
}

/// Circuit breaker per pool (SPEC §5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerRules {
    /// Opens after this many consecutive failed or timed-out results. Default 5.
    pub consecutive_failures: i32,
    /// Opens when the failure ratio over the last `window` results reaches this. Default 0.5.
    pub failure_ratio: f64,
    /// Results the ratio is computed over; the ratio applies once the window is full.
    /// Default 20.
    pub window: i32,
    /// How long it stays open before half-opening, in ms. Default 30000.
    pub cooldown_ms: i64,
    /// Probe jobs let through while half-open. Default 3.
    pub half_open_probes: i32,
    /// Probe successes that close it. Default 2.
    pub close_after_successes: i32,
}

impl Default for BreakerRules {
    fn default() -> Self {
        BreakerRules {
            consecutive_failures: 5,
            failure_ratio: 0.5,
            window: 20,
            cooldown_ms: 30_000,
            half_open_probes: 3,
            close_after_successes: 2,
        }
    }
}

/// Bounds on what one input may carry or cause, so that no input can exhaust memory or
/// produce a record the broker refuses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest input record (its value, as read from Kafka), in bytes; checked by the
    /// processor before it decodes anything, a larger record is dead-lettered
    /// `record_too_large`. It must leave room for a journal entry's events under the
    /// journal topic's `max.message.bytes` (checked at start). Default 524288 (512 KiB).
    pub max_record_bytes: i64,
    /// Largest job payload, in bytes. Default 262144 (256 KiB).
    pub max_payload_bytes: i64,
    /// Most labels on a job. Default 64.
    pub max_labels: i32,
    /// Most env entries on a job. Default 64.
    pub max_env: i32,
    /// Largest label or env key or value, in bytes. Default 4096.
    pub max_entry_bytes: i64,
    /// Most units of work (a placement, a timeout, a lost worker, a retry) one journal entry
    /// does; more continues in the next entry. Default 100.
    pub max_work_per_entry: u32,
    /// Keys of each queue lane, and of each kind of queued timer, held in memory (at least
    /// `max_work_per_entry + 2`: the lane's window and one more): an index whose first keys
    /// in memory grow past twice this is cut back to this many, and one with fewer than the
    /// window and one left reads this many more back from RocksDB. Default 256.
    pub lane_keys_in_memory: u32,
    /// Most PENDING jobs queued in one pool; a job beyond it is dead-lettered `queue_full`.
    /// Default 1000000.
    pub max_pending_per_pool: i64,
    /// Most PENDING jobs queued for one tenant (a tenant's own `max_pending_jobs` overrides
    /// it); none: no limit. Default none.
    pub max_pending_per_tenant: Option<i64>,
    /// Interpreter steps one evaluation of the input or output policy may take; beyond it
    /// the evaluation stops and the job is dead-lettered `policy_limit_exceeded`. Counted,
    /// not timed, so a replay or `audit verify` decides the same. Default 1000000.
    pub policy_max_steps: u32,
    /// Bytes one evaluation of a policy may allocate beyond what the process held when it
    /// began; beyond it the evaluation stops (`policy_limit_exceeded`). Enforced where the
    /// binary counts its allocations (`ksched` does); measured, not counted, so `audit
    /// verify` may disagree with a recorded stop (docs/audit.md). Default 67108864 (64 MiB).
    pub policy_max_memory_bytes: i64,
    /// Most worker records one pool holds (alive, or lost and not yet forgotten); a
    /// heartbeat from a new worker id beyond it is refused (`invalid_heartbeat`), so a
    /// producer of heartbeats cannot grow memory without end. Default 10000.
    pub max_workers_per_pool: u32,
    /// Most jobs a heartbeat may list as running (`active_job_ids`). Default 1000.
    pub max_active_job_ids: u32,
    /// Most bytes of text a heartbeat carries (worker id, labels, capabilities, the running
    /// jobs it lists): a worker's record is kept in memory, so a pool's workers hold at most
    /// `max_workers_per_pool` times this. Default 16384.
    pub max_heartbeat_bytes: u32,
    /// Most lanes of queued jobs one scheduling pass holds in a pool (jobs that could not be
    /// placed, one look per lane: jobs alike in tenant, limit, pools, placement labels,
    /// preferred worker and memory are one lane); the lanes behind wait for the next pass.
    /// Each look asks every worker of the pool. Default 100.
    pub max_scan_per_entry: u32,
    /// Furthest a job's `not_before` may lie ahead of its acceptance (or of a reschedule),
    /// in ms; beyond it the job is dead-lettered `delay_too_long` (a reschedule refused).
    /// Default 31622400000 (366 days).
    pub max_delay_ms: i64,
    /// Most DELAYED jobs one shard holds (they are kept in storage, not in memory); a
    /// delayed job beyond it is dead-lettered `queue_full`. Default 100000000.
    pub max_delayed_jobs: i64,
    /// Most schedules one shard holds (they are kept in memory, with their job templates).
    /// Default 100000.
    pub max_schedules: u32,
    /// Most concurrency keys with jobs queued or active at once in one shard (each costs a
    /// counter and a lane); a job that would bring one more is dead-lettered `queue_full`.
    /// Rate limit buckets not yet full, and debounce windows open, are bounded by it too,
    /// each kind on its own. Default 100000.
    pub max_concurrency_keys: u32,
    /// Most jobs one job may depend on (`depends_on`, SPEC §11); more is dead-lettered
    /// `invalid_dependencies`. Default 100.
    pub max_dependencies: u32,
    /// Longest a job waits BLOCKED for its dependencies, in ms, and the default of its
    /// `dependency_timeout_ms`; a longer timeout is dead-lettered `invalid_dependencies`.
    /// Default 604800000 (7 days).
    pub max_dependency_wait_ms: i64,
    /// Most BLOCKED jobs one shard holds (they are kept in storage, not in memory); a job
    /// that would wait beyond it is dead-lettered `queue_full`. Default 10000000.
    pub max_blocked_jobs: i64,
    /// Most batches one shard holds, open or ended within `batch_retention_ms` (they are
    /// kept in memory, a record of counts each); a member that would open one more is
    /// dead-lettered `queue_full`. Default 100000.
    pub max_batches: u32,
    /// Most members one batch may have (`batch_size`); more is dead-lettered
    /// `invalid_batch`. Default 1000000.
    pub max_batch_size: i32,
    /// How long an ended batch stays queryable (and refuses late members), in ms.
    /// Default 604800000 (7 days).
    pub batch_retention_ms: i64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_record_bytes: 512 * 1024,
            max_payload_bytes: 256 * 1024,
            max_labels: 64,
            max_env: 64,
            max_entry_bytes: 4096,
            max_work_per_entry: 100,
            lane_keys_in_memory: 256,
            max_pending_per_pool: 1_000_000,
            max_pending_per_tenant: None,
            policy_max_steps: 1_000_000,
            policy_max_memory_bytes: 64 * 1024 * 1024,
            max_workers_per_pool: 10_000,
            max_active_job_ids: 1_000,
            max_heartbeat_bytes: 16 * 1024,
            max_scan_per_entry: 100,
            max_delay_ms: 366 * 24 * 3_600_000,
            max_delayed_jobs: 100_000_000,
            max_schedules: 100_000,
            max_concurrency_keys: 100_000,
            max_dependencies: 100,
            max_dependency_wait_ms: 7 * 24 * 3_600_000,
            max_blocked_jobs: 10_000_000,
            max_batches: 100_000,
            max_batch_size: 1_000_000,
            batch_retention_ms: 7 * 24 * 3_600_000,
        }
    }
}

/// Everything a decision depends on besides state, input and policy.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Rules {
    /// Job topic -> pools, in preference order.
    pub topics: BTreeMap<String, Vec<String>>,
    /// Job topic -> the tenants its jobs may name. A topic listed here carries only those
    /// tenants' jobs, and their job ids must start with `<tenant_id>:`, so a tenant cannot
    /// take another's ids: with Kafka ACLs letting each tenant write only its own topics, the
    /// topic is the tenant's identity. A topic not listed carries any tenant.
    pub topic_tenants: BTreeMap<String, Vec<String>>,
    /// Job topic -> the principal that produces it (its Kafka identity, which the topic's
    /// ACL lets write it alone): a job on it names that principal as its submitter, or names
    /// none and is given it; a job naming another is refused. What four eyes compares an
    /// approver with. Left out of the journaled rules when empty.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub topic_principals: BTreeMap<String, String>,
    /// Job topic -> the concurrency limit of its jobs' keys (SPEC §10). Left out of the
    /// journaled rules when empty.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub topic_concurrency: BTreeMap<String, ConcurrencyRule>,
    /// Job topic -> its unique jobs rule (SPEC §10): one job per key and window. Left out
    /// of the journaled rules when empty.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub topic_unique: BTreeMap<String, UniqueRule>,
    /// Job topic -> its debounce rule (SPEC §10): jobs of one key close together collapse
    /// into the last. Left out of the journaled rules when empty.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub topic_debounce: BTreeMap<String, DebounceRule>,
    pub pools: BTreeMap<String, PoolRules>,
    pub tenants: BTreeMap<String, TenantRules>,
    pub timing: Timing,
    pub retry: RetryRules,
    pub overload: Overload,
    pub breaker: BreakerRules,
    pub limits: Limits,
    /// Pool -> partitions of its dispatch topic, as the runtime found them at start: a
    /// heartbeat claiming a partition outside is refused. Empty: not checked.
    pub dispatch_partitions: BTreeMap<String, i32>,
    /// The number of shards (journal partitions) the rules were put in force with: what
    /// tells, at the next start, which shard took which job topic then. None in rules
    /// journaled before it was recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
    /// Four eyes: an approval or rejection by the principal that submitted the job is
    /// refused (`four_eyes`), whichever way the control record came. The runtime sets it
    /// from `http.four_eyes` (default on); rules journaled before it existed read as off.
    pub four_eyes: bool,
}

/// A job topic's flow limits per key (SPEC §10): at most `limit` jobs of one key
/// SCHEDULED, DISPATCHED or RUNNING at once, and at most `rate` of them placed per period;
/// the others wait (`concurrency_limited`, `rate_limited`), in queue order. Keys are a
/// tenant's own: two tenants' jobs never share one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencyRule {
    /// Where a job's key comes from: `label:NAME` (the job's label NAME: the policy's if it
    /// adds one, else its own; a job without it, or with it empty, has no key) or
    /// `tenant` (one key for all of the tenant's jobs on such topics). Default
    /// `label:concurrency_key`.
    #[serde(default = "ConcurrencyRule::default_key")]
    pub key: String,
    /// Most jobs of one key at once, at least 1 (1: one at a time, in queue order). None:
    /// no such limit (then `rate` must be given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Most placements of one key's jobs per period, `N/PERIOD` (`100/s`, `600/1m`,
    /// `5/10s`, `1/h`): a token bucket in log time. Every placement takes a token, a
    /// retry's too. None: no rate limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// Most placements at once after the key was idle (the bucket's size); default N, one
    /// period's worth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// Fair share between the keys of one tenant (SPEC §10): within the tenant's share of
    /// a pool at a priority, its keys take turns (the key placed least lately first), not
    /// oldest job first, so one key's backlog does not hold the tenant's other keys behind
    /// it. Needs a `label:` key. Left out of the journaled rules when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fair: bool,
}

impl ConcurrencyRule {
    /// The label a key comes from when a rule names none.
    pub const DEFAULT_LABEL: &str = "concurrency_key";

    fn default_key() -> String {
        format!("label:{}", Self::DEFAULT_LABEL)
    }

    /// The label the key comes from; None for `tenant`.
    pub fn label(&self) -> Option<&str> {
        self.key.strip_prefix("label:")
    }

    /// The rule's rate limit, if it has a valid one.
    pub fn rate_limit(&self) -> Option<Rate> {
        Rate::parse(self.rate.as_deref()?, self.burst).ok()
    }

    fn check(&self, topic: &str) -> Result<(), RulesError> {
        let valid = key_is_label_or(&self.key, "tenant");
        if !valid {
            return Err(RulesError(format!(
                "topic {topic}: concurrency key {:?} must be `label:NAME` or `tenant`",
                self.key
            )));
        }
        if self.limit == Some(0) {
            return Err(RulesError(format!(
                "topic {topic}: concurrency limit must be at least 1"
            )));
        }
        if self.fair && self.label().is_none() {
            return Err(RulesError(format!(
                "topic {topic}: fair share between keys needs a `label:NAME` key (a `tenant` key is one key a tenant)"
            )));
        }
        match &self.rate {
            Some(rate) => {
                Rate::parse(rate, self.burst)
                    .map_err(|e| RulesError(format!("topic {topic}: rate {rate:?}: {e}")))?;
            }
            None if self.burst.is_some() => {
                return Err(RulesError(format!("topic {topic}: a burst needs a rate")));
            }
            None if self.limit.is_none() && !self.fair => {
                return Err(RulesError(format!(
                    "topic {topic}: concurrency needs a limit, a rate, fair share between keys, or more than one"
                )));
            }
            None => {}
        }
        Ok(())
    }
}

/// Unique jobs on a topic (SPEC §10): a job whose key a job of the same tenant on the
/// same topic was accepted with less than `for` ago is refused as a duplicate
/// (`JobDuplicate`, kind `UNIQUE_KEY`), whatever became of that first job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UniqueRule {
    /// Where the key comes from: `label:NAME` (the job's own label NAME; a job without it,
    /// or with it empty, is not held to the rule) or `payload` (the SHA-256 of the payload:
    /// one job per distinct payload). Default `label:unique_key`.
    #[serde(default = "UniqueRule::default_key")]
    pub key: String,
    /// How long a key stays taken after the job that took it was accepted: a span, `30s`,
    /// `10m`, `24h`; at most `timing.idempotency_retention_ms`.
    #[serde(rename = "for")]
    pub window: String,
}

impl UniqueRule {
    /// The label a key comes from when a rule names none.
    pub const DEFAULT_LABEL: &str = "unique_key";

    fn default_key() -> String {
        format!("label:{}", Self::DEFAULT_LABEL)
    }

    /// The rule's window in milliseconds (0 if it is not valid; validation refuses that).
    pub fn window_ms(&self) -> i64 {
        span_ms(&self.window)
    }

    /// The unique key of a job with `labels` and payload digest `digest`, if it has one.
    pub fn key_of(
        &self,
        labels: &BTreeMap<String, String>,
        digest: impl FnOnce() -> String,
    ) -> Option<String> {
        if self.key == "payload" {
            return Some(format!("payload:{}", digest()));
        }
        let name = self.key.strip_prefix("label:")?;
        labels
            .get(name)
            .filter(|v| !v.is_empty())
            .map(|v| format!("label:{v}"))
    }

    fn check(&self, topic: &str, retention_ms: i64) -> Result<(), RulesError> {
        let valid = key_is_label_or(&self.key, "payload");
        if !valid {
            return Err(RulesError(format!(
                "topic {topic}: unique key {:?} must be `label:NAME` or `payload`",
                self.key
            )));
        }
        let window = parse_period_ms(&self.window)
            .map_err(|e| RulesError(format!("topic {topic}: unique for {e}")))?;
        if window < 1 || window > u64::try_from(retention_ms).unwrap_or(0) {
            return Err(RulesError(format!(
                "topic {topic}: unique for {:?} must be at least 1ms and at most timing.idempotency_retention_ms ({retention_ms} ms), which keeps the keys",
                self.window
            )));
        }
        Ok(())
    }
}

/// Debounced jobs on a topic (SPEC §10): a job with a key waits `wait` (DELAYED); one of
/// the same tenant, topic and key accepted while it waits replaces it (the waiting job is
/// cancelled) and waits `wait` from its own acceptance, but no longer than `max_wait` from
/// the acceptance of the first job of the run, so a steady stream still runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DebounceRule {
    /// Where the key comes from: `label:NAME` (the job's own label NAME; a job without it,
    /// or with it empty, is not debounced) or `tenant` (one key for the tenant's jobs on
    /// the topic). Default `label:debounce_key`.
    #[serde(default = "DebounceRule::default_key")]
    pub key: String,
    /// How long a job waits for a later one to replace it: a span, `500ms`, `5s`, `1m`.
    pub wait: String,
    /// The longest a run of replacements may hold its key's work back, from the first
    /// job's acceptance: at least `wait`. Default ten times `wait`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<String>,
}

impl DebounceRule {
    /// The label a key comes from when a rule names none.
    pub const DEFAULT_LABEL: &str = "debounce_key";

    fn default_key() -> String {
        format!("label:{}", Self::DEFAULT_LABEL)
    }

    /// `wait` in milliseconds (0 if it is not valid; validation refuses that).
    pub fn wait_ms(&self) -> i64 {
        span_ms(&self.wait)
    }

    /// `max_wait` in milliseconds, ten times `wait` when not given.
    pub fn max_wait_ms(&self) -> i64 {
        match &self.max_wait {
            Some(text) => span_ms(text),
            None => self.wait_ms().saturating_mul(10),
        }
    }

    /// The debounce key of a job with `labels`, if it has one (`""` for `tenant`).
    pub fn key_of(&self, labels: &BTreeMap<String, String>) -> Option<String> {
        match self.key.strip_prefix("label:") {
            None => Some(String::new()),
            Some(name) => labels.get(name).filter(|v| !v.is_empty()).cloned(),
        }
    }

    fn check(&self, topic: &str, max_delay_ms: i64) -> Result<(), RulesError> {
        let valid = key_is_label_or(&self.key, "tenant");
        if !valid {
            return Err(RulesError(format!(
                "topic {topic}: debounce key {:?} must be `label:NAME` or `tenant`",
                self.key
            )));
        }
        for (what, text) in [
            ("wait", Some(&self.wait)),
            ("max_wait", self.max_wait.as_ref()),
        ] {
            if let Some(text) = text {
                parse_period_ms(text)
                    .map_err(|e| RulesError(format!("topic {topic}: debounce {what} {e}")))?;
            }
        }
        let (wait, max_wait) = (self.wait_ms(), self.max_wait_ms());
        if wait < 1 {
            return Err(RulesError(format!(
                "topic {topic}: debounce wait must be at least 1ms"
            )));
        }
        if max_wait < wait || max_wait > max_delay_ms {
            return Err(RulesError(format!(
                "topic {topic}: debounce max_wait ({max_wait} ms) must be at least its wait ({wait} ms) and at most limits.max_delay_ms ({max_delay_ms} ms)"
            )));
        }
        Ok(())
    }
}

/// Whether a rule's `key` is `label:NAME` (a name not blank) or `other`.
fn key_is_label_or(key: &str, other: &str) -> bool {
    key == other || (key.strip_prefix("label:")).is_some_and(|l| !l.trim().is_empty())
}

fn span_ms(text: &str) -> i64 {
    parse_period_ms(text)
        .ok()
        .and_then(|ms| i64::try_from(ms).ok())
        .unwrap_or(0)
}

/// A rate limit (SPEC §10): at most `count` placements per `per_ms` milliseconds, and at
/// most `burst` at once after an idle spell: a token bucket, kept as the time its next
/// token is due (GCRA), in log time, so replay decides as live did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Rate {
    pub count: u32,
    pub per_ms: u64,
    pub burst: u32,
}

impl Rate {
    /// The longest period a rate may name, and the longest a bucket takes to fill
    /// (burst × period / N): one week.
    pub const MAX_PERIOD_MS: u64 = 7 * 24 * 3_600_000;
    /// The largest burst.
    pub const MAX_BURST: u32 = 1_000_000;

    /// Reads `N/PERIOD` (`PERIOD`: an optional whole number and a unit of `ms`, `s`, `m`,
    /// `min`, `h`; `100/s` is `100/1s`), with `burst` (default N).
    pub fn parse(text: &str, burst: Option<u32>) -> Result<Rate, String> {
        let form = "write it N/PERIOD, as 100/s, 600/1m, 5/10s or 1/h";
        let (count, period) = text.trim().split_once('/').ok_or(form)?;
        let count: u32 = count.trim().parse().map_err(|_| form)?;
        let per_ms = parse_period_ms(period).map_err(|_| form)?;
        if count < 1 || per_ms < 1 {
            return Err("N and the period must be at least 1".to_owned());
        }
        if per_ms > Self::MAX_PERIOD_MS {
            return Err("the period may be a week at most".to_owned());
        }
        if u64::from(count) > per_ms.saturating_mul(1_000) {
            return Err("at most one placement a microsecond".to_owned());
        }
        let burst = burst.unwrap_or(count.min(Self::MAX_BURST));
        if !(1..=Self::MAX_BURST).contains(&burst) {
            return Err(format!("the burst must be 1 to {}", Self::MAX_BURST));
        }
        let rate = Rate {
            count,
            per_ms,
            burst,
        };
        // A bucket is remembered until it is full again: burst tokens' time at most.
        let span_ms = rate.interval_us().saturating_mul(i64::from(burst)) / 1_000;
        if span_ms > i64::try_from(Self::MAX_PERIOD_MS).unwrap_or(i64::MAX) {
            return Err(format!(
                "a burst of {burst} takes {span_ms} ms to fill at this rate; a week at most"
            ));
        }
        Ok(rate)
    }

    /// Microseconds between two tokens, rounded up (a rate is never exceeded).
    pub fn interval_us(&self) -> i64 {
        let us = i64::try_from(self.per_ms.saturating_mul(1_000)).unwrap_or(i64::MAX);
        let count = i64::from(self.count.max(1));
        (us + count - 1) / count
    }

    /// How far ahead of the next token's time a placement may take one: the burst less one,
    /// in tokens' time.
    pub fn tolerance_us(&self) -> i64 {
        self.interval_us()
            .saturating_mul(i64::from(self.burst.max(1) - 1))
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let per = match self.per_ms {
            ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
            ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
            ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
            ms => format!("{ms}ms"),
        };
        write!(f, "{}/{per}, burst {}", self.count, self.burst)
    }
}

/// Reads a span of time written as an optional whole number and a unit: `ms`, `s`/`sec`,
/// `m`/`min`, `h`/`hour` (`s` is `1s`; `90s`, `10m`, `24h`), in milliseconds.
pub fn parse_period_ms(text: &str) -> Result<u64, String> {
    let form = || format!("{text:?}: write a span as 500ms, 30s, 10m or 24h");
    let period = text.trim();
    let unit_at = period
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(form)?;
    let (n, unit) = period.split_at(unit_at);
    let n: u64 = if n.is_empty() {
        1
    } else {
        n.parse().map_err(|_| form())?
    };
    let unit_ms = match unit {
        "ms" => 1,
        "s" | "sec" => 1_000,
        "m" | "min" => 60_000,
        "h" | "hour" => 3_600_000,
        _ => return Err(form()),
    };
    Ok(n.saturating_mul(unit_ms))
}

/// A rule set that does not hold together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid rules: {0}")]
pub struct RulesError(pub String);

impl Rules {
    /// Checks cross-field rules; the error says what to fix.
    pub fn validate(&self) -> Result<(), RulesError> {
        let err = |m: String| Err(RulesError(m));
        for (topic, pools) in &self.topics {
            if pools.is_empty() {
                return err(format!("topic {topic} maps to no pool"));
            }
            for p in pools {
                if !self.pools.contains_key(p) {
                    return err(format!(
                        "topic {topic} maps to pool {p}, which is not defined under pools"
                    ));
                }
            }
        }
        for (topic, pools) in &self.topics {
            // A job stands at one priority in all its pools: their aging must agree.
            let aging = |p: &String| self.pools.get(p).and_then(|r| r.aging.as_ref());
            if let Some(p) = pools.iter().find(|p| aging(p) != aging(&pools[0])) {
                return err(format!(
                    "topic {topic} maps to pools {} and {p} with different aging rules; a job stands at one priority in all its pools: give them the same `aging`",
                    pools[0]
                ));
            }
        }
        for (topic, rule) in &self.topic_concurrency {
            if !self.topics.contains_key(topic) {
                return err(format!(
                    "topic {topic} has a concurrency limit but maps to no pool"
                ));
            }
            rule.check(topic)?;
        }
        for (topic, rule) in &self.topic_unique {
            if !self.topics.contains_key(topic) {
                return err(format!(
                    "topic {topic} has a unique rule but maps to no pool"
                ));
            }
            rule.check(topic, self.timing.idempotency_retention_ms)?;
        }
        for (topic, rule) in &self.topic_debounce {
            if !self.topics.contains_key(topic) {
                return err(format!(
                    "topic {topic} has a debounce rule but maps to no pool"
                ));
            }
            rule.check(topic, self.limits.max_delay_ms)?;
        }
        for (topic, tenants) in &self.topic_tenants {
            if !self.topics.contains_key(topic) {
                return err(format!("topic {topic} lists tenants but maps to no pool"));
            }
            if tenants.is_empty() {
                return err(format!(
                    "topic {topic} lists no tenant: leave `tenants` out to allow any"
                ));
            }
            if let Some(t) = tenants.iter().find(|t| !valid_tenant_id(t)) {
                return err(format!(
                    "topic {topic}: tenant {t:?} must be non-empty and must not contain ':' or '*'"
                ));
            }
        }
        for (topic, principal) in &self.topic_principals {
            if !self.topics.contains_key(topic) {
                return err(format!(
                    "topic {topic} names a principal but maps to no pool"
                ));
            }
            if principal.trim().is_empty() || principal.chars().any(char::is_control) {
                return err(format!(
                    "topic {topic}: principal {principal:?} must be non-empty, without control characters"
                ));
            }
        }
        if let Some(t) = self
            .tenants
            .keys()
            .find(|t| t.as_str() != "*" && !valid_tenant_id(t))
        {
            return err(format!(
                "tenant {t:?} must be non-empty and must not contain ':' or '*' (\"*\" alone holds the defaults)"
            ));
        }
        for (t, rules) in &self.tenants {
            if let Some(w) = rules.weight
                && !(1..=MAX_SHARE_WEIGHT).contains(&w)
            {
                return err(format!(
                    "tenant {t}: weight {w} must be from 1 to {MAX_SHARE_WEIGHT}"
                ));
            }
        }
        for (name, pool) in &self.pools {
            if let Some(p) = pool.workers.iter().find(|p| p.trim().is_empty()) {
                return err(format!("pool {name}: worker pattern {p:?} is empty"));
            }
            if let Some(aging) = &pool.aging {
                aging.check(name)?;
            }
        }
        for name in self.pools.keys() {
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return err(format!(
                    "pool name {name:?} must be non-empty and use only letters, digits, '-', '_' or '.' (it names a topic)"
                ));
            }
        }
        let t = &self.timing;
        for (name, v) in [
            ("timing.placement_timeout_ms", t.placement_timeout_ms),
            ("timing.worker_ttl_ms", t.worker_ttl_ms),
            ("timing.dispatch_timeout_ms", t.dispatch_timeout_ms),
            ("timing.running_timeout_ms", t.running_timeout_ms),
            (
                "timing.idempotency_retention_ms",
                t.idempotency_retention_ms,
            ),
            ("timing.clock_gap_ms", t.clock_gap_ms),
            ("timing.worker_retention_ms", t.worker_retention_ms),
            ("retry.initial_backoff_ms", self.retry.initial_backoff_ms),
            ("retry.max_backoff_ms", self.retry.max_backoff_ms),
            ("breaker.cooldown_ms", self.breaker.cooldown_ms),
        ] {
            if v <= 0 {
                return err(format!("{name} must be positive, got {v}"));
            }
        }
        if t.clock_gap_ms >= t.worker_ttl_ms {
            return err(format!(
                "timing.clock_gap_ms ({}) must be below timing.worker_ttl_ms ({}): a gap that long already looks like a lost worker",
                t.clock_gap_ms, t.worker_ttl_ms
            ));
        }
        let l = &self.limits;
        if l.max_record_bytes < 1024 {
            return err(format!(
                "limits.max_record_bytes must be at least 1024, got {}",
                l.max_record_bytes
            ));
        }
        if l.max_payload_bytes < 0
            || l.max_labels < 0
            || l.max_env < 0
            || l.max_entry_bytes < 1
            || l.max_work_per_entry < 1
            || l.lane_keys_in_memory < 1
            || l.max_pending_per_pool < 1
            || l.max_pending_per_tenant.is_some_and(|n| n < 1)
        {
            return err(
                "limits: sizes and counts must not be negative; max_entry_bytes, max_work_per_entry, lane_keys_in_memory and the pending limits must be at least 1"
                    .into(),
            );
        }
        if l.max_workers_per_pool < 1 {
            return err("limits.max_workers_per_pool must be at least 1".into());
        }
        if l.max_concurrency_keys < 1 {
            return err("limits.max_concurrency_keys must be at least 1".into());
        }
        if l.max_scan_per_entry < 1 {
            return err("limits.max_scan_per_entry must be at least 1".into());
        }
        if l.max_delay_ms < 0 {
            return err("limits.max_delay_ms must not be negative".into());
        }
        if l.max_delayed_jobs < 0 {
            return err("limits.max_delayed_jobs must not be negative".into());
        }
        if l.max_dependency_wait_ms < 1 || l.max_blocked_jobs < 0 {
            return err(format!(
                "limits.max_dependency_wait_ms must be positive and limits.max_blocked_jobs not negative, got {} and {}",
                l.max_dependency_wait_ms, l.max_blocked_jobs
            ));
        }
        if l.max_batch_size < 1 || l.batch_retention_ms < 0 {
            return err(format!(
                "limits.max_batch_size must be at least 1 and limits.batch_retention_ms not negative, got {} and {}",
                l.max_batch_size, l.batch_retention_ms
            ));
        }
        if self.timing.schedule_grace_ms < 0 {
            return err("timing.schedule_grace_ms must not be negative".into());
        }
        if l.policy_max_steps < 1 || l.policy_max_memory_bytes < 1024 * 1024 {
            return err(format!(
                "limits.policy_max_steps must be at least 1 and limits.policy_max_memory_bytes at least 1 MiB, got {} and {}",
                l.policy_max_steps, l.policy_max_memory_bytes
            ));
        }
        for (pool, n) in &self.dispatch_partitions {
            if *n < 1 {
                return err(format!("dispatch topic of pool {pool} has {n} partitions"));
            }
        }
        if self.retry.max_retries < 0 {
            return err("retry.max_retries must be 0 or more".into());
        }
        if self.retry.max_backoff_ms < self.retry.initial_backoff_ms {
            return err("retry.max_backoff_ms must be at least retry.initial_backoff_ms".into());
        }
        if !(0.0..=1.0).contains(&self.retry.jitter_ratio) {
            return err("retry.jitter_ratio must be between 0 and 1".into());
        }
        let b = &self.breaker;
        if b.consecutive_failures < 1 || b.window < 1 || b.half_open_probes < 1 {
            return err(
                "breaker.consecutive_failures, breaker.window and breaker.half_open_probes must be at least 1"
                    .into(),
            );
        }
        if b.close_after_successes < 1 || b.close_after_successes > b.half_open_probes {
            return err(
                "breaker.close_after_successes must be between 1 and breaker.half_open_probes"
                    .into(),
            );
        }
        if !(0.0..=1.0).contains(&b.failure_ratio) || b.failure_ratio == 0.0 {
            return err("breaker.failure_ratio must be in (0, 1]".into());
        }
        Ok(())
    }

    /// The journaled form: deterministic JSON (maps are ordered).
    pub fn to_canonical_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| unreachable!("rules serialize: {e}"))
    }

    pub fn from_json(json: &str) -> Result<Rules, RulesError> {
        serde_json::from_str(json).map_err(|e| RulesError(e.to_string()))
    }

    /// Pools a topic maps to, in preference order.
    pub fn pools_for_topic(&self, topic: &str) -> Option<&[String]> {
        self.topics.get(topic).map(Vec::as_slice)
    }

    pub fn strategy(&self, pool: &str) -> StrategyKind {
        self.pools.get(pool).map(|p| p.strategy).unwrap_or_default()
    }

    /// Whether queued jobs stand in the queues differently under `new` than under these
    /// rules: their concurrency keys, limits and rates (lanes), their aging timers, or how
    /// much of each lane memory holds (`max_work_per_entry`, `lane_keys_in_memory`) differ.
    /// Nothing else of the rules is part of a queued job's index entries, so other new rules
    /// (timeouts, retries, breakers, overload, tenants' weights and limits, routing, strategy)
    /// leave the backlog as it is, in memory and in storage.
    pub fn reindex_queued(&self, new: &Rules) -> bool {
        let aging = |r: &Rules| -> Vec<(String, AgingRule)> {
            (r.pools.iter())
                .filter_map(|(p, rules)| Some((p.clone(), rules.aging.clone()?)))
                .collect()
        };
        let windows = |r: &Rules| (r.limits.max_work_per_entry, r.limits.lane_keys_in_memory);
        self.topic_concurrency != new.topic_concurrency
            || aging(self) != aging(new)
            || windows(self) != windows(new)
    }

    /// The aging rule a job queued in `pools` ages by (a topic's pools agree on it: the
    /// first of them that has one).
    pub fn aging_of(&self, pools: &[String]) -> Option<&AgingRule> {
        (pools.iter()).find_map(|p| self.pools.get(p).and_then(|r| r.aging.as_ref()))
    }

    /// A tenant limit: the tenant's own, else the `"*"` default.
    fn tenant_limit<T>(
        &self,
        tenant: &str,
        limit: impl Fn(&TenantRules) -> Option<T>,
    ) -> Option<T> {
        self.tenants
            .get(tenant)
            .and_then(&limit)
            .or_else(|| self.tenants.get("*").and_then(&limit))
    }

    /// Most PENDING jobs `tenant` may have queued, if limited.
    pub fn max_pending_for_tenant(&self, tenant: &str) -> Option<i64> {
        self.tenant_limit(tenant, |t| t.max_pending_jobs)
            .or(self.limits.max_pending_per_tenant)
    }

    /// The concurrency key and limit of a job on `topic` (SPEC §10), its labels read through
    /// `label` (the policy's, then the job's own): None when the topic has no limit or the
    /// job lacks (or leaves empty) the label its key comes from. A `tenant` key is `""`,
    /// which no label gives.
    pub fn concurrency_of<'a>(
        &self,
        topic: &str,
        label: impl Fn(&str) -> Option<&'a str>,
    ) -> Option<crate::state::KeyLimit> {
        let rule = self.topic_concurrency.get(topic)?;
        let key = match rule.label() {
            None => String::new(),
            Some(name) => label(name).filter(|v| !v.is_empty())?.to_owned(),
        };
        Some(crate::state::KeyLimit {
            key,
            limit: rule.limit.unwrap_or(u32::MAX),
            rate: rule.rate_limit(),
            fair: rule.fair,
        })
    }

    /// `tenant`'s weight in a pool's fair share: its own, else the `"*"` default, else 1
    /// (never 0, even in rules that were not validated).
    pub fn share_weight(&self, tenant: &str) -> u32 {
        self.tenant_limit(tenant, |t| t.weight).unwrap_or(1).max(1)
    }

    /// Most SCHEDULED + DISPATCHED + RUNNING jobs `tenant` may have, if limited.
    pub fn max_concurrent_for_tenant(&self, tenant: &str) -> Option<i32> {
        self.tenant_limit(tenant, |t| t.max_concurrent_jobs)
    }

    /// Why a job on `topic` may not name `tenant` with `job_id`, if it may not (the topic is
    /// bound to other tenants, or the id is not in the tenant's namespace).
    pub fn tenant_not_allowed(&self, topic: &str, tenant: &str, job_id: &str) -> Option<String> {
        let allowed = self.topic_tenants.get(topic)?;
        if !allowed.iter().any(|t| t == tenant) {
            return Some(format!(
                "topic {topic} carries jobs of tenants [{}] only; job {job_id} names tenant {tenant:?}",
                allowed.join(", ")
            ));
        }
        let in_namespace = job_id
            .strip_prefix(tenant)
            .and_then(|rest| rest.strip_prefix(':'))
            .is_some_and(|rest| !rest.is_empty());
        (!in_namespace).then(|| {
            format!(
                "job ids on topic {topic} are namespaced by tenant: {job_id:?} must start with \"{tenant}:\""
            )
        })
    }

    /// The principal a job on `topic` is submitted by, if the topic names one, or why the
    /// job may not claim the principal it names.
    pub fn bound_principal(
        &self,
        topic: &str,
        claimed: Option<&str>,
    ) -> Result<Option<&str>, String> {
        let Some(bound) = self.topic_principals.get(topic) else {
            return Ok(None);
        };
        match claimed {
            None => Ok(Some(bound)),
            Some(c) if c == bound => Ok(Some(bound)),
            Some(c) => Err(format!(
                "topic {topic} is produced by principal {bound}; a job on it may not name {:?} as its submitter",
                crate::records::truncate_for_display(c, 64)
            )),
        }
    }

    /// Whether `worker_id` may heartbeat for `pool` (its `workers` patterns).
    pub fn worker_allowed(&self, pool: &str, worker_id: &str) -> bool {
        self.pools
            .get(pool)
            .is_none_or(|p| p.workers.is_empty() || p.workers.iter().any(|w| glob(w, worker_id)))
    }
}

/// The shard that schedules `pool` among `shards`: its explicit `shard`, else the first four
/// bytes of the SHA-256 of its name (big-endian) modulo `shards`; 0 with one shard. Stable across versions and
/// machines: `ksched shards` prints the map.
pub fn shard_of_pool(rules: &Rules, pool: &str, shards: u32) -> u32 {
    if shards <= 1 {
        return 0;
    }
    if let Some(s) = rules.pools.get(pool).and_then(|p| p.shard) {
        return s;
    }
    let digest = crate::hash::sha256_hex(pool.as_bytes());
    let head = u32::from_str_radix(&digest[..8], 16).unwrap_or(0);
    head % shards
}

/// The shard that takes a job topic's jobs: the shard of its pools (which must agree,
/// [`check_shards`]). None for a topic that is not routed.
pub fn shard_of_topic(rules: &Rules, topic: &str, shards: u32) -> Option<u32> {
    let pools = rules.topics.get(topic)?;
    pools.first().map(|p| shard_of_pool(rules, p, shards))
}

/// Checks the rules against `shards` shards: every explicit `shard` is one of them, and every
/// job topic's pools are scheduled by one shard (a job is decided by one processor, which
/// must hold every pool it may be placed in).
pub fn check_shards(rules: &Rules, shards: u32) -> Result<(), RulesError> {
    for (name, pool) in &rules.pools {
        if let Some(s) = pool.shard
            && s >= shards.max(1)
        {
            return Err(RulesError(format!(
                "pool {name}: shard {s} is not one of the {shards} shards (topics.journal_partitions); shards are numbered from 0"
            )));
        }
    }
    for (topic, pools) in &rules.topics {
        let mut by_shard: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
        for p in pools {
            by_shard
                .entry(shard_of_pool(rules, p, shards))
                .or_default()
                .push(p);
        }
        if by_shard.len() > 1 {
            let spread: Vec<String> = by_shard
                .iter()
                .map(|(s, ps)| format!("shard {s}: {}", ps.join(", ")))
                .collect();
            return Err(RulesError(format!(
                "topic {topic} maps to pools of different shards ({}); a topic's pools must share one shard: give them the same `shard:` in pools.yaml",
                spread.join("; ")
            )));
        }
    }
    Ok(())
}

/// A tenant id a topic may be bound to: not empty, no `:` (it ends the tenant's job-id
/// namespace) and no `*` (it means every tenant under `tenants`).
fn valid_tenant_id(t: &str) -> bool {
    !t.trim().is_empty() && !t.contains([':', '*'])
}

/// `text` matches `pattern`, where `*` stands for any characters (none included).
pub fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}
