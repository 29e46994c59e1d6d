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
//! transaction; replays checkpoint when [`Engine::checkpoint_due`] says so.

use ksched_core::apply_entry;
use ksched_core::decide::{Ctx, Processed, continuation, process};
use ksched_core::events::{Cause, Input, JournalEntry};
use ksched_core::records::Millis;
use ksched_core::state::State;
use ksched_store::Store;

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
    /// A replay's checkpoint being written on a thread of its own
    /// ([`Engine::checkpoint_behind`]).
    writing: Option<std::thread::JoinHandle<Result<(), ksched_store::Error>>>,
}

impl Engine {
    /// Continues the projection in `store` from its last checkpoint.
    pub fn open(store: Store) -> Result<Engine> {
        let state = store.load_state()?;
        Ok(Engine::with_state(store, state))
    }

    /// Continues from a state already in memory.
    pub fn with_state(store: Store, state: State) -> Engine {
        Engine {
            store,
            state,
            since_checkpoint: 0,
            writing: None,
        }
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
        Ok(self.store)
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
    /// ([`Engine::write`]) before the next one is prepared, and nothing may be evicted in
    /// between ([`Engine::evict`] after the last write). Waits first for a checkpoint being
    /// written behind.
    pub fn prepare(&mut self) -> Result<Pending, ksched_store::Error> {
        self.finish_writing()?;
        let dirty = self.state.take_dirty();
        let batch = self.store.prepare(&self.state, &dirty)?;
        Ok(Pending {
            batch,
            payloads: dirty.payloads,
        })
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

    /// A replay's checkpoint, written on a thread of its own while the replay folds on.
    /// Waits until the previous one is written, drops from memory what that one made cold
    /// (not what changed since: [`State::evict_written`]), then hands what changed to a
    /// writing thread with `watermark`. The next checkpoint, [`Engine::prepare`] and
    /// [`Engine::finish_writing`] wait for it; an error writing it is theirs.
    ///
    /// What the fold reads meanwhile is right: a record in the batch being written is still
    /// in memory, and one evicted earlier is in the store.
    pub fn checkpoint_behind(&mut self, watermark: Option<i64>) -> Result<()> {
        self.finish_writing()?;
        self.state.evict_written();
        let pending = self.prepare()?;
        let store = self.store.clone();
        let writing = std::thread::Builder::new()
            .name("ksched-checkpoint".into())
            .spawn(move || store.write(pending.batch, watermark))
            .map_err(crate::error::io("starting a checkpoint writing thread"))?;
        self.writing = Some(writing);
        self.since_checkpoint = 0;
        Ok(())
    }

    /// Waits for a checkpoint being written behind, if there is one.
    pub fn finish_writing(&mut self) -> Result<(), ksched_store::Error> {
        match self.writing.take() {
            None => Ok(()),
            Some(writing) => writing
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        }
    }

    /// Drops the state in memory and loads the working set of the last checkpoint again.
    pub fn reload(&mut self) -> Result<()> {
        self.finish_writing()?;
        self.state = self.store.load_state()?;
        self.since_checkpoint = 0;
        Ok(())
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
