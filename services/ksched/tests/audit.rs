//! Replay-based audit against the real broker: a scheduler runs a mixed workload (successes,
//! a retry, a dead letter, an approval, a cancel, a lost worker), is stopped, and then the
//! journal alone must rebuild the projection exactly, verify without divergence (and find the
//! one entry of a tampered copy), tell each job's story, show the state as of a past moment,
//! and answer what a different policy would have done.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use ksched_core::events::{Event, JournalEntry};
use ksched_testkit::{client_config, create_topic, read_to_end};
use ksched_worker::{Outcome, Worker};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

fn worker(
    c: &RunningScheduler,
    rt: &tokio::runtime::Runtime,
    id: &str,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<ksched_worker::Result<()>>,
) {
    let cfg = c.worker_config(id);
    let token = CancellationToken::new();
    let t = token.clone();
    let _guard = rt.enter();
    let w = Worker::new(cfg).unwrap();
    let handle = rt.spawn(async move {
        w.run(
            |job| async move {
                match job.dispatch.job.labels.get("mode").map(String::as_str) {
                    Some("fail") => Outcome::fatal("audit_fatal", "fails by design"),
                    Some("flaky") if job.attempt() == 1 => {
                        Outcome::retryable("audit_flaky", "first try fails")
                    }
                    Some("block") | Some("hang") => {
                        job.cancel.cancelled().await;
                        Outcome::Cancelled
                    }
                    _ => Outcome::succeeded(),
                }
            },
            t,
        )
        .await
    });
    (token, handle)
}

fn submit(c: &RunningScheduler, topic: &str, id: &str, labels: &[&str]) {
    let mut args = vec![
        "submit", "--topic", topic, "--job-id", id, "--tenant", "acme",
    ];
    for l in labels {
        args.extend(["--label", l]);
    }
    let (code, _, err) = c.cli(&args);
    assert_eq!(code, 0, "{err}");
}

