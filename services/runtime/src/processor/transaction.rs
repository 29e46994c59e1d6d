//! The batch's transaction: open, produce, send the offsets, commit or abort on the caller
//! thread (with its guard against a call that hangs), and the producers' delivery reports.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use prometheus::Counter;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, ClientContext, TopicPartitionList};
use tracing::{debug, error, warn};

use super::Processor;
use super::batch::{Batch, Phase, Recovery, written};
use crate::error::{Error, Result, kafka, refused_for_what_it_is};
use crate::metrics::spawn_counted;
use crate::settings::{Config, Settings};
use crate::topics::{client_config, transactional_retry_backoff};

impl Processor {
    /// Begins a transaction, and sends what waits in the outbox; from now on records go out
    /// as they are decided. Nothing may be in flight.
    pub(super) fn open(&mut self) -> Result<()> {
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
    pub(super) fn end(&mut self, offsets: Option<TopicPartitionList>, batch: Batch) -> Result<()> {
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
    pub(super) fn try_settle(&mut self, recovery: &mut Recovery) -> Result<()> {
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
    pub(super) fn settle(&mut self, recovery: &mut Recovery) -> Result<()> {
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
    pub(super) fn drain(&mut self, recovery: &mut Recovery) -> Result<()> {
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
    pub(super) fn fail(&self, e: Error) -> Error {
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
    pub(super) fn producer(&self) -> &BaseProducer<Delivery> {
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
}

/// Transactional producers a shard's processor may use in turn (ids `<id>` and `<id>-b`).
pub(super) const MAX_TRANSACTIONAL_PRODUCERS: usize = 2;

/// The transactional id of a shard's producer `i`: `<group>-journal-<shard>` for the first,
/// the shard's own (the processor's name, and the id whose fences say another instance holds
/// the shard: see `run_shard`), the same with `-b` for the second.
pub(crate) fn transactional_id(group_id: &str, shard: i32, i: usize) -> String {
    let suffix = if i == 0 { "" } else { "-b" };
    format!("{group_id}-journal-{shard}{suffix}")
}

/// Collects a producer's delivery reports: the last journal offset written (shared by the
/// processor's producers, so that it only moves forward whichever producer commits), and
/// refusals.
pub(super) struct Delivery {
    pub(super) journal: String,
    pub(super) partition: i32,
    pub(super) last_journal_offset: Arc<AtomicI64>,
    pub(super) failures: Mutex<Vec<(String, RDKafkaErrorCode, String)>>,
    pub(super) acks: Acks,
}

/// Records sent and records reported on, so that a transaction's end waits for its last
/// acknowledgement in one sleep: the producer's reporting thread
/// ([`serve_deliveries_behind`]) wakes it when the reports catch up with the sends.
#[derive(Default)]
pub(super) struct Acks {
    sent: AtomicU64,
    reported: Mutex<u64>,
    caught_up: Condvar,
}

impl Acks {
    pub(super) fn sent(&self) {
        self.sent.fetch_add(1, Ordering::SeqCst);
    }

    pub(super) fn reported(&self) {
        let mut reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        *reported += 1;
        // Only the report that catches up wakes anyone: not a system call per record.
        if *reported >= self.sent.load(Ordering::SeqCst) {
            self.caught_up.notify_all();
        }
    }

    /// Waits until every record sent so far is reported on, or `deadline` passes; whether
    /// they are.
    pub(super) fn wait(&self, deadline: Instant) -> bool {
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

/// A transaction finishing on the caller thread.
pub(super) struct InFlight {
    /// The last journal offset delivered, once committed.
    done: std::sync::mpsc::Receiver<Result<i64>>,
    deadline: Instant,
    limit: Duration,
    /// The batch's projection changes, written once it committed.
    pub(super) pending: crate::engine::Pending,
    batch: Batch,
}

/// A thread that makes the producers' transactional calls for the processor, so that one
/// librdkafka does not return from holds up this thread only.
pub(super) struct Caller {
    calls: std::sync::mpsc::Sender<Call>,
}

/// One call for the [`Caller`]'s thread.
type Call = Box<dyn FnOnce() + Send>;

impl Caller {
    /// `cpu` counts the thread's CPU time: the transaction's calls, and the delivery reports
    /// they serve, are the processor's work as much as deciding is.
    pub(super) fn start(cpu: Counter) -> Result<Caller> {
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
    pub(super) fn run<T: Send + 'static>(
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
pub(super) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// `linger.ms` of the processor's transactional producers, unless the client properties set
/// it (or its alias `queue.buffering.max.ms`): records decided in the same few milliseconds
/// go to the broker in one request.
pub(super) const PROCESSOR_LINGER_MS: &str = "2";

/// The configuration of a processor's transactional producer: the client properties, then
/// what the processor needs (the properties may change `linger.ms` and `retry.backoff.ms`,
/// not the rest).
pub(super) fn transactional_producer_config(
    settings: &Settings,
    id: &str,
    client_id: &str,
) -> ClientConfig {
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
pub(super) fn transactional_producer(
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
pub(super) fn serve_deliveries_behind(
    producer: &Arc<BaseProducer<Delivery>>,
    cpu: Counter,
) -> Result<()> {
    let producer: Weak<BaseProducer<Delivery>> = Arc::downgrade(producer);
    spawn_counted("ksched-acks", "a delivery report thread", cpu, move || {
        producer.upgrade().map(|p| p.poll(DELIVERY_POLL)).is_some()
    })
}
