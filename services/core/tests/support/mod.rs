//! A simulated scheduler for scenario tests: feeds inputs through `process` exactly as the
//! processor does, keeps the journal, and checks after every input that replaying the journal
//! from scratch gives the same state and that the indexes agree with the records.
#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use ksched_core::decide::{Ctx, process};
use ksched_core::events::*;
use ksched_core::outputs::Output;
use ksched_core::policy::{OutputDecision, PolicyDecision, PolicyEngine};
use ksched_core::records::*;
use ksched_core::rules::{PoolRules, Rules, StrategyKind};
use ksched_core::state::{
    ColdStore, DelayKey, DependentKey, Dirty, HistoryItem, HistoryLines, IdempotencyEntry, Job,
    Lane, QueueKey, QueuedCounts, Saga, State, TimerAt, TimerKind, dependent_keys_of, is_resident,
    lane_keys_of, wait_keys_of,
};
use serde_json::Value;

type InputRule = Box<dyn Fn(&Value) -> Option<PolicyDecision>>;
type OutputRule = Box<dyn Fn(&Value) -> Option<OutputDecision>>;

/// A policy engine scripted by closures over the input document; the first rule that answers
/// wins, otherwise allow. Deterministic, like the real one.
#[derive(Default)]
pub(crate) struct ScriptPolicy {
    pub input: Vec<InputRule>,
    pub output: Vec<OutputRule>,
    pub calls: RefCell<u32>,
}

impl PolicyEngine for ScriptPolicy {
    fn evaluate_input(&self, _: &Reconfigure, doc: &Value) -> PolicyDecision {
        *self.calls.borrow_mut() += 1;
        self.input
            .iter()
            .find_map(|r| r(doc))
            .unwrap_or_else(PolicyDecision::allow)
    }
    fn evaluate_output(&self, _: &Reconfigure, doc: &Value) -> OutputDecision {
        self.output.iter().find_map(|r| r(doc)).unwrap_or_default()
    }
}

pub(crate) const T0: i64 = 1_700_000_000_000;

/// What the processor keeps on disk, as maps: the partial state loads from it.
#[derive(Default, Clone)]
pub(crate) struct ColdMap {
    pub jobs: BTreeMap<String, Job>,
    pub sagas: BTreeMap<String, Saga>,
    pub idempotency: BTreeMap<(String, String), IdempotencyEntry>,
    /// History lines by (job, line number), as the store keeps them.
    pub history: BTreeMap<(String, u32), HistoryItem>,
    pub payloads: BTreeMap<String, Vec<u8>>,
    /// The delayed jobs by due time, as the store indexes them.
    pub delays: BTreeSet<DelayKey>,
    /// Blocked jobs by (tenant, dependency, dependent), as the store indexes them.
    pub dependents: BTreeSet<DependentKey>,
    /// The queued jobs by (pool, lane, queue key), as the store indexes them.
    pub lanes: BTreeSet<(String, Lane, QueueKey)>,
    /// Lane keys read so far.
    pub lane_reads: std::cell::Cell<usize>,
    /// The queued jobs' timers by kind, as the store indexes them.
    pub waits: BTreeSet<(TimerKind, TimerAt)>,
    /// Queued timers read so far.
    pub wait_reads: std::cell::Cell<usize>,
    /// The unfinished jobs a start reads: those not queued ([`is_queued`]).
    pub resident: BTreeSet<String>,
    /// Each lane's count of jobs, as the store keeps it.
    pub lane_counts: BTreeMap<(String, Lane), u64>,
    /// What the queued jobs count for besides their lanes, as of the last checkpoint.
    pub queued_counts: QueuedCounts,
    /// Job records read so far.
    pub reads: std::cell::Cell<usize>,
}

