//! DELAYED jobs by the time they become due (SPEC §9), kept so that ten million of them cost
//! storage, not memory.
//!
//! A delayed job's record leaves memory once it is written, like a terminal job's, and the
//! store indexes it by (due time, job id). In memory there is only a window: every delayed
//! job up to a key ([`Coverage`]), at most [`Delays::limit`] of them. A Tick that needs more
//! of them than the window holds reads the next keys from the store first
//! ([`State::load_delays_through`]), so what a decision sees is always every delayed job due
//! by the Tick's watermark, whatever the window held: a replay, a restart or a standby
//! decides the same.
//!
//! The store is written behind the decisions (docs/architecture.md, "The processor"), so
//! its index can lack a job delayed in the last batches, or still hold one released or
//! cancelled there. Both are in memory until they are written (nothing leaves memory
//! unwritten): a job delayed past the window is kept in `beyond` until its record leaves
//! memory, and a key read from the store whose job is in memory counts only if the job in
//! memory still waits under that key.

use std::collections::BTreeSet;

use crate::events::JobState;
use crate::records::Millis;

use super::{ColdStore, Job, State};

/// A delayed job's place: when it becomes due, then its id.
pub type DelayKey = (Millis, String);

/// Keys read from the store at a time when the window must grow.
pub const REFILL_CHUNK: usize = 4096;

/// The window's default bound ([`Delays::limit`]).
pub const DEFAULT_WINDOW: usize = 100_000;

/// How far the window is known to hold every delayed job.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Coverage {
    /// Every one: a state that began empty (tests, what-if, a replay into a new store).
    #[default]
    Everything,
    /// Every one with a key up to and including this one; later ones may be in storage.
    Through(DelayKey),
    /// None known: a state loaded from storage, before its first refill.
    Nothing,
}

impl Coverage {
    pub fn covers(&self, key: &DelayKey) -> bool {
        match self {
            Coverage::Everything => true,
            Coverage::Through(k) => key <= k,
            Coverage::Nothing => false,
        }
    }
}

/// The delayed jobs a state holds in memory ([`State::delays`]).
#[derive(Debug, Clone)]
pub struct Delays {
    /// Every delayed job the coverage reaches.
    window: BTreeSet<DelayKey>,
    coverage: Coverage,
    /// Delayed jobs past the coverage whose records are in memory (maybe not yet in the
    /// store's index); each leaves when its record leaves memory.
    beyond: BTreeSet<DelayKey>,
    /// Most keys the window keeps: past it, the latest go (their jobs are in the store, or in
    /// `beyond`). 0: no bound (a state with no store behind it).
    pub limit: usize,
}

impl Default for Delays {
    fn default() -> Self {
        Delays {
            window: BTreeSet::new(),
            coverage: Coverage::Everything,
            beyond: BTreeSet::new(),
            limit: 0,
        }
    }
}

impl Delays {
    /// A window that knows nothing yet: for a state loaded from a store that may hold
    /// delayed jobs.
    pub fn unknown(limit: usize) -> Delays {
        Delays {
            coverage: Coverage::Nothing,
            limit,
            ..Delays::default()
        }
    }

    /// Files a delayed job past the window whose record is in memory.
    pub(super) fn file_beyond(&mut self, key: DelayKey) {
        self.beyond.insert(key);
    }

    /// Keys in the window.
    pub fn window_len(&self) -> usize {
        self.window.len()
    }

    /// Keys of delayed jobs past the window held in memory.
    pub fn beyond_len(&self) -> usize {
        self.beyond.len()
    }

    pub fn coverage(&self) -> &Coverage {
        &self.coverage
    }

    /// The ids of the delayed jobs due by `through` (their time at or before it), earliest
    /// first, at most `limit`. Complete once [`State::load_delays_through`] ran for as many.
    pub fn due(&self, through: Millis, limit: usize) -> Vec<DelayKey> {
        self.window
            .iter()
            .take_while(|(due, _)| *due <= through)
            .take(limit)
            .cloned()
            .collect()
    }

    /// Whether a job due by `through` may wait still: in the window, or in storage past it.
    pub fn may_hold_due(&self, through: Millis) -> bool {
        !self.due(through, 1).is_empty() || self.refill_after(through, 1).is_some()
    }

    /// Whether the window must grow before `want` jobs due by `through` can be listed; if
    /// so, the key to read the store after (None: from its start).
    fn refill_after(&self, through: Millis, want: usize) -> Option<Option<DelayKey>> {
        let complete = match &self.coverage {
            Coverage::Everything => true,
            // A later job due at `through` itself may sort after `k`.
            Coverage::Through(k) => k.0 > through,
            Coverage::Nothing => false,
        };
        if complete
            || self
                .window
                .iter()
                .take_while(|k| k.0 <= through)
                .take(want)
                .count()
                >= want
        {
            return None;
        }
        Some(match &self.coverage {
            Coverage::Through(k) => Some(k.clone()),
            _ => None,
        })
    }
}

impl State {
    /// Files a job now DELAYED under `key` (its record is in memory).
    pub(super) fn delay_insert(&mut self, key: DelayKey) {
        if self.delays.coverage.covers(&key) {
            self.delays.window.insert(key);
            self.spill_delays();
        } else {
            self.delays.beyond.insert(key);
        }
    }

    /// A job no longer waits under `key` (released, cancelled or rescheduled): out of the
    /// window, and out of the store's index at the next checkpoint.
    pub(super) fn delay_remove(&mut self, key: DelayKey) {
        self.delays.window.remove(&key);
        self.delays.beyond.remove(&key);
        if let Some(d) = self.dirty.as_mut() {
            d.delays_removed.push(key);
        }
    }

