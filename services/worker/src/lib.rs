//! Worker SDK for ksched.
//!
//! A [`Worker`] joins its pool's consumer group on `<prefix>dispatch.<pool>`, runs a handler
//! for every Dispatch addressed to the partitions it owns (at most `max_parallel_jobs` at
//! once), reports `JobStarted`, progress and `JobResult` with the attempt number, sends
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ksched_codec::AnyRecord;
use ksched_core::records::{
    Dispatch, Heartbeat, JobProgress, JobResult, JobStarted, ResultMeta, ResultStatus,
};
use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use thiserror::Error;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

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

/// How a worker connects and what it reports about itself.
#[derive(Clone)]
pub struct WorkerConfig {
    pub bootstrap_servers: String,
    pub worker_id: String,
    pub pool: String,
    /// ksched's topic prefix. Default `ksched.`.
    pub topic_prefix: String,
    /// Most jobs at once (also reported in heartbeats). Default 4.
    pub max_parallel_jobs: usize,
    /// Heartbeat interval. Default 3 s (well under the scheduler's worker_ttl of 15 s).
    pub heartbeat_interval: Duration,
    /// How long shutdown lets running jobs finish before handing them back. Default 10 s.
    pub shutdown_grace: Duration,
    pub labels: BTreeMap<String, String>,
    pub capabilities: Vec<String>,
    /// Extra librdkafka properties (TLS, SASL, ...), as `-X key=value` and
    /// `--command-config` give them to Kafka's tools: see [`WorkerConfig::with_properties`].
    pub properties: BTreeMap<String, String>,
    /// Consumer group; default `<prefix>workers.<pool>`.
    pub group_id: Option<String>,
    /// Free memory to report (bytes) instead of the host's, e.g. a slot size the capacity
    /// strategy should pack against. Default none.
    pub memory_free_bytes: Option<i64>,
    /// Report the host's CPU load and memory in heartbeats. Default true; tests that run
    /// many workers on one busy machine turn it off so load never marks them overloaded.
    pub report_host_load: bool,
    /// The keyring that opens jobs' sealed secrets and payloads ([`JobContext::env`],
    /// [`JobContext::payload`]); read again whenever the file changes, so a rotation or a
    /// shredding reaches a running worker. Default none: a job with sealed values then fails
    /// `secret_unavailable` without running.
    pub keyring: Option<Arc<ksched_secrets::KeyringFile>>,
}

impl WorkerConfig {
    pub fn new(bootstrap_servers: &str, worker_id: &str, pool: &str) -> WorkerConfig {
        WorkerConfig {
            bootstrap_servers: bootstrap_servers.to_owned(),
            worker_id: worker_id.to_owned(),
            pool: pool.to_owned(),
            topic_prefix: "ksched.".to_owned(),
            max_parallel_jobs: 4,
            heartbeat_interval: Duration::from_secs(3),
            shutdown_grace: Duration::from_secs(10),
            labels: BTreeMap::new(),
            capabilities: Vec::new(),
            properties: BTreeMap::new(),
            group_id: None,
            memory_free_bytes: None,
            report_host_load: true,
            keyring: None,
        }
    }

    /// Opens sealed secrets with the keyring file at `path` (checked now: a missing or
    /// unreadable keyring fails here, not at the first job).
    pub fn with_keyring(mut self, path: &std::path::Path) -> Result<Self> {
        let file =
            ksched_secrets::KeyringFile::open(path).map_err(|e| Error::Config(e.to_string()))?;
        self.keyring = Some(Arc::new(file));
        Ok(self)
    }

    /// Adds librdkafka properties, e.g. from a Kafka client properties file parsed with
    /// [`ksched_core::properties::parse_properties`].
    pub fn with_properties(mut self, props: impl IntoIterator<Item = (String, String)>) -> Self {
        self.properties.extend(props);
        self
    }

    fn client(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap_servers);
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }

    fn dispatch_topic(&self) -> String {
        format!("{}dispatch.{}", self.topic_prefix, self.pool)
    }
}

/// How a job ended, as the handler reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Succeeded {
        result_ptr: Option<String>,
        meta: ResultMeta,
    },
    /// Worth another attempt (the scheduler backs off and retries).
    Retryable { code: String, message: String },
    /// Not worth retrying; `code` becomes the DLQ reason code.
    Fatal { code: String, message: String },
    /// The job stopped because its cancellation token fired.
    Cancelled,
}

