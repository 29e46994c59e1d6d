//! Workers, pools and tenants, and the dead letters with redrive.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Query, State as AxState};
use axum::response::{Html, IntoResponse, Response};

use super::failed;
use super::html::{esc, job_link, page, table, time, url};
use super::samples;
use crate::auth::{Action, Identity};
use crate::fleet::{dead_letter_counts, dead_letters, tenant_usage};
use crate::{Api, DEFAULT_LIMIT};
use ksched_core::records::Priority;

pub(super) async fn workers(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
) -> Response {
    if let Err(e) = crate::require(&who, Action::Read) {
        return failed(&who, "Workers", e);
    }
    let mut ws = Vec::new();
    for s in &api.stores {
        match s.workers() {
            Ok(w) => ws.extend(w),
            Err(e) => return failed(&who, "Workers", crate::internal(e)),
        }
    }
    let rows: Vec<Vec<String>> = ws
        .iter()
        .map(|(id, w)| {
            let hb = &w.heartbeat;
            vec![
                esc(id),
                esc(&hb.pool),
                if w.alive { "alive" } else { "lost" }.to_owned(),
                format!("{}/{}", hb.active_jobs, hb.max_parallel_jobs),
                format!("{:.0}", hb.cpu_load),
                esc(&format!("{:?}", hb.owned_partitions)),
                if hb.draining { "draining" } else { "" }.to_owned(),
                time(Some(w.last_seen)),
            ]
        })
        .collect();
    let body = format!(
        "<h1>Workers</h1>{}",
        table(
            &[
                "WORKER",
                "POOL",
                "LIVENESS",
                "LOAD (ACTIVE/MAX)",
                "CPU %",
                "OWNED PARTITIONS",
                "",
                "LAST SEEN (UTC)"
            ],
            &rows
        )
    );
    Html(page("Workers", "/ui/workers", Some(&who), &body)).into_response()
}

/// The rows of the fair share table: per pool and priority, the clock and each tenant
/// `who` sees with its pass, lowest first; passes in placements of a weight-1 tenant.
fn fair_shares(api: &Api, who: &Identity) -> Vec<Vec<String>> {
    let unit = ksched_core::state::SHARE_UNIT as f64;
    let placements = |v: u128| format!("{:.2}", v as f64 / unit);
    let mut rows = Vec::new();
    for store in &api.stores {
        for ((pool, rank), share) in store.fair_shares().unwrap_or_default() {
            let priority = [Priority::Critical, Priority::Interactive, Priority::Batch]
                .into_iter()
                .find(|p| p.rank() == rank)
                .map_or("?", |p| p.as_str());
            let mut passes: Vec<(&String, &u128)> =
                (share.passes.iter()).filter(|(t, _)| who.sees(t)).collect();
            passes.sort_by_key(|(t, pass)| (**pass, *t));
            for (tenant, pass) in passes {
                rows.push(vec![
                    esc(&pool),
                    priority.to_owned(),
                    placements(share.clock),
                    esc(tenant),
                    placements(*pass),
                    placements(pass.saturating_sub(share.clock)),
                ]);
            }
        }
    }
    rows
}

/// Most concurrency keys the console lists (the busiest).
const CONSOLE_KEYS: usize = 50;

