//! Worker SDK for ksched.
//!
//! A [`Worker`] joins its pool's consumer group on `<prefix>dispatch.<pool>`, runs a handler
//! for every Dispatch addressed to the partitions it owns (at most `max_parallel_jobs` at
//! once), reports `JobStarted` (once a job has run for
//! [`WorkerConfig::start_report_delay`]; a shorter job's result stands for its start),
//! progress and `JobResult` with the attempt number, sends
//! heartbeats (load, memory, labels, capabilities, owned partitions, active jobs), honours
//! `CancelDispatch` through the job's cancellation token, and shuts down gracefully: it stops
//! taking work, lets running jobs finish within a grace period, and hands back the rest.
//!
//! Delivery: a dispatch's offset is committed once the job is started, so a worker that
//! crashes mid-job does not run it again on restart; the scheduler notices the silence
//! (worker_ttl) and retries the job as a new attempt elsewhere.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ksched_worker::Error> {
//! use ksched_worker::{Outcome, Worker, WorkerConfig};
//! let config = WorkerConfig::new("127.0.0.1:9092", "worker-1", "default");
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! Worker::new(config)?
//!     .run(|job| async move {
//!         job.progress(0.5, "halfway").await;
//!         Outcome::succeeded()
//!     }, shutdown)
//!     .await
//! # }
//! ```

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ksched_codec::{AnyRecord, trace_context};
use ksched_core::records::{Dispatch, Heartbeat, JobResult, JobStarted, ResultMeta, ResultStatus};
use opentelemetry::KeyValue;
use opentelemetry::global::BoxedSpan;
use opentelemetry::trace::{
    Span, SpanContext, SpanKind, Status, TraceContextExt, Tracer, TracerProvider as _,
};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use thiserror::Error;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

mod config;
mod host;
mod job;
mod reporter;

pub use config::WorkerConfig;

/// The instrumentation scope of the SDK's run spans (`ksched run`, one per attempt of a
/// traced job). Spans are recorded by the OpenTelemetry SDK the application installs as the
/// global tracer provider; without one the trace context is still carried to the reports.
pub const TRACE_SCOPE: &str = "ksched-worker";
pub use job::{JobContext, Outcome, SECRET_UNAVAILABLE};

use host::{HostLoad, host_load};
use reporter::{FAREWELL_TIMEOUT, RECONNECT_BACKOFF_MAX_MS, REPORT_TIMEOUT, Reporter};

#[derive(Debug, Error)]
pub enum Error {
    #[error("kafka: {context}: {source}")]
    Kafka {
        context: String,
        source: rdkafka::error::KafkaError,
    },
    #[error("invalid worker configuration: {0}")]
    Config(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn kafka(context: &str) -> impl FnOnce(rdkafka::error::KafkaError) -> Error + '_ {
    move |source| Error::Kafka {
        context: context.to_owned(),
        source,
    }
}

/// What the worker runs now.
#[derive(Default)]
struct Running {
    /// (job_id, attempt) -> cancel token.
    jobs: HashMap<(String, i32), CancellationToken>,
    /// Attempts cancelled by the scheduler (their handler's outcome is reported as CANCELLED).
    cancelled: BTreeSet<(String, i32)>,
    /// Attempts this worker started recently, oldest first: a dispatch read again (its
    /// offset commit was lost to a broker outage or a rebalance) is not run twice.
    seen: std::collections::VecDeque<(String, i32)>,
    seen_set: std::collections::HashSet<(String, i32)>,
}

/// How many started attempts a worker remembers to skip dispatches it reads twice.
const SEEN_ATTEMPTS: usize = 10_000;

impl Running {
    /// Records that `key` starts here; false if it already did.
    fn first_time(&mut self, key: &(String, i32)) -> bool {
        if !self.seen_set.insert(key.clone()) {
            return false;
        }
        self.seen.push_back(key.clone());
        if self.seen.len() > SEEN_ATTEMPTS
            && let Some(old) = self.seen.pop_front()
        {
            self.seen_set.remove(&old);
        }
        true
    }
}

/// A worker of one pool.
pub struct Worker {
    config: WorkerConfig,
    consumer: Arc<StreamConsumer>,
    reporter: Reporter,
    running: Arc<Mutex<Running>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("worker_id", &self.config.worker_id)
            .field("pool", &self.config.pool)
            .finish()
    }
}

