//! ksched's processor around the pure core: settings, topics, the exactly-once loop, recovery,
//! the ticker.

pub mod api;
pub mod audit;
pub mod error;
pub mod metrics;
pub mod processor;
pub mod replay;
pub mod settings;
pub mod status;
pub mod ticker;
pub mod topics;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ksched_policy::RegoEngine;
use ksched_store::Store;
use tracing::{error, warn};

pub use error::{Error, Result};
pub use processor::Processor;
pub use settings::{Config, Overrides, Settings};
pub use status::Status;
pub use topics::Topics;

/// The topics of a configuration.
pub fn topics_of(config: &Config) -> Topics {
    Topics::new(
        &config.settings.topics.prefix,
        config.rules.topics.keys().cloned().collect(),
        config.rules.pools.keys().cloned().collect(),
    )
}

/// Runs the processor until `shutdown` is set, rebuilding it from RocksDB and the journal
/// after any failure that is not fatal (a failed transaction leaves the in-memory state
/// ahead of what was committed, so the only safe continuation is a fresh recovery).
/// Returns an error only when continuing cannot help (fenced by another instance, a journal
/// record that does not decode, a damaged store).
pub fn run_processor(
    config: Config,
    store: Store,
    status: Arc<Status>,
    shutdown: Arc<AtomicBool>,
) -> Result<()> {
    let topics = topics_of(&config);
    let policy = Arc::new(RegoEngine::new());
    let mut backoff = Duration::from_millis(200);
    while !shutdown.load(Ordering::Relaxed) {
        status.set_caught_up(false);
        let started = Processor::start(
            config.clone(),
            topics.clone(),
            store.clone(),
            policy.clone(),
            status.clone(),
        );
        let result = started.and_then(|mut p| p.run(&shutdown));
        match result {
            Ok(()) => return Ok(()),
            Err(
                e @ (Error::Fenced { .. }
                | Error::Journal { .. }
                | Error::Store(_)
                | Error::Config { .. }),
            ) => {
                error!(error = %e, "processor stopped");
                return Err(e);
            }
            Err(e) => {
                status.metrics.recoveries.inc();
                warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "processor failed; recovering from the store and the journal");
                ticker::sleep_unless(&shutdown, backoff);
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
    Ok(())
}
