//! Routing and placement (SPEC §3): topics, requires, label hints, placement labels, the
//! least-loaded score, overload skipping, deterministic ties, and the other strategies.

mod support;

use ksched_core::events::*;
use ksched_core::records::Heartbeat;
use ksched_core::rules::{PoolRules, StrategyKind};
use support::*;

fn with_load(worker: &str, pool: &str, active: i32, cpu: f64, gpu: f64) -> Heartbeat {
    Heartbeat {
        active_jobs: active,
        cpu_load: cpu,
        gpu_utilization: gpu,
        max_parallel_jobs: 8,
        ..hb(worker, pool)
    }
}

#[test]
fn an_unmapped_topic_is_dead_lettered_at_once_with_no_pool_mapping() {
    let mut sim = Sim::new();
    let mut r = job("j1");
    r.topic = "job.unknown".into();
    let ev = sim.submit(r);
    assert_eq!(names(&ev), ["JobAccepted", "JobFailed", "DeadLettered"]);
    let dl = dead_lettered(&ev);
    assert_eq!(dl.reason_code, "no_pool_mapping");
    assert!(dl.reason.contains("job.unknown"), "{}", dl.reason);
    assert_eq!(dl.last_state, "FAILED");
    assert_eq!(sim.job_state("j1"), JobState::Failed);
}

#[test]
fn requires_selects_pools_case_insensitively_and_no_match_is_no_pool_mapping() {
    let mut sim = Sim::new();
    sim.worker("g1", "gpu");
    let mut r = job("ok");
    r.topic = "job.gpu".into();
    r.meta.requires = vec!["GPU".into()];
    let ev = sim.submit(r);
    assert_eq!(scheduled(&ev).pool, "gpu");

    let mut r = job("nope");
    r.topic = "job.gpu".into();
    r.meta.requires = vec!["gpu".into(), "tpu".into()];
    let ev = sim.submit(r);
    let dl = dead_lettered(&ev);
    assert_eq!(dl.reason_code, "no_pool_mapping");
    assert!(dl.reason.contains("lacks tpu"), "{}", dl.reason);
}

#[test]
fn preferred_pool_restricts_when_mapped_and_eligible_and_is_ignored_with_a_note_otherwise() {
    let mut sim = Sim::new();
    sim.worker("wa", "a");
    sim.worker("wb", "b");
    let mut r = job("j1");
    r.topic = "job.multi".into();
    r.labels.insert("preferred_pool".into(), "b".into());
    let ev = sim.submit(r);
    assert_eq!(scheduled(&ev).pool, "b");
    assert_eq!(sim.job("j1").pools, ["b"]);

    let mut r = job("j2");
    r.topic = "job.multi".into();
    r.labels.insert("preferred_pool".into(), "gpu".into());
    let ev = sim.submit(r);
    let accepted = find(&ev, |e| match e {
        Event::JobAccepted(a) => Some(a),
        _ => None,
    });
    assert_eq!(accepted.pools, ["a", "b"]);
    assert!(
        accepted
            .routing_notes
            .iter()
            .any(|n| n.contains("preferred_pool gpu ignored")),
        "{:?}",
        accepted.routing_notes
    );
}

#[test]
fn multi_pool_topics_prefer_pools_in_listed_order() {
    let mut sim = Sim::new();
    sim.worker("wb", "b");
    sim.worker("wa", "a");
    let mut r = job("j1");
    r.topic = "job.multi".into();
    assert_eq!(scheduled(&sim.submit(r)).pool, "a");
    sim.heartbeat(Heartbeat {
        cpu_load: 95.0,
        ..hb("wa", "a")
    });
    let mut r = job("j2");
    r.topic = "job.multi".into();
    let s = scheduled(&sim.submit(r)).clone();
    assert_eq!(
        s.pool, "b",
        "falls through to the next pool when the first is full"
    );
    assert!(s.candidates.iter().any(
        |c| c.worker_id == "wa" && c.skipped.as_deref().is_some_and(|w| w.contains("cpu_load"))
    ));
}

