//! Time travel (the projection as of a moment) and what-if (the journal replayed under other
//! pools or policies), each in a child process, one at a time.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Form, Query, State as AxState};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use ksched_runtime::audit::PausedSchedule;
use ksched_runtime::audit::isolated::{self, ReplayAnswer, ReplayRequest, ReplayTask};

use super::failed;
use super::html::{esc, flash, job_link, page, state, table, time};
use super::jobs::jobs_table;
use crate::Api;
use crate::auth::{Action, Identity};

/// A time as the console takes it: RFC 3339, or a date-time without zone (UTC, what a
/// `datetime-local` input sends), or milliseconds since the epoch.
pub(super) fn parse_time(s: &str) -> Option<i64> {
    let s = s.trim();
    if let Ok(ms) = s.parse::<i64>() {
        return Some(ms);
    }
    if let Ok(t) = s.parse::<jiff::Timestamp>() {
        return Some(t.as_millisecond());
    }
    let civil: jiff::civil::DateTime = s.parse().ok()?;
    civil
        .to_zoned(jiff::tz::TimeZone::UTC)
        .ok()
        .map(|z| z.timestamp().as_millisecond())
}

/// Time travel and what-if replay a shard's whole journal: one at a time per process, so
/// that a few clicks cannot take every core from the scheduler.
static REPLAYS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

fn busy(who: &Identity, title: &str) -> Response {
    failed(
        who,
        title,
        crate::ApiError(
            StatusCode::TOO_MANY_REQUESTS,
            "another time travel or what-if replay is running; try again in a moment".into(),
        ),
    )
}

/// A replay for `who`, run in a child process (audit/isolated.rs), one at a time.
async fn replay(
    api: &Api,
    who: &Identity,
    shard: i32,
    task: ReplayTask,
) -> Result<ReplayAnswer, String> {
    let request = ReplayRequest {
        kafka: isolated::client_properties(&api.journal_client),
        topic: api.topics.journal.clone(),
        partition: shard,
        visible_tenants: who.tenants.clone(),
        memory_limit_bytes: 0,
        cpu_limit_secs: 0,
        task,
    };
    isolated::replay_in_child(&api.replays, request).await
}

/// Time travel: the projection of one shard as of a moment, replayed from the journal
/// into a scratch store (as `ksched audit at`), in a child process.
pub(super) async fn at(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(e) = crate::require(&who, Action::Replay) {
        return failed(&who, "Time travel", e);
    }
    let when = q.get("time").map_or("", |t| t.trim());
    let shard: i32 = q
        .get("shard")
        .and_then(|s| s.parse().ok())
        .filter(|s| *s >= 0 && (*s as usize) < api.stores.len())
        .unwrap_or(0);
    let mut body = format!(
        "<h1>Time travel</h1><form method=\"get\" action=\"/ui/at\">As of (UTC) \
         <input type=\"datetime-local\" step=\"0.001\" name=\"time\" id=\"time\" value=\"{}\"> shard \
         <input name=\"shard\" value=\"{shard}\" size=\"3\"> <button type=\"submit\" id=\"travel\">Show</button></form>",
        esc(when)
    );
    if when.is_empty() {
        body.push_str(
            "<p class=\"muted\">The projection as it was at a moment, replayed from the journal (as <code>ksched audit at</code>).</p>",
        );
        return Html(page("Time travel", "/ui/at", Some(&who), &body)).into_response();
    }
    let Some(ms) = parse_time(when) else {
        body.push_str(&flash(&format!("{when:?} is not a time"), true));
        return Html(page("Time travel", "/ui/at", Some(&who), &body)).into_response();
    };
    let Ok(_replay) = REPLAYS.try_acquire() else {
        return busy(&who, "Time travel");
    };
    let task = ReplayTask::At {
        time_ms: ms,
        max_jobs: 500,
    };
    match replay(&api, &who, shard, task).await {
        Ok(ReplayAnswer::At {
            last,
            counts,
            jobs,
            workers,
        }) => {
            let count_rows: Vec<Vec<String>> = counts
                .iter()
                .map(|(s, n)| vec![state(s), n.to_string()])
                .collect();
            let worker_rows: Vec<Vec<String>> = workers
                .iter()
                .map(|(id, w)| {
                    vec![
                        esc(id),
                        esc(&w.heartbeat.pool),
                        if w.alive { "alive" } else { "lost" }.to_owned(),
                        format!(
                            "{}/{}",
                            w.heartbeat.active_jobs, w.heartbeat.max_parallel_jobs
                        ),
                    ]
                })
                .collect();
            let _ = write!(
                body,
                "<p id=\"as-of\">Replayed to journal offset {} (log time {} UTC).</p>\
                 <h2>Jobs by state</h2>{}<h2>Jobs</h2>{}<h2>Workers</h2>{}",
                last.map_or("none".into(), |(o, _)| o.to_string()),
                time(last.map(|(_, t)| t)),
                table(&["STATE", "JOBS"], &count_rows),
                jobs_table(&jobs),
                table(&["WORKER", "POOL", "LIVENESS", "LOAD"], &worker_rows),
            );
        }
        Ok(ReplayAnswer::Failed(e)) | Err(e) => {
            body.push_str(&flash(&format!("the replay failed: {e}"), true))
        }
        Ok(_) => body.push_str(&flash("the replay answered another question", true)),
    }
    Html(page("Time travel", "/ui/at", Some(&who), &body)).into_response()
}

