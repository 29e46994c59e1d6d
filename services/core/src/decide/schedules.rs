//! Schedules (SPEC §9): the commands that make and change them, and the firings a Tick
//! decides: which of a schedule's times are on time, missed or caught up, what the overlap
//! policy does when the previous run has not ended, and the job each firing submits.
//!
//! A firing is journaled as `ScheduleFired` with the schedule's next firing, so its times
//! advance only through the journal; a firing's job id is `<tenant>:<schedule>@<time>`, so
//! the same firing can never submit twice, whatever replays or takes over.

use crate::decide::Decider;
use crate::events::*;
use crate::reason::{DlqReason, Rejection};
use crate::records::{
    JobRequest, Millis, ScheduleAction, ScheduleCatchUp, ScheduleCommand, ScheduleOverlap,
    ScheduleSpec,
};
use crate::schedule::{
    LABEL_SCHEDULE, LABEL_SLOT, Times, firing_job_id, invalid_schedule_id, invalid_spec, jitter_of,
    schedule_key, slot_text,
};
use crate::state::Schedule;

use super::submit::{MAX_ID_BYTES, delay_refused, invalid_request, queue_full, route};

/// Most firings catch-up ALL runs, about: older missed ones are journaled MISSED.
const MAX_CATCH_UP: i64 = 1_000;

impl Decider<'_, '_> {
    /// ScheduleCommand: create, update, pause, resume, trigger or delete a schedule.
    pub(super) fn schedule_command(&mut self, c: &ScheduleCommand) {
        if let Some(why) = invalid_tenant(&c.tenant_id)
            .or_else(|| invalid_schedule_id(&c.schedule_id))
            .or_else(|| {
                (c.principal_id.trim().is_empty() || c.principal_id.len() > MAX_ID_BYTES).then(
                    || {
                        "principal_id must be 1 to 256 bytes: a schedule's jobs are submitted as it"
                            .to_owned()
                    },
                )
            })
        {
            self.refuse("", Rejection::InvalidSchedule, why);
            return;
        }
        let key = schedule_key(&c.tenant_id, &c.schedule_id);
        let existing = self.state().schedules.get(&key).cloned();
        match (c.action, existing) {
            (ScheduleAction::Create, Some(_)) => {
                let why = format!(
                    "schedule {} of tenant {} exists; update or delete it",
                    c.schedule_id, c.tenant_id
                );
                self.refuse("", Rejection::ScheduleExists, why);
            }
            (ScheduleAction::Create, None) => self.create_schedule(c),
            (_, None) => {
                let why = format!("no schedule {} of tenant {}", c.schedule_id, c.tenant_id);
                self.refuse("", Rejection::UnknownSchedule, why);
            }
            (ScheduleAction::Update, Some(s)) => self.update_schedule(c, &s),
            (ScheduleAction::Pause, Some(s)) if s.paused => {
                self.refuse(
                    "",
                    Rejection::InvalidTransition,
                    "the schedule is paused already".into(),
                );
            }
            (ScheduleAction::Resume, Some(s)) if !s.paused => {
                self.refuse(
                    "",
                    Rejection::InvalidTransition,
                    "the schedule is not paused".into(),
                );
            }
            (ScheduleAction::Pause | ScheduleAction::Delete, Some(s)) => {
                self.changed(c, None, s.next_slot);
            }
            // Its times go on from where they stopped: the firings it missed while paused
            // are caught up (or not) by its catch-up policy at the next Tick.
            (ScheduleAction::Resume, Some(s)) => self.changed(c, None, s.next_slot),
            // The trigger's time is the command's (its job id is known before the decision,
            // so the store is asked whether a job has it).
            (ScheduleAction::Trigger, Some(_)) => {
                self.spend();
                self.fire(&key, c.requested_at.max(0), true);
            }
        }
    }

    fn changed(&mut self, c: &ScheduleCommand, spec: Option<ScheduleSpec>, next: Option<Millis>) {
        self.emit(Event::ScheduleChanged(ScheduleChanged {
            schedule_id: c.schedule_id.clone(),
            tenant_id: c.tenant_id.clone(),
            action: c.action,
            spec: spec.map(Box::new),
            principal_id: c.principal_id.clone(),
            reason: c.reason.clone(),
            next_slot: next,
        }));
    }

    fn create_schedule(&mut self, c: &ScheduleCommand) {
        let max = self.rules().rules.limits.max_schedules;
        if self.state().schedules.len() >= max as usize {
            let why = format!("the shard holds {max} schedules (limits.max_schedules)");
            self.refuse("", Rejection::TooManySchedules, why);
            return;
        }
        let Some(spec) = self.valid_spec(c, None) else {
            return;
        };
        let next = Times::of(&spec, self.now())
            .ok()
            .and_then(|t| t.next_after(self.now() - 1));
        self.changed(c, Some(spec), next);
    }

