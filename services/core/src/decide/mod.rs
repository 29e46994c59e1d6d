//! `decide`: one handler per input, each emitting events.
//!
//! A handler reads the state, emits an event, and the event is applied at once, so the next
//! decision in the same input (placing the second of two queued jobs, say) sees the first.
//! This is the same as computing all events first and applying them after, as long as every
//! state change goes through an event, which `Decider::emit` guarantees: handlers only get
//! `&State`. The journal entry for the input is the input plus these events; replaying the
//! entry with [`crate::apply::apply_entry`] yields the same state.
//!
//! Work per entry is bounded: an input that would cause more than
//! [`crate::rules::Limits::max_work_per_entry`] units of work (placements, timeouts, lost
//! workers) stops at a safe point and says so ([`Processed::more`]); the processor then
//! journals a continuation (a Tick at the same watermark) that picks up where it stopped.

mod breaker;
mod control;
mod placement;
mod reports;
mod retry;
mod saga;
mod submit;
mod tick;

use std::sync::Arc;

use crate::apply::{Applying, apply, begin_entry};
use crate::events::*;
use crate::outputs::{Output, output_of};
use crate::policy::PolicyEngine;
use crate::reason::{DlqReason, Rejection};
use crate::records::{DeadLetter, Millis, Tick};
use crate::rules::Rules;
use crate::state::{ActiveConfig, State};

pub use placement::MAX_CANDIDATES;
pub use retry::backoff_ms;
pub use saga::workflow_of;

/// What decisions may consult besides the state: the policy engine.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    pub policy: &'a dyn PolicyEngine,
}

impl std::fmt::Debug for Ctx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx").finish_non_exhaustive()
    }
}

/// The result of processing one input: its journal entry and the records it sends.
#[derive(Debug, Clone, PartialEq)]
pub struct Processed {
    pub entry: JournalEntry,
    pub outputs: Vec<Output>,
    /// The input's work was cut at the per-entry bound: process [`continuation`] next.
    pub more: bool,
}

/// The input that continues work cut at the per-entry bound: a Tick judged at the time the
/// state was last judged at, so it fires nothing a Tick has not already made due.
pub fn continuation(state: &State) -> Input {
    Input::Tick(Tick {
        source: CONTINUATION_SOURCE.to_owned(),
        issued_at: state.clock,
        watermark: Some(state.watermark),
    })
}

/// `Tick.source` of a continuation.
pub const CONTINUATION_SOURCE: &str = "continuation";

/// Decides on `input` and applies the events to `state`. `log_time` is the input record's
/// timestamp; the decision uses it, or the previous entry's time if that is later.
pub fn process(
    state: &mut State,
    ctx: &Ctx<'_>,
    cause: Cause,
    log_time: Millis,
    input: Input,
) -> Processed {
    let now = state.clock.max(log_time);
    let previous_watermark = state.watermark;
    begin_entry(state, now, &input);
    let budget = state
        .rules()
        .map_or(Rules::default().limits.max_work_per_entry, |r| {
            r.limits.max_work_per_entry
        });
    let mut d = Decider {
        state,
        ctx,
        now,
        cause: &cause,
        input: &input,
        events: Vec::new(),
        outputs: Vec::new(),
        budget,
        more: false,
        previous_watermark,
    };
    d.handle();
    let (events, outputs, more) = (d.events, d.outputs, d.more);
    Processed {
        entry: JournalEntry {
            cause,
            log_time: now,
            input,
            events,
            format: DECISION_FORMAT,
        },
        outputs,
        more,
    }
}

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
}

impl Decider<'_, '_> {
    fn handle(&mut self) {
        match self.input {
            Input::Submit(r) => self.submit(r),
            Input::Started(s) => self.started(s),
            Input::Progress(p) => self.progress(p),
            Input::Result(r) => self.result(r),
            Input::Heartbeat(h) => self.heartbeat(h),
            Input::Cancel(c) => self.cancel(c),
            Input::Approve(a) => self.approve(a),
            Input::Reject(r) => self.reject(r),
            Input::Tick(t) => self.tick(t),
            Input::Malformed(m) => self.malformed(m),
            Input::Reconfigure(r) => self.reconfigure(r),
        }
    }

    pub(crate) fn state(&self) -> &State {
        self.state
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
        };
        self.emit(Event::DeadLettered(DeadLettered { dead_letter: dl }));
    }

    fn malformed(&mut self, m: &MalformedRecord) {
        let code = DlqReason::parse(&m.reason_code).unwrap_or(DlqReason::MalformedRecord);
        let reason = match &m.key {
            Some(k) => format!(
                "record with key {k:?} ({} bytes): {}",
                m.size_bytes, m.error
            ),
            None => format!("record without key ({} bytes): {}", m.size_bytes, m.error),
        };
        let job_id = m.job_id.clone().unwrap_or_default();
        let tenant = m.tenant_id.clone().unwrap_or_default();
        self.dead_letter_input(&job_id, &tenant, code, reason);
    }

    fn reconfigure(&mut self, r: &Reconfigure) {
        let rules = match Rules::from_json(&r.rules_json).and_then(|rules| {
            rules.validate()?;
            Ok(rules)
        }) {
            Ok(rules) => rules,
            Err(e) => {
                self.refuse("", Rejection::InvalidConfig, e.to_string());
                return;
            }
        };
        if self
            .config()
            .is_some_and(|c| c.raw == *r && c.rules == rules)
        {
            return;
        }
        self.emit(Event::ConfigApplied(ConfigApplied { config: r.clone() }));
        self.reset_breakers("the configuration changed");
        let pools: Vec<String> = self.state.queues.keys().cloned().collect();
        self.schedule_pools(pools);
    }
}
