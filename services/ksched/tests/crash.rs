//! Crash test. `ksched run` runs as a child process; a few
//! thousand jobs flow through it while it is killed with SIGKILL at random moments and
//! restarted each time. At the end every job is terminal exactly once, the journal holds no
//! duplicate transition, no attempt was dispatched twice, no worker was declared lost (both
//! heartbeat throughout; with a 5 s worker TTL, a restart that judged time on input it had not
//! read yet would lose them), and the RocksDB projection equals a replay of the journal from
//! offset 0.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ksched_codec::AnyRecord;
use ksched_core::events::{Event, Input, JournalEntry};
use ksched_core::records::JobRequest;
use ksched_core::state::State;
use ksched_store::Store;
use ksched_testkit::{bootstrap_servers, client_config, read_to_end, unique};
use ksched_worker::{Outcome, Worker, WorkerConfig};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

const JOBS: usize = 3_000;
const KILLS: usize = 5;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `processor` is added to the processor's settings (YAML lines indented by two spaces).
fn write_config(
    dir: &Path,
    bootstrap: &str,
    prefix: &str,
    job_topic: &str,
    processor: &str,
) -> PathBuf {
    let policy = dir.join("policy");
    std::fs::create_dir_all(&policy).unwrap();
    std::fs::write(
        policy.join("input.rego"),
        "package ksched.input\ndefault allow := true\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("pools.yaml"),
        format!("topics:\n  {job_topic}: default\npools:\n  default: {{}}\n"),
    )
    .unwrap();
    let config = dir.join("ksched.yaml");
    std::fs::write(
        &config,
        format!(
            "kafka:\n  bootstrap_servers: {bootstrap}\n\
             topics:\n  prefix: {prefix}\n  dispatch_partitions: 4\n  job_partitions: 3\n  results_partitions: 3\n\
             processor:\n  group_id: {prefix}processor\n  commit_interval_ms: 10\n  transaction_timeout_ms: 10000\n{processor}\
             scheduler:\n  overload:\n    cpu_load: 1000\n  retry:\n    initial_backoff_ms: 100\n    max_backoff_ms: 500\n  timing:\n    worker_ttl_ms: 5000\n    clock_gap_ms: 2000\n\
             storage:\n  data_dir: {}\n\
             http:\n  enabled: false\n",
            dir.join("data").display()
        ),
    )
    .unwrap();
    config
}

fn spawn_scheduler(config: &Path, log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(env!("CARGO_BIN_EXE_ksched"))
        .args(["run", "--config"])
        .arg(config)
        .env("RUST_LOG", "info,librdkafka=warn")
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap()
}

fn journal(bootstrap: &str, topic: &str) -> Vec<JournalEntry> {
    read_to_end(bootstrap, topic)
        .unwrap()
        .into_iter()
        .filter_map(|r| r.payload)
        .map(|p| ksched_codec::decode::<JournalEntry>(&p).unwrap())
        .collect()
}

