//! ksched on a secured Kafka (docs/security.md): a node with TLS, SASL/SCRAM-SHA-512 and
//! ACLs, started by `deploy/kafka.sh start --secure` on its own port; each role with its own
//! user and exactly the ACLs `deploy/ksched-acls.py` grants. The whole path runs on it
//! (submit -> `ksched run` -> the SDK worker and the Python worker -> results -> `ksched
//! audit verify`), and what must be refused is: a wrong password, a CA the client does not
//! trust, a worker writing to the control topic, a job producer reading the journal. Two
//! shards, so that each shard's input group is held to its ACLs too.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use ksched_testkit::{TEST_POLICY, unique};
use ksched_worker::{Outcome, Worker, WorkerConfig};
use tokio_util::sync::CancellationToken;

/// The secure node: its bootstrap address and each user's client properties file. Stopped
/// when dropped if this test started it.
struct Secure {
    bootstrap: String,
    users: BTreeMap<String, PathBuf>,
    ca: PathBuf,
    port: String,
    started_here: bool,
}

fn kafka_sh(port: &str, cmd: &str) -> (bool, String) {
    let out = Command::new(repo().join("deploy/kafka.sh"))
        .args(cmd.split(' '))
        .env("KSCHED_KAFKA_PORT", port)
        .env_remove("KSCHED_KAFKA_BROKERS")
        .env_remove("KSCHED_KAFKA_PROXY_PORT")
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

impl Drop for Secure {
    fn drop(&mut self) {
        if self.started_here {
            let _ = kafka_sh(&self.port, "stop");
        }
    }
}

impl Secure {
    fn start() -> Secure {
        let port = std::env::var("KSCHED_SECURE_KAFKA_PORT").unwrap_or_else(|_| "29300".into());
        let running = kafka_sh(&port, "status").0;
        let (ok, text) = kafka_sh(&port, "start --secure");
        assert!(ok, "deploy/kafka.sh start --secure: {text}");
        let mut s = Secure {
            bootstrap: String::new(),
            users: BTreeMap::new(),
            ca: PathBuf::new(),
            port: port.clone(),
            started_here: !running,
        };
        let (ok, text) = kafka_sh(&port, "credentials");
        assert!(ok, "{text}");
        for line in text.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            match parts.as_slice() {
                ["bootstrap", b] => s.bootstrap = (*b).to_owned(),
                ["ca", p] => s.ca = PathBuf::from(p),
                ["user", name, p] => {
                    s.users.insert((*name).to_owned(), PathBuf::from(p));
                }
                _ => {}
            }
        }
        assert!(!s.bootstrap.is_empty() && s.users.contains_key("ksched"));
        s
    }

    fn user(&self, name: &str) -> &Path {
        &self.users[name]
    }

    fn properties(&self, name: &str) -> Vec<(String, String)> {
        ksched_core::properties::parse_properties(
            &std::fs::read_to_string(self.user(name)).unwrap(),
        )
        .unwrap()
    }
}

