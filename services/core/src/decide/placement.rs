//! Placement: the scheduling pass over pending queues (SPEC §3, §4, §5).
//!
//! A pass walks a pool's queue by priority, then fair share between tenants, then age (then
//! job_id), and places what it can. Gates come first (tenant limit, circuit breaker), then the common worker filters
//! (alive, pool, draining, dispatch partitions, placement labels, overload), then the pool's
//! strategy picks among the rest. The pass stops for a pool as soon as no worker of it can take
//! anything more: every job behind would fail the same way, so a full pool costs O(1) per
//! submission, not O(queue).

use std::collections::{BTreeMap, BTreeSet};

use crate::decide::Decider;
use crate::decide::breaker::breaker_blocks;
use crate::events::*;
use crate::reason::{DlqReason, WaitReason};
use crate::records::Heartbeat;
use crate::rules::{Overload, Rules};
use crate::state::{FairKey, Job, Lane, State, Walk, Worker};
use crate::strategy::{Assessment, Eligible, for_kind};

/// Most lanes of one tenant at one priority a pass finds held before it goes on to the
/// next tenant: a tenant at its limit with jobs of many lanes (each asking for other
/// labels, or memory) costs a pass this many looks, not its share of the pass's bound.
pub const GROUP_HELD_BOUND: u32 = 8;

/// Label naming the worker a job would like (SPEC §3.4).
pub(super) const LABEL_PREFERRED_WORKER: &str = "preferred_worker_id";
/// Job label prefixes that must equal the worker's label of the same name (SPEC §3.5).
pub(super) const PLACEMENT_PREFIXES: &[&str] = &["placement.", "constraint.", "node."];

/// Most candidates a placement event lists; the rest are counted (a pool of thousands of
/// workers must not make every placement event thousands of entries long).
pub const MAX_CANDIDATES: usize = 16;

/// The workers a placement considered, as journaled: at most [`MAX_CANDIDATES`], the best
/// scored first in line, and how many were left out.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Candidates {
    pub listed: Vec<Candidate>,
    pub omitted: i32,
}

impl Candidates {
    /// Bounds `all` (in evaluation order): when there are too many, keeps the scored ones
    /// with the best scores, then skipped ones, in their original order.
    fn bounded(all: Vec<Candidate>) -> Candidates {
        if all.len() <= MAX_CANDIDATES {
            return Candidates {
                listed: all,
                omitted: 0,
            };
        }
        let mut order: Vec<usize> = (0..all.len()).collect();
        order.sort_by(|a, b| {
            let key = |i: &usize| all[*i].score.unwrap_or(f64::INFINITY);
            key(a).total_cmp(&key(b)).then(a.cmp(b))
        });
        let mut keep: Vec<usize> = order.into_iter().take(MAX_CANDIDATES).collect();
        keep.sort_unstable();
        let omitted = i32::try_from(all.len() - keep.len()).unwrap_or(i32::MAX);
        let mut all: Vec<Option<Candidate>> = all.into_iter().map(Some).collect();
        Candidates {
            listed: keep.into_iter().filter_map(|i| all[i].take()).collect(),
            omitted,
        }
    }
}

/// Why a job could not be placed now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Blocked {
    pub code: WaitReason,
    pub detail: String,
    pub candidates: Candidates,
}

/// What placement would do for a job now.
enum Decision {
    Place {
        pool: String,
        worker_id: String,
        strategy: &'static str,
        candidates: Vec<Candidate>,
        notes: Vec<String>,
    },
    Blocked(Blocked),
}

/// How one pool fared for one job.
#[derive(Default)]
struct PoolOutcome {
    alive: usize,
    overloaded: usize,
}

