//! The batch loop: collect input records, decide each, commit the batch's transaction;
//! a failed batch is isolated input by input.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ksched_core::decide::Ctx;
use ksched_core::events::{Cause, Input};
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{debug, error, info, warn};

use super::Processor;
use super::assignment::{ASSIGNMENT_REFRESH, INPUTS_REFRESH};
use super::transaction::panic_text;
use crate::clock::wall_clock_ms;
use crate::error::{Coords, Error, Result, kafka, refused_for_what_it_is};
use crate::inputs::{
    InputRecord, Taken, refuse_for_disk, set_aside, skips_records, take, unreadable_input,
};
use crate::job_trace::Traced;
use crate::metrics::RecordCounters;
use crate::positions::{self};
use crate::shard::Takes;
use crate::status::Status;
use crate::topics::InputKind;

impl Processor {
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

    pub(super) fn collect(&mut self, recovery: &mut Recovery) -> Result<Vec<InputRecord>> {
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
            Takes::IfItHoldsSchedule(key) => {
                if !self.engine.state().schedules.contains_key(&key) {
                    return Ok(());
                }
            }
            Takes::IfItHoldsBatch(tenant, batch) => {
                if !self.engine.state().batches.contains_key(&(tenant, batch)) {
                    return Ok(());
                }
            }
        }
        // A new job while the disk is short of its reserve: refused, with its id. A job the
        // state holds already is decided as ever (a duplicate of it).
        let input = match input {
            Input::Submit(r) => match self.disk.short() {
                Some(free) if !self.engine.knows_job(&r.job_id)? => {
                    refuse_for_disk(rec, &r, free, self.disk.min_free())
                }
                _ => Input::Submit(r),
            },
            other => other,
        };
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
    pub(super) fn process_input(
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
}

/// Most continuation entries one input may add in its own transaction; further work waits
/// for the next Tick (which continues it anyway).
const MAX_CONTINUATIONS: usize = 1_000;

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

    pub(super) fn passed(&mut self, rec: &InputRecord) {
        let k = (rec.topic.clone(), rec.partition);
        if self.isolate.get(&k).is_some_and(|last| rec.offset >= *last) {
            self.isolate.remove(&k);
        }
    }
}

/// The inputs of a transaction, for what follows its end.
pub(super) struct Batch {
    pub(super) inputs: Vec<InputRecord>,
    /// Per input partition, the last offset in the batch.
    ranges: BTreeMap<(String, i32), i64>,
    pub(super) started: Instant,
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
    pub(super) fn blame(&self, e: Error) -> Error {
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

/// Status and metrics once a batch's projection is written (on the engine's writing thread).
pub(super) fn written(status: &Status, watermark: Option<i64>) {
    if let Some(w) = watermark {
        status.watermark.store(w, Ordering::Relaxed);
        status.metrics.watermark.set(w);
    }
    status
        .last_commit_ms
        .store(wall_clock_ms(), Ordering::Relaxed);
}

/// The processor's record counters, resolved once.
pub(super) struct Counters {
    jobs: RecordCounters,
    results: RecordCounters,
    control: RecordCounters,
    heartbeats: RecordCounters,
    pub(super) journal: RecordCounters,
    pub(super) dispatch: RecordCounters,
    pub(super) dlq: RecordCounters,
}

impl Counters {
    pub(super) fn new(m: &crate::metrics::Metrics) -> Counters {
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
pub(super) struct Phase<'a> {
    counters: &'a prometheus::CounterVec,
    name: &'static str,
    since: Instant,
}

impl<'a> Phase<'a> {
    pub(super) fn start(counters: &'a prometheus::CounterVec, name: &'static str) -> Phase<'a> {
        Phase {
            counters,
            name,
            since: Instant::now(),
        }
    }

    /// Ends the current phase and starts `name`.
    pub(super) fn next(&mut self, name: &'static str) {
        self.end();
        self.name = name;
        self.since = Instant::now();
    }

    pub(super) fn end(&self) {
        self.counters
            .with_label_values(&[self.name])
            .inc_by(self.since.elapsed().as_secs_f64());
    }
}
