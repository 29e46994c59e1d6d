//! `ksched.yaml`, `pools.yaml` and the policy directory, with environment and flag overrides.
//!
//! Precedence: the file, then `KSCHED__SECTION__FIELD=value` environment variables (the value
//! is parsed as YAML, so numbers and booleans work), then command-line flags. Every field has a
//! default, so an empty file is a valid configuration. `ksched run --print-config` prints the
//! result.

mod load;
mod validate;

pub use load::{
    BoundTopic, Config, OneOrMany, Overrides, PoolsFile, TopicRoute, load_settings, parse_pools,
    parse_settings,
};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ksched_core::properties::{is_secret_property, parse_properties};
use ksched_core::records::HIDDEN;
use ksched_core::rules::{BreakerRules, Limits, Overload, RetryRules, Timing};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Prefix of environment overrides: `KSCHED__PROCESSOR__MAX_BATCH=200`.
pub const ENV_PREFIX: &str = "KSCHED__";

/// Connection to Kafka.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSettings {
    /// Comma-separated host:port list. Default `127.0.0.1:9092`.
    pub bootstrap_servers: String,
    /// Client id prefix for every Kafka client of this process. Default `ksched`.
    pub client_id: String,
    /// Extra librdkafka properties for every client (e.g. `security.protocol`). Default none.
    pub properties: BTreeMap<String, String>,
}

impl KafkaSettings {
    /// The properties with secret values replaced by [`HIDDEN`].
    pub fn masked_properties(&self) -> BTreeMap<String, String> {
        self.properties
            .iter()
            .map(|(k, v)| {
                let v = if is_secret_property(k) {
                    HIDDEN.to_owned()
                } else {
                    v.clone()
                };
                (k.clone(), v)
            })
            .collect()
    }
}

impl std::fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSettings")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("client_id", &self.client_id)
            .field("properties", &self.masked_properties())
            .finish()
    }
}

/// Reads a Kafka client properties file (`--command-config`, as Kafka's own tools take it):
/// see [`parse_properties`].
pub fn read_properties_file(path: &Path) -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Config {
        source_name: path.display().to_string(),
        detail: format!("cannot read it: {e}"),
    })?;
    parse_properties(&text).map_err(|detail| Error::Config {
        source_name: path.display().to_string(),
        detail,
    })
}

impl Default for KafkaSettings {
    fn default() -> Self {
        KafkaSettings {
            bootstrap_servers: "127.0.0.1:9092".into(),
            client_id: "ksched".into(),
            properties: BTreeMap::new(),
        }
    }
}

/// Topic names and how ksched creates them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopicSettings {
    /// Prefix of ksched's own topics: `<prefix>results`, `<prefix>control`,
    /// `<prefix>heartbeats`, `<prefix>journal`, `<prefix>dlq`, `<prefix>dispatch.<pool>`.
    /// Default `ksched.`.
    pub prefix: String,
    /// Create missing topics at start. Default true.
    pub create: bool,
    /// Check existing topics' configuration at start (timestamp type, message size,
    /// journal retention and compaction) and refuse what breaks ksched's guarantees.
    /// Default true.
    pub verify: bool,
    /// Take producers' timestamps (CreateTime) as the time of input records. Only for a
    /// cluster that cannot stamp LogAppendTime (the embedded mock of `ksched dev`): any
    /// producer could then move the scheduler's clock. Default false.
    pub trust_create_time: bool,
    /// Replication factor of created topics. Default 1.
    pub replication_factor: i32,
    /// Partitions of each job topic ksched creates. Default 4.
    pub job_partitions: i32,
    /// Partitions of the results topic. Default 4.
    pub results_partitions: i32,
    /// Partitions of the control topic. Default 1.
    pub control_partitions: i32,
    /// Partitions of the heartbeats topic. Default 1.
    pub heartbeats_partitions: i32,
    /// Partitions of the journal. Default 1 (one processor owns each partition).
    pub journal_partitions: i32,
    /// Partitions of the DLQ topic. Default 1.
    pub dlq_partitions: i32,
    /// Partitions of each pool's dispatch topic: at least the pool's largest worker count.
    /// Default 8.
    pub dispatch_partitions: i32,
}

