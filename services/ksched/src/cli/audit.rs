//! `ksched audit ...`: answers from the journal alone (docs/audit.md). Needs only Kafka; reads
//! the journal, never writes to a live topic. Scratch projections go to a temporary directory
//! unless `--into` names one.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use ksched_core::events::{Event, Input};
use ksched_policy::{PolicyBundle, RegoEngine};
use ksched_runtime::audit::{self, Alternative, Progress, Source, Until, cause_text, entry_json};
use ksched_runtime::settings::PoolsFile;
use ksched_store::Store;
use serde_json::json;

use super::output::{Format, table, time};
use super::{CliResult, EXIT_BAD_INPUT, EXIT_FAILED, Failure, Target};

/// Exit code when an audit finds a difference (rebuild != live, a divergence in verify).
pub(crate) const EXIT_MISMATCH: u8 = 6;

#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
    #[command(subcommand)]
    pub command: AuditCommand,
    /// Journal topic (default: `<prefix>journal`).
    #[arg(long, global = true)]
    pub journal_topic: Option<String>,
    /// Journal partition.
    #[arg(long, global = true, default_value_t = 0)]
    pub partition: i32,
}

#[derive(Debug, Subcommand)]
pub(crate) enum AuditCommand {
    /// Replay the journal from offset 0 into a fresh RocksDB with the processor's apply, and
    /// compare with a live projection (a stopped scheduler's data directory or a checkpoint
    /// from POST /api/v1/admin/checkpoint).
    Rebuild {
        /// Where to build (default: a temporary directory, removed afterwards).
        #[arg(long)]
        into: Option<PathBuf>,
        /// Compare with this projection, replaying up to its journal watermark.
        #[arg(long)]
        compare_with: Option<PathBuf>,
        /// Replay up to and including this journal offset.
        #[arg(long, conflicts_with = "compare_with")]
        until_offset: Option<i64>,
    },
    /// Re-run decide over every recorded input and check it reproduces the recorded events
    /// byte for byte; report each divergence with its offset.
    Verify,
    /// Everything the journal says about one job: inputs, events, decisions, coordinates.
    Job { job_id: String },
    /// The state of jobs and workers as of a time or a journal offset.
    At {
        /// UTC time: `2026-11-30T03:12:00Z`, `2026-11-30 03:12:00.250` or milliseconds.
        #[arg(required_unless_present = "offset")]
        time: Option<String>,
        /// Journal offset (its entry included).
        #[arg(long, conflicts_with = "time")]
        offset: Option<i64>,
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long)]
        pool: Option<String>,
        /// List terminal jobs too (default: only jobs not yet terminal, plus counts).
        #[arg(long)]
        all: bool,
    },
    /// Replay the recorded inputs under other pools or another policy; report where each
    /// job's outcome would differ.
    WhatIf {
        /// A pools.yaml to decide with (replaces topics, pools and tenants).
        #[arg(long)]
        pools: Option<PathBuf>,
        /// A policy directory to decide with.
        #[arg(long)]
        policy: Option<PathBuf>,
    },
    /// The journal for other systems, secrets hidden.
    Export {
        #[arg(long, value_enum, default_value_t = ExportFormat::Jsonl)]
        format: ExportFormat,
        /// Output file (default: standard output).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ExportFormat {
    /// One JSON object per entry.
    Jsonl,
    /// An Avro object container file (schema io.ksched.JournalEntry).
    Avro,
}

fn failed(e: impl std::fmt::Display) -> Failure {
    Failure::new(EXIT_FAILED, e.to_string())
}

/// Prints progress on standard error (a line updated in place on a terminal).
fn progress_printer(label: &'static str) -> impl FnMut(&Progress) {
    let tty = std::io::stderr().is_terminal();
    move |p: &Progress| {
        let eta = p
            .eta()
            .map(|d| format!(", ETA {}s", d.as_secs()))
            .unwrap_or_default();
        let line = format!(
            "{label}: {} entries, {} events, offset {}/{}, {:.0} events/s{eta}",
            p.entries,
            p.events,
            p.offset,
            p.end,
            p.events_per_sec()
        );
        if tty {
            eprint!("\r{line}   ");
        } else {
            eprintln!("{line}");
        }
    }
}

