//! The processor loop (DESIGN "The processor"): batches of input records, each batch one Kafka
//! transaction holding its journal entries, dispatches, dead letters and input offsets; after
//! the commit, one RocksDB WriteBatch with the batch's changes and the journal watermark.
//!
//! No input can stall it (docs/reliability.md): records over the size limit are refused
//! before decoding; work per journal entry is bounded and continues in the next entry; a
//! failure that retrying cannot fix is isolated to its input, which is set aside
//! (`processing_failed`) and journaled so a replay agrees. Ticks are judged at the watermark
//! of what has been read (inputs.rs, `ReadThrough`).
//!
//! Runs on a plain thread: the Kafka transaction calls block.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use ksched_codec::{Framing, Record, trace_context};
use ksched_core::decide::Ctx;
use ksched_core::events::{Cause, Input, JournalEntry};
use ksched_core::outputs::Output;
use ksched_core::state::State;
use ksched_policy::RegoEngine;
use ksched_store::Store;
use prometheus::Counter;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::clock::wall_clock_ms;
use crate::engine::Engine;
use crate::error::{Coords, Error, Result, kafka, refused_for_what_it_is};
use crate::inputs::{
    InputRecord, ReadThrough, Taken, Unreadable, set_aside, skips_records, take, unreadable_input,
};
use crate::job_trace::{JobSpans, Traced};
use crate::metrics::{RecordCounters, spawn_counted};
use crate::positions::{self, Positions};
use crate::replay::{Flow, Replayer, journal_watermarks, read_journal};
use crate::settings::{Config, Settings};
use crate::shard::{Shard, Takes};
use crate::status::Status;
use crate::topics::{InputKind, Topics, client_config, transactional_retry_backoff};

/// Most continuation entries one input may add in its own transaction; further work waits
/// for the next Tick (which continues it anyway).
const MAX_CONTINUATIONS: usize = 1_000;
/// How often the processor refreshes which evidence partitions it consumes.
const ASSIGNMENT_REFRESH: Duration = Duration::from_secs(5);
/// How often the processor looks for partitions added to its input topics.
const INPUTS_REFRESH: Duration = Duration::from_secs(30);

/// Transactional producers a shard's processor may use in turn (ids `<id>` and `<id>-b`).
const MAX_TRANSACTIONAL_PRODUCERS: usize = 2;

/// The transactional id of a shard's producer `i`: `<group>-journal-<shard>` for the first,
/// the shard's own (the processor's name, and the id whose fences say another instance holds
/// the shard: see `run_shard`), the same with `-b` for the second.
pub(crate) fn transactional_id(group_id: &str, shard: i32, i: usize) -> String {
    let suffix = if i == 0 { "" } else { "-b" };
    format!("{group_id}-journal-{shard}{suffix}")
}

/// What a failed run leaves for the next: input partitions to process one input per
/// transaction (to find which input failed), and inputs to set aside.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    /// Per input partition, process inputs one at a time up to this offset.
    pub isolate: BTreeMap<(String, i32), i64>,
    /// Inputs to dead-letter as `processing_failed` instead of deciding on them, with what
    /// failed.
    pub set_aside: BTreeMap<Coords, String>,
    /// When isolation began; it ends after `ISOLATION_LIMIT` whatever happens.
    pub isolating_since: Option<Instant>,
}

/// Isolation ends after this even if some partition of the failed batch was not read again
/// (say, it was revoked).
const ISOLATION_LIMIT: Duration = Duration::from_secs(60);

impl Recovery {
    pub fn isolate(&mut self, ranges: BTreeMap<(String, i32), i64>) {
        for (k, last) in ranges {
            let e = self.isolate.entry(k).or_insert(last);
            *e = (*e).max(last);
        }
        self.isolating_since.get_or_insert_with(Instant::now);
    }

    fn isolating(&mut self) -> bool {
        if self
            .isolating_since
            .is_some_and(|t| t.elapsed() > ISOLATION_LIMIT)
        {
            self.isolate.clear();
        }
        if self.isolate.is_empty() {
            self.isolating_since = None;
        }
        !self.isolate.is_empty()
    }

    fn passed(&mut self, rec: &InputRecord) {
        let k = (rec.topic.clone(), rec.partition);
        if self.isolate.get(&k).is_some_and(|last| rec.offset >= *last) {
            self.isolate.remove(&k);
        }
    }
}

/// Collects a producer's delivery reports: the last journal offset written (shared by the
/// processor's producers, so that it only moves forward whichever producer commits), and
/// refusals.
struct Delivery {
    journal: String,
    partition: i32,
    last_journal_offset: Arc<AtomicI64>,
    failures: Mutex<Vec<(String, RDKafkaErrorCode, String)>>,
    acks: Acks,
}

/// Records sent and records reported on, so that a transaction's end waits for its last
/// acknowledgement in one sleep: the producer's reporting thread
/// ([`serve_deliveries_behind`]) wakes it when the reports catch up with the sends.
#[derive(Default)]
struct Acks {
    sent: AtomicU64,
    reported: Mutex<u64>,
    caught_up: Condvar,
}

impl Acks {
    fn sent(&self) {
        self.sent.fetch_add(1, Ordering::SeqCst);
    }

    fn reported(&self) {
        let mut reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        *reported += 1;
        // Only the report that catches up wakes anyone: not a system call per record.
        if *reported >= self.sent.load(Ordering::SeqCst) {
            self.caught_up.notify_all();
        }
    }

    /// Waits until every record sent so far is reported on, or `deadline` passes; whether
    /// they are.
    fn wait(&self, deadline: Instant) -> bool {
        let mut reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        while *reported < self.sent.load(Ordering::SeqCst) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            reported = self
                .caught_up
                .wait_timeout(reported, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

impl ClientContext for Delivery {}

/// Counts a report when dropped, at the end of the delivery callback.
struct Reported<'a>(&'a Acks);

impl Drop for Reported<'_> {
    fn drop(&mut self) {
        self.0.reported();
    }
}

impl ProducerContext for Delivery {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        use rdkafka::message::Message;
        // Counted once the failure below is in the list, so the waiter sees it.
        let _reported = Reported(&self.acks);
        match result {
            Ok(m) => {
                if m.partition() == self.partition && m.topic() == self.journal {
                    self.last_journal_offset
                        .fetch_max(m.offset(), Ordering::Relaxed);
                }
            }
            Err((e, m)) => {
                let code = e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail);
                if let Ok(mut f) = self.failures.lock() {
                    f.push((
                        m.topic().to_owned(),
                        code,
                        format!("{}/{}: {e}", m.topic(), m.partition()),
                    ));
                }
            }
        }
    }
}

