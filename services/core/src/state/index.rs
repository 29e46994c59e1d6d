//! The indexes derived from job records (queues, timers, tenant counts, in-flight sets),
//! maintained in one place so they can never disagree with the jobs they index.

use std::collections::BTreeMap;

use crate::events::{Event, Input, JobState};
use crate::records::Millis;
use crate::rules::Rules;

use super::{
    Bucket, BucketKey, HISTORY_MAX, Heads, Job, KeyGroup, KeyLimit, Lane, PoolShare, QueueKey,
    State, Timer, TimerKind, Worker,
};

/// A history line to write ([`State::write_history`]): when, and the event with its entry's
/// input, which say what it is. Its text is written only when the line is kept for the
/// store.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Line<'a> {
    pub(crate) at: Millis,
    pub(crate) event: &'a Event,
    pub(crate) input: &'a Input,
}

/// The timers one job can have at once: a deadline and at most three of its state's (a
/// queued job's retry, placement timeout and aging; a running job's two timeouts).
const MAX_TIMERS: usize = 4;

/// What one job contributes to the derived indexes at one moment, short of what cannot
/// change while it lives (its pools, tenant and priority: [`State::update_job`] checks that
/// in debug builds).
#[derive(Debug, PartialEq)]
struct Entries {
    /// The rank and time it stands in its pools' queues at, while queued.
    queued: Option<(u8, Millis)>,
    /// Whether a start reads it: unfinished and not queued ([`super::is_resident`]).
    resident: bool,
    /// Why it waits, while it is queued and a reason was journaled ([`WaitReason`] codes).
    waiting: Option<&'static str>,
    /// Its (tenant, concurrency key) while it is active, and while it is queued or active.
    active_key: Option<(String, String)>,
    live_key: Option<(String, String)>,
    /// The worker whose in-flight set holds it (`Some(None)`: active on no worker).
    active_on: Option<Option<String>>,
    /// Its timers in [`State::timers`]: a job's that is not queued.
    timers: [Option<(Millis, TimerKind)>; MAX_TIMERS],
    /// Its timers in [`State::waits`], by kind and the time each counts from: a queued
    /// job's ([`super::wait_keys_of`]).
    waits: [Option<(TimerKind, Millis)>; MAX_TIMERS],
}

/// The rank and time a queued job stands in its pools' queues at (None: not queued).
pub(super) fn queue_place(job: &Job) -> Option<(u8, Millis)> {
    let queued_at = job.queued_at.map(|q| match &job.concurrency {
        Some(_) => job.first_queued_at.map_or(q, |first| first.min(q)),
        None => q,
    })?;
    Some((job.queue_rank(), queued_at))
}

impl Entries {
    fn of(
        id: &str,
        job: &Job,
        rules: Option<&Rules>,
        floor: Millis,
        workers: &BTreeMap<String, Worker>,
    ) -> Entries {
        let mut timers = [None; MAX_TIMERS];
        let mut waits = [None; MAX_TIMERS];
        let queued = queue_place(job);
        if let Some(rules) = rules {
            // Only a running job's timeout counts from its worker's evidence; the search
            // through the worker's listed jobs is skipped for the others.
            let evidence = (job.state == JobState::Running)
                .then(|| evidence(workers, id, job))
                .flatten();
            let mut n = 0;
            each_timer(job, rules, floor, evidence, |due, kind, at| {
                debug_assert!(n < MAX_TIMERS, "job {id}: more than {MAX_TIMERS} timers");
                if queued.is_some() && super::waits::is_wait_kind(kind) {
                    if let Some(slot) = waits.get_mut(n) {
                        *slot = Some((kind, at));
                    }
                } else if let Some(slot) = timers.get_mut(n) {
                    *slot = Some((due, kind));
                }
                n += 1;
            });
        }
        let active = job.state.is_active();
        let key = |on: bool| {
            (job.concurrency.as_ref())
                .filter(|_| on)
                .map(|c| (job.request.tenant_id.clone(), c.key.clone()))
        };
        // A keyed job waiting out a retry's backoff keeps its key's slot, and comes back to
        // its first place in the key's queue: a limit of 1 runs the key's jobs in order,
        // retries included.
        let retrying = job.state == JobState::Pending && job.retry_at.is_some();
        let waiting = (job.queued_at.and(job.wait_reason.as_deref()))
            .map(|r| crate::reason::WaitReason::parse(r).map_or("other", |w| w.as_str()));
        Entries {
            queued,
            resident: super::is_resident(job),
            waiting,
            active_key: key(active || retrying),
            live_key: key(active || retrying || job.queued_at.is_some()),
            active_on: active.then(|| job.worker_id.clone()),
            timers,
            waits,
        }
    }

    /// No entries: a job outside every index.
    fn none() -> Entries {
        Entries {
            queued: None,
            resident: false,
            waiting: None,
            active_key: None,
            live_key: None,
            active_on: None,
            timers: [None; MAX_TIMERS],
            waits: [None; MAX_TIMERS],
        }
    }

    fn timers(&self) -> impl Iterator<Item = (Millis, TimerKind)> + '_ {
        self.timers.iter().flatten().copied()
    }

    fn waits(&self) -> impl Iterator<Item = (TimerKind, Millis)> + '_ {
        self.waits.iter().flatten().copied()
    }
}

/// The derived indexes, borrowed apart from the job records so a job can be changed and
/// re-indexed with one lookup.
struct Indexes<'a> {
    queued: &'a mut BTreeMap<String, u64>,
    lanes: &'a mut BTreeMap<String, BTreeMap<Lane, super::LaneJobs>>,
    lane_heads: &'a mut BTreeMap<String, Heads>,
    shares: &'a mut BTreeMap<super::ShareKey, PoolShare>,
    /// The rules in force, for tenants' fair share weights.
    rules: Option<&'a crate::rules::Rules>,
    dirty: Option<&'a mut super::Dirty>,
    /// Whether a tenant whose first job enters a pass is given the clock as its pass (as
    /// events change jobs). Not while indexes are rebuilt: jobs are indexed in no set order
    /// there, so a keyed job may stand in the pass for a moment before its key's active
    /// jobs are counted and park it; [`State::seed_missing_passes`] seeds what the rebuilt
    /// pass holds instead.
    seeding: bool,
    parked: &'a mut BTreeMap<String, std::collections::BTreeSet<(QueueKey, Lane)>>,
    key_active: &'a mut BTreeMap<String, BTreeMap<String, i64>>,
    key_live: &'a mut BTreeMap<(String, String), i64>,
    key_groups: &'a mut BTreeMap<KeyGroup, std::collections::BTreeSet<(QueueKey, Lane)>>,
    groups_of_key:
        &'a mut BTreeMap<(String, String), std::collections::BTreeSet<(String, KeyLimit)>>,
    buckets: &'a BTreeMap<BucketKey, Bucket>,
    clock: Millis,
    woken: &'a mut std::collections::BTreeSet<String>,
    timers: &'a mut std::collections::BTreeSet<Timer>,
    waits: &'a mut super::Waits,
    tenant_active: &'a mut BTreeMap<String, i64>,
    tenant_pending: &'a mut BTreeMap<String, i64>,
    waiting_by_reason: &'a mut BTreeMap<&'static str, i64>,
    workers: &'a mut BTreeMap<String, Worker>,
    orphans: &'a mut BTreeMap<String, std::collections::BTreeSet<String>>,
    backlog: &'a mut super::Backlog,
    /// How many first jobs of a lane decisions may read ([`super::window_of`]).
    window: usize,
    /// How many keys of a lane memory keeps ([`super::backlog::keep_of`]).
    keep: usize,
}

