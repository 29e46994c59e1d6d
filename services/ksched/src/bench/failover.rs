//! Failover: two `ksched run` processes on the same configuration and the large history, one
//! owning the journal, the other standing by (`processor.lease`). Under load the owner is
//! SIGKILLed: how long until the standby owns the journal, and until it decides on a job
//! submitted after the kill? Then the new owner is stopped (SIGTERM) with the first instance
//! back as its standby: the planned handover. Last, with no standby at all: the owner is
//! SIGKILLed and a new instance starts on an empty data directory, so it rebuilds the
//! projection from the journal before its first decision.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, Producer};
use serde_json::Value;

use super::recovery::{LOAD_JOBS_PER_SEC, send, spawn, wait_ready};

#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Failover {
    pub history_jobs: u64,
    /// `processor.lease_session_timeout_ms` of both instances.
    pub lease_session_timeout_ms: u64,
    /// SIGKILL of the owner to the standby's ownership (`/health/ready` role `owner`).
    pub killed_to_owned_seconds: f64,
    /// SIGKILL of the owner to the standby's first decision on a job submitted after it.
    pub killed_to_first_decision_seconds: f64,
    /// SIGTERM of the owner to the standby's ownership.
    pub stopped_to_owned_seconds: f64,
    /// SIGTERM of the owner to the decision on a job submitted right after the signal: the
    /// stopping owner may still decide it while it drains, so this says how long such a job
    /// waited, not when the new owner decided first.
    pub stopped_to_first_decision_seconds: f64,
    /// No standby: SIGKILL of the owner to the first decision of an instance started at
    /// that moment on an empty data directory (the session timeout, then a full rebuild).
    pub killed_to_first_decision_without_standby_seconds: f64,
}

/// One `ksched run` child with its configuration and API.
struct Instance {
    config: PathBuf,
    api: String,
    log: PathBuf,
    child: Option<Child>,
}

impl Instance {
    fn start(&mut self) -> Result<()> {
        let mut child = spawn(&self.config, &self.log)?;
        wait_ready(&self.api, &mut child, &self.log)?;
        self.child = Some(child);
        Ok(())
    }

    fn role(&self) -> Option<String> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_millis(500)))
            .build()
            .into();
        let body: Value = agent
            .get(format!("{}/health/ready", self.api))
            .call()
            .ok()?
            .body_mut()
            .read_json()
            .ok()?;
        body["role"].as_str().map(str::to_owned)
    }

    fn kill(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill().context("SIGKILL")?;
            c.wait()?;
        }
        Ok(())
    }

    /// SIGTERM, without waiting for the exit: the handover is timed from the signal.
    fn terminate(&mut self) -> Option<Child> {
        let c = self.child.take()?;
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status();
        Some(c)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(mut c) = self.terminate() {
            let _ = c.wait();
        }
    }
}

/// Waits for a journal entry about `probe` (the new owner's decision on it) in `journal`, a
/// reader positioned at the journal's end before `probe` was sent, noting when `new_owner`
/// first reports the role `owner`. Returns (owned, decided) seconds from `from`.
fn first_decision(
    journal: &BaseConsumer,
    probe: &str,
    new_owner: Option<&Instance>,
    from: Instant,
) -> Result<(Option<f64>, f64)> {
    let mut owned = None;
    let mut last_role_check = Instant::now() - Duration::from_secs(1);
    while from.elapsed() < Duration::from_secs(900) {
        if owned.is_none()
            && last_role_check.elapsed() > Duration::from_millis(50)
            && let Some(i) = new_owner
        {
            last_role_check = Instant::now();
            if i.role().as_deref() == Some("owner") {
                owned = Some(from.elapsed().as_secs_f64());
            }
        }
        let Some(m) = journal.poll(Duration::from_millis(20)) else {
            continue;
        };
        let m = m.context("reading the journal")?;
        if m.key() == Some(probe.as_bytes()) {
            return Ok((owned, from.elapsed().as_secs_f64()));
        }
    }
    anyhow::bail!("no decision on {probe} within 15 minutes")
}

