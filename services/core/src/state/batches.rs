//! Batches (SPEC §11): jobs of a tenant submitted with one `batch_id` and the count of them,
//! and the callbacks that wait for every one of them to end.
//!
//! A batch is a record of counts, kept in memory (at most `limits.max_batches` a shard) and
//! in storage, so that 100,000 members cost their own records and one of these. It opens
//! with its first member ([`crate::events::BatchOpened`]), counts each member as it ends,
//! and is COMPLETE when all of them have: then its callbacks are told, as the dependents of
//! an ended job are ([`super::Settling`]), under the dependency [`batch_dependency`]. It is
//! EXPIRED when `until` passes first, or CANCELLED by an operator; then its callbacks fail,
//! and a cancelled batch's members that have not started are cancelled, reached in storage
//! under [`batch_members`] like the dependents of a job. An ended batch is forgotten
//! `limits.batch_retention_ms` after it ended.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::events::{BatchState, JobState};
use crate::records::Millis;

use super::State;

/// A batch's identity: (tenant, batch id).
pub type BatchKey = (String, String);

/// One batch's counts and state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// Members it has, as each member names.
    pub expected: i32,
    /// Members accepted so far.
    pub joined: i32,
    pub succeeded: i32,
    /// Members that ended otherwise than SUCCEEDED.
    pub failed: i32,
    pub state: BatchState,
    pub opened_at: Millis,
    /// When it expires, if members are still missing or running.
    pub until: Millis,
    pub ended_at: Option<Millis>,
    /// When an ended batch is forgotten.
    pub forget_at: Option<Millis>,
    /// Who cancelled it (or expired it).
    pub closed_by: Option<String>,
}

impl Batch {
    /// When the Tick next acts on it: its expiry while open, then when it is forgotten.
    pub fn due(&self) -> Millis {
        match self.state {
            BatchState::Open => self.until,
            _ => self.forget_at.unwrap_or(self.until),
        }
    }

    /// Members that ended.
    pub fn ended(&self) -> i32 {
        self.succeeded.saturating_add(self.failed)
    }
}

/// Marks the internal dependency names: job ids hold no control characters.
const MARK: char = '\u{1}';

/// The dependency a callback of batch `batch_id` of `tenant` waits under.
pub fn batch_dependency(tenant: &str, batch_id: &str) -> String {
    format!("{MARK}batch{MARK}{tenant}{MARK}{batch_id}")
}

/// The entry every unfinished member of a batch is indexed under (as a blocked job is under
/// its dependencies), which a cancel reads.
pub fn batch_members(tenant: &str, batch_id: &str) -> String {
    format!("{MARK}members{MARK}{tenant}{MARK}{batch_id}")
}

/// What an internal dependency name stands for: ("batch" or "members", tenant, batch id).
pub fn parse_batch_name(name: &str) -> Option<(&str, &str, &str)> {
    let rest = name.strip_prefix(MARK)?;
    let mut parts = rest.splitn(3, MARK);
    let kind = parts.next()?;
    let tenant = parts.next()?;
    let id = parts.next()?;
    matches!(kind, "batch" | "members").then_some((kind, tenant, id))
}

/// A dependency as people read it: a job id, or `batch <id>`.
pub fn display_dependency(name: &str) -> Cow<'_, str> {
    match parse_batch_name(name) {
        Some((_, _, id)) => Cow::Owned(format!("batch {id}")),
        None => Cow::Borrowed(name),
    }
}

impl State {
    /// Opens batch `key` ([`crate::events::BatchOpened`]).
    pub(crate) fn open_batch(&mut self, key: BatchKey, expected: i32, now: Millis, until: Millis) {
        let batch = Batch {
            expected,
            joined: 0,
            succeeded: 0,
            failed: 0,
            state: BatchState::Open,
            opened_at: now,
            until,
            ended_at: None,
            forget_at: None,
            closed_by: None,
        };
        self.put_batch(key, batch);
    }

    /// A member of batch `key` was accepted.
    pub(crate) fn join_batch(&mut self, key: BatchKey) {
        if let Some(mut b) = self.batches.get(&key).cloned() {
            b.joined = b.joined.saturating_add(1);
            self.put_batch(key, b);
        }
    }

