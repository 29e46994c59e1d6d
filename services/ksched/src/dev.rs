//! `ksched dev`: the embedded default. One process: an in-memory Kafka (librdkafka's mock
//! cluster, memory only), RocksDB in ./data/dev, the scheduler, demo workers in two pools, and
//! a stream of demo jobs, printed as they happen. `--bootstrap-servers` uses a real broker.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ksched_core::events::{Event, Input, JournalEntry};
use ksched_core::records::{JobRequest, Priority, ResultMeta};
use ksched_core::rules::{PoolRules, Rules, StrategyKind};
use ksched_policy::PolicyBundle;
use ksched_runtime::{Config, Settings, topics_of};
use ksched_worker::{Outcome, Worker, WorkerConfig};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::cli::output::time;
use crate::run::{Service, init_tracing, signals};

/// The demo's safety policy: prod needs a human, destructive prod jobs never run.
pub(crate) const DEV_POLICY: &str = r#"package ksched.input

default allow := true

deny contains "destructive jobs never run in prod" if {
    input.job.labels.env == "prod"
    "destructive" in input.job.meta.risk_tags
}

require_approval contains "jobs touching prod need a human" if {
    input.job.labels.env == "prod"
    not "destructive" in input.job.meta.risk_tags
}

constraints := {"max_retries": 2} if input.job.labels.flaky == "true"
"#;

pub(crate) const CPU_TOPIC: &str = "job.dev.cpu";
pub(crate) const GPU_TOPIC: &str = "job.dev.gpu";

#[derive(Debug, Args)]
pub(crate) struct DevArgs {
    /// Use this Kafka instead of the embedded in-memory one.
    #[arg(long)]
    pub bootstrap_servers: Option<String>,
    /// RocksDB directory (wiped at start when Kafka is in memory: nothing else survives).
    #[arg(long, default_value = "./data/dev")]
    pub data_dir: PathBuf,
    /// HTTP API address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http_listen: String,
    /// Stop after this many seconds (0: run until Ctrl-C).
    #[arg(long, default_value_t = 0)]
    pub duration: u64,
    /// Seconds between background demo jobs after the first wave (0: none).
    #[arg(long, default_value_t = 3)]
    pub trickle: u64,
    /// Print each journal entry's events (otherwise only the notable ones).
    #[arg(long)]
    pub verbose: bool,
    /// Client properties for `--bootstrap-servers` (TLS, SASL).
    #[command(flatten)]
    pub kafka: crate::kafka_args::KafkaArgs,
}

/// Shards of the dev scheduler: cpu on shard 0, gpu on shard 1.
const DEV_SHARDS: i32 = 2;

fn dev_rules() -> Rules {
    let mut r = Rules::default();
    r.topics.insert(CPU_TOPIC.into(), vec!["cpu".into()]);
    r.topics.insert(GPU_TOPIC.into(), vec!["gpu".into()]);
    // Two shards, one pool each, as a scaled-out deployment has them.
    r.pools.insert(
        "cpu".into(),
        PoolRules {
            shard: Some(0),
            ..PoolRules::default()
        },
    );
    r.pools.insert(
        "gpu".into(),
        PoolRules {
            requires: vec!["gpu".into()],
            strategy: StrategyKind::Capacity,
            shard: Some(1),
            ..PoolRules::default()
        },
    );
    r.four_eyes = true;
    r.timing.worker_ttl_ms = 10_000;
    r.retry.initial_backoff_ms = 500;
    r.retry.max_backoff_ms = 2_000;
    r
}

fn dev_config(
    args: &DevArgs,
    bootstrap: &str,
    properties: Vec<(String, String)>,
    in_memory: bool,
) -> Config {
    let mut settings = Settings::default();
    settings.kafka.bootstrap_servers = bootstrap.to_owned();
    settings.kafka.properties = properties.into_iter().collect();
    settings.kafka.client_id = "ksched-dev".into();
    settings.topics.create = !in_memory;
    // The embedded mock cluster has no DescribeConfigs and cannot stamp LogAppendTime.
    settings.topics.verify = !in_memory;
    settings.topics.trust_create_time = in_memory;
    settings.topics.dispatch_partitions = 4;
    settings.topics.journal_partitions = DEV_SHARDS;
    settings.processor.group_id = "ksched-dev-processor".into();
    settings.processor.tick_interval_ms = 500;
    settings.storage.data_dir = args.data_dir.clone();
    // One instance runs both shards, with nothing to stand by for (and the in-memory
    // Kafka's group support is partial): no owners' group.
    settings.processor.lease = false;
    settings.http.listen = args.http_listen.clone();
    settings.log.level = "warn,ksched=warn".into();
    let rules = dev_rules();
    settings.scheduler.timing = rules.timing.clone();
    settings.scheduler.retry = rules.retry.clone();
    let mut policy = PolicyBundle::default();
    policy
        .modules
        .insert("input.rego".into(), DEV_POLICY.into());
    policy.data_json = "{}".into();
    Config {
        settings,
        rules,
        policy,
        source: None,
        framing: Default::default(),
    }
}

