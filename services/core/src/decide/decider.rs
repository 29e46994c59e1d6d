//! The decider a handler works with. Its fields are private to this module, so handlers
//! (the sibling modules) get the state as `&State` by construction and change it only by
//! emitting events ([`Decider::emit`]).

use std::sync::Arc;

use crate::apply::{Applying, apply};
use crate::decide::{Ctx, DECISION_FORMAT};
use crate::events::*;
use crate::outputs::{Output, output_of};
use crate::reason::{DlqReason, Rejection};
use crate::records::{DeadLetter, Millis};
use crate::rules::Rules;
use crate::state::{ActiveConfig, State};

pub(crate) struct Decider<'s, 'c> {
    state: &'s mut State,
    ctx: &'c Ctx<'c>,
    now: Millis,
    cause: &'s Cause,
    input: &'s Input,
    events: Vec<Event>,
    outputs: Vec<Output>,
    /// Units of work this entry may still do.
    budget: u32,
    /// Work was left for a continuation.
    more: bool,
    /// The watermark before this entry (a Tick's jump from it may be a gap).
    previous_watermark: Millis,
    /// The job the next dead letter names as the one that caused it (`dependency_failed`).
    related_job_id: Option<String>,
}

impl<'s, 'c> Decider<'s, 'c> {
    pub(super) fn new(
        state: &'s mut State,
        ctx: &'c Ctx<'c>,
        now: Millis,
        cause: &'s Cause,
        input: &'s Input,
        budget: u32,
        previous_watermark: Millis,
    ) -> Self {
        Decider {
            state,
            ctx,
            now,
            cause,
            input,
            events: Vec::new(),
            outputs: Vec::new(),
            budget,
            more: false,
            previous_watermark,
            related_job_id: None,
        }
    }

    /// The events decided, the records they send, and whether work was left over.
    pub(super) fn finish(self) -> (Vec<Event>, Vec<Output>, bool) {
        (self.events, self.outputs, self.more)
    }

    /// The decision's time: the input's log time, or the last entry's if that is later.
    pub(crate) fn now(&self) -> Millis {
        self.now
    }

