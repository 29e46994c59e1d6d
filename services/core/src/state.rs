//! The projection: jobs, workers, queues, tenants, breakers, sagas, idempotency keys.
//!
//! `apply` (in `apply.rs`) is the only code that changes it. Queues, timers, tenant counts and
//! each worker's in-flight set are indexes derived from job records; they are maintained in one
//! place (`State::update_job`) so they can never disagree with the jobs they index.
//!
//! The state may be partial: the runtime keeps active jobs in memory and loads terminal jobs
//! and idempotency keys from RocksDB before deciding on an input that names them
//! ([`Prerequisites`]). Everything here is deterministic: ordered maps, no clock, no hashing
//! with random seeds.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::events::{CircuitState, Input, JobState, Reconfigure, SagaOutcome};
use crate::records::{
    Constraints, DeadLetter, Heartbeat, JobRequest, JobTemplate, Millis, ResultMeta,
};
use crate::rules::{Rules, Timing};

/// The rules and policy bundle in force.
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveConfig {
    pub raw: Reconfigure,
    pub rules: Rules,
}

/// One line of a job's history: what happened, when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryItem {
    pub at: Millis,
    pub event: String,
    pub detail: String,
}

/// Most lines a job's history keeps (see `State::write_history`).
pub const HISTORY_MAX: u32 = 200;

/// One line of a job's history as the owner of the state persists it: the job, the line's
/// number, the line. A line may replace an earlier one with the same number (a run of
/// progress keeps one line; past the bound, the last slot keeps the latest line).
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryLine {
    pub job_id: String,
    pub seq: u32,
    pub item: HistoryItem,
}

/// A job as the scheduler knows it. Its payload and history are not held here: the payload
/// is written once when the job is accepted and read back when it is dispatched, the history
/// is appended line by line (see [`Dirty`]), so a backlog of pending jobs costs memory for
/// what decisions read, not for what the jobs carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// The request without its payload (see `payload_len` and `payload_digest`).
    pub request: JobRequest,
    pub payload_len: u64,
    /// First 16 bytes of the payload's SHA-256: a resubmission is "the same job" only with
    /// the same payload.
    pub payload_digest: [u8; 16],
    pub job_hash: String,
    pub state: JobState,
    /// Pools the job may run in, in preference order.
    pub pools: Vec<String>,
    /// Attempts dispatched so far (the current attempt's number).
    pub attempt: i32,
    pub constraints: Constraints,
    pub policy_snapshot: Option<String>,
    pub worker_id: Option<String>,
    pub pool: Option<String>,
    pub partition: Option<i32>,
    pub accepted_at: Millis,
    pub updated_at: Millis,
    /// Set while the job sits in its pools' pending queues.
    pub queued_at: Option<Millis>,
    /// Set while the job waits out a retry backoff.
    pub retry_at: Option<Millis>,
    pub dispatched_at: Option<Millis>,
    pub started_at: Option<Millis>,
    /// Last sign of life of the running attempt (start, progress, or a heartbeat listing it).
    pub last_evidence_at: Option<Millis>,
    pub deadline_at: Option<Millis>,
    pub wait_reason: Option<String>,
    pub progress: Option<f64>,
    pub last_error: Option<String>,
    pub result_ptr: Option<String>,
    pub result_meta: Option<ResultMeta>,
    pub execution_ms: Option<i64>,
    pub dlq_reason: Option<String>,
    /// History lines written so far (the next line's number).
    pub history_lines: u32,
    /// Lines not kept because the history reached its bound (the last slot keeps the
    /// latest).
    pub history_omitted: u32,
    /// The last line is progress (the next progress replaces it).
    pub history_progress: bool,
}

impl Job {
    /// The job's effective memory demand in bytes (label `memory`: bytes, or with a
    /// Ki/Mi/Gi/K/M/G suffix), for the capacity strategy.
    pub fn memory_demand(&self) -> Option<i64> {
        self.request
            .labels
            .get("memory")
            .and_then(|s| parse_bytes(s))
    }

