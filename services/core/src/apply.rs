//! `apply`: the only way the projection changes.
//!
//! Live processing, recovery and audit replay all fold journal entries through
//! [`apply_entry`], so a rebuilt projection equals the live one by construction.

use std::sync::Arc;

use crate::events::*;
use crate::reason::{AttemptError, DlqReason, WaitReason};
use crate::records::{JobRequest, Millis};
use crate::rules::Rules;
use crate::state::{
    ActiveConfig, Breaker, IdempotencyEntry, Job, Line, SagaStep, State, Worker, saga_key_of,
};

/// What an event is applied with besides itself: the entry it belongs to.
#[derive(Debug, Clone, Copy)]
pub struct Applying<'a> {
    /// The entry's log time.
    pub now: Millis,
    /// The entry's input (a `JobAccepted` without a request takes it from here).
    pub input: &'a Input,
    /// The entry's decision format ([`DECISION_FORMAT`]).
    pub format: i32,
}

/// Applies one journal entry: advances the clock, then applies its events in order.
pub fn apply_entry(state: &mut State, entry: &JournalEntry) {
    begin_entry(state, entry.log_time, &entry.input);
    let at = Applying {
        now: entry.log_time,
        input: &entry.input,
        format: entry.format,
    };
    for e in &entry.events {
        apply(state, e, &at);
    }
}

/// What every entry does before its events: the clock moves to the entry's log time, a
/// Tick moves the watermark it was judged at, and the entry's history lines start new runs.
pub(crate) fn begin_entry(state: &mut State, log_time: Millis, input: &Input) {
    state.clock = state.clock.max(log_time);
    state.entries += 1;
    state.woken.clear();
    state.fresh_settling.clear();
    if let Some(d) = state.dirty.as_mut() {
        d.history.begin_entry();
    }
    if let Input::Tick(t) = input {
        state.watermark = state.watermark.max(t.watermark.unwrap_or(log_time));
        state.prune_shares();
    }
    state.advance_buckets();
}

/// Most reason codes dead letters are counted by; the codes beyond count as
/// [`OTHER_REASONS`].
pub const MAX_COUNTED_REASONS: usize = 256;
/// Where dead letters of reason codes beyond [`MAX_COUNTED_REASONS`] are counted.
pub const OTHER_REASONS: &str = "other";

/// Records a pool result in its breaker window (true = failure).
fn breaker_result(state: &mut State, pool: &str, failure: bool, rules_window: usize) {
    let b = state.breakers.entry(pool.to_owned()).or_default();
    if failure {
        b.consecutive_failures += 1;
    } else {
        b.consecutive_failures = 0;
    }
    b.window.push_back(failure);
    while b.window.len() > rules_window.max(1) {
        b.window.pop_front();
    }
    if b.state == CircuitState::HalfOpen && !failure {
        b.probe_successes += 1;
    }
    state.mark_breaker(pool);
}

fn window(state: &State) -> usize {
    state
        .rules()
        .map_or(20, |r| usize::try_from(r.breaker.window).unwrap_or(20))
}

/// The first 16 bytes of the payload's SHA-256 (what a resubmission is compared by).
pub fn payload_digest(payload: &[u8]) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(payload);
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// What a job's deadline counts from: its acceptance in the log, never a producer's clock
/// (decision format 1 counted from the producer's `submitted_at`).
fn deadline_base(r: &JobRequest, accepted_at: Millis, format: i32) -> Millis {
    if format < 2 {
        r.submitted_at
    } else {
        // A job that is to wait for its time (SPEC §9) counts from then at the earliest,
        // while it waits for an approval too; its release sets the deadline again.
        accepted_at.max(r.not_before.unwrap_or(Millis::MIN))
    }
}

