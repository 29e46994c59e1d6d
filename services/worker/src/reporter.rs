//! Reports (starts, progress, results, heartbeats) through one idempotent producer, replaced
//! when it stops delivering.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ksched_codec::trace_context;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::{Result, kafka};

/// Longest a report (started, progress, result, heartbeat) is waited for.
pub(crate) const REPORT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest between two attempts to reach a broker again (librdkafka's default is 10 s).
pub(crate) const RECONNECT_BACKOFF_MAX_MS: &str = "1000";
/// Longest a draining heartbeat is waited for at shutdown.
pub(crate) const FAREWELL_TIMEOUT: Duration = Duration::from_secs(3);

/// Reports go through one idempotent producer. A producer that has stopped delivering is
/// replaced: librdkafka makes an idempotent producer unusable after a fatal error (a
/// sequence gap the broker refuses after an outage), and a producer that delivered nothing
/// for [`producer_stall`] is not trusted either. The
/// scheduler dedupes reports by (job, attempt), so one sent twice across a replacement is
/// harmless; a heartbeat that never arrives is not (the worker would be declared lost).
#[derive(Clone)]
pub(crate) struct Reporter {
    pub(crate) producer: Arc<Mutex<Producer>>,
    /// How to build the producer again.
    pub(crate) config: ClientConfig,
    /// Longest a report is waited for ([`REPORT_TIMEOUT`]).
    pub(crate) timeout: Duration,
    /// [`producer_stall`].
    pub(crate) stall: Duration,
    pub(crate) worker_id: String,
    pub(crate) results: String,
    pub(crate) heartbeats: String,
    /// Cancelled when the worker's drain is over: reports that must arrive (starts, results)
    /// are tried once more, not until delivered.
    pub(crate) give_up: CancellationToken,
}

/// The report producer in use, and since when it has not delivered anything.
pub(crate) struct Producer {
    pub(crate) inner: FutureProducer,
    pub(crate) generation: u64,
    pub(crate) last_delivered: Instant,
}

/// Reads `topic`'s partitions into `producer`'s metadata (librdkafka refuses a record for a
/// partition it does not know at once, and reads metadata on its own only every
/// `topic.metadata.refresh.interval.ms`).
async fn reread_partitions(producer: &FutureProducer, topic: &str, timeout: Duration) {
    use rdkafka::producer::Producer as _;
    let (producer, topic_name) = (producer.clone(), topic.to_owned());
    let read = tokio::task::spawn_blocking(move || {
        (producer.client())
            .fetch_metadata(Some(&topic_name), timeout)
            .map(|m| m.topics().first().map_or(0, |t| t.partitions().len()))
    })
    .await;
    match read {
        Ok(Ok(partitions)) => {
            debug!(
                topic,
                partitions, "read the topic's partitions again for a report"
            )
        }
        Ok(Err(e)) => warn!(error = %e, topic, "reading the topic's partitions failed"),
        Err(e) => warn!(error = %e, topic, "reading the topic's partitions failed"),
    }
}

/// A producer that delivered nothing for this long (every report given up meanwhile) is
/// replaced by a new one: three heartbeat intervals, at least 2 s ([`producer_stall`]).
/// After a broker restart librdkafka's idempotent producer can stop delivering altogether
/// (the fault suite's load producer once delivered nothing for five minutes); a worker whose
/// heartbeats stall longer than the scheduler's `worker_ttl_ms` is declared lost, so the
/// stall must be well inside it (default: 9 s of 15 s).
pub(crate) fn producer_stall(heartbeat_interval: Duration) -> Duration {
    (heartbeat_interval * 3).max(Duration::from_secs(2))
}

/// How long a heartbeat is waited for: two intervals, at least 1 s.
pub(crate) fn heartbeat_timeout(heartbeat_interval: Duration) -> Duration {
    (heartbeat_interval * 2).max(Duration::from_secs(1))
}

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reporter")
            .field("worker_id", &self.worker_id)
            .finish()
    }
}

impl Reporter {
    pub(crate) fn new(
        config: ClientConfig,
        worker_id: &str,
        topic_prefix: &str,
    ) -> Result<Reporter> {
        let inner: FutureProducer = config
            .create()
            .map_err(kafka("creating the report producer"))?;
        Ok(Reporter {
            producer: Arc::new(Mutex::new(Producer {
                inner,
                generation: 0,
                last_delivered: Instant::now(),
            })),
            config,
            timeout: REPORT_TIMEOUT,
            stall: producer_stall(crate::config::DEFAULT_HEARTBEAT_INTERVAL),
            worker_id: worker_id.to_owned(),
            results: format!("{topic_prefix}results"),
            heartbeats: format!("{topic_prefix}heartbeats"),
            give_up: CancellationToken::new(),
        })
    }

    pub(crate) fn current(&self) -> (FutureProducer, u64) {
        let p = self.producer.lock().unwrap_or_else(|p| p.into_inner());
        (p.inner.clone(), p.generation)
    }

    pub(crate) fn delivered(&self, generation: u64) {
        let mut p = self.producer.lock().unwrap_or_else(|p| p.into_inner());
        if p.generation == generation {
            p.last_delivered = Instant::now();
        }
    }

