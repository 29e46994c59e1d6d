//! Standing by: while another instance owns the journal partition, this one tails the journal
//! into its own RocksDB, so that taking over is a short catch-up, not a rebuild.

use std::time::{Duration, Instant};

use ksched_store::Store;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::Topics;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::replay::{Flow, Replayer, read_journal};
use crate::settings::Settings;
use crate::status::Status;
use crate::topics::client_config;

/// Between two reads of the journal's new entries.
const TAIL_INTERVAL: Duration = Duration::from_millis(500);

/// Tails the journal into `store` until this instance owns the partition or shuts down.
pub(crate) fn stand_by(
    settings: &Settings,
    topics: &Topics,
    store: &Store,
    status: &Status,
    lease: &Lease,
    shutdown: &CancellationToken,
) {
    info!("standing by: tailing the journal until this instance owns it");
    status.set_caught_up(false);
    let mut client = client_config(settings);
    client.set("client.id", format!("{}-standby", settings.kafka.client_id));
    let partition = settings.processor.journal_partition;
    let mut engine: Option<Engine> = None;
    let mut last_warning: Option<Instant> = None;
    while !shutdown.is_cancelled() && !lease.owned() {
        let step = match engine.as_mut() {
            Some(e) => tail(e, &client, &topics.journal, partition, status),
            None => Engine::open(store.clone()).map(|e| {
                engine = Some(e);
            }),
        };
        match step {
            Ok(()) => status.set_caught_up(engine.is_some()),
            Err(e) => {
                status.set_caught_up(false);
                // The next owner recovers from the store and the journal whatever happened
                // here; a standby only retries.
                engine = None;
                if last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(30)) {
                    warn!(error = %e, "standby could not follow the journal; retrying");
                    last_warning = Some(Instant::now());
                }
            }
        }
        crate::sleep_unless(shutdown, TAIL_INTERVAL);
    }
    status.set_caught_up(false);
}

/// Folds the journal's new entries into the engine's store and checkpoints them.
fn tail(
    engine: &mut Engine,
    client: &rdkafka::ClientConfig,
    journal: &str,
    partition: i32,
    status: &Status,
) -> Result<()> {
    let from = engine.store().watermark()?.map_or(0, |w| w + 1);
    let mut replayer = Replayer::new(engine);
    read_journal(client, journal, partition, from, |rec| {
        if replayer.applied == 0 && rec.offset > from {
            return Err(Error::JournalTruncated {
                topic: journal.to_owned(),
                partition,
                journal_start: rec.offset,
                needed: from,
            });
        }
        replayer.apply(rec.offset, &rec.entry)?;
        Ok(Flow::Continue)
    })?;
    if let Some(w) = replayer.last_offset {
        replayer.persist()?;
        status
            .watermark
            .store(w, std::sync::atomic::Ordering::Relaxed);
        status.metrics.watermark.set(w);
    }
    Ok(())
}
