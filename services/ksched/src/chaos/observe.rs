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
#[derive(Debug)]
pub(super) struct Load {
    pub ids: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    /// `rate` jobs per second to `topic`; `extra(n)` may add a poison record after job n.
    pub(super) fn start(
        bootstrap: &str,
        topic: &str,
        prefix: &str,
        rate: f64,
        mut extra: impl FnMut(u64, &BaseProducer) + Send + 'static,
    ) -> Result<Load> {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("message.max.bytes", "2000000")
            .create()?;
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
                        producer.poll(Duration::ZERO);
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
                        let mut record = BaseRecord::to(&topic).key(&id).payload(&bytes);
                        loop {
                            match producer.send(record) {
                                Ok(()) => break,
                                Err((_, r)) => {
                                    producer.poll(Duration::from_millis(10));
                                    record = r;
                                }
                            }
                        }
                        if let Ok(mut ids) = ids.lock() {
                            ids.push(id);
                        }
                    }
                    extra(n, &producer);
                    n += 1;
                    producer.poll(Duration::ZERO);
                }
                let _ = producer.flush(Duration::from_secs(120));
            })
        };
        Ok(Load {
            ids,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops producing and waits until everything produced is acknowledged.
    pub(super) fn finish(&mut self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.ids.lock().map(|v| v.clone()).unwrap_or_default()
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