impl ColdStore for ColdMap {
    type Error = std::convert::Infallible;
    fn job(&self, id: &str) -> Result<Option<Job>, Self::Error> {
        self.reads.set(self.reads.get() + 1);
        Ok(self.jobs.get(id).cloned())
    }
    fn saga(&self, id: &str) -> Result<Option<Saga>, Self::Error> {
        Ok(self.sagas.get(id).cloned())
    }
    fn idempotency(&self, t: &str, k: &str) -> Result<Option<IdempotencyEntry>, Self::Error> {
        Ok(self.idempotency.get(&(t.to_owned(), k.to_owned())).cloned())
    }
    fn delays_after(
        &self,
        after: Option<&DelayKey>,
        limit: usize,
    ) -> Result<Vec<DelayKey>, Self::Error> {
        let keys = self.delays.iter();
        Ok(match after {
            Some(a) => keys.filter(|k| *k > a).take(limit).cloned().collect(),
            None => keys.take(limit).cloned().collect(),
        })
    }
    fn dependents_after(
        &self,
        tenant: &str,
        dependency: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, Self::Error> {
        Ok((self.dependents.iter())
            .filter(|(t, d, id)| {
                t == tenant && d == dependency && after.is_none_or(|a| id.as_str() > a)
            })
            .take(limit)
            .map(|(_, _, id)| id.clone())
            .collect())
    }
    fn lane_after(
        &self,
        pool: &str,
        lane: &Lane,
        after: Option<&QueueKey>,
        limit: usize,
    ) -> Result<Vec<QueueKey>, Self::Error> {
        let read: Vec<QueueKey> = (self.lanes.iter())
            .filter(|(p, l, k)| p == pool && l == lane && after.is_none_or(|a| k > a))
            .take(limit)
            .map(|(_, _, k)| k.clone())
            .collect();
        self.lane_reads.set(self.lane_reads.get() + read.len());
        Ok(read)
    }
    fn waits_after(
        &self,
        kind: TimerKind,
        after: Option<&TimerAt>,
        limit: usize,
    ) -> Result<Vec<TimerAt>, Self::Error> {
        let read: Vec<TimerAt> = (self.waits.iter())
            .filter(|(kd, k)| *kd == kind && after.is_none_or(|a| k > a))
            .take(limit)
            .map(|(_, k)| k.clone())
            .collect();
        self.wait_reads.set(self.wait_reads.get() + read.len());
        Ok(read)
    }
}

/// A checkpoint as the store's prepare encodes it: the records the dirty keys name, as the
/// state held them then.
pub(crate) struct Batch {
    jobs: Vec<(String, Job)>,
    sagas: Vec<(String, Saga)>,
    idempotency: Vec<((String, String), IdempotencyEntry)>,
    pruned_before: Option<i64>,
    history: HistoryLines,
    payloads: BTreeMap<String, Vec<u8>>,
    delays_put: Vec<DelayKey>,
    delays_deleted: Vec<DelayKey>,
    dependents_put: Vec<DependentKey>,
    dependents_deleted: Vec<DependentKey>,
    lanes_put: Vec<(String, Lane, QueueKey)>,
    lanes_deleted: Vec<(String, Lane, QueueKey)>,
    waits_put: Vec<(TimerKind, TimerAt)>,
    waits_deleted: Vec<(TimerKind, TimerAt)>,
    /// Jobs a start reads, marked; and jobs that stopped being such, unmarked.
    resident_put: Vec<String>,
    resident_deleted: Vec<String>,
    lane_counts: Vec<((String, Lane), u64)>,
    queued_counts: QueuedCounts,
}

impl ColdMap {
    /// What the store's prepare takes from the state.
    fn prepare(state: &State, dirty: Dirty) -> Batch {
        let delays_put = (dirty.jobs.iter())
            .filter_map(|id| ksched_core::state::delay_key_of(id, state.jobs.get(id)?))
            .collect();
        let delays_deleted = (dirty.delays_removed.iter())
            .filter(|(due, id)| {
                !state
                    .jobs
                    .get(id)
                    .is_some_and(|j| j.state.is_parked() && j.delayed_until == Some(*due))
            })
            .cloned()
            .collect();
        let dependents_put = (dirty.jobs.iter())
            .filter_map(|id| Some(dependent_keys_of(id, state.jobs.get(id)?)))
            .flatten()
            .collect();
        let dependents_deleted = (dirty.dependents_removed.iter())
            .filter(|k| {
                !(state.jobs.get(&k.2)).is_some_and(|j| dependent_keys_of(&k.2, j).contains(k))
            })
            .cloned()
            .collect();
        let lanes_put = (dirty.jobs.iter())
            .filter_map(|id| Some(lane_keys_of(id, state.jobs.get(id)?)))
            .flatten()
            .collect();
        let lanes_deleted = (dirty.lanes_removed.iter())
            .filter(|(pool, lane, k)| {
                let job = state.jobs.get(&k.job_id);
                let unwritten =
                    job.is_some_and(|j| dirty.since_clock.is_some_and(|c| j.accepted_at > c));
                let waits_again = job.is_some_and(|j| {
                    lane_keys_of(&k.job_id, j)
                        .iter()
                        .any(|(p, l, q)| p == pool && l == lane && q == k)
                });
                !unwritten && !waits_again
            })
            .cloned()
            .collect();
        let rules = state.rules();
        let waits_put = (dirty.jobs.iter())
            .filter_map(|id| Some(wait_keys_of(id, state.jobs.get(id)?, rules)))
            .flatten()
            .collect();
        let waits_deleted = (dirty.waits_removed.iter())
            .filter(|(kind, k)| {
                let job = state.jobs.get(&k.job_id);
                let unwritten =
                    job.is_some_and(|j| dirty.since_clock.is_some_and(|c| j.accepted_at > c));
                let again = job.is_some_and(|j| {
                    wait_keys_of(&k.job_id, j, rules)
                        .iter()
                        .any(|(kd, w)| kd == kind && w == k)
                });
                !unwritten && !again
            })
            .cloned()
            .collect();
        let resident_put = (dirty.jobs.iter())
            .filter(|id| state.jobs.get(id).is_some_and(is_resident))
            .cloned()
            .collect();
        let resident_deleted = (dirty.resident_left.iter())
            .filter(|id| !state.jobs.get(id).is_some_and(is_resident))
            .cloned()
            .collect();
        let lane_counts = (dirty.lanes_counted.iter())
            .flat_map(|(pool, lanes)| {
                lanes.iter().map(move |lane| {
                    let len =
                        (state.lanes.get(pool).and_then(|l| l.get(lane))).map_or(0, |k| k.len());
                    ((pool.clone(), lane.clone()), len)
                })
            })
            .collect();
        Batch {
            resident_put,
            resident_deleted,
            lane_counts,
            queued_counts: state.queued_counts(),
            delays_put,
            delays_deleted,
            dependents_put,
            dependents_deleted,
            lanes_put,
            lanes_deleted,
            waits_put,
            waits_deleted,
            jobs: (dirty.jobs.into_iter())
                .filter_map(|id| Some((id.clone(), state.jobs.get(&id)?.clone())))
                .collect(),
            sagas: (dirty.sagas.into_iter())
                .filter_map(|id| Some((id.clone(), state.sagas.get(&id)?.clone())))
                .collect(),
            idempotency: (dirty.idempotency.into_iter())
                .filter_map(|k| Some((k.clone(), state.idempotency.get(&k)?.clone())))
                .collect(),
            pruned_before: dirty.idempotency_pruned_before,
            history: dirty.history,
            payloads: dirty.payloads,
        }
    }

