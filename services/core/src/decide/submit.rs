//! JobRequest: duplicates, idempotency, routing, the safety kernel, queueing (SPEC §3-§6).

use crate::decide::Decider;
use crate::events::*;
use crate::hash::job_hash;
use crate::policy::{PolicyDecision, input_document};
use crate::reason::{DlqReason, Rejection};
use crate::records::{Constraints, JobRequest, Millis, RedriveJob};
use crate::rules::{Limits, Rules};
use crate::state::{Job, State};

/// Who cancels a job a later job of its debounce key replaced (`JobCancelled.principal_id`).
pub const DEBOUNCE_PRINCIPAL: &str = "ksched:debounce";

/// Label naming the one pool a job would like (SPEC §3.3).
pub(super) const LABEL_PREFERRED_POOL: &str = "preferred_pool";

impl Decider<'_, '_> {
    pub(super) fn submit(&mut self, input: &JobRequest) {
        let mut request = input.clone();
        // Routing trusts the topic the record was read from, not what the producer wrote
        // (the processor already journals it so; an input that says otherwise keeps its own
        // request in JobAccepted).
        request.topic = self.cause().topic.clone();
        let journal_request = request != *input;
        if let Some((code, problem)) = invalid_request(&request, &self.rules().rules.limits) {
            self.dead_letter_input(&request.job_id, &request.tenant_id, code, problem);
            return;
        }
        if request.job_id.contains(super::saga::COMPENSATION_MARKER) {
            let problem = format!(
                "job ids holding {:?} are saga compensations' own; choose another",
                super::saga::COMPENSATION_MARKER
            );
            self.dead_letter_input(
                &request.job_id,
                &request.tenant_id,
                DlqReason::MalformedRecord,
                problem,
            );
            return;
        }

        if crate::schedule::is_firing_job_id(&request.job_id) {
            let problem = format!(
                "job {}: ids ending in @<RFC 3339 time> are schedule firings' own; choose another",
                crate::records::truncate_for_display(&request.job_id, 64)
            );
            self.dead_letter_input(
                &request.job_id,
                &request.tenant_id,
                DlqReason::MalformedRecord,
                problem,
            );
            return;
        }

        if let Some(why) = self.rules().rules.tenant_not_allowed(
            &request.topic,
            &request.tenant_id,
            &request.job_id,
        ) {
            self.dead_letter_input(
                &request.job_id,
                &request.tenant_id,
                DlqReason::TenantNotAllowed,
                why,
            );
            return;
        }

        match self
            .rules()
            .rules
            .bound_principal(&request.topic, request.principal_id.as_deref())
        {
            Ok(Some(bound)) if request.principal_id.is_none() => {
                // Four eyes compares approvers with the topic's producer, not with a claim.
                request.principal_id = Some(bound.to_owned());
            }
            Ok(_) => {}
            Err(why) => {
                self.dead_letter_input(
                    &request.job_id,
                    &request.tenant_id,
                    DlqReason::TenantNotAllowed,
                    why,
                );
                return;
            }
        }
        let journal_request = journal_request || request.principal_id != input.principal_id;

        if let Some(existing) = self.state().jobs.get(&request.job_id) {
            let same = same_submission(existing, &request);
            let job_id = request.job_id.clone();
            self.emit(Event::JobDuplicate(JobDuplicate {
                job_id: job_id.clone(),
                existing_job_id: job_id.clone(),
                kind: if same {
                    DuplicateKind::SameJobId
                } else {
                    DuplicateKind::ConflictingJobId
                },
                idempotency_key: request.meta.idempotency_key.clone(),
            }));
            if !same {
                let reason = format!(
                    "job_id {job_id} was already submitted with different content; the new submission is dropped"
                );
                self.dead_letter_input(
                    &job_id,
                    &request.tenant_id,
                    DlqReason::DuplicateJobId,
                    reason,
                );
            }
            return;
        }

        let retention = self.rules().rules.timing.idempotency_retention_ms;
        let idempotent = (request.meta.idempotency_key.clone()).map(|key| {
            (
                (request.tenant_id.clone(), key),
                retention,
                DuplicateKind::IdempotencyKey,
            )
        });
        let unique_key = unique_key_of(&self.rules().rules, &request);
        let unique = unique_key.clone().map(|key| {
            let window = self.rules().rules.topic_unique[&request.topic].window_ms();
            let scope = unique_scope(&request.tenant_id, &request.topic);
            ((scope, key), window, DuplicateKind::UniqueKey)
        });
        for (held, window, kind) in [idempotent, unique].into_iter().flatten() {
            let seen = (self.state().idempotency.get(&held))
                .filter(|e| self.now().saturating_sub(e.seen_at) < window)
                .map(|e| e.job_id.clone());
            if let Some(existing_job_id) = seen {
                self.emit(Event::JobDuplicate(JobDuplicate {
                    job_id: request.job_id.clone(),
                    existing_job_id,
                    kind,
                    idempotency_key: Some(held.1),
                }));
                return;
            }
        }

        let config = self.rules();
        let (pools, _) = route(&config.rules, &request);
        if let Some(why) = queue_full(self.state(), &config.rules, &request, &pools)
            .or_else(|| blocked_refused(self.state(), &config.rules, &request))
        {
            self.dead_letter_input(
                &request.job_id,
                &request.tenant_id,
                DlqReason::QueueFull,
                why,
            );
            return;
        }
        if let Some((code, why)) = delay_refused(self.state(), &config.rules, &request, self.now())
            .or_else(|| super::batches::batch_refused(self.state(), &config.rules, &request))
        {
            self.dead_letter_input(&request.job_id, &request.tenant_id, code, why);
            return;
        }
        self.open_batch_of(&request);
        self.accept(request, journal_request, unique_key);
    }

