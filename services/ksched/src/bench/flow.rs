//! `ksched bench --flow-keys N`: what concurrency keys cost. Saturation with every job
//! carrying one of N concurrency keys, the same jobs run twice on the same broker one
//! after the other: without limits, then with each key limited to `--flow-limit` at once.
//! The ratio of the two throughputs is the cost of the limits.
//!
//! `ksched bench --fair-share JOBS`: fair share between tenants, with the workers the
//! bottleneck (each job takes `--fair-share-work-ms`), so jobs wait in the scheduler's
//! queue: a backlog of JOBS of one tenant, then 100 of another, and how long those wait;
//! then JOBS of two tenants of weights 3 and 1 submitted together, and the share of the
//! dispatches each gets while both have jobs waiting.

use std::time::{Duration, Instant};

use anyhow::Result;
use ksched_core::rules::{ConcurrencyRule, TenantRules};

use super::e2e::{Percentiles, Rig, Saturation};
use super::{BenchArgs, Sizes, bench_config, phase};

#[derive(Debug, serde::Serialize)]
struct Flow {
    keys: u64,
    limit: u32,
    /// Saturation turns per run; the median turn is reported.
    turns: usize,
    unlimited: Saturation,
    limited: Saturation,
    /// Limited throughput over unlimited.
    ratio: f64,
}

pub(super) fn keys_only(args: &BenchArgs, keys: u64) -> Result<()> {
    let (turns, unlimited, limited) = two_schedulers(
        args,
        ["flow-unlimited", "flow-limited"],
        |limited, config| {
            if !limited {
                return;
            }
            let topics: Vec<String> = config.rules.topics.keys().cloned().collect();
            for topic in topics {
                config.rules.topic_concurrency.insert(
                    topic,
                    ConcurrencyRule {
                        key: format!("label:{}", ConcurrencyRule::DEFAULT_LABEL),
                        limit: Some(args.flow_limit),
                        rate: None,
                        burst: None,
                        fair: false,
                    },
                );
            }
        },
        |limited, rig, turns, jobs| {
            phase(&format!(
                "flow: {turns} x {jobs} jobs over {keys} keys, {}",
                if limited {
                    format!("each key limited to {} at once", args.flow_limit)
                } else {
                    "no limits".to_owned()
                }
            ));
            rig.keys = Some(keys);
            Ok(())
        },
    )?;
    let flow = Flow {
        keys,
        limit: args.flow_limit,
        turns,
        ratio: limited.jobs_per_sec / unlimited.jobs_per_sec.max(1e-9),
        unlimited,
        limited,
    };
    let line = |what: &str, s: &Saturation| {
        eprintln!(
            "        {what}: {:.0} jobs/s (median of {turns}), scheduler CPU {:.1} us a job",
            s.jobs_per_sec, s.processor_cpu_us_per_job
        );
    };
    line("no limits", &flow.unlimited);
    line(
        &format!("{keys} keys limited to {}", flow.limit),
        &flow.limited,
    );
    eprintln!("        limited / unlimited: {:.2}", flow.ratio);
    std::fs::write(&args.out, serde_json::to_string_pretty(&flow)?)?;
    Ok(())
}

/// The jobs a small tenant submits behind a large one's backlog.
const SMALL_JOBS: u64 = 100;

#[derive(Debug, serde::Serialize)]
struct FairShare {
    backlog: u64,
    workers: usize,
    slots: usize,
    work_ms: u64,
    /// A small tenant behind a large one's backlog.
    behind: Behind,
    /// Two tenants of weights 3 and 1, both with jobs waiting.
    weighted: Weighted,
}

#[derive(Debug, serde::Serialize)]
struct Behind {
    small_jobs: u64,
    /// The small tenant's last job sent -> its last job dispatched.
    small_last_dispatch_ms: f64,
    /// Each small job's sent -> dispatched, median and worst.
    small_p50_ms: f64,
    small_max_ms: f64,
    /// The large tenant's jobs not yet dispatched when the small one's last was.
    large_waiting_then: u64,
    /// The large tenant's first job sent -> its last dispatched.
    large_drain_seconds: f64,
}

#[derive(Debug, serde::Serialize)]
struct Weighted {
    /// From the light tenant's first dispatch to the heavy tenant's last.
    window_seconds: f64,
    heavy_dispatched: u64,
    light_dispatched: u64,
    /// Heavy over light within the window (3 if exact).
    ratio: f64,
    /// How far the ratio is from 3, in per cent of 3.
    error_percent: f64,
}