#[test]
fn least_loaded_scores_active_jobs_cpu_and_gpu() {
    let mut sim = Sim::new();
    sim.heartbeat(with_load("w1", "default", 1, 0.0, 0.0)); // 1.0
    sim.heartbeat(with_load("w2", "default", 0, 50.0, 40.0)); // 0.9
    sim.heartbeat(with_load("w3", "default", 0, 80.0, 30.0)); // 1.1
    let ev = sim.submit(job("j1"));
    let s = scheduled(&ev);
    assert_eq!(s.worker_id, "w2");
    assert_eq!(s.strategy, "least_loaded");
    let score = |w: &str| {
        s.candidates
            .iter()
            .find(|c| c.worker_id == w)
            .and_then(|c| c.score)
            .unwrap()
    };
    assert!((score("w1") - 1.0).abs() < 1e-9);
    assert!((score("w2") - 0.9).abs() < 1e-9);
    assert!((score("w3") - 1.1).abs() < 1e-9);
}

#[test]
fn in_flight_dispatches_count_as_active_until_their_result() {
    let mut sim = Sim::new();
    sim.heartbeat(with_load("w1", "default", 0, 0.0, 0.0));
    sim.heartbeat(with_load("w2", "default", 0, 10.0, 0.0));
    let first = scheduled(&sim.submit(job("j1"))).worker_id.clone();
    assert_eq!(first, "w1");
    // w1 now scores 1.0 (one in-flight dispatch), w2 scores 0.1.
    assert_eq!(scheduled(&sim.submit(job("j2"))).worker_id, "w2");
    // j1's result frees w1 at once, without waiting for its next heartbeat.
    sim.result("j1", 1, "w1", ksched_core::records::ResultStatus::Succeeded);
    assert_eq!(scheduled(&sim.submit(job("j3"))).worker_id, "w1");
}

#[test]
fn jobs_a_worker_runs_that_the_scheduler_no_longer_counts_still_load_it() {
    let mut sim = Sim::new();
    sim.heartbeat(with_load("w1", "default", 0, 0.0, 0.0));
    sim.heartbeat(with_load("w2", "default", 0, 0.0, 0.0));
    // w1 still runs a cancelled job ("zombie") it reports by id; w2 reports 2 by count only.
    sim.heartbeat(Heartbeat {
        active_jobs: 1,
        active_job_ids: vec!["zombie".into()],
        ..with_load("w1", "default", 0, 0.0, 0.0)
    });
    sim.heartbeat(Heartbeat {
        active_jobs: 2,
        ..with_load("w2", "default", 0, 0.0, 0.0)
    });
    assert_eq!(sim.state.workers["w1"].effective_active(), 1);
    assert_eq!(sim.state.workers["w2"].effective_active(), 2);
    assert_eq!(scheduled(&sim.submit(job("j1"))).worker_id, "w1");
}

#[test]
fn ties_go_to_the_lowest_worker_id() {
    let mut sim = Sim::new();
    for w in ["w3", "w1", "w2"] {
        sim.heartbeat(with_load(w, "default", 0, 20.0, 0.0));
    }
    assert_eq!(scheduled(&sim.submit(job("j1"))).worker_id, "w1");
}

#[test]
fn overloaded_workers_are_skipped_with_the_reason() {
    let mut sim = Sim::new();
    sim.heartbeat(Heartbeat {
        active_jobs: 2,
        max_parallel_jobs: 2,
        ..hb("full", "default")
    });
    sim.heartbeat(with_load("hot", "default", 0, 90.0, 0.0));
    sim.heartbeat(with_load("gpuhot", "default", 0, 0.0, 95.0));
    sim.heartbeat(with_load("ok", "default", 5, 50.0, 50.0));
    let ev = sim.submit(job("j1"));
    let s = scheduled(&ev);
    assert_eq!(s.worker_id, "ok");
    let why = |w: &str| {
        s.candidates
            .iter()
            .find(|c| c.worker_id == w)
            .and_then(|c| c.skipped.clone())
            .unwrap_or_default()
    };
    assert!(
        why("full").contains("max_parallel_jobs 2"),
        "{}",
        why("full")
    );
    assert!(why("hot").contains("cpu_load 90"), "{}", why("hot"));
    assert!(
        why("gpuhot").contains("gpu_utilization 95"),
        "{}",
        why("gpuhot")
    );
}