impl Default for TopicSettings {
    fn default() -> Self {
        TopicSettings {
            prefix: "ksched.".into(),
            create: true,
            verify: true,
            trust_create_time: false,
            replication_factor: 1,
            job_partitions: 4,
            results_partitions: 4,
            control_partitions: 1,
            heartbeats_partitions: 1,
            journal_partitions: 1,
            dlq_partitions: 1,
            dispatch_partitions: 8,
        }
    }
}

/// The processor loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessorSettings {
    /// Consumer group of the processor on the input topics. Default `ksched-processor`.
    pub group_id: String,
    /// The shard (journal partition) a processor runs. Set by the scheduler for each shard's
    /// processor; in the settings file it only matters to tools that read one shard
    /// (`audit --shard` overrides it). Default 0.
    pub journal_partition: i32,
    /// Most input records per transaction. Default 500.
    pub max_batch: usize,
    /// Longest a batch collects before it commits, in ms. Default 20.
    pub commit_interval_ms: u64,
    /// Adaptive batching: a batch commits as soon as the input consumer has nothing more at
    /// hand, instead of waiting out `commit_interval_ms`; the inputs that arrive while it
    /// commits make the next batch, so under load batches grow by themselves (up to
    /// `max_batch` and the interval). Off: every batch waits out the interval once it has an
    /// input (fewer, larger transactions at low load, at the price of latency). Default true.
    pub adaptive_batching: bool,
    /// Pipelining: while a batch's transaction ends (offsets, acknowledgements, commit) on
    /// the transaction thread, the processor decides the next batch into an outbox, sent once
    /// the previous one committed and its projection was written. Off: each batch is
    /// committed and written before the next is read, its records sent as they are decided.
    /// Default false: on a 2-core machine shared with the broker it gave 10-25 % more
    /// throughput but a p99 14-29 ms worse (docs/performance.md); it is meant for a broker
    /// across a network with cores to spare, where a transaction's end takes longer.
    pub pipelined: bool,
    /// Transactional producers a shard's processor uses in turn, one transaction each: 1 or
    /// 2. A transaction cannot add a partition until the coordinator has written the
    /// previous one's commit markers (it answers CONCURRENT_TRANSACTIONS, and librdkafka
    /// asks again 20 ms later); with two, each batch begins on the producer that did not
    /// just commit. Transactions still commit one after the other, in order. The second
    /// producer's transactional id is the first's with `-b` appended (the ACL prefix
    /// `<group_id>-journal-` covers both). Default 2.
    pub transactional_producers: u8,
    /// Leaves out of the journal (and the state) a heartbeat of an idle worker that says
    /// what its last journaled one said, while that one is less than a third of the worker
    /// TTL old (`ksched_core::decide::redundant_heartbeat`): an idle fleet no longer grows
    /// the journal with every heartbeat. Replay stays exact. Default true.
    pub coalesce_heartbeats: bool,
    /// The input positions a batch consumed up to travel in its first journal record (a
    /// `ksched-positions` header, docs/architecture.md), not to the consumer group: a
    /// transaction then needs no AddOffsetsToTxn and TxnOffsetCommit round trips. The
    /// positions still go to the group, in the transaction, when a batch journals nothing,
    /// when it is small (`journal_positions_min_batch`), and at least this often, in ms, so
    /// that consumer-lag tools see the group move. 0: every transaction sends them to the
    /// group (as before 2026-12). Default 1000.
    pub group_offsets_interval_ms: u64,
    /// Batches of fewer input records than this send their positions to the consumer group,
    /// not in a journal header: at low load the header would cost more journal bytes (an
    /// idle fleet's heartbeats are such batches) than the offsets cost time. Default 8.
    pub journal_positions_min_batch: usize,
    /// Kafka `transaction.timeout.ms`. Default 60000.
    pub transaction_timeout_ms: u64,
    /// Interval between Tick records, in ms. Default 1000.
    pub tick_interval_ms: u64,
    /// How long shutdown waits for the open batch to commit, in ms. Default 10000.
    pub shutdown_grace_ms: u64,
    /// No input record at all for this long, while the ticker writes one every
    /// `tick_interval_ms`, means the input consumer is stuck: the processor is rebuilt (new
    /// consumer and producer), as after any failure. Default 30000.
    pub input_stall_ms: u64,
    /// Instances with the same `group_id` share the shards (journal partitions) through
    /// Kafka's consumer-group protocol (group `<group_id>-owners`, cooperative-sticky): each
    /// shard is owned by one instance, which runs its processor; the others stand by for it,
    /// tailing its journal into their own RocksDB, and take over when the owner leaves or
    /// dies. Off: this instance runs every shard's processor unconditionally (and a second
    /// one fences it). Default true.
    pub lease: bool,
    /// How long the owner may go unheard before a standby takes over, in ms (the lease
    /// group's `session.timeout.ms`; brokers refuse less than their
    /// `group.min.session.timeout.ms`, 6000 by default). Default 6000.
    pub lease_session_timeout_ms: u64,
    /// How many instances besides its owner stand by for each shard: tail its journal into
    /// their own RocksDB, so that taking it over is a short catch-up. The standbys of a shard
    /// are chosen among the owners' group's members by rendezvous hashing (spread over the
    /// instances; one joining or leaving moves only the standbys it must). 0: none, a new
    /// owner catches up from its own store (a full rebuild when it has none). Kafka's
    /// assignor does not know the standbys: when a shard's owner dies, the shard may go to
    /// an instance that was not its standby, which then catches up from its own store; only
    /// with every other instance standing by is every takeover warm. Unset (the default):
    /// every other instance stands by.
    pub standby_replicas: Option<u32>,
}

