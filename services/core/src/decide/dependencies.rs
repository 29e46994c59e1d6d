//! Dependencies (SPEC §11): a job that names other jobs in `depends_on` waits BLOCKED, once
//! it is allowed (and approved), until its condition holds; then it goes on as if submitted
//! then (its time, its queues). When the condition can no longer hold, or its dependency
//! timeout passes first, it fails `dependency_failed`, naming the dependency that decided it.
//!
//! Only jobs of its own tenant, on its shard, count: another tenant's id is waited for as
//! if it did not exist (and so times out), so a job learns nothing of other tenants' jobs;
//! a job of another shard (its topic routed to pools another shard schedules) is not known
//! here and times out likewise. Dependencies
//! already ended count at once, from their records (loaded from storage if they left
//! memory). A job that is waited for is marked so (JobAwaited, also when it is submitted
//! after its dependent); its end makes it *settling*, and the next entry, a continuation,
//! tells its dependents, as many as the entry's work bound allows, the rest in the
//! continuations after ([`crate::state::Dependents`]).

use crate::decide::Decider;
use crate::events::*;
use crate::reason::DlqReason;
use crate::records::{DependencyCondition, Millis};
use crate::state::{batch_dependency, display_dependency, parse_batch_name};

/// Most dependencies a `dependency_failed` reason lists by id.
const LISTED: usize = 5;

impl Decider<'_, '_> {
    /// An admitted job with dependencies it has not waited for yet waits for them (JobBlocked,
    /// counting those that ended already), unless they decide at once. Returns whether it
    /// stopped here: blocked, or failed.
    pub(super) fn block(&mut self, job_id: &str) -> bool {
        let job = &self.state().jobs[job_id];
        let waits = !job.request.depends_on.is_empty() || job.request.after_batch.is_some();
        if !waits || job.awaiting.is_some() {
            return false;
        }
        let tenant = job.request.tenant_id.clone();
        let limits = &self.rules().rules.limits;
        // Checked at submission; a job that waited for an approval is checked here.
        let blocked = (self.state().jobs_by_state.get(&JobState::Blocked)).map_or(0, |n| *n);
        if i64::try_from(blocked).unwrap_or(i64::MAX) >= limits.max_blocked_jobs {
            let reason = format!(
                "the shard holds {blocked} blocked jobs, limits.max_blocked_jobs {}",
                limits.max_blocked_jobs
            );
            self.fail_for_good(job_id, DlqReason::QueueFull.as_str(), None, reason);
            return true;
        }
        let timeout = (job.request.dependency_timeout_ms).unwrap_or(limits.max_dependency_wait_ms);
        let until = job.accepted_at.saturating_add(timeout);
        if let Some(batch) = job.request.after_batch.clone() {
            return self.block_on_batch(job_id, &tenant, &batch, until);
        }
        let mut deps = job.request.depends_on.clone();
        deps.sort_unstable();
        let (mut waiting_on, mut awaited) = (Vec::new(), Vec::new());
        let (mut succeeded, mut failed, mut last_failed) = (0, 0, None);
        let mut cycle = None;
        for dep in deps {
            // Another tenant's job is waited for as if it did not exist.
            match (self.state().jobs.get(&dep)).filter(|j| j.request.tenant_id == tenant) {
                Some(j) if j.state == JobState::Succeeded => succeeded += 1,
                Some(j) if j.state.is_terminal() => {
                    failed += 1;
                    last_failed = Some(dep);
                }
                Some(j) => {
                    // It waits for this job already (named before this job was submitted).
                    let waits_for_it = j.state == JobState::Blocked
                        && (j.awaiting.as_deref())
                            .is_some_and(|a| a.open.iter().any(|o| o == job_id));
                    if waits_for_it && cycle.is_none() {
                        cycle = Some(dep.clone());
                    }
                    if !j.awaited {
                        awaited.push(dep.clone());
                    }
                    waiting_on.push(dep);
                }
                None => waiting_on.push(dep),
            }
        }
        self.emit(Event::JobBlocked(JobBlocked {
            job_id: job_id.to_owned(),
            waiting_on,
            succeeded,
            failed,
            until,
        }));
        if let Some(dep) = cycle {
            let reason = format!(
                "dependency {dep} waits for this job: waiting for it would close a cycle that could only end at the dependency timeout"
            );
            self.relate_next_dead_letter(&dep);
            self.fail_for_good(job_id, DlqReason::DependencyFailed.as_str(), None, reason);
            return true;
        }
        match self.judge_dependencies(job_id, last_failed.as_deref()) {
            Judgement::Met => {
                self.unblock(job_id);
                false
            }
            Judgement::Failed => true,
            // Its dependencies that have not ended learn that it waits for them.
            Judgement::Waits => {
                for dep in awaited {
                    self.emit(Event::JobAwaited(JobAwaited {
                        job_id: dep,
                        dependent: job_id.to_owned(),
                    }));
                }
                true
            }
        }
    }