    /// A member of batch `key` went from `before` to `after`: an end counts (SUCCEEDED, then
    /// quarantined, moves to the others). The last member's end completes an open batch,
    /// whose callbacks are then told.
    /// A member accepted before the batch opened belongs to an earlier batch of the same id,
    /// since forgotten: it does not count here.
    pub(super) fn count_batch_member(
        &mut self,
        key: BatchKey,
        accepted_at: Millis,
        before: JobState,
        after: JobState,
    ) {
        let Some(mut b) = self.batches.get(&key).cloned() else {
            return;
        };
        if accepted_at < b.opened_at {
            return;
        }
        // A complete batch's counts are those its callbacks are given: they change no more,
        // but in the entry that completed it (a success quarantined by the output policy
        // after it counted), before any callback is told.
        let told = batch_dependency(&key.0, &key.1);
        if b.state == BatchState::Complete && !self.fresh_settling.contains(&told) {
            return;
        }
        if before == JobState::Succeeded {
            b.succeeded = b.succeeded.saturating_sub(1);
        }
        if after == JobState::Succeeded {
            b.succeeded = b.succeeded.saturating_add(1);
        } else if !before.is_terminal() || before == JobState::Succeeded {
            b.failed = b.failed.saturating_add(1);
        }
        let complete =
            b.state == BatchState::Open && b.joined >= b.expected && b.ended() >= b.expected;
        if complete {
            let now = self.clock;
            b.state = BatchState::Complete;
            b.ended_at = Some(now);
            b.forget_at = Some(now.saturating_add(self.batch_retention()));
            self.begin_settling(
                &batch_dependency(&key.0, &key.1),
                &key.0,
                JobState::Succeeded,
            );
        }
        self.put_batch(key, b);
    }

    /// Batch `key` ended before its members did ([`crate::events::BatchClosed`]): EXPIRED
    /// or CANCELLED. Its callbacks are told it failed; a cancelled batch's members that have
    /// not started are cancelled.
    pub(crate) fn close_batch(&mut self, key: BatchKey, state: BatchState, by: &str) {
        let Some(mut b) = self.batches.get(&key).cloned() else {
            return;
        };
        let now = self.clock;
        b.state = state;
        b.closed_by = Some(by.to_owned());
        b.ended_at = Some(now);
        b.forget_at = Some(now.saturating_add(self.batch_retention()));
        let told = match state {
            BatchState::Cancelled => JobState::Cancelled,
            _ => JobState::Failed,
        };
        self.begin_settling(&batch_dependency(&key.0, &key.1), &key.0, told);
        if state == BatchState::Cancelled {
            self.begin_settling(&batch_members(&key.0, &key.1), &key.0, told);
        }
        self.put_batch(key, b);
    }

    /// An ended batch's retention passed ([`crate::events::BatchForgotten`]).
    pub(crate) fn forget_batch(&mut self, key: &BatchKey) {
        if let Some(b) = self.batches.remove(key) {
            self.batches_due.remove(&(b.due(), key.clone()));
            if let Some(d) = self.dirty.as_mut() {
                d.batches.insert(key.clone());
            }
        }
    }

    fn put_batch(&mut self, key: BatchKey, batch: Batch) {
        if let Some(old) = self.batches.get(&key) {
            self.batches_due.remove(&(old.due(), key.clone()));
        }
        self.batches_due.insert((batch.due(), key.clone()));
        if let Some(d) = self.dirty.as_mut() {
            d.batches.insert(key.clone());
        }
        self.batches.insert(key, batch);
    }

    fn batch_retention(&self) -> Millis {
        self.rules()
            .map_or(crate::rules::Limits::default().batch_retention_ms, |r| {
                r.limits.batch_retention_ms
            })
    }

    /// Files the batches loaded from storage by due time.
    pub fn index_batches(&mut self) {
        self.batches_due = (self.batches.iter())
            .map(|(k, b)| (b.due(), k.clone()))
            .collect();
    }

    /// An ended batch that may be forgotten before its time to make room for a new one: the
    /// first to be due among the first `scan` by due time, whose callbacks and members are
    /// not being told.
    pub fn batch_to_make_room(&self, scan: usize) -> Option<BatchKey> {
        (self.batches_due.iter())
            .take(scan)
            .map(|(_, k)| k)
            .find(|k| {
                self.batches[*k].state != BatchState::Open
                    && !self.settling.contains_key(&batch_dependency(&k.0, &k.1))
                    && !self.settling.contains_key(&batch_members(&k.0, &k.1))
            })
            .cloned()
    }

    /// Whether job `accepted_at` of batch `key` is one of its members (not of an earlier
    /// batch of the same id, since forgotten).
    pub fn member_of(&self, key: &BatchKey, accepted_at: Millis) -> bool {
        self.batches
            .get(key)
            .is_some_and(|b| accepted_at >= b.opened_at)
    }

    /// The batches due by `now`, first due first, at most `limit`.
    pub fn batches_due_by(&self, now: Millis, limit: usize) -> Vec<BatchKey> {
        (self.batches_due.iter())
            .take_while(|(due, _)| *due <= now)
            .take(limit)
            .map(|(_, k)| k.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_names_are_not_job_ids_and_read_back() {
        let b = batch_dependency("acme", "nightly:1");
        assert!(b.chars().any(char::is_control));
        assert_eq!(parse_batch_name(&b), Some(("batch", "acme", "nightly:1")));
        let m = batch_members("acme", "x");
        assert_eq!(parse_batch_name(&m), Some(("members", "acme", "x")));
        assert_eq!(parse_batch_name("job-1"), None);
        assert_eq!(display_dependency(&b), "batch nightly:1");
        assert_eq!(display_dependency("job-1"), "job-1");
    }
}