#[test]
fn all_overloaded_means_the_job_waits_as_pool_overloaded() {
    let mut sim = Sim::new();
    sim.heartbeat(with_load("hot", "default", 0, 99.0, 0.0));
    let ev = sim.submit(job("j1"));
    assert_eq!(waiting(&ev).reason_code, "pool_overloaded");
    assert_eq!(sim.job_state("j1"), JobState::Pending);
}

#[test]
fn draining_workers_and_workers_without_partitions_take_nothing() {
    let mut sim = Sim::new();
    sim.heartbeat(Heartbeat {
        draining: true,
        ..hb("drain", "default")
    });
    sim.heartbeat(Heartbeat {
        owned_partitions: vec![],
        ..hb("new", "default")
    });
    let ev = sim.submit(job("j1"));
    let w = waiting(&ev);
    assert_eq!(w.reason_code, "no_workers");
    let skipped: Vec<_> = w
        .candidates
        .iter()
        .filter_map(|c| c.skipped.clone())
        .collect();
    assert!(skipped.iter().any(|s| s == "draining"), "{skipped:?}");
    assert!(
        skipped.iter().any(|s| s.contains("no dispatch partition")),
        "{skipped:?}"
    );
}

#[test]
fn the_dispatch_goes_to_a_partition_the_worker_owns() {
    let mut sim = Sim::new();
    sim.heartbeat(Heartbeat {
        owned_partitions: vec![5, 3],
        ..hb("w1", "default")
    });
    let ev = sim.submit(job("j1"));
    let d = find(&ev, |e| match e {
        Event::JobDispatched(d) => Some(d),
        _ => None,
    });
    assert_eq!(d.partition, 3);
}

#[test]
fn placement_labels_must_equal_the_worker_labels() {
    let mut sim = Sim::new();
    let mut eu = hb("eu1", "default");
    eu.labels.insert("zone".into(), "eu".into());
    eu.labels.insert("disk".into(), "ssd".into());
    let mut us = hb("us1", "default");
    us.labels.insert("zone".into(), "us".into());
    us.labels.insert("disk".into(), "ssd".into());
    sim.heartbeat(us);
    sim.heartbeat(eu);
    sim.worker("bare", "default");
    let mut r = job("j1");
    r.labels.insert("placement.zone".into(), "eu".into());
    r.labels.insert("node.disk".into(), "ssd".into());
    r.labels.insert("team".into(), "x".into()); // not a placement label
    let ev = sim.submit(r);
    let s = scheduled(&ev);
    assert_eq!(s.worker_id, "eu1");
    let why = |w: &str| {
        s.candidates
            .iter()
            .find(|c| c.worker_id == w)
            .and_then(|c| c.skipped.clone())
            .unwrap_or_default()
    };
    assert!(why("us1").contains("zone=us"), "{}", why("us1"));
    assert!(why("bare").contains("no label"), "{}", why("bare"));

    let mut r = job("j2");
    r.labels.insert("constraint.zone".into(), "apac".into());
    let ev = sim.submit(r);
    assert_eq!(waiting(&ev).reason_code, "no_workers");
}

#[test]
fn preferred_worker_is_honoured_when_it_qualifies() {
    let mut sim = Sim::new();
    sim.heartbeat(with_load("w1", "default", 0, 0.0, 0.0));
    sim.heartbeat(with_load("w2", "default", 3, 50.0, 0.0));
    let mut r = job("j1");
    r.labels.insert("preferred_worker_id".into(), "w2".into());
    let s = scheduled(&sim.submit(r)).clone();
    assert_eq!(s.worker_id, "w2");
    assert_eq!(s.notes, ["preferred_worker_id w2 honoured"]);
}