impl Decider<'_, '_> {
    /// Runs a scheduling pass over each pool's queue, within the entry's work budget.
    ///
    /// A pass walks the heads of the pool's lanes ([`crate::state::Lane`]): by priority,
    /// then by fair share between the tenants of a priority (the one with the least of the
    /// pool for its weight first, [`crate::state::Heads`]), then in queue order within a
    /// tenant. Jobs of one lane are placed or held alike, so when a lane's first job is held
    /// the rest of it is passed over, and when it is placed the lane's next job comes up in
    /// its turn; a lane of 100,000 jobs held by their tenant's limit costs one look. A
    /// placement moves its tenant's pass on, so the walk goes back to the first tenant that
    /// still has a lane it has not found held. At most `limits.max_scan_per_entry` lanes are
    /// held per pool and pass (each look at one asks every worker of the pool), and at most
    /// [`GROUP_HELD_BOUND`] of one tenant at one priority; the ones behind wait for the next
    /// pass, which starts again at the head.
    pub(crate) fn schedule_pools(&mut self, pools: Vec<String>) {
        let pools: BTreeSet<String> = pools.into_iter().collect();
        let bound = self.rules().rules.limits.max_scan_per_entry.max(1);
        for pool in pools {
            self.maybe_half_open(&pool);
            // Groups before `after` in fair share order had every lane held; within a
            // group, lanes up to its cursor were held (a pass never frees capacity, and a
            // lane's next head comes after the job placed before it).
            let mut after: Option<FairKey> = None;
            let mut walks: BTreeMap<(String, u8), (Walk, u32)> = BTreeMap::new();
            let mut held = 0;
            // Whether the pool can take anything changes only with a placement.
            let mut full = self.pool_is_full(&pool);
            while !full {
                let Some(heads) = self.state().lane_heads.get(&pool) else {
                    break;
                };
                let Some(group) = heads.next_group(after.as_ref()).cloned() else {
                    break;
                };
                let (rank, _, _, tenant) = &group;
                let (walk, held_here) = walks.entry((tenant.clone(), *rank)).or_default();
                let next = (*held_here < GROUP_HELD_BOUND)
                    .then(|| heads.next_head(tenant, *rank, walk))
                    .flatten();
                let Some(head) = next else {
                    after = Some(group);
                    continue;
                };
                walk.tried(&head);
                if !self.may_work() {
                    return;
                }
                if self.try_place(&head.1.0.job_id) {
                    self.spend();
                    full = self.pool_is_full(&pool);
                    // The tenant's group moved: everything from where it stood, or now
                    // stands if that is sooner, is looked at again. (A placement that
                    // charged another pool, or a deadline, can leave the group's first
                    // head an older one of another turn.)
                    let heads = self.state().lane_heads.get(&pool);
                    let now = heads.and_then(|h| h.fair_key(tenant, *rank));
                    let from = now.filter(|n| *n < group).unwrap_or(group.clone());
                    after = heads.and_then(|h| h.group_before(&from));
                } else {
                    held += 1;
                    if let Some((_, n)) = walks.get_mut(&(tenant.clone(), *rank)) {
                        *n += 1;
                    }
                    if held >= bound {
                        break;
                    }
                }
            }
        }
    }

    /// True when no worker of the pool can take another job (or its circuit holds it).
    fn pool_is_full(&self, pool: &str) -> bool {
        let config = self.rules();
        let rules = &config.rules;
        if breaker_blocks(self.state(), rules, pool).is_some() {
            return true;
        }
        !self.state().workers.values().any(|w| {
            w.alive && w.heartbeat.pool == pool && common_skip(w, &rules.overload).is_none()
        })
    }

    /// Places one queued job if any of its pools has a worker for it (or ends it, if its
    /// deadline passed while it waited); true when the job left the queue.
    pub(super) fn try_place(&mut self, job_id: &str) -> bool {
        let config = self.rules();
        if let Some(deadline) = self.state().jobs[job_id].deadline_at
            && deadline <= self.now()
        {
            let detail = format!("deadline passed at {deadline} before the job could be placed");
            self.time_out(job_id, DlqReason::DeadlineExceeded, detail);
            return true;
        }
        // A lane no live worker of its pools matches (by placement labels) is held whatever
        // else holds: found without building the reasons `evaluate` gives every worker, as a
        // pass looks at such a lane again each time.
        if no_worker_fits_labels(self.state(), &self.state().jobs[job_id]) {
            return false;
        }
        match evaluate(self.state(), &config.rules, job_id) {
            Decision::Place {
                pool,
                worker_id,
                strategy,
                candidates,
                notes,
            } => {
                self.place(job_id, &pool, &worker_id, strategy, candidates, notes);
                true
            }
            Decision::Blocked(_) => false,
        }
    }