impl Indexes<'_> {
    /// Moves job `id` from the entries `before` to `after`, touching only what differs.
    fn change(&mut self, id: &str, job: &Job, before: &Entries, after: &Entries) {
        // The store's marker of a job a start reads goes when the job stops being one (a job
        // accepted since the last set was taken was in no written batch: it has none).
        if before.resident
            && !after.resident
            && let Some(d) = self.dirty.as_deref_mut()
            && d.since_clock.is_none_or(|c| job.accepted_at <= c)
        {
            d.resident_left.push(id.to_owned());
        }
        if before.waiting != after.waiting {
            if let Some(r) = before.waiting
                && let Some(n) = self.waiting_by_reason.get_mut(r)
            {
                *n -= 1;
                if *n <= 0 {
                    self.waiting_by_reason.remove(r);
                }
            }
            if let Some(r) = after.waiting {
                *self.waiting_by_reason.entry(r).or_default() += 1;
            }
        }
        if before.queued != after.queued {
            if let Some(q) = before.queued {
                self.unqueue(id, job, q);
            }
            if let Some(q) = after.queued {
                self.enqueue(id, job, q);
            }
        }
        match (before.active_on.is_some(), after.active_on.is_some()) {
            (false, true) => {
                *self
                    .tenant_active
                    .entry(job.request.tenant_id.clone())
                    .or_default() += 1;
            }
            (true, false) => decrement(self.tenant_active, &job.request.tenant_id),
            _ => {}
        }
        if before.live_key != after.live_key {
            if let Some(k) = &before.live_key
                && let Some(n) = self.key_live.get_mut(k)
            {
                *n -= 1;
                if *n <= 0 {
                    self.key_live.remove(k);
                }
            }
            if let Some(k) = &after.live_key {
                *self.key_live.entry(k.clone()).or_default() += 1;
            }
        }
        if before.active_key != after.active_key {
            if let Some((tenant, key)) = &before.active_key {
                self.count_key(tenant, key, -1);
            }
            if let Some((tenant, key)) = &after.active_key {
                self.count_key(tenant, key, 1);
            }
        }
        let was = before.active_on.as_ref().and_then(Option::as_deref);
        let is = after.active_on.as_ref().and_then(Option::as_deref);
        if was != is {
            if let Some(w) = was {
                self.leave_worker(id, w);
            }
            if let Some(w) = is {
                self.join_worker(id, w);
            }
        }
        for (due, kind) in before.timers() {
            if !after.timers().any(|t| t == (due, kind)) {
                let timer = Timer {
                    due,
                    kind,
                    job_id: id.to_owned(),
                };
                self.timers.remove(&timer);
            }
        }
        for (due, kind) in after.timers() {
            if !before.timers().any(|t| t == (due, kind)) {
                let timer = Timer {
                    due,
                    kind,
                    job_id: id.to_owned(),
                };
                self.timers.insert(timer);
            }
        }
        for (kind, at) in before.waits() {
            if !after.waits().any(|w| w == (kind, at)) {
                self.unwait(id, job, kind, at);
            }
        }
        for (kind, at) in after.waits() {
            if !before.waits().any(|w| w == (kind, at)) {
                let key = super::TimerAt {
                    at,
                    job_id: id.to_owned(),
                };
                if let Some(keys) = self.waits.of_mut(kind) {
                    keys.insert(key);
                }
            }
        }
    }

    /// Takes a queued job's timer out of its index ([`super::Waits`]); the store's entry
    /// goes with the next batch, unless no batch wrote it.
    fn unwait(&mut self, id: &str, job: &Job, kind: TimerKind, at: Millis) {
        let key = super::TimerAt {
            at,
            job_id: id.to_owned(),
        };
        let Some(keys) = self.waits.of_mut(kind) else {
            return;
        };
        if !keys.remove(&key) {
            return;
        }
        if let Some(d) = self.dirty.as_deref_mut()
            && d.since_clock.is_none_or(|c| job.accepted_at <= c)
        {
            d.waits_removed.push((kind, key));
        }
    }

    fn enqueue(&mut self, id: &str, job: &Job, (rank, queued_at): (u8, Millis)) {
        let lane = crate::decide::lane_of(job);
        for (i, pool) in job.pools.iter().enumerate() {
            // (A pool a topic names twice holds the job once.)
            if job.pools[..i].contains(pool) {
                continue;
            }
            let key = QueueKey {
                rank,
                queued_at,
                job_id: id.to_owned(),
            };
            let jobs = self
                .lanes
                .entry(pool.clone())
                .or_default()
                .entry(lane.clone())
                .or_insert_with(super::LaneJobs::whole);
            let head_before = jobs.first().cloned();
            if !jobs.insert(key) {
                continue;
            }
            if let Some(d) = self.dirty.as_deref_mut() {
                d.count_lane(pool, &lane);
            }
            let window = self.window;
            // In a lane longer than its window, or one partly in storage, this job may be
            // past it, or have put the last of the window past it: either may leave memory
            // now.
            if self.backlog.evicting && (jobs.len() > window as u64 || !jobs.is_whole()) {
                self.backlog.spare(id);
                if let Some(pushed) = jobs.head().iter().nth(window) {
                    self.backlog.pushed_out(&pushed.job_id);
                }
                if jobs.head().len() == super::backlog::trim_above(self.keep) + 1 {
                    self.backlog.long(pool, &lane);
                }
                // A key past a head read short of the window (the store held no more than
                // was read): the next read reaches it.
                if jobs.short(window + 1) {
                    self.backlog.short(pool, &lane);
                }
            }
            let head_after = jobs.first().cloned();
            if head_after != head_before {
                self.move_head(pool, &lane, head_before, head_after);
            }
            match self.queued.get_mut(pool) {
                Some(n) => *n += 1,
                None => {
                    self.queued.insert(pool.clone(), 1);
                }
            }
        }
        match self.tenant_pending.get_mut(&job.request.tenant_id) {
            Some(n) => *n += 1,
            None => {
                self.tenant_pending.insert(job.request.tenant_id.clone(), 1);
            }
        }
    }

    fn unqueue(&mut self, id: &str, job: &Job, (rank, queued_at): (u8, Millis)) {
        let lane = crate::decide::lane_of(job);
        for (i, pool) in job.pools.iter().enumerate() {
            if job.pools[..i].contains(pool) {
                continue;
            }
            let key = QueueKey {
                rank,
                queued_at,
                job_id: id.to_owned(),
            };
            let Some(lanes) = self.lanes.get_mut(pool) else {
                continue;
            };
            let Some(jobs) = lanes.get_mut(&lane) else {
                continue;
            };
            let was_head = jobs.first() == Some(&key);
            if !jobs.remove(&key) {
                continue;
            }
            if let Some(d) = self.dirty.as_deref_mut() {
                d.count_lane(pool, &lane);
            }
            if let Some(n) = self.queued.get_mut(pool) {
                *n -= 1;
                if *n == 0 {
                    self.queued.remove(pool);
                }
            }
            let next = jobs.first().cloned();
            debug_assert!(
                next.is_some() || jobs.is_empty(),
                "lane of job {id} in pool {pool}: its next job was not read back"
            );
            let window = self.window;
            if self.backlog.evicting {
                // A job that stood before the window's last left it: the next comes in, whose
                // record may be in storage.
                if let Some(last) = jobs.head().iter().nth(window - 1)
                    && key < *last
                {
                    self.backlog.entered(&last.job_id);
                }
                // Fewer keys in memory than the next entry may take: read more back first.
                if jobs.short(window + 1) {
                    self.backlog.short(pool, &lane);
                }
            }
            let empty = jobs.is_empty();
            if empty {
                lanes.remove(&lane);
                if lanes.is_empty() {
                    self.lanes.remove(pool);
                }
            }
            // (A job accepted since the last set was taken was in no written batch: the store
            // has no entry of it to drop.)
            if let Some(d) = self.dirty.as_deref_mut()
                && d.since_clock.is_none_or(|c| job.accepted_at <= c)
            {
                d.lanes_removed
                    .push((pool.clone(), lane.clone(), key.clone()));
            }
            if was_head {
                self.move_head(pool, &lane, Some(key), next);
            }
        }
        decrement(self.tenant_pending, &job.request.tenant_id);
    }

    /// Moves a lane's head from `old` to `new` (either None: the lane begins or ends).
    ///
    /// A lane without a concurrency key is one of the heads a pass walks. The lanes of one
    /// key and limit in a pool are a group, and only the group's first head (in queue
    /// order) stands among the heads a pass walks, or among the parked ones while the key
    /// is at its limit: the key's jobs in the pool are tried oldest first, and a key costs
    /// one move per pool when it reaches or leaves its limit, however many lanes it has.
    fn move_head(&mut self, pool: &str, lane: &Lane, old: Option<QueueKey>, new: Option<QueueKey>) {
        let Some(c) = lane.concurrency.as_ref().filter(|c| c.holds()) else {
            if let Some(o) = old {
                self.drop_head(pool, &(o, lane.clone()));
            }
            if let Some(n) = new {
                self.add_head(pool, (n, lane.clone()));
            }
            return;
        };
        let group_key = (pool.to_owned(), lane.tenant.clone(), c.clone());
        let group = self.key_groups.entry(group_key.clone()).or_default();
        let first_before = group.first().cloned();
        if let Some(o) = old {
            group.remove(&(o, lane.clone()));
        }
        if let Some(n) = new {
            group.insert((n, lane.clone()));
        }
        let first_after = group.first().cloned();
        let of_key = (lane.tenant.clone(), c.key.clone());
        if first_after.is_none() {
            self.key_groups.remove(&group_key);
            if let Some(g) = self.groups_of_key.get_mut(&of_key) {
                g.remove(&(pool.to_owned(), c.clone()));
                if g.is_empty() {
                    self.groups_of_key.remove(&of_key);
                }
            }
        } else if first_before.is_none() {
            (self.groups_of_key)
                .entry(of_key)
                .or_default()
                .insert((pool.to_owned(), c.clone()));
        }
        if first_before == first_after {
            return;
        }
        if let Some(f) = first_before
            && !self.drop_head(pool, &f)
        {
            remove_head(self.parked, pool, &f);
        }
        if let Some(f) = first_after {
            if self.held(&f.1.tenant, c) {
                self.parked.entry(pool.to_owned()).or_default().insert(f);
            } else {
                self.add_head(pool, f);
            }
        }
    }

    /// Adds a head to the ones a pass over `pool` walks. A tenant coming into the pass at
    /// its pool and priority starts at the clock there, or where its pass stands if that is
    /// ahead: every tenant with a head has a pass, and none banks a share from before. A
    /// turn ([`super::shares::turn_of`]) likewise at its tenant's turns' clock, except
    /// the `""` turn of a tenant with no turns bookkeeping (no fair key waiting), which
    /// needs none: it stands at 0 and is not charged.
    fn add_head(&mut self, pool: &str, head: (QueueKey, Lane)) {
        let tenant = &head.1.tenant;
        let (rank, turn) = (head.0.rank, super::shares::turn_of(&head.1));
        let key = (pool.to_owned(), rank);
        let heads = self.lane_heads.get(pool);
        let (comes, turn_comes) = (
            !heads.is_some_and(|h| h.has(tenant, rank)),
            !heads.is_some_and(|h| h.has_turn(tenant, rank, turn)),
        );
        // Only what comes is written: a pass `Heads` already holds is read, never moved
        // here (it would then differ from what a rebuild reads back).
        let (pass, turn_pass) = if self.seeding && turn_comes {
            let share = self.shares.entry(key.clone()).or_default();
            let mut changed = false;
            let pass = if comes {
                let clock = share.clock;
                let p = (share.passes.entry(tenant.clone())).or_insert_with(|| {
                    changed = true;
                    clock
                });
                if *p < clock {
                    *p = clock;
                    changed = true;
                }
                *p
            } else {
                share.pass(tenant)
            };
            let turn_pass = if turn.is_empty() && !share.turns.contains_key(tenant) {
                0
            } else {
                let turns = share.turns.entry(tenant.clone()).or_default();
                let clock = turns.clock;
                let p = (turns.passes.entry(turn.to_owned())).or_insert_with(|| {
                    changed = true;
                    clock
                });
                if *p < clock {
                    *p = clock;
                    changed = true;
                }
                *p
            };
            if changed && let Some(d) = self.dirty.as_deref_mut() {
                d.shares.insert(key);
            }
            (pass, turn_pass)
        } else {
            let share = self.shares.get(&key);
            (
                share.map_or(0, |s| s.pass(tenant)),
                share.map_or(0, |s| s.turn_pass(tenant, turn)),
            )
        };
        let weight = self.weight(tenant);
        (self.lane_heads)
            .entry(pool.to_owned())
            .or_default()
            .insert(head, pass, weight, turn_pass);
    }

    /// Removes a head from the ones a pass over `pool` walks; false when it was not there.
    fn drop_head(&mut self, pool: &str, head: &(QueueKey, Lane)) -> bool {
        let weight = self.weight(&head.1.tenant);
        let Some(heads) = self.lane_heads.get_mut(pool) else {
            return false;
        };
        let removed = heads.remove(head, weight);
        if heads.is_empty() {
            self.lane_heads.remove(pool);
        }
        removed
    }

    fn weight(&self, tenant: &str) -> u32 {
        self.rules.map_or(1, |r| r.share_weight(tenant))
    }

    /// Adds `delta` to a key's active jobs, then parks its groups that reached their limit
    /// and brings back those below it ([`Indexes::recheck_key`]).
    fn count_key(&mut self, tenant: &str, key: &str, delta: i64) {
        let counts = self.key_active.entry(tenant.to_owned()).or_default();
        let n = counts.entry(key.to_owned()).or_default();
        *n += delta;
        if *n <= 0 {
            counts.remove(key);
            if counts.is_empty() {
                self.key_active.remove(tenant);
            }
        }
        self.recheck_key(tenant, key);
    }

    /// Parks a key's groups that are held (at their limit, or their rate spent) and brings
    /// back those that are not (their pools are `woken`, for the decider to pass).
    fn recheck_key(&mut self, tenant: &str, key: &str) {
        let Some(groups) = self.groups_of_key.get(&(tenant.to_owned(), key.to_owned())) else {
            return;
        };
        for (pool, limits) in groups.clone() {
            let group_key = (pool.clone(), tenant.to_owned(), limits.clone());
            let Some(first) = self
                .key_groups
                .get(&group_key)
                .and_then(|g| g.first())
                .cloned()
            else {
                continue;
            };
            let held = held(self.key_active, self.buckets, self.clock, tenant, &limits);
            if held && self.drop_head(&pool, &first) {
                self.parked.entry(pool).or_default().insert(first);
            } else if !held && remove_head(self.parked, &pool, &first) {
                self.add_head(&pool, first);
                self.woken.insert(pool);
            }
        }
    }

    /// Whether a group of `tenant`'s key with these limits is held now.
    fn held(&self, tenant: &str, limits: &KeyLimit) -> bool {
        held(self.key_active, self.buckets, self.clock, tenant, limits)
    }

    fn join_worker(&mut self, id: &str, worker_id: &str) {
        match self.workers.get_mut(worker_id) {
            Some(w) => {
                w.inflight.insert(id.to_owned());
            }
            None => {
                self.orphans
                    .entry(worker_id.to_owned())
                    .or_default()
                    .insert(id.to_owned());
            }
        }
    }

    fn leave_worker(&mut self, id: &str, worker_id: &str) {
        match self.workers.get_mut(worker_id) {
            Some(w) => {
                w.inflight.remove(id);
            }
            None => {
                if let Some(set) = self.orphans.get_mut(worker_id) {
                    set.remove(id);
                    if set.is_empty() {
                        self.orphans.remove(worker_id);
                    }
                }
            }
        }
    }
}