    /// A batch's callback waits for its batch: BLOCKED until it completes, which may be at
    /// once; failed when it ended otherwise. Returns whether it stopped here.
    fn block_on_batch(&mut self, job_id: &str, tenant: &str, batch: &str, until: Millis) -> bool {
        let key = (tenant.to_owned(), batch.to_owned());
        let ended = (self.state().batches.get(&key)).map(|b| b.state);
        let (waiting_on, succeeded, failed) = match ended {
            Some(BatchState::Complete) => (vec![], 1, 0),
            Some(BatchState::Expired | BatchState::Cancelled) => (vec![], 0, 1),
            Some(BatchState::Open) | None => (vec![batch_dependency(tenant, batch)], 0, 0),
        };
        self.emit(Event::JobBlocked(JobBlocked {
            job_id: job_id.to_owned(),
            waiting_on,
            succeeded,
            failed,
            until,
        }));
        match self.judge_dependencies(job_id, None) {
            Judgement::Met => {
                self.unblock(job_id);
                false
            }
            Judgement::Failed | Judgement::Waits => true,
        }
    }

    /// A job just submitted that jobs already wait for (submitted before it) is marked
    /// waited for.
    pub(super) fn mark_awaited(&mut self, job_id: &str) {
        let tenant = &self.state().jobs[job_id].request.tenant_id;
        let first = self.state().dependents.of(tenant, job_id).next();
        if let Some(dependent) = first.map(str::to_owned) {
            self.emit(Event::JobAwaited(JobAwaited {
                job_id: job_id.to_owned(),
                dependent,
            }));
        }
    }

    /// Judges a BLOCKED job's condition as its dependencies stand: unchanged while it may
    /// still go either way; failed (`dependency_failed`, naming `decided_by`) when it can no
    /// longer hold.
    fn judge_dependencies(&mut self, job_id: &str, decided_by: Option<&str>) -> Judgement {
        let job = &self.state().jobs[job_id];
        let Some(a) = job
            .awaiting
            .as_deref()
            .filter(|_| job.state == JobState::Blocked)
        else {
            return Judgement::Waits;
        };
        let callback = job.request.after_batch.clone();
        // A callback waits for its batch alone, to complete.
        let (total, condition) = match &callback {
            Some(_) => (1, DependencyCondition::AllSucceeded),
            None => (
                i32::try_from(job.request.depends_on.len()).unwrap_or(i32::MAX),
                job.request.dependency_condition,
            ),
        };
        let (met, failed) = match condition {
            DependencyCondition::AllSucceeded => (a.succeeded == total, a.failed > 0),
            DependencyCondition::AllTerminal => (a.open.is_empty(), false),
            DependencyCondition::AnySucceeded => (a.succeeded > 0, a.failed == total),
        };
        if met {
            return Judgement::Met;
        }
        if !failed {
            return Judgement::Waits;
        }
        if let Some(batch) = callback {
            let key = (job.request.tenant_id.clone(), batch.clone());
            let reason = match self.state().batches.get(&key) {
                Some(b) => format!(
                    "its batch {batch} ended {} before every member did",
                    b.state.as_str()
                ),
                None => format!("its batch {batch} is not known (forgotten after its retention)"),
            };
            let code = DlqReason::DependencyFailed.as_str();
            self.fail_for_good(job_id, code, None, reason);
            return Judgement::Failed;
        }
        let reason = format!(
            "dependency {} did not succeed, so {} can no longer hold ({} of {total} dependencies failed)",
            decided_by.unwrap_or("?"),
            condition.as_str(),
            a.failed
        );
        if let Some(dep) = decided_by {
            self.relate_next_dead_letter(dep);
        }
        let code = DlqReason::DependencyFailed.as_str();
        self.fail_for_good(job_id, code, None, reason);
        Judgement::Failed
    }

    /// A BLOCKED job whose condition holds goes on: PENDING from here, then its time or its
    /// queues.
    /// A callback is given its batch's counts instead (they go into its request).
    fn unblock(&mut self, job_id: &str) {
        let job = &self.state().jobs[job_id];
        let a = job.awaiting.as_deref().cloned().unwrap_or_default();
        let batch = (job.request.after_batch.clone()).and_then(|b| {
            self.state()
                .batches
                .get(&(job.request.tenant_id.clone(), b))
        });
        let (succeeded, failed) = match batch {
            Some(b) => (b.succeeded, b.failed),
            None => (a.succeeded, a.failed),
        };
        self.emit(Event::JobUnblocked(JobUnblocked {
            job_id: job_id.to_owned(),
            succeeded,
            failed,
        }));
    }

