//! The routes of the API and the console, and what every request passes first: the Host
//! allow-list, authentication, the security headers; health, readiness and `/metrics`.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State as AxState};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Router, http::header};
use serde_json::{Value, json};

use crate::actions::{approve, cancel, checkpoint, redrive, reject, reschedule};
use crate::auth::{Denied, host_allowed};
use crate::fleet::{dlq, tenants, workers};
use crate::jobs::{get_job, job_history, list_jobs};
use crate::schedules;
use crate::{Api, ApiError, bad_request};

/// The routes.
pub fn router(api: Arc<Api>) -> Router {
    Router::new()
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/api/v1/jobs", get(list_jobs))
        .route("/api/v1/jobs/{id}", get(get_job))
        .route("/api/v1/jobs/{id}/history", get(job_history))
        .route("/api/v1/jobs/{id}/approve", post(approve))
        .route("/api/v1/jobs/{id}/reject", post(reject))
        .route("/api/v1/jobs/{id}/cancel", post(cancel))
        .route("/api/v1/jobs/{id}/redrive", post(redrive))
        .route("/api/v1/jobs/{id}/reschedule", post(reschedule))
        .route(
            "/api/v1/schedules",
            get(schedules::list_schedules).post(schedules::create_schedule),
        )
        .route(
            "/api/v1/schedules/{tenant}/{id}",
            get(schedules::get_schedule)
                .put(schedules::update_schedule)
                .delete(schedules::delete_schedule),
        )
        .route(
            "/api/v1/schedules/{tenant}/{id}/{action}",
            post(schedules::act_on_schedule),
        )
        .route("/api/v1/batches", get(crate::batches::list_batches))
        .route(
            "/api/v1/batches/{tenant}/{id}",
            get(crate::batches::get_batch),
        )
        .route(
            "/api/v1/batches/{tenant}/{id}/cancel",
            post(crate::batches::cancel_batch),
        )
        .route("/api/v1/workers", get(workers))
        .route("/api/v1/dlq", get(dlq))
        .route("/api/v1/tenants", get(tenants))
        .route("/api/v1/admin/checkpoint", post(checkpoint))
        .merge(crate::console::routes(api.clone()))
        .fallback(|| async { ApiError(StatusCode::NOT_FOUND, "no such route".into()) })
        .layer(axum::middleware::from_fn_with_state(
            api.clone(),
            unless_stopped,
        ))
        .layer(axum::middleware::from_fn_with_state(api.clone(), guard))
        .layer(axum::middleware::from_fn_with_state(
            api.clone(),
            read_body_in_time,
        ))
        .layer(axum::middleware::from_fn(secure_headers))
        .layer(DefaultBodyLimit::max(api.max_body_bytes))
        .with_state(api)
}

/// The checks before any `/api/` route: an allowed Host, a JSON body, a known caller (whose
/// identity the handlers receive).
pub(super) async fn guard(
    AxState(api): AxState<Arc<Api>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if !req.uri().path().starts_with("/api/") {
        return next.run(req).await;
    }
    let headers = req.headers();
    let text = |h: header::HeaderName| headers.get(h).and_then(|v| v.to_str().ok());
    if !host_allowed(text(header::HOST), &api.allowed_hosts) {
        return bad_request(format!(
            "Host {:?} is not one this API answers (http.allowed_hosts)",
            text(header::HOST).unwrap_or("")
        ))
        .into_response();
    }
    if req.method() == axum::http::Method::POST
        && !text(header::CONTENT_TYPE)
            .is_some_and(|c| c.trim_start().starts_with("application/json"))
    {
        return ApiError(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send JSON with Content-Type: application/json".into(),
        )
        .into_response();
    }
    match api.auth.identify(text(header::AUTHORIZATION)) {
        Ok(id) => {
            req.extensions_mut().insert(id);
            next.run(req).await
        }
        Err(Denied::Unauthenticated(why)) => {
            let mut r = ApiError(StatusCode::UNAUTHORIZED, why).into_response();
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            r
        }
    }
}