/// Removes a lane head from a pool's set; false when it was not there.
fn remove_head(
    map: &mut BTreeMap<String, std::collections::BTreeSet<(QueueKey, Lane)>>,
    pool: &str,
    entry: &(QueueKey, Lane),
) -> bool {
    let Some(set) = map.get_mut(pool) else {
        return false;
    };
    let removed = set.remove(entry);
    if set.is_empty() {
        map.remove(pool);
    }
    removed
}

/// Whether a key's jobs with these limits are held now: the key has as many active jobs as
/// the limit allows, or a rate and a bucket that frees later than `clock`.
fn held(
    key_active: &BTreeMap<String, BTreeMap<String, i64>>,
    buckets: &BTreeMap<BucketKey, Bucket>,
    clock: Millis,
    tenant: &str,
    limits: &KeyLimit,
) -> bool {
    let at_limit = (key_active.get(tenant))
        .and_then(|k| k.get(&limits.key))
        .is_some_and(|n| *n >= i64::from(limits.limit));
    at_limit
        || limits.rate.is_some_and(|rate| {
            (buckets.get(&(tenant.to_owned(), limits.key.clone(), rate)))
                .is_some_and(|b| b.free_at() > clock)
        })
}

/// What of a job may not change while it lives: the indexes file it by these.
#[cfg(debug_assertions)]
fn fixed_keys(job: &Job) -> (Vec<String>, String, u8) {
    (
        job.pools.clone(),
        job.request.tenant_id.clone(),
        job.request.priority.rank(),
    )
}

