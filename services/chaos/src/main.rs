//! `ksched-chaos`: the fault suite (docs/reliability.md), outside the product binary. Against
//! real brokers started on its own ports by `deploy/kafka.sh`, with `ksched run` as a child
//! process, two SDK workers and
//! the Python worker, and a steady load of jobs, it injects one fault at a time mid-run:
//!
//! - `kill`: SIGKILL of `ksched run` every 2-5 s, restarted at once (worker TTL 5 s);
//! - `broker-restart`: the broker stopped and started again while workers keep
//!   heartbeating into their producers' queues;
//! - `broker-kill`: one node of a 3-node KRaft cluster SIGKILLed mid-run (journal RF 3,
//!   min.insync.replicas 2) and started again later;
//! - `network`: between ksched and the broker, through toxiproxy: 300 ms latency, reset
//!   connections, a blackhole;
//! - `two-instances`: a second `ksched run` on the same configuration: it stands by, then the
//!   first is SIGKILLed and it takes over;
//! - `disk-full`: the disk of RocksDB fills up (a small tmpfs), then space returns;
//! - `poison`: 1 % poison records of every kind in the stream.
//!
//! For each: jobs lost, attempts dispatched twice, workers falsely declared lost, jobs stuck
//! (none allowed), and how long the scheduler took to decide again. The table goes to the
//! terminal, to JSON, and (`--update-docs`) into docs/reliability.md.

mod infra;
mod observe;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use clap::{Parser, ValueEnum};
use infra::{Cluster, Ksched, PyWorker, Toxiproxy, free_port, tail};
use ksched_core::events::JobState;
use ksched_core::records::{Dispatch, Heartbeat, JobRequest};
use observe::{JournalWatch, Load, LoadDeliveries, LoadProducer, SdkWorkers, now_ms};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::BaseRecord;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;
use serde_json::json;

/// The fault suite: kill, broker restarts and node loss, network faults, a second instance,
/// a full disk, poison records, each under load, with a verdict per fault
/// (docs/reliability.md). Starts its own brokers; run from the repository
/// (`bash scripts/chaos.sh`).
#[derive(Debug, Parser)]
#[command(name = "ksched-chaos", version, about, long_about = None)]
pub(crate) struct ChaosArgs {
    /// Seconds-long versions of every fault (what CI runs).
    #[arg(long)]
    pub short: bool,
    /// Faults to run, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub faults: Vec<Fault>,
    /// The repository (deploy/kafka.sh, examples/python-worker, docs/).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// Write the results as JSON here.
    #[arg(long, default_value = "chaos-results.json")]
    pub out: PathBuf,
    /// Write the results table into docs/reliability.md.
    #[arg(long)]
    pub update_docs: bool,
    /// First port of the suite's brokers; it uses this one and up to 40 above.
    #[arg(long, default_value_t = 29092)]
    pub port: u16,
    /// Leave the brokers running and the scratch directory (logs, configs) in place, to look
    /// into a failure.
    #[arg(long)]
    pub keep: bool,
    /// The `ksched` binary under test (default: the one beside this binary, as cargo builds
    /// them).
    #[arg(long)]
    pub ksched: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub(crate) enum Fault {
    Kill,
    BrokerRestart,
    BrokerKill,
    Network,
    TwoInstances,
    DiskFull,
    Poison,
}

impl Fault {
    const ALL: [Fault; 7] = [
        Fault::Kill,
        Fault::BrokerRestart,
        Fault::BrokerKill,
        Fault::Network,
        Fault::TwoInstances,
        Fault::DiskFull,
        Fault::Poison,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::BrokerRestart => "broker-restart",
            Fault::BrokerKill => "broker-kill",
            Fault::Network => "network",
            Fault::TwoInstances => "two-instances",
            Fault::DiskFull => "disk-full",
            Fault::Poison => "poison",
        }
    }
}

/// One fault's outcome.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Verdict {
    pub fault: String,
    pub what: String,
    pub jobs: usize,
    pub lost: usize,
    pub dispatched_twice: usize,
    pub false_worker_lost: usize,
    pub stuck: usize,
    /// Seconds from the end of the fault to the next decision that moved a job (the worst,
    /// when the fault repeats).
    pub recover_seconds: Option<f64>,
    /// Seconds from the end of the load to every job terminal.
    pub drain_seconds: f64,
    pub notes: Vec<String>,
    pub passed: bool,
    pub skipped: bool,
}

impl Verdict {
    /// The verdict of a fault that did not run to its end: failed, or `skipped`, for `why`.
    fn without_a_run(fault: &str, why: String, skipped: bool) -> Verdict {
        Verdict {
            fault: fault.into(),
            what: String::new(),
            jobs: 0,
            lost: 0,
            dispatched_twice: 0,
            false_worker_lost: 0,
            stuck: 0,
            recover_seconds: None,
            drain_seconds: 0.0,
            notes: vec![why],
            passed: false,
            skipped,
        }
    }
}

/// The suite's shared parts: the repository, a scratch directory, an async runtime for the
/// SDK workers, the Python interpreter if it is there.
struct Env {
    repo: PathBuf,
    /// The `ksched` binary each scenario runs.
    ksched: PathBuf,
    work: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    python: Option<String>,
    short: bool,
    /// `--keep`: brokers and scratch directory stay for a look into a failure.
    keep: bool,
    port: u16,
    kafka_home: PathBuf,
}

impl Env {
    fn seconds(&self, full: u64, short: u64) -> Duration {
        Duration::from_secs(if self.short { short } else { full })
    }
}

