//! `ksched.yaml`, `pools.yaml` and the policy directory, with environment and flag overrides.
//!
//! Precedence: the file, then `KSCHED__SECTION__FIELD=value` environment variables (the value
//! is parsed as YAML, so numbers and booleans work), then command-line flags. Every field has a
//! default, so an empty file is a valid configuration. `ksched run --print-config` prints the
//! result.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ksched_core::events::Reconfigure;
use ksched_core::hash::sha256_parts;
use ksched_core::properties::{is_secret_property, parse_properties};
use ksched_core::records::HIDDEN;
use ksched_core::rules::{
    BreakerRules, Limits, Overload, PoolRules, RetryRules, Rules, TenantRules, Timing,
};
use ksched_policy::PolicyBundle;
use serde::{Deserialize, Serialize};
use serde_norway::Value as Yaml;

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
}

impl Default for StorageSettings {
    fn default() -> Self {
        StorageSettings {
            data_dir: PathBuf::from("./data"),
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

/// `pools.yaml`: SPEC §3.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolsFile {
    /// Job topic -> one pool, a list of pools (in preference order), or
    /// `{pools: ..., tenants: [...]}` binding the topic to the tenants it may carry.
    pub topics: BTreeMap<String, TopicRoute>,
    pub pools: BTreeMap<String, PoolRules>,
    pub tenants: BTreeMap<String, TenantRules>,
}

impl PoolsFile {
    /// Puts this file's routing, pools and tenants into `rules` (the rest of the rules
    /// come from `ksched.yaml`).
    pub fn apply_to(&self, rules: &mut Rules) {
        rules.topics = self
            .topics
            .iter()
            .map(|(t, p)| (t.clone(), p.pools()))
            .collect();
        rules.topic_tenants = self
            .topics
            .iter()
            .filter_map(|(t, p)| Some((t.clone(), p.tenants()?.to_vec())))
            .collect();
        rules.topic_principals = self
            .topics
            .iter()
            .filter_map(|(t, p)| Some((t.clone(), p.principal()?.to_owned())))
            .collect();
        rules.pools = self.pools.clone();
        rules.tenants = self.tenants.clone();
    }
}

/// `default` or `[gpu-a100, gpu-h100]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

/// A job topic's entry in `pools.yaml`: its pools, and the tenants it may carry if bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    untagged,
    expecting = "a pool, a list of pools, or {pools: [...], tenants: [...], principal: ...} (no other keys)"
)]
pub enum TopicRoute {
    Pools(OneOrMany),
    Bound(BoundTopic),
}

/// `{pools: [batch, default], tenants: [acme], principal: acme-producer}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoundTopic {
    pub pools: OneOrMany,
    /// Tenants whose jobs the topic carries; their job ids start with `<tenant_id>:`.
    #[serde(default)]
    pub tenants: Vec<String>,
    /// The principal that produces the topic (the only one its ACL lets write): its jobs are
    /// that principal's (`principal_id` filled in; another is refused), so four eyes knows
    /// who submitted them. Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
}

impl TopicRoute {
    pub fn pools(&self) -> Vec<String> {
        match self {
            TopicRoute::Pools(p) | TopicRoute::Bound(BoundTopic { pools: p, .. }) => p.to_vec(),
        }
    }

    pub fn tenants(&self) -> Option<&[String]> {
        match self {
            TopicRoute::Pools(_) => None,
            TopicRoute::Bound(b) if b.tenants.is_empty() => None,
            TopicRoute::Bound(b) => Some(&b.tenants),
        }
    }

    pub fn principal(&self) -> Option<&str> {
        match self {
            TopicRoute::Pools(_) => None,
            TopicRoute::Bound(b) => b.principal.as_deref(),
        }
    }
}

/// Everything `ksched run` needs, loaded and checked.
#[derive(Debug, Clone)]
pub struct Config {
    pub settings: Settings,
    pub rules: Rules,
    pub policy: PolicyBundle,
    /// Where settings came from, for messages.
    pub source: Option<PathBuf>,
    /// How the processor frames what it writes: single-object unless the schema registry's
    /// ids were set at start (`schema_registry.output_format: confluent`).
    pub framing: std::sync::Arc<ksched_codec::Framing>,
}

