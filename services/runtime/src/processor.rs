//! The processor loop (DESIGN "The processor"): batches of input records, each batch one Kafka
//! transaction holding its journal entries, dispatches, dead letters and input offsets; after
//! the commit, one RocksDB WriteBatch with the batch's changes and the journal watermark.
//!
//! Runs on a plain thread: the Kafka transaction calls block.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ksched_codec::{AnyRecord, Record, decode_any, encode};
use ksched_core::decide::{Ctx, process};
use ksched_core::events::{Cause, Input, JournalEntry, MalformedRecord};
use ksched_core::outputs::Output;
use ksched_core::state::State;
use ksched_policy::RegoEngine;
use ksched_store::Store;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, Timestamp};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tracing::{debug, info, warn};

use crate::error::{Error, Result, kafka};
use crate::replay::{Flow, Replayer, journal_watermarks, read_journal};
use crate::settings::Config;
use crate::status::Status;
use crate::topics::{InputKind, Topics, client_config};

/// Collects delivery reports: the last journal offset written, and failures.
struct Delivery {
    journal: String,
    partition: i32,
    last_journal_offset: AtomicI64,
    delivered: AtomicU64,
    failures: Mutex<Vec<String>>,
}

impl ClientContext for Delivery {}

impl ProducerContext for Delivery {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(m) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
                if m.partition() == self.partition && m.topic() == self.journal {
                    self.last_journal_offset
                        .fetch_max(m.offset(), Ordering::Relaxed);
                }
            }
            Err((e, m)) => {
                if let Ok(mut f) = self.failures.lock() {
                    f.push(format!("{}/{}: {e}", m.topic(), m.partition()));
                }
            }
        }
    }
}

/// The input consumer's context: turns librdkafka statistics into the lag metric.
struct InputContext {
    status: Arc<Status>,
}

impl ClientContext for InputContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        for (topic, t) in &statistics.topics {
            let lag: i64 = t
                .partitions
                .values()
                .filter(|p| p.partition >= 0)
                .map(|p| p.consumer_lag.max(0))
                .sum();
            self.status
                .metrics
                .consumer_lag
                .with_label_values(&[topic.as_str()])
                .set(lag);
        }
    }
}

impl rdkafka::consumer::ConsumerContext for InputContext {}

/// An input record, copied out of the consumer.
struct InputRecord {
    topic: String,
    partition: i32,
    offset: i64,
    timestamp: Option<i64>,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
}

/// The processor for one journal partition.
pub struct Processor {
    config: Config,
    topics: Topics,
    store: Store,
    state: State,
    policy: Arc<RegoEngine>,
    producer: BaseProducer<Delivery>,
    consumer: Option<BaseConsumer<InputContext>>,
    transactional_id: String,
    status: Arc<Status>,
    sent: u64,
    last_size_check: Instant,
}

impl std::fmt::Debug for Processor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processor")
            .field("transactional_id", &self.transactional_id)
            .finish_non_exhaustive()
    }
}

fn is_fenced(e: &KafkaError) -> bool {
    match e {
        KafkaError::Transaction(r) => {
            r.is_fatal()
                || matches!(
                    r.code(),
                    RDKafkaErrorCode::ProducerFenced
                        | RDKafkaErrorCode::InvalidProducerEpoch
                        | RDKafkaErrorCode::Fenced
                )
        }
        other => matches!(
            other.rdkafka_error_code(),
            Some(RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::Fenced)
        ),
    }
}

