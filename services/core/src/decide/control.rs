//! Operator commands: CancelJob, ApproveJob, RejectJob (SPEC §6).

use crate::decide::Decider;
use crate::events::*;
use crate::reason::{DlqReason, Rejection};
use crate::records::{ApproveJob, CancelJob, RejectJob, RescheduleJob};

impl Decider<'_, '_> {
    /// Whether an operator's command about `job_id` (one acting for `tenant`, if any) may
    /// go on: the job exists and belongs to that tenant; otherwise it is refused here.
    pub(super) fn commanded(
        &mut self,
        job_id: &str,
        tenant: Option<&str>,
        principal: &str,
        verb: &str,
    ) -> bool {
        let Some(job) = self.state().jobs.get(job_id) else {
            self.refuse(job_id, Rejection::UnknownJob, format!("no job {job_id}"));
            return false;
        };
        if let Some(tenant) = tenant
            && tenant != job.request.tenant_id
        {
            let reason = format!(
                "principal {principal} of tenant {tenant} may not {verb} a job of tenant {}",
                job.request.tenant_id
            );
            self.refuse(job_id, Rejection::TenantMismatch, reason);
            return false;
        }
        true
    }

    pub(super) fn cancel(&mut self, c: &CancelJob) {
        if let Some(batch) = &c.batch_id {
            return self.cancel_batch(c, batch);
        }
        if !self.commanded(&c.job_id, c.tenant_id.as_deref(), &c.principal_id, "cancel") {
            return;
        }
        let job = &self.state().jobs[&c.job_id];
        if job.state.is_terminal() {
            let reason = format!("the job is already {}", job.state);
            self.refuse(&c.job_id, Rejection::InvalidTransition, reason);
            return;
        }
        self.cancel_job(&c.job_id, &c.principal_id, c.reason.clone());
    }

    /// A schedule's previous run cancelled by its next firing (overlap CANCEL_PREVIOUS), as
    /// an operator's cancel would: the schedule's principal cancels it.
    pub(super) fn cancel_by_schedule(&mut self, job_id: &str, principal: &str, reason: String) {
        if self
            .state()
            .jobs
            .get(job_id)
            .is_some_and(|j| !j.state.is_terminal())
        {
            self.cancel_job(job_id, principal, Some(reason));
        }
    }

    /// Cancels a job that has not ended: JobCancelled, and the worker told if it has it.
    pub(super) fn cancel_job(&mut self, job_id: &str, principal: &str, reason: Option<String>) {
        let job = &self.state().jobs[job_id];
        let on_worker = matches!(
            job.state,
            JobState::Scheduled | JobState::Dispatched | JobState::Running
        );
        let (attempt, worker, pool, partition) = (
            job.attempt,
            job.worker_id.clone(),
            job.pool.clone(),
            job.partition,
        );
        self.emit(Event::JobCancelled(JobCancelled {
            job_id: job_id.to_owned(),
            principal_id: principal.to_owned(),
            reason,
        }));
        if on_worker && let (Some(worker_id), Some(pool)) = (worker, pool) {
            self.emit(Event::DispatchCancelled(DispatchCancelled {
                job_id: job_id.to_owned(),
                attempt,
                pool: pool.clone(),
                worker_id,
                partition: partition.unwrap_or(-1),
                reason: "cancelled".to_owned(),
            }));
            self.saga_on_terminal(job_id);
            self.schedule_pools(vec![pool]);
        } else {
            self.saga_on_terminal(job_id);
        }
    }

    /// RescheduleJob: a DELAYED job waits for another time (SPEC §9); one already passed is
    /// released at the next Tick.
    pub(super) fn reschedule(&mut self, r: &RescheduleJob) {
        if !self.commanded(
            &r.job_id,
            r.tenant_id.as_deref(),
            &r.principal_id,
            "reschedule",
        ) {
            return;
        }
        let job = &self.state().jobs[&r.job_id];
        let Some(previous) = job.delayed_until.filter(|_| job.state == JobState::Delayed) else {
            let reason = format!(
                "the job is {}; only a DELAYED job is rescheduled",
                job.state
            );
            self.refuse(&r.job_id, Rejection::NotDelayed, reason);
            return;
        };
        let max = self.rules().rules.limits.max_delay_ms;
        if r.not_before < 0 || r.not_before.saturating_sub(self.now()) > max {
            let reason = format!(
                "not_before {} must be a time after 1970 and at most limits.max_delay_ms {max} ahead",
                r.not_before
            );
            self.refuse(&r.job_id, Rejection::InvalidTime, reason);
            return;
        }
        self.emit(Event::JobRescheduled(JobRescheduled {
            job_id: r.job_id.clone(),
            not_before: r.not_before,
            previous,
            principal_id: r.principal_id.clone(),
            reason: r.reason.clone(),
        }));
    }