impl State {
    /// The derived indexes and the job records, borrowed apart.
    fn split(&mut self) -> (&mut super::JobMap, Indexes<'_>, Option<&Rules>, Millis) {
        let State {
            jobs,
            queued,
            lanes,
            lane_heads,
            shares,
            parked,
            key_active,
            key_live,
            key_groups,
            groups_of_key,
            buckets,
            clock,
            woken,
            timers,
            waits,
            tenant_active,
            tenant_pending,
            waiting_by_reason,
            workers,
            orphans,
            config,
            liveness_floor,
            dirty,
            backlog,
            ..
        } = self;
        let window = super::window_of(config.as_deref().map(|c| &c.rules));
        let keep = super::backlog::keep_of(config.as_deref().map(|c| &c.rules));
        (
            jobs,
            Indexes {
                queued,
                lanes,
                lane_heads,
                shares,
                rules: config.as_deref().map(|c| &c.rules),
                seeding: true,
                dirty: dirty.as_mut(),
                parked,
                key_active,
                key_live,
                key_groups,
                groups_of_key,
                buckets,
                clock: *clock,
                woken,
                timers,
                waits,
                tenant_active,
                tenant_pending,
                waiting_by_reason,
                workers,
                orphans,
                backlog,
                window,
                keep,
            },
            config.as_deref().map(|c| &c.rules),
            *liveness_floor,
        )
    }

    /// Changes a job and keeps every index that derives from it in step: the job is looked
    /// up once, and only the index entries that differ are moved.
    pub(crate) fn update_job<R>(&mut self, id: &str, f: impl FnOnce(&mut Job) -> R) -> Option<R> {
        self.update_job_logged(id, None, f)
    }

    /// [`State::update_job`], then `line` appended to the job's history as
    /// [`State::write_history`] does, with the same lookup (most events do both).
    pub(crate) fn update_job_logged<R>(
        &mut self,
        id: &str,
        line: Option<Line<'_>>,
        f: impl FnOnce(&mut Job) -> R,
    ) -> Option<R> {
        let (jobs, mut ix, rules, floor) = self.split();
        let job = jobs.get_mut(id)?;
        let before_state = job.state;
        let before_delay = super::delay_key_of(id, job);
        let before_dependents = super::dependent_keys_of(id, job);
        let pool = job.pool.clone().filter(|_| before_state.is_active());
        let before = Entries::of(id, job, rules, floor, ix.workers);
        #[cfg(debug_assertions)]
        let fixed = fixed_keys(job);
        #[cfg(debug_assertions)]
        let lane = job.queued_at.map(|_| crate::decide::lane_of(job));
        let r = f(job);
        #[cfg(debug_assertions)]
        debug_assert_eq!(
            fixed,
            fixed_keys(job),
            "job {id}: pools, tenant and priority are fixed"
        );
        #[cfg(debug_assertions)]
        debug_assert!(
            job.queued_at.is_none() || lane.is_none() || lane == Some(crate::decide::lane_of(job)),
            "job {id}: its lane is fixed while it is queued"
        );
        let after = Entries::of(id, job, rules, floor, ix.workers);
        if before != after {
            ix.change(id, job, &before, &after);
        }
        let after_state = job.state;
        let after_delay = super::delay_key_of(id, job);
        let after_dependents = super::dependent_keys_of(id, job);
        // An ended job that is waited for settles; one that ends otherwise before its
        // dependents are told (SUCCEEDED, then OUTPUT_QUARANTINED) tells them that.
        let settles = (job.awaited && after_state.is_terminal() && after_state != before_state)
            .then(|| job.request.tenant_id.clone());
        // A batch member's end counts in its batch.
        let batch_end = (job.request.batch_id.clone())
            .filter(|_| after_state.is_terminal() && after_state != before_state)
            .map(|b| ((job.request.tenant_id.clone(), b), job.accepted_at));
        if let Some(line) = line {
            let seq = next_history_seq(job, line.event.name());
            self.push_line(id, seq, line);
        }
        self.mark_job(id);
        if before_delay != after_delay {
            if let Some(key) = before_delay {
                self.delay_remove(key);
            }
            if let Some(key) = after_delay {
                self.delay_insert(key);
            }
        }
        if before_dependents != after_dependents {
            self.move_dependents(before_dependents, after_dependents);
        }
        if let Some(tenant) = settles {
            self.begin_settling(id, &tenant, after_state);
        }
        if let Some((key, accepted_at)) = batch_end {
            self.count_batch_member(key, accepted_at, before_state, after_state);
        }
        if after_state != before_state {
            self.count_state(before_state, -1);
            self.count_state(after_state, 1);
            if after_state.is_cold() {
                self.cold.insert(id.to_owned());
            }
            if !after_state.is_active()
                && let Some(pool) = pool
            {
                self.free_probe(&pool, id);
            }
        }
        Some(r)
    }

