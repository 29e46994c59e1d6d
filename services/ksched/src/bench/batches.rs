//! Batches: what a fan-in costs the processor, through the real core and store as the
//! processor drives them (decide, continue what the per-entry bound cut, checkpoint, evict),
//! without a broker.
//!
//! A callback waits for a batch of `jobs` members; one worker of 1,000 slots runs them, every
//! one succeeding at once, its heartbeat and a Tick every 1,000 results (a second of log
//! time). Reported: the members' pace, resident memory, and from the entry of the last
//! member's result to the entry that dispatches the callback: wall time and entries.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use ksched_core::decide::Ctx;
use ksched_core::events::{Cause, Event, Input};
use ksched_core::policy::AllowAll;
use ksched_core::records::{Heartbeat, JobRequest, JobResult, Tick};
use ksched_runtime::{Config, Engine};
use ksched_store::Store;
use serde::Serialize;

use super::memory::{backlog_rules, rss_bytes};
use super::{BenchArgs, offline_config, phase};

const MIB: f64 = 1024.0 * 1024.0;

/// A job dispatched: its id, the attempt, and the counts its request carried (a callback's).
type Placed = (String, i32, Option<(i32, i32)>);
const CALLBACK: &str = "acme:callback";

#[derive(Debug, Default, Serialize)]
pub(super) struct FanIn {
    pub members: u64,
    /// Submitting every member and running it to its end (results), per second.
    pub members_per_second: f64,
    pub rss_peak_mib: f64,
    /// From the entry of the last member's result to the callback's dispatch, inclusive.
    pub callback_ms: f64,
    /// Entries that took (the result's and its continuations).
    pub callback_entries: u64,
    /// The counts the callback's dispatch carried.
    pub succeeded: i32,
    pub failed: i32,
}

