//! What operators touch, against `ksched run` (child process) and the real broker: every CLI
//! subcommand (output checked, exit codes), every HTTP route (including 404 and bad input),
//! and /metrics.

mod common;

use std::time::Duration;

use common::*;
use ksched_worker::{Outcome, Worker};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

fn start_worker(
    c: &RunningScheduler,
    rt: &tokio::runtime::Runtime,
    keyring: &str,
) -> CancellationToken {
    let cfg = c
        .worker_config("op-worker")
        .with_keyring(std::path::Path::new(keyring))
        .unwrap();
    let token = CancellationToken::new();
    let t = token.clone();
    let _guard = rt.enter();
    let worker = Worker::new(cfg).unwrap();
    rt.spawn(async move {
        worker
            .run(
                |job| async move {
                    match job.dispatch.job.labels.get("mode").map(String::as_str) {
                        Some("fail") => Outcome::fatal("op_failure", "asked to fail"),
                        Some("block") => {
                            job.cancel.cancelled().await;
                            Outcome::Cancelled
                        }
                        // The secret reaches the handler opened.
                        _ if job.env().get("$TOKEN").is_some_and(|t| t != "s3cret") => {
                            Outcome::fatal("secret_not_opened", "$TOKEN did not open")
                        }
                        _ => Outcome::succeeded(),
                    }
                },
                t,
            )
            .await
    });
    token
}

