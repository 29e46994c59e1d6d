//! Tick: time passes (SPEC §4). Lost workers and their jobs, breaker cool-downs, due timers
//! (retries, deadlines, placement and reconciler timeouts), forgotten workers, idempotency
//! retention, and a scheduling pass over every non-empty queue.
//!
//! A Tick judges at its watermark, the time up to which the processor has read every input
//! that could have prevented a timeout (docs/architecture.md, "Time"): a worker is lost, or
//! a job times out, only when its heartbeats and results have been read up to that time. A
//! jump of the watermark larger than `clock_gap_ms` means nothing could be read in between;
//! evidence-based timeouts then count from after the jump (`ClockGap`).

use crate::decide::Decider;
use crate::events::*;
use crate::reason::{AttemptError, DlqReason};
use crate::records::{Millis, Priority, Tick};
use crate::state::TimerKind;

/// Most debounce windows one Tick closes (the rest at the next).
const DEBOUNCES_CLOSED_PER_TICK: usize = 10_000;

/// Never prune idempotency keys more often than this (log time).
const MAX_PRUNE_INTERVAL_MS: i64 = 3_600_000;
/// Most jobs a WorkerLost event lists (every one is retried by its own event).
const MAX_LISTED_JOBS: usize = 100;

impl Decider<'_, '_> {
    pub(super) fn tick(&mut self, t: &Tick) {
        // Journals written before watermarks judged at the Tick's log time.
        let judged = t
            .watermark
            .unwrap_or(self.now())
            .max(self.previous_watermark());
        let gap = self.rules().rules.timing.clock_gap_ms;
        if t.watermark.is_some()
            && self.previous_watermark() > 0
            && judged - self.previous_watermark() > gap
        {
            self.emit(Event::ClockGap(ClockGap {
                from: self.previous_watermark(),
                to: judged,
            }));
        }
        self.lose_silent_workers(judged);
        self.requeue_jobs_of_lost_workers();
        let pools: Vec<String> = self.state().breakers.keys().cloned().collect();
        for pool in pools {
            self.maybe_half_open(&pool);
        }
        self.fire_due_timers(judged);
        let mut released = self.release_due(judged);
        self.close_debounces(judged);
        self.fire_due_schedules(judged);
        self.resume_sagas();
        self.batches_due(judged);
        released.extend(self.settle_dependents());
        self.forget_lost_workers(judged);
        self.prune_idempotency();
        let pools: Vec<String> = self.state().queued.keys().cloned().collect();
        self.schedule_pools(pools);
        self.explain_waiting(&released);
    }

    /// Debounce windows due by the watermark close (SPEC §10): their jobs are released (or
    /// were replaced, cancelled, rescheduled), and the next job of such a key begins a run.
    /// At most [`DEBOUNCES_CLOSED_PER_TICK`] a Tick (and those due at the same time as the
    /// last of them), so that no entry grows with the windows open.
    fn close_debounces(&mut self, judged: Millis) {
        let through = (self.state().debounces_due.iter())
            .take(DEBOUNCES_CLOSED_PER_TICK)
            .take_while(|(due, _)| *due <= judged)
            .last()
            .map(|(due, _)| *due);
        if let Some(through) = through {
            self.emit(Event::DebouncesClosed(DebouncesClosed { through }));
        }
    }

    /// DELAYED jobs due by the watermark go to their queues (SPEC §9), earliest first, one
    /// unit of work each; the scheduling pass that ends the Tick places them. Returns them.
    /// BLOCKED jobs whose dependency timeout is due fail (SPEC §11), in the same order.
    fn release_due(&mut self, judged: Millis) -> Vec<String> {
        let due = self.state().delays.due(judged, self.budget_left());
        let mut released = Vec::with_capacity(due.len());
        let mut timed_out = 0;
        for (not_before, job_id) in due {
            if !self.may_work() {
                break;
            }
            match self.state().jobs.get(&job_id).map(|j| j.state) {
                Some(JobState::Delayed) => {}
                // Its dependency timeout passed (SPEC §11).
                Some(JobState::Blocked) => {
                    self.spend();
                    self.dependency_timed_out(&job_id);
                    timed_out += 1;
                    continue;
                }
                _ => {
                    debug_assert!(
                        false,
                        "the delay window holds {job_id}, which does not wait"
                    );
                    continue;
                }
            }
            self.spend();
            self.emit(Event::JobReleased(JobReleased {
                job_id: job_id.clone(),
                not_before,
                released_at: judged,
            }));
            self.queue(&job_id);
            released.push(job_id);
        }
        // The entry loaded as many due jobs as its work bound reaches; more may be due, in
        // the window or in storage: a continuation releases them now, not a Tick later.
        if released.len() + timed_out > 0 && self.state().delays.may_hold_due(judged) {
            self.continue_later();
        }
        released
    }

