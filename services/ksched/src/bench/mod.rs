//! `ksched bench`: throughput, latency, replay, recovery, failover and scale with history, measured on
//! this machine against a given broker, beside a raw Kafka baseline in the same run.
//! docs/performance.md explains the method and records results.

mod baseline;
mod batches;
mod dependencies;
mod e2e;
mod failover;
mod flow;
mod history;
mod machine;
mod memory;
mod recovery;
mod report;
mod shards;
mod timers;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use ksched_core::records::JobRequest;
use ksched_core::rules::{PoolRules, Rules};
use ksched_policy::PolicyBundle;
use ksched_runtime::settings::KafkaSettings;
use ksched_runtime::{Config, Settings};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::ToBytes;
use rdkafka::producer::{BaseProducer, BaseRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use memory::memory_only;
use report::{Large, Report, Turn, median_of, or_dash, print_table};
use shards::shards_only;

/// A directory and the config of a phase that runs the core and the store without a broker
/// (`prefix` names its topics, which nothing creates).
pub(super) fn offline_config(
    args: &BenchArgs,
    prefix: &str,
) -> Result<(tempfile::TempDir, Config)> {
    let dir = tempfile::tempdir()?;
    let kafka = KafkaSettings {
        bootstrap_servers: args.bootstrap_servers.clone(),
        ..KafkaSettings::default()
    };
    let config = bench_config(&kafka, prefix, dir.path(), None);
    Ok((dir, config))
}

/// The fixed rates of the latency levels, jobs a second (beside the levels at fractions of
/// the measured saturation).
pub(super) const RATES: [f64; 3] = [250.0, 1_000.0, 2_500.0];

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// The broker to measure against.
    #[arg(
        long,
        default_value = "127.0.0.1:9092",
        env = "KAFKA_BOOTSTRAP_SERVERS"
    )]
    pub bootstrap_servers: String,
    /// A run of seconds with tiny sizes (CI), instead of the full one.
    #[arg(long)]
    pub smoke: bool,
    /// Write the results as JSON here.
    #[arg(long, default_value = "bench-results.json")]
    pub out: PathBuf,
    /// Scratch directory for projections (default: a temporary directory).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// `processor.lease_session_timeout_ms` in the failover measurement: how long a killed
    /// owner goes unnoticed. Brokers refuse less than their `group.min.session.timeout.ms`
    /// (6000 by default; deploy/kafka.sh sets 1000).
    #[arg(long, default_value_t = 6_000)]
    pub lease_session_ms: u64,
    /// SDK workers in the end-to-end runs.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Jobs each SDK worker runs at once (`max_parallel_jobs`). Enough that the fleet does
    /// not cap the scheduler: with 64 (the former default) the four workers' 256
    /// slots, not the processor, set the saturation figure and each shard's batch size, and
    /// jobs queued for a slot at 50 % load.
    #[arg(long, default_value_t = 1024)]
    pub worker_slots: usize,
    /// `linger.ms` of the bench's job producer: how long it holds a job to send it with
    /// others (librdkafka's default is 5). Each ms is up to a ms more submit -> dispatch.
    #[arg(long, default_value_t = 2, value_name = "MS")]
    pub submit_linger_ms: u64,
    /// Only the small-history phases (baseline and saturation turns, latency levels): skip
    /// the large history, recovery and failover (minutes of set-up).
    #[arg(long)]
    pub skip_large: bool,
    /// Run the processor pipelined (`processor.pipelined: true`), to compare.
    #[arg(long)]
    pub pipelined: bool,
    /// `processor.max_batch` (most input records per transaction), to compare; the
    /// scheduler's default otherwise.
    #[arg(long, value_name = "N")]
    pub max_batch: Option<usize>,
    /// Journal every heartbeat (`processor.coalesce_heartbeats: false`), to compare.
    #[arg(long)]
    pub keep_heartbeats: bool,
    /// Transactional producers per shard, used in turn (`processor.transactional_producers`,
    /// 1 or 2), to compare. Default: the setting's default.
    #[arg(long, value_name = "N")]
    pub transactional_producers: Option<u8>,
    /// How often the input offsets also go to the consumer group
    /// (`processor.group_offsets_interval_ms`; 0: with every transaction, as before the
    /// journal carried them), to compare. Default: the setting's default.
    #[arg(long, value_name = "MS")]
    pub group_offsets_interval_ms: Option<u64>,
    /// `processor.journal_positions_min_batch` (batches of fewer input records send their
    /// positions to the consumer group instead of a journal header), to compare. Default:
    /// the setting's default.
    #[arg(long, value_name = "N")]
    pub journal_positions_min_batch: Option<usize>,
    /// Only measure saturation throughput and CPU per job with each of these shard counts
    /// (one in-process instance holding them all, a processor thread per shard).
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    pub shards: Option<Vec<u32>>,
    /// Only measure memory per pending job, with this many pending jobs (no broker needed).
    #[arg(long, value_name = "JOBS")]
    pub memory: Option<u64>,
    /// Payload bytes of each pending job in the memory measurement.
    #[arg(long, default_value_t = 64)]
    pub memory_payload: usize,
    /// Only measure the cost of reading queued records back from storage: this many pending
    /// jobs drained by one worker with their records in storage, then in memory (no broker
    /// needed).
    #[arg(long, value_name = "JOBS")]
    pub backlog_drain: Option<u64>,
    /// Only measure what a backlog waiting in storage costs the jobs beside it: 100,000 jobs
    /// drained by one worker of their pool, beside no backlog and beside this many pending
    /// jobs of another pool without workers (no broker needed).
    #[arg(long, value_name = "JOBS", conflicts_with = "backlog_drain")]
    pub backlog_beside: Option<u64>,
    /// Only measure saturation on the broker beside a backlog: the SDK workers' jobs at
    /// saturation with no backlog, then with this many jobs of the same pool waiting that
    /// no worker can take (a placement label none has), submitted through Kafka first.
    #[arg(long, value_name = "JOBS", conflicts_with_all = ["backlog_drain", "backlog_beside"])]
    pub saturation_beside: Option<u64>,
    /// (Internal) load the store in this directory and print what it cost.
    #[arg(long, hide = true, value_name = "DIR")]
    pub memory_load: Option<PathBuf>,
    /// Only measure timers (no broker needed): this many delayed jobs due over
    /// `--timers-window-secs`, then `--timers-schedules` schedules firing at one minute.
    #[arg(long, value_name = "JOBS")]
    pub timers: Option<u64>,
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub timers_window_secs: u64,
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub timers_schedules: u64,
    /// With `--timers`: stop once every delayed job waits (what waiting costs), without
    /// releasing them or making schedules.
    #[arg(long, requires = "timers")]
    pub timers_waiting_only: bool,
    /// Only measure delayed jobs end to end on the broker: this many jobs, submitted ahead
    /// of their times, due over `--timers-window-secs`, run by the SDK workers; due ->
    /// release decision and due -> dispatch committed, p50/p99/p999.
    #[arg(long, value_name = "JOBS", conflicts_with = "timers")]
    pub timers_dispatch: Option<u64>,
    /// Only measure a fan-out (no broker needed): this many jobs BLOCKED on one job, then
    /// that job ends and every one is released; memory while they wait, and the entries the
    /// release takes.
    #[arg(long, value_name = "JOBS", conflicts_with_all = ["timers", "timers_dispatch", "memory"])]
    pub fan_out: Option<u64>,
    /// Only measure a fan-in (no broker needed): a batch of this many jobs, run to their
    /// ends, into one callback; from the last member's result to the callback's dispatch.
    #[arg(long, value_name = "JOBS", conflicts_with_all = ["timers", "timers_dispatch", "memory", "fan_out"])]
    pub fan_in: Option<u64>,
    /// `processor.tick_interval_ms` (how often scheduler time moves), to compare. Default:
    /// the setting's default (1000).
    #[arg(long, value_name = "MS")]
    pub tick_interval_ms: Option<u64>,
    /// Only measure what concurrency keys cost: saturation with each job carrying one of
    /// this many keys, without limits and then with each key limited to `--flow-limit`.
    #[arg(long, value_name = "KEYS", conflicts_with_all = ["timers", "timers_dispatch", "memory", "shards"])]
    pub flow_keys: Option<u64>,
    /// With `--flow-keys`: the most jobs of one key at once.
    #[arg(long, default_value_t = 1, value_name = "N", requires = "flow_keys")]
    pub flow_limit: u32,
    /// Only measure fair share between tenants: a backlog of this many jobs of one tenant,
    /// then 100 of another (how long they wait); then this many of two tenants of weights
    /// 3 and 1 together (the share each gets). Workers are the bottleneck: each job takes
    /// `--fair-share-work-ms` at a worker.
    #[arg(long, value_name = "JOBS", conflicts_with_all = ["timers", "timers_dispatch", "memory", "shards", "flow_keys"])]
    pub fair_share: Option<u64>,
    /// With `--fair-share`: how long each job takes at a worker.
    #[arg(long, default_value_t = 20, value_name = "MS", requires = "fair_share")]
    pub fair_share_work_ms: u64,
    /// Only measure latency at these fixed rates (jobs a second): submit -> dispatch and
    /// submit -> handler start, after a short warm-up, without the raw pipe, the histories
    /// or the saturation turns (a level's `load` is then against a nominal 10,000 jobs/s).
    #[arg(long, value_delimiter = ',', value_name = "R,R,...", conflicts_with_all = ["timers", "timers_dispatch", "memory", "memory_load", "backlog_drain", "backlog_beside", "saturation_beside", "fan_out", "fan_in", "shards", "flow_keys", "fair_share"])]
    pub rates: Option<Vec<f64>>,
    #[command(flatten)]
    pub kafka: crate::kafka_args::KafkaArgs,
}

