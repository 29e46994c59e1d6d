//! Shards (docs/architecture.md, "Shards"), against `ksched run` processes and the real
//! broker: four shards, each with its own pool and job topic. Two instances share the shards
//! through the owners' group; SDK workers run jobs on every pool while one instance is
//! SIGKILLed, and the survivor takes its shards over; the instance is added back and the
//! shards spread again. Every job ends SUCCEEDED exactly once,
//! journaled on its own shard only; no attempt is dispatched twice; `audit verify` reproduces
//! every shard's journal.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::*;
use ksched_worker::{Outcome, Worker};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const SHARDS: u32 = 4;

/// The shards an instance runs the processor of, from its readiness report.
fn owned(c: &RunningScheduler) -> Option<BTreeSet<u64>> {
    let (_, body) = http(&format!("{}/health/ready", c.api), "GET", None).ok()?;
    let v: Value = serde_json::from_str(&body).ok()?;
    Some(
        v["owned_shards"]
            .as_array()?
            .iter()
            .filter_map(Value::as_u64)
            .collect(),
    )
}

#[test]
fn shards_spread_over_instances_and_move_when_one_is_killed() {
    let a = RunningScheduler::start_sharded(SHARDS);
    wait_until("the first instance to own every shard", 60, || {
        owned(&a).is_some_and(|o| o.len() == SHARDS as usize)
    });
    let mut b = a.another_instance();
    // Cooperative-sticky: the newcomer gets its share, taken from the first one's.
    wait_until("the shards to spread over both instances", 90, || {
        let (oa, ob) = (owned(&a), owned(&b));
        oa.zip(ob)
            .is_some_and(|(oa, ob)| oa.len() == 2 && ob.len() == 2 && oa.is_disjoint(&ob))
    });
    let b_shards = owned(&b).unwrap();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let stop = CancellationToken::new();
    for s in 0..SHARDS {
        let _guard = rt.enter();
        let mut cfg = a.worker_config(&format!("w-{s}"));
        cfg.pool = format!("pool-{s}");
        let worker = Worker::new(cfg).unwrap();
        let stop = stop.clone();
        rt.spawn(async move {
            worker
                .run(
                    |_| async {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        Outcome::succeeded()
                    },
                    stop,
                )
                .await
        });
    }
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &a.bootstrap)
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    let topic = |s: u32| format!("{}jobs-{s}", a.prefix);
    let mut ids: BTreeMap<String, u32> = BTreeMap::new();
    let round = |tag: &str, ids: &mut BTreeMap<String, u32>| {
        for i in 0..40 {
            for s in 0..SHARDS {
                let id = format!("acme:{tag}-{s}-{i}");
                submit(&producer, &topic(s), &id);
                ids.insert(id, s);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    round("before", &mut ids);
    // Jobs run on every shard, whichever instance owns it; either instance's API answers.
    wait_until("a job of every shard to succeed", 90, || {
        (0..SHARDS).all(|s| {
            job_state(&a.api, &format!("acme:before-{s}-39")).as_deref() == Some("SUCCEEDED")
        })
    });

    let killed = Instant::now();
    b.kill();
    round("after", &mut ids);
    producer.flush(Duration::from_secs(10)).unwrap();
    wait_until("the survivor to own every shard", 60, || {
        owned(&a).is_some_and(|o| o.len() == SHARDS as usize)
    });
    println!(
        "shards {b_shards:?} moved to the survivor {:.1} s after the SIGKILL (lease session timeout 2 s)",
        killed.elapsed().as_secs_f64()
    );
    for id in ids.keys() {
        wait_until(&format!("{id} to succeed"), 120, || {
            job_state(&a.api, id).as_deref() == Some("SUCCEEDED")
        });
    }

    // Added back (same host and data directory): the shards spread again, and jobs of every
    // shard still run once.
    let back = Instant::now();
    b.start_again();
    wait_until("the shards to spread again", 90, || {
        let (oa, ob) = (owned(&a), owned(&b));
        oa.zip(ob)
            .is_some_and(|(oa, ob)| oa.len() == 2 && ob.len() == 2 && oa.is_disjoint(&ob))
    });
    println!(
        "instance added back: shards {:?} moved to it {:.1} s after it started",
        owned(&b).unwrap_or_default(),
        back.elapsed().as_secs_f64()
    );
    round("back", &mut ids);
    producer.flush(Duration::from_secs(10)).unwrap();
    for id in ids.keys() {
        wait_until(&format!("{id} to succeed"), 120, || {
            job_state(&a.api, id).as_deref() == Some("SUCCEEDED")
        });
    }
    stop.cancel();

    // Exactly once, per shard, from its journal: every job on its own shard only, one
    // dispatch per attempt, one success per job; and every shard's journal replays.
    let mut succeeded: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    for s in 0..SHARDS {
        let part = s.to_string();
        let (code, out, err) = a.cli(&["audit", "--partition", &part, "export"]);
        assert_eq!(code, 0, "{err}");
        let mut dispatched: BTreeMap<(String, i64), u32> = BTreeMap::new();
        for line in out.lines() {
            let entry: Value = serde_json::from_str(line).unwrap();
            for e in entry["events"].as_array().into_iter().flatten() {
                let job = e["job_id"].as_str().unwrap_or_default().to_owned();
                match e["type"].as_str() {
                    Some("JobDispatched") => {
                        *dispatched
                            .entry((job, e["attempt"].as_i64().unwrap()))
                            .or_default() += 1;
                    }
                    Some("JobSucceeded") => {
                        let n = succeeded.entry(job).or_insert((s, 0));
                        assert_eq!(n.0, s, "a job succeeded on two shards");
                        n.1 += 1;
                    }
                    _ => {}
                }
            }
        }
        let twice: Vec<_> = dispatched.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "shard {s}: attempts dispatched twice: {twice:?}"
        );
        let (code, out, err) = a.cli(&["audit", "--partition", &part, "verify"]);
        assert_eq!(code, 0, "audit verify of shard {s}: {out}{err}");
    }
    for (id, shard) in &ids {
        assert_eq!(
            succeeded.get(id),
            Some(&(*shard, 1)),
            "{id} succeeded once, on shard {shard}"
        );
    }
}
