# Input policy: evaluated once per job, before its first dispatch (SPEC section 5).
#
# input.job      the JobRequest: job_id, topic, tenant_id, principal_id, priority, labels,
#                env (secret values shown as *hidden*), payload_size, budget, meta
#                (idempotency_key, capability, risk_tags, requires, actor_id), workflow_id,
#                step_index, submitted_at
# input.tenant   {"id": ..., "active_jobs": <SCHEDULED + DISPATCHED + RUNNING jobs>}
# input.pools    pools the job may run in
#
# Rules ksched reads (all optional):
#   deny              set of reasons; non-empty -> DENIED, DLQ safety_denied
#   require_approval  set of reasons; non-empty -> APPROVAL_REQUIRED
#   allow             must be true for the job to run when nothing above applies
#   constraints       object: max_retries, max_concurrent_jobs (tenant), max_runtime_ms,
#                     deadline_ms (the smaller of this and the job's wins), labels (added;
#                     placement.* labels constrain placement)
#
# Decisions must be deterministic: time.now_ns, rand.intn, uuid.rfc4122 and opa.runtime are
# refused at load. The snapshot id (hash of these files and data.json) is journaled with
# every decision; approvals are bound to it.
package ksched.input

# Permissive default: every job may run.
default allow := true

# --- example: remove the leading "# " of the lines below to enforce it ---
# # Destructive jobs never run in production.
# deny contains msg if {
#     input.job.labels.env == "prod"
#     "destructive" in input.job.meta.risk_tags
#     msg := "destructive jobs are not allowed in prod"
# }
#
# # Anything else touching production needs a human.
# require_approval contains msg if {
#     input.job.labels.env == "prod"
#     msg := sprintf("job %s touches prod", [input.job.job_id])
# }
#
# # Batch jobs get one retry, ten minutes per attempt, and stay in the EU zone.
# constraints := {
#     "max_retries": 1,
#     "max_runtime_ms": 600000,
#     "labels": {"placement.zone": "eu"},
# } if input.job.priority == "BATCH"
# --- end of example ---
