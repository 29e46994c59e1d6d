//! The CPU the pure core spends per job, without Kafka, RocksDB or a policy: `process` (decide
//! and apply, with dirty-key tracking, as the processor runs it) over a steady stream of jobs,
//! each submitted, dispatched, started and succeeded, with heartbeats and ticks between.
//!
//! `ksched bench` measures the whole processor on a shared 2-core machine, where a 5 %
//! change is inside the noise; this measures the core's share alone, repeatably, so a change
//! to the state's indexes or to decide can be compared before and after.
//!
//! ```text
//! cargo run --release -p ksched-core --example core_cycle [jobs] [in_flight] [rounds]
//! ```

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use ksched_core::decide::{Ctx, process};
use ksched_core::events::{Cause, Input, Reconfigure};
use ksched_core::outputs::Output;
use ksched_core::policy::AllowAll;
use ksched_core::records::{Heartbeat, JobRequest, JobResult, JobStarted, Millis, Tick};
use ksched_core::rules::{PoolRules, Rules};
use ksched_core::state::{ColdStore, DelayKey, IdempotencyEntry, Job, Saga, State};

/// Workers in the one pool, as `ksched bench` runs them.
const WORKERS: usize = 4;
/// Inputs per batch: the processor evicts settled jobs after each.
const BATCH: usize = 64;
/// Simulated time per submitted job (4,000 jobs/s).
const MICROS_PER_JOB: i64 = 250;
/// A Tick per this many milliseconds, and a heartbeat of each worker per `HEARTBEAT_MS`.
const TICK_MS: Millis = 100;
const HEARTBEAT_MS: Millis = 1_000;

/// Nothing is ever cold: every job settles and is evicted, and no input names one again.
struct NoStore;

impl ColdStore for NoStore {
    type Error = std::convert::Infallible;
    fn job(&self, _: &str) -> Result<Option<Job>, Self::Error> {
        Ok(None)
    }
    fn saga(&self, _: &str) -> Result<Option<Saga>, Self::Error> {
        Ok(None)
    }
    fn idempotency(&self, _: &str, _: &str) -> Result<Option<IdempotencyEntry>, Self::Error> {
        Ok(None)
    }
    fn delays_after(&self, _: Option<&DelayKey>, _: usize) -> Result<Vec<DelayKey>, Self::Error> {
        Ok(Vec::new())
    }
    fn dependents_after(
        &self,
        _: &str,
        _: &str,
        _: Option<&str>,
        _: usize,
    ) -> Result<Vec<String>, Self::Error> {
        Ok(Vec::new())
    }
    fn lane_after(
        &self,
        _: &str,
        _: &ksched_core::state::Lane,
        _: Option<&ksched_core::state::QueueKey>,
        _: usize,
    ) -> Result<Vec<ksched_core::state::QueueKey>, Self::Error> {
        Ok(Vec::new())
    }
    fn waits_after(
        &self,
        _: ksched_core::state::TimerKind,
        _: Option<&ksched_core::state::TimerAt>,
        _: usize,
    ) -> Result<Vec<ksched_core::state::TimerAt>, Self::Error> {
        Ok(Vec::new())
    }
}

struct Driver {
    state: State,
    now_us: i64,
    offset: i64,
    inputs: u64,
    since_batch: usize,
    last_tick: Millis,
    last_beat: Millis,
    /// Dispatched and not yet settled, oldest first: (job, attempt, worker).
    running: VecDeque<(String, i32, String)>,
    by_worker: BTreeMap<String, BTreeSet<String>>,
}

impl Driver {
    fn now(&self) -> Millis {
        self.now_us / 1_000
    }

    fn input(&mut self, input: Input) {
        let ctx = Ctx { policy: &AllowAll };
        self.state
            .load_for_input(&input, &NoStore)
            .unwrap_or_else(|e| match e {});
        // A job's topic is the one its record was read from.
        let topic = match &input {
            Input::Submit(_) => "jobs",
            Input::Heartbeat(_) => "ksched.heartbeats",
            Input::Tick(_) | Input::Reconfigure(_) => "ksched.control",
            _ => "ksched.results",
        };
        let cause = Cause {
            topic: topic.into(),
            partition: 0,
            offset: self.offset,
        };
        self.offset += 1;
        self.inputs += 1;
        let now = self.now();
        let mut processed = process(&mut self.state, &ctx, cause, now, input);
        loop {
            for out in processed.outputs {
                if let Output::Dispatch { record, .. } = out {
                    self.by_worker
                        .entry(record.worker_id.clone())
                        .or_default()
                        .insert(record.job.job_id.clone());
                    self.running
                        .push_back((record.job.job_id, record.attempt, record.worker_id));
                }
            }
            if !processed.more {
                break;
            }
            let next = ksched_core::decide::continuation(&self.state);
            let cause = Cause {
                topic: "ksched.control".into(),
                partition: 0,
                offset: self.offset,
            };
            processed = process(&mut self.state, &ctx, cause, now, next);
        }
        self.since_batch += 1;
        if self.since_batch == BATCH {
            self.since_batch = 0;
            drop(self.state.take_dirty());
            self.state.evict_cold();
        }
    }