    /// Why a queued job is not placed now (used for JobWaiting and placement timeouts).
    pub(crate) fn blocker(&self, job_id: &str) -> Blocked {
        let config = self.rules();
        match evaluate(self.state(), &config.rules, job_id) {
            Decision::Blocked(b) => b,
            Decision::Place { .. } => Blocked {
                code: WaitReason::NoWorkers,
                detail: "placeable now; waiting for the next pass".into(),
                candidates: Candidates::default(),
            },
        }
    }

    /// Whether a queued job stands first among its key's jobs in one of its pools (what a
    /// pass tries of the key); true for a job without a key.
    pub(super) fn first_of_its_key(&self, job_id: &str) -> bool {
        let job = &self.state().jobs[job_id];
        let Some(c) = job.concurrency.as_ref().filter(|c| c.holds()) else {
            return true;
        };
        let lane = lane_of(job);
        job.pools.iter().any(|pool| {
            let group = (pool.clone(), lane.tenant.clone(), c.clone());
            (self.state().key_groups.get(&group))
                .and_then(|g| g.first())
                .is_some_and(|(q, _)| q.job_id == job_id)
        })
    }

    /// Why a keyed job that is not its key's oldest in any of its pools waits: its key's
    /// own reason if the key holds it, else the oldest before it.
    pub(super) fn behind_its_key(&self, job_id: &str) -> Blocked {
        let blocked = self.blocker(job_id);
        if blocked.code.is_flow_limit() {
            return blocked;
        }
        let job = &self.state().jobs[job_id];
        let key = job.concurrency.as_ref().map_or("", |c| c.key.as_str());
        Blocked {
            code: WaitReason::ConcurrencyLimited,
            detail: format!(
                "concurrency key {} of tenant {}: its older jobs in the same pools go first",
                key_name(key),
                job.request.tenant_id
            ),
            candidates: Candidates::default(),
        }
    }

    /// Why a queued job held by its concurrency key could not be placed even with a free
    /// slot (its pools have no worker for it, or their workers are full or their circuits
    /// open); None when a worker could take it.
    pub(crate) fn blocker_but_key(&self, job_id: &str) -> Option<Blocked> {
        let config = self.rules();
        match evaluate_with(self.state(), &config.rules, job_id, false) {
            Decision::Blocked(b) => Some(b),
            Decision::Place { .. } => None,
        }
    }

    fn place(
        &mut self,
        job_id: &str,
        pool: &str,
        worker_id: &str,
        strategy: &str,
        candidates: Vec<Candidate>,
        notes: Vec<String>,
    ) {
        let job = &self.state().jobs[job_id];
        let attempt = job.attempt + 1;
        let deadline_at = job.deadline_at;
        let partition = self.state().workers[worker_id]
            .heartbeat
            .owned_partitions
            .iter()
            .copied()
            .min()
            .unwrap_or(-1);
        let candidates = Candidates::bounded(candidates);
        let mut notes = notes;
        notes.extend(self.share_note(job, pool));
        self.emit(Event::JobScheduled(JobScheduled {
            job_id: job_id.to_owned(),
            attempt,
            pool: pool.to_owned(),
            worker_id: worker_id.to_owned(),
            strategy: strategy.to_owned(),
            candidates: candidates.listed,
            notes,
            candidates_omitted: candidates.omitted,
        }));
        self.emit(Event::JobDispatched(JobDispatched {
            job_id: job_id.to_owned(),
            attempt,
            pool: pool.to_owned(),
            worker_id: worker_id.to_owned(),
            partition,
            deadline_at,
        }));
    }
}