    fn update_schedule(&mut self, c: &ScheduleCommand, s: &Schedule) {
        let Some(spec) = self.valid_spec(c, Some(s)) else {
            return;
        };
        // Its next firing under the new times, after now: a firing already decided is not
        // decided again.
        let next = Times::of(&spec, s.created_at)
            .ok()
            .and_then(|t| t.next_after(self.now()));
        self.changed(c, Some(spec), next);
    }

    /// The command's spec, if it makes a schedule that may fire: valid times, and a template
    /// whose jobs the schedule's tenant and principal may submit. Refuses the command if not.
    fn valid_spec(&mut self, c: &ScheduleCommand, old: Option<&Schedule>) -> Option<ScheduleSpec> {
        let Some(spec) = c.spec.clone() else {
            let why = format!("{} needs the schedule's spec", c.action.as_str());
            self.refuse("", Rejection::InvalidSchedule, why);
            return None;
        };
        let anchor = old.map_or(self.now(), |s| s.created_at);
        let rules = self.rules();
        if let Some(why) = invalid_spec(&spec, anchor, rules.rules.limits.max_delay_ms) {
            self.refuse("", Rejection::InvalidSchedule, why);
            return None;
        }
        if let Some(old) = old
            && old.spec.template.topic != spec.template.topic
        {
            // The topic decides the shard that holds the schedule.
            let why = format!(
                "a schedule's topic is fixed ({}); delete it and create one on {}",
                old.spec.template.topic, spec.template.topic
            );
            self.refuse("", Rejection::InvalidSchedule, why);
            return None;
        }
        if rules.rules.pools_for_topic(&spec.template.topic).is_none() {
            let why = format!("topic {} is not mapped to any pool", spec.template.topic);
            self.refuse("", Rejection::InvalidSchedule, why);
            return None;
        }
        // A sample of its jobs must pass every check a submission does.
        let sample = firing_request(
            &c.tenant_id,
            &c.schedule_id,
            &c.principal_id,
            &spec,
            self.now(),
            false,
            self.now(),
        );
        // Its triggered jobs' ids are the longest.
        let triggered = JobRequest {
            job_id: firing_job_id(&c.tenant_id, &c.schedule_id, self.now(), true),
            ..sample.clone()
        };
        if let Some((_, why)) = invalid_request(&sample, &rules.rules.limits)
            .or_else(|| invalid_request(&triggered, &rules.rules.limits))
        {
            self.refuse("", Rejection::InvalidSchedule, why);
            return None;
        }
        if let Some(why) = template_not_allowed(&rules.rules, &sample) {
            self.refuse("", Rejection::TenantMismatch, why);
            return None;
        }
        Some(spec)
    }

    /// Firings due by the watermark (SPEC §9): first the buffered firings whose previous
    /// run has ended, then each active schedule's due firing, earliest first. Each decision
    /// is a unit of the entry's work; what the bound cuts, a continuation goes on with.
    pub(super) fn fire_due_schedules(&mut self, judged: Millis) {
        let buffered: Vec<String> = self.state().schedules_buffered.iter().cloned().collect();
        for key in buffered {
            if !self.may_work() {
                return;
            }
            let Some(s) = self.state().schedules.get(&key) else {
                continue;
            };
            let Some(slot) = s.buffered else {
                continue;
            };
            if self.previous_run(s).is_none() {
                let next = s.next_slot;
                self.spend();
                self.submit_firing(&key, slot, false, next);
            }
        }
        loop {
            let Some((slot, key)) = self.state().schedules_due.first().cloned() else {
                return;
            };
            if slot > judged || !self.may_work() {
                return;
            }
            self.spend();
            self.step_schedule(&key, slot, judged);
        }
    }