/// The input consumer's context: librdkafka statistics become the lag metric; a fatal
/// consumer error (this instance's group membership taken by another with the same
/// `group.instance.id`) stops the processor.
struct InputContext {
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

/// The processor for one journal partition.
pub struct Processor {
    config: Config,
    topics: Topics,
    /// The state over its projection: every decision, fold and checkpoint goes through it.
    engine: Engine,
    policy: Arc<RegoEngine>,
    /// The transactional producers, used in turn: a batch's transaction runs on
    /// `producers[turn]`, and the next batch's on the next one
    /// (`processor.transactional_producers`). Shared with the transaction thread, which ends
    /// each transaction.
    producers: Vec<Arc<BaseProducer<Delivery>>>,
    /// The producer the next (or the open) transaction is on.
    turn: usize,
    /// The producer with a transaction begun and not yet ended, to abort on failure. At most
    /// one transaction is open at a time: the next begins once the previous committed.
    txn_on: Cell<Option<usize>>,
    caller: Caller,
    consumer: Option<BaseConsumer<InputContext>>,
    /// The shard's transactional id (its first producer's): the name of this processor.
    transactional_id: String,
    status: Arc<Status>,
    shutdown: CancellationToken,
    last_size_check: Instant,
    read_through: ReadThrough,
    last_assignment: Option<Instant>,
    unreadable: Unreadable,
    /// When the consumer last delivered a record (or the processor subscribed).
    last_record: Instant,
    /// The shard this processor runs (its journal partition), among how many.
    shard: Shard,
    /// Records and bytes read and written, by topic role.
    counters: Counters,
    /// The input partitions assigned to the consumer, and when they were last checked
    /// against the topics' metadata (partitions added to a topic are picked up).
    inputs: Vec<(String, i32)>,
    inputs_checked: Instant,
    /// Partitions of the results topic (a Dispatch names one of this shard's).
    results_partitions: i32,
    /// Records decided on while no transaction is open (one is in flight).
    outbox: Vec<Outgoing>,
    /// A transaction is open for the batch being decided: its records go out at once.
    open: bool,
    /// The batch whose transaction finishes on the caller thread.
    in_flight: Option<InFlight>,
    /// Spans of traced jobs (job_trace.rs).
    spans: JobSpans,
    /// The next offset of each assigned input partition, after every batch decided so far
    /// (committed or not): what each batch's first journal record carries
    /// ([`positions::HEADER`]), and where inputs are assigned from again.
    positions: Positions,
    /// The positions header of the batch being decided, until its first journal record
    /// takes it.
    positions_header: Option<String>,
    /// When the positions last went to the consumer group.
    group_offsets_sent: Instant,
}

/// A record decided on, encoded, waiting for its transaction to begin.
struct Outgoing {
    topic: String,
    partition: Option<i32>,
    key: Vec<u8>,
    payload: Vec<u8>,
    /// The record's `traceparent` header, for a traced job's records.
    trace: Option<String>,
    /// The shard's input positions ([`positions::HEADER`]), on a batch's first journal
    /// record.
    positions: Option<String>,
}

/// The inputs of a transaction, for what follows its end.
struct Batch {
    inputs: Vec<InputRecord>,
    /// Per input partition, the last offset in the batch.
    ranges: BTreeMap<(String, i32), i64>,
    started: Instant,
}

impl Default for Batch {
    fn default() -> Batch {
        Batch {
            inputs: Vec::new(),
            ranges: BTreeMap::new(),
            started: Instant::now(),
        }
    }
}

impl Batch {
    /// A record refused for what it is (too large, invalid): with one input in the batch,
    /// that input failed; with several, which one is not known (the supervisor isolates
    /// them). Other errors are the transaction's.
    fn blame(&self, e: Error) -> Error {
        match e {
            Error::Kafka { context, source }
                if source
                    .rdkafka_error_code()
                    .is_some_and(refused_for_what_it_is)
                    && context.starts_with("producing")
                    && !self.inputs.is_empty() =>
            {
                let detail = format!("{context}: {source}");
                match self.inputs.as_slice() {
                    [only] => Error::InputFailed {
                        coords: only.coords(),
                        detail,
                    },
                    inputs => Error::BatchFailed {
                        inputs: inputs.len(),
                        ranges: self.ranges.clone(),
                        detail,
                    },
                }
            }
            e => e,
        }
    }
}

/// A transaction finishing on the caller thread.
struct InFlight {
    /// The last journal offset delivered, once committed.
    done: std::sync::mpsc::Receiver<Result<i64>>,
    deadline: Instant,
    limit: Duration,
    /// The batch's projection changes, written once it committed.
    pending: crate::engine::Pending,
    batch: Batch,
}

/// A thread that makes the producers' transactional calls for the processor, so that one
/// librdkafka does not return from holds up this thread only.
struct Caller {
    calls: std::sync::mpsc::Sender<Call>,
}

/// One call for the [`Caller`]'s thread.
type Call = Box<dyn FnOnce() + Send>;

impl Caller {
    /// `cpu` counts the thread's CPU time: the transaction's calls, and the delivery reports
    /// they serve, are the processor's work as much as deciding is.
    fn start(cpu: Counter) -> Result<Caller> {
        let (calls, rx) = std::sync::mpsc::channel::<Call>();
        // Ends when the processor (the sender) is gone.
        spawn_counted(
            "ksched-txn-calls",
            "the transaction thread",
            cpu,
            move || rx.recv().map(|call| call()).is_ok(),
        )?;
        Ok(Caller { calls })
    }

