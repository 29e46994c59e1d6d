//! Inputs, events and the journal entry that binds them.
//!
//! The journal holds one [`JournalEntry`] per processed input record: the input itself, where
//! it came from, the log time the decision used, and every event `decide` produced for it, in
//! order. `apply` folds events into state; replaying the entries from offset 0 rebuilds every
//! projection, and re-running `decide` over the recorded inputs must reproduce the recorded
//! events exactly (audit verify).
//!
//! Enum variant order is part of the Avro contract (union branch and enum symbol indexes):
//! append new variants at the end, never reorder. See docs/schema-evolution.md.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::records::{
    ApproveJob, CancelJob, Constraints, DeadLetter, Heartbeat, JobProgress, JobRequest, JobResult,
    JobStarted, JobTemplate, Millis, Priority, RedriveJob, RejectJob, RescheduleJob, ResultMeta,
    ScheduleAction, ScheduleCommand, ScheduleSpec, Tick,
};

/// Where an input record came from.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Cause {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// An input record the scheduler refused before deciding on it: it could not be read or
/// decoded, it exceeds a size limit, or processing it failed deterministically and it was set
/// aside so that the scheduler could go on. It becomes a DeadLetter with `reason_code`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MalformedRecord {
    /// The record key as UTF-8 (lossy), if it had one; usually the job_id.
    pub key: Option<String>,
    pub size_bytes: i32,
    /// What went wrong, for the operator and the producer.
    pub error: String,
    /// The DLQ reason: `malformed_record` (the default, and all that journals written
    /// before this field knew), `record_too_large`, `processing_failed` or
    /// `unreadable_record`.
    pub reason_code: String,
    /// The job the record concerned, when it was decoded far enough to know.
    pub job_id: Option<String>,
    /// The tenant the record claimed, when it was decoded far enough to know.
    pub tenant_id: Option<String>,
}

/// New routing rules, settings and policy bundle for the decisions that follow.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Reconfigure {
    /// The decision settings (pools, topics, timeouts, thresholds) as canonical JSON.
    pub rules_json: String,
    /// Rego modules by file name.
    pub policy_modules: BTreeMap<String, String>,
    /// Policy data document as JSON.
    pub policy_data_json: String,
    /// Hash of `policy_modules` and `policy_data_json`.
    pub policy_snapshot: String,
    /// Hash of `rules_json`.
    pub rules_id: String,
}

/// A command as the journal records it.
// Inputs are decoded one at a time and moved, never stored in bulk; boxing the large
// variants would only add allocations on the hot path.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Input {
    Submit(JobRequest),
    Started(JobStarted),
    Progress(JobProgress),
    Result(JobResult),
    Heartbeat(Heartbeat),
    Cancel(CancelJob),
    Approve(ApproveJob),
    Reject(RejectJob),
    Tick(Tick),
    Malformed(MalformedRecord),
    Reconfigure(Reconfigure),
    Redrive(RedriveJob),
    Reschedule(RescheduleJob),
    Schedule(ScheduleCommand),
}

impl Input {
    /// Short name for logs, metrics and rejections.
    pub fn kind(&self) -> &'static str {
        match self {
            Input::Submit(_) => "JobRequest",
            Input::Started(_) => "JobStarted",
            Input::Progress(_) => "JobProgress",
            Input::Result(_) => "JobResult",
            Input::Heartbeat(_) => "Heartbeat",
            Input::Cancel(_) => "CancelJob",
            Input::Approve(_) => "ApproveJob",
            Input::Reject(_) => "RejectJob",
            Input::Tick(_) => "Tick",
            Input::Malformed(_) => "MalformedRecord",
            Input::Reconfigure(_) => "Reconfigure",
            Input::Redrive(_) => "RedriveJob",
            Input::Reschedule(_) => "RescheduleJob",
            Input::Schedule(_) => "ScheduleCommand",
        }
    }

    /// The job this input concerns, if it concerns exactly one.
    pub fn job_id(&self) -> Option<&str> {
        match self {
            Input::Submit(r) => Some(&r.job_id),
            Input::Started(r) => Some(&r.job_id),
            Input::Progress(r) => Some(&r.job_id),
            Input::Result(r) => Some(&r.job_id),
            Input::Cancel(r) => Some(&r.job_id),
            Input::Approve(r) => Some(&r.job_id),
            Input::Reject(r) => Some(&r.job_id),
            Input::Redrive(r) => Some(&r.job_id),
            Input::Reschedule(r) => Some(&r.job_id),
            Input::Heartbeat(_)
            | Input::Tick(_)
            | Input::Malformed(_)
            | Input::Reconfigure(_)
            | Input::Schedule(_) => None,
        }
    }
}

/// The states of a job (SPEC §2).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobState {
    #[default]
    Pending,
    ApprovalRequired,
    Scheduled,
    Dispatched,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    Timeout,
    Denied,
    OutputQuarantined,
    /// Waits for its `not_before` (SPEC §9); appended last, as Avro enum symbols are.
    Delayed,
    /// Waits for the jobs it depends on (SPEC §11).
    Blocked,
}