impl Processor {
    /// Recovers and gets ready: loads the working set from RocksDB, fences any older
    /// instance of this journal partition, applies the journal from the watermark on, puts
    /// the configured rules and policy in force, and subscribes to the inputs.
    pub fn start(
        config: Config,
        topics: Topics,
        store: Store,
        policy: Arc<RegoEngine>,
        status: Arc<Status>,
    ) -> Result<Processor> {
        let settings = &config.settings;
        let partition = settings.processor.journal_partition;
        let transactional_id = format!("{}-journal-{partition}", settings.processor.group_id);
        let delivery = Delivery {
            journal: topics.journal.clone(),
            partition,
            last_journal_offset: AtomicI64::new(-1),
            delivered: AtomicU64::new(0),
            failures: Mutex::new(Vec::new()),
        };
        let producer: BaseProducer<Delivery> = client_config(settings)
            .set(
                "client.id",
                format!("{}-processor", settings.kafka.client_id),
            )
            .set("transactional.id", &transactional_id)
            .set("enable.idempotence", "true")
            .set(
                "transaction.timeout.ms",
                settings.processor.transaction_timeout_ms.to_string(),
            )
            .set("linger.ms", "2")
            .set("queue.buffering.max.messages", "1000000")
            .set("compression.type", "lz4")
            .create_with_context(delivery)
            .map_err(kafka("creating the transactional producer"))?;
        let timeout = Duration::from_millis(settings.processor.transaction_timeout_ms);
        producer.init_transactions(timeout).map_err(|e| {
            if is_fenced(&e) {
                Error::Fenced {
                    partition,
                    transactional_id: transactional_id.clone(),
                }
            } else {
                kafka(format!("init_transactions for {transactional_id}"))(e)
            }
        })?;
        let state = store.load_state()?;
        let mut p = Processor {
            config,
            topics,
            store,
            state,
            policy,
            producer,
            consumer: None,
            transactional_id,
            status,
            sent: 0,
            last_size_check: Instant::now(),
        };
        p.catch_up()?;
        p.reconfigure()?;
        p.subscribe()?;
        p.status.metrics.gauges(&p.state);
        p.status.set_caught_up(true);
        Ok(p)
    }

    /// Applies journal entries written after the store's watermark (a crash between a commit
    /// and its RocksDB write, or a store restored from an older copy).
    fn catch_up(&mut self) -> Result<()> {
        let span = tracing::info_span!("recovery");
        let _enter = span.enter();
        let settings = &self.config.settings;
        let partition = settings.processor.journal_partition;
        let from = self.store.watermark()?.map_or(0, |w| w + 1);
        let mut client = client_config(settings);
        client.set(
            "client.id",
            format!("{}-recovery", settings.kafka.client_id),
        );
        let (low, high) = journal_watermarks(&client, &self.topics.journal, partition)?;
        if from > high {
            return Err(Error::Other(format!(
                "the store in {} reflects journal offset {} but {}/{partition} ends at {high}: it belongs to another journal; move it away to rebuild from this one",
                self.store.path().display(),
                from - 1,
                self.topics.journal
            )));
        }
        if from < low {
            return Err(Error::Other(format!(
                "the journal {}/{partition} starts at {low} but the store needs entries from {from}: the journal lost records (retention?)",
                self.topics.journal
            )));
        }
        if from >= high {
            info!(
                watermark = from - 1,
                "projection is up to date with the journal"
            );
            return Ok(());
        }
        let started = Instant::now();
        let mut replayer =
            Replayer::with_state(self.store.clone(), std::mem::take(&mut self.state));
        let read = read_journal(&client, &self.topics.journal, partition, from, |rec| {
            replayer.apply(rec.offset, &rec.entry)?;
            Ok(Flow::Continue)
        });
        let persisted = read.and_then(|_| replayer.persist());
        let applied = replayer.applied;
        self.state = replayer.state;
        persisted?;
        info!(
            applied,
            from,
            to = high,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "caught up with the journal"
        );
        Ok(())
    }

    /// Journals the configured rules and policy if they differ from those in force.
    fn reconfigure(&mut self) -> Result<()> {
        let wanted = self.config.reconfigure();
        let current = self.state.config.as_ref().map(|c| &c.raw);
        if current == Some(&wanted) {
            return Ok(());
        }
        info!(
            policy_snapshot = %wanted.policy_snapshot,
            rules_id = %wanted.rules_id,
            "putting new rules and policy in force"
        );
        let cause = Cause {
            topic: "config".into(),
            partition: -1,
            offset: i64::try_from(self.state.entries).unwrap_or(i64::MAX),
        };
        let now = wall_clock_ms().max(self.state.clock);
        self.transaction(|p| {
            p.process_one(cause, now, Input::Reconfigure(wanted))?;
            Ok(None)
        })
    }

