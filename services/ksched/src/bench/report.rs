//! The bench's report: the table printed on the terminal and the figures it is made of.

use ksched_runtime::Settings;
use serde::Serialize;

use super::{baseline, e2e, failover, history, recovery};

#[derive(Debug, Serialize)]
pub(super) struct Report {
    pub(super) machine: String,
    pub(super) build: &'static str,
    pub(super) smoke: bool,
    pub(super) baseline: baseline::Baseline,
    pub(super) history_small: history::History,
    pub(super) saturation_small_history: e2e::Saturation,
    pub(super) levels: Vec<e2e::Level>,
    /// Levels at fixed rates ([`RATES`](super::RATES)), as users size a system.
    pub(super) rate_levels: Vec<e2e::Level>,
    pub(super) idle: e2e::Idle,
    pub(super) large: Option<Large>,
    /// (jobs/s x Kafka records per job) / baseline I/O records/s.
    pub(super) ratio: f64,
    /// Each turn's pipe and saturation, measured one after the other.
    pub(super) turns: Vec<Turn>,
    /// Median over the turns of jobs/s / the turn's physical limit.
    pub(super) of_physical_limit: f64,
    pub(super) commit_interval_ms: u64,
    /// `processor.pipelined`, `processor.coalesce_heartbeats` and
    /// `processor.transactional_producers` in this run.
    pub(super) pipelined: bool,
    /// The SDK workers of the end-to-end runs and the jobs each runs at once.
    pub(super) fleet: e2e::Fleet,
    /// `processor.max_batch` in this run.
    pub(super) max_batch: usize,
    pub(super) coalesce_heartbeats: bool,
    pub(super) transactional_producers: u8,
    pub(super) group_offsets_interval_ms: u64,
    pub(super) journal_positions_min_batch: usize,
    pub(super) total_seconds: f64,
}

/// The large-history phases.
#[derive(Debug, Serialize)]
pub(super) struct Large {
    pub(super) history_large: history::History,
    pub(super) saturation_large_history: e2e::Saturation,
    pub(super) recovery: recovery::Recovery,
    pub(super) failover: failover::Failover,
}

/// One turn: the raw pipe, then the scheduler at saturation right after it.
#[derive(Debug, Serialize)]
pub(super) struct Turn {
    pub(super) pipe_records_per_sec: f64,
    /// The pipe's consumed + produced records/s over 3: a job needs at least a submission
    /// in, a dispatch out and a result in.
    pub(super) physical_limit_jobs_per_sec: f64,
    pub(super) jobs_per_sec: f64,
    pub(super) of_physical_limit: f64,
    /// Cores busy on the machine during the pipe run and during the saturation run.
    pub(super) pipe_busy_cores: Option<f64>,
    pub(super) saturation_busy_cores: Option<f64>,
}

/// A figure with `decimals` decimals, or "-" where it was not measured.
pub(super) fn or_dash(v: Option<f64>, decimals: usize) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.decimals$}"))
}