    /// What the store's write does with a prepared batch.
    fn write(&mut self, b: Batch) {
        self.jobs.extend(b.jobs);
        self.sagas.extend(b.sagas);
        self.idempotency.extend(b.idempotency);
        if let Some(before) = b.pruned_before {
            self.idempotency.retain(|_, e| e.seen_at >= before);
        }
        for (job_id, seq, item) in b.history.lines() {
            self.history
                .insert((job_id.to_owned(), seq), item.to_item());
        }
        self.payloads.extend(b.payloads);
        self.delays.extend(b.delays_put);
        for k in &b.delays_deleted {
            self.delays.remove(k);
        }
        self.dependents.extend(b.dependents_put);
        for k in &b.dependents_deleted {
            self.dependents.remove(k);
        }
        self.lanes.extend(b.lanes_put);
        for k in &b.lanes_deleted {
            self.lanes.remove(k);
        }
        self.waits.extend(b.waits_put);
        for k in &b.waits_deleted {
            self.waits.remove(k);
        }
        self.resident.extend(b.resident_put);
        for id in &b.resident_deleted {
            self.resident.remove(id);
        }
        for (lane, len) in b.lane_counts {
            if len == 0 {
                self.lane_counts.remove(&lane);
            } else {
                self.lane_counts.insert(lane, len);
            }
        }
        self.queued_counts = b.queued_counts;
    }

    /// A state started from this storage as the store's `load_state` starts one: what the
    /// store keeps besides jobs (workers, schedules, shares, counts, ...) taken from `was`,
    /// the state that wrote it; the unfinished jobs that are not queued read and indexed;
    /// the queued ones as their lanes' counts, read back before the first decision.
    pub(crate) fn start(&self, was: &State) -> State {
        let mut s = State::tracking_changes();
        s.delays = ksched_core::state::Delays::unknown(was.delays.limit);
        s.backlog = ksched_core::state::Backlog::evicting();
        s.waits = ksched_core::state::Waits::unknown();
        s.dependents = ksched_core::state::Dependents::stored();
        s.settling = was.settling.clone();
        s.batches = was.batches.clone();
        s.index_batches();
        s.clock = was.clock;
        s.entries = was.entries;
        s.config = was.config.clone();
        s.last_idempotency_prune = was.last_idempotency_prune;
        s.dead_letters_by_reason = was.dead_letters_by_reason.clone();
        s.jobs_by_state = was.jobs_by_state.clone();
        s.watermark = was.watermark;
        s.liveness_floor = was.liveness_floor;
        s.workers = was.workers.clone();
        s.breakers = was.breakers.clone();
        s.schedules = was.schedules.clone();
        s.buckets = was.buckets.clone();
        s.shares = was.shares.clone();
        s.debounces = was.debounces.clone();
        s.sagas = (was.sagas.iter())
            .filter(|(_, saga)| saga.rolling_back())
            .map(|(k, saga)| (k.clone(), saga.clone()))
            .collect();
        let resident = (self.resident.iter()).map(|id| {
            let job = (self.job(id).unwrap_or_else(|e| match e {})).expect("a marked job");
            // Every marker names a job a start reads: none is left behind.
            assert!(is_resident(&job), "job {id} marked, not resident: {job:?}");
            Ok::<_, std::convert::Infallible>((id.clone(), job))
        });
        s.rebuild_indexes_with(resident)
            .unwrap_or_else(|e| match e {});
        let lanes = (self.lane_counts.iter()).map(|((p, l), n)| (p.clone(), l.clone(), *n));
        s.restore_queued(lanes, &self.queued_counts);
        s
    }

    /// The queued timers `state` holds, in memory and here, by kind, as
    /// [`ColdMap::lanes_of`] finds lanes. Each kind's count is checked against what is found.
    pub(crate) fn waits_of(&self, state: &State) -> BTreeMap<TimerKind, BTreeSet<TimerAt>> {
        let mut out: BTreeMap<TimerKind, BTreeSet<TimerAt>> = BTreeMap::new();
        for (kind, keys) in state.waits.each() {
            let all = out.entry(kind).or_default();
            all.extend(keys.head().iter().chain(keys.beyond()).cloned());
        }
        let rules = state.rules();
        for (kind, k) in &self.waits {
            let stands = match state.jobs.get(&k.job_id) {
                Some(j) => wait_keys_of(&k.job_id, j, rules)
                    .iter()
                    .any(|(kd, w)| kd == kind && w == k),
                None => true,
            };
            if stands {
                out.entry(*kind).or_default().insert(k.clone());
            }
        }
        for (kind, keys) in state.waits.each() {
            let found = out[&kind].len() as u64;
            assert_eq!(keys.len(), found, "count of queued {kind:?} timers");
        }
        out
    }

    /// The lanes `state` holds, in memory and here: each lane's head and keys past it, and
    /// the keys stored for it that still stand (a job in memory may have left its key since
    /// it was written). Each lane's count is checked against what is found.
    pub(crate) fn lanes_of(&self, state: &State) -> BTreeMap<(String, Lane), BTreeSet<QueueKey>> {
        let mut out: BTreeMap<(String, Lane), BTreeSet<QueueKey>> = BTreeMap::new();
        for (pool, lanes) in &state.lanes {
            for (lane, keys) in lanes {
                let all = out.entry((pool.clone(), lane.clone())).or_default();
                all.extend(keys.head().iter().chain(keys.beyond()).cloned());
            }
        }
        for (pool, lane, k) in &self.lanes {
            let stands = match state.jobs.get(&k.job_id) {
                Some(j) => lane_keys_of(&k.job_id, j)
                    .iter()
                    .any(|(p, l, q)| p == pool && l == lane && q == k),
                None => true,
            };
            if stands {
                out.entry((pool.clone(), lane.clone()))
                    .or_default()
                    .insert(k.clone());
            }
        }
        for (pool, lanes) in &state.lanes {
            for (lane, keys) in lanes {
                let found = out[&(pool.clone(), lane.clone())].len() as u64;
                assert_eq!(keys.len(), found, "lane count in pool {pool}: {lane:?}");
            }
        }
        out
    }

