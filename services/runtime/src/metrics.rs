//! Prometheus metrics of the scheduler. Names are constants here, in one place.

use std::collections::BTreeMap;

use ksched_core::events::{Event, JobState, JournalEntry};
use ksched_core::reason::DlqReason;
use ksched_core::state::State;
use prometheus::{
    Counter, CounterVec, Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

pub const JOBS: &str = "ksched_jobs";
pub const QUEUE_DEPTH: &str = "ksched_queue_depth";
pub const JOBS_WAITING: &str = "ksched_jobs_waiting";
pub const WORKERS: &str = "ksched_workers";
pub const DISPATCH_LATENCY: &str = "ksched_dispatch_latency_seconds";
pub const DEAD_LETTERS: &str = "ksched_dead_letters_total";
pub const EVENTS: &str = "ksched_events_total";
pub const JOURNAL_ENTRIES: &str = "ksched_journal_entries_total";
pub const COMMIT_LATENCY: &str = "ksched_transaction_commit_seconds";
pub const BATCH_SIZE: &str = "ksched_batch_size";
pub const CONSUMER_LAG: &str = "ksched_consumer_lag";
pub const ROCKSDB_SIZE: &str = "ksched_rocksdb_size_bytes";
pub const JOBS_IN_MEMORY: &str = "ksched_jobs_in_memory";
pub const WATERMARK: &str = "ksched_journal_watermark";
pub const CAUGHT_UP: &str = "ksched_caught_up";
pub const RECOVERIES: &str = "ksched_processor_recoveries_total";
pub const SET_ASIDE: &str = "ksched_inputs_set_aside_total";
pub const HEARTBEATS_COALESCED: &str = "ksched_heartbeats_coalesced_total";
pub const ISOLATIONS: &str = "ksched_batches_isolated_total";
pub const UNREADABLE: &str = "ksched_unreadable_records_total";
pub const CONTINUATIONS: &str = "ksched_continuations_total";
pub const STOPPED: &str = "ksched_processor_stopped";
pub const SHARD_OWNER: &str = "ksched_shard_owner";
pub const SHARD_STANDBY: &str = "ksched_shard_standby";
pub const PROCESSOR_CPU: &str = "ksched_processor_cpu_seconds_total";
pub const RECORDS: &str = "ksched_records_total";
pub const BATCH_PHASES: &str = "ksched_batch_phase_seconds_total";
pub const RECORD_BYTES: &str = "ksched_record_bytes_total";

/// The `reason` label of a dead letter whose reason is a worker's own error code: worker
/// codes are free text, and a label value per code would let any worker grow the metric
/// without bound.
pub const WORKER_ERROR_LABEL: &str = "worker_error";
/// The `pool` label of workers whose heartbeat names a pool the configuration lacks.
pub const UNCONFIGURED_POOL_LABEL: &str = "unconfigured";

/// The counters of one direction and topic role of `ksched_records_total` and
/// `ksched_record_bytes_total`.
#[derive(Debug, Clone)]
pub struct RecordCounters {
    records: IntCounter,
    bytes: IntCounter,
}

impl RecordCounters {
    /// Counts one record of `bytes` key and value bytes.
    pub fn count(&self, bytes: usize) {
        self.records.inc();
        self.bytes.inc_by(bytes as u64);
    }
}

/// Every metric of the process.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub jobs: IntGaugeVec,
    pub queue_depth: IntGaugeVec,
    pub jobs_waiting: IntGaugeVec,
    pub workers: IntGaugeVec,
    pub dispatch_latency: Histogram,
    pub dead_letters: IntCounterVec,
    pub events: IntCounterVec,
    pub journal_entries: IntCounter,
    pub commit_latency: Histogram,
    pub batch_size: Histogram,
    pub consumer_lag: IntGaugeVec,
    pub rocksdb_size: IntGauge,
    pub jobs_in_memory: IntGauge,
    pub watermark: IntGauge,
    pub caught_up: Gauge,
    pub recoveries: IntCounter,
    pub set_aside: IntCounter,
    pub heartbeats_coalesced: IntCounter,
    pub isolations: IntCounter,
    pub unreadable: IntCounter,
    pub continuations: IntCounter,
    pub stopped: IntGauge,
    pub shard_owner: IntGauge,
    pub shard_standby: IntGauge,
    pub processor_cpu: Counter,
    pub records: IntCounterVec,
    pub record_bytes: IntCounterVec,
    pub batch_phases: CounterVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    reg(
        r,
        IntCounter::new(name, help).unwrap_or_else(|e| unreachable!("{e}")),
    )
}

fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, m: T) -> T {
    r.register(Box::new(m.clone()))
        .unwrap_or_else(|e| unreachable!("metric names are unique constants: {e}"));
    m
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::for_shard(None)
    }

    /// The metrics of one shard's processor: every series carries `shard="<n>"` (a scheduler
    /// with one shard labels nothing, as before shards).
    pub fn for_shard(shard: Option<i32>) -> Metrics {
        let labels = shard.map(|s| [("shard".to_owned(), s.to_string())].into());
        let r = Registry::new_custom(None, labels).unwrap_or_else(|e| unreachable!("{e}"));
        let latency_buckets = vec![
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        ];
        let g = |name: &str, help: &str, labels: &[&str]| {
            IntGaugeVec::new(Opts::new(name, help), labels).unwrap_or_else(|e| unreachable!("{e}"))
        };
        Metrics {
            jobs: reg(&r, g(JOBS, "Jobs by state.", &["state"])),
            queue_depth: reg(
                &r,
                g(
                    QUEUE_DEPTH,
                    "Jobs waiting in each pool's pending queue.",
                    &["pool"],
                ),
            ),
            jobs_waiting: reg(
                &r,
                g(
                    JOBS_WAITING,
                    "Queued jobs by the reason they wait (the last JobWaiting of each: no_workers, pool_overloaded, tenant_limit, circuit_open, concurrency_limited, rate_limited, ...).",
                    &["reason"],
                ),
            ),
            workers: reg(
                &r,
                g(
                    WORKERS,
                    "Known workers by pool and liveness.",
                    &["pool", "alive"],
                ),
            ),
            dispatch_latency: reg(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        DISPATCH_LATENCY,
                        "From a job's acceptance to its first dispatch, in log time.",
                    )
                    .buckets(latency_buckets.clone()),
                )
                .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            dead_letters: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(DEAD_LETTERS, "Dead letters by reason code."),
                    &["reason"],
                )
                .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            events: reg(
                &r,
                IntCounterVec::new(Opts::new(EVENTS, "Journal events by type."), &["event"])
                    .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            journal_entries: reg(
                &r,
                IntCounter::new(
                    JOURNAL_ENTRIES,
                    "Inputs processed (journal entries written).",
                )
                .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            commit_latency: reg(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(COMMIT_LATENCY, "Kafka transaction commit time per batch.")
                        .buckets(latency_buckets),
                )
                .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            batch_size: reg(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(BATCH_SIZE, "Input records per transaction.").buckets(vec![
                        1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0,
                    ]),
                )
                .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            consumer_lag: reg(
                &r,
                g(
                    CONSUMER_LAG,
                    "Input records not yet processed, per topic.",
                    &["topic"],
                ),
            ),
            jobs_in_memory: reg(
                &r,
                IntGauge::new(
                    JOBS_IN_MEMORY,
                    "Job records the processor holds in memory: the active ones, the first queued ones of each lane, and others until they are written and evicted.",
                )
                .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            rocksdb_size: reg(
                &r,
                IntGauge::new(ROCKSDB_SIZE, "Size of the RocksDB projection's SST files.")
                    .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            watermark: reg(
                &r,
                IntGauge::new(WATERMARK, "Last journal offset reflected in RocksDB.")
                    .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            caught_up: reg(
                &r,
                Gauge::new(
                    CAUGHT_UP,
                    "1 when the processor has recovered and consumes inputs.",
                )
                .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            recoveries: reg(
                &r,
                IntCounter::new(
                    RECOVERIES,
                    "Times the processor was rebuilt after a failure.",
                )
                .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            set_aside: counter(
                &r,
                SET_ASIDE,
                "Inputs dead-lettered as processing_failed after processing them failed.",
            ),
            heartbeats_coalesced: counter(
                &r,
                HEARTBEATS_COALESCED,
                "Heartbeats of idle workers left out of the journal: they changed nothing decisions read (processor.coalesce_heartbeats).",
            ),
            isolations: counter(
                &r,
                ISOLATIONS,
                "Failed batches retried input by input to find the failing input.",
            ),
            unreadable: counter(
                &r,
                UNREADABLE,
                "Records the input consumer could not read (dead-lettered as unreadable_record).",
            ),
            continuations: counter(
                &r,
                CONTINUATIONS,
                "Journal entries that continued work cut at the per-entry bound.",
            ),
            stopped: reg(
                &r,
                IntGauge::new(
                    STOPPED,
                    "1 when the processor stopped for good (another instance took over).",
                )
                .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            shard_owner: reg(
                &r,
                IntGauge::new(
                    SHARD_OWNER,
                    "1 when this instance owns its shard and runs the processor, 0 while it stands by.",
                )
                .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            shard_standby: reg(
                &r,
                IntGauge::new(
                    SHARD_STANDBY,
                    "1 while this instance stands by for the shard (tails its journal), 0 otherwise.",
                )
                .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            processor_cpu: reg(
                &r,
                Counter::new(
                    PROCESSOR_CPU,
                    "CPU time of the processor's threads: the deciding thread (decoding, deciding, encoding), its transaction thread (offsets, commits), the threads that serve its producers' delivery reports and the thread that writes its projection to RocksDB; not librdkafka's own threads. From each thread's CPU clock.",
                )
                .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            records: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        RECORDS,
                        "Kafka records the processor consumed (direction in) and produced (out), by the topic's role.",
                    ),
                    &["direction", "topic"],
                )
                .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            record_bytes: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        RECORD_BYTES,
                        "Key and value bytes of the records the processor consumed (in) and produced (out), by the topic's role.",
                    ),
                    &["direction", "topic"],
                )
                .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            batch_phases: reg(
                &r,
                CounterVec::new(
                    Opts::new(
                        BATCH_PHASES,
                        "Time the processor spent in each phase of its batches: decide (decide, journal and produce every input), offsets (send_offsets_to_transaction), deliveries (await the produced records' acknowledgements), commit (commit_transaction), persist (write the projection to RocksDB).",
                    ),
                    &["phase"],
                )
                .unwrap_or_else(|e| unreachable!("{e}")),
            ),
            registry: r,
        }
    }

    /// Input records not yet processed on `topic` (only topics ksched consumes).
    pub fn set_consumer_lag(&self, topic: &str, lag: i64) {
        self.consumer_lag.with_label_values(&[topic]).set(lag);
    }

    /// One processed input.
    pub fn entry(&self, entry: &JournalEntry, state: &State) {
        self.journal_entries.inc();
        for e in &entry.events {
            self.events.with_label_values(&[e.name()]).inc();
            match e {
                Event::DeadLettered(d) => {
                    let code = d.dead_letter.reason_code.as_str();
                    let label = if DlqReason::parse(code).is_some() {
                        code
                    } else {
                        WORKER_ERROR_LABEL
                    };
                    self.dead_letters.with_label_values(&[label]).inc()
                }
                Event::JobDispatched(d) if d.attempt == 1 => {
                    if let Some(job) = state.jobs.get(&d.job_id) {
                        let secs = (entry.log_time - job.accepted_at).max(0) as f64 / 1000.0;
                        self.dispatch_latency.observe(secs);
                    }
                }
                _ => {}
            }
        }
    }

    /// The record and byte counters of `direction` (`in`, `out`) and topic role `topic`,
    /// resolved once (the processor counts every record it reads and writes).
    pub fn record_counters(&self, direction: &str, topic: &str) -> RecordCounters {
        RecordCounters {
            records: self.records.with_label_values(&[direction, topic]),
            bytes: self.record_bytes.with_label_values(&[direction, topic]),
        }
    }

    /// Adds the CPU time the calling thread used since `last` (its previous reading, updated).
    pub fn add_thread_cpu(&self, last: &mut Option<f64>) {
        add_thread_cpu(&self.processor_cpu, last);
    }

    /// After a batch: gauges from the state.
    pub fn batch(&self, records: usize, commit_secs: f64, state: &State) {
        self.batch_size.observe(records as f64);
        self.commit_latency.observe(commit_secs);
        self.gauges(state);
    }

    pub fn gauges(&self, state: &State) {
        for st in JobState::ALL {
            let n = state.jobs_by_state.get(&st).copied().unwrap_or(0);
            self.jobs
                .with_label_values(&[st.as_str()])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.jobs_in_memory
            .set(i64::try_from(state.jobs.len()).unwrap_or(i64::MAX));
        self.queue_depth.reset();
        for (pool, n) in &state.queued {
            self.queue_depth
                .with_label_values(&[pool.as_str()])
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        self.jobs_waiting.reset();
        for (reason, n) in &state.waiting_by_reason {
            self.jobs_waiting.with_label_values(&[reason]).set(*n);
        }
        let mut workers: BTreeMap<(&str, bool), i64> = BTreeMap::new();
        let configured = |pool: &str| state.rules().is_some_and(|r| r.pools.contains_key(pool));
        for w in state.workers.values() {
            let pool = w.heartbeat.pool.as_str();
            let label = if configured(pool) {
                pool
            } else {
                UNCONFIGURED_POOL_LABEL
            };
            *workers.entry((label, w.alive)).or_default() += 1;
        }
        self.workers.reset();
        for ((pool, alive), n) in workers {
            self.workers
                .with_label_values(&[pool, if alive { "true" } else { "false" }])
                .set(n);
        }
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        render_all([self])
    }
}

/// What this binary is: the package version, the git commit it was built from
/// (`-modified` when the checkout had changes; `unknown` outside git) and the compiler.
#[derive(Debug, Clone, Copy)]
pub struct BuildInfo {
    pub version: &'static str,
    pub commit: &'static str,
    pub rustc: &'static str,
}

/// This build's [`BuildInfo`].
pub const BUILD: BuildInfo = BuildInfo {
    version: env!("CARGO_PKG_VERSION"),
    commit: env!("KSCHED_GIT_COMMIT"),
    rustc: env!("KSCHED_RUSTC_VERSION"),
};

/// `ksched_codec_fast_writer_off`: 1 once the fast Avro writer was turned off in this
/// process (a record it wrote differed from apache-avro's, `ksched_codec::fast_writer_off`).
fn fast_writer_off() -> &'static IntGauge {
    static GAUGE: std::sync::OnceLock<IntGauge> = std::sync::OnceLock::new();
    GAUGE.get_or_init(|| {
        IntGauge::new(
            "ksched_codec_fast_writer_off",
            "1 once a record the fast Avro writer wrote differed from apache-avro's and the fast writer was turned off (a bug to report); 0 otherwise.",
        )
        .unwrap_or_else(|e| unreachable!("{e}"))
    })
}

/// Series of the whole process, rendered once whatever the shard count:
/// `ksched_build_info` (1, labelled with [`BUILD`]), `ksched_codec_fast_writer_off` and the
/// standard `process_*` series (CPU seconds, resident and virtual memory, open and maximum
/// file descriptors, threads, start time; read from /proc).
fn process_registry() -> &'static prometheus::Registry {
    static REGISTRY: std::sync::OnceLock<prometheus::Registry> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(|| {
        let r = prometheus::Registry::new();
        let _ = r.register(Box::new(fast_writer_off().clone()));
        let info = IntGaugeVec::new(
            Opts::new(
                "ksched_build_info",
                "1, labelled with the version, git commit and compiler this binary was built with.",
            ),
            &["version", "commit", "rustc"],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        info.with_label_values(&[BUILD.version, BUILD.commit, BUILD.rustc])
            .set(1);
        let _ = r.register(Box::new(info));
        #[cfg(target_os = "linux")]
        {
            let _ = r.register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ));
        }
        r
    })
}

/// The metrics of several shards in one exposition: the series of each family together,
/// under one HELP and TYPE, as the text format requires; the process's own series once.
pub fn render_all<'a>(metrics: impl IntoIterator<Item = &'a Metrics>) -> String {
    fast_writer_off().set(i64::from(ksched_codec::fast_writer_off()));
    let mut families: BTreeMap<String, prometheus::proto::MetricFamily> = BTreeMap::new();
    for family in process_registry().gather() {
        families.insert(family.name().to_owned(), family);
    }
    for m in metrics {
        for family in m.registry.gather() {
            match families.get_mut(family.name()) {
                Some(f) => {
                    for metric in family.get_metric() {
                        f.mut_metric().push(metric.clone());
                    }
                }
                None => {
                    families.insert(family.name().to_owned(), family);
                }
            }
        }
    }
    let all: Vec<_> = families.into_values().collect();
    let mut buf = Vec::new();
    let _ = TextEncoder::new().encode(&all, &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}

/// CPU time the calling thread has used, in seconds (`CLOCK_THREAD_CPUTIME_ID`: the time the
/// kernel ran it, user and system). One cheap system call: the processor reads it every
/// batch, and the transaction thread every transaction.
pub fn thread_cpu_seconds() -> Option<f64> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Some(t.tv_sec as f64 + t.tv_nsec as f64 / 1e9)
}

/// Adds to `counter` the CPU time the calling thread used since `last` (its previous
/// reading, updated; the first reading only starts the count).
pub fn add_thread_cpu(counter: &Counter, last: &mut Option<f64>) {
    let Some(now) = thread_cpu_seconds() else {
        return;
    };
    if let Some(before) = last.replace(now) {
        counter.inc_by((now - before).max(0.0));
    }
}

/// Starts a thread of the processor named `name` that runs `step` until it returns false,
/// its CPU time counted in `cpu` after every step.
pub(crate) fn spawn_counted(
    name: &str,
    what: &str,
    cpu: Counter,
    mut step: impl FnMut() -> bool + Send + 'static,
) -> crate::error::Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let mut last = None;
            add_thread_cpu(&cpu, &mut last);
            while step() {
                add_thread_cpu(&cpu, &mut last);
            }
        })
        .map_err(crate::error::io(format!("starting {what}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The processor's CPU counter moves with work done on the thread, not with time.
    #[test]
    fn thread_cpu_time_grows_with_work_on_the_thread() {
        let m = Metrics::new();
        let mut last = None;
        m.add_thread_cpu(&mut last);
        assert_eq!(
            m.processor_cpu.get(),
            0.0,
            "the first reading only starts the count"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
        // Work until the thread's own clock says 30 ms (however busy the machine is).
        let started = std::time::Instant::now();
        let clock0 = thread_cpu_seconds().unwrap();
        let mut x = 0u64;
        while thread_cpu_seconds().unwrap() - clock0 < 0.03 {
            x = std::hint::black_box(x.wrapping_add(1));
            assert!(started.elapsed().as_secs() < 10);
        }
        let worked = started.elapsed().as_secs_f64();
        m.add_thread_cpu(&mut last);
        let cpu = m.processor_cpu.get();
        assert!(
            cpu >= 0.03 && cpu <= worked + 0.01,
            "{cpu} s counted for {worked} s of work after 100 ms of sleep"
        );
    }

    /// Every metric the shipped Grafana dashboard queries exists.
    #[test]
    fn the_dashboard_uses_only_metrics_we_export() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/grafana/ksched-dashboard.json"
        );
        let text = std::fs::read_to_string(path).expect("dashboard file");
        let known = [
            JOBS,
            QUEUE_DEPTH,
            WORKERS,
            DISPATCH_LATENCY,
            DEAD_LETTERS,
            EVENTS,
            JOURNAL_ENTRIES,
            COMMIT_LATENCY,
            BATCH_SIZE,
            CONSUMER_LAG,
            ROCKSDB_SIZE,
            WATERMARK,
            CAUGHT_UP,
            RECOVERIES,
            SET_ASIDE,
            ISOLATIONS,
            UNREADABLE,
            CONTINUATIONS,
            STOPPED,
        ];
        let mut used = 0;
        for (i, _) in text.match_indices("ksched_") {
            let name: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name == "ksched_" || name.starts_with("ksched_overview") {
                continue;
            }
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(&name);
            assert!(
                known.contains(&base),
                "dashboard queries {name}, which ksched does not export"
            );
            used += 1;
        }
        assert!(used >= 10);
        // And they render.
        let m = Metrics::new();
        m.gauges(&State::new());
        assert!(m.render().contains(JOBS));
    }
}