    /// Admits a job (a submission, a schedule's firing or a saga compensation): routing,
    /// policy, queueing. `journal_request`: the request is not the entry's input, so
    /// JobAccepted carries it. `unique_key`: the unique key a submission takes (SPEC §10).
    pub(super) fn accept(
        &mut self,
        request: JobRequest,
        journal_request: bool,
        unique_key: Option<String>,
    ) {
        let job_id = request.job_id.clone();
        let notes = self.record_accepted(request, journal_request, unique_key);
        self.mark_awaited(&job_id);
        self.route_and_judge(&job_id, notes);
    }

    /// Journals JobAccepted (the job exists from here on); returns the routing notes.
    fn record_accepted(
        &mut self,
        request: JobRequest,
        journal_request: bool,
        unique_key: Option<String>,
    ) -> Vec<String> {
        let (pools, notes) = route(&self.rules().rules, &request);
        self.emit(Event::JobAccepted(JobAccepted {
            job_id: request.job_id.clone(),
            job_hash: job_hash(&request),
            pools,
            routing_notes: notes.clone(),
            request: journal_request.then(|| Box::new(request)),
            unique_key,
        }));
        notes
    }

    /// An accepted job with no pool fails for good; the others go to the safety kernel.
    fn route_and_judge(&mut self, job_id: &str, notes: Vec<String>) {
        if self.state().jobs[job_id].pools.is_empty() {
            let reason = notes.join("; ");
            self.fail_for_good(job_id, DlqReason::NoPoolMapping.as_str(), None, reason);
            return;
        }
        let decision = self.evaluate_input_policy(job_id);
        self.apply_policy_decision(job_id, decision);
    }