    /// Retries allowed after the first attempt.
    pub fn max_retries(&self, rules: &Rules) -> i32 {
        self.constraints
            .max_retries
            .unwrap_or(rules.retry.max_retries)
            .max(0)
    }

    /// Longest an attempt may run, if limited.
    pub fn max_runtime_ms(&self) -> Option<i64> {
        self.constraints
            .max_runtime_ms
            .or(self.request.budget.max_runtime_ms)
            .filter(|v| *v > 0)
    }
}

/// Parses `512`, `512Mi`, `2G`, `1.5Gi` into bytes.
pub fn parse_bytes(s: &str) -> Option<i64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "K" | "KB" => 1e3,
        "M" | "MB" => 1e6,
        "G" | "GB" => 1e9,
        "T" | "TB" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let v = n * mult;
    (v.is_finite() && (0.0..9.0e18).contains(&v)).then_some(v as i64)
}

/// A worker as the scheduler knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Worker {
    pub heartbeat: Heartbeat,
    pub joined_at: Millis,
    pub last_seen: Millis,
    pub alive: bool,
    /// Jobs the worker reported running that the scheduler does not count as in flight on it
    /// (e.g. cancelled or timed out but not stopped yet), as of its last heartbeat.
    pub foreign_active: i32,
    /// Memory of jobs dispatched since the last heartbeat, for the capacity strategy.
    pub reserved_memory: i64,
    /// Derived: jobs SCHEDULED, DISPATCHED or RUNNING on this worker.
    #[serde(skip)]
    pub inflight: BTreeSet<String>,
}

impl Worker {
    /// `active_jobs` in the score: the scheduler's own in-flight dispatches to this worker,
    /// which change at every dispatch and every result, plus what the worker runs that the
    /// scheduler no longer counts. (A heartbeat figure plus "dispatches since" would keep a
    /// worker looking full until its next heartbeat after its jobs finished.)
    pub fn effective_active(&self) -> i32 {
        i32::try_from(self.inflight.len())
            .unwrap_or(i32::MAX)
            .saturating_add(self.foreign_active)
    }

    pub fn free_memory(&self) -> Option<i64> {
        self.heartbeat
            .memory_free_bytes
            .map(|m| m.saturating_sub(self.reserved_memory))
    }
}

/// A pool's circuit breaker.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Breaker {
    pub state: CircuitState,
    pub consecutive_failures: i32,
    /// Last results, oldest first; `true` is a failure.
    pub window: VecDeque<bool>,
    pub opened_at: Option<Millis>,
    /// Probe jobs let through while half-open that are still SCHEDULED, DISPATCHED or
    /// RUNNING. A probe that ends any way frees its slot, with a result or without one
    /// (timed out, cancelled, its worker lost), so probes can never hold the pool closed.
    pub probes: BTreeSet<String>,
    pub probe_successes: i32,
}

impl Breaker {
    pub fn failure_ratio(&self) -> f64 {
        if self.window.is_empty() {
            return 0.0;
        }
        self.window.iter().filter(|f| **f).count() as f64 / self.window.len() as f64
    }
}

/// One step of a workflow whose compensation is on the stack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SagaStep {
    pub job_id: String,
    pub tenant_id: String,
    pub principal_id: Option<String>,
    pub compensation: JobTemplate,
}

/// A workflow's compensation stack and rollback progress.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Saga {
    pub stack: Vec<SagaStep>,
    /// Set once a step failed fatally.
    pub failed_job_id: Option<String>,
    /// The compensation job running now, during rollback.
    pub running: Option<String>,
    pub compensations_submitted: i32,
    pub outcome: Option<SagaOutcome>,
}

impl Saga {
    pub fn rolling_back(&self) -> bool {
        self.failed_job_id.is_some() && self.outcome.is_none()
    }
}

/// An idempotency key's owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdempotencyEntry {
    pub job_id: String,
    pub seen_at: Millis,
}

/// Position of a job in a pool's pending queue: priority, then age, then job_id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueueKey {
    pub rank: u8,
    pub queued_at: Millis,
    pub job_id: String,
}

