//! Queued jobs whose records, lane keys and timers wait in storage, so that a backlog costs
//! its counts in memory, not its records.
//!
//! A scheduling pass reads only the first jobs of each lane ([`super::Lane`]): it places a
//! lane's head, then the next, and one entry places at most `limits.max_work_per_entry`
//! jobs. So the records a decision can need of a lane are its first
//! `max_work_per_entry + 1` jobs, its *window* ([`window_of`]). Every other queued job's
//! record may leave memory once it is written, like a terminal job's, and so may its key in
//! the lane past the lane's first [`keep_of`] ([`super::LaneJobs`]), and its timers past
//! the first ones of their kind ([`super::Waits`]). The counts it is in stay, so the
//! counts placement needs are exact whatever memory holds.
//!
//! The window is kept full before every decision ([`State::refill_windows`]): a lane left
//! with fewer keys than its window and one reads more from the store's lane index, and a
//! job that came into a window when one before it left ([`Backlog::entering`]) has its
//! record read back. A
//! Tick reads the records of the timers it may fire, and an input or entry that re-derives
//! every index (new rules) reads every queued record first
//! ([`State::load_queued`]). Reading a record back is not a change: the store has the latest
//! version of every record not in memory (nothing leaves memory unwritten), so what a
//! decision sees, and decides, does not depend on what memory held.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::events::JobState;
use crate::rules::{Limits, Rules};

use super::{ColdStore, Job, Lane, LaneJobs, QueueKey, State, Stored, WAIT_KINDS};
use crate::records::Millis;

/// Whether `job` waits in its pools' queues. A start does not read such a job: its lanes'
/// counts and [`QueuedCounts`] stand for it, and its record, keys and timers are read back
/// as windows need them ([`State::restore_queued`]). Every other unfinished job is read.
pub fn is_queued(job: &Job) -> bool {
    super::index::queue_place(job).is_some()
}

/// Whether a start reads `job`: unfinished (not terminal, not delayed) and not queued. Such
/// records never leave memory; the store keeps a marker of each.
pub fn is_resident(job: &Job) -> bool {
    !job.state.is_cold() && !is_queued(job)
}

/// What the queued jobs count for besides their lanes, which the store writes with every
/// checkpoint so that a start need not read them ([`State::restore_queued`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedCounts {
    /// Queued jobs by the reason they wait ([`State::waiting_by_reason`]).
    pub waiting_by_reason: BTreeMap<String, i64>,
    /// Queued timers of each kind, in the order of [`WAIT_KINDS`].
    pub waits: [u64; 3],
}

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
    /// Lanes with fewer keys in memory than the next entry may take ([`super::LaneJobs::short`]).
    short: BTreeSet<(String, Lane)>,
    /// Lanes whose heads grew past [`trim_above`]: cut back when records leave memory.
    long: BTreeSet<(String, Lane)>,
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

    /// Notes that a lane has fewer keys in memory than the next entry may take.
    pub(super) fn short(&mut self, pool: &str, lane: &Lane) {
        if self.evicting {
            self.short.insert((pool.to_owned(), lane.clone()));
        }
    }

    /// Notes that a lane's head grew past [`trim_above`].
    pub(super) fn long(&mut self, pool: &str, lane: &Lane) {
        if self.evicting {
            self.long.insert((pool.to_owned(), lane.clone()));
        }
    }

    /// Forgets every note (indexes are rebuilt: every queued job is noted again as it joins
    /// its queues).
    pub(super) fn forget(&mut self) {
        self.entering.clear();
        self.spare.clear();
        self.short.clear();
        self.long.clear();
    }
}

/// How many of a lane's first jobs decisions may read under `rules`: one entry places at
/// most `max_work_per_entry` jobs and then looks at the next head.
pub fn window_of(rules: Option<&Rules>) -> usize {
    let work = rules.map_or_else(
        || Limits::default().max_work_per_entry,
        |r| r.limits.max_work_per_entry,
    );
    usize::try_from(work)
        .unwrap_or(usize::MAX)
        .saturating_add(1)
}

