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

mod batches;
mod breaker;
mod control;
mod decider;
mod dependencies;
mod placement;
mod reports;
mod retry;
mod saga;
mod schedules;
mod submit;
mod tick;

use crate::apply::begin_entry;

use crate::events::*;
use crate::outputs::Output;
use crate::policy::PolicyEngine;
use crate::reason::{DlqReason, Rejection};
use crate::records::{Millis, Tick};
use crate::rules::{Limits, Rules};
use crate::state::State;
pub(crate) use decider::Decider;
pub(crate) use placement::lane_of;

pub use placement::{GROUP_HELD_BOUND, MAX_CANDIDATES};
pub use reports::{HEARTBEAT_LOAD_STEP, redundant_heartbeat};
pub use retry::backoff_ms;
pub use saga::{compensation_id, saga_keys_of, workflow_of};
pub use submit::{DEBOUNCE_PRINCIPAL, unique_scope};
pub(crate) use submit::{debounceable, unique_key_of};

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
    let budget = state.rules().map_or_else(
        || Limits::default().max_work_per_entry,
        |r| r.limits.max_work_per_entry,
    );
    let mut d = Decider::new(state, ctx, now, &cause, &input, budget, previous_watermark);
    d.handle();
    let (events, outputs, more) = d.finish();
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

impl Decider<'_, '_> {
    fn handle(&mut self) {
        match self.input() {
            Input::Submit(r) => self.submit(r),
            Input::Started(s) => self.started(s),
            Input::Progress(p) => self.progress(p),
            Input::Result(r) => self.result(r),
            Input::Heartbeat(h) => self.heartbeat(h),
            Input::Cancel(c) => self.cancel(c),
            Input::Approve(a) => self.approve(a),
            Input::Reject(r) => self.reject(r),
            Input::Redrive(r) => self.redrive(r),
            Input::Reschedule(r) => self.reschedule(r),
            Input::Schedule(c) => self.schedule_command(c),
            Input::Tick(t) => self.tick(t),
            Input::Malformed(m) => self.malformed(m),
            Input::Reconfigure(r) => self.reconfigure(r),
        }
        // A concurrency key's slot freed by this input: its jobs waiting in other pools than
        // the one the input passed are placed now, not at the next Tick.
        loop {
            let woken = self.take_woken();
            if woken.is_empty() || !self.may_work() {
                break;
            }
            self.schedule_pools(woken);
        }
        // A job that is waited for ended: a continuation tells its dependents now (its load
        // reads them), not a Tick later.
        if self.state().settling_began() {
            self.continue_later();
        }
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
        let pools: Vec<String> = self.state().queued.keys().cloned().collect();
        self.schedule_pools(pools);
    }
}