impl Decider<'_, '_> {
    /// What fair share said of a placement while other tenants (or other turns of its
    /// tenant) had jobs waiting in the pool at the job's priority, and the priority aging
    /// gave it (journaled with the placement, for `audit job`).
    fn share_note(&self, job: &Job, pool: &str) -> Vec<String> {
        let state = self.state();
        let rank = job.queue_rank();
        let priority = crate::records::Priority::of_rank(rank).as_str();
        let heads = state.lane_heads.get(pool);
        let tenant = &job.request.tenant_id;
        let units = |v: u128| v as f64 / crate::state::SHARE_UNIT as f64;
        let share = state.shares.get(&(pool.to_owned(), rank));
        let mut notes = Vec::new();
        if job.aged > 0 {
            notes.push(format!(
                "placed at {priority} priority, aged from {} while it waited",
                job.request.priority.as_str()
            ));
        }
        let tenants = heads.map_or(0, |h| h.tenants_at(rank));
        if tenants >= 2 {
            notes.push(format!(
                "fair share in pool {pool}: tenant {tenant} (weight {}) at pass {:.2}, clock {:.2}, {tenants} tenants waiting at {priority} priority",
                state.share_weight(tenant),
                units(state.share_pass(pool, rank, tenant)),
                units(share.map_or(0, |s| s.clock)),
            ));
        }
        let turns = heads.map_or(0, |h| h.turns_at(tenant, rank));
        if turns >= 2 {
            let turn = (job.concurrency.as_ref())
                .filter(|c| c.fair)
                .map_or("", |c| c.key.as_str());
            let clock = (share.and_then(|s| s.turns.get(tenant))).map_or(0, |t| t.clock);
            notes.push(format!(
                "turns of tenant {tenant} in pool {pool}: key {turn:?} at pass {:.2}, clock {:.2}, {turns} keys waiting",
                units(share.map_or(0, |s| s.turn_pass(tenant, turn))),
                units(clock),
            ));
        }
        notes
    }
}

/// Where a queued job would go now, or why it cannot go anywhere: a pure reading of the state,
/// so it also answers "why is it waiting" without side effects.
fn evaluate(state: &State, rules: &Rules, job_id: &str) -> Decision {
    evaluate_with(state, rules, job_id, true)
}

/// [`evaluate`], with or without the job's concurrency key as a gate.
fn evaluate_with(state: &State, rules: &Rules, job_id: &str, with_key: bool) -> Decision {
    let job = &state.jobs[job_id];
    let key = || with_key.then(|| key_blocks(state, job)).flatten();
    if let Some(blocked) = tenant_blocks(state, job).or_else(key) {
        return Decision::Blocked(blocked);
    }
    let mut notes = Vec::new();
    if let Some(preferred) = job.request.labels.get(LABEL_PREFERRED_WORKER) {
        match preferred_worker(state, rules, job, preferred) {
            Ok((pool, score)) => {
                notes.push(format!("preferred_worker_id {preferred} honoured"));
                let candidates = vec![Candidate {
                    worker_id: preferred.clone(),
                    pool: pool.clone(),
                    score: Some(score),
                    skipped: None,
                }];
                let strategy = for_kind(rules.strategy(&pool)).name();
                return Decision::Place {
                    pool,
                    worker_id: preferred.clone(),
                    strategy,
                    candidates,
                    notes,
                };
            }
            Err(why) => notes.push(format!("preferred_worker_id {preferred} ignored: {why}")),
        }
    }
    let mut candidates = Vec::new();
    let mut any_alive = 0;
    let mut any_overloaded = 0;
    let mut circuit: Option<String> = None;
    for pool in &job.pools {
        if let Some(why) = breaker_blocks(state, rules, pool) {
            circuit.get_or_insert(why);
            continue;
        }
        let (eligible, outcome) = eligible_workers(state, rules, job, pool, &mut candidates);
        any_alive += outcome.alive;
        any_overloaded += outcome.overloaded;
        if eligible.is_empty() {
            continue;
        }
        let strategy = for_kind(rules.strategy(pool));
        let (winner, assessments) = strategy.choose(job, &eligible);
        for (e, a) in eligible.iter().zip(&assessments) {
            candidates.push(match a {
                Assessment::Score(s) => scored(e, pool, Some(*s), None),
                Assessment::Unfit(why) => scored(e, pool, None, Some(why.clone())),
            });
        }
        if let Some(i) = winner {
            return Decision::Place {
                pool: pool.clone(),
                worker_id: eligible[i].worker_id.to_owned(),
                strategy: strategy.name(),
                candidates,
                notes,
            };
        }
        any_overloaded += assessments
            .iter()
            .filter(|a| matches!(a, Assessment::Unfit(_)))
            .count();
    }
    let pools = job.pools.join(", ");
    let candidates = Candidates::bounded(candidates);
    let blocked = if any_overloaded > 0 {
        Blocked {
            code: WaitReason::PoolOverloaded,
            detail: format!("every suitable worker in [{pools}] is at capacity"),
            candidates,
        }
    } else if let Some(why) = circuit.filter(|_| any_alive == 0) {
        Blocked {
            code: WaitReason::CircuitOpen,
            detail: why,
            candidates,
        }
    } else if any_alive == 0 {
        Blocked {
            code: WaitReason::NoWorkers,
            detail: format!("no live worker in [{pools}]"),
            candidates,
        }
    } else {
        Blocked {
            code: WaitReason::NoWorkers,
            detail: format!(
                "no live worker in [{pools}] matches the job's placement labels or can receive dispatches"
            ),
            candidates,
        }
    };
    Decision::Blocked(blocked)
}