pub(super) fn fair_share_only(args: &BenchArgs, backlog: u64) -> Result<()> {
    let run = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let work = tempfile::tempdir()?;
    let (kafka, client) = super::kafka_clients(args)?;
    let prefix = format!("{run}.fair.");
    let mut config = bench_config(&kafka, &prefix, &work.path().join("fair"), None);
    super::tune(args, &mut config);
    config.rules.limits.max_pending_per_pool = i64::MAX;
    config.rules.limits.max_pending_per_tenant = None;
    config.rules.timing.placement_timeout_ms = 3_600_000;
    for (tenant, weight) in [("heavy", 3), ("light", 1)] {
        config.rules.tenants.insert(
            tenant.into(),
            TenantRules {
                weight: Some(weight),
                ..Default::default()
            },
        );
    }
    super::ensure_topics(&config)?;
    let mut fleet = args.fleet();
    fleet.work_ms = args.fair_share_work_ms;
    let limit = Duration::from_secs(3_600);
    let mut rig = Rig::start(config, client, fleet, "fair")?;

    phase(&format!(
        "fair share: {backlog} jobs of tenant large, then {SMALL_JOBS} of tenant small ({} workers x {} slots, {} ms a job)",
        fleet.workers, fleet.slots, fleet.work_ms
    ));
    rig.tenants = Some(vec!["large".into()]);
    let large = rig.submit(backlog, None)?;
    rig.tenants = Some(vec!["small".into()]);
    let small = rig.submit(SMALL_JOBS, None)?;
    rig.wait_completed(&small, limit)?;
    let small_times = rig.sent_and_dispatched(&small)?;
    let small_done = (small_times.iter())
        .filter_map(|(_, d)| *d)
        .fold(f64::MIN, f64::max);
    let small_sent = small_times.iter().map(|(s, _)| *s).fold(f64::MIN, f64::max);
    let waits: Vec<f64> = (small_times.iter())
        .filter_map(|(s, d)| d.map(|d| d - s))
        .collect();
    let small_max_ms = waits.iter().copied().fold(f64::NAN, f64::max);
    let large_waiting_then = (rig.sent_and_dispatched(&large)?.iter())
        .filter(|(_, d)| d.is_none_or(|d| d > small_done))
        .count() as u64;
    rig.wait_completed(&large, limit)?;
    let large_times = rig.sent_and_dispatched(&large)?;
    let large_first = large_times.iter().map(|(s, _)| *s).fold(f64::MAX, f64::min);
    let large_last = (large_times.iter())
        .filter_map(|(_, d)| *d)
        .fold(f64::MIN, f64::max);
    let behind = Behind {
        small_jobs: SMALL_JOBS,
        small_last_dispatch_ms: small_done - small_sent,
        small_p50_ms: Percentiles::of(waits).p50,
        small_max_ms,
        large_waiting_then,
        large_drain_seconds: (large_last - large_first) / 1000.0,
    };

    phase(&format!(
        "fair share: {backlog} jobs of tenants heavy (weight 3) and light (weight 1), in turn"
    ));
    rig.tenants = Some(vec!["heavy".into(), "light".into()]);
    let both = rig.submit(backlog, None)?;
    let (heavy, light): (Vec<String>, Vec<String>) =
        both.iter()
            .cloned()
            .enumerate()
            .fold((vec![], vec![]), |mut acc, (i, id)| {
                // The rig's tenants take turns by its sequence number, which the ids carry.
                let seq: usize = id
                    .rsplit('-')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(i);
                if seq.is_multiple_of(2) {
                    acc.0.push(id);
                } else {
                    acc.1.push(id);
                }
                acc
            });
    rig.wait_completed(&heavy, limit)?;
    let heavy_times: Vec<f64> = (rig.sent_and_dispatched(&heavy)?.into_iter())
        .filter_map(|(_, d)| d)
        .collect();
    let light_times: Vec<f64> = (rig.sent_and_dispatched(&light)?.into_iter())
        .filter_map(|(_, d)| d)
        .collect();
    let from = light_times.iter().copied().fold(f64::MAX, f64::min);
    let to = heavy_times.iter().copied().fold(f64::MIN, f64::max);
    let within = |t: &[f64]| t.iter().filter(|d| **d >= from && **d <= to).count() as u64;
    let (h, l) = (within(&heavy_times), within(&light_times));
    let ratio = h as f64 / (l.max(1)) as f64;
    let weighted = Weighted {
        window_seconds: (to - from) / 1000.0,
        heavy_dispatched: h,
        light_dispatched: l,
        ratio,
        error_percent: 100.0 * (ratio / 3.0 - 1.0),
    };
    rig.wait_completed(&light, limit)?;
    rig.stop()?;
    let report = FairShare {
        backlog,
        workers: fleet.workers,
        slots: fleet.slots,
        work_ms: fleet.work_ms,
        behind,
        weighted,
    };
    let b = &report.behind;
    eprintln!(
        "        small tenant behind {backlog} jobs: its {SMALL_JOBS} dispatched {:.0} ms after its last was sent (each: p50 {:.0} ms, max {:.0} ms); {} of the large tenant's jobs still waiting then; the large backlog drained in {:.1} s",
        b.small_last_dispatch_ms,
        b.small_p50_ms,
        b.small_max_ms,
        b.large_waiting_then,
        b.large_drain_seconds
    );
    let w = &report.weighted;
    eprintln!(
        "        weights 3:1 over {:.1} s: {} to {} dispatched, {:.3}:1 ({:+.2} % from 3:1)",
        w.window_seconds, w.heavy_dispatched, w.light_dispatched, w.ratio, w.error_percent
    );
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)?)?;
    Ok(())
}