    /// What the store's persist (prepare, then write at once) does with the dirty keys.
    fn persist(&mut self, state: &State, dirty: Dirty) {
        self.write(ColdMap::prepare(state, dirty));
    }
}

/// Every queued timer of a state that holds them whole, by kind.
pub(crate) fn whole_waits(state: &State) -> BTreeMap<TimerKind, BTreeSet<TimerAt>> {
    (state.waits.each())
        .map(|(kind, keys)| {
            assert!(
                keys.is_whole(),
                "queued timers of a state that keeps every job"
            );
            (kind, keys.head().clone())
        })
        .collect()
}

/// Every lane of a state that holds them whole.
pub(crate) fn whole_lanes(state: &State) -> BTreeMap<(String, Lane), BTreeSet<QueueKey>> {
    let mut out = BTreeMap::new();
    for (pool, lanes) in &state.lanes {
        for (lane, keys) in lanes {
            assert!(keys.is_whole(), "a lane of a state that keeps every job");
            out.insert((pool.clone(), lane.clone()), keys.head().clone());
        }
    }
    out
}

/// Rules with one `default` pool for topic `job.default`, a `gpu` pool requiring gpu for
/// `job.gpu`, and `job.multi` mapped to [a, b].
pub(crate) fn rules() -> Rules {
    let mut r = Rules::default();
    r.topics
        .insert("job.default".into(), vec!["default".into()]);
    r.topics.insert("job.gpu".into(), vec!["gpu".into()]);
    r.topics
        .insert("job.multi".into(), vec!["a".into(), "b".into()]);
    r.pools.insert("default".into(), PoolRules::default());
    r.pools.insert(
        "gpu".into(),
        PoolRules {
            requires: vec!["gpu".into(), "cuda".into()],
            strategy: StrategyKind::LeastLoaded,
            workers: Vec::new(),
            shard: None,
            aging: None,
        },
    );
    r.pools.insert("a".into(), PoolRules::default());
    r.pools.insert("b".into(), PoolRules::default());
    r
}

pub(crate) fn reconfigure(rules: &Rules, snapshot: &str) -> Reconfigure {
    Reconfigure {
        rules_json: rules.to_canonical_json(),
        policy_modules: BTreeMap::new(),
        policy_data_json: "{}".into(),
        policy_snapshot: snapshot.into(),
        rules_id: "test".into(),
    }
}

/// An output policy that quarantines results labelled `contains_pii`.
pub(crate) fn pii_quarantine() -> ScriptPolicy {
    let mut policy = ScriptPolicy::default();
    policy.output.push(Box::new(|doc| {
        (doc["result"]["labels"]["contains_pii"].as_str() == Some("true")).then(|| OutputDecision {
            limit_exceeded: false,
            quarantine: true,
            reasons: vec!["output contains PII".into()],
        })
    }));
    policy
}

pub(crate) fn job(id: &str) -> JobRequest {
    JobRequest {
        job_id: id.into(),
        topic: "job.default".into(),
        tenant_id: "acme".into(),
        principal_id: Some("alice".into()),
        submitted_at: T0,
        ..Default::default()
    }
}

pub(crate) fn hb(worker: &str, pool: &str) -> Heartbeat {
    Heartbeat {
        worker_id: worker.into(),
        pool: pool.into(),
        max_parallel_jobs: 4,
        owned_partitions: vec![0],
        ..Default::default()
    }
}

pub(crate) struct Sim {
    pub state: State,
    /// The same inputs on a partial state that evicts cold records after every input and
    /// loads them back on demand, as the processor does.
    pub partial: State,
    pub cold: ColdMap,
    /// The same inputs once more on a partial state whose checkpoints are written one input
    /// late, as a replay writes them behind its folding: it may evict only what a written
    /// batch holds ([`State::evict_written`]).
    pub behind: State,
    pub behind_cold: ColdMap,
    behind_pending: Option<Batch>,
    /// The journal folded entry by entry on a partial state that loads what each entry
    /// touches ([`State::load_for_entry`]) and checkpoints and evicts after every entry, as a
    /// replay, a standby and a recovery do.
    pub folded: State,
    pub folded_cold: ColdMap,
    pub policy: ScriptPolicy,
    pub now: i64,
    pub offset: i64,
    pub journal: Vec<JournalEntry>,
    pub outputs: Vec<Output>,
    /// Index into `journal` where the last input's entry is.
    pub last: usize,
    /// Continuation entries journaled so far (work cut at the per-entry bound).
    pub continuations: usize,
    /// Leave work cut at the per-entry bound undone, as a processor that stops right after
    /// an input would (a restart goes on with it).
    pub halt_continuations: bool,
    /// Workers that heartbeat while time passes.
    pub alive: Vec<(String, String)>,
    /// Whether every input is followed by [`Sim::check`] (a replay of the whole journal):
    /// scenarios of many thousands of inputs turn it off and check once at the end.
    pub checking: bool,
    last_tick: i64,
    last_beat: i64,
}

/// The ticker's interval in scenarios (the default `tick_interval_ms`).
pub(crate) const TICK_MS: i64 = 1_000;
/// How often keep-alive workers heartbeat in scenarios.
pub(crate) const HEARTBEAT_MS: i64 = 3_000;

impl Sim {
    pub(crate) fn new() -> Sim {
        Sim::with_rules(rules())
    }

    pub(crate) fn with_rules(rules: Rules) -> Sim {
        Sim::with_policy(rules, ScriptPolicy::default())
    }

