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
use crate::lease::Lease;
use crate::settings::Config;
use crate::status::{Shards, Status};
use crate::topics::{dispatch_partitions, ensure_topics, verify_topics};
use crate::{Topics, run_shard, ticker, topics_of};

/// A running scheduler: a processor thread per shard and a ticker, one shutdown for all.
#[derive(Debug)]
pub struct Scheduler {
    pub config: Config,
    pub topics: Topics,
    /// Shard 0's store (the only one with one shard); `stores` has every shard's.
    pub store: Store,
    /// Shard 0's status (the only one with one shard); `shards` has every shard's.
    pub status: Arc<Status>,
    /// Every shard's store (index = shard), views of one RocksDB.
    pub stores: Vec<Store>,
    pub shards: Shards,
    pub shutdown: CancellationToken,
    /// Warnings about the existing topics' configuration (already logged).
    pub topic_warnings: Vec<String>,
    /// Where a store of an older format was moved before this one was rebuilt, if it was.
    pub moved_aside: Option<PathBuf>,
    processors: Vec<JoinHandle<Result<()>>>,
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
        let (store, moved_aside) = Store::open_or_rebuild(&settings.storage.data_dir, 0)?;
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
        // Schemas registered (with a registry) before anything is decoded or written.
        let framing = {
            let (s, t) = (settings.clone(), topics.clone());
            tokio::task::spawn_blocking(move || crate::schemas::register(&s, &t))
                .await
                .map_err(|e| Error::Config {
                    source_name: "schema_registry".into(),
                    detail: format!("registering the schemas panicked: {e}"),
                })??
        };
        config.framing = Arc::new(framing);
        config.rules.dispatch_partitions = dispatch_partitions(&settings, &topics)?;
        let count = settings.topics.journal_partitions;
        config.rules.shards = Some(u32::try_from(count).unwrap_or(1));
        let shards = Shards::new(count);
        let stores: Vec<Store> = (0..count)
            .map(|s| store.for_partition(u16::try_from(s).unwrap_or(0)))
            .collect();
        let shutdown = CancellationToken::new();
        // With a lease, this instance owns no shard until the group says so (and its ticker
        // stays quiet until then); without one, it runs them all.
        let lease = if settings.processor.lease {
            let statuses = (0..count).map(|s| (s, shards.get(s).clone())).collect();
            Some(Arc::new(Lease::start(
                &settings,
                &topics,
                statuses,
                shutdown.clone(),
            )?))
        } else {
            for s in &shards.0 {
                s.set_owner(true);
            }
            None
        };
        let ticker = ticker::spawn(&settings, &topics, shards.clone(), shutdown.clone())?;
        let mut processors = Vec::new();
        for shard in 0..count {
            let mut c = config.clone();
            c.settings.processor.journal_partition = shard;
            let (s, st, l, sh) = (
                stores[usize::try_from(shard).unwrap_or(0)].clone(),
                shards.get(shard).clone(),
                lease.clone(),
                shutdown.clone(),
            );
            processors.push(
                std::thread::Builder::new()
                    .name(format!("ksched-shard-{shard}"))
                    .spawn(move || run_shard(c, s, st, l, sh))
                    .map_err(crate::error::io("starting a processor thread"))?,
            );
        }
        // The processors hold the lease: it is released (and handed over) when the last
        // one stopped.
        drop(lease);
        info!(
            bootstrap = %settings.kafka.bootstrap_servers,
            data_dir = %settings.storage.data_dir.display(),
            "scheduler started"
        );
        Ok(Scheduler {
            config,
            topics,
            store,
            status: shards.get(0).clone(),
            stores,
            shards,
            shutdown,
            topic_warnings,
            moved_aside: None,
            processors,
            ticker: Some(ticker),
        })
    }

    /// Waits until every shard this instance owns has recovered and consumes inputs (or,
    /// owning none, its standbys have caught up), or `limit` passes, or a processor stopped.
    /// Returns whether it is caught up.
    pub fn wait_ready(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if self.shards.is_caught_up() {
                return true;
            }
            if self.shards.stopped().is_some() || self.processor_finished() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// A processor thread has ended (stopped or failed for good).
    pub fn processor_finished(&self) -> bool {
        self.processors.is_empty() || self.processors.iter().any(JoinHandle::is_finished)
    }

    /// Waits for the processor to end (on shutdown, or by itself on a fatal error) and for
    /// the ticker (which stops once the processor stopped for good). The shutdown token is
    /// left as it is: an instance another one replaced may keep answering its API.
    ///
    /// With several shards, the first processor that ends decides: one that failed for good
    /// returns its error at once (the others run until shutdown, which the caller decides).
    pub fn wait(mut self) -> Result<()> {
        while !self.processors.iter().any(JoinHandle::is_finished) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let i = self
            .processors
            .iter()
            .position(JoinHandle::is_finished)
            .unwrap_or(0);
        let first = self.processors.remove(i);
        let result = first
            .join()
            .map_err(|_| Error::Invariant("a processor thread panicked"))
            .and_then(|r| r);
        if result.is_err() {
            self.join_ticker_when_stopped();
            return result;
        }
        let result = self.join_processor(None);
        if result.is_ok() {
            self.shutdown.cancel();
        }
        self.join_ticker();
        result
    }

    /// The ticker stops by itself once a processor stopped for good; joined only then.
    fn join_ticker_when_stopped(&mut self) {
        if self.shards.stopped().is_some() {
            self.join_ticker();
        }
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

    /// Joins every shard's processor; the first error is the result.
    fn join_processor(&mut self, grace: Option<Duration>) -> Result<()> {
        let processors = std::mem::take(&mut self.processors);
        if let Some(grace) = grace {
            let until = Instant::now() + grace;
            while !processors.iter().all(JoinHandle::is_finished) {
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
        let mut result = Ok(());
        for p in processors {
            let r = p
                .join()
                .map_err(|_| Error::Invariant("a processor thread panicked"))
                .and_then(|r| r);
            if result.is_ok() {
                result = r;
            }
        }
        result
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
        if self.processors.is_empty() && self.ticker.is_none() {
            return;
        }
        self.shutdown.cancel();
        for p in std::mem::take(&mut self.processors) {
            let _ = p.join();
        }
        self.join_ticker();
    }
}