struct Sizes {
    baseline_records: u64,
    /// Baseline runs; the median is reported (one run on a shared machine is noisy).
    baseline_runs: usize,
    saturation_jobs: u64,
    level_seconds: f64,
    /// How long the idle-fleet phase lasts.
    idle_seconds: f64,
    small_history: u64,
    large_history: u64,
}

impl Sizes {
    fn of(smoke: bool) -> Sizes {
        if smoke {
            Sizes {
                baseline_records: 2_000,
                baseline_runs: 1,
                saturation_jobs: 300,
                level_seconds: 1.5,
                idle_seconds: 3.0,
                small_history: 1_000,
                large_history: 5_000,
            }
        } else {
            Sizes {
                baseline_records: 200_000,
                baseline_runs: 3,
                saturation_jobs: 50_000,
                level_seconds: 8.0,
                idle_seconds: 30.0,
                small_history: 100_000,
                large_history: 1_000_000,
            }
        }
    }
}

/// Most warm-up runs of the raw pipe before the measured turns.
const WARM_UP_RUNS: usize = 6;

/// Settings and rules of a bench scheduler under topic prefix `prefix`.
fn bench_config(
    kafka: &KafkaSettings,
    prefix: &str,
    data_dir: &Path,
    http: Option<String>,
) -> Config {
    let mut s = Settings {
        kafka: kafka.clone(),
        ..Settings::default()
    };
    s.topics.prefix = prefix.to_owned();
    s.topics.dispatch_partitions = 8;
    s.topics.job_partitions = 4;
    s.topics.results_partitions = 4;
    s.processor.group_id = format!("{prefix}processor");
    s.storage.data_dir = data_dir.to_owned();
    s.http.enabled = http.is_some();
    s.http.listen = http.unwrap_or_else(|| "127.0.0.1:0".into());
    s.log.level = "warn".into();
    s.scheduler.overload.cpu_load = 1000.0;
    let mut rules = Rules::default();
    rules
        .topics
        .insert(format!("{prefix}jobs"), vec!["default".into()]);
    rules.pools.insert("default".into(), PoolRules::default());
    rules.timing = s.scheduler.timing.clone();
    rules.retry = s.scheduler.retry.clone();
    rules.overload = s.scheduler.overload.clone();
    rules.breaker = s.scheduler.breaker.clone();
    let mut policy = PolicyBundle::default();
    policy.modules.insert(
        "input.rego".into(),
        "package ksched.input\ndefault allow := true\n".into(),
    );
    policy.data_json = "{}".into();
    Config {
        settings: s,
        rules,
        policy,
        source: None,
        framing: Default::default(),
    }
}

