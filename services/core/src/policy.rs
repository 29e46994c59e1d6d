//! The safety kernel's interface (SPEC §5). The core asks; an engine answers.
//!
//! Engines are pure functions of (policy bundle, input document): the Rego engine in
//! `ksched-policy` memoizes on exactly that. The bundle travels in the journal
//! (`Reconfigure`), so a replay evaluates the policy that was in force.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::events::{Reconfigure, Verdict};
use crate::records::{Constraints, JobRequest, redact_env};

/// The input policy's answer for one job.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyDecision {
    pub verdict: Verdict,
    pub reasons: Vec<String>,
    /// What the policy set; unset fields fall back to the job's budget and the config.
    pub constraints: Constraints,
    /// The evaluation was stopped at its step or memory limit (the verdict is then Deny).
    pub limit_exceeded: bool,
}

impl PolicyDecision {
    pub fn allow() -> PolicyDecision {
        PolicyDecision {
            verdict: Verdict::Allow,
            reasons: Vec::new(),
            constraints: Constraints::default(),
            limit_exceeded: false,
        }
    }
}

/// The output policy's answer for one succeeded job.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OutputDecision {
    pub quarantine: bool,
    pub reasons: Vec<String>,
    /// The evaluation was stopped at its step or memory limit (the job is then quarantined).
    pub limit_exceeded: bool,
}

/// Evaluates policies. Implementations must be deterministic: same bundle and input, same
/// answer. A policy that fails to evaluate must fail closed (deny / quarantine, with the error
/// as the reason), so a broken policy never lets work through. Every evaluation is bounded by
/// the limits of the rules in the bundle (`limits.policy_max_steps`,
/// `limits.policy_max_memory_bytes`); one stopped at a limit says so (`limit_exceeded`).
pub trait PolicyEngine {
    fn evaluate_input(&self, bundle: &Reconfigure, input: &Value) -> PolicyDecision;
    fn evaluate_output(&self, bundle: &Reconfigure, input: &Value) -> OutputDecision;

    /// [`PolicyEngine::evaluate_input`] with the document built only if the engine needs
    /// it: a bundle with no input rules, or rules that read nothing of the input, decides
    /// without it. The answer must be the same as with the built document.
    fn evaluate_input_lazily(
        &self,
        bundle: &Reconfigure,
        input: &dyn Fn() -> Value,
    ) -> PolicyDecision {
        self.evaluate_input(bundle, &input())
    }

    /// [`PolicyEngine::evaluate_output`] with the document built only if the engine needs it.
    fn evaluate_output_lazily(
        &self,
        bundle: &Reconfigure,
        input: &dyn Fn() -> Value,
    ) -> OutputDecision {
        self.evaluate_output(bundle, &input())
    }
}

/// Allows everything and quarantines nothing. For tests and for bundles with no modules.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl PolicyEngine for AllowAll {
    fn evaluate_input(&self, _: &Reconfigure, _: &Value) -> PolicyDecision {
        PolicyDecision::allow()
    }
    fn evaluate_output(&self, _: &Reconfigure, _: &Value) -> OutputDecision {
        OutputDecision::default()
    }
    fn evaluate_input_lazily(&self, _: &Reconfigure, _: &dyn Fn() -> Value) -> PolicyDecision {
        PolicyDecision::allow()
    }
    fn evaluate_output_lazily(&self, _: &Reconfigure, _: &dyn Fn() -> Value) -> OutputDecision {
        OutputDecision::default()
    }
}

/// The document the input policy sees as `input`.
///
/// Secret env values are replaced by `*hidden*`; the payload is represented by its size.
pub fn input_document(
    job: &JobRequest,
    payload_size: u64,
    tenant_active_jobs: i64,
    pools: &[String],
) -> Value {
    object([
        ("job", job_document(job, payload_size)),
        (
            "tenant",
            json!({ "id": job.tenant_id, "active_jobs": tenant_active_jobs }),
        ),
        ("pools", json!(pools)),
    ])
}

