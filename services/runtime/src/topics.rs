//! Topic names and creating the topics ksched needs.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;
use tracing::{info, warn};

use crate::error::{Error, Result, kafka};
use crate::settings::Settings;

/// The names of ksched's topics for a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    pub prefix: String,
    pub results: String,
    pub control: String,
    pub heartbeats: String,
    pub journal: String,
    pub dlq: String,
    /// Job topics from pools.yaml.
    pub jobs: Vec<String>,
    /// Pools from pools.yaml.
    pub pools: Vec<String>,
}

/// What an input topic carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    Jobs,
    Results,
    Control,
    Heartbeats,
}

impl InputKind {
    /// The topic's role, as metrics name it.
    pub fn as_str(self) -> &'static str {
        match self {
            InputKind::Jobs => "jobs",
            InputKind::Results => "results",
            InputKind::Control => "control",
            InputKind::Heartbeats => "heartbeats",
        }
    }
}

impl Topics {
    pub fn new(prefix: &str, jobs: Vec<String>, pools: Vec<String>) -> Topics {
        Topics {
            prefix: prefix.to_owned(),
            results: format!("{prefix}results"),
            control: format!("{prefix}control"),
            heartbeats: format!("{prefix}heartbeats"),
            journal: format!("{prefix}journal"),
            dlq: format!("{prefix}dlq"),
            jobs,
            pools,
        }
    }

    pub fn dispatch(&self, pool: &str) -> String {
        format!("{}dispatch.{pool}", self.prefix)
    }

    /// Every topic the processor consumes.
    pub fn inputs(&self) -> Vec<String> {
        let mut v = self.jobs.clone();
        v.extend([
            self.results.clone(),
            self.control.clone(),
            self.heartbeats.clone(),
        ]);
        v
    }

    pub fn kind(&self, topic: &str) -> InputKind {
        if topic == self.results {
            InputKind::Results
        } else if topic == self.control {
            InputKind::Control
        } else if topic == self.heartbeats {
            InputKind::Heartbeats
        } else {
            InputKind::Jobs
        }
    }
}

/// Creates every missing topic: inputs with broker-assigned timestamps (LogAppendTime, so
/// decisions use one clock, not each producer's), the journal with unlimited retention.
pub async fn ensure_topics(settings: &Settings, topics: &Topics) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = client_config(settings)
        .create()
        .map_err(kafka("creating the admin client"))?;
    let t = &settings.topics;
    let log_append: BTreeMap<&str, &str> = [("message.timestamp.type", "LogAppendTime")].into();
    // The processor's producer batches records up to its message.max.bytes; the topics it
    // writes must take a batch that large (a journal entry fits in one, checked at start).
    let output_bytes = client_message_max_bytes(settings)
        .max(BROKER_MESSAGE_MAX_BYTES)
        .to_string();
    let mut forever: BTreeMap<&str, &str> = [
        ("retention.ms", "-1"),
        ("retention.bytes", "-1"),
        ("cleanup.policy", "delete"),
        ("max.message.bytes", output_bytes.as_str()),
    ]
    .into();
    if t.replication_factor >= 3 {
        forever.insert("min.insync.replicas", "2");
    }
    let output: BTreeMap<&str, &str> = [("max.message.bytes", output_bytes.as_str())].into();
    let mut wanted: Vec<(String, i32, &BTreeMap<&str, &str>)> = Vec::new();
    for job_topic in &topics.jobs {
        wanted.push((job_topic.clone(), t.job_partitions, &log_append));
    }
    wanted.push((topics.results.clone(), t.results_partitions, &log_append));
    wanted.push((topics.control.clone(), t.control_partitions, &log_append));
    wanted.push((
        topics.heartbeats.clone(),
        t.heartbeats_partitions,
        &log_append,
    ));
    wanted.push((topics.journal.clone(), t.journal_partitions, &forever));
    wanted.push((topics.dlq.clone(), t.dlq_partitions, &output));
    for pool in &topics.pools {
        wanted.push((topics.dispatch(pool), t.dispatch_partitions, &output));
    }
    let new: Vec<NewTopic<'_>> = wanted
        .iter()
        .map(|(name, partitions, configs)| {
            let mut nt = NewTopic::new(
                name,
                *partitions,
                TopicReplication::Fixed(t.replication_factor),
            );
            for (k, v) in configs.iter() {
                nt = nt.set(k, v);
            }
            nt
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .create_topics(&new, &opts)
        .await
        .map_err(kafka("creating topics"))?;
    for r in results {
        match r {
            Ok(name) => info!(topic = %name, "topic created"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(Error::Kafka {
                    context: format!("creating topic {name}"),
                    source: rdkafka::error::KafkaError::AdminOp(code),
                });
            }
        }
    }
    Ok(())
}

/// Errors librdkafka reports beside a request, kept to explain why the request failed.
#[derive(Default)]
struct Capture {
    errors: std::sync::Mutex<Vec<(RDKafkaErrorCode, String)>>,
}

impl rdkafka::ClientContext for Capture {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        if let Some(code) = error.rdkafka_error_code()
            && let Ok(mut e) = self.errors.lock()
        {
            e.push((code, reason.to_owned()));
        }
    }
}

