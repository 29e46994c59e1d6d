//! `apply`: the only way the projection changes.
//!
//! Live processing, recovery and audit replay all fold journal entries through
//! [`apply_entry`], so a rebuilt projection equals the live one by construction.

use std::sync::Arc;

use crate::events::*;
use crate::records::Millis;
use crate::rules::Rules;
use crate::state::{
    ActiveConfig, Breaker, HistoryItem, IdempotencyEntry, Job, SagaStep, State, Worker,
};

/// Error codes of failures that say nothing about the pool's health (no breaker count).
pub const NOT_POOL_FAILURES: &[&str] = &[ERROR_WORKER_LOST, ERROR_HANDED_BACK];
/// A worker stopped heartbeating while it had the job.
pub const ERROR_WORKER_LOST: &str = "worker_lost";
/// A draining worker gave the job back (result CANCELLED without a cancel request).
pub const ERROR_HANDED_BACK: &str = "handed_back";

/// Applies one journal entry: advances the clock, then applies its events in order.
pub fn apply_entry(state: &mut State, entry: &JournalEntry) {
    begin_entry(state, entry.log_time);
    for e in &entry.events {
        apply(state, e, entry.log_time);
    }
}

pub(crate) fn begin_entry(state: &mut State, log_time: Millis) {
    state.clock = state.clock.max(log_time);
    state.entries += 1;
}

fn history(job: &mut Job, at: Millis, event: &str, detail: String) {
    job.history.push(HistoryItem {
        at,
        event: event.to_owned(),
        detail,
    });
}

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