/// The request a `JobAccepted` admitted: its own, or the entry's input.
pub fn accepted_request<'a>(e: &'a JobAccepted, input: &'a Input) -> Option<&'a JobRequest> {
    match (&e.request, input) {
        (Some(r), _) => Some(r),
        (None, Input::Submit(r)) => Some(r),
        (None, _) => None,
    }
}

/// The history line `event` writes, at the entry's log time.
fn line<'a>(event: &'a Event, at: &Applying<'a>) -> Line<'a> {
    Line {
        at: at.now,
        event,
        input: at.input,
    }
}

/// Applies one event of an entry.
pub fn apply(state: &mut State, event: &Event, at: &Applying<'_>) {
    let now = at.now;
    let legacy_breaker = at.format < 2;
    match event {
        Event::JobAccepted(e) => {
            let Some(r) = accepted_request(e, at.input) else {
                // decide never writes this; a hand-made journal might.
                return;
            };
            let deadline_at = r
                .budget
                .deadline_ms
                .filter(|d| *d > 0)
                .map(|d| deadline_base(r, now, at.format).saturating_add(d));
            // The payload is written once, beside the job, and read back only to dispatch it.
            let mut request = r.clone();
            let payload = std::mem::take(&mut request.payload);
            let job = Job {
                request,
                payload_len: payload.len() as u64,
                payload_digest: payload_digest(&payload),
                payload_of: None,
                job_hash: e.job_hash.clone(),
                state: JobState::Pending,
                pools: e.pools.clone(),
                attempt: 0,
                constraints: Default::default(),
                policy_snapshot: None,
                worker_id: None,
                pool: None,
                partition: None,
                accepted_at: now,
                updated_at: now,
                queued_at: None,
                first_queued_at: None,
                retry_at: None,
                dispatched_at: None,
                started_at: None,
                last_evidence_at: None,
                deadline_at,
                delayed_until: None,
                released_at: None,
                concurrency: None,
                placement_from: None,
                wait_reason: None,
                progress: None,
                last_error: None,
                result_ptr: None,
                result_meta: None,
                execution_ms: None,
                dlq_reason: None,
                history_lines: 0,
                history_omitted: 0,
                history_progress: false,
                aged: 0,
                awaiting: None,
                awaited: false,
            };
            let batch = (job.request.batch_id.clone()).map(|b| (job.request.tenant_id.clone(), b));
            state.insert_job(e.job_id.clone(), job, Some(line(event, at)));
            if let Some(key) = batch {
                state.join_batch(key);
            }
            if let Some(d) = state.dirty.as_mut()
                && !payload.is_empty()
            {
                d.payloads.insert(e.job_id.clone(), payload);
            }
            let unique = e.unique_key.as_ref().map(|key| {
                let scope = crate::decide::unique_scope(&r.tenant_id, &r.topic);
                (scope, key.clone())
            });
            let idempotent = r
                .meta
                .idempotency_key
                .as_ref()
                .map(|key| (r.tenant_id.clone(), key.clone()));
            for k in [idempotent, unique].into_iter().flatten() {
                state.idempotency.insert(
                    k.clone(),
                    IdempotencyEntry {
                        job_id: e.job_id.clone(),
                        seen_at: now,
                    },
                );
                if let Some(d) = state.dirty.as_mut() {
                    d.idempotency.insert(k);
                }
            }
        }
        Event::JobDebounced(e) => {
            let Some(job) = state.jobs.get(&e.job_id) else {
                return;
            };
            let key = (
                job.request.tenant_id.clone(),
                job.request.topic.clone(),
                e.key.clone(),
            );
            let window = crate::state::Debounce {
                job_id: e.job_id.clone(),
                first_at: e.first_at,
                due: e.due,
            };
            state.open_debounce(key, window);
            state.write_history(&e.job_id, line(event, at));
        }
        Event::DebouncesClosed(e) => state.close_debounces(e.through),
        Event::JobDuplicate(e) => {
            state.write_history(&e.existing_job_id, line(event, at));
        }
        Event::PolicyEvaluated(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                j.constraints = e.constraints.clone();
                j.policy_snapshot = Some(e.snapshot_id.clone());
                if let Some(d) = e.constraints.deadline_ms.filter(|d| *d > 0) {
                    j.deadline_at =
                        Some(deadline_base(&j.request, j.accepted_at, at.format).saturating_add(d));
                }
                j.updated_at = now;
            });
        }
        Event::JobQueued(e) => {
            let config = state.config.clone();
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::Pending);
                j.queued_at = Some(now);
                j.aged = 0;
                j.first_queued_at.get_or_insert(now);
                j.placement_from = None;
                j.concurrency = config
                    .as_deref()
                    .and_then(|c| j.concurrency_under(&c.rules));
                j.retry_at = None;
                j.worker_id = None;
                j.pool = None;
                j.partition = None;
                j.updated_at = now;
            });
        }
        Event::JobWaiting(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                j.wait_reason = Some(e.reason_code.clone());
                // Held by its key while a worker could take it: its placement timeout starts
                // again (docs/flow-control.md; SPEC §4 would dead-letter it).
                if WaitReason::parse(&e.reason_code).is_some_and(WaitReason::is_flow_limit) {
                    j.placement_from = Some(now);
                }
            });
        }
        Event::JobScheduled(e) => {
            let memory = state.jobs.get(&e.job_id).and_then(|j| j.memory_demand());
            if let Some(w) = state.workers.get_mut(&e.worker_id) {
                w.reserved_memory = w.reserved_memory.saturating_add(memory.unwrap_or(0));
                state.mark_worker(&e.worker_id);
            }
            if let Some(b) = state.breakers.get_mut(&e.pool)
                && b.state == CircuitState::HalfOpen
            {
                b.probes.insert(e.job_id.clone());
                state.mark_breaker(&e.pool);
            }
            let placed = state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::Scheduled);
                j.attempt = e.attempt;
                j.queued_at = None;
                j.wait_reason = None;
                j.worker_id = Some(e.worker_id.clone());
                j.pool = Some(e.pool.clone());
                j.updated_at = now;
                let rated = (j.concurrency.as_ref())
                    .filter(|c| c.rate.is_some())
                    .cloned();
                let turn = (j.concurrency.as_ref())
                    .filter(|c| c.fair)
                    .map_or(String::new(), |c| c.key.clone());
                (j.request.tenant_id.clone(), j.queue_rank(), rated, turn)
            });
            if let Some((tenant, rank, rated, turn)) = placed {
                state.charge_share(&e.pool, rank, &tenant, &turn);
                if let Some(limits) = rated {
                    state.take_token(&tenant, &limits);
                }
            }
        }
        Event::JobDispatched(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::Dispatched);
                j.partition = Some(e.partition);
                j.dispatched_at = Some(now);
                j.updated_at = now;
            });
        }
        Event::JobRunning(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::Running);
                j.worker_id = Some(e.worker_id.clone());
                j.started_at = Some(now);
                j.last_evidence_at = Some(now);
                j.updated_at = now;
            });
        }
        Event::JobProgressed(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                j.progress = Some(e.progress);
                j.last_evidence_at = Some(now);
                j.updated_at = now;
            });
        }
        Event::JobSucceeded(e) => {
            let pool = state.jobs.get(&e.job_id).and_then(|j| j.pool.clone());
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::Succeeded);
                j.result_ptr = e.result_ptr.clone();
                j.result_meta = Some(e.result_meta.clone());
                j.execution_ms = Some(e.execution_ms);
                j.progress = Some(1.0);
                j.updated_at = now;
            });
            if legacy_breaker && let Some(pool) = pool {
                let w = window(state);
                breaker_result(state, &pool, false, w);
            }
        }
        Event::JobQuarantined(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::OutputQuarantined);
                j.updated_at = now;
            });
        }
        Event::JobRetrying(e) => {
            let counted = legacy_breaker
                .then(|| pool_failure(state, &e.job_id, &e.error_code))
                .flatten();
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::Pending);
                j.retry_at = Some(e.retry_at);
                j.queued_at = None;
                j.worker_id = None;
                j.pool = None;
                j.partition = None;
                j.progress = None;
                j.last_error = Some(error_text(&e.error_code, e.error_message.as_deref()));
                j.updated_at = now;
            });
            if let Some(pool) = counted {
                let w = window(state);
                breaker_result(state, &pool, true, w);
            }
        }
        Event::JobFailed(e) => {
            let counted = legacy_breaker
                .then(|| pool_failure(state, &e.job_id, &e.reason_code))
                .flatten();
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::Failed);
                j.queued_at = None;
                j.retry_at = None;
                j.last_error = Some(error_text(&e.reason_code, e.error_message.as_deref()));
                j.updated_at = now;
            });
            if let Some(pool) = counted {
                let w = window(state);
                breaker_result(state, &pool, true, w);
            }
        }
        Event::JobCancelled(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::Cancelled);
                j.queued_at = None;
                j.retry_at = None;
                j.updated_at = now;
            });
        }
        Event::JobTimedOut(e) => {
            let counted = (legacy_breaker && e.reason_code == DlqReason::Timeout.as_str())
                .then(|| pool_failure(state, &e.job_id, &e.reason_code))
                .flatten();
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::Timeout);
                j.queued_at = None;
                j.retry_at = None;
                j.last_error = Some(format!("{}: {}", e.reason_code, e.detail));
                j.updated_at = now;
            });
            if let Some(pool) = counted {
                let w = window(state);
                breaker_result(state, &pool, true, w);
            }
        }
        Event::JobDenied(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::Denied);
                j.queued_at = None;
                j.updated_at = now;
            });
        }
        Event::ApprovalRequested(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::ApprovalRequired);
                j.queued_at = None;
                j.policy_snapshot = Some(e.snapshot_id.clone());
                j.updated_at = now;
            });
        }
        Event::JobApproved(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::Pending);
                j.updated_at = now;
            });
        }
        Event::DispatchCancelled(e) => {
            state.write_history(&e.job_id, line(event, at));
        }
        Event::DeadLettered(e) => {
            let dl = &e.dead_letter;
            // Workers choose their own error codes: past a bound, new ones count together.
            let counted = if state.dead_letters_by_reason.len() >= MAX_COUNTED_REASONS
                && !state.dead_letters_by_reason.contains_key(&dl.reason_code)
            {
                OTHER_REASONS.to_owned()
            } else {
                dl.reason_code.clone()
            };
            *state.dead_letters_by_reason.entry(counted).or_default() += 1;
            // A refusal of a new job names no job of the state (a duplicate's names the job
            // it duplicates; a job refused for a short disk was never accepted).
            let refused_new = [DlqReason::DuplicateJobId, DlqReason::StorageFull]
                .iter()
                .any(|r| dl.reason_code == r.as_str());
            if !dl.job_id.is_empty() && !refused_new {
                state.update_job_logged(&dl.job_id, Some(line(event, at)), |j| {
                    j.dlq_reason = Some(dl.reason_code.clone());
                });
            }
            // Refusals for a short disk are not kept in the store, which they would fill:
            // the DLQ topic and the journal have them.
            if let Some(d) = state.dirty.as_mut()
                && dl.reason_code != DlqReason::StorageFull.as_str()
            {
                d.dead_letters.push((**dl).clone());
            }
        }
        Event::CommandRejected(e) => {
            if !e.job_id.is_empty() {
                state.write_history(&e.job_id, line(event, at));
            }
        }
        Event::WorkerUpdated(e) => {
            let hb = &e.heartbeat;
            // A heartbeat is evidence for the running jobs it lists: their timers move, the
            // jobs do not change. A job it stops listing keeps the time it was last listed,
            // written to the job once. Timers are derived from the worker's record, so the
            // affected jobs leave the index before it changes and return after.
            let (listed_before, seen_before) = state
                .workers
                .get(&e.worker_id)
                .map(|w| (w.heartbeat.active_job_ids.clone(), w.last_seen))
                .unwrap_or_default();
            let running_here = |state: &State, id: &String| {
                state.jobs.get(id).is_some_and(|j| {
                    j.state == JobState::Running && j.worker_id.as_deref() == Some(&e.worker_id)
                })
            };
            let mut affected: Vec<String> = listed_before
                .iter()
                .chain(&hb.active_job_ids)
                .filter(|id| running_here(state, id))
                .cloned()
                .collect();
            affected.sort();
            affected.dedup();
            for id in &affected {
                state.unindex_job(id);
            }
            if !state.workers.contains_key(&e.worker_id) {
                // A job may already name this worker (it took the job after a rebalance before
                // its first heartbeat): the new record takes those over.
                state.insert_worker(
                    &e.worker_id,
                    Worker {
                        heartbeat: (**hb).clone(),
                        joined_at: now,
                        last_seen: now,
                        alive: true,
                        foreign_active: 0,
                        reserved_memory: 0,
                        inflight: Default::default(),
                    },
                );
            }
            let pool_before = state
                .workers
                .get(&e.worker_id)
                .map(|w| w.heartbeat.pool.clone());
            if let Some(before) = pool_before {
                state.move_worker(&before, &hb.pool);
            }
            if let Some(w) = state.workers.get_mut(&e.worker_id) {
                if e.joined {
                    w.joined_at = now;
                }
                w.heartbeat = (**hb).clone();
                w.last_seen = now;
                w.alive = true;
                w.reserved_memory = 0;
            }
            state.mark_worker(&e.worker_id);
            for id in &affected {
                state.index_job(id);
            }
            if let Some(w) = state.workers.get_mut(&e.worker_id) {
                w.foreign_active = if hb.active_job_ids.is_empty() {
                    let counted = i32::try_from(w.inflight.len()).unwrap_or(i32::MAX);
                    hb.active_jobs.saturating_sub(counted).max(0)
                } else {
                    let foreign = hb
                        .active_job_ids
                        .iter()
                        .filter(|id| !w.inflight.contains(*id))
                        .count();
                    i32::try_from(foreign).unwrap_or(i32::MAX)
                };
            }
            for id in &listed_before {
                if !hb.active_job_ids.contains(id) && running_here(state, id) {
                    state.update_job(id, |j| {
                        j.last_evidence_at = j.last_evidence_at.max(Some(seen_before));
                    });
                }
            }
        }
        Event::WorkerLost(e) => {
            if let Some(w) = state.workers.get_mut(&e.worker_id) {
                w.alive = false;
                w.foreign_active = 0;
                w.reserved_memory = 0;
                state.mark_worker(&e.worker_id);
            }
        }
        Event::CircuitChanged(e) => {
            let b = state.breakers.entry(e.pool.clone()).or_default();
            b.state = e.to;
            match e.to {
                CircuitState::Open => {
                    b.opened_at = Some(now);
                    b.probes.clear();
                    b.probe_successes = 0;
                }
                CircuitState::HalfOpen => {
                    b.probes.clear();
                    b.probe_successes = 0;
                    b.consecutive_failures = 0;
                }
                CircuitState::Closed => {
                    *b = Breaker::default();
                }
            }
            state.mark_breaker(&e.pool);
        }
        Event::SagaStepRecorded(e) => {
            let key = crate::state::step_saga_key(e, at.format);
            state
                .sagas
                .entry(key.clone())
                .or_default()
                .stack
                .push(SagaStep {
                    job_id: e.job_id.clone(),
                    tenant_id: e.tenant_id.clone(),
                    principal_id: e.principal_id.clone(),
                    compensation: (*e.compensation).clone(),
                    topic: e.topic.clone(),
                });
            state.mark_saga(&key);
        }
        Event::SagaRollbackStarted(e) => {
            let key = saga_key_of(e.tenant_id.as_deref(), &e.workflow_id);
            let s = state.sagas.entry(key.clone()).or_default();
            s.failed_job_id = Some(e.failed_job_id.clone());
            state.mark_saga(&key);
        }
        Event::SagaCompensationSubmitted(e) => {
            let key = saga_key_of(e.tenant_id.as_deref(), &e.workflow_id);
            if let Some(s) = state.sagas.get_mut(&key) {
                s.stack.pop();
                s.running = Some(e.job_id.clone());
                s.compensations_submitted += 1;
                // A step that succeeded after the rollback ended opens it again.
                s.outcome = None;
                state.mark_saga(&key);
            }
        }
        Event::SagaCompensationEnded(e) => {
            let key = saga_key_of(e.tenant_id.as_deref(), &e.workflow_id);
            if let Some(s) = state.sagas.get_mut(&key) {
                if s.running.as_deref() == Some(e.job_id.as_str()) {
                    s.running = None;
                }
                if !e.succeeded {
                    s.compensations_failed += 1;
                }
                state.mark_saga(&key);
            }
        }
        Event::SagaFinished(e) => {
            let key = saga_key_of(e.tenant_id.as_deref(), &e.workflow_id);
            if let Some(s) = state.sagas.get_mut(&key) {
                s.outcome = Some(e.outcome);
                s.running = None;
                state.mark_saga(&key);
            }
        }
        Event::IdempotencyPruned(e) => {
            state.idempotency.retain(|_, v| v.seen_at >= e.before);
            state.last_idempotency_prune = now;
            if let Some(d) = state.dirty.as_mut() {
                d.idempotency_pruned_before = Some(e.before);
            }
        }
        Event::ConfigApplied(e) => {
            let rules = Rules::from_json(&e.config.rules_json).unwrap_or_default();
            let before = (state.config.take()).filter(|old| !old.rules.reindex_queued(&rules));
            state.config = Some(Arc::new(ActiveConfig {
                raw: e.config.clone(),
                rules,
            }));
            // Rules that index queued jobs alike re-index the jobs in memory alone: the
            // backlog in storage is not read ([`crate::state::State::reads_backlog_for`]).
            match before {
                Some(old) => state.reindex_under(&old.rules),
                None => {
                    state.resolve_queued_concurrency();
                    state.rebuild_indexes();
                }
            }
            if let Some(d) = state.dirty.as_mut() {
                d.config = true;
            }
        }
        Event::BreakerCounted(e) => {
            let w = window(state);
            breaker_result(state, &e.pool, e.failure, w);
        }
        Event::ClockGap(e) => state.raise_liveness_floor(e.to),
        Event::WorkerForgotten(e) => {
            if state.remove_worker(&e.worker_id).is_some() {
                state.mark_worker(&e.worker_id);
            }
        }
        Event::JobRedriven(e) => {
            // The new job (accepted just before) runs the old one's stored payload.
            let payload = state.jobs.get(&e.job_id).map(|old| {
                (
                    old.payload_of.clone().unwrap_or_else(|| e.job_id.clone()),
                    old.payload_len,
                    old.payload_digest,
                )
            });
            if let Some((of, len, digest)) = payload {
                state.update_job(&e.new_job_id, |j| {
                    j.payload_of = Some(of);
                    j.payload_len = len;
                    j.payload_digest = digest;
                });
            }
            state.write_history(&e.job_id, line(event, at));
            state.write_history(&e.new_job_id, line(event, at));
        }
        Event::JobDelayed(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::Delayed);
                j.delayed_until = Some(e.not_before);
                j.queued_at = None;
                j.retry_at = None;
                j.updated_at = now;
            });
        }
        Event::JobAged(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                j.aged = j.request.priority.rank().saturating_sub(e.priority.rank());
                j.updated_at = now;
            });
        }
        Event::JobReleased(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::Pending);
                j.delayed_until = None;
                j.released_at = Some(e.released_at);
                // As if submitted at its release (SPEC §9): the deadline counts from here.
                let deadline_ms = j
                    .constraints
                    .deadline_ms
                    .or(j.request.budget.deadline_ms)
                    .filter(|d| *d > 0);
                j.deadline_at = deadline_ms.map(|d| e.released_at.saturating_add(d));
                j.updated_at = now;
            });
        }
        Event::JobRescheduled(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                j.delayed_until = Some(e.not_before);
                j.updated_at = now;
            });
        }
        Event::JobBlocked(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::Blocked);
                // Its dependency timeout is its due time: it waits in the delay index.
                j.delayed_until = Some(e.until);
                let mut open = e.waiting_on.clone();
                open.sort_unstable();
                open.dedup();
                j.awaiting = Some(Box::new(crate::state::Awaiting {
                    open,
                    succeeded: e.succeeded,
                    failed: e.failed,
                }));
                j.queued_at = None;
                j.retry_at = None;
                j.updated_at = now;
            });
        }
        Event::JobAwaited(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                j.awaited = true;
            });
        }
        Event::DependencyResolved(e) => {
            state.told(&e.dependency, &e.job_id);
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                if let Some(a) = j.awaiting.as_mut()
                    && let Ok(i) = a.open.binary_search(&e.dependency)
                {
                    a.open.remove(i);
                    if e.state == JobState::Succeeded {
                        a.succeeded += 1;
                    } else {
                        a.failed += 1;
                    }
                }
                j.updated_at = now;
            });
        }
        Event::JobUnblocked(e) => {
            state.update_job_logged(&e.job_id, Some(line(event, at)), |j| {
                enter(j, JobState::Pending);
                // A batch's callback runs with the batch's counts in its request.
                if let Some(batch_id) = j.request.after_batch.clone() {
                    j.request.batch_outcome = Some(crate::records::BatchOutcome {
                        batch_id,
                        succeeded: e.succeeded,
                        failed: e.failed,
                    });
                }
                j.delayed_until = None;
                j.released_at = Some(now);
                // As if submitted now (SPEC §11): the deadline counts from here.
                let deadline_ms = j
                    .constraints
                    .deadline_ms
                    .or(j.request.budget.deadline_ms)
                    .filter(|d| *d > 0);
                j.deadline_at = deadline_ms.map(|d| now.saturating_add(d));
                j.updated_at = now;
            });
        }
        Event::DependentsSettled(e) => state.end_settling(&e.job_id),
        Event::BatchOpened(e) => {
            let key = (e.tenant_id.clone(), e.batch_id.clone());
            state.open_batch(key, e.expected, now, e.until);
        }
        Event::BatchClosed(e) => {
            let key = (e.tenant_id.clone(), e.batch_id.clone());
            state.close_batch(key, e.state, &e.principal_id);
        }
        Event::BatchMembersCancelled(e) => {
            let members = crate::state::batch_members(&e.tenant_id, &e.batch_id);
            state.told(&members, &e.through);
        }
        Event::BatchForgotten(e) => {
            state.forget_batch(&(e.tenant_id.clone(), e.batch_id.clone()));
        }
        Event::ScheduleChanged(e) => apply_schedule_changed(state, e, now),
        Event::ScheduleFired(e) => apply_schedule_fired(state, e, at),
    }
}