    fn subscribe(&mut self) -> Result<()> {
        let settings = &self.config.settings;
        let consumer: BaseConsumer<InputContext> = client_config(settings)
            .set("client.id", format!("{}-inputs", settings.kafka.client_id))
            .set("group.id", &settings.processor.group_id)
            // Static membership: a restarted processor (same journal partition) takes its
            // partitions back at once instead of waiting for the dead member's session to
            // expire, and fences a zombie that still holds them.
            .set("group.instance.id", &self.transactional_id)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "10")
            .set("fetch.queue.backoff.ms", "1")
            .set("statistics.interval.ms", "5000")
            .create_with_context(InputContext {
                status: self.status.clone(),
            })
            .map_err(kafka("creating the input consumer"))?;
        let inputs = self.topics.inputs();
        let names: Vec<&str> = inputs.iter().map(String::as_str).collect();
        consumer
            .subscribe(&names)
            .map_err(kafka("subscribing to the inputs"))?;
        info!(topics = ?names, group = %settings.processor.group_id, "consuming inputs");
        self.consumer = Some(consumer);
        Ok(())
    }

    /// Processes batches until `shutdown` is set, then commits what it has and returns.
    pub fn run(&mut self, shutdown: &AtomicBool) -> Result<()> {
        while !shutdown.load(Ordering::Relaxed) {
            let batch = self.collect()?;
            if batch.is_empty() {
                continue;
            }
            self.process_batch(batch)?;
        }
        self.store.flush()?;
        info!("processor stopped");
        Ok(())
    }

    fn collect(&mut self) -> Result<Vec<InputRecord>> {
        let settings = &self.config.settings.processor;
        let consumer = self
            .consumer
            .as_ref()
            .ok_or_else(|| Error::Other("processor is not subscribed".into()))?;
        let mut batch = Vec::new();
        let first_wait = Duration::from_millis(100);
        let window = Duration::from_millis(settings.commit_interval_ms);
        let mut deadline: Option<Instant> = None;
        while batch.len() < settings.max_batch {
            let wait = match deadline {
                None => first_wait,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left,
                    _ => break,
                },
            };
            match consumer.poll(wait) {
                Some(Ok(m)) => {
                    deadline.get_or_insert_with(|| Instant::now() + window);
                    batch.push(InputRecord {
                        topic: m.topic().to_owned(),
                        partition: m.partition(),
                        offset: m.offset(),
                        timestamp: match m.timestamp() {
                            Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) => Some(t),
                            Timestamp::NotAvailable => None,
                        },
                        key: m.key().map(<[u8]>::to_vec),
                        payload: m.payload().map(<[u8]>::to_vec),
                    });
                }
                Some(Err(e)) => {
                    warn!(error = %e, "input consumer error");
                    if deadline.is_none() {
                        break;
                    }
                }
                None => {
                    if deadline.is_none() {
                        break;
                    }
                }
            }
        }
        Ok(batch)
    }

    fn process_batch(&mut self, batch: Vec<InputRecord>) -> Result<()> {
        let started = Instant::now();
        let n = batch.len();
        let span = tracing::info_span!("batch", records = n);
        let _enter = span.enter();
        let mut offsets: BTreeMap<(String, i32), i64> = BTreeMap::new();
        self.transaction(|p| {
            for rec in batch {
                let input = decode_input(&p.topics, &rec);
                let cause = Cause {
                    topic: rec.topic.clone(),
                    partition: rec.partition,
                    offset: rec.offset,
                };
                let ts = rec.timestamp.unwrap_or(p.state.clock);
                p.process_one(cause, ts, input)?;
                offsets.insert((rec.topic, rec.partition), rec.offset + 1);
            }
            let mut tpl = TopicPartitionList::new();
            for ((topic, partition), next) in &offsets {
                tpl.add_partition_offset(topic, *partition, Offset::Offset(*next))
                    .map_err(kafka("building the offset list"))?;
            }
            Ok(Some(tpl))
        })?;
        self.status
            .metrics
            .batch(n, started.elapsed().as_secs_f64(), &self.state);
        debug!(
            records = n,
            elapsed_us = started.elapsed().as_micros() as u64,
            "batch committed"
        );
        Ok(())
    }

    /// Decides on one input and queues its journal entry and outputs in the transaction.
    fn process_one(&mut self, cause: Cause, ts: i64, input: Input) -> Result<()> {
        self.state.load_for_input(&input, &self.store)?;
        let ctx = Ctx {
            policy: self.policy.as_ref(),
        };
        let processed = process(&mut self.state, &ctx, cause, ts, input);
        self.send_entry(&processed.entry)?;
        for out in processed.outputs {
            self.send_output(out)?;
        }
        self.status.metrics.entry(&processed.entry, &self.state);
        Ok(())
    }

    /// Runs `body` inside a Kafka transaction, then persists the projection. On failure the
    /// transaction is aborted and the error returned: the in-memory state has moved ahead of
    /// what was committed, so the caller must rebuild the processor (from RocksDB and the
    /// journal), which the supervisor does.
    fn transaction(
        &mut self,
        body: impl FnOnce(&mut Processor) -> Result<Option<TopicPartitionList>>,
    ) -> Result<()> {
        let timeout = Duration::from_millis(self.config.settings.processor.transaction_timeout_ms);
        let fenced = |p: &Processor| Error::Fenced {
            partition: p.config.settings.processor.journal_partition,
            transactional_id: p.transactional_id.clone(),
        };
        self.producer.begin_transaction().map_err(|e| {
            if is_fenced(&e) {
                fenced(self)
            } else {
                kafka("begin_transaction")(e)
            }
        })?;
        let outcome = body(self).and_then(|offsets| {
            if let Some(tpl) = offsets {
                let consumer = self
                    .consumer
                    .as_ref()
                    .ok_or_else(|| Error::Other("offsets without a consumer".into()))?;
                let meta = consumer
                    .group_metadata()
                    .ok_or_else(|| Error::Other("consumer has no group metadata".into()))?;
                self.producer
                    .send_offsets_to_transaction(&tpl, &meta, timeout)
                    .map_err(kafka("send_offsets_to_transaction"))?;
            }
            self.await_deliveries(timeout)?;
            self.producer
                .commit_transaction(timeout)
                .map_err(kafka("commit_transaction"))
        });
        if let Err(e) = outcome {
            let fatal = matches!(&e, Error::Kafka { source, .. } if is_fenced(source));
            if !fatal && let Err(abort) = self.producer.abort_transaction(timeout) {
                warn!(error = %abort, "abort_transaction failed");
            }
            return Err(if fatal { fenced(self) } else { e });
        }
        let failures = std::mem::take(
            &mut *self
                .producer
                .context()
                .failures
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        if !failures.is_empty() {
            return Err(Error::Other(format!(
                "records of a committed transaction reported delivery failures: {failures:?}"
            )));
        }
        let last = self
            .producer
            .context()
            .last_journal_offset
            .load(Ordering::Relaxed);
        self.persist((last >= 0).then_some(last))?;
        Ok(())
    }

    /// Serves delivery reports until every record of the transaction is acknowledged.
    ///
    /// `commit_transaction` would flush too, but rust-rdkafka's flush polls in 100 ms steps
    /// (`BaseProducer::poll` blocks for its whole timeout), which put ~100 ms on every
    /// commit. Waiting here in 1 ms steps leaves the commit nothing to flush.
    fn await_deliveries(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.producer.in_flight_count() > 0 {
            self.producer.poll(Duration::from_millis(1));
            if Instant::now() > deadline {
                return Err(Error::Other(format!(
                    "{} records of the transaction were not acknowledged within {timeout:?}",
                    self.producer.in_flight_count()
                )));
            }
        }
        Ok(())
    }

    fn persist(&mut self, watermark: Option<i64>) -> Result<()> {
        let dirty = self.state.take_dirty();
        self.store.persist(&self.state, dirty, watermark)?;
        self.state.evict_cold();
        if let Some(w) = watermark {
            self.status.watermark.store(w, Ordering::Relaxed);
            self.status.metrics.watermark.set(w);
        }
        self.status
            .last_commit_ms
            .store(wall_clock_ms(), Ordering::Relaxed);
        if self.last_size_check.elapsed() > Duration::from_secs(10) {
            self.last_size_check = Instant::now();
            self.status
                .metrics
                .rocksdb_size
                .set(i64::try_from(self.store.size_bytes()).unwrap_or(i64::MAX));
        }
        Ok(())
    }

    fn send(
        &mut self,
        topic: &str,
        partition: Option<i32>,
        key: &[u8],
        payload: &[u8],
    ) -> Result<()> {
        let mut record = BaseRecord::to(topic).key(key).payload(payload);
        if let Some(p) = partition.filter(|p| *p >= 0) {
            record = record.partition(p);
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    self.producer.poll(Duration::from_millis(10));
                    record = r;
                }
                Err((e, _)) => return Err(kafka(format!("producing to {topic}"))(e)),
            }
        }
        self.sent += 1;
        if self.sent.is_multiple_of(1024) {
            self.producer.poll(Duration::ZERO);
        }
        Ok(())
    }

    fn send_entry(&mut self, entry: &JournalEntry) -> Result<()> {
        let bytes = encode_or_fail(entry)?;
        let journal = self.topics.journal.clone();
        let partition = self.config.settings.processor.journal_partition;
        self.send(&journal, Some(partition), entry.key().as_bytes(), &bytes)
    }

    fn send_output(&mut self, out: Output) -> Result<()> {
        match out {
            Output::Dispatch {
                pool,
                partition,
                record,
            } => {
                let topic = self.topics.dispatch(&pool);
                let bytes = encode_or_fail(record.as_ref())?;
                self.send(&topic, Some(partition), record.worker_id.as_bytes(), &bytes)
            }
            Output::CancelDispatch {
                pool,
                partition,
                record,
            } => {
                let topic = self.topics.dispatch(&pool);
                let bytes = encode_or_fail(&record)?;
                self.send(&topic, Some(partition), record.worker_id.as_bytes(), &bytes)
            }
            Output::DeadLetter(dl) => {
                let topic = self.topics.dlq.clone();
                let key = if dl.job_id.is_empty() {
                    format!(
                        "{}/{}/{}",
                        dl.cause_topic, dl.cause_partition, dl.cause_offset
                    )
                } else {
                    dl.job_id.clone()
                };
                let bytes = encode_or_fail(&dl)?;
                self.send(&topic, None, key.as_bytes(), &bytes)
            }
        }
    }

    /// The projection, for tests and the HTTP API.
    pub fn state(&self) -> &State {
        &self.state
    }
}