    /// A delayed job's record leaves memory: the store has its key from now on.
    pub(super) fn delay_left_memory(&mut self, key: &DelayKey) {
        self.delays.beyond.remove(key);
    }

    /// Keeps the window within its limit: the latest keys go, the coverage shrinks to what
    /// stays, and a key whose job is in memory is kept in `beyond` (the store may not have
    /// it yet).
    fn spill_delays(&mut self) {
        let limit = self.delays.limit;
        if limit == 0 {
            return;
        }
        while self.delays.window.len() > limit {
            let Some(last) = self.delays.window.pop_last() else {
                break;
            };
            if self.jobs.contains_key(&last.1) {
                self.delays.beyond.insert(last);
            }
            self.delays.coverage = match self.delays.window.last() {
                Some(k) => Coverage::Through(k.clone()),
                None => Coverage::Nothing,
            };
        }
    }

    /// Reads delayed jobs' keys from `store` until the window lists `want` jobs due by
    /// `through`, or every one there is. Keys whose jobs are in memory count only if the job
    /// still waits under them (the store is written behind).
    pub fn load_delays_through<S: ColdStore>(
        &mut self,
        through: Millis,
        want: usize,
        store: &S,
    ) -> Result<(), S::Error> {
        while let Some(after) = self.delays.refill_after(through, want) {
            let chunk = store.delays_after(after.as_ref(), REFILL_CHUNK)?;
            let coverage = match chunk.last() {
                Some(last) if chunk.len() >= REFILL_CHUNK => Coverage::Through(last.clone()),
                _ => Coverage::Everything,
            };
            for key in chunk {
                let current = match self.jobs.get(&key.1) {
                    Some(job) => delay_key_of(&key.1, job).as_ref() == Some(&key),
                    None => true,
                };
                if current {
                    self.delays.window.insert(key);
                }
            }
            let reached: Vec<DelayKey> = self
                .delays
                .beyond
                .iter()
                .filter(|k| coverage.covers(k))
                .cloned()
                .collect();
            for key in reached {
                self.delays.beyond.remove(&key);
                self.delays.window.insert(key);
            }
            self.delays.coverage = coverage;
        }
        Ok(())
    }

    /// The delay window's own consistency check alone: what a partial state's window gets wrong.
    pub fn delay_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        self.check_delays(&mut problems);
        problems
    }

    /// What disagrees between the delayed jobs in memory and the window: each must be in
    /// the window or `beyond`, and a key whose job is in memory must be that job's.
    pub(super) fn check_delays(&self, problems: &mut Vec<String>) {
        for (id, job) in self.jobs.iter_any_order() {
            if let Some(key) = delay_key_of(id, job) {
                let filed = if self.delays.coverage.covers(&key) {
                    self.delays.window.contains(&key)
                } else {
                    self.delays.beyond.contains(&key)
                };
                if !filed {
                    problems.push(format!("delayed job {id} is not in the delay window"));
                }
            }
        }
        for key in self.delays.window.iter().chain(&self.delays.beyond) {
            if let Some(job) = self.jobs.get(&key.1)
                && delay_key_of(&key.1, job).as_ref() != Some(key)
            {
                problems.push(format!(
                    "the delay window holds job {} at {}, which does not wait then",
                    key.1, key.0
                ));
            }
        }
        if self.delays.coverage == Coverage::Everything {
            // Blocked jobs wait in it too, until their dependency timeout.
            let count = |s| self.jobs_by_state.get(&s).copied().unwrap_or(0);
            let waiting = count(JobState::Delayed) + count(JobState::Blocked);
            let filed = self.delays.window.len() as u64;
            if waiting != filed {
                problems.push(format!(
                    "{waiting} jobs counted DELAYED or BLOCKED, the complete delay window holds {filed}"
                ));
            }
        }
    }
}

/// The key a job waits under, if it is DELAYED (its time) or BLOCKED (its dependency
/// timeout).
pub fn delay_key_of(id: &str, job: &Job) -> Option<DelayKey> {
    (job.state.is_parked())
        .then_some(job.delayed_until)
        .flatten()
        .map(|due| (due, id.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(due: Millis, id: &str) -> DelayKey {
        (due, id.to_owned())
    }

    #[test]
    fn coverage_reaches_up_to_its_key() {
        assert!(Coverage::Everything.covers(&key(i64::MAX, "z")));
        assert!(!Coverage::Nothing.covers(&key(0, "")));
        let c = Coverage::Through(key(10, "b"));
        assert!(c.covers(&key(10, "a")) && c.covers(&key(10, "b")));
        assert!(!c.covers(&key(10, "c")) && !c.covers(&key(11, "a")));
    }

    #[test]
    fn a_window_asks_for_the_store_only_when_it_may_lack_due_jobs() {
        let mut d = Delays::unknown(10);
        assert_eq!(d.refill_after(100, 5), Some(None), "nothing known yet");
        d.coverage = Coverage::Through(key(50, "x"));
        d.window.insert(key(10, "a"));
        assert_eq!(
            d.refill_after(100, 5),
            Some(Some(key(50, "x"))),
            "due jobs may lie past the coverage"
        );
        assert_eq!(d.refill_after(40, 5), None, "covered past the watermark");
        assert_eq!(d.refill_after(100, 1), None, "enough due jobs in hand");
        d.coverage = Coverage::Everything;
        assert_eq!(d.refill_after(i64::MAX, 1000), None);
    }
}