    pub(crate) fn with_policy(rules: Rules, policy: ScriptPolicy) -> Sim {
        let mut sim = Sim {
            state: State::new(),
            partial: State::tracking_changes(),
            cold: ColdMap::default(),
            behind: State::tracking_changes(),
            behind_cold: ColdMap::default(),
            behind_pending: None,
            folded: State::tracking_changes(),
            folded_cold: ColdMap::default(),
            policy,
            now: T0,
            offset: 0,
            journal: Vec::new(),
            outputs: Vec::new(),
            last: 0,
            continuations: 0,
            halt_continuations: false,
            alive: Vec::new(),
            checking: true,
            last_tick: T0,
            last_beat: T0,
        };
        // Delay windows of two keys: every Tick that releases more reads them from storage.
        // Queued records past their lanes' windows leave memory: scenarios with a small
        // `limits.max_work_per_entry` read them back as the windows slide.
        for state in [&mut sim.partial, &mut sim.behind, &mut sim.folded] {
            state.delays.limit = 2;
            state.backlog = ksched_core::state::Backlog::evicting();
            state.dependents = ksched_core::state::Dependents::stored();
        }
        sim.reconfigure(&rules, "snap-1");
        sim
    }

    pub(crate) fn reconfigure(&mut self, rules: &Rules, snapshot: &str) -> Vec<Event> {
        self.input(
            "ksched.control",
            Input::Reconfigure(reconfigure(rules, snapshot)),
        )
    }

    /// Processes one input read from `topic` at the current time; returns its events.
    pub(crate) fn input(&mut self, topic: &str, input: Input) -> Vec<Event> {
        let cause = Cause {
            topic: topic.into(),
            partition: 0,
            offset: self.offset,
        };
        self.offset += 1;
        let p = self.decide(&cause, input);
        self.journal.push(p.entry.clone());
        self.fold_last();
        self.last = self.journal.len() - 1;
        if self.checking {
            self.check();
        }
        let mut events = p.entry.events;
        // Work cut at the per-entry bound continues at once, as the processor does.
        let mut more = p.more && !self.halt_continuations;
        while more {
            let next = ksched_core::decide::continuation(&self.state);
            let p = self.decide(&cause, next);
            self.journal.push(p.entry.clone());
            self.fold_last();
            self.continuations += 1;
            if self.checking {
                self.check();
            }
            events.extend(p.entry.events);
            more = p.more;
        }
        events
    }

    /// Decides on `input` with the full state and with both partial ones, checks that the
    /// partial ones decide the same, and checkpoints them; returns the full state's decision.
    fn decide(&mut self, cause: &Cause, input: Input) -> ksched_core::decide::Processed {
        let ctx = Ctx {
            policy: &self.policy,
        };
        let p = process(
            &mut self.state,
            &ctx,
            cause.clone(),
            self.now,
            input.clone(),
        );

        // Checkpointed after every input, then evicted.
        self.partial
            .load_for_input(&input, &self.cold)
            .unwrap_or_else(|e| match e {});
        let missing = self.partial.window_problems();
        assert!(missing.is_empty(), "partial, before deciding: {missing:?}");
        let q = process(
            &mut self.partial,
            &ctx,
            cause.clone(),
            self.now,
            input.clone(),
        );
        same_entry(&q.entry, &p.entry);
        let dirty = self.partial.take_dirty();
        self.cold.persist(&self.partial, dirty);
        self.partial.evict_cold();

        // Checkpointed after every input, written after the next one.
        self.behind
            .load_for_input(&input, &self.behind_cold)
            .unwrap_or_else(|e| match e {});
        let missing = self.behind.window_problems();
        assert!(missing.is_empty(), "behind, before deciding: {missing:?}");
        let r = process(&mut self.behind, &ctx, cause.clone(), self.now, input);
        same_entry(&r.entry, &p.entry);
        if let Some(batch) = self.behind_pending.take() {
            self.behind_cold.write(batch);
        }
        self.behind.evict_written();
        let dirty = self.behind.take_dirty();
        self.behind_pending = Some(ColdMap::prepare(&self.behind, dirty));

        self.outputs.extend(p.outputs.iter().cloned());
        p
    }

    /// The partial states stop and start again from their storage ([`ColdMap::start`]), as
    /// the processor does once its last checkpoint is written, then read their lanes'
    /// windows back as `Engine::open` does: the one written after every input, the one
    /// written behind (its last batch written first) and the folded one (a standby's).
    pub(crate) fn restart(&mut self) {
        let started = |cold: &ColdMap, was: &State| {
            let mut s = cold.start(was);
            s.refill_windows(cold).unwrap_or_else(|e| match e {});
            s
        };
        self.partial = started(&self.cold, &self.partial);
        if let Some(batch) = self.behind_pending.take() {
            self.behind_cold.write(batch);
        }
        self.behind = started(&self.behind_cold, &self.behind);
        self.folded = started(&self.folded_cold, &self.folded);
        if self.checking {
            self.check();
        }
    }

    /// Journals `entry` as if an older scheduler had written it (say, with an older decision
    /// format): every state applies it as a replay would, then goes on as after a decision.
    pub(crate) fn inject(&mut self, entry: JournalEntry) {
        ksched_core::apply_entry(&mut self.state, &entry);
        self.partial
            .load_for_entry(&entry, &self.cold)
            .unwrap_or_else(|e| match e {});
        ksched_core::apply_entry(&mut self.partial, &entry);
        let dirty = self.partial.take_dirty();
        self.cold.persist(&self.partial, dirty);
        self.partial.evict_cold();
        if let Some(batch) = self.behind_pending.take() {
            self.behind_cold.write(batch);
        }
        self.behind
            .load_for_entry(&entry, &self.behind_cold)
            .unwrap_or_else(|e| match e {});
        ksched_core::apply_entry(&mut self.behind, &entry);
        self.behind.evict_written();
        let dirty = self.behind.take_dirty();
        self.behind_pending = Some(ColdMap::prepare(&self.behind, dirty));
        self.journal.push(entry);
        self.fold_last();
        self.last = self.journal.len() - 1;
        if self.checking {
            self.check();
        }
    }

    /// Folds the journal's last entry into the folded partial state, then checkpoints and
    /// evicts it.
    fn fold_last(&mut self) {
        let entry = self.journal.last().expect("an entry was just journaled");
        self.folded
            .load_for_entry(entry, &self.folded_cold)
            .unwrap_or_else(|e| match e {});
        ksched_core::apply_entry(&mut self.folded, entry);
        let dirty = self.folded.take_dirty();
        self.folded_cold.persist(&self.folded, dirty);
        self.folded.evict_cold();
    }