fn main() -> ExitCode {
    let args = ChaosArgs::parse();
    match suite(&args) {
        Ok(verdicts) => {
            if verdicts.iter().all(|v| v.passed || v.skipped) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("ksched-chaos: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn suite(args: &ChaosArgs) -> Result<Vec<Verdict>> {
    let repo = args
        .repo
        .canonicalize()
        .context("--repo: the ksched repository")?;
    ensure!(
        repo.join("deploy/kafka.sh").exists(),
        "{} is not the ksched repository (no deploy/kafka.sh); pass --repo",
        repo.display()
    );
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let ksched = match &args.ksched {
        Some(path) => path.clone(),
        None => std::env::current_exe()?.with_file_name("ksched"),
    };
    ensure!(
        ksched.is_file(),
        "no ksched binary at {} (`cargo build -p ksched` builds it; or pass --ksched)",
        ksched.display()
    );
    let env = Env {
        repo,
        ksched,
        work: tempfile::Builder::new().prefix("ksched-chaos-").tempdir()?,
        rt: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?,
        python: PyWorker::python(),
        short: args.short,
        keep: args.keep,
        port: args.port,
        // The jars are shared with the development broker; data dirs are per port.
        kafka_home: std::env::var_os("KSCHED_KAFKA_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join(".cache/ksched/kafka")),
    };
    if env.python.is_none() {
        eprintln!(
            "chaos: no Python with confluent-kafka and fastavro: the Python worker is left out"
        );
    }
    let faults: Vec<Fault> = if args.faults.is_empty() {
        Fault::ALL.to_vec()
    } else {
        args.faults.clone()
    };
    let mut verdicts = Vec::new();
    for f in faults {
        eprintln!("chaos: {}", f.name());
        let started = Instant::now();
        let mut v = match run_fault(&env, f) {
            Ok(v) => v,
            Err(e) => Verdict::without_a_run(f.name(), format!("the run failed: {e:#}"), false),
        };
        if !v.passed && !v.skipped && !args.keep {
            // The logs and configs of a failed fault outlive the run.
            let kept =
                std::env::temp_dir().join(format!("ksched-chaos-failed-{}-{}", f.name(), now_ms()));
            if std::fs::rename(env.work.path().join(f.name()), &kept).is_ok() {
                v.notes.push(format!("logs in {}", kept.display()));
            }
        }
        eprintln!(
            "chaos: {} {} in {:.0} s: {} jobs, {} lost, {} dispatched twice, {} false worker loss, {} stuck, recovered in {}{}",
            v.fault,
            if v.skipped {
                "SKIPPED"
            } else if v.passed {
                "passed"
            } else {
                "FAILED"
            },
            started.elapsed().as_secs_f64(),
            v.jobs,
            v.lost,
            v.dispatched_twice,
            v.false_worker_lost,
            v.stuck,
            v.recover_seconds
                .map_or("-".into(), |s| format!("{s:.1} s")),
            if v.notes.is_empty() {
                String::new()
            } else {
                format!(" ({})", v.notes.join("; "))
            }
        );
        verdicts.push(v);
    }
    let table = table(&verdicts, args.short);
    println!("{table}");
    std::fs::write(
        &args.out,
        serde_json::to_string_pretty(&json!({
            "short": args.short,
            "machine": machine(),
            "verdicts": verdicts,
        }))?,
    )?;
    if args.update_docs {
        update_docs(&env.repo.join("docs/reliability.md"), &table)?;
    }
    if args.keep {
        let kept = env.work.keep();
        eprintln!(
            "chaos: kept {} and the brokers (single node on {}, cluster on {})",
            kept.display(),
            args.port,
            args.port + 10
        );
    } else {
        for cluster in [single(&env), triple(&env)] {
            let _ = cluster.reset();
        }
    }
    Ok(verdicts)
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cpus} cores, brokers and ksched on the same machine")
}

fn table(verdicts: &[Verdict], short: bool) -> String {
    let mut t = format!(
        "Run: `ksched-chaos{}` on {}.\n\n| fault | what was done | jobs | lost | dispatched twice | false worker loss | stuck | decisions again after | all jobs done after the load | result |\n|---|---|---|---|---|---|---|---|---|---|\n",
        if short { " --short" } else { "" },
        machine()
    );
    for v in verdicts {
        let result = if v.skipped {
            format!("skipped: {}", v.notes.join("; "))
        } else if v.passed {
            if v.notes.is_empty() {
                "passed".into()
            } else {
                format!("passed ({})", v.notes.join("; "))
            }
        } else {
            format!("FAILED: {}", v.notes.join("; "))
        };
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} s | {} |\n",
            v.fault,
            v.what,
            v.jobs,
            v.lost,
            v.dispatched_twice,
            v.false_worker_lost,
            v.stuck,
            v.recover_seconds
                .map_or("-".into(), |s| format!("{s:.1} s")),
            v.drain_seconds,
            result.replace('|', "/")
        ));
    }
    t
}

const BEGIN: &str = "<!-- chaos-results:begin -->";
const END: &str = "<!-- chaos-results:end -->";

fn update_docs(path: &Path, table: &str) -> Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let (Some(b), Some(e)) = (text.find(BEGIN), text.find(END)) else {
        anyhow::bail!("{} has no {BEGIN} ... {END} markers", path.display());
    };
    let updated = format!("{}{BEGIN}\n{table}{}", &text[..b], &text[e..]);
    std::fs::write(path, updated)?;
    Ok(())
}

/// The single-node broker the suite uses, with a listener behind toxiproxy.
fn single(env: &Env) -> Cluster {
    Cluster::new(&env.repo, &env.kafka_home, env.port, 1, Some(env.port + 3))
}

/// The 3-node cluster.
fn triple(env: &Env) -> Cluster {
    Cluster::new(&env.repo, &env.kafka_home, env.port + 10, 3, None)
}