    fn lose_silent_workers(&mut self, judged: Millis) {
        let ttl = self.rules().rules.timing.worker_ttl_ms;
        let floor = self.state().liveness_floor;
        let lost: Vec<(String, String, Millis, Vec<String>)> = self
            .state()
            .workers
            .iter()
            .filter(|(_, w)| w.alive && judged.saturating_sub(w.last_seen.max(floor)) > ttl)
            .map(|(id, w)| {
                (
                    id.clone(),
                    w.heartbeat.pool.clone(),
                    w.last_seen,
                    w.inflight.iter().take(MAX_LISTED_JOBS).cloned().collect(),
                )
            })
            .collect();
        for (worker_id, pool, last_seen, job_ids) in lost {
            if !self.may_work() {
                return;
            }
            self.emit(Event::WorkerLost(WorkerLost {
                worker_id,
                pool,
                last_seen,
                job_ids,
            }));
            self.spend();
        }
    }

    /// The oncue agent-death rule: jobs on a lost worker failed retryably. One unit of work
    /// per job, so a worker that had thousands is settled over several entries.
    fn requeue_jobs_of_lost_workers(&mut self) {
        let ttl = self.rules().rules.timing.worker_ttl_ms;
        let orphaned: Vec<(String, Millis, String)> = self
            .state()
            .workers
            .iter()
            .filter(|(_, w)| !w.alive)
            .flat_map(|(id, w)| {
                w.inflight
                    .iter()
                    .map(move |j| (id.clone(), w.last_seen, j.clone()))
            })
            .collect();
        for (worker_id, last_seen, job_id) in orphaned {
            if !self.may_work() {
                return;
            }
            let message = format!(
                "worker {worker_id} sent no heartbeat for more than {ttl} ms (last at {last_seen})"
            );
            self.retry_or_fail(&job_id, AttemptError::WorkerLost.as_str(), Some(message));
            self.spend();
        }
    }

