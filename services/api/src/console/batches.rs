//! Batches: each with its progress (succeeded, failed, not ended, not yet submitted) as a
//! bar, its state and times; one batch's page lists its members not ended and its callbacks
//! waiting; operators cancel an open batch.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Form, Path, State as AxState};
use axum::response::{Html, IntoResponse, Redirect, Response};
use ksched_core::events::BatchState;
use ksched_core::state::Batch;

use super::failed;
use super::html::{action_form, esc, flash, job_link, page, state, table, time, url};
use crate::Api;
use crate::actions::CancelBody;
use crate::auth::{Action, Identity};
use crate::batches::{batch_cancel, batch_detail};

/// Most batches the list shows.
const SHOWN: usize = 200;

/// A batch's progress as a bar: succeeded, failed, not ended, not submitted yet.
pub(super) fn progress(b: &Batch) -> String {
    const WIDTH: f64 = 240.0;
    let total = f64::from(b.expected.max(1));
    let running = b.joined.saturating_sub(b.ended()).max(0);
    let parts = [
        (b.succeeded, "#2e7d32", "succeeded"),
        (b.failed, "#c62828", "ended otherwise"),
        (running, "#1565c0", "not ended"),
    ];
    let mut svg = format!(
        "<svg class=\"progress\" width=\"{WIDTH}\" height=\"12\" role=\"img\" aria-label=\"{} of {} ended\"><rect width=\"{WIDTH}\" height=\"12\" fill=\"#e0e0e0\"><title>not submitted yet</title></rect>",
        b.ended(),
        b.expected
    );
    let mut x = 0.0;
    for (n, color, what) in parts {
        let w = WIDTH * f64::from(n.max(0)) / total;
        if w > 0.0 {
            let _ = write!(
                svg,
                "<rect x=\"{x:.1}\" width=\"{w:.1}\" height=\"12\" fill=\"{color}\"><title>{n} {what}</title></rect>"
            );
        }
        x += w;
    }
    svg.push_str("</svg>");
    svg
}

fn counts(b: &Batch) -> String {
    format!(
        "{} of {} submitted; {} succeeded, {} ended otherwise",
        b.joined, b.expected, b.succeeded, b.failed
    )
}

fn cancel_form(who: &Identity, tenant: &str, id: &str, b: &Batch) -> String {
    if b.state != BatchState::Open || !who.may(Action::Cancel) {
        return String::new();
    }
    let action = format!("/ui/batches/{}/{}/cancel", url(tenant), url(id));
    let mut fields = Vec::new();
    if who.principal.is_none() {
        fields.push(("principal", "as", "operator"));
    }
    fields.push(("reason", "reason", ""));
    action_form(&action, "Cancel batch", &fields)
}

pub(super) async fn batches(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
    axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>,
) -> Response {
    if let Err(e) = crate::require(&who, Action::Read) {
        return failed(&who, "Batches", e);
    }
    let mut all = Vec::new();
    for store in &api.stores {
        match store.batches(None, |(t, _)| who.sees(t), SHOWN + 1) {
            Ok(b) => all.extend(b),
            Err(e) => return failed(&who, "Batches", crate::internal(e)),
        }
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let more = all.len() > SHOWN;
    all.truncate(SHOWN);
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|((tenant, id), b)| {
            let link = format!(
                "<a href=\"/ui/batches/{}/{}\">{}:{}</a>",
                url(tenant),
                url(id),
                esc(tenant),
                esc(id)
            );
            vec![
                link,
                state(b.state.as_str()),
                progress(b),
                esc(&counts(b)),
                time(Some(b.opened_at)),
                time(b.ended_at),
                cancel_form(&who, tenant, id, b),
            ]
        })
        .collect();
    let mut body = String::from("<h1>Batches</h1>");
    body.push_str(&flash(q.get("msg").map_or("", String::as_str), false));
    body.push_str(&flash(q.get("err").map_or("", String::as_str), true));
    body.push_str(&table(
        &[
            "BATCH",
            "STATE",
            "PROGRESS",
            "COUNTS",
            "OPENED (UTC)",
            "ENDED (UTC)",
            "",
        ],
        &rows,
    ));
    if more {
        let _ = write!(
            body,
            "<p class=\"muted\">The first {SHOWN}; `ksched batches list --tenant T` narrows.</p>"
        );
    }
    Html(page("Batches", "/ui/batches", Some(&who), &body)).into_response()
}

/// One batch: progress, members not ended, callbacks waiting.
pub(super) async fn batch(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path((tenant, id)): Path<(String, String)>,
) -> Response {
    let title = format!("Batch {id}");
    let view = match batch_detail(&api, &who, &tenant, &id) {
        Ok(v) => v.0,
        Err(e) => return failed(&who, &title, e),
    };
    let b = match crate::batches::find_batch(&api, &who, &tenant, &id) {
        Ok((_, b)) => b,
        Err(e) => return failed(&who, &title, e),
    };
    let ids = |field: &str| -> String {
        let list: Vec<String> = (view[field].as_array().into_iter().flatten())
            .filter_map(|v| v.as_str())
            .map(job_link)
            .collect();
        let more = if view[format!("{field}_more")].as_bool() == Some(true) {
            " and more"
        } else {
            ""
        };
        if list.is_empty() {
            "none".to_owned()
        } else {
            format!("{}{more}", list.join(", "))
        }
    };
    let body = format!(
        "<h1>Batch {}:{} {}</h1><p>{}</p><p>{}</p><p>opened {} UTC, expires {} UTC{}</p>{}\
         <h2>Members not ended</h2><p>{}</p><h2>Callbacks waiting</h2><p>{}</p>",
        esc(&tenant),
        esc(&id),
        state(b.state.as_str()),
        progress(&b),
        esc(&counts(&b)),
        time(Some(b.opened_at)),
        time(Some(b.until)),
        b.ended_at
            .map(|t| format!(", ended {} UTC", time(Some(t))))
            .unwrap_or_default(),
        cancel_form(&who, &tenant, &id, &b),
        ids("members_not_ended"),
        ids("callbacks_waiting"),
    );
    Html(page(&title, "/ui/batches", Some(&who), &body)).into_response()
}

/// POST /ui/batches/{tenant}/{id}/cancel.
pub(super) async fn cancel(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path((tenant, id)): Path<(String, String)>,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let body = CancelBody {
        principal: f.get("principal").cloned().filter(|p| !p.trim().is_empty()),
        tenant: None,
        reason: f.get("reason").cloned().filter(|r| !r.trim().is_empty()),
    };
    let target = match batch_cancel(&api, &who, &tenant, &id, body).await {
        Ok(_) => format!(
            "/ui/batches?msg={}",
            url(&format!("{tenant}:{id}: cancel sent"))
        ),
        Err(e) => format!("/ui/batches?err={}", url(&e.1)),
    };
    Redirect::to(&target).into_response()
}
