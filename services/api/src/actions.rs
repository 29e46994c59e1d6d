//! Operators' actions: approve, reject, cancel and redrive produce control records, like the
//! CLI; checkpoints of the projection.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, Path, State as AxState};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use ksched_core::events::JobState;
use ksched_core::records::{ApproveJob, CancelJob, RedriveJob, RejectJob, RescheduleJob};
use ksched_core::state::Job;
use ksched_runtime::clock::wall_clock_ms;
use ksched_runtime::error::Result;
use rdkafka::producer::FutureRecord;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::{Action, Identity};
use crate::jobs::{find_job, load_job};
use crate::{Api, ApiError, ApiResult, bad_request, forbidden, internal, not_found, require};

pub(super) async fn send_control<T: ksched_codec::Record>(
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

pub(super) fn parse_body<T: for<'de> Deserialize<'de>>(body: &[u8]) -> ApiResult<T> {
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
pub(super) struct ApproveBody {
    /// Only without authentication; an authenticated caller approves as itself.
    pub(super) approver: Option<String>,
    pub(super) comment: Option<String>,
}

pub(super) async fn approve(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let b: ApproveBody = parse_body(&body)?;
    Ok(accepted(approve_job(&api, &caller, &id, b).await?))
}

pub(super) async fn approve_job(
    api: &Api,
    caller: &Identity,
    id: &str,
    b: ApproveBody,
) -> ApiResult<Value> {
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
pub(super) struct RejectBody {
    /// Only without authentication; an authenticated caller rejects as itself.
    pub(super) approver: Option<String>,
    pub(super) reason: Option<String>,
}

pub(super) async fn reject(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let b: RejectBody = parse_body(&body)?;
    Ok(accepted(reject_job(&api, &caller, &id, b).await?))
}

pub(super) async fn reject_job(
    api: &Api,
    caller: &Identity,
    id: &str,
    b: RejectBody,
) -> ApiResult<Value> {
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
pub(super) struct CancelBody {
    /// Only without authentication; an authenticated caller cancels as itself.
    pub(super) principal: Option<String>,
    /// Only without authentication; an authenticated caller acts for its tenants.
    pub(super) tenant: Option<String>,
    pub(super) reason: Option<String>,
}

pub(super) async fn cancel(
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

pub(super) async fn cancel_job(
    api: &Api,
    caller: &Identity,
    id: &str,
    b: CancelBody,
) -> ApiResult<Value> {
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
        batch_id: None,
    };
    send_control(api, id, &record).await?;
    Ok(json!({ "job_id": id, "status": "cancel sent" }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RescheduleBody {
    /// The job's new time: epoch milliseconds, or an RFC 3339 time.
    pub(super) not_before: TimeValue,
    /// Only without authentication; an authenticated caller reschedules as itself.
    pub(super) principal: Option<String>,
    /// Only without authentication; an authenticated caller acts for its tenants.
    pub(super) tenant: Option<String>,
    pub(super) reason: Option<String>,
}

/// A time in a request body: epoch milliseconds or RFC 3339 text.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum TimeValue {
    Millis(i64),
    Text(String),
}

impl TimeValue {
    pub(super) fn millis(&self) -> ApiResult<i64> {
        match self {
            TimeValue::Millis(ms) => Ok(*ms),
            TimeValue::Text(t) => t
                .parse::<jiff::Timestamp>()
                .map(|t| t.as_millisecond())
                .map_err(|e| bad_request(format!("{t:?} is not an RFC 3339 time: {e}"))),
        }
    }
}

pub(super) async fn reschedule(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let b: RescheduleBody = parse_body(&body)?;
    Ok(accepted(reschedule_job(&api, &caller, &id, b).await?))
}

/// Moves a DELAYED job to another time (RescheduleJob): the role that may cancel it may.
pub(super) async fn reschedule_job(
    api: &Api,
    caller: &Identity,
    id: &str,
    b: RescheduleBody,
) -> ApiResult<Value> {
    require(caller, Action::Cancel)?;
    let not_before = b.not_before.millis()?;
    if not_before < 0 {
        return Err(bad_request("not_before must not be before 1970"));
    }
    let job = load_job(api, caller, id)?;
    let (principal, tenant) = acting(caller, &job, b.principal, b.tenant)?;
    if job.state != JobState::Delayed {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "job {id} is {}; only a DELAYED job is rescheduled",
                job.state
            ),
        ));
    }
    let record = RescheduleJob {
        job_id: id.to_owned(),
        not_before,
        tenant_id: tenant,
        principal_id: principal,
        reason: b.reason,
        requested_at: wall_clock_ms(),
    };
    send_control(api, id, &record).await?;
    Ok(json!({ "job_id": id, "not_before": not_before, "status": "reschedule sent" }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RedriveBody {
    /// Only without authentication; an authenticated caller redrives as itself.
    pub(super) principal: Option<String>,
    /// Only without authentication; an authenticated caller acts for its tenants.
    pub(super) tenant: Option<String>,
    /// The new job's id; default `<job_id>.redrive-<unix ms>`.
    pub(super) new_job_id: Option<String>,
    pub(super) reason: Option<String>,
}

/// Submits a dead-lettered job again as a new job (RedriveJob on the control topic; the
/// processor decides and journals JobAccepted + JobRedriven, or CommandRejected).
pub(super) async fn redrive(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let b: RedriveBody = parse_body(&body)?;
    Ok(accepted(redrive_job(&api, &caller, &id, b).await?))
}

pub(super) async fn redrive_job(
    api: &Api,
    caller: &Identity,
    id: &str,
    b: RedriveBody,
) -> ApiResult<Value> {
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

pub(super) fn accepted(body: Value) -> Response {
    (StatusCode::ACCEPTED, axum::Json(body)).into_response()
}

/// A consistent copy of the projection, for `ksched audit rebuild --compare-with`.
pub(super) async fn checkpoint(
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
