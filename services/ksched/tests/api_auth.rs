//! The HTTP API with API tokens (`http.tokens_file`, docs/security.md), against `ksched run`
//! and the real broker: no token or an unknown one is 401; roles and tenants bound what each
//! caller sees and does; an approver cannot approve their own job; the principal journaled is
//! the caller's, whatever the body says; only JSON bodies and allowed Hosts are answered.

mod common;

use std::process::Command;

use common::*;
use ksched_core::hash::sha256_hex;
use ksched_worker::{Outcome, Worker};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const ALICE: &str = "alice-0123456789abcdef0123456789";
const BOB: &str = "bob-0123456789abcdef0123456789ab";
const CAROL: &str = "carol-0123456789abcdef0123456789";
const DAVE: &str = "dave-0123456789abcdef0123456789a";

fn call(url: &str, method: &str, token: Option<&str>, body: Option<&str>) -> (u16, Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("Authorization", a)])
        .unwrap_or_default();
    let (code, text) = http_with(url, method, &headers, body).unwrap();
    (
        code,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[test]
fn callers_are_authenticated_held_to_their_roles_and_tenants_and_cannot_approve_their_own_jobs() {
    let tokens_dir = tempfile::tempdir().unwrap();
    let tokens = tokens_dir.path().join("tokens.yaml");
    std::fs::write(
        &tokens,
        format!(
            "tokens:\n\
             \x20 - principal: alice\n    token_sha256: {}\n    roles: [approver]\n\
             \x20 - principal: bob\n    token_sha256: {}\n    roles: [approver]\n\
             \x20 - principal: carol\n    token_sha256: {}\n    roles: [viewer]\n    tenants: [acme]\n\
             \x20 - principal: dave\n    token_sha256: {}\n    roles: [operator]\n    tenants: [acme]\n",
            sha256_hex(ALICE.as_bytes()),
            sha256_hex(BOB.as_bytes()),
            sha256_hex(CAROL.as_bytes()),
            sha256_hex(DAVE.as_bytes()),
        ),
    )
    .unwrap();
    let c = RunningScheduler::start(&format!("  tokens_file: {}\n", tokens.display()));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stop = CancellationToken::new();
    {
        let _guard = rt.enter();
        let worker = Worker::new(c.worker_config("auth-worker")).unwrap();
        let t = stop.clone();
        rt.spawn(async move { worker.run(|_| async { Outcome::succeeded() }, t).await });
    }
    let api = c.api.clone();

    // Health and metrics need no token; the API does.
    assert_eq!(
        http(&format!("{api}/health/live"), "GET", None).unwrap().0,
        200
    );
    assert_eq!(http(&format!("{api}/metrics"), "GET", None).unwrap().0, 200);
    let (code, body) = call(&format!("{api}/api/v1/jobs"), "GET", None, None);
    assert_eq!(code, 401, "{body}");
    assert!(body["error"].as_str().unwrap().contains("API token"));
    let (code, _) = call(
        &format!("{api}/api/v1/jobs"),
        "GET",
        Some("not-a-token-0123456789abcdef0000"),
        None,
    );
    assert_eq!(code, 401);

    // The CLI sends its token; without one it says what is missing (exit 6).
    let (code, _, err) = c.cli(&["jobs", "list"]);
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("--token"), "{err}");

    // alice submits a job that needs approval; one of globex too.
    for (id, tenant, extra) in [
        (
            "needs-approval",
            "acme",
            vec!["--label", "approval=required"],
        ),
        ("globex-1", "globex", vec!["--label", "approval=required"]),
    ] {
        let mut args = vec![
            "submit",
            "--topic",
            &c.job_topic,
            "--job-id",
            id,
            "--tenant",
            tenant,
            "--principal",
            "alice",
        ];
        args.extend(extra);
        let (code, _, err) = c.cli(&args);
        assert_eq!(code, 0, "{err}");
    }
    let state = |id: &str| {
        call(&format!("{api}/api/v1/jobs/{id}"), "GET", Some(BOB), None).1["state"]
            .as_str()
            .map(str::to_owned)
    };
    wait_until("both jobs to await approval", 60, || {
        state("needs-approval").as_deref() == Some("APPROVAL_REQUIRED")
            && state("globex-1").as_deref() == Some("APPROVAL_REQUIRED")
    });
    let (code, _, err) = c.cli(&["jobs", "get", "needs-approval", "--token", BOB]);
    assert_eq!(code, 0, "{err}");

    // alice may not approve her own job (four eyes); carol may not approve at all.
    let approve = format!("{api}/api/v1/jobs/needs-approval/approve");
    let (code, body) = call(&approve, "POST", Some(ALICE), Some("{}"));
    assert_eq!(code, 403, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("four eyes"),
        "{body}"
    );
    let (code, body) = call(&approve, "POST", Some(CAROL), Some("{}"));
    assert_eq!(code, 403, "{body}");

    // A text/plain body, as any web page may send cross-origin, is refused; so is a Host the
    // API does not answer (DNS rebinding).
    let auth = format!("Bearer {BOB}");
    let (code, _) = http_with(
        &approve,
        "POST",
        &[("Authorization", &auth), ("Content-Type", "text/plain")],
        Some(r#"{"approver":"mallory"}"#),
    )
    .unwrap();
    assert_eq!(code, 415);
    let (code, _) = http_with(
        &format!("{api}/api/v1/jobs"),
        "GET",
        &[("Authorization", &auth), ("Host", "evil.example:8080")],
        None,
    )
    .unwrap();
    assert_eq!(code, 400);

    // bob approves; the approver named in the body is ignored: bob is journaled.
    let (code, body) = call(
        &approve,
        "POST",
        Some(BOB),
        Some(r#"{"approver":"mallory"}"#),
    );
    assert_eq!(code, 202, "{body}");
    assert_eq!(body["approver"], "bob");
    wait_until("the approved job to succeed", 60, || {
        state("needs-approval").as_deref() == Some("SUCCEEDED")
    });
    let (_, tail, err) = c.cli(&["journal", "tail", "--job", "needs-approval", "-o", "json"]);
    let approved: Vec<&str> = tail.lines().filter(|l| l.contains("JobApproved")).collect();
    assert_eq!(approved.len(), 1, "{tail}{err}");
    assert!(
        approved[0].contains("\"bob\"") && !approved[0].contains("mallory"),
        "{}",
        approved[0]
    );

    // carol sees acme's jobs only; another tenant's job does not exist for her.
    let (code, body) = call(&format!("{api}/api/v1/jobs"), "GET", Some(CAROL), None);
    assert_eq!(code, 200);
    let ids: Vec<&str> = body["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job_id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"needs-approval") && !ids.contains(&"globex-1"),
        "{ids:?}"
    );
    let (code, _) = call(
        &format!("{api}/api/v1/jobs/globex-1"),
        "GET",
        Some(CAROL),
        None,
    );
    assert_eq!(code, 404);
    let (code, body) = call(&format!("{api}/api/v1/dlq"), "GET", Some(CAROL), None);
    assert_eq!(code, 200);
    assert!(body["counts_by_reason"].is_null(), "{body}");

    // dave (operator of acme) cannot cancel globex's job; no approver can checkpoint.
    let (code, _) = call(
        &format!("{api}/api/v1/jobs/globex-1/cancel"),
        "POST",
        Some(DAVE),
        Some(r#"{"principal":"root"}"#),
    );
    assert_eq!(code, 404);
    let (code, _) = call(
        &format!("{api}/api/v1/admin/checkpoint"),
        "POST",
        Some(BOB),
        Some("{}"),
    );
    assert_eq!(code, 403);
    // bob, an approver of every tenant, rejects globex's job.
    let (code, body) = call(
        &format!("{api}/api/v1/jobs/globex-1/reject"),
        "POST",
        Some(BOB),
        Some(r#"{"reason":"not now"}"#),
    );
    assert_eq!(code, 202, "{body}");
    wait_until("the rejected job to be denied", 60, || {
        state("globex-1").as_deref() == Some("DENIED")
    });

    stop.cancel();
    c.stop();
}

#[test]
fn the_api_does_not_listen_beyond_loopback_without_authentication() {
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/ksched.yaml");
    let out = Command::new(bin())
        .args(["run", "--config"])
        .arg(&config)
        .args(["--http-listen", "0.0.0.0:8089", "--print-config"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no authentication") && err.contains("tokens_file"),
        "{err}"
    );
}