    fn fire_due_timers(&mut self, judged: Millis) {
        // No more than the entry can act on (one unit each): a million timers due at once
        // cost each entry its budget, not a million. Aging is never urgent: its steps are
        // kept apart and take what the other timers leave, at most half of the entry's
        // work, so that a backlog given aging at once neither stands before a deadline
        // nor keeps the scheduling pass from running.
        let aging_cap = (self.budget_left() / 2).max(1);
        let cap = self.budget_left() + 1;
        let floor = self.state().liveness_floor;
        let mut due = self.state().due_timers(judged, floor, cap);
        let aging = self.state().due_aging(judged, aging_cap + 1);
        if due.len() == cap || aging.len() > aging_cap {
            self.continue_later();
        }
        due.extend(aging);
        let config = self.rules();
        let timing = &config.rules.timing;
        let mut requeued = Vec::new();
        let mut aging_left = aging_cap;
        for due in due {
            // An earlier timer in this tick may have settled the job already.
            if !self.state().timer_stands(&due) {
                continue;
            }
            let t = due.timer;
            if t.kind == TimerKind::Aging {
                if aging_left == 0 {
                    continue;
                }
                aging_left -= 1;
            }
            if !self.may_work() {
                break;
            }
            self.spend();
            let job = &self.state().jobs[&t.job_id];
            match t.kind {
                TimerKind::Deadline => {
                    let deadline_ms = job.deadline_at.unwrap_or(0) - job.accepted_at;
                    let detail = format!(
                        "deadline of {deadline_ms} ms from acceptance passed in state {}",
                        job.state
                    );
                    self.time_out(&t.job_id, DlqReason::DeadlineExceeded, detail);
                }
                TimerKind::RetryAt => requeued.push(t.job_id.clone()),
                TimerKind::Aging => {
                    let event = JobAged {
                        job_id: t.job_id.clone(),
                        priority: Priority::of_rank(job.queue_rank().saturating_sub(1)),
                        queued_at: job.queued_at.unwrap_or(t.due),
                    };
                    self.emit(Event::JobAged(event));
                }
                TimerKind::PlacementTimeout => {
                    // A job a worker could take now that no pass reached (past the pass's
                    // bound) is placed, not dead-lettered; a keyed job only if it is its
                    // key's oldest in a pool, so its key's jobs keep their order.
                    let first = self.first_of_its_key(&t.job_id);
                    if first && self.try_place(&t.job_id) {
                        continue;
                    }
                    let mut blocked = if first {
                        self.blocker(&t.job_id)
                    } else {
                        self.behind_its_key(&t.job_id)
                    };
                    // Held by its key while a worker could take it: it waits on, its timeout
                    // anew. Held by its pools as well: it times out for their reason.
                    if blocked.code.is_flow_limit()
                        && let Some(pools) = self.blocker_but_key(&t.job_id)
                    {
                        blocked = pools;
                    }
                    if blocked.code.is_flow_limit() {
                        self.emit(Event::JobWaiting(JobWaiting {
                            job_id: t.job_id.clone(),
                            reason_code: blocked.code.as_str().to_owned(),
                            detail: format!(
                                "{}; its placement timeout starts again",
                                blocked.detail
                            ),
                            candidates: Vec::new(),
                            candidates_omitted: 0,
                        }));
                        continue;
                    }
                    let code = blocked.code.dlq_reason();
                    let reason = format!(
                        "not placed within {} ms: {}",
                        timing.placement_timeout_ms, blocked.detail
                    );
                    self.fail_for_good(&t.job_id, code.as_str(), Some(reason.clone()), reason);
                }
                TimerKind::DispatchTimeout => {
                    let detail = format!(
                        "attempt {} dispatched to {} was not started within {} ms",
                        job.attempt,
                        job.worker_id.as_deref().unwrap_or("?"),
                        timing.dispatch_timeout_ms
                    );
                    self.time_out(&t.job_id, DlqReason::Timeout, detail);
                }
                TimerKind::RunningTimeout => {
                    let detail = format!(
                        "attempt {} on {} showed no progress or heartbeat for {} ms",
                        job.attempt,
                        job.worker_id.as_deref().unwrap_or("?"),
                        timing.running_timeout_ms
                    );
                    self.time_out(&t.job_id, DlqReason::Timeout, detail);
                }
                TimerKind::MaxRuntime => {
                    let detail = format!(
                        "attempt {} ran longer than its max_runtime_ms {}",
                        job.attempt,
                        job.max_runtime_ms().unwrap_or(0)
                    );
                    self.time_out(&t.job_id, DlqReason::Timeout, detail);
                }
            }
        }
        for job_id in requeued {
            let ready = self.state().jobs.get(&job_id).is_some_and(|j| {
                j.state == JobState::Pending && j.retry_at.is_some_and(|r| r <= judged)
            });
            if ready {
                self.enqueue(&job_id);
            }
        }
    }

    /// Drops the records of workers lost for longer than `worker_retention_ms` whose jobs
    /// have all been settled, so a fleet that churns through worker ids stays bounded.
    fn forget_lost_workers(&mut self, judged: Millis) {
        let retention = self.rules().rules.timing.worker_retention_ms;
        let gone: Vec<(String, String, Millis)> = self
            .state()
            .workers
            .iter()
            .filter(|(_, w)| {
                !w.alive && w.inflight.is_empty() && judged.saturating_sub(w.last_seen) > retention
            })
            .map(|(id, w)| (id.clone(), w.heartbeat.pool.clone(), w.last_seen))
            .collect();
        for (worker_id, pool, last_seen) in gone {
            if !self.may_work() {
                return;
            }
            self.emit(Event::WorkerForgotten(WorkerForgotten {
                worker_id,
                pool,
                last_seen,
            }));
            self.spend();
        }
    }

    fn prune_idempotency(&mut self) {
        let retention = self.rules().rules.timing.idempotency_retention_ms;
        let interval = (retention / 4).clamp(1_000, MAX_PRUNE_INTERVAL_MS);
        if self
            .now()
            .saturating_sub(self.state().last_idempotency_prune)
            >= interval
        {
            self.emit(Event::IdempotencyPruned(IdempotencyPruned {
                before: self.now().saturating_sub(retention),
            }));
        }
    }
}