    /// RedriveJob: a dead-lettered job submitted again as `new_job_id`, with the same request
    /// (submitted now: its deadline counts from the redrive; no idempotency key, the old job
    /// keeps it) and the same stored payload. It is routed, judged by the policy, approved
    /// and limited like any submission. Saga steps are not redriven alone.
    pub(super) fn redrive(&mut self, r: &RedriveJob) {
        if !self.commanded(
            &r.job_id,
            r.tenant_id.as_deref(),
            &r.principal_id,
            "redrive",
        ) {
            return;
        }
        let old = &self.state().jobs[&r.job_id];
        if !old.state.is_dead_lettered() {
            let reason = format!(
                "the job is {}; only a dead-lettered job (FAILED, TIMEOUT, DENIED) is redriven",
                old.state
            );
            self.refuse(&r.job_id, Rejection::NotDeadLettered, reason);
            return;
        }
        if let Some(wf) = &old.request.workflow_id {
            let reason = format!(
                "the job is a step of workflow {wf}; a saga step is not redriven alone (submit the workflow again)"
            );
            self.refuse(&r.job_id, Rejection::InvalidTransition, reason);
            return;
        }
        let new_id = r.new_job_id.trim();
        if new_id.is_empty()
            || new_id.len() > MAX_ID_BYTES
            || new_id != r.new_job_id
            || new_id.chars().any(char::is_control)
            || new_id.contains(super::saga::COMPENSATION_MARKER)
            || crate::schedule::is_firing_job_id(new_id)
        {
            let reason = format!(
                "new job id {:?} must be 1 to {MAX_ID_BYTES} bytes without surrounding spaces or control characters, and not a saga compensation's (holding {:?}) or a schedule firing's (ending in @<time>)",
                crate::records::truncate_for_display(&r.new_job_id, 64),
                super::saga::COMPENSATION_MARKER
            );
            self.refuse(&r.job_id, Rejection::InvalidJobId, reason);
            return;
        }
        if self.state().jobs.contains_key(new_id) {
            let reason = format!("job {new_id} exists already; choose another new job id");
            self.refuse(&r.job_id, Rejection::JobIdTaken, reason);
            return;
        }
        let mut request = old.request.clone();
        request.job_id = new_id.to_owned();
        request.submitted_at = self.now();
        request.meta.idempotency_key = None;
        // Submitted now: a time it was to wait for has passed, or it would not have ended;
        // so have its dependencies (an operator redriving it runs it whatever they did).
        request.not_before = None;
        request.depends_on.clear();
        request.dependency_timeout_ms = None;
        // Nor does it join its batch again (which counted its end), nor wait for one.
        request.batch_id = None;
        request.batch_size = None;
        request.after_batch = None;
        request.batch_outcome = None;
        let config = self.rules();
        // A tenant-bound topic's job ids stay in their tenant's namespace.
        if let Some(why) =
            config
                .rules
                .tenant_not_allowed(&request.topic, &request.tenant_id, &request.job_id)
        {
            self.refuse(&r.job_id, Rejection::TenantMismatch, why);
            return;
        }
        let (pools, _) = route(&config.rules, &request);
        if let Some(why) = queue_full(self.state(), &config.rules, &request, &pools) {
            self.refuse(&r.job_id, Rejection::QueueFull, why);
            return;
        }
        let notes = self.record_accepted(request, true, None);
        self.mark_awaited(new_id);
        self.emit(Event::JobRedriven(JobRedriven {
            job_id: r.job_id.clone(),
            new_job_id: new_id.to_owned(),
            principal_id: r.principal_id.clone(),
            reason: r.reason.clone(),
        }));
        self.route_and_judge(new_id, notes);
    }

    /// Asks the safety kernel about a job, with the effective constraints filled in.
    pub(super) fn evaluate_input_policy(&mut self, job_id: &str) -> Judged {
        let config = self.rules();
        let job = &self.state().jobs[job_id];
        let tenant_active = self.state().tenant_active_jobs(&job.request.tenant_id);
        let doc = || input_document(&job.request, job.payload_len, tenant_active, &job.pools);
        let decision: PolicyDecision = self.ctx().policy.evaluate_input_lazily(&config.raw, &doc);
        Judged {
            event: PolicyEvaluated {
                job_id: job_id.to_owned(),
                snapshot_id: config.raw.policy_snapshot.clone(),
                verdict: decision.verdict,
                reasons: decision.reasons,
                constraints: effective_constraints(job, &decision.constraints, &config.rules),
            },
            limit_exceeded: decision.limit_exceeded,
        }
    }

    /// Journals a policy decision and acts on it.
    pub(super) fn apply_policy_decision(&mut self, job_id: &str, judged: Judged) {
        let Judged {
            event: decision,
            limit_exceeded,
        } = judged;
        let verdict = decision.verdict;
        let reasons = decision.reasons.clone();
        let snapshot = decision.snapshot_id.clone();
        self.emit(Event::PolicyEvaluated(decision));
        match verdict {
            Verdict::Allow => self.admit(job_id),
            Verdict::Deny => {
                let code = if limit_exceeded {
                    DlqReason::PolicyLimitExceeded
                } else {
                    DlqReason::SafetyDenied
                };
                self.deny(job_id, code, reasons, None)
            }
            Verdict::RequireApproval
                if self.rules().rules.four_eyes
                    && super::control::submitter(&self.state().jobs[job_id].request).is_none() =>
            {
                // Nobody could approve it: refuse it now rather than leave it waiting.
                let why = super::control::unknown_submitter(job_id);
                self.deny(job_id, DlqReason::SubmitterUnknown, vec![why], None)
            }
            Verdict::RequireApproval => {
                let job_hash = self.state().jobs[job_id].job_hash.clone();
                self.emit(Event::ApprovalRequested(ApprovalRequested {
                    job_id: job_id.to_owned(),
                    job_hash,
                    snapshot_id: snapshot,
                    reasons,
                }));
            }
        }
    }