fn encode_or_fail<T: Record>(value: &T) -> Result<Vec<u8>> {
    encode(value).map_err(|e| Error::Other(format!("encoding {}: {e}", T::NAME)))
}

/// The record as an input: decoded if it is the kind its topic carries, otherwise a malformed
/// record that becomes a `malformed_record` dead letter.
fn decode_input(topics: &Topics, rec: &InputRecord) -> Input {
    let malformed = |error: String| {
        Input::Malformed(MalformedRecord {
            key: rec
                .key
                .as_deref()
                .map(|k| String::from_utf8_lossy(k).into_owned()),
            size_bytes: rec
                .payload
                .as_ref()
                .map_or(0, |p| i32::try_from(p.len()).unwrap_or(i32::MAX)),
            error,
        })
    };
    let Some(payload) = rec.payload.as_deref() else {
        return malformed("record has no value".into());
    };
    let record = match decode_any(payload) {
        Ok(r) => r,
        Err(e) => return malformed(e.to_string()),
    };
    let kind = topics.kind(&rec.topic);
    match (kind, record) {
        (InputKind::Jobs, AnyRecord::JobRequest(r)) => Input::Submit(r),
        (InputKind::Results, AnyRecord::JobStarted(r)) => Input::Started(r),
        (InputKind::Results, AnyRecord::JobProgress(r)) => Input::Progress(r),
        (InputKind::Results, AnyRecord::JobResult(r)) => Input::Result(r),
        (InputKind::Control, AnyRecord::CancelJob(r)) => Input::Cancel(r),
        (InputKind::Control, AnyRecord::ApproveJob(r)) => Input::Approve(r),
        (InputKind::Control, AnyRecord::RejectJob(r)) => Input::Reject(r),
        (InputKind::Control, AnyRecord::Tick(r)) => Input::Tick(r),
        (InputKind::Heartbeats, AnyRecord::Heartbeat(r)) => Input::Heartbeat(r),
        (kind, other) => malformed(format!(
            "a {} record does not belong on {} ({kind:?} topic)",
            other.name(),
            rec.topic
        )),
    }
}

pub(crate) fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
