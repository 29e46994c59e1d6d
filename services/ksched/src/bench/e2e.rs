//! End to end: producers submit jobs, SDK workers with a no-op handler and regular heartbeats
//! complete them, and a journal tailer times each job from its submission to its dispatch
//! and to its success becoming durable in the journal.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ksched_core::events::{Event, Input, JournalEntry};
use ksched_core::records::JobRequest;
use ksched_runtime::status::Shards;
use ksched_runtime::{Config, Scheduler};
use ksched_worker::{Outcome, Worker, WorkerConfig};
use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use tokio_util::sync::CancellationToken;

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(super) struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub samples: usize,
}

impl Percentiles {
    /// `p50 / p99 / p999 ms`.
    pub(super) fn figures(&self) -> String {
        format!("{:.1} / {:.1} / {:.1} ms", self.p50, self.p99, self.p999)
    }

    pub(super) fn of(mut v: Vec<f64>) -> Percentiles {
        if v.is_empty() {
            return Percentiles::default();
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
        Percentiles {
            p50: at(0.50),
            p99: at(0.99),
            p999: at(0.999),
            samples: v.len(),
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Level {
    /// Fraction of saturation offered.
    pub load: f64,
    pub offered_jobs_per_sec: f64,
    pub achieved_jobs_per_sec: f64,
    pub jobs: u64,
    pub submit_to_dispatch_ms: Percentiles,
    /// From the send to the first line of an SDK worker's handler (one clock).
    pub submit_to_handler_ms: Percentiles,
    /// Where submit -> dispatch went, from the broker's and the processor's timestamps.
    pub dispatch_parts: DispatchParts,
    pub submit_to_completed_ms: Percentiles,
    /// Mean input records per transaction, and mean time per batch (processing and
    /// commit), ms, during the level.
    pub mean_batch: f64,
    pub mean_batch_ms: f64,
    /// Mean ms per batch in each phase.
    pub phase_ms_per_batch: BTreeMap<String, f64>,
    /// The machine and the scheduler's threads during the level (Linux only).
    pub machine: Option<super::machine::Usage>,
    /// The [`SLOWEST_LISTED`] jobs slowest from submit to handler start, slowest first:
    /// where a stall was (the scheduler, the commit, or the worker's fetch) and when.
    pub slowest_to_handler: Vec<SlowJob>,
}

/// How many of a level's slowest jobs [`Level::slowest_to_handler`] lists.
const SLOWEST_LISTED: usize = 3;

/// One job's way from submit to handler start, ms: when it was sent (from the level's
/// start), then each step from the previous one: `to_log` and `deciding` as in
/// [`DispatchParts`]; `committing`, from the journal record's creation to the tailer reading
/// the dispatch committed; `to_handler`, from there to an SDK worker's handler starting (the
/// worker's fetch and its queue). A step without its timestamps is absent.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(super) struct SlowJob {
    pub sent_at_ms: f64,
    pub total_ms: f64,
    pub to_log_ms: Option<f64>,
    pub deciding_ms: Option<f64>,
    pub committing_ms: Option<f64>,
    pub to_handler_ms: Option<f64>,
}

impl SlowJob {
    /// One line: the total, when, and its steps.
    pub(super) fn figures(&self) -> String {
        let step = |name: &str, v: Option<f64>| v.map(|v| format!(", {name} {v:.1}"));
        let steps: String = [
            step("to the log", self.to_log_ms),
            step("deciding", self.deciding_ms),
            step("committing", self.committing_ms),
            step("to the handler", self.to_handler_ms),
        ]
        .into_iter()
        .flatten()
        .collect();
        format!(
            "{:.1} ms, sent {:.0} ms into the level{steps} ms",
            self.total_ms, self.sent_at_ms
        )
    }
}

/// Submit -> dispatch in three parts, from timestamps on one clock (the bench and the broker
/// run on one machine): `to_log`, from the send to the broker's append of the input the
/// dispatch was decided on (the submission itself, unless the job waited for capacity);
/// `deciding`, from there to the journal record's creation (the processor fetched it, its
/// batch formed and the decision was made); `committing`, from there until the tailer saw
/// it committed (the rest of the transaction, the markers, the tailer's fetch). Percentiles
/// of each part, and the mean of each part over the slowest 1 % of jobs: what the p99 is
/// made of. And when the slowest 1 % were sent: spread over the level (a steady tail) or
/// bunched in a few moments (stalls, which one level's p99 may or may not meet).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(super) struct DispatchParts {
    pub to_log_ms: Percentiles,
    pub deciding_ms: Percentiles,
    pub committing_ms: Percentiles,
    /// Means over the jobs at or above the p99 of submit -> dispatch: to_log, deciding,
    /// committing.
    pub slowest_1pct_ms: [f64; 3],
    /// In how many of the level's [`SEND_WINDOW_MS`] windows the slowest 1 % were sent, and
    /// the share of them sent in the window that holds most.
    pub slowest_1pct_windows: usize,
    pub slowest_1pct_top_window_share: f64,
    /// Jobs dispatched on a later input than their submission (a result, a heartbeat, a
    /// Tick): no worker had a free slot when they were submitted, so they waited in the
    /// queue, and their *to the log* runs to that later input.
    pub queued: usize,
}

/// The windows the slowest 1 % are counted in, by the time they were sent.
pub(super) const SEND_WINDOW_MS: f64 = 100.0;

/// One job of a latency level: when it was sent, its submit -> dispatch, and its three
/// parts (all ms).
#[derive(Debug, Clone, Copy)]
pub(super) struct Job {
    pub sent: f64,
    pub total: f64,
    pub parts: [f64; 3],
    /// Dispatched on a later input than its submission.
    pub queued: bool,
}

impl DispatchParts {
    fn of(jobs: &[Job]) -> DispatchParts {
        if jobs.is_empty() {
            return DispatchParts::default();
        }
        let part = |i: usize| Percentiles::of(jobs.iter().map(|j| j.parts[i]).collect());
        let p99 = Percentiles::of(jobs.iter().map(|j| j.total).collect()).p99;
        let slow: Vec<&Job> = jobs.iter().filter(|j| j.total >= p99).collect();
        let mean =
            |i: usize| slow.iter().map(|j| j.parts[i]).sum::<f64>() / slow.len().max(1) as f64;
        let mut windows: BTreeMap<i64, usize> = BTreeMap::new();
        for j in &slow {
            *windows
                .entry((j.sent / SEND_WINDOW_MS).floor() as i64)
                .or_default() += 1;
        }
        let top = windows.values().copied().max().unwrap_or(0);
        DispatchParts {
            to_log_ms: part(0),
            deciding_ms: part(1),
            committing_ms: part(2),
            slowest_1pct_ms: [mean(0), mean(1), mean(2)],
            slowest_1pct_windows: windows.len(),
            slowest_1pct_top_window_share: top as f64 / slow.len().max(1) as f64,
            queued: jobs.iter().filter(|j| j.queued).count(),
        }
    }

    /// The figures in one line, as the bench prints them.
    pub(super) fn figures(&self) -> String {
        let [a, b, c] = self.slowest_1pct_ms;
        format!(
            "to the log {:.1} / {:.1}, deciding {:.1} / {:.1}, committing {:.1} / {:.1} ms; slowest 1 %: {a:.1} + {b:.1} + {c:.1} ms, sent in {} windows of {SEND_WINDOW_MS} ms ({:.0} % in one); {} jobs waited in the queue for a worker slot",
            self.to_log_ms.p50,
            self.to_log_ms.p99,
            self.deciding_ms.p50,
            self.deciding_ms.p99,
            self.committing_ms.p50,
            self.committing_ms.p99,
            self.slowest_1pct_windows,
            100.0 * self.slowest_1pct_top_window_share,
            self.queued,
        )
    }
}

/// The journal an idle fleet writes: the rig's workers heartbeating (one a second) with no
/// jobs, for a while.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Idle {
    pub workers: usize,
    pub seconds: f64,
    /// Heartbeat records the processor consumed.
    pub heartbeats: f64,
    /// Journal records and bytes written meanwhile (heartbeats and Ticks).
    pub journal_records: f64,
    pub journal_bytes: f64,
    /// Of which for heartbeats: the journal records beyond the Ticks' (one per Tick read).
    pub heartbeat_journal_records: f64,
    /// Journal bytes per idle worker-hour, from the heartbeats' share of the journal.
    pub journal_bytes_per_worker_hour: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Saturation {
    pub jobs: u64,
    pub seconds: f64,
    pub jobs_per_sec: f64,
    /// Records the processor consumed and produced per job (inputs + journal entries +
    /// dispatches + dead letters), measured.
    pub kafka_records_per_job: f64,
    /// Mean input records per transaction during the run.
    pub mean_batch: f64,
    /// Mean time per batch (processing and commit), ms.
    pub mean_batch_ms: f64,
    /// CPU time of the processor threads per job (their thread CPU clocks,
    /// `ksched_processor_cpu_seconds_total`), microseconds.
    pub processor_cpu_us_per_job: f64,
    /// CPU time of this whole bench process per job (processors, librdkafka's threads, the
    /// SDK workers, the submitter and the tailer; not the broker), microseconds.
    pub process_cpu_us_per_job: f64,
    /// Records and bytes per job the processor consumed and produced, by topic role
    /// (`in jobs`, `out journal`, ...; `ksched_records_total`, `ksched_record_bytes_total`).
    pub per_job_by_topic: BTreeMap<String, PerJob>,
    /// Mean ms per batch in each phase (`ksched_batch_phase_seconds_total`).
    pub phase_ms_per_batch: BTreeMap<String, f64>,
    /// The machine and the scheduler's threads during the run (Linux only).
    pub machine: Option<super::machine::Usage>,
}

/// The phases of a batch, as the processor times them: on the processor thread decide,
/// wait (for the previous batch to commit), prepare (wait for the previous batch's
/// projection write, evict, encode this batch's changes), send and persist (hand them to the
/// writing thread); on the transaction thread, overlapping the next batch's decide when
/// pipelined, offsets, deliveries and commit.
pub(super) const PHASES: [&str; 8] = [
    "decide",
    "wait",
    "prepare",
    "send",
    "offsets",
    "deliveries",
    "commit",
    "persist",
];

/// Records and bytes per job on one topic role.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub(super) struct PerJob {
    pub records: f64,
    pub bytes: f64,
}

/// Topic roles the processor reads (`in`) and writes (`out`).
const ROLES: [(&str, &str); 7] = [
    ("in", "jobs"),
    ("in", "results"),
    ("in", "heartbeats"),
    ("in", "control"),
    ("out", "journal"),
    ("out", "dispatch"),
    ("out", "dlq"),
];

impl Saturation {
    /// The run with the median throughput.
    pub(super) fn median(mut runs: Vec<Saturation>) -> Saturation {
        runs.sort_by(|a, b| a.jobs_per_sec.total_cmp(&b.jobs_per_sec));
        runs.swap_remove(runs.len() / 2)
    }
}

/// When each job was sent, dispatched and completed (ms on one clock).
#[derive(Default)]
struct Times {
    sent: HashMap<String, f64>,
    dispatched: HashMap<String, f64>,
    /// For each first dispatch: when the input it was decided on was appended, when its
    /// journal record was created (ms on the same clock as `sent`), and whether that input
    /// was a later one than the job's submission (it waited in the queue).
    dispatch_marks: HashMap<String, (f64, f64, bool)>,
    /// When an SDK worker's handler first began each job.
    started: HashMap<String, f64>,
    completed: HashMap<String, f64>,
}

/// A running scheduler with workers, a tailer and a submitter. With several pools (and
/// shards), the workers are spread over the pools and the jobs over the job topics.
pub(super) struct Rig {
    config: Config,
    scheduler: Option<Scheduler>,
    shards: Shards,
    rt: tokio::runtime::Runtime,
    workers_stop: CancellationToken,
    workers: Vec<tokio::task::JoinHandle<ksched_worker::Result<()>>>,
    tail_stop: Arc<AtomicBool>,
    tailer: Option<std::thread::JoinHandle<()>>,
    times: Arc<Mutex<Times>>,
    producer: BaseProducer,
    epoch: Instant,
    seq: u64,
    label: String,
    /// Jobs submitted carry one of this many concurrency keys (the `concurrency_key`
    /// label), in turn.
    pub(super) keys: Option<u64>,
    /// Jobs submitted belong to these tenants, in turn (default: ten tenants).
    pub(super) tenants: Option<Vec<String>>,
}

fn now_ms(epoch: Instant) -> f64 {
    epoch.elapsed().as_secs_f64() * 1000.0
}

/// The wall clock, ms since the Unix epoch (what the broker's timestamps are in).
fn wall_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Delayed jobs end to end ([`Rig::timers`]).
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Timed {
    pub jobs: u64,
    pub window_seconds: f64,
    /// Jobs falling due per second.
    pub jobs_per_sec: f64,
    pub submit_seconds: f64,
    /// How long before the first job's time the last was submitted (negative: after).
    pub submitted_before_due_ms: f64,
    /// Due -> the journal entry that released and dispatched it (its log time).
    pub due_to_decided_ms: Percentiles,
    /// Due -> its dispatch read committed from the journal.
    pub due_to_dispatch_visible_ms: Percentiles,
    /// Jobs whose dispatch was decided before their time (never, if timers are right).
    pub early: usize,
}

/// The clients of a rig: its SDK workers (how many, and how many jobs each runs at once),
/// and how its job producer batches.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(super) struct Fleet {
    pub workers: usize,
    pub slots: usize,
    /// How long each job takes at a worker (0: it succeeds at once).
    pub work_ms: u64,
    /// `linger.ms` of the producer that submits the jobs.
    pub submit_linger_ms: u64,
}

