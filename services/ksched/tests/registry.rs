//! ksched with a real Schema Registry (Apicurio, `deploy/registry.sh start`; its
//! Confluent-compatible URL in `KSCHED_SCHEMA_REGISTRY_URL`) and the way Kafka users produce
//! and consume: confluent-kafka's AvroSerializer and AvroDeserializer
//! (`tests/registry_client.py`), against the real broker.

mod common;

use std::io::Read as _;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use ksched_worker::{Outcome, Worker};
use tokio_util::sync::CancellationToken;

fn registry_url() -> String {
    std::env::var("KSCHED_SCHEMA_REGISTRY_URL").unwrap_or_else(|_| {
        panic!(
            "KSCHED_SCHEMA_REGISTRY_URL is not set: start the registry with `deploy/registry.sh start` \
             (scripts/test.sh does) and export the URL it prints"
        )
    })
}

/// Runs the Python client; its stdout, after asserting it succeeded.
fn client(args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/registry_client.py");
    // Output to files, not pipes: a consumer prints the whole journal.
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = Command::new(python())
        .arg(script)
        .args(args)
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    // A hung registry call must fail the test, not stall it.
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    assert!(
        status.is_some_and(|s| s.success()),
        "registry_client.py {args:?} ({status:?}, None = killed after 90 s): {stdout}\n{}",
        std::fs::read_to_string(&err_path).unwrap_or_default()
    );
    stdout
}

fn sdk_worker(rc: &RunningScheduler, url: &str) -> (tokio::runtime::Runtime, CancellationToken) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let token = CancellationToken::new();
    let mut cfg = rc.worker_config("sr-worker");
    cfg.schema_registry_url = Some(url.to_owned());
    let _guard = rt.enter();
    let worker = Worker::new(cfg).unwrap();
    let t = token.clone();
    rt.spawn(async move { worker.run(|_job| async { Outcome::succeeded() }, t).await });
    (rt, token)
}