fn workers_alive(c: &RunningScheduler) -> Vec<String> {
    json(&format!("{}/api/v1/workers", c.api))["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["alive"] == true && !w["owned_partitions"].as_array().unwrap().is_empty())
        .map(|w| w["worker_id"].as_str().unwrap().to_owned())
        .collect()
}

/// The names of the events of a job's timeline (from `audit job -o json`).
fn timeline_events(c: &RunningScheduler, id: &str) -> Vec<String> {
    let (code, out, err) = c.cli(&["audit", "job", id, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    v["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|e| e["events"].as_array().unwrap().clone())
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

fn in_order(haystack: &[String], needles: &[&str]) -> bool {
    let mut it = haystack.iter();
    needles.iter().all(|n| it.any(|h| h == n))
}

#[test]
fn the_journal_alone_answers_the_audit_questions() {
    let c = RunningScheduler::start_with_topics("", &["jobs", "reports"]);
    let jobs = c.job_topic.clone();
    let reports = format!("{}reports", c.prefix);
    let rt = tokio::runtime::Runtime::new().unwrap();

    // A worker that will be lost while it holds a job.
    let (_lost_token, lost) = worker(&c, &rt, "w-lost");
    wait_until("w-lost", 60, || {
        workers_alive(&c).contains(&"w-lost".to_owned())
    });
    submit(&c, &jobs, "hang-1", &["mode=hang"]);
    wait_state(&c.api, "hang-1", "RUNNING");
    lost.abort(); // no drain, no more heartbeats: lost after worker_ttl (3 s)
    let (w1_token, _w1) = worker(&c, &rt, "w1");
    wait_until("w1", 60, || workers_alive(&c).contains(&"w1".to_owned()));

    submit(&c, &jobs, "ok-1", &[]);
    submit(&c, &jobs, "ok-2", &[]);
    submit(&c, &jobs, "flaky-1", &["mode=flaky"]);
    submit(&c, &jobs, "fail-1", &["mode=fail"]);
    submit(&c, &jobs, "approve-1", &["approval=required"]);
    submit(&c, &jobs, "cancel-1", &["mode=block"]);
    wait_state(&c.api, "approve-1", "APPROVAL_REQUIRED");
    assert_eq!(c.cli(&["approve", "approve-1"]).0, 0);
    wait_state(&c.api, "cancel-1", "RUNNING");
    assert_eq!(c.cli(&["cancel", "cancel-1"]).0, 0);
    for (id, state) in [
        ("ok-1", "SUCCEEDED"),
        ("ok-2", "SUCCEEDED"),
        ("flaky-1", "SUCCEEDED"),
        ("fail-1", "FAILED"),
        ("approve-1", "SUCCEEDED"),
        ("cancel-1", "CANCELLED"),
    ] {
        wait_state(&c.api, id, state);
    }
    // hang-1 was on the lost worker: retried as worker_lost, it now hangs on w1 until cancelled.
    wait_until("hang-1 to run again", 60, || {
        json(&format!("{}/api/v1/jobs/hang-1", c.api))["attempt"] == 2
    });
    wait_state(&c.api, "hang-1", "RUNNING");
    assert_eq!(c.cli(&["cancel", "hang-1"]).0, 0);
    wait_state(&c.api, "hang-1", "CANCELLED");

    // The moment `audit at` must reproduce: every job's state, at a journal watermark.
    let captured_at = json(&format!("{}/health/ready", c.api))["journal_watermark"]
        .as_i64()
        .unwrap();
    let captured: BTreeMap<String, String> =
        json(&format!("{}/api/v1/jobs?limit=1000", c.api))["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| {
                (
                    j["job_id"].as_str().unwrap().to_owned(),
                    j["state"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
    assert_eq!(captured.len(), 7);

    // After the moment: report jobs on their own topic (what-if will deny that topic).
    submit(&c, &reports, "report-1", &[]);
    submit(&c, &reports, "report-2", &[]);
    wait_state(&c.api, "report-1", "SUCCEEDED");
    wait_state(&c.api, "report-2", "SUCCEEDED");

    // A checkpoint of the running scheduler, for comparison after it stops too.
    let (code, body) = http(
        &format!("{}/api/v1/admin/checkpoint", c.api),
        "POST",
        Some(""),
    )
    .unwrap();
    assert_eq!(code, 201, "{body}");
    let checkpoint: Value = serde_json::from_str(&body).unwrap();
    let checkpoint_path = checkpoint["path"].as_str().unwrap().to_owned();
    assert!(checkpoint["journal_watermark"].as_i64().unwrap() > captured_at);

    w1_token.cancel();
    rt.shutdown_timeout(Duration::from_secs(10));
    let data = c.data_dir();
    let prefix = c.prefix.clone();
    let bootstrap = c.bootstrap.clone();
    // Stop the scheduler but keep the harness (config, CLI) around.
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(c.child.id().to_string())
        .status();
    let mut c = c;
    assert!(c.child.wait().unwrap().success());

    // 1. rebuild == live (the stopped scheduler's store, and the checkpoint).
    let (code, out, err) = c.cli(&[
        "audit",
        "rebuild",
        "--compare-with",
        &path_str(&data),
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["equal"], true, "{out}");
    assert!(v["entries"].as_u64().unwrap() > 20);
    let (code, out, _) = c.cli(&["audit", "rebuild", "--compare-with", &checkpoint_path]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("equal to the live projection"), "{out}");

    // 2. verify: no divergence.
    let (code, out, err) = c.cli(&["audit", "verify", "-o", "json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["divergences"].as_array().unwrap().len(), 0, "{out}");

    // ... and exactly one in a copy of the journal where one event was altered.
    let copy = format!("{prefix}journal-tampered");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(create_topic(&bootstrap, &copy, 1)).unwrap();
    let producer: BaseProducer = client_config(&bootstrap).create().unwrap();
    let mut tampered_at = None;
    for (i, rec) in read_to_end(&bootstrap, &format!("{prefix}journal"))
        .unwrap()
        .into_iter()
        .enumerate()
    {
        let mut bytes = rec.payload.unwrap();
        let mut entry: JournalEntry = ksched_codec::decode(&bytes).unwrap();
        if tampered_at.is_none() {
            for e in &mut entry.events {
                if let Event::DeadLettered(d) = e
                    && d.dead_letter.job_id == "fail-1"
                {
                    d.dead_letter.reason = "nothing to see here".into();
                    tampered_at = Some(i as i64);
                }
            }
            if tampered_at == Some(i as i64) {
                bytes = ksched_codec::encode(&entry).unwrap();
            }
        }
        producer
            .send(
                BaseRecord::to(&copy)
                    .partition(0)
                    .key(&rec.key.unwrap_or_default())
                    .payload(&bytes),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    let tampered_at = tampered_at.expect("the DLQ entry of fail-1 is in the journal");
    let (code, out, _) = c.cli(&["audit", "verify", "--journal-topic", &copy, "-o", "json"]);
    assert_eq!(code, 6, "a divergence fails the audit: {out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let d = v["divergences"].as_array().unwrap();
    assert_eq!(d.len(), 1, "{out}");
    assert_eq!(d[0]["offset"].as_i64(), Some(tampered_at));
    assert!(d[0]["input"].as_str().unwrap().contains("fail-1"), "{out}");
    assert!(
        d[0]["detail"]
            .as_str()
            .unwrap()
            .contains("nothing to see here"),
        "{out}"
    );

    // 3. job timelines.
    let flaky = timeline_events(&c, "flaky-1");
    assert!(
        in_order(
            &flaky,
            &[
                "JobAccepted",
                "PolicyEvaluated",
                "JobQueued",
                "JobScheduled",
                "JobDispatched",
                "JobRunning",
                "JobRetrying",
                "JobQueued",
                "JobScheduled",
                "JobDispatched",
                "JobRunning",
                "JobSucceeded",
            ]
        ),
        "{flaky:?}"
    );
    let approve = timeline_events(&c, "approve-1");
    assert!(
        in_order(
            &approve,
            &[
                "PolicyEvaluated",
                "ApprovalRequested",
                "JobApproved",
                "JobSucceeded"
            ]
        ),
        "{approve:?}"
    );
    let fail = timeline_events(&c, "fail-1");
    assert!(
        in_order(&fail, &["JobRunning", "JobFailed", "DeadLettered"]),
        "{fail:?}"
    );
    let hang = timeline_events(&c, "hang-1");
    assert!(
        in_order(
            &hang,
            &[
                "JobRunning",
                "WorkerLost",
                "JobRetrying",
                "JobScheduled",
                "JobRunning",
                "JobCancelled",
                "DispatchCancelled"
            ]
        ),
        "{hang:?}"
    );
    let (code, out, _) = c.cli(&["audit", "job", "flaky-1"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("candidates:") && out.contains("w1=") && out.contains("retry in"),
        "{out}"
    );
    assert!(
        out.contains(&format!("from {jobs}/")),
        "input coordinates: {out}"
    );
    assert_eq!(c.cli(&["audit", "job", "never-was"]).0, 3);

    // 4. the state as of the captured moment.
    let (code, out, err) = c.cli(&[
        "audit",
        "at",
        "--offset",
        &captured_at.to_string(),
        "--all",
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let then: BTreeMap<String, String> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["job_id"].as_str().unwrap().to_owned(),
                j["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        then, captured,
        "audit at {captured_at} vs the projection captured then"
    );
    assert!(!then.contains_key("report-1"));
    let log_time = v["log_time"].as_i64().unwrap();
    let (code, out, _) = c.cli(&["audit", "at", &log_time.to_string(), "--all", "-o", "json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(v["jobs"].as_array().unwrap().len() >= 7);

    // 5. what-if: a policy that denies the reports topic changes exactly the report jobs.
    let policy = c.dir.path().join("deny-reports");
    std::fs::create_dir_all(&policy).unwrap();
    std::fs::write(
        policy.join("input.rego"),
        format!(
            "package ksched.input\ndefault allow := true\nrequire_approval contains \"a human must approve\" if input.job.labels.approval == \"required\"\ndeny contains \"no reports\" if input.job.topic == \"{reports}\"\n"
        ),
    )
    .unwrap();
    let (code, out, err) = c.cli(&[
        "audit",
        "what-if",
        "--policy",
        &path_str(&policy),
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let mut ids: Vec<&str> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["job_id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["report-1", "report-2"], "{out}");
    for r in v["rows"].as_array().unwrap() {
        assert_eq!(r["alternative"]["verdict"], "Deny");
        assert_eq!(r["alternative"]["state"], "DENIED");
        assert_eq!(r["actual"]["state"], "SUCCEEDED");
    }
    assert_eq!(v["totals"]["verdict"], 2);

    // 6. export: JSON Lines and an Avro container file, entry for entry. (Secrets in exports:
    // tests/secrets.rs submits one and scans both.)
    let (code, out, _) = c.cli(&["audit", "export"]);
    assert_eq!(code, 0);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len() as u64, {
        let (_, o, _) = c.cli(&["audit", "rebuild", "-o", "json"]);
        serde_json::from_str::<Value>(&o).unwrap()["entries"]
            .as_u64()
            .unwrap()
    });
    assert!(
        lines
            .iter()
            .any(|l| l["input"]["type"] == "JobRequest" && l["input"]["job_id"] == "ok-1")
    );
    let avro = c.dir.path().join("journal.avro");
    assert_eq!(
        c.cli(&[
            "audit",
            "export",
            "--format",
            "avro",
            "--out",
            &path_str(&avro)
        ])
        .0,
        0
    );
    let reader = apache_avro::Reader::new(std::fs::File::open(&avro).unwrap()).unwrap();
    assert_eq!(reader.count(), lines.len());
}