/// Creates the topics of `config` that are missing.
fn ensure_topics(config: &Config) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(ksched_runtime::topics::ensure_topics(
        &config.settings,
        &ksched_runtime::topics_of(config),
    ))?;
    Ok(())
}

/// Writes `config` as files `ksched run --config` reads.
fn write_config(config: &Config, dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir.join("policy"))?;
    for (name, text) in &config.policy.modules {
        std::fs::write(dir.join("policy").join(name), text)?;
    }
    let mut pools = String::from("topics:\n");
    for (t, p) in &config.rules.topics {
        pools.push_str(&format!("  {t}: [{}]\n", p.join(", ")));
    }
    pools.push_str("pools:\n");
    for p in config.rules.pools.keys() {
        pools.push_str(&format!("  {p}: {{}}\n"));
    }
    std::fs::write(dir.join("pools.yaml"), pools)?;
    let mut settings = config.settings.clone();
    settings.pools_file = dir.join("pools.yaml");
    settings.policy_dir = dir.join("policy");
    let path = dir.join("ksched.yaml");
    std::fs::write(&path, serde_norway::to_string(&settings)?)?;
    Ok(path)
}

/// Sends `record`, serving delivery reports while the producer's queue is full; any other
/// error is returned.
fn send<K, P>(producer: &BaseProducer, mut record: BaseRecord<'_, K, P>) -> Result<()>
where
    K: ToBytes + ?Sized,
    P: ToBytes + ?Sized,
{
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                ksched_runtime::topics::serve_deliveries(producer);
                record = r;
            }
            Err((e, _)) => return Err(e).context("producing a bench record"),
        }
    }
}

