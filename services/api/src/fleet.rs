//! Workers, dead letters and tenants.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Extension, Query, State as AxState};
use ksched_core::records::DeadLetter;
use serde_json::{Value, json};

use crate::auth::{Action, Identity};
use crate::jobs::{limit_of, only};
use crate::views::{dead_letter_view, worker_view};
use crate::{Api, ApiResult, MAX_SCANNED, heavy_read, internal, require};

pub(super) async fn workers(
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

pub(super) async fn dlq(
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
pub(super) async fn dead_letters(
    api: &Api,
    caller: &Identity,
    reason: Option<String>,
    job_id: Option<String>,
    limit: usize,
) -> ApiResult<Vec<DeadLetter>> {
    require(caller, Action::Read)?;
    let stores = api.stores.clone();
    let caller = caller.clone();
    heavy_read(move || {
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
}

/// Dead letters by reason code, counted by the projection (no dead letter is read), for a
/// caller who sees every tenant (the counts span them all).
pub(super) fn dead_letter_counts(
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

pub(super) async fn tenants(
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
pub(super) async fn tenant_usage(api: &Api, caller: &Identity) -> ApiResult<TenantUsage> {
    require(caller, Action::Read)?;
    let stores = api.stores.clone();
    let caller = caller.clone();
    heavy_read(move || {
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
}