    /// Appends a line to job `id`'s history (nothing for an unknown job). The line goes out
    /// with the dirty keys; the job keeps only counters. A run of progress keeps its latest
    /// line; past [`HISTORY_MAX`] lines, the last slot keeps the latest and the others
    /// between are counted as omitted (the journal has every event: `ksched audit job`).
    pub(crate) fn write_history(&mut self, id: &str, line: Line<'_>) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        let seq = next_history_seq(job, line.event.name());
        self.mark_job(id);
        self.push_line(id, seq, line);
    }

    /// Adds line `seq` of job `id` to the changed keys, when they are tracked.
    fn push_line(&mut self, id: &str, seq: u32, line: Line<'_>) {
        if let Some(d) = self.dirty.as_mut() {
            d.history
                .push_with(id, seq, line.at, line.event.name(), |text| {
                    line.event.describe_into(line.input, text);
                });
        }
    }

    /// A half-open breaker's probe ended (any way): its slot is free again.
    fn free_probe(&mut self, pool: &str, job_id: &str) {
        if let Some(b) = self.breakers.get_mut(pool)
            && b.probes.remove(job_id)
        {
            self.mark_breaker(pool);
        }
    }

    /// Adds a worker's record; it takes over the jobs already naming it.
    pub(crate) fn insert_worker(&mut self, id: &str, mut worker: Worker) {
        worker.inflight = self.orphans.remove(id).unwrap_or_default();
        self.count_worker(&worker.heartbeat.pool, 1);
        if let Some(old) = self.workers.insert(id.to_owned(), worker) {
            self.count_worker(&old.heartbeat.pool, -1);
        }
    }

    /// A worker's record names `to` from now on instead of `from`.
    pub(crate) fn move_worker(&mut self, from: &str, to: &str) {
        if from != to {
            self.count_worker(from, -1);
            self.count_worker(to, 1);
        }
    }

