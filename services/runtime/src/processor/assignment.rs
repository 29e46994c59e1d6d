//! The inputs: which partitions the processor reads and from where, and the positions it
//! hands over with every batch.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use tracing::{info, warn};

use super::Processor;
use crate::error::{Error, Result, kafka};
use crate::positions::{self, Positions};
use crate::replay::journal_watermarks;
use crate::settings::Settings;
use crate::shard::Shard;
use crate::status::Status;
use crate::topics::client_config;

impl Processor {
    /// Creates the input consumer and assigns it this shard's input partitions
    /// ([`Shard::inputs`]), from the offsets its group committed.
    pub(super) fn subscribe(&mut self) -> Result<()> {
        let settings = &self.config.settings;
        let group = self.shard.input_group(&settings.processor.group_id);
        let consumer: BaseConsumer<InputContext> = input_consumer_config(settings, &group)
            .set(
                "client.id",
                format!("{}-inputs-{}", settings.kafka.client_id, self.shard.id),
            )
            .create_with_context(InputContext {
                status: self.status.clone(),
                replaced: Mutex::new(None),
            })
            .map_err(kafka("creating the input consumer"))?;
        self.consumer = Some(consumer);
        self.inputs.clear();
        self.positions = self.journal_positions()?;
        self.assign_inputs()?;
        info!(
            shard = self.shard.id,
            shards = self.shard.count,
            group = %group,
            partitions = self.inputs.len(),
            "consuming inputs"
        );
        self.last_record = Instant::now();
        Ok(())
    }

    /// The input positions in the journal's last positions header (positions.rs), read
    /// after the catch-up: empty when no record carries one.
    fn journal_positions(&self) -> Result<Positions> {
        let settings = &self.config.settings;
        let partition = settings.processor.journal_partition;
        let mut client = crate::replay::reader_client(settings, "positions");
        client.set("isolation.level", "read_committed");
        let (low, high) = journal_watermarks(&client, &self.topics.journal, partition)?;
        let found =
            positions::last_in_journal(&client, &self.topics.journal, partition, low, high)?;
        Ok(found.unwrap_or_default())
    }

    /// Assigns the consumer this shard's input partitions as the topics' metadata has them
    /// now. A partition assigned before goes on from the processor's own position (batches
    /// in flight included); one new to this processor from the further of the group's
    /// committed offset and the journal's positions header (positions.rs), or from the
    /// start when neither has it.
    pub(super) fn assign_inputs(&mut self) -> Result<()> {
        self.inputs_checked = Instant::now();
        let consumer = self.consumer()?;
        let md = consumer
            .fetch_metadata(None, Duration::from_secs(10))
            .map_err(kafka("reading the input topics' metadata"))?;
        let counts: BTreeMap<String, i32> = md
            .topics()
            .iter()
            .filter(|t| t.error().is_none())
            .map(|t| {
                (
                    t.name().to_owned(),
                    i32::try_from(t.partitions().len()).unwrap_or(i32::MAX),
                )
            })
            .collect();
        for topic in self.topics.inputs() {
            if !counts.contains_key(&topic) {
                return Err(Error::UnknownTopic { topic });
            }
        }
        let results = counts.get(&self.topics.results).copied().unwrap_or(0);
        if let Some(why) = Shard::check_results_partitions(self.shard.count, results) {
            return Err(Error::Config {
                source_name: "topics.results_partitions".into(),
                detail: why,
            });
        }
        self.results_partitions = results;
        let wanted = self.shard.inputs(&self.topics, &self.config.rules, &counts);
        if wanted == self.inputs {
            return Ok(());
        }
        let mut fresh = TopicPartitionList::new();
        for (topic, partition) in wanted.iter().filter(|tp| !self.inputs.contains(tp)) {
            fresh.add_partition(topic, *partition);
        }
        if fresh.count() > 0 {
            let committed = self
                .consumer()?
                .committed_offsets(fresh, Duration::from_secs(30))
                .map_err(kafka("reading the input group's committed offsets"))?;
            let committed: Positions = committed
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) => Some(((e.topic().to_owned(), e.partition()), o)),
                    _ => None,
                })
                .collect();
            self.positions = positions::furthest(std::mem::take(&mut self.positions), &committed);
        }
        self.positions.retain(|tp, _| wanted.contains(tp));
        let mut tpl = TopicPartitionList::new();
        for (topic, partition) in &wanted {
            let from = match self.positions.get(&(topic.clone(), *partition)) {
                Some(o) => Offset::Offset(*o),
                None => Offset::Stored,
            };
            tpl.add_partition_offset(topic, *partition, from)
                .map_err(kafka("building the input assignment"))?;
        }
        self.consumer()?
            .assign(&tpl)
            .map_err(kafka("assigning the input partitions"))?;
        if !self.inputs.is_empty() {
            info!(
                before = self.inputs.len(),
                now = wanted.len(),
                "input partitions changed; assigned again"
            );
        }
        self.inputs = wanted;
        // The read-through bookkeeping follows the new assignment at the next Tick.
        self.last_assignment = None;
        Ok(())
    }

    /// Stops when another consumer took this instance's group membership.
    pub(super) fn check_membership(&self) -> Result<()> {
        let consumer = self.consumer()?;
        let replaced = consumer
            .context()
            .replaced
            .lock()
            .ok()
            .and_then(|r| r.clone());
        match replaced {
            Some(detail) => Err(Error::Replaced {
                instance_id: self.transactional_id.clone(),
                detail,
            }),
            None => Ok(()),
        }
    }

    pub(super) fn consumer(&self) -> Result<&BaseConsumer<InputContext>> {
        self.consumer.as_ref().ok_or(Error::Invariant(
            "the processor's consumer is used before it subscribed",
        ))
    }
}

