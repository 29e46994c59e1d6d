//! Schedules against the real broker and two `ksched run` processes (an owner and a
//! standby): a schedule made through the CLI fires every two seconds; the owner is
//! SIGKILLed and the standby goes on with it. No firing submits twice (one JobAccepted and
//! one dispatch per firing's job, each received once by the worker), pause stops the
//! firings, trigger fires once, delete ends them, `audit verify` reproduces the journal, and
//! `audit what-if --pause-schedule` names exactly the jobs its timed firings made.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use ksched_worker::{Outcome, Worker};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

fn show(c: &RunningScheduler) -> Option<Value> {
    let (code, out, _) = c.cli(&["schedules", "show", "acme:beat", "-o", "json"]);
    (code == 0)
        .then(|| serde_json::from_str(&out).ok())
        .flatten()
}

#[test]
fn a_schedule_fires_once_per_time_across_a_kill_and_a_takeover() {
    let (mut owner, standby) = owner_and_standby();

    let received: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stop = CancellationToken::new();
    {
        let _guard = rt.enter();
        let worker = Worker::new(owner.worker_config("beat-worker")).unwrap();
        let (s, received) = (stop.clone(), received.clone());
        rt.spawn(async move {
            worker
                .run(
                    move |job| {
                        let received = received.clone();
                        async move {
                            *received
                                .lock()
                                .unwrap()
                                .entry(job.dispatch.job.job_id.clone())
                                .or_default() += 1;
                            Outcome::succeeded()
                        }
                    },
                    s,
                )
                .await
        });
    }

    let topic = owner.job_topic.clone();
    let (code, out, err) = owner.cli(&[
        "schedules",
        "create",
        "acme:beat",
        "--every",
        "2s",
        "--topic",
        &topic,
        "--payload",
        "tick",
        "--label",
        "kind=beat",
        "--reason",
        "e2e",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    // A bad one is refused by the API before it reaches the journal.
    let (code, _, err) = owner.cli(&[
        "schedules",
        "create",
        "acme:bad",
        "--cron",
        "61 * * * *",
        "--topic",
        &topic,
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("cron"), "{err}");

    wait_until("three firings to run", 60, || {
        show(&owner).is_some_and(|v| v["submitted"].as_u64().unwrap_or(0) >= 3)
    });
    let (code, out, err) = owner.cli(&["schedules", "list", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["schedules"][0]["schedule_id"], "beat", "{out}");
    assert_eq!(
        listed["schedules"][0]["next_firings"]
            .as_array()
            .map(Vec::len),
        Some(5)
    );

    owner.kill();
    wait_until("the standby to take over", 60, || {
        role(&standby).as_deref() == Some("owner")
    });
    let before = show(&standby).map_or(0, |v| v["submitted"].as_u64().unwrap_or(0));
    wait_until("three more firings on the new owner", 60, || {
        show(&standby).is_some_and(|v| v["submitted"].as_u64().unwrap_or(0) >= before + 3)
    });

    let (code, _, err) = standby.cli(&["schedules", "pause", "acme:beat", "--reason", "quiet"]);
    assert_eq!(code, 0, "{err}");
    wait_until("the pause to be decided", 30, || {
        show(&standby).is_some_and(|v| v["paused"] == true)
    });
    let paused_at = show(&standby).unwrap()["submitted"].as_u64().unwrap();
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        show(&standby).unwrap()["submitted"].as_u64().unwrap(),
        paused_at,
        "no firing while paused"
    );
    let (code, _, err) = standby.cli(&["schedules", "trigger", "acme:beat"]);
    assert_eq!(code, 0, "{err}");
    wait_until("the trigger to run", 30, || {
        received
            .lock()
            .unwrap()
            .keys()
            .any(|id| id.ends_with("/trigger"))
    });
    let (code, _, err) = standby.cli(&["schedules", "delete", "acme:beat"]);
    assert_eq!(code, 0, "{err}");
    wait_until("the delete to be decided", 30, || show(&standby).is_none());

    // Every firing's job ran, each once; the journal submitted and dispatched each once.
    let (code, out, err) = standby.cli(&["audit", "export"]);
    assert_eq!(code, 0, "{err}");
    let mut submitted: BTreeMap<i64, u32> = BTreeMap::new();
    let mut accepted: BTreeMap<String, u32> = BTreeMap::new();
    let mut dispatched: BTreeMap<String, u32> = BTreeMap::new();
    for line in out.lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        for e in entry["events"].as_array().into_iter().flatten() {
            let id = e["job_id"].as_str().unwrap_or_default().to_owned();
            match e["type"].as_str() {
                Some("ScheduleFired") if e["outcome"] == "SUBMITTED" => {
                    *submitted.entry(e["slot"].as_i64().unwrap()).or_default() += 1;
                }
                Some("JobAccepted") if id.starts_with("acme:beat@") => {
                    *accepted.entry(id).or_default() += 1
                }
                Some("JobDispatched") if id.starts_with("acme:beat@") => {
                    *dispatched.entry(id).or_default() += 1
                }
                _ => {}
            }
        }
    }
    assert!(submitted.len() >= 7, "{submitted:?}");
    assert!(
        submitted.values().all(|n| *n == 1),
        "a firing submitted twice: {submitted:?}"
    );
    assert_eq!(accepted.len(), submitted.len());
    assert!(accepted.values().all(|n| *n == 1), "{accepted:?}");
    assert!(dispatched.values().all(|n| *n == 1), "{dispatched:?}");
    stop.cancel();
    let received = received.lock().unwrap().clone();
    for id in accepted.keys() {
        assert_eq!(received.get(id), Some(&1), "{id}: {received:?}");
    }
    let (code, out, err) = standby.cli(&["audit", "verify"]);
    assert_eq!(code, 0, "{out}{err}");

    // What if it had been paused from the start: none of its timed firings' jobs would have
    // existed; the trigger, a human's act, stands.
    let (code, out, err) = standby.cli(&[
        "audit",
        "what-if",
        "--pause-schedule",
        "acme:beat",
        "--pause-schedule",
        "acme:never",
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let differing: Vec<&str> = rows.iter().map(|r| r["job_id"].as_str().unwrap()).collect();
    let timed: Vec<&str> = (accepted.keys())
        .map(String::as_str)
        .filter(|id| !id.ends_with("/trigger"))
        .collect();
    assert_eq!(differing, timed, "{out}");
    for r in rows {
        assert_eq!(r["alternative"]["state"], Value::Null, "{r}");
        assert_ne!(r["actual"]["state"], Value::Null, "{r}");
    }
    assert_eq!(v["schedules_not_found"], serde_json::json!(["acme:never"]));
}
