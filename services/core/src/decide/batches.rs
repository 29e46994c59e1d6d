//! Batches (SPEC §11): members join a batch as they are accepted, each end counts, and the
//! batch's callbacks wait BLOCKED for it to complete, as a job waits for a dependency
//! ([`crate::state::batch_dependency`]); the Tick expires a batch whose time passed and
//! forgets an ended one after its retention; an operator's cancel ends it, and its members
//! that have not started are cancelled, in id order over as many entries as it takes.

use crate::decide::Decider;
use crate::events::*;
use crate::reason::{DlqReason, Rejection};
use crate::records::{CancelJob, JobRequest};
use crate::rules::{Limits, Rules};
use crate::state::{BatchKey, State, batch_members};

/// Batches looked at, by due time, for an ended one to forget early when the shard holds
/// `limits.max_batches` and a member would open one more.
const ROOM_SCAN: usize = 1_000;

/// Who expires a batch (`BatchClosed.principal_id`).
pub(super) const EXPIRY_PRINCIPAL: &str = "ksched:expiry";

/// Why a request's batch fields cannot be taken (`invalid_batch`), whatever the batch holds.
pub(super) fn invalid_batch(r: &JobRequest, limits: &Limits) -> Option<String> {
    let id_ok = |id: &str| {
        !id.trim().is_empty()
            && id.len() <= super::submit::MAX_ID_BYTES
            && !id.chars().any(char::is_control)
    };
    let job = &r.job_id;
    if r.batch_outcome.is_some() {
        return Some(format!(
            "job {job}: batch_outcome is set by the scheduler when a callback runs, not by a producer"
        ));
    }
    match (&r.batch_id, r.batch_size) {
        (None, None) => {}
        (Some(b), Some(n)) => {
            if !id_ok(b) {
                return Some(format!(
                    "job {job}: batch_id must be 1 to {} bytes without control characters",
                    super::submit::MAX_ID_BYTES
                ));
            }
            if n < 1 || n > limits.max_batch_size {
                return Some(format!(
                    "job {job}: batch_size {n} must be 1 to limits.max_batch_size {}",
                    limits.max_batch_size
                ));
            }
        }
        (Some(_), None) => {
            return Some(format!(
                "job {job}: batch_id needs batch_size, the count of the batch's members"
            ));
        }
        (None, Some(_)) => return Some(format!("job {job}: batch_size needs batch_id")),
    }
    if let Some(b) = &r.after_batch {
        if !id_ok(b) {
            return Some(format!(
                "job {job}: after_batch must be 1 to {} bytes without control characters",
                super::submit::MAX_ID_BYTES
            ));
        }
        if r.batch_id.as_ref() == Some(b) {
            return Some(format!(
                "job {job}: a callback of batch {b} cannot be one of its members (it would wait for itself)"
            ));
        }
        if !r.depends_on.is_empty() {
            return Some(format!(
                "job {job}: a batch callback waits for its batch only; it names no depends_on"
            ));
        }
    }
    None
}

/// Why a member may not join its batch now, if it may not: `invalid_batch` when the batch
/// ended, has all its members, or expects another count; `queue_full` when it would open a
/// batch past `limits.max_batches`.
pub(super) fn batch_refused(
    state: &State,
    rules: &Rules,
    r: &JobRequest,
) -> Option<(DlqReason, String)> {
    let (Some(id), Some(size)) = (&r.batch_id, r.batch_size) else {
        return None;
    };
    let job = &r.job_id;
    let invalid = |why: String| Some((DlqReason::InvalidBatch, format!("job {job}: {why}")));
    match state.batches.get(&(r.tenant_id.clone(), id.clone())) {
        Some(b) if b.state != BatchState::Open => invalid(format!(
            "batch {id} is {} already; a member cannot join it",
            b.state.as_str()
        )),
        Some(b) if b.expected != size => invalid(format!(
            "batch {id} has {} members, not batch_size {size}",
            b.expected
        )),
        Some(b) if b.joined >= b.expected => invalid(format!(
            "batch {id} has all its {} members already",
            b.expected
        )),
        Some(_) => None,
        None => {
            let max = rules.limits.max_batches as usize;
            let full = state.batches.len() >= max && state.batch_to_make_room(ROOM_SCAN).is_none();
            full.then(|| {
                let why = format!(
                    "job {job}: the shard holds {} batches, open or being told, limits.max_batches {max}",
                    state.batches.len()
                );
                (DlqReason::QueueFull, why)
            })
        }
    }
}

impl Decider<'_, '_> {
    /// A member about to be accepted opens its batch if it is the first.
    pub(super) fn open_batch_of(&mut self, r: &JobRequest) {
        let (Some(id), Some(expected)) = (&r.batch_id, r.batch_size) else {
            return;
        };
        let key = (r.tenant_id.clone(), id.clone());
        if self.state().batches.contains_key(&key) {
            return;
        }
        // At the cap: the ended batch due first makes room (batch_refused found one).
        if self.state().batches.len() >= self.rules().rules.limits.max_batches as usize
            && let Some(old) = self.state().batch_to_make_room(ROOM_SCAN)
        {
            self.emit(Event::BatchForgotten(BatchForgotten {
                tenant_id: old.0,
                batch_id: old.1,
            }));
        }
        let wait = self.rules().rules.limits.max_dependency_wait_ms;
        self.emit(Event::BatchOpened(BatchOpened {
            tenant_id: key.0,
            batch_id: key.1,
            expected,
            until: self.now().saturating_add(wait),
        }));
    }