/// Flags that override the file and the environment.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub bootstrap_servers: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub http_listen: Option<String>,
    pub pools_file: Option<PathBuf>,
    pub policy_dir: Option<PathBuf>,
    /// librdkafka properties from `--command-config` then `-X key=value`, applied over
    /// `kafka.properties` in that order.
    pub kafka_properties: Vec<(String, String)>,
}

/// Loads the settings alone: `path` (or defaults), then `KSCHED__*` variables from `env`,
/// then `flags`; relative paths resolved, validated. What every tool that talks to Kafka
/// shares with `ksched run`.
pub fn load_settings(
    path: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    flags: &Overrides,
) -> Result<Settings> {
    let (mut tree, base_dir) = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| Error::Config {
                source_name: p.display().to_string(),
                detail: format!("cannot read it: {e}"),
            })?;
            let tree: Yaml = if text.trim().is_empty() {
                Yaml::Mapping(Default::default())
            } else {
                serde_norway::from_str(&text).map_err(|e| Error::Config {
                    source_name: p.display().to_string(),
                    detail: e.to_string(),
                })?
            };
            let dir = p.parent().map(Path::to_path_buf).unwrap_or_default();
            (tree, dir)
        }
        None => (Yaml::Mapping(Default::default()), PathBuf::from(".")),
    };
    apply_env(&mut tree, env)?;
    let source_name = path.map_or_else(|| "defaults".to_owned(), |p| p.display().to_string());
    let mut settings: Settings = serde_norway::from_value(tree).map_err(|e| Error::Config {
        source_name: source_name.clone(),
        detail: e.to_string(),
    })?;
    if let Some(v) = &flags.bootstrap_servers {
        settings.kafka.bootstrap_servers = v.clone();
    }
    if let Some(v) = &flags.data_dir {
        settings.storage.data_dir = v.clone();
    }
    if let Some(v) = &flags.http_listen {
        settings.http.listen = v.clone();
    }
    if let Some(v) = &flags.pools_file {
        settings.pools_file = v.clone();
    }
    if let Some(v) = &flags.policy_dir {
        settings.policy_dir = v.clone();
    }
    for (k, v) in &flags.kafka_properties {
        settings.kafka.properties.insert(k.clone(), v.clone());
    }
    // Relative paths in the file are relative to the file; flags are relative to the cwd.
    let resolve = |p: &Path, from_flag: bool| {
        if p.is_absolute() || from_flag {
            p.to_path_buf()
        } else {
            base_dir.join(p)
        }
    };
    settings.pools_file = resolve(&settings.pools_file, flags.pools_file.is_some());
    settings.policy_dir = resolve(&settings.policy_dir, flags.policy_dir.is_some());
    if let Some(t) = &settings.http.tokens_file {
        settings.http.tokens_file = Some(resolve(t, false));
    }
    if let Some(j) = &mut settings.http.jwt {
        j.jwks_file = resolve(&j.jwks_file, false);
    }
    if let Some(f) = &settings.schema_registry.basic_auth_file {
        settings.schema_registry.basic_auth_file = Some(resolve(f, false));
    }
    if let Some(t) = &mut settings.http.tls {
        t.cert_file = resolve(&t.cert_file, false);
        t.key_file = resolve(&t.key_file, false);
        t.client_ca_file = t.client_ca_file.as_deref().map(|c| resolve(c, false));
    }
    settings.validate()?;
    Ok(settings)
}