/// How often the processor refreshes which evidence partitions it consumes.
pub(super) const ASSIGNMENT_REFRESH: Duration = Duration::from_secs(5);

/// How often the processor looks for partitions added to its input topics.
pub(super) const INPUTS_REFRESH: Duration = Duration::from_secs(30);

/// The input consumer's context: librdkafka statistics become the lag metric; a fatal
/// consumer error (this instance's group membership taken by another with the same
/// `group.instance.id`) stops the processor.
pub(super) struct InputContext {
    status: Arc<Status>,
    replaced: Mutex<Option<String>>,
}

impl ClientContext for InputContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        for (topic, t) in &statistics.topics {
            let lag: i64 = t
                .partitions
                .values()
                .filter(|p| p.partition >= 0)
                // What the processor has not read yet: the end it may read up to (the last
                // stable offset, read_committed) past its position. librdkafka's own
                // `consumer_lag` counts from the group's committed offset, which the
                // processor moves only now and then (positions.rs).
                .filter(|p| p.app_offset >= 0 && p.ls_offset >= 0)
                .map(|p| (p.ls_offset - p.app_offset).max(0))
                .sum();
            self.status.metrics.set_consumer_lag(topic, lag);
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let fenced = matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::FencedInstanceId | RDKafkaErrorCode::Fatal)
        ) || matches!(error, KafkaError::MessageConsumptionFatal(_));
        if fenced {
            if let Ok(mut r) = self.replaced.lock() {
                r.get_or_insert_with(|| format!("{error}: {reason}"));
            }
        } else {
            warn!(error = %error, reason, "input consumer error");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for InputContext {}

/// How long the broker may hold an input fetch that finds nothing new, unless
/// `kafka.properties` sets `fetch.wait.max.ms`. Kafka's own default. It costs no latency: with
/// `fetch.min.bytes` 1 the broker answers as soon as a record is there, a read_committed fetch
/// as soon as a commit's markers move the last stable offset (a parked fetch was
/// measured answered 0.5 ms after the commit). It bounds only how often an idle shard asks:
/// at 10 ms, 100 empty fetches a second each.
const INPUT_FETCH_WAIT_MS: &str = "500";

/// The input consumer's settings: offsets only (the partitions are assigned by hand, every
/// shard reading the heartbeats and control topics whole, and the shard's transactional id,
/// not the group, fences an older instance of it), read_committed.
pub(super) fn input_consumer_config(settings: &Settings, group: &str) -> ClientConfig {
    let mut cfg = client_config(settings);
    if cfg.get("fetch.wait.max.ms").is_none() {
        cfg.set("fetch.wait.max.ms", INPUT_FETCH_WAIT_MS);
    }
    cfg.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("fetch.queue.backoff.ms", "1")
        .set("statistics.interval.ms", "5000");
    cfg
}