fn apply_schedule_changed(state: &mut State, e: &ScheduleChanged, now: Millis) {
    use crate::records::ScheduleAction;
    let key = crate::schedule::schedule_key(&e.tenant_id, &e.schedule_id);
    match e.action {
        ScheduleAction::Create => {
            let spec = e.spec.as_deref().cloned().unwrap_or_default();
            let schedule = crate::state::Schedule {
                schedule_id: e.schedule_id.clone(),
                tenant_id: e.tenant_id.clone(),
                principal_id: e.principal_id.clone(),
                paused: spec.paused,
                spec,
                created_at: now,
                updated_at: now,
                next_slot: e.next_slot,
                ..Default::default()
            };
            state.put_schedule(&key, Some(schedule));
        }
        ScheduleAction::Update => state.update_schedule(&key, |s| {
            if let Some(spec) = e.spec.as_deref() {
                // An update may pause a schedule; only RESUME makes a paused one fire again
                // (and catches up what it missed).
                s.paused = s.paused || spec.paused;
                s.spec = spec.clone();
            }
            s.principal_id = e.principal_id.clone();
            s.next_slot = e.next_slot;
            s.updated_at = now;
        }),
        ScheduleAction::Pause => state.update_schedule(&key, |s| {
            s.paused = true;
            s.updated_at = now;
        }),
        ScheduleAction::Resume => state.update_schedule(&key, |s| {
            s.paused = false;
            s.next_slot = e.next_slot;
            s.updated_at = now;
        }),
        ScheduleAction::Delete => state.put_schedule(&key, None),
        // A trigger is journaled as the firing it makes (ScheduleFired).
        ScheduleAction::Trigger => {}
    }
}

