//! Batches (SPEC §11): list them and show one (counts, state, members not ended, callbacks
//! waiting), as the shards' stores hold them at their last checkpoint; cancel one (a
//! CancelJob naming the batch on the control topic: the processor decides, and journals
//! BatchClosed or CommandRejected).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Extension, Path, Query, State as AxState};
use axum::http::StatusCode;
use axum::response::Response;
use ksched_core::events::BatchState;
use ksched_core::records::CancelJob;
use ksched_core::state::{Batch, batch_dependency, batch_members};
use ksched_runtime::clock::wall_clock_ms;
use ksched_store::Store;
use serde_json::{Value, json};

use crate::actions::{CancelBody, accepted, parse_body, send_control};
use crate::auth::{Action, Identity};
use crate::jobs::{limit_of, only};
use crate::{Api, ApiError, ApiResult, heavy_read, internal, require};

/// Most members not ended, and callbacks waiting, one batch's view lists.
const LISTED: usize = 100;

/// A batch as the API shows it.
pub(crate) fn batch_view(tenant: &str, id: &str, b: &Batch) -> Value {
    json!({
        "tenant_id": tenant,
        "batch_id": id,
        "state": b.state.as_str(),
        "expected": b.expected,
        "joined": b.joined,
        "succeeded": b.succeeded,
        "failed": b.failed,
        "running_or_waiting": b.joined.saturating_sub(b.ended()),
        "opened_at": b.opened_at,
        "until": b.until,
        "ended_at": b.ended_at,
        "forget_at": b.forget_at,
        "closed_by": b.closed_by,
    })
}

pub(super) async fn list_batches(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    only(&q, &["tenant", "limit"])?;
    require(&caller, Action::Read)?;
    let limit = limit_of(&q)?;
    let tenant = q.get("tenant").cloned();
    let stores = api.stores.clone();
    // Each shard's first `limit` the caller sees (of the tenant asked for), then the union's.
    let out = heavy_read(move || {
        let mut out = Vec::new();
        for store in &stores {
            let keep = |(t, _): &(String, String)| caller.sees(t);
            out.extend(store.batches(tenant.as_deref(), keep, limit)?);
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out.truncate(limit);
        Ok::<_, ksched_store::Error>(out)
    })
    .await?;
    Ok(axum::Json(json!({
        "batches": out.iter().map(|((t, id), b)| batch_view(t, id, b)).collect::<Vec<_>>(),
    })))
}

/// A batch the caller sees, with the store (shard) that holds it, or 404 (also for one of a
/// tenant it does not see).
pub(crate) fn find_batch<'a>(
    api: &'a Api,
    caller: &Identity,
    tenant: &str,
    id: &str,
) -> ApiResult<(&'a Store, Batch)> {
    require(caller, Action::Read)?;
    if caller.sees(tenant) {
        for store in &api.stores {
            if let Some(b) = store.batch(tenant, id).map_err(internal)? {
                return Ok((store, b));
            }
        }
    }
    Err(ApiError(
        StatusCode::NOT_FOUND,
        format!("no batch {id} of tenant {tenant}"),
    ))
}

/// The batch with the first members not ended and the callbacks still waiting.
pub(crate) fn batch_detail(api: &Api, caller: &Identity, tenant: &str, id: &str) -> ApiResult {
    let (store, b) = find_batch(api, caller, tenant, id)?;
    let mut view = batch_view(tenant, id, &b);
    for (field, name) in [
        ("members_not_ended", batch_members(tenant, id)),
        ("callbacks_waiting", batch_dependency(tenant, id)),
    ] {
        let mut ids =
            (store.dependents_after(tenant, &name, None, LISTED + 1)).map_err(internal)?;
        let more = ids.len() > LISTED;
        ids.truncate(LISTED);
        view[field] = json!(ids);
        view[format!("{field}_more")] = json!(more);
    }
    Ok(axum::Json(view))
}

pub(super) async fn get_batch(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path((tenant, id)): Path<(String, String)>,
) -> ApiResult {
    batch_detail(&api, &caller, &tenant, &id)
}

pub(super) async fn cancel_batch(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path((tenant, id)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let b: CancelBody = parse_body(&body)?;
    Ok(accepted(
        batch_cancel(&api, &caller, &tenant, &id, b).await?,
    ))
}

/// Cancels an open batch the caller sees (the API and the console).
pub(crate) async fn batch_cancel(
    api: &Api,
    caller: &Identity,
    tenant: &str,
    id: &str,
    b: CancelBody,
) -> ApiResult<Value> {
    require(caller, Action::Cancel)?;
    let (_, batch) = find_batch(api, caller, tenant, id)?;
    if batch.state != BatchState::Open {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("batch {id} is already {}", batch.state.as_str()),
        ));
    }
    let principal = match &caller.principal {
        Some(p) => p.clone(),
        None => b.principal.unwrap_or_default(),
    };
    if principal.trim().is_empty() {
        return Err(crate::bad_request("principal must not be empty"));
    }
    let record = CancelJob {
        job_id: String::new(),
        tenant_id: Some(tenant.to_owned()),
        principal_id: principal,
        reason: b.reason,
        requested_at: wall_clock_ms(),
        batch_id: Some(id.to_owned()),
    };
    send_control(api, id, &record).await?;
    Ok(json!({ "tenant_id": tenant, "batch_id": id, "status": "cancel sent" }))
}
