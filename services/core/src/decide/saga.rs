//! Sagas (SPEC §7): compensations pushed as steps succeed, run last-first when a step fails
//! fatally, one at a time, each after the previous reached a terminal state.

use crate::decide::Decider;
use crate::events::*;
use crate::records::JobRequest;

/// Label marking a compensation job.
pub(super) const LABEL_SAGA_COMPENSATION: &str = "saga_compensation";
/// Label naming the workflow a compensation job belongs to.
pub(super) const LABEL_SAGA_WORKFLOW: &str = "saga_workflow_id";

/// The workflow a job belongs to, as a step or as a compensation.
pub fn workflow_of(request: &JobRequest) -> Option<&str> {
    request
        .workflow_id
        .as_deref()
        .or_else(|| request.labels.get(LABEL_SAGA_WORKFLOW).map(String::as_str))
        .filter(|w| !w.is_empty())
}

impl Decider<'_, '_> {
    /// A job succeeded: push its compensation, or continue a rollback it was part of.
    pub(super) fn saga_on_success(&mut self, job_id: &str) {
        let request = &self.state().jobs[job_id].request;
        let Some(workflow_id) = workflow_of(request).map(str::to_owned) else {
            return;
        };
        if self.is_running_compensation(&workflow_id, job_id) {
            self.next_compensation(&workflow_id);
            return;
        }
        // A step that succeeds while its workflow rolls back is compensated too (its
        // compensation goes on top of the stack); once the saga has ended, nothing is pushed.
        let finished = self
            .state()
            .sagas
            .get(&workflow_id)
            .is_some_and(|s| s.outcome.is_some());
        if let (Some(compensation), false) = (request.compensation.clone(), finished) {
            let (tenant_id, principal_id) =
                (request.tenant_id.clone(), request.principal_id.clone());
            self.emit(Event::SagaStepRecorded(SagaStepRecorded {
                workflow_id,
                job_id: job_id.to_owned(),
                tenant_id,
                principal_id,
                compensation,
            }));
        }
    }

    /// A job failed fatally: roll its workflow back, or fail the rollback it was part of.
    pub(super) fn saga_on_fatal(&mut self, job_id: &str) {
        let Some(workflow_id) = workflow_of(&self.state().jobs[job_id].request).map(str::to_owned)
        else {
            return;
        };
        if self.is_running_compensation(&workflow_id, job_id) {
            self.finish_saga(
                &workflow_id,
                SagaOutcome::CompensationFailed,
                format!("compensation job {job_id} failed"),
            );
            return;
        }
        let saga = self.state().sagas.get(&workflow_id);
        if saga.is_some_and(|s| s.failed_job_id.is_some()) {
            return; // already rolling back (or rolled back)
        }
        let steps = saga.map_or(0, |s| s.stack.len());
        self.emit(Event::SagaRollbackStarted(SagaRollbackStarted {
            workflow_id: workflow_id.clone(),
            failed_job_id: job_id.to_owned(),
            steps: i32::try_from(steps).unwrap_or(i32::MAX),
        }));
        self.next_compensation(&workflow_id);
    }

    /// A job ended some other way (failed after retries, timed out, cancelled, denied): if it
    /// was a running compensation, the rollback failed.
    pub(crate) fn saga_on_terminal(&mut self, job_id: &str) {
        let Some(job) = self.state().jobs.get(job_id) else {
            return;
        };
        let Some(workflow_id) = workflow_of(&job.request).map(str::to_owned) else {
            return;
        };
        if self.is_running_compensation(&workflow_id, job_id) {
            let state = self.state().jobs[job_id].state;
            self.finish_saga(
                &workflow_id,
                SagaOutcome::CompensationFailed,
                format!("compensation job {job_id} ended {state}"),
            );
        }
    }

    fn is_running_compensation(&self, workflow_id: &str, job_id: &str) -> bool {
        self.state()
            .sagas
            .get(workflow_id)
            .is_some_and(|s| s.running.as_deref() == Some(job_id))
    }

    fn finish_saga(&mut self, workflow_id: &str, outcome: SagaOutcome, detail: String) {
        self.emit(Event::SagaFinished(SagaFinished {
            workflow_id: workflow_id.to_owned(),
            outcome,
            detail,
        }));
    }

    /// Submits the compensation on top of the stack, or ends the saga when none is left.
    fn next_compensation(&mut self, workflow_id: &str) {
        let Some(saga) = self.state().sagas.get(workflow_id) else {
            self.finish_saga(
                workflow_id,
                SagaOutcome::Compensated,
                "no step had a compensation".to_owned(),
            );
            return;
        };
        let Some(step) = saga.stack.last().cloned() else {
            let n = saga.compensations_submitted;
            self.finish_saga(
                workflow_id,
                SagaOutcome::Compensated,
                format!("{n} compensations succeeded"),
            );
            return;
        };
        let job_id = format!(
            "{workflow_id}~compensation~{}",
            saga.compensations_submitted + 1
        );
        self.emit(Event::SagaCompensationSubmitted(
            SagaCompensationSubmitted {
                workflow_id: workflow_id.to_owned(),
                job_id: job_id.clone(),
                for_job_id: step.job_id.clone(),
            },
        ));
        let t = step.compensation;
        let mut labels = t.labels;
        labels.insert(LABEL_SAGA_COMPENSATION.to_owned(), "true".to_owned());
        labels.insert(LABEL_SAGA_WORKFLOW.to_owned(), workflow_id.to_owned());
        let request = JobRequest {
            job_id: job_id.clone(),
            topic: t.topic,
            tenant_id: step.tenant_id,
            principal_id: step.principal_id,
            priority: t.priority,
            labels,
            env: t.env,
            payload: t.payload,
            budget: t.budget,
            meta: t.meta,
            workflow_id: None,
            step_index: None,
            compensation: None,
            submitted_at: self.now(),
            // A compensation starts no trace (the step's job may not be in memory here, and
            // a decision may not depend on what is).
            traceparent: None,
        };
        if self.state().jobs.contains_key(&job_id) {
            // Cannot happen with ids derived from the counter, but never overwrite a job.
            self.finish_saga(
                workflow_id,
                SagaOutcome::CompensationFailed,
                format!("compensation job id {job_id} is taken"),
            );
            return;
        }
        self.accept(request, true);
        // accept() settles the saga itself if the compensation ended at once (no pool,
        // denied): saga_on_terminal sees it as the running compensation.
    }
}