impl Rig {
    /// Starts the scheduler (on `config`, whose data directory may hold history), the
    /// fleet's SDK workers (at least one per pool, spread over the pools) and the journal
    /// tailer (every shard's journal partition).
    pub(super) fn start(
        config: Config,
        client: ClientConfig,
        fleet: Fleet,
        label: &str,
    ) -> Result<Rig> {
        let workers = fleet.workers;
        let settings = config.settings.clone();
        let topics = ksched_runtime::topics_of(&config);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let scheduler = rt.block_on(Scheduler::start(config.clone()))?;
        let shards = scheduler.shards.clone();
        anyhow::ensure!(
            scheduler.wait_ready(Duration::from_secs(600)),
            "the scheduler did not recover within 10 minutes: {}",
            shards.stopped().unwrap_or_default()
        );
        let pools: Vec<String> = config.rules.pools.keys().cloned().collect();
        let workers = workers.max(pools.len());
        let epoch = Instant::now();
        let epoch_wall = wall_ms();
        let times = Arc::new(Mutex::new(Times::default()));
        let tail_stop = Arc::new(AtomicBool::new(false));
        let tailer = {
            let journal = &topics.journal;
            let consumer = super::journal_from_end(
                &client,
                journal,
                settings.topics.journal_partitions,
                &format!("{journal}-bench-tail"),
            )?;
            let (times, stop) = (times.clone(), tail_stop.clone());
            std::thread::spawn(move || tail(&consumer, &times, &stop, epoch, epoch_wall))
        };
        let workers_stop = CancellationToken::new();
        let mut handles = Vec::new();
        let bootstrap = settings.kafka.bootstrap_servers.clone();
        {
            let _guard = rt.enter();
            for i in 0..workers {
                let pool = &pools[i % pools.len()];
                let mut cfg = WorkerConfig::new(&bootstrap, &format!("{label}-worker-{i}"), pool)
                    .with_properties(settings.kafka.properties.clone());
                cfg.topic_prefix = settings.topics.prefix.clone();
                cfg.max_parallel_jobs = fleet.slots;
                cfg.heartbeat_interval = Duration::from_secs(1);
                cfg.report_host_load = false;
                let worker = Worker::new(cfg)?;
                let stop = workers_stop.clone();
                let work = Duration::from_millis(fleet.work_ms);
                let times = times.clone();
                handles.push(rt.spawn(async move {
                    worker
                        .run(
                            move |job| {
                                // The handler's first line: submit -> handler start.
                                let at = now_ms(epoch);
                                if let Ok(mut t) = times.lock() {
                                    t.started.entry(job.job_id().to_owned()).or_insert(at);
                                }
                                async move {
                                    if !work.is_zero() {
                                        tokio::time::sleep(work).await;
                                    }
                                    Outcome::succeeded()
                                }
                            },
                            stop,
                        )
                        .await
                }));
            }
        }
        let producer: BaseProducer = client
            .clone()
            .set("enable.idempotence", "true")
            .set("linger.ms", fleet.submit_linger_ms.to_string())
            .set("queue.buffering.max.messages", "1000000")
            .create()?;
        let rig = Rig {
            config,
            scheduler: Some(scheduler),
            shards,
            rt,
            workers_stop,
            workers: handles,
            tail_stop,
            tailer: Some(tailer),
            times,
            producer,
            epoch,
            seq: 0,
            label: label.to_owned(),
            keys: None,
            tenants: None,
        };
        rig.wait_workers(workers)?;
        Ok(rig)
    }