/// How long the broker may hold a dispatch fetch that finds nothing new, unless the
/// properties set `fetch.wait.max.ms` (Kafka's default). A dispatch still arrives as soon as
/// the scheduler's transaction commits: the broker answers a read_committed fetch when the
/// last stable offset moves. This only bounds how often an idle worker asks: at the 10 ms it
/// had before, every idle worker sent the broker 100 empty fetches a second.
const DISPATCH_FETCH_WAIT_MS: &str = "500";

/// The dispatch consumer's settings: the pool's group, read_committed, offsets committed
/// for the jobs taken.
fn dispatch_consumer_config(config: &WorkerConfig, group: &str) -> rdkafka::ClientConfig {
    let mut c = config.client();
    if c.get("fetch.wait.max.ms").is_none() {
        c.set("fetch.wait.max.ms", DISPATCH_FETCH_WAIT_MS);
    }
    c.set("group.id", group)
        .set("client.id", format!("ksched-worker-{}", config.worker_id))
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "500")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("session.timeout.ms", "10000")
        .set("reconnect.backoff.max.ms", RECONNECT_BACKOFF_MAX_MS);
    c
}

impl Worker {
    pub fn new(config: WorkerConfig) -> Result<Worker> {
        if config.worker_id.is_empty() || config.pool.is_empty() {
            return Err(Error::Config("worker_id and pool must be set".into()));
        }
        if config.max_parallel_jobs == 0 {
            return Err(Error::Config("max_parallel_jobs must be at least 1".into()));
        }
        if let Some(url) = &config.schema_registry_url {
            ksched_codec::registry().set_source(Arc::new(
                ksched_codec::schema_registry::SchemaRegistryClient::new(
                    url,
                    std::time::Duration::from_secs(5),
                    None,
                ),
            ));
        }
        let group = config
            .group_id
            .clone()
            .unwrap_or_else(|| format!("{}workers.{}", config.topic_prefix, config.pool));
        let consumer: StreamConsumer = dispatch_consumer_config(&config, &group)
            .create()
            .map_err(kafka("creating the dispatch consumer"))?;
        let mut producer = config.client();
        producer
            .set(
                "client.id",
                format!("ksched-worker-{}-reports", config.worker_id),
            )
            .set("enable.idempotence", "true")
            .set("linger.ms", "1")
            .set("message.timeout.ms", REPORT_TIMEOUT.as_millis().to_string())
            // After an outage the scheduler gives workers `worker_ttl_ms` from its own
            // recovery to be heard again; librdkafka's default reconnect back-off grows to
            // 10 s, longer than a short TTL, so heartbeats retry the broker every second.
            .set("reconnect.backoff.max.ms", RECONNECT_BACKOFF_MAX_MS);
        let mut reporter = Reporter::new(producer, &config.worker_id, &config.topic_prefix)?;
        reporter.stall = reporter::producer_stall(config.heartbeat_interval);
        Ok(Worker {
            config,
            consumer: Arc::new(consumer),
            reporter,
            running: Arc::new(Mutex::new(Running::default())),
        })
    }