    fn heartbeat(&mut self, worker: usize) {
        let id = format!("worker-{worker}");
        let active: Vec<String> = self
            .by_worker
            .get(&id)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        self.input(Input::Heartbeat(Heartbeat {
            worker_id: id,
            pool: "default".into(),
            active_jobs: active.len() as i32,
            max_parallel_jobs: 0,
            cpu_load: 10.0,
            owned_partitions: vec![0, 1, 2, 3],
            active_job_ids: active,
            sent_at: self.now(),
            ..Default::default()
        }));
    }

    /// Submits job `n`; settles the oldest running jobs beyond `in_flight`; ticks and
    /// heartbeats as time passes.
    fn job(&mut self, run: &str, n: u64, in_flight: usize) {
        self.now_us += MICROS_PER_JOB;
        let now = self.now();
        self.input(Input::Submit(JobRequest {
            job_id: format!("{run}.small-{n:07}"),
            topic: "jobs".into(),
            tenant_id: "bench".into(),
            payload: vec![0; 64],
            submitted_at: now,
            ..Default::default()
        }));
        while self.running.len() > in_flight {
            let (job_id, attempt, worker_id) = self.running.pop_front().unwrap();
            self.input(Input::Started(JobStarted {
                job_id: job_id.clone(),
                attempt,
                worker_id: worker_id.clone(),
                started_at: now,
            }));
            if let Some(s) = self.by_worker.get_mut(&worker_id) {
                s.remove(&job_id);
            }
            self.input(Input::Result(JobResult::succeeded(
                job_id, attempt, worker_id, 1, now,
            )));
        }
        if now - self.last_tick >= TICK_MS {
            self.last_tick = now;
            self.input(Input::Tick(Tick {
                source: "core-cycle".into(),
                issued_at: now,
                watermark: Some(now),
            }));
        }
        if now - self.last_beat >= HEARTBEAT_MS {
            self.last_beat = now;
            for w in 0..WORKERS {
                self.heartbeat(w);
            }
        }
    }
}

fn rules() -> Rules {
    let mut r = Rules::default();
    r.topics.insert("jobs".into(), vec!["default".into()]);
    r.pools.insert("default".into(), PoolRules::default());
    r.dispatch_partitions.insert("default".into(), 4);
    r
}

fn main() {
    let arg = |i: usize, default: u64| {
        std::env::args()
            .nth(i)
            .map_or(default, |a| a.parse().expect("a whole number"))
    };
    let jobs = arg(1, 200_000);
    let in_flight = arg(2, 200) as usize;
    let rounds = arg(3, 3);
    println!("core_cycle: {jobs} jobs per round, {in_flight} in flight, {WORKERS} workers");
    for round in 1..=rounds {
        let mut d = Driver {
            state: State::tracking_changes(),
            now_us: 1_700_000_000_000_000,
            offset: 0,
            inputs: 0,
            since_batch: 0,
            last_tick: 0,
            last_beat: 0,
            running: VecDeque::new(),
            by_worker: BTreeMap::new(),
        };
        let rules = rules();
        d.input(Input::Reconfigure(Reconfigure {
            rules_json: rules.to_canonical_json(),
            policy_modules: BTreeMap::new(),
            policy_data_json: "{}".into(),
            policy_snapshot: "core-cycle".into(),
            rules_id: "core-cycle".into(),
        }));
        for w in 0..WORKERS {
            d.heartbeat(w);
        }
        let run = format!("bench-{round:08x}");
        // Warm-up: fill the pipeline and the allocator.
        for n in 0..jobs / 10 {
            d.job(&run, n, in_flight);
        }
        let inputs = d.inputs;
        let started = Instant::now();
        for n in jobs / 10..jobs / 10 + jobs {
            d.job(&run, n, in_flight);
        }
        let took = started.elapsed();
        let inputs = d.inputs - inputs;
        println!(
            "round {round}: {:.2} us/job, {:.2} us/input ({:.2} inputs/job), {} jobs in memory at the end",
            took.as_secs_f64() * 1e6 / jobs as f64,
            took.as_secs_f64() * 1e6 / inputs as f64,
            inputs as f64 / jobs as f64,
            d.state.jobs.len()
        );
    }
}