impl Default for ProcessorSettings {
    fn default() -> Self {
        ProcessorSettings {
            group_id: "ksched-processor".into(),
            journal_partition: 0,
            max_batch: 500,
            commit_interval_ms: 20,
            adaptive_batching: true,
            pipelined: false,
            transactional_producers: 2,
            coalesce_heartbeats: true,
            group_offsets_interval_ms: 1_000,
            journal_positions_min_batch: 8,
            transaction_timeout_ms: 60_000,
            tick_interval_ms: 1_000,
            shutdown_grace_ms: 10_000,
            input_stall_ms: 30_000,
            lease: true,
            lease_session_timeout_ms: 6_000,
            standby_replicas: None,
        }
    }
}

/// Decision settings besides routing: timers, retries, overload thresholds, circuit breaker.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerSettings {
    pub timing: Timing,
    pub retry: RetryRules,
    pub overload: Overload,
    pub breaker: BreakerRules,
    pub limits: Limits,
}

/// Where the projection lives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageSettings {
    /// RocksDB directory. Default `./data`.
    pub data_dir: PathBuf,
    /// Free bytes to keep on the filesystem under `data_dir`: while less is free, new jobs
    /// are dead-lettered `storage_full` before they are journaled, and every job already
    /// accepted goes on. 0: no reserve. Default 1 GiB.
    pub min_free_disk_bytes: u64,
}

impl Default for StorageSettings {
    fn default() -> Self {
        StorageSettings {
            data_dir: PathBuf::from("./data"),
            min_free_disk_bytes: 1 << 30,
        }
    }
}