    fn owned_partitions(&self) -> Vec<i32> {
        let topic = self.config.dispatch_topic();
        let mut v: Vec<i32> = self
            .consumer
            .assignment()
            .map(|tpl| {
                tpl.elements()
                    .iter()
                    .filter(|e| e.topic() == topic)
                    .map(|e| e.partition())
                    .collect()
            })
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    fn heartbeat(&self, draining: bool) -> Heartbeat {
        let (active_job_ids, active) = {
            let r = self.running.lock().unwrap_or_else(|p| p.into_inner());
            let ids: Vec<String> = r.jobs.keys().map(|(j, _)| j.clone()).collect();
            let n = ids.len();
            (ids, n)
        };
        let load = if self.config.report_host_load {
            host_load()
        } else {
            HostLoad {
                cpu_percent: 0.0,
                memory_percent: 0.0,
                memory_free_bytes: None,
            }
        };
        Heartbeat {
            worker_id: self.config.worker_id.clone(),
            pool: self.config.pool.clone(),
            active_jobs: i32::try_from(active).unwrap_or(i32::MAX),
            max_parallel_jobs: i32::try_from(self.config.max_parallel_jobs).unwrap_or(i32::MAX),
            cpu_load: load.cpu_percent,
            gpu_utilization: 0.0,
            memory_load: load.memory_percent,
            memory_free_bytes: self.config.memory_free_bytes.or(load.memory_free_bytes),
            capabilities: self.config.capabilities.clone(),
            labels: self.config.labels.clone(),
            owned_partitions: self.owned_partitions(),
            active_job_ids,
            draining,
            sent_at: now_ms(),
        }
    }

    async fn send_heartbeat(&self, draining: bool) {
        let hb = self.heartbeat(draining);
        let timeout = reporter::heartbeat_timeout(self.config.heartbeat_interval);
        self.reporter
            .send_heartbeat(&self.config.worker_id, &hb, timeout)
            .await;
    }

    /// Runs jobs with `handler` until `shutdown` fires, then drains.
    pub async fn run<H, F>(self, handler: H, shutdown: CancellationToken) -> Result<()>
    where
        H: Fn(JobContext) -> F + Send + Sync + 'static,
        F: Future<Output = Outcome> + Send + 'static,
    {
        let topic = self.config.dispatch_topic();
        self.consumer
            .subscribe(&[&topic])
            .map_err(kafka("subscribing to the dispatch topic"))?;
        info!(worker = %self.config.worker_id, topic = %topic, "worker started");
        let this = Arc::new(self);
        let handler = Arc::new(handler);
        let slots = Arc::new(Semaphore::new(this.config.max_parallel_jobs));
        let mut tasks = tokio::task::JoinSet::new();

        // Heartbeats, until the main loop stops, or the run future is dropped (the worker
        // is gone: its heartbeats must stop too, and its consumer with them).
        let beat_stop = CancellationToken::new();
        let _stop_beats_on_drop = beat_stop.clone().drop_guard();
        let beats = {
            let (this, stop) = (this.clone(), beat_stop.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = this.send_heartbeat(false) => {}
                    }
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(this.config.heartbeat_interval) => {}
                    }
                }
            })
        };

        loop {
            // Take a slot first, so a dispatch is only read when it can start at once.
            let permit = tokio::select! {
                _ = shutdown.cancelled() => break,
                p = slots.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let msg = tokio::select! {
                _ = shutdown.cancelled() => break,
                m = this.consumer.recv() => m,
            };
            let msg = match msg {
                Ok(m) => m,
                Err(e) => {
                    warn!(error = %e, "dispatch consumer error");
                    continue;
                }
            };
            let (partition, offset) = (msg.partition(), msg.offset());
            let decoded = msg.payload().map(ksched_codec::decode_any);
            let trace = msg.headers().and_then(|h| {
                h.iter()
                    .find(|h| h.key == trace_context::HEADER)
                    .and_then(|h| trace_context::parse(h.value?))
            });
            // Commit past this record now: the job starts below, or needs nothing.
            if let Err(e) = this.consumer.store_offset(&topic, partition, offset) {
                warn!(error = %e, "cannot store the dispatch offset");
            }
            drop(msg);
            match decoded {
                Some(Ok(AnyRecord::Dispatch(d))) => {
                    let key = (d.job.job_id.clone(), d.attempt);
                    let first = this
                        .running
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .first_time(&key);
                    if !first {
                        drop(permit);
                        debug!(job_id = %key.0, attempt = key.1, "dispatch read again; this attempt already started here");
                        continue;
                    }
                    let (ctx, run) = this.admit(d, trace);
                    let (this, handler) = (this.clone(), handler.clone());
                    tasks.spawn(async move {
                        let _permit = permit;
                        this.execute(ctx, run, handler.as_ref()).await;
                    });
                }
                Some(Ok(AnyRecord::CancelDispatch(c))) => {
                    drop(permit);
                    let mut r = this.running.lock().unwrap_or_else(|p| p.into_inner());
                    let key = (c.job_id.clone(), c.attempt);
                    if let Some(token) = r.jobs.get(&key).cloned() {
                        info!(job_id = %c.job_id, attempt = c.attempt, reason = %c.reason, "cancel requested");
                        // Marked before the token fires, under the same lock: a handler that
                        // returns at once is still reported CANCELLED, not handed back.
                        r.cancelled.insert(key);
                        token.cancel();
                    }
                }
                Some(Ok(other)) => {
                    drop(permit);
                    warn!(
                        record = other.name(),
                        "unexpected record on the dispatch topic"
                    );
                }
                Some(Err(e)) => {
                    drop(permit);
                    warn!(error = %e, "undecodable record on the dispatch topic");
                }
                None => drop(permit),
            }
            while tasks.try_join_next().is_some() {}
        }

        // Graceful shutdown: take nothing new, say so, let running jobs finish.
        info!(worker = %this.config.worker_id, running = tasks.len(), "worker draining");
        this.consumer.unsubscribe();
        this.farewell().await;
        let deadline = tokio::time::sleep(this.config.shutdown_grace);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                next = tasks.join_next() => if next.is_none() { break },
                _ = &mut deadline => {
                    this.reporter.give_up.cancel();
                    this.hand_back_all();
                    while tasks.join_next().await.is_some() {}
                    break;
                }
            }
        }
        beat_stop.cancel();
        let _ = beats.await;
        this.farewell().await;
        info!(worker = %this.config.worker_id, "worker stopped");
        Ok(())
    }

    /// A draining heartbeat, best effort: a broker that does not answer does not hold up the
    /// shutdown for long (the scheduler notices the worker gone by its TTL anyway).
    async fn farewell(&self) {
        let _ = tokio::time::timeout(FAREWELL_TIMEOUT, self.send_heartbeat(true)).await;
    }

    /// Cancels every running job; their handlers return and report them handed back.
    fn hand_back_all(&self) {
        let r = self.running.lock().unwrap_or_else(|p| p.into_inner());
        warn!(
            running = r.jobs.len(),
            "grace period over; handing jobs back"
        );
        for token in r.jobs.values() {
            token.cancel();
        }
    }

    /// The job as its handler sees it, and the attempt's run span when the job is traced.
    /// `trace`: the Dispatch record's `traceparent` header (the scheduler's dispatch span);
    /// without one, the job's own trace (the submission's) is continued.
    fn admit(&self, d: Dispatch, trace: Option<SpanContext>) -> (JobContext, Option<BoxedSpan>) {
        let cancel = CancellationToken::new();
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .jobs
            .insert((d.job.job_id.clone(), d.attempt), cancel.clone());
        let run = trace
            .or_else(|| trace_context::parse_str(d.job.traceparent.as_deref()?))
            .map(|parent| {
                let tracer = opentelemetry::global::tracer_provider().tracer(TRACE_SCOPE);
                let cx = opentelemetry::Context::new().with_remote_span_context(parent);
                tracer
                    .span_builder("ksched run")
                    .with_kind(SpanKind::Consumer)
                    .with_attributes([
                        KeyValue::new("ksched.job.id", d.job.job_id.clone()),
                        KeyValue::new("ksched.job.attempt", i64::from(d.attempt)),
                        KeyValue::new("ksched.worker.id", self.config.worker_id.clone()),
                        KeyValue::new("ksched.pool", d.pool.clone()),
                    ])
                    .start_with_context(&tracer, &cx)
            });
        let ctx = JobContext {
            trace: run
                .as_ref()
                .and_then(|s| trace_context::format(s.span_context())),
            dispatch: Arc::new(d),
            cancel,
            opened: Arc::default(),
            reporter: self.reporter.clone(),
        };
        (ctx, run)
    }

    /// The job's env and payload opened with the keyring as it is now.
    fn open(
        &self,
        job: &ksched_core::records::JobRequest,
    ) -> Result<ksched_secrets::Opened, String> {
        let keyring = match &self.config.keyring {
            Some(file) if ksched_secrets::needs_keys(job) => {
                Some(file.current().map_err(|e| e.to_string())?)
            }
            Some(_) | None => None,
        };
        ksched_secrets::open_request(keyring.as_deref(), job).map_err(|e| match keyring {
            None if ksched_secrets::needs_keys(job) => format!(
                "the job carries sealed values and worker {} has no keyring (WorkerConfig::keyring): {e}",
                self.config.worker_id
            ),
            _ => e.to_string(),
        })
    }

    async fn execute<H, F>(&self, ctx: JobContext, mut run: Option<BoxedSpan>, handler: &H)
    where
        H: Fn(JobContext) -> F,
        F: Future<Output = Outcome>,
    {
        let job_id = ctx.job_id().to_owned();
        let attempt = ctx.attempt();
        let reply = ctx.dispatch.reply_partition;
        let trace = ctx.trace.clone();
        debug!(%job_id, attempt, "job started");
        let started = Instant::now();
        let start = JobStarted {
            job_id: job_id.clone(),
            attempt,
            worker_id: self.config.worker_id.clone(),
            started_at: now_ms(),
        };
        let report_start = || {
            self.reporter
                .deliver_result_topic(reply, &job_id, &start, trace.as_deref())
        };
        let handled = async {
            match self.open(&ctx.dispatch.job) {
                Ok(opened) => {
                    let mut ctx = ctx.clone();
                    ctx.opened = Arc::new(opened);
                    handler(ctx).await
                }
                Err(why) => {
                    warn!(%job_id, attempt, error = %why, "sealed values do not open; the job fails without running");
                    Outcome::fatal(SECRET_UNAVAILABLE, &why)
                }
            }
        };
        // The start is reported once the job has run for `start_report_delay`; a job done
        // sooner is reported by its result alone. Either way the result goes out after the
        // start was delivered, so the scheduler never reads them the other way round.
        let delay = self.config.start_report_delay;
        let outcome = if delay.is_zero() {
            report_start().await;
            handled.await
        } else {
            tokio::pin!(handled);
            tokio::select! {
                biased;
                outcome = &mut handled => outcome,
                _ = tokio::time::sleep(delay) => {
                    let ((), outcome) = tokio::join!(report_start(), &mut handled);
                    outcome
                }
            }
        };
        let key = (job_id.clone(), attempt);
        let cancelled_by_scheduler = {
            let mut r = self.running.lock().unwrap_or_else(|p| p.into_inner());
            r.jobs.remove(&key);
            r.cancelled.remove(&key)
        };
        let (status, error_code, error_message, result_ptr, result_meta) = match outcome {
            Outcome::Succeeded { result_ptr, meta } => {
                (ResultStatus::Succeeded, None, None, result_ptr, meta)
            }
            Outcome::Retryable { code, message } => (
                ResultStatus::FailedRetryable,
                Some(code),
                Some(message),
                None,
                ResultMeta::default(),
            ),
            Outcome::Fatal { code, message } => (
                ResultStatus::FailedFatal,
                Some(code),
                Some(message),
                None,
                ResultMeta::default(),
            ),
            Outcome::Cancelled => (
                ResultStatus::Cancelled,
                Some(if cancelled_by_scheduler {
                    "cancelled".to_owned()
                } else {
                    ksched_core::reason::AttemptError::HandedBack
                        .as_str()
                        .to_owned()
                }),
                None,
                None,
                ResultMeta::default(),
            ),
        };
        let result = JobResult {
            job_id: job_id.clone(),
            attempt,
            worker_id: self.config.worker_id.clone(),
            status,
            error_code,
            error_message,
            result_ptr,
            result_meta,
            execution_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
            finished_at: now_ms(),
        };
        self.reporter
            .deliver_result_topic(reply, &job_id, &result, trace.as_deref())
            .await;
        if let Some(span) = run.as_mut() {
            span.set_attribute(KeyValue::new("ksched.result.status", status.as_str()));
            if let Some(code) = &result.error_code {
                span.set_status(Status::error(code.clone()));
            }
            span.end();
        }
        debug!(%job_id, attempt, status = status.as_str(), "job finished");
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rdkafka::ClientConfig;

    use super::*;

    fn key(job: &str, attempt: i32) -> (String, i32) {
        (job.to_owned(), attempt)
    }

    /// An idle worker asks the broker twice a second, not a hundred times (before, 10 ms);
    /// the properties still choose.
    #[test]
    fn an_idle_dispatch_fetch_waits_half_a_second_unless_the_properties_say() {
        let mut cfg = WorkerConfig::new("127.0.0.1:9092", "w", "default");
        let c = dispatch_consumer_config(&cfg, "g");
        assert_eq!(c.get("fetch.wait.max.ms"), Some("500"));
        assert_eq!(c.get("isolation.level"), Some("read_committed"));
        cfg.properties
            .insert("fetch.wait.max.ms".into(), "20".into());
        assert_eq!(
            dispatch_consumer_config(&cfg, "g").get("fetch.wait.max.ms"),
            Some("20")
        );
    }

    /// A worker whose broker is gone still stops when asked: its heartbeats and reports are
    /// bounded (before, the heartbeat loop waited for a delivery for message.timeout.ms, 5
    /// minutes, and the drain with it).
    #[tokio::test]
    async fn a_worker_stops_when_asked_even_if_its_broker_is_gone() {
        let mut cfg = WorkerConfig::new("127.0.0.1:1", "w-gone", "default");
        cfg.heartbeat_interval = Duration::from_millis(100);
        cfg.shutdown_grace = Duration::from_millis(100);
        let worker = Worker::new(cfg).unwrap();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(worker.run(|_| async { Outcome::succeeded() }, shutdown.clone()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        shutdown.cancel();
        let stopped = tokio::time::timeout(Duration::from_secs(20), run).await;
        assert!(
            matches!(stopped, Ok(Ok(Ok(())))),
            "the worker did not stop: {stopped:?}"
        );
    }

    /// A worker whose report producer delivers nothing gets a new one within a few heartbeat
    /// intervals (before, a heartbeat was waited for 30 s and the producer replaced only
    /// after 45 s without a delivery: after a broker restart left librdkafka's idempotent
    /// producer stuck, the scheduler declared the live worker lost long before).
    #[tokio::test]
    async fn a_stalled_heartbeat_producer_is_replaced_within_a_few_intervals() {
        let mut cfg = WorkerConfig::new("127.0.0.1:1", "w-stalled", "default");
        cfg.heartbeat_interval = Duration::from_millis(200);
        cfg.shutdown_grace = Duration::from_millis(100);
        let worker = Worker::new(cfg).unwrap();
        let reporter = worker.reporter.clone();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(worker.run(|_| async { Outcome::succeeded() }, shutdown.clone()));
        // Stall after 2 s (three intervals, at least 2 s), heartbeats given up after 1 s.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let generation = reporter.current().1;
        shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(20), run).await;
        assert!(
            generation >= 1,
            "the stalled report producer was not replaced within 5 s"
        );
    }

    /// A report producer that stopped delivering is replaced and the report sent again on
    /// the new one (before, every report of a broken idempotent producer was given up, its
    /// heartbeats with them, and the scheduler declared a live worker lost). The first
    /// producer here can never deliver (its broker address is dead); the one built for the
    /// replacement reaches the real broker.
    #[tokio::test]
    async fn a_report_producer_that_stopped_delivering_is_replaced() {
        let bootstrap = ksched_testkit::bootstrap_servers().expect("a broker");
        let topic = ksched_testkit::unique("reports");
        ksched_testkit::create_topic(&bootstrap, &topic, 1)
            .await
            .unwrap();
        let mut dead = ClientConfig::new();
        dead.set("bootstrap.servers", "127.0.0.1:1")
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", "1000");
        let mut reporter = Reporter::new(dead, "w-renew", "test.").unwrap();
        reporter.timeout = Duration::from_secs(1);
        reporter.stall = Duration::ZERO;
        reporter.config = ksched_testkit::client_config(&bootstrap);
        reporter
            .config
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", "10000");
        reporter.timeout = Duration::from_secs(10);

        let hb = JobStarted {
            job_id: "j-1".into(),
            attempt: 1,
            worker_id: "w-renew".into(),
            started_at: now_ms(),
        };
        reporter.send_to(&topic, None, "j-1", &hb, None).await;

        assert_eq!(reporter.current().1, 1, "the producer was not replaced");
        let read = ksched_testkit::read_to_end(&bootstrap, &topic).unwrap();
        assert_eq!(read.len(), 1, "the report was not sent again: {read:?}");
    }

    /// A report to a partition added to the results topic after the report producer read
    /// its partitions is delivered: a Dispatch names its worker's results partition, and
    /// one added while both run is named at once. (Before, librdkafka refused it as an
    /// unknown partition every second for up to five minutes, its metadata refresh.)
    #[tokio::test]
    async fn a_report_to_a_partition_added_since_the_producer_started_is_delivered() {
        let bootstrap = ksched_testkit::bootstrap_servers().expect("a broker");
        let topic = ksched_testkit::unique("reports-grown");
        ksched_testkit::create_topic(&bootstrap, &topic, 1)
            .await
            .unwrap();
        let mut config = ksched_testkit::client_config(&bootstrap);
        config
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", "10000");
        let mut reporter = Reporter::new(config, "w-grown", "test.").unwrap();
        reporter.timeout = Duration::from_secs(10);
        let report = |job: &str| JobStarted {
            job_id: job.into(),
            attempt: 1,
            worker_id: "w-grown".into(),
            started_at: now_ms(),
        };
        let sent = reporter
            .send_to(&topic, Some(0), "j-1", &report("j-1"), None)
            .await;
        assert!(sent, "the first report, to the partition the topic had");

        let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
            ksched_testkit::client_config(&bootstrap).create().unwrap();
        let grown = admin
            .create_partitions(
                &[rdkafka::admin::NewPartitions::new(&topic, 3)],
                &rdkafka::admin::AdminOptions::new(),
            )
            .await
            .unwrap();
        assert!(grown.iter().all(Result::is_ok), "{grown:?}");

        let sent = reporter
            .send_to(&topic, Some(2), "j-2", &report("j-2"), None)
            .await;
        assert!(sent, "the report to the added partition was not delivered");
        assert_eq!(reporter.current().1, 0, "the producer was replaced instead");
        let read = ksched_testkit::read_to_end(&bootstrap, &topic).unwrap();
        let partitions: Vec<i32> = read.iter().map(|r| r.partition).collect();
        assert_eq!(partitions, [0, 2], "{read:?}");
    }

    /// A result is not given up when a send times out (before, a broker outage longer than
    /// the report timeout lost it, and its job stayed RUNNING until the running timeout);
    /// once the drain is over it is tried once more and left to the scheduler's timeouts.
    #[tokio::test]
    async fn a_result_is_sent_until_delivered_or_the_drain_gives_up() {
        let mut dead = ClientConfig::new();
        dead.set("bootstrap.servers", "127.0.0.1:1")
            .set("message.timeout.ms", "300");
        let mut reporter = Reporter::new(dead, "w-outage", "test.").unwrap();
        reporter.timeout = Duration::from_millis(300);
        let result = JobStarted {
            job_id: "j-1".into(),
            attempt: 1,
            worker_id: "w-outage".into(),
            started_at: now_ms(),
        };
        let r = reporter.clone();
        let sending =
            tokio::spawn(async move { r.deliver("results", None, "j-1", &result, None).await });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            !sending.is_finished(),
            "the result was given up on a timeout"
        );
        reporter.give_up.cancel();
        tokio::time::timeout(Duration::from_secs(5), sending)
            .await
            .expect("deliver returns once the drain gave up")
            .unwrap();
    }

    /// A producer that delivers is kept, however many reports fail before the stall time.
    #[tokio::test]
    async fn a_failed_report_alone_does_not_replace_the_producer() {
        let mut dead = ClientConfig::new();
        dead.set("bootstrap.servers", "127.0.0.1:1")
            .set("message.timeout.ms", "500");
        let mut reporter = Reporter::new(dead, "w-keep", "test.").unwrap();
        reporter.timeout = Duration::from_millis(500);
        let hb = JobStarted {
            job_id: "j-1".into(),
            attempt: 1,
            worker_id: "w-keep".into(),
            started_at: now_ms(),
        };
        reporter.send_to("nowhere", None, "j-1", &hb, None).await;
        assert_eq!(reporter.current().1, 0);
    }

    #[test]
    fn debug_output_masks_secret_properties() {
        let c = WorkerConfig::new("b:9093", "w1", "p").with_properties([
            ("sasl.username".to_owned(), "w1".to_owned()),
            ("sasl.password".to_owned(), "hunter2".to_owned()),
        ]);
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("w1") && shown.contains("*hidden*"),
            "{shown}"
        );
        assert_eq!(c.client().get("sasl.password"), Some("hunter2"));
    }

    #[test]
    fn a_dispatch_read_again_does_not_start_twice() {
        let mut r = Running::default();
        assert!(r.first_time(&key("a", 1)));
        assert!(!r.first_time(&key("a", 1)));
        // Another attempt of the same job is a new run.
        assert!(r.first_time(&key("a", 2)));
    }

    #[test]
    fn the_memory_of_started_attempts_is_bounded_oldest_first() {
        let mut r = Running::default();
        for i in 0..SEEN_ATTEMPTS + 5 {
            assert!(r.first_time(&key(&format!("j{i}"), 1)));
        }
        assert_eq!(r.seen.len(), SEEN_ATTEMPTS);
        assert_eq!(r.seen_set.len(), SEEN_ATTEMPTS);
        // The five oldest are forgotten; the newest are remembered.
        assert!(r.first_time(&key("j0", 1)));
        assert!(!r.first_time(&key(&format!("j{}", SEEN_ATTEMPTS + 4), 1)));
    }
}
