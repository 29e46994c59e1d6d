//! The HTTP API served by `ksched run` (docs/openapi.yaml): read-only queries over the
//! projection, approve/reject/cancel (which produce control records, like the CLI), health
//! and readiness, and `/metrics`. Secret env values are hidden in every view.
//!
//! `/api/` routes answer only allowed `Host`s (DNS rebinding), take JSON bodies only (a web
//! page cannot post `text/plain` cross-origin into them), and, with `http.tokens_file`,
//! only authenticated callers, each within its roles and tenants (auth.rs).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, Extension, Path, Query, State as AxState};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Router, http::header};
use ksched_core::events::JobState;
use ksched_core::records::{ApproveJob, CancelJob, DeadLetter, RedriveJob, RejectJob, redact_env};
use ksched_core::state::{Job, Worker};
use ksched_store::Store;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use crate::auth::{Action, Auth, Denied, Identity, default_allowed_hosts, host_allowed};
use ksched_runtime::clock::wall_clock_ms;
use ksched_runtime::error::{Result, kafka};
use ksched_runtime::settings::Settings;
use ksched_runtime::status::Shards;
use ksched_runtime::topics::{Topics, client_config};

pub mod auth;
mod console;
pub mod tls;

/// Most jobs one list request returns.
pub const MAX_LIMIT: usize = 10_000;
/// Most jobs (or dead letters) one list request reads per shard: a filter that matches few
/// returns a page with fewer than `limit` jobs and a `next_after` to continue from.
pub const MAX_SCANNED: usize = 50_000;
/// Most bytes of jobs one list request reads per shard (jobs with large labels and env make
/// a page short, with a `next_after`).
pub const MAX_PAGE_BYTES: usize = 16 << 20;
/// Reads that grow with the backlog or the journal (job lists, tenant usage, a job's
/// journal window) at once; more wait for a turn, up to `HEAVY_READ_WAIT`.
const HEAVY_READS: usize = 2;
const HEAVY_READ_WAIT: Duration = Duration::from_secs(10);

static HEAVY: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(HEAVY_READS);

/// A turn for a heavy read, or 503 when none came within `HEAVY_READ_WAIT`.
async fn heavy_read() -> ApiResult<tokio::sync::SemaphorePermit<'static>> {
    match tokio::time::timeout(HEAVY_READ_WAIT, HEAVY.acquire()).await {
        Ok(Ok(p)) => Ok(p),
        _ => Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many large reads at once; try again in a moment".into(),
        )),
    }
}
/// Jobs a list request returns without `limit`.
pub const DEFAULT_LIMIT: usize = 100;

/// What the handlers share.
pub struct Api {
    /// Every shard's store (index = shard): this instance's view of each, exact for the
    /// shards it owns, a moment behind for those it stands by for.
    stores: Vec<Store>,
    checkpoints: std::path::PathBuf,
    shards: Shards,
    producer: FutureProducer,
    topics: Topics,
    kafka_ok: Mutex<(Option<Instant>, bool)>,
    /// Longer than this without a Tick judged: not ready.
    tick_stale_ms: i64,
    auth: Auth,
    four_eyes: bool,
    allowed_hosts: Vec<String>,
    max_body_bytes: usize,
    /// The console's samples of the metrics, for its plots.
    samples: console::Samples,
    /// How the console reads the journal (a job's decisions, time travel).
    journal_client: rdkafka::ClientConfig,
    /// Served over TLS: the console's cookie is `Secure`, and its pages' origin `https`.
    secure_cookies: bool,
    /// How the console's time travel and what-if run (a child process).
    replays: ksched_runtime::audit::isolated::ChildLimits,
    /// `http.request_read_timeout_ms`.
    read_timeout: Duration,
    max_connections: usize,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api").finish_non_exhaustive()
    }
}