/// A scratch directory: the one given, or a temporary one removed on drop.
struct Scratch {
    path: PathBuf,
    _temp: Option<TempDir>,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(given: Option<PathBuf>) -> Result<Scratch, Failure> {
    match given {
        Some(p) => Ok(Scratch {
            path: p,
            _temp: None,
        }),
        None => {
            let p = std::env::temp_dir().join(format!(
                "ksched-audit-{}-{}",
                std::process::id(),
                uuid::Uuid::new_v4().simple()
            ));
            std::fs::create_dir_all(&p).map_err(failed)?;
            Ok(Scratch {
                path: p.clone(),
                _temp: Some(TempDir(p)),
            })
        }
    }
}

/// Parses `2026-11-30T03:12:00Z`, `2026-11-30 03:12:00.250` (UTC) or milliseconds.
pub(crate) fn parse_time(s: &str) -> Option<i64> {
    if let Ok(ms) = s.parse::<i64>() {
        return Some(ms);
    }
    let s = s.trim().trim_end_matches('Z');
    let (date, clock) = s.split_once(['T', ' '])?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = clock.split_once('.').unwrap_or((clock, "0"));
    let mut t = hms.splitn(3, ':').map(|x| x.parse::<i64>());
    let (h, mi, sec) = (
        t.next()?.ok()?,
        t.next()?.ok()?,
        t.next().unwrap_or(Ok(0)).ok()?,
    );
    let millis: i64 = format!("{frac:0<3}")[..3].parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm), inverse of output::time.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + h * 3_600 + mi * 60 + sec) * 1_000) + millis)
}

pub(crate) fn audit(t: &Target, args: AuditArgs) -> CliResult {
    t.check_credentials()?;
    let client = t.client_config();
    let src = Source {
        client,
        topic: args
            .journal_topic
            .clone()
            .unwrap_or_else(|| format!("{}journal", t.prefix)),
        partition: args.partition,
    };
    match args.command {
        AuditCommand::Rebuild {
            into,
            compare_with,
            until_offset,
        } => rebuild(t, &src, into, compare_with, until_offset),
        AuditCommand::Verify => verify(t, &src),
        AuditCommand::Job { job_id } => job(t, &src, &job_id),
        AuditCommand::At {
            time: at_time,
            offset,
            tenant,
            pool,
            all,
        } => {
            let until = match (offset, at_time) {
                (Some(o), _) => Until::Offset(o),
                (None, Some(s)) => Until::Time(parse_time(&s).ok_or_else(|| {
                    Failure::new(
                        EXIT_BAD_INPUT,
                        format!(
                            "cannot read the time {s:?}; use 2026-11-30T03:12:00Z or milliseconds"
                        ),
                    )
                })?),
                (None, None) => {
                    return Err(Failure::new(EXIT_BAD_INPUT, "give a TIME or --offset"));
                }
            };
            at(t, &src, until, tenant, pool, all)
        }
        AuditCommand::WhatIf { pools, policy } => what_if(t, &src, pools, policy),
        AuditCommand::Export { format, out } => export(&src, format, out),
    }
}

fn rebuild(
    t: &Target,
    src: &Source,
    into: Option<PathBuf>,
    compare_with: Option<PathBuf>,
    until_offset: Option<i64>,
) -> CliResult {
    let partition = u16::try_from(src.partition).map_err(failed)?;
    let live =
        match &compare_with {
            Some(p) => Some(Store::open_read_only(p, partition).map_err(|e| {
                Failure::new(EXIT_BAD_INPUT, format!("opening {}: {e}", p.display()))
            })?),
            None => None,
        };
    let until = match &live {
        Some(l) => Some(l.watermark().map_err(failed)?.ok_or_else(|| {
            Failure::new(
                EXIT_BAD_INPUT,
                "the live projection has no journal watermark",
            )
        })?),
        None => until_offset,
    };
    let dir = scratch(into)?;
    let report =
        audit::rebuild(src, &dir.path, until, progress_printer("rebuild")).map_err(failed)?;
    eprintln!();
    let rebuilt = Store::open_read_only(&dir.path, partition).map_err(failed)?;
    let differences = match &live {
        Some(l) => Some(audit::compare(&rebuilt, l).map_err(failed)?),
        None => None,
    };
    let equal = differences.as_ref().is_none_or(Vec::is_empty);
    match t.output {
        Format::Json => super::output::json(&json!({
            "entries": report.entries,
            "events": report.events,
            "last_offset": report.last_offset,
            "elapsed_ms": report.elapsed.as_millis() as u64,
            "events_per_sec": report.events_per_sec(),
            "compared": live.is_some(),
            "equal": equal,
            "differences": differences.iter().flatten().map(|d| json!({
                "column_family": d.column_family, "key": d.key, "kind": d.kind,
            })).collect::<Vec<_>>(),
        })),
        Format::Table => {
            println!(
                "rebuilt {} entries ({} events) up to offset {} in {:.1}s: {:.0} events/s",
                report.entries,
                report.events,
                report.last_offset.map_or("-".into(), |o| o.to_string()),
                report.elapsed.as_secs_f64(),
                report.events_per_sec()
            );
            match &differences {
                None => {}
                Some(d) if d.is_empty() => println!("equal to the live projection, key for key"),
                Some(d) => {
                    println!("{} keys differ from the live projection:", d.len());
                    let rows: Vec<Vec<String>> = d
                        .iter()
                        .map(|x| vec![x.column_family.clone(), x.key.clone(), x.kind.to_owned()])
                        .collect();
                    table(&["COLUMN FAMILY", "KEY", "DIFFERENCE"], &rows);
                }
            }
        }
    }
    if equal {
        Ok(())
    } else {
        Err(Failure::new(
            EXIT_MISMATCH,
            "the rebuilt projection differs from the live one",
        ))
    }
}

