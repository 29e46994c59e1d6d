//! The operator console under `/ui` (docs/console.md): server-rendered pages over the same
//! projection, actions and roles as the API. Pages: overview (live over server-sent
//! events), jobs, a job's page (timeline, every decision with its candidates and policy
//! verdicts, approve / reject / cancel / redrive), workers, pools and tenants, the DLQ with
//! redrive, and time travel (the projection as of a moment, replayed from the journal).
//!
//! Authentication is the API's: with `http.tokens_file` or `http.jwt` the browser signs in
//! with a token, kept in an HttpOnly, SameSite=Strict cookie and checked on every request
//! like a bearer header; without either the console, like the API, answers on loopback
//! only. A POST must come from a console page: a form body, and an `Origin` (or
//! `Sec-Fetch-Site`) that is this server's, so another site cannot make a signed-in browser
//! act.

mod html;
mod plot;
mod samples;

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Form, Path, Query, State as AxState};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use ksched_core::events::{Event, JobState};
use ksched_core::state::Job;
use serde_json::Value;

use super::{
    Api, ApproveBody, CancelBody, DEFAULT_LIMIT, RedriveBody, RejectBody, approve_job, cancel_job,
    dead_letter_counts, dead_letters, find_job, heavy_read, job_view, jobs_query, redrive_job,
    reject_job, tenant_usage,
};
use crate::auth::{Action, Denied, Identity, host_allowed};
use html::{action_form, esc, flash, job_link, page, state, table, time, url};
use ksched_runtime::audit::isolated::{self, ReplayAnswer, ReplayRequest, ReplayTask};
use ksched_runtime::audit::{Source, TimelineItem, job_window};
use ksched_runtime::clock::wall_clock_ms;

pub(crate) use samples::Samples;

/// The cookie that holds a signed-in browser's token.
const COOKIE: &str = "ksched_session";
/// Most journal entries a job page reads (its window of the journal).
const MAX_WINDOW_ENTRIES: usize = 50_000;
/// Jobs a list page shows.
const PAGE: usize = 50;

/// The console's routes, behind its guard.
pub(super) fn routes(api: Arc<Api>) -> Router<Arc<Api>> {
    Router::new()
        .route("/ui", get(overview))
        .route("/ui/", get(|| async { Redirect::to("/ui") }))
        .route("/ui/live", get(live))
        .route("/ui/jobs", get(jobs))
        .route("/ui/jobs/{id}", get(job))
        .route("/ui/jobs/{id}/{action}", post(act))
        .route("/ui/workers", get(workers))
        .route("/ui/pools", get(pools))
        .route("/ui/dlq", get(dlq))
        .route("/ui/at", get(at))
        .route("/ui/what-if", get(what_if_page).post(what_if))
        .route("/ui/login", get(login_page).post(login))
        .route("/ui/logout", post(logout))
        .layer(axum::middleware::from_fn_with_state(api, guard))
}

/// Samples the metrics for the overview's plots until the process ends.
pub(super) fn start_sampler(api: Arc<Api>) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(samples::EVERY_MS));
        loop {
            every.tick().await;
            let text = api.shards.render_metrics();
            api.samples.take(wall_clock_ms(), &text);
        }
    });
}

/// The token a request carries: its bearer header, else the console's cookie.
fn credentials(headers: &HeaderMap) -> Option<String> {
    if let Some(h) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        return Some(h.to_owned());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| {
            c.trim()
                .strip_prefix(&format!("{COOKIE}="))
                .map(str::to_owned)
        })
        .map(|t| format!("Bearer {t}"))
}

/// Whether a POST came from one of this server's pages.
fn same_origin(headers: &HeaderMap, tls: bool) -> bool {
    let text = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
    if let Some(site) = text("sec-fetch-site")
        && site != "same-origin"
    {
        return false;
    }
    let (Some(origin), Some(host)) = (text("origin"), text("host")) else {
        return false;
    };
    let scheme = if tls { "https" } else { "http" };
    origin == format!("{scheme}://{host}")
}

