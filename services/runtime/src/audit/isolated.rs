//! The console's replays, in a child process.
//!
//! Time travel replays a shard's whole journal, and what-if also evaluates a caller's policy
//! on every job and holds two worlds in memory: neither runs inside the scheduler. The
//! console starts `ksched replay-child`, hands it a [`ReplayRequest`] on its standard input
//! and reads a [`ReplayAnswer`] from its standard output. The child lowers its own priority
//! and limits its CPU time before it reads anything (`RLIMIT_CPU`); the console watches its
//! resident memory and kills it past `http.replay_memory_limit_bytes`, and at the deadline.
//! Whatever a request makes it do, the scheduler's process, memory and cores are not its to
//! take. (Resident memory, not an address-space limit: a policy's huge value is reserved
//! before it is touched, and refusing the reservation would abort the child where the
//! evaluation's own memory limit stops it cleanly.)

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::time::Duration;

use ksched_core::events::{JobState, Verdict};
use ksched_core::state::{Job, Worker};
use ksched_policy::{PolicyBundle, RegoEngine};
use rdkafka::ClientConfig;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Alternative, Outcome, PausedSchedule, Source, Until, replay_until, what_if};

/// Most bytes of a request the child reads (a pools.yaml and a policy, both capped by the
/// HTTP body limit long before this).
const MAX_REQUEST_BYTES: u64 = 16 << 20;

/// Most bytes of an answer the console reads back.
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// The last bytes of a child's standard error kept for the server's log.
const STDERR_TAIL_BYTES: usize = 4096;

/// The niceness the child runs at: the scheduler's threads go first.
const CHILD_NICENESS: i32 = 10;

/// What the console asks a child to replay.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplayRequest {
    /// The journal reader's librdkafka properties.
    pub kafka: BTreeMap<String, String>,
    pub topic: String,
    pub partition: i32,
    /// The tenants whose jobs the caller sees; None: every tenant.
    pub visible_tenants: Option<BTreeSet<String>>,
    /// Resident memory the child may use, in bytes (the console kills it beyond).
    pub memory_limit_bytes: u64,
    /// The child's CPU time limit (`RLIMIT_CPU`), in seconds.
    pub cpu_limit_secs: u64,
    pub task: ReplayTask,
}

/// Time travel or what-if.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ReplayTask {
    /// The projection as of a log time: counts by state, the first `max_jobs` jobs, the
    /// workers.
    At { time_ms: i64, max_jobs: usize },
    /// The recorded inputs decided under other pools and/or another input policy (one Rego
    /// module), with at most `max_rows` rows.
    WhatIf {
        pools_yaml: Option<String>,
        policy_rego: Option<String>,
        /// Schedules taken to have been paused from their start; a scoped caller may name
        /// its own tenants' only.
        #[serde(default)]
        paused_schedules: Vec<PausedSchedule>,
        max_rows: usize,
    },
}

/// A job of the what-if diff, as the child sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiffRow {
    pub job_id: String,
    pub tenant_id: String,
    pub topic: String,
    pub differs_in: Vec<String>,
    pub actual: DiffOutcome,
    pub alternative: DiffOutcome,
}

/// [`Outcome`], as the child sends it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DiffOutcome {
    pub state: Option<JobState>,
    pub pool: Option<String>,
    pub worker: Option<String>,
    pub verdict: Option<Verdict>,
}

impl From<&Outcome> for DiffOutcome {
    fn from(o: &Outcome) -> Self {
        DiffOutcome {
            state: o.state,
            pool: o.pool.clone(),
            worker: o.worker.clone(),
            verdict: o.verdict,
        }
    }
}

