//! Sagas (SPEC §7): compensations pushed as steps succeed, run last-first when a step fails
//! fatally, one at a time, each after the previous reached a terminal state (whichever).
//!
//! A saga is its tenant's: keyed by (tenant, workflow), so another tenant's failure under
//! the same workflow id touches nothing of it. A compensation is admitted as its step's
//! producer could have submitted it: on the step's own topic, as the step's tenant and
//! principal, with an id in the tenant's namespace, through every check a submission
//! passes (request bounds, the topic's tenant binding, the pending-jobs limits) and then
//! the input policy. One that is refused is dead-lettered with the reason and counts as not
//! succeeded; the rollback goes on, and ends COMPENSATION_FAILED.

use crate::decide::Decider;
use crate::decide::submit::{invalid_request, queue_full, route};
use crate::events::*;
use crate::reason::DlqReason;
use crate::records::JobRequest;
use crate::state::{SagaStep, saga_key, saga_key_of};

/// Label marking a compensation job.
pub(super) const LABEL_SAGA_COMPENSATION: &str = "saga_compensation";
/// Label naming the workflow a compensation job belongs to.
pub(super) const LABEL_SAGA_WORKFLOW: &str = "saga_workflow_id";
/// What a compensation's job id holds, and a submitted job's may not.
pub(super) const COMPENSATION_MARKER: &str = "~compensation~";

/// The workflow a job belongs to, as a step or as a compensation.
pub fn workflow_of(request: &JobRequest) -> Option<&str> {
    request
        .workflow_id
        .as_deref()
        .or_else(|| request.labels.get(LABEL_SAGA_WORKFLOW).map(String::as_str))
        .filter(|w| !w.is_empty())
}

/// The sagas a decision about `request`'s job may read: its tenant's, and one keyed by its
/// workflow alone (begun before sagas were the tenant's).
pub fn saga_keys_of(request: &JobRequest) -> Vec<String> {
    workflow_of(request).map_or_else(Vec::new, |wf| {
        vec![saga_key(&request.tenant_id, wf), wf.to_owned()]
    })
}

/// The id of the `n`-th compensation of a saga: in its tenant's namespace.
pub fn compensation_id(key: &str, n: i32) -> String {
    match key.split_once('\u{1f}') {
        Some((tenant, workflow)) => format!("{tenant}:{workflow}{COMPENSATION_MARKER}{n}"),
        None => format!("{key}{COMPENSATION_MARKER}{n}"),
    }
}

/// A saga as a decision addresses it: its key, its workflow, and the tenant its events
/// name (None for a saga keyed by its workflow alone).
#[derive(Debug, Clone)]
struct SagaRef {
    key: String,
    workflow: String,
    tenant: Option<String>,
}

impl SagaRef {
    fn own(tenant: &str, workflow: &str) -> SagaRef {
        SagaRef {
            key: saga_key(tenant, workflow),
            workflow: workflow.to_owned(),
            tenant: Some(tenant.to_owned()),
        }
    }

    fn of_key(key: &str) -> SagaRef {
        match key.split_once('\u{1f}') {
            Some((tenant, workflow)) => SagaRef::own(tenant, workflow),
            None => SagaRef {
                key: key.to_owned(),
                workflow: key.to_owned(),
                tenant: None,
            },
        }
    }
}

impl Decider<'_, '_> {
    /// The saga whose running compensation `job_id` is, if it is one.
    fn running_saga(&self, tenant: &str, workflow: &str, job_id: &str) -> Option<SagaRef> {
        let own = SagaRef::own(tenant, workflow);
        let legacy = SagaRef::of_key(&saga_key_of(None, workflow));
        [own, legacy].into_iter().find(|s| {
            self.state()
                .sagas
                .get(&s.key)
                .is_some_and(|saga| saga.running.as_deref() == Some(job_id))
        })
    }

    /// A job succeeded: continue the rollback it was a compensation of, or push its
    /// compensation. A step that succeeds while its saga rolls back is compensated in turn
    /// (its compensation goes on top of the stack); one that succeeds after the rollback
    /// ended opens it again, so no step that succeeded stays uncompensated.
    pub(super) fn saga_on_success(&mut self, job_id: &str) {
        let request = &self.state().jobs[job_id].request;
        let Some(workflow) = workflow_of(request).map(str::to_owned) else {
            return;
        };
        let tenant = request.tenant_id.clone();
        if let Some(saga) = self.running_saga(&tenant, &workflow, job_id) {
            self.compensation_ended(&saga, job_id, true, "SUCCEEDED".to_owned());
            return;
        }
        let Some(compensation) = request.compensation.clone() else {
            return;
        };
        let (principal_id, topic) = (request.principal_id.clone(), request.topic.clone());
        let saga = SagaRef::own(&tenant, &workflow);
        let ended = self
            .state()
            .sagas
            .get(&saga.key)
            .is_some_and(|s| s.outcome.is_some());
        self.emit(Event::SagaStepRecorded(SagaStepRecorded {
            workflow_id: workflow,
            job_id: job_id.to_owned(),
            tenant_id: tenant,
            principal_id,
            compensation,
            topic: Some(topic),
        }));
        if ended {
            self.next_compensation(&saga);
        }
    }