impl Outcome {
    pub fn succeeded() -> Outcome {
        Outcome::Succeeded {
            result_ptr: None,
            meta: ResultMeta::default(),
        }
    }
    pub fn retryable(code: &str, message: &str) -> Outcome {
        Outcome::Retryable {
            code: code.into(),
            message: message.into(),
        }
    }
    pub fn fatal(code: &str, message: &str) -> Outcome {
        Outcome::Fatal {
            code: code.into(),
            message: message.into(),
        }
    }
}

/// One job, as the handler sees it.
#[derive(Debug, Clone)]
pub struct JobContext {
    /// The dispatch as the scheduler sent it: secret env values and a sealed payload are
    /// sealed here; [`JobContext::env`] and [`JobContext::payload`] give them opened.
    pub dispatch: Arc<Dispatch>,
    /// Fires when the scheduler cancels the attempt (CancelDispatch) or the worker hands the
    /// job back during shutdown. Handlers should stop and return [`Outcome::Cancelled`].
    pub cancel: CancellationToken,
    opened: Arc<ksched_secrets::Opened>,
    reporter: Reporter,
}

/// The error code of a job whose sealed values this worker cannot open (no keyring, a key
/// it lacks — retired or shredded —, or a value altered on the way).
pub const SECRET_UNAVAILABLE: &str = "secret_unavailable";

impl JobContext {
    /// The job's environment, secret values opened. Never log it whole.
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.opened.env
    }

    /// The job's payload, opened if the producer sealed it.
    pub fn payload(&self) -> &[u8] {
        &self.opened.payload
    }

    pub fn job_id(&self) -> &str {
        &self.dispatch.job.job_id
    }

    pub fn attempt(&self) -> i32 {
        self.dispatch.attempt
    }

    /// Reports progress (0.0 to 1.0).
    pub async fn progress(&self, fraction: f64, message: &str) {
        let p = JobProgress {
            job_id: self.job_id().to_owned(),
            attempt: self.attempt(),
            worker_id: self.reporter.worker_id.clone(),
            progress: fraction,
            message: (!message.is_empty()).then(|| message.to_owned()),
            sent_at: now_ms(),
        };
        self.reporter.send_result_topic(self.job_id(), &p).await;
    }
}

/// Longest a report (started, progress, result, heartbeat) is waited for.
const REPORT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest between two attempts to reach a broker again (librdkafka's default is 10 s).
const RECONNECT_BACKOFF_MAX_MS: &str = "1000";
/// Longest a draining heartbeat is waited for at shutdown.
const FAREWELL_TIMEOUT: Duration = Duration::from_secs(3);

/// Reports go through one idempotent producer. A producer that has stopped delivering is
/// replaced: librdkafka makes an idempotent producer unusable after a fatal error (a
/// sequence gap the broker refuses after an outage), and a producer that delivered nothing
/// for [`PRODUCER_STALL`] while the broker is reachable again is not trusted either. The
/// scheduler dedupes reports by (job, attempt), so one sent twice across a replacement is
/// harmless; a heartbeat that never arrives is not (the worker would be declared lost).
#[derive(Clone)]
struct Reporter {
    producer: Arc<Mutex<Producer>>,
    /// How to build the producer again.
    config: ClientConfig,
    /// Longest a report is waited for ([`REPORT_TIMEOUT`]).
    timeout: Duration,
    /// [`PRODUCER_STALL`].
    stall: Duration,
    worker_id: String,
    results: String,
    heartbeats: String,
    /// Cancelled when the worker's drain is over: reports that must arrive (starts, results)
    /// are tried once more, not until delivered.
    give_up: CancellationToken,
}

/// The report producer in use, and since when it has not delivered anything.
struct Producer {
    inner: FutureProducer,
    generation: u64,
    last_delivered: Instant,
}

/// A producer that delivered nothing for this long (every report given up meanwhile) is
/// replaced by a new one.
const PRODUCER_STALL: Duration = Duration::from_secs(45);

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reporter")
            .field("worker_id", &self.worker_id)
            .finish()
    }
}

impl Reporter {
    fn new(config: ClientConfig, worker_id: &str, topic_prefix: &str) -> Result<Reporter> {
        let inner: FutureProducer = config
            .create()
            .map_err(kafka("creating the report producer"))?;
        Ok(Reporter {
            producer: Arc::new(Mutex::new(Producer {
                inner,
                generation: 0,
                last_delivered: Instant::now(),
            })),
            config,
            timeout: REPORT_TIMEOUT,
            stall: PRODUCER_STALL,
            worker_id: worker_id.to_owned(),
            results: format!("{topic_prefix}results"),
            heartbeats: format!("{topic_prefix}heartbeats"),
            give_up: CancellationToken::new(),
        })
    }