impl Config {
    /// Loads the settings ([`load_settings`]), then the pools file and the policy bundle, and
    /// validates everything.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &Overrides,
    ) -> Result<Config> {
        let settings = load_settings(path, env, flags)?;
        let pools = load_pools(&settings.pools_file)?;
        let mut rules = Rules {
            timing: settings.scheduler.timing.clone(),
            retry: settings.scheduler.retry.clone(),
            overload: settings.scheduler.overload.clone(),
            breaker: settings.scheduler.breaker.clone(),
            limits: settings.scheduler.limits.clone(),
            // Filled in from the broker's metadata at start (topics::dispatch_partitions).
            dispatch_partitions: BTreeMap::new(),
            four_eyes: settings.http.four_eyes,
            ..Rules::default()
        };
        pools.apply_to(&mut rules);
        let shards = u32::try_from(settings.topics.journal_partitions).unwrap_or(1);
        rules
            .validate()
            .and_then(|()| ksched_core::rules::check_shards(&rules, shards))
            .map_err(|e| Error::Config {
                source_name: settings.pools_file.display().to_string(),
                detail: e.to_string(),
            })?;
        let policy = if settings.policy_dir.is_dir() {
            PolicyBundle::from_dir(&settings.policy_dir).map_err(|e| Error::Config {
                source_name: settings.policy_dir.display().to_string(),
                detail: e.to_string(),
            })?
        } else {
            return Err(Error::Config {
                source_name: settings.policy_dir.display().to_string(),
                detail: "policy directory not found (set policy_dir, or --policy-dir)".into(),
            });
        };
        Ok(Config {
            settings,
            rules,
            policy,
            source: path.map(Path::to_path_buf),
            framing: Default::default(),
        })
    }

    /// The input that puts these rules and this policy in force (journaled).
    pub fn reconfigure(&self) -> Reconfigure {
        let rules_json = self.rules.to_canonical_json();
        Reconfigure {
            rules_id: sha256_parts([rules_json.as_bytes()])[..16].to_owned(),
            rules_json,
            policy_modules: self.policy.modules.clone(),
            policy_data_json: self.policy.data_json.clone(),
            policy_snapshot: self.policy.snapshot_id(),
        }
    }

    /// The effective configuration as YAML, for `--print-config`.
    pub fn to_yaml(&self) -> String {
        #[derive(Serialize)]
        struct Printed<'a> {
            #[serde(flatten)]
            settings: &'a Settings,
            effective_rules: &'a Rules,
            policy_snapshot: String,
            policy_modules: Vec<&'a String>,
        }
        let mut settings = self.settings.clone();
        settings.kafka.properties = settings.kafka.masked_properties();
        let printed = Printed {
            settings: &settings,
            effective_rules: &self.rules,
            policy_snapshot: self.policy.snapshot_id(),
            policy_modules: self.policy.modules.keys().collect(),
        };
        serde_norway::to_string(&printed).unwrap_or_else(|e| format!("# cannot print: {e}\n"))
    }
}

/// Parses a settings file's text alone (no environment, no flags, no pools or policy): what
/// the operator tools need to find Kafka and the API.
pub fn parse_settings(text: &str) -> Result<Settings> {
    if text.trim().is_empty() {
        return Ok(Settings::default());
    }
    serde_norway::from_str(text).map_err(|e| Error::Config {
        source_name: "settings".into(),
        detail: e.to_string(),
    })
}

/// Parses a pools file's text.
pub fn parse_pools(text: &str) -> Result<PoolsFile> {
    serde_norway::from_str(text).map_err(|e| Error::Config {
        source_name: "pools".into(),
        detail: e.to_string(),
    })
}

fn load_pools(path: &Path) -> Result<PoolsFile> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Config {
        source_name: path.display().to_string(),
        detail: format!("cannot read the pools file: {e}"),
    })?;
    serde_norway::from_str(&text).map_err(|e| Error::Config {
        source_name: path.display().to_string(),
        detail: e.to_string(),
    })
}

/// Applies `KSCHED__A__B=value` to the YAML tree (`a.b = value`).
fn apply_env(tree: &mut Yaml, env: impl IntoIterator<Item = (String, String)>) -> Result<()> {
    for (name, value) in env {
        let Some(path) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        let keys: Vec<String> = path.split("__").map(str::to_ascii_lowercase).collect();
        if keys.iter().any(String::is_empty) {
            return Err(Error::Config {
                source_name: name.clone(),
                detail: "empty path segment; use KSCHED__SECTION__FIELD".into(),
            });
        }
        let parsed: Yaml = serde_norway::from_str(&value).unwrap_or(Yaml::String(value.clone()));
        let mut node = &mut *tree;
        for (i, key) in keys.iter().enumerate() {
            let Yaml::Mapping(map) = node else {
                return Err(Error::Config {
                    source_name: name.clone(),
                    detail: format!("{} is not a section", keys[..i].join(".")),
                });
            };
            let k = Yaml::String(key.clone());
            if i == keys.len() - 1 {
                map.insert(k, parsed.clone());
                break;
            }
            node = map
                .entry(k)
                .or_insert_with(|| Yaml::Mapping(Default::default()));
        }
    }
    Ok(())
}