    fn count_worker(&mut self, pool: &str, delta: i32) {
        let n = self.workers_by_pool.entry(pool.to_owned()).or_default();
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            self.workers_by_pool.remove(pool);
        }
    }

    /// Drops a worker's record; jobs still naming it stay indexed as orphans.
    pub(crate) fn remove_worker(&mut self, id: &str) -> Option<Worker> {
        let mut w = self.workers.remove(id)?;
        self.count_worker(&w.heartbeat.pool, -1);
        let inflight = std::mem::take(&mut w.inflight);
        if !inflight.is_empty() {
            self.orphans.insert(id.to_owned(), inflight);
        }
        Some(w)
    }

    fn count_state(&mut self, state: JobState, delta: i64) {
        let n = self.jobs_by_state.entry(state).or_default();
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            self.jobs_by_state.remove(&state);
        }
    }

    /// Adds a job (replacing one with the same id), with `line` as its first history line
    /// ([`State::write_history`]). The job is indexed before it goes into the map (the
    /// indexes read only the record), so a new job costs one lookup in the map.
    pub(crate) fn insert_job(&mut self, id: String, mut job: Job, line: Option<Line<'_>>) {
        if let Some(old) = self.jobs.get(&id).map(|j| j.state) {
            self.unindex_job(&id);
            self.count_state(old, -1);
        }
        self.count_state(job.state, 1);
        if job.state.is_cold() {
            self.cold.insert(id.clone());
        }
        if let Some(line) = line {
            let seq = next_history_seq(&mut job, line.event.name());
            self.push_line(&id, seq, line);
        }
        self.mark_job(&id);
        // A batch member is indexed under its batch from its acceptance.
        for key in super::dependent_keys_of(&id, &job) {
            self.dependents.insert(key);
        }
        let (jobs, mut ix, rules, floor) = self.split();
        let entries = Entries::of(&id, &job, rules, floor, ix.workers);
        ix.change(&id, &job, &Entries::none(), &entries);
        jobs.insert(id, Box::new(job));
    }

    pub(crate) fn index_job(&mut self, id: &str) {
        let (jobs, mut ix, rules, floor) = self.split();
        let Some(job) = jobs.get(id) else { return };
        let entries = Entries::of(id, job, rules, floor, ix.workers);
        ix.change(id, job, &Entries::none(), &entries);
        let keys = super::dependent_keys_of(id, job);
        for key in keys {
            self.dependents.insert(key);
        }
    }

    pub(crate) fn unindex_job(&mut self, id: &str) {
        let (jobs, mut ix, rules, floor) = self.split();
        let Some(job) = jobs.get(id) else { return };
        let entries = Entries::of(id, job, rules, floor, ix.workers);
        ix.change(id, job, &entries, &Entries::none());
        let keys = super::dependent_keys_of(id, job);
        for key in &keys {
            self.dependents.remove(key);
        }
    }

    /// After new rules that index queued jobs as `old` did ([`Rules::reindex_queued`]): each
    /// job in memory whose entries differ under the new rules (its timers) is re-indexed,
    /// and the lanes' heads weigh their tenants by the new weights. The queued jobs' entries
    /// are the same under both, so the lanes, their counts and the queued timers stay as
    /// they are, in memory and in storage: what a rebuild would give, without reading the
    /// backlog back.
    pub(crate) fn reindex_under(&mut self, old: &Rules) {
        let (jobs, mut ix, rules, floor) = self.split();
        for (id, job) in jobs.iter_any_order() {
            let before = Entries::of(id, job, Some(old), floor, ix.workers);
            let after = Entries::of(id, job, rules, floor, ix.workers);
            if before != after {
                ix.change(id, job, &before, &after);
            }
        }
        let Some(rules) = self.config.as_deref().map(|c| &c.rules) else {
            return;
        };
        for heads in self.lane_heads.values_mut() {
            heads.reweigh(|tenant| rules.share_weight(tenant));
        }
    }

    /// Rebuilds every derived index from the records (after new rules change the timers, and
    /// after loading records from storage).
    pub fn rebuild_indexes(&mut self) {
        let none = std::iter::empty::<Result<(String, Job), std::convert::Infallible>>();
        self.rebuild_indexes_with(none)
            .unwrap_or_else(|never| match never {});
    }

    /// [`State::rebuild_indexes`] from the records in memory and those of `more` (a start
    /// streams the unfinished jobs that are not queued from storage, then restores the
    /// queued ones' counts: [`State::restore_queued`]). Queued records past every lane's window
    /// leave memory as they come when the backlog evicts ([`super::Backlog`]): jobs only
    /// join the queues here, so a job past a window stays past it.
    pub fn rebuild_indexes_with<E>(
        &mut self,
        more: impl IntoIterator<Item = Result<(String, Job), E>>,
    ) -> Result<(), E> {
        /// Records indexed between two looks for queued ones past every window.
        const EVICT_EVERY: usize = 16_384;
        self.queued.clear();
        let before = std::mem::take(&mut self.lanes);
        self.lane_heads.clear();
        self.parked.clear();
        self.key_active.clear();
        self.key_live.clear();
        self.key_groups.clear();
        self.groups_of_key.clear();
        self.bucket_changes = (self.buckets.iter())
            .map(|(k, b)| (b.next_change(self.clock), k.clone()))
            .collect();
        self.timers.clear();
        let waits_before = std::mem::take(&mut self.waits);
        self.tenant_active.clear();
        self.tenant_pending.clear();
        self.waiting_by_reason.clear();
        self.orphans.clear();
        self.workers_by_pool.clear();
        self.backlog.forget();
        self.index_schedules();
        self.index_debounces();
        for w in self.workers.values_mut() {
            w.inflight.clear();
            *self
                .workers_by_pool
                .entry(w.heartbeat.pool.clone())
                .or_default() += 1;
        }
        self.cold = (self.jobs.iter_any_order())
            .filter(|(_, j)| j.state.is_cold())
            .map(|(id, _)| id.to_owned())
            .collect();
        self.dependents.reset(
            (self.jobs.iter_any_order()).flat_map(|(id, j)| super::dependent_keys_of(id, j)),
        );
        // Each job's index entries go into ordered sets and counts: the order does not show.
        let (jobs, mut ix, rules, floor) = self.split();
        ix.seeding = false;
        for (id, job) in jobs.iter_any_order() {
            let entries = Entries::of(id, job, rules, floor, ix.workers);
            ix.change(id, job, &Entries::none(), &entries);
        }
        let mut streamed = 0;
        for item in more {
            let (id, job) = item?;
            if self.jobs.contains_key(&id) {
                continue;
            }
            if job.state.is_cold() {
                self.cold.insert(id.clone());
            }
            for key in super::dependent_keys_of(&id, &job) {
                self.dependents.insert(key);
            }
            let (jobs, mut ix, rules, floor) = self.split();
            ix.seeding = false;
            let entries = Entries::of(&id, &job, rules, floor, ix.workers);
            ix.change(&id, &job, &Entries::none(), &entries);
            jobs.insert(id, Box::new(job));
            streamed += 1;
            if streamed % EVICT_EVERY == 0 {
                self.evict_spare(None);
            }
        }
        if streamed > 0 {
            self.evict_spare(None);
        }
        self.seed_missing_passes();
        self.note_lanes_left(before);
        self.note_waits_changed(&waits_before);
        Ok(())
    }

    /// How this state's lanes disagree with those of `whole`, a state that holds every key
    /// (tests): see [`super::LaneJobs::problems_against`].
    pub fn lane_problems(&self, whole: &State) -> Vec<String> {
        let mut problems = Vec::new();
        let lanes = |s: &State| -> Vec<(String, Lane)> {
            (s.lanes.iter())
                .flat_map(|(p, l)| l.keys().map(move |lane| (p.clone(), lane.clone())))
                .collect()
        };
        if lanes(self) != lanes(whole) {
            problems.push("the lanes differ".to_owned());
        }
        for (pool, of_pool) in &whole.lanes {
            for (lane, all) in of_pool {
                let Some(mine) = self.lanes.get(pool).and_then(|l| l.get(lane)) else {
                    continue;
                };
                for p in mine.problems_against(all.head()) {
                    problems.push(format!("a lane of {pool} ({}): {p}", lane.tenant));
                }
            }
        }
        problems
    }

    /// How this state's queued timers disagree with those of `whole`, a state that holds
    /// every one (tests): see [`super::Stored::problems_against`].
    pub fn wait_problems(&self, whole: &State) -> Vec<String> {
        let mut problems = Vec::new();
        for ((kind, mine), (_, all)) in self.waits.each().zip(whole.waits.each()) {
            for p in mine.problems_against(all.head()) {
                problems.push(format!("{kind:?} timers: {p}"));
            }
        }
        problems
    }

    /// Keys read back into a lane: a lane whose head was not known (which an entry never
    /// leaves, see [`super::backlog::keep_of`]) stands in the passes again.
    pub(super) fn lane_read_back(
        &mut self,
        pool: &str,
        lane: &Lane,
        first_before: Option<QueueKey>,
    ) {
        let first =
            (self.lanes.get(pool).and_then(|l| l.get(lane))).and_then(|k| k.first().cloned());
        if first != first_before {
            let (_, mut ix, _, _) = self.split();
            // A lane whose head was not known (a start reads none) stands in the passes as
            // a rebuild would put it there: at its tenant's pass as stored, which the lane
            // had before ([`State::seed_missing_passes`] seeds one none stored).
            ix.seeding = first_before.is_some();
            ix.move_head(pool, lane, first_before, first);
        }
    }

    /// After a rebuild (new rules): the entries of the lanes `before` that the rebuilt
    /// lanes no longer hold go from the store's lane index, with the records that changed,
    /// and every lane's count is written again.
    /// Every lane is whole here: what rebuilds reads the backlog back first
    /// ([`State::load_queued`]); a start begins with no lanes.
    fn note_lanes_left(&mut self, before: BTreeMap<String, BTreeMap<Lane, super::LaneJobs>>) {
        let Some(dirty) = self.dirty.as_mut() else {
            return;
        };
        // Every lane's count is written again: lanes come and go with new rules.
        for (pool, lanes) in &self.lanes {
            for lane in lanes.keys() {
                dirty.count_lane(pool, lane);
            }
        }
        for (pool, lanes) in before {
            for (lane, keys) in lanes {
                debug_assert!(keys.is_whole(), "a lane of {pool} rebuilt while partial");
                dirty.count_lane(&pool, &lane);
                let now = self.lanes.get(&pool).and_then(|l| l.get(&lane));
                for key in keys.head().iter().chain(keys.beyond()) {
                    if !now.is_some_and(|n| n.head().contains(key) || n.beyond().contains(key)) {
                        dirty
                            .lanes_removed
                            .push((pool.clone(), lane.clone(), key.clone()));
                    }
                }
            }
        }
    }

    /// After a rebuild (new rules, which may move or end aging steps): the queued timers
    /// `before` that the rebuilt indexes no longer hold go from the store's index, and the
    /// jobs of those and of those they hold anew are written again (with their timers).
    /// Every index is whole here, as every lane is ([`State::note_lanes_left`]), but at a
    /// start, which knows none before (every one it indexes is in the store).
    fn note_waits_changed(&mut self, before: &super::Waits) {
        if self.dirty.is_none() || before.each().any(|(_, s)| !s.is_whole()) {
            return;
        }
        let mut rewrite = Vec::new();
        for (kind, old) in before.each() {
            let Some(now) = self.waits.of(kind) else {
                continue;
            };
            let held = |s: &super::Stored<super::TimerAt>, k: &super::TimerAt| {
                s.head().contains(k) || s.beyond().contains(k)
            };
            let gone: Vec<(TimerKind, super::TimerAt)> = (old.head().iter().chain(old.beyond()))
                .filter(|k| !held(now, k))
                .map(|k| (kind, k.clone()))
                .collect();
            // The job of a timer gone stays in memory until the store's entry is deleted
            // (a changed record is not let go before it is written): a read back meanwhile
            // finds the job in memory and passes the stale entry over.
            rewrite.extend(gone.iter().map(|(_, k)| k.job_id.clone()));
            if let Some(d) = self.dirty.as_mut() {
                d.waits_removed.extend(gone);
            }
            rewrite.extend(
                (now.head().iter().chain(now.beyond()))
                    .filter(|k| !held(old, k))
                    .map(|k| k.job_id.clone()),
            );
        }
        for id in rewrite {
            self.mark_job(&id);
        }
    }

    /// After a clock gap: evidence-based timeouts (placement, dispatch, running) count from
    /// `to` at the earliest. Each such timer in memory (dispatch, running) stands at its
    /// start (or the floor, if later) plus its timeout, so it moves to the later of where it
    /// stands and `to` plus its timeout: the timers alone say so. Queued jobs' placement
    /// timeouts are judged against the floor when they fire ([`super::due_of`]): none moves.
    pub(crate) fn raise_liveness_floor(&mut self, to: Millis) {
        let floor = self.liveness_floor.max(to);
        self.liveness_floor = floor;
        let Some(timing) = self.rules().map(|r| r.timing.clone()) else {
            return;
        };
        let timeout = |kind: TimerKind| floor_timeout(kind, Some(&timing));
        let early: Vec<Timer> = (self.timers.iter())
            .filter(|t| timeout(t.kind).is_some_and(|d| t.due < floor.saturating_add(d)))
            .cloned()
            .collect();
        for mut t in early {
            self.timers.remove(&t);
            t.due = floor.saturating_add(timeout(t.kind).unwrap_or(0));
            self.timers.insert(t);
        }
    }

    /// Gives each queued or active job the concurrency key and limit of the rules now in
    /// force (after a Reconfigure; the indexes are rebuilt next), so a limit added while a
    /// key's jobs run counts them.
    pub(crate) fn resolve_queued_concurrency(&mut self) {
        let Some(config) = self.config.clone() else {
            return;
        };
        let mut changed = Vec::new();
        for (id, job) in self.jobs.iter_any_order_mut() {
            if job.queued_at.is_none() && !job.state.is_active() && job.retry_at.is_none() {
                continue;
            }
            let now = job.concurrency_under(&config.rules);
            if now != job.concurrency {
                job.concurrency = now;
                changed.push(id.to_owned());
            }
        }
        for id in changed {
            self.mark_job(&id);
        }
    }

    /// A job of `tenant` with these limits was placed now: it takes a token of its key's
    /// bucket under its rate, which may hold the key's groups until the bucket frees.
    pub(crate) fn take_token(&mut self, tenant: &str, limits: &KeyLimit) {
        let Some(rate) = limits.rate else { return };
        let k: BucketKey = (tenant.to_owned(), limits.key.clone(), rate);
        let now_us = self.clock.saturating_mul(1_000);
        if let Some(old) = self.buckets.get(&k) {
            let old_change = old.next_change(self.clock);
            self.bucket_changes.remove(&(old_change, k.clone()));
        }
        let b = self.buckets.entry(k.clone()).or_insert(Bucket {
            next_token_us: now_us,
            tolerance_us: 0,
        });
        b.next_token_us = b
            .next_token_us
            .max(now_us)
            .saturating_add(rate.interval_us());
        b.tolerance_us = rate.tolerance_us();
        let change = b.next_change(self.clock);
        self.bucket_changes.insert((change, k.clone()));
        self.mark_bucket(&k);
        let (_, mut ix, _, _) = self.split();
        ix.recheck_key(tenant, &limits.key);
    }

    /// At the start of an entry, once the clock moved: buckets whose time came free their
    /// keys' groups (their pools `woken`) or, full again, are forgotten.
    pub(crate) fn advance_buckets(&mut self) {
        while let Some(first) = self.bucket_changes.first()
            && first.0 <= self.clock
        {
            let Some((_, k)) = self.bucket_changes.pop_first() else {
                break;
            };
            if let Some(b) = self.buckets.get(&k) {
                if b.full_at() <= self.clock {
                    self.buckets.remove(&k);
                    self.mark_bucket(&k);
                } else {
                    let change = b.next_change(self.clock);
                    self.bucket_changes.insert((change, k.clone()));
                }
            }
            let (_, mut ix, _, _) = self.split();
            ix.recheck_key(&k.0, &k.1);
        }
    }

    /// Every job waiting in `pool`'s queue, in queue order (priority, then when queued, then
    /// id): its lanes merged. A walk of the whole queue, for tests, on states that hold
    /// every key (an evicting one holds each lane's first keys only).
    pub fn queue_order(&self, pool: &str) -> Vec<QueueKey> {
        debug_assert!(
            (self.lanes.get(pool).into_iter())
                .flat_map(|l| l.values())
                .all(|l| l.is_whole()),
            "the queue of {pool} is walked whole only where every key is in memory"
        );
        let mut keys: Vec<QueueKey> = (self.lanes.get(pool).into_iter())
            .flat_map(|lanes| lanes.values())
            .flat_map(|l| l.head().iter().chain(l.beyond()).cloned())
            .collect();
        keys.sort_unstable();
        keys
    }

    /// Active jobs of a concurrency key of a tenant.
    pub fn key_active_jobs(&self, tenant: &str, key: &str) -> i64 {
        (self.key_active.get(tenant))
            .and_then(|k| k.get(key))
            .copied()
            .unwrap_or(0)
    }

    /// Active jobs of a tenant (SCHEDULED + DISPATCHED + RUNNING).
    pub fn tenant_active_jobs(&self, tenant: &str) -> i64 {
        self.tenant_active.get(tenant).copied().unwrap_or(0)
    }

    /// Checks the derived indexes against the records; returns what disagrees. For a state
    /// that holds every record (tests): one whose queued records wait in storage
    /// ([`super::Backlog`]) rebuilds indexes without them.
    pub fn check_invariants(&self) -> Vec<String> {
        let mut problems = self.schedule_problems();
        let mut rebuilt = self.clone();
        rebuilt.dirty = None;
        rebuilt.rebuild_indexes();
        if rebuilt.queued != self.queued {
            problems.push("pending queues disagree with job records".to_owned());
        }
        if rebuilt.bucket_changes != self.bucket_changes {
            problems.push("rate limit timers disagree with the buckets".to_owned());
        }
        if rebuilt.key_active != self.key_active || rebuilt.key_live != self.key_live {
            problems.push("concurrency key counts disagree with job records".to_owned());
        }
        if rebuilt.lanes != self.lanes
            || rebuilt.lane_heads != self.lane_heads
            || rebuilt.parked != self.parked
            || rebuilt.key_groups != self.key_groups
            || rebuilt.groups_of_key != self.groups_of_key
        {
            problems.push("queue lanes disagree with job records".to_owned());
        }
        if rebuilt.timers != self.timers || rebuilt.waits != self.waits {
            problems.push("timers disagree with job records".to_owned());
        }
        if rebuilt.tenant_active != self.tenant_active {
            problems.push("tenant active counts disagree with job records".to_owned());
        }
        if rebuilt.tenant_pending != self.tenant_pending {
            problems.push("tenant pending counts disagree with job records".to_owned());
        }
        if rebuilt.waiting_by_reason != self.waiting_by_reason {
            problems.push("waiting counts per reason disagree with job records".to_owned());
        }
        if rebuilt.orphans != self.orphans {
            problems.push("jobs of unknown workers disagree with job records".to_owned());
        }
        if rebuilt.workers_by_pool != self.workers_by_pool {
            problems.push("worker counts per pool disagree with worker records".to_owned());
        }
        for (id, w) in &self.workers {
            if rebuilt.workers.get(id).map(|r| &r.inflight) != Some(&w.inflight) {
                problems.push(format!(
                    "in-flight set of worker {id} disagrees with job records"
                ));
            }
        }
        for id in self.jobs.ids_sorted() {
            let job = &self.jobs[&id];
            if job.state.is_terminal() && (job.queued_at.is_some() || job.retry_at.is_some()) {
                problems.push(format!("job {id} is {} and still queued", job.state));
            }
            if job.queued_at.is_some() && job.state != JobState::Pending {
                problems.push(format!("job {id} is queued in state {}", job.state));
            }
        }
        for (t, n) in &self.tenant_active {
            if *n < 0 {
                problems.push(format!("tenant {t} has {n} active jobs"));
            }
        }
        self.check_delays(&mut problems);
        // Jobs in queues or on workers are always in memory, so their counts must match
        // exactly; terminal and delayed counts may exceed what memory holds.
        let mut counted: BTreeMap<JobState, u64> = BTreeMap::new();
        for (_, j) in self.jobs.iter_any_order() {
            *counted.entry(j.state).or_default() += 1;
        }
        for st in JobState::ALL {
            let have = counted.get(&st).copied().unwrap_or(0);
            let kept = self.jobs_by_state.get(&st).copied().unwrap_or(0);
            if (!st.is_cold() && have != kept) || (st.is_cold() && have > kept) {
                problems.push(format!("{kept} jobs counted {st}, {have} present"));
            }
        }
        problems
    }
}

