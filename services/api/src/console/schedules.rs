//! Schedules: each with its times, its next firings and its latest runs with their jobs;
//! pause, resume and trigger for operators.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Form, Path, State as AxState};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use ksched_core::records::ScheduleAction;
use ksched_core::schedule::{Times, slot_text};

use super::failed;
use super::html::{action_form, esc, flash, job_link, page, table, time, url};
use crate::Api;
use crate::auth::{Action, Identity};
use crate::schedules::{ActBody, schedule_act};

/// How many coming firings a row shows.
const NEXT: usize = 3;

pub(super) async fn schedules(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
    axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>,
) -> Response {
    if let Err(e) = crate::require(&who, Action::Read) {
        return failed(&who, "Schedules", e);
    }
    let mut all = Vec::new();
    for store in &api.stores {
        match store.schedules() {
            Ok(s) => all.extend(s.into_iter().filter(|(_, s)| who.sees(&s.tenant_id))),
            Err(e) => return failed(&who, "Schedules", crate::internal(e)),
        }
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let operator = who.may(Action::Schedule);
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|(_, s)| {
            let spec = &s.spec;
            let when = match (&spec.cron, spec.interval_ms) {
                (Some(c), _) => format!("{} ({})", esc(c), esc(&spec.time_zone)),
                (None, Some(ms)) => format!("every {}", esc(&human_ms(ms))),
                (None, None) => String::new(),
            };
            let mut next = Vec::new();
            if let (Ok(times), Some(first)) = (Times::of(spec, s.created_at), s.next_slot) {
                let mut at = Some(first);
                while let Some(t) = at.filter(|_| next.len() < NEXT) {
                    next.push(time(Some(t)));
                    at = times.next_after(t);
                }
            }
            let mut last = String::new();
            for f in s.recent.iter().rev().take(3) {
                let job = f.job_id.as_deref().map(job_link).unwrap_or_default();
                let _ = write!(
                    last,
                    "<div title=\"{}\">{} {} {job}</div>",
                    esc(&f.detail),
                    esc(&slot_text(f.slot)),
                    esc(&f.outcome)
                );
            }
            let base = format!(
                "/ui/schedules/{}/{}",
                url(&s.tenant_id),
                url(&s.schedule_id)
            );
            let mut actions = String::new();
            if operator {
                let toggle = if s.paused { "resume" } else { "pause" };
                actions.push_str(&action_form(&format!("{base}/{toggle}"), toggle, &[]));
                actions.push_str(&action_form(&format!("{base}/trigger"), "trigger", &[]));
            }
            vec![
                format!("{}:{}", esc(&s.tenant_id), esc(&s.schedule_id)),
                when,
                esc(&spec.template.topic),
                if s.paused { "paused" } else { "active" }.to_owned(),
                next.join("<br>"),
                last,
                format!(
                    "{} run, {} skipped, {} missed, {} refused",
                    s.submitted, s.skipped, s.missed, s.refused
                ),
                actions,
            ]
        })
        .collect();
    let mut body = String::from("<h1>Schedules</h1>");
    body.push_str(&flash(q.get("msg").map_or("", String::as_str), false));
    body.push_str(&flash(q.get("err").map_or("", String::as_str), true));
    body.push_str(&table(
        &[
            "SCHEDULE",
            "WHEN",
            "TOPIC",
            "",
            "NEXT FIRINGS (UTC)",
            "LATEST FIRINGS",
            "SO FAR",
            "",
        ],
        &rows,
    ));
    Html(page("Schedules", "/ui/schedules", Some(&who), &body)).into_response()
}

/// POST /ui/schedules/{tenant}/{id}/{pause|resume|trigger}.
pub(super) async fn act(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path((tenant, id, verb)): Path<(String, String, String)>,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let action = match verb.as_str() {
        "pause" => Ok(ScheduleAction::Pause),
        "resume" => Ok(ScheduleAction::Resume),
        "trigger" => Ok(ScheduleAction::Trigger),
        other => Err(crate::ApiError(
            StatusCode::NOT_FOUND,
            format!("no schedule action {other}"),
        )),
    };
    let body = ActBody {
        principal: f.get("principal").cloned().filter(|p| !p.trim().is_empty()),
        reason: f.get("reason").cloned().filter(|r| !r.trim().is_empty()),
    };
    let done = match action {
        Ok(a) => schedule_act(&api, &who, &tenant, &id, a, body).await,
        Err(e) => Err(e),
    };
    let target = match done {
        Ok(v) => format!(
            "/ui/schedules?msg={}",
            url(&format!(
                "{tenant}:{id}: {}",
                v["status"].as_str().unwrap_or("sent")
            ))
        ),
        Err(e) => format!("/ui/schedules?err={}", url(&e.1)),
    };
    Redirect::to(&target).into_response()
}

/// `90000` -> `1m30s`.
fn human_ms(ms: i64) -> String {
    let mut left = ms / 1000;
    let mut out = String::new();
    for (unit, secs) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if left >= secs {
            let _ = write!(out, "{}{unit}", left / secs);
            left %= secs;
        }
    }
    if out.is_empty() {
        format!("{ms}ms")
    } else {
        out
    }
}
