//! `ksched bench --shards 1,2,4`: saturation throughput and CPU per job of one in-process
//! `ksched run` holding N shards (N processor threads), for each N, on this machine and
//! broker. Each shard has one pool and one job topic; the SDK workers and the submitted jobs
//! are spread evenly over them, so that every shard carries the same share of the load.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ksched_core::rules::PoolRules;
use ksched_runtime::Config;
use ksched_runtime::settings::KafkaSettings;
use rdkafka::ClientConfig;
use serde::Serialize;

use super::e2e::{self, Fleet, Rig, Saturation};
use super::{BenchArgs, Sizes, kafka_clients, machine, phase, tune};

#[derive(Debug, Serialize)]
pub(super) struct ShardRun {
    pub shards: u32,
    pub saturation: Saturation,
}

/// A bench configuration of `shards` shards: pool `pool-<s>` on shard `s`, fed by the job
/// topic `<prefix>jobs-<s>`.
pub(super) fn config(kafka: &KafkaSettings, prefix: &str, dir: &Path, shards: u32) -> Config {
    let mut config = super::bench_config(kafka, prefix, dir, None);
    let n = i32::try_from(shards.max(1)).unwrap_or(i32::MAX);
    let t = &mut config.settings.topics;
    t.journal_partitions = n;
    // Shard s answers on the results partitions p with p % n == s: a multiple of n.
    t.results_partitions = n * ((4 + n - 1) / n);
    t.job_partitions = 2;
    config.rules.topics.clear();
    config.rules.pools.clear();
    for s in 0..shards.max(1) {
        config
            .rules
            .topics
            .insert(format!("{prefix}jobs-{s}"), vec![format!("pool-{s}")]);
        config.rules.pools.insert(
            format!("pool-{s}"),
            PoolRules {
                shard: Some(s),
                ..PoolRules::default()
            },
        );
    }
    config
}

/// Saturation with `shards` shards: `jobs` jobs as fast as possible after a warm-up.
/// `config`: from [`config`] for as many shards.
pub(super) fn run(
    config: Config,
    client: &ClientConfig,
    shards: u32,
    fleet: Fleet,
    jobs: u64,
) -> Result<ShardRun> {
    super::ensure_topics(&config)?;
    // The same workers whatever the shard count (at least one per pool), spread over the
    // pools: every count carries the same fleet, and only the processors differ.
    let fleet = Fleet {
        workers: fleet.workers.max(shards as usize),
        ..fleet
    };
    let mut rig = Rig::start(config, client.clone(), fleet, &format!("shards-{shards}"))?;
    rig.saturation((jobs / 10).max(50))?;
    // Give the warm-up's stragglers (heartbeats, ticks) a moment to settle.
    std::thread::sleep(Duration::from_millis(500));
    let saturation = rig.saturation(jobs)?;
    rig.stop()?;
    Ok(ShardRun { shards, saturation })
}

/// `ksched bench --shards 1,2,4`: saturation and CPU per job for each shard count, each
/// count measured `runs` times, interleaved (1, 2, 4, 1, 2, 4, ...) so that a machine that
/// slows down or speeds up during the bench weighs on every count alike.
pub(super) fn shards_only(args: &BenchArgs, counts: &[u32]) -> Result<()> {
    anyhow::ensure!(
        !counts.is_empty() && counts.iter().all(|n| (1..=64).contains(n)),
        "--shards takes shard counts from 1 to 64"
    );
    let total = Instant::now();
    let sizes = Sizes::of(args.smoke);
    let runs = if args.smoke { 1 } else { 3 };
    let run = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let work = tempfile::tempdir()?;
    let (kafka, client) = kafka_clients(args)?;
    let mut results: Vec<ShardRun> = Vec::new();
    for round in 0..runs {
        for n in counts {
            phase(&format!(
                "shards: {n} (run {} of {runs}), saturation with {} jobs",
                round + 1,
                sizes.saturation_jobs
            ));
            let prefix = format!("{run}.shards-{n}-{round}.");
            let mut config = config(
                &kafka,
                &prefix,
                &work.path().join(format!("{n}-{round}")),
                *n,
            );
            tune(args, &mut config);
            let r = self::run(config, &client, *n, args.fleet(), sizes.saturation_jobs)?;
            eprintln!(
                "        {:.0} jobs/s, processor CPU {:.0} us/job, process CPU {:.0} us/job",
                r.saturation.jobs_per_sec,
                r.saturation.processor_cpu_us_per_job,
                r.saturation.process_cpu_us_per_job
            );
            results.push(r);
        }
    }
    println!();
    println!(
        "ksched bench --shards ({} build{}, {} workers, at least one per shard, x {} slots{}{}) on {}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        if args.smoke { ", smoke sizes" } else { "" },
        args.workers,
        args.worker_slots,
        if args.pipelined { ", pipelined" } else { "" },
        args.max_batch
            .map(|n| format!(", max_batch {n}"))
            .unwrap_or_default(),
        machine()
    );
    println!();
    println!(
        "| shards | jobs/s at saturation (median; runs) | processor CPU per job (median) | process CPU per job (median) | Kafka records per job |"
    );
    println!("|---|---|---|---|---|");
    let median = |mut v: Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for n in counts {
        let of: Vec<&ShardRun> = results.iter().filter(|r| r.shards == *n).collect();
        let field = |f: fn(&e2e::Saturation) -> f64| -> Vec<f64> {
            of.iter().map(|r| f(&r.saturation)).collect()
        };
        let jps = field(|s| s.jobs_per_sec);
        println!(
            "| {n} | {:.0} ({}) | {:.0} us | {:.0} us | {:.1} |",
            median(jps.clone()),
            jps.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
            median(field(|s| s.processor_cpu_us_per_job)),
            median(field(|s| s.process_cpu_us_per_job)),
            median(field(|s| s.kafka_records_per_job)),
        );
    }
    println!(
        "| total bench time | {:.0} s |||",
        total.elapsed().as_secs_f64()
    );
    std::fs::write(&args.out, serde_json::to_string_pretty(&results)?)
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("results written to {}", args.out.display());
    Ok(())
}