pub(super) async fn pools(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
) -> Response {
    let usage = match tenant_usage(&api, &who).await {
        Ok(u) => u,
        Err(e) => return failed(&who, "Pools & tenants", e),
    };
    let metrics = samples::parse(&api.shards.render_metrics());
    let depth = samples::by(&metrics, "ksched_queue_depth", "pool");
    let mut alive: BTreeMap<String, (u32, u32, i64, i64)> = BTreeMap::new();
    for s in &api.stores {
        for (_, w) in s.workers().unwrap_or_default() {
            let e = alive.entry(w.heartbeat.pool.clone()).or_default();
            if w.alive {
                e.0 += 1;
                e.2 += i64::from(w.heartbeat.active_jobs);
                e.3 += i64::from(w.heartbeat.max_parallel_jobs);
            } else {
                e.1 += 1;
            }
        }
    }
    for p in depth.keys() {
        alive.entry(p.clone()).or_default();
    }
    let rows: Vec<Vec<String>> = alive
        .iter()
        .map(|(p, (up, lost, active, cap))| {
            vec![
                format!("<a href=\"/ui/jobs?pool={}\">{}</a>", url(p), esc(p)),
                depth.get(p).copied().unwrap_or(0.0).to_string(),
                up.to_string(),
                lost.to_string(),
                format!("{active}/{cap}"),
            ]
        })
        .collect();
    let tenants: Vec<Vec<String>> = usage
        .tenants
        .iter()
        .map(|(t, u)| {
            let reasons: Vec<String> = (u.reasons.iter())
                .map(|(r, n)| format!("{} {n}", esc(r)))
                .collect();
            vec![
                format!("<a href=\"/ui/jobs?tenant={}\">{}</a>", url(t), esc(t)),
                u.active.to_string(),
                u.waiting.to_string(),
                reasons.join(", "),
                u.limit.map_or("none".into(), |l| l.to_string()),
            ]
        })
        .collect();
    let busiest = usage.busiest_keys(CONSOLE_KEYS);
    let keys: Vec<Vec<String>> = busiest
        .iter()
        .map(|((t, k), u)| {
            vec![
                esc(t),
                if k.is_empty() {
                    "(the tenant)".to_owned()
                } else {
                    esc(k)
                },
                u.active.to_string(),
                u.waiting.to_string(),
                u.limit.map_or("none".into(), |l| l.to_string()),
                u.rate.as_deref().map_or("none".into(), esc),
            ]
        })
        .collect();
    let shares = fair_shares(&api, &who);
    let keys_note = match usage.keys.len().saturating_sub(busiest.len()) {
        0 => String::new(),
        n => format!("<p>{n} more keys with fewer jobs (the API lists up to 1,000).</p>"),
    };
    let body = format!(
        "<h1>Pools</h1>{}<h1>Tenants</h1>{}<h1>Concurrency keys</h1>{}{keys_note}\
         <h1>Fair share</h1><p>Per pool and priority, each tenant's pass against the pool's \
         clock, in placements of a weight-1 tenant: the lowest pass is served next; a tenant \
         ahead of the clock has had more than its share lately. Tenants at or behind the \
         clock with nothing waiting are forgotten at each Tick.</p>{}",
        table(
            &[
                "POOL",
                "PENDING",
                "WORKERS ALIVE",
                "LOST",
                "LOAD (ACTIVE/CAPACITY)"
            ],
            &rows
        ),
        table(
            &[
                "TENANT",
                "ON WORKERS",
                "WAITING",
                "WAITING FOR",
                "MAX CONCURRENT JOBS"
            ],
            &tenants
        ),
        table(
            &["TENANT", "KEY", "ACTIVE", "WAITING", "LIMIT", "RATE"],
            &keys
        ),
        table(
            &["POOL", "PRIORITY", "CLOCK", "TENANT", "PASS", "AHEAD"],
            &shares
        )
    );
    Html(page("Pools & tenants", "/ui/pools", Some(&who), &body)).into_response()
}

pub(super) async fn dlq(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let reason = q.get("reason").map(|r| r.trim()).filter(|r| !r.is_empty());
    let listed = dead_letters(
        &api,
        &who,
        reason.map(str::to_owned),
        None,
        DEFAULT_LIMIT * 2,
    )
    .await
    .and_then(|list| Ok((list, dead_letter_counts(&api, &who)?)));
    let (list, counts) = match listed {
        Ok(r) => r,
        Err(e) => return failed(&who, "DLQ", e),
    };
    let mut reasons = String::from("<option value=\"\">any reason</option>");
    for r in counts.iter().flat_map(|c| c.keys()) {
        let sel = if Some(r.as_str()) == reason {
            " selected"
        } else {
            ""
        };
        let _ = write!(reasons, "<option{sel}>{}</option>", esc(r));
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|d| {
            let job = if d.job_id.is_empty() {
                String::from("<span class=\"muted\">(an input record)</span>")
            } else {
                job_link(&d.job_id)
            };
            vec![
                time(Some(d.at)),
                job,
                esc(&d.reason_code),
                d.attempts.to_string(),
                esc(&d.reason),
                esc(&format!(
                    "{}/{}/{}",
                    d.cause_topic, d.cause_partition, d.cause_offset
                )),
            ]
        })
        .collect();
    let body = format!(
        "<h1>Dead letters</h1><form method=\"get\" action=\"/ui/dlq\"><select name=\"reason\">{reasons}</select> \
         <button type=\"submit\">Filter</button></form>\
         <p class=\"muted\">A job's page redrives it (submits it again as a new job).</p>{}",
        table(
            &[
                "AT (UTC)",
                "JOB",
                "REASON CODE",
                "ATTEMPTS",
                "REASON",
                "CAUSE"
            ],
            &rows
        )
    );
    Html(page("DLQ", "/ui/dlq", Some(&who), &body)).into_response()
}