fn scored(e: &Eligible<'_>, pool: &str, score: Option<f64>, skipped: Option<String>) -> Candidate {
    Candidate {
        worker_id: e.worker_id.to_owned(),
        pool: pool.to_owned(),
        score,
        skipped,
    }
}

/// Tenant `max_concurrent_jobs` (SPEC §5).
fn tenant_blocks(state: &State, job: &Job) -> Option<Blocked> {
    let limit = job.constraints.max_concurrent_jobs?;
    let active = state.tenant_active_jobs(&job.request.tenant_id);
    (active >= i64::from(limit)).then(|| Blocked {
        code: WaitReason::TenantLimit,
        detail: format!(
            "tenant {} has {active} active jobs, its limit is {limit}",
            job.request.tenant_id
        ),
        candidates: Candidates::default(),
    })
}

/// A concurrency key at its limit, or with its rate spent (SPEC §10).
fn key_blocks(state: &State, job: &Job) -> Option<Blocked> {
    let c = job.concurrency.as_ref()?;
    let tenant = &job.request.tenant_id;
    let active = state.key_active_jobs(tenant, &c.key);
    if active >= i64::from(c.limit) {
        return Some(Blocked {
            code: WaitReason::ConcurrencyLimited,
            detail: format!(
                "concurrency key {} of tenant {tenant} has {active} active jobs, its limit is {}",
                key_name(&c.key),
                c.limit
            ),
            candidates: Candidates::default(),
        });
    }
    let rate = c.rate?;
    let free_at = (state.buckets.get(&(tenant.clone(), c.key.clone(), rate)))
        .map(|b| b.free_at())
        .filter(|at| *at > state.clock)?;
    Some(Blocked {
        code: WaitReason::RateLimited,
        detail: format!(
            "concurrency key {} of tenant {tenant} has spent its rate ({rate}) until {free_at}",
            key_name(&c.key),
        ),
        candidates: Candidates::default(),
    })
}

/// A concurrency key as messages name it (`""` is the whole tenant's).
pub(crate) fn key_name(key: &str) -> String {
    if key.is_empty() {
        "(the tenant's)".to_owned()
    } else {
        format!("{:?}", crate::records::truncate_for_display(key, 64))
    }
}

/// Why a live worker cannot take any job now, whatever the job.
fn common_skip(w: &Worker, overload: &Overload) -> Option<String> {
    let hb: &Heartbeat = &w.heartbeat;
    if hb.draining {
        return Some("draining".into());
    }
    if hb.owned_partitions.is_empty() {
        return Some("owns no dispatch partition yet".into());
    }
    let active = w.effective_active();
    if hb.max_parallel_jobs > 0 && active >= hb.max_parallel_jobs {
        return Some(format!(
            "overloaded: {active} active >= max_parallel_jobs {}",
            hb.max_parallel_jobs
        ));
    }
    if hb.cpu_load >= overload.cpu_load {
        return Some(format!(
            "overloaded: cpu_load {} >= {}",
            hb.cpu_load, overload.cpu_load
        ));
    }
    if hb.gpu_utilization >= overload.gpu_utilization {
        return Some(format!(
            "overloaded: gpu_utilization {} >= {}",
            hb.gpu_utilization, overload.gpu_utilization
        ));
    }
    None
}