impl Api {
    pub fn new(
        settings: &Settings,
        topics: Topics,
        stores: Vec<Store>,
        shards: Shards,
    ) -> Result<Api> {
        let producer: FutureProducer = client_config(settings)
            .set("client.id", format!("{}-api", settings.kafka.client_id))
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", "10000")
            .create()
            .map_err(kafka("creating the API producer"))?;
        let data = &settings.storage.data_dir;
        let checkpoints = data.with_file_name(format!(
            "{}-checkpoints",
            data.file_name()
                .map_or_else(|| "data".into(), |n| n.to_string_lossy().into_owned())
        ));
        let auth = Auth::from_settings(&settings.http)?;
        let allowed_hosts = if settings.http.allowed_hosts.is_empty() {
            default_allowed_hosts(&settings.http.listen)
        } else {
            settings.http.allowed_hosts.clone()
        };
        Ok(Api {
            stores,
            checkpoints,
            shards,
            producer,
            topics,
            auth,
            four_eyes: settings.http.four_eyes,
            allowed_hosts,
            max_body_bytes: settings.http.max_body_bytes,
            samples: console::Samples::default(),
            // The processor's principal reads the journal here: its group, not the auditors'.
            journal_client: ksched_runtime::replay::reader_client(settings, "console"),
            secure_cookies: settings.http.tls.is_some(),
            replays: ksched_runtime::audit::isolated::ChildLimits {
                // The `ksched` binary, which has the `replay-child` subcommand.
                program: std::env::current_exe().unwrap_or_else(|_| "ksched".into()),
                memory_limit_bytes: settings.http.replay_memory_limit_bytes,
                timeout: Duration::from_millis(settings.http.replay_timeout_ms),
            },
            read_timeout: Duration::from_millis(settings.http.request_read_timeout_ms),
            max_connections: settings.http.max_connections,
            kafka_ok: Mutex::new((None, false)),
            tick_stale_ms: i64::try_from(settings.processor.tick_interval_ms.saturating_mul(5))
                .unwrap_or(i64::MAX)
                .max(5_000),
        })
    }

    /// Whether the broker answers a metadata request (cached for a second).
    fn kafka_reachable(&self) -> bool {
        let mut guard = self.kafka_ok.lock().unwrap_or_else(|p| p.into_inner());
        if let (Some(at), ok) = *guard
            && at.elapsed() < Duration::from_secs(1)
        {
            return ok;
        }
        let ok = self
            .producer
            .client()
            .fetch_metadata(Some(&self.topics.control), Duration::from_millis(1500))
            .is_ok();
        *guard = (Some(Instant::now()), ok);
        ok
    }
}

/// A JSON error with a status code.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, axum::Json(json!({ "error": self.1 }))).into_response()
    }
}

fn bad_request(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into())
}

fn forbidden(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::FORBIDDEN, msg.into())
}

fn not_found(id: &str) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("no job {id}"))
}

