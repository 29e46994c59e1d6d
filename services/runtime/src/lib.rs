//! ksched's processor around the pure core: settings, topics, the exactly-once loop, recovery,
//! the ticker.

pub mod audit;
pub mod clock;
pub mod disk;
pub mod engine;
pub mod error;
pub mod inputs;
pub mod job_trace;
pub mod lease;
pub mod metrics;
pub mod positions;
pub mod processor;
pub mod replay;
pub mod schemas;
pub mod service;
pub mod settings;
pub mod shard;
mod standby;
pub mod status;
pub mod tail;
pub mod ticker;
pub mod topics;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ksched_policy::RegoEngine;
use ksched_store::Store;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

pub use engine::Engine;
pub use error::{Error, Result};
pub use processor::{Processor, Recovery};
pub use service::Scheduler;
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

/// The pause before the first retry after a failure; it doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// A processor that ran this long before failing starts its retries from [`MIN_BACKOFF`].
const HEALTHY_RUN: Duration = Duration::from_secs(30);
/// A processor fenced twice within this long stops: another instance holds its journal
/// partition. Fenced once, it recovers (see [`Fences`]).
const FENCE_WINDOW: Duration = Duration::from_secs(120);

/// What a fenced transaction means. Either another instance with this transactional id
/// started (it fenced this one when it initialised its transactions), or the transaction
/// coordinator aborted a transaction that ran past `transaction.timeout.ms` and bumped the
/// producer epoch, which is what a broker failover in the middle of a transaction does:
/// librdkafka reports both as "fenced". The first is only an instance that recovers and
/// fences the other back, so a processor fenced once recovers (its new producer fences any
/// other instance in turn, which then recovers the same way), and one fenced again within
/// [`FENCE_WINDOW`] stops: of two instances, the one fenced twice gives way and one stays.
///
/// Only fences on the shard's first transactional id count. A processor initialises its two
/// ids one after the other, so two instances starting at once can each end up holding one
/// of them; counting a fence on either would let both reach their second fence and both
/// stop. The first id alone is held by exactly one of them (the last to initialise it), and
/// the one that stops never initialises again, so the other keeps it. A fence on the second
/// id alone is recovered from, and the recovery fences the other instance on the first.
#[derive(Debug, Default)]
struct Fences {
    last: Option<Instant>,
}

impl Fences {
    /// Records a fence now; true when it is the second within [`FENCE_WINDOW`].
    fn again(&mut self, now: Instant) -> bool {
        let again = self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < FENCE_WINDOW);
        self.last = Some(now);
        again
    }
}