impl JobState {
    pub const ALL: [JobState; 13] = [
        JobState::Pending,
        JobState::ApprovalRequired,
        JobState::Scheduled,
        JobState::Dispatched,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Timeout,
        JobState::Denied,
        JobState::OutputQuarantined,
        JobState::Delayed,
        JobState::Blocked,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded
                | JobState::Failed
                | JobState::Cancelled
                | JobState::Timeout
                | JobState::Denied
                | JobState::OutputQuarantined
        )
    }

    /// Ended dead-lettered: what a redrive may submit again.
    pub fn is_dead_lettered(self) -> bool {
        matches!(
            self,
            JobState::Failed | JobState::Timeout | JobState::Denied
        )
    }

    /// Waiting for a time or for other jobs, its record kept in storage rather than in
    /// memory: DELAYED (SPEC §9) and BLOCKED (SPEC §11). Not terminal, and not in any queue.
    /// Both wait under a due time ([`crate::state::delay_key_of`]): a blocked job's is its
    /// dependency timeout.
    pub fn is_parked(self) -> bool {
        matches!(self, JobState::Delayed | JobState::Blocked)
    }

    /// What the processor need not hold in memory once it is written: terminal and parked
    /// jobs. An input that names one loads it first.
    pub fn is_cold(self) -> bool {
        self.is_terminal() || self.is_parked()
    }

    /// Counted against the tenant's `max_concurrent_jobs`.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            JobState::Scheduled | JobState::Dispatched | JobState::Running
        )
    }

    /// The allowed transitions (SPEC §2). Anything else is rejected and journaled.
    pub fn can_transition(self, to: JobState) -> bool {
        use JobState::*;
        match (self, to) {
            (
                Pending,
                Scheduled | Denied | ApprovalRequired | Cancelled | Timeout | Failed | Delayed
                | Blocked,
            ) => true,
            (Delayed, Pending | Cancelled) => true,
            (Blocked, Pending | Cancelled | Failed) => true,
            (ApprovalRequired, Pending | Denied | Cancelled | Timeout) => true,
            (Scheduled, Dispatched | Cancelled | Timeout) => true,
            // A worker may report its result without a JobStarted first; the start is implied.
            (Dispatched, Running | Succeeded | Pending | Failed | Cancelled | Timeout) => true,
            (Running, Succeeded | Pending | Failed | Cancelled | Timeout) => true,
            (Succeeded, OutputQuarantined) => true,
            _ => false,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "PENDING",
            JobState::ApprovalRequired => "APPROVAL_REQUIRED",
            JobState::Scheduled => "SCHEDULED",
            JobState::Dispatched => "DISPATCHED",
            JobState::Running => "RUNNING",
            JobState::Succeeded => "SUCCEEDED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
            JobState::Timeout => "TIMEOUT",
            JobState::Denied => "DENIED",
            JobState::OutputQuarantined => "OUTPUT_QUARANTINED",
            JobState::Delayed => "DELAYED",
            JobState::Blocked => "BLOCKED",
        }
    }

    pub fn parse(s: &str) -> Option<JobState> {
        JobState::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s))
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a batch stands (SPEC §11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum BatchState {
    /// Members missing or unfinished.
    Open,
    /// Every member ended: its callbacks run.
    Complete,
    /// Its time passed first: its callbacks fail.
    Expired,
    /// An operator cancelled it: its members that had not started were cancelled, and its
    /// callbacks fail.
    Cancelled,
}

impl BatchState {
    pub fn as_str(self) -> &'static str {
        match self {
            BatchState::Open => "OPEN",
            BatchState::Complete => "COMPLETE",
            BatchState::Expired => "EXPIRED",
            BatchState::Cancelled => "CANCELLED",
        }
    }
}

/// How a duplicate submission was recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DuplicateKind {
    /// Same job_id, same content: a producer retry. Ignored.
    SameJobId,
    /// Same job_id, different content: dead-lettered as `duplicate_job_id`.
    ConflictingJobId,
    /// Same (tenant_id, idempotency_key) within the retention window. Ignored.
    IdempotencyKey,
    /// A unique key (SPEC §10) a job of the same tenant and topic took within the topic's
    /// window. Ignored; `idempotency_key` holds the unique key.
    UniqueKey,
}

/// The safety kernel's verdict on a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    Allow,
    Deny,
    RequireApproval,
}

/// A circuit breaker's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CircuitState {
    #[default]
    Closed,
    Open,
    HalfOpen,
}

/// How a saga ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SagaOutcome {
    Compensated,
    CompensationFailed,
}

/// One worker considered for a placement, and what the strategy made of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub worker_id: String,
    pub pool: String,
    /// The strategy's score; lower is better. None when the worker was skipped.
    pub score: Option<f64>,
    /// Why the worker was skipped, if it was (e.g. `overloaded: cpu_load 95 >= 90`).
    pub skipped: Option<String>,
}

