//! Timers: what delayed jobs and schedules cost the processor, through the real core and
//! store as the processor drives them (decide, continue what the per-entry bound cut,
//! checkpoint, evict), in scheduler time that the bench advances itself (no broker).
//!
//! - `jobs` delayed jobs due over `window_ms`, released by Ticks every 100 ms: resident memory
//!   while they wait, how late each release is in scheduler time, and the wall time the
//!   releases take against the window they cover (below 1, the processor keeps up).
//! - `schedules` cron schedules that all fire at the same minute: the wall time to decide
//!   every firing, and how late the last one is in scheduler time.
//!
//! What a real deployment adds to a release's lateness is the Tick interval (1 s by default,
//! here 100 ms) and the processor's commit: the end-to-end figures of `ksched bench`.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use ksched_core::decide::Ctx;
use ksched_core::events::{Cause, Event, Input};
use ksched_core::policy::AllowAll;
use ksched_core::records::{
    JobRequest, JobTemplate, Millis, ScheduleAction, ScheduleCommand, ScheduleSpec, Tick,
};
use ksched_runtime::settings::KafkaSettings;
use ksched_runtime::{Config, Engine};
use ksched_store::Store;
use serde::Serialize;

use super::memory::{backlog_rules, rss_bytes};
use super::{BenchArgs, bench_config, phase};

/// Scheduler time the bench starts at (2026-01-01T00:00:00Z), a whole minute.
const T0: Millis = 1_767_225_600_000;
/// Scheduler time between two Ticks.
const TICK_MS: Millis = 100;
const MIB: f64 = 1024.0 * 1024.0;

#[derive(Debug, Default, Serialize)]
pub(super) struct Timers {
    pub delayed_jobs: u64,
    pub window_ms: i64,
    pub rss_before_mib: f64,
    /// Every job submitted and waiting DELAYED (checkpointed, evicted from memory).
    pub rss_waiting_mib: f64,
    /// Resident memory as the jobs were submitted: (jobs waiting, MiB), ten points.
    pub rss_waiting_curve: Vec<(u64, f64)>,
    pub submit_seconds: f64,
    /// Released - due, in scheduler time.
    pub release_late_ms_p50: i64,
    pub release_late_ms_p99: i64,
    pub release_late_ms_max: i64,
    /// Wall time of the release Ticks (with their continuations and checkpoints) over the
    /// scheduler time they covered.
    pub release_wall_seconds: f64,
    pub release_load: f64,
    pub release_tick_wall_ms_p50: f64,
    pub release_tick_wall_ms_p99: f64,
    pub release_tick_wall_ms_max: f64,
    /// Every job released (PENDING, in memory: no worker takes them here).
    pub rss_released_mib: f64,
    pub schedules: u64,
    pub schedules_create_seconds: f64,
    pub rss_schedules_mib: f64,
    /// Wall time to decide every schedule's firing of one minute (one Tick and its
    /// continuations): how late the last firing is decided.
    pub firing_wall_seconds: f64,
    pub firings: u64,
}

fn percentile_i(v: &mut [i64], p: f64) -> i64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

