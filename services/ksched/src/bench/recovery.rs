//! Recovery: `ksched run` (a child process) on a projection with a long history is killed with
//! SIGKILL under load and started again. How long until it reports ready (/health/ready), and
//! until a job submitted after the restart has its decision in the journal (serving: the
//! input group joined, the transaction fenced and the backlog since the kill processed)?

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ksched_core::records::JobRequest;
use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Recovery {
    pub history_jobs: u64,
    /// Start to ready on a clean projection.
    pub cold_start_seconds: f64,
    /// Start to ready after SIGKILL under load.
    pub recovery_seconds: f64,
    /// Start to the first decision on a job submitted after the restart.
    pub first_decision_seconds: f64,
    pub jobs_submitted_before_kill: u64,
}

pub(super) fn spawn(config: &Path, log: &Path) -> Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    Ok(Command::new(std::env::current_exe()?)
        .args(["run", "--config"])
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .spawn()?)
}

fn ready(api: &str) -> bool {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into();
    agent
        .get(format!("{api}/health/ready"))
        .call()
        .is_ok_and(|r| r.status().as_u16() == 200)
}

pub(super) fn wait_ready(api: &str, child: &mut Child, log: &Path) -> Result<f64> {
    let started = Instant::now();
    loop {
        if ready(api) {
            return Ok(started.elapsed().as_secs_f64());
        }
        if let Some(status) = child.try_wait()? {
            anyhow::bail!(
                "ksched run exited ({status}) before serving:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "not ready within 10 minutes"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(super) const LOAD_JOBS_PER_SEC: f64 = 2_000.0;

pub(super) fn send(producer: &BaseProducer, topic: &str, job_id: &str) -> Result<()> {
    let req = JobRequest {
        job_id: job_id.to_owned(),
        topic: topic.to_owned(),
        tenant_id: "bench".into(),
        ..Default::default()
    };
    let bytes = ksched_codec::encode(&req)?;
    super::send(producer, BaseRecord::to(topic).key(job_id).payload(&bytes))
}

/// The journal read from its end at the time of creation (committed entries only).
struct Journal {
    consumer: BaseConsumer,
}

impl Journal {
    fn at_end(client: &ClientConfig, topic: &str) -> Result<Journal> {
        let consumer =
            super::journal_from_end(client, topic, 1, &format!("{topic}-bench-recovery"))?;
        Ok(Journal { consumer })
    }

    /// Waits for an entry whose input is about `job_id`.
    fn wait_for(&self, job_id: &str, limit: Duration) -> Result<()> {
        let started = Instant::now();
        while started.elapsed() < limit {
            let Some(m) = self.consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            let m = m.context("reading the journal")?;
            if m.key() == Some(job_id.as_bytes()) {
                return Ok(());
            }
        }
        anyhow::bail!("no decision on {job_id} within {limit:?} of the restart")
    }
}

pub(super) fn run(
    client: &ClientConfig,
    config_file: &Path,
    api: &str,
    job_topic: &str,
    journal_topic: &str,
    history_jobs: u64,
    log: &Path,
) -> Result<Recovery> {
    let started = Instant::now();
    let mut child = spawn(config_file, log)?;
    wait_ready(api, &mut child, log)?;
    let cold_start_seconds = started.elapsed().as_secs_f64();
    // Load at a steady 2,000 jobs/s (well under saturation: the point is transactions in
    // flight at the kill, not a backlog), then SIGKILL mid-stream.
    let producer: BaseProducer = client.clone().set("linger.ms", "2").create()?;
    let load_started = Instant::now();
    let mut n = 0u64;
    while load_started.elapsed() < Duration::from_millis(1500) {
        n += 1;
        send(&producer, job_topic, &format!("recovery-{n}"))?;
        let due = Duration::from_secs_f64(n as f64 / LOAD_JOBS_PER_SEC);
        if let Some(wait) = due.checked_sub(load_started.elapsed()) {
            std::thread::sleep(wait);
        }
        producer.poll(Duration::ZERO);
    }
    child.kill().context("SIGKILL")?;
    child.wait()?;
    producer.flush(Duration::from_secs(30))?;
    let journal = Journal::at_end(client, journal_topic)?;
    let restarted = Instant::now();
    let mut child = spawn(config_file, log)?;
    let probe = "recovery-probe";
    send(&producer, job_topic, probe)?;
    producer.flush(Duration::from_secs(30))?;
    wait_ready(api, &mut child, log)?;
    let recovery_seconds = restarted.elapsed().as_secs_f64();
    let decided = journal.wait_for(probe, Duration::from_secs(600));
    let first_decision_seconds = restarted.elapsed().as_secs_f64();
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let _ = child.wait();
    decided?;
    Ok(Recovery {
        history_jobs,
        cold_start_seconds,
        recovery_seconds,
        first_decision_seconds,
        jobs_submitted_before_kill: n,
    })
}