/// Refuses what `id` may not do.
fn require(id: &Identity, action: Action) -> ApiResult<()> {
    if id.may(action) {
        Ok(())
    } else {
        Err(forbidden(format!(
            "{} may not {}",
            id.principal.as_deref().unwrap_or("this caller"),
            match action {
                Action::Read => "read",
                Action::Cancel => "cancel jobs (role operator)",
                Action::Redrive => "redrive dead-lettered jobs (role operator)",
                Action::Decide => "approve or reject jobs (role approver)",
                Action::Checkpoint => "take checkpoints (role admin)",
                Action::Replay =>
                    "replay the journal: time travel, what-if (role auditor or operator)",
            }
        )))
    }
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

type ApiResult<T = axum::Json<Value>> = std::result::Result<T, ApiError>;

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
        .route("/api/v1/workers", get(workers))
        .route("/api/v1/dlq", get(dlq))
        .route("/api/v1/tenants", get(tenants))
        .route("/api/v1/admin/checkpoint", post(checkpoint))
        .merge(console::routes(api.clone()))
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
async fn guard(
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

/// Serves the API on `listen` until `shutdown` resolves, over TLS when `tls` is given.
///
/// Hostile clients get little: at most `http.max_connections` connections at once (the
/// next ones are told 503 and closed), and a connection that does not send a request's
/// headers within `http.request_read_timeout_ms` of connecting or of its last response, a
/// body within as long after its headers (`read_body_in_time`), or does not read what it
/// is sent within as long (`WriteDeadline`), is closed. A TLS handshake has its own
/// timeout.
pub async fn serve(
    listen: &str,
    tls: Option<Arc<rustls::ServerConfig>>,
    api: Arc<Api>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    console::start_sampler(api.clone());
    let listener =
        tokio::net::TcpListener::bind(listen)
            .await
            .map_err(ksched_runtime::error::io(format!(
                "binding the HTTP API to {listen}"
            )))?;
    match &tls {
        Some(_) => info!(listen, "HTTP API listening over TLS"),
        None => info!(listen, "HTTP API listening"),
    }
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let read_timeout = api.read_timeout;
    let slots = Arc::new(tokio::sync::Semaphore::new(api.max_connections));
    let app = router(api);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    warn!(error = %e, "HTTP API cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        // Every connection is accepted, so the listen backlog never fills: past the cap, a
        // plain connection is told 503 and closed at once.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if acceptor.is_none() {
                tokio::spawn(refuse_connection(stream));
            }
            continue;
        };
        tokio::spawn(async move {
            let _slot = slot;
            let stream = WriteDeadline::new(stream, read_timeout);
            let Some(acceptor) = acceptor else {
                return serve_connection(stream, app, read_timeout, peer).await;
            };
            match tokio::time::timeout(crate::tls::HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
            {
                Ok(Ok(s)) => serve_connection(s, app, read_timeout, peer).await,
                Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake refused"),
                Err(_) => debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

/// A connection past `http.max_connections`: 503, closed.
async fn refuse_connection(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let answer = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 57\r\nConnection: close\r\n\r\n{\"error\": \"too many connections (http.max_connections)\"}\n";
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(answer)).await;
}

/// A connection whose writes may not stall: a client that stops reading (a pipelined flood
/// it never reads, a server-sent event stream it left) is cut off once a write has waited
/// this long, instead of holding its connection for ever.
struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    stalled: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    fn new(inner: S, limit: Duration) -> WriteDeadline<S> {
        WriteDeadline {
            inner,
            limit,
            stalled: None,
        }
    }

    /// After a write that returned `poll`: arms the deadline while it waits, checks it.
    fn watch<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        poll: std::task::Poll<std::io::Result<T>>,
    ) -> std::task::Poll<std::io::Result<T>> {
        use std::future::Future;
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client did not read its answer in time",
            ))),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, poll)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, poll)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// One HTTP/1.1 connection, with the header read timeout.
async fn serve_connection<S>(
    stream: S,
    app: Router,
    read_timeout: Duration,
    peer: std::net::SocketAddr,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(app);
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(read_timeout)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await
    {
        debug!(%peer, error = %e, "HTTP API connection ended");
    }
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

/// A job as the API and the CLI show it (secret env values hidden, payload as its size).
pub fn job_view(id: &str, j: &Job) -> Value {
    let r = &j.request;
    json!({
        "job_id": id,
        "state": j.state.as_str(),
        "tenant_id": r.tenant_id,
        "principal_id": r.principal_id,
        "topic": r.topic,
        "priority": r.priority.as_str(),
        "pools": j.pools,
        "attempt": j.attempt,
        "worker_id": j.worker_id,
        "pool": j.pool,
        "labels": r.labels,
        "env": redact_env(&r.env),
        "payload_size": j.payload_len,
        "budget": { "deadline_ms": r.budget.deadline_ms, "max_runtime_ms": r.budget.max_runtime_ms },
        "meta": {
            "idempotency_key": r.meta.idempotency_key,
            "capability": r.meta.capability,
            "risk_tags": r.meta.risk_tags,
            "requires": r.meta.requires,
            "actor_id": r.meta.actor_id,
        },
        "workflow_id": r.workflow_id,
        "constraints": {
            "max_retries": j.constraints.max_retries,
            "max_concurrent_jobs": j.constraints.max_concurrent_jobs,
            "max_runtime_ms": j.constraints.max_runtime_ms,
            "deadline_ms": j.constraints.deadline_ms,
            "labels": j.constraints.labels,
        },
        "job_hash": j.job_hash,
        "policy_snapshot": j.policy_snapshot,
        "submitted_at": r.submitted_at,
        "accepted_at": j.accepted_at,
        "updated_at": j.updated_at,
        "deadline_at": j.deadline_at,
        "retry_at": j.retry_at,
        "wait_reason": j.wait_reason,
        "progress": j.progress,
        "last_error": j.last_error,
        "result_ptr": j.result_ptr,
        "execution_ms": j.execution_ms,
        "dlq_reason": j.dlq_reason,
    })
}

pub fn worker_view(id: &str, w: &Worker) -> Value {
    let hb = &w.heartbeat;
    json!({
        "worker_id": id,
        "pool": hb.pool,
        "alive": w.alive,
        "last_seen": w.last_seen,
        "joined_at": w.joined_at,
        "active_jobs": hb.active_jobs,
        "max_parallel_jobs": hb.max_parallel_jobs,
        "cpu_load": hb.cpu_load,
        "gpu_utilization": hb.gpu_utilization,
        "memory_load": hb.memory_load,
        "memory_free_bytes": hb.memory_free_bytes,
        "capabilities": hb.capabilities,
        "labels": hb.labels,
        "owned_partitions": hb.owned_partitions,
        "draining": hb.draining,
    })
}

pub fn dead_letter_view(d: &DeadLetter) -> Value {
    json!({
        "job_id": d.job_id,
        "topic": d.topic,
        "tenant_id": d.tenant_id,
        "reason_code": d.reason_code,
        "reason": d.reason,
        "last_state": d.last_state,
        "attempts": d.attempts,
        "cause": { "topic": d.cause_topic, "partition": d.cause_partition, "offset": d.cause_offset },
        "at": d.at,
    })
}

fn limit_of(q: &HashMap<String, String>) -> ApiResult<usize> {
    match q.get("limit") {
        None => Ok(DEFAULT_LIMIT),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            _ => Err(bad_request(format!(
                "limit must be a number from 1 to {MAX_LIMIT}, got {v:?}"
            ))),
        },
    }
}

/// Checks query parameters against the known ones.
fn only(q: &HashMap<String, String>, known: &[&str]) -> ApiResult<()> {
    for k in q.keys() {
        if !known.contains(&k.as_str()) {
            return Err(bad_request(format!(
                "unknown query parameter {k:?}; known: {}",
                known.join(", ")
            )));
        }
    }
    Ok(())
}

async fn list_jobs(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    only(&q, &["state", "tenant", "pool", "topic", "limit", "after"])?;
    let (jobs, next) = jobs_query(&api, caller, &q).await?;
    Ok(axum::Json(json!({
        "jobs": jobs.iter().map(|(id, j)| job_view(id, j)).collect::<Vec<_>>(),
        "next_after": next,
    })))
}

/// The jobs `caller` sees that match the filters in `q` (state, tenant, pool, topic), in id
/// order, `limit` of them after `after`; and the id to continue after, if there may be more.
async fn jobs_query(
    api: &Api,
    caller: Identity,
    q: &HashMap<String, String>,
) -> ApiResult<(Vec<(String, Job)>, Option<String>)> {
    require(&caller, Action::Read)?;
    let limit = limit_of(q)?;
    let state = match q.get("state") {
        None => None,
        Some(s) => Some(JobState::parse(s).ok_or_else(|| {
            bad_request(format!(
                "unknown state {s:?}; one of {}",
                JobState::ALL.map(JobState::as_str).join(", ")
            ))
        })?),
    };
    let (tenant, pool, topic) = (
        q.get("tenant").cloned(),
        q.get("pool").cloned(),
        q.get("topic").cloned(),
    );
    let keep = move |_: &str, j: &Job| {
        caller.sees(&j.request.tenant_id)
            && state.is_none_or(|s| j.state == s)
            && tenant.as_ref().is_none_or(|t| &j.request.tenant_id == t)
            && pool
                .as_ref()
                .is_none_or(|p| j.pool.as_ref() == Some(p) || j.pools.contains(p))
            && topic.as_ref().is_none_or(|t| &j.request.topic == t)
    };
    let stores = api.stores.clone();
    let after = q.get("after").cloned();
    let active_only = state.is_some_and(|s| !s.is_terminal());
    // Held by the blocking task: a request given up on still holds its turn until done.
    let turn = heavy_read().await?;
    let (jobs, next) = tokio::task::spawn_blocking(move || {
        let _turn = turn;
        // Each shard's first `limit` after `after`, each scan bounded: the union's first
        // `limit` below the point every shard has been read to.
        let mut jobs = Vec::new();
        let mut read_to: Option<String> = None;
        for store in &stores {
            let bound = ksched_store::ScanBound {
                jobs: limit,
                scanned: MAX_SCANNED,
                bytes: MAX_PAGE_BYTES,
            };
            let scanned = if active_only {
                // Non-terminal states are served from the active index, not a full scan.
                store.scan_active_jobs(after.as_deref(), bound, &keep)?
            } else {
                store.scan_jobs(after.as_deref(), bound, &keep)?
            };
            let shard_read_to = match (&scanned.stopped_after, scanned.jobs.len() == limit) {
                (Some(last), _) => Some(last.clone()),
                (None, true) => scanned.jobs.last().map(|(id, _)| id.clone()),
                (None, false) => None,
            };
            if let Some(r) = shard_read_to {
                read_to = Some(read_to.map_or(r.clone(), |t: String| t.min(r)));
            }
            jobs.extend(scanned.jobs);
        }
        jobs.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(r) = &read_to {
            jobs.retain(|(id, _)| id <= r);
        }
        jobs.truncate(limit);
        let next = if jobs.len() == limit {
            jobs.last().map(|(id, _)| id.clone())
        } else {
            read_to
        };
        Ok::<_, ksched_store::Error>((jobs, next))
    })
    .await
    .map_err(internal)?
    .map_err(internal)?;
    Ok((jobs, next))
}

/// The job, if it exists and `caller` may see it (another tenant's job is "not found": its
/// existence is not disclosed).
fn load_job(api: &Api, caller: &Identity, id: &str) -> ApiResult<Job> {
    find_job(api, caller, id).map(|(_, j)| j)
}

/// [`load_job`], with the store (shard) that holds it.
fn find_job<'a>(api: &'a Api, caller: &Identity, id: &str) -> ApiResult<(&'a Store, Job)> {
    require(caller, Action::Read)?;
    for store in &api.stores {
        if let Some(j) = store.job(id).map_err(internal)? {
            return if caller.sees(&j.request.tenant_id) {
                Ok((store, j))
            } else {
                Err(not_found(id))
            };
        }
    }
    Err(not_found(id))
}