    /// Applies the journal event by event, calling `each` after every event with the state
    /// and the event (for checks of every intermediate state).
    pub(crate) fn replay_each(&self, mut each: impl FnMut(&State, &Event)) {
        let mut replay = State::new();
        for entry in &self.journal {
            ksched_core::apply::apply_entry(
                &mut replay,
                &JournalEntry {
                    events: vec![],
                    ..entry.clone()
                },
            );
            let at = ksched_core::apply::Applying {
                now: entry.log_time,
                input: &entry.input,
                format: entry.format,
            };
            for e in &entry.events {
                ksched_core::apply(&mut replay, e, &at);
                each(&replay, e);
            }
        }
    }

    /// Replay == live and index consistency, after every input.
    pub(crate) fn check(&self) {
        let mut replayed = State::new();
        for e in &self.journal {
            ksched_core::apply_entry(&mut replayed, e);
        }
        assert!(
            replayed == self.state,
            "replaying the journal gives a different state"
        );
        let problems = self.state.check_invariants();
        assert!(problems.is_empty(), "invariants: {problems:?}");
        // Memory plus cold storage of the partial state hold the full projection.
        for (id, job) in self.state.jobs.iter_any_order() {
            let stored = (self.partial.jobs.get(id)).or_else(|| self.cold.jobs.get(id));
            assert_eq!(stored, Some(job), "job {id} of the partial state");
            // What is not written yet is still in memory.
            let behind = (self.behind.jobs.get(id)).or_else(|| self.behind_cold.jobs.get(id));
            assert_eq!(behind, Some(job), "job {id} of the state written behind");
            let folded = (self.folded.jobs.get(id)).or_else(|| self.folded_cold.jobs.get(id));
            assert_eq!(folded, Some(job), "job {id} of the folded partial state");
        }
        // Eviction finds every job that became terminal, whichever way it did.
        let lingering: Vec<&str> = (self.partial.jobs.iter_any_order())
            .filter(|(_, j)| j.state.is_cold())
            .map(|(id, _)| id)
            .collect();
        assert!(
            lingering.is_empty(),
            "terminal or delayed jobs not evicted: {lingering:?}"
        );
        for (what, state) in [
            ("partial", &self.partial),
            ("behind", &self.behind),
            ("folded", &self.folded),
        ] {
            let lingering = state.lingering_queued();
            assert!(
                lingering.is_empty(),
                "{what}: queued jobs past every window still in memory: {lingering:?}"
            );
        }
        for (what, state) in [
            ("partial", &self.partial),
            ("behind", &self.behind),
            ("folded", &self.folded),
        ] {
            let problems = state.delay_problems();
            assert!(problems.is_empty(), "{what}: {problems:?}");
        }
        assert_eq!(self.partial.workers, self.state.workers);
        assert_eq!(self.partial.queued, self.state.queued);
        // The counts placement and admission read, whatever memory holds and however the
        // state began.
        for (what, state) in [
            ("partial", &self.partial),
            ("behind", &self.behind),
            ("folded", &self.folded),
        ] {
            assert_eq!(state.queued, self.state.queued, "{what}");
            assert_eq!(state.tenant_pending, self.state.tenant_pending, "{what}");
            assert_eq!(state.tenant_active, self.state.tenant_active, "{what}");
            assert_eq!(state.key_live, self.state.key_live, "{what}");
            assert_eq!(state.key_active, self.state.key_active, "{what}");
            let reasons = &self.state.waiting_by_reason;
            assert_eq!(&state.waiting_by_reason, reasons, "{what}");
        }
        for (what, state) in [
            ("partial", &self.partial),
            ("behind", &self.behind),
            ("folded", &self.folded),
        ] {
            let problems = state.lane_problems(&self.state);
            assert!(problems.is_empty(), "{what} lanes: {problems:?}");
        }
        let lanes = whole_lanes(&self.state);
        assert_eq!(self.cold.lanes_of(&self.partial), lanes, "partial lanes");
        assert_eq!(
            self.behind_cold.lanes_of(&self.behind),
            lanes,
            "lanes written behind"
        );
        assert_eq!(
            self.folded_cold.lanes_of(&self.folded),
            lanes,
            "folded lanes"
        );
        assert_eq!(self.partial.timers, self.state.timers);
        let waits = whole_waits(&self.state);
        assert_eq!(self.cold.waits_of(&self.partial), waits, "partial timers");
        assert_eq!(
            self.behind_cold.waits_of(&self.behind),
            waits,
            "queued timers written behind"
        );
        assert_eq!(
            self.folded_cold.waits_of(&self.folded),
            waits,
            "folded queued timers"
        );
        for (what, state) in [
            ("partial", &self.partial),
            ("behind", &self.behind),
            ("folded", &self.folded),
        ] {
            let problems = state.wait_problems(&self.state);
            assert!(problems.is_empty(), "{what} queued timers: {problems:?}");
        }
        // Blocked jobs by what they wait for: memory and storage together hold every entry
        // the whole state has (a stored key whose job in memory left it does not count).
        let whole: BTreeSet<DependentKey> = (self.state.jobs.iter_any_order())
            .flat_map(|(id, j)| dependent_keys_of(id, j))
            .collect();
        assert_eq!(self.state.dependents.keys(), &whole, "dependents in memory");
        for (what, state, cold) in [
            ("partial", &self.partial, &self.cold),
            ("behind", &self.behind, &self.behind_cold),
            ("folded", &self.folded, &self.folded_cold),
        ] {
            let mut seen: BTreeSet<DependentKey> = (cold.dependents.iter())
                .filter(|k| {
                    (state.jobs.get(&k.2)).is_none_or(|j| dependent_keys_of(&k.2, j).contains(k))
                })
                .cloned()
                .collect();
            seen.extend(state.dependents.keys().iter().cloned());
            assert_eq!(seen, whole, "{what} dependents");
            assert_eq!(state.settling, self.state.settling, "{what} settling");
            assert_eq!(state.batches, self.state.batches, "{what} batches");
            assert_eq!(
                state.batches_due, self.state.batches_due,
                "{what} batches due"
            );
        }
        // Each batch counts its own members: accepted since it opened, and their ends (a
        // complete batch's counts are frozen as its callbacks were given them).
        for ((tenant, id), b) in &self.state.batches {
            let members: Vec<&Job> = (self.state.jobs.iter_any_order())
                .map(|(_, j)| j)
                .filter(|j| {
                    j.request.tenant_id == *tenant
                        && j.request.batch_id.as_deref() == Some(id.as_str())
                        && j.accepted_at >= b.opened_at
                })
                .collect();
            assert_eq!(b.joined as usize, members.len(), "batch {id} joined");
            assert!(b.joined <= b.expected, "batch {id}: {b:?}");
            let ended =
                |s: &dyn Fn(JobState) -> bool| members.iter().filter(|j| s(j.state)).count() as i32;
            if b.state == BatchState::Complete {
                assert_eq!(b.succeeded + b.failed, b.expected, "batch {id}: {b:?}");
            } else {
                let succeeded = ended(&|s| s == JobState::Succeeded);
                let failed = ended(&|s| s.is_terminal() && s != JobState::Succeeded);
                assert_eq!(
                    (b.succeeded, b.failed),
                    (succeeded, failed),
                    "batch {id}: {b:?}"
                );
            }
        }
        assert_eq!(self.partial.breakers, self.state.breakers);
        assert_eq!(self.partial.buckets, self.state.buckets);
        assert_eq!(self.behind.buckets, self.state.buckets);
        assert_eq!(self.folded.buckets, self.state.buckets);
        assert_eq!(self.partial.shares, self.state.shares);
        assert_eq!(self.behind.shares, self.state.shares);
        assert_eq!(self.folded.shares, self.state.shares);
        assert_eq!(self.folded.workers, self.state.workers);
        assert_eq!(self.folded.queued, self.state.queued);
        assert_eq!(self.folded.timers, self.state.timers);
        assert_eq!(self.folded.jobs_by_state, self.state.jobs_by_state);
        assert_eq!(self.partial.schedules, self.state.schedules);
        assert_eq!(self.behind.schedules, self.state.schedules);
        assert_eq!(self.folded.schedules, self.state.schedules);
        assert_eq!(self.cold.history, self.folded_cold.history);
    }