/// The job was admitted: it exists from here on, in PENDING.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobAccepted {
    pub job_id: String,
    /// The request, when it is not the entry's input: a saga compensation, or any job
    /// accepted in a journal written before requests were journaled once. None: the entry's
    /// input is the request (its topic already set to the topic it was read from). Boxed,
    /// as are the other large fields of rare or per-worker events, so that an `Event` is as
    /// large as a common one, not as its largest (a replay moves millions of them).
    pub request: Option<Box<JobRequest>>,
    /// SHA-256 of the canonical request without `approval_*` labels (SPEC §6).
    pub job_hash: String,
    /// Pools the job may run in, in preference order.
    pub pools: Vec<String>,
    /// Why configured pools were left out (requires, preferred_pool).
    pub routing_notes: Vec<String>,
    /// The unique key the job takes for its topic's window (SPEC §10: `label:VALUE` or
    /// `payload:DIGEST`), if its topic has a unique rule and the job a key.
    #[serde(default)]
    pub unique_key: Option<String>,
}

/// A submission that was seen before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobDuplicate {
    pub job_id: String,
    pub existing_job_id: String,
    pub kind: DuplicateKind,
    pub idempotency_key: Option<String>,
}

/// The input policy's decision for a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyEvaluated {
    pub job_id: String,
    pub snapshot_id: String,
    pub verdict: Verdict,
    pub reasons: Vec<String>,
    /// Effective constraints: policy over config defaults.
    pub constraints: Constraints,
}

/// The job entered its pools' pending queues.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobQueued {
    pub job_id: String,
    pub pools: Vec<String>,
    pub priority: Priority,
}

/// A queued job could not be placed yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobWaiting {
    pub job_id: String,
    /// `no_workers`, `pool_overloaded`, `tenant_limit`, `circuit_open`,
    /// `concurrency_limited` or `rate_limited`.
    pub reason_code: String,
    pub detail: String,
    pub candidates: Vec<Candidate>,
    /// Workers considered but not listed in `candidates` (the list keeps the best scored
    /// and the first skipped, up to a bound, so that a placement event stays small).
    pub candidates_omitted: i32,
}

/// The placement decision: a worker was chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobScheduled {
    pub job_id: String,
    pub attempt: i32,
    pub pool: String,
    pub worker_id: String,
    pub strategy: String,
    pub candidates: Vec<Candidate>,
    /// How label hints were honoured or why they were ignored.
    pub notes: Vec<String>,
    /// Workers considered but not listed in `candidates` (see [`JobWaiting`]).
    pub candidates_omitted: i32,
}

/// The Dispatch record was written to the worker's partition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobDispatched {
    pub job_id: String,
    pub attempt: i32,
    pub pool: String,
    pub worker_id: String,
    pub partition: i32,
    pub deadline_at: Option<Millis>,
}

/// A worker started the current attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRunning {
    pub job_id: String,
    pub attempt: i32,
    pub worker_id: String,
    /// Set when another worker of the pool took the job after a rebalance.
    pub reassigned_from: Option<String>,
}

/// Progress of the current attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobProgressed {
    pub job_id: String,
    pub attempt: i32,
    pub progress: f64,
    pub message: Option<String>,
}

/// The current attempt succeeded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSucceeded {
    pub job_id: String,
    pub attempt: i32,
    pub worker_id: String,
    pub result_ptr: Option<String>,
    pub result_meta: ResultMeta,
    pub execution_ms: i64,
}

/// The output policy quarantined a succeeded job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobQuarantined {
    pub job_id: String,
    pub snapshot_id: String,
    pub reasons: Vec<String>,
}

/// An attempt failed in a way that allows another; the job waits `backoff_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRetrying {
    pub job_id: String,
    /// The attempt that failed.
    pub attempt: i32,
    pub error_code: String,
    pub error_message: Option<String>,
    pub backoff_ms: i64,
    pub retry_at: Millis,
}

/// The job failed for good.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobFailed {
    pub job_id: String,
    pub attempt: i32,
    /// The DLQ reason code (e.g. `max_retries_exceeded`, `no_workers`, the worker's error_code).
    pub reason_code: String,
    pub error_message: Option<String>,
}

/// The job was cancelled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobCancelled {
    pub job_id: String,
    pub principal_id: String,
    pub reason: Option<String>,
}

/// A dead-lettered job was submitted again as a new job, accepted just before in the same
/// entry: the new job runs the old one's request and payload (its payload is read from the
/// old job's, [`crate::state::Job::payload_of`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRedriven {
    /// The dead-lettered job; it stays as it ended.
    pub job_id: String,
    pub new_job_id: String,
    pub principal_id: String,
    pub reason: Option<String>,
}

/// The job ran out of time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobTimedOut {
    pub job_id: String,
    pub attempt: i32,
    /// `timeout` (reconciler, max runtime) or `deadline_exceeded`.
    pub reason_code: String,
    pub detail: String,
}

/// The job was denied by policy or by an approver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobDenied {
    pub job_id: String,
    /// `safety_denied` or `approval_rejected`.
    pub reason_code: String,
    pub reasons: Vec<String>,
    pub by: Option<String>,
}

/// The job waits for a human: APPROVAL_REQUIRED.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequested {
    pub job_id: String,
    pub job_hash: String,
    pub snapshot_id: String,
    pub reasons: Vec<String>,
}

/// An approval matched: the job returns to PENDING with its stored constraints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobApproved {
    pub job_id: String,
    pub approver: String,
    pub comment: Option<String>,
}