    /// An allowed (or approved) job: it waits DELAYED while its `not_before` is ahead
    /// (SPEC §9), or its debounce window is open (SPEC §10), and goes to its queues
    /// otherwise.
    pub(super) fn admit(&mut self, job_id: &str) {
        if self.block(job_id) {
            return;
        }
        let debounced = match self.debounce(job_id) {
            Debounced::No => None,
            Debounced::Until(due) => Some(due),
            Debounced::Replaced => return,
        };
        match self.state().jobs[job_id].request.not_before.max(debounced) {
            Some(not_before) if not_before > self.now() => {
                self.emit(Event::JobDelayed(JobDelayed {
                    job_id: job_id.to_owned(),
                    not_before,
                }));
            }
            _ => self.enqueue(job_id),
        }
    }

    /// Holds a job of a topic with a debounce rule (SPEC §10): it waits the rule's wait from
    /// now, and replaces (cancels) the job waiting under its key if that one's window is
    /// open, no longer than the max wait from the first job of the run. A job admitted late
    /// (approved) finding a job accepted after it waiting under its key is the one replaced:
    /// the later request wins. Saga steps and compensations, and schedule firings, are not
    /// debounced.
    fn debounce(&mut self, job_id: &str) -> Debounced {
        let request = &self.state().jobs[job_id].request;
        let config = self.rules();
        let Some(rule) = config.rules.topic_debounce.get(&request.topic) else {
            return Debounced::No;
        };
        let Some(key) = rule
            .key_of(&request.labels)
            .filter(|_| debounceable(request))
        else {
            return Debounced::No;
        };
        let (wait, max_wait) = (rule.wait_ms(), rule.max_wait_ms());
        let window_key = (request.tenant_id.clone(), request.topic.clone(), key);
        let now = self.now();
        let open =
            self.state().debounces.get(&window_key).filter(|w| {
                w.due > now
                    && w.job_id != job_id
                    && self.state().jobs.get(&w.job_id).is_some_and(|j| {
                        j.state == JobState::Delayed && j.delayed_until == Some(w.due)
                    })
            });
        let accepted_at = self.state().jobs[job_id].accepted_at;
        if let Some(w) = open
            && self.state().jobs[&w.job_id].accepted_at > accepted_at
        {
            let reason = format!(
                "debounced: job {}, accepted after it with the same debounce key {:?}, waits to run",
                w.job_id,
                crate::records::truncate_for_display(&window_key.2, 64)
            );
            self.cancel_job(job_id, DEBOUNCE_PRINCIPAL, Some(reason));
            return Debounced::Replaced;
        }
        let (first_at, replaces) = match open {
            Some(w) => (w.first_at, Some(w.job_id.clone())),
            None => (now, None),
        };
        // The window never outlives the max wait; a job of a later time of its own waits
        // for that, out of the window's reach.
        let due = now
            .saturating_add(wait)
            .min(first_at.saturating_add(max_wait));
        let (_, _, key) = window_key;
        self.emit(Event::JobDebounced(JobDebounced {
            job_id: job_id.to_owned(),
            key: key.clone(),
            first_at,
            due,
            replaces: replaces.clone(),
        }));
        if let Some(old) = replaces {
            let reason = format!(
                "debounced: job {job_id} of the same debounce key {:?} replaced it",
                crate::records::truncate_for_display(&key, 64)
            );
            self.cancel_job(&old, DEBOUNCE_PRINCIPAL, Some(reason));
        }
        Debounced::Until(due)
    }