/// How many keys a lane's head holds after a read or a cut under `rules`
/// (`limits.lane_keys_in_memory`, at least the window and one more): a lane is read back
/// once per so many jobs that leave it, not at every one.
pub(super) fn keep_of(rules: Option<&Rules>) -> usize {
    let kept = rules.map_or_else(
        || Limits::default().lane_keys_in_memory,
        |r| r.limits.lane_keys_in_memory,
    );
    usize::try_from(kept)
        .unwrap_or(usize::MAX)
        .max(window_of(rules).saturating_add(1))
}

/// The most keys a lane's head holds before it is cut back to `keep`.
pub(super) fn trim_above(keep: usize) -> usize {
    keep.saturating_mul(2)
}

impl State {
    /// How many first jobs of each lane decisions may read ([`window_of`]).
    fn window(&self) -> usize {
        window_of(self.rules())
    }

    /// Whether queued job `id`'s record may leave memory: it is past the window of every
    /// lane it waits in (None: not known yet, while a lane's head in memory is shorter than
    /// its window and the job stands past it).
    fn past_every_window(&self, id: &str, job: &Job) -> Option<bool> {
        let (rank, queued_at) = super::index::queue_place(job)?;
        let key = QueueKey {
            rank,
            queued_at,
            job_id: id.to_owned(),
        };
        let lane = crate::decide::lane_of(job);
        let window = self.window();
        let mut known = true;
        for pool in &job.pools {
            let Some(keys) = self.lanes.get(pool).and_then(|lanes| lanes.get(&lane)) else {
                continue;
            };
            match keys.past_window(&key, window) {
                Some(false) => return Some(false),
                Some(true) => {}
                None => known = false,
            }
        }
        known.then_some(true)
    }

    /// What the queued jobs count for besides their lanes ([`QueuedCounts`]).
    pub fn queued_counts(&self) -> QueuedCounts {
        let mut waits = [0; 3];
        for (n, kind) in waits.iter_mut().zip(WAIT_KINDS) {
            *n = self.waits.of(kind).map_or(0, Stored::len);
        }
        QueuedCounts {
            waiting_by_reason: (self.waiting_by_reason.iter())
                .map(|(r, n)| ((*r).to_owned(), *n))
                .collect(),
            waits,
        }
    }

    /// A start's second step, after [`State::rebuild_indexes_with`] the unfinished jobs that
    /// are not queued ([`is_queued`]): the queued ones, which it does not read, as the
    /// store counts them: `lanes` gives each lane of each pool and its count of jobs, and
    /// `counts` the rest. The counts placement reads (per pool, tenant and concurrency key)
    /// are exact at once; every lane is read back before the first decision
    /// ([`State::refill_windows`]), which puts its head in the passes.
    ///
    /// A job stands in the same [`Lane`] in each of its pools (the lane names its tenant,
    /// pools and concurrency key): a tenant's or a key's queued jobs are the counts of its
    /// lanes, each lane counted once however many pools it is in.
    pub fn restore_queued(
        &mut self,
        lanes: impl IntoIterator<Item = (String, Lane, u64)>,
        counts: &QueuedCounts,
    ) {
        debug_assert!(self.lanes.is_empty(), "a start's jobs were queued ones");
        for (pool, lane, len) in lanes {
            if len == 0 {
                continue;
            }
            *self.queued.entry(pool.clone()).or_default() += len;
            self.backlog.short(&pool, &lane);
            let of_pool = self.lanes.entry(pool).or_default();
            of_pool.insert(lane, LaneJobs::counted(len));
        }
        let mut counted: BTreeMap<&Lane, u64> = BTreeMap::new();
        let mut tenants: BTreeMap<&str, i64> = BTreeMap::new();
        let mut keys: BTreeMap<(&str, &str), i64> = BTreeMap::new();
        for (lane, jobs) in self.lanes.values().flatten() {
            let len = jobs.len();
            if let Some(seen) = counted.get(lane) {
                debug_assert_eq!(*seen, len, "a lane counts alike in each of its pools");
                continue;
            }
            counted.insert(lane, len);
            let n = i64::try_from(len).unwrap_or(i64::MAX);
            *tenants.entry(&lane.tenant).or_default() += n;
            if let Some(c) = &lane.concurrency {
                *keys.entry((&lane.tenant, &c.key)).or_default() += n;
            }
        }
        for (tenant, n) in tenants {
            *self.tenant_pending.entry(tenant.to_owned()).or_default() += n;
        }
        for ((tenant, key), n) in keys {
            let live = (tenant.to_owned(), key.to_owned());
            *self.key_live.entry(live).or_default() += n;
        }
        for (reason, n) in &counts.waiting_by_reason {
            let code = crate::reason::WaitReason::parse(reason).map_or("other", |w| w.as_str());
            *self.waiting_by_reason.entry(code).or_default() += n;
        }
        for (kind, n) in WAIT_KINDS.into_iter().zip(counts.waits) {
            if let Some(keys) = self.waits.of_mut(kind) {
                *keys = Stored::counted(n);
            }
        }
    }