/// The HTTP API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// Serve the API and /metrics. Default true.
    pub enabled: bool,
    /// Listen address. Default `127.0.0.1:8080` (loopback only).
    pub listen: String,
    /// API tokens: a YAML file of principals, their roles and tenants, and the SHA-256 of
    /// each one's token (docs/security.md). Without it the API has no authentication, and
    /// `ksched run` refuses to listen beyond loopback. Relative to the settings file.
    /// Default none.
    pub tokens_file: Option<PathBuf>,
    /// An approver may not approve or reject a job they submitted: the API refuses it (403)
    /// and, journaled with the rules, so does the processor for control records written to
    /// Kafka directly. Default true.
    pub four_eyes: bool,
    /// `Host` header values the API answers (against DNS rebinding); health and metrics
    /// answer any. Default: `localhost`, `127.0.0.1`, `[::1]` and the listen address's host.
    pub allowed_hosts: Vec<String>,
    /// Largest request body. Default 65536.
    pub max_body_bytes: usize,
    /// Bearer JWTs from an OIDC issuer, verified against its JWKS (docs/security.md).
    /// Default none.
    pub jwt: Option<JwtSettings>,
    /// Serve the API over TLS. Default none (plain HTTP).
    pub tls: Option<TlsSettings>,
    /// Most connections open at once; beyond it new ones wait to be accepted. Default 1024.
    pub max_connections: usize,
    /// A connection must send a request's headers within this long of connecting (or of
    /// its previous response), and its body within this long of the headers; otherwise it
    /// is closed. Default 10000 (10 s).
    pub request_read_timeout_ms: u64,
    /// The console's time travel and what-if run in a child process (`ksched
    /// replay-child`), killed after this long. Default 300000 (5 min).
    pub replay_timeout_ms: u64,
    /// The child's resident memory limit, in bytes (it is killed beyond): a what-if holds
    /// two projections of the shard in memory. Default 4294967296 (4 GiB).
    pub replay_memory_limit_bytes: u64,
}

/// `http.jwt`: bearer JWTs an OIDC issuer signed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtSettings {
    /// The `iss` a token must carry (the issuer URL).
    pub issuer: String,
    /// The `aud` a token must carry (the client id ksched is registered as).
    pub audience: String,
    /// The issuer's JSON Web Key Set (its `jwks_uri`, saved to a file a sidecar or a cron job
    /// refreshes); read again when a token names a key id it lacks. Relative to the
    /// settings file.
    pub jwks_file: PathBuf,
    /// The claim naming the principal. Default `sub`.
    pub principal_claim: String,
    /// The claim listing ksched roles (`viewer`, `operator`, `approver`, `auditor`, `admin`).
    /// Default `ksched_roles`.
    pub roles_claim: String,
    /// The claim listing the tenants the caller is held to; absent: every tenant.
    /// Default `ksched_tenants`.
    pub tenants_claim: String,
    /// Clock skew allowed on `exp` and `nbf`, in seconds. Default 30.
    pub leeway_s: u64,
}

impl Default for JwtSettings {
    fn default() -> Self {
        JwtSettings {
            issuer: String::new(),
            audience: String::new(),
            jwks_file: PathBuf::new(),
            principal_claim: "sub".into(),
            roles_claim: "ksched_roles".into(),
            tenants_claim: "ksched_tenants".into(),
            leeway_s: 30,
        }
    }
}

/// `http.tls`: the API over TLS (PEM files, relative to the settings file).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// The server's certificate chain.
    pub cert_file: PathBuf,
    /// Its private key.
    pub key_file: PathBuf,
    /// With it, clients must present a certificate this CA signed (mutual TLS): only
    /// holders of one reach the API at all; who they are to ksched still comes from their
    /// token.
    pub client_ca_file: Option<PathBuf>,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            enabled: true,
            listen: "127.0.0.1:8080".into(),
            tokens_file: None,
            four_eyes: true,
            allowed_hosts: Vec::new(),
            max_body_bytes: 64 * 1024,
            jwt: None,
            tls: None,
            max_connections: 1024,
            request_read_timeout_ms: 10_000,
            replay_timeout_ms: 300_000,
            replay_memory_limit_bytes: 4 << 30,
        }
    }
}

