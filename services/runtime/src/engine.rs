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
        }
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn into_store(self) -> Store {
        self.store
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
    /// between ([`Engine::evict`] after the last write).
    pub fn prepare(&mut self) -> Result<Pending, ksched_store::Error> {
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

    /// Evicts cold records from memory; only once everything prepared was written.
    pub fn evict(&mut self) {
        self.state.evict_cold();
        self.since_checkpoint = 0;
    }

    /// Drops the state in memory and loads the working set of the last checkpoint again.
    pub fn reload(&mut self) -> Result<()> {
        self.state = self.store.load_state()?;
        self.since_checkpoint = 0;
        Ok(())
    }
}
