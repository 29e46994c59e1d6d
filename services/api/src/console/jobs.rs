//! The jobs list and a job's page: its timeline, every decision with its candidates and
//! policy verdicts, and the actions an operator may take on it.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Form, Path, Query, State as AxState};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use ksched_core::events::{Event, JobState};
use ksched_core::state::Job;
use ksched_runtime::audit::{Source, TimelineItem, job_window};
use serde_json::Value;

use super::html::{action_form, esc, flash, job_link, page, state, table, time, url};
use super::plot;
use super::{PAGE, failed};
use crate::actions::{
    ApproveBody, CancelBody, RedriveBody, RejectBody, approve_job, cancel_job, redrive_job,
    reject_job,
};
use crate::auth::{Action, Identity};
use crate::jobs::{find_job, jobs_query};
use crate::{Api, JOB_COLUMNS, heavy_read, job_view};

/// Most journal entries a job page reads (its window of the journal).
const MAX_WINDOW_ENTRIES: usize = 50_000;

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

pub(super) fn jobs_table(jobs: &[(String, Job)]) -> String {
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
    table(&JOB_COLUMNS, &rows)
}

pub(super) async fn jobs(
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
pub(super) fn actions(who: &Identity, id: &str, j: &Job) -> String {
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

pub(super) async fn job(
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
    let window =
        heavy_read(move || job_window(&src, &job_id, from, until, 5_000, MAX_WINDOW_ENTRIES))
            .await
            .map_err(|e| e.1);
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
    // What it waits for (their states as this shard has them; another tenant's job, or one
    // of another shard, shows as not known), and what waits for it.
    let graph = if j.request.depends_on.is_empty() && !j.awaited {
        String::new()
    } else {
        let waits_for: Vec<(String, Option<String>)> = (j.request.depends_on.iter())
            .take(plot::GRAPH_SIDE + 1)
            .map(|dep| {
                let state = (store.job(dep).ok().flatten())
                    .filter(|d| d.request.tenant_id == j.request.tenant_id)
                    .map(|d| d.state.as_str().to_owned());
                (dep.clone(), state)
            })
            .collect();
        let limit = plot::GRAPH_SIDE + 1;
        let mut waited_by =
            (store.dependents_after(&j.request.tenant_id, &id, None, limit)).unwrap_or_default();
        let more = waited_by.len() > plot::GRAPH_SIDE;
        waited_by.truncate(plot::GRAPH_SIDE);
        plot::dependencies((&id, j.state.as_str()), &waits_for, &waited_by, more)
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
         {graph}<h2>History</h2>{}<h2>Decisions (journal)</h2>{decisions}<h2>Job</h2>{}",
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
pub(super) async fn act(
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
        other => Err(crate::ApiError(
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
