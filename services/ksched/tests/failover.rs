//! High availability (`processor.lease`), against two `ksched run` processes and the real
//! broker: one instance owns the journal partition, the other stands by tailing the journal
//! into its own RocksDB. The owner is SIGKILLed, or stopped (SIGTERM), while jobs flow; the
//! standby takes over, and every job ends SUCCEEDED exactly once, no attempt is dispatched
//! twice, and `audit verify` reproduces the journal. The time from the kill or stop to the
//! standby's ownership and to its first decision is printed.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use ksched_worker::{Outcome, Worker};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

#[test]
fn an_owner_alone_stopped_and_started_again_owns_the_journal_again() {
    let mut a = RunningScheduler::start("");
    wait_until("it owns the journal", 60, || {
        role(&a).as_deref() == Some("owner")
    });
    a.terminate();
    assert!(
        !a.log().contains("handed the shards over"),
        "nobody was there to take it:\n{}",
        a.log()
    );
    a.start_again();
    // Its static membership gives the partition back at once (a handover without a standby
    // once left it standing by for minutes).
    wait_until("it owns the journal again", 30, || {
        role(&a).as_deref() == Some("owner")
    });
}

/// How the owner goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Going {
    /// SIGKILL: the group notices after the lease session timeout.
    Killed,
    /// SIGTERM: the owner commits its batch and leaves the group.
    Stopped,
}

#[test]
fn the_standby_takes_over_when_the_owner_is_killed() {
    failover(Going::Killed);
}

#[test]
fn the_standby_takes_over_when_the_owner_stops() {
    failover(Going::Stopped);
}

fn failover(going: Going) {
    let (mut owner, standby) = owner_and_standby();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let stop = CancellationToken::new();
    {
        let _guard = rt.enter();
        let worker = Worker::new(owner.worker_config("ha-worker")).unwrap();
        let s = stop.clone();
        rt.spawn(async move {
            worker
                .run(
                    |_| async {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Outcome::succeeded()
                    },
                    s,
                )
                .await
        });
    }
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &owner.bootstrap)
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    let topic = owner.job_topic.clone();
    let mut ids = Vec::new();
    for i in 0..150 {
        let id = format!("acme:before-{i}");
        submit(&producer, &topic, &id);
        ids.push(id);
        std::thread::sleep(Duration::from_millis(10));
    }
    // Jobs are flowing through the owner.
    wait_until("the owner to run jobs", 60, || {
        job_state(&owner.api, "acme:before-50").as_deref() == Some("SUCCEEDED")
    });

    // From the signal on: a stopping owner's own shutdown is part of the handover.
    let went = Instant::now();
    match going {
        Going::Killed => owner.kill(),
        // Its exit is waited for below: the handover is timed from the signal.
        Going::Stopped => owner.sigterm(),
    }
    for i in 0..150 {
        let id = format!("acme:after-{i}");
        submit(&producer, &topic, &id);
        ids.push(id);
        std::thread::sleep(Duration::from_millis(10));
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    wait_until("the standby to take over", 60, || {
        role(&standby).as_deref() == Some("owner")
    });
    let took_over = went.elapsed();
    if going == Going::Stopped {
        owner.wait_clean_exit();
    }
    if std::env::var("KSCHED_TEST_LOGS").is_ok() {
        for l in owner.log().lines().chain(standby.log().lines()) {
            if l.contains("owns")
                || l.contains("handed")
                || l.contains("left the")
                || l.contains("processor ready")
                || l.contains("shutting")
            {
                println!("{l}");
            }
        }
    }
    if going == Going::Stopped {
        // Its static membership would have kept the partition for the session timeout.
        assert!(
            owner.log().contains("handed the shards over"),
            "{}",
            owner.log()
        );
    }
    wait_until("its first decision after the kill", 60, || {
        job_state(&standby.api, "acme:after-0").is_some()
    });
    let first_decision = went.elapsed();
    println!(
        "failover: owner {}; the standby owned the journal after {:.1} s and decided on a job submitted after it went {:.1} s after it (lease session timeout 6 s)",
        if going == Going::Killed {
            "SIGKILLed"
        } else {
            "stopped (SIGTERM)"
        },
        took_over.as_secs_f64(),
        first_decision.as_secs_f64()
    );
    for id in &ids {
        wait_until(&format!("{id} to succeed"), 120, || {
            job_state(&standby.api, id).as_deref() == Some("SUCCEEDED")
        });
    }
    stop.cancel();

    // Exactly once, from the journal: one dispatch per attempt, one success per job.
    let (code, out, err) = standby.cli(&["audit", "export"]);
    assert_eq!(code, 0, "{err}");
    let mut dispatched: BTreeMap<(String, i64), u32> = BTreeMap::new();
    let mut succeeded: BTreeMap<String, u32> = BTreeMap::new();
    for line in out.lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        for e in entry["events"].as_array().into_iter().flatten() {
            match e["type"].as_str() {
                Some("JobDispatched") => {
                    let key = (
                        e["job_id"].as_str().unwrap().to_owned(),
                        e["attempt"].as_i64().unwrap(),
                    );
                    *dispatched.entry(key).or_default() += 1;
                }
                Some("JobSucceeded") => {
                    *succeeded
                        .entry(e["job_id"].as_str().unwrap().to_owned())
                        .or_default() += 1;
                }
                _ => {}
            }
        }
    }
    let twice: Vec<_> = dispatched.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "attempts dispatched twice: {twice:?}");
    for id in &ids {
        assert_eq!(succeeded.get(id), Some(&1), "{id} succeeded once");
    }
    let (code, out, err) = standby.cli(&["audit", "verify"]);
    assert_eq!(code, 0, "audit verify: {out}{err}");
    assert!(
        standby.log().contains("this instance owns the shard"),
        "{}",
        standby.log()
    );
}