/// What a due timer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimerKind {
    Deadline,
    RetryAt,
    PlacementTimeout,
    DispatchTimeout,
    RunningTimeout,
    MaxRuntime,
}

/// A job timer, ordered by due time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timer {
    pub due: Millis,
    pub kind: TimerKind,
    pub job_id: String,
}

/// Keys changed since the runtime last persisted, so it writes only those.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Dirty {
    pub jobs: BTreeSet<String>,
    pub workers: BTreeSet<String>,
    pub breakers: BTreeSet<String>,
    pub sagas: BTreeSet<String>,
    pub idempotency: BTreeSet<(String, String)>,
    pub idempotency_pruned_before: Option<Millis>,
    pub dead_letters: Vec<DeadLetter>,
    pub config: bool,
    /// History lines written since the last persist, in order.
    pub history: Vec<HistoryLine>,
    /// Payloads of jobs accepted since the last persist (job_id -> payload).
    pub payloads: BTreeMap<String, Vec<u8>>,
}

/// Everything the scheduler knows.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// Log time of the last applied entry; decisions never go back in time.
    pub clock: Millis,
    /// Journal entries applied.
    pub entries: u64,
    pub config: Option<Arc<ActiveConfig>>,
    /// Boxed: a map node holds a pointer per job instead of the whole record, which the
    /// tree's spare slots would otherwise multiply (a backlog of a million pending jobs).
    pub jobs: BTreeMap<String, Box<Job>>,
    pub workers: BTreeMap<String, Worker>,
    pub breakers: BTreeMap<String, Breaker>,
    pub sagas: BTreeMap<String, Saga>,
    pub idempotency: BTreeMap<(String, String), IdempotencyEntry>,
    pub last_idempotency_prune: Millis,
    pub dead_letters_by_reason: BTreeMap<String, u64>,
    /// Jobs per state, over every job ever accepted (kept by transitions, so it stays right
    /// while terminal jobs live only in storage).
    pub jobs_by_state: BTreeMap<JobState, u64>,
    /// Derived: pool -> pending queue.
    pub queues: BTreeMap<String, BTreeSet<QueueKey>>,
    /// Derived: job timers by due time.
    pub timers: BTreeSet<Timer>,
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
            && self.idempotency == other.idempotency
            && self.last_idempotency_prune == other.last_idempotency_prune
            && self.watermark == other.watermark
            && self.liveness_floor == other.liveness_floor
            && self.orphans == other.orphans
            && self.tenant_pending == other.tenant_pending
            && self.dead_letters_by_reason == other.dead_letters_by_reason
            && self.jobs_by_state == other.jobs_by_state
            && self.queues == other.queues
            && self.timers == other.timers
            && self.tenant_active == other.tenant_active
    }
}

/// Where a partial state's cold records live (RocksDB in the processor).
pub trait ColdStore {
    type Error;
    fn job(&self, id: &str) -> Result<Option<Job>, Self::Error>;
    fn saga(&self, workflow_id: &str) -> Result<Option<Saga>, Self::Error>;
    fn idempotency(&self, tenant: &str, key: &str)
    -> Result<Option<IdempotencyEntry>, Self::Error>;
}

