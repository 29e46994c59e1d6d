//! Queued jobs whose records wait in storage, so that a backlog costs its index entries in
//! memory, not its records.
//!
//! A scheduling pass reads only the first jobs of each lane ([`super::Lane`]): it places a
//! lane's head, then the next, and one entry places at most `limits.max_work_per_entry`
//! jobs. So the records a decision can need of a lane are its first
//! `max_work_per_entry + 1` jobs, its *window* ([`window_of`]). Every other queued job's
//! record may leave memory once it is written, like a terminal job's. Its index entries stay
//! (its place in its lanes, its timers, the counts it is in), so placement order, the
//! counts placement needs and the timers are exact whatever memory holds.
//!
//! The window is kept full before every decision ([`State::refill_windows`]): a job that
//! came into a window when one before it left ([`Backlog::entering`]) has its record read
//! back. A
//! Tick reads the records of the timers it may fire, and an input or entry that re-derives
//! every index (new rules) reads every queued record first
//! ([`State::load_queued`]). Reading a record back is not a change: the store has the latest
//! version of every record not in memory (nothing leaves memory unwritten), so what a
//! decision sees, and decides, does not depend on what memory held.

use std::collections::BTreeSet;

use crate::events::JobState;
use crate::rules::Rules;

use super::{ColdStore, Job, QueueKey, State};
use crate::records::Millis;

/// The queued jobs a state holds in memory beyond what decisions need ([`State::backlog`]).
#[derive(Debug, Clone, Default)]
pub struct Backlog {
    /// Whether queued records past their lanes' windows may leave memory: a state with a
    /// store behind it. Off, every record stays (tests, audits, what-if).
    pub evicting: bool,
    /// Queued jobs in memory that may be past every window of theirs: looked at when
    /// records leave memory.
    spare: BTreeSet<String>,
    /// Jobs that came into a lane's window when a job before them left it: their records
    /// may be in storage only.
    entering: Vec<String>,
}

impl Backlog {
    /// A backlog whose records past the windows leave memory (a state loaded from a store).
    pub fn evicting() -> Backlog {
        Backlog {
            evicting: true,
            ..Backlog::default()
        }
    }

    /// Queued jobs in memory that may leave it.
    pub fn spare_len(&self) -> usize {
        self.spare.len()
    }

    /// Notes that job `id` was queued, or pushed back in a lane: its record may leave memory.
    pub(super) fn spare(&mut self, id: &str) {
        if self.evicting && !self.spare.contains(id) {
            self.spare.insert(id.to_owned());
        }
    }

    /// Notes that job `id` was put past a lane's window: its record may leave memory, and
    /// need not be read back for having come into the window before. (A job's lanes in its
    /// pools hold the same jobs, so it stands at the same place in each.)
    pub(super) fn pushed_out(&mut self, id: &str) {
        if self.evicting {
            self.entering.retain(|e| e != id);
            self.spare(id);
        }
    }

    /// Notes that job `id` came into a lane's window.
    pub(super) fn entered(&mut self, id: &str) {
        if self.evicting {
            self.entering.push(id.to_owned());
        }
    }

    /// Forgets every note (indexes are rebuilt: every queued job is noted again as it joins
    /// its queues).
    pub(super) fn forget(&mut self) {
        self.entering.clear();
        self.spare.clear();
    }
}

/// How many of a lane's first jobs decisions may read under `rules`: one entry places at
/// most `max_work_per_entry` jobs and then looks at the next head.
pub fn window_of(rules: Option<&Rules>) -> usize {
    let work = rules.map_or(Rules::default().limits.max_work_per_entry, |r| {
        r.limits.max_work_per_entry
    });
    usize::try_from(work)
        .unwrap_or(usize::MAX)
        .saturating_add(1)
}

/// Whether `key` is among the first `window` keys of `keys`.
fn in_window(keys: &BTreeSet<QueueKey>, key: &QueueKey, window: usize) -> bool {
    keys.range(..key).take(window).count() < window
}

impl State {
    /// How many first jobs of each lane decisions may read ([`window_of`]).
    fn window(&self) -> usize {
        window_of(self.rules())
    }

    /// Whether queued job `id`'s record may leave memory: it is past the window of every
    /// lane it waits in.
    fn past_every_window(&self, id: &str, job: &Job) -> bool {
        let Some((rank, queued_at)) = super::index::queue_place(job) else {
            return false;
        };
        let key = QueueKey {
            rank,
            queued_at,
            job_id: id.to_owned(),
        };
        let lane = crate::decide::lane_of(job);
        let window = self.window();
        job.pools.iter().all(|pool| {
            (self.lanes.get(pool).and_then(|lanes| lanes.get(&lane)))
                .is_none_or(|keys| !in_window(keys, &key, window))
        })
    }

    /// Reads back the records of the jobs that came into a lane's window since the last
    /// decision, so that a decision finds in memory every record it may read. They are in
    /// their windows: not looked at again when records leave memory (unless pushed out).
    pub fn refill_windows<S: ColdStore>(&mut self, store: &S) -> Result<(), S::Error> {
        for id in std::mem::take(&mut self.backlog.entering) {
            if !self.jobs.contains_key(&id)
                && let Some(job) = store.job(&id)?
            {
                if self.indexed_while_stored(&job) {
                    self.jobs.insert(id, Box::new(job));
                } else {
                    self.hydrate_job(id, job);
                }
            }
        }
        Ok(())
    }