fn terminal_of(e: &Event) -> bool {
    matches!(
        e,
        Event::JobSucceeded(_)
            | Event::JobFailed(_)
            | Event::JobCancelled(_)
            | Event::JobTimedOut(_)
            | Event::JobDenied(_)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_repeatedly_the_scheduler_loses_nothing_and_duplicates_nothing() {
    let bootstrap = bootstrap_servers().unwrap_or_else(|e| panic!("{e}"));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("crash test seed {seed}");
    let mut rng = Rng(seed);
    let prefix = format!("{}.", unique("crash"));
    let job_topic = format!("{prefix}jobs");
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &bootstrap,
        &prefix,
        &job_topic,
        "  tick_interval_ms: 200\n",
    );
    let log = dir.path().join("ksched.log");

    // Topics exist once the first scheduler started; workers join after that.
    let mut child = spawn_scheduler(&config, &log);
    await_until_journal(&bootstrap, &format!("{prefix}journal"), &log).await;

    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    for i in 0..2 {
        let mut cfg = WorkerConfig::new(&bootstrap, &format!("w{i}"), "default");
        cfg.topic_prefix = prefix.clone();
        cfg.max_parallel_jobs = 32;
        cfg.heartbeat_interval = Duration::from_millis(500);
        cfg.report_host_load = false;
        let worker = Worker::new(cfg).unwrap();
        let token = shutdown.clone();
        workers.push(tokio::spawn(async move {
            worker
                .run(
                    |job| async move {
                        let n: u64 = job.job_id().trim_start_matches("job-").parse().unwrap_or(0);
                        if n.is_multiple_of(25) {
                            Outcome::fatal("boom", "fatal by design")
                        } else if n.is_multiple_of(10) && job.attempt() == 1 {
                            Outcome::retryable("flaky", "first attempt fails by design")
                        } else {
                            Outcome::succeeded()
                        }
                    },
                    token,
                )
                .await
        }));
    }

    // Submit the jobs in bursts while killing and restarting the scheduler.
    let per_burst = JOBS / (KILLS + 1);
    let mut submitted = 0;
    for round in 0..=KILLS {
        let end = if round == KILLS {
            JOBS
        } else {
            submitted + per_burst
        };
        submit(&bootstrap, &job_topic, submitted..end);
        submitted = end;
        if round < KILLS {
            let wait = 300 + rng.below(2_500);
            tokio::time::sleep(Duration::from_millis(wait)).await;
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
            eprintln!("round {round}: killed after {wait} ms");
            child = spawn_scheduler(&config, &log);
        }
    }

    // Wait until every job is terminal in the journal.
    let journal_topic = format!("{prefix}journal");
    let deadline = Instant::now() + Duration::from_secs(300);
    let entries = loop {
        let entries = journal(&bootstrap, &journal_topic);
        let terminal: BTreeSet<&str> = entries
            .iter()
            .flat_map(|e| e.events.iter())
            .filter(|e| terminal_of(e))
            .filter_map(Event::job_id)
            .collect();
        eprintln!("{} of {JOBS} jobs terminal", terminal.len());
        if terminal.len() == JOBS {
            break entries;
        }
        assert!(
            Instant::now() < deadline,
            "jobs never finished; scheduler log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    shutdown.cancel();
    for w in workers {
        w.await.unwrap().unwrap();
    }
    // A graceful stop of the last scheduler (SIGTERM), then look at its store.
    Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "graceful stop: {status:?}");

    // Every job terminal exactly once; no duplicate transition in the journal.
    let mut terminal: BTreeMap<String, usize> = BTreeMap::new();
    let mut accepted: BTreeMap<String, usize> = BTreeMap::new();
    let mut dispatched: BTreeMap<(String, i32), usize> = BTreeMap::new();
    for e in entries.iter().flat_map(|e| e.events.iter()) {
        match e {
            Event::JobAccepted(a) => *accepted.entry(a.job_id.clone()).or_default() += 1,
            Event::JobDispatched(d) => {
                *dispatched.entry((d.job_id.clone(), d.attempt)).or_default() += 1
            }
            e if terminal_of(e) => {
                *terminal.entry(e.job_id().unwrap().to_owned()).or_default() += 1
            }
            _ => {}
        }
    }
    let lost: Vec<&str> = entries
        .iter()
        .flat_map(|e| e.events.iter())
        .filter_map(|e| match e {
            Event::WorkerLost(l) => Some(l.worker_id.as_str()),
            _ => None,
        })
        .collect();
    assert!(lost.is_empty(), "workers falsely declared lost: {lost:?}");
    assert_eq!(terminal.len(), JOBS);
    assert!(terminal.values().all(|n| *n == 1), "a job ended twice");
    assert_eq!(accepted.len(), JOBS);
    assert!(
        accepted.values().all(|n| *n == 1),
        "a job was accepted twice"
    );
    assert!(
        dispatched.values().all(|n| *n == 1),
        "an attempt was dispatched twice (journal)"
    );

    // No attempt dispatched twice on the dispatch topic, and none sent that the journal lacks.
    let mut sent: BTreeMap<(String, i32), usize> = BTreeMap::new();
    for r in read_to_end(&bootstrap, &format!("{prefix}dispatch.default")).unwrap() {
        if let Some(Ok(AnyRecord::Dispatch(d))) = r.payload.as_deref().map(ksched_codec::decode_any)
        {
            *sent.entry((d.job.job_id.clone(), d.attempt)).or_default() += 1;
        }
    }
    assert!(
        sent.values().all(|n| *n == 1),
        "an attempt was dispatched twice (topic)"
    );
    assert_eq!(
        sent.keys().collect::<Vec<_>>(),
        dispatched.keys().collect::<Vec<_>>()
    );

    // The projection equals a replay of the journal from offset 0.
    let store = Store::open(&dir.path().join("data"), 0).unwrap();
    let mut replay = State::new();
    for e in &entries {
        ksched_core::apply_entry(&mut replay, e);
    }
    let stored = store.jobs().unwrap();
    assert_eq!(stored.len(), replay.jobs.len());
    for (id, job) in stored {
        assert_eq!(Some(&job), replay.jobs.get(&id), "job {id}");
        assert!(job.state.is_terminal());
    }
    let fatal = (0..JOBS).filter(|n| n.is_multiple_of(25)).count();
    assert_eq!(
        store.dead_letter_counts().unwrap().get("boom").copied(),
        Some(fatal as u64)
    );
}

/// Submits jobs `range` to `topic`, keyed by job id.
fn submit(bootstrap: &str, topic: &str, range: std::ops::Range<usize>) {
    let producer: BaseProducer = client_config(bootstrap)
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    for n in range {
        let req = JobRequest {
            job_id: format!("job-{n}"),
            topic: topic.to_owned(),
            tenant_id: "acme".into(),
            submitted_at: 0,
            ..Default::default()
        };
        let bytes = ksched_codec::encode(&req).unwrap();
        producer
            .send(BaseRecord::to(topic).key(&req.job_id).payload(&bytes))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// Waits until the journal holds `n` accepted jobs.
async fn await_accepted(bootstrap: &str, journal_topic: &str, n: usize, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let accepted = journal(bootstrap, journal_topic)
            .iter()
            .flat_map(|e| e.events.iter())
            .filter(|e| matches!(e, Event::JobAccepted(_)))
            .count();
        if accepted >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{accepted} of {n} jobs accepted; scheduler log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The input positions travel in the journal (positions.rs). A scheduler killed with
/// SIGKILL, whose group's committed offsets of the job topic are then set back to 0, reads
/// on from the positions its journal carries: no submit is read and decided twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_it_reads_on_from_the_journals_positions_not_the_groups_offsets() {
    let bootstrap = bootstrap_servers().unwrap_or_else(|e| panic!("{e}"));
    let prefix = format!("{}.", unique("positions"));
    let job_topic = format!("{prefix}jobs");
    let journal_topic = format!("{prefix}journal");
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &bootstrap,
        &prefix,
        &job_topic,
        // Every batch carries its positions in the journal, none sends them to the group.
        "  tick_interval_ms: 200\n  group_offsets_interval_ms: 3600000\n  journal_positions_min_batch: 1\n",
    );
    let log = dir.path().join("ksched.log");
    let mut child = spawn_scheduler(&config, &log);
    // No workers: the jobs are accepted and wait in the queue.
    await_until_journal(&bootstrap, &journal_topic, &log).await;
    submit(&bootstrap, &job_topic, 0..60);
    await_accepted(&bootstrap, &journal_topic, 60, &log).await;

    // The journal's last positions header has every submit read; the group is behind.
    let journaled: i64 = read_to_end(&bootstrap, &journal_topic)
        .unwrap()
        .iter()
        .rev()
        .find_map(|r| {
            r.headers
                .iter()
                .find(|(k, _)| k == ksched_runtime::positions::HEADER)
                .map(|(_, v)| ksched_runtime::positions::decode(v).unwrap())
        })
        .expect("a positions header in the journal")
        .iter()
        .filter(|((t, _), _)| *t == job_topic)
        .map(|(_, o)| *o)
        .sum();
    assert_eq!(journaled, 60);

    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // The group's offsets of the job topic back to 0, as a group left behind: a batch of
    // Ticks that journals nothing sends the positions to the group too, so it may have
    // caught up by now.
    let group: BaseConsumer = client_config(&bootstrap)
        .set("group.id", format!("{prefix}processor"))
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..3 {
        tpl.add_partition_offset(&job_topic, p, Offset::Offset(0))
            .unwrap();
    }
    group.commit(&tpl, CommitMode::Sync).unwrap();
    let committed = group
        .committed_offsets(tpl, Duration::from_secs(10))
        .unwrap();
    assert!(
        committed
            .elements()
            .iter()
            .all(|e| e.offset() == Offset::Offset(0)),
        "{committed:?}"
    );
    let mut child = spawn_scheduler(&config, &log);
    submit(&bootstrap, &job_topic, 60..120);
    await_accepted(&bootstrap, &journal_topic, 120, &log).await;
    Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(child.wait().unwrap().success());

    let entries = journal(&bootstrap, &journal_topic);
    let mut causes: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for e in entries
        .iter()
        .filter(|e| e.cause.topic == job_topic && matches!(e.input, Input::Submit(_)))
    {
        *causes
            .entry((e.cause.partition, e.cause.offset))
            .or_default() += 1;
    }
    assert_eq!(causes.len(), 120);
    let twice: Vec<_> = causes.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "submits decided twice: {twice:?}");
    let duplicates = entries
        .iter()
        .flat_map(|e| e.events.iter())
        .filter(|e| matches!(e, Event::JobDuplicate(_)))
        .count();
    assert_eq!(duplicates, 0, "a submit was read again after the restart");
}

/// Waits until the scheduler journaled something (its topics exist then).
async fn await_until_journal(bootstrap: &str, journal_topic: &str, log: &Path) {
    let started = Instant::now();
    while read_to_end(bootstrap, journal_topic).map_or(true, |j| j.is_empty()) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "scheduler did not start: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