pub(super) fn run(config: &Config, jobs: u64, dir: &Path) -> Result<FanIn> {
    let (topic, rules) = backlog_rules(config);
    let reconfigure = Config {
        rules,
        ..config.clone()
    }
    .reconfigure();
    let mut engine = Engine::open(Store::open(dir, 0)?)?;
    let ctx = Ctx { policy: &AllowAll };
    let offset = std::cell::Cell::new(0i64);
    let now = || 1_767_225_600_000 + offset.get();
    // Decides an input and what the per-entry bound cut; returns the jobs dispatched and
    // the entries it took.
    let decide = |engine: &mut Engine, input: Input, placed: &mut Vec<Placed>| -> Result<u64> {
        let mut input = input;
        let mut entries = 0;
        loop {
            offset.set(offset.get() + 1);
            // A job is routed by the topic it was read from.
            let topic = match &input {
                Input::Submit(r) => r.topic.clone(),
                _ => "ksched.control".to_owned(),
            };
            let cause = Cause {
                topic,
                partition: 0,
                offset: offset.get(),
            };
            let p = engine.decide(&ctx, cause, now(), input)?;
            entries += 1;
            for e in &p.entry.events {
                if let Event::JobDispatched(d) = e {
                    let outcome = (engine.state().jobs.get(&d.job_id))
                        .and_then(|j| j.request.batch_outcome.as_ref())
                        .map(|o| (o.succeeded, o.failed));
                    placed.push((d.job_id.clone(), d.attempt, outcome));
                }
            }
            if offset.get() % 1_000 == 0 {
                engine.checkpoint(Some(offset.get()))?;
            }
            if !p.more {
                return Ok(entries);
            }
            input = engine.continuation();
        }
    };
    let mut placed = Vec::new();
    decide(&mut engine, Input::Reconfigure(reconfigure), &mut placed)?;
    let request = |id: String| JobRequest {
        job_id: id,
        topic: topic.clone(),
        tenant_id: "acme".into(),
        principal_id: Some("bench".into()),
        payload: vec![7u8; 64],
        ..Default::default()
    };
    let callback = JobRequest {
        after_batch: Some("fan-in".into()),
        ..request(CALLBACK.into())
    };
    decide(&mut engine, Input::Submit(callback), &mut placed)?;
    let heartbeat = |at| Heartbeat {
        worker_id: "fan-in".into(),
        pool: "default".into(),
        max_parallel_jobs: 1_000,
        owned_partitions: vec![0],
        sent_at: at,
        ..Default::default()
    };
    let started = Instant::now();
    decide(&mut engine, Input::Heartbeat(heartbeat(now())), &mut placed)?;
    let mut peak = rss_bytes();
    let mut submitted = 0u64;
    let mut done = 0u64;
    let mut last = None;
    let mut callback = None;
    while done < jobs || callback.is_none() {
        // Members go in as the worker frees slots, as a producer keeping ahead would.
        while submitted < jobs && placed.len() < 2_000 {
            let member = JobRequest {
                batch_id: Some("fan-in".into()),
                batch_size: Some(i32::try_from(jobs)?),
                ..request(format!("acme:member-{submitted:09}"))
            };
            decide(&mut engine, Input::Submit(member), &mut placed)?;
            submitted += 1;
        }
        anyhow::ensure!(!placed.is_empty(), "nothing placed after {done} results");
        for (id, attempt, outcome) in std::mem::take(&mut placed) {
            if id == CALLBACK {
                callback = outcome;
                continue;
            }
            let result = JobResult::succeeded(id, attempt, "fan-in", 1, now());
            done += 1;
            if done == jobs {
                let t = Instant::now();
                let entries = decide(&mut engine, Input::Result(result), &mut placed)?;
                let dispatched = placed.iter().any(|(id, _, _)| id == CALLBACK);
                anyhow::ensure!(dispatched, "the last result did not dispatch the callback");
                last = Some((t.elapsed().as_secs_f64() * 1_000.0, entries));
                continue;
            }
            decide(&mut engine, Input::Result(result), &mut placed)?;
            if done.is_multiple_of(1_000) {
                decide(&mut engine, Input::Heartbeat(heartbeat(now())), &mut placed)?;
                let tick = Tick {
                    source: "bench".into(),
                    issued_at: now(),
                    watermark: Some(now()),
                };
                decide(&mut engine, Input::Tick(tick), &mut placed)?;
                peak = peak.max(rss_bytes());
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    engine.checkpoint(Some(offset.get()))?;
    let (callback_ms, callback_entries) = last.unwrap_or_default();
    let (succeeded, failed) = callback.unwrap_or_default();
    Ok(FanIn {
        members: jobs,
        members_per_second: jobs as f64 / seconds,
        rss_peak_mib: peak as f64 / MIB,
        callback_ms,
        callback_entries,
        succeeded,
        failed,
    })
}

/// `ksched bench --fan-in N`: a batch of N members into one callback, through the core and
/// the store.
pub(super) fn fan_in_only(args: &BenchArgs, jobs: u64) -> Result<()> {
    let (dir, config) = offline_config(args, "bench.fanin.")?;
    phase(&format!(
        "fan-in: a batch of {jobs} jobs into one callback (core and store, no broker)"
    ));
    let f = run(&config, jobs, &dir.path().join("store"))?;
    eprintln!(
        "        members: {} submitted and run at {:.0}/s; RSS peak {:.0} MiB",
        f.members, f.members_per_second, f.rss_peak_mib
    );
    eprintln!(
        "        last member's result -> callback dispatched: {:.2} ms over {} entries; the callback got {} succeeded, {} failed",
        f.callback_ms, f.callback_entries, f.succeeded, f.failed
    );
    anyhow::ensure!(
        i64::from(f.succeeded) == i64::try_from(jobs)? && f.failed == 0,
        "the callback's counts are wrong"
    );
    std::fs::write(&args.out, serde_json::to_string_pretty(&f)?)?;
    Ok(())
}