    fn current(&self) -> (FutureProducer, u64) {
        let p = self.producer.lock().unwrap_or_else(|p| p.into_inner());
        (p.inner.clone(), p.generation)
    }

    fn delivered(&self, generation: u64) {
        let mut p = self.producer.lock().unwrap_or_else(|p| p.into_inner());
        if p.generation == generation {
            p.last_delivered = Instant::now();
        }
    }

    /// After a failed report: replaces the producer of `generation` when it is fatally
    /// broken or has delivered nothing for [`PRODUCER_STALL`]. True when the report should
    /// be sent again: the producer was replaced, here or meanwhile (a replaced producer's
    /// queued reports fail when it is dropped).
    fn renew_if_broken(&self, generation: u64, producer: &FutureProducer) -> bool {
        use rdkafka::producer::Producer as _;
        let fatal = producer.client().fatal_error();
        let mut p = self.producer.lock().unwrap_or_else(|p| p.into_inner());
        if p.generation != generation {
            return true;
        }
        let stalled = p.last_delivered.elapsed() >= self.stall;
        if fatal.is_none() && !stalled {
            return false;
        }
        match self.config.create::<FutureProducer>() {
            Ok(fresh) => {
                match &fatal {
                    Some((code, reason)) => warn!(
                        worker = %self.worker_id, ?code, %reason,
                        "the report producer failed fatally; replaced by a new one"
                    ),
                    None => warn!(
                        worker = %self.worker_id,
                        stalled_s = p.last_delivered.elapsed().as_secs(),
                        "the report producer delivered nothing for too long; replaced by a new one"
                    ),
                }
                p.inner = fresh;
                p.generation += 1;
                p.last_delivered = Instant::now();
                true
            }
            Err(e) => {
                warn!(error = %e, "cannot create a new report producer");
                false
            }
        }
    }

    /// Sends a report once (on a new producer too, when the first turns out broken); true
    /// when it was delivered.
    async fn send<T: ksched_codec::Record>(&self, topic: &str, key: &str, value: &T) -> bool {
        let bytes = match ksched_codec::encode(value) {
            Ok(b) => b,
            Err(e) => {
                warn!(error = %e, "cannot encode {}", T::NAME);
                return false;
            }
        };
        // Once more on a new producer when the first one turns out broken.
        for _ in 0..2 {
            let (producer, generation) = self.current();
            let record = FutureRecord::to(topic).key(key).payload(&bytes);
            // Bounded, whatever state the client is in: a report that cannot be delivered is
            // given up (the scheduler's timeouts cover it) rather than holding up the job or
            // the worker's shutdown.
            match tokio::time::timeout(self.timeout, producer.send(record, self.timeout)).await {
                Ok(Ok(_)) => {
                    self.delivered(generation);
                    return true;
                }
                Ok(Err((e, _))) => warn!(error = %e, topic, key, "report not delivered"),
                Err(_) => warn!(
                    topic,
                    key,
                    timeout_s = self.timeout.as_secs(),
                    "report not delivered in time; given up"
                ),
            }
            if !self.renew_if_broken(generation, &producer) {
                return false;
            }
        }
        false
    }