async fn guard(
    AxState(api): AxState<Arc<Api>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let headers = req.headers().clone();
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    if !host_allowed(host, &api.allowed_hosts) {
        return (
            StatusCode::BAD_REQUEST,
            "this Host is not one the console answers (http.allowed_hosts)",
        )
            .into_response();
    }
    let post = req.method() == axum::http::Method::POST;
    if post {
        let form = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"));
        if !form || !same_origin(&headers, api.secure_cookies) {
            return (
                StatusCode::FORBIDDEN,
                "console actions come from console pages (form posts from this origin)",
            )
                .into_response();
        }
    }
    let path = req.uri().path().to_owned();
    if path == "/ui/login" {
        return next.run(req).await;
    }
    match api.auth.identify(credentials(&headers).as_deref()) {
        Ok(id) => {
            req.extensions_mut().insert(id);
            next.run(req).await
        }
        Err(Denied::Unauthenticated(_)) if !post => {
            Redirect::to(&format!("/ui/login?next={}", url(&path))).into_response()
        }
        Err(Denied::Unauthenticated(why)) => (StatusCode::UNAUTHORIZED, why).into_response(),
    }
}

fn login_form(next: &str, error: &str) -> String {
    format!(
        "<h1>Sign in</h1>{}<p>Paste an API token or a JWT issued for ksched (docs/security.md).</p>\
         <form method=\"post\" action=\"/ui/login\"><input type=\"hidden\" name=\"next\" value=\"{}\">\
         <input type=\"password\" name=\"token\" size=\"60\" autocomplete=\"off\" id=\"token\"> \
         <button type=\"submit\" id=\"sign-in\">Sign in</button></form>",
        flash(error, true),
        esc(next)
    )
}

async fn login_page(Query(q): Query<HashMap<String, String>>) -> Html<String> {
    let next = q.get("next").map_or("/ui", String::as_str);
    Html(page("Sign in", "", None, &login_form(next, "")))
}

async fn login(
    AxState(api): AxState<Arc<Api>>,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let token = f.get("token").map_or("", |t| t.trim());
    // Only where the console sends it back: its own pages.
    let next = f
        .get("next")
        .filter(|n| n.starts_with("/ui") && !n.starts_with("//"))
        .map_or("/ui", String::as_str);
    let cookie_safe = !token.is_empty()
        && token
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b';' | b',' | b'"' | b'\\'));
    let ok = cookie_safe && api.auth.identify(Some(&format!("Bearer {token}"))).is_ok();
    if !ok {
        return (
            StatusCode::UNAUTHORIZED,
            Html(page(
                "Sign in",
                "",
                None,
                &login_form(next, "that token is not accepted"),
            )),
        )
            .into_response();
    }
    let secure = if api.secure_cookies { "; Secure" } else { "" };
    (
        StatusCode::SEE_OTHER,
        [
            (
                header::SET_COOKIE,
                format!("{COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict{secure}"),
            ),
            (header::LOCATION, next.to_owned()),
        ],
    )
        .into_response()
}

async fn logout() -> Response {
    (
        StatusCode::SEE_OTHER,
        [
            (
                header::SET_COOKIE,
                format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0"),
            ),
            (header::LOCATION, "/ui/login".to_owned()),
        ],
    )
        .into_response()
}

/// A page that could not be made: the reason, with the API's status.
fn failed(who: &Identity, title: &str, e: super::ApiError) -> Response {
    (e.0, Html(page(title, "", Some(who), &flash(&e.1, true)))).into_response()
}

