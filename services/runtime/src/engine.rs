//! The one engine step every path takes: the live processor, its recovery, `audit rebuild`,
//! `audit at`, `audit verify` and the benches.
//!
//! An [`Engine`] is the scheduler's state over its RocksDB projection. Three steps, each
//! written once:
//!
//! - [`Engine::decide`]: load the cold records deciding on an input may read, then decide
//!   (the core applies each event as it is decided);
//! - [`Engine::fold`]: load what a journal entry touches, then apply it;
//! - [`Engine::checkpoint`]: write the keys that changed with the journal watermark, then
//!   evict what is cold (terminal jobs, old idempotency keys, idle sagas) from memory.
//!
//! Which step runs when is the caller's: the processor checkpoints after each committed
//! transaction; replays checkpoint when [`Engine::checkpoint_due`] says so. Both write their
//! checkpoints behind ([`Engine::write_behind`]): on the engine's writing thread, while the
//! next batch is decided or folded.

use ksched_core::apply_entry;
use ksched_core::decide::{Ctx, Processed, continuation, process};
use ksched_core::events::{Cause, Input, JournalEntry};
use ksched_core::records::Millis;
use ksched_core::state::State;
use ksched_store::Store;
use prometheus::Counter;

use crate::error::Result;

/// Entries decided or folded between two checkpoints of a replay.
pub const CHECKPOINT_EVERY: u64 = 5_000;

/// A batch of changes to the projection, prepared and not written yet.
#[derive(Debug)]
pub struct Pending {
    batch: ksched_store::Prepared,
    /// Payloads of jobs accepted in the batch: a dispatch decided before the batch is
    /// written reads its payload here.
    payloads: std::collections::BTreeMap<String, Vec<u8>>,
}

impl Pending {
    pub fn payload(&self, job_id: &str) -> Option<&Vec<u8>> {
        self.payloads.get(job_id)
    }
}

/// The scheduler's state over its projection.
#[derive(Debug)]
pub struct Engine {
    store: Store,
    state: State,
    /// Entries decided or folded since the last checkpoint.
    since_checkpoint: u64,
    /// The thread that writes checkpoints behind ([`Engine::write_behind`]), once started.
    writer: Option<Writer>,
    /// Whose CPU the writing thread's time counts as (the processor's), if anyone's.
    writer_cpu: Option<Counter>,
    /// The checkpoint being written behind, if one is.
    writing: Option<Writing>,
}

/// A checkpoint handed to the writing thread and not known to be written yet.
#[derive(Debug)]
struct Writing {
    /// The write's outcome, or the panic it raised (raised again on the engine's thread).
    done: std::sync::mpsc::Receiver<std::thread::Result<Result<(), ksched_store::Error>>>,
    /// Its payloads, readable until it is written ([`Engine::payload_being_written`]).
    payloads: std::collections::BTreeMap<String, Vec<u8>>,
}

/// One write for the writing thread.
type WriteJob = Box<dyn FnOnce() + Send>;

/// The engine's writing thread: runs the writes handed to it, one at a time, in order. It
/// ends when the engine lets go of it.
#[derive(Debug)]
struct Writer {
    jobs: std::sync::mpsc::Sender<WriteJob>,
}

impl Writer {
    fn start(cpu: Option<Counter>) -> Result<Writer> {
        let (jobs, rx) = std::sync::mpsc::channel::<WriteJob>();
        let step = move || rx.recv().map(|job| job()).is_ok();
        match cpu {
            Some(cpu) => crate::metrics::spawn_counted(
                "ksched-writer",
                "the projection's writing thread",
                cpu,
                step,
            )?,
            None => {
                std::thread::Builder::new()
                    .name("ksched-writer".into())
                    .spawn(move || while step() {})
                    .map_err(crate::error::io("starting the projection's writing thread"))?;
            }
        }
        Ok(Writer { jobs })
    }
}