fn what_if_form(pools: &str, policy: &str, paused: &str, shard: i32) -> String {
    format!(
        "<h1>What if</h1><p class=\"muted\">Decides every recorded input of a shard again under \
         other pools (a pools.yaml: topics, pools, tenants), another input policy (one \
         Rego module) and/or with schedules paused from their start, and lists the jobs that \
         would have ended differently (as <code>ksched audit what-if</code>). Nothing is \
         written anywhere.</p>\
         <form method=\"post\" action=\"/ui/what-if\" id=\"what-if\">\
         <p><label>pools.yaml<br><textarea name=\"pools\" rows=\"10\" cols=\"90\" id=\"pools\">{}</textarea></label></p>\
         <p><label>policy (Rego, package ksched.input)<br><textarea name=\"policy\" rows=\"8\" cols=\"90\" id=\"policy\">{}</textarea></label></p>\
         <p><label>schedules paused (TENANT:ID, one a line)<br><textarea name=\"paused\" rows=\"3\" cols=\"90\" id=\"paused\">{}</textarea></label></p>\
         <p>shard <input name=\"shard\" value=\"{shard}\" size=\"3\"> <button type=\"submit\" id=\"compare\">Compare</button></p></form>",
        esc(pools),
        esc(policy),
        esc(paused)
    )
}

/// Most schedules one what-if pauses.
const MAX_PAUSED: usize = 100;

pub(super) async fn what_if_page(Extension(who): Extension<Identity>) -> Response {
    if let Err(e) = crate::require(&who, Action::Replay) {
        return failed(&who, "What if", e);
    }
    Html(page(
        "What if",
        "/ui/what-if",
        Some(&who),
        &what_if_form("", "", "", 0),
    ))
    .into_response()
}

/// How long each tenant's jobs waited from acceptance to their first placement, recorded
/// and under the alternative: what a limit, a rate or a weight changes even where every
/// job ends the same.
fn waits_table(waits: &[ksched_runtime::audit::TenantWaits]) -> String {
    if waits.is_empty() {
        return String::new();
    }
    let ms = |v: i64| format!("{v} ms");
    let both = |f: &dyn Fn(&ksched_runtime::audit::WaitSummary) -> String,
                w: &ksched_runtime::audit::TenantWaits| {
        format!("{} → {}", f(&w.actual), f(&w.alternative))
    };
    let rows: Vec<Vec<String>> = waits
        .iter()
        .map(|w| {
            vec![
                esc(&w.tenant_id),
                both(&|s| s.placed.to_string(), w),
                both(&|s| ms(s.p50_ms), w),
                both(&|s| ms(s.p99_ms), w),
                both(&|s| ms(s.max_ms), w),
                both(&|s| s.unplaced.to_string(), w),
            ]
        })
        .collect();
    format!(
        "<h2>Time to first placement, per tenant (recorded → under the alternative)</h2><div id=\"what-if-waits\">{}</div>",
        table(
            &["TENANT", "PLACED", "P50", "P99", "MAX", "NEVER PLACED"],
            &rows
        )
    )
}

