//! `ksched dev` for a bounded time: the embedded in-memory Kafka, the scheduler, the demo
//! workers and the demo jobs, which reach their expected terminal states (the approval one
//! after an approval through the HTTP API).

mod common;

use std::process::{Command, Stdio};

use common::*;

#[test]
fn ksched_dev_runs_the_demo_to_its_expected_outcomes() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let out_path = dir.path().join("dev.out");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut child = Command::new(bin())
        .args([
            "dev",
            "--duration",
            "90",
            "--http-listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(dir.path().join("data"))
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .unwrap();
    let output = || std::fs::read_to_string(&out_path).unwrap_or_default();

    wait_until("the demo approval request", 60, || {
        job_state(&api, "demo-deploy-prod").as_deref() == Some("APPROVAL_REQUIRED")
    });
    // The console the banner names shows it, with its approval button.
    assert!(
        output().contains(&format!("CONSOLE {api}/ui")),
        "{}",
        output()
    );
    let (code, page) = http(&format!("{api}/ui/jobs/demo-deploy-prod"), "GET", None).unwrap();
    assert_eq!(code, 200, "{page}");
    assert!(
        page.contains("<span class=\"state APPROVAL_REQUIRED\">")
            && page.contains("/ui/jobs/demo-deploy-prod/approve"),
        "{page}"
    );
    let (code, body) = http(
        &format!("{api}/api/v1/jobs/demo-deploy-prod/approve"),
        "POST",
        Some(r#"{"approver":"test"}"#),
    )
    .unwrap();
    assert_eq!(code, 202, "{body}");

    for (job, state) in [
        ("demo-hello-1", "SUCCEEDED"),
        ("demo-hello-2", "SUCCEEDED"),
        ("demo-hello-3", "SUCCEEDED"),
        ("demo-render-1", "SUCCEEDED"),
        ("demo-flaky-1", "SUCCEEDED"),
        ("demo-deploy-prod", "SUCCEEDED"),
        ("demo-wipe-prod", "DENIED"),
        ("demo-broken-1", "FAILED"),
        // Dependencies: after two successes, after two ends, and one a failure ends.
        ("demo-after-two", "SUCCEEDED"),
        ("demo-cleanup", "SUCCEEDED"),
        ("demo-doomed", "FAILED"),
        // A batch of five, one failing, and its callback.
        ("demo-batch-4", "SUCCEEDED"),
        ("demo-batch-5", "FAILED"),
        ("demo-batch-report", "SUCCEEDED"),
        // Sealed by `ksched dev` with its keyring, opened by the demo worker.
        ("demo-secret-1", "SUCCEEDED"),
        // Submitted with a time 30 s ahead.
        ("demo-later-1", "SUCCEEDED"),
    ] {
        wait_until(&format!("{job} to be {state}"), 60, || {
            job_state(&api, job).as_deref() == Some(state)
        });
    }
    let flaky = json(&format!("{api}/api/v1/jobs/demo-flaky-1"));
    assert_eq!(flaky["attempt"], 2, "retried once");
    let render = json(&format!("{api}/api/v1/jobs/demo-render-1"));
    assert_eq!(render["pool"], "gpu");
    let dlq = json(&format!("{api}/api/v1/dlq"));
    let codes: Vec<&str> = dlq["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["reason_code"].as_str().unwrap())
        .collect();
    assert!(
        codes.contains(&"safety_denied") && codes.contains(&"demo_input_invalid"),
        "{codes:?}"
    );
    let report = json(&format!("{api}/api/v1/jobs/demo-batch-report"));
    assert_eq!(report["batch_outcome"]["succeeded"], 4, "{report}");
    assert_eq!(report["batch_outcome"]["failed"], 1, "{report}");
    let batch = json(&format!("{api}/api/v1/batches/demo/demo-batch"));
    assert_eq!(batch["state"], "COMPLETE", "{batch}");
    let later = json(&format!("{api}/api/v1/jobs/demo-later-1"));
    assert!(
        later["released_at"].as_i64() >= later["not_before"].as_i64(),
        "{later}"
    );
    // The demo schedule fires at once, then every 10 s.
    wait_until("the demo schedule's first run", 30, || {
        let (code, body) = http(
            &format!("{api}/api/v1/schedules/demo/every-10s"),
            "GET",
            None,
        )
        .unwrap();
        code == 200
            && serde_json::from_str::<serde_json::Value>(&body)
                .is_ok_and(|v| v["submitted"].as_u64() >= Some(1))
    });
    // The console's schedules page lists it, with its buttons.
    let (code, page) = http(&format!("{api}/ui/schedules"), "GET", None).unwrap();
    assert_eq!(code, 200, "{page}");
    assert!(
        page.contains("demo:every-10s")
            && page.contains("/ui/schedules/demo/every-10s/pause")
            && page.contains("SUBMITTED"),
        "{page}"
    );
    wait_until("a trickle job", 30, || {
        job_state(&api, "demo-batch-1").is_some()
    });

    Command::new("kill")
        .arg("-INT")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    let text = output();
    assert!(status.success(), "{status:?}\n{text}");
    assert!(text.contains("EMBEDDED IN-MEMORY KAFKA"), "{text}");
    assert!(
        text.contains("demo-flaky-1") && text.contains("retry in"),
        "{text}"
    );
    assert!(text.contains("APPROVAL REQUIRED"), "{text}");
    assert!(
        text.contains("ksched jobs list"),
        "tells how to inspect: {text}"
    );
}