    /// After a failed report: replaces the producer of `generation` when it is fatally
    /// broken or has delivered nothing for [`producer_stall`]. True when the report should
    /// be sent again: the producer was replaced, here or meanwhile (a replaced producer's
    /// queued reports fail when it is dropped).
    pub(crate) fn renew_if_broken(&self, generation: u64, producer: &FutureProducer) -> bool {
        use rdkafka::producer::Producer as _;
        let fatal = producer.client().fatal_error();
        let mut p = self.producer.lock().unwrap_or_else(|p| p.into_inner());
        if p.generation != generation {
            return true;
        }
        let stalled = p.last_delivered.elapsed() >= self.stall;
        if fatal.is_none() && !stalled {
            return false;
        }
        match self.config.create::<FutureProducer>() {
            Ok(fresh) => {
                match &fatal {
                    Some((code, reason)) => warn!(
                        worker = %self.worker_id, ?code, %reason,
                        "the report producer failed fatally; replaced by a new one"
                    ),
                    None => warn!(
                        worker = %self.worker_id,
                        stalled_s = p.last_delivered.elapsed().as_secs(),
                        "the report producer delivered nothing for too long; replaced by a new one"
                    ),
                }
                p.inner = fresh;
                p.generation += 1;
                p.last_delivered = Instant::now();
                true
            }
            Err(e) => {
                warn!(error = %e, "cannot create a new report producer");
                false
            }
        }
    }

    /// A heartbeat, waited for at most `timeout`: the next one supersedes it, so a producer
    /// that holds it longer is checked for a stall at once rather than after
    /// [`REPORT_TIMEOUT`].
    pub(crate) async fn send_heartbeat<T: ksched_codec::Record>(
        &self,
        key: &str,
        value: &T,
        timeout: Duration,
    ) -> bool {
        self.send_once(&self.heartbeats, None, key, value, None, timeout)
            .await
    }

    /// Sends a report once (on a new producer too, when the first turns out broken) to a
    /// given partition (None: the partitioner's, by key), with the job's `traceparent`
    /// header when it is traced; true when it was delivered.
    pub(crate) async fn send_to<T: ksched_codec::Record>(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: &str,
        value: &T,
        trace: Option<&str>,
    ) -> bool {
        self.send_once(topic, partition, key, value, trace, self.timeout)
            .await
    }

    async fn send_once<T: ksched_codec::Record>(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: &str,
        value: &T,
        trace: Option<&str>,
        timeout: Duration,
    ) -> bool {
        let bytes = match ksched_codec::encode(value) {
            Ok(b) => b,
            Err(e) => {
                warn!(error = %e, "cannot encode {}", T::NAME);
                return false;
            }
        };
        // Once more on a new producer when the first one turns out broken; once more after
        // reading the topic's partitions again when a Dispatch named one this producer does
        // not know yet (added to the results topic since it last read them: the scheduler
        // reads its partitions every 30 s, librdkafka every 5 minutes).
        let (mut tries, mut reread) = (2, false);
        while tries > 0 {
            tries -= 1;
            let (producer, generation) = self.current();
            let mut record = FutureRecord::to(topic).key(key).payload(&bytes);
            if let Some(p) = partition {
                record = record.partition(p);
            }
            if let Some(t) = trace {
                record = record.headers(OwnedHeaders::new().insert(Header {
                    key: trace_context::HEADER,
                    value: Some(t),
                }));
            }
            // Bounded, whatever state the client is in: a report that cannot be delivered is
            // given up (the scheduler's timeouts cover it) rather than holding up the job or
            // the worker's shutdown.
            match tokio::time::timeout(timeout, producer.send(record, timeout)).await {
                Ok(Ok(_)) => {
                    self.delivered(generation);
                    return true;
                }
                Ok(Err((e, _)))
                    if e.rdkafka_error_code() == Some(RDKafkaErrorCode::UnknownPartition)
                        && !reread =>
                {
                    reread = true;
                    tries += 1;
                    reread_partitions(&producer, topic, timeout).await;
                    continue;
                }
                Ok(Err((e, _))) => warn!(error = %e, topic, key, "report not delivered"),
                Err(_) => warn!(
                    topic,
                    key,
                    timeout_ms = timeout.as_millis() as u64,
                    "report not delivered in time; given up"
                ),
            }
            if !self.renew_if_broken(generation, &producer) {
                return false;
            }
        }
        false
    }

    /// Sends a report the scheduler must get (a start, a result) until it is delivered, or
    /// once more after the drain gave up. A broker outage longer than a report's timeout
    /// does not lose it: a lost result leaves its job RUNNING until `running_timeout_ms`
    /// and runs it again.
    pub(crate) async fn deliver<T: ksched_codec::Record>(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: &str,
        value: &T,
        trace: Option<&str>,
    ) {
        loop {
            if self.send_to(topic, partition, key, value, trace).await {
                return;
            }
            if self.give_up.is_cancelled() {
                warn!(
                    topic,
                    key,
                    "{} not delivered and the worker is stopping; the scheduler's timeouts retry the attempt",
                    T::NAME
                );
                return;
            }
            tokio::select! {
                _ = self.give_up.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// A report on the results topic, to the partition the Dispatch named (its shard's).
    pub(crate) async fn send_result_topic<T: ksched_codec::Record>(
        &self,
        partition: Option<i32>,
        job_id: &str,
        value: &T,
        trace: Option<&str>,
    ) {
        self.send_to(&self.results, partition, job_id, value, trace)
            .await;
    }

    /// [`Reporter::send_result_topic`] until delivered ([`Reporter::deliver`]).
    pub(crate) async fn deliver_result_topic<T: ksched_codec::Record>(
        &self,
        partition: Option<i32>,
        job_id: &str,
        value: &T,
        trace: Option<&str>,
    ) {
        self.deliver(&self.results, partition, job_id, value, trace)
            .await;
    }
}