/// The overview's numbers: what the stores and the metrics say now.
fn stats(api: &Api, who: &Identity) -> Result<String, super::ApiError> {
    let mut out = String::from("<div id=\"live\">");
    let metrics = samples::parse(&api.shards.render_metrics());
    if who.sees_all() {
        let mut counts: BTreeMap<JobState, u64> = BTreeMap::new();
        for s in &api.stores {
            for (st, n) in s.job_counts().map_err(super::internal)? {
                *counts.entry(st).or_default() += n;
            }
        }
        out.push_str("<h2>Jobs</h2><div class=\"cards\">");
        for st in JobState::ALL {
            let n = counts.get(&st).copied().unwrap_or(0);
            let _ = write!(
                out,
                "<a class=\"card\" href=\"/ui/jobs?state={0}\"><b id=\"count-{0}\">{n}</b>{0}</a>",
                st.as_str()
            );
        }
        out.push_str("</div>");
    } else {
        out.push_str(
            "<p class=\"muted\">Job counts span every tenant; this sign-in sees some.</p>",
        );
    }
    let lag = samples::by(&metrics, "ksched_consumer_lag", "topic");
    let depth = samples::by(&metrics, "ksched_queue_depth", "pool");
    let rows: Vec<Vec<String>> = depth
        .iter()
        .map(|(p, d)| vec![esc(p), format!("{d}")])
        .collect();
    let _ = write!(out, "<h2>Queues</h2>{}", table(&["POOL", "PENDING"], &rows));
    let mut breakers = Vec::new();
    for s in &api.stores {
        breakers.extend(s.breakers().map_err(super::internal)?);
    }
    let rows: Vec<Vec<String>> = breakers
        .iter()
        .map(|(p, b)| {
            vec![
                esc(p),
                esc(&format!("{:?}", b.state)),
                b.consecutive_failures.to_string(),
                time(b.opened_at),
            ]
        })
        .collect();
    let _ = write!(
        out,
        "<h2>Circuit breakers</h2>{}",
        table(&["POOL", "STATE", "CONSECUTIVE FAILURES", "OPENED"], &rows)
    );
    let rows: Vec<Vec<String>> = lag
        .iter()
        .map(|(t, n)| vec![esc(t), format!("{n}")])
        .collect();
    let _ = write!(
        out,
        "<h2>Consumer lag</h2>{}",
        table(&["TOPIC", "RECORDS NOT PROCESSED"], &rows)
    );
    if let Some(dlq) = dead_letter_counts(api, who)? {
        let rows: Vec<Vec<String>> = dlq
            .iter()
            .map(|(r, n)| {
                vec![
                    format!("<a href=\"/ui/dlq?reason={}\">{}</a>", url(r), esc(r)),
                    n.to_string(),
                ]
            })
            .collect();
        let _ = write!(
            out,
            "<h2>Dead letters</h2>{}",
            table(&["REASON", "COUNT"], &rows)
        );
    }
    let _ = write!(
        out,
        "<p class=\"muted\">as of {} UTC</p></div>",
        time(Some(wall_clock_ms()))
    );
    Ok(out)
}

async fn overview(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
) -> Response {
    let stats = match stats(&api, &who) {
        Ok(s) => s,
        Err(e) => return failed(&who, "Overview", e),
    };
    let samples = api.samples.all();
    let throughput = vec![(
        "journal entries/s".to_owned(),
        samples.iter().map(|s| (s.at, s.entries_per_s)).collect(),
    )];
    let dead_letters = vec![(
        "dead letters/s".to_owned(),
        samples
            .iter()
            .map(|s| (s.at, s.dead_letters_per_s))
            .collect(),
    )];
    let mut depth: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
    for s in &samples {
        for (p, d) in &s.queue_depth {
            depth.entry(p.clone()).or_default().push((s.at, *d));
        }
    }
    let latency = vec![
        (
            "p50".to_owned(),
            samples
                .iter()
                .filter_map(|s| Some((s.at, s.latency_ms?.0)))
                .collect(),
        ),
        (
            "p99".to_owned(),
            samples
                .iter()
                .filter_map(|s| Some((s.at, s.latency_ms?.1)))
                .collect(),
        ),
    ];
    let body = format!(
        "<h1>Overview</h1>{stats}<h2>Over time</h2>{}{}{}{}",
        plot::lines("Throughput", "entries/s", &throughput),
        plot::lines("Dead-letter rate", "/s", &dead_letters),
        plot::lines(
            "Queue depth by pool",
            "jobs",
            &depth.into_iter().collect::<Vec<_>>()
        ),
        plot::lines(
            "Dispatch latency (acceptance to first dispatch)",
            "ms",
            &latency
        ),
    );
    Html(page("Overview", "/ui", Some(&who), &body)).into_response()
}

/// The overview's numbers again every few seconds, as server-sent events.
/// Live overview streams open at once in the process: each reads the stores every few
/// seconds for as long as it stays open.
const MAX_LIVE_STREAMS: usize = 64;

static LIVE_STREAMS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_LIVE_STREAMS);

