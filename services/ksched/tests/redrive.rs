//! Redrive against the real broker: a dead-lettered job submitted again from the API and
//! from the CLI (`ksched dlq redrive`), run by a real SDK worker with the old job's payload,
//! journaled with who did it and why, and `audit verify` still clean.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use ksched_core::records::JobRequest;
use ksched_worker::{Outcome, Worker};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

#[test]
fn a_dead_lettered_job_is_redriven_from_the_api_and_the_cli_and_runs_with_its_payload() {
    let rc = RunningScheduler::start("");
    // The worker fails a job fatally until the "fix" is deployed, and notes every payload.
    let fixed = Arc::new(Mutex::new(false));
    // (job id, payload) of every run.
    type Runs = Arc<Mutex<Vec<(String, Vec<u8>)>>>;
    let seen: Runs = Arc::default();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let token = CancellationToken::new();
    let worker = {
        let _guard = rt.enter();
        Worker::new(rc.worker_config("redrive-worker")).unwrap()
    };
    let (f, s, t) = (fixed.clone(), seen.clone(), token.clone());
    rt.spawn(async move {
        worker
            .run(
                move |job| {
                    let (f, s) = (f.clone(), s.clone());
                    async move {
                        s.lock()
                            .unwrap()
                            .push((job.job_id().to_owned(), job.payload().to_vec()));
                        if *f.lock().unwrap() {
                            Outcome::succeeded()
                        } else {
                            Outcome::fatal("bad_input", "the bug is not fixed yet")
                        }
                    }
                },
                t,
            )
            .await
    });

    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &rc.bootstrap)
        .create()
        .unwrap();
    for id in ["broken-1", "broken-2"] {
        produce_job(
            &producer,
            &JobRequest {
                job_id: id.into(),
                topic: rc.job_topic.clone(),
                tenant_id: "acme".into(),
                payload: format!("payload of {id}").into_bytes(),
                submitted_at: 1,
                ..JobRequest::default()
            },
        );
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    wait_state(&rc.api, "broken-1", "FAILED");
    wait_state(&rc.api, "broken-2", "FAILED");
    *fixed.lock().unwrap() = true;

    // A job that did not fail is not redriven: the API says why.
    let (code, body) = http(
        &format!("{}/api/v1/jobs/nobody/redrive", rc.api),
        "POST",
        Some(r#"{"principal":"ops"}"#),
    )
    .unwrap();
    assert_eq!(code, 404, "{body}");

    // From the API, with a chosen id and a reason.
    let (code, body) = http(
        &format!("{}/api/v1/jobs/broken-1/redrive", rc.api),
        "POST",
        Some(r#"{"principal":"ops","new_job_id":"broken-1.again","reason":"fixed in v2"}"#),
    )
    .unwrap();
    assert_eq!(code, 202, "{body}");
    wait_state(&rc.api, "broken-1.again", "SUCCEEDED");

    // From the CLI, with the default id.
    let (code, out, err) = rc.cli(&[
        "dlq",
        "redrive",
        "broken-2",
        "--principal",
        "ops",
        "--reason",
        "fixed in v2",
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let new_id = v["new_job_id"].as_str().unwrap().to_owned();
    assert!(new_id.starts_with("broken-2.redrive-"), "{new_id}");
    wait_state(&rc.api, &new_id, "SUCCEEDED");

    // The new jobs ran the old ones' payloads; the old ones stay FAILED.
    let seen = seen.lock().unwrap().clone();
    for (new, old) in [
        ("broken-1.again", "broken-1"),
        (new_id.as_str(), "broken-2"),
    ] {
        let payload = seen
            .iter()
            .find(|(id, _)| id == new)
            .map(|(_, p)| p.clone())
            .unwrap_or_else(|| panic!("{new} never ran: {seen:?}"));
        assert_eq!(payload, format!("payload of {old}").into_bytes());
        assert_eq!(job_state(&rc.api, old).as_deref(), Some("FAILED"));
    }

    // Journaled with who and why, in both jobs' histories.
    for id in ["broken-1", "broken-1.again"] {
        let h = json(&format!("{}/api/v1/jobs/{id}/history", rc.api));
        let line = h["history"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["event"] == "JobRedriven")
            .unwrap_or_else(|| panic!("{id}: {h}"))
            .clone();
        assert_eq!(
            line["detail"], "broken-1 redriven as broken-1.again by ops: fixed in v2",
            "{id}"
        );
    }

    // Twice into the same id: refused before it is sent; a succeeded job: conflict.
    let (code, body) = http(
        &format!("{}/api/v1/jobs/broken-1/redrive", rc.api),
        "POST",
        Some(r#"{"principal":"ops","new_job_id":"broken-1.again"}"#),
    )
    .unwrap();
    assert_eq!(code, 409, "{body}");
    let (code, out, err) = rc.cli(&["dlq", "redrive", "broken-1.again"]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("only a dead-lettered job"), "{err}");

    // Replaying every recorded input reproduces the journal, redrives included.
    let (code, out, err) = rc.cli(&["audit", "verify", "-o", "json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["divergences"].as_array().unwrap().len(), 0, "{out}");

    token.cancel();
    rt.shutdown_timeout(Duration::from_secs(10));
    rc.stop();
}