/// The what-if diff: jobs whose state, pool, worker or verdict would have differed. The
/// pools and the policy are checked here; the replay runs in a child process.
pub(super) async fn what_if(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    if let Err(e) = crate::require(&who, Action::Replay) {
        return failed(&who, "What if", e);
    }
    // Browsers send a textarea's line breaks as CRLF.
    let text = |k: &str| {
        f.get(k)
            .map_or(String::new(), |s| s.trim().replace("\r\n", "\n"))
    };
    let (pools_text, policy_text, paused_text) = (text("pools"), text("policy"), text("paused"));
    let shard: i32 = f
        .get("shard")
        .and_then(|s| s.trim().parse().ok())
        .filter(|s| *s >= 0 && (*s as usize) < api.stores.len())
        .unwrap_or(0);
    let mut body = what_if_form(&pools_text, &policy_text, &paused_text, shard);
    let error = |body: &mut String, msg: String| body.push_str(&flash(&msg, true));
    if pools_text.is_empty() && policy_text.is_empty() && paused_text.is_empty() {
        error(
            &mut body,
            "give a pools.yaml, a policy or schedules to pause (or several)".into(),
        );
        return Html(page("What if", "/ui/what-if", Some(&who), &body)).into_response();
    }
    let paused = match (paused_text.lines())
        .filter(|l| !l.trim().is_empty())
        .take(MAX_PAUSED + 1)
        .map(|l| PausedSchedule::parse(l, None))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(p) if p.len() > MAX_PAUSED => {
            error(&mut body, format!("at most {MAX_PAUSED} schedules at once"));
            return Html(page("What if", "/ui/what-if", Some(&who), &body)).into_response();
        }
        Ok(p) => p,
        Err(e) => {
            error(&mut body, e);
            return Html(page("What if", "/ui/what-if", Some(&who), &body)).into_response();
        }
    };
    if !pools_text.is_empty()
        && let Err(e) = ksched_runtime::settings::parse_pools(&pools_text)
    {
        error(&mut body, format!("pools.yaml: {e}"));
        return Html(page("What if", "/ui/what-if", Some(&who), &body)).into_response();
    }
    if !policy_text.is_empty() {
        let bundle = ksched_policy::PolicyBundle {
            modules: BTreeMap::from([("input.rego".to_owned(), policy_text.clone())]),
            data_json: "{}".into(),
        };
        if let Err(e) = ksched_policy::compile(&bundle) {
            error(&mut body, format!("policy: {e}"));
            return Html(page("What if", "/ui/what-if", Some(&who), &body)).into_response();
        }
    }
    let Ok(_replay) = REPLAYS.try_acquire() else {
        return busy(&who, "What if");
    };
    let task = ReplayTask::WhatIf {
        pools_yaml: (!pools_text.is_empty()).then(|| pools_text.clone()),
        policy_rego: (!policy_text.is_empty()).then(|| policy_text.clone()),
        paused_schedules: paused,
        max_rows: 1_000,
    };
    match replay(&api, &who, shard, task).await {
        Ok(ReplayAnswer::WhatIf {
            jobs,
            differing,
            rows,
            totals,
            schedules_not_found,
            waits,
        }) => {
            for s in &schedules_not_found {
                error(
                    &mut body,
                    format!("schedule {s} is not in this shard's journal"),
                );
            }
            let totals: Vec<String> = totals.iter().map(|(k, n)| format!("{n} by {k}")).collect();
            let outcome = |o: &isolated::DiffOutcome| {
                format!(
                    "{} {} {} {}",
                    o.state.map_or(String::new(), |s| state(s.as_str())),
                    esc(o.pool.as_deref().unwrap_or("")),
                    esc(o.worker.as_deref().unwrap_or("")),
                    o.verdict.map_or(String::new(), |v| format!("{v:?}")),
                )
            };
            let rows: Vec<Vec<String>> = rows
                .iter()
                .map(|row| {
                    vec![
                        job_link(&row.job_id),
                        esc(&row.topic),
                        esc(&row.differs_in.join(", ")),
                        outcome(&row.actual),
                        outcome(&row.alternative),
                    ]
                })
                .collect();
            let _ = write!(
                body,
                "<p id=\"what-if-summary\">{jobs} jobs replayed; {differing} would have ended differently{}.</p>{}",
                if totals.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", totals.join(", "))
                },
                table(
                    &[
                        "JOB",
                        "TOPIC",
                        "DIFFERS IN",
                        "RECORDED",
                        "UNDER THE ALTERNATIVE"
                    ],
                    &rows
                )
            );
            body.push_str(&waits_table(&waits));
        }
        Ok(ReplayAnswer::Failed(e)) | Err(e) => error(&mut body, format!("the replay failed: {e}")),
        Ok(_) => error(&mut body, "the replay answered another question".into()),
    }
    Html(page("What if", "/ui/what-if", Some(&who), &body)).into_response()
}
