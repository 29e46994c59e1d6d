//! `ksched audit what-if`: the recorded inputs under other pools or another policy.

use std::path::PathBuf;

use ksched_policy::{PolicyBundle, RegoEngine};
use ksched_runtime::audit::{self, Alternative, PausedSchedule, Source};
use ksched_runtime::settings::PoolsFile;
use serde_json::json;

use crate::cli::output::{Format, table};
use crate::cli::{CliResult, EXIT_BAD_INPUT, Failure, Target};

use super::{Answers, failed};

/// The world to decide in instead, from `--pools`, `--policy` and `--pause-schedule`.
pub(super) fn alternative(
    pools: Option<PathBuf>,
    policy: Option<PathBuf>,
    pause_schedules: &[String],
    paused_from: Option<&str>,
) -> Result<Alternative, Failure> {
    if pools.is_none() && policy.is_none() && pause_schedules.is_empty() {
        return Err(Failure::new(
            EXIT_BAD_INPUT,
            "give --pools, --policy or --pause-schedule (or several)",
        ));
    }
    let paused_from = match paused_from {
        Some(t) => Some(super::parse_time(t).ok_or_else(|| {
            Failure::new(
                EXIT_BAD_INPUT,
                format!("--paused-from {t:?} is not a time (RFC 3339, YYYY-MM-DD HH:MM[:SS] in UTC, or epoch ms)"),
            )
        })?),
        None => None,
    };
    let paused_schedules = pause_schedules
        .iter()
        .map(|s| PausedSchedule::parse(s, paused_from))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Failure::new(EXIT_BAD_INPUT, format!("--pause-schedule {e}")))?;
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
    Ok(Alternative {
        pools,
        policy,
        paused_schedules,
    })
}

pub(super) fn what_if(
    t: &Target,
    src: &Source,
    alternative: &Alternative,
    out: &mut Answers,
) -> CliResult {
    let engine = RegoEngine::new();
    let report = audit::what_if(
        src,
        alternative,
        &engine,
        &|_| true,
        false,
        super::progress_printer("what-if"),
    )
    .map_err(failed)?;
    match t.output {
        Format::Json => out.json(
            src.partition,
            json!({
                "jobs": report.jobs,
                "differing": report.rows.len(),
                "totals": report.totals,
                "schedules_not_found": report.schedules_not_found,
                "waits": report.waits.iter().map(|w| json!({
                    "tenant_id": w.tenant_id,
                    "actual": w.actual.to_json(),
                    "alternative": w.alternative.to_json(),
                })).collect::<Vec<_>>(),
                "rows": report.rows.iter().map(|r| json!({
                    "job_id": r.job_id,
                    "tenant_id": r.tenant_id,
                    "topic": r.topic,
                    "differs_in": r.differs_in,
                    "actual": r.actual.to_json(),
                    "alternative": r.alternative.to_json(),
                })).collect::<Vec<_>>(),
            }),
        ),
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
            for s in &report.schedules_not_found {
                println!("schedule {s} is not in this journal");
            }
            if report.waits.iter().any(|w| w.actual != w.alternative) {
                println!("\nwaits from acceptance to first placement (ms):");
                let show = |s: &audit::WaitSummary| {
                    format!(
                        "{} placed, p50 {}, p99 {}, max {}{}",
                        s.placed,
                        s.p50_ms,
                        s.p99_ms,
                        s.max_ms,
                        if s.unplaced > 0 {
                            format!(", {} never placed", s.unplaced)
                        } else {
                            String::new()
                        }
                    )
                };
                let rows: Vec<Vec<String>> = (report.waits.iter())
                    .map(|w| vec![w.tenant_id.clone(), show(&w.actual), show(&w.alternative)])
                    .collect();
                table(&["TENANT", "ACTUAL", "WHAT-IF"], &rows);
            }
        }
    }
    Ok(())
}

fn serde_norway_pools(text: &str) -> Result<PoolsFile, String> {
    ksched_runtime::settings::parse_pools(text).map_err(|e| e.to_string())
}
