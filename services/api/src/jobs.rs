//! Job queries: lists with filters and bounded scans, one job, its history.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Extension, Path, Query, State as AxState};
use ksched_core::events::JobState;
use ksched_core::state::Job;
use ksched_store::Store;
use serde_json::json;

use crate::auth::{Action, Identity};
use crate::views::job_view;
use crate::{
    Api, ApiResult, DEFAULT_LIMIT, MAX_LIMIT, MAX_PAGE_BYTES, MAX_SCANNED, bad_request, heavy_read,
    internal, not_found, require,
};

pub(super) fn limit_of(q: &HashMap<String, String>) -> ApiResult<usize> {
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
pub(super) fn only(q: &HashMap<String, String>, known: &[&str]) -> ApiResult<()> {
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

pub(super) async fn list_jobs(
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
pub(super) async fn jobs_query(
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
    // Jobs in queues and on workers are served from the active index, not a full scan;
    // delayed jobs are not in it.
    let active_only = state.is_some_and(|s| !s.is_cold());
    let (jobs, next) = heavy_read(move || {
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
    .await?;
    Ok((jobs, next))
}

/// The job, if it exists and `caller` may see it (another tenant's job is "not found": its
/// existence is not disclosed).
pub(super) fn load_job(api: &Api, caller: &Identity, id: &str) -> ApiResult<Job> {
    find_job(api, caller, id).map(|(_, j)| j)
}

/// [`load_job`], with the store (shard) that holds it.
pub(super) fn find_job<'a>(
    api: &'a Api,
    caller: &Identity,
    id: &str,
) -> ApiResult<(&'a Store, Job)> {
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

pub(super) async fn get_job(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path(id): Path<String>,
) -> ApiResult {
    let (store, job) = find_job(&api, &caller, &id)?;
    let mut view = job_view(&id, &job);
    // The blocked jobs waiting for it (of its tenant, as the store has written them).
    let mut waiting =
        (store.dependents_after(&job.request.tenant_id, &id, None, MAX_DEPENDENTS + 1))
            .map_err(internal)?;
    let more = waiting.len() > MAX_DEPENDENTS;
    waiting.truncate(MAX_DEPENDENTS);
    view["dependents"] = json!(waiting);
    view["dependents_more"] = json!(more);
    Ok(axum::Json(view))
}

/// Most blocked jobs waiting for it that one job's view lists.
const MAX_DEPENDENTS: usize = 100;

pub(super) async fn job_history(
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
