//! `ksched audit at`: jobs and workers as of a time or an offset.

use ksched_runtime::audit::{self, Source, Until};
use serde_json::json;

use crate::cli::output::{Format, table, time};
use crate::cli::{CliResult, Failure, Target};

use super::{Answers, failed, scratch};

pub(super) fn at(
    t: &Target,
    src: &Source,
    until: Until,
    tenant: Option<&str>,
    pool: Option<&str>,
    all: bool,
    out: &mut Answers,
) -> CliResult {
    let dir = scratch(None)?;
    let (store, last) = audit::replay_until(src, &dir.path, until).map_err(failed)?;
    let Some((offset, log_time)) = last else {
        return Err(Failure::new(
            crate::cli::EXIT_NOT_FOUND,
            "the journal has no entry that early",
        ));
    };
    let jobs: Vec<_> = store
        .jobs()
        .map_err(failed)?
        .into_iter()
        .filter(|(_, j)| tenant.is_none_or(|t| j.request.tenant_id == t))
        .filter(|(_, j)| {
            pool.is_none_or(|p| j.pool.as_deref() == Some(p) || j.pools.iter().any(|q| q == p))
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
        Format::Json => out.json(
            src.partition,
            json!({
                "journal_offset": offset,
                "log_time": log_time,
                "counts_by_state": counts,
                "jobs": shown.iter().map(|(id, j)| ksched_api::job_view(id, j)).collect::<Vec<_>>(),
                "workers": workers.iter()
                    .filter(|(_, w)| pool.is_none_or(|p| w.heartbeat.pool == p))
                    .map(|(id, w)| ksched_api::worker_view(id, w)).collect::<Vec<_>>(),
            }),
        ),
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
                .filter(|(_, w)| pool.is_none_or(|p| w.heartbeat.pool == p))
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