/// Applies one event at log time `now`.
pub fn apply(state: &mut State, event: &Event, now: Millis) {
    match event {
        Event::JobAccepted(e) => {
            let r = &e.request;
            let deadline_at = r
                .budget
                .deadline_ms
                .filter(|d| *d > 0)
                .map(|d| r.submitted_at.saturating_add(d));
            let mut job = Job {
                request: r.clone(),
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
                retry_at: None,
                dispatched_at: None,
                started_at: None,
                last_evidence_at: None,
                deadline_at,
                wait_reason: None,
                progress: None,
                last_error: None,
                result_ptr: None,
                result_meta: None,
                execution_ms: None,
                dlq_reason: None,
                history: Vec::new(),
            };
            let mut detail = format!("topic {} -> pools [{}]", r.topic, e.pools.join(", "));
            for n in &e.routing_notes {
                detail.push_str("; ");
                detail.push_str(n);
            }
            history(&mut job, now, "JobAccepted", detail);
            state.insert_job(e.job_id.clone(), job);
            if let Some(key) = &r.meta.idempotency_key {
                let k = (r.tenant_id.clone(), key.clone());
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
        Event::JobDuplicate(e) => {
            let detail = match e.kind {
                DuplicateKind::SameJobId => {
                    "same job_id and content submitted again; ignored".to_owned()
                }
                DuplicateKind::ConflictingJobId => {
                    "same job_id with different content; dead-lettered".to_owned()
                }
                DuplicateKind::IdempotencyKey => format!(
                    "job {} reused idempotency key {}; ignored",
                    e.job_id,
                    e.idempotency_key.as_deref().unwrap_or("")
                ),
            };
            state.update_job(&e.existing_job_id, |j| {
                history(j, now, "JobDuplicate", detail)
            });
        }
        Event::PolicyEvaluated(e) => {
            state.update_job(&e.job_id, |j| {
                j.constraints = e.constraints.clone();
                j.policy_snapshot = Some(e.snapshot_id.clone());
                if let Some(d) = e.constraints.deadline_ms.filter(|d| *d > 0) {
                    j.deadline_at = Some(j.request.submitted_at.saturating_add(d));
                }
                j.updated_at = now;
                let mut detail = format!("{:?} under snapshot {}", e.verdict, e.snapshot_id);
                if !e.reasons.is_empty() {
                    detail.push_str(": ");
                    detail.push_str(&e.reasons.join("; "));
                }
                history(j, now, "PolicyEvaluated", detail);
            });
        }
        Event::JobQueued(e) => {
            state.update_job(&e.job_id, |j| {
                j.state = JobState::Pending;
                j.queued_at = Some(now);
                j.retry_at = None;
                j.worker_id = None;
                j.pool = None;
                j.partition = None;
                j.updated_at = now;
                history(j, now, "JobQueued", format!("in [{}]", e.pools.join(", ")));
            });
        }
        Event::JobWaiting(e) => {
            state.update_job(&e.job_id, |j| {
                j.wait_reason = Some(e.reason_code.clone());
                history(
                    j,
                    now,
                    "JobWaiting",
                    format!("{}: {}", e.reason_code, e.detail),
                );
            });
        }
        Event::JobScheduled(e) => {
            let memory = state.jobs.get(&e.job_id).and_then(Job::memory_demand);
            if let Some(w) = state.workers.get_mut(&e.worker_id) {
                w.reserved_memory = w.reserved_memory.saturating_add(memory.unwrap_or(0));
                state.mark_worker(&e.worker_id);
            }
            if let Some(b) = state.breakers.get_mut(&e.pool)
                && b.state == CircuitState::HalfOpen
            {
                b.probes_sent += 1;
                state.mark_breaker(&e.pool);
            }
            state.update_job(&e.job_id, |j| {
                j.state = JobState::Scheduled;
                j.attempt = e.attempt;
                j.queued_at = None;
                j.wait_reason = None;
                j.worker_id = Some(e.worker_id.clone());
                j.pool = Some(e.pool.clone());
                j.updated_at = now;
                history(
                    j,
                    now,
                    "JobScheduled",
                    format!(
                        "attempt {} on {} in {} by {} ({} candidates)",
                        e.attempt,
                        e.worker_id,
                        e.pool,
                        e.strategy,
                        e.candidates.len()
                    ),
                );
            });
        }
        Event::JobDispatched(e) => {
            state.update_job(&e.job_id, |j| {
                j.state = JobState::Dispatched;
                j.partition = Some(e.partition);
                j.dispatched_at = Some(now);
                j.updated_at = now;
                history(
                    j,
                    now,
                    "JobDispatched",
                    format!(
                        "attempt {} to {} partition {}",
                        e.attempt, e.worker_id, e.partition
                    ),
                );
            });
        }
        Event::JobRunning(e) => {
            state.update_job(&e.job_id, |j| {
                j.state = JobState::Running;
                j.worker_id = Some(e.worker_id.clone());
                j.started_at = Some(now);
                j.last_evidence_at = Some(now);
                j.updated_at = now;
                let detail = match &e.reassigned_from {
                    Some(from) => format!(
                        "attempt {} on {} (reassigned from {from})",
                        e.attempt, e.worker_id
                    ),
                    None => format!("attempt {} on {}", e.attempt, e.worker_id),
                };
                history(j, now, "JobRunning", detail);
            });
        }
        Event::JobProgressed(e) => {
            state.update_job(&e.job_id, |j| {
                j.progress = Some(e.progress);
                j.last_evidence_at = Some(now);
                j.updated_at = now;
                let detail = format!(
                    "{:.0}%{}",
                    e.progress * 100.0,
                    e.message
                        .as_deref()
                        .map(|m| format!(" {m}"))
                        .unwrap_or_default()
                );
                // Progress is frequent: keep only the latest line of a run of progress.
                match j.history.last_mut() {
                    Some(last) if last.event == "JobProgressed" => {
                        last.at = now;
                        last.detail = detail;
                    }
                    _ => history(j, now, "JobProgressed", detail),
                }
            });
        }
        Event::JobSucceeded(e) => {
            let pool = state.jobs.get(&e.job_id).and_then(|j| j.pool.clone());
            state.update_job(&e.job_id, |j| {
                j.state = JobState::Succeeded;
                j.result_ptr = e.result_ptr.clone();
                j.result_meta = Some(e.result_meta.clone());
                j.execution_ms = Some(e.execution_ms);
                j.progress = Some(1.0);
                j.updated_at = now;
                history(
                    j,
                    now,
                    "JobSucceeded",
                    format!(
                        "attempt {} on {} in {} ms",
                        e.attempt, e.worker_id, e.execution_ms
                    ),
                );
            });
            if let Some(pool) = pool {
                let w = window(state);
                breaker_result(state, &pool, false, w);
            }
        }
        Event::JobQuarantined(e) => {
            state.update_job(&e.job_id, |j| {
                j.state = JobState::OutputQuarantined;
                j.updated_at = now;
                history(j, now, "JobQuarantined", e.reasons.join("; "));
            });
        }
        Event::JobRetrying(e) => {
            let counted = pool_failure(state, &e.job_id, &e.error_code);
            state.update_job(&e.job_id, |j| {
                j.state = JobState::Pending;
                j.retry_at = Some(e.retry_at);
                j.queued_at = None;
                j.worker_id = None;
                j.pool = None;
                j.partition = None;
                j.progress = None;
                j.last_error = Some(error_text(&e.error_code, e.error_message.as_deref()));
                j.updated_at = now;
                history(
                    j,
                    now,
                    "JobRetrying",
                    format!(
                        "attempt {} failed ({}); retry in {} ms",
                        e.attempt, e.error_code, e.backoff_ms
                    ),
                );
            });
            if let Some(pool) = counted {
                let w = window(state);
                breaker_result(state, &pool, true, w);
            }
        }
        Event::JobFailed(e) => {
            let counted = pool_failure(state, &e.job_id, &e.reason_code);
            state.update_job(&e.job_id, |j| {
                j.state = JobState::Failed;
                j.queued_at = None;
                j.retry_at = None;
                j.last_error = Some(error_text(&e.reason_code, e.error_message.as_deref()));
                j.updated_at = now;
                history(j, now, "JobFailed", e.reason_code.clone());
            });
            if let Some(pool) = counted {
                let w = window(state);
                breaker_result(state, &pool, true, w);
            }
        }
        Event::JobCancelled(e) => {
            state.update_job(&e.job_id, |j| {
                j.state = JobState::Cancelled;
                j.queued_at = None;
                j.retry_at = None;
                j.updated_at = now;
                history(
                    j,
                    now,
                    "JobCancelled",
                    format!(
                        "by {}{}",
                        e.principal_id,
                        e.reason
                            .as_deref()
                            .map(|r| format!(": {r}"))
                            .unwrap_or_default()
                    ),
                );
            });
        }
        Event::JobTimedOut(e) => {
            let counted = (e.reason_code == "timeout")
                .then(|| pool_failure(state, &e.job_id, &e.reason_code))
                .flatten();
            state.update_job(&e.job_id, |j| {
                j.state = JobState::Timeout;
                j.queued_at = None;
                j.retry_at = None;
                j.last_error = Some(format!("{}: {}", e.reason_code, e.detail));
                j.updated_at = now;
                history(
                    j,
                    now,
                    "JobTimedOut",
                    format!("{}: {}", e.reason_code, e.detail),
                );
            });
            if let Some(pool) = counted {
                let w = window(state);
                breaker_result(state, &pool, true, w);
            }
        }
        Event::JobDenied(e) => {
            state.update_job(&e.job_id, |j| {
                j.state = JobState::Denied;
                j.queued_at = None;
                j.updated_at = now;
                history(
                    j,
                    now,
                    "JobDenied",
                    format!("{}: {}", e.reason_code, e.reasons.join("; ")),
                );
            });
        }
        Event::ApprovalRequested(e) => {
            state.update_job(&e.job_id, |j| {
                j.state = JobState::ApprovalRequired;
                j.queued_at = None;
                j.policy_snapshot = Some(e.snapshot_id.clone());
                j.updated_at = now;
                history(j, now, "ApprovalRequested", e.reasons.join("; "));
            });
        }
        Event::JobApproved(e) => {
            state.update_job(&e.job_id, |j| {
                j.state = JobState::Pending;
                j.updated_at = now;
                history(j, now, "JobApproved", format!("by {}", e.approver));
            });
        }
        Event::DispatchCancelled(e) => {
            state.update_job(&e.job_id, |j| {
                history(
                    j,
                    now,
                    "DispatchCancelled",
                    format!("attempt {} on {}: {}", e.attempt, e.worker_id, e.reason),
                )
            });
        }
        Event::DeadLettered(e) => {
            let dl = &e.dead_letter;
            *state
                .dead_letters_by_reason
                .entry(dl.reason_code.clone())
                .or_default() += 1;
            if !dl.job_id.is_empty() && dl.reason_code != "duplicate_job_id" {
                state.update_job(&dl.job_id, |j| {
                    j.dlq_reason = Some(dl.reason_code.clone());
                    history(
                        j,
                        now,
                        "DeadLettered",
                        format!("{}: {}", dl.reason_code, dl.reason),
                    );
                });
            }
            if let Some(d) = state.dirty.as_mut() {
                d.dead_letters.push(dl.clone());
            }
        }
        Event::CommandRejected(e) => {
            if !e.job_id.is_empty() {
                state.update_job(&e.job_id, |j| {
                    history(
                        j,
                        now,
                        "CommandRejected",
                        format!("{} {}: {}", e.input_kind, e.reason_code, e.reason),
                    )
                });
            }
        }
        Event::WorkerUpdated(e) => {
            let hb = &e.heartbeat;
            if !state.workers.contains_key(&e.worker_id) {
                // A job may already name this worker (it took the job after a rebalance before
                // its first heartbeat): the new record starts with those in flight.
                let inflight = state
                    .jobs
                    .iter()
                    .filter(|(_, j)| {
                        j.state.is_active() && j.worker_id.as_deref() == Some(&e.worker_id)
                    })
                    .map(|(id, _)| id.clone())
                    .collect();
                state.workers.insert(
                    e.worker_id.clone(),
                    Worker {
                        heartbeat: hb.clone(),
                        joined_at: now,
                        last_seen: now,
                        alive: true,
                        foreign_active: 0,
                        reserved_memory: 0,
                        inflight,
                    },
                );
            }
            if let Some(w) = state.workers.get_mut(&e.worker_id) {
                if e.joined {
                    w.joined_at = now;
                }
                w.heartbeat = hb.clone();
                w.last_seen = now;
                w.alive = true;
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
                w.reserved_memory = 0;
            }
            state.mark_worker(&e.worker_id);
            // Jobs the worker says it runs are alive: refresh their evidence.
            for id in &hb.active_job_ids {
                let running_here = state.jobs.get(id).is_some_and(|j| {
                    j.state == JobState::Running && j.worker_id.as_deref() == Some(&e.worker_id)
                });
                if running_here {
                    state.update_job(id, |j| j.last_evidence_at = Some(now));
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
                    b.probes_sent = 0;
                    b.probe_successes = 0;
                }
                CircuitState::HalfOpen => {
                    b.probes_sent = 0;
                    b.probe_successes = 0;
                }
                CircuitState::Closed => {
                    *b = Breaker::default();
                }
            }
            state.mark_breaker(&e.pool);
        }
        Event::SagaStepRecorded(e) => {
            state
                .sagas
                .entry(e.workflow_id.clone())
                .or_default()
                .stack
                .push(SagaStep {
                    job_id: e.job_id.clone(),
                    tenant_id: e.tenant_id.clone(),
                    principal_id: e.principal_id.clone(),
                    compensation: e.compensation.clone(),
                });
            state.mark_saga(&e.workflow_id);
        }
        Event::SagaRollbackStarted(e) => {
            let s = state.sagas.entry(e.workflow_id.clone()).or_default();
            s.failed_job_id = Some(e.failed_job_id.clone());
            state.mark_saga(&e.workflow_id);
        }
        Event::SagaCompensationSubmitted(e) => {
            if let Some(s) = state.sagas.get_mut(&e.workflow_id) {
                s.stack.pop();
                s.running = Some(e.job_id.clone());
                s.compensations_submitted += 1;
                state.mark_saga(&e.workflow_id);
            }
        }
        Event::SagaFinished(e) => {
            if let Some(s) = state.sagas.get_mut(&e.workflow_id) {
                s.outcome = Some(e.outcome);
                s.running = None;
                state.mark_saga(&e.workflow_id);
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
            state.config = Some(Arc::new(ActiveConfig {
                raw: e.config.clone(),
                rules,
            }));
            state.rebuild_indexes();
            if let Some(d) = state.dirty.as_mut() {
                d.config = true;
            }
        }
    }
}

/// The pool whose breaker a failure counts against: only failures of a dispatched or running
/// attempt, and not the ones that say nothing about the pool (worker lost, handed back).
fn pool_failure(state: &State, job_id: &str, code: &str) -> Option<String> {
    let j = state.jobs.get(job_id)?;
    let executing = matches!(j.state, JobState::Dispatched | JobState::Running);
    (executing && !NOT_POOL_FAILURES.contains(&code))
        .then(|| j.pool.clone())
        .flatten()
}

fn error_text(code: &str, message: Option<&str>) -> String {
    match message {
        Some(m) if !m.is_empty() => format!("{code}: {m}"),
        _ => code.to_owned(),
    }
}
