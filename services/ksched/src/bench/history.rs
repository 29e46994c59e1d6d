//! History for the replay, recovery and scale measurements: a journal written by running the
//! real decision core over a synthetic stream (submit, success, heartbeats), as a processor
//! would have written it, then rebuilt into a RocksDB projection.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use ksched_core::decide::Ctx;
use ksched_core::events::{Cause, Input};
use ksched_core::policy::AllowAll;
use ksched_core::records::{Heartbeat, JobRequest, JobResult, Tick};
use ksched_runtime::audit::{self, Source};
use ksched_runtime::{Config, Engine};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct History {
    pub jobs: u64,
    pub entries: u64,
    pub events: u64,
    pub generate_seconds: f64,
    pub rebuild_seconds: f64,
    pub rebuild_events_per_sec: f64,
}

pub(super) const WORKERS: usize = 4;

/// Writes a journal for `jobs` jobs to `config`'s journal topic and rebuilds it into
/// `data_dir`.
pub(super) fn build(
    client: &ClientConfig,
    config: &Config,
    jobs: u64,
    data_dir: &Path,
) -> Result<History> {
    let topics = ksched_runtime::topics_of(config);
    let job_topic = topics.jobs[0].clone();
    let producer: BaseProducer = client
        .clone()
        .set("enable.idempotence", "true")
        .set("linger.ms", "50")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "2000000")
        .set("queue.buffering.max.kbytes", "2000000")
        .create()?;
    let started = Instant::now();
    // The generator decides as a processor does, over a scratch projection of its own.
    let scratch = tempfile::tempdir()?;
    let mut engine = Engine::open(ksched_store::Store::open(scratch.path(), 0)?)?;
    let ctx = Ctx { policy: &AllowAll };
    let mut clock: i64 = 1_700_000_000_000;
    // Inputs are attributed to the topics a processor would have read them from (routing
    // goes by the topic a job arrived on).
    let mut offsets: BTreeMap<String, i64> = BTreeMap::new();
    let mut entries = 0u64;
    let mut events = 0u64;
    let mut emit = |engine: &mut Engine, topic: &str, input: Input, clock: i64| -> Result<()> {
        let off = offsets.entry(topic.to_owned()).or_default();
        let cause = Cause {
            topic: topic.to_owned(),
            partition: 0,
            offset: *off,
        };
        *off += 1;
        let p = engine.decide(&ctx, cause, clock, input)?;
        entries += 1;
        events += p.entry.events.len() as u64;
        let bytes = ksched_codec::encode(&p.entry)?;
        let key = p.entry.key();
        let rec = BaseRecord::to(&topics.journal)
            .partition(0)
            .key(&key)
            .payload(&bytes);
        super::send(&producer, rec)
    };
    emit(
        &mut engine,
        &topics.control,
        Input::Reconfigure(config.reconfigure()),
        clock,
    )?;
    let heartbeat = |w: usize, clock: i64| Heartbeat {
        worker_id: format!("history-worker-{w}"),
        pool: "default".into(),
        max_parallel_jobs: 1_000_000,
        owned_partitions: vec![i32::try_from(w).unwrap_or(0)],
        sent_at: clock,
        ..Default::default()
    };
    for j in 0..jobs {
        if j % 1_000 == 0 {
            for w in 0..WORKERS {
                clock += 1;
                emit(
                    &mut engine,
                    &topics.heartbeats,
                    Input::Heartbeat(heartbeat(w, clock)),
                    clock,
                )?;
            }
            // The generator only needs the working set; finished jobs go to the scratch store.
            engine.checkpoint(None)?;
        }
        let id = format!("history-{j}");
        clock += 1;
        let req = JobRequest {
            job_id: id.clone(),
            topic: job_topic.clone(),
            tenant_id: format!("tenant-{}", j % 10),
            submitted_at: clock,
            ..Default::default()
        };
        emit(&mut engine, &job_topic, Input::Submit(req), clock)?;
        // Every job of the history is dispatched and succeeds; anything else means the
        // generator's inputs are not what a processor would see.
        let job = engine.state().jobs.get(&id);
        let Some(worker_id) = job.and_then(|j| j.worker_id.clone()) else {
            anyhow::bail!(
                "history job {id} was not dispatched (state {:?})",
                job.map(|j| j.state)
            );
        };
        clock += 1;
        let result = JobResult::succeeded(id, 1, worker_id, 1, clock);
        emit(&mut engine, &topics.results, Input::Result(result), clock)?;
    }
    // The history's workers are gone by the time the bench runs: a tick past their TTL
    // says so, as the live ticker would.
    clock += config.rules.timing.worker_ttl_ms + 1;
    let tick = Tick {
        source: "bench-history".into(),
        issued_at: clock,
        watermark: Some(clock),
    };
    emit(&mut engine, &topics.control, Input::Tick(tick), clock)?;
    producer.flush(Duration::from_secs(300))?;
    let generate_seconds = started.elapsed().as_secs_f64();
    let src = Source {
        client: client.clone(),
        topic: topics.journal.clone(),
        partition: 0,
    };
    let report = audit::rebuild(&src, data_dir, None, |_| {})?;
    Ok(History {
        jobs,
        entries,
        events,
        generate_seconds,
        rebuild_seconds: report.elapsed.as_secs_f64(),
        rebuild_events_per_sec: report.events_per_sec(),
    })
}