/// Runs one shard's processor until `shutdown`, rebuilding it from RocksDB and the journal
/// after any failure that is not fatal (a failed transaction leaves the in-memory state ahead
/// of what was committed, so the only safe continuation is a fresh recovery):
///
/// - a batch that failed in a way retrying cannot fix is retried input by input, and the
///   input that fails is set aside (dead-lettered `processing_failed`), so one bad input
///   never stops the others;
/// - anything else (the broker unreachable, a full disk) is retried after a pause that
///   doubles up to 10 s and starts over once a processor ran well for 30 s.
///
/// The shard is `config.settings.processor.journal_partition`; `store` is that shard's.
/// With a `lease`, the processor runs while this instance owns the shard; otherwise the
/// instance stands by for it when the lease chose it as one of the shard's standbys.
///
/// Returns an error only when continuing cannot help (fenced or replaced by another
/// instance, a journal record that does not decode, a store that does not match the
/// journal, a configuration the journal refuses); the status says why.
pub fn run_shard(
    config: Config,
    store: Store,
    status: Arc<Status>,
    lease: Option<Arc<lease::Lease>>,
    shutdown: CancellationToken,
) -> Result<()> {
    let topics = topics_of(&config);
    let shard = config.settings.processor.journal_partition;
    let span = tracing::info_span!("shard", shard);
    let _enter = span.enter();
    let policy = Arc::new(RegoEngine::new());
    let mut backoff = MIN_BACKOFF;
    let mut recovery = Recovery::default();
    let mut fences = Fences::default();
    let shard_id = processor::transactional_id(&config.settings.processor.group_id, shard, 0);
    while !shutdown.is_cancelled() {
        // Without a lease the processor runs until shutdown; with one, while this instance
        // owns the shard, and the instance stands by for it otherwise.
        let run_until = match &lease {
            None => shutdown.clone(),
            Some(l) if l.owned(shard) && !l.ownership(shard).is_cancelled() => l.ownership(shard),
            Some(l) if l.stands_by(shard) => {
                standby::stand_by(&config.settings, &topics, &store, &status, l, &shutdown);
                continue;
            }
            // Neither owner nor standby (`processor.standby_replicas`): wait for a role.
            Some(l) => {
                status.set_caught_up(false);
                while !shutdown.is_cancelled() && !l.owned(shard) && !l.stands_by(shard) {
                    sleep_unless(&shutdown, Duration::from_millis(50));
                }
                continue;
            }
        };
        let lost =
            |lease: &Option<Arc<lease::Lease>>| lease.as_ref().is_some_and(|l| !l.owned(shard));
        status.set_caught_up(false);
        let started = Instant::now();
        let result = Processor::start(
            config.clone(),
            topics.clone(),
            store.clone(),
            policy.clone(),
            status.clone(),
            run_until,
        )
        .and_then(|mut p| p.run(&mut recovery));
        match result {
            Ok(()) if shutdown.is_cancelled() => return Ok(()),
            // The lease was lost: the open batch is committed (or refused, once the next
            // owner fenced this one); stand by.
            Ok(()) => {
                info!("the processor stopped: this instance no longer owns the shard")
            }
            Err(e @ (Error::Fenced { .. } | Error::Replaced { .. })) if lost(&lease) => {
                info!(error = %e, "another instance owns the shard now; standing by");
            }
            // Still the owner as far as the group knows: a transaction the coordinator
            // aborted, or a zombie that has not noticed it lost the lease yet. The lease,
            // not a count of fences, says who gives way.
            Err(e @ (Error::Fenced { .. } | Error::Replaced { .. })) if lease.is_some() => {
                status.metrics.recoveries.inc();
                warn!(error = %e, "the processor was fenced while this instance holds the lease; recovering");
                sleep_unless(&shutdown, MIN_BACKOFF);
            }
            // Fenced on the second producer's id only: recovering takes the first id back
            // (see [`Fences`]).
            Err(Error::Fenced {
                transactional_id, ..
            }) if transactional_id != shard_id => {
                status.metrics.recoveries.inc();
                warn!(
                    transactional_id,
                    "the processor's second producer was fenced (a transaction the coordinator aborted, or another instance starting); recovering"
                );
                sleep_unless(&shutdown, MIN_BACKOFF);
            }
            Err(e @ Error::Fenced { .. }) if !fences.again(Instant::now()) => {
                status.metrics.recoveries.inc();
                warn!(
                    error = %e,
                    "the processor's transaction was fenced: a transaction the coordinator aborted after a broker failover, or another instance; recovering (fenced again within {} s, this instance stops)",
                    FENCE_WINDOW.as_secs()
                );
                sleep_unless(&shutdown, MIN_BACKOFF);
            }
            Err(e) if e.is_fatal() => {
                error!(error = %e, "processor stopped");
                status.set_stopped(e.to_string());
                return Err(e);
            }
            Err(Error::BatchFailed {
                inputs,
                ranges,
                detail,
            }) => {
                status.metrics.isolations.inc();
                warn!(inputs, detail = %detail, "a batch failed for what it holds; retrying it input by input");
                recovery.isolate(ranges);
            }
            Err(Error::InputFailed { coords, detail }) => {
                error!(
                    topic = %coords.0,
                    partition = coords.1,
                    offset = coords.2,
                    detail = %detail,
                    "an input failed for what it is; it will be set aside"
                );
                recovery.set_aside.insert(coords, detail);
            }
            Err(e) => {
                status.metrics.recoveries.inc();
                if started.elapsed() > HEALTHY_RUN {
                    backoff = MIN_BACKOFF;
                }
                warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "processor failed; recovering from the store and the journal");
                sleep_unless(&shutdown, backoff);
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
    Ok(())
}

/// Sleeps up to `d`, waking early on shutdown.
pub(crate) fn sleep_unless(shutdown: &CancellationToken, d: Duration) {
    let step = Duration::from_millis(20);
    let until = Instant::now() + d;
    while !shutdown.is_cancelled() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(step));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fence alone is recovered from (a broker failover aborts a long transaction the same
    /// way another instance does); a second one soon after means another instance.
    #[test]
    fn a_processor_fenced_once_recovers_and_fenced_twice_soon_stops() {
        let mut f = Fences::default();
        let t0 = Instant::now();
        assert!(!f.again(t0), "the first fence stops the processor");
        assert!(f.again(t0 + Duration::from_secs(5)));
        // Long after the last one, a fence is a first one again.
        assert!(!f.again(t0 + Duration::from_secs(5) + FENCE_WINDOW));
    }
}