#[test]
fn preferred_worker_falls_back_to_scoring_and_says_why() {
    let mut sim = Sim::new();
    sim.heartbeat(with_load("w1", "default", 0, 0.0, 0.0));
    sim.heartbeat(with_load("busy", "default", 0, 95.0, 0.0));
    sim.worker("g1", "gpu");
    for (preferred, why) in [
        ("ghost", "unknown worker"),
        ("busy", "cpu_load 95"),
        ("g1", "pool gpu is not eligible"),
    ] {
        let mut r = job(&format!("j-{preferred}"));
        r.labels
            .insert("preferred_worker_id".into(), preferred.into());
        let s = scheduled(&sim.submit(r)).clone();
        assert_eq!(s.worker_id, "w1");
        assert!(
            s.notes
                .iter()
                .any(|n| n.contains("ignored") && n.contains(why)),
            "{preferred}: {:?}",
            s.notes
        );
    }
    // A preferred worker that stopped heartbeating.
    sim.advance(20_000);
    sim.heartbeat(with_load("w1", "default", 0, 0.0, 0.0));
    sim.tick_after(0);
    let mut r = job("j-dead");
    r.labels.insert("preferred_worker_id".into(), "busy".into());
    let s = scheduled(&sim.submit(r)).clone();
    assert!(s.notes[0].contains("not alive"), "{:?}", s.notes);
}

#[test]
fn throttled_gives_work_to_the_worker_with_the_most_credit() {
    let mut rules = rules();
    rules.pools.insert(
        "default".into(),
        PoolRules {
            requires: vec![],
            strategy: StrategyKind::Throttled,
            workers: vec![],
            shard: None,
            aging: None,
        },
    );
    let mut sim = Sim::with_rules(rules);
    sim.heartbeat(Heartbeat {
        max_parallel_jobs: 2,
        ..hb("small", "default")
    });
    sim.heartbeat(Heartbeat {
        max_parallel_jobs: 3,
        ..hb("big", "default")
    });
    sim.heartbeat(Heartbeat {
        max_parallel_jobs: 0,
        ..hb("unlimited", "default")
    });
    let order: Vec<String> = (0..6)
        .map(|i| {
            let ev = sim.submit(job(&format!("j{i}")));
            ev.iter()
                .find_map(|e| match e {
                    Event::JobScheduled(s) => Some(s.worker_id.clone()),
                    _ => None,
                })
                .unwrap_or_else(|| "-".into())
        })
        .collect();
    // Credits: big 3, small 2. big, then tie 2-2 -> big (lower id), small, big/small...
    assert_eq!(order, ["big", "big", "small", "big", "small", "-"]);
    let last = sim.job("j5");
    assert_eq!(last.state, JobState::Pending);
    assert_eq!(last.wait_reason.as_deref(), Some("pool_overloaded"));
}

#[test]
fn capacity_bin_packs_by_memory_best_fit() {
    let mut rules = rules();
    rules.pools.insert(
        "default".into(),
        PoolRules {
            requires: vec![],
            strategy: StrategyKind::Capacity,
            workers: vec![],
            shard: None,
            aging: None,
        },
    );
    let mut sim = Sim::with_rules(rules);
    let gib = 1i64 << 30;
    for (w, free) in [("roomy", 16 * gib), ("snug", 3 * gib), ("tiny", gib / 2)] {
        sim.heartbeat(Heartbeat {
            memory_free_bytes: Some(free),
            ..hb(w, "default")
        });
    }
    let mut r = job("j2g");
    r.labels.insert("memory".into(), "2Gi".into());
    let s = scheduled(&sim.submit(r)).clone();
    assert_eq!(s.worker_id, "snug", "smallest leftover that fits");
    assert_eq!(s.strategy, "capacity");
    // snug has 1 GiB left now (reserved since its heartbeat): the next 2Gi goes to roomy.
    let mut r = job("j2g-b");
    r.labels.insert("memory".into(), "2Gi".into());
    assert_eq!(scheduled(&sim.submit(r)).worker_id, "roomy");
    // Too big for anyone: waits as overloaded, with the reasons.
    let mut r = job("huge");
    r.labels.insert("memory".into(), "64Gi".into());
    let ev = sim.submit(r);
    let w = waiting(&ev);
    assert_eq!(w.reason_code, "pool_overloaded");
    assert!(
        w.candidates
            .iter()
            .all(|c| c.skipped.as_deref().is_some_and(|s| s.contains("needs")))
    );
}
