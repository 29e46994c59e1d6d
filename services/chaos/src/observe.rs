//! The steady load and what the suite watches: jobs produced at a fixed rate, SDK workers
//! that count what they run, and a reader that follows the journal (read_committed, from
//! its start) and keeps what the verdict needs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use ksched_core::events::{Event, Input, JobState, JournalEntry};
use ksched_core::records::JobRequest;
use ksched_runtime::tail::PartitionTail;
use ksched_worker::{Outcome, Worker, WorkerConfig};
use rdkafka::ClientConfig;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use tokio_util::sync::CancellationToken;

pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// What the journal says so far.
#[derive(Debug, Default)]
pub(super) struct Seen {
    pub accepted: BTreeSet<String>,
    /// Terminal events per job (more than one is a bug).
    pub terminal: BTreeMap<String, Vec<JobState>>,
    /// Why a job ended other than SUCCEEDED: its reason code, after the error codes of the
    /// attempts retried before (`max_retries_exceeded after worker_lost, timeout`).
    pub why: BTreeMap<String, String>,
    /// Error codes of each job's retried attempts, in order.
    pub retried: BTreeMap<String, Vec<String>>,
    pub dispatched: BTreeMap<(String, i32), u32>,
    pub workers_lost: Vec<(String, i64)>,
    pub dead_letters: BTreeMap<String, u64>,
    pub clock_gaps: u64,
    /// Log times of decisions that moved jobs (dispatches and results), in order.
    pub decisions: Vec<i64>,
    /// Ticks by their source, with the log time of the first one.
    pub tick_sources: BTreeMap<String, i64>,
    pub entries: u64,
    /// Errors the journal reader saw, and the last one.
    pub read_errors: u64,
    pub last_read_error: Option<String>,
    /// How often the reader replaced a stalled consumer.
    pub reader_replaced: u64,
}

/// Follows a journal from offset 0 on a thread.
#[derive(Debug)]
pub(super) struct JournalWatch {
    pub seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl JournalWatch {
    pub(super) fn start(bootstrap: &str, topic: &str) -> Result<JournalWatch> {
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", bootstrap)
            .set("group.id", format!("{topic}-chaos-watch"))
            .set("fetch.wait.max.ms", "20");
        // A tail, not a bare consumer: after a broker restart, a bare consumer once read
        // nothing more and 876 jobs looked lost (librdkafka#5153).
        let mut tail =
            PartitionTail::new(&client, topic, 0, 0)?.stall_after(Duration::from_secs(5));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let m = match tail.poll(Duration::from_millis(100)) {
                        Ok(Some(m)) => m,
                        Ok(None) => continue,
                        Err(e) => {
                            if let Ok(mut s) = seen.lock() {
                                s.read_errors += 1;
                                s.last_read_error = Some(e.to_string());
                            }
                            std::thread::sleep(Duration::from_millis(100));
                            continue;
                        }
                    };
                    let Some(Ok(entry)) = m.payload().map(ksched_codec::decode::<JournalEntry>)
                    else {
                        continue;
                    };
                    if let Ok(mut s) = seen.lock() {
                        note(&mut s, &entry);
                        s.reader_replaced = tail.replaced();
                    }
                }
            })
        };
        Ok(JournalWatch {
            seen,
            stop,
            thread: Some(thread),
        })
    }

    pub(super) fn with<R>(&self, f: impl FnOnce(&Seen) -> R) -> R {
        let s = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        f(&s)
    }
}

impl Drop for JournalWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A job ended in `state` (not SUCCEEDED) with `code`: noted with why, the error codes of
/// its retried attempts first.
fn ended(s: &mut Seen, job_id: &str, state: JobState, code: &str) {
    s.terminal.entry(job_id.to_owned()).or_default().push(state);
    let why = match s.retried.get(job_id) {
        Some(codes) if !codes.is_empty() => format!("{code} after {}", codes.join(", ")),
        _ => code.to_owned(),
    };
    s.why.insert(job_id.to_owned(), why);
}