#[test]
fn jobs_from_the_confluent_serializer_run_and_standard_deserializers_read_what_ksched_writes() {
    let url = registry_url();
    let rc = RunningScheduler::start(&format!(
        "schema_registry:\n  url: {url}\n  output_format: confluent\n"
    ));
    let (_rt, token) = sdk_worker(&rc, &url);

    // A producer that takes the schema ksched registered under the topic's subject.
    let id1 = client(&["produce", &rc.bootstrap, &url, &rc.job_topic, "sr-1"]);
    wait_state(&rc.api, "sr-1", "SUCCEEDED");
    // A newer producer schema (an added optional field), registered by the serializer,
    // accepted without a ksched release.
    let id2 = client(&[
        "produce",
        &rc.bootstrap,
        &url,
        &rc.job_topic,
        "sr-2",
        "--newer",
    ]);
    assert_ne!(id1.trim(), id2.trim(), "the newer schema has its own id");
    wait_state(&rc.api, "sr-2", "SUCCEEDED");
    let job = json(&format!("{}/api/v1/jobs/sr-2", rc.api));
    assert_eq!(job["labels"]["origin"], "python-avro-serializer", "{job}");

    // What ksched wrote, read with AvroDeserializer: the dispatch topic (a union of Dispatch
    // and CancelDispatch under its subject) and the journal.
    let dispatch = format!("{}dispatch.default", rc.prefix);
    let journal = format!("{}journal", rc.prefix);
    let (b, u) = (rc.bootstrap.clone(), url.clone());
    let journal_reader = std::thread::spawn(move || client(&["consume", &b, &u, &journal, "12"]));
    let dispatched = client(&["consume", &rc.bootstrap, &url, &dispatch, "12"]);
    let journaled = journal_reader.join().unwrap();
    for id in ["sr-1", "sr-2"] {
        assert!(
            dispatched.contains(&format!("\"job_id\": \"{id}\"")),
            "{id} in the dispatch topic:\n{dispatched}"
        );
        assert!(
            journaled.contains(&format!("\"job_id\": \"{id}\"")),
            "{id} in the journal"
        );
    }
    assert!(journaled.lines().count() >= 8, "{journaled}");

    // The audit tools read a journal in the Confluent wire format (ids looked up where
    // ksched registered them; `cli` passes the scheduler's settings file).
    let (code, out, err) = rc.cli(&["audit", "verify", "-o", "json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["divergences"].as_array().unwrap().len(), 0, "{out}");
    token.cancel();
}

/// A TCP forwarder to the registry that can be cut, connections and all.
struct Forwarder {
    port: u16,
    down: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
}

impl Forwarder {
    fn to(target: &str) -> Forwarder {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let down = Arc::new(AtomicBool::new(false));
        let streams: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (d, s, target) = (down.clone(), streams.clone(), target.to_owned());
        std::thread::spawn(move || {
            while !d.load(Ordering::SeqCst) {
                let Ok((inbound, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                inbound.set_nonblocking(false).unwrap();
                let Ok(outbound) = TcpStream::connect(&target) else {
                    continue;
                };
                let mut all = s.lock().unwrap();
                all.push(inbound.try_clone().unwrap());
                all.push(outbound.try_clone().unwrap());
                for (mut from, mut to) in [
                    (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                    (outbound, inbound),
                ] {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 || std::io::Write::write_all(&mut to, &buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Forwarder {
            port,
            down,
            streams,
        }
    }

    /// Stops accepting and closes every connection.
    fn cut(&self) {
        self.down.store(true, Ordering::SeqCst);
        for s in self.streams.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

#[test]
fn ids_seen_still_decode_with_the_registry_gone_and_a_registry_down_at_start_is_a_clear_error() {
    let url = registry_url();
    let authority = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let path = url
        .trim_start_matches("http://")
        .trim_start_matches(&authority);
    let forwarder = Forwarder::to(&authority);
    let via = format!("http://127.0.0.1:{}{path}", forwarder.port);
    let mut rc = RunningScheduler::start(&format!(
        "schema_registry:\n  url: {via}\n  output_format: confluent\n  timeout_ms: 2000\n"
    ));
    let (_rt, token) = sdk_worker(&rc, &url);
    client(&["produce", &rc.bootstrap, &url, &rc.job_topic, "seen-1"]);
    wait_state(&rc.api, "seen-1", "SUCCEEDED");

    // The registry is gone for ksched (producers still reach it).
    forwarder.cut();
    client(&["produce", &rc.bootstrap, &url, &rc.job_topic, "seen-2"]);
    wait_state(&rc.api, "seen-2", "SUCCEEDED");
    // A schema id ksched has not seen cannot be looked up: dead-lettered, the scheduler
    // goes on.
    client(&[
        "produce",
        &rc.bootstrap,
        &url,
        &rc.job_topic,
        "unseen-3",
        "--newer",
    ]);
    client(&["produce", &rc.bootstrap, &url, &rc.job_topic, "seen-4"]);
    wait_state(&rc.api, "seen-4", "SUCCEEDED");
    let dlq = format!("{}dlq", rc.prefix);
    let dead = client(&["consume", &rc.bootstrap, &url, &dlq, "8"]);
    assert!(
        dead.contains("\"reason_code\": \"schema_unavailable\""),
        "the DLQ, read with AvroDeserializer:\n{dead}"
    );
    assert_eq!(dead.lines().count(), 1, "{dead}");
    token.cancel();

    // Started again with the registry unreachable: a clear error, at once.
    rc.kill();
    let started = Instant::now();
    let out = Command::new(bin())
        .args(["run", "--config"])
        .arg(&rc.config)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("schema_registry") && text.contains("cannot be reached"),
        "{text}"
    );
    assert!(started.elapsed() < Duration::from_secs(60), "{text}");
}

/// CI's schema check by a second implementation: every released schema in
/// `schemas/history/` registered with the registry, and the current schema of its type
/// checked BACKWARD (the current reader reads what each older writer wrote) by the
/// registry's compatibility API, version by version. (The codec's own check of the same
/// rule is `services/codec/tests/history.rs`.)
#[test]
fn the_registry_finds_every_current_schema_backward_compatible_with_every_released_one() {
    use ksched_codec::schema_registry::SchemaRegistryClient;
    let url = registry_url();
    let client = SchemaRegistryClient::new(&url, Duration::from_secs(10), None);
    let tag = ksched_testkit::unique("compat");
    let history = repo().join("schemas/history");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&history)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "avsc"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    let subject = |name: &str| format!("{tag}-{name}");
    for f in &files {
        let short = f
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .split('.')
            .next()
            .unwrap();
        let s = subject(&format!("io.ksched.{short}"));
        // Released versions are registered as they are, whatever their order.
        client.set_compatibility(&s, "NONE").unwrap();
        client
            .register(&s, &std::fs::read_to_string(f).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        client.set_compatibility(&s, "BACKWARD").unwrap();
    }
    let current = ksched_codec::current_self_contained().unwrap();
    let mut checked = 0;
    for (name, json) in &current {
        let s = subject(name);
        let versions = client.versions(&s).unwrap_or_default();
        for v in versions {
            let reasons = client.compatible(&s, &v.to_string(), json).unwrap();
            assert!(
                reasons.is_empty(),
                "the current {name} cannot read version {v} of it: {reasons:?}"
            );
            checked += 1;
        }
    }
    assert!(
        checked >= files.len(),
        "{checked} checks for {} files",
        files.len()
    );
    // And the check can fail: a reader that needs a field old writers lack.
    let mut breaking: serde_json::Value =
        serde_json::from_str(&current["io.ksched.JobRequest"]).unwrap();
    breaking["fields"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "required_later", "type": "string"}));
    let reasons = client
        .compatible(
            &subject("io.ksched.JobRequest"),
            "latest",
            &breaking.to_string(),
        )
        .unwrap();
    assert!(
        !reasons.is_empty(),
        "a field without a default is not BACKWARD compatible"
    );
}