async fn get_job(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path(id): Path<String>,
) -> ApiResult {
    let job = load_job(&api, &caller, &id)?;
    Ok(axum::Json(job_view(&id, &job)))
}

async fn job_history(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path(id): Path<String>,
) -> ApiResult {
    let (store, job) = find_job(&api, &caller, &id)?;
    let lines = store.history(&id).map_err(internal)?;
    Ok(axum::Json(json!({
        "job_id": id,
        "state": job.state.as_str(),
        "attempt": job.attempt,
        "history": lines.iter().map(|h| json!({"at": h.at, "event": h.event, "detail": h.detail})).collect::<Vec<_>>(),
        // Lines past the bound were not kept (the last line is the latest); the journal has
        // every event: `ksched audit job`.
        "lines_omitted": job.history_omitted,
    })))
}

async fn send_control<T: ksched_codec::Record>(
    api: &Api,
    job_id: &str,
    record: &T,
) -> ApiResult<()> {
    let bytes = ksched_codec::encode(record).map_err(internal)?;
    api.producer
        .send(
            FutureRecord::to(&api.topics.control)
                .key(job_id)
                .payload(&bytes),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("kafka: {e}")))?;
    Ok(())
}

fn parse_body<T: for<'de> Deserialize<'de>>(body: &[u8]) -> ApiResult<T> {
    let body = if body.is_empty() {
        b"{}".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| bad_request(format!("request body: {e}")))
}