fn note(s: &mut Seen, entry: &JournalEntry) {
    s.entries += 1;
    if let Input::Tick(t) = &entry.input {
        s.tick_sources
            .entry(t.source.clone())
            .or_insert(entry.log_time);
    }
    for e in &entry.events {
        match e {
            Event::JobAccepted(a) => {
                s.accepted.insert(a.job_id.clone());
            }
            Event::JobDispatched(d) => {
                *s.dispatched
                    .entry((d.job_id.clone(), d.attempt))
                    .or_default() += 1;
                s.decisions.push(entry.log_time);
            }
            Event::JobSucceeded(x) => {
                s.terminal
                    .entry(x.job_id.clone())
                    .or_default()
                    .push(JobState::Succeeded);
                s.decisions.push(entry.log_time);
            }
            Event::JobRetrying(x) => s
                .retried
                .entry(x.job_id.clone())
                .or_default()
                .push(x.error_code.clone()),
            Event::JobFailed(x) => ended(s, &x.job_id, JobState::Failed, &x.reason_code),
            Event::JobTimedOut(x) => ended(s, &x.job_id, JobState::Timeout, &x.reason_code),
            Event::JobCancelled(x) => s
                .terminal
                .entry(x.job_id.clone())
                .or_default()
                .push(JobState::Cancelled),
            Event::JobDenied(x) => s
                .terminal
                .entry(x.job_id.clone())
                .or_default()
                .push(JobState::Denied),
            Event::WorkerLost(l) => s.workers_lost.push((l.worker_id.clone(), entry.log_time)),
            Event::DeadLettered(d) => {
                *s.dead_letters
                    .entry(d.dead_letter.reason_code.clone())
                    .or_default() += 1
            }
            Event::ClockGap(_) => s.clock_gaps += 1,
            _ => {}
        }
    }
}

/// Jobs produced at a steady rate on a thread until stopped.
///
/// The load is a careful client: each job is kept until the broker acknowledged it, sent
/// again when its delivery failed, and the producer is replaced (every unacknowledged job
/// sent again on the new one) when it stops delivering. After a broker restart, librdkafka's
/// idempotent producer once delivered nothing more for minutes (937 of 1,097 jobs of a
/// `broker-restart` run never reached the broker, and the verdict called them lost). A job
/// sent twice is the same record, which the scheduler takes once (`JobDuplicate`).
#[derive(Debug)]
pub(super) struct Load {
    pub ids: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Delivered>>,
}

/// What the load's producer made of the jobs it was given.
#[derive(Debug, Default)]
pub(super) struct Delivered {
    /// Jobs never acknowledged by the broker, even by a new producer.
    pub undelivered: BTreeSet<String>,
    /// How often a job was sent again, how often the producer was replaced, and the last
    /// delivery error.
    pub resent: u64,
    pub replaced: u64,
    pub last_error: Option<String>,
}

impl Delivered {
    /// A note for the verdict, when the producer had to work for it.
    pub(super) fn note(&self) -> Option<String> {
        if self.resent == 0 && self.replaced == 0 && self.undelivered.is_empty() {
            return None;
        }
        let mut note = format!(
            "the load's producer sent {} jobs again and was replaced {} times",
            self.resent, self.replaced
        );
        if let Some(e) = &self.last_error {
            note.push_str(&format!(" (last delivery error: {e})"));
        }
        if !self.undelivered.is_empty() {
            note.push_str(&format!(
                "; {} jobs never reached the broker (first: {})",
                self.undelivered.len(),
                self.undelivered.iter().next().map_or("", String::as_str)
            ));
        }
        Some(note)
    }
}

/// Delivery reports of the load's producer, by job number (0: a record not tracked, such as
/// a poison record).
#[derive(Debug, Default)]
pub(super) struct LoadDeliveries {
    reports: Mutex<Vec<(usize, Option<String>)>>,
}

impl rdkafka::ClientContext for LoadDeliveries {}

impl rdkafka::producer::ProducerContext for LoadDeliveries {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, n: usize) {
        if n == 0 {
            return;
        }
        let error = result.as_ref().err().map(|(e, _)| e.to_string());
        if let Ok(mut r) = self.reports.lock() {
            r.push((n, error));
        }
    }
}

/// The load's producer.
pub(super) type LoadProducer = BaseProducer<LoadDeliveries>;

