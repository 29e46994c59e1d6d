//! What workers report: JobStarted, JobProgress, JobResult, Heartbeat.
//!
//! Every report carries the attempt number of the Dispatch it answers; a report for an older
//! attempt is journaled as rejected and changes nothing (attempt fencing).

use crate::apply::ERROR_HANDED_BACK;
use crate::decide::Decider;
use crate::events::*;
use crate::policy::output_document;
use crate::records::{Heartbeat, JobProgress, JobResult, JobStarted, ResultStatus};

impl Decider<'_, '_> {
    /// Checks a report against the job's current attempt; refuses it (journaled) if it does
    /// not fit. Returns the job's state when the report may proceed.
    fn admit_report(&mut self, job_id: &str, attempt: i32) -> Option<JobState> {
        let Some(job) = self.state().jobs.get(job_id) else {
            self.refuse(job_id, "unknown_job", format!("no job {job_id}"));
            return None;
        };
        let (state, current) = (job.state, job.attempt);
        if attempt < current {
            self.refuse(
                job_id,
                "stale_attempt",
                format!("report for attempt {attempt}, the job is on attempt {current}; ignored"),
            );
            return None;
        }
        if attempt > current {
            self.refuse(
                job_id,
                "unknown_attempt",
                format!("report for attempt {attempt}, but only {current} were dispatched"),
            );
            return None;
        }
        if !matches!(state, JobState::Dispatched | JobState::Running) {
            self.refuse(
                job_id,
                "invalid_transition",
                format!("the job is {state}; a {} cannot change it", self.input_kind),
            );
            return None;
        }
        Some(state)
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
        match self.admit_report(&s.job_id, s.attempt) {
            Some(JobState::Dispatched) => self.start(&s.job_id, s.attempt, &s.worker_id),
            Some(_) => self.refuse(
                &s.job_id,
                "duplicate",
                format!("attempt {} already started", s.attempt),
            ),
            None => {}
        }
    }

    pub(super) fn progress(&mut self, p: &JobProgress) {
        let Some(state) = self.admit_report(&p.job_id, p.attempt) else {
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
        let Some(state) = self.admit_report(&r.job_id, r.attempt) else {
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
                r.error_code.as_deref().unwrap_or("failed_retryable"),
                r.error_message.clone(),
            ),
            ResultStatus::FailedFatal => {
                let code = r
                    .error_code
                    .clone()
                    .filter(|c| !c.is_empty())
                    .unwrap_or_else(|| "failed_fatal".to_owned());
                self.fail(&r.job_id, r.attempt, &code, r.error_message.clone());
                self.dead_letter(
                    &r.job_id,
                    &code,
                    r.error_message
                        .clone()
                        .unwrap_or_else(|| "the worker reported FAILED_FATAL".to_owned()),
                );
                self.saga_on_fatal(&r.job_id);
            }
            // Nobody asked to cancel (a cancelled job is terminal and refused above): the worker
            // gave the job back, e.g. while draining. Another attempt runs elsewhere.
            ResultStatus::Cancelled => self.retry_or_fail(
                &r.job_id,
                ERROR_HANDED_BACK,
                r.error_message
                    .clone()
                    .or_else(|| Some(format!("worker {} gave the job back", r.worker_id))),
            ),
        }
        if let Some(pool) = pool {
            self.evaluate_breaker(&pool);
            self.schedule_pools(vec![pool]);
        }
    }

    fn succeed(&mut self, r: &JobResult) {
        self.emit(Event::JobSucceeded(JobSucceeded {
            job_id: r.job_id.clone(),
            attempt: r.attempt,
            worker_id: r.worker_id.clone(),
            result_ptr: r.result_ptr.clone(),
            result_meta: r.result_meta.clone(),
            execution_ms: r.execution_ms,
        }));
        let config = self.rules();
        let doc = output_document(
            &self.state().jobs[&r.job_id].request,
            &r.worker_id,
            r.result_ptr.as_deref(),
            &r.result_meta,
            r.execution_ms,
        );
        let verdict = self.ctx.policy.evaluate_output(&config.raw, &doc);
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
            self.dead_letter(&r.job_id, "output_quarantined", reason);
        }
        self.saga_on_success(&r.job_id);
    }

    /// Opens, closes or keeps a pool's circuit after a result (SPEC §5).
    pub(super) fn evaluate_breaker(&mut self, pool: &str) {
        let config = self.rules();
        let rules = &config.rules.breaker;
        let Some(b) = self.state().breakers.get(pool) else {
            return;
        };
        let ratio = b.failure_ratio();
        let change = match b.state {
            CircuitState::Closed if b.consecutive_failures >= rules.consecutive_failures => Some((
                CircuitState::Open,
                format!("{} consecutive failures", b.consecutive_failures),
            )),
            CircuitState::Closed
                if b.window.len() >= rules.window as usize && ratio >= rules.failure_ratio =>
            {
                Some((
                    CircuitState::Open,
                    format!(
                        "failure ratio {:.0}% over the last {} results",
                        ratio * 100.0,
                        b.window.len()
                    ),
                ))
            }
            CircuitState::HalfOpen if b.consecutive_failures > 0 => {
                Some((CircuitState::Open, "a probe job failed".to_owned()))
            }
            CircuitState::HalfOpen if b.probe_successes >= rules.close_after_successes => Some((
                CircuitState::Closed,
                format!("{} probe jobs succeeded", b.probe_successes),
            )),
            _ => None,
        };
        if let Some((to, reason)) = change {
            let from = b.state;
            self.emit(Event::CircuitChanged(CircuitChanged {
                pool: pool.to_owned(),
                from,
                to,
                reason,
            }));
        }
    }

    pub(super) fn heartbeat(&mut self, hb: &Heartbeat) {
        if hb.worker_id.trim().is_empty() || hb.pool.trim().is_empty() {
            self.refuse(
                "",
                "invalid_heartbeat",
                "heartbeat without worker_id or pool".to_owned(),
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
            heartbeat: hb.clone(),
            joined,
        }));
        self.schedule_pools(vec![hb.pool.clone()]);
    }
}