impl Engine {
    /// Continues the projection in `store` from its last checkpoint: the jobs that are not
    /// queued, the queued ones' counts, and each lane's first keys and records (what the
    /// first decision reads, read before it so that queries see the queues' heads too).
    pub fn open(store: Store) -> Result<Engine> {
        let mut state = store.load_state()?;
        state.refill_windows(&store)?;
        Ok(Engine::with_state(store, state))
    }

    /// Continues from a state already in memory.
    pub fn with_state(store: Store, state: State) -> Engine {
        Engine {
            store,
            state,
            since_checkpoint: 0,
            writer: None,
            writer_cpu: None,
            writing: None,
        }
    }

    /// Counts the CPU time of the writing thread in `cpu` (call before the first write
    /// behind).
    pub fn count_writer_cpu(&mut self, cpu: Counter) {
        self.writer_cpu = Some(cpu);
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The store, once a checkpoint written behind is in it.
    pub fn into_store(mut self) -> Result<Store> {
        self.finish_writing()?;
        // A handle on the same database: the engine goes with nothing left to write.
        Ok(self.store.clone())
    }

    /// Decides on `input` read at `log_time` from `cause`: loads what the decision may read,
    /// then decides; the state holds the result.
    pub fn decide(
        &mut self,
        ctx: &Ctx<'_>,
        cause: Cause,
        log_time: Millis,
        input: Input,
    ) -> Result<Processed> {
        self.state.load_for_input(&input, &self.store)?;
        self.since_checkpoint += 1;
        Ok(process(&mut self.state, ctx, cause, log_time, input))
    }

    /// Decides again on the input of a journaled entry (`audit verify`): loads what the input
    /// and the recorded entry touch, then decides. Returns the entry decided now.
    pub fn decide_again(&mut self, ctx: &Ctx<'_>, recorded: &JournalEntry) -> Result<JournalEntry> {
        self.state.load_for_entry(recorded, &self.store)?;
        let p = self.decide(
            ctx,
            recorded.cause.clone(),
            recorded.log_time,
            recorded.input.clone(),
        )?;
        Ok(p.entry)
    }

    /// Whether this shard holds `job_id` (in memory or in its store), terminal or not.
    pub fn knows_job(&self, job_id: &str) -> Result<bool> {
        Ok(self.state.jobs.contains_key(job_id) || self.store.job(job_id)?.is_some())
    }

    /// The input that continues work an entry cut at its bound.
    pub fn continuation(&self) -> Input {
        continuation(&self.state)
    }

    /// Folds a journal entry into the state: loads what it touches, applies its events.
    pub fn fold(&mut self, entry: &JournalEntry) -> Result<()> {
        self.state.load_for_entry(entry, &self.store)?;
        apply_entry(&mut self.state, entry);
        self.since_checkpoint += 1;
        Ok(())
    }

    /// Whether a replay has folded enough since its last checkpoint to write one.
    pub fn checkpoint_due(&self) -> bool {
        self.since_checkpoint >= CHECKPOINT_EVERY
    }

    /// Writes every key that changed since the last checkpoint, with `watermark` (the last
    /// journal offset the state reflects), then evicts cold records from memory.
    pub fn checkpoint(&mut self, watermark: Option<i64>) -> Result<(), ksched_store::Error> {
        let pending = self.prepare()?;
        self.write(pending, watermark)?;
        self.evict();
        Ok(())
    }

    /// The first half of a checkpoint, for the processor's pipeline: takes the keys that
    /// changed and encodes them as the state holds them now (the payloads accepted stay
    /// readable until written, see [`Pending::payload`]). The batch must be written
    /// ([`Engine::write`] or [`Engine::write_behind`]) before the next one is prepared, and
    /// nothing may be evicted in between ([`Engine::evict_written`] once it is written).
    /// Waits first for a checkpoint being written behind.
    pub fn prepare(&mut self) -> Result<Pending, ksched_store::Error> {
        self.finish_writing()?;
        let mut dirty = self.state.take_dirty();
        let batch = self.store.prepare(&self.state, &mut dirty)?;
        Ok(Pending {
            batch,
            payloads: dirty.payloads,
        })
    }

    /// [`Engine::prepare`] for an owner that writes behind: waits until the previous batch
    /// is written, drops from memory what that one made cold (not what changed since:
    /// [`State::evict_written`]), then prepares what changed.
    pub fn prepare_next(&mut self) -> Result<Pending, ksched_store::Error> {
        self.finish_writing()?;
        self.state.evict_written();
        self.prepare()
    }

    /// The second half: writes a prepared batch with `watermark`.
    pub fn write(
        &self,
        pending: Pending,
        watermark: Option<i64>,
    ) -> Result<(), ksched_store::Error> {
        self.store.write(pending.batch, watermark)
    }

    /// Evicts cold records from memory but those changed since the last batch was prepared
    /// ([`State::evict_written`]); only once everything prepared was written. The
    /// processor's eviction under load, with a batch decided and not prepared yet.
    pub fn evict_written(&mut self) {
        self.state.evict_written();
    }

    /// Evicts cold records from memory; only once everything prepared was written.
    pub fn evict(&mut self) {
        self.state.evict_cold();
        self.since_checkpoint = 0;
    }

    /// A replay's checkpoint, written behind while the replay folds on. Waits until the
    /// previous one is written, drops from memory what that one made cold (not what changed
    /// since: [`State::evict_written`]), then hands what changed to the writing thread with
    /// `watermark` ([`Engine::write_behind`]).
    pub fn checkpoint_behind(&mut self, watermark: Option<i64>) -> Result<()> {
        let pending = self.prepare_next()?;
        self.write_behind(pending, watermark, || {})?;
        self.since_checkpoint = 0;
        Ok(())
    }

    /// Writes a prepared batch with `watermark` on the engine's writing thread, then runs
    /// `then` there; returns at once. The next [`Engine::prepare`] and
    /// [`Engine::finish_writing`] wait for it (an error writing it is theirs), and so does
    /// dropping the engine: a write never lands after its engine is gone.
    ///
    /// What is decided or folded meanwhile reads right: a record in the batch being written
    /// stays in memory until [`Engine::evict_written`] after it is written, one evicted
    /// earlier is in the store, and the batch's payloads are at
    /// [`Engine::payload_being_written`].
    pub fn write_behind(
        &mut self,
        pending: Pending,
        watermark: Option<i64>,
        then: impl FnOnce() + Send + 'static,
    ) -> Result<()> {
        self.finish_writing()?;
        if self.writer.is_none() {
            self.writer = Some(Writer::start(self.writer_cpu.clone())?);
        }
        let (tx, done) = std::sync::mpsc::sync_channel(1);
        let store = self.store.clone();
        let batch = pending.batch;
        let job: WriteJob = Box::new(move || {
            let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let written = store.write(batch, watermark);
                if written.is_ok() {
                    then();
                }
                written
            }));
            let _ = tx.send(written);
        });
        let sent = self
            .writer
            .as_ref()
            .is_some_and(|w| w.jobs.send(job).is_ok());
        if !sent {
            self.writer = None;
            return Err(crate::error::Error::Invariant(
                "the projection's writing thread is gone",
            ));
        }
        self.writing = Some(Writing {
            done,
            payloads: pending.payloads,
        });
        Ok(())
    }

    /// A payload accepted in the batch being written behind, until it is written.
    pub fn payload_being_written(&self, job_id: &str) -> Option<&Vec<u8>> {
        self.writing.as_ref()?.payloads.get(job_id)
    }

    /// Waits for a checkpoint being written behind, if there is one.
    pub fn finish_writing(&mut self) -> Result<(), ksched_store::Error> {
        match self.writing.take() {
            None => Ok(()),
            Some(writing) => match writing.done.recv() {
                Ok(Ok(written)) => written,
                Ok(Err(panic)) => std::panic::resume_unwind(panic),
                // The writing thread runs every job it is handed and answers each: it cannot
                // end with one unanswered.
                Err(_) => unreachable!("the projection's writing thread ended before its write"),
            },
        }
    }

    /// Drops the state in memory and loads the working set of the last checkpoint again.
    pub fn reload(&mut self) -> Result<()> {
        self.finish_writing()?;
        self.state = self.store.load_state()?;
        self.state.refill_windows(&self.store)?;
        self.since_checkpoint = 0;
        Ok(())
    }
}