impl rdkafka::consumer::ConsumerContext for Capture {}

/// Connects once and asks for the cluster's metadata: a failed authentication or TLS
/// handshake (wrong password or mechanism, a broker certificate from a CA the client does not
/// trust) is an error that says so, where the client itself would only retry until a
/// timeout. Brokers that do not answer are not an error here: the caller's own requests wait
/// for them.
pub fn check_credentials(settings: &Settings) -> Result<()> {
    let consumer: BaseConsumer<Capture> = client_config(settings)
        .create_with_context(Capture::default())
        .map_err(kafka("creating a Kafka client"))?;
    if consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .is_ok()
    {
        return Ok(());
    }
    // Client errors are events on the client's queue: serve them.
    for _ in 0..5 {
        let _ = consumer.poll(Duration::from_millis(20));
    }
    let errors = consumer
        .context()
        .errors
        .lock()
        .map(|e| e.clone())
        .unwrap_or_default();
    match errors
        .into_iter()
        .find_map(|(code, reason)| refusal_hint(code, &reason).map(|hint| (reason, hint)))
    {
        Some((detail, hint)) => Err(Error::Refused {
            bootstrap: settings.kafka.bootstrap_servers.clone(),
            detail,
            hint,
        }),
        None => Ok(()),
    }
}

/// What to check when the brokers refused the client's credentials or the client their
/// certificate; None for other errors.
fn refusal_hint(code: RDKafkaErrorCode, reason: &str) -> Option<&'static str> {
    const SASL: &str = "Check sasl.mechanism, sasl.username and sasl.password (-X, --command-config or kafka.properties).";
    const TLS: &str =
        "Check ssl.ca.location: it must name the CA that signed the brokers' certificates.";
    if code == RDKafkaErrorCode::Authentication || reason.contains("SASL authentication error") {
        Some(SASL)
    } else if code == RDKafkaErrorCode::SSL || reason.contains("SSL handshake failed") {
        Some(TLS)
    } else {
        None
    }
}

/// A client config with the bootstrap servers and extra properties.
pub fn client_config(settings: &Settings) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &settings.kafka.bootstrap_servers);
    for (k, v) in &settings.kafka.properties {
        cfg.set(k, v);
    }
    cfg
}

/// `retry.backoff.ms` of a transactional producer, unless the client properties set it.
///
/// A transaction that begins right after the previous one committed sends AddOffsetsToTxn
/// while the coordinator is still writing the previous transaction's markers; the coordinator
/// answers CONCURRENT_TRANSACTIONS and librdkafka asks again after `retry.backoff.ms` (100 ms
/// by default, doubling up to `retry.backoff.max.ms`). Adaptive batching begins the next
/// transaction within a few milliseconds at low load, so that wait was most of a p99 submit
/// -> dispatch latency of 100-140 ms (docs/performance.md, "What limits latency"). librdkafka itself asks again after
/// 20 ms for AddPartitionsToTxn on the same answer.
pub const TRANSACTIONAL_RETRY_BACKOFF_MS: u32 = 10;