/// The first wave of demo jobs and what each one shows.
pub(crate) fn demo_jobs() -> Vec<(JobRequest, &'static str)> {
    let job = |id: &str, topic: &str| JobRequest {
        job_id: id.into(),
        topic: topic.into(),
        tenant_id: "demo".into(),
        principal_id: Some("dev".into()),
        priority: Priority::Interactive,
        payload: b"demo".to_vec(),
        submitted_at: now_ms(),
        ..Default::default()
    };
    let mut out = Vec::new();
    for i in 1..=3 {
        out.push((
            job(&format!("demo-hello-{i}"), CPU_TOPIC),
            "runs on a cpu worker",
        ));
    }
    let mut render = job("demo-render-1", GPU_TOPIC);
    render.meta.requires = vec!["gpu".into()];
    render.labels.insert("memory".into(), "2Gi".into());
    out.push((render, "needs a gpu and 2Gi: bin-packed on the gpu pool"));
    let mut flaky = job("demo-flaky-1", CPU_TOPIC);
    flaky.labels.insert("flaky".into(), "true".into());
    out.push((
        flaky,
        "fails its first attempt, is retried after a backoff, then succeeds",
    ));
    let mut deploy = job("demo-deploy-prod", CPU_TOPIC);
    deploy.labels.insert("env".into(), "prod".into());
    out.push((deploy, "touches prod: waits for approval"));
    let mut wipe = job("demo-wipe-prod", CPU_TOPIC);
    wipe.labels.insert("env".into(), "prod".into());
    wipe.meta.risk_tags = vec!["destructive".into()];
    out.push((wipe, "destructive in prod: denied by policy"));
    let mut secret = job("demo-secret-1", CPU_TOPIC);
    secret.env.insert(
        DEMO_SECRET.into(),
        format!("demo-{}", uuid::Uuid::new_v4().simple()),
    );
    out.push((
        secret,
        "carries a secret, sealed for its tenant: only its worker opens it",
    ));
    let mut later = job("demo-later-1", CPU_TOPIC);
    later.not_before = Some(now_ms() + 30_000);
    out.push((later, "waits DELAYED for 30 s, then runs"));
    let mut broken = job("demo-broken-1", CPU_TOPIC);
    broken.labels.insert("demo.fatal".into(), "true".into());
    out.push((
        broken,
        "fails fatally: dead-lettered with the worker's error code",
    ));
    // Dependencies are kept per shard: these wait for jobs of their own (cpu) shard.
    let mut after = job("demo-after-two", CPU_TOPIC);
    after.depends_on = vec!["demo-hello-1".into(), "demo-flaky-1".into()];
    out.push((
        after,
        "waits BLOCKED until demo-hello-1 and demo-flaky-1 succeeded, then runs",
    ));
    let mut cleanup = job("demo-cleanup", CPU_TOPIC);
    cleanup.depends_on = vec!["demo-broken-1".into(), "demo-hello-3".into()];
    cleanup.dependency_condition = ksched_core::records::DependencyCondition::AllTerminal;
    out.push((
        cleanup,
        "runs once demo-broken-1 and demo-hello-3 ended, however they ended",
    ));
    let mut doomed = job("demo-doomed", CPU_TOPIC);
    doomed.depends_on = vec!["demo-broken-1".into()];
    out.push((
        doomed,
        "needs demo-broken-1 to succeed: fails dependency_failed when it does not",
    ));
    // A batch of five (one fails) and its callback, submitted first, which runs once all
    // five ended, with their counts.
    let mut report = job("demo-batch-report", CPU_TOPIC);
    report.after_batch = Some("demo-batch".into());
    out.push((
        report,
        "callback of batch demo-batch: runs once its 5 members ended, with 4 succeeded, 1 failed",
    ));
    for i in 1..=5 {
        let mut m = job(&format!("demo-batch-{i}"), CPU_TOPIC);
        m.batch_id = Some("demo-batch".into());
        m.batch_size = Some(5);
        if i == 5 {
            m.labels.insert("demo.fatal".into(), "true".into());
        }
        out.push((m, "member of batch demo-batch"));
    }
    out
}