    /// Puts a PENDING job in its pools' queues and tries to place it; if it cannot be placed
    /// now, journals why it waits.
    pub(super) fn enqueue(&mut self, job_id: &str) {
        let pools = self.queue(job_id);
        self.schedule_pools(pools);
        self.explain_waiting(&[job_id]);
    }

    /// Puts a PENDING job in its pools' queues (JobQueued); returns the pools.
    pub(super) fn queue(&mut self, job_id: &str) -> Vec<String> {
        let job = &self.state().jobs[job_id];
        let pools = job.pools.clone();
        let priority = job.request.priority;
        self.emit(Event::JobQueued(JobQueued {
            job_id: job_id.to_owned(),
            pools: pools.clone(),
            priority,
        }));
        pools
    }

    /// Journals why each of `jobs` still in a queue waits (JobWaiting).
    pub(super) fn explain_waiting(&mut self, jobs: &[impl AsRef<str>]) {
        for job_id in jobs.iter().map(AsRef::as_ref) {
            if self
                .state()
                .jobs
                .get(job_id)
                .is_none_or(|j| j.queued_at.is_none())
            {
                continue;
            }
            let blocked = self.blocker(job_id);
            self.emit(Event::JobWaiting(JobWaiting {
                job_id: job_id.to_owned(),
                reason_code: blocked.code.as_str().to_owned(),
                detail: blocked.detail,
                candidates: blocked.candidates.listed,
                candidates_omitted: blocked.candidates.omitted,
            }));
        }
    }
}

/// What a debounce rule does with a job being admitted.
enum Debounced {
    /// Nothing: no rule, no key, or a job no rule debounces.
    No,
    /// It waits until then.
    Until(Millis),
    /// A job of its key accepted after it waits: this one is cancelled.
    Replaced,
}

/// The input policy's decision on a job, as journaled, and whether the evaluation was
/// stopped at a limit (a denial then dead-letters `policy_limit_exceeded`).
#[derive(Debug)]
pub(super) struct Judged {
    pub(super) event: PolicyEvaluated,
    pub(super) limit_exceeded: bool,
}

/// Whether a job may be debounced (SPEC §10): not a saga's step or compensation (a saga
/// waits for each of them), nor a schedule's firing (its overlap policy governs it), nor a
/// job with dependencies (it runs when they let it, not when a window closes).
pub(crate) fn debounceable(r: &JobRequest) -> bool {
    super::saga::workflow_of(r).is_none()
        && !crate::schedule::is_firing_job_id(&r.job_id)
        && r.depends_on.is_empty()
        && r.after_batch.is_none()
}

/// The unique key a submission on its topic takes (SPEC §10), if the topic has a unique
/// rule and the job a key: `label:VALUE`, or `payload:DIGEST` (hex of the payload's digest).
pub(crate) fn unique_key_of(rules: &Rules, r: &JobRequest) -> Option<String> {
    let rule = rules.topic_unique.get(&r.topic)?;
    rule.key_of(&r.labels, || {
        crate::hash::hex(&crate::apply::payload_digest(&r.payload))
    })
}

/// Where a topic's unique keys are kept among the idempotency keys: under a tenant of
/// `<tenant>:unique:<topic>`, which no submission can name (tenant ids hold no `:`), so a
/// producer's idempotency key never meets a unique key.
pub fn unique_scope(tenant: &str, topic: &str) -> String {
    format!("{tenant}:unique:{topic}")
}

/// Longest job or tenant id, in bytes (ids key records, logs and terminals).
pub(super) const MAX_ID_BYTES: usize = 256;