    /// Sends a report the scheduler must get (a start, a result) until it is delivered, or
    /// once more after the drain gave up. A broker outage longer than a report's timeout
    /// does not lose it: a lost result leaves its job RUNNING until `running_timeout_ms`
    /// and runs it again.
    async fn deliver<T: ksched_codec::Record>(&self, topic: &str, key: &str, value: &T) {
        loop {
            if self.send(topic, key, value).await {
                return;
            }
            if self.give_up.is_cancelled() {
                warn!(
                    topic,
                    key,
                    "{} not delivered and the worker is stopping; the scheduler's timeouts retry the attempt",
                    T::NAME
                );
                return;
            }
            tokio::select! {
                _ = self.give_up.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    async fn send_result_topic<T: ksched_codec::Record>(&self, job_id: &str, value: &T) {
        self.send(&self.results, job_id, value).await;
    }

    async fn deliver_result_topic<T: ksched_codec::Record>(&self, job_id: &str, value: &T) {
        self.deliver(&self.results, job_id, value).await;
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

/// Secret properties (passwords, JAAS configs, keys) are masked.
impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let properties: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(k, v)| {
                let v = if ksched_core::properties::is_secret_property(k) {
                    ksched_core::records::HIDDEN
                } else {
                    v.as_str()
                };
                (k.as_str(), v)
            })
            .collect();
        f.debug_struct("WorkerConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("worker_id", &self.worker_id)
            .field("pool", &self.pool)
            .field("topic_prefix", &self.topic_prefix)
            .field("max_parallel_jobs", &self.max_parallel_jobs)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("labels", &self.labels)
            .field("capabilities", &self.capabilities)
            .field("properties", &properties)
            .field("group_id", &self.group_id)
            .field("memory_free_bytes", &self.memory_free_bytes)
            .field("report_host_load", &self.report_host_load)
            .field("keyring", &self.keyring.as_ref().map(|k| k.path()))
            .finish()
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

impl Worker {
    pub fn new(config: WorkerConfig) -> Result<Worker> {
        if config.worker_id.is_empty() || config.pool.is_empty() {
            return Err(Error::Config("worker_id and pool must be set".into()));
        }
        if config.max_parallel_jobs == 0 {
            return Err(Error::Config("max_parallel_jobs must be at least 1".into()));
        }
        let group = config
            .group_id
            .clone()
            .unwrap_or_else(|| format!("{}workers.{}", config.topic_prefix, config.pool));
        let consumer: StreamConsumer = config
            .client()
            .set("group.id", &group)
            .set("client.id", format!("ksched-worker-{}", config.worker_id))
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "500")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed")
            .set("session.timeout.ms", "10000")
            .set("fetch.wait.max.ms", "10")
            .set("reconnect.backoff.max.ms", RECONNECT_BACKOFF_MAX_MS)
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
        let reporter = Reporter::new(producer, &config.worker_id, &config.topic_prefix)?;
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
        self.reporter
            .send(&self.reporter.heartbeats, &self.config.worker_id, &hb)
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
                    let ctx = this.admit(d);
                    let (this, handler) = (this.clone(), handler.clone());
                    tasks.spawn(async move {
                        let _permit = permit;
                        this.execute(ctx, handler.as_ref()).await;
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

    fn admit(&self, d: Dispatch) -> JobContext {
        let cancel = CancellationToken::new();
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .jobs
            .insert((d.job.job_id.clone(), d.attempt), cancel.clone());
        JobContext {
            dispatch: Arc::new(d),
            cancel,
            opened: Arc::default(),
            reporter: self.reporter.clone(),
        }
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

    async fn execute<H, F>(&self, ctx: JobContext, handler: &H)
    where
        H: Fn(JobContext) -> F,
        F: Future<Output = Outcome>,
    {
        let job_id = ctx.job_id().to_owned();
        let attempt = ctx.attempt();
        debug!(%job_id, attempt, "job started");
        let started = Instant::now();
        self.reporter
            .deliver_result_topic(
                &job_id,
                &JobStarted {
                    job_id: job_id.clone(),
                    attempt,
                    worker_id: self.config.worker_id.clone(),
                    started_at: now_ms(),
                },
            )
            .await;
        let outcome = match self.open(&ctx.dispatch.job) {
            Ok(opened) => {
                let mut ctx = ctx.clone();
                ctx.opened = Arc::new(opened);
                handler(ctx).await
            }
            Err(why) => {
                warn!(%job_id, attempt, error = %why, "sealed values do not open; the job fails without running");
                Outcome::fatal(SECRET_UNAVAILABLE, &why)
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
        self.reporter.deliver_result_topic(&job_id, &result).await;
        debug!(%job_id, attempt, status = status.as_str(), "job finished");
    }
}

struct HostLoad {
    cpu_percent: f64,
    memory_percent: f64,
    memory_free_bytes: Option<i64>,
}

/// CPU (1-minute load average over the CPU count) and memory from /proc, where available.
fn host_load() -> HostLoad {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let load1 = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        meminfo
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<i64>().ok())
            .map(|kb| kb * 1024)
    };
    let (total, available) = (field("MemTotal:"), field("MemAvailable:"));
    let memory_percent = match (total, available) {
        (Some(t), Some(a)) if t > 0 => 100.0 * (t - a) as f64 / t as f64,
        _ => 0.0,
    };
    HostLoad {
        cpu_percent: (100.0 * load1 / cpus).clamp(0.0, 100.0),
        memory_percent,
        memory_free_bytes: available,
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(job: &str, attempt: i32) -> (String, i32) {
        (job.to_owned(), attempt)
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
        reporter.send(&topic, "j-1", &hb).await;

        assert_eq!(reporter.current().1, 1, "the producer was not replaced");
        let read = ksched_testkit::read_to_end(&bootstrap, &topic).unwrap();
        assert_eq!(read.len(), 1, "the report was not sent again: {read:?}");
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
        let sending = tokio::spawn(async move { r.deliver("results", "j-1", &result).await });
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
        reporter.send("nowhere", "j-1", &hb).await;
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