impl Drop for Engine {
    /// Waits for a write behind: the next engine on the same store (the supervisor's restart)
    /// must not load it while a batch of this one still lands.
    fn drop(&mut self) {
        // Not `finish_writing`: a panic raised again here could be a second one.
        let Some(writing) = self.writing.take() else {
            return;
        };
        match writing.done.recv() {
            Ok(Ok(Ok(()))) | Err(_) => {}
            Ok(Ok(Err(e))) => tracing::warn!(
                error = %e,
                "the last projection write behind failed; the next start applies the journal from the watermark before it"
            ),
            Ok(Err(_)) => tracing::warn!(
                "the last projection write behind panicked; the next start applies the journal from the watermark before it"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use ksched_core::policy::AllowAll;
    use ksched_core::records::{Heartbeat, JobRequest, JobResult};
    use ksched_core::rules::{PoolRules, Rules};

    use super::*;

    /// A directory for a store, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!(
                "ksched-engine-{name}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            Scratch(dir)
        }

        fn store(&self) -> Store {
            Store::open(&self.0, 0).expect("a store opens in a fresh directory")
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Decides a history in which finished jobs are touched again soon after: every job is
    /// submitted and succeeds, then the job two before it is submitted again (a duplicate
    /// job id) and a new job reuses its idempotency key. Returns the entries, and the store
    /// the deciding engine checkpointed after each one.
    fn decided_history(dir: &Scratch) -> Vec<JournalEntry> {
        let mut rules = Rules::default();
        rules
            .topics
            .insert("job.default".into(), vec!["default".into()]);
        rules.pools.insert("default".into(), PoolRules::default());
        let reconfigure = ksched_core::events::Reconfigure {
            rules_json: rules.to_canonical_json(),
            policy_modules: Default::default(),
            policy_data_json: "{}".into(),
            policy_snapshot: "snap".into(),
            rules_id: "rules".into(),
        };
        let mut live = Engine::open(dir.store()).expect("the store opens");
        let ctx = Ctx { policy: &AllowAll };
        let mut entries = Vec::new();
        let mut clock: Millis = 1_700_000_000_000;
        let mut decide = |live: &mut Engine, input: Input, clock: Millis| {
            let offset = i64::try_from(entries.len()).unwrap_or(i64::MAX);
            let cause = Cause {
                topic: "in".into(),
                partition: 0,
                offset,
            };
            let p = live.decide(&ctx, cause, clock, input).expect("decides");
            live.checkpoint(Some(offset)).expect("checkpoints");
            entries.push(p.entry);
        };
        decide(&mut live, Input::Reconfigure(reconfigure), clock);
        decide(
            &mut live,
            Input::Heartbeat(Heartbeat {
                worker_id: "w".into(),
                pool: "default".into(),
                max_parallel_jobs: 1_000,
                owned_partitions: vec![0],
                sent_at: clock,
                ..Default::default()
            }),
            clock,
        );
        let request = |id: String, key: String, clock: Millis| {
            let mut r = JobRequest {
                job_id: id,
                topic: "job.default".into(),
                tenant_id: "acme".into(),
                submitted_at: clock,
                ..Default::default()
            };
            r.meta.idempotency_key = Some(key);
            r
        };
        for j in 0..40 {
            clock += 1;
            let id = format!("job-{j}");
            decide(
                &mut live,
                Input::Submit(request(id.clone(), format!("key-{j}"), clock)),
                clock,
            );
            clock += 1;
            let result = JobResult::succeeded(id, 1, "w", 1, clock);
            decide(&mut live, Input::Result(result), clock);
            if j >= 2 {
                clock += 1;
                let again = format!("job-{}", j - 2);
                decide(
                    &mut live,
                    Input::Submit(request(again, format!("other-{j}"), clock)),
                    clock,
                );
                clock += 1;
                decide(
                    &mut live,
                    Input::Submit(request(format!("new-{j}"), format!("key-{}", j - 1), clock)),
                    clock,
                );
            }
        }
        entries
    }

    /// A batch written behind: its payloads are readable until it is written, the next
    /// prepare waits for it, and an engine dropped meanwhile waits for it too, so a write
    /// never lands after its engine is gone (the supervisor's next engine loads the store).
    #[test]
    fn a_batch_written_behind_is_readable_and_waited_for() {
        let dir = Scratch::new("write-behind");
        let entries = decided_history(&Scratch::new("write-behind-live"));
        let mut engine = Engine::open(dir.store()).expect("the store opens");
        for entry in &entries[..2] {
            engine.fold(entry).expect("folds");
        }
        let mut r = JobRequest {
            job_id: "with-payload".into(),
            topic: "job.default".into(),
            tenant_id: "acme".into(),
            submitted_at: 1_700_000_000_001,
            ..Default::default()
        };
        r.payload = b"the payload".to_vec();
        let cause = Cause {
            topic: "in".into(),
            partition: 0,
            offset: 2,
        };
        engine
            .decide(
                &Ctx { policy: &AllowAll },
                cause,
                r.submitted_at,
                Input::Submit(r),
            )
            .expect("decides");
        let pending = engine.prepare_next().expect("prepares");
        // The writing thread holds the write's end until the test lets it go.
        let (release, held) = std::sync::mpsc::channel::<()>();
        engine
            .write_behind(pending, Some(2), move || {
                let _ = held.recv();
            })
            .expect("hands the batch over");
        assert_eq!(
            engine
                .payload_being_written("with-payload")
                .map(Vec::as_slice),
            Some(&b"the payload"[..]),
            "the payload is readable while its batch is written"
        );
        let store = engine.store().clone();
        let (dropped_tx, dropped) = std::sync::mpsc::channel();
        let dropping = std::thread::spawn(move || {
            drop(engine);
            let _ = dropped_tx.send(());
        });
        assert!(
            dropped
                .recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "the engine was dropped while its write had not ended"
        );
        release.send(()).expect("the writing thread waits");
        dropped
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the engine is dropped once its write ended");
        dropping.join().expect("the dropping thread ends");
        assert_eq!(store.watermark().expect("reads"), Some(2));
        assert_eq!(
            store.payload("with-payload").expect("reads").as_deref(),
            Some(&b"the payload"[..])
        );
    }

    /// Folding with checkpoints written behind gives the projection the deciding engine
    /// wrote, key for key, however often it checkpoints: a finished job touched again while
    /// its checkpoint is being written is read from memory, not from the store.
    #[test]
    fn checkpoints_written_behind_give_the_live_projection() {
        let live_dir = Scratch::new("live");
        let entries = decided_history(&live_dir);
        let live = live_dir.store();
        for every in [1, 2, 3, 7] {
            let dir = Scratch::new(&format!("behind-{every}"));
            let mut engine = Engine::open(dir.store()).expect("the store opens");
            for (offset, entry) in entries.iter().enumerate() {
                engine.fold(entry).expect("folds");
                if (offset + 1) % every == 0 {
                    engine
                        .checkpoint_behind(Some(offset as i64))
                        .expect("checkpoints");
                }
            }
            engine
                .checkpoint(Some(entries.len() as i64 - 1))
                .expect("checkpoints");
            let rebuilt = engine.into_store().expect("the last write ends");
            let differences = crate::audit::compare(&rebuilt, &live).expect("compares");
            assert!(
                differences.is_empty(),
                "checkpoints every {every} entries: {differences:?}"
            );
        }
    }
}
