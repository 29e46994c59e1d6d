//! `decide`: one handler per input, each emitting events.
//!
//! A handler reads the state, emits an event, and the event is applied at once, so the next
//! decision in the same input (placing the second of two queued jobs, say) sees the first.
//! This is the same as computing all events first and applying them after, as long as every
//! state change goes through an event, which [`Decider::emit`] guarantees: handlers only get
//! `&State`. The journal entry for the input is the input plus these events; replaying the
//! entry with [`crate::apply::apply_entry`] yields the same state.

mod control;
mod placement;
mod reports;
mod retry;
mod saga;
mod submit;
mod tick;

use std::sync::Arc;

use crate::apply::{apply, begin_entry};
use crate::events::*;
use crate::outputs::{Output, output_of};
use crate::policy::PolicyEngine;
use crate::records::{DeadLetter, Millis};
use crate::rules::Rules;
use crate::state::{ActiveConfig, State};

pub use placement::blocker_reason_code;
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
}

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
    begin_entry(state, now);
    let mut d = Decider {
        state,
        ctx,
        now,
        cause: &cause,
        input_kind: input.kind(),
        events: Vec::new(),
        outputs: Vec::new(),
    };
    d.handle(&input);
    let (events, outputs) = (d.events, d.outputs);
    Processed {
        entry: JournalEntry {
            cause,
            log_time: now,
            input,
            events,
        },
        outputs,
    }
}

/// The events `input` would produce from `state`, without changing it (for audit verify and
/// what-if replays; the live path uses [`process`]).
pub fn decide(
    state: &State,
    ctx: &Ctx<'_>,
    cause: Cause,
    log_time: Millis,
    input: Input,
) -> Vec<Event> {
    let mut scratch = state.clone();
    scratch.dirty = None;
    process(&mut scratch, ctx, cause, log_time, input)
        .entry
        .events
}

pub(crate) struct Decider<'s, 'c> {
    state: &'s mut State,
    ctx: &'c Ctx<'c>,
    now: Millis,
    cause: &'s Cause,
    input_kind: &'static str,
    events: Vec<Event>,
    outputs: Vec<Output>,
}

impl Decider<'_, '_> {
    fn handle(&mut self, input: &Input) {
        match input {
            Input::Submit(r) => self.submit(r),
            Input::Started(s) => self.started(s),
            Input::Progress(p) => self.progress(p),
            Input::Result(r) => self.result(r),
            Input::Heartbeat(h) => self.heartbeat(h),
            Input::Cancel(c) => self.cancel(c),
            Input::Approve(a) => self.approve(a),
            Input::Reject(r) => self.reject(r),
            Input::Tick(_) => self.tick(),
            Input::Malformed(m) => self.malformed(m),
            Input::Reconfigure(r) => self.reconfigure(r),
        }
    }

    pub(crate) fn state(&self) -> &State {
        self.state
    }

    /// Applies `event` and records it (and the record it sends, if any).
    pub(crate) fn emit(&mut self, event: Event) {
        apply(self.state, &event, self.now);
        if let Some(out) = output_of(self.state, &event, self.now) {
            self.outputs.push(out);
        }
        self.events.push(event);
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

    pub(crate) fn refuse(&mut self, job_id: &str, reason_code: &str, reason: String) {
        let state = self.state.jobs.get(job_id).map(|j| j.state);
        let job_id = if state.is_some() { job_id } else { "" };
        self.emit(Event::CommandRejected(CommandRejected {
            job_id: job_id.to_owned(),
            input_kind: self.input_kind.to_owned(),
            reason_code: reason_code.to_owned(),
            reason,
            state,
        }));
    }

    /// Emits the DeadLettered event for a job.
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
        let dl = DeadLetter {
            job_id: job_id.to_owned(),
            topic,
            tenant_id: tenant,
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
        let dl = DeadLetter {
            job_id: String::new(),
            topic: self.cause.topic.clone(),
            tenant_id: String::new(),
            reason_code: "malformed_record".to_owned(),
            reason: match &m.key {
                Some(k) => format!(
                    "record with key {k:?} ({} bytes): {}",
                    m.size_bytes, m.error
                ),
                None => format!("record without key ({} bytes): {}", m.size_bytes, m.error),
            },
            last_state: String::new(),
            attempts: 0,
            cause_topic: self.cause.topic.clone(),
            cause_partition: self.cause.partition,
            cause_offset: self.cause.offset,
            at: self.now,
        };
        self.emit(Event::DeadLettered(DeadLettered { dead_letter: dl }));
    }

    fn reconfigure(&mut self, r: &Reconfigure) {
        let rules = match Rules::from_json(&r.rules_json).and_then(|rules| {
            rules.validate()?;
            Ok(rules)
        }) {
            Ok(rules) => rules,
            Err(e) => {
                self.refuse("", "invalid_config", e.to_string());
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
        let pools: Vec<String> = self.state.queues.keys().cloned().collect();
        self.schedule_pools(pools);
    }
}