/// Why a decodable request still cannot be scheduled, if it cannot: `record_too_large` for
/// what exceeds the configured limits, `malformed_record` for the rest.
pub(super) fn invalid_request(r: &JobRequest, limits: &Limits) -> Option<(DlqReason, String)> {
    let malformed = |m: String| Some((DlqReason::MalformedRecord, m));
    let too_large = |m: String| Some((DlqReason::RecordTooLarge, m));
    if r.job_id.trim().is_empty() {
        return malformed("job_id is empty".into());
    }
    if r.tenant_id.trim().is_empty() {
        return malformed(format!("job {}: tenant_id is empty", r.job_id));
    }
    if r.tenant_id.contains(':') {
        // `<tenant>:` begins the tenant's job ids (and its compensations'): a tenant named
        // with a colon could take another's.
        return malformed(format!(
            "job {}: tenant_id {:?} must not contain ':'",
            r.job_id,
            crate::records::truncate_for_display(&r.tenant_id, 64)
        ));
    }
    let workflow = r.workflow_id.as_deref().unwrap_or("");
    for (what, id) in [
        ("job_id", &*r.job_id),
        ("tenant_id", &*r.tenant_id),
        ("workflow_id", workflow),
    ] {
        if id.len() > MAX_ID_BYTES || id.chars().any(char::is_control) {
            return malformed(format!(
                "{what} {:?} must be at most {MAX_ID_BYTES} bytes without control characters",
                crate::records::truncate_for_display(id, 64)
            ));
        }
    }
    if r.not_before.is_some_and(|t| t < 0) {
        return malformed(format!(
            "job {}: not_before {} is before 1970",
            r.job_id,
            r.not_before.unwrap_or(0)
        ));
    }
    if let Some(why) = invalid_dependencies(r, limits) {
        return Some((DlqReason::InvalidDependencies, why));
    }
    if let Some(why) = super::batches::invalid_batch(r, limits) {
        return Some((DlqReason::InvalidBatch, why));
    }
    if r.budget.deadline_ms.is_some_and(|d| d <= 0) {
        return malformed(format!(
            "job {}: budget.deadline_ms must be positive",
            r.job_id
        ));
    }
    if r.budget.max_runtime_ms.is_some_and(|d| d <= 0) {
        return malformed(format!(
            "job {}: budget.max_runtime_ms must be positive",
            r.job_id
        ));
    }
    let payload = r.payload.len() as i64;
    if payload > limits.max_payload_bytes {
        return too_large(format!(
            "job {}: payload of {payload} bytes exceeds limits.max_payload_bytes {}",
            r.job_id, limits.max_payload_bytes
        ));
    }
    for (what, map, max) in [
        ("labels", &r.labels, limits.max_labels),
        ("env", &r.env, limits.max_env),
    ] {
        if map.len() > usize::try_from(max).unwrap_or(0) {
            return too_large(format!(
                "job {}: {} {what} exceed limits.max_{what} {max}",
                r.job_id,
                map.len()
            ));
        }
        if let Some((k, v)) = map.iter().find(|(k, v)| {
            k.len() as i64 > limits.max_entry_bytes || v.len() as i64 > limits.max_entry_bytes
        }) {
            return too_large(format!(
                "job {}: {what} entry {:?} ({} + {} bytes) exceeds limits.max_entry_bytes {}",
                r.job_id,
                crate::records::truncate_for_display(k, 64),
                k.len(),
                v.len(),
                limits.max_entry_bytes
            ));
        }
    }
    None
}