/// A CancelDispatch was sent to the worker running an attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DispatchCancelled {
    pub job_id: String,
    pub attempt: i32,
    pub pool: String,
    pub worker_id: String,
    pub partition: i32,
    pub reason: String,
}

/// A DeadLetter was written to the DLQ topic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLettered {
    pub dead_letter: Box<DeadLetter>,
}

/// An input was refused; the job (if any) is unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandRejected {
    /// Empty when the input concerned no known job.
    pub job_id: String,
    pub input_kind: String,
    /// Machine-readable: `invalid_transition`, `stale_attempt`, `unknown_job`,
    /// `tenant_mismatch`, `stale_job_hash`, `stale_policy_snapshot`, `not_awaiting_approval`, ...
    pub reason_code: String,
    pub reason: String,
    /// The job's state when the input arrived, if the job exists.
    pub state: Option<JobState>,
}

/// A heartbeat updated the worker view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerUpdated {
    pub worker_id: String,
    pub heartbeat: Box<Heartbeat>,
    /// First heartbeat, or first since the worker was declared lost.
    pub joined: bool,
}

/// A worker stopped sending heartbeats for longer than `worker_ttl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerLost {
    pub worker_id: String,
    pub pool: String,
    pub last_seen: Millis,
    /// Jobs that were DISPATCHED or RUNNING on it.
    pub job_ids: Vec<String>,
}

/// A pool's circuit breaker moved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CircuitChanged {
    pub pool: String,
    pub from: CircuitState,
    pub to: CircuitState,
    pub reason: String,
}

/// A workflow step succeeded: its compensation was pushed on the workflow's stack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SagaStepRecorded {
    pub workflow_id: String,
    pub job_id: String,
    /// Tenant and principal the compensation job will run as (the step's own). From
    /// decision format 3 the saga is the tenant's: keyed by (tenant, workflow).
    pub tenant_id: String,
    pub principal_id: Option<String>,
    pub compensation: Box<JobTemplate>,
    /// The step's topic, the only one its compensation may run on; None in journals
    /// written before it was recorded.
    pub topic: Option<String>,
}

/// A workflow step failed fatally: its compensations run, last first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SagaRollbackStarted {
    pub workflow_id: String,
    pub failed_job_id: String,
    pub steps: i32,
    /// The tenant whose saga it is; None: a saga keyed by its workflow alone (journals
    /// written before sagas were the tenant's).
    pub tenant_id: Option<String>,
}

/// The next compensation was submitted as a new job (its JobAccepted follows, or the
/// dead letter that refused it and its `SagaCompensationEnded`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SagaCompensationSubmitted {
    pub workflow_id: String,
    pub job_id: String,
    /// The step whose compensation this is.
    pub for_job_id: String,
    /// As in [`SagaRollbackStarted::tenant_id`].
    pub tenant_id: Option<String>,
}

/// The workflow's rollback ended (again, when a step that succeeded after it was
/// compensated too).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SagaFinished {
    pub workflow_id: String,
    pub outcome: SagaOutcome,
    pub detail: String,
    /// As in [`SagaRollbackStarted::tenant_id`].
    pub tenant_id: Option<String>,
}

/// A compensation reached a terminal state, or was refused before it became a job; the
/// next one follows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SagaCompensationEnded {
    pub workflow_id: String,
    /// As in [`SagaRollbackStarted::tenant_id`].
    pub tenant_id: Option<String>,
    pub job_id: String,
    /// It succeeded; otherwise the saga ends COMPENSATION_FAILED.
    pub succeeded: bool,
    /// How it ended (its state, or why it was refused).
    pub detail: String,
}

/// Idempotency keys first seen before `before` were forgotten (retention passed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdempotencyPruned {
    pub before: Millis,
}

/// New rules and policy took effect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigApplied {
    pub config: Reconfigure,
}

/// An attempt's end counted in a pool's circuit breaker window (SPEC §5). Decided once, by
/// `decide`, so a replay counts exactly what the live scheduler counted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BreakerCounted {
    pub pool: String,
    pub job_id: String,
    /// True for a failure (failed or timed out), false for a success.
    pub failure: bool,
}

/// Scheduler time jumped: for longer than `clock_gap_ms` no input could be read (a broker
/// outage, the scheduler down, a partition without a leader), so nobody could have shown a
/// sign of life. Timeouts that wait for evidence (worker loss, dispatch, running and
/// placement timeouts) count from `to`, not from before the gap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClockGap {
    /// The watermark before the gap.
    pub from: Millis,
    /// The watermark after it.
    pub to: Millis,
}

/// A worker lost for longer than `worker_retention_ms` was forgotten (its record dropped).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerForgotten {
    pub worker_id: String,
    pub pool: String,
    pub last_seen: Millis,
}

/// The job waits until scheduler time reaches `not_before` (its request's, or a
/// reschedule's); then [`JobReleased`] puts it in its queues.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobDelayed {
    pub job_id: String,
    pub not_before: Millis,
}