pub(super) fn percentile_f(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Drives one input and every continuation it needs; returns their events.
fn drive(engine: &mut Engine, cause: &Cause, at: Millis, input: Input) -> Result<Vec<Event>> {
    let ctx = Ctx { policy: &AllowAll };
    let mut p = engine.decide(&ctx, cause.clone(), at, input)?;
    let mut events = std::mem::take(&mut p.entry.events);
    while p.more {
        let next = engine.continuation();
        p = engine.decide(&ctx, cause.clone(), at, next)?;
        events.append(&mut p.entry.events);
    }
    Ok(events)
}

fn tick(at: Millis) -> Input {
    Input::Tick(Tick {
        source: "bench".into(),
        issued_at: at,
        watermark: Some(at),
    })
}

pub(super) fn run(
    config: &Config,
    jobs: u64,
    window_ms: i64,
    schedules: u64,
    dir: &Path,
    waiting_only: bool,
) -> Result<Timers> {
    let before = rss_bytes();
    let (topic, mut rules) = backlog_rules(config);
    rules.limits.max_schedules = u32::try_from(schedules).unwrap_or(u32::MAX).max(1);
    rules.timing.placement_timeout_ms = 24 * 3_600_000;
    let reconfigure = Config {
        rules,
        ..config.clone()
    }
    .reconfigure();
    let mut engine = Engine::open(Store::open(dir, 0)?)?;
    let mut offset = 0i64;
    let mut cause = || {
        offset += 1;
        Cause {
            topic: "ksched.control".into(),
            partition: 0,
            offset,
        }
    };
    drive(&mut engine, &cause(), T0, Input::Reconfigure(reconfigure))?;

    // Delayed jobs, due over the window in an order unlike their submission.
    let mut curve = Vec::new();
    let started = Instant::now();
    let step = (window_ms.max(1) as u64).max(1);
    for n in 0..jobs {
        let due = T0 + 1_000 + i64::try_from((n * 7_919) % step).unwrap_or(0);
        let request = JobRequest {
            job_id: format!("timer-{n:09}"),
            topic: topic.clone(),
            tenant_id: format!("tenant-{}", n % 100),
            principal_id: Some("bench".into()),
            payload: vec![7u8; 64],
            not_before: Some(due),
            ..Default::default()
        };
        let c = Cause {
            topic: topic.clone(),
            ..cause()
        };
        drive(&mut engine, &c, T0, Input::Submit(request))?;
        if n % 5_000 == 4_999 {
            engine.checkpoint(None)?;
        }
        if (n + 1) % (jobs / 10).max(1) == 0 {
            curve.push((n + 1, rss_bytes() as f64 / MIB));
        }
    }
    engine.checkpoint(None)?;
    let submit_seconds = started.elapsed().as_secs_f64();
    let waiting = rss_bytes();
    if waiting_only {
        return Ok(Timers {
            delayed_jobs: jobs,
            window_ms,
            rss_before_mib: before as f64 / MIB,
            rss_waiting_mib: waiting as f64 / MIB,
            rss_waiting_curve: curve,
            submit_seconds,
            ..Timers::default()
        });
    }

    // Release them, a Tick every 100 ms of scheduler time.
    let mut late = Vec::with_capacity(usize::try_from(jobs).unwrap_or(0));
    let mut tick_wall = Vec::new();
    let started = Instant::now();
    let mut at = T0;
    let end = T0 + 1_000 + window_ms + TICK_MS;
    while at <= end {
        at += TICK_MS;
        let t = Instant::now();
        for e in drive(&mut engine, &cause(), at, tick(at))? {
            if let Event::JobReleased(r) = e {
                late.push(r.released_at - r.not_before);
            }
        }
        engine.checkpoint(None)?;
        tick_wall.push(t.elapsed().as_secs_f64() * 1_000.0);
    }
    let release_wall_seconds = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        late.len() as u64 == jobs,
        "{} of {jobs} delayed jobs were released",
        late.len()
    );
    let released = rss_bytes();

    // Schedules that all fire at the next minute.
    let started = Instant::now();
    for n in 0..schedules {
        let command = ScheduleCommand {
            schedule_id: format!("every-minute-{n:06}"),
            tenant_id: format!("tenant-{}", n % 100),
            action: ScheduleAction::Create,
            spec: Some(ScheduleSpec {
                cron: Some("* * * * *".into()),
                time_zone: "UTC".into(),
                template: JobTemplate {
                    topic: topic.clone(),
                    payload: vec![7u8; 64],
                    ..Default::default()
                },
                catch_up_window_ms: 86_400_000,
                ..Default::default()
            }),
            principal_id: "bench".into(),
            reason: None,
            requested_at: at,
        };
        drive(&mut engine, &cause(), at, Input::Schedule(command))?;
        if n % 5_000 == 4_999 {
            engine.checkpoint(None)?;
        }
    }
    engine.checkpoint(None)?;
    let schedules_create_seconds = started.elapsed().as_secs_f64();
    let with_schedules = rss_bytes();
    let minute = (at / 60_000 + 1) * 60_000;
    let started = Instant::now();
    let events = drive(&mut engine, &cause(), minute, tick(minute))?;
    engine.checkpoint(None)?;
    let firing_wall_seconds = started.elapsed().as_secs_f64();
    let fired = events
        .iter()
        .filter(|e| matches!(e, Event::ScheduleFired(f) if f.slot == minute))
        .count() as u64;
    anyhow::ensure!(fired == schedules, "{fired} of {schedules} schedules fired");
    Ok(Timers {
        delayed_jobs: jobs,
        window_ms,
        rss_before_mib: before as f64 / MIB,
        rss_waiting_mib: waiting as f64 / MIB,
        rss_waiting_curve: curve,
        submit_seconds,
        release_late_ms_p50: percentile_i(&mut late, 0.5),
        release_late_ms_p99: percentile_i(&mut late, 0.99),
        release_late_ms_max: percentile_i(&mut late, 1.0),
        release_wall_seconds,
        release_load: release_wall_seconds / ((end - T0) as f64 / 1_000.0),
        release_tick_wall_ms_p50: percentile_f(&mut tick_wall, 0.5),
        release_tick_wall_ms_p99: percentile_f(&mut tick_wall, 0.99),
        release_tick_wall_ms_max: percentile_f(&mut tick_wall, 1.0),
        rss_released_mib: released as f64 / MIB,
        schedules,
        schedules_create_seconds,
        rss_schedules_mib: with_schedules as f64 / MIB,
        firing_wall_seconds,
        firings: fired,
    })
}

