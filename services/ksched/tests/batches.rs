//! Batches against the real broker and two `ksched run` processes (an owner and a standby):
//! a batch of 400 members (every tenth fails) with a callback submitted before them; the
//! owner is SIGKILLed when about half the members ran, and the standby finishes. The
//! callback runs exactly once, after the last member ended, with the counts of succeeded
//! and failed in its request. A second batch, of members waiting for their time, is
//! cancelled with `ksched batches cancel`: its members are cancelled, its callback fails
//! `dependency_failed`. `ksched batches show`, the API and the console show both;
//! `audit verify` reproduces the journal.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use ksched_core::records::{BatchOutcome, JobRequest};
use ksched_worker::Outcome;
use rdkafka::producer::Producer;
use serde_json::Value;

fn now_ms() -> i64 {
    ksched_runtime::clock::wall_clock_ms()
}

const MEMBERS: usize = 400;
const LATER: usize = 30;

/// Each run at the worker: (started, ended) by the host's clock, and the batch outcome its
/// request carried.
type Runs = Arc<Mutex<BTreeMap<String, Vec<(i64, i64, Option<BatchOutcome>)>>>>;

#[test]
fn a_callback_runs_once_with_its_counts_across_a_kill_and_a_cancelled_batch_cancels_its_members() {
    let (mut owner, standby) = owner_and_standby();
    let runs: Runs = Arc::default();
    let recorded = runs.clone();
    let (_rt, stop) = run_worker(&owner, "batch-worker", 32, move |job| {
        let runs = recorded.clone();
        async move {
            let id = job.dispatch.job.job_id.clone();
            let outcome = job.dispatch.job.batch_outcome.clone();
            let started = now_ms();
            tokio::time::sleep(Duration::from_millis(40)).await;
            runs.lock()
                .unwrap()
                .entry(id.clone())
                .or_default()
                .push((started, now_ms(), outcome));
            if id.ends_with('0') && id.contains(":m") {
                Outcome::fatal("boom", "failed on purpose")
            } else {
                Outcome::succeeded()
            }
        }
    });

    let producer = producer_of(&owner);
    let topic = owner.job_topic.clone();
    let t0 = now_ms();
    let request = |id: &str| JobRequest {
        job_id: id.into(),
        topic: topic.clone(),
        tenant_id: "acme".into(),
        submitted_at: t0,
        ..Default::default()
    };
    let member = |id: &str, batch: &str, size: usize| JobRequest {
        batch_id: Some(batch.into()),
        batch_size: Some(size as i32),
        ..request(id)
    };
    let callback = |id: &str, batch: &str| JobRequest {
        after_batch: Some(batch.into()),
        ..request(id)
    };
    // The second batch first: its members wait for a time an hour ahead.
    produce_job(&producer, &callback("acme:later-done", "later"));
    for i in 0..LATER {
        let m = JobRequest {
            not_before: Some(t0 + 3_600_000),
            ..member(&format!("acme:l{i:03}"), "later", LATER)
        };
        produce_job(&producer, &m);
    }
    produce_job(&producer, &callback("acme:nightly-done", "nightly"));
    let members: Vec<String> = (0..MEMBERS).map(|i| format!("acme:m{i:03}")).collect();
    for id in &members {
        produce_job(&producer, &member(id, "nightly", MEMBERS));
    }
    producer.flush(Duration::from_secs(10)).unwrap();

    // Cancel the second batch once all its members are in.
    wait_until("the second batch to have its members", 60, || {
        let (_, body) = http(
            &format!("{}/api/v1/batches/acme/later", owner.api),
            "GET",
            None,
        )
        .unwrap_or_default();
        serde_json::from_str::<Value>(&body).is_ok_and(|v| v["joined"] == LATER)
    });
    let (code, out, err) = owner.cli(&["batches", "cancel", "acme:later", "--reason", "wrong day"]);
    assert_eq!(code, 0, "{out}{err}");

    // The owner goes when about half the first batch ran.
    wait_until("half the batch to run", 120, || {
        runs.lock().unwrap().len() >= MEMBERS / 2
    });
    let at_kill = runs.lock().unwrap().len();
    owner.kill();
    eprintln!("killed the owner with {at_kill} of {MEMBERS} members run");
    assert!(
        !runs.lock().unwrap().contains_key("acme:nightly-done"),
        "the kill came after the callback"
    );
    wait_until("the standby to take over", 60, || {
        role(&standby).as_deref() == Some("owner")
    });
    wait_until("the callback to succeed", 180, || {
        job_state(&standby.api, "acme:nightly-done").as_deref() == Some("SUCCEEDED")
    });
    wait_until("the cancelled batch's callback to fail", 60, || {
        job_state(&standby.api, "acme:later-done").as_deref() == Some("FAILED")
    });
    for i in 0..LATER {
        let id = format!("acme:l{i:03}");
        wait_until(&format!("{id} to be cancelled"), 60, || {
            job_state(&standby.api, &id).as_deref() == Some("CANCELLED")
        });
    }
    stop.cancel();

    // Once, after the last member ended, with the counts.
    let runs = runs.lock().unwrap().clone();
    let last_member = (members.iter())
        .map(|id| runs.get(id).unwrap_or_else(|| panic!("{id} never ran"))[0].1)
        .max()
        .unwrap();
    let done = &runs["acme:nightly-done"];
    assert_eq!(done.len(), 1, "the callback ran {done:?}");
    assert!(done[0].0 >= last_member, "the callback ran early");
    // A figure for the record, not a check: the last member's end at the worker to the
    // callback's start there (its result, the entry ending the batch, the continuation
    // releasing the callback, its dispatch, the worker's fetch).
    eprintln!(
        "last member ended -> callback started at the worker: {} ms",
        done[0].0 - last_member
    );
    let failed = MEMBERS / 10;
    let want = BatchOutcome {
        batch_id: "nightly".into(),
        succeeded: (MEMBERS - failed) as i32,
        failed: failed as i32,
    };
    assert_eq!(done[0].2.as_ref(), Some(&want));
    assert!(!runs.contains_key("acme:later-done"));
    assert!(runs.keys().all(|id| !id.starts_with("acme:l")));
    let v = json(&format!(
        "{}/api/v1/dlq?job_id=acme:later-done",
        standby.api
    ));
    let dl = &v["dead_letters"][0];
    assert_eq!(dl["reason_code"], "dependency_failed", "{v}");
    assert!(
        dl["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("CANCELLED"),
        "{v}"
    );

    // What the API, the CLI and the console show.
    let v = json(&format!("{}/api/v1/batches/acme/nightly", standby.api));
    assert_eq!(v["state"], "COMPLETE", "{v}");
    assert_eq!(
        (v["succeeded"].as_i64(), v["failed"].as_i64()),
        (Some(360), Some(40))
    );
    assert_eq!(v["members_not_ended"], serde_json::json!([]));
    let (code, out, err) = standby.cli(&["batches", "show", "acme:later", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let later: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(later["state"], "CANCELLED", "{out}");
    assert_eq!(later["failed"], LATER, "{out}");
    let (code, out, err) = standby.cli(&["batches", "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("acme:nightly") && out.contains("COMPLETE"),
        "{out}"
    );
    let (code, page) = http(&format!("{}/ui/batches", standby.api), "GET", None).unwrap();
    assert_eq!(code, 200);
    assert!(
        page.contains("/ui/batches/acme/nightly") && page.contains("class=\"progress\""),
        "{page}"
    );
    let (code, out, err) = standby.cli(&["jobs", "get", "acme:nightly-done", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["batch_outcome"]["succeeded"], 360, "{out}");

    // From the journal: the callback released and dispatched once.
    let (code, out, err) = standby.cli(&["audit", "export"]);
    assert_eq!(code, 0, "{err}");
    let mut counted: BTreeMap<(String, String), u32> = BTreeMap::new();
    for line in out.lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        for e in entry["events"].as_array().into_iter().flatten() {
            let id = e["job_id"].as_str().unwrap_or_default().to_owned();
            let kind = e["type"].as_str().unwrap_or_default().to_owned();
            *counted.entry((id, kind)).or_default() += 1;
        }
    }
    let n = |id: &str, kind: &str| counted.get(&(id.to_owned(), kind.to_owned())).copied();
    assert_eq!(n("acme:nightly-done", "JobUnblocked"), Some(1));
    assert_eq!(n("acme:nightly-done", "JobDispatched"), Some(1));
    for id in &members {
        assert_eq!(n(id, "JobDispatched"), Some(1), "{id}");
    }
    let (code, out, err) = standby.cli(&["audit", "verify"]);
    assert_eq!(code, 0, "{out}{err}");
}