    pub(super) fn approve(&mut self, a: &ApproveJob) {
        let Some(job) = self.state().jobs.get(&a.job_id) else {
            self.refuse(
                &a.job_id,
                Rejection::UnknownJob,
                format!("no job {}", a.job_id),
            );
            return;
        };
        if job.state != JobState::ApprovalRequired {
            let reason = format!("the job is {}, not awaiting approval", job.state);
            self.refuse(&a.job_id, Rejection::NotAwaitingApproval, reason);
            return;
        }
        if let Some(why) = self.own_job(&a.job_id, &a.approver, "approve") {
            self.refuse(&a.job_id, Rejection::FourEyes, why);
            return;
        }
        let job = &self.state().jobs[&a.job_id];
        if a.job_hash != job.job_hash {
            let reason = format!(
                "approval is for job hash {}, the job's hash is {}",
                a.job_hash, job.job_hash
            );
            self.refuse(&a.job_id, Rejection::StaleJobHash, reason);
            return;
        }
        let stored = job.policy_snapshot.clone().unwrap_or_default();
        if a.policy_snapshot != stored {
            let reason = format!(
                "approval is for policy snapshot {}, approval was requested under {stored}",
                a.policy_snapshot
            );
            self.refuse(&a.job_id, Rejection::StalePolicySnapshot, reason);
            return;
        }
        let current = self.rules().raw.policy_snapshot.clone();
        if current == stored {
            self.emit(Event::JobApproved(JobApproved {
                job_id: a.job_id.clone(),
                approver: a.approver.clone(),
                comment: a.comment.clone(),
            }));
            self.admit(&a.job_id);
            return;
        }
        // The policy changed since approval was requested: ask it again (SPEC §6).
        let decision = self.evaluate_input_policy(&a.job_id);
        match decision.event.verdict {
            Verdict::Allow => {
                self.emit(Event::PolicyEvaluated(decision.event));
                self.emit(Event::JobApproved(JobApproved {
                    job_id: a.job_id.clone(),
                    approver: a.approver.clone(),
                    comment: a.comment.clone(),
                }));
                self.admit(&a.job_id);
            }
            Verdict::RequireApproval => {
                let reason = format!(
                    "the policy changed from snapshot {stored} to {current} and still requires approval; approve again under the new snapshot"
                );
                self.refuse(&a.job_id, Rejection::StalePolicySnapshot, reason);
                self.apply_policy_decision(&a.job_id, decision);
            }
            Verdict::Deny => self.apply_policy_decision(&a.job_id, decision),
        }
    }

    /// Why `approver` may not decide on the job, if four eyes forbid it: they submitted it,
    /// or, for an approval, nobody can tell who did (a rejection lets nothing run).
    fn own_job(&self, job_id: &str, approver: &str, verb: &str) -> Option<String> {
        if !self.rules().rules.four_eyes {
            return None;
        }
        match submitter(&self.state().jobs[job_id].request) {
            None if verb == "approve" => Some(unknown_submitter(job_id)),
            None => None,
            Some(s) if s == approver => Some(format!(
                "{approver} submitted job {job_id} and may not {verb} it (four eyes)"
            )),
            Some(_) => None,
        }
    }

    pub(super) fn reject(&mut self, r: &RejectJob) {
        let Some(job) = self.state().jobs.get(&r.job_id) else {
            self.refuse(
                &r.job_id,
                Rejection::UnknownJob,
                format!("no job {}", r.job_id),
            );
            return;
        };
        if job.state != JobState::ApprovalRequired {
            let reason = format!("the job is {}, not awaiting approval", job.state);
            self.refuse(&r.job_id, Rejection::NotAwaitingApproval, reason);
            return;
        }
        if let Some(why) = self.own_job(&r.job_id, &r.approver, "reject") {
            self.refuse(&r.job_id, Rejection::FourEyes, why);
            return;
        }
        let reasons: Vec<String> = r.reason.iter().cloned().collect();
        self.deny(
            &r.job_id,
            DlqReason::ApprovalRejected,
            reasons,
            Some(r.approver.clone()),
        );
    }
}

/// Who submitted a job, as far as the scheduler knows: the principal it names (its topic's
/// producer on a topic bound to one, which fills it in).
pub(super) fn submitter(r: &crate::records::JobRequest) -> Option<&str> {
    r.principal_id.as_deref().filter(|p| !p.trim().is_empty())
}

/// Why a job without a known submitter cannot be approved under four eyes.
pub(super) fn unknown_submitter(job_id: &str) -> String {
    format!(
        "job {job_id} names no submitter (principal_id), so four eyes cannot tell the submitter from an approver; bind its topic to its producer (pools.yaml `principal:`) or have producers name themselves"
    )
}
