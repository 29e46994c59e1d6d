//! A lane's queued jobs in queue order, of which memory holds the first ones.
//!
//! A decision reads only a lane's first jobs, its window ([`super::window_of`]), so the keys
//! past them may wait in storage too: the store indexes every queued job by (pool, lane,
//! queue key), written with the job's record ([`lane_keys_of`]). In memory a lane holds its
//! *head*, every key up to a point (`through`), and the keys past it whose records are in
//! memory (`beyond`: the store, written behind the decisions, may not have them yet). The
//! count is exact whatever memory holds. Keys are read back before a decision needs them
//! ([`super::State::refill_windows`]); a key read from the store whose job is in memory
//! counts only if the job still waits under it, as the delay window does.

use std::collections::BTreeSet;

use super::{Job, Lane, QueueKey};

/// A key of an ordered index of jobs: it names its job.
pub trait JobKey: Ord + Clone {
    fn job_id(&self) -> &str;
}

impl JobKey for QueueKey {
    fn job_id(&self) -> &str {
        &self.job_id
    }
}

/// A lane's jobs ([`Stored`] of queue keys).
pub type LaneJobs = Stored<QueueKey>;

/// An ordered index of jobs of which memory holds the first keys and the store every one:
/// a lane's jobs, or the queued jobs' timers of one kind ([`super::Waits`]). All of them (a
/// state that never lets them go), or its head, with the rest in storage. Two are equal when
/// they hold the same keys alike (states that hold every key compare so);
/// [`Stored::problems_against`] compares a partial one with the whole.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored<K> {
    /// Every key up to `through` (all of them while `whole`).
    head: BTreeSet<K>,
    /// Whether `head` holds every key.
    whole: bool,
    /// While not whole: every key up to this one is in `head` (None: no key is known).
    through: Option<K>,
    /// Keys past `through` whose records are in memory.
    beyond: BTreeSet<K>,
    /// Keys in the index, in memory or not.
    len: u64,
}

impl<K> Default for Stored<K> {
    /// Nothing known: keys are read from the store before any is trusted.
    fn default() -> Self {
        Stored {
            head: BTreeSet::new(),
            whole: false,
            through: None,
            beyond: BTreeSet::new(),
            len: 0,
        }
    }
}

impl<K: JobKey> Stored<K> {
    /// An index that holds every key it is given.
    pub fn whole() -> Stored<K> {
        Stored {
            whole: true,
            ..Stored::default()
        }
    }

    /// An index of `len` keys, every one in storage: what a start knows of a lane, or of
    /// a kind of queued timer, before it reads any of them back (none: whole).
    pub fn counted(len: u64) -> Stored<K> {
        Stored {
            len,
            whole: len == 0,
            ..Stored::default()
        }
    }

    /// How many jobs wait in the lane.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first key (in memory whenever there are keys, at a decision).
    pub fn first(&self) -> Option<&K> {
        self.head.first()
    }

    /// The first keys, in order: every key up to where memory holds them all.
    pub fn head(&self) -> &BTreeSet<K> {
        &self.head
    }

    /// Keys past the head held in memory.
    pub fn beyond(&self) -> &BTreeSet<K> {
        &self.beyond
    }

    /// Whether the head holds every key of the lane.
    pub fn is_whole(&self) -> bool {
        self.whole
    }

    /// Whether `key` belongs in the head.
    fn covers(&self, key: &K) -> bool {
        self.whole || self.through.as_ref().is_some_and(|t| key <= t)
    }

    /// Adds a key; false if the lane holds it already (in memory).
    pub(super) fn insert(&mut self, key: K) -> bool {
        let added = if self.covers(&key) {
            self.head.insert(key)
        } else {
            self.beyond.insert(key)
        };
        if added {
            self.len += 1;
        }
        added
    }

    /// Removes a key; false if a whole lane lacks it. A key past the head is in `beyond`
    /// or in storage.
    pub(super) fn remove(&mut self, key: &K) -> bool {
        if self.covers(key) {
            if !self.head.remove(key) {
                return false;
            }
        } else {
            self.beyond.remove(key);
        }
        self.len = self.len.saturating_sub(1);
        true
    }

    /// Whether `key` stands past the lane's first `window` keys (None: not known, when it is
    /// past a head of fewer keys).
    pub(super) fn past_window(&self, key: &K, window: usize) -> Option<bool> {
        if self.covers(key) {
            Some(self.head.range(..key).take(window).count() >= window)
        } else {
            (self.head.len() >= window).then_some(true)
        }
    }

    /// Whether fewer than `want` keys are in the head while the lane has more.
    pub fn short(&self, want: usize) -> bool {
        !self.whole && self.head.len() < want && self.len > self.head.len() as u64
    }

    /// Whether the head holds `want` keys or every one there is (None: every key of the
    /// index): no read from the store is needed for that many.
    pub(super) fn holds(&self, want: Option<usize>) -> bool {
        match want {
            Some(w) => !self.short(w),
            None => self.whole,
        }
    }

    /// Where to read the store after (None: from the lane's first key).
    pub(super) fn read_after(&self) -> Option<&K> {
        self.through.as_ref()
    }

    /// Takes keys read from storage after [`LaneJobs::read_after`]: `more` says whether the
    /// store may hold keys past the last of them. `current` says whether a key still
    /// stands (its job in memory may have left it since the store was written).
    pub(super) fn extend(&mut self, read: Vec<K>, more: bool, current: impl Fn(&K) -> bool) {
        let through = if more { read.last().cloned() } else { None };
        for key in read {
            if current(&key) {
                self.head.insert(key);
            }
        }
        match through {
            Some(t) => {
                let later = self.beyond.split_off(&t);
                let mut reached = std::mem::replace(&mut self.beyond, later);
                if self.beyond.first() == Some(&t) {
                    self.beyond.pop_first();
                    reached.insert(t.clone());
                }
                self.head.append(&mut reached);
                self.through = Some(t);
            }
            None => {
                self.head.append(&mut self.beyond);
                self.whole = true;
                self.through = None;
            }
        }
    }