/// What the child found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ReplayAnswer {
    At {
        /// The last entry applied: its offset and log time.
        last: Option<(i64, i64)>,
        /// Visible jobs by state.
        counts: BTreeMap<String, u64>,
        /// The first visible jobs, in id order.
        jobs: Vec<(String, Job)>,
        workers: Vec<(String, Worker)>,
    },
    WhatIf {
        /// Visible jobs replayed.
        jobs: usize,
        /// Visible jobs that differ, in all (`rows` may hold fewer).
        differing: usize,
        rows: Vec<DiffRow>,
        /// How many visible jobs differ in each respect.
        totals: BTreeMap<String, usize>,
        /// Named schedules this shard's journal never held (`TENANT:ID`).
        #[serde(default)]
        schedules_not_found: Vec<String>,
        /// Per visible tenant, how long its jobs waited to be placed in each world.
        #[serde(default)]
        waits: Vec<super::TenantWaits>,
    },
    /// The replay could not be done (bad pools or policy, an unreadable journal).
    Failed(String),
}

/// How the console runs a child.
#[derive(Debug, Clone)]
pub struct ChildLimits {
    /// The program: the `ksched` binary (it has the `replay-child` subcommand).
    pub program: std::path::PathBuf,
    pub memory_limit_bytes: u64,
    /// Wall-clock deadline; the child is killed then.
    pub timeout: Duration,
}

/// Runs `request` in a child process within `limits`. The error says why there is no
/// answer: the child failed to start, ran out of time or memory, or answered nonsense.
pub async fn replay_in_child(
    limits: &ChildLimits,
    mut request: ReplayRequest,
) -> Result<ReplayAnswer, String> {
    request.memory_limit_bytes = limits.memory_limit_bytes;
    request.cpu_limit_secs = limits.timeout.as_secs().saturating_add(5);
    let body = serde_json::to_vec(&request).map_err(|e| e.to_string())?;
    let mut child = tokio::process::Command::new(&limits.program)
        .arg("replay-child")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        // Its own process group, killed whole: nothing it starts outlives it.
        .process_group(0)
        .spawn()
        .map_err(|e| {
            format!(
                "the replay could not start ({}): {e}",
                limits.program.display()
            )
        })?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or("the replay has no standard input")?;
    let too_big = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pid = child.id();
    // However this ends before the child is reaped (a limit, the caller gone), the group
    // goes. (Once it is reaped its id may be another's: the guard is disarmed then.)
    let mut group = KillOnDrop(pid);
    if let Some(pid) = pid {
        let (too_big, limit) = (too_big.clone(), limits.memory_limit_bytes);
        tokio::spawn(async move {
            // Until the process is gone (its /proc entry with it).
            while let Some(rss) = resident_bytes(pid) {
                if rss > limit {
                    too_big.store(true, std::sync::atomic::Ordering::Relaxed);
                    kill(Some(pid));
                    break;
                }
                tokio::time::sleep(MEMORY_POLL).await;
            }
        });
    }
    let (Some(mut stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err("the replay has no standard output".into());
    };
    let run = async move {
        stdin
            .write_all(&body)
            .await
            .map_err(|e| format!("sending the replay its request: {e}"))?;
        drop(stdin);
        // Both pipes drained at once, each bounded: the answer up to MAX_ANSWER_BYTES, what
        // the child says on standard error only its last bytes (it could say gigabytes).
        let answer = async {
            let mut out = Vec::new();
            let read = (&mut stdout)
                .take(MAX_ANSWER_BYTES as u64 + 1)
                .read_to_end(&mut out)
                .await;
            if out.len() > MAX_ANSWER_BYTES {
                // Stopped now, not when it has written the rest (nobody reads it).
                kill(pid);
            }
            read.map(|_| out)
        };
        let said = async {
            let mut tail: Vec<u8> = Vec::new();
            let mut buf = [0u8; 8192];
            loop {
                match stderr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        tail.extend_from_slice(&buf[..n]);
                        if tail.len() > STDERR_TAIL_BYTES {
                            tail.drain(..tail.len() - STDERR_TAIL_BYTES);
                        }
                    }
                }
            }
            tail
        };
        let (answer, said) = tokio::join!(answer, said);
        let answer = answer.map_err(|e| format!("reading the replay's answer: {e}"))?;
        if answer.len() > MAX_ANSWER_BYTES {
            return Err(format!(
                "the replay's answer is larger than {} MiB",
                MAX_ANSWER_BYTES >> 20
            ));
        }
        let status = child
            .wait()
            .await
            .map_err(|e| format!("waiting for the replay: {e}"))?;
        group.disarm();
        Ok((status, answer, said))
    };
    let (status, answer, said) = match tokio::time::timeout(limits.timeout, run).await {
        Ok(out) => out?,
        // The future, and with it the child (kill_on_drop), is dropped here.
        Err(_) => {
            return Err(format!(
                "the replay took longer than {} s (http.replay_timeout_ms) and was stopped",
                limits.timeout.as_secs()
            ));
        }
    };
    if too_big.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(format!(
            "the replay used more than {} MiB of memory (http.replay_memory_limit_bytes) and was stopped",
            limits.memory_limit_bytes >> 20
        ));
    }
    if !status.success() {
        // What the child said stays in the server's log: a caller's policy could make it
        // say things about jobs the caller may not see.
        let said = String::from_utf8_lossy(&said);
        tracing::warn!(status = %status, said = %said.trim(), "a console replay failed");
        use std::os::unix::process::ExitStatusExt;
        return Err(match (status.code(), status.signal()) {
            (Some(code), _) => {
                format!("the replay failed (exit {code}); the server's log says why")
            }
            (None, Some(24)) => "the replay used up its CPU time and was stopped".to_owned(),
            (None, signal) => format!(
                "the replay was stopped by signal {}; the server's log says why",
                signal.unwrap_or_default()
            ),
        });
    }
    serde_json::from_slice(&answer).map_err(|e| format!("the replay's answer: {e}"))
}