    /// Starts `f` on the thread; its result comes on the receiver.
    fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<std::sync::mpsc::Receiver<T>> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.calls
            .send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .ok()?;
        Some(rx)
    }
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

/// The text of a panic payload.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
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
        shutdown: CancellationToken,
    ) -> Result<Processor> {
        let started = Instant::now();
        let settings = &config.settings;
        let partition = settings.processor.journal_partition;
        let shard = Shard::new(partition, settings.topics.journal_partitions);
        let transactional_id = transactional_id(&settings.processor.group_id, partition, 0);
        // Both ids are initialised before the journal is read, whatever
        // `transactional_producers` says: an older instance is fenced on each, a transaction
        // it left open on either is aborted (so the setting can change between runs), and
        // nothing it still commits can follow the catch-up.
        let last_journal_offset = Arc::new(AtomicI64::new(-1));
        let mut producers = Vec::new();
        for i in 0..MAX_TRANSACTIONAL_PRODUCERS {
            let suffix = if i == 0 { "" } else { "-b" };
            let id = self::transactional_id(&settings.processor.group_id, partition, i);
            let delivery = Delivery {
                journal: topics.journal.clone(),
                partition,
                last_journal_offset: last_journal_offset.clone(),
                failures: Mutex::new(Vec::new()),
                acks: Acks::default(),
            };
            let client_id = format!("{}-processor{suffix}", settings.kafka.client_id);
            let producer = transactional_producer(&config, &id, &client_id, delivery)?;
            if i < usize::from(settings.processor.transactional_producers) {
                let producer = Arc::new(producer);
                serve_deliveries_behind(&producer, status.metrics.processor_cpu.clone())?;
                producers.push(producer);
            }
        }
        let fenced_ms = started.elapsed().as_millis() as u64;
        let caller = Caller::start(status.metrics.processor_cpu.clone())?;
        let mut engine = Engine::open(store)?;
        engine.count_writer_cpu(status.metrics.processor_cpu.clone());
        let loaded_ms = started.elapsed().as_millis() as u64;
        let mut p = Processor {
            config,
            topics,
            engine,
            policy,
            producers,
            turn: 0,
            txn_on: Cell::new(None),
            caller,
            consumer: None,
            transactional_id,
            counters: Counters::new(&status.metrics),
            status,
            shutdown,
            last_size_check: Instant::now(),
            read_through: ReadThrough::default(),
            last_assignment: None,
            unreadable: Unreadable::default(),
            last_record: Instant::now(),
            shard,
            inputs: Vec::new(),
            inputs_checked: Instant::now(),
            results_partitions: 0,
            outbox: Vec::new(),
            open: false,
            in_flight: None,
            spans: JobSpans::default(),
            positions: Positions::new(),
            positions_header: None,
            group_offsets_sent: Instant::now(),
        };
        p.catch_up()?;
        let caught_up_ms = started.elapsed().as_millis() as u64;
        p.reconfigure()?;
        p.subscribe()?;
        p.status.metrics.gauges(p.engine.state());
        p.status.set_caught_up(true);
        info!(
            fenced_ms,
            loaded_ms,
            caught_up_ms,
            ready_ms = started.elapsed().as_millis() as u64,
            "processor ready (times from its start)"
        );
        Ok(p)
    }

    /// Applies journal entries written after the store's watermark (a crash between a commit
    /// and its RocksDB write, or a store restored from an older copy).
    fn catch_up(&mut self) -> Result<()> {
        let span = tracing::info_span!("recovery");
        let _enter = span.enter();
        let settings = &self.config.settings;
        let partition = settings.processor.journal_partition;
        let from = self.engine.store().watermark()?.map_or(0, |w| w + 1);
        let client = crate::replay::reader_client(settings, "recovery");
        let (low, high) = journal_watermarks(&client, &self.topics.journal, partition)?;
        if from > high {
            return Err(Error::StoreAheadOfJournal {
                path: self.engine.store().path().display().to_string(),
                store_offset: from - 1,
                topic: self.topics.journal.clone(),
                partition,
                journal_end: high,
            });
        }
        if from < low {
            return Err(Error::JournalTruncated {
                topic: self.topics.journal.clone(),
                partition,
                journal_start: low,
                needed: from,
            });
        }
        if from >= high {
            info!(
                watermark = from - 1,
                "projection is up to date with the journal"
            );
            return Ok(());
        }
        let started = Instant::now();
        let mut replayer = Replayer::new(&mut self.engine);
        read_journal(&client, &self.topics.journal, partition, from, |rec| {
            replayer.apply(rec.offset, &rec.entry)?;
            Ok(Flow::Continue)
        })?;
        replayer.persist()?;
        let applied = replayer.applied;
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
        let current = self.engine.state().config.as_ref().map(|c| &c.raw);
        if current == Some(&wanted) {
            return Ok(());
        }
        crate::shard::check_moves(
            &self.config.settings,
            &self.topics.journal,
            self.engine.state(),
            &self.config.rules,
            self.shard,
        )?;
        info!(
            policy_snapshot = %wanted.policy_snapshot,
            rules_id = %wanted.rules_id,
            "putting new rules and policy in force"
        );
        let cause = Cause {
            topic: "config".into(),
            partition: -1,
            offset: i64::try_from(self.engine.state().entries).unwrap_or(i64::MAX),
        };
        let now = reconfigure_time(self.engine.state());
        let mut recovery = Recovery::default();
        self.drain(&mut recovery)
            .and_then(|()| self.process_input(cause, now, Input::Reconfigure(wanted), None))
            .and_then(|()| self.end(None, Batch::default()))
            .and_then(|()| self.drain(&mut recovery))
            .map_err(|e| match e {
                e @ (Error::Fenced { .. } | Error::Kafka { .. }) => e,
                other => Error::Config {
                    source_name: "rules and policy".into(),
                    detail: format!("they could not be journaled: {other}"),
                },
            })
    }

    /// Creates the input consumer and assigns it this shard's input partitions
    /// ([`Shard::inputs`]), from the offsets its group committed.
    fn subscribe(&mut self) -> Result<()> {
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
    fn assign_inputs(&mut self) -> Result<()> {
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

    /// Processes batches until shutdown, then commits what it has and returns. `recovery`
    /// says which inputs to isolate or set aside, and is updated as they pass.
    pub fn run(&mut self, recovery: &mut Recovery) -> Result<()> {
        let mut cpu = None;
        while !self.shutdown.is_cancelled() {
            self.status.metrics.add_thread_cpu(&mut cpu);
            self.check_membership()?;
            if self.inputs_checked.elapsed() > INPUTS_REFRESH {
                self.assign_inputs()?;
            }
            let batch = self.collect(recovery)?;
            if batch.is_empty() {
                self.drain(recovery)?;
                continue;
            }
            self.process_batch(batch, recovery)?;
        }
        self.drain(recovery)?;
        self.engine.store().flush()?;
        info!("processor stopped");
        Ok(())
    }

    /// Stops when another consumer took this instance's group membership.
    fn check_membership(&self) -> Result<()> {
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

    fn consumer(&self) -> Result<&BaseConsumer<InputContext>> {
        self.consumer.as_ref().ok_or(Error::Invariant(
            "the processor's consumer is used before it subscribed",
        ))
    }

    fn collect(&mut self, recovery: &mut Recovery) -> Result<Vec<InputRecord>> {
        let settings = &self.config.settings.processor;
        let max_batch = if recovery.isolating() {
            1
        } else {
            settings.max_batch
        };
        let window = Duration::from_millis(settings.commit_interval_ms);
        // Adaptive batching: once the consumer has nothing more at hand, every input waiting
        // is in the batch, and waiting out the window would only delay it. Inputs that arrive
        // while this batch commits make the next one: under load batches grow by themselves
        // (up to `max_batch` and the window).
        let adaptive = settings.adaptive_batching;
        let trust_create_time = self.config.settings.topics.trust_create_time;
        let stalled = self.last_record.elapsed();
        if stalled > Duration::from_millis(settings.input_stall_ms) {
            return Err(Error::InputsStalled {
                seconds: stalled.as_secs(),
            });
        }
        let consumer = self.consumer.as_ref().ok_or(Error::Invariant(
            "the processor's consumer is used before it subscribed",
        ))?;
        let mut batch = Vec::new();
        let first_wait = Duration::from_millis(100);
        let mut deadline: Option<Instant> = None;
        while batch.len() < max_batch {
            let wait = match deadline {
                None => first_wait,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(_) if adaptive => Duration::ZERO,
                    Some(left) if !left.is_zero() => left,
                    _ => break,
                },
            };
            match consumer.poll(wait) {
                Some(Ok(m)) => {
                    deadline.get_or_insert_with(|| Instant::now() + window);
                    batch.push(InputRecord::from_message(&m, trust_create_time));
                }
                Some(Err(KafkaError::PartitionEOF(_))) => {}
                Some(Err(e)) => {
                    if let KafkaError::MessageConsumptionFatal(_) = e {
                        return Err(Error::Replaced {
                            instance_id: self.transactional_id.clone(),
                            detail: e.to_string(),
                        });
                    }
                    if skips_records(&e) {
                        // The consumer skipped what it could not read; the next record of
                        // the same partition shows where (inputs.rs, `Unreadable`).
                        error!(error = %e, "the input consumer could not read a record");
                        self.status.metrics.unreadable.inc();
                        self.unreadable.error(e.to_string());
                    } else {
                        warn!(error = %e, "input consumer error; the client retries");
                    }
                    if deadline.is_none() {
                        break;
                    }
                }
                None => {
                    if deadline.is_none() || adaptive {
                        break;
                    }
                }
            }
        }
        if !batch.is_empty() {
            self.last_record = Instant::now();
        }
        Ok(batch)
    }

    /// Decides on a batch and starts the end of its transaction on the transaction thread.
    ///
    /// With nothing in flight (the previous batch already committed: always without
    /// pipelining, and at low load) the transaction begins first and each record goes out
    /// as it is decided, so its acknowledgement comes back while the rest is decided. With
    /// a batch in flight (pipelining under load) the records wait in the outbox while the
    /// batch is decided, the one in flight is settled, and then they go out. Without
    /// pipelining the batch is settled before returning.
    fn process_batch(&mut self, batch: Vec<InputRecord>, recovery: &mut Recovery) -> Result<()> {
        let started = Instant::now();
        let span = tracing::info_span!("batch", records = batch.len());
        let _enter = span.enter();
        let mut ranges: BTreeMap<(String, i32), i64> = BTreeMap::new();
        for rec in &batch {
            let last = ranges
                .entry((rec.topic.clone(), rec.partition))
                .or_default();
            *last = (*last).max(rec.offset);
        }
        for ((topic, partition), last) in &ranges {
            self.positions.insert((topic.clone(), *partition), last + 1);
        }
        // Where this batch's positions go (positions.rs): to the group when the batch is
        // small or the group is due; in its first journal record otherwise (and to the
        // group after all if it journals nothing).
        let settings = &self.config.settings.processor;
        let interval = Duration::from_millis(settings.group_offsets_interval_ms);
        let to_group = batch.len() < settings.journal_positions_min_batch
            || self.group_offsets_sent.elapsed() >= interval;
        self.positions_header = (!to_group).then(|| positions::encode(&self.positions));
        let batch = Batch {
            inputs: batch,
            ranges,
            started,
        };
        self.try_settle(recovery)?;
        if self.in_flight.is_none() {
            self.open()?;
        }
        let phases = self.status.metrics.batch_phases.clone();
        let phase = Phase::start(&phases, "decide");
        for rec in &batch.inputs {
            if let Err(e) = self.process_record(rec, recovery) {
                return Err(if self.open {
                    batch.blame(self.fail(e))
                } else {
                    e
                });
            }
        }
        phase.end();
        self.settle(recovery)?;
        // A batch that journaled nothing left its header untaken: its positions go to the
        // group, as do those of a batch that was to send them there.
        let untaken = self.positions_header.take().is_some();
        let offsets = if to_group || untaken {
            self.group_offsets_sent = Instant::now();
            let mut tpl = TopicPartitionList::new();
            for ((topic, partition), next) in &self.positions {
                tpl.add_partition_offset(topic, *partition, Offset::Offset(*next))
                    .map_err(kafka("building the offset list"))?;
            }
            Some(tpl)
        } else {
            None
        };
        self.end(offsets, batch)?;
        if !self.config.settings.processor.pipelined {
            self.settle(recovery)?;
        }
        Ok(())
    }

    /// One input record: a marker moves the read-through time of its partition; anything
    /// else is decided on and journaled (or set aside, when it failed before).
    fn process_record(&mut self, rec: &InputRecord, recovery: &mut Recovery) -> Result<()> {
        let kind = self.topics.kind(&rec.topic);
        self.counters
            .input(kind)
            .count(rec.key.as_ref().map_or(0, Vec::len) + rec.payload.as_ref().map_or(0, Vec::len));
        if let Some(gap) = self.unreadable.read(rec) {
            let cause = Cause {
                topic: gap.topic.clone(),
                partition: gap.partition,
                offset: gap.offset,
            };
            let input = unreadable_input(&gap);
            if self.shard.takes(&self.config.rules, kind, &input) == Takes::Yes {
                self.process_input(cause, self.engine.state().clock, input, None)?;
            }
        }
        self.read_through.observe(rec);
        let max_record_bytes = self
            .engine
            .state()
            .rules()
            .map_or(512 * 1024, |r| r.limits.max_record_bytes);
        let taken = take(&self.topics, rec, max_record_bytes);
        let input = match recovery.set_aside.remove(&rec.coords()) {
            Some(detail) => {
                let decoded = match &taken {
                    Taken::Input(i) => Some(i),
                    Taken::Marker => None,
                };
                warn!(
                    topic = %rec.topic,
                    partition = rec.partition,
                    offset = rec.offset,
                    detail = %detail,
                    "setting an input aside: it is dead-lettered as processing_failed"
                );
                self.status.metrics.set_aside.inc();
                set_aside(rec, decoded, &detail)
            }
            None => match taken {
                Taken::Marker => return Ok(()),
                Taken::Input(i) => i,
            },
        };
        match self.shard.takes(&self.config.rules, kind, &input) {
            Takes::Yes => {}
            Takes::No => return Ok(()),
            Takes::IfItHolds(job_id) => {
                if !self.engine.knows_job(&job_id)? {
                    return Ok(());
                }
            }
        }
        let ts = rec.log_append_time.unwrap_or(self.engine.state().clock);
        if let Input::Heartbeat(hb) = &input
            && self.config.settings.processor.coalesce_heartbeats
            && ksched_core::decide::redundant_heartbeat(self.engine.state(), hb, ts)
        {
            self.status.metrics.heartbeats_coalesced.inc();
            return Ok(());
        }
        let input = match input {
            Input::Tick(mut t) => {
                t.watermark = Some(self.tick_watermark(rec.log_append_time));
                self.status.tick_processed();
                Input::Tick(t)
            }
            other => other,
        };
        let cause = Cause {
            topic: rec.topic.clone(),
            partition: rec.partition,
            offset: rec.offset,
        };
        let traced = Traced::of(&input, rec.trace.as_ref(), rec.log_append_time);
        self.process_input(cause, ts, input, traced)
    }

    /// What a Tick appended at `tick_time` is judged at: the least of it and what every
    /// evidence partition has been read through; the previous watermark while some
    /// evidence partition has not been read at all yet.
    fn tick_watermark(&mut self, tick_time: Option<i64>) -> i64 {
        if self
            .last_assignment
            .is_none_or(|t| t.elapsed() > ASSIGNMENT_REFRESH)
            && let Some(c) = self.consumer.as_ref()
            && let Ok(tpl) = c.assignment()
        {
            self.last_assignment = Some(Instant::now());
            let evidence: Vec<(String, i32)> = tpl
                .elements()
                .iter()
                .filter(|e| {
                    matches!(
                        self.topics.kind(e.topic()),
                        InputKind::Results | InputKind::Heartbeats
                    )
                })
                .map(|e| (e.topic().to_owned(), e.partition()))
                .collect();
            self.read_through.set_assignment(evidence);
        }
        let tick_time = tick_time.unwrap_or(self.engine.state().clock);
        match self.read_through.watermark(tick_time) {
            Some(w) => w.max(self.engine.state().watermark),
            None => {
                debug!(unread = ?self.read_through.unread(), "evidence partitions not read yet; time holds");
                self.engine.state().watermark
            }
        }
    }

    /// Decides on one input (and any continuations it needs) and queues the journal entries
    /// and outputs in the transaction. A panic in a decision is isolated to the input.
    /// `traced`: the trace the input continues; its span covers the input's own entry.
    fn process_input(
        &mut self,
        cause: Cause,
        ts: i64,
        input: Input,
        mut traced: Option<Traced>,
    ) -> Result<()> {
        let coords = (cause.topic.clone(), cause.partition, cause.offset);
        let mut next = Some(input);
        let mut continuations = 0;
        while let Some(input) = next.take() {
            let ctx = Ctx {
                policy: self.policy.as_ref(),
            };
            let engine = &mut self.engine;
            let processed = std::panic::catch_unwind(AssertUnwindSafe(|| {
                engine.decide(&ctx, cause.clone(), ts, input)
            }))
            .map_err(|p| Error::InputFailed {
                coords: coords.clone(),
                detail: format!("deciding on it panicked: {}", panic_text(p.as_ref())),
            })??;
            let trace = traced
                .take()
                .and_then(|t| self.spans.decided(t, &processed.entry));
            self.send_entry(&processed.entry, trace)?;
            for out in processed.outputs {
                self.send_output(out)?;
            }
            self.status
                .metrics
                .entry(&processed.entry, self.engine.state());
            if processed.more {
                if continuations < MAX_CONTINUATIONS {
                    continuations += 1;
                    next = Some(self.engine.continuation());
                } else {
                    debug!("work left for the next Tick");
                }
            }
        }
        if continuations > 0 {
            self.status
                .metrics
                .continuations
                .inc_by(continuations as u64);
        }
        Ok(())
    }

    /// Begins a transaction, and sends what waits in the outbox; from now on records go out
    /// as they are decided. Nothing may be in flight.
    fn open(&mut self) -> Result<()> {
        debug_assert!(self.in_flight.is_none() && !self.open);
        debug_assert!(self.txn_on.get().is_none());
        self.producer().begin_transaction().map_err(|e| {
            if is_fenced(&e) {
                self.fenced(self.turn)
            } else {
                kafka("begin_transaction")(e)
            }
        })?;
        self.txn_on.set(Some(self.turn));
        self.open = true;
        for o in std::mem::take(&mut self.outbox) {
            self.produce(o).map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    /// Ends the batch just decided: prepares its projection changes (once the previous
    /// batch's are written, and what they made cold is evicted), opens its transaction (if
    /// it was decided into the outbox) and hands the rest to the transaction thread: send
    /// `offsets`, wait for every acknowledgement, commit. Nothing may be in flight.
    /// [`Processor::settle`] waits for it and has the projection written.
    fn end(&mut self, offsets: Option<TopicPartitionList>, batch: Batch) -> Result<()> {
        debug_assert!(self.in_flight.is_none());
        let phases = self.status.metrics.batch_phases.clone();
        let mut phase = Phase::start(&phases, "prepare");
        let pending = self
            .engine
            .prepare_next()
            .map_err(|e| self.store_error(e))?;
        phase.next("send");
        let timeout = Duration::from_millis(self.config.settings.processor.transaction_timeout_ms);
        if !self.open {
            self.open().map_err(|e| batch.blame(e))?;
        }
        self.open = false;
        let offsets = match offsets {
            Some(tpl) => {
                let meta = self.consumer()?.group_metadata().ok_or(Error::Invariant(
                    "the processor's consumer has no group metadata",
                ))?;
                Some((tpl, meta))
            }
            None => None,
        };
        phase.end();
        let p = self.producers[self.turn].clone();
        // The next batch begins on the next producer: its transaction need not wait for the
        // coordinator to finish this one's markers.
        self.turn = (self.turn + 1) % self.producers.len();
        let job = move || -> Result<i64> {
            let mut phase = Phase::start(&phases, "offsets");
            if let Some((tpl, meta)) = offsets {
                p.send_offsets_to_transaction(&tpl, &meta, timeout)
                    .map_err(kafka("send_offsets_to_transaction"))?;
            }
            phase.next("deliveries");
            await_deliveries(&p, timeout)?;
            refusals(&p)?;
            phase.next("commit");
            p.commit_transaction(timeout)
                .map_err(kafka("commit_transaction"))?;
            phase.end();
            Ok(p.context().last_journal_offset.load(Ordering::Relaxed))
        };
        // librdkafka may block in send_offsets_to_transaction (and the coordinator requests
        // behind commits) past the timeout it is given while it waits for a group or
        // transaction coordinator that went away with a broker (librdkafka issues 5456 and
        // 5511, open in the bundled 2.12). Past the transaction timeout the coordinator
        // aborts the transaction anyway: the job is given up on 10 s later.
        let limit = timeout + Duration::from_secs(10);
        let done = self.caller.run(job).ok_or(Error::Invariant(
            "the processor's transaction thread is gone",
        ))?;
        self.in_flight = Some(InFlight {
            done,
            deadline: Instant::now() + limit,
            limit,
            pending,
            batch,
        });
        Ok(())
    }

    /// Settles the batch in flight if its transaction already ended.
    fn try_settle(&mut self, recovery: &mut Recovery) -> Result<()> {
        let Some(f) = self.in_flight.take() else {
            return Ok(());
        };
        match f.done.try_recv() {
            Ok(outcome) => self.settled(f, outcome, recovery),
            Err(std::sync::mpsc::TryRecvError::Empty) => {
                self.in_flight = Some(f);
                Ok(())
            }
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                let e = Error::Invariant("the processor's transaction thread is gone");
                self.settled(f, Err(e), recovery)
            }
        }
    }

    /// Waits for the batch in flight (if any) to commit, then has its projection written
    /// with the journal watermark it reached and lets its inputs pass. On failure the transaction is
    /// aborted and the error returned: the in-memory state has moved ahead of what was
    /// committed (by this batch and the one decided since), so the caller must rebuild the
    /// processor from RocksDB and the journal, which the supervisor does.
    fn settle(&mut self, recovery: &mut Recovery) -> Result<()> {
        let Some(f) = self.in_flight.take() else {
            return Ok(());
        };
        let phases = self.status.metrics.batch_phases.clone();
        let phase = Phase::start(&phases, "wait");
        let wait = f.deadline.saturating_duration_since(Instant::now());
        let outcome = match f.done.recv_timeout(wait) {
            Ok(outcome) => outcome,
            Err(_) => {
                error!(
                    seconds = f.limit.as_secs(),
                    "a transactional call hangs in librdkafka; giving up on this producer"
                );
                Err(Error::TransactionStuck {
                    call: "finishing the transaction",
                    seconds: f.limit.as_secs(),
                })
            }
        };
        phase.end();
        self.settled(f, outcome, recovery)
    }

    /// What follows the end of a transaction in flight: on success, its projection handed to
    /// the engine's writing thread (written while the next batch is decided: the next
    /// [`Engine::prepare_next`] waits for it) and its inputs let pass; on failure, the error
    /// (see [`Processor::settle`]).
    fn settled(
        &mut self,
        f: InFlight,
        outcome: Result<i64>,
        recovery: &mut Recovery,
    ) -> Result<()> {
        let last = match outcome {
            Ok(last) => {
                self.txn_on.set(None);
                last
            }
            Err(e) => {
                let e = self.fail(e);
                return Err(f.batch.blame(e));
            }
        };
        let phases = self.status.metrics.batch_phases.clone();
        let phase = Phase::start(&phases, "persist");
        let watermark = (last >= 0).then_some(last);
        let status = self.status.clone();
        self.engine
            .write_behind(f.pending, watermark, move || written(&status, watermark))?;
        self.check_size();
        phase.end();
        for rec in &f.batch.inputs {
            recovery.passed(rec);
        }
        let n = f.batch.inputs.len();
        if n > 0 {
            self.status.metrics.batch(
                n,
                f.batch.started.elapsed().as_secs_f64(),
                self.engine.state(),
            );
            debug!(
                records = n,
                elapsed_us = f.batch.started.elapsed().as_micros() as u64,
                "batch committed"
            );
        }
        Ok(())
    }

    /// Settles the batch in flight and evicts what is cold from memory: only with nothing
    /// decided and not yet written can the state forget what the store holds.
    fn drain(&mut self, recovery: &mut Recovery) -> Result<()> {
        self.settle(recovery)?;
        self.engine
            .finish_writing()
            .map_err(|e| self.store_error(e))?;
        if self.outbox.is_empty() {
            self.engine.evict();
        }
        Ok(())
    }

    /// After a failed transactional step: aborts the open transaction (unless the producer
    /// is fenced or stuck: the next incarnation's init_transactions aborts whatever this one
    /// left open, so a broker that cannot be reached is not waited for twice, nor a stuck
    /// producer asked for anything more), and says fenced when it was.
    fn fail(&self, e: Error) -> Error {
        let fatal = matches!(&e, Error::Kafka { source, .. } if is_fenced(source));
        let stuck = matches!(e, Error::TransactionStuck { .. });
        let on = self.txn_on.take();
        if let Some(on) = on {
            if !fatal && !stuck {
                let timeout =
                    Duration::from_millis(self.config.settings.processor.transaction_timeout_ms);
                if let Err(abort) = self.abort(on, timeout.min(Duration::from_secs(5))) {
                    warn!(error = %abort, "abort_transaction failed");
                }
            }
            // Reports of the aborted records are moot now.
            refusals(&self.producers[on]).ok();
        }
        if fatal {
            self.fenced(on.unwrap_or(self.turn))
        } else {
            e
        }
    }

    /// The error for producer `i` fenced: another instance took the shard.
    fn fenced(&self, i: usize) -> Error {
        let processor = &self.config.settings.processor;
        Error::Fenced {
            partition: processor.journal_partition,
            transactional_id: transactional_id(&processor.group_id, processor.journal_partition, i),
        }
    }

    /// The producer the next (or the open) transaction is on.
    fn producer(&self) -> &BaseProducer<Delivery> {
        &self.producers[self.turn]
    }

    fn store_error(&self, e: ksched_store::Error) -> Error {
        if e.is_out_of_space() {
            Error::DiskFull {
                path: self.engine.store().path().display().to_string(),
                detail: e.to_string(),
            }
        } else {
            Error::Store(e)
        }
    }

    /// Aborts the open transaction. Its records still queued or in flight are purged first
    /// and their delivery reports served: librdkafka's abort waits for those reports, and
    /// this thread is the one that serves them (without this, every abort with records
    /// outstanding failed after its timeout and left the transaction to the next instance).
    fn abort(&self, on: usize, timeout: Duration) -> std::result::Result<(), KafkaError> {
        let producer = &self.producers[on];
        let deadline = Instant::now() + timeout;
        producer.purge(rdkafka::producer::PurgeConfig::default().queue().inflight());
        while producer.in_flight_count() > 0 && Instant::now() < deadline {
            crate::topics::serve_deliveries(producer);
        }
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        producer.abort_transaction(left)
    }

    /// The store's size, now and then.
    fn check_size(&mut self) {
        if self.last_size_check.elapsed() > Duration::from_secs(10) {
            self.last_size_check = Instant::now();
            self.status
                .metrics
                .rocksdb_size
                .set(i64::try_from(self.engine.store().size_bytes()).unwrap_or(i64::MAX));
        }
    }

    /// One record decided on, encoded: sent at once in the open transaction, or kept in the
    /// outbox until the transaction begins.
    fn queue(
        &mut self,
        topic: String,
        partition: Option<i32>,
        key: Vec<u8>,
        payload: Vec<u8>,
        trace: Option<String>,
        positions: Option<String>,
    ) -> Result<()> {
        let counters = if topic == self.topics.journal {
            &self.counters.journal
        } else if topic == self.topics.dlq {
            &self.counters.dlq
        } else {
            &self.counters.dispatch
        };
        // The positions header is journal bytes too (a batch's first record carries it).
        let header = positions
            .as_ref()
            .map_or(0, |p| positions::HEADER.len() + p.len());
        counters.count(key.len() + payload.len() + header);
        let o = Outgoing {
            topic,
            partition,
            key,
            payload,
            trace,
            positions,
        };
        if self.open {
            self.produce(o)
        } else {
            self.outbox.push(o);
            Ok(())
        }
    }

    /// Sends one record in the open transaction. A full producer queue is waited out for at
    /// most the transaction timeout; a record the client refuses outright fails at once.
    fn produce(&mut self, o: Outgoing) -> Result<()> {
        let mut record = BaseRecord::to(&o.topic).key(&o.key).payload(&o.payload);
        if let Some(p) = o.partition.filter(|p| *p >= 0) {
            record = record.partition(p);
        }
        if o.trace.is_some() || o.positions.is_some() {
            let mut headers = OwnedHeaders::new();
            if let Some(t) = &o.trace {
                headers = headers.insert(Header {
                    key: trace_context::HEADER,
                    value: Some(t),
                });
            }
            if let Some(p) = &o.positions {
                headers = headers.insert(Header {
                    key: positions::HEADER,
                    value: Some(p),
                });
            }
            record = record.headers(headers);
        }
        let deadline = Instant::now()
            + Duration::from_millis(self.config.settings.processor.transaction_timeout_ms);
        loop {
            match self.producer().send(record) {
                Ok(()) => {
                    self.producer().context().acks.sent();
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r))
                    if Instant::now() < deadline =>
                {
                    crate::topics::serve_deliveries(self.producer());
                    record = r;
                }
                Err((e, _)) => return Err(kafka(format!("producing to {}", o.topic))(e)),
            }
        }
        Ok(())
    }

    fn send_entry(&mut self, entry: &JournalEntry, trace: Option<String>) -> Result<()> {
        let bytes = encode_or_fail(&self.config.framing, &self.topics.journal, entry)?;
        let journal = self.topics.journal.clone();
        let partition = self.config.settings.processor.journal_partition;
        let positions = self.positions_header.take();
        self.queue(
            journal,
            Some(partition),
            entry.key().into_bytes(),
            bytes,
            trace,
            positions,
        )
    }

    fn send_output(&mut self, out: Output) -> Result<()> {
        match out {
            Output::Dispatch {
                pool,
                partition,
                mut record,
                payload_len,
                payload_of,
            } => {
                if payload_len > 0 {
                    record.job.payload = self.payload(&payload_of)?;
                }
                if self.shard.count > 1 {
                    record.reply_partition = self
                        .shard
                        .reply_partition(&record.job.job_id, self.results_partitions);
                }
                let topic = self.topics.dispatch(&pool);
                let bytes = encode_or_fail(&self.config.framing, &topic, record.as_ref())?;
                let trace = self.spans.dispatched(&record, &topic);
                self.queue(
                    topic,
                    Some(partition),
                    record.worker_id.as_bytes().to_vec(),
                    bytes,
                    trace,
                    None,
                )
            }
            Output::CancelDispatch {
                pool,
                partition,
                record,
            } => {
                let topic = self.topics.dispatch(&pool);
                let bytes = encode_or_fail(&self.config.framing, &topic, &record)?;
                self.queue(
                    topic,
                    Some(partition),
                    record.worker_id.into_bytes(),
                    bytes,
                    None,
                    None,
                )
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
                let bytes = encode_or_fail(&self.config.framing, &topic, &dl)?;
                self.queue(topic, None, key.into_bytes(), bytes, None, None)
            }
        }
    }

    /// A job's payload: accepted in this batch or the one in flight (not written yet), or
    /// from the store.
    fn payload(&self, job_id: &str) -> Result<Vec<u8>> {
        if let Some(p) = self
            .engine
            .state()
            .dirty
            .as_ref()
            .and_then(|d| d.payloads.get(job_id))
            .or_else(|| self.in_flight.as_ref()?.pending.payload(job_id))
            .or_else(|| self.engine.payload_being_written(job_id))
        {
            return Ok(p.clone());
        }
        self.engine.store().payload(job_id)?.ok_or_else(|| {
            Error::Store(ksched_store::Error::Decode {
                what: format!("the payload of job {job_id}"),
                detail: "it is missing".into(),
            })
        })
    }

    /// The projection, for tests and the HTTP API.
    pub fn state(&self) -> &State {
        self.engine.state()
    }
}

/// Status and metrics once a batch's projection is written (on the engine's writing thread).
fn written(status: &Status, watermark: Option<i64>) {
    if let Some(w) = watermark {
        status.watermark.store(w, Ordering::Relaxed);
        status.metrics.watermark.set(w);
    }
    status
        .last_commit_ms
        .store(wall_clock_ms(), Ordering::Relaxed);
}

/// `linger.ms` of the processor's transactional producers, unless the client properties set
/// it (or its alias `queue.buffering.max.ms`): records decided in the same few milliseconds
/// go to the broker in one request.
const PROCESSOR_LINGER_MS: &str = "2";

/// The configuration of a processor's transactional producer: the client properties, then
/// what the processor needs (the properties may change `linger.ms` and `retry.backoff.ms`,
/// not the rest).
/// How long the broker may hold an input fetch that finds nothing new, unless
/// `kafka.properties` sets `fetch.wait.max.ms`. Kafka's own default. It costs no latency: with
/// `fetch.min.bytes` 1 the broker answers as soon as a record is there, a read_committed fetch
/// as soon as a commit's markers move the last stable offset (a parked fetch was answered
/// 0.5 ms after the commit: docs/performance.md, twenty-second steps). It bounds only how
/// often an idle shard asks: at the 10 ms it had before, 100 empty fetches a second each.
const INPUT_FETCH_WAIT_MS: &str = "500";

/// The input consumer's settings: offsets only (the partitions are assigned by hand, every
/// shard reading the heartbeats and control topics whole, and the shard's transactional id,
/// not the group, fences an older instance of it), read_committed.
fn input_consumer_config(settings: &Settings, group: &str) -> ClientConfig {
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

fn transactional_producer_config(settings: &Settings, id: &str, client_id: &str) -> ClientConfig {
    let mut cfg = client_config(settings);
    if cfg.get("linger.ms").is_none() && cfg.get("queue.buffering.max.ms").is_none() {
        cfg.set("linger.ms", PROCESSOR_LINGER_MS);
    }
    transactional_retry_backoff(&mut cfg)
        .set("client.id", client_id)
        .set("transactional.id", id)
        .set("enable.idempotence", "true")
        .set(
            "transaction.timeout.ms",
            settings.processor.transaction_timeout_ms.to_string(),
        )
        .set("queue.buffering.max.messages", "1000000")
        .set("compression.type", "lz4")
        // A record to a topic or partition that does not exist fails within seconds
        // instead of waiting out the transaction.
        .set("topic.metadata.propagation.max.ms", "5000");
    cfg
}

/// A transactional producer for the processor, its id initialised: an older instance with
/// the same id is fenced, and a transaction it left open is aborted.
fn transactional_producer(
    config: &Config,
    id: &str,
    client_id: &str,
    delivery: Delivery,
) -> Result<BaseProducer<Delivery>> {
    let settings = &config.settings;
    let producer: BaseProducer<Delivery> = transactional_producer_config(settings, id, client_id)
        .create_with_context(delivery)
        .map_err(kafka("creating the transactional producer"))?;
    let timeout = Duration::from_millis(settings.processor.transaction_timeout_ms);
    producer.init_transactions(timeout).map_err(|e| {
        if is_fenced(&e) {
            Error::Fenced {
                partition: settings.processor.journal_partition,
                transactional_id: id.to_owned(),
            }
        } else {
            kafka(format!("init_transactions for {id}"))(e)
        }
    })?;
    Ok(producer)
}

/// Delivery failures of the open transaction's records, as an error (and cleared).
fn refusals(producer: &BaseProducer<Delivery>) -> Result<()> {
    let failures = std::mem::take(
        &mut *producer
            .context()
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner()),
    );
    let Some((topic, code, text)) = failures
        .iter()
        .find(|(_, c, _)| refused_for_what_it_is(*c))
        .or(failures.first())
        .cloned()
    else {
        return Ok(());
    };
    Err(kafka(format!(
        "producing to {topic} ({} of the transaction's records failed; first: {text})",
        failures.len()
    ))(KafkaError::MessageProduction(code)))
}

/// Waits until every record of the transaction is acknowledged (and reported on).
///
/// `commit_transaction` would flush too, but rust-rdkafka's flush polls in 100 ms steps
/// (`BaseProducer::poll` blocks for its whole timeout), which put ~100 ms on every commit:
/// waiting here leaves the commit nothing to flush. The reports are served by the producer's
/// own thread ([`serve_deliveries_behind`]), which wakes this one when the last comes in:
/// one sleep per transaction, where serving them here took a nap of
/// [`DELIVERY_NAP`](crate::topics::DELIVERY_NAP) per check (20-35 per transaction, each a
/// context switch that cost this virtual machine more than the check).
fn await_deliveries(producer: &BaseProducer<Delivery>, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let unacknowledged = || Error::Unacknowledged {
        records: producer.in_flight_count(),
        timeout,
    };
    if !producer.context().acks.wait(deadline) {
        return Err(unacknowledged());
    }
    // The last report is served; librdkafka releases its event (and stops counting the
    // records in flight) as the callback returns, microseconds later.
    while producer.in_flight_count() > 0 {
        if Instant::now() > deadline {
            return Err(unacknowledged());
        }
        std::thread::sleep(DELIVERY_SETTLE);
    }
    Ok(())
}

/// How long [`await_deliveries`] naps while librdkafka lets go of the last report.
const DELIVERY_SETTLE: Duration = Duration::from_micros(20);

/// How long each poll of a producer's reporting thread lasts: it notices the producer is
/// gone at most this late. rust-rdkafka rounds a poll's time left down to whole
/// milliseconds, so each poll's last millisecond is a busy loop: 0.2 % of a core here.
const DELIVERY_POLL: Duration = Duration::from_millis(500);

/// Starts the thread that serves `producer`'s delivery reports as they come (see
/// [`await_deliveries`]), its CPU time counted in `cpu` with the processor's. It ends
/// within [`DELIVERY_POLL`] once the processor lets go of the producer (and destroys it
/// then, if it held the last reference).
fn serve_deliveries_behind(producer: &Arc<BaseProducer<Delivery>>, cpu: Counter) -> Result<()> {
    let producer: Weak<BaseProducer<Delivery>> = Arc::downgrade(producer);
    spawn_counted("ksched-acks", "a delivery report thread", cpu, move || {
        producer.upgrade().map(|p| p.poll(DELIVERY_POLL)).is_some()
    })
}

/// Encodes a record the processor writes; a value that does not encode is refused like a
/// record the broker refuses (it is the input's, not the broker's, problem).
fn encode_or_fail<T: Record>(framing: &Framing, topic: &str, value: &T) -> Result<Vec<u8>> {
    framing.encode(topic, value).map_err(|e| {
        kafka(format!("producing {} (it does not encode: {e})", T::NAME))(
            KafkaError::MessageProduction(RDKafkaErrorCode::InvalidMessage),
        )
    })
}

/// The log time a Reconfigure is decided at: the scheduler's own time (the last entry's),
/// never a host's clock. A host clock ahead of the broker would otherwise move scheduler
/// time forward and shift every timer judged after it.
fn reconfigure_time(state: &ksched_core::state::State) -> i64 {
    state.clock
}

/// The processor's record counters, resolved once.
struct Counters {
    jobs: RecordCounters,
    results: RecordCounters,
    control: RecordCounters,
    heartbeats: RecordCounters,
    journal: RecordCounters,
    dispatch: RecordCounters,
    dlq: RecordCounters,
}

impl Counters {
    fn new(m: &crate::metrics::Metrics) -> Counters {
        Counters {
            jobs: m.record_counters("in", InputKind::Jobs.as_str()),
            results: m.record_counters("in", InputKind::Results.as_str()),
            control: m.record_counters("in", InputKind::Control.as_str()),
            heartbeats: m.record_counters("in", InputKind::Heartbeats.as_str()),
            journal: m.record_counters("out", "journal"),
            dispatch: m.record_counters("out", "dispatch"),
            dlq: m.record_counters("out", "dlq"),
        }
    }

    fn input(&self, kind: InputKind) -> &RecordCounters {
        match kind {
            InputKind::Jobs => &self.jobs,
            InputKind::Results => &self.results,
            InputKind::Control => &self.control,
            InputKind::Heartbeats => &self.heartbeats,
        }
    }
}

/// Times the phases of a batch into `ksched_batch_phase_seconds_total` (one phase at a time;
/// a phase left by an error is not counted).
struct Phase<'a> {
    counters: &'a prometheus::CounterVec,
    name: &'static str,
    since: Instant,
}

