//! What workers report: JobStarted, JobProgress, JobResult, Heartbeat.
//!
//! Every report carries the attempt number of the Dispatch it answers; a report for an older
//! attempt is journaled as rejected and changes nothing (attempt fencing).

use crate::decide::Decider;
use crate::events::*;
use crate::policy::output_document;
use crate::reason::{AttemptError, DlqReason, Rejection};
use crate::records::{Heartbeat, JobProgress, JobResult, JobStarted, Millis, ResultStatus};

impl Decider<'_, '_> {
    /// Checks a report against the job's current attempt and the worker it went to; refuses
    /// it (journaled) if it does not fit. Returns the job's state when the report may
    /// proceed.
    ///
    /// A RUNNING attempt takes reports only from the worker that started it. A DISPATCHED
    /// one also from another live worker of its pool: a rebalance of the pool's consumer
    /// group may hand the dispatch partition to it before the first worker read the
    /// dispatch (the rebalance is journaled with the start).
    fn admit_report(&mut self, job_id: &str, attempt: i32, worker_id: &str) -> Option<JobState> {
        let Some(job) = self.state().jobs.get(job_id) else {
            self.refuse(job_id, Rejection::UnknownJob, format!("no job {job_id}"));
            return None;
        };
        let (state, current) = (job.state, job.attempt);
        if attempt < current {
            self.refuse(
                job_id,
                Rejection::StaleAttempt,
                format!("report for attempt {attempt}, the job is on attempt {current}; ignored"),
            );
            return None;
        }
        if attempt > current {
            self.refuse(
                job_id,
                Rejection::UnknownAttempt,
                format!("report for attempt {attempt}, but only {current} were dispatched"),
            );
            return None;
        }
        if !matches!(state, JobState::Dispatched | JobState::Running) {
            self.refuse(
                job_id,
                Rejection::InvalidTransition,
                format!(
                    "the job is {state}; a {} cannot change it",
                    self.input().kind()
                ),
            );
            return None;
        }
        if let Some(why) = self.not_assigned(job_id, state, worker_id) {
            self.refuse(job_id, Rejection::NotAssignedWorker, why);
            return None;
        }
        Some(state)
    }

    /// Why `worker_id` may not report on the job's current attempt, if it may not.
    fn not_assigned(&self, job_id: &str, state: JobState, worker_id: &str) -> Option<String> {
        let job = &self.state().jobs[job_id];
        let assigned = job.worker_id.as_deref().unwrap_or("");
        if assigned == worker_id {
            return None;
        }
        if state == JobState::Running {
            return Some(format!(
                "attempt {} runs on worker {assigned}; a report from {worker_id:?} is ignored",
                job.attempt
            ));
        }
        let pool = job.pool.as_deref().unwrap_or("");
        let takes_over = self
            .state()
            .workers
            .get(worker_id)
            .is_some_and(|w| w.alive && w.heartbeat.pool == pool);
        (!takes_over).then(|| {
            format!(
                "attempt {} went to worker {assigned} of pool {pool}; {worker_id:?} is not a live worker of that pool",
                job.attempt
            )
        })
    }

    /// DISPATCHED -> RUNNING, recording a rebalance if another worker of the pool took it.
    fn start(&mut self, job_id: &str, attempt: i32, worker_id: &str) {
        let assigned = self.state().jobs[job_id].worker_id.clone();
        let reassigned_from = assigned.filter(|w| w != worker_id);
        self.emit(Event::JobRunning(JobRunning {
            job_id: job_id.to_owned(),
            attempt,
            worker_id: worker_id.to_owned(),
            reassigned_from,
        }));
    }

    pub(super) fn started(&mut self, s: &JobStarted) {
        match self.admit_report(&s.job_id, s.attempt, &s.worker_id) {
            Some(JobState::Dispatched) => self.start(&s.job_id, s.attempt, &s.worker_id),
            // RUNNING on this worker already: its progress (or result) was read first. The
            // start agrees with the job: nothing to do, and nothing to refuse.
            Some(_) => {}
            None => {}
        }
    }