/// A DELAYED job became due: the Tick's watermark reached its `not_before`. It is PENDING
/// from here, as if submitted at `released_at`: its deadline counts from then.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobReleased {
    pub job_id: String,
    pub not_before: Millis,
    pub released_at: Millis,
}

/// The job waits for its dependencies (SPEC §11), BLOCKED, until its condition holds
/// ([`JobUnblocked`]), can no longer hold, or `until` passes (then it fails
/// `dependency_failed`). The dependencies already ended when it was admitted are counted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobBlocked {
    pub job_id: String,
    /// The dependencies not ended yet (or not submitted yet, or not of its tenant).
    pub waiting_on: Vec<String>,
    pub succeeded: i32,
    pub failed: i32,
    pub until: Millis,
}

/// Job `job_id` is waited for by `dependent`: its end releases its dependents
/// ([`JobState::Blocked`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobAwaited {
    pub job_id: String,
    pub dependent: String,
}

/// A BLOCKED job's dependency ended, in `state`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DependencyResolved {
    pub job_id: String,
    pub dependency: String,
    pub state: JobState,
}

/// A BLOCKED job's condition holds: PENDING from here, as if submitted now (its deadline
/// counts from here); it goes on to its debounce, its time and its queues.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobUnblocked {
    pub job_id: String,
    pub succeeded: i32,
    pub failed: i32,
}

/// Every job waiting for ended job `job_id` has been told of its end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DependentsSettled {
    pub job_id: String,
}

/// A batch's first member was accepted (SPEC §11): the batch expects `expected` members,
/// and expires at `until` unless all of them ended by then.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchOpened {
    pub tenant_id: String,
    pub batch_id: String,
    pub expected: i32,
    pub until: Millis,
}

/// A batch ended before all its members did: EXPIRED at its `until`, or CANCELLED by
/// `principal_id`. Its callbacks fail; a cancelled batch's members that have not started are
/// cancelled ([`BatchMembersCancelled`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchClosed {
    pub tenant_id: String,
    pub batch_id: String,
    pub state: BatchState,
    pub principal_id: String,
    pub reason: String,
}

/// A cancelled batch's members up to `through`, in id order, were reached: those that had
/// not started were cancelled (each by its own JobCancelled).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchMembersCancelled {
    pub tenant_id: String,
    pub batch_id: String,
    pub through: String,
}

/// An ended batch's record was dropped, `limits.batch_retention_ms` after it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchForgotten {
    pub tenant_id: String,
    pub batch_id: String,
}

/// A DELAYED job's time was changed ([`crate::records::RescheduleJob`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRescheduled {
    pub job_id: String,
    pub not_before: Millis,
    pub previous: Millis,
    pub principal_id: String,
    pub reason: Option<String>,
}

/// A schedule was created, changed, paused, resumed or deleted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleChanged {
    pub schedule_id: String,
    pub tenant_id: String,
    pub action: ScheduleAction,
    /// For CREATE and UPDATE: the schedule as it is now.
    pub spec: Option<Box<ScheduleSpec>>,
    pub principal_id: String,
    pub reason: Option<String>,
    /// Its next firing from here; None when it has none.
    pub next_slot: Option<Millis>,
}

/// What became of a schedule's firing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ScheduleOutcome {
    /// A job was submitted.
    Submitted,
    /// Its previous run had not ended (overlap SKIP, or BUFFER_ONE with one waiting).
    Skipped,
    /// It waits for the previous run to end (overlap BUFFER_ONE).
    Buffered,
    /// Too late, by its catch-up policy.
    Missed,
    /// The job was refused as a submission would have been.
    Refused,
}

impl ScheduleOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ScheduleOutcome::Submitted => "SUBMITTED",
            ScheduleOutcome::Skipped => "SKIPPED",
            ScheduleOutcome::Buffered => "BUFFERED",
            ScheduleOutcome::Missed => "MISSED",
            ScheduleOutcome::Refused => "REFUSED",
        }
    }
}

/// A schedule's firing was decided: a job submitted, or why none was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleFired {
    pub schedule_id: String,
    pub tenant_id: String,
    /// The firing's time (for MISSED, the first firing missed: those from it to before
    /// `next_slot` were; for a trigger, the time it was asked for).
    pub slot: Millis,
    pub outcome: ScheduleOutcome,
    pub job_id: Option<String>,
    pub detail: String,
    /// Fired by a TRIGGER command, outside the schedule's times.
    pub triggered: bool,
    /// The schedule's next firing from here; None when it has none.
    pub next_slot: Option<Millis>,
}

/// A job held to its topic's debounce rule (SPEC §10): it waits DELAYED until `due`
/// ([`JobDelayed`] follows), unless a later job of its key replaces it first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobDebounced {
    pub job_id: String,
    /// The debounce key: the label's value, `""` for a `tenant` key.
    pub key: String,
    /// When the run of jobs it belongs to began: the first one's acceptance (log time).
    pub first_at: Millis,
    /// When it is released unless a later job of its key replaces it: its acceptance plus
    /// the rule's wait, no later than `first_at` plus the rule's max wait (or its own
    /// `not_before`, if later).
    pub due: Millis,
    /// The job of the same key it replaces, cancelled next in the same entry.
    pub replaces: Option<String>,
}