/// Why a request's dependencies cannot be waited for (SPEC §11), if they cannot.
fn invalid_dependencies(r: &JobRequest, limits: &Limits) -> Option<String> {
    let max = usize::try_from(limits.max_dependencies).unwrap_or(usize::MAX);
    if r.depends_on.len() > max {
        return Some(format!(
            "job {}: depends on {} jobs, more than limits.max_dependencies {max}",
            r.job_id,
            r.depends_on.len()
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for id in &r.depends_on {
        let shown = crate::records::truncate_for_display(id, 64);
        if id.trim().is_empty() || id.len() > MAX_ID_BYTES || id.chars().any(char::is_control) {
            return Some(format!(
                "job {}: dependency {shown:?} must be 1 to {MAX_ID_BYTES} bytes without control characters",
                r.job_id
            ));
        }
        if *id == r.job_id {
            return Some(format!("job {}: a job cannot depend on itself", r.job_id));
        }
        // Their jobs are accepted by other inputs than a submission, which do not look for
        // jobs waiting for them.
        if crate::schedule::is_firing_job_id(id) || id.contains(super::saga::COMPENSATION_MARKER) {
            return Some(format!(
                "job {}: dependency {shown:?} is a schedule firing's or a saga compensation's id, which cannot be waited for",
                r.job_id
            ));
        }
        if !seen.insert(id.as_str()) {
            return Some(format!("job {}: depends on {shown:?} twice", r.job_id));
        }
    }
    let max_wait = limits.max_dependency_wait_ms;
    if let Some(t) = r.dependency_timeout_ms
        && (t <= 0 || t > max_wait)
    {
        return Some(format!(
            "job {}: dependency_timeout_ms {t} must be positive and at most limits.max_dependency_wait_ms {max_wait}",
            r.job_id
        ));
    }
    None
}

/// Why the job may not enter its pools' queues now (admission limits), if it may not.
pub(super) fn queue_full(
    state: &State,
    rules: &Rules,
    r: &JobRequest,
    pools: &[String],
) -> Option<String> {
    let max_pool = rules.limits.max_pending_per_pool;
    if let Some(pool) = pools.iter().find(|p| {
        state
            .queued
            .get(*p)
            .map_or(0, |n| i64::try_from(*n).unwrap_or(i64::MAX))
            >= max_pool
    }) {
        return Some(format!(
            "pool {pool} already has {max_pool} pending jobs (limits.max_pending_per_pool); submit again later"
        ));
    }
    if let Some(c) = rules.concurrency_of(&r.topic, |name| r.labels.get(name).map(String::as_str)) {
        let max = rules.limits.max_concurrency_keys as usize;
        let live = &state.key_live;
        let is_live = live.contains_key(&(r.tenant_id.clone(), c.key.clone()));
        if live.len() >= max && !is_live {
            return Some(format!(
                "the shard has {max} concurrency keys with jobs queued or active (limits.max_concurrency_keys); submit again later"
            ));
        }
        // Buckets outlive their keys' jobs (until full again): bounded the same way.
        if let Some(rate) = c.rate
            && state.buckets.len() >= max
            && !is_live
            && !state
                .buckets
                .contains_key(&(r.tenant_id.clone(), c.key.clone(), rate))
        {
            return Some(format!(
                "the shard has {max} rate limit buckets not yet full (limits.max_concurrency_keys); submit again later"
            ));
        }
    }
    if let Some(rule) = rules.topic_debounce.get(&r.topic)
        && debounceable(r)
        && let Some(key) = rule.key_of(&r.labels)
    {
        let max = rules.limits.max_concurrency_keys as usize;
        let window_key = (r.tenant_id.clone(), r.topic.clone(), key);
        if state.debounces.len() >= max && !state.debounces.contains_key(&window_key) {
            return Some(format!(
                "the shard has {max} debounce windows open (limits.max_concurrency_keys); submit again later"
            ));
        }
    }
    let max_tenant = rules.max_pending_for_tenant(&r.tenant_id)?;
    let pending = state.tenant_pending.get(&r.tenant_id).copied().unwrap_or(0);
    (pending >= max_tenant).then(|| {
        format!(
            "tenant {} already has {pending} pending jobs, its limit is {max_tenant}; submit again later",
            r.tenant_id
        )
    })
}

/// A resubmission is "the same job" when everything but the topic the scheduler fills in is
/// equal (the payload by its length and digest: the job holds no payload).
fn same_submission(existing: &Job, new: &JobRequest) -> bool {
    let payload = &new.payload;
    if existing.payload_len != payload.len() as u64
        || existing.payload_digest != crate::apply::payload_digest(payload)
    {
        return false;
    }
    let a = &existing.request;
    // The same job, whoever traced this submission of it (and a callback's counts are
    // the scheduler's, set once it was released).
    let b = JobRequest {
        topic: a.topic.clone(),
        payload: Vec::new(),
        traceparent: a.traceparent.clone(),
        batch_outcome: a.batch_outcome.clone(),
        ..new.clone()
    };
    *a == b
}

/// Topic -> mapped pools -> those whose `requires` cover the job's -> `preferred_pool`.
/// Returns the eligible pools in preference order and notes on what was left out.
pub(crate) fn route(rules: &crate::rules::Rules, r: &JobRequest) -> (Vec<String>, Vec<String>) {
    let mut notes = Vec::new();
    let Some(mapped) = rules.pools_for_topic(&r.topic) else {
        notes.push(format!("topic {} is not mapped to any pool", r.topic));
        return (Vec::new(), notes);
    };
    let mut eligible = Vec::new();
    for pool in mapped {
        let offered = rules
            .pools
            .get(pool)
            .map(|p| p.requires.as_slice())
            .unwrap_or(&[]);
        let missing: Vec<&String> = r
            .meta
            .requires
            .iter()
            .filter(|need| !offered.iter().any(|o| o.eq_ignore_ascii_case(need)))
            .collect();
        if missing.is_empty() {
            eligible.push(pool.clone());
        } else {
            notes.push(format!(
                "pool {pool} lacks {}",
                missing
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if eligible.is_empty() {
        notes.push(format!(
            "no pool mapped for topic {} offers [{}]",
            r.topic,
            r.meta.requires.join(", ")
        ));
        return (eligible, notes);
    }
    if let Some(preferred) = r.labels.get(LABEL_PREFERRED_POOL) {
        if eligible.contains(preferred) {
            notes.push(format!("preferred_pool {preferred} honoured"));
            eligible = vec![preferred.clone()];
        } else if mapped.contains(preferred) {
            notes.push(format!(
                "preferred_pool {preferred} ignored: it lacks the required capabilities"
            ));
        } else {
            notes.push(format!(
                "preferred_pool {preferred} ignored: not mapped for topic {}",
                r.topic
            ));
        }
    }
    (eligible, notes)
}

/// Policy constraints over the job's budget and the configured defaults (SPEC §5): the
/// effective deadline, and the effective runtime limit, are the smaller of the job's and
/// the policy's.
fn effective_constraints(
    job: &Job,
    policy: &Constraints,
    rules: &crate::rules::Rules,
) -> Constraints {
    // Each side's limit counts only when it is one (positive): a policy's 0 does not erase
    // the job's own deadline.
    let deadline_ms = match (
        job.request.budget.deadline_ms.filter(|d| *d > 0),
        policy.deadline_ms.filter(|d| *d > 0),
    ) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Constraints {
        max_retries: Some(policy.max_retries.unwrap_or(rules.retry.max_retries).max(0)),
        max_concurrent_jobs: policy
            .max_concurrent_jobs
            .or_else(|| rules.max_concurrent_for_tenant(&job.request.tenant_id)),
        // Like the deadline: the tighter of the job's own limit and the policy's.
        max_runtime_ms: match (
            policy.max_runtime_ms.filter(|v| *v > 0),
            job.request.budget.max_runtime_ms.filter(|v| *v > 0),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        },
        deadline_ms,
        labels: policy.labels.clone(),
    }
}

/// Why a job with dependencies may not wait for them (`queue_full`), if it may not: the
/// shard holds `limits.max_blocked_jobs` already.
fn blocked_refused(state: &State, rules: &Rules, r: &JobRequest) -> Option<String> {
    if r.depends_on.is_empty() && r.after_batch.is_none() {
        return None;
    }
    let blocked = (state.jobs_by_state.get(&crate::events::JobState::Blocked)).map_or(0, |n| *n);
    let max = rules.limits.max_blocked_jobs;
    (i64::try_from(blocked).unwrap_or(i64::MAX) >= max).then(|| {
        format!(
            "job {}: the shard holds {blocked} blocked jobs, limits.max_blocked_jobs {max}",
            r.job_id
        )
    })
}

/// Why a job that would wait DELAYED may not (`delay_too_long`, `queue_full`), if it may not:
/// its time lies further ahead than `limits.max_delay_ms`, or the shard holds
/// `limits.max_delayed_jobs` already.
pub(super) fn delay_refused(
    state: &State,
    rules: &Rules,
    r: &JobRequest,
    now: crate::records::Millis,
) -> Option<(DlqReason, String)> {
    let not_before = r.not_before.filter(|t| *t > now)?;
    let limits = &rules.limits;
    if not_before - now > limits.max_delay_ms {
        return Some((
            DlqReason::DelayTooLong,
            format!(
                "job {}: not_before {not_before} is {} ms ahead, more than limits.max_delay_ms {}",
                r.job_id,
                not_before - now,
                limits.max_delay_ms
            ),
        ));
    }
    let delayed = state
        .jobs_by_state
        .get(&crate::events::JobState::Delayed)
        .copied()
        .unwrap_or(0);
    if i64::try_from(delayed).unwrap_or(i64::MAX) >= limits.max_delayed_jobs {
        return Some((
            DlqReason::QueueFull,
            format!(
                "job {}: the shard holds {delayed} delayed jobs, limits.max_delayed_jobs",
                r.job_id
            ),
        ));
    }
    None
}