/// A `read_committed` consumer of the journal's first `partitions` partitions (the shards),
/// positioned at their current ends: it sees what is committed from now on.
fn journal_from_end(
    client: &ClientConfig,
    journal: &str,
    partitions: i32,
    group: &str,
) -> Result<BaseConsumer> {
    let consumer: BaseConsumer = client
        .clone()
        .set("group.id", group)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        // An idle tail need not ask 200 times a second: the broker answers a read_committed
        // fetch as soon as a commit moves the last stable offset (as the processor's and the
        // workers' consumers do).
        .set("fetch.wait.max.ms", "500")
        .set("fetch.queue.backoff.ms", "1")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions.max(1) {
        let (_, high) = consumer.fetch_watermarks(journal, p, Duration::from_secs(30))?;
        tpl.add_partition_offset(journal, p, Offset::Offset(high))?;
    }
    consumer.assign(&tpl)?;
    Ok(consumer)
}

/// The bench's Kafka settings (the broker and client properties given) and the client
/// configuration they make.
fn kafka_clients(args: &BenchArgs) -> Result<(KafkaSettings, ClientConfig)> {
    let kafka = KafkaSettings {
        bootstrap_servers: args.bootstrap_servers.clone(),
        client_id: "ksched-bench".into(),
        properties: args.kafka.properties()?.into_iter().collect(),
    };
    let client = ksched_runtime::topics::client_config(&Settings {
        kafka: kafka.clone(),
        ..Settings::default()
    });
    Ok((kafka, client))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_default();
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    format!("{cpus} cores ({model}), {mem_gib:.0} GiB, broker on the same machine")
}