/// The demo schedule: a job on the cpu pool every 10 s.
fn demo_schedule() -> ksched_core::records::ScheduleCommand {
    use ksched_core::records::{JobTemplate, ScheduleAction, ScheduleCommand, ScheduleSpec};
    ScheduleCommand {
        schedule_id: "every-10s".into(),
        tenant_id: "demo".into(),
        action: ScheduleAction::Create,
        spec: Some(ScheduleSpec {
            interval_ms: Some(10_000),
            time_zone: "UTC".into(),
            template: JobTemplate {
                topic: CPU_TOPIC.into(),
                payload: b"demo".to_vec(),
                ..Default::default()
            },
            catch_up_window_ms: 86_400_000,
            ..Default::default()
        }),
        principal_id: "dev".into(),
        reason: Some("the demo".into()),
        requested_at: now_ms(),
    }
}

/// The secret env of the demo job that shows sealing.
const DEMO_SECRET: &str = "$DEMO_TOKEN";

/// What the demo workers do with a job.
async fn demo_handler(job: ksched_worker::JobContext) -> Outcome {
    let labels = &job.dispatch.job.labels;
    if let Some(token) = job.env().get(DEMO_SECRET)
        && (token.is_empty() || ksched_secrets::is_sealed(token))
    {
        return Outcome::fatal("demo_secret_sealed", "the worker could not open the secret");
    }
    let steps = 4;
    for i in 1..=steps {
        tokio::select! {
            _ = job.cancel.cancelled() => return Outcome::Cancelled,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        job.progress(f64::from(i) / f64::from(steps), "").await;
    }
    if labels.get("demo.fatal").is_some_and(|v| v == "true") {
        return Outcome::fatal(
            "demo_input_invalid",
            "the demo asked this job to fail for good",
        );
    }
    if labels.get("flaky").is_some_and(|v| v == "true") && job.attempt() == 1 {
        return Outcome::retryable("demo_transient", "first attempt fails by design");
    }
    Outcome::Succeeded {
        result_ptr: Some(format!("memory://results/{}", job.job_id())),
        meta: ResultMeta {
            size_bytes: Some(42),
            content_type: Some("text/plain".into()),
            labels: BTreeMap::new(),
        },
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub(crate) fn main(args: DevArgs) -> ExitCode {
    match dev(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ksched dev: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn dev(args: DevArgs) -> anyhow::Result<()> {
    // The mock cluster lives on this thread for the whole run (it is not Send).
    let mock = match &args.bootstrap_servers {
        Some(_) => None,
        None => Some(MockCluster::new(1).context("starting the embedded Kafka")?),
    };
    let bootstrap = match (&mock, &args.bootstrap_servers) {
        (Some(m), _) => m.bootstrap_servers(),
        (None, Some(b)) => b.clone(),
        (None, None) => unreachable!("one of the two is set"),
    };
    let in_memory = mock.is_some();
    if in_memory && args.data_dir.exists() {
        // The journal it mirrored is gone with the last in-memory Kafka.
        std::fs::remove_dir_all(&args.data_dir)
            .with_context(|| format!("clearing {}", args.data_dir.display()))?;
    }
    let properties = args.kafka.properties()?;
    anyhow::ensure!(
        !in_memory || properties.is_empty(),
        "-X and --command-config are for a real Kafka (--bootstrap-servers); the embedded one takes none"
    );
    let config = dev_config(&args, &bootstrap, properties, in_memory);
    let client = ksched_runtime::topics::client_config(&config.settings);
    let _tracing = init_tracing(&config.settings.log)?;
    let topics = topics_of(&config);
    if let Some(m) = &mock {
        let s = &config.settings.topics;
        let create = |name: &str, partitions: i32| {
            m.create_topic(name, partitions, 1)
                .with_context(|| format!("creating {name} in the embedded Kafka"))
        };
        for t in &topics.jobs {
            create(t, s.job_partitions)?;
        }
        create(&topics.results, s.results_partitions)?;
        create(&topics.control, s.control_partitions)?;
        create(&topics.heartbeats, s.heartbeats_partitions)?;
        create(&topics.journal, s.journal_partitions)?;
        create(&topics.dlq, s.dlq_partitions)?;
        for p in &topics.pools {
            create(&topics.dispatch(p), s.dispatch_partitions)?;
        }
    }
    let keyring_path = dev_keyring(&args)?;
    let keyring = ksched_secrets::Keyring::load(&keyring_path)?;
    banner(&args, &bootstrap, in_memory, &keyring_path);

    let service = Service::start(config.clone())?;
    service.rt.spawn(signals(service.shutdown()));
    let stop = CancellationToken::new();

    // Print the journal as it grows.
    let printer = {
        let (client, journal, shutdown, verbose) = (
            client.clone(),
            topics.journal.clone(),
            service.shutdown(),
            args.verbose,
        );
        std::thread::spawn(move || print_journal(&client, &journal, &shutdown, verbose))
    };

    // Demo workers: two on cpu, one on gpu.
    let _runtime = service.rt.enter();
    let mut workers = Vec::new();
    for (id, pool, gpu) in [
        ("cpu-worker-1", "cpu", false),
        ("cpu-worker-2", "cpu", false),
        ("gpu-worker-1", "gpu", true),
    ] {
        let mut cfg = WorkerConfig::new(&bootstrap, id, pool)
            .with_properties(config.settings.kafka.properties.clone());
        cfg.heartbeat_interval = Duration::from_secs(1);
        cfg.max_parallel_jobs = 2;
        cfg.report_host_load = false;
        if gpu {
            cfg.capabilities = vec!["gpu".into()];
            cfg.memory_free_bytes = Some(16 << 30);
            cfg.labels.insert("accelerator".into(), "demo-gpu".into());
        }
        let worker = Worker::new(cfg.with_keyring(&keyring_path)?)?;
        let token = stop.clone();
        workers.push(
            service
                .rt
                .spawn(async move { worker.run(demo_handler, token).await }),
        );
    }

    // The demo jobs, then a trickle.
    let (submitter, shutdown) = (stop.clone(), service.shutdown());
    let trickle = args.trickle;
    let client_for_jobs = client.clone();
    let control = topics.control.clone();
    service.rt.spawn(async move {
        let producer: FutureProducer = match client_for_jobs.create() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("ksched dev: cannot submit demo jobs: {e}");
                return;
            }
        };
        tokio::time::sleep(Duration::from_secs(2)).await;
        for (mut job, what) in demo_jobs() {
            if let Err(e) = keyring.seal_request(&mut job, false) {
                eprintln!("ksched dev: sealing {}: {e}", job.job_id);
                continue;
            }
            println!("submit   {:<18} {what}", job.job_id);
            submit(&producer, &job).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let schedule = demo_schedule();
        if let Ok(bytes) = ksched_codec::encode(&schedule) {
            let key = format!("{}:{}", schedule.tenant_id, schedule.schedule_id);
            let sent = producer
                .send(
                    FutureRecord::to(&control).key(&key).payload(&bytes),
                    Duration::from_secs(10),
                )
                .await;
            match sent {
                Ok(_) => println!(
                    "schedule {key:<18} submits a job every 10 s (ksched schedules show {key})"
                ),
                Err((e, _)) => eprintln!("ksched dev: creating the demo schedule: {e}"),
            }
        }
        if trickle == 0 {
            return;
        }
        let mut n = 0u64;
        while !submitter.is_cancelled() && !shutdown.is_cancelled() {
            tokio::time::sleep(Duration::from_secs(trickle)).await;
            n += 1;
            let mut job = demo_jobs().remove(0).0;
            job.job_id = format!("demo-batch-{n}");
            job.priority = Priority::Batch;
            job.submitted_at = now_ms();
            submit(&producer, &job).await;
        }
    });

    // Run until the duration passes or a signal arrives.
    let shutdown = service.shutdown();
    let limit = (args.duration > 0).then(|| Duration::from_secs(args.duration));
    let started = std::time::Instant::now();
    while !shutdown.is_cancelled() && limit.is_none_or(|l| started.elapsed() < l) {
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("stopping: workers drain, the open batch commits");
    stop.cancel();
    service.rt.block_on(async {
        for w in workers {
            let _ = w.await;
        }
    });
    shutdown.cancel();
    let _ = printer.join();
    service.wait()?;
    drop(mock);
    Ok(())
}

async fn submit(producer: &FutureProducer, job: &JobRequest) {
    let Ok(bytes) = ksched_codec::encode(job) else {
        return;
    };
    if let Err((e, _)) = producer
        .send(
            FutureRecord::to(&job.topic)
                .key(&job.job_id)
                .payload(&bytes),
            Duration::from_secs(10),
        )
        .await
    {
        eprintln!("ksched dev: submitting {}: {e}", job.job_id);
    }
}

/// The demo tenant's keyring beside the data directory: kept across runs (a journal on a
/// real Kafka outlives a run, and its secrets should still open), made on the first.
fn dev_keyring(args: &DevArgs) -> anyhow::Result<PathBuf> {
    let mut name = args.data_dir.as_os_str().to_owned();
    name.push("-keyring.json");
    let path = PathBuf::from(name);
    if !path.exists() {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let mut k = ksched_secrets::Keyring::new();
        k.rotate("demo")?;
        k.save(&path)?;
    }
    Ok(path)
}

fn banner(args: &DevArgs, bootstrap: &str, in_memory: bool, keyring: &Path) {
    let kafka = if in_memory {
        format!(
            "EMBEDDED IN-MEMORY KAFKA at {bootstrap} (librdkafka mock cluster: memory only, everything is gone on exit)"
        )
    } else {
        format!("Kafka at {bootstrap}")
    };
    let api = format!("http://{}", args.http_listen);
    println!(
        "\nksched dev\n  {kafka}\n  RocksDB projection in {}\n  HTTP API {api}: NO AUTHENTICATION (anyone on this machine may approve and cancel; see docs/security.md)\n  keyring {} seals the demo tenant's secrets (ksched submit --keyring it)\n  2 shards: cpu pool on shard 0 (2 workers, least_loaded), gpu pool on shard 1 (1 worker, capacity)\n\n\
         CONSOLE {api}/ui  (the demo jobs are there; demo-deploy-prod waits for your approval)\n\n\
         Inspect while it runs (another terminal):\n  \
         curl {api}/api/v1/jobs\n  \
         ksched jobs list --api {api}\n  \
         ksched jobs history demo-flaky-1 --api {api}\n  \
         ksched workers list --api {api}\n  \
         ksched dlq list --api {api}\n  \
         ksched dlq redrive JOB_ID --api {api}\n  \
         ksched approve demo-deploy-prod --api {api}\n  \
         ksched journal tail --follow --bootstrap-servers {bootstrap}\n  \
         curl {api}/metrics\n\nCtrl-C stops it.\n",
        args.data_dir.display(),
        keyring.display()
    );
}

/// Prints journal entries as they are committed, until `shutdown`.
fn print_journal(client: &ClientConfig, topic: &str, shutdown: &CancellationToken, verbose: bool) {
    let consumer: BaseConsumer = match client
        .clone()
        .set("group.id", "ksched-dev-printer")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ksched dev: cannot read the journal: {e}");
            return;
        }
    };
    let mut tpl = TopicPartitionList::new();
    for shard in 0..DEV_SHARDS {
        if tpl
            .add_partition_offset(topic, shard, Offset::Beginning)
            .is_err()
        {
            return;
        }
    }
    if consumer.assign(&tpl).is_err() {
        return;
    }
    while !shutdown.is_cancelled() {
        let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let Some(Ok(entry)) = m.payload().map(ksched_codec::decode::<JournalEntry>) else {
            continue;
        };
        for line in describe(&entry, verbose) {
            println!(
                "{}  shard {}  {line}",
                &time(entry.log_time)[11..],
                m.partition()
            );
        }
    }
}

/// One line per notable event of an entry (every event with `verbose`).
pub(crate) fn describe(entry: &JournalEntry, verbose: bool) -> Vec<String> {
    let mut out = Vec::new();
    for e in &entry.events {
        let notable = match e {
            Event::JobRunning(_)
            | Event::JobQueued(_)
            | Event::JobDispatched(_)
            | Event::PolicyEvaluated(_)
            | Event::BreakerCounted(_)
            | Event::JobProgressed(_) => false,
            Event::WorkerUpdated(u) => u.joined,
            _ => true,
        };
        if notable || verbose {
            let who = e.job_id().or(e.worker_id()).unwrap_or("");
            let line = match e {
                Event::ApprovalRequested(a) => format!(
                    "{who:<18} APPROVAL REQUIRED: {}; run `ksched approve {}`",
                    e.describe(&entry.input),
                    a.job_id
                ),
                _ => format!("{who:<18} {}", e.describe(&entry.input)),
            };
            out.push(line);
        }
    }
    if verbose && out.is_empty() && !matches!(entry.input, Input::Tick(_) | Input::Heartbeat(_)) {
        out.push(format!("{} (no events)", entry.input.kind()));
    }
    out
}
