//! Test support for everything that touches Kafka.
//!
//! [`bootstrap_servers`] finds a real broker: `KAFKA_BOOTSTRAP_SERVERS` when set (CI and local
//! runs start one with `deploy/kafka.sh start`), otherwise an Apache Kafka container through
//! testcontainers when a Docker engine answers, otherwise an error that says how to start one.
//! Tests never share topics or groups: [`unique`] names them.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::FromClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use thiserror::Error;

/// Why no broker could be found or a topic could not be made.
#[derive(Debug, Error)]
pub enum Error {
    #[error(
        "no Kafka broker for the tests: KAFKA_BOOTSTRAP_SERVERS is not set and {docker}.\n\
         Start the local broker with `deploy/kafka.sh start` and run\n\
         `KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 cargo test`, or run `bash .ci/run`."
    )]
    NoBroker { docker: String },

    #[error("creating topic {topic}: {detail}")]
    CreateTopic { topic: String, detail: String },

    #[error("reading {topic} to its end took longer than 60 s")]
    ReadTimeout { topic: String },

    #[error("kafka client: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Bootstrap servers of a real Kafka broker for this test process.
pub fn bootstrap_servers() -> Result<String> {
    if let Ok(servers) = std::env::var("KAFKA_BOOTSTRAP_SERVERS")
        && !servers.trim().is_empty()
    {
        return Ok(servers);
    }
    static CONTAINER: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    CONTAINER
        .get_or_init(docker::start_kafka)
        .clone()
        .map_err(|docker| Error::NoBroker { docker })
}

mod docker {
    use std::sync::OnceLock;

    use testcontainers_modules::kafka::apache::{KAFKA_PORT, Kafka};
    use testcontainers_modules::testcontainers::Container;
    use testcontainers_modules::testcontainers::runners::SyncRunner;

    /// Kept alive for the whole test process; testcontainers' reaper removes it afterwards.
    static RUNNING: OnceLock<Container<Kafka>> = OnceLock::new();

    fn engine_present() -> bool {
        std::env::var_os("DOCKER_HOST").is_some()
            || std::path::Path::new("/var/run/docker.sock").exists()
    }

    pub(super) fn start_kafka() -> Result<String, String> {
        if !engine_present() {
            return Err(
                "no Docker engine was found (no DOCKER_HOST, no /var/run/docker.sock)".into(),
            );
        }
        let container = Kafka::default()
            .with_jvm_image()
            .start()
            .map_err(|e| format!("starting an apache/kafka container failed ({e})"))?;
        let port = container
            .get_host_port_ipv4(KAFKA_PORT)
            .map_err(|e| format!("the apache/kafka container has no mapped port ({e})"))?;
        let _ = RUNNING.set(container);
        Ok(format!("127.0.0.1:{port}"))
    }
}

/// The input policy the end-to-end tests run under: allows everything, except that the job
/// label `approval=required` requires approval and `deny=true` denies.
pub const TEST_POLICY: &str = r#"package ksched.input

default allow := true

require_approval contains "a human must approve" if input.job.labels.approval == "required"

deny contains "denied by the test policy" if input.job.labels.deny == "true"
"#;

/// A name no other test (or earlier run) uses: `<prefix>-<pid>-<counter>-<random>`.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let rand = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}-{n}-{}", std::process::id(), &rand[..8])
}

/// A client config pointed at the test broker.
pub fn client_config(bootstrap: &str) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", bootstrap);
    cfg
}

/// Creates topics with the given partition counts (replication factor 1); existing topics are
/// left as they are.
pub async fn create_topics(bootstrap: &str, topics: &[(&str, i32)]) -> Result<()> {
    let admin = AdminClient::<DefaultClientContext>::from_config(&client_config(bootstrap))?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(name, partitions)| NewTopic::new(name, *partitions, TopicReplication::Fixed(1)))
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.create_topics(&new, &opts).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => {
                return Err(Error::CreateTopic {
                    topic,
                    detail: code.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// Creates one topic.
pub async fn create_topic(bootstrap: &str, name: &str, partitions: i32) -> Result<()> {
    create_topics(bootstrap, &[(name, partitions)]).await
}

/// A record read by [`read_to_end`].
#[derive(Debug, Clone)]
pub struct ReadRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    /// The record's headers, in order (a header without a value has an empty one).
    pub headers: Vec<(String, Vec<u8>)>,
}

/// Reads every committed record of `topic` up to the end it had when called (partitions in
/// order). Does not rely on partition-EOF events, which read_committed consumers may not see
/// while producers keep committing.
pub fn read_to_end(bootstrap: &str, topic: &str) -> Result<Vec<ReadRecord>> {
    let consumer: BaseConsumer = client_config(bootstrap)
        .set("group.id", unique("reader"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    let timeout = Duration::from_secs(10);
    let meta = consumer.fetch_metadata(Some(topic), timeout)?;
    let partitions: Vec<i32> = meta
        .topics()
        .first()
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    let mut ends = std::collections::BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        let (low, high) = consumer.fetch_watermarks(topic, p, timeout)?;
        if high > low {
            ends.insert(p, high);
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        }
    }
    let mut out = Vec::new();
    if ends.is_empty() {
        return Ok(out);
    }
    consumer.assign(&tpl)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                if ends
                    .get(&m.partition())
                    .is_some_and(|end| m.offset() < *end)
                {
                    out.push(ReadRecord {
                        partition: m.partition(),
                        offset: m.offset(),
                        key: m.key().map(<[u8]>::to_vec),
                        payload: m.payload().map(<[u8]>::to_vec),
                        headers: m
                            .headers()
                            .map(|h| {
                                h.iter()
                                    .map(|h| {
                                        (h.key.to_owned(), h.value.unwrap_or_default().to_vec())
                                    })
                                    .collect()
                            })
                            .unwrap_or_default(),
                    });
                }
            }
            Some(Err(e)) => return Err(e.into()),
            None => {
                // Done when every partition's position is at its end (the last offset may be
                // a transaction marker, which is never delivered).
                let pos = consumer.position()?;
                let done = ends.iter().all(|(p, end)| {
                    matches!(
                        pos.find_partition(topic, *p).map(|e| e.offset()),
                        Some(Offset::Offset(o)) if o >= end - 1
                    )
                });
                if done {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    return Err(Error::ReadTimeout {
                        topic: topic.to_owned(),
                    });
                }
            }
        }
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    Ok(out)
}