/// Who decides: the authenticated caller; without authentication (loopback only), the
/// approver the request names.
fn decider(caller: &Identity, named: Option<String>) -> ApiResult<String> {
    require(caller, Action::Decide)?;
    let approver = match &caller.principal {
        Some(p) => p.clone(),
        None => named.unwrap_or_default(),
    };
    if approver.trim().is_empty() {
        return Err(bad_request("approver must not be empty"));
    }
    Ok(approver)
}

/// The job an approval (`approving`) or rejection by `approver` is about, if it awaits one
/// and the approver did not submit it, nor, for an approval, may have (four eyes,
/// `http.four_eyes`).
fn awaiting_approval(
    api: &Api,
    caller: &Identity,
    id: &str,
    approver: &str,
    approving: bool,
) -> ApiResult<Job> {
    let job = load_job(api, caller, id)?;
    if job.state != JobState::ApprovalRequired {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("job {id} is {}, not awaiting approval", job.state),
        ));
    }
    let submitter = job
        .request
        .principal_id
        .as_deref()
        .filter(|p| !p.trim().is_empty());
    if api.four_eyes && approving && submitter.is_none() {
        return Err(forbidden(format!(
            "job {id} names no submitter (principal_id): four eyes (http.four_eyes) cannot tell the submitter from an approver"
        )));
    }
    if api.four_eyes && submitter == Some(approver) {
        return Err(forbidden(format!(
            "{approver} submitted job {id}: another approver must decide (four eyes, http.four_eyes)"
        )));
    }
    Ok(job)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApproveBody {
    /// Only without authentication; an authenticated caller approves as itself.
    approver: Option<String>,
    comment: Option<String>,
}

