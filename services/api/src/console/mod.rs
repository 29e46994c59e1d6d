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

mod batches;
mod fleet;
mod html;
mod jobs;
mod overview;
mod plot;
mod replays;
mod samples;
mod schedules;

pub(crate) use samples::Samples;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Form, Query, State as AxState};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use ksched_runtime::clock::wall_clock_ms;

use crate::Api;
use crate::auth::{Denied, Identity, host_allowed};
use fleet::{dlq, pools, workers};
use html::{esc, flash, page, url};
use jobs::{act, job, jobs};
use overview::{live, overview};
use replays::{at, what_if, what_if_page};

/// The cookie that holds a signed-in browser's token.
const COOKIE: &str = "ksched_session";

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
        .route("/ui/schedules", get(schedules::schedules))
        .route("/ui/schedules/{tenant}/{id}/{action}", post(schedules::act))
        .route("/ui/batches", get(batches::batches))
        .route("/ui/batches/{tenant}/{id}", get(batches::batch))
        .route("/ui/batches/{tenant}/{id}/cancel", post(batches::cancel))
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
fn failed(who: &Identity, title: &str, e: crate::ApiError) -> Response {
    (e.0, Html(page(title, "", Some(who), &flash(&e.1, true)))).into_response()
}

#[cfg(test)]
mod tests;
