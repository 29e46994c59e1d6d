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
    let keys = usage.busiest_keys(MAX_KEYS_LISTED);
    Ok(axum::Json(json!({
        "tenants": usage.tenants.iter().map(|(t, u)| json!({
            "tenant_id": t,
            "active_jobs": u.active,
            "waiting_jobs": u.waiting,
            "max_concurrent_jobs": u.limit,
            "waiting_by_reason": u.reasons,
        })).collect::<Vec<_>>(),
        "concurrency_keys": keys.iter().map(|((t, k), u)| json!({
            "tenant_id": t,
            "key": k,
            "active_jobs": u.active,
            "waiting_jobs": u.waiting,
            "limit": u.limit,
            "rate": u.rate,
        })).collect::<Vec<_>>(),
        "concurrency_keys_omitted": usage.keys.len().saturating_sub(keys.len()),
    })))
}

/// Most concurrency keys `/api/v1/tenants` and the console list (the busiest).
pub(super) const MAX_KEYS_LISTED: usize = 1_000;

/// One tenant's jobs not yet ended: on workers, waiting (by the reason they wait), and its
/// concurrency limit.
#[derive(Debug, Clone, Default)]
pub(super) struct TenantLoad {
    pub active: i64,
    pub waiting: i64,
    pub limit: Option<i32>,
    /// Queued jobs by the reason their last `JobWaiting` gave (`none` when none did yet),
    /// and jobs awaiting an approval as `approval_required` (delayed jobs are not counted:
    /// they wait in storage, by time).
    pub reasons: std::collections::BTreeMap<String, i64>,
}

/// One concurrency key's jobs not yet ended (SPEC §10).
#[derive(Debug, Clone, Default)]
pub(super) struct KeyLoad {
    pub active: i64,
    pub waiting: i64,
    /// At most this many at once; None: no such limit.
    pub limit: Option<u32>,
    /// Its rate limit, as `N/PERIOD, burst B`.
    pub rate: Option<String>,
}

/// What `caller` sees of the tenants and their concurrency keys (`""` is a `tenant` key).
#[derive(Debug, Clone, Default)]
pub(super) struct TenantUsage {
    pub tenants: std::collections::BTreeMap<String, TenantLoad>,
    pub keys: std::collections::BTreeMap<(String, String), KeyLoad>,
}

impl TenantUsage {
    /// The `n` keys with the most jobs waiting, then active.
    pub(super) fn busiest_keys(&self, n: usize) -> Vec<(&(String, String), &KeyLoad)> {
        let mut keys: Vec<_> = self.keys.iter().collect();
        keys.sort_by_key(|(k, u)| (std::cmp::Reverse((u.waiting, u.active)), *k));
        keys.truncate(n);
        keys
    }
}

/// Reads every non-terminal job (a backlog's worth): on a blocking thread, one of
/// [`HEAVY_READS`].
pub(super) async fn tenant_usage(api: &Api, caller: &Identity) -> ApiResult<TenantUsage> {
    require(caller, Action::Read)?;
    let stores = api.stores.clone();
    let caller = caller.clone();
    heavy_read(move || {
        let mut usage = TenantUsage::default();
        for store in &stores {
            store.scan_active_jobs(None, ksched_store::ScanBound::ALL, |_, j| {
                let tenant = &j.request.tenant_id;
                if !caller.sees(tenant) {
                    return false;
                }
                let active = j.state.is_active();
                let e = usage.tenants.entry(tenant.clone()).or_default();
                if active {
                    e.active += 1;
                } else {
                    e.waiting += 1;
                    let reason = match j.state {
                        ksched_core::events::JobState::Pending => {
                            j.wait_reason.clone().unwrap_or_else(|| "none".into())
                        }
                        other => other.as_str().to_ascii_lowercase(),
                    };
                    *e.reasons.entry(reason).or_default() += 1;
                }
                e.limit = e.limit.or(j.constraints.max_concurrent_jobs);
                if let Some(c) = &j.concurrency {
                    let k = usage
                        .keys
                        .entry((tenant.clone(), c.key.clone()))
                        .or_default();
                    if active {
                        k.active += 1;
                    } else {
                        k.waiting += 1;
                    }
                    k.limit = (c.limit != u32::MAX).then_some(c.limit);
                    k.rate = c.rate.map(|r| r.to_string());
                }
                false
            })?;
        }
        Ok::<_, ksched_store::Error>(usage)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_keys_are_those_with_most_jobs_waiting_then_active() {
        let mut usage = TenantUsage::default();
        for (tenant, key, active, waiting) in [
            ("acme", "a", 1, 0),
            ("acme", "b", 0, 5),
            ("globex", "a", 3, 5),
            ("acme", "", 2, 1),
        ] {
            usage.keys.insert(
                (tenant.to_owned(), key.to_owned()),
                KeyLoad {
                    active,
                    waiting,
                    ..KeyLoad::default()
                },
            );
        }
        let order: Vec<(&str, &str)> = (usage.busiest_keys(3).into_iter())
            .map(|((t, k), _)| (t.as_str(), k.as_str()))
            .collect();
        assert_eq!(order, [("globex", "a"), ("acme", "b"), ("acme", "")]);
    }
}