async fn live(AxState(api): AxState<Arc<Api>>, Extension(who): Extension<Identity>) -> Response {
    let Ok(turn) = LIVE_STREAMS.try_acquire() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many live overviews are open; reload the page later",
        )
            .into_response();
    };
    let stream = futures_util::stream::unfold(
        (api, who, true, turn),
        |(api, who, first, turn)| async move {
            if !first {
                tokio::time::sleep(Duration::from_millis(samples::EVERY_MS)).await;
            }
            let data = stats(&api, &who).unwrap_or_else(|e| flash(&e.1, true));
            Some((
                Ok::<_, Infallible>(SseEvent::default().event("overview").data(data)),
                (api, who, false, turn),
            ))
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The query without empty values (a form sends its blank fields) and with a page size.
fn filters(q: &HashMap<String, String>, known: &[&str]) -> HashMap<String, String> {
    let mut out: HashMap<String, String> = q
        .iter()
        .filter(|(k, v)| known.contains(&k.as_str()) && !v.trim().is_empty())
        .map(|(k, v)| (k.clone(), v.trim().to_owned()))
        .collect();
    out.entry("limit".into())
        .or_insert_with(|| PAGE.to_string());
    out
}

fn jobs_table(jobs: &[(String, Job)]) -> String {
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|(id, j)| {
            vec![
                job_link(id),
                state(j.state.as_str()),
                esc(&j.request.tenant_id),
                esc(j.pool.as_deref().unwrap_or(&j.pools.join(", "))),
                esc(j.worker_id.as_deref().unwrap_or("")),
                j.attempt.to_string(),
                time(Some(j.updated_at)),
            ]
        })
        .collect();
    table(
        &[
            "JOB",
            "STATE",
            "TENANT",
            "POOL",
            "WORKER",
            "ATTEMPT",
            "UPDATED (UTC)",
        ],
        &rows,
    )
}

async fn jobs(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let f = filters(&q, &["state", "tenant", "pool", "topic", "after", "limit"]);
    let (list, next) = match jobs_query(&api, who.clone(), &f).await {
        Ok(r) => r,
        Err(e) => return failed(&who, "Jobs", e),
    };
    let value = |k: &str| f.get(k).map_or(String::new(), |v| esc(v));
    let mut states = String::from("<option value=\"\">any state</option>");
    for s in JobState::ALL {
        let sel = if f.get("state").map(String::as_str) == Some(s.as_str()) {
            " selected"
        } else {
            ""
        };
        let _ = write!(states, "<option{sel}>{}</option>", s.as_str());
    }
    let mut body = format!(
        "<h1>Jobs</h1><form method=\"get\" action=\"/ui/jobs\" id=\"filters\">\
         <select name=\"state\">{states}</select> \
         <input name=\"tenant\" placeholder=\"tenant\" value=\"{}\"> \
         <input name=\"pool\" placeholder=\"pool\" value=\"{}\"> \
         <input name=\"topic\" placeholder=\"topic\" value=\"{}\"> \
         <button type=\"submit\">Filter</button></form>{}",
        value("tenant"),
        value("pool"),
        value("topic"),
        jobs_table(&list)
    );
    if let Some(after) = next {
        let mut q = f.clone();
        q.insert("after".into(), after);
        let query: Vec<String> = q
            .iter()
            .map(|(k, v)| format!("{}={}", url(k), url(v)))
            .collect();
        let _ = write!(
            body,
            "<a href=\"/ui/jobs?{}\" id=\"next\">next page</a>",
            esc(&query.join("&"))
        );
    }
    Html(page("Jobs", "/ui/jobs", Some(&who), &body)).into_response()
}

/// A journal entry's events as rows, with placement candidates and policy verdicts.
fn decision(item: &TimelineItem) -> String {
    let e = &item.entry;
    let mut out = format!(
        "<tr><td class=\"num\">{}</td><td>{}</td><td>{}<br><span class=\"muted\">{}</span></td><td>",
        item.offset,
        time(Some(e.log_time)),
        esc(e.input.kind()),
        esc(&ksched_runtime::audit::cause_text(&e.cause)),
    );
    for ev in &e.events {
        let _ = write!(
            out,
            "<div><b>{}</b> {}</div>",
            esc(ev.name()),
            esc(&ev.describe(&e.input))
        );
        let candidates = match ev {
            Event::JobScheduled(s) => Some((&s.candidates, s.candidates_omitted)),
            Event::JobWaiting(w) => Some((&w.candidates, w.candidates_omitted)),
            _ => None,
        };
        if let Some((cands, omitted)) = candidates {
            let rows: Vec<Vec<String>> = cands
                .iter()
                .map(|c| {
                    vec![
                        esc(&c.worker_id),
                        esc(&c.pool),
                        c.score.map_or(String::new(), |s| format!("{s:.3}")),
                        esc(c.skipped.as_deref().unwrap_or("")),
                    ]
                })
                .collect();
            out.push_str(&table(
                &["WORKER", "POOL", "SCORE", "SKIPPED BECAUSE"],
                &rows,
            ));
            if omitted > 0 {
                let _ = write!(out, "<div class=\"muted\">{omitted} more not listed</div>");
            }
        }
        if let Event::PolicyEvaluated(p) = ev
            && !p.reasons.is_empty()
        {
            let _ = write!(
                out,
                "<div>verdict {:?} under snapshot {}: {}</div>",
                p.verdict,
                esc(&p.snapshot_id),
                esc(&p.reasons.join("; "))
            );
        }
    }
    out.push_str("</td></tr>");
    out
}

/// The forms a job's state allows this caller.
fn actions(who: &Identity, id: &str, j: &Job) -> String {
    let as_field = |name: &'static str| -> Vec<(&'static str, &'static str, &'static str)> {
        if who.principal.is_none() {
            vec![(name, "as", "operator")]
        } else {
            Vec::new()
        }
    };
    let base = format!("/ui/jobs/{}", url(id));
    let mut out = String::new();
    if j.state == JobState::ApprovalRequired && who.may(Action::Decide) {
        let mut f = as_field("approver");
        f.push(("comment", "comment", ""));
        out.push_str(&action_form(&format!("{base}/approve"), "Approve", &f));
        let mut f = as_field("approver");
        f.push(("reason", "reason", ""));
        out.push_str(&action_form(&format!("{base}/reject"), "Reject", &f));
    }
    if !j.state.is_terminal() && who.may(Action::Cancel) {
        let mut f = as_field("principal");
        f.push(("reason", "reason", ""));
        out.push_str(&action_form(&format!("{base}/cancel"), "Cancel", &f));
    }
    if j.state.is_dead_lettered() && who.may(Action::Redrive) {
        let mut f = as_field("principal");
        f.push(("new_job_id", "new id (optional)", ""));
        f.push(("reason", "reason", ""));
        out.push_str(&action_form(&format!("{base}/redrive"), "Redrive", &f));
    }
    out
}