impl<'a> Phase<'a> {
    fn start(counters: &'a prometheus::CounterVec, name: &'static str) -> Phase<'a> {
        Phase {
            counters,
            name,
            since: Instant::now(),
        }
    }

    /// Ends the current phase and starts `name`.
    fn next(&mut self, name: &'static str) {
        self.end();
        self.name = name;
        self.since = Instant::now();
    }

    fn end(&self) {
        self.counters
            .with_label_values(&[self.name])
            .inc_by(self.since.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Reconfigure is decided at scheduler time, never at the host's: a host clock ahead
    /// of the broker would move every timer judged after it.
    #[test]
    fn a_reconfigure_is_decided_at_the_schedulers_time_not_the_hosts() {
        let mut state = State::new();
        state.clock = 1_000;
        assert_eq!(reconfigure_time(&state), 1_000);
        assert!(
            wall_clock_ms() > 1_000_000,
            "the host's clock is not what decides"
        );
    }

    /// The transaction's end waits until the reports catch up with the sends: not before
    /// (a record sent and not reported keeps it waiting until its deadline), and it is woken
    /// by the report that catches up, from the thread that serves them.
    #[test]
    fn waiting_for_acknowledgements_ends_with_the_last_report() {
        let acks = Arc::new(Acks::default());
        assert!(
            acks.wait(Instant::now()),
            "nothing sent: nothing to wait for"
        );
        acks.sent();
        acks.sent();
        acks.reported();
        assert!(
            !acks.wait(Instant::now() + Duration::from_millis(50)),
            "one of two records is not reported on"
        );
        let reporter = {
            let acks = acks.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                acks.reported();
            })
        };
        assert!(
            acks.wait(Instant::now() + Duration::from_secs(30)),
            "the last report ends the wait"
        );
        reporter.join().unwrap();
        // Reports of records sent later (the next transaction) are waited for in turn.
        acks.sent();
        assert!(!acks.wait(Instant::now() + Duration::from_millis(20)));
        acks.reported();
        assert!(acks.wait(Instant::now()));
    }

    /// A call that librdkafka does not return from is given up on after its limit, and the
    /// processor thread is free again (before, it waited forever in
    /// send_offsets_to_transaction after a broker holding a coordinator was killed).
    #[test]
    fn a_transactional_call_that_hangs_is_given_up_on() {
        let caller = Caller::start(cpu_counter()).unwrap();
        let seven = caller.run(|| 7).unwrap();
        assert_eq!(seven.recv_timeout(Duration::from_secs(5)).ok(), Some(7));
        let started = Instant::now();
        let hung = caller
            .run(|| std::thread::sleep(Duration::from_secs(3)))
            .unwrap();
        assert!(hung.recv_timeout(Duration::from_millis(200)).is_err());
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    /// Settings whose `kafka.properties` are `props`.
    fn settings_with(props: &[(&str, &str)]) -> Settings {
        let mut settings = Settings::default();
        for (k, v) in props {
            settings
                .kafka
                .properties
                .insert((*k).to_owned(), (*v).to_owned());
        }
        settings
    }

    /// An idle input fetch waits 500 ms at the broker unless the client properties say
    /// otherwise (before, 10 ms, and the processor set it after the properties).
    #[test]
    fn an_idle_input_fetch_waits_half_a_second_unless_the_properties_say() {
        let wait = |props: &[(&str, &str)]| {
            let cfg = input_consumer_config(&settings_with(props), "g");
            assert_eq!(cfg.get("isolation.level"), Some("read_committed"));
            assert_eq!(cfg.get("group.id"), Some("g"));
            cfg.get("fetch.wait.max.ms").map(str::to_owned)
        };
        assert_eq!(wait(&[]), Some("500".to_owned()));
        assert_eq!(wait(&[("fetch.wait.max.ms", "50")]), Some("50".to_owned()));
    }

    /// The processor's producer lingers 2 ms unless the client properties say otherwise
    /// (before, its `linger.ms` could not be changed: the processor set it after the
    /// properties).
    #[test]
    fn the_transactional_producer_lingers_as_the_properties_say() {
        let linger = |props: &[(&str, &str)]| {
            let settings = settings_with(props);
            let cfg = transactional_producer_config(&settings, "ksched-journal-0", "c");
            (
                cfg.get("linger.ms").map(str::to_owned),
                cfg.get("transactional.id").map(str::to_owned),
            )
        };
        let id = Some("ksched-journal-0".to_owned());
        assert_eq!(
            linger(&[]),
            (Some(PROCESSOR_LINGER_MS.to_owned()), id.clone())
        );
        assert_eq!(
            linger(&[("linger.ms", "0.5")]),
            (Some("0.5".to_owned()), id.clone())
        );
        assert_eq!(
            linger(&[("queue.buffering.max.ms", "5")]),
            (None, id.clone())
        );
        // What the processor needs is not the properties' to change.
        assert_eq!(linger(&[("transactional.id", "other")]).1, id);
    }

    fn cpu_counter() -> Counter {
        Counter::new("cpu", "test").unwrap()
    }

    /// The transaction thread's CPU is the processor's: it serves the delivery reports and
    /// the commit calls that the deciding thread once made itself (before, it went
    /// uncounted, and processor CPU per job looked smaller than it was).
    #[test]
    fn the_transaction_threads_cpu_is_counted_as_the_processors() {
        let cpu = cpu_counter();
        let caller = Caller::start(cpu.clone()).unwrap();
        let worked = caller
            .run(|| {
                let clock0 = crate::metrics::thread_cpu_seconds().unwrap();
                let mut x = 0u64;
                while crate::metrics::thread_cpu_seconds().unwrap() - clock0 < 0.03 {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                x
            })
            .unwrap();
        assert!(worked.recv_timeout(Duration::from_secs(10)).is_ok());
        // The count is added after the call has sent its result: wait for it briefly.
        let until = Instant::now() + Duration::from_secs(5);
        while cpu.get() < 0.03 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            cpu.get() >= 0.03,
            "{} s counted for 30 ms of work",
            cpu.get()
        );
    }
}