    pub(super) fn progress(&mut self, p: &JobProgress) {
        let Some(state) = self.admit_report(&p.job_id, p.attempt, &p.worker_id) else {
            return;
        };
        if state == JobState::Dispatched {
            self.start(&p.job_id, p.attempt, &p.worker_id);
        }
        let progress = if p.progress.is_finite() {
            p.progress.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self.emit(Event::JobProgressed(JobProgressed {
            job_id: p.job_id.clone(),
            attempt: p.attempt,
            progress,
            message: p.message.clone(),
        }));
    }

    pub(super) fn result(&mut self, r: &JobResult) {
        let Some(state) = self.admit_report(&r.job_id, r.attempt, &r.worker_id) else {
            return;
        };
        if state == JobState::Dispatched {
            self.start(&r.job_id, r.attempt, &r.worker_id);
        }
        let pool = self.state().jobs[&r.job_id].pool.clone();
        match r.status {
            ResultStatus::Succeeded => self.succeed(r),
            ResultStatus::FailedRetryable => self.retry_or_fail(
                &r.job_id,
                worker_code(&r.error_code).unwrap_or(AttemptError::FailedRetryable.as_str()),
                r.error_message.clone(),
            ),
            ResultStatus::FailedFatal => self.fail_fatal(
                &r.job_id,
                worker_code(&r.error_code).unwrap_or(AttemptError::FailedFatal.as_str()),
                r.error_message.clone(),
            ),
            // Nobody asked to cancel (a cancelled job is terminal and refused above): the worker
            // gave the job back, e.g. while draining. Another attempt runs elsewhere.
            ResultStatus::Cancelled => self.retry_or_fail(
                &r.job_id,
                AttemptError::HandedBack.as_str(),
                r.error_message
                    .clone()
                    .or_else(|| Some(format!("worker {} gave the job back", r.worker_id))),
            ),
        }
        if let Some(pool) = pool {
            self.schedule_pools(vec![pool]);
        }
    }

    fn succeed(&mut self, r: &JobResult) {
        let counted = self.breaker_pool(&r.job_id, "");
        self.emit(Event::JobSucceeded(JobSucceeded {
            job_id: r.job_id.clone(),
            attempt: r.attempt,
            worker_id: r.worker_id.clone(),
            result_ptr: r.result_ptr.clone(),
            result_meta: r.result_meta.clone(),
            execution_ms: r.execution_ms,
        }));
        self.count_for_breaker(counted, &r.job_id, false);
        let config = self.rules();
        let job = &self.state().jobs[&r.job_id];
        let doc = || {
            output_document(
                &job.request,
                job.payload_len,
                &r.worker_id,
                r.result_ptr.as_deref(),
                &r.result_meta,
                r.execution_ms,
            )
        };
        let verdict = self.ctx().policy.evaluate_output_lazily(&config.raw, &doc);
        if verdict.quarantine {
            let reason = if verdict.reasons.is_empty() {
                "quarantined by output policy".to_owned()
            } else {
                verdict.reasons.join("; ")
            };
            self.emit(Event::JobQuarantined(JobQuarantined {
                job_id: r.job_id.clone(),
                snapshot_id: config.raw.policy_snapshot.clone(),
                reasons: verdict.reasons,
            }));
            let code = if verdict.limit_exceeded {
                DlqReason::PolicyLimitExceeded
            } else {
                DlqReason::OutputQuarantined
            };
            self.dead_letter(&r.job_id, code.as_str(), reason);
        }
        self.saga_on_success(&r.job_id);
    }

    pub(super) fn heartbeat(&mut self, hb: &Heartbeat) {
        let config = self.rules();
        let partitions = config.rules.dispatch_partitions.get(&hb.pool).copied();
        let configured = config.rules.pools.contains_key(&hb.pool);
        if let Some(why) = invalid_heartbeat(hb, configured, partitions, &config.rules.limits) {
            self.refuse("", Rejection::InvalidHeartbeat, why);
            return;
        }
        let max = config.rules.limits.max_workers_per_pool;
        let known = self.state().workers.get(&hb.worker_id);
        let joins_pool = known.is_none_or(|w| w.heartbeat.pool != hb.pool);
        let in_pool = self
            .state()
            .workers_by_pool
            .get(&hb.pool)
            .copied()
            .unwrap_or(0);
        if joins_pool && in_pool >= max {
            let why = format!(
                "pool {} already holds {in_pool} workers (limits.max_workers_per_pool); a new worker {:?} is refused until lost ones are forgotten",
                hb.pool,
                crate::records::truncate_for_display(&hb.worker_id, 64)
            );
            self.refuse("", Rejection::InvalidHeartbeat, why);
            return;
        }
        if !config.rules.worker_allowed(&hb.pool, &hb.worker_id) {
            self.refuse(
                "",
                Rejection::InvalidHeartbeat,
                format!(
                    "worker id {:?} may not heartbeat for pool {} (its `workers` patterns)",
                    crate::records::truncate_for_display(&hb.worker_id, 64),
                    hb.pool
                ),
            );
            return;
        }
        let joined = self
            .state()
            .workers
            .get(&hb.worker_id)
            .is_none_or(|w| !w.alive);
        self.emit(Event::WorkerUpdated(WorkerUpdated {
            worker_id: hb.worker_id.clone(),
            heartbeat: Box::new(hb.clone()),
            joined,
        }));
        self.schedule_pools(vec![hb.pool.clone()]);
    }
}

/// Largest move of a load (cpu, gpu, memory; percentage points) that a heartbeat left out
/// of the journal may hide ([`redundant_heartbeat`]).
pub const HEARTBEAT_LOAD_STEP: f64 = 5.0;

/// Whether a heartbeat may be left out of the journal, and so out of the state: it would
/// change nothing a decision reads but the worker's last-seen time, and that time is recent.
/// The worker is alive and idle (nothing in flight on it, nothing it runs, no memory reserved
/// since its last heartbeat), nothing waits in its pool's queue, the heartbeat says what the
/// last journaled one said (`sent_at` aside; loads within [`HEARTBEAT_LOAD_STEP`] points,
/// free memory within 5 %), and the last journaled one is less than a third of the worker
/// TTL old at `log_time`.
///
/// Replay stays exact because the choice is made on the state before the input touches it
/// and the input left out changes nothing at all (not the clock, not the entry count): a
/// replay of the journal reaches the same state without it. An idle fleet journals one
/// heartbeat per worker per third of the TTL instead of every one; liveness is judged from
/// the last journaled heartbeat, so a worker is judged lost at most a third of the TTL
/// earlier than from its last heartbeat, and never falsely while it heartbeats more often
/// than every two thirds of the TTL.
pub fn redundant_heartbeat(state: &crate::state::State, hb: &Heartbeat, log_time: Millis) -> bool {
    let Some(rules) = state.rules() else {
        return false;
    };
    let Some(w) = state.workers.get(&hb.worker_id) else {
        return false;
    };
    let now = state.clock.max(log_time);
    let last = &w.heartbeat;
    let idle = w.alive
        && w.inflight.is_empty()
        && w.foreign_active == 0
        && w.reserved_memory == 0
        && hb.active_jobs == 0
        && hb.active_job_ids.is_empty();
    let close = |a: f64, b: f64| (a - b).abs() <= HEARTBEAT_LOAD_STEP;
    let same = hb.pool == last.pool
        && hb.max_parallel_jobs == last.max_parallel_jobs
        && close(hb.cpu_load, last.cpu_load)
        && close(hb.gpu_utilization, last.gpu_utilization)
        && close(hb.memory_load, last.memory_load)
        && match (hb.memory_free_bytes, last.memory_free_bytes) {
            (None, None) => true,
            (Some(a), Some(b)) => a >= 0 && b >= 0 && (a - b).abs() <= b / 20,
            _ => false,
        }
        && hb.capabilities == last.capabilities
        && hb.labels == last.labels
        && hb.owned_partitions == last.owned_partitions
        && hb.active_jobs == last.active_jobs
        && hb.active_job_ids == last.active_job_ids
        && hb.draining == last.draining;
    let nothing_waits = !state.queued.contains_key(&hb.pool);
    let valid = invalid_heartbeat(
        hb,
        rules.pools.contains_key(&hb.pool),
        rules.dispatch_partitions.get(&hb.pool).copied(),
        &rules.limits,
    )
    .is_none()
        && rules.worker_allowed(&hb.pool, &hb.worker_id);
    let recent = now - w.last_seen < rules.timing.worker_ttl_ms / 3;
    idle && same && nothing_waits && valid && recent
}

/// Longest error code a worker may give, in bytes; a longer one (or one with control
/// characters) is replaced by the scheduler's generic code.
pub(crate) const MAX_ERROR_CODE_BYTES: usize = 128;

/// A worker's own error code, when it gave a usable one.
fn worker_code(code: &Option<String>) -> Option<&str> {
    code.as_deref().filter(|c| {
        !c.trim().is_empty() && c.len() <= MAX_ERROR_CODE_BYTES && !c.chars().any(char::is_control)
    })
}

/// Why a heartbeat cannot be taken as the worker's view, if it cannot: identity missing or
/// oversized, loads that are not numbers (NaN would win every placement) or negative,
/// negative counts, dispatch partitions the pool's topic does not have (`partitions`, when
/// known), or more (or larger) labels, capabilities and running jobs than `limits` allow:
/// the worker's record is kept in memory, so its size must be bounded.
fn invalid_heartbeat(
    hb: &Heartbeat,
    configured: bool,
    partitions: Option<i32>,
    limits: &crate::rules::Limits,
) -> Option<String> {
    if hb.worker_id.trim().is_empty() || hb.pool.trim().is_empty() {
        return Some("heartbeat without worker_id or pool".to_owned());
    }
    let who = crate::records::truncate_for_display(&hb.worker_id, 64);
    if hb.worker_id.len() > super::submit::MAX_ID_BYTES
        || hb.worker_id.chars().any(char::is_control)
    {
        return Some(format!(
            "heartbeat of {who:?}: worker_id must be at most {} bytes without control characters",
            super::submit::MAX_ID_BYTES
        ));
    }
    let max_entries = usize::try_from(limits.max_labels).unwrap_or(0);
    let entry_ok = |s: &str| s.len() as i64 <= limits.max_entry_bytes;
    if hb.labels.len() > max_entries || hb.capabilities.len() > max_entries {
        return Some(format!(
            "heartbeat of {who}: {} labels and {} capabilities; at most {max_entries} of each (limits.max_labels)",
            hb.labels.len(),
            hb.capabilities.len()
        ));
    }
    if !hb.labels.iter().all(|(k, v)| entry_ok(k) && entry_ok(v))
        || !hb.capabilities.iter().all(|c| entry_ok(c))
    {
        return Some(format!(
            "heartbeat of {who}: a label or capability is longer than {} bytes (limits.max_entry_bytes)",
            limits.max_entry_bytes
        ));
    }
    let max_jobs = usize::try_from(limits.max_active_job_ids).unwrap_or(0);
    if hb.active_job_ids.len() > max_jobs
        || hb
            .active_job_ids
            .iter()
            .any(|id| id.len() > super::submit::MAX_ID_BYTES)
    {
        return Some(format!(
            "heartbeat of {who}: it lists {} running jobs; at most {max_jobs} ids (limits.max_active_job_ids) of at most {} bytes",
            hb.active_job_ids.len(),
            super::submit::MAX_ID_BYTES
        ));
    }
    let text: usize = hb.worker_id.len()
        + hb.labels
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
        + hb.capabilities.iter().map(String::len).sum::<usize>()
        + hb.active_job_ids.iter().map(String::len).sum::<usize>();
    if text > usize::try_from(limits.max_heartbeat_bytes).unwrap_or(usize::MAX) {
        return Some(format!(
            "heartbeat of {who}: {text} bytes of ids, labels and capabilities; at most {} (limits.max_heartbeat_bytes)",
            limits.max_heartbeat_bytes
        ));
    }
    if hb.owned_partitions.len() > max_jobs {
        return Some(format!(
            "heartbeat of {who}: it claims {} dispatch partitions",
            hb.owned_partitions.len()
        ));
    }
    if !configured {
        return Some(format!(
            "heartbeat of {who}: pool {} is not configured (pools.yaml)",
            crate::records::truncate_for_display(&hb.pool, 64)
        ));
    }
    for (name, v) in [
        ("cpu_load", hb.cpu_load),
        ("gpu_utilization", hb.gpu_utilization),
        ("memory_load", hb.memory_load),
    ] {
        if !v.is_finite() || v < 0.0 {
            return Some(format!(
                "heartbeat of {who}: {name} {v} is not a load (a finite number, 0 or more)"
            ));
        }
    }
    if hb.active_jobs < 0 || hb.max_parallel_jobs < 0 {
        return Some(format!(
            "heartbeat of {who}: active_jobs {} and max_parallel_jobs {} must not be negative",
            hb.active_jobs, hb.max_parallel_jobs
        ));
    }
    if hb.memory_free_bytes.is_some_and(|m| m < 0) {
        return Some(format!("heartbeat of {who}: memory_free_bytes is negative"));
    }
    if let Some(n) = partitions
        && let Some(p) = hb.owned_partitions.iter().find(|p| **p < 0 || **p >= n)
    {
        return Some(format!(
            "heartbeat of {who}: it claims dispatch partition {p}, but the dispatch topic of pool {} has partitions 0..{}",
            crate::records::truncate_for_display(&hb.pool, 64),
            n - 1
        ));
    }
    None
}
