//! The ticker: appends a Tick to the control topic every `tick_interval_ms`, so time reaches
//! the core only through the log (DESIGN invariant 1), and a marker Tick to every partition
//! of the evidence topics (results, heartbeats), so the processor knows how far it has read
//! each of them even when no worker writes there (docs/architecture.md, "Time"). Record
//! timestamps are the broker's (those topics use LogAppendTime), so every decision uses one
//! clock. It stops on shutdown and when the processor stopped for good.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ksched_core::records::Tick;
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::clock::wall_clock_ms;
use crate::error::{Result, kafka};
use crate::settings::Settings;
use crate::status::Shards;
use crate::topics::{Topics, client_config, partition_count};

/// The `source` of marker Ticks on evidence partitions.
pub const MARKER_SOURCE: &str = "watermark-marker";

/// Starts the ticker thread.
pub fn spawn(
    settings: &Settings,
    topics: &Topics,
    status: Shards,
    shutdown: CancellationToken,
) -> Result<JoinHandle<()>> {
    let mut config = client_config(settings);
    config
        .set("client.id", format!("{}-ticker", settings.kafka.client_id))
        .set("enable.idempotence", "true")
        .set("linger.ms", "0");
    let interval = Duration::from_millis(settings.processor.tick_interval_ms);
    let mut ticks = TickProducer::new(config, stall_after(interval))?;
    let mut markers: Vec<(String, i32)> = Vec::new();
    for topic in [&topics.results, &topics.heartbeats] {
        let n = partition_count(settings, topic)?;
        markers.extend((0..n).map(|p| (topic.clone(), p)));
    }
    let control = topics.control.clone();
    let source = format!("{}-{}", settings.kafka.client_id, std::process::id());
    let handle = std::thread::Builder::new()
        .name("ksched-ticker".into())
        .spawn(move || {
            info!(topic = %control, interval_ms = interval.as_millis() as u64, evidence_partitions = markers.len(), "ticker started");
            while !shutdown.is_cancelled() {
                if let Some(why) = status.stopped() {
                    info!(reason = %why, "ticker stopped: the processor stopped");
                    break;
                }
                if !status.is_owner() {
                    // A standby's ticks would only double the owner's.
                    crate::sleep_unless(&shutdown, interval);
                    continue;
                }
                let now = wall_clock_ms();
                // Markers first: a Tick read after them finds its evidence partitions read.
                for (topic, partition) in &markers {
                    ticks.append(topic, Some(*partition), MARKER_SOURCE, now);
                }
                ticks.append(&control, None, &source, now);
                ticks.producer.poll(Duration::ZERO);
                ticks.replace_if_stalled();
                crate::sleep_unless(&shutdown, interval);
            }
            let _ = ticks.producer.flush(Duration::from_secs(2));
        })
        .map_err(crate::error::io("starting the ticker thread"))?;
    Ok(handle)
}

/// A ticker producer that delivered nothing for this long while ticks wait is replaced:
/// ten tick intervals, at least 5 s.
fn stall_after(interval: Duration) -> Duration {
    (interval * 10).max(Duration::from_secs(5))
}

/// When the ticker's producer last delivered a record, and how many it reported on.
#[derive(Debug)]
struct Deliveries {
    last: Mutex<Instant>,
    reported: AtomicU64,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        self.reported.fetch_add(1, Ordering::Relaxed);
        if result.is_ok()
            && let Ok(mut last) = self.last.lock()
        {
            *last = Instant::now();
        }
    }
}

/// The ticker's producer, replaced when it stops delivering. After a broker restart
/// librdkafka's idempotent producer can deliver nothing more (the fault suite's load
/// producer once held its records for five minutes); a ticker stuck that way would stop
/// the scheduler's clock: no timeouts, no retries, no lost workers, until a restart.
struct TickProducer {
    config: ClientConfig,
    producer: BaseProducer<Deliveries>,
    stall: Duration,
    /// Records handed to the current producer.
    sent: u64,
    replaced: u64,
}

impl TickProducer {
    fn new(config: ClientConfig, stall: Duration) -> Result<TickProducer> {
        let producer = Self::create(&config)?;
        Ok(TickProducer {
            config,
            producer,
            stall,
            sent: 0,
            replaced: 0,
        })
    }

    fn create(config: &ClientConfig) -> Result<BaseProducer<Deliveries>> {
        config
            .create_with_context(Deliveries {
                last: Mutex::new(Instant::now()),
                reported: AtomicU64::new(0),
            })
            .map_err(kafka("creating the ticker producer"))
    }

    /// Replaces the producer when records wait in it and it delivered nothing for the
    /// stall time; true when it did. Its undelivered ticks are dropped with it: a tick only
    /// says what time it is, and the next one says it again.
    fn replace_if_stalled(&mut self) -> bool {
        let since = self
            .producer
            .context()
            .last
            .lock()
            .map_or(Duration::ZERO, |l| l.elapsed());
        let waiting = self.waiting();
        if waiting == 0 || since < self.stall {
            return false;
        }
        match Self::create(&self.config) {
            Ok(fresh) => {
                warn!(
                    stalled_s = since.as_secs(),
                    waiting,
                    "the ticker's producer delivered nothing for too long; replaced by a new one"
                );
                self.producer = fresh;
                self.sent = 0;
                self.replaced += 1;
                true
            }
            Err(e) => {
                warn!(error = %e, "cannot create a new ticker producer");
                false
            }
        }
    }

    /// Records handed to the producer that it has not reported on yet.
    fn waiting(&self) -> u64 {
        self.sent
            .saturating_sub(self.producer.context().reported.load(Ordering::Relaxed))
    }

    /// Queues a Tick (a marker when `partition` is given) for `topic`.
    fn append(&mut self, topic: &str, partition: Option<i32>, source: &str, now: i64) {
        let tick = Tick {
            source: source.to_owned(),
            issued_at: now,
            watermark: None,
        };
        match ksched_codec::encode(&tick) {
            Ok(bytes) => {
                let mut record = BaseRecord::to(topic).key("tick").payload(&bytes);
                if let Some(p) = partition {
                    record = record.partition(p);
                }
                if self.waiting() == 0
                    && let Ok(mut last) = self.producer.context().last.lock()
                {
                    // Nothing waited: the stall clock starts with this record.
                    *last = Instant::now();
                }
                match self.producer.send(record) {
                    Ok(()) => self.sent += 1,
                    Err((e, _)) => warn!(error = %e, topic, "could not append a tick"),
                }
            }
            Err(e) => warn!(error = %e, "could not encode a tick"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A producer holding ticks it cannot deliver is replaced once the stall time passes
    /// (before, the ticker kept one producer for good: stuck after a broker restart, it
    /// stopped the scheduler's clock). An idle producer is not replaced.
    #[test]
    fn a_ticker_producer_that_stopped_delivering_is_replaced() {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("enable.idempotence", "true");
        let mut ticks = TickProducer::new(config, Duration::from_millis(300)).unwrap();
        std::thread::sleep(Duration::from_millis(400));
        assert!(
            !ticks.replace_if_stalled(),
            "an idle producer is not stalled"
        );

        ticks.append("ticks", Some(0), "test", 1);
        assert!(
            !ticks.replace_if_stalled(),
            "replaced before the stall time"
        );
        std::thread::sleep(Duration::from_millis(400));
        assert!(ticks.replace_if_stalled(), "a stalled producer was kept");
        assert_eq!(ticks.replaced, 1);
        assert_eq!(ticks.sent, 0, "the new producer starts empty");
    }
}
