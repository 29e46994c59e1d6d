//! `ksched run` as a child process with its own topics, data and HTTP port; the `ksched`
//! binary for CLI calls; an HTTP client.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ksched_testkit::{TEST_POLICY, bootstrap_servers, unique};

pub(crate) struct RunningScheduler {
    pub child: Child,
    pub bootstrap: String,
    pub prefix: String,
    pub job_topic: String,
    pub api: String,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    /// For an API over TLS: the CA its certificate chains to, and the client certificate
    /// and key when it requires mutual TLS; `cli` passes them on.
    pub tls: Option<ApiTls>,
}

/// How the tests reach an API served over TLS.
#[derive(Debug, Clone)]
pub(crate) struct ApiTls {
    pub ca: PathBuf,
    pub client: Option<(PathBuf, PathBuf)>,
}

impl ApiTls {
    /// `ksched` flags for it.
    pub(crate) fn cli_args(&self) -> Vec<String> {
        let mut a = vec!["--api-ca".to_owned(), path_str(&self.ca)];
        if let Some((cert, key)) = &self.client {
            a.extend(["--api-cert".to_owned(), path_str(cert)]);
            a.extend(["--api-key".to_owned(), path_str(key)]);
        }
        a
    }

    /// GET `url` over TLS; the status, or None when no answer came.
    pub(crate) fn get(&self, url: &str) -> Option<u16> {
        use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};
        let certs = |p: &Path| -> Vec<Certificate<'static>> {
            let pem = std::fs::read(p).unwrap();
            ureq::tls::parse_pem(&pem)
                .filter_map(|i| match i {
                    Ok(PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect()
        };
        let mut tls = TlsConfig::builder().root_certs(RootCerts::new_with_certs(&certs(&self.ca)));
        if let Some((cert, key)) = &self.client {
            let key = PrivateKey::from_pem(&std::fs::read(key).unwrap()).unwrap();
            tls = tls.client_cert(Some(ClientCert::new_with_certs(&certs(cert), key)));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(tls.build())
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        agent.get(url).call().ok().map(|r| r.status().as_u16())
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ksched")
}

/// The repository's root.
pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Python with the example worker's packages: `KSCHED_PYTHON` (scripts/setup.sh sets
/// it), else setup's venv, else `python3`.
pub(crate) fn python() -> String {
    std::env::var("KSCHED_PYTHON").unwrap_or_else(|_| {
        let venv = PathBuf::from(std::env::var("HOME").unwrap_or_default())
            .join(".cache/ksched/venv/bin/python");
        if venv.exists() {
            venv.display().to_string()
        } else {
            "python3".into()
        }
    })
}

impl RunningScheduler {
    /// An SDK worker's configuration for this scheduler's `default` pool: quick heartbeats,
    /// no host load reports (so a busy test machine never counts as overloaded).
    pub(crate) fn worker_config(&self, id: &str) -> ksched_worker::WorkerConfig {
        let mut cfg = ksched_worker::WorkerConfig::new(&self.bootstrap, id, "default");
        cfg.topic_prefix = self.prefix.clone();
        cfg.heartbeat_interval = Duration::from_millis(300);
        cfg.report_host_load = false;
        cfg
    }

    /// Writes a configuration and starts `ksched run`; returns once /health/ready says so.
    pub(crate) fn start(extra: &str) -> RunningScheduler {
        RunningScheduler::start_with_topics(extra, &["jobs"])
    }

    /// Like [`RunningScheduler::start`], with job topics `<prefix><name>` for each name, all
    /// routed to pool `default` (the first is `job_topic`).
    pub(crate) fn start_with_topics(extra: &str, topics: &[&str]) -> RunningScheduler {
        RunningScheduler::start_full(extra, topics, None)
    }

    /// Like [`RunningScheduler::start`], with `rules` (pools.yaml for a topic prefix) instead
    /// of the one topic `<prefix>jobs` routed to pool `default`.
    pub(crate) fn start_with_rules(rules: &dyn Fn(&str) -> String) -> RunningScheduler {
        RunningScheduler::start_custom(rules, "jobs", "", "", "", "", None)
    }

    /// Like [`RunningScheduler::start_with_rules`], with `scheduler` lines added to the
    /// `scheduler` section of the settings.
    pub(crate) fn start_with_rules_and_scheduler(
        rules: &dyn Fn(&str) -> String,
        scheduler: &str,
    ) -> RunningScheduler {
        RunningScheduler::start_custom(rules, "jobs", "", "", scheduler, "", None)
    }

    /// Like [`RunningScheduler::start`], with `processor` lines added to the `processor`
    /// section of the settings.
    pub(crate) fn start_with_processor(processor: &str) -> RunningScheduler {
        let routes =
            |prefix: &str| format!("topics:\n  {prefix}jobs: default\npools:\n  default: {{}}\n");
        RunningScheduler::start_custom(&routes, "jobs", "", processor, "", "", None)
    }

    /// Like [`RunningScheduler::start`], with the API over TLS (`extra` configures
    /// `http.tls`); `tls` says how to reach it.
    pub(crate) fn start_tls(extra: &str, tls: ApiTls) -> RunningScheduler {
        RunningScheduler::start_full(extra, &["jobs"], Some(tls))
    }

    fn start_full(extra: &str, topics: &[&str], tls: Option<ApiTls>) -> RunningScheduler {
        let routes = |prefix: &str| -> String {
            let routes: String = topics
                .iter()
                .map(|t| format!("  {prefix}{t}: default\n"))
                .collect();
            format!("topics:\n{routes}pools:\n  default: {{}}\n")
        };
        RunningScheduler::start_custom(&routes, topics[0], "", "", "", extra, tls)
    }

    /// `shards` shards (journal partitions), with a pool `pool-<s>` on each shard `s` and a
    /// job topic `<prefix>jobs-<s>` routed to it; a short lease session (1 s heartbeats
    /// apart at most), so that a killed instance's shards move within seconds. `rules` and
    /// `processor` are lines added to pools.yaml and to the `processor` section.
    pub(crate) fn start_sharded(shards: u32, rules: &str, processor: &str) -> RunningScheduler {
        let pools = |prefix: &str| -> String {
            let mut t = String::from("topics:\n");
            let mut p = String::from("pools:\n");
            for s in 0..shards {
                t.push_str(&format!("  {prefix}jobs-{s}: pool-{s}\n"));
                p.push_str(&format!("  pool-{s}: {{shard: {s}}}\n"));
            }
            t + &p + rules
        };
        RunningScheduler::start_custom(
            &pools,
            "jobs-0",
            &format!(
                "  journal_partitions: {shards}\n  results_partitions: {shards}\n  heartbeats_partitions: 2\n  control_partitions: 2\n"
            ),
            &format!("  lease_session_timeout_ms: 2000\n{processor}"),
            "",
            "",
            None,
        )
    }

    /// The general form: `pools` writes pools.yaml for a topic prefix; `topics_extra`,
    /// `processor_extra` and `scheduler_extra` are lines added to those sections.
    fn start_custom(
        pools: &dyn Fn(&str) -> String,
        first_topic: &str,
        topics_extra: &str,
        processor_extra: &str,
        scheduler_extra: &str,
        extra: &str,
        tls: Option<ApiTls>,
    ) -> RunningScheduler {
        let bootstrap = bootstrap_servers().unwrap_or_else(|e| panic!("{e}"));
        let prefix = format!("{}.", unique("cli"));
        let job_topic = format!("{prefix}{first_topic}");
        let dir = tempfile::tempdir().unwrap();
        let policy = dir.path().join("policy");
        std::fs::create_dir_all(&policy).unwrap();
        std::fs::write(policy.join("input.rego"), TEST_POLICY).unwrap();
        std::fs::write(dir.path().join("pools.yaml"), pools(&prefix)).unwrap();
        let port = free_port();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let api = format!("{scheme}://127.0.0.1:{port}");
        let config = dir.path().join("ksched.yaml");
        let commit = if processor_extra.contains("commit_interval_ms") {
            ""
        } else {
            "  commit_interval_ms: 10\n"
        };
        let results = if topics_extra.contains("results_partitions") {
            ""
        } else {
            "  results_partitions: 4\n"
        };
        std::fs::write(
            &config,
            format!(
                "kafka:\n  bootstrap_servers: {bootstrap}\n\
                 topics:\n  prefix: {prefix}\n  dispatch_partitions: 2\n  job_partitions: 2\n{results}{topics_extra}\
                 processor:\n  group_id: {prefix}processor\n  tick_interval_ms: 200\n{commit}{processor_extra}\
                 scheduler:\n  overload:\n    cpu_load: 1000\n  retry:\n    initial_backoff_ms: 100\n    max_backoff_ms: 500\n  timing:\n    worker_ttl_ms: 3000\n    clock_gap_ms: 1000\n{scheduler_extra}\
                 storage:\n  data_dir: {}\n\
                 http:\n  listen: 127.0.0.1:{port}\n{extra}",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let child = spawn_run(&config, dir.path());
        let mut c = RunningScheduler {
            child,
            bootstrap,
            prefix,
            job_topic,
            api,
            dir,
            config,
            tls,
        };
        c.wait_ready();
        c
    }

    /// A second `ksched run` on the same topics and processor group, with its own data
    /// directory and HTTP port: a standby while this one owns the journal (`processor.lease`).
    pub(crate) fn another_instance(&self) -> RunningScheduler {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let text = std::fs::read_to_string(&self.config).unwrap();
        let old_port = self.api.rsplit(':').next().unwrap();
        let text = text
            .replace(
                &format!("listen: 127.0.0.1:{old_port}"),
                &format!("listen: 127.0.0.1:{port}"),
            )
            .replace(
                &self.dir.path().display().to_string(),
                &dir.path().display().to_string(),
            );
        for f in ["pools.yaml", "policy/input.rego"] {
            let to = dir.path().join(f);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(self.dir.path().join(f), to).unwrap();
        }
        let config = dir.path().join("ksched.yaml");
        std::fs::write(&config, text).unwrap();
        let child = spawn_run(&config, dir.path());
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut c = RunningScheduler {
            child,
            bootstrap: self.bootstrap.clone(),
            prefix: self.prefix.clone(),
            job_topic: self.job_topic.clone(),
            api: format!("{scheme}://127.0.0.1:{port}"),
            dir,
            config,
            tls: self.tls.clone(),
        };
        c.wait_ready();
        c
    }

    /// SIGKILL: no batch committed, no group left; the process is gone.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ksched.log")).unwrap_or_default()
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let url = format!("{}/health/ready", self.api);
            let ready = match &self.tls {
                Some(tls) => tls.get(&url) == Some(200),
                None => matches!(http(&url, "GET", None), Ok((200, _))),
            };
            if ready {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "ksched run exited ({status}) before it got ready:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "ksched run never got ready:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs `ksched <args>` against this scheduler; returns (exit code, stdout, stderr).
    pub(crate) fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let out: Output = Command::new(bin())
            .args(args)
            .args([
                "--bootstrap-servers",
                &self.bootstrap,
                "--api",
                &self.api,
                "--prefix",
                &self.prefix,
            ])
            .args(self.tls.iter().flat_map(ApiTls::cli_args))
            .arg("--config")
            .arg(&self.config)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// SIGTERM, and waits for a clean exit (the open batch committed, the groups left).
    pub(crate) fn terminate(&mut self) {
        self.sigterm();
        self.wait_clean_exit();
    }

    /// SIGTERM, without waiting.
    pub(crate) fn sigterm(&self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
    }

    /// Waits for the process to exit, and for that exit to be clean.
    pub(crate) fn wait_clean_exit(&mut self) {
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "ksched run did not stop cleanly: {status:?}\n{}",
            self.log()
        );
    }

    /// `ksched run` again on the same configuration and data directory, after
    /// [`RunningScheduler::terminate`] or [`RunningScheduler::kill`].
    pub(crate) fn start_again(&mut self) {
        self.child = spawn_run(&self.config, self.dir.path());
        self.wait_ready();
    }

    pub(crate) fn stop(mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "ksched run did not stop cleanly: {status:?}\n{}",
            self.log()
        );
    }

    pub(crate) fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Stops the scheduler like [`RunningScheduler::stop`] and hands over its directory
    /// (settings, log, RocksDB data), to look at what it left behind.
    pub(crate) fn stop_keeping_dir(mut self) -> tempfile::TempDir {
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let status = self.child.wait().unwrap();
        let log = std::fs::read_to_string(dir.path().join("ksched.log")).unwrap_or_default();
        assert!(
            status.success(),
            "ksched run did not stop cleanly: {status:?}\n{log}"
        );
        dir
    }
}

impl Drop for RunningScheduler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ksched run --config <config>`, its output in `<dir>/ksched.log`.
fn spawn_run(config: &Path, dir: &Path) -> Child {
    let log = std::fs::File::create(dir.join("ksched.log")).unwrap();
    Command::new(bin())
        .args(["run", "--config"])
        .arg(config)
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap()
}

/// A minimal HTTP/1.1 client (status, body), so the tests check the server, not a library.
pub(crate) fn http(url: &str, method: &str, body: Option<&str>) -> std::io::Result<(u16, String)> {
    http_with(url, method, &[], body)
}

/// [`http`] with headers: `Host` and `Content-Type` (JSON by default) are replaced when given.
pub(crate) fn http_with(
    url: &str,
    method: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    http_full(url, method, headers, body).map(|(status, _, body)| (status, body))
}

/// [`http_with`], with the response's head (status line and headers) as well.
pub(crate) fn http_full(
    url: &str,
    method: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> std::io::Result<(u16, String, String)> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let mut s = std::net::TcpStream::connect(host)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let body = body.unwrap_or("");
    let given = |name: &str| headers.iter().any(|(h, _)| h.eq_ignore_ascii_case(name));
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !given("host") {
        head.push_str(&format!("Host: {host}\r\n"));
    }
    if !given("content-type") {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (h, v) in headers {
        head.push_str(&format!("{h}: {v}\r\n"));
    }
    write!(s, "{head}Content-Length: {}\r\n\r\n{body}", body.len())?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let resp = String::from_utf8_lossy(&resp).into_owned();
    let status: u16 = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok((status, head.to_owned(), body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

pub(crate) fn json(url: &str) -> serde_json::Value {
    let (code, body) = http(url, "GET", None).unwrap();
    assert_eq!(code, 200, "GET {url}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// Polls `cond` until it holds or panics after `secs`.
pub(crate) fn wait_until(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub(crate) fn job_state(api: &str, id: &str) -> Option<String> {
    let (code, body) = http(&format!("{api}/api/v1/jobs/{id}"), "GET", None).ok()?;
    (code == 200).then(|| {
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["state"].as_str().unwrap_or("").to_owned()
    })
}

pub(crate) fn wait_state(api: &str, id: &str, state: &str) {
    wait_until(&format!("{id} to be {state}"), 60, || {
        job_state(api, id).as_deref() == Some(state)
    });
}

pub(crate) fn path_str(p: &Path) -> String {
    p.display().to_string()
}

/// Produces a job of tenant `acme` with id `id` to `topic` (keyed by its id).
pub(crate) fn submit(producer: &rdkafka::producer::BaseProducer, topic: &str, id: &str) {
    submit_as(producer, topic, id, "acme");
}

/// Produces a job of `tenant` with id `id` to `topic` (keyed by its id).
pub(crate) fn submit_as(
    producer: &rdkafka::producer::BaseProducer,
    topic: &str,
    id: &str,
    tenant: &str,
) {
    let job = ksched_core::records::JobRequest {
        job_id: id.to_owned(),
        topic: topic.to_owned(),
        tenant_id: tenant.into(),
        submitted_at: 1,
        ..Default::default()
    };
    produce_job(producer, &job);
}

/// Produces `job` to its topic, single-object encoded and keyed by its id.
pub(crate) fn produce_job(
    producer: &rdkafka::producer::BaseProducer,
    job: &ksched_core::records::JobRequest,
) {
    use rdkafka::producer::BaseRecord;
    let bytes = ksched_codec::encode(job).unwrap();
    producer
        .send(BaseRecord::to(&job.topic).key(&job.job_id).payload(&bytes))
        .unwrap();
    producer.poll(Duration::ZERO);
}

/// Runs `ksched <args>` with neither a settings file nor a broker from the environment;
/// (exit code, stdout, stderr).
pub(crate) fn ksched(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin())
        .args(args)
        .env_remove("KSCHED_CONFIG")
        .env_remove("KAFKA_BOOTSTRAP_SERVERS")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The role an instance reports (`owner`, `standby`), if it answers.
pub(crate) fn role(c: &RunningScheduler) -> Option<String> {
    let (_, body) = http(&format!("{}/health/ready", c.api), "GET", None).ok()?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["role"].as_str().map(str::to_owned)
}

/// Two instances of one scheduler, once one owns the journal and the other stands by:
/// (owner, standby).
pub(crate) fn owner_and_standby() -> (RunningScheduler, RunningScheduler) {
    owner_and_standby_of(RunningScheduler::start(""))
}

/// [`owner_and_standby`] of an instance already started, and another like it.
pub(crate) fn owner_and_standby_of(a: RunningScheduler) -> (RunningScheduler, RunningScheduler) {
    let b = a.another_instance();
    wait_until("one owner and one standby", 60, || {
        let roles = [role(&a), role(&b)];
        roles.contains(&Some("owner".into())) && roles.contains(&Some("standby".into()))
    });
    if role(&a).as_deref() == Some("owner") {
        (a, b)
    } else {
        (b, a)
    }
}

/// A producer of job records to `owner`'s broker.
pub(crate) fn producer_of(owner: &RunningScheduler) -> rdkafka::producer::BaseProducer {
    rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &owner.bootstrap)
        .set("enable.idempotence", "true")
        .create()
        .unwrap()
}

/// An SDK worker `id` of `slots` slots for `owner`'s pool, running `handler` until the
/// token is cancelled (on the runtime returned with it, which must outlive the run).
pub(crate) fn run_worker<H, F>(
    owner: &RunningScheduler,
    id: &str,
    slots: usize,
    handler: H,
) -> (tokio::runtime::Runtime, tokio_util::sync::CancellationToken)
where
    H: Fn(ksched_worker::JobContext) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = ksched_worker::Outcome> + Send + 'static,
{
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let mut cfg = owner.worker_config(id);
    cfg.max_parallel_jobs = slots;
    let worker = {
        let _guard = rt.enter();
        ksched_worker::Worker::new(cfg).unwrap()
    };
    let s = stop.clone();
    rt.spawn(async move { worker.run(handler, s).await });
    (rt, stop)
}

/// A [`run_worker`] whose jobs succeed after `ms`, and the ids of the jobs it started, in the
/// order it started them.
#[allow(clippy::type_complexity)]
pub(crate) fn run_recording_worker(
    owner: &RunningScheduler,
    id: &str,
    slots: usize,
    ms: u64,
) -> (
    tokio::runtime::Runtime,
    tokio_util::sync::CancellationToken,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    let started: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let recorded = started.clone();
    let (rt, stop) = run_worker(owner, id, slots, move |job| {
        let started = recorded.clone();
        async move {
            started
                .lock()
                .unwrap()
                .push(job.dispatch.job.job_id.clone());
            tokio::time::sleep(Duration::from_millis(ms)).await;
            ksched_worker::Outcome::succeeded()
        }
    });
    (rt, stop, started)
}