/// Debounce windows due by `through` closed: a job of their keys accepted later begins a
/// new run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DebouncesClosed {
    pub through: Millis,
}

/// A queued job waited its pools' aging time (SPEC §10): it stands in its queues at
/// `priority` from here, in its place by age, until it leaves them. Its request keeps the
/// priority it was submitted with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobAged {
    pub job_id: String,
    /// The priority it goes on at: one above the one it waited at.
    pub priority: crate::records::Priority,
    /// When it was queued (this time): it has waited since.
    pub queued_at: Millis,
}

/// Every event the scheduler journals.
// The large fields of rare or per-worker events are boxed (a saga's request and its
// compensation, a heartbeat, a dead letter), so an event is as large as the common ones
// (152 bytes, not 496): a replay decodes, moves, reads and frees millions of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Event {
    JobAccepted(JobAccepted),
    JobDuplicate(JobDuplicate),
    PolicyEvaluated(PolicyEvaluated),
    JobQueued(JobQueued),
    JobWaiting(JobWaiting),
    JobScheduled(JobScheduled),
    JobDispatched(JobDispatched),
    JobRunning(JobRunning),
    JobProgressed(JobProgressed),
    JobSucceeded(JobSucceeded),
    JobQuarantined(JobQuarantined),
    JobRetrying(JobRetrying),
    JobFailed(JobFailed),
    JobCancelled(JobCancelled),
    JobTimedOut(JobTimedOut),
    JobDenied(JobDenied),
    ApprovalRequested(ApprovalRequested),
    JobApproved(JobApproved),
    DispatchCancelled(DispatchCancelled),
    DeadLettered(DeadLettered),
    CommandRejected(CommandRejected),
    WorkerUpdated(WorkerUpdated),
    WorkerLost(WorkerLost),
    CircuitChanged(CircuitChanged),
    SagaStepRecorded(SagaStepRecorded),
    SagaRollbackStarted(SagaRollbackStarted),
    SagaCompensationSubmitted(SagaCompensationSubmitted),
    SagaFinished(SagaFinished),
    IdempotencyPruned(IdempotencyPruned),
    ConfigApplied(ConfigApplied),
    BreakerCounted(BreakerCounted),
    ClockGap(ClockGap),
    WorkerForgotten(WorkerForgotten),
    JobRedriven(JobRedriven),
    SagaCompensationEnded(SagaCompensationEnded),
    JobDelayed(JobDelayed),
    JobReleased(JobReleased),
    JobRescheduled(JobRescheduled),
    ScheduleChanged(ScheduleChanged),
    ScheduleFired(ScheduleFired),
    JobDebounced(JobDebounced),
    DebouncesClosed(DebouncesClosed),
    JobAged(JobAged),
    JobBlocked(JobBlocked),
    JobAwaited(JobAwaited),
    DependencyResolved(DependencyResolved),
    JobUnblocked(JobUnblocked),
    DependentsSettled(DependentsSettled),
    BatchOpened(BatchOpened),
    BatchClosed(BatchClosed),
    BatchMembersCancelled(BatchMembersCancelled),
    BatchForgotten(BatchForgotten),
}

