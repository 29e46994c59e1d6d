//! Starting and stopping a scheduler, in one place for `ksched run`, `ksched dev`, the bench
//! and the tests: the data directory and store, the topics (created, checked, the dispatch
//! partitions read), the ticker and the processor thread, one cancellation token for all of
//! them, and a bounded grace period on the way out.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ksched_store::Store;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::{Error, Result};
use crate::settings::Config;
use crate::status::Status;
use crate::topics::{dispatch_partitions, ensure_topics, verify_topics};
use crate::{Topics, run_processor, ticker, topics_of};

/// A running scheduler: processor and ticker threads sharing one status and one shutdown.
#[derive(Debug)]
pub struct Scheduler {
    pub config: Config,
    pub topics: Topics,
    pub store: Store,
    pub status: Arc<Status>,
    pub shutdown: CancellationToken,
    /// Warnings about the existing topics' configuration (already logged).
    pub topic_warnings: Vec<String>,
    /// Where a store of an older format was moved before this one was rebuilt, if it was.
    pub moved_aside: Option<PathBuf>,
    processor: Option<JoinHandle<Result<()>>>,
    ticker: Option<JoinHandle<()>>,
}

impl Scheduler {
    /// Opens the store (rebuilding one of an older format from the journal), creates missing
    /// topics (if configured), checks the existing ones, reads the dispatch partitions into
    /// the rules, and starts the ticker and the processor. Returns once both run; the
    /// processor recovers in the background (see [`Scheduler::wait_ready`]).
    pub async fn start(config: Config) -> Result<Scheduler> {
        let settings = &config.settings;
        std::fs::create_dir_all(&settings.storage.data_dir).map_err(|e| Error::Config {
            source_name: "storage.data_dir".into(),
            detail: format!("cannot create {}: {e}", settings.storage.data_dir.display()),
        })?;
        let partition =
            u16::try_from(settings.processor.journal_partition).map_err(|_| Error::Config {
                source_name: "processor.journal_partition".into(),
                detail: "out of range".into(),
            })?;
        let (store, moved_aside) = Store::open_or_rebuild(&settings.storage.data_dir, partition)?;
        if let Some(old) = &moved_aside {
            warn!(
                old = %old.display(),
                "the store was written by another ksched version; it was moved aside and is rebuilt from the journal"
            );
        }
        let mut s = Scheduler::start_on(config, store).await?;
        s.moved_aside = moved_aside;
        Ok(s)
    }

    /// [`Scheduler::start`] on a store already open (a restart in the same process).
    pub async fn start_on(mut config: Config, store: Store) -> Result<Scheduler> {
        let settings = config.settings.clone();
        let topics = topics_of(&config);
        crate::topics::check_credentials(&settings)?;
        if settings.topics.create {
            ensure_topics(&settings, &topics).await?;
        }
        let topic_warnings = if settings.topics.verify {
            verify_topics(&settings, &topics).await?
        } else {
            Vec::new()
        };
        config.rules.dispatch_partitions = dispatch_partitions(&settings, &topics)?;
        let status = Arc::new(Status::new());
        // With a lease, this instance owns nothing until the group says so (and its ticker
        // stays quiet until then).
        status.set_owner(!settings.processor.lease);
        let shutdown = CancellationToken::new();
        let ticker = ticker::spawn(&settings, &topics, status.clone(), shutdown.clone())?;
        let processor = {
            let (c, s, st, sh) = (
                config.clone(),
                store.clone(),
                status.clone(),
                shutdown.clone(),
            );
            std::thread::Builder::new()
                .name("ksched-processor".into())
                .spawn(move || run_processor(c, s, st, sh))
                .map_err(crate::error::io("starting the processor thread"))?
        };
        info!(
            bootstrap = %settings.kafka.bootstrap_servers,
            data_dir = %settings.storage.data_dir.display(),
            "scheduler started"
        );
        Ok(Scheduler {
            config,
            topics,
            store,
            status,
            shutdown,
            topic_warnings,
            moved_aside: None,
            processor: Some(processor),
            ticker: Some(ticker),
        })
    }

    /// Waits until the processor has recovered and consumes inputs, or `limit` passes, or
    /// the processor stopped. Returns whether it is caught up.
    pub fn wait_ready(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if self.status.is_caught_up() {
                return true;
            }
            if self.status.stopped().is_some() || self.processor_finished() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The processor thread has ended (stopped or failed for good).
    pub fn processor_finished(&self) -> bool {
        self.processor.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits for the processor to end (on shutdown, or by itself on a fatal error) and for
    /// the ticker (which stops once the processor stopped for good). The shutdown token is
    /// left as it is: an instance another one replaced may keep answering its API.
    pub fn wait(mut self) -> Result<()> {
        let result = self.join_processor(None);
        if result.is_ok() {
            self.shutdown.cancel();
        }
        self.join_ticker();
        result
    }

    /// Stops: the open batch is committed within `processor.shutdown_grace_ms`; past it the
    /// processor is left to die with the process (its transaction aborts, the next start
    /// recovers from the journal).
    pub fn stop(mut self) -> Result<()> {
        self.shutdown.cancel();
        let grace = Duration::from_millis(self.config.settings.processor.shutdown_grace_ms);
        let result = self.join_processor(Some(grace));
        self.join_ticker();
        result
    }

    fn join_processor(&mut self, grace: Option<Duration>) -> Result<()> {
        let Some(p) = self.processor.take() else {
            return Ok(());
        };
        if let Some(grace) = grace {
            let until = Instant::now() + grace;
            while !p.is_finished() {
                if Instant::now() > until {
                    warn!(
                        grace_ms = grace.as_millis() as u64,
                        "the open batch did not commit within processor.shutdown_grace_ms; stopping without it (the next start recovers)"
                    );
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        p.join()
            .map_err(|_| Error::Invariant("the processor thread panicked"))?
    }

    fn join_ticker(&mut self) {
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Scheduler {
    /// A scheduler dropped while its threads run stops them.
    fn drop(&mut self) {
        if self.processor.is_none() && self.ticker.is_none() {
            return;
        }
        self.shutdown.cancel();
        if let Some(p) = self.processor.take() {
            let _ = p.join();
        }
        self.join_ticker();
    }
}