/// The child: reads one request from standard input, limits itself, replays, writes the
/// answer to standard output. Returns the process's exit code.
pub fn child_main() -> i32 {
    let mut text = String::new();
    if let Err(e) = std::io::stdin()
        .take(MAX_REQUEST_BYTES)
        .read_to_string(&mut text)
    {
        eprintln!("replay-child: reading the request: {e}");
        return 2;
    }
    let request: ReplayRequest = match serde_json::from_str(&text) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("replay-child: the request: {e}");
            return 2;
        }
    };
    if let Err(e) = limit_self(request.cpu_limit_secs) {
        eprintln!("replay-child: limiting itself: {e}");
        return 2;
    }
    let answer = replay(&request);
    let mut out = std::io::stdout().lock();
    let written = serde_json::to_writer(&mut out, &answer)
        .map_err(std::io::Error::from)
        .and_then(|()| out.flush());
    match written {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("replay-child: writing the answer: {e}");
            1
        }
    }
}

/// Kills the child `pid`'s process group (a replay past a limit, or done with).
fn kill(pid: Option<u32>) {
    if let Some(pid) = pid
        .and_then(|p| i32::try_from(p).ok())
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// Kills a child's process group when dropped.
struct KillOnDrop(Option<u32>);

impl KillOnDrop {
    /// The child was reaped: its id may be another's now.
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        kill(self.0);
    }
}

/// How often the console looks at a child's resident memory.
const MEMORY_POLL: Duration = Duration::from_millis(50);

/// A process's resident memory, from `/proc/<pid>/statm`; None once it is gone.
fn resident_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages.saturating_mul(rustix::param::page_size() as u64))
}

/// Lowers the priority and caps the CPU time of this process.
fn limit_self(cpu_secs: u64) -> std::io::Result<()> {
    use rustix::process::{Resource, Rlimit, setpriority_process, setrlimit};
    let cap = |n: u64| Rlimit {
        current: Some(n),
        maximum: Some(n),
    };
    setrlimit(Resource::Cpu, cap(cpu_secs.max(1)))?;
    // Best effort: a niceness the process may not set is no reason to refuse the replay.
    let _ = setpriority_process(None, CHILD_NICENESS);
    Ok(())
}