/// The lane a queued job is in: everything [`evaluate`] reads of the job but its place in
/// the queue (the deadline aside: a job held past it is ended by its timer).
pub(crate) fn lane_of(job: &Job) -> Lane {
    let mut placement: Vec<(String, String)> = job
        .request
        .labels
        .iter()
        .chain(job.constraints.labels.iter())
        .filter(|(k, _)| PLACEMENT_PREFIXES.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    placement.sort();
    Lane {
        tenant: job.request.tenant_id.clone(),
        limit: job.constraints.max_concurrent_jobs,
        pools: job.pools.clone(),
        placement,
        preferred_worker: job.request.labels.get(LABEL_PREFERRED_WORKER).cloned(),
        memory: job.memory_demand(),
        concurrency: job.concurrency.clone(),
    }
}

/// Job labels that name a placement constraint, with the worker label they must equal.
fn placement_labels(job: &Job) -> impl Iterator<Item = (&str, &str)> {
    job.request
        .labels
        .iter()
        .chain(job.constraints.labels.iter())
        .filter_map(|(k, v)| {
            PLACEMENT_PREFIXES
                .iter()
                .find_map(|p| k.strip_prefix(p))
                .map(|name| (name, v.as_str()))
        })
}

/// Whether no live worker of the job's pools has its placement labels: then [`evaluate`]
/// places it nowhere (every worker it may place on, the preferred one too, passes
/// [`label_mismatch`]).
fn no_worker_fits_labels(state: &State, job: &Job) -> bool {
    if placement_labels(job).next().is_none() {
        return false;
    }
    !state.workers.values().any(|w| {
        w.alive
            && job.pools.contains(&w.heartbeat.pool)
            && placement_labels(job).all(|(name, want)| {
                w.heartbeat
                    .labels
                    .get(name)
                    .is_some_and(|have| have == want)
            })
    })
}

fn label_mismatch(job: &Job, w: &Worker) -> Option<String> {
    for (name, want) in placement_labels(job) {
        match w.heartbeat.labels.get(name) {
            Some(have) if have == want => {}
            Some(have) => return Some(format!("label {name}={have}, job needs {want}")),
            None => return Some(format!("no label {name}, job needs {want}")),
        }
    }
    None
}

/// Live workers of `pool` that pass the common filters for `job`; the rest are recorded in
/// `candidates` with the reason they were skipped.
fn eligible_workers<'s>(
    state: &'s State,
    rules: &Rules,
    job: &Job,
    pool: &str,
    candidates: &mut Vec<Candidate>,
) -> (Vec<Eligible<'s>>, PoolOutcome) {
    let mut out = Vec::new();
    let mut outcome = PoolOutcome::default();
    for (id, w) in &state.workers {
        if !w.alive || w.heartbeat.pool != pool {
            continue;
        }
        outcome.alive += 1;
        let skip = |why: String| Candidate {
            worker_id: id.clone(),
            pool: pool.to_owned(),
            score: None,
            skipped: Some(why),
        };
        if let Some(why) = label_mismatch(job, w) {
            candidates.push(skip(why));
            continue;
        }
        if let Some(why) = common_skip(w, &rules.overload) {
            if why.starts_with("overloaded") {
                outcome.overloaded += 1;
            }
            candidates.push(skip(why));
            continue;
        }
        out.push(Eligible {
            worker_id: id,
            worker: w,
        });
    }
    (out, outcome)
}

/// The preferred worker's pool and score if it can take the job now (SPEC §3.4), or why not.
fn preferred_worker(
    state: &State,
    rules: &Rules,
    job: &Job,
    preferred: &str,
) -> Result<(String, f64), String> {
    let w = state.workers.get(preferred).ok_or("unknown worker")?;
    if !w.alive {
        return Err("not alive".into());
    }
    let pool = &w.heartbeat.pool;
    if !job.pools.contains(pool) {
        return Err(format!("its pool {pool} is not eligible for the job"));
    }
    if let Some(why) = breaker_blocks(state, rules, pool) {
        return Err(why);
    }
    if let Some(why) = label_mismatch(job, w).or_else(|| common_skip(w, &rules.overload)) {
        return Err(why);
    }
    let eligible = Eligible {
        worker_id: preferred,
        worker: w,
    };
    match for_kind(rules.strategy(pool)).assess(job, &eligible) {
        Assessment::Score(s) => Ok((pool.clone(), s)),
        Assessment::Unfit(why) => Err(why),
    }
}