    /// A job failed fatally: roll its workflow back, or go on with the rollback it was a
    /// compensation of.
    pub(super) fn saga_on_fatal(&mut self, job_id: &str) {
        let request = &self.state().jobs[job_id].request;
        let Some(workflow) = workflow_of(request).map(str::to_owned) else {
            return;
        };
        let tenant = request.tenant_id.clone();
        if let Some(saga) = self.running_saga(&tenant, &workflow, job_id) {
            self.compensation_ended(&saga, job_id, false, "FAILED (fatal)".to_owned());
            return;
        }
        let saga = self.saga_to_roll_back(&tenant, &workflow);
        let found = self.state().sagas.get(&saga.key);
        if found.is_some_and(|s| s.failed_job_id.is_some()) {
            return; // already rolling back (or rolled back)
        }
        let steps = found.map_or(0, |s| s.stack.len());
        self.emit(Event::SagaRollbackStarted(SagaRollbackStarted {
            workflow_id: workflow,
            failed_job_id: job_id.to_owned(),
            steps: i32::try_from(steps).unwrap_or(i32::MAX),
            tenant_id: saga.tenant.clone(),
        }));
        self.next_compensation(&saga);
    }

    /// The saga a fatal failure of the tenant's step rolls back: its own; or, when it has
    /// none, one begun before sagas were the tenant's (keyed by the workflow alone) whose
    /// steps are this tenant's, so that steps recorded before an upgrade are compensated.
    fn saga_to_roll_back(&self, tenant: &str, workflow: &str) -> SagaRef {
        let own = SagaRef::own(tenant, workflow);
        if self.state().sagas.contains_key(&own.key) {
            return own;
        }
        let legacy = SagaRef::of_key(&saga_key_of(None, workflow));
        let theirs = self.state().sagas.get(&legacy.key).is_some_and(|s| {
            s.outcome.is_none()
                && !s.stack.is_empty()
                && s.stack.iter().all(|step| step.tenant_id == tenant)
        });
        if theirs { legacy } else { own }
    }

    /// A job ended some other way (failed after retries, timed out, cancelled, denied): if
    /// it was a running compensation, the next one follows.
    pub(crate) fn saga_on_terminal(&mut self, job_id: &str) {
        let Some(job) = self.state().jobs.get(job_id) else {
            return;
        };
        let Some(workflow) = workflow_of(&job.request).map(str::to_owned) else {
            return;
        };
        let (tenant, state) = (job.request.tenant_id.clone(), job.state);
        if let Some(saga) = self.running_saga(&tenant, &workflow, job_id) {
            self.compensation_ended(&saga, job_id, false, state.as_str().to_owned());
        }
    }

