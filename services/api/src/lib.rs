//! ksched's HTTP side, served by `ksched run`: the API (docs/openapi.yaml), the operator
//! console under `/ui` (docs/console.md), authentication (tokens and JWTs, roles and tenants)
//! and TLS. It reads the runtime's projections and status and produces control records,
//! like the CLI; the processor does not know it exists.
//!
//! The API: read-only queries over the projection, approve/reject/cancel/redrive (control
//! records), health and readiness, and `/metrics`. Secret env values are hidden in every
//! view. `/api/` routes answer only allowed `Host`s (DNS rebinding), take JSON bodies only (a
//! web page cannot post `text/plain` cross-origin into them), and, with `http.tokens_file` or
//! `http.jwt`, only authenticated callers, each within its roles and tenants ([`auth`]).

mod actions;
pub mod auth;
mod batches;
mod console;
mod fleet;
mod jobs;
mod routes;
mod schedules;
mod server;
pub mod tls;
mod views;

pub use routes::router;
pub use schedules::schedule_view;
pub use server::serve;
pub use views::{JOB_COLUMNS, dead_letter_view, job_view, worker_view};

use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use ksched_runtime::error::{Result, kafka};
use ksched_runtime::settings::Settings;
use ksched_runtime::status::Shards;
use ksched_runtime::topics::{Topics, client_config};
use ksched_store::Store;
use rdkafka::producer::{FutureProducer, Producer};
use serde_json::{Value, json};

use crate::auth::{Action, Auth, Identity, default_allowed_hosts};

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

/// Runs `read` on a blocking thread in one of the [`HEAVY_READS`] turns, or answers 503 when
/// no turn came within `HEAVY_READ_WAIT`. The blocking task holds the turn: a request given
/// up on still holds it until its read is done.
async fn heavy_read<T, E>(
    read: impl FnOnce() -> std::result::Result<T, E> + Send + 'static,
) -> ApiResult<T>
where
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let turn = match tokio::time::timeout(HEAVY_READ_WAIT, HEAVY.acquire()).await {
        Ok(Ok(turn)) => turn,
        _ => {
            return Err(ApiError(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many large reads at once; try again in a moment".into(),
            ));
        }
    };
    tokio::task::spawn_blocking(move || {
        let _turn = turn;
        read()
    })
    .await
    .map_err(internal)?
    .map_err(internal)
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
                Action::Schedule => "create or change schedules (role operator)",
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
