//! A worker in another language, built only from schemas/: examples/python-worker
//! (confluent-kafka + fastavro) runs beside the scheduler against the real broker. Its
//! heartbeats and results must decode in Rust, and Rust's dispatches must decode in Python:
//! the schemas are the contract.

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use ksched_core::events::JobState;
use support::*;

fn python() -> String {
    if let Ok(p) = std::env::var("KSCHED_PYTHON") {
        return p;
    }
    let venv = PathBuf::from(std::env::var("HOME").unwrap_or_default())
        .join(".cache/ksched/venv/bin/python");
    if venv.exists() {
        return venv.display().to_string();
    }
    "python3".into()
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_worker_runs_jobs_from_the_schemas_alone() {
    let s = Scheduler::start(vec![]).await;
    let py = python();
    let check = Command::new(&py)
        .args(["-c", "import confluent_kafka, fastavro, cryptography"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {py}: {e}"));
    assert!(
        check.status.success(),
        "{py} lacks confluent-kafka, fastavro or cryptography ({}); `bash scripts/setup.sh` installs them",
        String::from_utf8_lossy(&check.stderr)
    );
    let worker_dir = repo().join("examples/python-worker");
    // Secrets and payloads sealed in Rust must open in Python: the format is a contract too.
    let keys_dir = tempfile::tempdir().unwrap();
    let keyring_path = keys_dir.path().join("keyring.json");
    let mut keyring = ksched_secrets::Keyring::new();
    keyring.rotate("acme").unwrap();
    keyring.save(&keyring_path).unwrap();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(&py)
        .arg(worker_dir.join("worker.py"))
        .args([
            "--bootstrap",
            &s.bootstrap,
            "--prefix",
            &s.prefix,
            "--pool",
            "default",
        ])
        .args([
            "--worker-id",
            "py-1",
            "--max-jobs",
            "4",
            "--heartbeat-interval",
            "0.3",
        ])
        .arg("--schemas")
        .arg(repo().join("schemas"))
        .arg("--keyring")
        .arg(&keyring_path)
        .stdout(Stdio::from(log.reopen().unwrap()))
        .stderr(Stdio::from(log.reopen().unwrap()))
        .spawn()
        .unwrap();
    let output = || std::fs::read_to_string(log.path()).unwrap_or_default();

    // Its heartbeat decoded in Rust: the worker is known with its partitions and labels.
    wait_for(
        "the python worker's heartbeat",
        Duration::from_secs(60),
        || {
            s.store
                .workers()
                .unwrap()
                .iter()
                .any(|(id, w)| id == "py-1" && !w.heartbeat.owned_partitions.is_empty())
        },
    )
    .await;
    let (_, w) = s
        .store
        .workers()
        .unwrap()
        .into_iter()
        .find(|(id, _)| id == "py-1")
        .unwrap();
    assert_eq!(w.heartbeat.labels["lang"], "python");
    assert_eq!(w.heartbeat.capabilities, ["python"]);

    for (id, payload) in [("py-a", "hello"), ("py-b", "from rust"), ("py-c", "ksched")] {
        let mut r = request(&s, id);
        r.payload = payload.as_bytes().to_vec();
        r.env.insert("$SECRET".into(), "x".into());
        // py-c's payload is sealed as well: only the worker reads it.
        keyring.seal_request(&mut r, id == "py-c").unwrap();
        s.submit(&r);
    }
    // Sealed with a key this worker was never given: it fails without running.
    let mut stranger = ksched_secrets::Keyring::new();
    stranger.rotate("acme").unwrap();
    let mut r = request(&s, "py-d");
    r.env.insert("$SECRET".into(), "x".into());
    stranger.seal_request(&mut r, false).unwrap();
    s.submit(&r);
    let job = s
        .wait_job("py-d", "FAILED", |j| j.state == JobState::Failed)
        .await;
    assert_eq!(
        job.dlq_reason.as_deref(),
        Some("secret_unavailable"),
        "{}",
        output()
    );
    for (id, out) in [("py-a", "HELLO"), ("py-b", "FROM RUST"), ("py-c", "KSCHED")] {
        let job = s
            .wait_job(id, "SUCCEEDED", |j| j.state == JobState::Succeeded)
            .await;
        assert_eq!(job.worker_id.as_deref(), Some("py-1"), "{}", output());
        assert_eq!(
            job.result_ptr.as_deref(),
            Some(format!("inline:{out}").as_str())
        );
        let meta = job.result_meta.unwrap();
        assert_eq!(meta.labels["worker_lang"], "python");
        assert_eq!(meta.labels["secrets_opened"], "1");
        assert_eq!(meta.size_bytes, Some(out.len() as i64));
        assert_eq!(job.attempt, 1);
    }
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "python worker: {status:?}\n{}", output());
    assert!(output().contains("stopped after 4 jobs"), "{}", output());
    // Its last heartbeat says it is draining.
    wait_for("the draining heartbeat", Duration::from_secs(30), || {
        s.store
            .workers()
            .unwrap()
            .iter()
            .any(|(id, w)| id == "py-1" && w.heartbeat.draining)
    })
    .await;
}