/// The timeout a timer of `kind` counts from the liveness floor with ([`each_timer`]), if it
/// is one of those.
pub(super) fn floor_timeout(
    kind: TimerKind,
    timing: Option<&crate::rules::Timing>,
) -> Option<Millis> {
    let timing = timing?;
    match kind {
        TimerKind::PlacementTimeout => Some(timing.placement_timeout_ms),
        TimerKind::DispatchTimeout => Some(timing.dispatch_timeout_ms),
        TimerKind::RunningTimeout => Some(timing.running_timeout_ms),
        _ => None,
    }
}

/// The number of the history line `event` writes for `job`, counted in the job (see
/// [`State::write_history`]).
fn next_history_seq(job: &mut Job, event: &str) -> u32 {
    let progress = event == "JobProgressed";
    let seq = if progress && job.history_progress && job.history_lines > 0 {
        job.history_lines - 1
    } else if job.history_lines >= HISTORY_MAX {
        job.history_omitted = job.history_omitted.saturating_add(1);
        HISTORY_MAX - 1
    } else {
        job.history_lines += 1;
        job.history_lines - 1
    };
    job.history_progress = progress;
    seq
}

fn decrement(counts: &mut BTreeMap<String, i64>, key: &str) {
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n <= 0 {
            counts.remove(key);
        }
    }
}