    /// Reads back what the next decision may read: the keys of lanes left with fewer in
    /// memory than an entry may take, and the records of the jobs in their windows and of
    /// those that came into a lane's window since the last decision. Records read back are
    /// in their windows: not looked at again when records leave memory (unless pushed out).
    pub fn refill_windows<S: ColdStore>(&mut self, store: &S) -> Result<(), S::Error> {
        let window = self.window();
        let keep = keep_of(self.rules());
        let mut began = false;
        for (pool, lane) in std::mem::take(&mut self.backlog.short) {
            began |= self.read_lane(&pool, &lane, Some(keep), store)?;
            if let Some(jobs) = self.lanes.get(&pool).and_then(|l| l.get(&lane)) {
                let missing = (jobs.head().iter().take(window))
                    .filter(|k| !self.jobs.contains_key(&k.job_id))
                    .map(|k| k.job_id.clone());
                self.backlog.entering.extend(missing);
            }
        }
        // Lanes that came into the passes from nothing (a start): their tenants' passes.
        if began {
            self.seed_missing_passes();
        }
        if self.backlog.evicting {
            for kind in super::WAIT_KINDS {
                self.read_waits(kind, Some(window + 1), store)?;
            }
        }
        for id in std::mem::take(&mut self.backlog.entering) {
            if !self.jobs.contains_key(&id)
                && let Some(job) = store.job(&id)?
            {
                if self.indexed_while_stored(&job) {
                    // Its batch entry left memory with it.
                    for key in super::dependent_keys_of(&id, &job) {
                        self.dependents.insert(key);
                    }
                    self.jobs.insert(id, Box::new(job));
                } else {
                    self.hydrate_job(id, job);
                }
            }
        }
        Ok(())
    }

    /// Reads lane `lane` of `pool`'s keys back from `store` until its head holds `want`
    /// (None: every key). A key whose job is in memory counts only if the job still waits
    /// under it: the store is written behind. Returns whether the lane came into the passes
    /// from nothing (a start knows no lane's head): its tenant's pass may need seeding
    /// ([`State::seed_missing_passes`]).
    fn read_lane<S: ColdStore>(
        &mut self,
        pool: &str,
        lane: &Lane,
        want: Option<usize>,
        store: &S,
    ) -> Result<bool, S::Error> {
        let chunk = keep_of(self.rules());
        let mut began = false;
        loop {
            let Some(jobs) = self.lanes.get(pool).and_then(|l| l.get(lane)) else {
                return Ok(began);
            };
            if jobs.holds(want) {
                return Ok(began);
            }
            let first_before = jobs.first().cloned();
            let read = store.lane_after(pool, lane, jobs.read_after(), chunk)?;
            let more = read.len() >= chunk;
            let State { jobs, lanes, .. } = self;
            let current = |k: &QueueKey| match jobs.get(&k.job_id) {
                Some(job) => (super::lane_keys_of(&k.job_id, job).iter())
                    .any(|(p, l, q)| p == pool && l == lane && q == k),
                None => true,
            };
            let Some(keys) = lanes.get_mut(pool).and_then(|l| l.get_mut(lane)) else {
                return Ok(began);
            };
            keys.extend(read, more, current);
            if keys.head().len() > trim_above(chunk) {
                self.backlog.long(pool, lane);
            }
            began |= first_before.is_none();
            self.lane_read_back(pool, lane, first_before);
        }
    }

