//! A scheduler in the test process against the real broker, with its own topics, group,
//! data directory and policy; SDK workers; and readers for the journal, DLQ and dispatch
//! topics.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ksched_codec::{AnyRecord, Record};
use ksched_core::events::JournalEntry;
use ksched_core::records::{DeadLetter, JobRequest};
use ksched_core::state::Job;
use ksched_runtime::{Config, Overrides, Status};
use ksched_store::Store;
use ksched_testkit::{TEST_POLICY, bootstrap_servers, client_config, unique};
use ksched_worker::{JobContext, Outcome, Worker, WorkerConfig};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use tokio_util::sync::CancellationToken;

pub(crate) struct Scheduler {
    pub bootstrap: String,
    pub prefix: String,
    pub job_topic: String,
    pub config: Config,
    pub store: Store,
    pub status: Arc<Status>,
    running: Option<ksched_runtime::Scheduler>,
    _dir: tempfile::TempDir,
}

/// Extra `KSCHED__*` settings for a test.
pub(crate) type Env = Vec<(&'static str, String)>;

impl Scheduler {
    pub(crate) async fn start(env: Env) -> Scheduler {
        Scheduler::try_start(env)
            .await
            .unwrap_or_else(|e| panic!("starting the scheduler: {e}"))
    }

    /// Starts a scheduler, or says why it would not start.
    pub(crate) async fn try_start(env: Env) -> Result<Scheduler, String> {
        let bootstrap = bootstrap_servers().unwrap_or_else(|e| panic!("{e}"));
        let prefix = format!("{}.", unique("t"));
        let job_topic = format!("{prefix}jobs");
        let dir = tempfile::tempdir().unwrap();
        let pools = dir.path().join("pools.yaml");
        std::fs::write(
            &pools,
            format!("topics:\n  {job_topic}: default\npools:\n  default:\n    requires: []\n"),
        )
        .unwrap();
        let policy = dir.path().join("policy");
        std::fs::create_dir(&policy).unwrap();
        std::fs::write(policy.join("input.rego"), TEST_POLICY).unwrap();
        let mut vars: Vec<(String, String)> = vec![
            ("KSCHED__TOPICS__PREFIX".into(), prefix.clone()),
            ("KSCHED__TOPICS__DISPATCH_PARTITIONS".into(), "4".into()),
            ("KSCHED__TOPICS__JOB_PARTITIONS".into(), "2".into()),
            ("KSCHED__TOPICS__RESULTS_PARTITIONS".into(), "2".into()),
            (
                "KSCHED__PROCESSOR__GROUP_ID".into(),
                format!("{prefix}processor"),
            ),
            ("KSCHED__PROCESSOR__TICK_INTERVAL_MS".into(), "200".into()),
            ("KSCHED__PROCESSOR__COMMIT_INTERVAL_MS".into(), "10".into()),
            (
                "KSCHED__SCHEDULER__TIMING__CLOCK_GAP_MS".into(),
                "2000".into(),
            ),
            (
                "KSCHED__SCHEDULER__OVERLOAD__CPU_LOAD".into(),
                "1000".into(),
            ),
            (
                "KSCHED__SCHEDULER__RETRY__INITIAL_BACKOFF_MS".into(),
                "200".into(),
            ),
            (
                "KSCHED__SCHEDULER__RETRY__MAX_BACKOFF_MS".into(),
                "1000".into(),
            ),
            ("KSCHED__HTTP__ENABLED".into(), "false".into()),
        ];
        for (k, v) in env {
            vars.push((k.to_owned(), v));
        }
        let flags = Overrides {
            bootstrap_servers: Some(bootstrap.clone()),
            data_dir: Some(dir.path().join("data")),
            pools_file: Some(pools),
            policy_dir: Some(policy),
            ..Overrides::default()
        };
        let config = Config::load(None, vars, &flags).map_err(|e| format!("config: {e}"))?;
        let running = ksched_runtime::Scheduler::start(config.clone())
            .await
            .map_err(|e| e.to_string())?;
        let s = Scheduler {
            bootstrap,
            prefix,
            job_topic,
            config: running.config.clone(),
            store: running.store.clone(),
            status: running.status.clone(),
            running: Some(running),
            _dir: dir,
        };
        s.wait_caught_up().await;
        Ok(s)
    }

    async fn wait_caught_up(&self) {
        wait_for("the processor to catch up", Duration::from_secs(60), || {
            self.status.is_caught_up()
        })
        .await;
    }

    pub(crate) fn topic(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Produces a record (single-object encoded) to `topic`.
    pub(crate) fn produce<T: Record>(&self, topic: &str, key: &str, value: &T) {
        let bytes = ksched_codec::encode(value).unwrap();
        self.produce_raw(topic, key, &bytes);
    }

    pub(crate) fn produce_raw(&self, topic: &str, key: &str, bytes: &[u8]) {
        let producer: BaseProducer = client_config(&self.bootstrap).create().unwrap();
        producer
            .send(BaseRecord::to(topic).key(key).payload(bytes))
            .map_err(|(e, _)| e)
            .unwrap();
        producer.flush(Duration::from_secs(10)).unwrap();
    }

    pub(crate) fn submit(&self, request: &JobRequest) {
        self.produce(&self.job_topic, &request.job_id, request);
    }

    pub(crate) fn job(&self, id: &str) -> Option<Job> {
        self.store.job(id).unwrap()
    }

    /// Waits until the projection's job satisfies `pred`; returns it.
    pub(crate) async fn wait_job(&self, id: &str, what: &str, pred: impl Fn(&Job) -> bool) -> Job {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(j) = self.job(id)
                && pred(&j)
            {
                return j;
            }
            if Instant::now() > deadline {
                panic!(
                    "job {id} never became {what}; last seen: {:?}",
                    self.job(id)
                        .map(|j| (j.state, self.store.history(id).unwrap_or_default()))
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts an SDK worker of the `default` pool running `handler`.
    pub(crate) fn worker<H, F>(&self, id: &str, handler: H) -> WorkerHandle
    where
        H: Fn(JobContext) -> F + Send + Sync + 'static,
        F: std::future::Future<Output = Outcome> + Send + 'static,
    {
        self.worker_with(id, |_| {}, handler)
    }

    /// Starts an SDK worker of the `default` pool running `handler`, its configuration
    /// changed by `configure`.
    pub(crate) fn worker_with<H, F>(
        &self,
        id: &str,
        configure: impl FnOnce(&mut WorkerConfig),
        handler: H,
    ) -> WorkerHandle
    where
        H: Fn(JobContext) -> F + Send + Sync + 'static,
        F: std::future::Future<Output = Outcome> + Send + 'static,
    {
        let mut cfg = WorkerConfig::new(&self.bootstrap, id, "default");
        cfg.topic_prefix = self.prefix.clone();
        cfg.heartbeat_interval = Duration::from_millis(300);
        cfg.shutdown_grace = Duration::from_secs(5);
        cfg.report_host_load = false;
        configure(&mut cfg);
        let token = CancellationToken::new();
        let worker = Worker::new(cfg).unwrap();
        let t = token.clone();
        let handle = tokio::spawn(async move { worker.run(handler, t).await });
        WorkerHandle { token, handle }
    }

    /// Waits until the scheduler knows worker `id` as alive with dispatch partitions.
    pub(crate) async fn wait_worker(&self, id: &str) {
        wait_for(
            &format!("worker {id} to be known"),
            Duration::from_secs(60),
            || {
                self.store.workers().unwrap().iter().any(|(w, rec)| {
                    w == id && rec.alive && !rec.heartbeat.owned_partitions.is_empty()
                })
            },
        )
        .await;
    }

    /// Every journal entry so far (read_committed, from the beginning).
    pub(crate) fn journal(&self) -> Vec<(i64, JournalEntry)> {
        read_all(&self.bootstrap, &self.topic("journal"), |b| {
            ksched_codec::decode::<JournalEntry>(b).unwrap()
        })
    }

    pub(crate) fn dead_letters(&self) -> Vec<DeadLetter> {
        read_all(&self.bootstrap, &self.topic("dlq"), |b| {
            ksched_codec::decode::<DeadLetter>(b).unwrap()
        })
        .into_iter()
        .map(|(_, d)| d)
        .collect()
    }

    pub(crate) fn dispatch_records(&self) -> Vec<AnyRecord> {
        read_all(&self.bootstrap, &self.topic("dispatch.default"), |b| {
            ksched_codec::decode_any(b).unwrap()
        })
        .into_iter()
        .map(|(_, d)| d)
        .collect()
    }

    /// Starts the processor again on the same store and topics (after [`Scheduler::stop`]).
    pub(crate) async fn restart(mut self) -> Scheduler {
        drop(self.running.take());
        let running = ksched_runtime::Scheduler::start_on(self.config.clone(), self.store.clone())
            .await
            .unwrap_or_else(|e| panic!("restarting the scheduler: {e}"));
        self.store = running.store.clone();
        self.status = running.status.clone();
        self.running = Some(running);
        self.wait_caught_up().await;
        self
    }

    pub(crate) fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop().unwrap();
        }
    }
}

pub(crate) struct WorkerHandle {
    pub token: CancellationToken,
    pub handle: tokio::task::JoinHandle<ksched_worker::Result<()>>,
}

impl WorkerHandle {
    pub(crate) async fn stop(self) {
        self.token.cancel();
        self.handle.await.unwrap().unwrap();
    }
}

/// Polls `cond` until it holds, or panics after `limit`.
pub(crate) async fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        if Instant::now() > deadline {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads a topic from the beginning to its end as of the call, read_committed.
pub(crate) fn read_all<T>(
    bootstrap: &str,
    topic: &str,
    decode: impl Fn(&[u8]) -> T,
) -> Vec<(i64, T)> {
    ksched_testkit::read_to_end(bootstrap, topic)
        .unwrap_or_else(|e| panic!("reading {topic}: {e}"))
        .into_iter()
        .filter_map(|r| r.payload.map(|p| (r.offset, decode(&p))))
        .collect()
}

pub(crate) fn request(scheduler: &Scheduler, id: &str) -> JobRequest {
    JobRequest {
        job_id: id.into(),
        topic: scheduler.job_topic.clone(),
        tenant_id: "acme".into(),
        principal_id: Some("alice".into()),
        submitted_at: now_ms(),
        ..Default::default()
    }
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

pub(crate) fn data_dir(s: &Scheduler) -> PathBuf {
    s.config.settings.storage.data_dir.clone()
}