/// When the job's worker last listed it as running, if its latest heartbeat does.
fn evidence(workers: &BTreeMap<String, Worker>, id: &str, job: &Job) -> Option<Millis> {
    let w = workers.get(job.worker_id.as_deref()?)?;
    w.heartbeat
        .active_job_ids
        .iter()
        .any(|j| j == id)
        .then_some(w.last_seen)
}

/// The timers a job has in its current state, as (due, kind, the time it counts from:
/// its start for a placement timeout, else its due time) triples: at most
/// [`MAX_TIMERS`]. Timeouts that wait for a sign of life count from `floor` at the earliest
/// (after a [`crate::events::ClockGap`]); `evidence` is when the job's worker last listed it
/// as running (heartbeats are evidence without rewriting the job). Deadlines, retry
/// backoffs and max runtimes are not evidence-based.
pub(super) fn each_timer(
    job: &Job,
    rules: &Rules,
    floor: Millis,
    evidence: Option<Millis>,
    mut each: impl FnMut(Millis, TimerKind, Millis),
) {
    // A delayed job's deadline counts from its release (SPEC §9): it has no timer while it
    // waits; its due time is in the delay window, not here.
    if job.state.is_terminal() || job.state.is_parked() {
        return;
    }
    let timing = &rules.timing;
    if let Some(d) = job.deadline_at {
        each(d, TimerKind::Deadline, d);
    }
    match job.state {
        JobState::Pending => {
            if let Some(r) = job.retry_at {
                each(r, TimerKind::RetryAt, r);
            }
            if let Some(q) = job.queued_at {
                // Started again while its concurrency key held it (SPEC §10). Kept by its
                // start (see `super::waits`).
                let from = q.max(job.placement_from.unwrap_or(q));
                each(
                    from.max(floor).saturating_add(timing.placement_timeout_ms),
                    TimerKind::PlacementTimeout,
                    from,
                );
                // Aging (SPEC §10): one priority per `after` waited since it was queued.
                if let Some(aging) = rules.aging_of(&job.pools)
                    && job.queue_rank() > aging.up_to.rank()
                {
                    let steps = i64::from(job.aged) + 1;
                    let due = q.saturating_add(aging.after_ms().saturating_mul(steps));
                    each(due, TimerKind::Aging, due);
                }
            }
        }
        JobState::Dispatched => {
            if let Some(d) = job.dispatched_at {
                let due = d.max(floor).saturating_add(timing.dispatch_timeout_ms);
                each(due, TimerKind::DispatchTimeout, due);
            }
        }
        JobState::Running => {
            if let Some(e) = job.last_evidence_at {
                let e = e.max(evidence.unwrap_or(e)).max(floor);
                let due = e.saturating_add(timing.running_timeout_ms);
                each(due, TimerKind::RunningTimeout, due);
            }
            if let (Some(s), Some(max)) = (job.started_at, job.max_runtime_ms()) {
                let due = s.saturating_add(max);
                each(due, TimerKind::MaxRuntime, due);
            }
        }
        _ => {}
    }
}