impl Settings {
    /// Cross-field rules, with messages that say what to change.
    pub fn validate(&self) -> Result<()> {
        let bad = |detail: String| {
            Err(Error::Config {
                source_name: "settings".into(),
                detail,
            })
        };
        if self.kafka.bootstrap_servers.trim().is_empty() {
            return bad("kafka.bootstrap_servers is empty".into());
        }
        if !self
            .topics
            .prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return bad(format!(
                "topics.prefix {:?} may use only letters, digits, '.', '_' and '-'",
                self.topics.prefix
            ));
        }
        let t = &self.topics;
        for (name, n) in [
            ("topics.job_partitions", t.job_partitions),
            ("topics.results_partitions", t.results_partitions),
            ("topics.control_partitions", t.control_partitions),
            ("topics.heartbeats_partitions", t.heartbeats_partitions),
            ("topics.journal_partitions", t.journal_partitions),
            ("topics.dlq_partitions", t.dlq_partitions),
            ("topics.dispatch_partitions", t.dispatch_partitions),
            ("topics.replication_factor", t.replication_factor),
        ] {
            if n < 1 {
                return bad(format!("{name} must be at least 1, got {n}"));
            }
        }
        let sr = &self.schema_registry;
        if sr.output_format == OutputFormat::Confluent && sr.url.is_none() {
            return bad(
                "schema_registry.output_format confluent needs schema_registry.url: the Confluent wire format names schemas by registry id".into(),
            );
        }
        if let Some(url) = &sr.url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return bad(format!(
                "schema_registry.url {url:?} must start with http:// or https://"
            ));
        }
        if t.results_partitions < t.journal_partitions {
            return bad(format!(
                "topics.results_partitions ({}) must be at least topics.journal_partitions ({}): each shard answers on its own results partitions",
                t.results_partitions, t.journal_partitions
            ));
        }
        let p = &self.processor;
        if p.journal_partition < 0 || p.journal_partition >= t.journal_partitions {
            return bad(format!(
                "processor.journal_partition {} is not a partition of a journal with {} partitions",
                p.journal_partition, t.journal_partitions
            ));
        }
        if !(1..=2).contains(&p.transactional_producers) {
            return bad(format!(
                "processor.transactional_producers must be 1 or 2, not {}",
                p.transactional_producers
            ));
        }
        if p.max_batch == 0 {
            return bad("processor.max_batch must be at least 1".into());
        }
        if p.lease && p.lease_session_timeout_ms < 1_000 {
            return bad("processor.lease_session_timeout_ms must be at least 1000".into());
        }
        if p.commit_interval_ms == 0 || p.tick_interval_ms == 0 {
            return bad(
                "processor.commit_interval_ms and processor.tick_interval_ms must be positive"
                    .into(),
            );
        }
        if p.transaction_timeout_ms < 1_000 || p.transaction_timeout_ms <= p.commit_interval_ms * 10
        {
            return bad(format!(
                "processor.transaction_timeout_ms ({}) must be at least 1000 and well above commit_interval_ms ({})",
                p.transaction_timeout_ms, p.commit_interval_ms
            ));
        }
        if p.input_stall_ms < p.tick_interval_ms.saturating_mul(10) {
            return bad(format!(
                "processor.input_stall_ms ({}) must be at least ten times processor.tick_interval_ms ({})",
                p.input_stall_ms, p.tick_interval_ms
            ));
        }
        let gap = self.scheduler.timing.clock_gap_ms;
        if gap < i64::try_from(p.tick_interval_ms.saturating_mul(2)).unwrap_or(i64::MAX) {
            return bad(format!(
                "scheduler.timing.clock_gap_ms ({gap}) must be at least twice processor.tick_interval_ms ({}): ordinary ticks would look like gaps",
                p.tick_interval_ms
            ));
        }
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return bad(format!(
                "log.format must be text or json, got {:?}",
                self.log.format
            ));
        }
        if self.http.enabled {
            let Ok(addr) = self.http.listen.parse::<std::net::SocketAddr>() else {
                return bad(format!(
                    "http.listen {:?} is not an address like 127.0.0.1:8080",
                    self.http.listen
                ));
            };
            if !addr.ip().is_loopback() && !self.http.authenticates() {
                return bad(format!(
                    "http.listen {} is reachable beyond this machine, but the API has no authentication: set http.tokens_file or http.jwt (docs/security.md), or listen on 127.0.0.1",
                    self.http.listen
                ));
            }
            if let Some(j) = &self.http.jwt
                && (j.issuer.trim().is_empty()
                    || j.audience.trim().is_empty()
                    || j.jwks_file.as_os_str().is_empty())
            {
                return bad("http.jwt needs issuer, audience and jwks_file".into());
            }
            if let Some(t) = &self.http.tls
                && (t.cert_file.as_os_str().is_empty() || t.key_file.as_os_str().is_empty())
            {
                return bad("http.tls needs cert_file and key_file".into());
            }
            if self.http.max_body_bytes == 0 {
                return bad("http.max_body_bytes must be positive".into());
            }
            if self.http.max_connections == 0 || self.http.request_read_timeout_ms == 0 {
                return bad(
                    "http.max_connections and http.request_read_timeout_ms must be positive".into(),
                );
            }
            if self.http.replay_timeout_ms == 0 || self.http.replay_memory_limit_bytes < 256 << 20 {
                return bad(
                    "http.replay_timeout_ms must be positive and http.replay_memory_limit_bytes at least 268435456 (256 MiB)"
                        .into(),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_binds_tenants_in_pools_yaml() {
        let pools = parse_pools(
            "topics:\n  job.default: default\n  job.multi: [a, default]\n  job.acme:\n    pools: [a, default]\n    tenants: [acme]\n\
             pools:\n  default: {}\n  a:\n    workers: [\"a-*\"]\n\
             tenants:\n  \"*\":\n    max_concurrent_jobs: 5\n",
        )
        .unwrap();
        let mut rules = Rules::default();
        pools.apply_to(&mut rules);
        rules.validate().unwrap();
        assert_eq!(rules.topics["job.acme"], ["a", "default"]);
        assert_eq!(rules.topics["job.multi"], ["a", "default"]);
        assert_eq!(
            rules.topic_tenants.keys().collect::<Vec<_>>(),
            ["job.acme"],
            "only the bound topic lists tenants"
        );
        assert_eq!(rules.topic_tenants["job.acme"], ["acme"]);
        assert_eq!(rules.pools["a"].workers, ["a-*"]);
        assert_eq!(rules.max_concurrent_for_tenant("anyone"), Some(5));
    }

    #[test]
    fn a_misspelt_topic_binding_is_refused() {
        let e = parse_pools("topics:\n  job.acme:\n    pools: [default]\n    tenant: [acme]\n")
            .unwrap_err();
        assert!(e.to_string().contains("tenants: [...]"), "{e}");
    }

    #[test]
    fn fewer_results_partitions_than_shards_are_refused_before_any_topic_is_made() {
        let mut s = Settings::default();
        s.topics.journal_partitions = 6;
        s.topics.results_partitions = 4;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("results_partitions (4)"), "{e}");
        s.topics.results_partitions = 6;
        s.validate().unwrap();
    }

    #[test]
    fn transactional_producers_are_one_or_two() {
        let mut s = Settings::default();
        assert_eq!(s.processor.transactional_producers, 2);
        for n in [0, 3] {
            s.processor.transactional_producers = n;
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains("must be 1 or 2"), "{e}");
        }
        s.processor.transactional_producers = 1;
        s.validate().unwrap();
    }
}