/// The document the output policy sees as `input`.
pub fn output_document(
    job: &JobRequest,
    payload_size: u64,
    worker_id: &str,
    result_ptr: Option<&str>,
    meta: &crate::records::ResultMeta,
    execution_ms: i64,
) -> Value {
    object([
        ("job", job_document(job, payload_size)),
        (
            "result",
            json!({
                "worker_id": worker_id,
                "result_ptr": result_ptr,
                "size_bytes": meta.size_bytes,
                "content_type": meta.content_type,
                "labels": meta.labels,
                "execution_ms": execution_ms,
            }),
        ),
    ])
}

/// An object of ready values. `json!` would pass each value through `to_value`, which copies
/// a whole nested document by serializing it (a fifth of the core's time per job, measured
/// with `examples/core_cycle.rs`).
fn object<const N: usize>(members: [(&str, Value); N]) -> Value {
    Value::Object(
        members
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
    )
}

fn job_document(job: &JobRequest, payload_size: u64) -> Value {
    let env: BTreeMap<String, String> = redact_env(&job.env);
    json!({
        "job_id": job.job_id,
        "topic": job.topic,
        "tenant_id": job.tenant_id,
        "principal_id": job.principal_id,
        "priority": job.priority.as_str(),
        "labels": job.labels,
        "env": env,
        "payload_size": payload_size,
        "budget": { "deadline_ms": job.budget.deadline_ms, "max_runtime_ms": job.budget.max_runtime_ms },
        "meta": {
            "idempotency_key": job.meta.idempotency_key,
            "capability": job.meta.capability,
            "risk_tags": job.meta.risk_tags,
            "requires": job.meta.requires,
            "actor_id": job.meta.actor_id,
        },
        "workflow_id": job.workflow_id,
        "step_index": job.step_index,
        "submitted_at": job.submitted_at,
    })
}

/// Reads the policy's constraint object (`max_retries`, `max_concurrent_jobs`,
/// `max_runtime_ms`, `deadline_ms`, `labels`); anything else is ignored.
pub fn constraints_from_json(v: &Value) -> Constraints {
    let int = |k: &str| v.get(k).and_then(Value::as_i64);
    Constraints {
        max_retries: int("max_retries").and_then(|x| i32::try_from(x).ok()),
        max_concurrent_jobs: int("max_concurrent_jobs").and_then(|x| i32::try_from(x).ok()),
        max_runtime_ms: int("max_runtime_ms"),
        deadline_ms: int("deadline_ms"),
        labels: v
            .get("labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| {
                        let s = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                        (k.clone(), s)
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::ResultMeta;

    fn request() -> JobRequest {
        JobRequest {
            job_id: "j1".into(),
            topic: "jobs".into(),
            tenant_id: "acme".into(),
            labels: [("team".to_owned(), "a".to_owned())].into(),
            env: [("$TOKEN".to_owned(), "s3cret".to_owned())].into(),
            submitted_at: 7,
            ..Default::default()
        }
    }

    fn job_shape() -> Value {
        json!({
            "job_id": "j1", "topic": "jobs", "tenant_id": "acme", "principal_id": null,
            "priority": "BATCH", "labels": { "team": "a" }, "env": { "$TOKEN": "*hidden*" },
            "payload_size": 12,
            "budget": { "deadline_ms": null, "max_runtime_ms": null },
            "meta": { "idempotency_key": null, "capability": null, "risk_tags": [],
                      "requires": [], "actor_id": null },
            "workflow_id": null, "step_index": null, "submitted_at": 7,
        })
    }

    #[test]
    fn the_input_document_has_the_job_the_tenant_and_the_pools() {
        let doc = input_document(&request(), 12, 3, &["default".into()]);
        let want = json!({
            "job": job_shape(),
            "tenant": { "id": "acme", "active_jobs": 3 },
            "pools": ["default"],
        });
        assert_eq!(doc, want);
    }

    #[test]
    fn the_output_document_has_the_job_and_the_result() {
        let meta = ResultMeta {
            size_bytes: Some(5),
            ..Default::default()
        };
        let doc = output_document(&request(), 12, "w1", Some("s3://r"), &meta, 40);
        let want = json!({
            "job": job_shape(),
            "result": { "worker_id": "w1", "result_ptr": "s3://r", "size_bytes": 5,
                        "content_type": null, "labels": {}, "execution_ms": 40 },
        });
        assert_eq!(doc, want);
    }
}