fn run_fault(env: &Env, f: Fault) -> Result<Verdict> {
    match f {
        Fault::Kill => kill(env),
        Fault::BrokerRestart => broker_restart(env),
        Fault::BrokerKill => broker_kill(env),
        Fault::Network => network(env),
        Fault::TwoInstances => two_instances(env),
        Fault::DiskFull => disk_full(env),
        Fault::Poison => poison(env),
    }
}

/// One fault's run: topics under their own prefix, a config file, the watch on the journal.
struct Scenario {
    name: &'static str,
    ksched: PathBuf,
    dir: PathBuf,
    prefix: String,
    job_topic: String,
    config: PathBuf,
    direct: String,
    watch: JournalWatch,
    heals: Vec<i64>,
    notes: Vec<String>,
    /// Jobs the load's producer never got to the broker (the run is then not conclusive).
    undelivered: usize,
    /// Dead letters the run must have written, at least, by reason.
    expect_dead_letters: BTreeMap<String, u64>,
    /// Recovery measured to the first Tick of this ticker (an instance that took over), from
    /// this time, instead of to the first decision after each heal.
    recover_by_ticker: Option<(String, i64)>,
}

impl Scenario {
    /// `ksched_bootstrap`: how ksched reaches the brokers (through the proxy, or directly).
    fn new(
        env: &Env,
        name: &'static str,
        cluster: &Cluster,
        ksched_bootstrap: &str,
        data_dir: Option<PathBuf>,
    ) -> Result<Scenario> {
        let dir = env.work.path().join(name);
        std::fs::create_dir_all(dir.join("policy"))?;
        let prefix = format!(
            "chaos-{name}-{}.",
            &uuid::Uuid::new_v4().simple().to_string()[..6]
        );
        let job_topic = format!("{prefix}jobs");
        std::fs::write(
            dir.join("policy/input.rego"),
            "package ksched.input\ndefault allow := true\n",
        )?;
        std::fs::write(
            dir.join("pools.yaml"),
            format!("topics:\n  {job_topic}: default\npools:\n  default: {{}}\n"),
        )?;
        // A store on a disk of its own (a small tmpfs, to fill up): no reserve, so the disk
        // fills and ksched's stop on a full disk is what is tried.
        let reserve = if data_dir.is_some() { 0 } else { 1 << 30 };
        let data_dir = data_dir.unwrap_or_else(|| dir.join("data"));
        let config = dir.join("ksched.yaml");
        std::fs::write(
            &config,
            format!(
                "kafka:\n  bootstrap_servers: {ksched_bootstrap}\n  client_id: chaos-{name}\n\
                 topics:\n  prefix: {prefix}\n  replication_factor: {rf}\n  dispatch_partitions: 8\n  job_partitions: 4\n  results_partitions: 4\n\
                 processor:\n  group_id: {prefix}processor\n  tick_interval_ms: 250\n  commit_interval_ms: 10\n  transaction_timeout_ms: 20000\n  shutdown_grace_ms: 5000\n\
                 scheduler:\n  timing:\n    worker_ttl_ms: 5000\n    clock_gap_ms: 2000\n  overload:\n    cpu_load: 1000\n  retry:\n    initial_backoff_ms: 200\n    max_backoff_ms: 2000\n\
                 storage:\n  data_dir: {}\n  min_free_disk_bytes: {reserve}\n\
                 log:\n  level: info\n\
                 pools_file: pools.yaml\npolicy_dir: policy\n",
                data_dir.display(),
                rf = if cluster.brokers >= 3 { 3 } else { 1 },
            ),
        )?;
        let direct = cluster.direct();
        let watch = JournalWatch::start(&direct, &format!("{prefix}journal"))?;
        Ok(Scenario {
            name,
            ksched: env.ksched.clone(),
            dir,
            prefix,
            job_topic,
            config,
            direct,
            watch,
            heals: Vec::new(),
            notes: Vec::new(),
            undelivered: 0,
            expect_dead_letters: BTreeMap::new(),
            recover_by_ticker: None,
        })
    }

    fn ksched(&self, n: usize) -> Result<Ksched> {
        Ksched::spawn(
            &self.ksched,
            &self.config,
            &self.dir.join(format!("ksched-{n}.log")),
            free_port()?,
        )
    }

    /// Two SDK workers and the Python worker, once ksched created the topics.
    fn workers(&self, env: &Env) -> Result<(SdkWorkers, Option<PyWorker>)> {
        let sdk = SdkWorkers::start(
            &env.rt,
            &self.direct,
            &self.prefix,
            &["sdk-1".to_owned(), "sdk-2".to_owned()],
        )?;
        let py = match &env.python {
            Some(p) => Some(PyWorker::spawn(
                p,
                &env.repo,
                &self.direct,
                &self.prefix,
                "py-1",
                &self.dir.join("py-1.log"),
            )?),
            None => None,
        };
        Ok((sdk, py))
    }

    fn load(&self, rate: f64) -> Result<Load> {
        Load::start(&self.direct, &self.job_topic, &self.prefix, rate, |_, _| {})
    }

    /// `ksched run` ready, then the workers.
    fn ready(&self, env: &Env) -> Result<(Ksched, SdkWorkers, Option<PyWorker>)> {
        let mut k = self.ksched(0)?;
        k.wait_ready(Duration::from_secs(120))?;
        let (sdk, py) = self.workers(env)?;
        Ok((k, sdk, py))
    }

    /// [`Scenario::ready`], then the steady load for a few seconds before a fault.
    fn under_load(&self, env: &Env) -> Result<(Ksched, SdkWorkers, Option<PyWorker>, Load)> {
        let (k, sdk, py) = self.ready(env)?;
        let load = self.load(rate(env))?;
        std::thread::sleep(Duration::from_secs(5));
        Ok((k, sdk, py, load))
    }