fn verify(t: &Target, src: &Source) -> CliResult {
    let dir = scratch(None)?;
    let policy = RegoEngine::new();
    let report =
        audit::verify(src, &dir.path, &policy, progress_printer("verify")).map_err(failed)?;
    eprintln!();
    match t.output {
        Format::Json => super::output::json(&json!({
            "entries": report.entries,
            "events": report.events,
            "elapsed_ms": report.elapsed.as_millis() as u64,
            "divergences": report.divergences.iter().map(|d| json!({
                "offset": d.offset, "input": d.input, "recorded": d.recorded,
                "recomputed": d.recomputed, "detail": d.detail,
            })).collect::<Vec<_>>(),
        })),
        Format::Table => {
            println!(
                "verified {} entries ({} events) in {:.1}s: {} divergences",
                report.entries,
                report.events,
                report.elapsed.as_secs_f64(),
                report.divergences.len()
            );
            for d in &report.divergences {
                println!("offset {} {}:", d.offset, d.input);
                println!("  recorded:   {}", d.recorded.join(" "));
                println!("  recomputed: {}", d.recomputed.join(" "));
                println!("  {}", d.detail);
            }
        }
    }
    if report.divergences.is_empty() {
        Ok(())
    } else {
        Err(Failure::new(
            EXIT_MISMATCH,
            format!(
                "{} recorded entries were not reproduced",
                report.divergences.len()
            ),
        ))
    }
}

/// One event, explained on one line: its text, and for placements every candidate with its
/// score or why it was skipped (the audit's "why this worker").
fn explain(e: &Event, input: &Input) -> String {
    let mut line = e.describe(input);
    let (candidates, omitted) = match e {
        Event::JobScheduled(s) => (&s.candidates, s.candidates_omitted),
        Event::JobWaiting(w) => (&w.candidates, w.candidates_omitted),
        _ => return line,
    };
    if candidates.is_empty() {
        return line;
    }
    let list: Vec<String> = candidates
        .iter()
        .map(|c| match (&c.score, &c.skipped) {
            (Some(score), _) => format!("{}={score:.3}", c.worker_id),
            (None, Some(why)) => format!("{} skipped ({why})", c.worker_id),
            (None, None) => c.worker_id.clone(),
        })
        .collect();
    line.push_str(&format!("; candidates: {}", list.join(", ")));
    if omitted > 0 {
        line.push_str(&format!(" and {omitted} more"));
    }
    line
}