/// The replay itself, in this process.
pub fn replay(request: &ReplayRequest) -> ReplayAnswer {
    let mut client = ClientConfig::new();
    for (k, v) in &request.kafka {
        client.set(k, v);
    }
    let src = Source {
        client,
        topic: request.topic.clone(),
        partition: request.partition,
    };
    let visible = |tenant: &str| {
        request
            .visible_tenants
            .as_ref()
            .is_none_or(|t| t.contains(tenant))
    };
    let answer = match &request.task {
        ReplayTask::At { time_ms, max_jobs } => at(&src, *time_ms, *max_jobs, &visible),
        ReplayTask::WhatIf {
            pools_yaml,
            policy_rego,
            paused_schedules,
            max_rows,
        } => diff(
            &src,
            pools_yaml.as_deref(),
            policy_rego.as_deref(),
            paused_schedules,
            *max_rows,
            &visible,
            request.visible_tenants.is_some(),
        ),
    };
    answer.unwrap_or_else(ReplayAnswer::Failed)
}

fn at(
    src: &Source,
    time_ms: i64,
    max_jobs: usize,
    visible: &dyn Fn(&str) -> bool,
) -> Result<ReplayAnswer, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (store, last) =
        replay_until(src, dir.path(), Until::Time(time_ms)).map_err(|e| e.to_string())?;
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut jobs = Vec::new();
    for (id, j) in store.jobs().map_err(|e| e.to_string())? {
        if !visible(&j.request.tenant_id) {
            continue;
        }
        *counts.entry(j.state.as_str().to_owned()).or_default() += 1;
        if jobs.len() < max_jobs {
            jobs.push((id, j));
        }
    }
    let workers = store.workers().map_err(|e| e.to_string())?;
    Ok(ReplayAnswer::At {
        last,
        counts,
        jobs,
        workers,
    })
}

fn diff(
    src: &Source,
    pools_yaml: Option<&str>,
    policy_rego: Option<&str>,
    paused_schedules: &[PausedSchedule],
    max_rows: usize,
    visible: &dyn Fn(&str) -> bool,
    scoped: bool,
) -> Result<ReplayAnswer, String> {
    // Another tenant's schedule is refused whether or not it exists.
    if let Some(p) = paused_schedules.iter().find(|p| !visible(&p.tenant_id)) {
        return Err(format!(
            "schedules of tenant {} are not yours to pause",
            p.tenant_id
        ));
    }
    let pools = pools_yaml
        .map(crate::settings::parse_pools)
        .transpose()
        .map_err(|e| format!("pools.yaml: {e}"))?;
    let policy = match policy_rego {
        None => None,
        Some(text) => {
            let bundle = PolicyBundle {
                modules: BTreeMap::from([("input.rego".to_owned(), text.to_owned())]),
                data_json: "{}".into(),
            };
            ksched_policy::compile(&bundle).map_err(|e| format!("policy: {e}"))?;
            Some(bundle)
        }
    };
    let engine = RegoEngine::new();
    let report = what_if(
        src,
        &Alternative {
            pools,
            policy,
            paused_schedules: paused_schedules.to_vec(),
        },
        &engine,
        visible,
        scoped,
        |_| {},
    )
    .map_err(|e| e.to_string())?;
    Ok(ReplayAnswer::WhatIf {
        jobs: report.jobs,
        schedules_not_found: report.schedules_not_found.clone(),
        differing: report.rows.len(),
        rows: report
            .rows
            .iter()
            .take(max_rows)
            .map(|r| DiffRow {
                job_id: r.job_id.clone(),
                tenant_id: r.tenant_id.clone(),
                topic: r.topic.clone(),
                differs_in: r.differs_in.iter().map(|d| (*d).to_owned()).collect(),
                actual: (&r.actual).into(),
                alternative: (&r.alternative).into(),
            })
            .collect(),
        totals: report
            .totals
            .iter()
            .map(|(k, n)| ((*k).to_owned(), *n))
            .collect(),
        waits: report.waits.clone(),
    })
}