pub(crate) fn main(args: BenchArgs) -> ExitCode {
    match bench(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ksched bench: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn phase(name: &str) {
    eprintln!("bench: {name}");
}

impl BenchArgs {
    /// The SDK workers of the end-to-end runs.
    fn fleet(&self) -> e2e::Fleet {
        e2e::Fleet {
            workers: self.workers,
            slots: self.worker_slots,
            work_ms: 0,
            submit_linger_ms: self.submit_linger_ms,
        }
    }
}

/// The processor settings the bench's flags switch, for comparison runs.
fn tune(args: &BenchArgs, config: &mut Config) {
    let p = &mut config.settings.processor;
    p.pipelined = args.pipelined;
    if let Some(n) = args.max_batch {
        p.max_batch = n;
    }
    p.coalesce_heartbeats = !args.keep_heartbeats;
    if let Some(n) = args.transactional_producers {
        p.transactional_producers = n;
    }
    if let Some(ms) = args.group_offsets_interval_ms {
        p.group_offsets_interval_ms = ms;
    }
    if let Some(n) = args.journal_positions_min_batch {
        p.journal_positions_min_batch = n;
    }
    if let Some(ms) = args.tick_interval_ms {
        p.tick_interval_ms = ms;
        p.input_stall_ms = p.input_stall_ms.max(ms.saturating_mul(10));
    }
}

fn bench(args: BenchArgs) -> Result<()> {
    // The in-process services and librdkafka log to stderr only when asked, e.g.
    // `RUST_LOG=librdkafka=debug ksched bench -X debug=eos`; the figures stay on stdout.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    if let Some(dir) = &args.memory_load {
        return memory::load(dir);
    }
    if let Some(jobs) = args.memory {
        return memory_only(&args, jobs);
    }
    if let Some(jobs) = args.backlog_drain {
        return memory::drain_only(&args, jobs);
    }
    if let Some(jobs) = args.backlog_beside {
        return memory::beside_only(&args, jobs);
    }
    if let Some(jobs) = args.saturation_beside {
        return flow::saturation_beside_only(&args, jobs);
    }
    if let Some(jobs) = args.timers {
        return timers::timers_only(&args, jobs);
    }
    if let Some(jobs) = args.timers_dispatch {
        return timers::dispatch_only(&args, jobs);
    }
    if let Some(jobs) = args.fan_out {
        return dependencies::fan_out_only(&args, jobs);
    }
    if let Some(jobs) = args.fan_in {
        return batches::fan_in_only(&args, jobs);
    }
    if let Some(counts) = &args.shards {
        return shards_only(&args, counts);
    }
    if let Some(keys) = args.flow_keys {
        return flow::keys_only(&args, keys);
    }
    if let Some(jobs) = args.fair_share {
        return flow::fair_share_only(&args, jobs);
    }
    if let Some(rates) = &args.rates {
        return rates_only(&args, rates);
    }
    let total = Instant::now();
    let sizes = Sizes::of(args.smoke);
    let run = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let work = match &args.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(&run),
    };
    std::fs::create_dir_all(&work)?;
    let _cleanup = Cleanup(if args.work_dir.is_none() {
        Some(work.clone())
    } else {
        None
    });
    let (kafka, client) = kafka_clients(&args)?;

    // 1. A history of `small_history` jobs, rebuilt into a projection.
    let rt = tokio::runtime::Runtime::new()?;
    let defaults = Settings::default().processor;
    phase(&format!(
        "history: {} jobs written and rebuilt",
        sizes.small_history
    ));
    let small_prefix = format!("{run}.small.");
    let small_dir = work.join("small");
    let mut small_cfg = bench_config(&kafka, &small_prefix, &small_dir, None);
    tune(&args, &mut small_cfg);
    let transactional_producers = small_cfg.settings.processor.transactional_producers;
    let group_offsets_interval_ms = small_cfg.settings.processor.group_offsets_interval_ms;
    let journal_positions_min_batch = small_cfg.settings.processor.journal_positions_min_batch;
    rt.block_on(ksched_runtime::topics::ensure_topics(
        &small_cfg.settings,
        &ksched_runtime::topics_of(&small_cfg),
    ))?;
    let history_small = history::build(&client, &small_cfg, sizes.small_history, &small_dir)?;
    eprintln!(
        "        rebuild {:.0} events/s",
        history_small.rebuild_events_per_sec
    );

    // 2. The raw Kafka pipe and the scheduler at saturation, warmed up, then measured in
    // turns (pipe, scheduler, pipe, scheduler, ...), so that a broker or machine that speeds
    // up or slows down during the bench weighs on both alike.
    let sample = JobRequest {
        job_id: format!("{run}.small-1234567"),
        topic: format!("{run}.small.jobs"),
        tenant_id: "tenant-1".into(),
        ..Default::default()
    };
    let record_bytes = ksched_codec::encode(&sample)?.len();
    let pipe = |name: &str, records: u64| -> Result<baseline::Baseline> {
        let pipe_in = format!("{run}.baseline-{name}.in");
        let pipe_out = format!("{run}.baseline-{name}.out");
        rt.block_on(create_topics(&client, &[(&pipe_in, 4), (&pipe_out, 1)]))?;
        let machine0 = machine::read();
        let mut b = baseline::run(
            &client,
            &pipe_in,
            &pipe_out,
            records,
            record_bytes,
            defaults.max_batch,
            Duration::from_millis(defaults.commit_interval_ms),
        )?;
        b.machine_busy_cores =
            machine::Usage::between(&machine0, &machine::read()).map(|m| m.busy_cores);
        Ok(b)
    };
    phase("warm-up: the raw pipe and the scheduler, not measured");
    // A broker just started runs the pipe several times slower at first (measured: 8k, 16k,
    // then 30k jobs/s of physical limit in three turns): pipe runs until two in a row agree
    // within 15 % (at most `WARM_UP_RUNS`). That is not always enough (after a restart, six
    // runs climbed from 6k to 12k records/s and the turns went on climbing): the turns'
    // figures are reported one by one for that reason.
    let mut last: Option<f64> = None;
    for i in 0..if args.smoke { 1 } else { WARM_UP_RUNS } {
        let rate = pipe(
            &format!("warm-up-{i}"),
            (sizes.baseline_records / 4).max(1_000),
        )?
        .records_per_sec;
        eprintln!("        warm-up pipe {}: {rate:.0} records/s", i + 1);
        if last.is_some_and(|l| (rate - l).abs() <= 0.15 * l.max(rate)) {
            break;
        }
        last = Some(rate);
    }
    let mut rig = e2e::Rig::start(small_cfg, client.clone(), args.fleet(), "e2e")?;
    rig.saturation((sizes.saturation_jobs / 10).max(50))?;
    let mut pipes = Vec::new();
    let mut saturations = Vec::new();
    for i in 0..sizes.baseline_runs {
        phase(&format!(
            "turn {} of {}: raw Kafka pipe (transactional consume -> produce), then the scheduler at saturation",
            i + 1,
            sizes.baseline_runs
        ));
        let b = pipe(&i.to_string(), sizes.baseline_records)?;
        let s = rig.saturation(sizes.saturation_jobs)?;
        eprintln!(
            "        pipe {:.0} records/s; scheduler {:.0} jobs/s (mean batch {:.0} records, {:.1} ms), {:.2} of the physical limit",
            b.records_per_sec,
            s.jobs_per_sec,
            s.mean_batch,
            s.mean_batch_ms,
            s.jobs_per_sec / b.physical_limit_jobs_per_sec()
        );
        if let Some(m) = &s.machine {
            let (machine, scheduler) = m.per_job_us(s.jobs);
            eprintln!(
                "        machine busy {} of {} cores during the pipe, {:.2} during the scheduler's run: {machine:.0} us per job, the scheduler's own threads {scheduler:.0} us; at most {} jobs/s if those cost nothing",
                or_dash(b.machine_busy_cores, 2),
                m.cores,
                m.busy_cores,
                or_dash(m.free_scheduler_ceiling(s.jobs), 0)
            );
        }
        pipes.push(b);
        saturations.push(s);
    }
    let turns: Vec<Turn> = pipes
        .iter()
        .zip(&saturations)
        .map(|(b, s)| Turn {
            pipe_records_per_sec: b.records_per_sec,
            physical_limit_jobs_per_sec: b.physical_limit_jobs_per_sec(),
            jobs_per_sec: s.jobs_per_sec,
            of_physical_limit: s.jobs_per_sec / b.physical_limit_jobs_per_sec(),
            pipe_busy_cores: b.machine_busy_cores,
            saturation_busy_cores: s.machine.as_ref().map(|m| m.busy_cores),
        })
        .collect();
    let baseline = baseline::Baseline::median(pipes);
    let saturation_small = e2e::Saturation::median(saturations);

    let mut levels = Vec::new();
    for load in [0.25, 0.5, 0.8] {
        phase(&format!("end to end: {:.0} % of saturation", load * 100.0));
        let l = rig.level(load, saturation_small.jobs_per_sec, sizes.level_seconds)?;
        eprintln!(
            "        dispatch p50 {:.1} ms p99 {:.1} ms; completed p50 {:.1} ms p99 {:.1} ms; mean batch {:.0} records, {:.1} ms",
            l.submit_to_dispatch_ms.p50,
            l.submit_to_dispatch_ms.p99,
            l.submit_to_completed_ms.p50,
            l.submit_to_completed_ms.p99,
            l.mean_batch,
            l.mean_batch_ms
        );
        eprintln!(
            "        dispatch parts p50 / p99: {}",
            l.dispatch_parts.figures()
        );
        if let Some(m) = &l.machine {
            eprintln!("        {}", m.level_figures());
        }
        levels.push(l);
    }
    let mut rate_levels = Vec::new();
    for rate in RATES {
        rate_levels.push(rate_level(
            &mut rig,
            rate,
            saturation_small.jobs_per_sec,
            sizes.level_seconds,
        )?);
    }
    phase("an idle fleet: no jobs, the workers heartbeating");
    let idle = rig.idle(sizes.idle_seconds)?;
    rig.stop()?;

    let large = if args.skip_large {
        None
    } else {
        Some(large_phases(&args, &sizes, &kafka, &client, &run, &work)?)
    };

    let ratio = saturation_small.jobs_per_sec * saturation_small.kafka_records_per_job
        / baseline.io_records_per_sec;
    let of_physical_limit = median_of(turns.iter().map(|t| t.of_physical_limit).collect());
    let report = Report {
        machine: machine(),
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        smoke: args.smoke,
        baseline,
        turns,
        of_physical_limit,
        history_small,
        saturation_small_history: saturation_small,
        levels,
        rate_levels,
        idle,
        large,
        ratio,
        commit_interval_ms: defaults.commit_interval_ms,
        pipelined: args.pipelined,
        fleet: args.fleet(),
        max_batch: args.max_batch.unwrap_or(defaults.max_batch),
        coalesce_heartbeats: !args.keep_heartbeats,
        transactional_producers,
        group_offsets_interval_ms,
        journal_positions_min_batch,
        total_seconds: total.elapsed().as_secs_f64(),
    };
    print_table(&report);
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("results written to {}", args.out.display());
    Ok(())
}