    /// Decides on a schedule's due firing at `slot` (<= `judged`). Every path journals a
    /// ScheduleFired whose next firing lies after `slot`, so the loop moves on.
    fn step_schedule(&mut self, key: &str, slot: Millis, judged: Millis) {
        let s = self.state().schedules[key].clone();
        let times = match Times::of(&s.spec, s.created_at) {
            Ok(t) => t,
            Err(why) => {
                // Validated when it was made; a newer binary may know a zone no more.
                self.fired(key, slot, ScheduleOutcome::Refused, None, why, false, None);
                return;
            }
        };
        let after = |t: Millis| times.next_after(t).filter(|n| *n > slot);
        let latest = times.latest_at_or_before(judged).unwrap_or(slot).max(slot);
        let catch_up = s.spec.catch_up;
        match catch_up {
            ScheduleCatchUp::All => {
                // Within the window (never narrower than the grace), and at most about
                // MAX_CATCH_UP firings back (the gap after this one as the period): a
                // schedule of every second paused for a year catches up minutes, not a year.
                let grace = self.rules().rules.timing.schedule_grace_ms;
                let period = after(slot).map_or(0, |n| n - slot);
                let window = s
                    .spec
                    .catch_up_window_ms
                    .max(grace)
                    .min(period.saturating_mul(MAX_CATCH_UP).max(grace));
                let floor = judged.saturating_sub(window);
                if slot < floor {
                    let first = times.next_after(floor - 1).filter(|n| *n > slot);
                    let why = format!(
                        "missed firings from {} are older than the catch-up window ({window} ms, at most about {MAX_CATCH_UP} firings)",
                        slot_text(slot)
                    );
                    self.fired(key, slot, ScheduleOutcome::Missed, None, why, false, first);
                } else {
                    self.fire(key, slot, false);
                }
            }
            ScheduleCatchUp::Last | ScheduleCatchUp::None if slot < latest => {
                let why = format!(
                    "missed firings from {} to before {} (catch-up {})",
                    slot_text(slot),
                    slot_text(latest),
                    catch_up_name(catch_up)
                );
                self.fired(
                    key,
                    slot,
                    ScheduleOutcome::Missed,
                    None,
                    why,
                    false,
                    Some(latest),
                );
            }
            ScheduleCatchUp::Last | ScheduleCatchUp::None => {
                let grace = self.rules().rules.timing.schedule_grace_ms;
                if judged - slot <= grace || catch_up == ScheduleCatchUp::Last {
                    self.fire(key, slot, false);
                } else {
                    let why = format!(
                        "the firing is {} ms late, more than timing.schedule_grace_ms {grace} (catch-up NONE)",
                        judged - slot
                    );
                    self.fired(
                        key,
                        slot,
                        ScheduleOutcome::Missed,
                        None,
                        why,
                        false,
                        after(slot),
                    );
                }
            }
        }
    }

    /// A firing at `slot` (a TRIGGER's at now): the overlap policy, then the job.
    fn fire(&mut self, key: &str, slot: Millis, triggered: bool) {
        let s = self.state().schedules[key].clone();
        // A trigger leaves the schedule's times where they were.
        let next = if triggered {
            s.next_slot
        } else {
            Times::of(&s.spec, s.created_at)
                .ok()
                .and_then(|t| t.next_after(slot))
                .filter(|n| *n > slot)
        };
        if let Some((previous, state)) = self.previous_run(&s) {
            let running = format!("its previous run {previous} is {state}");
            let held = match s.spec.overlap {
                ScheduleOverlap::Skip => Some((
                    ScheduleOutcome::Skipped,
                    format!("{running} (overlap SKIP)"),
                )),
                ScheduleOverlap::BufferOne if s.buffered.is_none() && !triggered => Some((
                    ScheduleOutcome::Buffered,
                    format!("{running}: it runs when that ends (overlap BUFFER_ONE)"),
                )),
                ScheduleOverlap::BufferOne if triggered => Some((
                    ScheduleOutcome::Skipped,
                    format!("{running} (overlap BUFFER_ONE buffers scheduled firings only)"),
                )),
                ScheduleOverlap::BufferOne => Some((
                    ScheduleOutcome::Skipped,
                    format!("{running} and a firing waits already (overlap BUFFER_ONE)"),
                )),
                ScheduleOverlap::AllowAll | ScheduleOverlap::CancelPrevious => None,
            };
            if let Some((outcome, why)) = held {
                self.fired(key, slot, outcome, None, why, triggered, next);
                return;
            }
            if s.spec.overlap == ScheduleOverlap::CancelPrevious {
                let reason = format!(
                    "schedule {} fired again (overlap CANCEL_PREVIOUS)",
                    s.schedule_id
                );
                self.cancel_by_schedule(&previous, &s.principal_id, reason);
            }
        }
        self.submit_firing(key, slot, triggered, next);
    }

    /// The schedule's previous run and its state, while it has not ended.
    fn previous_run(&self, s: &Schedule) -> Option<(String, JobState)> {
        let id = s.last_job.as_ref()?;
        let job = self.state().jobs.get(id)?;
        (!job.state.is_terminal()).then(|| (id.clone(), job.state))
    }

    /// Submits a firing's job: the template, as the schedule's tenant and principal, through
    /// every check a producer's submission passes.
    fn submit_firing(&mut self, key: &str, slot: Millis, triggered: bool, next: Option<Millis>) {
        let s = self.state().schedules[key].clone();
        let jitter = if triggered {
            0
        } else {
            jitter_of(&s.tenant_id, &s.schedule_id, slot, s.spec.jitter_ms)
        };
        let request = firing_request(
            &s.tenant_id,
            &s.schedule_id,
            &s.principal_id,
            &s.spec,
            slot,
            triggered,
            self.now(),
        );
        let request = JobRequest {
            not_before: (jitter > 0).then(|| slot.saturating_add(jitter)),
            ..request
        };
        if let Some((code, why)) = self.firing_refused(&request) {
            let detail = format!("{}: {why}", code.as_str());
            self.fired(
                key,
                slot,
                ScheduleOutcome::Refused,
                Some(request.job_id.clone()),
                detail,
                triggered,
                next,
            );
            return;
        }
        let detail = match request.not_before {
            Some(t) => format!(
                "submitted, waiting {jitter} ms of jitter until {}",
                slot_text(t)
            ),
            None => "submitted".to_owned(),
        };
        let job_id = request.job_id.clone();
        self.fired(
            key,
            slot,
            ScheduleOutcome::Submitted,
            Some(job_id),
            detail,
            triggered,
            next,
        );
        self.accept(request, true, None);
    }

