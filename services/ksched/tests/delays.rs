//! Run-at and delayed jobs against the real broker and two `ksched run` processes (an owner
//! and a standby): jobs due over several seconds are submitted, the owner is SIGKILLed while
//! most of them wait, and the standby releases the rest. None is lost, none runs before its
//! time, none is released or dispatched twice; a reschedule and a cancel made through the CLI
//! hold across the takeover, and `audit verify` reproduces the journal.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use ksched_core::records::JobRequest;
use ksched_worker::{Outcome, Worker};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

fn now_ms() -> i64 {
    ksched_runtime::clock::wall_clock_ms()
}

#[test]
fn delayed_jobs_survive_a_kill_and_a_takeover_none_lost_early_or_twice() {
    let (mut owner, standby) = owner_and_standby();

    // When each job reached the worker, by the host's clock (the broker's, on this host).
    let received: Arc<Mutex<BTreeMap<String, Vec<i64>>>> = Arc::default();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stop = CancellationToken::new();
    {
        let _guard = rt.enter();
        let worker = Worker::new(owner.worker_config("delay-worker")).unwrap();
        let (s, received) = (stop.clone(), received.clone());
        rt.spawn(async move {
            worker
                .run(
                    move |job| {
                        let received = received.clone();
                        async move {
                            received
                                .lock()
                                .unwrap()
                                .entry(job.dispatch.job.job_id.clone())
                                .or_default()
                                .push(now_ms());
                            Outcome::succeeded()
                        }
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
    let t0 = now_ms();
    let mut due = BTreeMap::new();
    // Sixty jobs due 4 to 10 s from now, submitted in an order unlike their times.
    for i in 0..60 {
        let id = format!("acme:d{i:02}");
        let not_before = t0 + 4_000 + ((i * 37) % 60) * 100;
        produce_job(
            &producer,
            &JobRequest {
                job_id: id.clone(),
                topic: topic.clone(),
                tenant_id: "acme".into(),
                submitted_at: t0,
                not_before: Some(not_before),
                ..Default::default()
            },
        );
        due.insert(id, not_before);
    }
    for (id, not_before) in [("acme:moved", t0 + 600_000), ("acme:never", t0 + 3_600_000)] {
        produce_job(
            &producer,
            &JobRequest {
                job_id: id.into(),
                topic: topic.clone(),
                tenant_id: "acme".into(),
                submitted_at: t0,
                not_before: Some(not_before),
                ..Default::default()
            },
        );
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    wait_until("the jobs to wait DELAYED", 60, || {
        job_state(&owner.api, "acme:never").as_deref() == Some("DELAYED")
            && job_state(&owner.api, "acme:moved").as_deref() == Some("DELAYED")
    });
    let (code, out, err) = owner.cli(&["jobs", "list", "--state", "DELAYED", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert!(
        listed["jobs"].as_array().unwrap().len() >= 2,
        "delayed jobs are listed: {out}"
    );
    let (code, _, err) = owner.cli(&["jobs", "reschedule", "acme:moved", "--delay", "7s"]);
    assert_eq!(code, 0, "{err}");
    let moved_to = now_ms() + 7_000;
    let (code, _, err) = owner.cli(&["cancel", "acme:never", "--reason", "not needed"]);
    assert_eq!(code, 0, "{err}");
    wait_until("the cancel to be decided", 30, || {
        job_state(&owner.api, "acme:never").as_deref() == Some("CANCELLED")
    });

    // The owner goes while most jobs wait.
    let wait = (t0 + 5_000 - now_ms()).max(0);
    std::thread::sleep(Duration::from_millis(wait as u64));
    owner.kill();
    wait_until("the standby to take over", 60, || {
        role(&standby).as_deref() == Some("owner")
    });
    for id in due.keys().chain([&"acme:moved".to_owned()]) {
        wait_until(&format!("{id} to succeed"), 120, || {
            job_state(&standby.api, id).as_deref() == Some("SUCCEEDED")
        });
    }
    stop.cancel();

    // None early: a job reached the worker only once its time had come.
    due.insert("acme:moved".into(), moved_to - 1_000);
    let received = received.lock().unwrap().clone();
    for (id, not_before) in &due {
        let at = received.get(id).unwrap_or_else(|| panic!("{id} never ran"));
        assert!(
            at[0] >= *not_before,
            "{id} ran at {} ms, {} ms before its time",
            at[0],
            not_before - at[0]
        );
    }
    assert!(!received.contains_key("acme:never"));
    assert_eq!(
        job_state(&standby.api, "acme:never").as_deref(),
        Some("CANCELLED")
    );

    // None twice, from the journal: one release and one dispatch per job.
    let (code, out, err) = standby.cli(&["audit", "export"]);
    assert_eq!(code, 0, "{err}");
    let mut released: BTreeMap<String, u32> = BTreeMap::new();
    let mut dispatched: BTreeMap<String, u32> = BTreeMap::new();
    for line in out.lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        for e in entry["events"].as_array().into_iter().flatten() {
            let id = e["job_id"].as_str().unwrap_or_default().to_owned();
            match e["type"].as_str() {
                Some("JobReleased") => *released.entry(id).or_default() += 1,
                Some("JobDispatched") => *dispatched.entry(id).or_default() += 1,
                _ => {}
            }
        }
    }
    for id in due.keys() {
        assert_eq!(released.get(id), Some(&1), "{id} released {released:?}");
        assert_eq!(
            dispatched.get(id),
            Some(&1),
            "{id} dispatched {dispatched:?}"
        );
    }
    assert_eq!(released.get("acme:never"), None);
    let (code, out, err) = standby.cli(&["audit", "verify"]);
    assert_eq!(code, 0, "{out}{err}");
}