/// Sets [`TRANSACTIONAL_RETRY_BACKOFF_MS`] on a transactional producer's configuration,
/// unless it (the client properties) already sets `retry.backoff.ms`.
pub fn transactional_retry_backoff(cfg: &mut ClientConfig) -> &mut ClientConfig {
    if cfg.get("retry.backoff.ms").is_none() {
        cfg.set(
            "retry.backoff.ms",
            TRANSACTIONAL_RETRY_BACKOFF_MS.to_string(),
        );
    }
    cfg
}

/// How long [`serve_deliveries`] naps while records are in flight.
pub const DELIVERY_NAP: Duration = Duration::from_micros(200);

/// Serves the delivery reports at hand, then naps [`DELIVERY_NAP`] if records are still in
/// flight: call it in a loop to wait for acknowledgements.
///
/// Not `BaseProducer::poll(1 ms)`: rust-rdkafka turns the time left into whole milliseconds
/// for librdkafka, so the wait's last (and a 1 ms poll's only) millisecond is a busy loop,
/// and it does not return before its timeout even when every report has come. Waiting for a
/// transaction's acknowledgements in 1 ms polls kept a core busy for the whole wait (about
/// 40 % of the processor's CPU at 4 shards).
pub fn serve_deliveries<C: rdkafka::producer::ProducerContext>(
    producer: &rdkafka::producer::BaseProducer<C>,
) {
    use rdkafka::producer::Producer;
    producer.poll(Duration::ZERO);
    if producer.in_flight_count() > 0 {
        std::thread::sleep(DELIVERY_NAP);
    }
}

/// Room a journal entry needs besides its input: the events of at most
/// `limits.max_work_per_entry` units of work, placement candidates included.
pub const JOURNAL_ENTRY_OVERHEAD: i64 = 256 * 1024;
/// librdkafka's `message.max.bytes` when `kafka.properties` does not set it.
const CLIENT_MESSAGE_MAX_BYTES: i64 = 1_000_000;
/// The broker's default `max.message.bytes`.
const BROKER_MESSAGE_MAX_BYTES: i64 = 1_048_588;

/// The largest batch (and so record) the processor's producer sends.
pub fn client_message_max_bytes(settings: &Settings) -> i64 {
    settings
        .kafka
        .properties
        .get("message.max.bytes")
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(CLIENT_MESSAGE_MAX_BYTES)
}