pub(super) fn median_of(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(super) fn print_table(r: &Report) {
    let l = |i: usize| &r.levels[i];
    println!();
    println!(
        "ksched bench ({} build{}, {} workers x {} slots{}{}{}{}{}) on {}",
        r.build,
        if r.smoke { ", smoke sizes" } else { "" },
        r.fleet.workers,
        r.fleet.slots,
        if r.max_batch == Settings::default().processor.max_batch {
            String::new()
        } else {
            format!(", max_batch {}", r.max_batch)
        },
        if r.pipelined {
            ", pipelined processor"
        } else {
            ""
        },
        if r.coalesce_heartbeats {
            ""
        } else {
            ", every heartbeat journaled"
        },
        if r.transactional_producers == 1 {
            ", one transactional producer per shard"
        } else {
            ""
        },
        if r.group_offsets_interval_ms == 0 {
            ", input offsets sent to the group with every transaction"
        } else {
            ""
        },
        r.machine
    );
    println!();
    println!("| measure | result |");
    println!("|---|---|");
    println!(
        "| raw Kafka baseline (transactional pipe, {} B records; median of {}) | {:.0} records/s ({:.0} consumed+produced/s); runs {} |",
        r.baseline.record_bytes,
        r.baseline.runs_records_per_sec.len(),
        r.baseline.records_per_sec,
        r.baseline.io_records_per_sec,
        r.baseline
            .runs_records_per_sec
            .iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "| end to end at saturation ({} jobs of history; median of {}) | {:.0} jobs/s, {:.1} Kafka records per job; runs {} |",
        r.history_small.jobs,
        r.turns.len(),
        r.saturation_small_history.jobs_per_sec,
        r.saturation_small_history.kafka_records_per_job,
        r.turns
            .iter()
            .map(|t| format!("{:.0}", t.jobs_per_sec))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "| physical limit (pipe consumed+produced records/s / 3) and saturation's share of it, per turn | {} ; median share {:.2} |",
        r.turns
            .iter()
            .map(|t| format!(
                "{:.0} jobs/s -> {:.2}",
                t.physical_limit_jobs_per_sec, t.of_physical_limit
            ))
            .collect::<Vec<_>>()
            .join(", "),
        r.of_physical_limit
    );
    if r.turns.iter().any(|t| t.pipe_busy_cores.is_some()) {
        println!(
            "| cores busy on the machine per turn: during the pipe / during the scheduler's saturation run | {} |",
            r.turns
                .iter()
                .map(|t| format!(
                    "{} / {}",
                    or_dash(t.pipe_busy_cores, 2),
                    or_dash(t.saturation_busy_cores, 2)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    println!(
        "| ratio (jobs/s x records/job) / baseline | {:.2} |",
        r.ratio
    );
    let per = &r.saturation_small_history.per_job_by_topic;
    let total = per
        .values()
        .fold((0.0, 0.0), |t, p| (t.0 + p.records, t.1 + p.bytes));
    println!(
        "| records / bytes per job at saturation, by topic | {} ; total {:.2} / {:.0} B |",
        per.iter()
            .filter(|(_, p)| p.records > 0.0)
            .map(|(k, p)| format!("{k} {:.2} / {:.0} B", p.records, p.bytes))
            .collect::<Vec<_>>()
            .join(", "),
        total.0,
        total.1
    );
    println!(
        "| an idle fleet ({} workers, a heartbeat a second, {:.0} s): heartbeats read; journal records (of which heartbeats); journal bytes per idle worker-hour | {:.0}; {:.0} ({:.0}); {:.0} B |",
        r.idle.workers,
        r.idle.seconds,
        r.idle.heartbeats,
        r.idle.journal_records,
        r.idle.heartbeat_journal_records,
        r.idle.journal_bytes_per_worker_hour
    );
    let phases = |m: &std::collections::BTreeMap<String, f64>| -> String {
        e2e::PHASES
            .iter()
            .map(|p| format!("{p} {:.1}", m.get(*p).copied().unwrap_or(0.0)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "| a batch at saturation: mean input records; ms per phase | {:.0}; {} |",
        r.saturation_small_history.mean_batch,
        phases(&r.saturation_small_history.phase_ms_per_batch)
    );
    for l in &r.levels {
        println!(
            "| a batch at {:.0} % load: mean input records; ms per phase | {:.0}; {} |",
            100.0 * l.load,
            l.mean_batch,
            phases(&l.phase_ms_per_batch)
        );
    }
    println!(
        "| CPU per job at saturation: processor (deciding and transaction threads) / whole bench process (workers, clients; not the broker) | {:.0} us / {:.0} us |",
        r.saturation_small_history.processor_cpu_us_per_job,
        r.saturation_small_history.process_cpu_us_per_job
    );
    if let Some(m) = &r.saturation_small_history.machine {
        let jobs = r.saturation_small_history.jobs;
        let (machine, scheduler) = m.per_job_us(jobs);
        let limit = median_of(
            r.turns
                .iter()
                .map(|t| t.physical_limit_jobs_per_sec)
                .collect(),
        );
        println!(
            "| the machine at saturation: busy cores; CPU per job of every process / of the scheduler's own threads; the most it could carry if those threads cost nothing (share of the median physical limit) | {:.2} of {}; {machine:.0} us / {scheduler:.0} us; {} |",
            m.busy_cores,
            m.cores,
            m.free_scheduler_ceiling(jobs)
                .map_or("-".to_owned(), |c| format!(
                    "{c:.0} jobs/s ({:.2})",
                    c / limit.max(1e-9)
                ))
        );
    }
    for l in &r.levels {
        if let Some(m) = &l.machine {
            println!(
                "| the machine at {:.0} % load | {} |",
                100.0 * l.load,
                m.level_figures()
            );
        }
    }
    for (i, name) in ["25 %", "50 %", "80 %"].iter().enumerate() {
        println!(
            "| submit -> dispatch at {name} load (p50 / p99 / p999) | {:.1} / {:.1} / {:.1} ms |",
            l(i).submit_to_dispatch_ms.p50,
            l(i).submit_to_dispatch_ms.p99,
            l(i).submit_to_dispatch_ms.p999
        );
        println!(
            "| its parts at {name} load, p50 / p99 (deciding: fetch, batch, decide; committing: transaction, markers, fetch) | {} |",
            l(i).dispatch_parts.figures()
        );
        println!(
            "| submit -> completed at {name} load (p50 / p99 / p999) | {:.1} / {:.1} / {:.1} ms |",
            l(i).submit_to_completed_ms.p50,
            l(i).submit_to_completed_ms.p99,
            l(i).submit_to_completed_ms.p999
        );
        println!(
            "| submit -> handler start at {name} load (p50 / p99 / p999) | {} |",
            l(i).submit_to_handler_ms.figures()
        );
    }
    for l in &r.rate_levels {
        println!(
            "| at {:.0} jobs/s ({:.2} of saturation; {:.0} achieved): submit -> dispatch / -> handler start (p50 / p99 / p999) | {} / {} |",
            l.offered_jobs_per_sec,
            l.load,
            l.achieved_jobs_per_sec,
            l.submit_to_dispatch_ms.figures(),
            l.submit_to_handler_ms.figures()
        );
    }
    if let Some(g) = &r.large {
        println!(
            "| rebuild of {} events ({} jobs) | {:.0} events/s ({:.1} s) |",
            g.history_large.events,
            g.history_large.jobs,
            g.history_large.rebuild_events_per_sec,
            g.history_large.rebuild_seconds
        );
        println!(
            "| recovery after SIGKILL, {} jobs of history | {:.2} s to ready, {:.2} s to the first decision (clean start {:.2} s) |",
            g.recovery.history_jobs,
            g.recovery.recovery_seconds,
            g.recovery.first_decision_seconds,
            g.recovery.cold_start_seconds
        );
        let f = &g.failover;
        println!(
            "| failover, {} jobs of history, lease session timeout {} ms | owner SIGKILLed: the standby owns at {:.2} s, first decision at {:.2} s; owner stopped: the standby owns at {:.2} s, a job sent at the signal is decided at {:.2} s; no standby (rebuild from the journal): first decision at {:.2} s |",
            f.history_jobs,
            f.lease_session_timeout_ms,
            f.killed_to_owned_seconds,
            f.killed_to_first_decision_seconds,
            f.stopped_to_owned_seconds,
            f.stopped_to_first_decision_seconds,
            f.killed_to_first_decision_without_standby_seconds
        );
        println!(
            "| saturation with {} vs {} jobs of history | {:.0} vs {:.0} jobs/s ({:+.1} %) |",
            r.history_small.jobs,
            g.history_large.jobs,
            r.saturation_small_history.jobs_per_sec,
            g.saturation_large_history.jobs_per_sec,
            100.0
                * (g.saturation_large_history.jobs_per_sec
                    / r.saturation_small_history.jobs_per_sec
                    - 1.0)
        );
    }
    println!("| total bench time | {:.0} s |", r.total_seconds);
}