    /// Rollbacks whose next compensation was left for a continuation (the entry's work
    /// bound): each goes on.
    pub(super) fn resume_sagas(&mut self) {
        let waiting: Vec<String> = self
            .state()
            .sagas
            .iter()
            .filter(|(_, s)| s.rolling_back() && s.running.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        for key in waiting {
            if !self.may_work() {
                return;
            }
            self.next_compensation(&SagaRef::of_key(&key));
        }
    }

    fn compensation_ended(
        &mut self,
        saga: &SagaRef,
        job_id: &str,
        succeeded: bool,
        detail: String,
    ) {
        self.emit(Event::SagaCompensationEnded(SagaCompensationEnded {
            workflow_id: saga.workflow.clone(),
            tenant_id: saga.tenant.clone(),
            job_id: job_id.to_owned(),
            succeeded,
            detail,
        }));
        self.next_compensation(saga);
    }

    fn finish_saga(&mut self, saga: &SagaRef, outcome: SagaOutcome, detail: String) {
        self.emit(Event::SagaFinished(SagaFinished {
            workflow_id: saga.workflow.clone(),
            outcome,
            detail,
            tenant_id: saga.tenant.clone(),
        }));
    }

    /// Submits the compensation on top of the stack, or ends the saga when none is left. A
    /// compensation refused at admission ends at once and the next one follows, each a unit
    /// of the entry's work: a long run of them continues on the next Tick.
    fn next_compensation(&mut self, saga: &SagaRef) {
        loop {
            let Some(s) = self.state().sagas.get(&saga.key) else {
                self.finish_saga(
                    saga,
                    SagaOutcome::Compensated,
                    "no step had a compensation".to_owned(),
                );
                return;
            };
            let (n, failed) = (s.compensations_submitted, s.compensations_failed);
            let Some(step) = s.stack.last().cloned() else {
                let (outcome, detail) = if failed > 0 {
                    (
                        SagaOutcome::CompensationFailed,
                        format!("{failed} of {n} compensations did not succeed"),
                    )
                } else {
                    (
                        SagaOutcome::Compensated,
                        format!("{n} compensations succeeded"),
                    )
                };
                self.finish_saga(saga, outcome, detail);
                return;
            };
            if !self.may_work() {
                return;
            }
            self.spend();
            let job_id = compensation_id(&saga.key, n + 1);
            self.emit(Event::SagaCompensationSubmitted(
                SagaCompensationSubmitted {
                    workflow_id: saga.workflow.clone(),
                    job_id: job_id.clone(),
                    for_job_id: step.job_id.clone(),
                    tenant_id: saga.tenant.clone(),
                },
            ));
            let request = self.compensation_request(&saga.workflow, &job_id, &step);
            match self.compensation_refused(&request, &step) {
                None => {
                    // accept() goes on with the rollback itself if the compensation ended
                    // at once (no pool, denied): saga_on_terminal sees it running.
                    self.accept(request, true, None);
                    return;
                }
                Some((code, reason)) => {
                    self.dead_letter_derived(
                        &job_id,
                        &request.topic,
                        &request.tenant_id,
                        code,
                        reason.clone(),
                    );
                    self.emit(Event::SagaCompensationEnded(SagaCompensationEnded {
                        workflow_id: saga.workflow.clone(),
                        tenant_id: saga.tenant.clone(),
                        job_id,
                        succeeded: false,
                        detail: format!("refused: {reason}"),
                    }));
                }
            }
        }
    }

    /// The job a step's compensation template makes: on the step's topic (the template's
    /// own only for a step recorded before topics were), as the step's tenant and principal.
    fn compensation_request(&self, workflow: &str, job_id: &str, step: &SagaStep) -> JobRequest {
        let t = step.compensation.clone();
        let mut labels = t.labels;
        labels.insert(LABEL_SAGA_COMPENSATION.to_owned(), "true".to_owned());
        labels.insert(LABEL_SAGA_WORKFLOW.to_owned(), workflow.to_owned());
        let topic = match &step.topic {
            Some(own) if t.topic.is_empty() => own.clone(),
            _ => t.topic,
        };
        // A compensation is no resubmission: an idempotency key in the template would take
        // over (or be refused as) one of the tenant's own submissions.
        let mut meta = t.meta;
        meta.idempotency_key = None;
        JobRequest {
            job_id: job_id.to_owned(),
            topic,
            tenant_id: step.tenant_id.clone(),
            principal_id: step.principal_id.clone(),
            priority: t.priority,
            labels,
            env: t.env,
            payload: t.payload,
            budget: t.budget,
            meta,
            workflow_id: None,
            step_index: None,
            compensation: None,
            submitted_at: self.now(),
            // A compensation starts no trace (the step's job may not be in memory here, and
            // a decision may not depend on what is).
            traceparent: None,
            not_before: None,
            ..JobRequest::default()
        }
    }

    /// Why a compensation may not be admitted, if it may not: every check a submission by
    /// the step's producer passes.
    fn compensation_refused(
        &self,
        request: &JobRequest,
        step: &SagaStep,
    ) -> Option<(DlqReason, String)> {
        if let Some(own) = &step.topic
            && &request.topic != own
        {
            return Some((
                DlqReason::TenantNotAllowed,
                format!(
                    "a compensation runs on its step's topic {own}; step {}'s names {}",
                    step.job_id, request.topic
                ),
            ));
        }
        let config = self.rules();
        if let Some(problem) = invalid_request(request, &config.rules.limits) {
            return Some(problem);
        }
        if let Some(why) =
            config
                .rules
                .tenant_not_allowed(&request.topic, &request.tenant_id, &request.job_id)
        {
            return Some((DlqReason::TenantNotAllowed, why));
        }
        if self.state().jobs.contains_key(&request.job_id) {
            return Some((
                DlqReason::DuplicateJobId,
                format!("compensation job id {} is taken", request.job_id),
            ));
        }
        let (pools, _) = route(&config.rules, request);
        queue_full(self.state(), &config.rules, request, &pools)
            .map(|why| (DlqReason::QueueFull, why))
    }
}