    /// Where the input was read.
    pub(crate) fn cause(&self) -> &'s Cause {
        self.cause
    }

    pub(crate) fn input(&self) -> &'s Input {
        self.input
    }

    pub(crate) fn ctx(&self) -> &'c Ctx<'c> {
        self.ctx
    }

    /// The watermark before this entry (a Tick's jump from it may be a gap).
    pub(crate) fn previous_watermark(&self) -> Millis {
        self.previous_watermark
    }

    pub(crate) fn state(&self) -> &State {
        self.state
    }

    /// The pools whose parked lanes this entry brought back (a concurrency key's slot
    /// freed), emptied.
    pub(crate) fn take_woken(&mut self) -> Vec<String> {
        std::mem::take(&mut self.state.woken).into_iter().collect()
    }

    /// Applies `event` and records it (and the record it sends, if any).
    pub(crate) fn emit(&mut self, event: Event) {
        let at = Applying {
            now: self.now,
            input: self.input,
            format: DECISION_FORMAT,
        };
        apply(self.state, &event, &at);
        if let Some(out) = output_of(self.state, &event, self.now) {
            self.outputs.push(out);
        }
        self.events.push(event);
    }

    /// Whether this entry may do another unit of work (a placement, a timeout, a lost
    /// worker, a retry). When not, the entry ends and a continuation does the rest: handlers
    /// ask before each unit, at points where stopping leaves a consistent state that a later
    /// Tick would pick up again. Only work that emits events spends budget
    /// ([`Decider::spend`]), so every continuation makes progress.
    pub(crate) fn may_work(&mut self) -> bool {
        if self.budget == 0 {
            self.more = true;
            return false;
        }
        true
    }

    /// Leaves work for a continuation although the budget is not spent: what the entry
    /// loaded to decide on is done, and more of the same waits in storage.
    pub(crate) fn continue_later(&mut self) {
        self.more = true;
    }

    /// Names `job_id` in the next dead letter as the job that caused it.
    pub(crate) fn relate_next_dead_letter(&mut self, job_id: &str) {
        self.related_job_id = Some(job_id.to_owned());
    }

    /// Units of work this entry may still do.
    pub(crate) fn budget_left(&self) -> usize {
        self.budget as usize
    }

    /// One unit of work was done.
    pub(crate) fn spend(&mut self) {
        self.budget = self.budget.saturating_sub(1);
    }

    pub(crate) fn config(&self) -> Option<Arc<ActiveConfig>> {
        self.state.config.clone()
    }

    /// The rules in force; a scheduler that has never been configured routes nothing.
    pub(crate) fn rules(&self) -> Arc<ActiveConfig> {
        self.state.config.clone().unwrap_or_else(|| {
            Arc::new(ActiveConfig {
                raw: Reconfigure::default(),
                rules: Rules::default(),
            })
        })
    }

    pub(crate) fn refuse(&mut self, job_id: &str, code: Rejection, reason: String) {
        let state = self.state.jobs.get(job_id).map(|j| j.state);
        let job_id = if state.is_some() { job_id } else { "" };
        self.emit(Event::CommandRejected(CommandRejected {
            job_id: job_id.to_owned(),
            input_kind: self.input.kind().to_owned(),
            reason_code: code.as_str().to_owned(),
            reason,
            state,
        }));
    }

    /// Emits the DeadLettered event for a job the state knows.
    pub(crate) fn dead_letter(&mut self, job_id: &str, reason_code: &str, reason: String) {
        let (topic, tenant, last_state, attempts) = match self.state.jobs.get(job_id) {
            Some(j) => (
                j.request.topic.clone(),
                j.request.tenant_id.clone(),
                j.state.as_str().to_owned(),
                j.attempt,
            ),
            None => (String::new(), String::new(), String::new(), 0),
        };
        self.dead_letter_record(
            job_id,
            topic,
            tenant,
            last_state,
            attempts,
            reason_code,
            reason,
        );
    }

    /// Emits a DeadLettered event for a record that never became a job (or a submission
    /// refused before it did): malformed, too large, set aside, a conflicting duplicate.
    pub(crate) fn dead_letter_input(
        &mut self,
        job_id: &str,
        tenant_id: &str,
        reason_code: DlqReason,
        reason: String,
    ) {
        let topic = self.cause.topic.clone();
        self.dead_letter_record(
            job_id,
            topic,
            tenant_id.to_owned(),
            String::new(),
            0,
            reason_code.as_str(),
            reason,
        );
    }

    /// Emits a DeadLettered event for a job a decision made that never became one (a saga
    /// compensation refused at admission).
    pub(crate) fn dead_letter_derived(
        &mut self,
        job_id: &str,
        topic: &str,
        tenant_id: &str,
        reason_code: DlqReason,
        reason: String,
    ) {
        self.dead_letter_record(
            job_id,
            topic.to_owned(),
            tenant_id.to_owned(),
            String::new(),
            0,
            reason_code.as_str(),
            reason,
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn dead_letter_record(
        &mut self,
        job_id: &str,
        topic: String,
        tenant_id: String,
        last_state: String,
        attempts: i32,
        reason_code: &str,
        reason: String,
    ) {
        let dl = DeadLetter {
            job_id: job_id.to_owned(),
            topic,
            tenant_id,
            reason_code: reason_code.to_owned(),
            reason,
            last_state,
            attempts,
            cause_topic: self.cause.topic.clone(),
            cause_partition: self.cause.partition,
            cause_offset: self.cause.offset,
            at: self.now,
            related_job_id: self.related_job_id.take(),
        };
        self.emit(Event::DeadLettered(DeadLettered {
            dead_letter: Box::new(dl),
        }));
    }
}