    /// The Tick's work on batches: those whose time passed with members missing or running
    /// expire (their callbacks fail); ended ones past their retention are forgotten, once
    /// their callbacks were told.
    pub(super) fn batches_due(&mut self, now: crate::records::Millis) {
        for key in self.state().batches_due_by(now, self.budget_left()) {
            if !self.may_work() {
                return;
            }
            let b = &self.state().batches[&key];
            if b.state == BatchState::Open {
                let reason = format!(
                    "its time passed with {} of {} members accepted and {} ended",
                    b.joined,
                    b.expected,
                    b.ended()
                );
                self.spend();
                self.close(&key, BatchState::Expired, EXPIRY_PRINCIPAL, reason);
                continue;
            }
            let told = crate::state::batch_dependency(&key.0, &key.1);
            let members = batch_members(&key.0, &key.1);
            if self.state().settling.contains_key(&told)
                || self.state().settling.contains_key(&members)
            {
                // Forgotten once its callbacks and members are told (they read it).
                continue;
            }
            self.spend();
            self.emit(Event::BatchForgotten(BatchForgotten {
                tenant_id: key.0,
                batch_id: key.1,
            }));
        }
    }

    fn close(&mut self, key: &BatchKey, state: BatchState, principal: &str, reason: String) {
        self.emit(Event::BatchClosed(BatchClosed {
            tenant_id: key.0.clone(),
            batch_id: key.1.clone(),
            state,
            principal_id: principal.to_owned(),
            reason,
        }));
    }

    /// CancelJob naming a batch: an open batch of the named tenant is cancelled; its members
    /// that have not started are cancelled by the continuations that follow.
    pub(super) fn cancel_batch(&mut self, c: &CancelJob, batch_id: &str) {
        let shown = crate::records::truncate_for_display(batch_id, 64);
        let Some(tenant) = c.tenant_id.clone() else {
            let reason = format!("cancelling batch {shown} names the batch's tenant");
            self.refuse("", Rejection::UnknownJob, reason);
            return;
        };
        let key = (tenant, batch_id.to_owned());
        let Some(b) = self.state().batches.get(&key) else {
            let reason = format!("no batch {shown} of tenant {}", key.0);
            self.refuse("", Rejection::UnknownJob, reason);
            return;
        };
        if b.state != BatchState::Open {
            let reason = format!("batch {shown} is {} already", b.state.as_str());
            self.refuse("", Rejection::InvalidTransition, reason);
            return;
        }
        let reason = c
            .reason
            .clone()
            .unwrap_or_else(|| "cancelled by an operator".to_owned());
        self.close(&key, BatchState::Cancelled, &c.principal_id, reason);
    }

    /// Cancels the members of a cancelled batch that have not started, in id order after
    /// the last reached, as far as the entry's work goes; returns whether all were reached.
    pub(super) fn cancel_members(&mut self, name: &str, tenant: &str, batch_id: &str) -> bool {
        let after = (self.state().settling.get(name)).and_then(|s| s.told_through.clone());
        let members: Vec<String> = (self.state().dependents)
            .after(tenant, name, after.as_deref())
            .take(self.budget_left())
            .map(str::to_owned)
            .collect();
        let mut through = None;
        for m in members {
            if !self.may_work() {
                break;
            }
            self.spend();
            // Placed or sent to a worker but not started there yet counts too; a member of
            // an earlier batch of the same id is not this one's.
            let key = (tenant.to_owned(), batch_id.to_owned());
            let not_started = (self.state().jobs.get(&m)).is_some_and(|j| {
                self.state().member_of(&key, j.accepted_at)
                    && matches!(
                        j.state,
                        JobState::Pending
                            | JobState::ApprovalRequired
                            | JobState::Delayed
                            | JobState::Blocked
                            | JobState::Scheduled
                            | JobState::Dispatched
                    )
            });
            if not_started {
                let key = (tenant.to_owned(), batch_id.to_owned());
                let by = (self.state().batches.get(&key)).and_then(|b| b.closed_by.clone());
                let principal = by.unwrap_or_else(|| EXPIRY_PRINCIPAL.to_owned());
                let reason = format!("its batch {batch_id} was cancelled");
                self.cancel_job(&m, &principal, Some(reason));
            }
            through = Some(m);
        }
        if let Some(through) = through {
            self.emit(Event::BatchMembersCancelled(BatchMembersCancelled {
                tenant_id: tenant.to_owned(),
                batch_id: batch_id.to_owned(),
                through,
            }));
        }
        let after = (self.state().settling.get(name)).and_then(|s| s.told_through.clone());
        let more = (self.state().dependents)
            .after(tenant, name, after.as_deref())
            .next()
            .is_some();
        !more && self.state().dependents.complete(tenant, name)
    }
}