    /// A job unblocked by a Tick goes on: DELAYED while its `not_before` is ahead, else to
    /// its queues. Returns whether it was queued.
    fn admit_unblocked(&mut self, job_id: &str) -> bool {
        match self.state().jobs[job_id].request.not_before {
            Some(not_before) if not_before > self.now() => {
                self.emit(Event::JobDelayed(JobDelayed {
                    job_id: job_id.to_owned(),
                    not_before,
                }));
                false
            }
            _ => {
                self.queue(job_id);
                true
            }
        }
    }

    /// A BLOCKED job whose dependency timeout passed fails `dependency_failed`, naming the
    /// first dependency it still waited for.
    pub(super) fn dependency_timed_out(&mut self, job_id: &str) {
        let job = &self.state().jobs[job_id];
        let open = job
            .awaiting
            .as_deref()
            .map(|a| a.open.clone())
            .unwrap_or_default();
        let waited = (job.delayed_until.unwrap_or(job.accepted_at)).saturating_sub(job.accepted_at);
        let shown: Vec<String> = (open.iter().take(LISTED))
            .map(|id| crate::records::truncate_for_display(&display_dependency(id), 64))
            .collect();
        let more = open.len().saturating_sub(LISTED);
        let reason = format!(
            "its dependency timeout ({waited} ms) passed while it waited for {}{}; a dependency never submitted, another tenant's, or one whose topic another shard schedules is never found",
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        );
        if let Some(first) = open.first().filter(|d| parse_batch_name(d).is_none()) {
            self.relate_next_dead_letter(first);
        }
        self.fail_for_good(job_id, DlqReason::DependencyFailed.as_str(), None, reason);
    }

    /// Tells the dependents of the jobs that were settling before this entry of their end,
    /// in order, as far as the entry's work reaches (each dependent told is a unit, each job
    /// settled another); a job whose dependents are all told is settled. Returns the jobs
    /// that went to their queues (the Tick's scheduling pass places them).
    pub(super) fn settle_dependents(&mut self) -> Vec<String> {
        let mut queued = Vec::new();
        for (dep, s) in self.state().settling_now(self.budget_left()) {
            // A cancelled batch's members.
            if let Some(("members", tenant, batch)) = parse_batch_name(&dep) {
                let (tenant, batch) = (tenant.to_owned(), batch.to_owned());
                if !self.cancel_members(&dep, &tenant, &batch) {
                    self.continue_later();
                    return queued;
                }
                if !self.may_work() {
                    return queued;
                }
                self.spend();
                self.emit(Event::DependentsSettled(DependentsSettled { job_id: dep }));
                continue;
            }
            let dependents: Vec<String> = (self.state().dependents)
                .after(&s.tenant_id, &dep, s.told_through.as_deref())
                .take(self.budget_left())
                .map(str::to_owned)
                .collect();
            for b in dependents {
                if !self.may_work() {
                    return queued;
                }
                // One told before may have ended it (a saga rolling back cancels its steps).
                if (self.state().jobs.get(&b)).is_none_or(|j| j.state != JobState::Blocked) {
                    continue;
                }
                self.spend();
                self.emit(Event::DependencyResolved(DependencyResolved {
                    job_id: b.clone(),
                    dependency: dep.clone(),
                    state: s.state,
                }));
                if let Judgement::Met = self.judge_dependencies(&b, Some(&dep)) {
                    self.unblock(&b);
                    if self.admit_unblocked(&b) {
                        queued.push(b);
                    }
                }
            }
            if !self.may_work() {
                return queued;
            }
            let told = (self.state().settling.get(&dep)).and_then(|s| s.told_through.clone());
            let more = (self.state().dependents)
                .after(&s.tenant_id, &dep, told.as_deref())
                .next()
                .is_some();
            if more || !self.state().dependents.complete(&s.tenant_id, &dep) {
                // The rest are in storage: the continuation's load reads them.
                self.continue_later();
                return queued;
            }
            self.spend();
            self.emit(Event::DependentsSettled(DependentsSettled { job_id: dep }));
        }
        queued
    }
}

/// Where a BLOCKED job's condition stands.
enum Judgement {
    Met,
    Failed,
    Waits,
}