    /// Waits until the scheduler knows `n` live workers (over every pool of every shard).
    fn wait_workers(&self, n: usize) -> Result<()> {
        let started = Instant::now();
        loop {
            let ready: i64 = self
                .shards
                .0
                .iter()
                .flat_map(|s| {
                    self.config
                        .rules
                        .pools
                        .keys()
                        .map(|p| s.metrics.workers.with_label_values(&[p, "true"]).get())
                })
                .sum();
            if ready >= i64::try_from(n).unwrap_or(i64::MAX) {
                return Ok(());
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(60),
                "workers never joined"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Submits `n` jobs, at `rate` per second or as fast as possible, round-robin over the
    /// job topics; returns their ids.
    pub(super) fn submit(&mut self, n: u64, rate: Option<f64>) -> Result<Vec<String>> {
        self.submit_at(n, rate, |_| None)
    }

    /// [`Rig::submit`], the `i`th job to run no earlier than `not_before(i)` (epoch ms).
    fn submit_at(
        &mut self,
        n: u64,
        rate: Option<f64>,
        not_before: impl Fn(u64) -> Option<i64>,
    ) -> Result<Vec<String>> {
        let topics = ksched_runtime::topics_of(&self.config).jobs;
        let started = Instant::now();
        let mut ids = Vec::with_capacity(n as usize);
        for i in 0..n {
            if let Some(r) = rate {
                let due = Duration::from_secs_f64(i as f64 / r);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            self.seq += 1;
            let topic = &topics[(self.seq as usize) % topics.len()];
            let id = format!("{}-{}", self.label, self.seq);
            let mut req = JobRequest {
                job_id: id.clone(),
                topic: topic.clone(),
                tenant_id: match &self.tenants {
                    Some(t) if !t.is_empty() => t[(self.seq as usize) % t.len()].clone(),
                    _ => format!("tenant-{}", self.seq % 10),
                },
                submitted_at: 0,
                not_before: not_before(i),
                ..Default::default()
            };
            if let Some(keys) = self.keys {
                req.labels.insert(
                    ksched_core::rules::ConcurrencyRule::DEFAULT_LABEL.to_owned(),
                    format!("key-{}", self.seq % keys.max(1)),
                );
            }
            let bytes = ksched_codec::encode(&req)?;
            self.times
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?
                .sent
                .insert(id.clone(), now_ms(self.epoch));
            super::send(
                &self.producer,
                BaseRecord::to(topic).key(&id).payload(&bytes),
            )?;
            self.producer.poll(Duration::ZERO);
            ids.push(id);
        }
        self.producer.flush(Duration::from_secs(60))?;
        Ok(ids)
    }

    /// Submits `n` jobs no worker can take (a placement label none has) as fast as
    /// possible, round-robin over the job topics, without timing them; then waits until the
    /// scheduler holds them all queued, at most `limit`.
    pub(super) fn submit_unplaceable(&mut self, n: u64, limit: Duration) -> Result<()> {
        let topics = ksched_runtime::topics_of(&self.config).jobs;
        let queued = || -> i64 {
            (self.shards.0.iter())
                .map(|s| s.metrics.queue_depth.with_label_values(&["default"]).get())
                .sum()
        };
        let before = queued();
        for i in 0..n {
            let topic = &topics[(i as usize) % topics.len()];
            let id = format!("{}-waiting-{i}", self.label);
            let mut req = JobRequest {
                job_id: id.clone(),
                topic: topic.clone(),
                tenant_id: format!("waiting-{}", i % 10),
                ..Default::default()
            };
            req.labels.insert("placement.zone".into(), "nowhere".into());
            let bytes = ksched_codec::encode(&req)?;
            super::send(
                &self.producer,
                BaseRecord::to(topic).key(&id).payload(&bytes),
            )?;
            self.producer.poll(Duration::ZERO);
        }
        self.producer.flush(Duration::from_secs(120))?;
        let started = Instant::now();
        let want = before + i64::try_from(n).unwrap_or(i64::MAX);
        while queued() < want {
            anyhow::ensure!(
                started.elapsed() < limit,
                "{} of {n} waiting jobs queued after {limit:?}",
                queued() - before
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// When each job was sent and first dispatched (ms since the rig started; the
    /// dispatch's journal record, as the tailer read it), None while not dispatched.
    pub(super) fn sent_and_dispatched(&self, ids: &[String]) -> Result<Vec<(f64, Option<f64>)>> {
        let t = self.times.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        Ok(ids
            .iter()
            .map(|i| {
                (
                    t.sent.get(i).copied().unwrap_or(f64::NAN),
                    t.dispatched.get(i).copied(),
                )
            })
            .collect())
    }

    pub(super) fn wait_completed(&self, ids: &[String], limit: Duration) -> Result<()> {
        let started = Instant::now();
        // Jobs complete roughly in order: resume the scan where the last one stopped.
        let mut done = 0;
        loop {
            {
                let t = self.times.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                while done < ids.len() && t.completed.contains_key(&ids[done]) {
                    done += 1;
                }
            }
            if done == ids.len() {
                return Ok(());
            }
            anyhow::ensure!(
                started.elapsed() < limit,
                "only {done} of {} jobs completed within {limit:?}",
                ids.len()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Records consumed and produced so far (every topic role), summed over the shards.
    fn io_records(&self) -> f64 {
        self.by_topic().values().map(|t| t.records).sum()
    }

    /// Records and bytes so far per topic role, summed over the shards.
    fn by_topic(&self) -> BTreeMap<String, PerJob> {
        ROLES
            .iter()
            .map(|(direction, topic)| {
                let mut t = PerJob::default();
                for s in &self.shards.0 {
                    let m = &s.metrics;
                    t.records += m.records.with_label_values(&[direction, topic]).get() as f64;
                    t.bytes += m.record_bytes.with_label_values(&[direction, topic]).get() as f64;
                }
                (format!("{direction} {topic}"), t)
            })
            .collect()
    }

    /// Seconds so far in each batch phase, summed over the shards.
    fn phases(&self) -> BTreeMap<String, f64> {
        PHASES
            .iter()
            .map(|p| {
                let secs = self
                    .shards
                    .0
                    .iter()
                    .map(|s| s.metrics.batch_phases.with_label_values(&[p]).get())
                    .sum();
                ((*p).to_owned(), secs)
            })
            .collect()
    }

    /// Summed over the shards: batches' records, batches, their seconds, and the
    /// processors' CPU seconds.
    fn batch_totals(&self) -> (f64, u64, f64, f64) {
        self.shards.0.iter().fold((0.0, 0, 0.0, 0.0), |t, s| {
            let m = &s.metrics;
            (
                t.0 + m.batch_size.get_sample_sum(),
                t.1 + m.batch_size.get_sample_count(),
                t.2 + m.commit_latency.get_sample_sum(),
                t.3 + m.processor_cpu.get(),
            )
        })
    }

    /// As many jobs as fast as possible: the completion rate is the saturation throughput.
    pub(super) fn saturation(&mut self, jobs: u64) -> Result<Saturation> {
        let before = self.io_records();
        let (b0, n0, c0, cpu0) = self.batch_totals();
        let topics0 = self.by_topic();
        let phases0 = self.phases();
        let process0 = process_cpu_seconds();
        let machine0 = super::machine::read();
        let t0 = now_ms(self.epoch);
        let ids = self.submit(jobs, None)?;
        self.wait_completed(&ids, Duration::from_secs(600))?;
        let machine = super::machine::Usage::between(&machine0, &super::machine::read());
        let t = self.times.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        let last = ids
            .iter()
            .filter_map(|i| t.completed.get(i))
            .fold(0.0f64, |a, b| a.max(*b));
        let seconds = ((last - t0) / 1000.0).max(1e-9);
        let (b1, n1, c1, cpu1) = self.batch_totals();
        let batches = (n1 - n0).max(1) as f64;
        let per_job_us = |secs: f64| 1e6 * secs / jobs as f64;
        Ok(Saturation {
            jobs,
            seconds,
            jobs_per_sec: jobs as f64 / seconds,
            kafka_records_per_job: (self.io_records() - before) / jobs as f64,
            mean_batch: (b1 - b0) / batches,
            mean_batch_ms: 1000.0 * (c1 - c0) / batches,
            processor_cpu_us_per_job: per_job_us(cpu1 - cpu0),
            process_cpu_us_per_job: per_job_us(process_cpu_seconds() - process0),
            phase_ms_per_batch: per_batch_ms(&phases0, &self.phases(), batches),
            machine,
            per_job_by_topic: self
                .by_topic()
                .into_iter()
                .map(|(k, v)| {
                    let before = topics0.get(&k).copied().unwrap_or_default();
                    let per_job = PerJob {
                        records: (v.records - before.records) / jobs as f64,
                        bytes: (v.bytes - before.bytes) / jobs as f64,
                    };
                    (k, per_job)
                })
                .collect(),
        })
    }

    /// Nothing submitted for `seconds`: what the idle workers' heartbeats cost the journal.
    pub(super) fn idle(&mut self, seconds: f64) -> Result<Idle> {
        let t0 = self.by_topic();
        std::thread::sleep(Duration::from_secs_f64(seconds));
        let t1 = self.by_topic();
        let d = |k: &str| {
            let (a, b) = (
                t0.get(k).copied().unwrap_or_default(),
                t1.get(k).copied().unwrap_or_default(),
            );
            PerJob {
                records: b.records - a.records,
                bytes: b.bytes - a.bytes,
            }
        };
        let (journal, heartbeats, control) =
            (d("out journal"), d("in heartbeats"), d("in control"));
        // Every Tick read makes a journal entry; what else is journaled meanwhile is the
        // heartbeats'.
        let beats = (journal.records - control.records).max(0.0);
        let bytes_per_record = journal.bytes / journal.records.max(1.0);
        let workers = self.workers.len();
        Ok(Idle {
            workers,
            seconds,
            heartbeats: heartbeats.records,
            journal_records: journal.records,
            journal_bytes: journal.bytes,
            heartbeat_journal_records: beats,
            journal_bytes_per_worker_hour: beats * bytes_per_record * 3600.0
                / (seconds * workers.max(1) as f64),
        })
    }

    /// Jobs offered at `rate` a second for `seconds`, whatever the saturation (a level as
    /// users size a system); `load` is then the fraction of `saturation` it came to.
    pub(super) fn level_at(&mut self, rate: f64, saturation: f64, seconds: f64) -> Result<Level> {
        self.offer(rate.max(1.0), rate / saturation.max(1.0), seconds)
    }

    /// An open-loop load of `load` x `saturation` jobs/s for `seconds`.
    pub(super) fn level(&mut self, load: f64, saturation: f64, seconds: f64) -> Result<Level> {
        self.offer((load * saturation).max(1.0), load, seconds)
    }

    /// `rate` jobs a second for `seconds`, open loop; `load` is what the level reports it as.
    fn offer(&mut self, rate: f64, load: f64, seconds: f64) -> Result<Level> {
        let n = (rate * seconds).ceil().max(1.0) as u64;
        let (b0, n0, c0, _) = self.batch_totals();
        let phases0 = self.phases();
        let machine0 = super::machine::read();
        let t0 = now_ms(self.epoch);
        let ids = self.submit(n, Some(rate))?;
        self.wait_completed(&ids, Duration::from_secs(600))?;
        let machine = super::machine::Usage::between(&machine0, &super::machine::read());
        let t = self.times.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        let mut dispatch = Vec::new();
        let mut parts = Vec::new();
        let mut completed = Vec::new();
        let mut started = Vec::new();
        let mut slowest: Vec<(f64, &String)> = Vec::new();
        let mut last = t0;
        for id in &ids {
            let sent = t.sent[id];
            if let Some(h) = t.started.get(id) {
                started.push(h - sent);
                slowest.push((h - sent, id));
            }
            if let Some(d) = t.dispatched.get(id) {
                dispatch.push(d - sent);
                if let Some((logged, created, queued)) = t.dispatch_marks.get(id) {
                    parts.push(Job {
                        sent,
                        total: d - sent,
                        parts: [logged - sent, created - logged, d - created],
                        queued: *queued,
                    });
                }
            }
            if let Some(c) = t.completed.get(id) {
                completed.push(c - sent);
                last = last.max(*c);
            }
        }
        slowest.sort_by(|a, b| b.0.total_cmp(&a.0));
        let slowest_to_handler = (slowest.iter().take(SLOWEST_LISTED))
            .map(|(total, id)| {
                let sent = t.sent[*id];
                let marks = t.dispatch_marks.get(*id);
                let visible = t.dispatched.get(*id).copied();
                SlowJob {
                    sent_at_ms: sent - t0,
                    total_ms: *total,
                    to_log_ms: marks.map(|(logged, _, _)| logged - sent),
                    deciding_ms: marks.map(|(logged, created, _)| created - logged),
                    committing_ms: marks.zip(visible).map(|((_, created, _), d)| d - created),
                    to_handler_ms: visible.map(|d| sent + total - d),
                }
            })
            .collect();
        let (b1, n1, c1, _) = self.batch_totals();
        let batches = (n1 - n0).max(1) as f64;
        Ok(Level {
            slowest_to_handler,
            phase_ms_per_batch: per_batch_ms(&phases0, &self.phases(), batches),
            machine,
            mean_batch: (b1 - b0) / batches,
            mean_batch_ms: 1000.0 * (c1 - c0) / batches,
            load,
            offered_jobs_per_sec: rate,
            achieved_jobs_per_sec: n as f64 / ((last - t0) / 1000.0).max(1e-9),
            jobs: n,
            submit_to_dispatch_ms: Percentiles::of(dispatch),
            submit_to_handler_ms: Percentiles::of(started),
            dispatch_parts: DispatchParts::of(&parts),
            submit_to_completed_ms: Percentiles::of(completed),
        })
    }

    /// `jobs` delayed jobs, submitted as fast as possible `lead` ahead of the first's time
    /// and due evenly over `window`: how late each release was decided (the dispatch's
    /// journal entry's log time) and how late its dispatch became visible committed (when
    /// the tailer read it), after its time.
    pub(super) fn timers(&mut self, jobs: u64, window: Duration, lead: Duration) -> Result<Timed> {
        let first_due = wall_ms() + lead.as_secs_f64() * 1000.0;
        let step = window.as_secs_f64() * 1000.0 / jobs.max(1) as f64;
        let due_of = |i: u64| (first_due + i as f64 * step) as i64;
        let started = Instant::now();
        let ids = self.submit_at(jobs, None, |i| Some(due_of(i)))?;
        let submit_seconds = started.elapsed().as_secs_f64();
        let submitted_before_due_ms = first_due - wall_ms();
        self.wait_completed(&ids, window + lead + Duration::from_secs(600))?;
        let epoch_wall = wall_ms() - now_ms(self.epoch);
        let t = self.times.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        let (mut decided, mut visible, mut early) = (Vec::new(), Vec::new(), 0);
        for (i, id) in ids.iter().enumerate() {
            let due = due_of(i as u64) as f64 - epoch_wall;
            if let Some((logged, _, _)) = t.dispatch_marks.get(id) {
                decided.push(logged - due);
                early += usize::from(*logged < due - 1.0);
            }
            if let Some(d) = t.dispatched.get(id) {
                visible.push(d - due);
            }
        }
        Ok(Timed {
            jobs,
            window_seconds: window.as_secs_f64(),
            jobs_per_sec: jobs as f64 / window.as_secs_f64().max(1e-9),
            submit_seconds,
            submitted_before_due_ms,
            due_to_decided_ms: Percentiles::of(decided),
            due_to_dispatch_visible_ms: Percentiles::of(visible),
            early,
        })
    }

    pub(super) fn stop(mut self) -> Result<()> {
        self.workers_stop.cancel();
        let handles = std::mem::take(&mut self.workers);
        self.rt.block_on(async {
            for h in handles {
                let _ = h.await;
            }
        });
        self.tail_stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.tailer.take() {
            let _ = t.join();
        }
        if let Some(s) = self.scheduler.take() {
            s.stop().context("processor")?;
        }
        Ok(())
    }
}

/// Follows the journal from its end, noting when each job's first dispatch and its success
/// become visible (committed).
/// `epoch_wall`: the wall clock at `epoch`, to put the records' timestamps on its clock.
fn tail(
    consumer: &BaseConsumer,
    times: &Mutex<Times>,
    stop: &AtomicBool,
    epoch: Instant,
    epoch_wall: f64,
) {
    while !stop.load(Ordering::Relaxed) {
        let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let at = now_ms(epoch);
        let Some(Ok(entry)) = m.payload().map(ksched_codec::decode::<JournalEntry>) else {
            continue;
        };
        let Ok(mut t) = times.lock() else { return };
        for e in &entry.events {
            match e {
                Event::JobDispatched(d) if d.attempt == 1 => {
                    t.dispatched.insert(d.job_id.clone(), at);
                    if let Some(created) = m.timestamp().to_millis() {
                        let logged = entry.log_time as f64 - epoch_wall;
                        let created = created as f64 - epoch_wall;
                        let queued =
                            !matches!(&entry.input, Input::Submit(r) if r.job_id == d.job_id);
                        t.dispatch_marks
                            .insert(d.job_id.clone(), (logged, created, queued));
                    }
                }
                Event::JobSucceeded(s) => {
                    t.completed.insert(s.job_id.clone(), at);
                }
                _ => {}
            }
        }
    }
}

/// CPU time (user + system) of this process so far, in seconds, from `/proc/self/stat`
/// (clock ticks of 10 ms); 0 where Linux does not say.
fn process_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // The command name may hold spaces: the fields that follow start after its ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    ticks(11)
        .zip(ticks(12))
        .map_or(0.0, |(u, s)| (u + s) / 100.0)
}

/// Mean ms per batch in each phase between two readings.
fn per_batch_ms(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    batches: f64,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0.0);
            (k.clone(), 1000.0 * d / batches)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1,000 jobs sent every 10 ms, each a little slower than the one before (no ties), of
    /// which those `slow` says took 100 ms more: the slowest 1 % when they are 11.
    fn level(slow: impl Fn(usize) -> bool) -> Vec<Job> {
        (0..1_000)
            .map(|i| {
                let total = 20.0 + i as f64 / 1_000.0 + if slow(i) { 100.0 } else { 0.0 };
                Job {
                    sent: i as f64 * 10.0,
                    total,
                    parts: [total / 4.0, total / 4.0, total / 2.0],
                    queued: slow(i),
                }
            })
            .collect()
    }

    #[test]
    fn the_slowest_jobs_of_one_stall_are_in_one_window() {
        let parts = DispatchParts::of(&level(|i| (500..511).contains(&i)));
        // Sent from 5,000 to 5,100 ms: the windows of 5,000 and 5,100.
        assert_eq!(parts.slowest_1pct_windows, 2, "{parts:?}");
        assert!((parts.slowest_1pct_top_window_share - 10.0 / 11.0).abs() < 1e-9);
        assert!((parts.slowest_1pct_ms[2] - (120.505 / 2.0)).abs() < 1e-9);
        assert_eq!(parts.queued, 11);
    }

    #[test]
    fn a_steady_tail_is_spread_over_the_level() {
        let parts = DispatchParts::of(&level(|i| i % 91 == 0));
        assert_eq!(parts.slowest_1pct_windows, 11, "{parts:?}");
        assert!((parts.slowest_1pct_top_window_share - 1.0 / 11.0).abs() < 1e-9);
    }
}
