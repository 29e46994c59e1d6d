//! The raw Kafka baseline: a transactional consume -> produce pipe with the processor's batch
//! and commit settings and records of the scheduler's sizes. Its records/s is what this
//! machine's Kafka allows; the scheduler is measured against it.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ksched_runtime::topics::{serve_deliveries, transactional_retry_backoff};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Baseline {
    /// Input records piped per second.
    pub records_per_sec: f64,
    /// Records consumed plus produced per second (what the ratio compares with).
    pub io_records_per_sec: f64,
    pub records: u64,
    pub record_bytes: usize,
    pub seconds: f64,
    /// Input records/s of every run, of which this is the median.
    pub runs_records_per_sec: Vec<f64>,
    /// How many of the machine's cores were busy meanwhile (every process; Linux only).
    pub machine_busy_cores: Option<f64>,
}

impl Baseline {
    /// Consumed + produced records/s over 3: the most jobs/s this Kafka could carry if a job
    /// cost only its submission in, its dispatch out and its result in.
    pub(super) fn physical_limit_jobs_per_sec(&self) -> f64 {
        self.io_records_per_sec / 3.0
    }

    /// The run with the median throughput, listing all runs' figures.
    pub(super) fn median(mut runs: Vec<Baseline>) -> Baseline {
        runs.sort_by(|a, b| a.records_per_sec.total_cmp(&b.records_per_sec));
        let all: Vec<f64> = runs.iter().map(|b| b.records_per_sec).collect();
        let mut b = runs.swap_remove(runs.len() / 2);
        b.runs_records_per_sec = all;
        b
    }
}

pub(super) fn run(
    client: &ClientConfig,
    input: &str,
    output: &str,
    records: u64,
    record_bytes: usize,
    max_batch: usize,
    commit_interval: Duration,
) -> Result<Baseline> {
    // Fill the input.
    let producer: BaseProducer = client
        .clone()
        .set("enable.idempotence", "true")
        .set("linger.ms", "20")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "2000000")
        .create()?;
    let payload = vec![b'x'; record_bytes];
    for i in 0..records {
        let key = format!("job-{i}");
        super::send(&producer, BaseRecord::to(input).key(&key).payload(&payload))?;
    }
    producer.flush(Duration::from_secs(60))?;

    let consumer: BaseConsumer = client
        .clone()
        .set("group.id", format!("{input}-pipe"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "10")
        .set("fetch.queue.backoff.ms", "1")
        .create()?;
    consumer.subscribe(&[input])?;
    // The processor's transactional settings, its retry backoff included.
    let txn: BaseProducer = transactional_retry_backoff(&mut client.clone())
        .set("transactional.id", format!("{input}-pipe"))
        .set("enable.idempotence", "true")
        .set("linger.ms", "2")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let timeout = Duration::from_secs(30);
    txn.init_transactions(timeout)?;
    let mut done = 0u64;
    let mut started: Option<Instant> = None;
    let deadline = Instant::now() + Duration::from_secs(300);
    while done < records {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the baseline pipe stalled at {done}/{records}"
        );
        let mut batch = Vec::new();
        let mut window: Option<Instant> = None;
        while batch.len() < max_batch {
            let wait = match window {
                None => Duration::from_millis(100),
                Some(w) => match w.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left,
                    _ => break,
                },
            };
            match consumer.poll(wait) {
                Some(Ok(m)) => {
                    window.get_or_insert_with(|| Instant::now() + commit_interval);
                    started.get_or_insert_with(Instant::now);
                    batch.push((
                        m.topic().to_owned(),
                        m.partition(),
                        m.offset(),
                        m.key().map(<[u8]>::to_vec).unwrap_or_default(),
                        m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                    ));
                }
                Some(Err(e)) => return Err(e).context("baseline consumer"),
                None if window.is_none() => break,
                None => {}
            }
        }
        if batch.is_empty() {
            continue;
        }
        txn.begin_transaction()?;
        let mut offsets = std::collections::BTreeMap::new();
        for (topic, partition, offset, key, value) in &batch {
            super::send(&txn, BaseRecord::to(output).key(key).payload(value))?;
            offsets.insert((topic.clone(), *partition), offset + 1);
        }
        let mut tpl = TopicPartitionList::new();
        for ((t, p), o) in offsets {
            tpl.add_partition_offset(&t, p, Offset::Offset(o))?;
        }
        let meta = consumer
            .group_metadata()
            .context("the pipe consumer has no group metadata")?;
        txn.send_offsets_to_transaction(&tpl, &meta, timeout)?;
        // As the processor does: serve delivery reports before committing (rust-rdkafka's
        // flush inside commit_transaction polls in 100 ms steps), napping, not spinning.
        while txn.in_flight_count() > 0 {
            serve_deliveries(&txn);
        }
        txn.commit_transaction(timeout)?;
        done += batch.len() as u64;
    }
    let seconds = started.map_or(0.0, |s| s.elapsed().as_secs_f64()).max(1e-9);
    Ok(Baseline {
        records_per_sec: records as f64 / seconds,
        io_records_per_sec: 2.0 * records as f64 / seconds,
        records,
        record_bytes,
        seconds,
        runs_records_per_sec: vec![records as f64 / seconds],
        machine_busy_cores: None,
    })
}