impl Event {
    /// The Avro record name of the event (also its name in logs and metrics).
    pub fn name(&self) -> &'static str {
        match self {
            Event::JobAccepted(_) => "JobAccepted",
            Event::JobDuplicate(_) => "JobDuplicate",
            Event::PolicyEvaluated(_) => "PolicyEvaluated",
            Event::JobQueued(_) => "JobQueued",
            Event::JobWaiting(_) => "JobWaiting",
            Event::JobScheduled(_) => "JobScheduled",
            Event::JobDispatched(_) => "JobDispatched",
            Event::JobRunning(_) => "JobRunning",
            Event::JobProgressed(_) => "JobProgressed",
            Event::JobSucceeded(_) => "JobSucceeded",
            Event::JobQuarantined(_) => "JobQuarantined",
            Event::JobRetrying(_) => "JobRetrying",
            Event::JobFailed(_) => "JobFailed",
            Event::JobCancelled(_) => "JobCancelled",
            Event::JobTimedOut(_) => "JobTimedOut",
            Event::JobDenied(_) => "JobDenied",
            Event::ApprovalRequested(_) => "ApprovalRequested",
            Event::JobApproved(_) => "JobApproved",
            Event::DispatchCancelled(_) => "DispatchCancelled",
            Event::DeadLettered(_) => "DeadLettered",
            Event::CommandRejected(_) => "CommandRejected",
            Event::WorkerUpdated(_) => "WorkerUpdated",
            Event::WorkerLost(_) => "WorkerLost",
            Event::CircuitChanged(_) => "CircuitChanged",
            Event::SagaStepRecorded(_) => "SagaStepRecorded",
            Event::SagaRollbackStarted(_) => "SagaRollbackStarted",
            Event::SagaCompensationSubmitted(_) => "SagaCompensationSubmitted",
            Event::SagaFinished(_) => "SagaFinished",
            Event::SagaCompensationEnded(_) => "SagaCompensationEnded",
            Event::IdempotencyPruned(_) => "IdempotencyPruned",
            Event::ConfigApplied(_) => "ConfigApplied",
            Event::BreakerCounted(_) => "BreakerCounted",
            Event::ClockGap(_) => "ClockGap",
            Event::WorkerForgotten(_) => "WorkerForgotten",
            Event::JobRedriven(_) => "JobRedriven",
            Event::JobDelayed(_) => "JobDelayed",
            Event::JobReleased(_) => "JobReleased",
            Event::JobRescheduled(_) => "JobRescheduled",
            Event::ScheduleChanged(_) => "ScheduleChanged",
            Event::ScheduleFired(_) => "ScheduleFired",
            Event::JobDebounced(_) => "JobDebounced",
            Event::DebouncesClosed(_) => "DebouncesClosed",
            Event::JobAged(_) => "JobAged",
            Event::JobBlocked(_) => "JobBlocked",
            Event::JobAwaited(_) => "JobAwaited",
            Event::DependencyResolved(_) => "DependencyResolved",
            Event::JobUnblocked(_) => "JobUnblocked",
            Event::DependentsSettled(_) => "DependentsSettled",
            Event::BatchOpened(_) => "BatchOpened",
            Event::BatchClosed(_) => "BatchClosed",
            Event::BatchMembersCancelled(_) => "BatchMembersCancelled",
            Event::BatchForgotten(_) => "BatchForgotten",
        }
    }

    /// The job the event concerns, if any.
    pub fn job_id(&self) -> Option<&str> {
        let id = match self {
            Event::JobAccepted(e) => &e.job_id,
            Event::JobDuplicate(e) => &e.job_id,
            Event::PolicyEvaluated(e) => &e.job_id,
            Event::JobQueued(e) => &e.job_id,
            Event::JobWaiting(e) => &e.job_id,
            Event::JobScheduled(e) => &e.job_id,
            Event::JobDispatched(e) => &e.job_id,
            Event::JobRunning(e) => &e.job_id,
            Event::JobProgressed(e) => &e.job_id,
            Event::JobSucceeded(e) => &e.job_id,
            Event::JobQuarantined(e) => &e.job_id,
            Event::JobRetrying(e) => &e.job_id,
            Event::JobFailed(e) => &e.job_id,
            Event::JobCancelled(e) => &e.job_id,
            Event::JobTimedOut(e) => &e.job_id,
            Event::JobDenied(e) => &e.job_id,
            Event::ApprovalRequested(e) => &e.job_id,
            Event::JobApproved(e) => &e.job_id,
            Event::DispatchCancelled(e) => &e.job_id,
            Event::DeadLettered(e) => &e.dead_letter.job_id,
            Event::CommandRejected(e) => &e.job_id,
            Event::SagaStepRecorded(e) => &e.job_id,
            Event::SagaRollbackStarted(e) => &e.failed_job_id,
            Event::SagaCompensationSubmitted(e) => &e.job_id,
            Event::SagaCompensationEnded(e) => &e.job_id,
            Event::BreakerCounted(e) => &e.job_id,
            Event::JobRedriven(e) => &e.job_id,
            Event::JobDelayed(e) => &e.job_id,
            Event::JobReleased(e) => &e.job_id,
            Event::JobRescheduled(e) => &e.job_id,
            Event::JobDebounced(e) => &e.job_id,
            Event::JobAged(e) => &e.job_id,
            Event::JobBlocked(e) => &e.job_id,
            Event::JobAwaited(e) => &e.job_id,
            Event::DependencyResolved(e) => &e.job_id,
            Event::JobUnblocked(e) => &e.job_id,
            // A batch's callbacks or members told is no job's event.
            Event::DependentsSettled(e) if crate::state::parse_batch_name(&e.job_id).is_some() => {
                return None;
            }
            Event::DependentsSettled(e) => &e.job_id,
            Event::ScheduleFired(e) => match &e.job_id {
                Some(id) => id,
                None => return None,
            },
            Event::ScheduleChanged(_)
            | Event::WorkerUpdated(_)
            | Event::WorkerLost(_)
            | Event::CircuitChanged(_)
            | Event::SagaFinished(_)
            | Event::IdempotencyPruned(_)
            | Event::DebouncesClosed(_)
            | Event::ConfigApplied(_)
            | Event::ClockGap(_)
            | Event::WorkerForgotten(_)
            | Event::BatchOpened(_)
            | Event::BatchClosed(_)
            | Event::BatchMembersCancelled(_)
            | Event::BatchForgotten(_) => return None,
        };
        if id.is_empty() { None } else { Some(id) }
    }

    /// The worker the event concerns, if any.
    pub fn worker_id(&self) -> Option<&str> {
        match self {
            Event::JobScheduled(e) => Some(&e.worker_id),
            Event::JobDispatched(e) => Some(&e.worker_id),
            Event::JobRunning(e) => Some(&e.worker_id),
            Event::JobSucceeded(e) => Some(&e.worker_id),
            Event::DispatchCancelled(e) => Some(&e.worker_id),
            Event::WorkerUpdated(e) => Some(&e.worker_id),
            Event::WorkerLost(e) => Some(&e.worker_id),
            Event::WorkerForgotten(e) => Some(&e.worker_id),
            _ => None,
        }
    }
}