async fn job(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let (shard, store, j) = match find_job(&api, &who, &id) {
        Ok((store, j)) => {
            let shard = i32::from(store.partition());
            (shard, store.clone(), j)
        }
        Err(e) => return failed(&who, &id, e),
    };
    let history = store.history(&id).unwrap_or_default();
    let src = Source {
        client: api.journal_client.clone(),
        topic: api.topics.journal.clone(),
        partition: shard,
    };
    let (from, until) = (j.accepted_at, j.updated_at.max(j.accepted_at));
    let job_id = id.clone();
    // A journal read per page view: one of the few heavy reads at a time.
    let window = match heavy_read().await {
        Ok(turn) => tokio::task::spawn_blocking(move || {
            let _turn = turn;
            job_window(&src, &job_id, from, until, 5_000, MAX_WINDOW_ENTRIES)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string())),
        Err(e) => Err(e.1),
    };
    let decisions = match window {
        Ok((items, cut)) => {
            let rows: String = items.iter().map(decision).collect();
            format!(
                "<table id=\"decisions\"><thead><tr><th>OFFSET</th><th>LOG TIME (UTC)</th><th>INPUT</th><th>DECISION</th></tr></thead><tbody>{rows}</tbody></table>{}",
                if cut {
                    "<p class=\"muted\">The journal window was cut; `ksched audit job` reads it whole.</p>"
                } else {
                    ""
                }
            )
        }
        Err(e) => flash(&format!("the journal could not be read: {e}"), true),
    };
    let view = job_view(&id, &j);
    let fields: Vec<Vec<String>> = view
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| {
                    let text = match v {
                        Value::String(s) => s.clone(),
                        Value::Null => String::new(),
                        other => other.to_string(),
                    };
                    let text = if k.ends_with("_at") {
                        v.as_i64()
                            .map_or(text, |ms| format!("{} UTC", time(Some(ms))))
                    } else {
                        text
                    };
                    vec![esc(k), esc(&text)]
                })
                .collect()
        })
        .unwrap_or_default();
    let points: Vec<(i64, String, String)> = history
        .iter()
        .map(|h| (h.at, h.event.to_string(), h.detail.clone()))
        .collect();
    let rows: Vec<Vec<String>> = history
        .iter()
        .map(|h| vec![time(Some(h.at)), esc(&h.event), esc(&h.detail)])
        .collect();
    let msg = q.get("msg").map_or("", String::as_str);
    let err = q.get("err").map_or("", String::as_str);
    let body = format!(
        "<h1>Job {} {}</h1>{}{}<div id=\"actions\">{}</div>{}\
         <h2>History</h2>{}<h2>Decisions (journal)</h2>{decisions}<h2>Job</h2>{}",
        esc(&id),
        state(j.state.as_str()),
        flash(msg, false),
        flash(err, true),
        actions(&who, &id, &j),
        plot::timeline(&points),
        table(&["AT (UTC)", "EVENT", "DETAIL"], &rows),
        table(&["FIELD", "VALUE"], &fields),
    );
    Html(page(&format!("Job {id}"), "/ui/jobs", Some(&who), &body)).into_response()
}