    /// Reads queued timers of `kind` back from `store` until its index's head holds `want`
    /// of them, or all of them (None). A key whose job is in memory counts only if the job
    /// still has that timer: the store is written behind.
    fn read_waits<S: ColdStore>(
        &mut self,
        kind: super::TimerKind,
        want: Option<usize>,
        store: &S,
    ) -> Result<(), S::Error> {
        let chunk = keep_of(self.rules());
        loop {
            let Some(keys) = self.waits.of(kind) else {
                return Ok(());
            };
            if keys.holds(want) {
                return Ok(());
            }
            let read = store.waits_after(kind, keys.read_after(), chunk)?;
            let more = read.len() >= chunk;
            let rules = self.config.as_deref().map(|c| &c.rules);
            let State { jobs, waits, .. } = self;
            let current = |k: &super::TimerAt| match jobs.get(&k.job_id) {
                Some(job) => (super::wait_keys_of(&k.job_id, job, rules).iter())
                    .any(|(kd, at)| *kd == kind && at == k),
                None => true,
            };
            if let Some(keys) = waits.of_mut(kind) {
                keys.extend(read, more, current);
            }
        }
    }

    /// Reads back every queued job's key, timer and record not in memory: for what
    /// re-derives every index from the records (new rules). Costs memory for the whole
    /// backlog until the next checkpoint lets it go again.
    pub fn load_queued<S: ColdStore>(&mut self, store: &S) -> Result<(), S::Error> {
        if !self.backlog.evicting {
            return Ok(());
        }
        for kind in super::WAIT_KINDS {
            self.read_waits(kind, None, store)?;
        }
        let partial: Vec<(String, Lane)> = (self.lanes.iter())
            .flat_map(|(pool, lanes)| {
                (lanes.iter())
                    .filter(|(_, jobs)| !jobs.is_whole())
                    .map(|(lane, _)| (pool.clone(), lane.clone()))
            })
            .collect();
        let mut began = false;
        for (pool, lane) in partial {
            began |= self.read_lane(&pool, &lane, None, store)?;
        }
        if began {
            self.seed_missing_passes();
        }
        let mut missing: BTreeSet<&str> = BTreeSet::new();
        for lanes in self.lanes.values() {
            for jobs in lanes.values() {
                for key in jobs.head() {
                    if !self.jobs.contains_key(&key.job_id) {
                        missing.insert(&key.job_id);
                    }
                }
            }
        }
        let missing: Vec<String> = missing.into_iter().map(str::to_owned).collect();
        self.load_jobs(&missing, store)
    }