/// Keys a decision on an input may read, which a partial state must hold first.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Prerequisites {
    pub job_ids: Vec<String>,
    pub idempotency: Option<(String, String)>,
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

    pub fn take_dirty(&mut self) -> Dirty {
        self.dirty.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// What must be loaded before deciding on `input`.
    pub fn prerequisites(input: &Input) -> Prerequisites {
        let mut p = Prerequisites::default();
        if let Some(id) = input.job_id() {
            p.job_ids.push(id.to_owned());
        }
        if let Input::Submit(r) = input
            && let Some(key) = &r.meta.idempotency_key
        {
            p.idempotency = Some((r.tenant_id.clone(), key.clone()));
        }
        p
    }

    /// The workflow whose saga a decision on `input` may read, once the input's job is loaded.
    pub fn workflow_prerequisite(&self, input: &Input) -> Option<String> {
        let request = match input {
            Input::Submit(r) => r,
            other => &self.jobs.get(other.job_id()?)?.request,
        };
        crate::decide::workflow_of(request).map(str::to_owned)
    }

    /// Loads from `store` everything deciding on `input` may read: its job, the owner of its
    /// idempotency key, and the saga of its workflow.
    pub fn load_for_input<S: ColdStore>(
        &mut self,
        input: &Input,
        store: &S,
    ) -> Result<(), S::Error> {
        let pre = State::prerequisites(input);
        self.load_jobs(&pre.job_ids, store)?;
        if let Some((tenant, key)) = &pre.idempotency {
            let k = (tenant.clone(), key.clone());
            if !self.idempotency.contains_key(&k)
                && let Some(e) = store.idempotency(tenant, key)?
            {
                self.idempotency.insert(k.clone(), e);
            }
            // A duplicate is recorded in the history of the job that owns the key.
            if let Some(owner) = self.idempotency.get(&k).map(|e| e.job_id.clone()) {
                self.load_jobs(&[owner], store)?;
            }
        }
        if let Some(wf) = self.workflow_prerequisite(input) {
            self.load_sagas(&[wf], store)?;
        }
        Ok(())
    }

    /// Loads from `store` everything applying `entry` reads or changes.
    pub fn load_for_entry<S: ColdStore>(
        &mut self,
        entry: &crate::events::JournalEntry,
        store: &S,
    ) -> Result<(), S::Error> {
        let (jobs, workflows) = entry.touched();
        self.load_jobs(&jobs, store)?;
        self.load_sagas(&workflows, store)
    }

    fn load_jobs<S: ColdStore>(&mut self, ids: &[String], store: &S) -> Result<(), S::Error> {
        for id in ids {
            if !self.jobs.contains_key(id)
                && let Some(job) = store.job(id)?
            {
                self.hydrate_job(id.clone(), job);
            }
        }
        Ok(())
    }

    fn load_sagas<S: ColdStore>(&mut self, ids: &[String], store: &S) -> Result<(), S::Error> {
        for id in ids {
            if !self.sagas.contains_key(id)
                && let Some(s) = store.saga(id)?
            {
                self.sagas.insert(id.clone(), s);
            }
        }
        Ok(())
    }

    /// Adds a job loaded from storage (not a state change: the job was already there).
    pub fn hydrate_job(&mut self, job_id: String, job: Job) {
        if self.jobs.contains_key(&job_id) {
            return;
        }
        if job.state.is_terminal() {
            self.cold.insert(job_id.clone());
        }
        self.jobs.insert(job_id.clone(), Box::new(job));
        self.index_job(&job_id);
    }

    /// Drops terminal jobs, idempotency keys and idle sagas from memory (they stay in
    /// storage). Only called by an owner that has persisted every dirty key.
    pub fn evict_cold(&mut self) {
        for id in std::mem::take(&mut self.cold) {
            if self.jobs.get(&id).is_some_and(|j| j.state.is_terminal()) {
                self.unindex_job(&id);
                self.jobs.remove(&id);
            }
        }
        self.idempotency.clear();
        // Sagas mid-rollback stay: a tick may end their running compensation.
        self.sagas.retain(|_, s| s.rolling_back());
    }

    pub fn mark_job(&mut self, id: &str) {
        if let Some(d) = self.dirty.as_mut() {
            d.jobs.insert(id.to_owned());
        }
    }

    pub fn mark_worker(&mut self, id: &str) {
        if let Some(d) = self.dirty.as_mut() {
            d.workers.insert(id.to_owned());
        }
    }

    pub(crate) fn mark_breaker(&mut self, pool: &str) {
        if let Some(d) = self.dirty.as_mut() {
            d.breakers.insert(pool.to_owned());
        }
    }

    pub(crate) fn mark_saga(&mut self, id: &str) {
        if let Some(d) = self.dirty.as_mut() {
            d.sagas.insert(id.to_owned());
        }
    }

    /// Changes a job and keeps every index that derives from it in step.
    pub(crate) fn update_job<R>(&mut self, id: &str, f: impl FnOnce(&mut Job) -> R) -> Option<R> {
        let (before, pool) = self.jobs.get(id).map(|j| (j.state, j.pool.clone()))?;
        self.unindex_job(id);
        let r = self.jobs.get_mut(id).map(|j| f(j));
        self.index_job(id);
        self.mark_job(id);
        if let Some(after) = self.jobs.get(id).map(|j| j.state)
            && after != before
        {
            self.count_state(before, -1);
            self.count_state(after, 1);
            if after.is_terminal() {
                self.cold.insert(id.to_owned());
            }
            if before.is_active()
                && !after.is_active()
                && let Some(pool) = pool
            {
                self.free_probe(&pool, id);
            }
        }
        r
    }

    /// Appends a line to job `id`'s history (nothing for an unknown job). The line goes out
    /// with the dirty keys; the job keeps only counters. A run of progress keeps its latest
    /// line; past [`HISTORY_MAX`] lines, the last slot keeps the latest and the others
    /// between are counted as omitted (the journal has every event: `ksched audit job`).
    pub(crate) fn write_history(&mut self, id: &str, at: Millis, event: &str, detail: String) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        let progress = event == "JobProgressed";
        let seq = if progress && job.history_progress && job.history_lines > 0 {
            job.history_lines - 1
        } else if job.history_lines >= HISTORY_MAX {
            job.history_omitted = job.history_omitted.saturating_add(1);
            HISTORY_MAX - 1
        } else {
            job.history_lines += 1;
            job.history_lines - 1
        };
        job.history_progress = progress;
        self.mark_job(id);
        if let Some(d) = self.dirty.as_mut() {
            d.history.push(HistoryLine {
                job_id: id.to_owned(),
                seq,
                item: HistoryItem {
                    at,
                    event: event.to_owned(),
                    detail,
                },
            });
        }
    }

    /// A half-open breaker's probe ended (any way): its slot is free again.
    fn free_probe(&mut self, pool: &str, job_id: &str) {
        if let Some(b) = self.breakers.get_mut(pool)
            && b.probes.remove(job_id)
        {
            self.mark_breaker(pool);
        }
    }

    /// Adds a worker's record; it takes over the jobs already naming it.
    pub(crate) fn insert_worker(&mut self, id: &str, mut worker: Worker) {
        worker.inflight = self.orphans.remove(id).unwrap_or_default();
        self.workers.insert(id.to_owned(), worker);
    }

    /// Drops a worker's record; jobs still naming it stay indexed as orphans.
    pub(crate) fn remove_worker(&mut self, id: &str) -> Option<Worker> {
        let mut w = self.workers.remove(id)?;
        let inflight = std::mem::take(&mut w.inflight);
        if !inflight.is_empty() {
            self.orphans.insert(id.to_owned(), inflight);
        }
        Some(w)
    }

    fn count_state(&mut self, state: JobState, delta: i64) {
        let n = self.jobs_by_state.entry(state).or_default();
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            self.jobs_by_state.remove(&state);
        }
    }

    pub(crate) fn insert_job(&mut self, id: String, job: Job) {
        if let Some(old) = self.jobs.get(&id).map(|j| j.state) {
            self.unindex_job(&id);
            self.count_state(old, -1);
        }
        self.count_state(job.state, 1);
        if job.state.is_terminal() {
            self.cold.insert(id.clone());
        }
        self.jobs.insert(id.clone(), Box::new(job));
        self.index_job(&id);
        self.mark_job(&id);
    }

    /// The timers of job `id` as the state stands (its record, its worker's evidence, the
    /// liveness floor, the timing rules).
    fn job_timers(&self, id: &str, job: &Job) -> Vec<Timer> {
        let Some(timing) = self.config.as_deref().map(|c| &c.rules.timing) else {
            return Vec::new();
        };
        let evidence = self.worker_evidence(id, job);
        timers_of(id, job, timing, self.liveness_floor, evidence)
    }

    /// When the job's worker last listed it as running, if its latest heartbeat does.
    pub fn worker_evidence(&self, id: &str, job: &Job) -> Option<Millis> {
        let w = self.workers.get(job.worker_id.as_deref()?)?;
        w.heartbeat
            .active_job_ids
            .iter()
            .any(|j| j == id)
            .then_some(w.last_seen)
    }

    pub(crate) fn index_job(&mut self, id: &str) {
        let Some(job) = self.jobs.get(id) else { return };
        let timers = self.job_timers(id, job);
        let job = &self.jobs[id];
        if let Some(queued_at) = job.queued_at {
            for pool in &job.pools {
                self.queues
                    .entry(pool.clone())
                    .or_default()
                    .insert(QueueKey {
                        rank: job.request.priority.rank(),
                        queued_at,
                        job_id: id.to_owned(),
                    });
            }
            *self
                .tenant_pending
                .entry(job.request.tenant_id.clone())
                .or_default() += 1;
        }
        self.timers.extend(timers);
        if job.state.is_active() {
            *self
                .tenant_active
                .entry(job.request.tenant_id.clone())
                .or_default() += 1;
            if let Some(worker_id) = job.worker_id.as_ref() {
                match self.workers.get_mut(worker_id) {
                    Some(w) => {
                        w.inflight.insert(id.to_owned());
                    }
                    None => {
                        self.orphans
                            .entry(worker_id.clone())
                            .or_default()
                            .insert(id.to_owned());
                    }
                }
            }
        }
    }

    pub(crate) fn unindex_job(&mut self, id: &str) {
        let Some(job) = self.jobs.get(id) else { return };
        for t in self.job_timers(id, job) {
            self.timers.remove(&t);
        }
        let job = &self.jobs[id];
        if let Some(queued_at) = job.queued_at {
            for pool in &job.pools {
                if let Some(q) = self.queues.get_mut(pool) {
                    q.remove(&QueueKey {
                        rank: job.request.priority.rank(),
                        queued_at,
                        job_id: id.to_owned(),
                    });
                    if q.is_empty() {
                        self.queues.remove(pool);
                    }
                }
            }
            decrement(&mut self.tenant_pending, &job.request.tenant_id);
        }
        if job.state.is_active() {
            decrement(&mut self.tenant_active, &job.request.tenant_id);
            if let Some(worker_id) = job.worker_id.as_ref() {
                match self.workers.get_mut(worker_id) {
                    Some(w) => {
                        w.inflight.remove(id);
                    }
                    None => {
                        if let Some(set) = self.orphans.get_mut(worker_id) {
                            set.remove(id);
                            if set.is_empty() {
                                self.orphans.remove(worker_id);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Rebuilds every derived index from the records (after new rules change the timers, and
    /// after loading records from storage).
    pub fn rebuild_indexes(&mut self) {
        self.queues.clear();
        self.timers.clear();
        self.tenant_active.clear();
        self.tenant_pending.clear();
        self.orphans.clear();
        for w in self.workers.values_mut() {
            w.inflight.clear();
        }
        self.cold = self
            .jobs
            .iter()
            .filter(|(_, j)| j.state.is_terminal())
            .map(|(id, _)| id.clone())
            .collect();
        let ids: Vec<String> = self.jobs.keys().cloned().collect();
        for id in ids {
            self.index_job(&id);
        }
    }

    /// Active jobs of a tenant (SCHEDULED + DISPATCHED + RUNNING).
    pub fn tenant_active_jobs(&self, tenant: &str) -> i64 {
        self.tenant_active.get(tenant).copied().unwrap_or(0)
    }

    /// Checks the derived indexes against the records; returns what disagrees. Used by tests
    /// and by `audit rebuild`.
    pub fn check_invariants(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut rebuilt = self.clone();
        rebuilt.dirty = None;
        rebuilt.rebuild_indexes();
        if rebuilt.queues != self.queues {
            problems.push("pending queues disagree with job records".to_owned());
        }
        if rebuilt.timers != self.timers {
            problems.push("timers disagree with job records".to_owned());
        }
        if rebuilt.tenant_active != self.tenant_active {
            problems.push("tenant active counts disagree with job records".to_owned());
        }
        if rebuilt.tenant_pending != self.tenant_pending {
            problems.push("tenant pending counts disagree with job records".to_owned());
        }
        if rebuilt.orphans != self.orphans {
            problems.push("jobs of unknown workers disagree with job records".to_owned());
        }
        for (id, w) in &self.workers {
            if rebuilt.workers.get(id).map(|r| &r.inflight) != Some(&w.inflight) {
                problems.push(format!(
                    "in-flight set of worker {id} disagrees with job records"
                ));
            }
        }
        for (id, job) in &self.jobs {
            if job.state.is_terminal() && (job.queued_at.is_some() || job.retry_at.is_some()) {
                problems.push(format!("job {id} is {} and still queued", job.state));
            }
            if job.queued_at.is_some() && job.state != JobState::Pending {
                problems.push(format!("job {id} is queued in state {}", job.state));
            }
        }
        for (t, n) in &self.tenant_active {
            if *n < 0 {
                problems.push(format!("tenant {t} has {n} active jobs"));
            }
        }
        // Active jobs are always in memory, so their counts must match exactly; terminal
        // counts may exceed what memory holds.
        let mut counted: BTreeMap<JobState, u64> = BTreeMap::new();
        for j in self.jobs.values() {
            *counted.entry(j.state).or_default() += 1;
        }
        for st in JobState::ALL {
            let have = counted.get(&st).copied().unwrap_or(0);
            let kept = self.jobs_by_state.get(&st).copied().unwrap_or(0);
            if (!st.is_terminal() && have != kept) || (st.is_terminal() && have > kept) {
                problems.push(format!("{kept} jobs counted {st}, {have} present"));
            }
        }
        problems
    }
}

fn decrement(counts: &mut BTreeMap<String, i64>, key: &str) {
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n <= 0 {
            counts.remove(key);
        }
    }
}

/// The timers a job has in its current state. Timeouts that wait for a sign of life count
/// from `floor` at the earliest (after a [`crate::events::ClockGap`]); `evidence` is when
/// the job's worker last listed it as running (heartbeats are evidence without rewriting the
/// job). Deadlines, retry backoffs and max runtimes are not evidence-based.
pub fn timers_of(
    id: &str,
    job: &Job,
    timing: &Timing,
    floor: Millis,
    evidence: Option<Millis>,
) -> Vec<Timer> {
    let mut out = Vec::new();
    let mut push = |due: Millis, kind: TimerKind| {
        out.push(Timer {
            due,
            kind,
            job_id: id.to_owned(),
        })
    };
    if job.state.is_terminal() {
        return out;
    }
    if let Some(d) = job.deadline_at {
        push(d, TimerKind::Deadline);
    }
    match job.state {
        JobState::Pending => {
            if let Some(r) = job.retry_at {
                push(r, TimerKind::RetryAt);
            }
            if let Some(q) = job.queued_at {
                push(
                    q.max(floor).saturating_add(timing.placement_timeout_ms),
                    TimerKind::PlacementTimeout,
                );
            }
        }
        JobState::Dispatched => {
            if let Some(d) = job.dispatched_at {
                push(
                    d.max(floor).saturating_add(timing.dispatch_timeout_ms),
                    TimerKind::DispatchTimeout,
                );
            }
        }
        JobState::Running => {
            if let Some(e) = job.last_evidence_at {
                let e = e.max(evidence.unwrap_or(e)).max(floor);
                push(
                    e.saturating_add(timing.running_timeout_ms),
                    TimerKind::RunningTimeout,
                );
            }
            if let (Some(s), Some(max)) = (job.started_at, job.max_runtime_ms()) {
                push(s.saturating_add(max), TimerKind::MaxRuntime);
            }
        }
        _ => {}
    }
    out
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