#[derive(Debug, serde::Serialize)]
struct Beside {
    backlog: u64,
    turns: usize,
    /// Seconds the scheduler took to take the backlog in (sent to all queued).
    backlog_seconds: f64,
    empty: Saturation,
    beside: Saturation,
    /// Beside the backlog over beside none.
    ratio: f64,
}

/// `ksched bench --saturation-beside N`: saturation on the broker with no backlog, then in
/// a second scheduler beside `backlog` jobs of the same pool that no worker can take,
/// submitted through Kafka and queued first (past the lanes' windows, in RocksDB).
pub(super) fn saturation_beside_only(args: &BenchArgs, backlog: u64) -> Result<()> {
    let mut backlog_seconds = 0.0;
    let (turns, empty, beside) = two_schedulers(
        args,
        ["empty", "beside"],
        |_, config| {
            config.rules.limits.max_pending_per_pool = i64::MAX;
            config.rules.limits.max_pending_per_tenant = None;
            config.rules.timing.placement_timeout_ms = 24 * 3_600_000;
        },
        |beside, rig, turns, jobs| {
            if beside {
                phase(&format!(
                    "saturation beside: {backlog} waiting jobs submitted"
                ));
                let started = Instant::now();
                rig.submit_unplaceable(backlog, Duration::from_secs(7_200))?;
                backlog_seconds = started.elapsed().as_secs_f64();
                eprintln!("        queued in {backlog_seconds:.0} s");
            }
            let what = if beside {
                format!("beside {backlog} waiting")
            } else {
                "beside none".to_owned()
            };
            phase(&format!("saturation beside: {turns} x {jobs} jobs, {what}"));
            Ok(())
        },
    )?;
    let b = Beside {
        backlog,
        turns,
        backlog_seconds,
        ratio: beside.jobs_per_sec / empty.jobs_per_sec.max(1e-9),
        empty,
        beside,
    };
    for (what, s) in [("beside none", &b.empty), ("beside the backlog", &b.beside)] {
        eprintln!(
            "        {what}: {:.0} jobs/s (median of {turns}), scheduler CPU {:.1} us a job",
            s.jobs_per_sec, s.processor_cpu_us_per_job
        );
    }
    eprintln!("        beside the backlog / beside none: {:.2}", b.ratio);
    std::fs::write(&args.out, serde_json::to_string_pretty(&b)?)?;
    Ok(())
}

/// The saturation measurement in two schedulers on one broker, one after the other (the
/// first of `names` as `false`, the second as `true`): each configured by `configure`, made
/// ready by `ready` (given the turns and jobs a turn), then measured in turns (three, one
/// with `--smoke`). Returns the turns and each scheduler's median turn.
fn two_schedulers(
    args: &BenchArgs,
    names: [&str; 2],
    configure: impl Fn(bool, &mut ksched_runtime::Config),
    mut ready: impl FnMut(bool, &mut Rig, usize, u64) -> Result<()>,
) -> Result<(usize, Saturation, Saturation)> {
    let sizes = Sizes::of(args.smoke);
    let turns = if args.smoke { 1 } else { 3 };
    let run = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let work = tempfile::tempdir()?;
    let (kafka, client) = super::kafka_clients(args)?;
    let mut medians = Vec::new();
    for (second, name) in [(false, names[0]), (true, names[1])] {
        let prefix = format!("{run}.{name}.");
        let mut config = bench_config(&kafka, &prefix, &work.path().join(name), None);
        super::tune(args, &mut config);
        configure(second, &mut config);
        super::ensure_topics(&config)?;
        let mut rig = Rig::start(config, client.clone(), args.fleet(), name)?;
        ready(second, &mut rig, turns, sizes.saturation_jobs)?;
        let mut runs = Vec::with_capacity(turns);
        for _ in 0..turns {
            runs.push(rig.saturation(sizes.saturation_jobs)?);
        }
        rig.stop()?;
        medians.push(Saturation::median(runs));
    }
    let second = medians.pop().unwrap_or_else(|| unreachable!("two runs"));
    let first = medians.pop().unwrap_or_else(|| unreachable!("two runs"));
    Ok((turns, first, second))
}
