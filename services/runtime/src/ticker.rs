//! The ticker: appends a Tick to the control topic every `tick_interval_ms`, so time reaches
//! the core only through the log (DESIGN invariant 1). Its record timestamps are assigned by
//! the broker (the control topic uses LogAppendTime), so every decision uses one clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use ksched_core::records::Tick;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use tracing::{info, warn};

use crate::error::{Result, kafka};
use crate::processor::wall_clock_ms;
use crate::settings::Settings;
use crate::topics::{Topics, client_config};

/// Starts the ticker thread; it stops when `shutdown` is set.
pub fn spawn(
    settings: &Settings,
    topics: &Topics,
    shutdown: Arc<AtomicBool>,
) -> Result<JoinHandle<()>> {
    let producer: BaseProducer = client_config(settings)
        .set("client.id", format!("{}-ticker", settings.kafka.client_id))
        .set("enable.idempotence", "true")
        .set("linger.ms", "0")
        .create()
        .map_err(kafka("creating the ticker producer"))?;
    let topic = topics.control.clone();
    let interval = Duration::from_millis(settings.processor.tick_interval_ms);
    let source = format!("{}-{}", settings.kafka.client_id, std::process::id());
    let handle = std::thread::Builder::new()
        .name("ksched-ticker".into())
        .spawn(move || {
            info!(topic = %topic, interval_ms = interval.as_millis() as u64, "ticker started");
            while !shutdown.load(Ordering::Relaxed) {
                let tick = Tick {
                    source: source.clone(),
                    issued_at: wall_clock_ms(),
                };
                match ksched_codec::encode(&tick) {
                    Ok(bytes) => {
                        if let Err((e, _)) =
                            producer.send(BaseRecord::to(&topic).key("tick").payload(&bytes))
                        {
                            warn!(error = %e, "could not append a tick");
                        }
                    }
                    Err(e) => warn!(error = %e, "could not encode a tick"),
                }
                producer.poll(Duration::ZERO);
                sleep_unless(&shutdown, interval);
            }
            let _ = producer.flush(Duration::from_secs(2));
        })
        .map_err(|e| crate::error::Error::Other(format!("starting the ticker thread: {e}")))?;
    Ok(handle)
}

/// Sleeps up to `d`, waking early when `flag` is set.
pub(crate) fn sleep_unless(flag: &AtomicBool, d: Duration) {
    let step = Duration::from_millis(50);
    let mut left = d;
    while !left.is_zero() && !flag.load(Ordering::Relaxed) {
        let s = left.min(step);
        std::thread::sleep(s);
        left = left.saturating_sub(s);
    }
}