fn apply_schedule_fired(state: &mut State, e: &ScheduleFired, at: &Applying<'_>) {
    let key = crate::schedule::schedule_key(&e.tenant_id, &e.schedule_id);
    state.update_schedule(&key, |s| {
        match e.outcome {
            ScheduleOutcome::Submitted => {
                s.submitted += 1;
                s.last_job = e.job_id.clone();
                if s.buffered == Some(e.slot) {
                    s.buffered = None;
                }
            }
            ScheduleOutcome::Buffered => s.buffered = Some(e.slot),
            ScheduleOutcome::Skipped => s.skipped += 1,
            ScheduleOutcome::Missed => s.missed += 1,
            ScheduleOutcome::Refused => {
                s.refused += 1;
                if s.buffered == Some(e.slot) {
                    s.buffered = None;
                }
            }
        }
        // The decision says where the schedule's times stand (a trigger, or a buffered
        // firing that runs, leaves them where they were).
        s.next_slot = e.next_slot;
        s.recent.push(crate::state::Firing {
            slot: e.slot,
            outcome: e.outcome.as_str().to_owned(),
            job_id: e.job_id.clone(),
            triggered: e.triggered,
            detail: e.detail.clone(),
        });
        let excess = s
            .recent
            .len()
            .saturating_sub(crate::state::Schedule::RECENT);
        s.recent.drain(..excess);
        s.updated_at = at.now;
    });
}

/// Decision format 1: the pool whose breaker a failure counts against. Only failures of a
/// dispatched or running attempt, and not the ones that say nothing about the pool.
fn pool_failure(state: &State, job_id: &str, code: &str) -> Option<String> {
    let j = state.jobs.get(job_id)?;
    let executing = matches!(j.state, JobState::Dispatched | JobState::Running);
    (executing && AttemptError::is_pool_failure(code))
        .then(|| j.pool.clone())
        .flatten()
}

fn error_text(code: &str, message: Option<&str>) -> String {
    match message {
        Some(m) if !m.is_empty() => format!("{code}: {m}"),
        _ => code.to_owned(),
    }
}

/// Moves a job to `to`. The decider only emits moves SPEC §2 allows; a build with debug
/// assertions (every test) checks each one against [`JobState::can_transition`].
fn enter(j: &mut crate::state::Job, to: JobState) {
    debug_assert!(
        j.state == to || j.state.can_transition(to),
        "job {}: {} -> {to} is not a SPEC §2 transition",
        j.request.job_id,
        j.state
    );
    j.state = to;
}