fn job(t: &Target, src: &Source, job_id: &str) -> CliResult {
    let items = audit::timeline(src, job_id).map_err(failed)?;
    if items.is_empty() {
        return Err(Failure::new(
            super::EXIT_NOT_FOUND,
            format!(
                "the journal {}/{} says nothing about job {job_id}",
                src.topic, src.partition
            ),
        ));
    }
    match t.output {
        Format::Json => {
            let list: Vec<_> = items
                .iter()
                .map(|i| entry_json(src.partition, i.offset, &i.entry))
                .collect();
            super::output::json(&json!({ "job_id": job_id, "timeline": list }));
        }
        Format::Table => {
            let mut rows = Vec::new();
            for i in &items {
                let input = match &i.entry.input {
                    Input::Submit(_) => "JobRequest".to_owned(),
                    other => other.kind().to_owned(),
                };
                let head = vec![
                    i.offset.to_string(),
                    time(i.entry.log_time),
                    format!("{input} from {}", cause_text(&i.entry.cause)),
                ];
                if i.entry.events.is_empty() {
                    rows.push([head.clone(), vec!["-".into()]].concat());
                }
                for (n, e) in i.entry.events.iter().enumerate() {
                    let prefix = if n == 0 {
                        head.clone()
                    } else {
                        vec![String::new(); 3]
                    };
                    rows.push(
                        [
                            prefix,
                            vec![format!("{}: {}", e.name(), explain(e, &i.entry.input))],
                        ]
                        .concat(),
                    );
                }
            }
            table(
                &["JOURNAL OFFSET", "LOG TIME (UTC)", "INPUT", "EVENTS"],
                &rows,
            );
        }
    }
    Ok(())
}

fn at(
    t: &Target,
    src: &Source,
    until: Until,
    tenant: Option<String>,
    pool: Option<String>,
    all: bool,
) -> CliResult {
    let dir = scratch(None)?;
    let (store, last) = audit::replay_until(src, &dir.path, until).map_err(failed)?;
    let Some((offset, log_time)) = last else {
        return Err(Failure::new(
            super::EXIT_NOT_FOUND,
            "the journal has no entry that early",
        ));
    };
    let jobs: Vec<_> = store
        .jobs()
        .map_err(failed)?
        .into_iter()
        .filter(|(_, j)| tenant.as_ref().is_none_or(|t| &j.request.tenant_id == t))
        .filter(|(_, j)| {
            pool.as_ref()
                .is_none_or(|p| j.pool.as_ref() == Some(p) || j.pools.contains(p))
        })
        .collect();
    let mut counts = std::collections::BTreeMap::new();
    for (_, j) in &jobs {
        *counts.entry(j.state.as_str()).or_insert(0u64) += 1;
    }
    let shown: Vec<_> = jobs
        .iter()
        .filter(|(_, j)| all || !j.state.is_terminal())
        .collect();
    let workers = store.workers().map_err(failed)?;
    match t.output {
        Format::Json => super::output::json(&json!({
            "journal_offset": offset,
            "log_time": log_time,
            "counts_by_state": counts,
            "jobs": shown.iter().map(|(id, j)| ksched_runtime::api::job_view(id, j)).collect::<Vec<_>>(),
            "workers": workers.iter()
                .filter(|(_, w)| pool.as_ref().is_none_or(|p| &w.heartbeat.pool == p))
                .map(|(id, w)| ksched_runtime::api::worker_view(id, w)).collect::<Vec<_>>(),
        })),
        Format::Table => {
            println!(
                "as of journal offset {offset}, log time {} UTC",
                time(log_time)
            );
            let c: Vec<String> = counts.iter().map(|(s, n)| format!("{s} {n}")).collect();
            println!(
                "jobs: {}",
                if c.is_empty() {
                    "none".into()
                } else {
                    c.join(", ")
                }
            );
            let rows: Vec<Vec<String>> = shown
                .iter()
                .map(|(id, j)| {
                    vec![
                        id.clone(),
                        j.state.as_str().to_owned(),
                        j.request.tenant_id.clone(),
                        j.pool.clone().unwrap_or_else(|| "-".into()),
                        j.worker_id.clone().unwrap_or_else(|| "-".into()),
                        j.attempt.to_string(),
                    ]
                })
                .collect();
            table(
                &["JOB", "STATE", "TENANT", "POOL", "WORKER", "ATTEMPT"],
                &rows,
            );
            let inflight = |id: &str| {
                jobs.iter()
                    .filter(|(_, j)| j.state.is_active() && j.worker_id.as_deref() == Some(id))
                    .count()
            };
            let wrows: Vec<Vec<String>> = workers
                .iter()
                .filter(|(_, w)| pool.as_ref().is_none_or(|p| &w.heartbeat.pool == p))
                .map(|(id, w)| {
                    vec![
                        id.clone(),
                        w.heartbeat.pool.clone(),
                        w.alive.to_string(),
                        inflight(id).to_string(),
                        time(w.last_seen),
                    ]
                })
                .collect();
            println!();
            table(
                &["WORKER", "POOL", "ALIVE", "IN FLIGHT", "LAST SEEN (UTC)"],
                &wrows,
            );
        }
    }
    Ok(())
}