impl HttpSettings {
    /// Whether callers must authenticate (API tokens or JWTs).
    pub fn authenticates(&self) -> bool {
        self.tokens_file.is_some() || self.jwt.is_some()
    }
}

/// Logging.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// `text` or `json`. Default `text`.
    pub format: String,
    /// A tracing filter (`info`, `ksched=debug,rdkafka=warn`). Default `info`.
    pub level: String,
    /// OTLP/HTTP endpoint for trace export (e.g. `http://127.0.0.1:4318/v1/traces`). Default
    /// none: then `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`, if
    /// set, and otherwise no export (trace context is carried through Kafka headers anyway).
    pub otlp_endpoint: Option<String>,
    /// `service.name` of exported traces. Default `ksched`.
    pub service_name: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            format: "text".into(),
            level: "info".into(),
            otlp_endpoint: None,
            service_name: "ksched".into(),
        }
    }
}

/// How ksched writes the records it produces (journal, dispatch, DLQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    /// Avro single-object encoding (`C3 01` + fingerprint), readable without a registry.
    #[default]
    SingleObject,
    /// The Confluent wire format (`00` + schema id), readable by Kafka Connect, ksqlDB,
    /// Flink and the Confluent deserializers; needs `schema_registry.url`.
    Confluent,
}

/// Subject names under which ksched registers its schemas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubjectStrategy {
    /// `<topic>-value`; a topic carrying several record types gets a union of them.
    #[default]
    Topic,
    /// The record's full name (`io.ksched.Dispatch`).
    Record,
}

/// A Schema Registry (the Confluent-compatible REST API; docs/schema-evolution.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchemaRegistrySettings {
    /// Base URL, e.g. `http://127.0.0.1:8081/apis/ccompat/v7` (Apicurio) or
    /// `http://registry:8081` (Confluent). Default none: job records in the Confluent wire
    /// format are refused (`malformed_record`), and ksched writes single-object encoding.
    pub url: Option<String>,
    /// `topic` (default) or `record`.
    pub subject_name_strategy: SubjectStrategy,
    /// `single_object` (default) or `confluent`.
    pub output_format: OutputFormat,
    /// A file holding `user:password` for HTTP basic authentication (Confluent's
    /// `basic.auth.user.info`), kept out of this file. Default none.
    pub basic_auth_file: Option<PathBuf>,
    /// Timeout of each registry call. Default 5,000 ms.
    pub timeout_ms: u64,
}

impl Default for SchemaRegistrySettings {
    fn default() -> Self {
        SchemaRegistrySettings {
            url: None,
            subject_name_strategy: SubjectStrategy::Topic,
            output_format: OutputFormat::SingleObject,
            basic_auth_file: None,
            timeout_ms: 5_000,
        }
    }
}

/// Everything in `ksched.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    pub kafka: KafkaSettings,
    pub topics: TopicSettings,
    pub processor: ProcessorSettings,
    pub scheduler: SchedulerSettings,
    pub storage: StorageSettings,
    pub http: HttpSettings,
    pub log: LogSettings,
    pub schema_registry: SchemaRegistrySettings,
    /// Routing file (SPEC §3 format), relative to this file. Default `pools.yaml`.
    pub pools_file: PathBuf,
    /// Directory of Rego policies and data.json, relative to this file. Default `policy`.
    pub policy_dir: PathBuf,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            kafka: KafkaSettings::default(),
            topics: TopicSettings::default(),
            processor: ProcessorSettings::default(),
            scheduler: SchedulerSettings::default(),
            storage: StorageSettings::default(),
            http: HttpSettings::default(),
            log: LogSettings::default(),
            schema_registry: SchemaRegistrySettings::default(),
            pools_file: PathBuf::from("pools.yaml"),
            policy_dir: PathBuf::from("policy"),
        }
    }
}

#[cfg(test)]
mod tests;
