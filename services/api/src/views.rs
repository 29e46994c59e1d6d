//! The JSON views of jobs, workers and dead letters (the API's, the console's and the CLI's),
//! secret env values hidden.

use ksched_core::records::{DeadLetter, redact_env};
use ksched_core::state::{Job, Worker};
use serde_json::{Value, json};

/// The columns of a job in a list, as the console and the CLI show them.
pub const JOB_COLUMNS: [&str; 7] = [
    "JOB",
    "STATE",
    "TENANT",
    "POOL",
    "WORKER",
    "ATTEMPT",
    "UPDATED (UTC)",
];

/// A job as the API and the CLI show it (secret env values hidden, payload as its size).
pub fn job_view(id: &str, j: &Job) -> Value {
    let r = &j.request;
    let mut view = json!({
        "job_id": id,
        "state": j.state.as_str(),
        "tenant_id": r.tenant_id,
        "principal_id": r.principal_id,
        "topic": r.topic,
        "priority": r.priority.as_str(),
        "queue_priority": ksched_core::records::Priority::of_rank(j.queue_rank()).as_str(),
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
        "not_before": r.not_before,
        "delayed_until": j.delayed_until,
        "released_at": j.released_at,
        "deadline_at": j.deadline_at,
        // What it waits for (SPEC §11): its request's dependencies, and how they stand since
        // it was blocked (`waiting_on`: those not ended yet).
        "depends_on": r.depends_on,
        "dependency_condition": r.dependency_condition.as_str(),
        "dependency_timeout_ms": r.dependency_timeout_ms,
        "waiting_on": j.awaiting.as_ref().map(|a| {
            (a.open.iter())
                .map(|d| ksched_core::state::display_dependency(d).into_owned())
                .collect::<Vec<_>>()
        }),
        "dependencies_succeeded": j.awaiting.as_ref().map(|a| a.succeeded),
        "dependencies_failed": j.awaiting.as_ref().map(|a| a.failed),
        "awaited": j.awaited,
        "retry_at": j.retry_at,
        "wait_reason": j.wait_reason,
        "progress": j.progress,
        "last_error": j.last_error,
        "result_ptr": j.result_ptr,
        "execution_ms": j.execution_ms,
        "dlq_reason": j.dlq_reason,
    });
    // Its batch (SPEC §11): the one it belongs to, the one it is a callback of, and how
    // that one ended, once it ran.
    view["batch_id"] = json!(r.batch_id);
    view["batch_size"] = json!(r.batch_size);
    view["after_batch"] = json!(r.after_batch);
    view["batch_outcome"] = json!(r.batch_outcome);
    view
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
        "related_job_id": d.related_job_id,
    })
}