/// Sends a job now and waits for its decision in the journal: [`first_decision`] of a probe
/// named after `tag`.
fn probe(
    s: &Setup<'_>,
    producer: &BaseProducer,
    tag: &str,
    new_owner: Option<&Instance>,
    from: Instant,
) -> Result<(Option<f64>, f64)> {
    // At the journal's end before the probe is sent, so that its decision cannot be missed.
    let journal = super::journal_from_end(s.client, s.journal_topic, 1, "ksched-bench-failover")?;
    let probe = format!("failover-probe-{tag}");
    send(producer, s.job_topic, &probe)?;
    producer.flush(Duration::from_secs(30))?;
    first_decision(&journal, &probe, new_owner, from)
}

/// Jobs at a steady rate for `seconds`, so that transactions are in flight at the fault.
fn load(producer: &BaseProducer, job_topic: &str, tag: &str, seconds: f64) -> Result<()> {
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < seconds {
        n += 1;
        send(producer, job_topic, &format!("failover-{tag}-{n}"))?;
        let due = Duration::from_secs_f64(n as f64 / LOAD_JOBS_PER_SEC);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
        producer.poll(Duration::ZERO);
    }
    Ok(())
}

/// Copies a closed RocksDB directory (a standby that had been following the journal would
/// hold the same projection).
fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// What the failover run needs from the bench: the large history's configuration.
pub(super) struct Setup<'a> {
    pub client: &'a ClientConfig,
    pub config: &'a ksched_runtime::Config,
    pub job_topic: &'a str,
    pub journal_topic: &'a str,
    pub history_jobs: u64,
    pub work: &'a Path,
    pub lease_session_timeout_ms: u64,
}

pub(super) fn run(s: &Setup<'_>) -> Result<Failover> {
    let instance = |name: &str, data_dir: PathBuf| -> Result<Instance> {
        let port = super::free_port()?;
        let mut c = s.config.clone();
        c.settings.storage.data_dir = data_dir;
        c.settings.http.enabled = true;
        c.settings.http.listen = format!("127.0.0.1:{port}");
        c.settings.processor.lease = true;
        c.settings.processor.lease_session_timeout_ms = s.lease_session_timeout_ms;
        let config = super::write_config(&c, &s.work.join(format!("failover-{name}")))?;
        Ok(Instance {
            config,
            api: format!("http://127.0.0.1:{port}"),
            log: s.work.join(format!("failover-{name}.log")),
            child: None,
        })
    };
    let data = &s.config.settings.storage.data_dir;
    let standby_dir = s.work.join("failover-standby-data");
    copy_dir(data, &standby_dir)?;
    let mut a = instance("a", data.clone())?;
    let mut b = instance("b", standby_dir)?;
    a.start()?;
    b.start()?;
    anyhow::ensure!(
        a.role().as_deref() == Some("owner") && b.role().as_deref() == Some("standby"),
        "expected the first instance to own the journal and the second to stand by, got {:?} and {:?}",
        a.role(),
        b.role()
    );
    let producer: BaseProducer = s.client.clone().set("linger.ms", "2").create()?;

    // 1. The owner SIGKILLed under load; the standby takes over.
    load(&producer, s.job_topic, "kill", 1.5)?;
    a.kill()?;
    let (owned, decided) = probe(s, &producer, "kill", Some(&b), Instant::now())?;

    // 2. The first instance back, standing by; the new owner stopped.
    a.start()?;
    load(&producer, s.job_topic, "stop", 1.5)?;
    let stopping = b.terminate();
    let (handed_over, stop_decided) = probe(s, &producer, "stop", Some(&a), Instant::now())?;
    if let Some(mut c) = stopping {
        c.wait()?;
    }

    // 3. No standby: the owner SIGKILLed and a new instance on an empty directory.
    load(&producer, s.job_topic, "alone", 1.5)?;
    a.kill()?;
    let killed = Instant::now();
    let mut c = instance("c", s.work.join("failover-empty-data"))?;
    c.child = Some(spawn(&c.config, &c.log)?);
    let (_, rebuilt) = probe(s, &producer, "alone", None, killed)?;
    Ok(Failover {
        history_jobs: s.history_jobs,
        lease_session_timeout_ms: s.lease_session_timeout_ms,
        killed_to_owned_seconds: owned.unwrap_or(f64::NAN),
        killed_to_first_decision_seconds: decided,
        stopped_to_owned_seconds: handed_over.unwrap_or(f64::NAN),
        stopped_to_first_decision_seconds: stop_decided,
        killed_to_first_decision_without_standby_seconds: rebuilt,
    })
}
