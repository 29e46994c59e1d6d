//! The ticker: appends a Tick to the control topic every `tick_interval_ms`, so time reaches
//! the core only through the log (DESIGN invariant 1), and a marker Tick to every partition
//! of the evidence topics (results, heartbeats), so the processor knows how far it has read
//! each of them even when no worker writes there (docs/architecture.md, "Time"). Record
//! timestamps are the broker's (those topics use LogAppendTime), so every decision uses one
//! clock. It stops on shutdown and when the processor stopped for good.

use std::thread::JoinHandle;
use std::time::Duration;

use ksched_core::records::Tick;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::{Result, kafka};
use crate::processor::wall_clock_ms;
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
    let producer: BaseProducer = client_config(settings)
        .set("client.id", format!("{}-ticker", settings.kafka.client_id))
        .set("enable.idempotence", "true")
        .set("linger.ms", "0")
        .create()
        .map_err(kafka("creating the ticker producer"))?;
    let mut markers: Vec<(String, i32)> = Vec::new();
    for topic in [&topics.results, &topics.heartbeats] {
        let n = partition_count(settings, topic)?;
        markers.extend((0..n).map(|p| (topic.clone(), p)));
    }
    let control = topics.control.clone();
    let interval = Duration::from_millis(settings.processor.tick_interval_ms);
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
                    append(&producer, topic, Some(*partition), MARKER_SOURCE, now);
                }
                append(&producer, &control, None, &source, now);
                producer.poll(Duration::ZERO);
                crate::sleep_unless(&shutdown, interval);
            }
            let _ = producer.flush(Duration::from_secs(2));
        })
        .map_err(crate::error::io("starting the ticker thread"))?;
    Ok(handle)
}

fn append(producer: &BaseProducer, topic: &str, partition: Option<i32>, source: &str, now: i64) {
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
            if let Err((e, _)) = producer.send(record) {
                warn!(error = %e, topic, "could not append a tick");
            }
        }
        Err(e) => warn!(error = %e, "could not encode a tick"),
    }
}