    /// Why a firing's job may not be admitted, if it may not.
    fn firing_refused(&self, request: &JobRequest) -> Option<(DlqReason, String)> {
        let config = self.rules();
        if let Some(problem) = invalid_request(request, &config.rules.limits) {
            return Some(problem);
        }
        if let Some(why) = template_not_allowed(&config.rules, request) {
            return Some((DlqReason::TenantNotAllowed, why));
        }
        if self.state().jobs.contains_key(&request.job_id) {
            return Some((
                DlqReason::DuplicateJobId,
                format!(
                    "job {} exists already (this firing ran before)",
                    request.job_id
                ),
            ));
        }
        let (pools, _) = route(&config.rules, request);
        if let Some(why) = queue_full(self.state(), &config.rules, request, &pools) {
            return Some((DlqReason::QueueFull, why));
        }
        delay_refused(self.state(), &config.rules, request, self.now())
    }

    #[allow(clippy::too_many_arguments)]
    fn fired(
        &mut self,
        key: &str,
        slot: Millis,
        outcome: ScheduleOutcome,
        job_id: Option<String>,
        detail: String,
        triggered: bool,
        next_slot: Option<Millis>,
    ) {
        let s = &self.state().schedules[key];
        let event = ScheduleFired {
            schedule_id: s.schedule_id.clone(),
            tenant_id: s.tenant_id.clone(),
            slot,
            outcome,
            job_id: job_id.filter(|_| outcome == ScheduleOutcome::Submitted),
            detail,
            triggered,
            next_slot,
        };
        self.emit(Event::ScheduleFired(event));
    }
}

/// The job a schedule's firing at `slot` submits.
pub(crate) fn firing_request(
    tenant: &str,
    schedule_id: &str,
    principal: &str,
    spec: &ScheduleSpec,
    slot: Millis,
    triggered: bool,
    now: Millis,
) -> JobRequest {
    let t = spec.template.clone();
    let mut labels = t.labels;
    labels.insert(LABEL_SCHEDULE.to_owned(), schedule_id.to_owned());
    labels.insert(LABEL_SLOT.to_owned(), slot_text(slot));
    // Each firing is its own job: an idempotency key in the template would make every
    // firing after the first a duplicate of it.
    let mut meta = t.meta;
    meta.idempotency_key = None;
    JobRequest {
        job_id: firing_job_id(tenant, schedule_id, slot, triggered),
        topic: t.topic,
        tenant_id: tenant.to_owned(),
        principal_id: (!principal.is_empty()).then(|| principal.to_owned()),
        priority: t.priority,
        labels,
        env: t.env,
        payload: t.payload,
        budget: t.budget,
        meta,
        workflow_id: None,
        step_index: None,
        compensation: None,
        submitted_at: now,
        traceparent: None,
        not_before: None,
        ..JobRequest::default()
    }
}

/// Why a schedule's jobs may not be submitted on its topic as its tenant and principal, if
/// they may not: the topic is bound to other tenants, or produced by another principal (a
/// schedule submits as the principal that made it, so that four eyes still holds).
fn template_not_allowed(rules: &crate::rules::Rules, r: &JobRequest) -> Option<String> {
    if let Some(why) = rules.tenant_not_allowed(&r.topic, &r.tenant_id, &r.job_id) {
        return Some(why);
    }
    rules
        .bound_principal(&r.topic, r.principal_id.as_deref())
        .err()
}

fn invalid_tenant(tenant: &str) -> Option<String> {
    (tenant.trim().is_empty()
        || tenant.len() > MAX_ID_BYTES
        || tenant.contains(':')
        || tenant.chars().any(char::is_control))
    .then(|| {
        format!(
            "tenant_id {:?} must be 1 to {MAX_ID_BYTES} bytes without ':' or control characters",
            crate::records::truncate_for_display(tenant, 64)
        )
    })
}

fn catch_up_name(c: ScheduleCatchUp) -> &'static str {
    match c {
        ScheduleCatchUp::None => "NONE",
        ScheduleCatchUp::Last => "LAST",
        ScheduleCatchUp::All => "ALL",
    }
}