/// Headers on every response: no MIME sniffing, no framing by another site (clickjacking of
/// the console's forms), and nothing kept in caches (pages and answers show jobs and who
/// may act on them).
async fn secure_headers(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut r = next.run(req).await;
    let h = r.headers_mut();
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static("frame-ancestors 'none'"),
    );
    h.insert(
        header::X_FRAME_OPTIONS,
        header::HeaderValue::from_static("DENY"),
    );
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    r
}

/// An instance that stopped for good (another took over) says so instead of answering from
/// a projection that no longer moves; health and metrics stay up.
async fn unless_stopped(
    AxState(api): AxState<Arc<Api>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if req.uri().path().starts_with("/api/")
        && let Some(why) = api.shards.stopped()
    {
        return ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("this instance no longer schedules: {why}"),
        )
        .into_response();
    }
    next.run(req).await
}

async fn live() -> axum::Json<Value> {
    axum::Json(json!({ "status": "ok" }))
}

/// Ready: recovered, the broker answers, Ticks are being judged (a processor cut off from
/// the log, or whose ticker is, reads none), and no other instance replaced this one.
async fn ready(AxState(api): AxState<Arc<Api>>) -> Response {
    let caught_up = api.shards.is_caught_up();
    let kafka = {
        let api = api.clone();
        tokio::task::spawn_blocking(move || api.kafka_reachable())
            .await
            .unwrap_or(false)
    };
    let since_tick = api.shards.since_last_tick_ms();
    let ticking = since_tick.is_some_and(|ms| ms <= api.tick_stale_ms);
    let stopped = api.shards.stopped();
    // A standby judges no Ticks; it is ready when it has read the journal to its end.
    let owner = api.shards.is_owner();
    let ok = caught_up && kafka && (ticking || !owner) && stopped.is_none();
    let body = json!({
        "ready": ok,
        "role": if owner { "owner" } else { "standby" },
        "caught_up": caught_up,
        "kafka_reachable": kafka,
        "ms_since_last_tick": since_tick,
        "stopped": stopped,
        "journal_watermark": api.shards.watermarks().first(),
        "journal_watermarks": api.shards.watermarks(),
        "owned_shards": api.shards.owned_ids(),
        "standby_shards": api.shards.standby_ids(),
    });
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, axum::Json(body)).into_response()
}

/// `/metrics`, to an allowed `Host` or an IP address: DNS rebinding needs a name, and a
/// scraper addresses a pod by its IP.
async fn metrics(AxState(api): AxState<Arc<Api>>, headers: axum::http::HeaderMap) -> Response {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    if !host_allowed(host, &api.allowed_hosts) && !host.is_some_and(is_ip_literal) {
        return bad_request(format!(
            "Host {:?} is not one this API answers (http.allowed_hosts)",
            host.unwrap_or("")
        ))
        .into_response();
    }
    (
        [("content-type", "text/plain; version=0.0.4")],
        api.shards.render_metrics(),
    )
        .into_response()
}

/// Whether a `Host` header (with or without a port) is an IP address, not a name.
fn is_ip_literal(host: &str) -> bool {
    host.parse::<std::net::SocketAddr>().is_ok()
        || host.parse::<std::net::IpAddr>().is_ok()
        || host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok())
}

/// Reads a request's whole body, within `http.request_read_timeout_ms` and
/// `http.max_body_bytes`, before any handler sees it: a client that sends its body a byte
/// at a time is answered 408 and closed instead of holding a task and a connection.
async fn read_body_in_time(
    AxState(api): AxState<Arc<Api>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let read = axum::body::to_bytes(body, api.max_body_bytes);
    let bytes = match tokio::time::timeout(api.read_timeout, read).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => {
            return ApiError(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the request body is larger than {} bytes (http.max_body_bytes), or broken",
                    api.max_body_bytes
                ),
            )
            .into_response();
        }
        Err(_) => {
            let mut r = ApiError(
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive in time (http.request_read_timeout_ms)".into(),
            )
            .into_response();
            r.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            return r;
        }
    };
    next.run(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(bytes),
    ))
    .await
}