    /// Reads back the record of every queued job not in memory: for what re-derives every
    /// index from the records (new rules). Costs memory for the whole backlog
    /// until the next checkpoint lets it go again.
    pub fn load_queued<S: ColdStore>(&mut self, store: &S) -> Result<(), S::Error> {
        if !self.backlog.evicting {
            return Ok(());
        }
        let mut missing: BTreeSet<&str> = BTreeSet::new();
        for lanes in self.lanes.values() {
            for key in lanes.values().flatten() {
                if !self.jobs.contains_key(&key.job_id) {
                    missing.insert(&key.job_id);
                }
            }
        }
        let missing: Vec<String> = missing.into_iter().map(str::to_owned).collect();
        self.load_jobs(&missing, store)
    }

    /// Reads back the records of the first `want` timers due by `judged` (of the aging
    /// steps, or of the other timers) whose records are not in memory. Counted apart from
    /// those in memory: what a Tick does before it fires timers (requeue the jobs of lost
    /// workers) removes timers of jobs in memory only, so the timers it fires whose records
    /// are in storage are the first of these, at most as many as it fires. A clock gap the
    /// Tick journals first (`gap_to`) moves the evidence-based timeouts on
    /// ([`State::raise_liveness_floor`]): those it moves past `judged` are not counted.
    pub(super) fn load_timer_records<S: ColdStore>(
        &mut self,
        aging: bool,
        judged: Millis,
        gap_to: Option<Millis>,
        want: usize,
        store: &S,
    ) -> Result<(), S::Error> {
        // Without eviction every record is in memory: no walk through the due timers.
        if !self.backlog.evicting {
            return Ok(());
        }
        let timers = if aging {
            &self.aging_timers
        } else {
            &self.timers
        };
        let timing = self.rules().map(|r| &r.timing);
        // Whether the Tick fires `t` once a clock gap it journals moved it on.
        let fires = |t: &&super::Timer| match (gap_to, super::index::floor_timeout(t.kind, timing))
        {
            (Some(to), Some(timeout)) => t.due.max(to.saturating_add(timeout)) <= judged,
            _ => true,
        };
        let missing: Vec<String> = (timers.iter())
            .take_while(|t| t.due <= judged)
            .filter(|t| !self.jobs.contains_key(&t.job_id))
            .filter(fires)
            .take(want)
            .map(|t| t.job_id.clone())
            .collect();
        self.load_jobs(&missing, store)
    }

    /// Whether `job`, read from storage, is queued here: its index entries are in memory.
    pub(super) fn indexed_while_stored(&self, job: &Job) -> bool {
        self.backlog.evicting && job.state == JobState::Pending && job.queued_at.is_some()
    }

    /// Lets the records of queued jobs past every window leave memory, but those `keep`
    /// names (changed since the last written checkpoint).
    pub(super) fn evict_spare(&mut self, keep: Option<&BTreeSet<String>>) {
        if !self.backlog.evicting {
            return;
        }
        let spare = std::mem::take(&mut self.backlog.spare);
        let mut kept = BTreeSet::new();
        for id in spare {
            let Some(job) = self.jobs.get(&id) else {
                // Not in memory: looked at again once read back, if it came into a window
                // again since it was pushed out.
                if self.backlog.entering.contains(&id) {
                    kept.insert(id);
                }
                continue;
            };
            if !self.indexed_while_stored(job) {
                // No longer queued: terminal, active or parked jobs go their own ways.
                continue;
            }
            if keep.is_some_and(|k| k.contains(&id)) {
                kept.insert(id);
            } else if self.past_every_window(&id, job) {
                self.jobs.remove(&id);
            }
        }
        self.backlog.spare = kept;
    }

    /// Jobs in a lane's window whose records are not in memory: none once the windows were
    /// read back ([`State::refill_windows`]), as before every decision.
    pub fn window_problems(&self) -> Vec<String> {
        let window = self.window();
        let mut problems = Vec::new();
        for (pool, lanes) in &self.lanes {
            for keys in lanes.values() {
                for key in keys.iter().take(window) {
                    if !self.jobs.contains_key(&key.job_id) {
                        problems.push(format!(
                            "job {} is in the window of its lane in pool {pool} but not in memory",
                            key.job_id
                        ));
                    }
                }
            }
        }
        problems
    }

    /// Queued jobs past every window whose records stayed in memory when records were let go
    /// (but those not yet written): none.
    pub fn lingering_queued(&self) -> Vec<String> {
        let mut ids: Vec<String> = (self.jobs.iter_any_order())
            .filter(|(id, job)| {
                self.indexed_while_stored(job)
                    && !self.backlog.spare.contains(*id)
                    && self.past_every_window(id, job)
            })
            .map(|(id, _)| id.to_owned())
            .collect();
        ids.sort_unstable();
        ids
    }
}