/// A producer that acknowledged nothing for this long while jobs wait is replaced.
const LOAD_PRODUCER_STALL: Duration = Duration::from_secs(10);
/// How long the load waits, once stopped, for its last jobs to be acknowledged.
const LOAD_DRAIN: Duration = Duration::from_secs(120);

/// The load thread's producer and the jobs it has not seen acknowledged.
struct Sender {
    config: ClientConfig,
    producer: LoadProducer,
    /// Job number -> (id, record), until acknowledged.
    outstanding: BTreeMap<usize, (String, Vec<u8>)>,
    topic: String,
    last_ack: Instant,
    delivered: Delivered,
}

impl Sender {
    fn new(config: ClientConfig, topic: &str) -> Result<Sender> {
        let producer = config.create_with_context(LoadDeliveries::default())?;
        Ok(Sender {
            config,
            producer,
            outstanding: BTreeMap::new(),
            topic: topic.to_owned(),
            last_ack: Instant::now(),
            delivered: Delivered::default(),
        })
    }

    fn send(&mut self, n: usize, id: String, bytes: Vec<u8>) {
        send_tracked(&self.producer, &self.topic, n, &id, &bytes);
        self.outstanding.insert(n, (id, bytes));
    }

    /// Serves delivery reports for up to `wait`: acknowledged jobs are done, failed ones
    /// sent again; a producer that stalled is replaced.
    fn poll(&mut self, wait: Duration) {
        self.producer.poll(wait);
        let reports = self
            .producer
            .context()
            .reports
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default();
        for (n, error) in reports {
            match error {
                None => {
                    self.outstanding.remove(&n);
                    self.last_ack = Instant::now();
                }
                Some(e) => {
                    self.delivered.last_error = Some(e);
                    if let Some((id, bytes)) = self.outstanding.get(&n) {
                        send_tracked(&self.producer, &self.topic, n, id, bytes);
                        self.delivered.resent += 1;
                    }
                }
            }
        }
        if self.outstanding.is_empty() {
            self.last_ack = Instant::now();
        } else if self.last_ack.elapsed() > LOAD_PRODUCER_STALL {
            self.replace();
        }
    }

    fn replace(&mut self) {
        let Ok(fresh) = self
            .config
            .create_with_context::<_, LoadProducer>(LoadDeliveries::default())
        else {
            return;
        };
        // The old producer's queue is dropped with it; its jobs go out again on the new one.
        self.producer = fresh;
        self.delivered.replaced += 1;
        for (n, (id, bytes)) in &self.outstanding {
            send_tracked(&self.producer, &self.topic, *n, id, bytes);
            self.delivered.resent += 1;
        }
        self.last_ack = Instant::now();
    }

    /// Waits up to `limit` for every job to be acknowledged.
    fn drain(mut self, limit: Duration) -> Delivered {
        let until = Instant::now() + limit;
        while !self.outstanding.is_empty() && Instant::now() < until {
            self.poll(Duration::from_millis(100));
        }
        self.delivered.undelivered = self.outstanding.into_values().map(|(id, _)| id).collect();
        self.delivered
    }
}

/// Queues one tracked record, waiting while the producer's queue is full.
fn send_tracked(producer: &LoadProducer, topic: &str, n: usize, key: &str, bytes: &[u8]) {
    let mut record = BaseRecord::with_opaque_to(topic, n).key(key).payload(bytes);
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((_, back)) => {
                producer.poll(Duration::from_millis(10));
                record = back;
            }
        }
    }
}