    /// Keeps the first `keep` keys of the head: the later ones whose records are in memory
    /// (`in_memory`) go to `beyond`, the others are in storage. Returns the keys dropped.
    pub(super) fn trim(&mut self, keep: usize, in_memory: impl Fn(&str) -> bool) -> usize {
        let mut dropped = 0;
        while self.head.len() > keep {
            let Some(last) = self.head.pop_last() else {
                break;
            };
            if in_memory(last.job_id()) {
                self.beyond.insert(last);
            } else {
                dropped += 1;
            }
        }
        self.whole = self.head.len() as u64 == self.len && self.beyond.is_empty();
        self.through = if self.whole {
            None
        } else {
            self.head.last().cloned()
        };
        dropped
    }

    /// Job `id`'s record left memory: its key past the head is in storage now.
    pub(super) fn left_memory(&mut self, key: &K) {
        self.beyond.remove(key);
    }

    /// How this lane disagrees with `all`, every key of the lane in order: its count, its
    /// head (the first keys, every one up to where it is known to reach), and the keys it
    /// holds past the head.
    pub fn problems_against(&self, all: &BTreeSet<K>) -> Vec<String> {
        let mut problems = Vec::new();
        if self.len != all.len() as u64 {
            problems.push(format!("counts {} keys of {}", self.len, all.len()));
        }
        let prefix: Vec<&K> = match (&self.through, self.whole) {
            (_, true) => all.iter().collect(),
            (Some(t), false) => all.iter().take_while(|k| *k <= t).collect(),
            (None, false) => Vec::new(),
        };
        if !self.head.iter().eq(prefix.iter().copied()) {
            problems.push(format!(
                "holds {} first keys, not the {} up to where it reaches",
                self.head.len(),
                prefix.len()
            ));
        }
        if let Some(k) = self
            .beyond
            .iter()
            .find(|k| self.covers(k) || !all.contains(*k))
        {
            problems.push(format!("holds {} past its head wrongly", k.job_id()));
        }
        problems
    }
}

/// The (pool, lane, key) entries of a queued job, one per pool it names (a pool named twice
/// once): what the store's lane index holds for it.
pub fn lane_keys_of(id: &str, job: &Job) -> Vec<(String, Lane, QueueKey)> {
    let Some((rank, queued_at)) = super::index::queue_place(job) else {
        return Vec::new();
    };
    let lane = crate::decide::lane_of(job);
    let mut out: Vec<(String, Lane, QueueKey)> = Vec::new();
    for pool in &job.pools {
        if out.iter().any(|(p, _, _)| p == pool) {
            continue;
        }
        out.push((
            pool.clone(),
            lane.clone(),
            QueueKey {
                rank,
                queued_at,
                job_id: id.to_owned(),
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: i64) -> QueueKey {
        QueueKey {
            rank: 2,
            queued_at: n,
            job_id: format!("j{n:03}"),
        }
    }

    #[test]
    fn a_trimmed_lane_counts_what_storage_holds_and_reads_it_back_in_order() {
        let mut lane = LaneJobs::whole();
        for n in 0..10 {
            assert!(lane.insert(key(n)));
        }
        assert!(!lane.insert(key(3)), "held once");
        // Records 8 and 9 are in memory (not yet written): they stay, past the head.
        lane.trim(4, |id| id == "j008" || id == "j009");
        assert_eq!(lane.len(), 10);
        assert_eq!(lane.head().len(), 4);
        assert_eq!(lane.beyond().len(), 2);
        assert!(lane.short(5) && !lane.short(4));
        // A key past the head goes to `beyond`, a key in it to the head.
        assert!(lane.insert(key(20)));
        assert!(lane.beyond().contains(&key(20)));
        assert!(lane.remove(&key(6)), "in storage: counted out");
        assert_eq!(lane.len(), 10);
        // The store has 4..7 (6 left since it was written: its job says so) and not yet 8, 9.
        let read = vec![key(4), key(5), key(6), key(7)];
        lane.extend(read, false, |k| *k != key(6));
        assert!(lane.is_whole());
        let order: Vec<i64> = lane.head().iter().map(|k| k.queued_at).collect();
        assert_eq!(order, vec![0, 1, 2, 3, 4, 5, 7, 8, 9, 20]);
        assert_eq!(lane.len(), order.len() as u64);
    }

    #[test]
    fn a_partial_read_covers_the_keys_in_memory_up_to_its_last() {
        let mut lane = LaneJobs::whole();
        for n in 0..6 {
            lane.insert(key(n));
        }
        lane.trim(1, |id| id == "j003" || id == "j005");
        let read = vec![key(1), key(2), key(4)];
        lane.extend(read, true, |_| true);
        let head: Vec<i64> = lane.head().iter().map(|k| k.queued_at).collect();
        assert_eq!(head, vec![0, 1, 2, 3, 4]);
        assert_eq!(lane.beyond().iter().next(), Some(&key(5)));
        assert_eq!(lane.read_after(), Some(&key(4)));
        // Every key read stale: the lane still moves on past them.
        lane.extend(vec![key(6)], true, |_| false);
        assert_eq!(lane.read_after(), Some(&key(6)));
        assert_eq!(lane.head().len(), 6, "5 came in with the coverage");
    }
}
