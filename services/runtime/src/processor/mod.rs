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

mod assignment;
mod batch;
mod outputs;
mod transaction;

use std::cell::Cell;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ksched_core::events::{Cause, Input};
use ksched_core::state::State;
use ksched_policy::RegoEngine;
use ksched_store::Store;
use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::BaseProducer;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::inputs::{ReadThrough, Unreadable};
use crate::job_trace::JobSpans;
use crate::positions::Positions;
use crate::replay::{Flow, Replayer, journal_watermarks, read_journal};
use crate::settings::Config;
use crate::shard::Shard;
use crate::status::Status;
use crate::topics::Topics;
use assignment::InputContext;
pub use batch::Recovery;
use batch::{Batch, Counters};
use outputs::Outgoing;
pub(crate) use transaction::transactional_id;
use transaction::{
    Acks, Caller, Delivery, InFlight, MAX_TRANSACTIONAL_PRODUCERS, serve_deliveries_behind,
    transactional_producer,
};

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
    /// Free disk under the store: new jobs are refused while it is short (disk.rs).
    disk: crate::disk::DiskReserve,
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

impl std::fmt::Debug for Processor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processor")
            .field("transactional_id", &self.transactional_id)
            .finish_non_exhaustive()
    }
}

/// The log time a Reconfigure is decided at: the scheduler's own time (the last entry's),
/// never a host's clock. A host clock ahead of the broker would otherwise move scheduler
/// time forward and shift every timer judged after it.
fn reconfigure_time(state: &ksched_core::state::State) -> i64 {
    state.clock
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
        let mut disk = crate::disk::DiskReserve::new(
            config.settings.storage.data_dir.clone(),
            config.settings.storage.min_free_disk_bytes,
        );
        // Read once at start, so a disk already short is said at once, not at the first job.
        disk.short();
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
            disk,
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
            self.engine.store(),
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

    /// The projection, for tests and the HTTP API.
    pub fn state(&self) -> &State {
        self.engine.state()
    }
}

#[cfg(test)]
mod tests;