impl Load {
    /// `rate` jobs per second to `topic`; `extra(n)` may add a poison record after job n
    /// (sent untracked: with opaque 0).
    pub(super) fn start(
        bootstrap: &str,
        topic: &str,
        prefix: &str,
        rate: f64,
        mut extra: impl FnMut(u64, &LoadProducer) + Send + 'static,
    ) -> Result<Load> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("message.max.bytes", "2000000");
        let mut sender = Sender::new(config, topic)?;
        let ids = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (ids, stop, topic, prefix) = (
                ids.clone(),
                stop.clone(),
                topic.to_owned(),
                prefix.to_owned(),
            );
            std::thread::spawn(move || {
                let started = Instant::now();
                let mut n: u64 = 0;
                while !stop.load(Ordering::Relaxed) {
                    let due = started + Duration::from_secs_f64(n as f64 / rate);
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait.min(Duration::from_millis(50)));
                        sender.poll(Duration::ZERO);
                        continue;
                    }
                    let id = format!("{prefix}job-{n:07}");
                    let req = JobRequest {
                        job_id: id.clone(),
                        topic: topic.clone(),
                        tenant_id: format!("tenant-{}", n % 7),
                        principal_id: Some("chaos".into()),
                        payload: format!("payload {n}").into_bytes(),
                        submitted_at: now_ms(),
                        ..Default::default()
                    };
                    if let Ok(bytes) = ksched_codec::encode(&req) {
                        sender.send(
                            usize::try_from(n).unwrap_or(usize::MAX - 1) + 1,
                            id.clone(),
                            bytes,
                        );
                        if let Ok(mut ids) = ids.lock() {
                            ids.push(id);
                        }
                    }
                    extra(n, &sender.producer);
                    n += 1;
                    sender.poll(Duration::ZERO);
                }
                sender.drain(LOAD_DRAIN)
            })
        };
        Ok(Load {
            ids,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops producing and waits until everything produced is acknowledged (sent again
    /// where it has to be); returns every job given to the producer and how that went.
    pub(super) fn finish(&mut self) -> (Vec<String>, Delivered) {
        self.stop.store(true, Ordering::Relaxed);
        let delivered = self
            .thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        let ids = self.ids.lock().map(|v| v.clone()).unwrap_or_default();
        (ids, delivered)
    }
}

/// SDK workers of the `default` pool; each run of a job is counted.
#[derive(Debug)]
pub(super) struct SdkWorkers {
    pub runs: Arc<Mutex<BTreeMap<String, u32>>>,
    token: CancellationToken,
    handles: Vec<tokio::task::JoinHandle<ksched_worker::Result<()>>>,
}

impl SdkWorkers {
    pub(super) fn start(
        rt: &tokio::runtime::Runtime,
        bootstrap: &str,
        prefix: &str,
        ids: &[String],
    ) -> Result<SdkWorkers> {
        let runs = Arc::new(Mutex::new(BTreeMap::new()));
        let token = CancellationToken::new();
        let mut handles = Vec::new();
        let _guard = rt.enter();
        for id in ids {
            let mut cfg = WorkerConfig::new(bootstrap, id, "default");
            cfg.topic_prefix = prefix.to_owned();
            cfg.max_parallel_jobs = 16;
            cfg.heartbeat_interval = Duration::from_millis(500);
            cfg.report_host_load = false;
            cfg.shutdown_grace = Duration::from_secs(5);
            let worker = Worker::new(cfg)?;
            let (runs, token) = (runs.clone(), token.clone());
            handles.push(rt.spawn(async move {
                worker
                    .run(
                        move |job| {
                            let runs = runs.clone();
                            async move {
                                if let Ok(mut r) = runs.lock() {
                                    *r.entry(job.job_id().to_owned()).or_default() += 1;
                                }
                                let ms = 10
                                    + (ksched_core::hash::fnv1a64(&[job.job_id().as_bytes()]) % 90);
                                tokio::time::sleep(Duration::from_millis(ms)).await;
                                Outcome::succeeded()
                            }
                        },
                        token,
                    )
                    .await
            }));
        }
        Ok(SdkWorkers {
            runs,
            token,
            handles,
        })
    }

    /// Drains and stops; returns workers that ended in an error.
    /// Stops the workers; what went wrong, including a worker that did not stop within a
    /// minute (its drain is bounded by the grace period and the report timeout).
    pub(super) fn stop(self, rt: &tokio::runtime::Runtime) -> Vec<String> {
        self.token.cancel();
        rt.block_on(async {
            let mut errors = Vec::new();
            for h in self.handles {
                match tokio::time::timeout(Duration::from_secs(60), h).await {
                    Ok(Ok(Ok(()))) => {}
                    Ok(Ok(Err(e))) => errors.push(e.to_string()),
                    Ok(Err(e)) => errors.push(e.to_string()),
                    Err(_) => errors.push("a worker did not stop within 60 s".into()),
                }
            }
            errors
        })
    }
}