    /// The jobs the load got to the broker, to judge the run on; the rest are noted, and
    /// fail the run (it says nothing about them).
    fn submitted(&mut self, (ids, delivered): (Vec<String>, observe::Delivered)) -> Vec<String> {
        if let Some(note) = delivered.note() {
            self.notes.push(note);
        }
        self.undelivered = delivered.undelivered.len();
        ids.into_iter()
            .filter(|id| !delivered.undelivered.contains(id))
            .collect()
    }

    /// Waits until every job is terminal (or `limit`), then judges the run.
    fn verdict(
        mut self,
        env: &Env,
        what: String,
        ids: &[String],
        sdk: SdkWorkers,
        py: Option<PyWorker>,
        limit: Duration,
    ) -> Result<Verdict> {
        let load_ended = Instant::now();
        loop {
            let done = self
                .watch
                .with(|s| ids.iter().all(|id| s.terminal.contains_key(id)));
            if done || load_ended.elapsed() > limit {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let drain = load_ended.elapsed().as_secs_f64();
        // Workers stopped from here on are lost for real once their TTL passes.
        let workers_stopped_at = now_ms();
        let runs = sdk.runs.lock().map(|r| r.clone()).unwrap_or_default();
        let errors = sdk.stop(&env.rt);
        let workers_failed = !errors.is_empty();
        if workers_failed {
            self.notes
                .push(format!("SDK worker errors: {}", errors.join("; ")));
        }
        if let Some(mut py) = py
            && !py.alive()
        {
            self.notes.push("the Python worker died".into());
        }
        // Give the journal reader a moment to see the last commits.
        std::thread::sleep(Duration::from_millis(500));
        let twice_on_topic =
            dispatched_twice_on_topic(&self.direct, &format!("{}dispatch.default", self.prefix))?;
        let v = self.watch.with(|s| {
            let lost = ids.iter().filter(|id| !s.accepted.contains(*id)).count();
            let stuck = ids
                .iter()
                .filter(|id| s.accepted.contains(*id) && !s.terminal.contains_key(*id))
                .count();
            let ended_twice = s.terminal.values().filter(|t| t.len() > 1).count();
            let not_succeeded: Vec<&String> = ids
                .iter()
                .filter(|id| {
                    s.terminal
                        .get(*id)
                        .is_some_and(|t| t.first() != Some(&JobState::Succeeded))
                })
                .collect();
            let twice_in_journal = s.dispatched.values().filter(|n| **n > 1).count();
            let by_ticker = self.recover_by_ticker.as_ref().map(|(source, from)| {
                s.tick_sources
                    .get(source)
                    .map(|first| (first - from) as f64 / 1000.0)
            });
            let recover = match by_ticker {
                Some(r) => r,
                None => self
                    .heals
                    .iter()
                    .map(|h| {
                        s.decisions
                            .iter()
                            .find(|t| **t >= *h)
                            .map(|t| (t - h) as f64 / 1000.0)
                    })
                    .collect::<Option<Vec<f64>>>()
                    .and_then(|v| v.into_iter().reduce(f64::max)),
            };
            let mut notes = std::mem::take(&mut self.notes);
            if ended_twice > 0 {
                notes.push(format!("{ended_twice} jobs ended twice"));
            }
            if !not_succeeded.is_empty() {
                // How they ended, most common first: the reason is the lead to the bug.
                let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
                for id in &not_succeeded {
                    *reasons
                        .entry(s.why.get(*id).map_or("cancelled or denied", String::as_str))
                        .or_default() += 1;
                }
                let mut reasons: Vec<(&str, usize)> = reasons.into_iter().collect();
                reasons.sort_by_key(|r| std::cmp::Reverse(r.1));
                let reasons: Vec<String> = reasons
                    .iter()
                    .take(5)
                    .map(|(why, n)| format!("{n}: {why}"))
                    .collect();
                notes.push(format!(
                    "{} jobs did not succeed (first: {}; {})",
                    not_succeeded.len(),
                    not_succeeded[0],
                    reasons.join("; ")
                ));
            }
            if s.clock_gaps > 0 {
                notes.push(format!("{} clock gaps", s.clock_gaps));
            }
            if s.reader_replaced > 0 {
                notes.push(format!(
                    "the journal reader replaced its stalled consumer {} times",
                    s.reader_replaced
                ));
            }
            if let Some(e) = &s.last_read_error {
                notes.push(format!(
                    "the journal reader saw {} errors (last: {e})",
                    s.read_errors
                ));
            }
            let reruns = runs.values().filter(|n| **n > 1).count();
            if reruns > 0 {
                notes.push(format!("{reruns} jobs run twice by SDK workers"));
            }
            let missing: Vec<String> = self
                .expect_dead_letters
                .iter()
                .filter(|(reason, n)| s.dead_letters.get(*reason).copied().unwrap_or(0) < **n)
                .map(|(reason, n)| {
                    format!(
                        "{} of {n} {reason} dead letters",
                        s.dead_letters.get(reason).copied().unwrap_or(0)
                    )
                })
                .collect();
            if !missing.is_empty() {
                notes.push(format!("missing: {}", missing.join(", ")));
            } else if !self.expect_dead_letters.is_empty() {
                let got: Vec<String> = s
                    .dead_letters
                    .iter()
                    .map(|(r, n)| format!("{n} {r}"))
                    .collect();
                notes.push(format!("dead-lettered: {}", got.join(", ")));
            }
            let dispatched_twice = twice_in_journal + twice_on_topic;
            let false_worker_lost = s
                .workers_lost
                .iter()
                .filter(|(_, at)| *at < workers_stopped_at)
                .count();
            let passed = missing.is_empty()
                && self.undelivered == 0
                && !workers_failed
                && lost == 0
                && stuck == 0
                && dispatched_twice == 0
                && false_worker_lost == 0
                && ended_twice == 0
                && not_succeeded.is_empty()
                && self.heals.is_empty() == recover.is_none();
            Verdict {
                fault: self.name.into(),
                what,
                jobs: ids.len(),
                lost,
                dispatched_twice,
                false_worker_lost,
                stuck,
                recover_seconds: recover,
                drain_seconds: drain,
                notes,
                passed,
                skipped: false,
            }
        });
        Ok(v)
    }
}

/// Attempts dispatched more than once on the dispatch topic (read_committed).
fn dispatched_twice_on_topic(bootstrap: &str, topic: &str) -> Result<usize> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("{topic}-chaos-check"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(30))?;
    let partitions = md
        .topics()
        .first()
        .map_or(0, |t| t.partitions().len() as i32);
    let mut seen: BTreeMap<(String, i32), u32> = BTreeMap::new();
    for p in 0..partitions {
        let (_, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(30))?;
        if high == 0 {
            continue;
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        consumer.assign(&tpl)?;
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            match consumer.poll(Duration::from_millis(500)) {
                Some(Ok(m)) => {
                    if let Some(Ok(d)) = m.payload().map(ksched_codec::decode::<Dispatch>) {
                        *seen.entry((d.job.job_id, d.attempt)).or_default() += 1;
                    }
                    if m.offset() >= high - 1 {
                        break;
                    }
                }
                _ => {
                    let pos = consumer
                        .position()
                        .ok()
                        .and_then(|t| t.elements().first().map(|e| e.offset()));
                    if matches!(pos, Some(Offset::Offset(o)) if o >= high - 1)
                        || Instant::now() > until
                    {
                        break;
                    }
                }
            }
        }
    }
    Ok(seen.values().filter(|n| **n > 1).count())
}

fn rate(env: &Env) -> f64 {
    if env.short { 30.0 } else { 50.0 }
}

/// SIGKILL every 2-5 s, restarted at once, as a restart policy would.
fn kill(env: &Env) -> Result<Verdict> {
    let cluster = single(env);
    cluster.fresh()?;
    let mut s = Scenario::new(env, "kill", &cluster, &cluster.direct(), None)?;
    let (mut k, sdk, py) = s.ready(env)?;
    let mut load = s.load(rate(env))?;
    let kills = if env.short { 3 } else { 20 };
    let mut rng = ksched_core::hash::fnv1a64(&[s.prefix.as_bytes()]);
    for n in 1..=kills {
        rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        std::thread::sleep(Duration::from_millis(2_000 + (rng >> 33) % 3_000));
        k.kill();
        s.heals.push(now_ms());
        k = s.ksched(n)?;
    }
    std::thread::sleep(env.seconds(10, 5));
    let ids = s.submitted(load.finish());
    k.wait_ready(Duration::from_secs(120))?;
    let what = format!(
        "SIGKILL of ksched run every 2-5 s, {kills} times, restarted at once; worker TTL 5 s; {:.0} jobs/s",
        rate(env)
    );
    let v = s.verdict(env, what, &ids, sdk, py, Duration::from_secs(180));
    k.stop(Duration::from_secs(10));
    v
}

/// The broker stopped and started again.
fn broker_restart(env: &Env) -> Result<Verdict> {
    let cluster = single(env);
    cluster.fresh()?;
    let mut s = Scenario::new(env, "broker-restart", &cluster, &cluster.direct(), None)?;
    let (mut k, sdk, py, mut load) = s.under_load(env)?;
    let down = env.seconds(60, 15);
    cluster.stop()?;
    std::thread::sleep(down);
    cluster.start()?;
    s.heals.push(now_ms());
    std::thread::sleep(env.seconds(15, 8));
    let ids = s.submitted(load.finish());
    let what = format!(
        "broker stopped for {} s and started again; workers keep heartbeating into their producers' queues",
        down.as_secs()
    );
    let (dir, direct, prefix) = (s.dir.clone(), s.direct.clone(), s.prefix.clone());
    let mut v = s.verdict(env, what, &ids, sdk, py, Duration::from_secs(180))?;
    if let Some(status) = k.exited() {
        anyhow::bail!("ksched run exited ({status}):\n{}", tail(&k.log, 20));
    }
    explain(&mut v, &dir, &direct, &prefix, &k);
    k.stop(Duration::from_secs(10));
    Ok(v)
}

/// Each node of three SIGKILLed in turn, each started again before the next.
fn broker_kill(env: &Env) -> Result<Verdict> {
    let cluster = triple(env);
    cluster.fresh()?;
    let mut s = Scenario::new(env, "broker-kill", &cluster, &cluster.direct(), None)?;
    let (mut k, sdk, py, mut load) = s.under_load(env)?;
    // Every node in turn: one of them leads the journal, one coordinates the processor's
    // group, one its transactions.
    let down = env.seconds(30, 15);
    for node in 1..=3 {
        cluster.kill_node(node)?;
        s.heals.push(now_ms());
        std::thread::sleep(down);
        cluster.start_node(node)?;
        std::thread::sleep(env.seconds(10, 5));
    }
    let ids = s.submitted(load.finish());
    let what = format!(
        "3-node KRaft cluster, journal RF 3 / min.insync.replicas 2; each node in turn SIGKILLed, started again {} s later",
        down.as_secs()
    );
    let (dir, direct, prefix) = (s.dir.clone(), s.direct.clone(), s.prefix.clone());
    let mut v = s.verdict(env, what, &ids, sdk, py, Duration::from_secs(180))?;
    explain(&mut v, &dir, &direct, &prefix, &k);
    k.stop(Duration::from_secs(10));
    if !env.keep {
        let _ = cluster.reset();
    }
    Ok(v)
}

/// What a failed run looked like from outside, for its notes: ksched's readiness (how far
/// it applied the journal, when it last judged a Tick), and each journal and dispatch
/// partition whose last stable offset (what read_committed readers may read up to) lags its
/// high watermark: a transaction left open there holds every such reader back.
fn explain(v: &mut Verdict, dir: &Path, direct: &str, prefix: &str, k: &Ksched) {
    if v.passed {
        return;
    }
    if let Some((code, body)) = k.ready() {
        v.notes.push(format!("ksched ready {code}: {body}"));
        // Not judging Ticks: where is it stuck? Every thread's stack, when gdb is there.
        if body["ms_since_last_tick"]
            .as_i64()
            .is_none_or(|ms| ms > 30_000)
        {
            let stacks = dir.join("ksched-stacks.txt");
            let dumped = std::process::Command::new("gdb")
                .args([
                    "-p",
                    &k.child.id().to_string(),
                    "-batch",
                    "-ex",
                    "thread apply all bt 40",
                ])
                .output();
            if let Ok(out) = dumped
                && std::fs::write(&stacks, &out.stdout).is_ok()
            {
                v.notes
                    .push(format!("stacks of ksched run in {}", stacks.display()));
            }
        }
    }
    let stable = |isolation: &str| -> Option<BaseConsumer> {
        ClientConfig::new()
            .set("bootstrap.servers", direct)
            .set("group.id", format!("{prefix}explain"))
            .set("isolation.level", isolation)
            .create()
            .ok()
    };
    let (Some(uncommitted), Some(committed)) =
        (stable("read_uncommitted"), stable("read_committed"))
    else {
        return;
    };
    let timeout = Duration::from_secs(10);
    // A transaction is open for a few ms of every batch: a last stable offset below the high
    // watermark means a transaction left open only if it has not moved a moment later.
    let lso = |topic: &str, p: i32| committed.fetch_watermarks(topic, p, timeout).map(|w| w.1);
    let topics = [
        format!("{prefix}journal"),
        format!("{prefix}dispatch.default"),
    ];
    let partitions = |topic: &str| -> Vec<i32> {
        uncommitted
            .fetch_metadata(Some(topic), timeout)
            .map(|meta| {
                meta.topics()
                    .iter()
                    .flat_map(|t| t.partitions().iter().map(|p| p.id()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut first_look: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for topic in &topics {
        for p in partitions(topic) {
            if let Ok(l) = lso(topic, p) {
                first_look.insert((topic.clone(), p), l);
            }
        }
    }
    std::thread::sleep(Duration::from_secs(3));
    for topic in &topics {
        for p in partitions(topic) {
            let high = uncommitted.fetch_watermarks(topic, p, timeout).map(|w| w.1);
            let before = first_look.get(&(topic.clone(), p)).copied();
            match (high, lso(topic, p)) {
                (Ok(h), Ok(l)) if l < h && before == Some(l) => v.notes.push(format!(
                    "{topic}/{p}: last stable offset {l} < high watermark {h}, unmoved for 3 s (a transaction left open)"
                )),
                (Ok(h), Ok(_)) if topic.ends_with("journal") => {
                    v.notes.push(format!("{topic}/{p}: high watermark {h}"))
                }
                (Ok(_), Ok(_)) => {}
                (h, l) => v
                    .notes
                    .push(format!("{topic}/{p}: offsets unknown ({h:?}, {l:?})")),
            }
        }
    }
}

/// Latency, reset connections and a blackhole between ksched and the broker.
fn network(env: &Env) -> Result<Verdict> {
    let cluster = single(env);
    cluster.fresh()?;
    let api = free_port()?;
    let proxy = match Toxiproxy::start(api, &env.work.path().join("toxiproxy.log")) {
        Ok(p) => p,
        Err(e) => return Ok(skipped("network", &format!("{e:#}"))),
    };
    let (Some(listen), Some(upstream), Some(through)) = (
        cluster.proxy_port.map(|p| format!("127.0.0.1:{p}")),
        cluster.proxied_upstream(),
        cluster.proxied(),
    ) else {
        anyhow::bail!("the single-node broker has no proxied listener");
    };
    proxy.proxy("kafka", &listen, &upstream)?;
    let mut s = Scenario::new(env, "network", &cluster, &through, None)?;
    let (mut k, sdk, py, mut load) = s.under_load(env)?;
    proxy.toxic(
        "kafka",
        "latency",
        "latency",
        json!({ "latency": 300, "jitter": 0 }),
    )?;
    std::thread::sleep(env.seconds(20, 6));
    proxy.remove_toxic("kafka", "latency")?;
    proxy.toxic("kafka", "reset", "reset_peer", json!({ "timeout": 0 }))?;
    std::thread::sleep(Duration::from_secs(1));
    proxy.remove_toxic("kafka", "reset")?;
    s.heals.push(now_ms());
    std::thread::sleep(Duration::from_secs(5));
    let blackhole = env.seconds(30, 10);
    proxy.toxic("kafka", "blackhole", "timeout", json!({ "timeout": 0 }))?;
    std::thread::sleep(blackhole);
    proxy.remove_toxic("kafka", "blackhole")?;
    s.heals.push(now_ms());
    std::thread::sleep(env.seconds(15, 8));
    let ids = s.submitted(load.finish());
    let what = format!(
        "through toxiproxy between ksched and the broker: 300 ms latency for {} s, connections reset, a {} s blackhole (workers connect directly)",
        env.seconds(20, 6).as_secs(),
        blackhole.as_secs()
    );
    let v = s.verdict(env, what, &ids, sdk, py, Duration::from_secs(180));
    k.stop(Duration::from_secs(10));
    drop(proxy);
    v
}

/// A second instance on the same configuration.
fn two_instances(env: &Env) -> Result<Verdict> {
    let cluster = single(env);
    cluster.fresh()?;
    let mut s = Scenario::new(env, "two-instances", &cluster, &cluster.direct(), None)?;
    let (mut a, sdk, py, mut load) = s.under_load(env)?;
    // The same configuration, another machine's data directory.
    let other = s.dir.join("ksched-b.yaml");
    std::fs::write(
        &other,
        std::fs::read_to_string(&s.config)?.replace(
            &format!("data_dir: {}", s.dir.join("data").display()),
            &format!("data_dir: {}", s.dir.join("data-b").display()),
        ),
    )?;
    let mut b = Ksched::spawn(&s.ksched, &other, &s.dir.join("ksched-b.log"), free_port()?)?;
    // With processor.lease the second instance stands by; then the owner is SIGKILLed and
    // the standby takes over. The ticker's source names the process: the takeover is
    // complete when the second instance's Ticks are judged.
    let role = |r: &Option<(u16, serde_json::Value)>| {
        r.as_ref()
            .filter(|(c, _)| *c == 200)
            .and_then(|(_, body)| body["role"].as_str().map(str::to_owned))
    };
    let until = Instant::now() + Duration::from_secs(60);
    let mut outcome = loop {
        let (ra, rb) = (a.ready(), b.ready());
        if role(&ra).as_deref() == Some("owner") && role(&rb).as_deref() == Some("standby") {
            break Ok("the second instance stood by".to_owned());
        }
        if Instant::now() > until {
            break Err(format!(
                "not one owner and one ready standby after 60 s: first {ra:?}, second {rb:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    std::thread::sleep(env.seconds(10, 3));
    let killed = now_ms();
    a.kill();
    s.heals.push(killed);
    s.recover_by_ticker = Some((format!("chaos-two-instances-{}", b.child.id()), killed));
    if outcome.is_ok() {
        let until = Instant::now() + Duration::from_secs(60);
        outcome = loop {
            if role(&b.ready()).as_deref() == Some("owner") {
                break Ok(format!(
                    "the second instance stood by, and owned the journal {:.1} s after the first was SIGKILLed",
                    (now_ms() - killed) as f64 / 1000.0
                ));
            }
            if Instant::now() > until {
                break Err("the standby did not take over within 60 s of the kill".to_owned());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
    }
    std::thread::sleep(env.seconds(10, 5));
    let ids = s.submitted(load.finish());
    match &outcome {
        Ok(how) => s.notes.push(how.chars().take(120).collect()),
        Err(why) => s.notes.push(why.clone()),
    }
    let what =
        "a second ksched run on the same configuration (another data directory) started mid-run; it stands by; the first is SIGKILLed"
            .to_owned();
    let mut v = s.verdict(env, what, &ids, sdk, py, Duration::from_secs(180))?;
    v.passed &= outcome.is_ok();
    a.stop(Duration::from_secs(10));
    b.stop(Duration::from_secs(10));
    Ok(v)
}

/// RocksDB's disk fills up; ksched stops cleanly; space returns; it starts again.
fn disk_full(env: &Env) -> Result<Verdict> {
    let cluster = single(env);
    cluster.fresh()?;
    let mount = env.work.path().join("disk-full-tmpfs");
    if !infra::mount_tmpfs(&mount, 64)? {
        return Ok(skipped(
            "disk-full",
            "cannot mount a tmpfs here (needs root); run the suite as root",
        ));
    }
    let result = (|| {
        let data = mount.join("data");
        let mut s = Scenario::new(env, "disk-full", &cluster, &cluster.direct(), Some(data))?;
        let (mut k, sdk, py, mut load) = s.under_load(env)?;
        let filler = mount.join("filler");
        fill(&filler)?;
        let until = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = k.exited() {
                break Some(st);
            }
            if Instant::now() > until {
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let log = std::fs::read_to_string(&k.log).unwrap_or_default();
        match status {
            Some(st) if !st.success() && log.contains("is full") => s
                .notes
                .push("stopped cleanly with: the disk holding the store ... is full".into()),
            Some(st) => s
                .notes
                .push(format!("exited ({st}) without the disk-full message")),
            None => s
                .notes
                .push("did not stop within 60 s of the disk filling up".into()),
        }
        std::fs::remove_file(&filler)?;
        // A restart policy starts it again once space returned.
        s.heals.push(now_ms());
        let mut k2 = s.ksched(1)?;
        k2.wait_ready(Duration::from_secs(120))?;
        std::thread::sleep(env.seconds(10, 5));
        let ids = s.submitted(load.finish());
        let clean = s
            .notes
            .first()
            .is_some_and(|n| n.starts_with("stopped cleanly"));
        let what = "RocksDB's directory on a 64 MiB tmpfs, filled up mid-run; space freed and ksched started again".to_owned();
        let mut v = s.verdict(env, what, &ids, sdk, py, Duration::from_secs(180))?;
        v.passed &= clean;
        k2.stop(Duration::from_secs(10));
        Ok(v)
    })();
    infra::unmount(&mount);
    result
}

/// Writes zeros to `path` until the disk is full.
fn fill(path: &Path) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    let block = vec![0u8; 1 << 20];
    loop {
        match f.write_all(&block) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => return Err(e.into()),
        }
    }
    let _ = f.sync_all();
    Ok(())
}

/// 1 % poison records of every kind among valid jobs.
fn poison(env: &Env) -> Result<Verdict> {
    let cluster = single(env);
    cluster.fresh()?;
    let mut s = Scenario::new(env, "poison", &cluster, &cluster.direct(), None)?;
    let (mut k, sdk, py) = s.ready(env)?;
    let (jobs, rate) = if env.short {
        (2_000u64, 200.0)
    } else {
        (100_000, 800.0)
    };
    let compressed = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let expected = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::<&'static str, u64>::new()));
    let extra = {
        let (topic, prefix, direct) = (s.job_topic.clone(), s.prefix.clone(), s.direct.clone());
        let (compressed, expected) = (compressed.clone(), expected.clone());
        let codecs: Vec<(String, LoadProducer)> = ["gzip", "zstd"]
            .iter()
            .map(|c| {
                let p: LoadProducer = ClientConfig::new()
                    .set("bootstrap.servers", &direct)
                    .set("compression.type", *c)
                    .create_with_context(LoadDeliveries::default())
                    .expect("a compressing producer");
                ((*c).to_owned(), p)
            })
            .collect();
        move |n: u64, producer: &LoadProducer| {
            if n % 100 != 9 {
                return;
            }
            // Every 100th job is followed by one poison record, kinds in turn.
            let kind = (n / 100) % 10;
            let id = format!("{prefix}poison-{n}");
            let req = |id: &str| JobRequest {
                job_id: id.to_owned(),
                topic: topic.clone(),
                tenant_id: "poison".into(),
                ..Default::default()
            };
            let send = |p: &LoadProducer, topic: &str, key: &str, bytes: &[u8]| {
                // Untracked (opaque 0): a poison record is not a job the verdict waits for.
                let mut r = BaseRecord::with_opaque_to(topic, 0).key(key).payload(bytes);
                loop {
                    match p.send(r) {
                        Ok(()) => return,
                        Err((_, back)) => {
                            p.poll(Duration::from_millis(10));
                            r = back;
                        }
                    }
                }
            };
            let count = |reason: &'static str| {
                if let Ok(mut e) = expected.lock() {
                    *e.entry(reason).or_default() += 1;
                }
            };
            let enc = |r: &JobRequest| ksched_codec::encode(r).unwrap_or_default();
            match kind {
                0 => {
                    let mut r = req(&id);
                    r.payload = vec![b'x'; 900 * 1024];
                    send(producer, &topic, &id, &enc(&r));
                    count("record_too_large");
                }
                1 => {
                    send(producer, &topic, &id, b"\x00\x01\x02 not avro at all");
                    count("malformed_record");
                }
                2 => {
                    let d = Dispatch::default();
                    send(
                        producer,
                        &topic,
                        &id,
                        &ksched_codec::encode(&d).unwrap_or_default(),
                    );
                    count("malformed_record");
                }
                3 => {
                    let mut r = req(&id);
                    r.tenant_id.clear();
                    send(producer, &topic, &id, &enc(&r));
                    count("malformed_record");
                }
                4 => {
                    let mut r = req(&id);
                    for i in 0..100 {
                        r.labels.insert(format!("l{i}"), "v".into());
                    }
                    send(producer, &topic, &id, &enc(&r));
                    count("record_too_large");
                }
                5 => {
                    // The job just before, again, with other content.
                    let mut r = req(&format!("{prefix}job-{n:07}"));
                    r.payload = b"different".to_vec();
                    send(producer, &topic, &r.job_id.clone(), &enc(&r));
                    count("duplicate_job_id");
                }
                6 | 7 => {
                    let (_, p) = &codecs[(kind - 6) as usize];
                    send(p, &topic, &id, &enc(&req(&id)));
                    p.poll(Duration::ZERO);
                    if let Ok(mut c) = compressed.lock() {
                        c.push(id);
                    }
                }
                8 => {
                    let hb = Heartbeat {
                        worker_id: id.clone(),
                        pool: "default".into(),
                        cpu_load: f64::NAN,
                        owned_partitions: vec![0],
                        ..Default::default()
                    };
                    send(
                        producer,
                        &format!("{prefix}heartbeats"),
                        &id,
                        &ksched_codec::encode(&hb).unwrap_or_default(),
                    );
                }
                _ => {
                    let hb = Heartbeat {
                        worker_id: id.clone(),
                        pool: "default".into(),
                        owned_partitions: vec![99],
                        ..Default::default()
                    };
                    send(
                        producer,
                        &format!("{prefix}heartbeats"),
                        &id,
                        &ksched_codec::encode(&hb).unwrap_or_default(),
                    );
                }
            }
        }
    };
    let mut load = Load::start(&s.direct, &s.job_topic, &s.prefix, rate, extra)?;
    while load.ids.lock().map_or(0, |v| v.len() as u64) < jobs {
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut ids = s.submitted(load.finish());
    let compressed = compressed.lock().map(|c| c.clone()).unwrap_or_default();
    ids.extend(compressed.iter().cloned());
    s.expect_dead_letters = expected
        .lock()
        .map(|e| e.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect())
        .unwrap_or_default();
    let what = format!(
        "{} valid jobs at {rate:.0}/s with 1 % poison records in turn: 900 kB jobs, garbage, wrong record types, invalid and oversized requests, conflicting duplicates, gzip and zstd jobs, NaN heartbeats, heartbeats claiming partition 99",
        ids.len()
    );
    // A conflicting duplicate is refused and the original (a valid job) succeeds once.
    let limit = Duration::from_secs(if env.short { 120 } else { 600 });
    let v = s.verdict(env, what, &ids, sdk, py, limit);
    k.stop(Duration::from_secs(10));
    v
}

fn skipped(fault: &str, why: &str) -> Verdict {
    Verdict::without_a_run(fault, why.into(), true)
}
