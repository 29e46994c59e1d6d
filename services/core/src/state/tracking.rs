//! Change tracking: which keys changed since the last checkpoint, for incremental writes.

use std::collections::{BTreeMap, BTreeSet};

use crate::records::{DeadLetter, Millis};

use super::{HistoryLines, State};

/// Keys changed since the runtime last persisted, so it writes only those.
#[derive(Debug, Clone, Default)]
pub struct Dirty {
    pub jobs: BTreeSet<String>,
    pub workers: BTreeSet<String>,
    pub breakers: BTreeSet<String>,
    /// Rate limit buckets changed or gone (a key the state no longer holds is gone).
    pub buckets: BTreeSet<super::BucketKey>,
    /// (pool, priority) fair shares changed.
    pub shares: BTreeSet<super::ShareKey>,
    /// Debounce windows opened, moved on or closed (a key the state no longer holds closed).
    pub debounces: BTreeSet<super::DebounceKey>,
    pub sagas: BTreeSet<String>,
    /// Schedules changed or deleted (a key the state no longer holds was deleted).
    pub schedules: BTreeSet<String>,
    pub idempotency: BTreeSet<(String, String)>,
    pub idempotency_pruned_before: Option<Millis>,
    pub dead_letters: Vec<DeadLetter>,
    pub config: bool,
    /// History lines written since the last persist, in order.
    pub history: HistoryLines,
    /// Keys under which jobs no longer wait (released, cancelled, rescheduled): the store's
    /// delay index drops them, unless the job waits under the same key again.
    pub delays_removed: Vec<super::DelayKey>,
    /// Entries BLOCKED jobs left (a dependency ended, or the job stopped waiting): the
    /// store's index drops them, unless the job waits under the same entry again.
    pub dependents_removed: Vec<super::DependentKey>,
    /// Jobs that began or ended settling ([`State::settling`]).
    pub settling: BTreeSet<String>,
    /// Batches changed or forgotten (a key the state no longer holds was forgotten).
    pub batches: BTreeSet<super::BatchKey>,
    /// (pool, lane, key) entries jobs left in their queues: the store's lane index drops
    /// them, unless the job waits under the same entry again ([`super::lane_keys_of`]).
    pub lanes_removed: Vec<(String, super::Lane, super::QueueKey)>,
    /// Lanes whose count of jobs changed, by pool: the store keeps each lane's count, which
    /// is what a start reads of a backlog ([`State::restore_queued`]).
    pub lanes_counted: BTreeMap<String, BTreeSet<super::Lane>>,
    /// Jobs that stopped being read at a start ([`super::is_resident`]): queued again, or
    /// ended. The store drops their marker, unless the job is one again.
    pub resident_left: Vec<String>,
    /// Queued jobs' timers taken out of their indexes: the store's index drops them, unless
    /// the job has the same timer again ([`super::wait_keys_of`]).
    pub waits_removed: Vec<(super::TimerKind, super::TimerAt)>,
    /// Payloads of jobs accepted since the last persist (job_id -> payload).
    pub payloads: BTreeMap<String, Vec<u8>>,
    /// The state's clock when this set began, i.e. when the set before it was taken
    /// ([`State::take_dirty`]): a job accepted later than this (`Job::accepted_at`, the log
    /// time of its acceptance, which the clock had not passed) was in no earlier set, so no
    /// earlier checkpoint wrote it. `None` when not known (the set a state starts with,
    /// loaded from storage or new): nothing is assumed.
    pub since_clock: Option<Millis>,
    /// The job [`State::mark_job`] marked last, which is in `jobs`: a job is marked again
    /// and again as its events apply (each event's update and history line), and comparing
    /// its id with this one is cheaper than looking it up in `jobs`.
    last_job: Option<String>,
}

impl Dirty {
    /// Notes that lane `lane` of `pool` gained or lost a job (copied the first time only).
    pub(super) fn count_lane(&mut self, pool: &str, lane: &super::Lane) {
        match self.lanes_counted.get_mut(pool) {
            Some(lanes) => {
                if !lanes.contains(lane) {
                    lanes.insert(lane.clone());
                }
            }
            None => {
                let lanes = BTreeSet::from([lane.clone()]);
                self.lanes_counted.insert(pool.to_owned(), lanes);
            }
        }
    }
}

impl State {
    /// The keys changed since the last call. The next set's history starts with room for
    /// as many lines as this one had: a replay's checkpoint holds tens of thousands, and
    /// growing the list to that size again, by doubling, was a few per cent of a replay.
    pub fn take_dirty(&mut self) -> Dirty {
        let clock = self.clock;
        let Some(d) = self.dirty.as_mut() else {
            return Dirty::default();
        };
        let taken = std::mem::take(d);
        d.history = taken.history.sized_like();
        d.since_clock = Some(clock);
        taken
    }

    pub fn mark_job(&mut self, id: &str) {
        let Some(d) = self.dirty.as_mut() else {
            return;
        };
        if d.last_job.as_deref() == Some(id) {
            return;
        }
        // Looked up first: a job is marked several times per entry, and the key is copied
        // only the first time.
        if !d.jobs.contains(id) {
            d.jobs.insert(id.to_owned());
        }
        let last = d.last_job.get_or_insert_with(String::new);
        last.clear();
        last.push_str(id);
    }

    pub fn mark_worker(&mut self, id: &str) {
        if let Some(d) = self.dirty.as_mut() {
            d.workers.insert(id.to_owned());
        }
    }

    pub(crate) fn mark_breaker(&mut self, pool: &str) {
        if let Some(d) = self.dirty.as_mut() {
            d.breakers.insert(pool.to_owned());
        }
    }

    pub(crate) fn mark_bucket(&mut self, key: &super::BucketKey) {
        if let Some(d) = self.dirty.as_mut() {
            d.buckets.insert(key.clone());
        }
    }

    pub(crate) fn mark_debounce(&mut self, key: &super::DebounceKey) {
        if let Some(d) = self.dirty.as_mut() {
            d.debounces.insert(key.clone());
        }
    }

    pub(crate) fn mark_share(&mut self, key: &super::ShareKey) {
        if let Some(d) = self.dirty.as_mut() {
            d.shares.insert(key.clone());
        }
    }

    pub(crate) fn mark_saga(&mut self, id: &str) {
        if let Some(d) = self.dirty.as_mut() {
            d.sagas.insert(id.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_marked_again_after_a_checkpoint_is_marked_in_the_next_one() {
        let mut state = State::tracking_changes();
        state.mark_job("a");
        state.mark_job("b");
        state.mark_job("b");
        let first = state.take_dirty();
        assert_eq!(first.jobs, BTreeSet::from(["a".to_owned(), "b".to_owned()]));
        // "b" was the last marked before the checkpoint took the set: the next set must
        // still get it.
        state.mark_job("b");
        state.mark_job("a");
        state.mark_job("a");
        let second = state.take_dirty();
        assert_eq!(
            second.jobs,
            BTreeSet::from(["a".to_owned(), "b".to_owned()])
        );
        // Each set after the first knows the clock it began at; the first does not.
        assert_eq!(first.since_clock, None);
        assert_eq!(second.since_clock, Some(0));
        // A set put back (as eviction does) keeps what it holds.
        state.mark_job("c");
        let third = state.take_dirty();
        state.dirty = Some(third);
        state.mark_job("c");
        state.mark_job("d");
        assert_eq!(
            state.take_dirty().jobs,
            BTreeSet::from(["c".to_owned(), "d".to_owned()])
        );
    }
}