async fn approve(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let b: ApproveBody = parse_body(&body)?;
    Ok(accepted(approve_job(&api, &caller, &id, b).await?))
}

async fn approve_job(api: &Api, caller: &Identity, id: &str, b: ApproveBody) -> ApiResult<Value> {
    let id = id.to_owned();
    let approver = decider(caller, b.approver)?;
    let job = awaiting_approval(api, caller, &id, &approver, true)?;
    let record = ApproveJob {
        job_id: id.clone(),
        job_hash: job.job_hash.clone(),
        policy_snapshot: job.policy_snapshot.clone().unwrap_or_default(),
        approver: approver.clone(),
        comment: b.comment,
        requested_at: wall_clock_ms(),
    };
    send_control(api, &id, &record).await?;
    Ok(json!({
        "job_id": id,
        "job_hash": record.job_hash,
        "policy_snapshot": record.policy_snapshot,
        "approver": approver,
        "status": "approval sent",
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RejectBody {
    /// Only without authentication; an authenticated caller rejects as itself.
    approver: Option<String>,
    reason: Option<String>,
}

async fn reject(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let b: RejectBody = parse_body(&body)?;
    Ok(accepted(reject_job(&api, &caller, &id, b).await?))
}

async fn reject_job(api: &Api, caller: &Identity, id: &str, b: RejectBody) -> ApiResult<Value> {
    let approver = decider(caller, b.approver)?;
    awaiting_approval(api, caller, id, &approver, false)?;
    let record = RejectJob {
        job_id: id.to_owned(),
        approver,
        reason: b.reason,
        requested_at: wall_clock_ms(),
    };
    send_control(api, id, &record).await?;
    Ok(json!({ "job_id": id, "status": "rejection sent" }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelBody {
    /// Only without authentication; an authenticated caller cancels as itself.
    principal: Option<String>,
    /// Only without authentication; an authenticated caller acts for its tenants.
    tenant: Option<String>,
    reason: Option<String>,
}

async fn cancel(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let b: CancelBody = parse_body(&body)?;
    Ok(accepted(cancel_job(&api, &caller, &id, b).await?))
}

/// Who an operator's command is journaled as, and for which tenant: from the identity (a
/// tenant-scoped operator acts for the job's tenant, which it sees; an unscoped one as an
/// operator); without authentication (loopback only), as the request names.
fn acting(
    caller: &Identity,
    job: &Job,
    principal: Option<String>,
    tenant: Option<String>,
) -> ApiResult<(String, Option<String>)> {
    let (principal, tenant) = match &caller.principal {
        Some(p) => (
            p.clone(),
            (!caller.sees_all()).then(|| job.request.tenant_id.clone()),
        ),
        None => (principal.unwrap_or_default(), tenant),
    };
    if principal.trim().is_empty() {
        return Err(bad_request("principal must not be empty"));
    }
    Ok((principal, tenant))
}

async fn cancel_job(api: &Api, caller: &Identity, id: &str, b: CancelBody) -> ApiResult<Value> {
    require(caller, Action::Cancel)?;
    let job = load_job(api, caller, id)?;
    let (principal, tenant) = acting(caller, &job, b.principal, b.tenant)?;
    if job.state.is_terminal() {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("job {id} is already {}", job.state),
        ));
    }
    let record = CancelJob {
        job_id: id.to_owned(),
        tenant_id: tenant,
        principal_id: principal,
        reason: b.reason,
        requested_at: wall_clock_ms(),
    };
    send_control(api, id, &record).await?;
    Ok(json!({ "job_id": id, "status": "cancel sent" }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RedriveBody {
    /// Only without authentication; an authenticated caller redrives as itself.
    principal: Option<String>,
    /// Only without authentication; an authenticated caller acts for its tenants.
    tenant: Option<String>,
    /// The new job's id; default `<job_id>.redrive-<unix ms>`.
    new_job_id: Option<String>,
    reason: Option<String>,
}

/// Submits a dead-lettered job again as a new job (RedriveJob on the control topic; the
/// processor decides and journals JobAccepted + JobRedriven, or CommandRejected).
async fn redrive(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let b: RedriveBody = parse_body(&body)?;
    Ok(accepted(redrive_job(&api, &caller, &id, b).await?))
}

async fn redrive_job(api: &Api, caller: &Identity, id: &str, b: RedriveBody) -> ApiResult<Value> {
    require(caller, Action::Redrive)?;
    let job = load_job(api, caller, id)?;
    let (principal, tenant) = acting(caller, &job, b.principal, b.tenant)?;
    if !job.state.is_dead_lettered() {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "job {id} is {}; only a dead-lettered job (FAILED, TIMEOUT, DENIED) is redriven",
                job.state
            ),
        ));
    }
    let now = wall_clock_ms();
    let tenant_prefix = format!("{}:", job.request.tenant_id);
    let new_job_id = b.new_job_id.unwrap_or_else(|| {
        // A caller held to tenants redrives into the job's tenant's namespace.
        if caller.sees_all() || id.starts_with(&tenant_prefix) {
            format!("{id}.redrive-{now}")
        } else {
            format!("{tenant_prefix}{id}.redrive-{now}")
        }
    });
    // A caller held to tenants names new ids in the job's tenant's namespace only: any other
    // id could tell it whether another tenant holds it.
    if !caller.sees_all() && !new_job_id.starts_with(&tenant_prefix) {
        return Err(bad_request(format!(
            "new_job_id must start with \"{tenant_prefix}\" (the job's tenant's namespace)"
        )));
    }
    match find_job(api, caller, &new_job_id) {
        Ok(_) => {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!("job {new_job_id} exists already; choose another new_job_id"),
            ));
        }
        // Another tenant's job is "not found", like any id the caller may not see: a new
        // id in its namespace is refused as such, not told apart from a free one.
        Err(e) if e.0 == StatusCode::NOT_FOUND => {
            let foreign_namespace = new_job_id
                .split_once(':')
                .is_some_and(|(tenant, _)| !caller.sees(tenant));
            if foreign_namespace || find_job(api, &Identity::local(), &new_job_id).is_ok() {
                return Err(not_found(&new_job_id));
            }
        }
        Err(e) => return Err(e),
    }
    let record = RedriveJob {
        job_id: id.to_owned(),
        new_job_id: new_job_id.clone(),
        tenant_id: tenant,
        principal_id: principal,
        reason: b.reason,
        requested_at: now,
    };
    send_control(api, id, &record).await?;
    Ok(json!({
        "job_id": id,
        "new_job_id": new_job_id,
        "status": "redrive sent",
    }))
}

fn accepted(body: Value) -> Response {
    (StatusCode::ACCEPTED, axum::Json(body)).into_response()
}

/// A consistent copy of the projection, for `ksched audit rebuild --compare-with`.
async fn checkpoint(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
) -> ApiResult<Response> {
    require(&caller, Action::Checkpoint)?;
    let dir = api.checkpoints.join(wall_clock_ms().to_string());
    std::fs::create_dir_all(&api.checkpoints).map_err(internal)?;
    // Every shard's store is a view of one RocksDB: one checkpoint holds them all.
    let store = api.stores[0].clone();
    let target = dir.clone();
    tokio::task::spawn_blocking(move || store.checkpoint(&target))
        .await
        .map_err(internal)?
        .map_err(internal)?;
    let check = ksched_store::Store::open_read_only(&dir, 0).map_err(internal)?;
    let watermarks = (0..api.stores.len())
        .map(|s| {
            check
                .for_partition(u16::try_from(s).unwrap_or(0))
                .watermark()
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(internal)?;
    Ok((
        StatusCode::CREATED,
        axum::Json(json!({
            "path": dir.display().to_string(),
            "journal_watermark": watermarks.first().copied().flatten(),
            "journal_watermarks": watermarks,
        })),
    )
        .into_response())
}

async fn workers(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
) -> ApiResult {
    require(&caller, Action::Read)?;
    let mut ws = Vec::new();
    for store in &api.stores {
        ws.extend(store.workers().map_err(internal)?);
    }
    Ok(axum::Json(json!({
        "workers": ws.iter().map(|(id, w)| worker_view(id, w)).collect::<Vec<_>>(),
    })))
}

async fn dlq(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    only(&q, &["reason", "job_id", "limit"])?;
    let limit = limit_of(&q)?;
    let list = dead_letters(
        &api,
        &caller,
        q.get("reason").cloned(),
        q.get("job_id").cloned(),
        limit,
    )
    .await?;
    let counts = dead_letter_counts(&api, &caller)?;
    Ok(axum::Json(json!({
        "dead_letters": list.iter().map(dead_letter_view).collect::<Vec<_>>(),
        "counts_by_reason": counts.map_or(Value::Null, |c| json!(c)),
    })))
}

/// The dead letters `caller` sees, newest first across shards, filtered by reason and job,
/// each shard read newest first for at most [`MAX_SCANNED`] of them, on a blocking thread.
async fn dead_letters(
    api: &Api,
    caller: &Identity,
    reason: Option<String>,
    job_id: Option<String>,
    limit: usize,
) -> ApiResult<Vec<DeadLetter>> {
    require(caller, Action::Read)?;
    let stores = api.stores.clone();
    let caller = caller.clone();
    // Held by the blocking task: a request given up on still holds its turn until done.
    let turn = heavy_read().await?;
    tokio::task::spawn_blocking(move || {
        let _turn = turn;
        let keep = |d: &DeadLetter| {
            caller.sees(&d.tenant_id)
                && reason.as_ref().is_none_or(|r| &d.reason_code == r)
                && job_id.as_ref().is_none_or(|j| &d.job_id == j)
        };
        let mut all = Vec::new();
        for store in &stores {
            all.extend(store.dead_letters_newest(limit, MAX_SCANNED, keep)?);
        }
        all.sort_by_key(|d| std::cmp::Reverse(d.at));
        all.truncate(limit);
        Ok::<_, ksched_store::Error>(all)
    })
    .await
    .map_err(internal)?
    .map_err(internal)
}

/// Dead letters by reason code, counted by the projection (no dead letter is read), for a
/// caller who sees every tenant (the counts span them all).
fn dead_letter_counts(
    api: &Api,
    caller: &Identity,
) -> ApiResult<Option<std::collections::BTreeMap<String, u64>>> {
    require(caller, Action::Read)?;
    if !caller.sees_all() {
        return Ok(None);
    }
    let mut counts: std::collections::BTreeMap<String, u64> = Default::default();
    for store in &api.stores {
        for (reason, n) in store.dead_letter_counts().map_err(internal)? {
            *counts.entry(reason).or_default() += n;
        }
    }
    Ok(Some(counts))
}

async fn tenants(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
) -> ApiResult {
    let usage = tenant_usage(&api, &caller).await?;
    Ok(axum::Json(json!({
        "tenants": usage.iter().map(|(t, (running, waiting, limit))| json!({
            "tenant_id": t,
            "active_jobs": running,
            "waiting_jobs": waiting,
            "max_concurrent_jobs": limit,
        })).collect::<Vec<_>>(),
    })))
}

/// Per tenant `caller` sees: jobs on workers, jobs waiting, and the concurrency limit.
type TenantUsage = std::collections::BTreeMap<String, (i64, i64, Option<i32>)>;

/// Reads every non-terminal job (a backlog's worth): on a blocking thread, one of
/// [`HEAVY_READS`].
async fn tenant_usage(api: &Api, caller: &Identity) -> ApiResult<TenantUsage> {
    require(caller, Action::Read)?;
    let stores = api.stores.clone();
    let caller = caller.clone();
    // Held by the blocking task: a request given up on still holds its turn until done.
    let turn = heavy_read().await?;
    tokio::task::spawn_blocking(move || {
        let _turn = turn;
        let mut usage = TenantUsage::new();
        for store in &stores {
            store.scan_active_jobs(None, ksched_store::ScanBound::ALL, |_, j| {
                if caller.sees(&j.request.tenant_id) {
                    let e = usage
                        .entry(j.request.tenant_id.clone())
                        .or_insert((0, 0, None));
                    if j.state.is_active() {
                        e.0 += 1;
                    } else {
                        e.1 += 1;
                    }
                    e.2 = e.2.or(j.constraints.max_concurrent_jobs);
                }
                false
            })?;
        }
        Ok::<_, ksched_store::Error>(usage)
    })
    .await
    .map_err(internal)?
    .map_err(internal)
}