    pub(crate) fn submit(&mut self, req: JobRequest) -> Vec<Event> {
        let topic = req.topic.clone();
        self.input(&topic, Input::Submit(req))
    }

    pub(crate) fn heartbeat(&mut self, hb: Heartbeat) -> Vec<Event> {
        let mut hb = hb;
        hb.sent_at = self.now;
        self.input("ksched.heartbeats", Input::Heartbeat(hb))
    }

    pub(crate) fn worker(&mut self, worker: &str, pool: &str) -> Vec<Event> {
        self.heartbeat(hb(worker, pool))
    }

    /// Lets `ms` pass as in production: the ticker appends a Tick every [`TICK_MS`], each
    /// judged at its own time, and workers named by [`Sim::keep_alive`] heartbeat every
    /// [`HEARTBEAT_MS`]. Ends with a Tick at the new time; returns the events of every input.
    pub(crate) fn tick_after(&mut self, ms: i64) -> Vec<Event> {
        let mut events = self.elapse(ms);
        events.extend(self.tick_now());
        events
    }

    /// Lets `ms` pass as in production (Ticks and keep-alive heartbeats, as in
    /// [`Sim::tick_after`]) without a Tick at the end, so the next input is read at the new
    /// time. Returns what happened meanwhile.
    pub(crate) fn advance(&mut self, ms: i64) -> Vec<Event> {
        self.elapse(ms)
    }

    /// Time jumps by `ms` with nothing read meanwhile (a broker outage, the scheduler down):
    /// the next Tick sees a gap.
    pub(crate) fn gap(&mut self, ms: i64) {
        self.now += ms;
        self.last_beat = self.now;
    }

    /// Workers that keep heartbeating (as `hb(worker, pool)`) while time passes.
    pub(crate) fn keep_alive(&mut self, workers: &[(&str, &str)]) {
        self.alive = workers
            .iter()
            .map(|(w, p)| ((*w).to_owned(), (*p).to_owned()))
            .collect();
    }

    fn elapse(&mut self, ms: i64) -> Vec<Event> {
        let end = self.now + ms;
        let mut events = Vec::new();
        loop {
            let next_tick = self.last_tick + TICK_MS;
            let next_beat = self.last_beat + HEARTBEAT_MS;
            let next = next_tick.min(next_beat);
            if next >= end {
                break;
            }
            self.now = next;
            if next == next_beat {
                self.last_beat = next;
                for (w, p) in self.alive.clone() {
                    events.extend(self.heartbeat(hb(&w, &p)));
                }
            }
            if next == next_tick {
                events.extend(self.tick_now());
            }
        }
        self.now = end;
        events
    }

    /// A Tick at the current time, judged at it.
    pub(crate) fn tick_now(&mut self) -> Vec<Event> {
        self.last_tick = self.now;
        self.input(
            "ksched.control",
            Input::Tick(Tick {
                source: "test".into(),
                issued_at: self.now,
                watermark: Some(self.now),
            }),
        )
    }

    pub(crate) fn started(&mut self, job_id: &str, attempt: i32, worker: &str) -> Vec<Event> {
        self.input(
            "ksched.results",
            Input::Started(JobStarted {
                job_id: job_id.into(),
                attempt,
                worker_id: worker.into(),
                started_at: self.now,
            }),
        )
    }

