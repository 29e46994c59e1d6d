//! `ksched bench --flow-keys N`: what concurrency keys cost. Saturation with every job
//! carrying one of N concurrency keys, the same jobs run twice on the same broker one
//! after the other: without limits, then with each key limited to `--flow-limit` at once.
//! The ratio of the two throughputs is the cost of the limits.

use anyhow::Result;
use ksched_core::rules::ConcurrencyRule;

use super::e2e::{Rig, Saturation};
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
    let sizes = Sizes::of(args.smoke);
    let turns = if args.smoke { 1 } else { 3 };
    let run = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let work = tempfile::tempdir()?;
    let (kafka, client) = super::kafka_clients(args)?;
    let mut medians = Vec::new();
    for limited in [false, true] {
        let name = if limited { "limited" } else { "unlimited" };
        let prefix = format!("{run}.flow-{name}.");
        let mut config = bench_config(&kafka, &prefix, &work.path().join(name), None);
        super::tune(args, &mut config);
        if limited {
            let topics: Vec<String> = config.rules.topics.keys().cloned().collect();
            for topic in topics {
                config.rules.topic_concurrency.insert(
                    topic,
                    ConcurrencyRule {
                        key: format!("label:{}", ConcurrencyRule::DEFAULT_LABEL),
                        limit: Some(args.flow_limit),
                        rate: None,
                        burst: None,
                    },
                );
            }
        }
        super::ensure_topics(&config)?;
        phase(&format!(
            "flow: {turns} x {} jobs over {keys} keys, {}",
            sizes.saturation_jobs,
            if limited {
                format!("each key limited to {} at once", args.flow_limit)
            } else {
                "no limits".to_owned()
            }
        ));
        let mut rig = Rig::start(config, client.clone(), args.fleet(), "flow")?;
        rig.keys = Some(keys);
        let mut runs = Vec::with_capacity(turns);
        for _ in 0..turns {
            runs.push(rig.saturation(sizes.saturation_jobs)?);
        }
        rig.stop()?;
        medians.push(Saturation::median(runs));
    }
    let limited = medians.pop().unwrap_or_else(|| unreachable!("two runs"));
    let unlimited = medians.pop().unwrap_or_else(|| unreachable!("two runs"));
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