/// The decision format this build writes in [`JournalEntry::format`]. Entries of an older
/// format are applied with that format's rules, so old journals still replay to what the
/// scheduler that wrote them had:
/// 1. the first format: `apply` counted attempt ends in the circuit breaker itself.
/// 2. `decide` journals every count as a `BreakerCounted` event.
/// 3. a saga is its tenant's: `SagaStepRecorded` keys it by (tenant, workflow), where
///    format 2 keyed it by the workflow alone.
pub const DECISION_FORMAT: i32 = 3;

/// One processed input and what it caused: the unit of the journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// Where the input was read.
    pub cause: Cause,
    /// The time the decision used: the input's log time, never earlier than the previous entry's.
    pub log_time: Millis,
    pub input: Input,
    pub events: Vec<Event>,
    /// The decision format of the scheduler that wrote the entry ([`DECISION_FORMAT`]); 1 for
    /// journals written before the field existed.
    pub format: i32,
}

impl JournalEntry {
    /// The entry as it may be shown or exported: secret env values hidden everywhere.
    pub fn redacted(&self) -> JournalEntry {
        let mut e = self.clone();
        if let Input::Submit(r) = &mut e.input {
            *r = r.redacted();
        }
        if let Input::Schedule(c) = &mut e.input
            && let Some(spec) = &mut c.spec
        {
            spec.template.env = crate::records::redact_env(&spec.template.env);
        }
        for ev in &mut e.events {
            match ev {
                Event::JobAccepted(a) => {
                    a.request = a.request.as_ref().map(|r| Box::new(r.redacted()));
                }
                Event::SagaStepRecorded(s) => {
                    s.compensation.env = crate::records::redact_env(&s.compensation.env)
                }
                Event::ScheduleChanged(c) => {
                    if let Some(spec) = &mut c.spec {
                        spec.template.env = crate::records::redact_env(&spec.template.env);
                    }
                }
                _ => {}
            }
        }
        e
    }

    /// Jobs and sagas (by [`crate::state::saga_key`]) whose records `apply` reads or
    /// changes for this entry: what a partial state must hold before the entry is applied.
    ///
    /// A job the entry accepts, before any other event of the entry names it, is not among
    /// them: `JobAccepted` writes the whole record, and it is only ever decided for an id the
    /// shard does not hold (the decision loaded the id and found nothing, or it would have
    /// been a `JobDuplicate`), so there is nothing to read. A replay folds a submit without a
    /// store lookup that could only miss.
    pub fn touched(&self) -> (Vec<&str>, Vec<String>) {
        use crate::state::saga_key_of;
        let mut jobs: Vec<&str> = Vec::new();
        let mut workflows: Vec<String> = Vec::new();
        let mut accepted: Vec<&str> = Vec::new();
        for e in &self.events {
            // An entry's events mostly follow one job: its next event needs no search.
            let new = |id: &&str| jobs.last() != Some(id) && accepted.last() != Some(id);
            if let Some(id) = e.job_id().filter(new) {
                if matches!(e, Event::JobAccepted(_)) && !jobs.contains(&id) {
                    accepted.push(id);
                } else if !accepted.contains(&id) {
                    jobs.push(id);
                }
            }
            match e {
                Event::JobDuplicate(d) => jobs.push(&d.existing_job_id),
                Event::WorkerUpdated(u) => {
                    jobs.extend(u.heartbeat.active_job_ids.iter().map(String::as_str))
                }
                Event::SagaStepRecorded(s) => {
                    workflows.push(crate::state::step_saga_key(s, self.format))
                }
                Event::SagaRollbackStarted(s) => {
                    workflows.push(saga_key_of(s.tenant_id.as_deref(), &s.workflow_id))
                }
                Event::SagaCompensationSubmitted(s) => {
                    workflows.push(saga_key_of(s.tenant_id.as_deref(), &s.workflow_id))
                }
                Event::SagaFinished(s) => {
                    workflows.push(saga_key_of(s.tenant_id.as_deref(), &s.workflow_id))
                }
                Event::SagaCompensationEnded(s) => {
                    workflows.push(saga_key_of(s.tenant_id.as_deref(), &s.workflow_id))
                }
                Event::JobRedriven(r) => jobs.push(&r.new_job_id),
                _ => {}
            }
        }
        jobs.sort_unstable();
        jobs.dedup();
        workflows.sort_unstable();
        workflows.dedup();
        (jobs, workflows)
    }

    /// The Kafka key of the entry: the job it concerns, else the worker, else the input kind.
    pub fn key(&self) -> String {
        if let Some(id) = self.input.job_id() {
            return id.to_owned();
        }
        if let Input::Heartbeat(h) = &self.input {
            return h.worker_id.clone();
        }
        self.input.kind().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A large field added to an event should be boxed (see `Event`): every event is as
    /// large as the largest kind.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn an_event_is_as_large_as_a_common_one() {
        assert!(
            std::mem::size_of::<Event>() <= 160,
            "{} bytes",
            std::mem::size_of::<Event>()
        );
    }
}