    /// Reads back the records of the first `want` queued timers due by `judged` of each
    /// kind (of the aging steps, or of the others) whose records are not in memory (the
    /// other timers are of jobs that are not queued, always in memory). Counted apart from
    /// those in memory: what a Tick does before it fires timers (requeue the jobs of lost
    /// workers) changes timers of jobs in memory only, so the timers it fires whose records
    /// are in storage are the first of these, at most as many as it fires. A clock gap the
    /// Tick journals first (`gap_to`) raises the liveness floor placement timeouts count
    /// from ([`super::due_of`]): they are judged as the Tick will judge them.
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
        let floor = gap_to.map_or(self.liveness_floor, |to| self.liveness_floor.max(to));
        let timing = self.rules().map(|r| &r.timing);
        let kinds: &[super::TimerKind] = if aging {
            &[super::TimerKind::Aging]
        } else {
            &[
                super::TimerKind::Deadline,
                super::TimerKind::PlacementTimeout,
            ]
        };
        let mut missing: Vec<String> = Vec::new();
        for &kind in kinds {
            missing.extend(
                (self.due_waits(kind, judged, floor, timing, usize::MAX))
                    .filter(|t| !self.jobs.contains_key(&t.timer.job_id))
                    .take(want)
                    .map(|t| t.timer.job_id),
            );
        }
        self.load_jobs(&missing, store)
    }

    /// Whether `job`, read from storage, is queued here: its index entries are in memory.
    pub(super) fn indexed_while_stored(&self, job: &Job) -> bool {
        self.backlog.evicting && job.state == JobState::Pending && job.queued_at.is_some()
    }

    /// Lets the records of queued jobs past every window leave memory, but those `keep`
    /// names (changed since the last written checkpoint), then cuts the lanes whose heads
    /// grew long back to their first keys (the rest are in storage, or stay past the head
    /// while their records are in memory).
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
            let past = self.past_every_window(&id, job);
            if keep.is_some_and(|k| k.contains(&id)) || past.is_none() {
                kept.insert(id);
            } else if past == Some(true) {
                for (pool, lane, key) in super::lane_keys_of(&id, job) {
                    if let Some(jobs) = self.lanes.get_mut(&pool).and_then(|l| l.get_mut(&lane)) {
                        jobs.left_memory(&key);
                    }
                }
                for (kind, key) in super::wait_keys_of(&id, job, self.rules()) {
                    if let Some(keys) = self.waits.of_mut(kind) {
                        keys.left_memory(&key);
                    }
                }
                // A batch member's entry is in storage only from here.
                let entries = super::dependent_keys_of(&id, job);
                if !entries.is_empty() {
                    for key in &entries {
                        self.dependents.remove(key);
                    }
                    self.dependents.left_memory();
                }
                self.jobs.remove(&id);
            }
        }
        self.backlog.spare = kept;
        let keep_keys = keep_of(self.rules());
        for (pool, lane) in std::mem::take(&mut self.backlog.long) {
            let State { jobs, lanes, .. } = self;
            if let Some(keys) = lanes.get_mut(&pool).and_then(|l| l.get_mut(&lane)) {
                keys.trim(keep_keys, |id| jobs.contains_key(id));
            }
        }
        for kind in super::WAIT_KINDS {
            let State { jobs, waits, .. } = self;
            if let Some(keys) = waits.of_mut(kind)
                && keys.head().len() > trim_above(keep_keys)
            {
                keys.trim(keep_keys, |id| jobs.contains_key(id));
            }
        }
    }

    /// What a decision would find missing: lanes with fewer keys in memory than an entry
    /// may take, and jobs in a lane's window whose records are not in memory. None once the
    /// windows were read back ([`State::refill_windows`]), as before every decision.
    pub fn window_problems(&self) -> Vec<String> {
        let window = self.window();
        let mut problems = Vec::new();
        for (pool, lanes) in &self.lanes {
            for keys in lanes.values() {
                if keys.short(window + 1) {
                    problems.push(format!(
                        "a lane in pool {pool} holds {} of its {} keys in memory, fewer than {}",
                        keys.head().len(),
                        keys.len(),
                        window + 1
                    ));
                }
                for key in keys.head().iter().take(window) {
                    if !self.jobs.contains_key(&key.job_id) {
                        problems.push(format!(
                            "job {} is in the window of its lane in pool {pool} but not in memory",
                            key.job_id
                        ));
                    }
                }
            }
        }
        for (kind, keys) in self.waits.each() {
            if keys.short(window + 1) {
                problems.push(format!(
                    "the queued timers of kind {kind:?} hold {} of their {} keys in memory, fewer than {}",
                    keys.head().len(),
                    keys.len(),
                    window + 1
                ));
            }
        }
        problems
    }

    /// Queued jobs past every window whose records stayed in memory when records were let go
    /// (but those not yet written), and keys past a lane's head kept for records that are
    /// no longer in memory: none.
    pub fn lingering_queued(&self) -> Vec<String> {
        let mut ids: Vec<String> = (self.jobs.iter_any_order())
            .filter(|(id, job)| {
                self.indexed_while_stored(job)
                    && !self.backlog.spare.contains(*id)
                    && self.past_every_window(id, job) == Some(true)
            })
            .map(|(id, _)| id.to_owned())
            .collect();
        for lanes in self.lanes.values() {
            for keys in lanes.values() {
                ids.extend(
                    (keys.beyond().iter())
                        .filter(|k| !self.jobs.contains_key(&k.job_id))
                        .map(|k| format!("{} (past its lane's head)", k.job_id)),
                );
            }
        }
        for (kind, keys) in self.waits.each() {
            ids.extend(
                (keys.beyond().iter())
                    .filter(|k| !self.jobs.contains_key(&k.job_id))
                    .map(|k| format!("{} (past the head of its {kind:?} timers)", k.job_id)),
            );
        }
        ids.sort_unstable();
        ids
    }
}
