//! How a worker connects and what it reports about itself.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;

use crate::{Error, Result};

/// A heartbeat every 3 s: five in the scheduler's default `worker_ttl_ms` (15 s).
pub(crate) const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3);
/// [`WorkerConfig::start_report_delay`] by default.
pub(crate) const DEFAULT_START_REPORT_DELAY: Duration = Duration::from_millis(200);

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
    /// How long a job runs before its `JobStarted` is reported. A job that finishes sooner
    /// is reported by its `JobResult` alone (the scheduler takes a result for a DISPATCHED
    /// attempt as its start too, and journals both in one entry): one report, one input
    /// record and one journal entry fewer per short job. Zero: every job reports its start,
    /// before its handler runs. Default 200 ms; keep it well under the scheduler's
    /// `dispatch_timeout_ms` (60 s), which a job that never reports its start runs into.
    pub start_report_delay: Duration,
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
    /// The keyring that opens jobs' sealed secrets and payloads ([`JobContext::env`](crate::JobContext::env),
    /// [`JobContext::payload`](crate::JobContext::payload)); read again whenever the file changes, so a rotation or a
    /// shredding reaches a running worker. Default none: a job with sealed values then fails
    /// `secret_unavailable` without running.
    pub keyring: Option<Arc<ksched_secrets::KeyringFile>>,
    /// The Schema Registry (Confluent-compatible API) to look up the schema ids of dispatch
    /// records in the Confluent wire format (`schema_registry.output_format: confluent` on
    /// the scheduler). Default none: such records fail to decode and are skipped, logged.
    pub schema_registry_url: Option<String>,
}

impl WorkerConfig {
    pub fn new(bootstrap_servers: &str, worker_id: &str, pool: &str) -> WorkerConfig {
        WorkerConfig {
            bootstrap_servers: bootstrap_servers.to_owned(),
            worker_id: worker_id.to_owned(),
            pool: pool.to_owned(),
            topic_prefix: "ksched.".to_owned(),
            max_parallel_jobs: 4,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            shutdown_grace: Duration::from_secs(10),
            start_report_delay: DEFAULT_START_REPORT_DELAY,
            labels: BTreeMap::new(),
            capabilities: Vec::new(),
            properties: BTreeMap::new(),
            group_id: None,
            memory_free_bytes: None,
            report_host_load: true,
            keyring: None,
            schema_registry_url: None,
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

    pub(crate) fn client(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap_servers);
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }

    pub(crate) fn dispatch_topic(&self) -> String {
        format!("{}dispatch.{}", self.topic_prefix, self.pool)
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
