//! Tick: time passes (SPEC §4). Lost workers, breaker cool-downs, due timers (retries,
//! deadlines, placement and reconciler timeouts), idempotency retention, and a scheduling pass
//! over every non-empty queue.

use crate::apply::ERROR_WORKER_LOST;
use crate::decide::Decider;
use crate::decide::placement::blocker_reason_code;
use crate::events::*;
use crate::state::{Timer, TimerKind};

/// Never prune idempotency keys more often than this (log time).
const MAX_PRUNE_INTERVAL_MS: i64 = 3_600_000;

impl Decider<'_, '_> {
    pub(super) fn tick(&mut self) {
        self.lose_silent_workers();
        let pools: Vec<String> = self.state().breakers.keys().cloned().collect();
        for pool in pools {
            self.maybe_half_open(&pool);
        }
        self.fire_due_timers();
        self.prune_idempotency();
        let pools: Vec<String> = self.state().queues.keys().cloned().collect();
        self.schedule_pools(pools);
    }

    fn lose_silent_workers(&mut self) {
        let ttl = self.rules().rules.timing.worker_ttl_ms;
        let lost: Vec<(String, String, i64, Vec<String>)> = self
            .state()
            .workers
            .iter()
            .filter(|(_, w)| w.alive && self.now.saturating_sub(w.last_seen) > ttl)
            .map(|(id, w)| {
                (
                    id.clone(),
                    w.heartbeat.pool.clone(),
                    w.last_seen,
                    w.inflight.iter().cloned().collect(),
                )
            })
            .collect();
        for (worker_id, pool, last_seen, job_ids) in lost {
            self.emit(Event::WorkerLost(WorkerLost {
                worker_id: worker_id.clone(),
                pool,
                last_seen,
                job_ids: job_ids.clone(),
            }));
            // The oncue agent-death rule: its jobs failed retryably.
            for job_id in job_ids {
                let message = format!(
                    "worker {worker_id} sent no heartbeat for more than {ttl} ms (last at {last_seen})"
                );
                self.retry_or_fail(&job_id, ERROR_WORKER_LOST, Some(message));
            }
        }
    }

    fn fire_due_timers(&mut self) {
        let due: Vec<Timer> = self
            .state()
            .timers
            .iter()
            .take_while(|t| t.due <= self.now)
            .cloned()
            .collect();
        let config = self.rules();
        let timing = &config.rules.timing;
        let mut requeued = Vec::new();
        for t in due {
            // An earlier timer in this tick may have settled the job already.
            if !self.state().timers.contains(&t) {
                continue;
            }
            let job = &self.state().jobs[&t.job_id];
            match t.kind {
                TimerKind::Deadline => {
                    let deadline_ms = job.deadline_at.unwrap_or(0) - job.request.submitted_at;
                    let detail = format!(
                        "deadline of {deadline_ms} ms from submission passed in state {}",
                        job.state
                    );
                    self.time_out(&t.job_id, "deadline_exceeded", detail);
                }
                TimerKind::RetryAt => requeued.push(t.job_id.clone()),
                TimerKind::PlacementTimeout => {
                    let blocked = self.blocker(&t.job_id);
                    let code = blocker_reason_code(blocked.code);
                    let reason = format!(
                        "not placed within {} ms: {}",
                        timing.placement_timeout_ms, blocked.detail
                    );
                    let attempt = self.state().jobs[&t.job_id].attempt;
                    self.fail(&t.job_id, attempt, code, Some(reason.clone()));
                    self.dead_letter(&t.job_id, code, reason);
                    self.saga_on_terminal(&t.job_id);
                }
                TimerKind::DispatchTimeout => {
                    let detail = format!(
                        "attempt {} dispatched to {} was not started within {} ms",
                        job.attempt,
                        job.worker_id.as_deref().unwrap_or("?"),
                        timing.dispatch_timeout_ms
                    );
                    self.time_out(&t.job_id, "timeout", detail);
                }
                TimerKind::RunningTimeout => {
                    let detail = format!(
                        "attempt {} on {} showed no progress or heartbeat for {} ms",
                        job.attempt,
                        job.worker_id.as_deref().unwrap_or("?"),
                        timing.running_timeout_ms
                    );
                    self.time_out(&t.job_id, "timeout", detail);
                }
                TimerKind::MaxRuntime => {
                    let detail = format!(
                        "attempt {} ran longer than its max_runtime_ms {}",
                        job.attempt,
                        job.max_runtime_ms().unwrap_or(0)
                    );
                    self.time_out(&t.job_id, "timeout", detail);
                }
            }
        }
        for job_id in requeued {
            let ready = self.state().jobs.get(&job_id).is_some_and(|j| {
                j.state == JobState::Pending && j.retry_at.is_some_and(|r| r <= self.now)
            });
            if ready {
                self.enqueue(&job_id);
            }
        }
    }

    fn prune_idempotency(&mut self) {
        let retention = self.rules().rules.timing.idempotency_retention_ms;
        let interval = (retention / 4).clamp(1_000, MAX_PRUNE_INTERVAL_MS);
        if self.now.saturating_sub(self.state().last_idempotency_prune) >= interval {
            self.emit(Event::IdempotencyPruned(IdempotencyPruned {
                before: self.now.saturating_sub(retention),
            }));
        }
    }
}