#[test]
fn cli_http_api_and_metrics() {
    let c = RunningScheduler::start("");
    // The keyring producers seal secrets with and the worker opens them with.
    let keyring = path_str(&c.dir.path().join("keyring.json"));
    let keys = |args: &[&str]| {
        let out = std::process::Command::new(bin())
            .arg("keys")
            .args(["--keyring", &keyring])
            .args(args)
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let (code, out, err) = keys(&["rotate", "--tenant", "acme"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("active"), "{out}");
    let (code, out, _) = keys(&["list"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("acme"), "{out}");
    let (code, _, err) = keys(&["shred", "--tenant", "acme"]);
    assert_eq!(code, Some(2), "shredding asks for --yes: {err}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let worker = start_worker(&c, &rt, &keyring);
    wait_until("the worker to register", 60, || {
        json(&format!("{}/api/v1/workers", c.api))["workers"]
            .as_array()
            .is_some_and(|w| {
                w.iter().any(|w| {
                    w["alive"] == true && !w["owned_partitions"].as_array().unwrap().is_empty()
                })
            })
    });

    // submit: a secret needs a keyring to be sealed with; the CLI will not send it in clear.
    let (code, _, err) = c.cli(&[
        "submit",
        "--topic",
        &c.job_topic,
        "--tenant",
        "acme",
        "--env",
        "$TOKEN=s3cret",
    ]);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("$TOKEN") && err.contains("--keyring"), "{err}");

    // submit: prints the job id; flags and a JSON file both work.
    let (code, out, err) = c.cli(&[
        "submit",
        "--keyring",
        &keyring,
        "--topic",
        &c.job_topic,
        "--job-id",
        "ok-1",
        "--tenant",
        "acme",
        "--label",
        "team=x",
        "--env",
        "$TOKEN=s3cret",
        "--env",
        "MODE=fast",
        "--payload",
        "hi",
    ]);
    assert_eq!((code, out.trim()), (0, "ok-1"), "{err}");
    let file = c.dir.path().join("job.json");
    std::fs::write(
        &file,
        format!(r#"{{"job_id":"from-file","topic":"{}","tenant_id":"acme","labels":{{"mode":"fail"}},"payload":"x"}}"#, c.job_topic),
    )
    .unwrap();
    let (code, out, _) = c.cli(&["submit", "--file", &path_str(&file), "--output", "json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["job_id"], "from-file");
    assert_eq!(v["topic"], c.job_topic.as_str());
    let (code, _, err) = c.cli(&["submit", "--topic", &c.job_topic, "--label", "novalue"]);
    assert_eq!(code, 5, "bad input exit code");
    assert!(err.contains("KEY=VALUE"), "{err}");
    let (code, _, err) = c.cli(&["submit", "--topic", &c.job_topic, "--priority", "urgent"]);
    assert_eq!(code, 5);
    assert!(err.contains("critical, interactive or batch"), "{err}");

    wait_state(&c.api, "ok-1", "SUCCEEDED");
    wait_state(&c.api, "from-file", "FAILED");

    // jobs get: table and JSON; secrets hidden in both.
    let (code, out, _) = c.cli(&["jobs", "get", "ok-1"]);
    assert_eq!(code, 0);
    assert!(out.contains("SUCCEEDED"), "{out}");
    assert!(out.contains("*hidden*") && !out.contains("s3cret"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("worker_id") && l.contains("op-worker")),
        "{out}"
    );
    let (_, out, _) = c.cli(&["jobs", "get", "ok-1", "-o", "json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["env"]["$TOKEN"], "*hidden*");
    assert_eq!(v["env"]["MODE"], "fast");
    assert_eq!(v["payload_size"], 2);
    let (code, _, err) = c.cli(&["jobs", "get", "missing"]);
    assert_eq!(code, 3, "not found exit code");
    assert!(err.contains("no job missing"), "{err}");

    // jobs list with filters.
    let (_, out, _) = c.cli(&["jobs", "list", "--state", "SUCCEEDED"]);
    assert!(out.lines().next().unwrap().starts_with("JOB"), "{out}");
    assert!(out.contains("ok-1") && !out.contains("from-file"), "{out}");
    let (_, out, _) = c.cli(&["jobs", "list", "--tenant", "nobody", "-o", "json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["jobs"].as_array().unwrap().len(), 0);
    let (code, _, err) = c.cli(&["jobs", "list", "--state", "SLEEPING"]);
    assert_eq!(code, 5);
    assert!(err.contains("unknown state"), "{err}");

    // jobs history.
    let (_, out, _) = c.cli(&["jobs", "history", "ok-1"]);
    for e in [
        "JobAccepted",
        "JobScheduled",
        "JobDispatched",
        "JobRunning",
        "JobSucceeded",
    ] {
        assert!(out.contains(e), "{e} in {out}");
    }

    // workers list.
    let (_, out, _) = c.cli(&["workers", "list"]);
    assert!(
        out.contains("op-worker") && out.contains("default") && out.contains("true"),
        "{out}"
    );

    // dlq list / show.
    let (_, out, _) = c.cli(&["dlq", "list"]);
    assert!(
        out.contains("from-file") && out.contains("op_failure"),
        "{out}"
    );
    let (code, out, _) = c.cli(&["dlq", "show", "from-file"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("asked to fail") && out.contains("FAILED"),
        "{out}"
    );
    let (code, _, _) = c.cli(&["dlq", "show", "ok-1"]);
    assert_eq!(code, 3);

    // approve: fetches hash and snapshot itself.
    c.cli(&[
        "submit",
        "--topic",
        &c.job_topic,
        "--job-id",
        "needs-ok",
        "--label",
        "approval=required",
    ]);
    wait_state(&c.api, "needs-ok", "APPROVAL_REQUIRED");
    let (code, out, _) = c.cli(&["approve", "needs-ok", "--approver", "bob"]);
    assert_eq!((code, out.trim()), (0, "needs-ok: approval sent"));
    wait_state(&c.api, "needs-ok", "SUCCEEDED");
    let (code, _, err) = c.cli(&["approve", "needs-ok"]);
    assert_eq!(code, 4, "conflict exit code: {err}");
    assert!(err.contains("not awaiting approval"), "{err}");

    // reject.
    c.cli(&[
        "submit",
        "--topic",
        &c.job_topic,
        "--job-id",
        "no-way",
        "--label",
        "approval=required",
    ]);
    wait_state(&c.api, "no-way", "APPROVAL_REQUIRED");
    let (code, _, _) = c.cli(&["reject", "no-way", "--reason", "not today"]);
    assert_eq!(code, 0);
    wait_state(&c.api, "no-way", "DENIED");

    // cancel a running job; cancelling it again conflicts.
    c.cli(&[
        "submit",
        "--topic",
        &c.job_topic,
        "--job-id",
        "long",
        "--label",
        "mode=block",
        "--tenant",
        "acme",
    ]);
    wait_state(&c.api, "long", "RUNNING");
    let (code, _, _) = c.cli(&["cancel", "long", "--tenant", "acme", "--principal", "alice"]);
    assert_eq!(code, 0);
    wait_state(&c.api, "long", "CANCELLED");
    let (code, _, _) = c.cli(&["cancel", "long"]);
    assert_eq!(code, 4);

    // journal tail: decoded entries, secrets hidden, filter by job, JSON lines.
    let (code, out, _) = c.cli(&["journal", "tail", "--from-beginning", "--job", "ok-1"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("JobRequest(ok-1)") && out.contains("JobSucceeded(ok-1)"),
        "{out}"
    );
    let (_, out, _) = c.cli(&[
        "journal",
        "tail",
        "--from-beginning",
        "--job",
        "ok-1",
        "-o",
        "json",
    ]);
    assert!(out.contains("*hidden*") && !out.contains("s3cret"), "{out}");
    for line in out.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert!(v["offset"].as_i64().is_some());
    }
    let (_, out, _) = c.cli(&["journal", "tail", "-n", "3"]);
    assert!(out.lines().count() <= 3, "{out}");

    // An unreachable API says what to do.
    let out = std::process::Command::new(bin())
        .args(["jobs", "list", "--api", "http://127.0.0.1:9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is `ksched run` up?"));

    http_routes(&c);
    openapi_describes_the_routes(&c);
    metrics(&c);

    worker.cancel();
    rt.shutdown_timeout(Duration::from_secs(10));
    c.stop();
}

fn http_routes(c: &RunningScheduler) {
    let api = &c.api;
    assert_eq!(json(&format!("{api}/health/live"))["status"], "ok");
    let ready = json(&format!("{api}/health/ready"));
    assert_eq!(ready["ready"], true);
    assert_eq!(ready["kafka_reachable"], true);
    assert!(ready["journal_watermark"].as_i64().unwrap() >= 0);

    let v = json(&format!("{api}/api/v1/jobs?state=SUCCEEDED&limit=1"));
    assert_eq!(v["jobs"].as_array().unwrap().len(), 1);
    assert!(v["next_after"].is_string(), "{v}");
    let next = v["next_after"].as_str().unwrap();
    let page2 = json(&format!(
        "{api}/api/v1/jobs?state=SUCCEEDED&limit=10&after={next}"
    ));
    assert!(
        page2["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["job_id"].as_str().unwrap() > next)
    );
    let v = json(&format!("{api}/api/v1/jobs?state=RUNNING"));
    assert_eq!(v["jobs"].as_array().unwrap().len(), 0);
    assert_eq!(
        json(&format!("{api}/api/v1/jobs/ok-1"))["state"],
        "SUCCEEDED"
    );
    let h = json(&format!("{api}/api/v1/jobs/ok-1/history"));
    assert!(h["history"].as_array().unwrap().len() >= 5);
    assert!(
        !json(&format!("{api}/api/v1/workers"))["workers"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let dlq = json(&format!("{api}/api/v1/dlq?reason=op_failure"));
    assert_eq!(dlq["dead_letters"].as_array().unwrap().len(), 1);
    assert_eq!(dlq["counts_by_reason"]["op_failure"], 1);
    assert_eq!(dlq["counts_by_reason"]["approval_rejected"], 1);
    let tenants = json(&format!("{api}/api/v1/tenants"));
    assert!(tenants["tenants"].is_array());

    for (path, code) in [
        ("/api/v1/jobs/nope", 404),
        ("/api/v1/jobs/nope/history", 404),
        ("/api/v1/nothing", 404),
        ("/api/v1/jobs?limit=0", 400),
        ("/api/v1/jobs?limit=lots", 400),
        ("/api/v1/jobs?state=SLEEPING", 400),
        ("/api/v1/jobs?colour=red", 400),
        ("/api/v1/dlq?limit=-1", 400),
    ] {
        let (got, body) = http(&format!("{api}{path}"), "GET", None).unwrap();
        assert_eq!(got, code, "GET {path}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(v["error"].is_string(), "{path}: {body}");
    }
    for (path, body, code) in [
        ("/api/v1/jobs/nope/approve", r#"{"approver":"bob"}"#, 404),
        ("/api/v1/jobs/ok-1/approve", r#"{"approver":"bob"}"#, 409),
        ("/api/v1/jobs/ok-1/approve", r#"{"approver":""}"#, 400),
        (
            "/api/v1/jobs/ok-1/approve",
            r#"{"approver":"bob","extra":1}"#,
            400,
        ),
        ("/api/v1/jobs/ok-1/approve", "not json", 400),
        ("/api/v1/jobs/nope/reject", r#"{"approver":"bob"}"#, 404),
        ("/api/v1/jobs/ok-1/reject", r#"{"approver":"bob"}"#, 409),
        ("/api/v1/jobs/nope/cancel", r#"{"principal":"p"}"#, 404),
        ("/api/v1/jobs/ok-1/cancel", r#"{"principal":"p"}"#, 409),
        ("/api/v1/jobs/ok-1/cancel", r#"{}"#, 400),
    ] {
        let (got, resp) = http(&format!("{api}{path}"), "POST", Some(body)).unwrap();
        assert_eq!(got, code, "POST {path} {body}: {resp}");
    }
    // A successful POST is covered by the CLI above; one more straight through HTTP.
    c.cli(&[
        "submit",
        "--topic",
        &c.job_topic,
        "--job-id",
        "via-http",
        "--label",
        "approval=required",
    ]);
    wait_state(api, "via-http", "APPROVAL_REQUIRED");
    let (got, resp) = http(
        &format!("{api}/api/v1/jobs/via-http/approve"),
        "POST",
        Some(r#"{"approver":"http"}"#),
    )
    .unwrap();
    assert_eq!(got, 202, "{resp}");
    let v: Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(v["job_hash"].as_str().unwrap().len(), 64);
    wait_state(api, "via-http", "SUCCEEDED");
}

fn metrics(c: &RunningScheduler) {
    let (code, text) = http(&format!("{}/metrics", c.api), "GET", None).unwrap();
    assert_eq!(code, 200);
    let value = |series: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
    };
    assert!(value("ksched_jobs{state=\"SUCCEEDED\"}") >= 3.0);
    assert!(value("ksched_jobs{state=\"FAILED\"}") >= 1.0);
    assert_eq!(value("ksched_jobs{state=\"RUNNING\"}"), 0.0);
    assert!(value("ksched_dispatch_latency_seconds_count") >= 4.0);
    assert!(
        value("ksched_dispatch_latency_seconds_sum")
            < value("ksched_dispatch_latency_seconds_count") * 60.0
    );
    // A worker's own error code is free text: it is counted as worker_error, so no worker
    // can grow the metric's label set.
    assert_eq!(
        value("ksched_dead_letters_total{reason=\"worker_error\"}"),
        1.0
    );
    assert!(!text.contains("reason=\"op_failure\""));
    assert!(value("ksched_transaction_commit_seconds_count") >= 1.0);
    assert!(value("ksched_batch_size_count") >= 1.0);
    assert!(value("ksched_journal_entries_total") > 10.0);
    // What runs, and the process's own series, once each.
    let build = text
        .lines()
        .find(|l| l.starts_with("ksched_build_info{"))
        .unwrap_or_else(|| panic!("no ksched_build_info in:\n{text}"));
    assert!(
        build.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION")))
            && build.ends_with(" 1"),
        "{build}"
    );
    assert_eq!(text.matches("\nksched_build_info{").count(), 1);
    // Every fast Avro write of this (debug) run agreed with apache-avro's.
    assert_eq!(value("ksched_codec_fast_writer_off"), 0.0);
    assert!(value("process_resident_memory_bytes") > 1e6);
    assert!(value("process_open_fds") > 3.0);
    assert!(value("ksched_events_total{event=\"JobAccepted\"}") >= 6.0);
    assert_eq!(value("ksched_caught_up"), 1.0);
    assert!(value("ksched_journal_watermark") > 0.0);
    assert!(value("ksched_workers{alive=\"true\",pool=\"default\"}") >= 1.0);
    assert!(text.contains("ksched_queue_depth") || !text.contains("ksched_queue_depth{"));
    assert!(text.contains("# TYPE ksched_rocksdb_size_bytes gauge"));
    // Consumer lag comes from librdkafka statistics every 5 s.
    wait_until("consumer lag statistics", 30, || {
        let (_, t) = http(&format!("{}/metrics", c.api), "GET", None).unwrap();
        t.lines()
            .any(|l| l.starts_with(&format!("ksched_consumer_lag{{topic=\"{}\"}}", c.job_topic)))
    });
}

/// docs/openapi.yaml and the server agree: every documented GET answers with a documented
/// status, and every route the server has is documented.
fn openapi_describes_the_routes(c: &RunningScheduler) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.yaml");
    let doc: Value = serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    let mut documented = Vec::new();
    for (route, ops) in paths {
        for (method, op) in ops.as_object().unwrap() {
            documented.push(format!("{} {route}", method.to_uppercase()));
            let codes: Vec<u16> = op["responses"]
                .as_object()
                .unwrap()
                .keys()
                .map(|k| k.parse().unwrap())
                .collect();
            if method == "get" {
                let url = format!("{}{}", c.api, route.replace("{id}", "ok-1"));
                let (got, body) = http(&url, "GET", None).unwrap();
                assert!(
                    codes.contains(&got),
                    "GET {route} answered {got}, documented {codes:?}: {body}"
                );
            }
        }
    }
    let served = [
        "GET /health/live",
        "GET /health/ready",
        "GET /metrics",
        "GET /api/v1/jobs",
        "GET /api/v1/jobs/{id}",
        "GET /api/v1/jobs/{id}/history",
        "POST /api/v1/jobs/{id}/approve",
        "POST /api/v1/jobs/{id}/reject",
        "POST /api/v1/jobs/{id}/cancel",
        "POST /api/v1/jobs/{id}/redrive",
        "POST /api/v1/jobs/{id}/reschedule",
        "GET /api/v1/schedules",
        "POST /api/v1/schedules",
        "GET /api/v1/schedules/{tenant}/{id}",
        "PUT /api/v1/schedules/{tenant}/{id}",
        "DELETE /api/v1/schedules/{tenant}/{id}",
        "POST /api/v1/schedules/{tenant}/{id}/{action}",
        "GET /api/v1/batches",
        "GET /api/v1/batches/{tenant}/{id}",
        "POST /api/v1/batches/{tenant}/{id}/cancel",
        "GET /api/v1/workers",
        "GET /api/v1/dlq",
        "GET /api/v1/tenants",
        "POST /api/v1/admin/checkpoint",
    ];
    for r in served {
        assert!(
            documented.iter().any(|d| d == r),
            "{r} is not in docs/openapi.yaml"
        );
    }
    assert_eq!(documented.len(), served.len(), "documented: {documented:?}");
}