/// A child process killed when the test ends, even by a failed assertion.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_whole_path_runs_on_tls_sasl_and_acls_and_each_role_is_held_to_its_acls() {
    let secure = Secure::start();
    let prefix = format!("{}.", unique("sec"));
    let group = format!("{prefix}processor");
    let job_topic = format!("jobs.acme.{}", unique("t"));
    let py = python();

    // Each role gets exactly its ACLs.
    let grant = Command::new(&py)
        .arg(repo().join("deploy/ksched-acls.py"))
        .args(["--bootstrap", &secure.bootstrap, "--command-config"])
        .arg(secure.user("admin"))
        .args(["--prefix", &prefix, "--processor-group", &group])
        .args(["--processor", "ksched", "--job-topic", &job_topic])
        .args(["--worker", "worker-default:default"])
        .args(["--producer", &format!("tenant-acme:{job_topic}")])
        .args(["--auditor", "auditor"])
        .output()
        .unwrap();
    assert!(
        grant.status.success(),
        "{}",
        String::from_utf8_lossy(&grant.stderr)
    );

    // ksched run as User:ksched.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("policy")).unwrap();
    std::fs::write(dir.path().join("policy/input.rego"), TEST_POLICY).unwrap();
    std::fs::write(
        dir.path().join("pools.yaml"),
        // The job topic carries acme's jobs only: Kafka lets only tenant-acme write it, so
        // the topic is acme's identity.
        format!(
            "topics:\n  {job_topic}:\n    pools: default\n    tenants: [acme]\npools:\n  default: {{}}\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let config = dir.path().join("ksched.yaml");
    std::fs::write(
        &config,
        format!(
            "kafka:\n  bootstrap_servers: {}\n\
             topics:\n  prefix: {prefix}\n  journal_partitions: 2\n  dispatch_partitions: 2\n  job_partitions: 2\n  results_partitions: 2\n\
             processor:\n  group_id: {group}\n  tick_interval_ms: 200\n  commit_interval_ms: 10\n\
             scheduler:\n  overload:\n    cpu_load: 1000\n  timing:\n    worker_ttl_ms: 5000\n    clock_gap_ms: 1000\n\
             storage:\n  data_dir: {}\n\
             http:\n  listen: 127.0.0.1:{port}\n",
            secure.bootstrap,
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let log_path = dir.path().join("ksched.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut run = Reaped(
        Command::new(bin())
            .args(["run", "--config"])
            .arg(&config)
            .arg("--command-config")
            .arg(secure.user("ksched"))
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap(),
    );
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let ready_by = std::time::Instant::now() + Duration::from_secs(90);
    wait_until("ksched run to get ready on the secure listener", 90, || {
        assert!(
            run.0.try_wait().unwrap().is_none(),
            "ksched run exited:\n{}",
            read_log()
        );
        let ready = matches!(
            http(&format!("{api}/health/ready"), "GET", None),
            Ok((200, _))
        );
        assert!(
            ready || std::time::Instant::now() < ready_by,
            "ksched run not ready after 90 s; its readiness: {:?}\nits log:\n{}",
            http(&format!("{api}/health/ready"), "GET", None),
            read_log()
        );
        ready
    });

    // Its own readers (the catch-up, the positions read-back, a standby's tail) are held to
    // the processor's grants too: a group it may not describe fails their fetches, and a
    // lucky shard can still get ready after retries, so the log is what tells.
    let log = read_log();
    assert!(
        !log.contains("AuthorizationFailed"),
        "ksched run was refused something its grants should allow:\n{log}"
    );
    // An SDK worker and the Python worker as User:worker-default.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let token = CancellationToken::new();
    {
        let mut cfg = WorkerConfig::new(&secure.bootstrap, "sdk-secure", "default")
            .with_properties(secure.properties("worker-default"));
        cfg.topic_prefix = prefix.clone();
        cfg.heartbeat_interval = Duration::from_millis(300);
        cfg.report_host_load = false;
        let _guard = rt.enter();
        let worker = Worker::new(cfg).unwrap();
        let t = token.clone();
        rt.spawn(async move { worker.run(|_job| async { Outcome::succeeded() }, t).await });
    }
    let py_log = std::fs::File::create(dir.path().join("py.log")).unwrap();
    let _pyw = Reaped(
        Command::new(&py)
            .arg(repo().join("examples/python-worker/worker.py"))
            .args(["--bootstrap", &secure.bootstrap, "--prefix", &prefix])
            .args(["--pool", "default", "--worker-id", "py-secure"])
            .arg("--command-config")
            .arg(secure.user("worker-default"))
            .stdout(Stdio::from(py_log.try_clone().unwrap()))
            .stderr(Stdio::from(py_log))
            .spawn()
            .unwrap(),
    );
    wait_until("both workers to heartbeat", 60, || {
        let w = json(&format!("{api}/api/v1/workers"));
        let alive = |id: &str| {
            w["workers"].as_array().is_some_and(|ws| {
                ws.iter()
                    .any(|x| x["worker_id"] == id && x["alive"] == true)
            })
        };
        alive("sdk-secure") && alive("py-secure")
    });

    // Jobs submitted as User:tenant-acme run to SUCCEEDED.
    let acme = secure.user("tenant-acme").display().to_string();
    for i in 0..6 {
        let id = format!("acme:secure-{i}");
        let (code, out, err) = ksched(&[
            "submit",
            "--bootstrap-servers",
            &secure.bootstrap,
            "--command-config",
            &acme,
            "--topic",
            &job_topic,
            "--tenant",
            "acme",
            "--job-id",
            &id,
        ]);
        assert_eq!((code, out.trim()), (0, id.as_str()), "{err}");
    }
    for i in 0..6 {
        wait_state(&api, &format!("acme:secure-{i}"), "SUCCEEDED");
    }
    // The console reads a job's decisions from the journal with ksched's own principal.
    let (code, page) = http(&format!("{api}/ui/jobs/acme:secure-0"), "GET", None).unwrap();
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("id=\"decisions\""), "{page}");

    // Refused: tenant-acme, on the topic it may write, claiming another tenant's job. It
    // is dead-lettered `tenant_not_allowed`, never runs.
    let (code, _, err) = ksched(&[
        "submit",
        "--bootstrap-servers",
        &secure.bootstrap,
        "--command-config",
        &acme,
        "--topic",
        &job_topic,
        "--tenant",
        "globex",
        "--job-id",
        "globex:squatted",
    ]);
    assert_eq!(code, 0, "{err}");
    wait_until(
        "the claim of another tenant to be dead-lettered",
        60,
        || {
            let Ok((200, body)) = http(
                &format!("{api}/api/v1/dlq?job_id=globex:squatted"),
                "GET",
                None,
            ) else {
                return false;
            };
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            v["dead_letters"][0]["reason_code"] == "tenant_not_allowed"
        },
    );
    assert_eq!(job_state(&api, "globex:squatted"), None);

    // The auditor replays the journal and finds every decision the same.
    let auditor = secure.user("auditor").display().to_string();
    let (code, out, err) = ksched(&[
        "audit",
        "verify",
        "--all-shards",
        "--bootstrap-servers",
        &secure.bootstrap,
        "--command-config",
        &auditor,
        "--prefix",
        &prefix,
    ]);
    assert_eq!(code, 0, "{out}{err}");

    // Refused: a wrong password.
    let (code, _, err) = ksched(&[
        "submit",
        "--bootstrap-servers",
        &secure.bootstrap,
        "--command-config",
        &acme,
        "-X",
        "sasl.password=not-it",
        "--topic",
        &job_topic,
        "--tenant",
        "acme",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("Authentication failed"), "{err}");

    // Refused: a broker certificate from a CA the client does not trust.
    let other_ca = dir.path().join("other-ca.pem");
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=not the ksched CA", "-keyout"])
        .arg(dir.path().join("other-ca.key"))
        .arg("-out")
        .arg(&other_ca)
        .output()
        .unwrap();
    assert!(made.status.success());
    let (code, _, err) = ksched(&[
        "submit",
        "--bootstrap-servers",
        &secure.bootstrap,
        "--command-config",
        &acme,
        "-X",
        &format!("ssl.ca.location={}", other_ca.display()),
        "--topic",
        &job_topic,
        "--tenant",
        "acme",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("certificate verify failed"), "{err}");

    // Refused: a worker writing to the control topic (it could approve or cancel jobs).
    let (code, _, err) = ksched(&[
        "submit",
        "--bootstrap-servers",
        &secure.bootstrap,
        "--command-config",
        &secure.user("worker-default").display().to_string(),
        "--topic",
        &format!("{prefix}control"),
        "--tenant",
        "acme",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("Topic authorization failed"), "{err}");

    // Refused: a job producer reading the journal (every tenant's history).
    let (code, _, err) = ksched(&[
        "journal",
        "tail",
        "--bootstrap-servers",
        &secure.bootstrap,
        "--command-config",
        &acme,
        "--prefix",
        &prefix,
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("Topic authorization failed") || err.contains("not authorized"),
        "{err}"
    );

    token.cancel();
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(run.0.id().to_string())
        .status();
    let _ = run.0.wait();
    // Its password never reached its log.
    let password = secure
        .properties("ksched")
        .into_iter()
        .find(|(k, _)| k == "sasl.password")
        .map(|(_, v)| v)
        .unwrap();
    let log = read_log();
    assert!(!log.contains(&password));
    assert!(
        !log.contains("AuthorizationFailed"),
        "ksched run was refused something its grants should allow:\n{log}"
    );
}