/// A form's action on a job; back to the job's page with what happened.
async fn act(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path((id, action)): Path<(String, String)>,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let field = |k: &str| {
        f.get(k)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let done = match action.as_str() {
        "approve" => {
            approve_job(
                &api,
                &who,
                &id,
                ApproveBody {
                    approver: field("approver"),
                    comment: field("comment"),
                },
            )
            .await
        }
        "reject" => {
            reject_job(
                &api,
                &who,
                &id,
                RejectBody {
                    approver: field("approver"),
                    reason: field("reason"),
                },
            )
            .await
        }
        "cancel" => {
            cancel_job(
                &api,
                &who,
                &id,
                CancelBody {
                    principal: field("principal"),
                    tenant: None,
                    reason: field("reason"),
                },
            )
            .await
        }
        "redrive" => {
            redrive_job(
                &api,
                &who,
                &id,
                RedriveBody {
                    principal: field("principal"),
                    tenant: None,
                    new_job_id: field("new_job_id"),
                    reason: field("reason"),
                },
            )
            .await
        }
        other => Err(super::ApiError(
            StatusCode::NOT_FOUND,
            format!("no action {other}"),
        )),
    };
    let target = match done {
        Ok(v) => {
            let mut msg = v["status"].as_str().unwrap_or("sent").to_owned();
            if let Some(new) = v["new_job_id"].as_str() {
                let _ = write!(msg, " as {new}");
            }
            format!("/ui/jobs/{}?msg={}", url(&id), url(&msg))
        }
        Err(e) => format!("/ui/jobs/{}?err={}", url(&id), url(&e.1)),
    };
    Redirect::to(&target).into_response()
}

async fn workers(AxState(api): AxState<Arc<Api>>, Extension(who): Extension<Identity>) -> Response {
    if let Err(e) = super::require(&who, Action::Read) {
        return failed(&who, "Workers", e);
    }
    let mut ws = Vec::new();
    for s in &api.stores {
        match s.workers() {
            Ok(w) => ws.extend(w),
            Err(e) => return failed(&who, "Workers", super::internal(e)),
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

async fn pools(AxState(api): AxState<Arc<Api>>, Extension(who): Extension<Identity>) -> Response {
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
        .iter()
        .map(|(t, (running, waiting, limit))| {
            vec![
                format!("<a href=\"/ui/jobs?tenant={}\">{}</a>", url(t), esc(t)),
                running.to_string(),
                waiting.to_string(),
                limit.map_or("none".into(), |l| l.to_string()),
            ]
        })
        .collect();
    let body = format!(
        "<h1>Pools</h1>{}<h1>Tenants</h1>{}",
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
            &["TENANT", "ON WORKERS", "WAITING", "MAX CONCURRENT JOBS"],
            &tenants
        )
    );
    Html(page("Pools & tenants", "/ui/pools", Some(&who), &body)).into_response()
}

async fn dlq(
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

/// A time as the console takes it: RFC 3339, or a date-time without zone (UTC, what a
/// `datetime-local` input sends), or milliseconds since the epoch.
fn parse_time(s: &str) -> Option<i64> {
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
        super::ApiError(
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
async fn at(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(e) = super::require(&who, Action::Replay) {
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

fn what_if_form(pools: &str, policy: &str, shard: i32) -> String {
    format!(
        "<h1>What if</h1><p class=\"muted\">Decides every recorded input of a shard again under \
         other pools (a pools.yaml: topics, pools, tenants) and/or another input policy (one \
         Rego module), and lists the jobs that would have ended differently (as \
         <code>ksched audit what-if</code>). Nothing is written anywhere.</p>\
         <form method=\"post\" action=\"/ui/what-if\" id=\"what-if\">\
         <p><label>pools.yaml<br><textarea name=\"pools\" rows=\"10\" cols=\"90\" id=\"pools\">{}</textarea></label></p>\
         <p><label>policy (Rego, package ksched.input)<br><textarea name=\"policy\" rows=\"8\" cols=\"90\" id=\"policy\">{}</textarea></label></p>\
         <p>shard <input name=\"shard\" value=\"{shard}\" size=\"3\"> <button type=\"submit\" id=\"compare\">Compare</button></p></form>",
        esc(pools),
        esc(policy)
    )
}

async fn what_if_page(Extension(who): Extension<Identity>) -> Response {
    if let Err(e) = super::require(&who, Action::Replay) {
        return failed(&who, "What if", e);
    }
    Html(page(
        "What if",
        "/ui/what-if",
        Some(&who),
        &what_if_form("", "", 0),
    ))
    .into_response()
}

/// The what-if diff: jobs whose state, pool, worker or verdict would have differed. The
/// pools and the policy are checked here; the replay runs in a child process.
async fn what_if(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    if let Err(e) = super::require(&who, Action::Replay) {
        return failed(&who, "What if", e);
    }
    // Browsers send a textarea's line breaks as CRLF.
    let text = |k: &str| {
        f.get(k)
            .map_or(String::new(), |s| s.trim().replace("\r\n", "\n"))
    };
    let (pools_text, policy_text) = (text("pools"), text("policy"));
    let shard: i32 = f
        .get("shard")
        .and_then(|s| s.trim().parse().ok())
        .filter(|s| *s >= 0 && (*s as usize) < api.stores.len())
        .unwrap_or(0);
    let mut body = what_if_form(&pools_text, &policy_text, shard);
    let error = |body: &mut String, msg: String| body.push_str(&flash(&msg, true));
    if pools_text.is_empty() && policy_text.is_empty() {
        error(&mut body, "give a pools.yaml, a policy, or both".into());
        return Html(page("What if", "/ui/what-if", Some(&who), &body)).into_response();
    }
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
        max_rows: 1_000,
    };
    match replay(&api, &who, shard, task).await {
        Ok(ReplayAnswer::WhatIf {
            jobs,
            differing,
            rows,
            totals,
        }) => {
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
        }
        Ok(ReplayAnswer::Failed(e)) | Err(e) => error(&mut body, format!("the replay failed: {e}")),
        Ok(_) => error(&mut body, "the replay answered another question".into()),
    }
    Html(page("What if", "/ui/what-if", Some(&who), &body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_or_the_header_carries_the_token() {
        let mut h = HeaderMap::new();
        assert_eq!(credentials(&h), None);
        h.insert(
            header::COOKIE,
            "a=b; ksched_session=tok123".parse().unwrap(),
        );
        assert_eq!(credentials(&h).as_deref(), Some("Bearer tok123"));
        h.insert(header::AUTHORIZATION, "Bearer other".parse().unwrap());
        assert_eq!(credentials(&h).as_deref(), Some("Bearer other"));
    }

    #[test]
    fn only_this_origin_may_post() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:8080".parse().unwrap());
        assert!(!same_origin(&h, false), "no Origin: refused");
        h.insert("origin", "http://127.0.0.1:8080".parse().unwrap());
        assert!(same_origin(&h, false));
        assert!(!same_origin(&h, true), "https page, http origin");
        h.insert("sec-fetch-site", "cross-site".parse().unwrap());
        assert!(!same_origin(&h, false));
        h.insert("sec-fetch-site", "same-origin".parse().unwrap());
        h.insert("origin", "http://evil.example".parse().unwrap());
        assert!(!same_origin(&h, false));
    }

    #[test]
    fn times_from_forms() {
        assert_eq!(parse_time("1000"), Some(1000));
        assert_eq!(parse_time("1970-01-01T00:00:01Z"), Some(1000));
        assert_eq!(parse_time("1970-01-01T00:00:02"), Some(2000));
        assert_eq!(parse_time("1970-01-01T00:01"), Some(60_000));
        assert_eq!(parse_time("yesterday"), None);
    }
}