fn what_if(t: &Target, src: &Source, pools: Option<PathBuf>, policy: Option<PathBuf>) -> CliResult {
    if pools.is_none() && policy.is_none() {
        return Err(Failure::new(
            EXIT_BAD_INPUT,
            "give --pools or --policy (or both)",
        ));
    }
    let pools = match pools {
        Some(p) => {
            let text = std::fs::read_to_string(&p)
                .map_err(|e| Failure::new(EXIT_BAD_INPUT, format!("{}: {e}", p.display())))?;
            Some(
                serde_norway_pools(&text)
                    .map_err(|e| Failure::new(EXIT_BAD_INPUT, format!("{}: {e}", p.display())))?,
            )
        }
        None => None,
    };
    let policy = match policy {
        Some(d) => Some(
            PolicyBundle::from_dir(&d)
                .map_err(|e| Failure::new(EXIT_BAD_INPUT, format!("{}: {e}", d.display())))?,
        ),
        None => None,
    };
    let engine = RegoEngine::new();
    let report = audit::what_if(src, &Alternative { pools, policy }, &engine).map_err(failed)?;
    match t.output {
        Format::Json => super::output::json(&json!({
            "jobs": report.jobs,
            "differing": report.rows.len(),
            "totals": report.totals,
            "rows": report.rows.iter().map(|r| json!({
                "job_id": r.job_id,
                "topic": r.topic,
                "differs_in": r.differs_in,
                "actual": r.actual.to_json(),
                "alternative": r.alternative.to_json(),
            })).collect::<Vec<_>>(),
        })),
        Format::Table => {
            let show = |o: &audit::Outcome| {
                format!(
                    "{} {} {} {}",
                    o.state.map_or("-", |s| s.as_str()),
                    o.pool.as_deref().unwrap_or("-"),
                    o.worker.as_deref().unwrap_or("-"),
                    o.verdict.map_or("-".into(), |v| format!("{v:?}"))
                )
            };
            let rows: Vec<Vec<String>> = report
                .rows
                .iter()
                .map(|r| {
                    vec![
                        r.job_id.clone(),
                        r.topic.clone(),
                        r.differs_in.join(","),
                        show(&r.actual),
                        show(&r.alternative),
                    ]
                })
                .collect();
            table(
                &[
                    "JOB",
                    "TOPIC",
                    "DIFFERS IN",
                    "ACTUAL (state pool worker verdict)",
                    "WHAT-IF",
                ],
                &rows,
            );
            let totals: Vec<String> = report
                .totals
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            println!(
                "\n{} of {} jobs would differ{}",
                report.rows.len(),
                report.jobs,
                if totals.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", totals.join(", "))
                }
            );
        }
    }
    Ok(())
}

fn serde_norway_pools(text: &str) -> Result<PoolsFile, String> {
    ksched_runtime::settings::parse_pools(text).map_err(|e| e.to_string())
}

fn export(src: &Source, format: ExportFormat, out: Option<PathBuf>) -> CliResult {
    let mut sink: Box<dyn Write> = match &out {
        Some(p) => Box::new(std::io::BufWriter::new(std::fs::File::create(p).map_err(
            |e| Failure::new(EXIT_BAD_INPUT, format!("{}: {e}", p.display())),
        )?)),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let n = match format {
        ExportFormat::Jsonl => audit::export_jsonl(src, &mut sink),
        ExportFormat::Avro => audit::export_avro(src, &mut sink),
    }
    .map_err(failed)?;
    sink.flush().map_err(failed)?;
    eprintln!("exported {n} journal entries");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_time;
    use crate::cli::output::time;

    #[test]
    fn times_parse_as_they_print() {
        for ms in [0, 1_700_000_000_123, 951_782_400_000, 1_796_000_000_999] {
            assert_eq!(parse_time(&time(ms)), Some(ms), "{}", time(ms));
        }
        assert_eq!(parse_time("2023-11-14T22:13:20Z"), Some(1_700_000_000_000));
        assert_eq!(parse_time("1700000000000"), Some(1_700_000_000_000));
        assert_eq!(parse_time("yesterday"), None);
        assert_eq!(parse_time("2023-13-01T00:00:00Z"), None);
    }
}
