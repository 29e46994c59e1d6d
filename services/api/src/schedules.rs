//! Schedules: list and show them (as the shards' stores hold them at their last checkpoint),
//! and create, update, pause, resume, trigger or delete one (a ScheduleCommand on the control
//! topic: the processor decides, and journals ScheduleChanged or CommandRejected).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, Path, Query, State as AxState};
use axum::http::StatusCode;
use axum::response::Response;
use ksched_core::records::{
    Budget, JobMeta, JobTemplate, Priority, ScheduleAction, ScheduleCatchUp, ScheduleCommand,
    ScheduleOverlap, ScheduleSpec, is_secret_key,
};
use ksched_core::schedule::{Times, invalid_schedule_id, invalid_spec, schedule_key, slot_text};
use ksched_core::state::Schedule;
use ksched_runtime::clock::wall_clock_ms;
use rdkafka::producer::FutureRecord;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::actions::{TimeValue, accepted, parse_body};
use crate::auth::{Action, Identity};
use crate::jobs::{limit_of, only};
use crate::{Api, ApiError, ApiResult, bad_request, forbidden, internal, require};

/// How many coming firings a schedule's view lists.
const NEXT_FIRINGS: usize = 5;

/// The body of a create (POST /api/v1/schedules) or an update (PUT .../{tenant}/{id}): the
/// whole schedule.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ScheduleBody {
    /// For a create: its id (the path names it for an update).
    pub(super) schedule_id: Option<String>,
    /// For a create: its tenant; default the caller's, when it has exactly one.
    pub(super) tenant: Option<String>,
    /// Only without authentication; an authenticated caller acts as itself.
    pub(super) principal: Option<String>,
    pub(super) cron: Option<String>,
    pub(super) interval_ms: Option<i64>,
    #[serde(default)]
    pub(super) time_zone: Option<String>,
    pub(super) template: TemplateBody,
    #[serde(default)]
    pub(super) overlap: ScheduleOverlap,
    #[serde(default)]
    pub(super) catch_up: ScheduleCatchUp,
    pub(super) catch_up_window_ms: Option<i64>,
    #[serde(default)]
    pub(super) jitter_ms: i64,
    pub(super) start_at: Option<TimeValue>,
    pub(super) end_at: Option<TimeValue>,
    #[serde(default)]
    pub(super) paused: bool,
    pub(super) reason: Option<String>,
}

/// The job each firing submits.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TemplateBody {
    pub(super) topic: String,
    /// The payload as text (UTF-8).
    #[serde(default)]
    pub(super) payload: String,
    #[serde(default)]
    pub(super) priority: Priority,
    #[serde(default)]
    pub(super) labels: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) env: BTreeMap<String, String>,
    pub(super) deadline_ms: Option<i64>,
    pub(super) max_runtime_ms: Option<i64>,
    #[serde(default)]
    pub(super) requires: Vec<String>,
}

/// Who acts, and why, on a pause, resume, trigger or delete.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ActBody {
    /// Only without authentication.
    pub(crate) principal: Option<String>,
    pub(crate) reason: Option<String>,
}

impl ScheduleBody {
    fn spec(self) -> ApiResult<(ScheduleSpec, Option<String>)> {
        let t = self.template;
        if let Some(k) = t.env.keys().find(|k| is_secret_key(k)) {
            return Err(bad_request(format!(
                "template env {k:?} is a secret ($ key): a schedule's template carries no secrets; give the worker its own"
            )));
        }
        let time = |v: Option<TimeValue>| v.map(|v| v.millis()).transpose();
        let spec = ScheduleSpec {
            cron: self.cron,
            interval_ms: self.interval_ms,
            time_zone: self.time_zone.unwrap_or_else(|| "UTC".into()),
            template: JobTemplate {
                topic: t.topic,
                priority: t.priority,
                labels: t.labels,
                env: t.env,
                payload: t.payload.into_bytes(),
                budget: Budget {
                    deadline_ms: t.deadline_ms,
                    max_runtime_ms: t.max_runtime_ms,
                },
                meta: JobMeta {
                    requires: t.requires,
                    ..JobMeta::default()
                },
            },
            overlap: self.overlap,
            catch_up: self.catch_up,
            catch_up_window_ms: self.catch_up_window_ms.unwrap_or(86_400_000),
            jitter_ms: self.jitter_ms,
            start_at: time(self.start_at)?,
            end_at: time(self.end_at)?,
            paused: self.paused,
        };
        Ok((spec, self.reason))
    }
}