/// One latency level at `rate` jobs/s, its figures printed as it ends.
fn rate_level(rig: &mut e2e::Rig, rate: f64, saturation: f64, seconds: f64) -> Result<e2e::Level> {
    phase(&format!("end to end: {rate:.0} jobs/s"));
    let l = rig.level_at(rate, saturation, seconds)?;
    eprintln!(
        "        submit -> dispatch {}; -> handler start {}; mean batch {:.0} records, {:.1} ms",
        l.submit_to_dispatch_ms.figures(),
        l.submit_to_handler_ms.figures(),
        l.mean_batch,
        l.mean_batch_ms
    );
    eprintln!(
        "        dispatch parts p50 / p99: {}",
        l.dispatch_parts.figures()
    );
    eprintln!(
        "        batch phases, ms a batch: {}",
        l.phase_ms_per_batch
            .iter()
            .map(|(k, v)| format!("{k} {v:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(m) = &l.machine {
        eprintln!("        {}", m.level_figures());
    }
    if let Some(j) = l.slowest_to_handler.first() {
        eprintln!("        slowest to a handler: {}", j.figures());
    }
    Ok(l)
}

/// `bench --rates`: the latency levels at the given rates only, on a warmed-up rig; the
/// settings and the levels so far are written to `--out` as JSON after each level, and a
/// line per level is printed on stdout at the end.
fn rates_only(args: &BenchArgs, rates: &[f64]) -> Result<()> {
    anyhow::ensure!(
        rates
            .iter()
            .all(|r| r.is_finite() && (MIN_RATE..=MAX_RATE).contains(r)),
        "--rates takes jobs-a-second figures from {MIN_RATE} to {MAX_RATE}"
    );
    anyhow::ensure!(
        rates.len() <= MAX_RATES,
        "--rates takes at most {MAX_RATES} rates"
    );
    let sizes = Sizes::of(args.smoke);
    let run = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let scratch = tempfile::tempdir()?;
    let work = args.work_dir.as_deref().unwrap_or(scratch.path());
    let (kafka, client) = kafka_clients(args)?;
    let prefix = format!("{run}.rates.");
    let mut config = bench_config(&kafka, &prefix, &work.join(&run), None);
    tune(args, &mut config);
    let p = &config.settings.processor;
    let mut report = RatesReport {
        machine: machine(),
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        fleet: args.fleet(),
        pipelined: p.pipelined,
        max_batch: p.max_batch,
        coalesce_heartbeats: p.coalesce_heartbeats,
        transactional_producers: p.transactional_producers,
        group_offsets_interval_ms: p.group_offsets_interval_ms,
        journal_positions_min_batch: p.journal_positions_min_batch,
        kafka_properties: kafka.masked_properties(),
        levels: Vec::new(),
    };
    ensure_topics(&config)?;
    let mut rig = e2e::Rig::start(config, client, args.fleet(), "rates")?;
    phase("warm-up: a short run at saturation, not measured");
    rig.saturation((sizes.saturation_jobs / 10).max(50))?;
    for rate in rates {
        let level = rate_level(&mut rig, *rate, NOMINAL_SATURATION, sizes.level_seconds)?;
        report.levels.push(level);
        std::fs::write(&args.out, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", args.out.display()))?;
    }
    rig.stop()?;
    for l in &report.levels {
        println!(
            "{:>8.0} jobs/s offered: submit -> dispatch {}; submit -> handler start {}",
            l.offered_jobs_per_sec,
            l.submit_to_dispatch_ms.figures(),
            l.submit_to_handler_ms.figures()
        );
    }
    eprintln!("results written to {}", args.out.display());
    Ok(())
}

/// What `bench --rates` writes: the settings it ran with, and its levels.
#[derive(Debug, serde::Serialize)]
struct RatesReport {
    machine: String,
    build: &'static str,
    fleet: e2e::Fleet,
    pipelined: bool,
    max_batch: usize,
    coalesce_heartbeats: bool,
    transactional_producers: u8,
    group_offsets_interval_ms: u64,
    journal_positions_min_batch: usize,
    /// The librdkafka properties given (`-X`, `--command-config`), secrets masked.
    kafka_properties: std::collections::BTreeMap<String, String>,
    levels: Vec<e2e::Level>,
}

/// The rates `bench --rates` offers: at least a job a second, and at most what keeps a
/// level to 400,000 jobs (their timings are held until the run ends).
const MIN_RATE: f64 = 1.0;
const MAX_RATE: f64 = 50_000.0;
/// Most levels one `bench --rates` runs.
const MAX_RATES: usize = 20;

/// What `bench --rates` reports a level's load against: it measures no saturation.
const NOMINAL_SATURATION: f64 = 10_000.0;

/// The large history, rebuilt (the replay figure); recovery after SIGKILL; saturation on it;
/// failover between two instances on it.
fn large_phases(
    args: &BenchArgs,
    sizes: &Sizes,
    kafka: &KafkaSettings,
    client: &ClientConfig,
    run: &str,
    work: &Path,
) -> Result<Large> {
    let rt = tokio::runtime::Runtime::new()?;
    let kafka = kafka.clone();
    // 4. A large history, rebuilt (the replay figure), then saturation on it.
    phase(&format!(
        "history: {} jobs written and rebuilt",
        sizes.large_history
    ));
    let large_prefix = format!("{run}.large.");
    let large_dir = work.join("large");
    let port = free_port()?;
    let mut large_cfg = bench_config(
        &kafka,
        &large_prefix,
        &large_dir,
        Some(format!("127.0.0.1:{port}")),
    );
    tune(args, &mut large_cfg);
    rt.block_on(ksched_runtime::topics::ensure_topics(
        &large_cfg.settings,
        &ksched_runtime::topics_of(&large_cfg),
    ))?;
    let history_large = history::build(client, &large_cfg, sizes.large_history, &large_dir)?;
    eprintln!(
        "        rebuild {:.0} events/s",
        history_large.rebuild_events_per_sec
    );

    // 5. Recovery after SIGKILL, as a child process, with that history.
    phase("recovery: ksched run killed with SIGKILL under load, restarted");
    let config_file = write_config(&large_cfg, &work.join("large-config"))?;
    let recovery = recovery::run(
        client,
        &config_file,
        &format!("http://127.0.0.1:{port}"),
        &format!("{large_prefix}jobs"),
        &ksched_runtime::topics_of(&large_cfg).journal,
        sizes.large_history,
        &work.join("recovery.log"),
    )?;
    eprintln!(
        "        ready {:.2} s after restart, first decision at {:.2} s",
        recovery.recovery_seconds, recovery.first_decision_seconds
    );

    phase("end to end: saturation with the large history");
    let mut large_no_http = large_cfg.clone();
    large_no_http.settings.http.enabled = false;
    let mut rig = e2e::Rig::start(large_no_http, client.clone(), args.fleet(), "e2e-large")?;
    rig.saturation((sizes.saturation_jobs / 10).max(50))?;
    let saturation_large = rig.saturation(sizes.saturation_jobs)?;
    eprintln!(
        "        {:.0} jobs/s (mean batch {:.0} records, {:.1} ms)",
        saturation_large.jobs_per_sec, saturation_large.mean_batch, saturation_large.mean_batch_ms
    );
    rig.stop()?;

    // 7. Failover between two instances on that history, and a new owner without a standby.
    phase(&format!(
        "failover: owner and standby on {} jobs of history (lease session timeout {} ms)",
        sizes.large_history, args.lease_session_ms
    ));
    let failover = failover::run(&failover::Setup {
        client,
        config: &large_cfg,
        job_topic: &format!("{large_prefix}jobs"),
        journal_topic: &ksched_runtime::topics_of(&large_cfg).journal,
        history_jobs: sizes.large_history,
        work,
        lease_session_timeout_ms: args.lease_session_ms,
    })?;
    eprintln!(
        "        owner killed: standby owns at {:.2} s, first decision at {:.2} s; owner stopped: standby owns at {:.2} s, a job sent at the signal decided at {:.2} s; no standby: {:.2} s",
        failover.killed_to_owned_seconds,
        failover.killed_to_first_decision_seconds,
        failover.stopped_to_owned_seconds,
        failover.stopped_to_first_decision_seconds,
        failover.killed_to_first_decision_without_standby_seconds
    );

    Ok(Large {
        history_large,
        saturation_large_history: saturation_large,
        recovery,
        failover,
    })
}

struct Cleanup(Option<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

async fn create_topics(client: &ClientConfig, topics: &[(&str, i32)]) -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = client.create()?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(n, p)| NewTopic::new(n, *p, TopicReplication::Fixed(1)))
        .collect();
    for r in admin.create_topics(&new, &AdminOptions::new()).await? {
        if let Err((t, e)) = r {
            anyhow::bail!("creating {t}: {e}");
        }
    }
    Ok(())
}
