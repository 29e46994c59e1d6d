//! Dependencies against the real broker and two `ksched run` processes (an owner and a
//! standby): a gate job due in a few seconds holds 300 jobs BLOCKED and a callback waits for
//! 100 of them; the owner is SIGKILLed around the gate's end, while its dependents are being
//! released, and the standby finishes. None runs before what it waits for, each is released
//! and dispatched once, the callback runs once after its dependencies; a failed dependency,
//! one never submitted, and another tenant's job each end their dependent
//! `dependency_failed` naming it; a dependency submitted after its dependent is waited for;
//! `audit verify` reproduces the journal.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use ksched_core::records::{DependencyCondition, JobRequest};
use ksched_worker::Outcome;
use rdkafka::producer::Producer;
use serde_json::Value;

fn now_ms() -> i64 {
    ksched_runtime::clock::wall_clock_ms()
}

const FANOUT: usize = 300;

/// When each job started and ended at the worker, by the host's clock, per run.
type Runs = Arc<Mutex<BTreeMap<String, Vec<(i64, i64)>>>>;
const FANIN: usize = 100;

#[test]
fn dependents_are_released_once_in_order_across_a_kill_and_failures_name_their_cause() {
    let (mut owner, standby) = owner_and_standby();

    let runs: Runs = Arc::default();
    let recorded = runs.clone();
    let (_rt, stop) = run_worker(&owner, "dep-worker", 64, move |job| {
        let runs = recorded.clone();
        async move {
            let id = job.dispatch.job.job_id.clone();
            let started = now_ms();
            tokio::time::sleep(Duration::from_millis(20)).await;
            runs.lock()
                .unwrap()
                .entry(id.clone())
                .or_default()
                .push((started, now_ms()));
            if id.ends_with("-fails") {
                Outcome::fatal("boom", "failed on purpose")
            } else {
                Outcome::succeeded()
            }
        }
    });

    let producer = producer_of(&owner);
    let topic = owner.job_topic.clone();
    let t0 = now_ms();
    let request = |id: &str, tenant: &str, deps: &[String]| JobRequest {
        job_id: id.into(),
        topic: topic.clone(),
        tenant_id: tenant.into(),
        submitted_at: t0,
        depends_on: deps.to_vec(),
        ..Default::default()
    };
    let gate = "acme:gate".to_owned();
    produce_job(
        &producer,
        &JobRequest {
            not_before: Some(t0 + 6_000),
            ..request(&gate, "acme", &[])
        },
    );
    let fanned: Vec<String> = (0..FANOUT).map(|i| format!("acme:f{i:03}")).collect();
    for id in &fanned {
        produce_job(&producer, &request(id, "acme", std::slice::from_ref(&gate)));
    }
    let callback_deps: Vec<String> = fanned[..FANIN].to_vec();
    produce_job(
        &producer,
        &JobRequest {
            dependency_condition: DependencyCondition::AllTerminal,
            ..request("acme:callback", "acme", &callback_deps)
        },
    );
    produce_job(&producer, &request("acme:bad-fails", "acme", &[]));
    produce_job(
        &producer,
        &request("acme:doomed", "acme", &["acme:bad-fails".to_owned()]),
    );
    produce_job(
        &producer,
        &JobRequest {
            dependency_timeout_ms: Some(3_000),
            ..request("acme:ghost-wait", "acme", &["acme:ghost".to_owned()])
        },
    );
    produce_job(&producer, &request("other:theirs", "other", &[]));
    produce_job(
        &producer,
        &JobRequest {
            dependency_timeout_ms: Some(4_000),
            ..request("acme:theirs-wait", "acme", &["other:theirs".to_owned()])
        },
    );
    produce_job(
        &producer,
        &request("acme:late-wait", "acme", &["acme:late".to_owned()]),
    );
    producer.flush(Duration::from_secs(10)).unwrap();

    wait_until("the fan-out to wait BLOCKED", 60, || {
        job_state(&owner.api, "acme:callback").as_deref() == Some("BLOCKED")
            && job_state(&owner.api, "acme:late-wait").as_deref() == Some("BLOCKED")
    });
    let (code, out, err) = owner.cli(&["jobs", "get", "acme:callback", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["dependency_condition"], "ALL_TERMINAL");
    assert_eq!(v["depends_on"].as_array().unwrap().len(), FANIN);
    let (code, out, err) = owner.cli(&["jobs", "list", "--state", "BLOCKED", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert!(!listed["jobs"].as_array().unwrap().is_empty(), "{out}");
    // The console draws what the callback waits for, and what waits for the gate.
    let (code, page) = http(&format!("{}/ui/jobs/acme:callback", owner.api), "GET", None).unwrap();
    assert_eq!(code, 200);
    assert!(
        page.contains("aria-label=\"job dependencies\"") && page.contains("/ui/jobs/acme%3Af000"),
        "{page}"
    );
    let (_, page) = http(&format!("{}/ui/jobs/acme:gate", owner.api), "GET", None).unwrap();
    assert!(
        page.contains("/ui/jobs/acme%3Af000") && page.contains("more</text>"),
        "{page}"
    );
    // A dependency submitted after its dependent.
    produce_job(&producer, &request("acme:late", "acme", &[]));
    producer.flush(Duration::from_secs(10)).unwrap();

    // The owner goes around the gate's end, while its dependents are being released.
    wait_until("the gate to run", 60, || {
        runs.lock().unwrap().contains_key(&gate)
    });
    owner.kill();
    wait_until("the standby to take over", 60, || {
        role(&standby).as_deref() == Some("owner")
    });
    for id in fanned
        .iter()
        .chain([&"acme:callback".to_owned(), &"acme:late-wait".to_owned()])
    {
        wait_until(&format!("{id} to succeed"), 120, || {
            job_state(&standby.api, id).as_deref() == Some("SUCCEEDED")
        });
    }
    for id in ["acme:doomed", "acme:ghost-wait", "acme:theirs-wait"] {
        wait_until(&format!("{id} to fail"), 60, || {
            job_state(&standby.api, id).as_deref() == Some("FAILED")
        });
    }
    stop.cancel();

    // None before what it waits for, each once.
    let runs = runs.lock().unwrap().clone();
    let ended = |id: &str| runs.get(id).unwrap_or_else(|| panic!("{id} never ran"))[0].1;
    let gate_ended = ended(&gate);
    for id in &fanned {
        let r = &runs[id];
        assert_eq!(r.len(), 1, "{id} ran {r:?}");
        assert!(r[0].0 >= gate_ended, "{id} started before the gate ended");
    }
    let last_dep = callback_deps.iter().map(|id| ended(id)).max().unwrap();
    assert_eq!(runs["acme:callback"].len(), 1);
    assert!(
        runs["acme:callback"][0].0 >= last_dep,
        "the callback ran early"
    );
    assert!(runs["acme:late-wait"][0].0 >= ended("acme:late"));
    for id in ["acme:doomed", "acme:ghost-wait", "acme:theirs-wait"] {
        assert!(!runs.contains_key(id), "{id} ran");
    }

    // Each failure names the dependency that decided it.
    for (id, related) in [
        ("acme:doomed", "acme:bad-fails"),
        ("acme:ghost-wait", "acme:ghost"),
        ("acme:theirs-wait", "other:theirs"),
    ] {
        let v = json(&format!("{}/api/v1/dlq?job_id={id}", standby.api));
        let dl = &v["dead_letters"][0];
        assert_eq!(dl["reason_code"], "dependency_failed", "{id}: {v}");
        assert_eq!(dl["related_job_id"], related, "{id}: {v}");
    }

    // From the journal: one release and one dispatch per job, each dependency told once.
    let (code, out, err) = standby.cli(&["audit", "export"]);
    assert_eq!(code, 0, "{err}");
    let mut unblocked: BTreeMap<String, u32> = BTreeMap::new();
    let mut dispatched: BTreeMap<String, u32> = BTreeMap::new();
    let mut told: BTreeMap<(String, String), u32> = BTreeMap::new();
    for line in out.lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        for e in entry["events"].as_array().into_iter().flatten() {
            let id = e["job_id"].as_str().unwrap_or_default().to_owned();
            match e["type"].as_str() {
                Some("JobUnblocked") => *unblocked.entry(id).or_default() += 1,
                Some("JobDispatched") => *dispatched.entry(id).or_default() += 1,
                Some("DependencyResolved") => {
                    let dep = e["dependency"].as_str().unwrap_or_default().to_owned();
                    *told.entry((id, dep)).or_default() += 1;
                }
                _ => {}
            }
        }
    }
    for id in fanned.iter().chain([&"acme:callback".to_owned()]) {
        assert_eq!(unblocked.get(id), Some(&1), "{id} unblocked");
        assert_eq!(dispatched.get(id), Some(&1), "{id} dispatched");
    }
    assert!(told.values().all(|n| *n == 1), "a dependency told twice");
    assert_eq!(
        told.keys().filter(|(_, dep)| *dep == gate).count(),
        FANOUT,
        "every dependent of the gate told"
    );
    let (code, out, err) = standby.cli(&["audit", "verify"]);
    assert_eq!(code, 0, "{out}{err}");
}