pub(super) async fn list_schedules(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    require(&caller, Action::Read)?;
    only(&q, &["tenant", "limit"])?;
    let limit = limit_of(&q)?;
    let tenant = q.get("tenant").cloned();
    let mut all = Vec::new();
    for store in &api.stores {
        for (key, s) in store.schedules().map_err(internal)? {
            if caller.sees(&s.tenant_id) && tenant.as_ref().is_none_or(|t| *t == s.tenant_id) {
                all.push((key, s));
            }
        }
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let more = all.len() > limit;
    all.truncate(limit);
    Ok(axum::Json(json!({
        "schedules": all.iter().map(|(_, s)| schedule_view(s)).collect::<Vec<_>>(),
        "truncated": more,
    })))
}

pub(super) async fn get_schedule(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path((tenant, id)): Path<(String, String)>,
) -> ApiResult {
    require(&caller, Action::Read)?;
    let s = load_schedule(&api, &caller, &tenant, &id)?;
    Ok(axum::Json(schedule_view(&s)))
}

/// A schedule the caller sees, or 404 (also for one of a tenant it does not see).
fn load_schedule(api: &Api, caller: &Identity, tenant: &str, id: &str) -> ApiResult<Schedule> {
    let key = schedule_key(tenant, id);
    if caller.sees(tenant) {
        for store in &api.stores {
            if let Some(s) = store.schedule(&key).map_err(internal)? {
                return Ok(s);
            }
        }
    }
    Err(ApiError(
        StatusCode::NOT_FOUND,
        format!("no schedule {id} of tenant {tenant}"),
    ))
}

pub(super) async fn create_schedule(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    require(&caller, Action::Schedule)?;
    let b: ScheduleBody = parse_body(&body)?;
    let id = b
        .schedule_id
        .clone()
        .ok_or_else(|| bad_request("schedule_id is required"))?;
    let tenant = match (&b.tenant, &caller.tenants) {
        (Some(t), _) => t.clone(),
        (None, Some(own)) if own.len() == 1 => own.iter().next().cloned().unwrap_or_default(),
        (None, _) => return Err(bad_request("tenant is required")),
    };
    let principal = principal_of(&caller, b.principal.clone())?;
    let (spec, reason) = b.spec()?;
    may_submit_on(&api, &caller, &tenant, &spec.template.topic)?;
    // One schedule of the id per tenant, whichever shard its topic is on (the shard that
    // takes the command knows only its own).
    if caller.sees(&tenant) {
        for store in &api.stores {
            if store
                .schedule(&schedule_key(&tenant, &id))
                .map_err(internal)?
                .is_some()
            {
                return Err(ApiError(
                    StatusCode::CONFLICT,
                    format!("schedule {id} of tenant {tenant} exists; update or delete it"),
                ));
            }
        }
    }
    let record = command(
        &caller,
        &tenant,
        &id,
        ScheduleAction::Create,
        Some(spec),
        principal,
        reason,
    )?;
    Ok(accepted(send(&api, &record, "create sent").await?))
}

pub(super) async fn update_schedule(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path((tenant, id)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    require(&caller, Action::Schedule)?;
    let b: ScheduleBody = parse_body(&body)?;
    if b.schedule_id.as_ref().is_some_and(|s| *s != id)
        || b.tenant.as_ref().is_some_and(|t| *t != tenant)
    {
        return Err(bad_request(
            "the path names the schedule; the body may not name another",
        ));
    }
    load_schedule(&api, &caller, &tenant, &id)?;
    let principal = principal_of(&caller, b.principal.clone())?;
    let (spec, reason) = b.spec()?;
    may_submit_on(&api, &caller, &tenant, &spec.template.topic)?;
    let record = command(
        &caller,
        &tenant,
        &id,
        ScheduleAction::Update,
        Some(spec),
        principal,
        reason,
    )?;
    Ok(accepted(send(&api, &record, "update sent").await?))
}

/// POST .../{tenant}/{id}/{pause|resume|trigger|delete}.
pub(super) async fn act_on_schedule(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path((tenant, id, verb)): Path<(String, String, String)>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let action = match verb.as_str() {
        "pause" => ScheduleAction::Pause,
        "resume" => ScheduleAction::Resume,
        "trigger" => ScheduleAction::Trigger,
        "delete" => ScheduleAction::Delete,
        other => {
            return Err(ApiError(
                StatusCode::NOT_FOUND,
                format!("no schedule action {other:?}"),
            ));
        }
    };
    act(&api, &caller, &tenant, &id, action, &body).await
}

/// DELETE .../{tenant}/{id} (as POST .../delete).
pub(super) async fn delete_schedule(
    AxState(api): AxState<Arc<Api>>,
    Extension(caller): Extension<Identity>,
    Path((tenant, id)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    act(&api, &caller, &tenant, &id, ScheduleAction::Delete, &body).await
}

async fn act(
    api: &Api,
    caller: &Identity,
    tenant: &str,
    id: &str,
    action: ScheduleAction,
    body: &[u8],
) -> ApiResult<Response> {
    let b: ActBody = parse_body(body)?;
    Ok(accepted(
        schedule_act(api, caller, tenant, id, action, b).await?,
    ))
}

/// Pauses, resumes, triggers or deletes a schedule the caller sees (the API and the console).
pub(crate) async fn schedule_act(
    api: &Api,
    caller: &Identity,
    tenant: &str,
    id: &str,
    action: ScheduleAction,
    b: ActBody,
) -> ApiResult<Value> {
    require(caller, Action::Schedule)?;
    load_schedule(api, caller, tenant, id)?;
    let principal = principal_of(caller, b.principal)?;
    let record = command(caller, tenant, id, action, None, principal, b.reason)?;
    let status = format!("{} sent", action.as_str().to_lowercase());
    send(api, &record, &status).await
}

/// A schedule submits new jobs: an admin may make one on any topic, an operator only on a
/// topic bound to the schedule's tenant (pools.yaml `tenants:`), which that tenant's
/// producers alone may use. Anything else would let an operator run jobs it could not
/// produce.
fn may_submit_on(api: &Api, caller: &Identity, tenant: &str, topic: &str) -> ApiResult<()> {
    if caller.roles.contains(&crate::auth::Role::Admin) {
        return Ok(());
    }
    for store in &api.stores {
        if let Some(rules) = store.rules().map_err(internal)?
            && rules
                .topic_tenants
                .get(topic)
                .is_some_and(|tenants| tenants.iter().any(|t| t == tenant))
        {
            return Ok(());
        }
    }
    Err(forbidden(format!(
        "topic {topic} is not bound to tenant {tenant} (pools.yaml tenants:): only an admin schedules jobs on it"
    )))
}

fn principal_of(caller: &Identity, named: Option<String>) -> ApiResult<String> {
    let principal = match &caller.principal {
        Some(p) => p.clone(),
        None => named.unwrap_or_default(),
    };
    if principal.trim().is_empty() {
        return Err(bad_request("principal must not be empty"));
    }
    Ok(principal)
}

/// The command, checked as far as the API can (the processor decides): the caller sees the
/// tenant, and the id and times are valid.
fn command(
    caller: &Identity,
    tenant: &str,
    id: &str,
    action: ScheduleAction,
    spec: Option<ScheduleSpec>,
    principal: String,
    reason: Option<String>,
) -> ApiResult<ScheduleCommand> {
    if !caller.sees(tenant) {
        return Err(forbidden(format!("not allowed to act for tenant {tenant}")));
    }
    if tenant.trim().is_empty() || tenant.contains(':') {
        return Err(bad_request("tenant must not be empty nor contain ':'"));
    }
    if let Some(why) = invalid_schedule_id(id) {
        return Err(bad_request(why));
    }
    let now = wall_clock_ms();
    if let Some(why) = spec.as_ref().and_then(|s| invalid_spec(s, now, i64::MAX)) {
        return Err(bad_request(why));
    }
    Ok(ScheduleCommand {
        schedule_id: id.to_owned(),
        tenant_id: tenant.to_owned(),
        action,
        spec,
        principal_id: principal,
        reason,
        requested_at: now,
    })
}

async fn send(api: &Api, record: &ScheduleCommand, status: &str) -> ApiResult<Value> {
    let bytes = ksched_codec::encode(record).map_err(internal)?;
    let key = schedule_key(&record.tenant_id, &record.schedule_id);
    api.producer
        .send(
            FutureRecord::to(&api.topics.control)
                .key(&key)
                .payload(&bytes),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("kafka: {e}")))?;
    Ok(json!({
        "tenant_id": record.tenant_id,
        "schedule_id": record.schedule_id,
        "status": status,
    }))
}

/// A schedule as the API and the console show it: its spec (a secret env value hidden),
/// its coming firings and its latest ones.
pub fn schedule_view(s: &Schedule) -> Value {
    let spec = &s.spec;
    let mut next = Vec::new();
    if let (Ok(times), Some(first)) = (Times::of(spec, s.created_at), s.next_slot) {
        let mut at = Some(first);
        while let Some(t) = at.filter(|_| next.len() < NEXT_FIRINGS) {
            next.push(json!({ "at": t, "time": slot_text(t) }));
            at = times.next_after(t);
        }
    }
    let t = &spec.template;
    json!({
        "tenant_id": s.tenant_id,
        "schedule_id": s.schedule_id,
        "principal_id": s.principal_id,
        "cron": spec.cron,
        "interval_ms": spec.interval_ms,
        "time_zone": spec.time_zone,
        "overlap": spec.overlap,
        "catch_up": spec.catch_up,
        "catch_up_window_ms": spec.catch_up_window_ms,
        "jitter_ms": spec.jitter_ms,
        "start_at": spec.start_at,
        "end_at": spec.end_at,
        "paused": s.paused,
        "template": {
            "topic": t.topic,
            "priority": t.priority,
            "labels": t.labels,
            "env": ksched_core::records::redact_env(&t.env),
            "payload_bytes": t.payload.len(),
            "deadline_ms": t.budget.deadline_ms,
            "max_runtime_ms": t.budget.max_runtime_ms,
            "requires": t.meta.requires,
        },
        "next_slot": s.next_slot,
        "next_firings": next,
        "buffered": s.buffered,
        "last_job": s.last_job,
        "recent": s.recent.iter().map(|f| json!({
            "slot": f.slot,
            "time": slot_text(f.slot),
            "outcome": f.outcome,
            "job_id": f.job_id,
            "triggered": f.triggered,
            "detail": f.detail,
        })).collect::<Vec<_>>(),
        "submitted": s.submitted,
        "skipped": s.skipped,
        "missed": s.missed,
        "refused": s.refused,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
    })
}
