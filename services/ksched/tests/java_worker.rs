//! The JVM worker (`examples/java-worker`), written from docs/workers.md and `schemas/`
//! alone with Kafka's Java client and Apache Avro, against `ksched run` on the real broker:
//! it runs a job, a retried job (attempt numbers), a fatal one, and drains on SIGTERM.
//! Built with Maven (`mvn -q -B package`), run on the machine's Java 17.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use ksched_core::records::JobRequest;
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};

/// The worker process, killed if the test fails before it stops.
struct Jvm(Child);

impl Drop for Jvm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn send(producer: &BaseProducer, topic: &str, id: &str, labels: &[(&str, &str)], payload: &str) {
    let job = JobRequest {
        job_id: id.to_owned(),
        topic: topic.to_owned(),
        tenant_id: "acme".into(),
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        payload: payload.as_bytes().to_vec(),
        submitted_at: 1,
        ..Default::default()
    };
    produce_job(producer, &job);
}

#[test]
fn the_java_worker_written_from_the_protocol_page_runs_retries_fails_and_drains() {
    let project = repo().join("examples/java-worker");
    let build = Command::new("mvn")
        .args(["-q", "-B", "-f"])
        .arg(project.join("pom.xml"))
        .args(["clean", "package"])
        .output()
        .expect("mvn runs (Debian: apt-get install -y maven)");
    assert!(
        build.status.success(),
        "mvn package:\n{}\n{}",
        String::from_utf8_lossy(&build.stdout),
        String::from_utf8_lossy(&build.stderr)
    );

    let rc = RunningScheduler::start("");
    let log = rc.dir.path().join("java-worker.log");
    let out = std::fs::File::create(&log).unwrap();
    let classpath = format!(
        "{}:{}/*",
        project.join("target/ksched-java-worker.jar").display(),
        project.join("target/lib").display()
    );
    let mut jvm = Jvm(Command::new("java")
        .args(["-cp", &classpath, "dev.ksched.worker.Worker"])
        .args(["--bootstrap", &rc.bootstrap, "--prefix", &rc.prefix])
        .args(["--pool", "default", "--worker-id", "java-1"])
        .arg("--schemas")
        .arg(repo().join("schemas"))
        .args(["--heartbeat-ms", "300"])
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .unwrap());
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until("the Java worker to own a dispatch partition", 60, || {
        assert!(
            jvm.0.try_wait().unwrap().is_none(),
            "the worker exited:\n{}",
            read_log()
        );
        let workers = json(&format!("{}/api/v1/workers", rc.api));
        workers["workers"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|w| {
                w["worker_id"] == "java-1"
                    && w["owned_partitions"]
                        .as_array()
                        .is_some_and(|p| !p.is_empty())
            })
    });

    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &rc.bootstrap)
        .create()
        .unwrap();
    send(&producer, &rc.job_topic, "java-ok", &[], "hello from rust");
    send(
        &producer,
        &rc.job_topic,
        "java-retry",
        &[("fail_attempts", "1")],
        "again",
    );
    send(
        &producer,
        &rc.job_topic,
        "java-fatal",
        &[("fatal", "true")],
        "",
    );
    // A sealed payload, and this worker has no keyring: it fails without running.
    send(
        &producer,
        &rc.job_topic,
        "java-sealed",
        &[],
        "kse1.k1.AAAA.BBBB",
    );
    producer.flush(Duration::from_secs(10)).unwrap();

    let job = |id: &str| json(&format!("{}/api/v1/jobs/{id}", rc.api));
    let settled = |id: &str, state: &str| {
        wait_until(&format!("{id} to be {state}"), 60, || {
            job(id)["state"] == state
        })
    };
    settled("java-ok", "SUCCEEDED");
    let ok = job("java-ok");
    assert_eq!(ok["result_ptr"], "inline:HELLO FROM RUST", "{ok}");
    assert_eq!(ok["worker_id"], "java-1", "{ok}");
    assert_eq!(ok["attempt"], 1, "{ok}");

    // Attempt 1 failed retryable; attempt 2, dispatched with its own number, succeeded.
    settled("java-retry", "SUCCEEDED");
    assert_eq!(job("java-retry")["attempt"], 2);

    settled("java-fatal", "FAILED");
    assert_eq!(job("java-fatal")["dlq_reason"], "asked_to_fail_fatal");
    settled("java-sealed", "FAILED");
    assert_eq!(job("java-sealed")["dlq_reason"], "secret_unavailable");

    // SIGTERM: the worker says it is draining, leaves its group and exits cleanly.
    let pid = jvm.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let started = Instant::now();
    let status = loop {
        if let Some(s) = jvm.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the worker did not stop:\n{}",
            read_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        status.success() || status.code() == Some(143),
        "{status}\n{}",
        read_log()
    );
    let started = Instant::now();
    loop {
        let workers = json(&format!("{}/api/v1/workers", rc.api));
        let draining = workers["workers"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|w| w["worker_id"] == "java-1" && w["draining"] == true);
        if draining {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the scheduler did not see the worker draining: {workers}\nthe worker:\n{}\nthe scheduler:\n{}",
            read_log(),
            tail(&rc.log(), 60)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Five attempts ran: java-ok, java-retry twice, java-fatal, java-sealed.
    assert!(
        read_log().contains("java-1: stopped after 5 jobs"),
        "{}",
        read_log()
    );
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