/// The journal reader's properties, for a child's request.
pub fn client_properties(client: &ClientConfig) -> BTreeMap<String, String> {
    client
        .config_map()
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for the child: a script that ignores the request and does `body`.
    fn child(dir: &std::path::Path, body: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("child.sh");
        std::fs::write(&path, format!("#!/bin/sh\ncat >/dev/null\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn request() -> ReplayRequest {
        ReplayRequest {
            kafka: BTreeMap::new(),
            topic: "t".into(),
            partition: 0,
            visible_tenants: None,
            memory_limit_bytes: 0,
            cpu_limit_secs: 0,
            task: ReplayTask::At {
                time_ms: 0,
                max_jobs: 1,
            },
        }
    }

    /// A tenant-scoped caller may pause its own tenants' schedules only; another tenant's is
    /// refused before the journal is read, whether it exists or not.
    #[test]
    fn a_scoped_what_if_may_not_pause_another_tenants_schedule() {
        let mut r = request();
        r.visible_tenants = Some(["acme".to_owned()].into());
        r.task = ReplayTask::WhatIf {
            pools_yaml: None,
            policy_rego: None,
            paused_schedules: vec![
                PausedSchedule::parse("acme:nightly", None).unwrap(),
                PausedSchedule::parse("globex:nightly", None).unwrap(),
            ],
            max_rows: 10,
        };
        match replay(&r) {
            ReplayAnswer::Failed(e) => assert!(e.contains("tenant globex"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_child_that_grows_past_its_memory_limit_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let limits = ChildLimits {
            program: child(
                dir.path(),
                "exec python3 -c 'x = bytearray(700 * 1024 * 1024); import time; time.sleep(60)'",
            ),
            memory_limit_bytes: 256 << 20,
            timeout: Duration::from_secs(60),
        };
        let started = std::time::Instant::now();
        let e = replay_in_child(&limits, request()).await.unwrap_err();
        assert!(e.contains("more than 256 MiB"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(30));
    }

    #[tokio::test]
    async fn a_child_past_its_deadline_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let limits = ChildLimits {
            program: child(dir.path(), "sleep 60"),
            memory_limit_bytes: 256 << 20,
            timeout: Duration::from_millis(500),
        };
        let started = std::time::Instant::now();
        let e = replay_in_child(&limits, request()).await.unwrap_err();
        assert!(e.contains("took longer than"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn a_child_that_answers_nonsense_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let limits = ChildLimits {
            program: child(dir.path(), "echo 'not json'"),
            memory_limit_bytes: 256 << 20,
            timeout: Duration::from_secs(10),
        };
        let e = replay_in_child(&limits, request()).await.unwrap_err();
        assert!(e.contains("the replay's answer"), "{e}");
    }

    /// A child that floods its standard output or error costs the console bounded memory,
    /// and what it says on standard error never reaches the caller.
    #[tokio::test]
    async fn a_child_that_floods_its_pipes_is_bounded_and_not_relayed() {
        let dir = tempfile::tempdir().unwrap();
        let limits = ChildLimits {
            program: child(dir.path(), "head -c 200000000 /dev/zero"),
            memory_limit_bytes: 4 << 30,
            timeout: Duration::from_secs(60),
        };
        let e = replay_in_child(&limits, request()).await.unwrap_err();
        assert!(e.contains("larger than 64 MiB"), "{e}");
        let limits = ChildLimits {
            program: child(
                dir.path(),
                "head -c 200000000 /dev/zero >&2; echo 'globex:secret-job' >&2; exit 3",
            ),
            memory_limit_bytes: 4 << 30,
            timeout: Duration::from_secs(60),
        };
        let e = replay_in_child(&limits, request()).await.unwrap_err();
        assert!(e.contains("exit 3") && !e.contains("globex"), "{e}");
    }
}
