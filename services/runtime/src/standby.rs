//! Standing by: while another instance owns a shard, this one tails the shard's journal
//! into its own RocksDB, so that taking over is a short catch-up, not a rebuild. It reads
//! through one long-lived [`PartitionTail`], a few milliseconds behind the owner.

use std::time::{Duration, Instant};

use ksched_core::events::JournalEntry;
use ksched_store::Store;
use rdkafka::message::Message;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::Topics;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::replay::journal_watermarks;
use crate::settings::Settings;
use crate::status::Status;
use crate::tail::PartitionTail;

/// The longest a standby keeps folded entries before it checkpoints them.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);
/// How long one step of the standby reads before it looks at the lease again.
const STEP: Duration = Duration::from_millis(100);
/// How often a standby asks where the journal ends, to say whether it is caught up.
const END_EVERY: Duration = Duration::from_secs(1);

/// Tails the journal into `store` until this instance owns the partition, is no longer one of
/// its standbys, or shuts down.
pub(crate) fn stand_by(
    settings: &Settings,
    topics: &Topics,
    store: &Store,
    status: &Status,
    lease: &Lease,
    shutdown: &CancellationToken,
) {
    info!("standing by: tailing the shard's journal until this instance owns it");
    status.set_caught_up(false);
    // As recovery's reader: assigned by hand, it joins no group and commits nothing.
    let client = crate::replay::reader_client(settings, "standby");
    let partition = settings.processor.journal_partition;
    let mut follower: Option<Follower> = None;
    let mut last_warning: Option<Instant> = None;
    while !shutdown.is_cancelled() && !lease.owned(partition) && lease.stands_by(partition) {
        let step = match follower.as_mut() {
            Some(f) => f.step(status),
            None => Follower::open(store, &client, &topics.journal, partition).map(|f| {
                follower = Some(f);
                false
            }),
        };
        match step {
            Ok(caught_up) => status.set_caught_up(caught_up),
            Err(e) => {
                status.set_caught_up(false);
                // The next owner recovers from the store and the journal whatever happened
                // here; a standby only retries.
                follower = None;
                if last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(30)) {
                    warn!(error = %e, "standby could not follow the journal; retrying");
                    last_warning = Some(Instant::now());
                }
                crate::sleep_unless(shutdown, Duration::from_millis(500));
            }
        }
    }
    // What was folded is checkpointed, so that the owner-to-be starts from there.
    if let Some(mut f) = follower
        && let Err(e) = f.checkpoint(status)
    {
        warn!(error = %e, "standby could not checkpoint what it read; the owner replays it");
    }
    status.set_caught_up(false);
}

/// A standby's engine and its reader of the journal, kept from one step to the next.
struct Follower {
    engine: Engine,
    tail: PartitionTail,
    journal: String,
    partition: i32,
    /// The last offset folded and not checkpointed yet.
    folded: Option<i64>,
    checkpointed_at: Instant,
    /// The journal's last stable offset when last asked, and when that was.
    end: Option<i64>,
    end_asked_at: Option<Instant>,
}

impl Follower {
    fn open(
        store: &Store,
        client: &rdkafka::ClientConfig,
        journal: &str,
        partition: i32,
    ) -> Result<Follower> {
        let engine = Engine::open(store.clone())?;
        let from = engine.store().watermark()?.map_or(0, |w| w + 1);
        // A reader asked for an offset the journal no longer has would silently start
        // elsewhere: the gap is refused here, as recovery refuses it.
        let (low, _) = journal_watermarks(client, journal, partition)?;
        if low > from {
            return Err(Error::JournalTruncated {
                topic: journal.to_owned(),
                partition,
                journal_start: low,
                needed: from,
            });
        }
        let tail = PartitionTail::new(client, journal, partition, from)?;
        Ok(Follower {
            engine,
            tail,
            journal: journal.to_owned(),
            partition,
            folded: None,
            checkpointed_at: Instant::now(),
            end: None,
            end_asked_at: None,
        })
    }

    /// Folds what the journal has for about [`STEP`]; checkpoints every
    /// [`CHECKPOINT_EVERY`] and whenever it has read everything. Returns whether it is caught
    /// up: past the journal's end as it was at most [`END_EVERY`] ago (under a steady load it
    /// is never idle, yet a second behind at most), and false while the broker cannot say.
    fn step(&mut self, status: &Status) -> Result<bool> {
        let until = Instant::now() + STEP;
        let mut idle = false;
        while Instant::now() < until {
            let Some(m) = self.tail.poll(Duration::from_millis(20))? else {
                idle = true;
                break;
            };
            let entry: JournalEntry = ksched_codec::decode(m.payload().unwrap_or_default())
                .map_err(|source| Error::Journal {
                    topic: self.journal.clone(),
                    partition: self.partition,
                    offset: m.offset(),
                    source,
                })?;
            self.engine.fold(&entry)?;
            self.folded = Some(m.offset());
            if self.engine.checkpoint_due() {
                self.checkpoint(status)?;
            }
        }
        if self.folded.is_some() && (idle || self.checkpointed_at.elapsed() >= CHECKPOINT_EVERY) {
            self.checkpoint(status)?;
        }
        if self.end_asked_at.is_none_or(|t| t.elapsed() >= END_EVERY) {
            self.end = self.tail.stable_end().ok();
            self.end_asked_at = Some(Instant::now());
        }
        // The last offset may be a transaction marker, never delivered.
        Ok(self
            .end
            .is_some_and(|end| self.tail.next_offset() >= end - 1))
    }

    fn checkpoint(&mut self, status: &Status) -> Result<()> {
        let Some(w) = self.folded.take() else {
            return Ok(());
        };
        self.engine.checkpoint(Some(w))?;
        self.checkpointed_at = Instant::now();
        status
            .watermark
            .store(w, std::sync::atomic::Ordering::Relaxed);
        status.metrics.watermark.set(w);
        Ok(())
    }
}
