//! `ksched bench --shards 1,2,4`: saturation throughput and CPU per job of one in-process
//! `ksched run` holding N shards (N processor threads), for each N, on this machine and
//! broker. Each shard has one pool and one job topic; the SDK workers and the submitted jobs
//! are spread evenly over them, so that every shard carries the same share of the load.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use ksched_core::rules::PoolRules;
use ksched_runtime::Config;
use ksched_runtime::settings::KafkaSettings;
use rdkafka::ClientConfig;
use serde::Serialize;

use super::e2e::{Fleet, Rig, Saturation};

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
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(ksched_runtime::topics::ensure_topics(
        &config.settings,
        &ksched_runtime::topics_of(&config),
    ))?;
    drop(rt);
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
