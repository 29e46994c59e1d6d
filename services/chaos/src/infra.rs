//! What the fault suite runs against and breaks: brokers started by `deploy/kafka.sh` on the
//! suite's own ports (one node with a listener behind toxiproxy, or a 3-node cluster),
//! toxiproxy itself, `ksched run` child processes, and the Python worker.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

/// A Kafka cluster managed through `deploy/kafka.sh`.
#[derive(Debug)]
pub(super) struct Cluster {
    script: PathBuf,
    home: PathBuf,
    pub base_port: u16,
    pub brokers: u8,
    /// Where toxiproxy listens for the proxied listener (single node only).
    pub proxy_port: Option<u16>,
}

impl Cluster {
    pub(super) fn new(
        repo: &Path,
        home: &Path,
        base_port: u16,
        brokers: u8,
        proxy_port: Option<u16>,
    ) -> Cluster {
        Cluster {
            script: repo.join("deploy/kafka.sh"),
            home: home.to_owned(),
            base_port,
            brokers,
            proxy_port,
        }
    }

    fn run(&self, args: &[&str]) -> Result<()> {
        let mut cmd = Command::new("bash");
        cmd.arg(&self.script)
            .args(args)
            .env("KSCHED_KAFKA_HOME", &self.home)
            .env("KSCHED_KAFKA_PORT", self.base_port.to_string())
            .env("KSCHED_KAFKA_BROKERS", self.brokers.to_string())
            .env("KAFKA_HEAP_OPTS", "-Xms128m -Xmx512m");
        match self.proxy_port {
            Some(p) => cmd.env("KSCHED_KAFKA_PROXY_PORT", p.to_string()),
            None => cmd.env_remove("KSCHED_KAFKA_PROXY_PORT"),
        };
        let out = cmd.output().context("running deploy/kafka.sh")?;
        ensure!(
            out.status.success(),
            "deploy/kafka.sh {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// Starts from empty storage (a fresh cluster for each fault: no state leaks between).
    pub(super) fn fresh(&self) -> Result<()> {
        self.run(&["reset"])?;
        self.run(&["start", "--brokers", &self.brokers.to_string()])
    }

    pub(super) fn stop(&self) -> Result<()> {
        self.run(&["stop"])
    }

    pub(super) fn start(&self) -> Result<()> {
        self.run(&["start", "--brokers", &self.brokers.to_string()])
    }

    pub(super) fn kill_node(&self, node: u8) -> Result<()> {
        self.run(&["kill-node", &node.to_string()])
    }

    pub(super) fn start_node(&self, node: u8) -> Result<()> {
        self.run(&["start-node", &node.to_string()])
    }

    pub(super) fn reset(&self) -> Result<()> {
        self.run(&["reset"])
    }

    /// Bootstrap servers for clients that talk to the brokers directly.
    pub(super) fn direct(&self) -> String {
        (0..self.brokers)
            .map(|i| format!("127.0.0.1:{}", self.base_port + 10 * u16::from(i)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Bootstrap servers through the proxy (the proxied listener's advertised address).
    pub(super) fn proxied(&self) -> Option<String> {
        self.proxy_port.map(|p| format!("127.0.0.1:{p}"))
    }

    /// The broker side of the proxied listener.
    pub(super) fn proxied_upstream(&self) -> Option<String> {
        self.proxy_port
            .map(|_| format!("127.0.0.1:{}", self.base_port + 2))
    }
}

/// toxiproxy (github.com/Shopify/toxiproxy/v2) on loopback, driven through its HTTP API.
#[derive(Debug)]
pub(super) struct Toxiproxy {
    child: Child,
    api: String,
    agent: ureq::Agent,
}

impl Toxiproxy {
    /// Finds `toxiproxy-server` (PATH, then ~/.cache/ksched/bin, where scripts/setup.sh puts
    /// it) and starts it on `api_port`.
    pub(super) fn start(api_port: u16, log: &Path) -> Result<Toxiproxy> {
        let bin = find_toxiproxy().context(
            "toxiproxy-server not found: `source scripts/setup.sh` installs it (go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0)",
        )?;
        let log = std::fs::File::create(log)?;
        let child = Command::new(bin)
            .args(["-host", "127.0.0.1", "-port", &api_port.to_string()])
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .context("starting toxiproxy-server")?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        let t = Toxiproxy {
            child,
            api: format!("http://127.0.0.1:{api_port}"),
            agent,
        };
        let started = Instant::now();
        while t.call("GET", "/version", None).is_err() {
            ensure!(
                started.elapsed() < Duration::from_secs(15),
                "toxiproxy did not answer"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(t)
    }

    /// One API call, tried again (up to 5 times, 200 ms apart) when the connection fails: a
    /// CI run failed on "Connection reset by peer" from the API between two toxics (a pooled
    /// keep-alive connection the server had dropped, most likely). A retried DELETE that
    /// finds nothing (404) or POST that finds its toxic there (409) did its work the first time.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let url = format!("{}{path}", self.api);
        let mut attempt = 0;
        let mut resp = loop {
            let sent = match (method, &body) {
                ("GET", _) => self.agent.get(&url).call(),
                ("DELETE", _) => self.agent.delete(&url).call(),
                (_, Some(b)) => self.agent.post(&url).send_json(b),
                (_, None) => self.agent.post(&url).send_empty(),
            };
            match sent {
                Ok(resp) => break resp,
                Err(_) if attempt < 4 => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e.into()),
            }
        };
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        let done_before =
            attempt > 0 && matches!((method, status), ("DELETE", 404) | ("POST", 409));
        ensure!(
            status < 300 || done_before,
            "toxiproxy {method} {path}: {status} {text}"
        );
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub(super) fn proxy(&self, name: &str, listen: &str, upstream: &str) -> Result<()> {
        self.call(
            "POST",
            "/proxies",
            Some(json!({ "name": name, "listen": listen, "upstream": upstream, "enabled": true })),
        )?;
        Ok(())
    }

    /// Adds a toxic to both directions of `proxy`.
    pub(super) fn toxic(
        &self,
        proxy: &str,
        name: &str,
        kind: &str,
        attributes: Value,
    ) -> Result<()> {
        for stream in ["downstream", "upstream"] {
            self.call(
                "POST",
                &format!("/proxies/{proxy}/toxics"),
                Some(json!({
                    "name": format!("{name}-{stream}"),
                    "type": kind,
                    "stream": stream,
                    "toxicity": 1.0,
                    "attributes": attributes,
                })),
            )?;
        }
        Ok(())
    }

    pub(super) fn remove_toxic(&self, proxy: &str, name: &str) -> Result<()> {
        for stream in ["downstream", "upstream"] {
            self.call(
                "DELETE",
                &format!("/proxies/{proxy}/toxics/{name}-{stream}"),
                None,
            )?;
        }
        Ok(())
    }
}

impl Drop for Toxiproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_toxiproxy() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("toxiproxy-server"))
                .collect()
        })
        .unwrap_or_default();
    candidates.push(home.join(".cache/ksched/bin/toxiproxy-server"));
    candidates.into_iter().find(|p| p.is_file())
}

/// A `ksched run` child process with its own log.
#[derive(Debug)]
pub(super) struct Ksched {
    pub child: Child,
    pub log: PathBuf,
    pub api: String,
}

impl Ksched {
    pub(super) fn spawn(bin: &Path, config: &Path, log: &Path, http_port: u16) -> Result<Ksched> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let child = Command::new(bin)
            .args(["run", "--config"])
            .arg(config)
            .args(["--http-listen", &format!("127.0.0.1:{http_port}")])
            .env(
                "RUST_LOG",
                std::env::var("KSCHED_CHAOS_RUST_LOG")
                    .unwrap_or_else(|_| "warn,ksched=info".into()),
            )
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .spawn()
            .context("starting ksched run")?;
        Ok(Ksched {
            child,
            log: log.to_owned(),
            api: format!("http://127.0.0.1:{http_port}"),
        })
    }

    /// `/health/ready`: status code and body.
    pub(super) fn ready(&self) -> Option<(u16, Value)> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(3)))
            .build()
            .into();
        let mut r = agent
            .get(format!("{}/health/ready", self.api))
            .call()
            .ok()?;
        let code = r.status().as_u16();
        let body = r.body_mut().read_to_string().ok()?;
        Some((code, serde_json::from_str(&body).unwrap_or(Value::Null)))
    }

    pub(super) fn wait_ready(&mut self, limit: Duration) -> Result<Duration> {
        let started = Instant::now();
        loop {
            if self.ready().is_some_and(|(code, _)| code == 200) {
                return Ok(started.elapsed());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "ksched run exited ({status}) before it was ready:\n{}",
                    tail(&self.log, 30)
                );
            }
            ensure!(
                started.elapsed() < limit,
                "ksched run not ready within {limit:?}:\n{}",
                tail(&self.log, 30)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub(super) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait (SIGKILL after `limit`).
    pub(super) fn stop(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
        None
    }

    pub(super) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Ksched {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `n` lines of a log file.
pub(super) fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The Python worker (examples/python-worker), if Python with its packages is here.
#[derive(Debug)]
pub(super) struct PyWorker {
    child: Child,
}

impl PyWorker {
    pub(super) fn python() -> Option<String> {
        let candidates = [
            std::env::var("KSCHED_PYTHON").ok(),
            std::env::var_os("HOME").map(|h| {
                PathBuf::from(h)
                    .join(".cache/ksched/venv/bin/python")
                    .display()
                    .to_string()
            }),
        ];
        candidates.into_iter().flatten().find(|p| {
            Command::new(p)
                .args(["-c", "import confluent_kafka, fastavro"])
                .output()
                .is_ok_and(|o| o.status.success())
        })
    }

    pub(super) fn spawn(
        python: &str,
        repo: &Path,
        bootstrap: &str,
        prefix: &str,
        worker_id: &str,
        log: &Path,
    ) -> Result<PyWorker> {
        let file = std::fs::File::create(log)?;
        let child = Command::new(python)
            .arg(repo.join("examples/python-worker/worker.py"))
            .args([
                "--bootstrap",
                bootstrap,
                "--prefix",
                prefix,
                "--pool",
                "default",
            ])
            .args(["--worker-id", worker_id, "--heartbeat-interval", "0.5"])
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .spawn()
            .context("starting the Python worker")?;
        Ok(PyWorker { child })
    }

    pub(super) fn alive(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }
}

impl Drop for PyWorker {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A tmpfs of `mib` MiB at `dir` (root only); None when it cannot be mounted.
pub(super) fn mount_tmpfs(dir: &Path, mib: u32) -> Result<bool> {
    std::fs::create_dir_all(dir)?;
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
        .arg(dir)
        .output()
        .is_ok_and(|o| o.status.success());
    Ok(ok)
}

pub(super) fn unmount(dir: &Path) {
    let _ = Command::new("umount").arg(dir).output();
}
