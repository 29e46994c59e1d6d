//! Dependencies: what a fan-out costs the processor, through the real core and store as the
//! processor drives them (decide, continue what the per-entry bound cut, checkpoint, evict),
//! without a broker.
//!
//! `jobs` jobs wait BLOCKED for one job (`ALL_TERMINAL`); resident memory while they wait;
//! then that job ends, and every waiting job is told and queued: the wall time from the
//! entry that ended it to the last job released, the number of entries it took, and the
//! longest one (what bounds how long any other input waits behind the fan-out).

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use ksched_core::decide::Ctx;
use ksched_core::events::{Cause, Event, Input};
use ksched_core::policy::AllowAll;
use ksched_core::records::{CancelJob, DependencyCondition, JobRequest, Millis};
use ksched_runtime::{Config, Engine};
use ksched_store::Store;
use serde::Serialize;

use super::memory::{backlog_rules, rss_bytes};
use super::timers::percentile_f as percentile;
use super::{BenchArgs, offline_config, phase};

const T0: Millis = 1_767_225_600_000;
const MIB: f64 = 1024.0 * 1024.0;
/// Entries between two checkpoints, as a busy processor writes them.
const CHECKPOINT_EVERY: u64 = 5_000;

#[derive(Debug, Default, Serialize)]
pub(super) struct FanOut {
    pub dependents: u64,
    pub rss_before_mib: f64,
    /// Every dependent submitted and BLOCKED (checkpointed, evicted from memory).
    pub rss_blocked_mib: f64,
    pub submit_seconds: f64,
    /// From the entry that ended the job waited for to the last dependent released.
    pub release_seconds: f64,
    pub released: u64,
    /// Entries (the end's and its continuations) the release took.
    pub entries: u64,
    /// Wall time of one entry (decide with its loads; checkpoints apart), in ms.
    pub entry_ms_p50: f64,
    pub entry_ms_p99: f64,
    pub entry_ms_max: f64,
    /// The checkpoints written during the release, in ms (longest).
    pub checkpoint_ms_max: f64,
    /// Every dependent released (PENDING: no worker takes them here).
    pub rss_released_mib: f64,
}

pub(super) fn run(config: &Config, jobs: u64, dir: &Path) -> Result<FanOut> {
    let before = rss_bytes();
    let (topic, mut rules) = backlog_rules(config);
    rules.limits.max_blocked_jobs = i64::MAX;
    rules.timing.placement_timeout_ms = 24 * 3_600_000;
    let reconfigure = Config {
        rules,
        ..config.clone()
    }
    .reconfigure();
    let mut engine = Engine::open(Store::open(dir, 0)?)?;
    let ctx = Ctx { policy: &AllowAll };
    let mut offset = 0i64;
    let mut cause = |topic: &str| {
        offset += 1;
        Cause {
            topic: topic.to_owned(),
            partition: 0,
            offset,
        }
    };
    let drive = |engine: &mut Engine, c: Cause, input: Input| -> Result<bool> {
        Ok(engine.decide(&ctx, c, T0, input)?.more)
    };
    drive(
        &mut engine,
        cause("ksched.control"),
        Input::Reconfigure(reconfigure),
    )?;
    let request = |id: String, deps: Vec<String>| JobRequest {
        job_id: id,
        topic: topic.clone(),
        tenant_id: "acme".into(),
        principal_id: Some("bench".into()),
        payload: vec![7u8; 64],
        depends_on: deps,
        dependency_condition: DependencyCondition::AllTerminal,
        ..Default::default()
    };
    let root = "acme:root".to_owned();
    drive(
        &mut engine,
        cause(&topic),
        Input::Submit(request(root.clone(), Vec::new())),
    )?;
    let started = Instant::now();
    for n in 0..jobs {
        let id = format!("acme:fan-{n:09}");
        drive(
            &mut engine,
            cause(&topic),
            Input::Submit(request(id, vec![root.clone()])),
        )?;
        if n % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1 {
            engine.checkpoint(None)?;
        }
    }
    engine.checkpoint(None)?;
    let submit_seconds = started.elapsed().as_secs_f64();
    let blocked = rss_bytes();

    // The job waited for ends; its dependents are told as the processor would tell them.
    let mut entry_ms = Vec::new();
    let mut checkpoint_ms: f64 = 0.0;
    let mut released = 0u64;
    let started = Instant::now();
    let mut input = Input::Cancel(CancelJob {
        job_id: root.clone(),
        principal_id: "bench".into(),
        ..Default::default()
    });
    let mut since_checkpoint = 0;
    loop {
        let t = Instant::now();
        let p = engine.decide(&ctx, cause("ksched.control"), T0, input)?;
        entry_ms.push(t.elapsed().as_secs_f64() * 1_000.0);
        released += (p.entry.events.iter())
            .filter(|e| matches!(e, Event::JobUnblocked(_)))
            .count() as u64;
        since_checkpoint += p.entry.events.len() as u64;
        if since_checkpoint >= CHECKPOINT_EVERY {
            let t = Instant::now();
            engine.checkpoint(None)?;
            checkpoint_ms = checkpoint_ms.max(t.elapsed().as_secs_f64() * 1_000.0);
            since_checkpoint = 0;
        }
        if !p.more {
            break;
        }
        input = engine.continuation();
    }
    engine.checkpoint(None)?;
    let release_seconds = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        released == jobs,
        "{released} of {jobs} dependents were released"
    );
    Ok(FanOut {
        dependents: jobs,
        rss_before_mib: before as f64 / MIB,
        rss_blocked_mib: blocked as f64 / MIB,
        submit_seconds,
        release_seconds,
        released,
        entries: entry_ms.len() as u64,
        entry_ms_p50: percentile(&mut entry_ms, 0.5),
        entry_ms_p99: percentile(&mut entry_ms, 0.99),
        entry_ms_max: percentile(&mut entry_ms, 1.0),
        checkpoint_ms_max: checkpoint_ms,
        rss_released_mib: rss_bytes() as f64 / MIB,
    })
}

/// `ksched bench --fan-out N`: one job with N dependents, through the core and the store.
pub(super) fn fan_out_only(args: &BenchArgs, jobs: u64) -> Result<()> {
    let (dir, config) = offline_config(args, "bench.fanout.")?;
    phase(&format!(
        "fan-out: {jobs} jobs BLOCKED on one job, then that job ends (core and store, no broker)"
    ));
    let f = run(&config, jobs, &dir.path().join("store"))?;
    eprintln!(
        "        blocked: RSS {:.0} MiB -> {:.0} MiB with {} jobs BLOCKED (submitted in {:.1} s)",
        f.rss_before_mib, f.rss_blocked_mib, f.dependents, f.submit_seconds
    );
    eprintln!(
        "        released: {} in {:.2} s over {} entries; an entry p50 {:.2} / p99 {:.2} / max {:.2} ms; a checkpoint max {:.0} ms; RSS {:.0} MiB with them all PENDING",
        f.released,
        f.release_seconds,
        f.entries,
        f.entry_ms_p50,
        f.entry_ms_p99,
        f.entry_ms_max,
        f.checkpoint_ms_max,
        f.rss_released_mib
    );
    std::fs::write(&args.out, serde_json::to_string_pretty(&f)?)?;
    Ok(())
}