/// `ksched bench --timers N`: delayed jobs and schedules, through the core and the store.
pub(super) fn timers_only(args: &BenchArgs, jobs: u64) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let kafka = KafkaSettings {
        bootstrap_servers: args.bootstrap_servers.clone(),
        ..KafkaSettings::default()
    };
    let config = bench_config(&kafka, "bench.timers.", dir.path(), None);
    let window_ms = i64::try_from(args.timers_window_secs.saturating_mul(1_000)).unwrap_or(60_000);
    phase(&format!(
        "timers: {jobs} delayed jobs due over {} s, then {} schedules firing at one minute",
        args.timers_window_secs, args.timers_schedules
    ));
    let t = run(
        &config,
        jobs,
        window_ms,
        args.timers_schedules,
        &dir.path().join("store"),
        args.timers_waiting_only,
    )?;
    eprintln!(
        "        waiting: RSS {:.0} MiB -> {:.0} MiB with {} jobs DELAYED (submitted in {:.1} s); on the way: {}",
        t.rss_before_mib,
        t.rss_waiting_mib,
        t.delayed_jobs,
        t.submit_seconds,
        (t.rss_waiting_curve.iter())
            .map(|(n, m)| format!("{n} {m:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if args.timers_waiting_only {
        std::fs::write(&args.out, serde_json::to_string_pretty(&t)?)?;
        return Ok(());
    }
    eprintln!(
        "        released: late by p50 {} / p99 {} / max {} ms of scheduler time (Ticks every {TICK_MS} ms); \
         {:.1} s of wall time for {:.1} s of scheduler time (load {:.2}); a Tick p50 {:.1} / p99 {:.1} / max {:.1} ms",
        t.release_late_ms_p50,
        t.release_late_ms_p99,
        t.release_late_ms_max,
        t.release_wall_seconds,
        (t.window_ms + 1_000 + TICK_MS) as f64 / 1_000.0,
        t.release_load,
        t.release_tick_wall_ms_p50,
        t.release_tick_wall_ms_p99,
        t.release_tick_wall_ms_max
    );
    eprintln!(
        "        schedules: {} made in {:.1} s (RSS {:.0} MiB with the released jobs); {} firings of one minute decided in {:.2} s",
        t.schedules,
        t.schedules_create_seconds,
        t.rss_schedules_mib,
        t.firings,
        t.firing_wall_seconds
    );
    std::fs::write(&args.out, serde_json::to_string_pretty(&t)?)?;
    Ok(())
}

/// `ksched bench --timers-dispatch N`: delayed jobs through the broker, a whole scheduler and
/// SDK workers; how late after its time each was released and dispatched.
pub(super) fn dispatch_only(args: &BenchArgs, jobs: u64) -> Result<()> {
    let run = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let work = tempfile::tempdir()?;
    let (kafka, client) = super::kafka_clients(args)?;
    let prefix = format!("{run}.timers.");
    let mut config = bench_config(&kafka, &prefix, &work.path().join("timers"), None);
    super::tune(args, &mut config);
    let tick_ms = config.settings.processor.tick_interval_ms;
    super::ensure_topics(&config)?;
    let window = std::time::Duration::from_secs(args.timers_window_secs.max(1));
    // Submitted well before the first is due (submission runs at tens of thousands a second).
    let lead = std::time::Duration::from_secs(10 + jobs / 20_000);
    phase(&format!(
        "timers end to end: {jobs} delayed jobs due over {} s ({:.0}/s), Ticks every {tick_ms} ms",
        window.as_secs(),
        jobs as f64 / window.as_secs_f64()
    ));
    let mut rig = super::e2e::Rig::start(config, client, args.fleet(), "timers")?;
    let t = rig.timers(jobs, window, lead)?;
    rig.stop()?;
    let p = |x: &super::e2e::Percentiles| {
        format!(
            "p50 {:.0} / p99 {:.0} / p999 {:.0} ms",
            x.p50, x.p99, x.p999
        )
    };
    eprintln!(
        "        submitted in {:.1} s, the last {:.1} s before the first was due; {} dispatched early",
        t.submit_seconds,
        t.submitted_before_due_ms / 1000.0,
        t.early
    );
    eprintln!(
        "        due -> released and dispatched (decided): {}; due -> dispatch committed: {}",
        p(&t.due_to_decided_ms),
        p(&t.due_to_dispatch_visible_ms)
    );
    std::fs::write(&args.out, serde_json::to_string_pretty(&t)?)?;
    Ok(())
}