    pub(crate) fn result(
        &mut self,
        job_id: &str,
        attempt: i32,
        worker: &str,
        status: ResultStatus,
    ) -> Vec<Event> {
        self.result_with(job_id, attempt, worker, status, None)
    }

    pub(crate) fn result_with(
        &mut self,
        job_id: &str,
        attempt: i32,
        worker: &str,
        status: ResultStatus,
        error_code: Option<&str>,
    ) -> Vec<Event> {
        self.input(
            "ksched.results",
            Input::Result(JobResult {
                job_id: job_id.into(),
                attempt,
                worker_id: worker.into(),
                status,
                error_code: error_code.map(str::to_owned),
                error_message: None,
                result_ptr: None,
                result_meta: ResultMeta::default(),
                execution_ms: 5,
                finished_at: self.now,
            }),
        )
    }

    /// Attempt `attempt` of `job_id` succeeded on `worker`, its output labelled
    /// `contains_pii` (which [`pii_quarantine`] quarantines).
    pub(crate) fn succeed_with_pii(
        &mut self,
        job_id: &str,
        attempt: i32,
        worker: &str,
    ) -> Vec<Event> {
        let mut result = JobResult::succeeded(job_id, attempt, worker, 3, self.now);
        result.result_meta.labels = [("contains_pii".to_owned(), "true".to_owned())].into();
        self.input("ksched.results", Input::Result(result))
    }

    pub(crate) fn cancel(&mut self, job_id: &str, tenant: Option<&str>) -> Vec<Event> {
        self.input(
            "ksched.control",
            Input::Cancel(CancelJob {
                job_id: job_id.into(),
                tenant_id: tenant.map(str::to_owned),
                principal_id: "op".into(),
                reason: None,
                requested_at: self.now,
                batch_id: None,
            }),
        )
    }

    /// An operator's cancel of batch `batch_id` of `tenant`.
    pub(crate) fn cancel_batch(&mut self, tenant: &str, batch_id: &str) -> Vec<Event> {
        self.input(
            "ksched.control",
            Input::Cancel(CancelJob {
                job_id: String::new(),
                tenant_id: Some(tenant.to_owned()),
                principal_id: "op".into(),
                reason: None,
                requested_at: self.now,
                batch_id: Some(batch_id.to_owned()),
            }),
        )
    }

    pub(crate) fn job(&self, id: &str) -> &Job {
        self.state
            .jobs
            .get(id)
            .unwrap_or_else(|| panic!("no job {id}"))
    }

    /// A job's history as the store keeps it (the job itself holds only counters).
    pub(crate) fn history(&self, id: &str) -> Vec<HistoryItem> {
        self.cold
            .history
            .range((id.to_owned(), 0)..=(id.to_owned(), u32::MAX))
            .map(|(_, item)| item.clone())
            .collect()
    }

    /// A job's payload as the store keeps it.
    pub(crate) fn payload(&self, id: &str) -> Vec<u8> {
        self.cold.payloads.get(id).cloned().unwrap_or_default()
    }

    pub(crate) fn job_state(&self, id: &str) -> JobState {
        self.job(id).state
    }

    pub(crate) fn dead_letters(&self) -> Vec<&DeadLetter> {
        self.outputs
            .iter()
            .filter_map(|o| match o {
                Output::DeadLetter(d) => Some(d),
                _ => None,
            })
            .collect()
    }

    pub(crate) fn dispatches(&self) -> Vec<&Dispatch> {
        self.outputs
            .iter()
            .filter_map(|o| match o {
                Output::Dispatch { record, .. } => Some(record.as_ref()),
                _ => None,
            })
            .collect()
    }

    pub(crate) fn cancel_dispatches(&self) -> Vec<&CancelDispatch> {
        self.outputs
            .iter()
            .filter_map(|o| match o {
                Output::CancelDispatch { record, .. } => Some(record),
                _ => None,
            })
            .collect()
    }
}

/// Names of events, for compact assertions.
/// A job of `job.default` carrying concurrency key `key` (the `concurrency_key` label).
pub(crate) fn keyed(id: &str, key: &str) -> JobRequest {
    let mut j = job(id);
    j.labels.insert("concurrency_key".into(), key.into());
    j
}

/// The jobs dispatched by `events`, in order.
pub(crate) fn dispatched(events: &[Event]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::JobDispatched(d) => Some(d.job_id.as_str()),
            _ => None,
        })
        .collect()
}

pub(crate) fn names(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(Event::name).collect()
}

pub(crate) fn find<'e, T>(events: &'e [Event], pick: impl Fn(&'e Event) -> Option<&'e T>) -> &'e T {
    events
        .iter()
        .find_map(pick)
        .unwrap_or_else(|| panic!("event not found in {:?}", names(events)))
}

pub(crate) fn scheduled(events: &[Event]) -> &JobScheduled {
    find(events, |e| match e {
        Event::JobScheduled(s) => Some(s),
        _ => None,
    })
}

pub(crate) fn waiting(events: &[Event]) -> &JobWaiting {
    find(events, |e| match e {
        Event::JobWaiting(s) => Some(s),
        _ => None,
    })
}

pub(crate) fn rejected(events: &[Event]) -> &CommandRejected {
    find(events, |e| match e {
        Event::CommandRejected(s) => Some(s),
        _ => None,
    })
}

pub(crate) fn dead_lettered(events: &[Event]) -> &DeadLetter {
    &find(events, |e| match e {
        Event::DeadLettered(s) => Some(s),
        _ => None,
    })
    .dead_letter
}

/// The partial and the full state decided the same (compared as text, so that a NaN a
/// hostile input carries compares equal to itself).
fn same_entry(a: &JournalEntry, b: &JournalEntry) {
    if a != b {
        assert_eq!(
            format!("{a:?}"),
            format!("{b:?}"),
            "a partial state decided differently"
        );
    }
}