/// Partitions of `topic`, from the broker's metadata. A topic created a moment ago may take a
/// few seconds to reach every broker's metadata; it is asked for again meanwhile.
pub fn partition_count(settings: &Settings, topic: &str) -> Result<i32> {
    let consumer: BaseConsumer = client_config(settings)
        .set(
            "client.id",
            format!("{}-metadata", settings.kafka.client_id),
        )
        .create()
        .map_err(kafka("creating a metadata client"))?;
    let until = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let md = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(30))
            .map_err(kafka(format!("reading the metadata of {topic}")))?;
        let t = md
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .ok_or_else(|| Error::UnknownTopic {
                topic: topic.to_owned(),
            })?;
        match t.error() {
            None if !t.partitions().is_empty() => {
                return Ok(i32::try_from(t.partitions().len()).unwrap_or(i32::MAX));
            }
            e if std::time::Instant::now() > until => {
                return Err(Error::Config {
                    source_name: format!("topic {topic}"),
                    detail: format!(
                        "{}: create it, or let ksched create it (topics.create)",
                        e.map_or("no partitions".to_owned(), |e| RDKafkaErrorCode::from(e)
                            .to_string())
                    ),
                });
            }
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// Pool -> partitions of its dispatch topic (journaled with the rules, so a heartbeat that
/// claims a partition the topic lacks is refused).
pub fn dispatch_partitions(settings: &Settings, topics: &Topics) -> Result<BTreeMap<String, i32>> {
    topics
        .pools
        .iter()
        .map(|pool| {
            Ok((
                pool.clone(),
                partition_count(settings, &topics.dispatch(pool))?,
            ))
        })
        .collect()
}

/// Checks the configuration of existing topics against what ksched relies on; returns the
/// warnings (already logged) and refuses what would break its guarantees, with the command
/// that fixes it (docs/operations.md, "Topics ksched checks").
pub async fn verify_topics(settings: &Settings, topics: &Topics) -> Result<Vec<String>> {
    let max_record_bytes = settings.scheduler.limits.max_record_bytes;
    let admin: AdminClient<DefaultClientContext> = client_config(settings)
        .create()
        .map_err(kafka("creating the admin client"))?;
    let mut names: Vec<String> = topics.inputs();
    names.push(topics.journal.clone());
    names.push(topics.dlq.clone());
    names.extend(topics.pools.iter().map(|p| topics.dispatch(p)));
    let specs: Vec<ResourceSpecifier<'_>> =
        names.iter().map(|n| ResourceSpecifier::Topic(n)).collect();
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(30)));
    let results = match admin.describe_configs(specs.iter(), &opts).await {
        Ok(r) => r,
        Err(e) => {
            let w = format!("could not read topic configurations ({e}); they are not checked");
            warn!("{w}");
            return Ok(vec![w]);
        }
    };
    let fix = |topic: &str, setting: &str| {
        format!(
            "kafka-configs.sh --bootstrap-server {} --alter --entity-type topics --entity-name {topic} --add-config {setting}",
            settings.kafka.bootstrap_servers
        )
    };
    let client_max = client_message_max_bytes(settings);
    let journal_needs = max_record_bytes + JOURNAL_ENTRY_OVERHEAD;
    let inputs = topics.inputs();
    let mut refusals = Vec::new();
    let mut warnings = Vec::new();
    if journal_needs > client_max {
        refusals.push(format!(
            "limits.max_record_bytes {max_record_bytes} plus {JOURNAL_ENTRY_OVERHEAD} bytes for a journal entry's events exceeds the client's message.max.bytes {client_max}: lower limits.max_record_bytes or raise kafka.properties.message.max.bytes"
        ));
    }
    for (name, result) in names.iter().zip(results) {
        let resource = match result {
            Ok(r) => r,
            Err(RDKafkaErrorCode::UnknownTopicOrPartition) => {
                refusals.push(format!(
                    "topic {name} does not exist: create it, or set topics.create: true"
                ));
                continue;
            }
            Err(code) => {
                warnings.push(format!(
                    "could not read the configuration of {name} ({code}); it is not checked"
                ));
                continue;
            }
        };
        let entries = resource.entry_map();
        let get = |k: &str| entries.get(k).and_then(|e| e.value.clone());
        if inputs.contains(name) && get("message.timestamp.type").as_deref() == Some("CreateTime") {
            if topics.kind(name) == InputKind::Jobs {
                warnings.push(format!(
                    "job topic {name} keeps producers' timestamps (CreateTime): ksched ignores them and stamps its jobs with broker time from its own topics. To have broker time on jobs too: {}",
                    fix(name, "message.timestamp.type=LogAppendTime")
                ));
            } else {
                refusals.push(format!(
                    "{name} keeps producers' timestamps (CreateTime): any producer could move the scheduler's clock. Fix: {}",
                    fix(name, "message.timestamp.type=LogAppendTime")
                ));
            }
        }
        let max_bytes = get("max.message.bytes").and_then(|v| v.parse::<i64>().ok());
        let written = *name == topics.journal
            || *name == topics.dlq
            || topics.pools.iter().any(|p| topics.dispatch(p) == *name);
        if written && let Some(has) = max_bytes.filter(|has| *has < client_max) {
            refusals.push(format!(
                "{name} accepts record batches of at most {has} bytes (max.message.bytes), but ksched's producer sends batches of up to {client_max} (message.max.bytes; a journal entry may need {journal_needs}). Fix: {}",
                fix(name, &format!("max.message.bytes={client_max}"))
            ));
        }
        if *name == topics.journal {
            let policy = get("cleanup.policy").unwrap_or_default();
            if policy.contains("compact") {
                refusals.push(format!(
                    "the journal {name} is compacted (cleanup.policy={policy}): compaction drops entries, and the journal is the scheduler's history. Fix: {}",
                    fix(name, "cleanup.policy=delete")
                ));
            }
            if let Some(r) = get("retention.ms").filter(|r| r != "-1") {
                warnings.push(format!(
                    "the journal {name} deletes entries after retention.ms={r}: the projection can then no longer be rebuilt from it, nor the history audited. Fix: {}",
                    fix(name, "retention.ms=-1")
                ));
            }
            let min_isr = get("min.insync.replicas").and_then(|v| v.parse::<i32>().ok());
            if settings.topics.replication_factor >= 3
                && let Some(m) = min_isr.filter(|m| *m < 2)
            {
                warnings.push(format!(
                    "the journal {name} has min.insync.replicas={m} with replication factor {}: losing one broker could lose committed decisions. Fix: {}",
                    settings.topics.replication_factor,
                    fix(name, "min.insync.replicas=2")
                ));
            }
        }
    }
    for w in &warnings {
        warn!("{w}");
    }
    if refusals.is_empty() {
        Ok(warnings)
    } else {
        Err(Error::Config {
            source_name: "topics".into(),
            detail: refusals.join("\n  "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waiting for acknowledgements costs little CPU (it was a busy loop: 1 ms polls of
    /// rust-rdkafka spin for their whole millisecond).
    #[test]
    fn waiting_for_deliveries_naps_instead_of_spinning() {
        use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .create()
            .unwrap();
        producer
            .send(BaseRecord::to("t").key("k").payload("v"))
            .map_err(|(e, _)| e)
            .unwrap();
        // librdkafka counts its own requests in flight too: at least the record.
        assert!(
            producer.in_flight_count() >= 1,
            "no broker: it stays in flight"
        );
        let cpu0 = crate::metrics::thread_cpu_seconds().unwrap();
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(300) {
            serve_deliveries(&producer);
        }
        let cpu = crate::metrics::thread_cpu_seconds().unwrap() - cpu0;
        assert!(cpu < 0.1, "{cpu:.3} s of CPU to wait 0.3 s for a delivery");
    }

    #[test]
    fn a_transactional_producer_retries_soon_unless_the_properties_say_otherwise() {
        let mut cfg = ClientConfig::new();
        transactional_retry_backoff(&mut cfg);
        assert_eq!(cfg.get("retry.backoff.ms"), Some("10"));
        let mut cfg = ClientConfig::new();
        cfg.set("retry.backoff.ms", "250");
        transactional_retry_backoff(&mut cfg);
        assert_eq!(cfg.get("retry.backoff.ms"), Some("250"));
    }

    #[test]
    fn refused_credentials_and_untrusted_certificates_are_told_apart_from_outages() {
        let sasl = "sasl_ssl://127.0.0.1:9093/bootstrap: SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512";
        assert!(
            refusal_hint(RDKafkaErrorCode::BrokerTransportFailure, sasl)
                .unwrap()
                .contains("sasl.password")
        );
        let tls = "ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed";
        assert!(
            refusal_hint(RDKafkaErrorCode::BrokerTransportFailure, tls)
                .unwrap()
                .contains("ssl.ca.location")
        );
        assert!(refusal_hint(RDKafkaErrorCode::Authentication, "").is_some());
        // A broker that is down is waited for, not refused.
        assert!(
            refusal_hint(
                RDKafkaErrorCode::BrokerTransportFailure,
                "127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection refused"
            )
            .is_none()
        );
        assert!(refusal_hint(RDKafkaErrorCode::AllBrokersDown, "1/1 brokers are down").is_none());
    }
}
