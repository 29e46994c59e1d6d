//! The records that cross Kafka topics (SPEC §1), as plain data.
//!
//! Field names match the Avro schemas in `schemas/` one for one; `ksched-codec` maps between
//! the two. Maps are `BTreeMap` so that every encoding of a record, and every decision made
//! from one, is deterministic. Times are milliseconds since the Unix epoch.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// Job priority. Higher priorities are dequeued first; within a priority the oldest job wins.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Priority {
    Critical,
    Interactive,
    #[default]
    Batch,
}

impl Priority {
    /// Queue rank: 0 is dequeued first.
    pub fn rank(self) -> u8 {
        match self {
            Priority::Critical => 0,
            Priority::Interactive => 1,
            Priority::Batch => 2,
        }
    }

    /// The priority of queue rank `rank` (ranks past the last are BATCH).
    pub fn of_rank(rank: u8) -> Priority {
        match rank {
            0 => Priority::Critical,
            1 => Priority::Interactive,
            _ => Priority::Batch,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "CRITICAL",
            Priority::Interactive => "INTERACTIVE",
            Priority::Batch => "BATCH",
        }
    }
}

/// Time limits a producer asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Budget {
    /// Whole-job deadline, counted from `submitted_at`; never reset by a retry.
    pub deadline_ms: Option<i64>,
    /// Longest a single attempt may run once started.
    pub max_runtime_ms: Option<i64>,
}

/// Scheduling metadata a producer attaches to a job.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct JobMeta {
    pub idempotency_key: Option<String>,
    pub capability: Option<String>,
    pub risk_tags: Vec<String>,
    /// Capabilities a pool must declare in its `requires` for the job to be routed there.
    pub requires: Vec<String>,
    pub actor_id: Option<String>,
}

/// A job submission (topic: any configured job topic). Debug hides secret env values.
#[derive(Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct JobRequest {
    pub job_id: String,
    /// The job topic. The scheduler overwrites it with the topic the record was read from.
    pub topic: String,
    pub tenant_id: String,
    pub principal_id: Option<String>,
    pub priority: Priority,
    pub labels: BTreeMap<String, String>,
    /// Environment for the worker. Keys starting with `$` are secret: never logged or shown.
    pub env: BTreeMap<String, String>,
    #[serde(with = "serde_bytes_compat")]
    pub payload: Vec<u8>,
    pub budget: Budget,
    pub meta: JobMeta,
    pub workflow_id: Option<String>,
    pub step_index: Option<i32>,
    /// Boxed: most jobs have none, and every job in memory would carry its size.
    pub compensation: Option<Box<JobTemplate>>,
    pub submitted_at: Millis,
    /// W3C `traceparent` of the submission (the record's header, else this field), kept only
    /// when valid: the scheduler's spans for the job and its dispatches continue this trace.
    pub traceparent: Option<String>,
    /// Run no earlier than this (epoch ms, scheduler time): until then the job waits
    /// DELAYED (SPEC §9). None, or a time already passed, runs it now.
    pub not_before: Option<Millis>,
    /// Jobs of its tenant it waits for, BLOCKED, until `dependency_condition` holds (SPEC
    /// §11).
    #[serde(default)]
    pub depends_on: Vec<String>,
    #[serde(default)]
    pub dependency_condition: DependencyCondition,
    /// Longest it waits BLOCKED, from its acceptance; None: `limits.max_dependency_wait_ms`.
    #[serde(default)]
    pub dependency_timeout_ms: Option<i64>,
    /// The batch the job belongs to (SPEC §11): jobs of its tenant submitted with the same
    /// id, `batch_size` of them, whose ends its callbacks wait for.
    #[serde(default)]
    pub batch_id: Option<String>,
    /// How many jobs the batch has: every member names the same count.
    #[serde(default)]
    pub batch_size: Option<i32>,
    /// The job is a callback of this batch of its tenant: it waits BLOCKED until every
    /// member ended, then runs with the counts in `batch_outcome`.
    #[serde(default)]
    pub after_batch: Option<String>,
    /// Set by the scheduler when a callback is released: how its batch ended. A producer
    /// may not set it.
    #[serde(default)]
    pub batch_outcome: Option<BatchOutcome>,
}

/// How a batch's members ended, as its callback is told (SPEC §11).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct BatchOutcome {
    pub batch_id: String,
    /// Members that ended SUCCEEDED.
    pub succeeded: i32,
    /// Members that ended otherwise (failed, cancelled, timed out, denied, quarantined).
    pub failed: i32,
}

/// When a job's dependencies let it run (SPEC §11).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DependencyCondition {
    /// Every dependency SUCCEEDED; any other end fails the job.
    #[default]
    AllSucceeded,
    /// Every dependency ended, however.
    AllTerminal,
    /// One dependency SUCCEEDED; all of them ending otherwise fails the job.
    AnySucceeded,
}

impl DependencyCondition {
    pub fn as_str(self) -> &'static str {
        match self {
            DependencyCondition::AllSucceeded => "ALL_SUCCEEDED",
            DependencyCondition::AllTerminal => "ALL_TERMINAL",
            DependencyCondition::AnySucceeded => "ANY_SUCCEEDED",
        }
    }

    pub fn parse(s: &str) -> Option<DependencyCondition> {
        [
            DependencyCondition::AllSucceeded,
            DependencyCondition::AllTerminal,
            DependencyCondition::AnySucceeded,
        ]
        .into_iter()
        .find(|c| c.as_str().eq_ignore_ascii_case(s))
    }
}

/// What a compensation job looks like before it gets a job id (SPEC §7). Debug hides secret
/// env values.
#[derive(Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct JobTemplate {
    pub topic: String,
    pub priority: Priority,
    pub labels: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    #[serde(with = "serde_bytes_compat")]
    pub payload: Vec<u8>,
    pub budget: Budget,
    pub meta: JobMeta,
}

/// The marker for secret env values in every view and export.
pub const HIDDEN: &str = "*hidden*";

/// True when an env key names a secret (`$` prefix).
pub fn is_secret_key(key: &str) -> bool {
    key.starts_with('$')
}

/// At most `max` characters of `s`, with control characters replaced, for messages that
/// quote producer input (keys, ids) without letting it flood a log line or a terminal.
pub fn truncate_for_display(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .take(max)
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect();
    if s.chars().count() > max {
        out.push('…');
    }
    out
}

/// A copy of `env` with secret values replaced by [`HIDDEN`].
pub fn redact_env(env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    env.iter()
        .map(|(k, v)| {
            let v = if is_secret_key(k) {
                HIDDEN.to_owned()
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect()
}

// Written out so that a request in a log line or a panic message never shows a secret.
impl fmt::Debug for JobRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobRequest")
            .field("job_id", &self.job_id)
            .field("topic", &self.topic)
            .field("tenant_id", &self.tenant_id)
            .field("principal_id", &self.principal_id)
            .field("priority", &self.priority)
            .field("labels", &self.labels)
            .field("env", &redact_env(&self.env))
            .field("payload_bytes", &self.payload.len())
            .field("budget", &self.budget)
            .field("meta", &self.meta)
            .field("workflow_id", &self.workflow_id)
            .field("step_index", &self.step_index)
            .field("compensation", &self.compensation)
            .field("submitted_at", &self.submitted_at)
            .field("traceparent", &self.traceparent)
            .field("not_before", &self.not_before)
            .field("depends_on", &self.depends_on)
            .field("dependency_condition", &self.dependency_condition)
            .field("dependency_timeout_ms", &self.dependency_timeout_ms)
            .field("batch_id", &self.batch_id)
            .field("batch_size", &self.batch_size)
            .field("after_batch", &self.after_batch)
            .field("batch_outcome", &self.batch_outcome)
            .finish()
    }
}

impl fmt::Debug for JobTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobTemplate")
            .field("topic", &self.topic)
            .field("priority", &self.priority)
            .field("labels", &self.labels)
            .field("env", &redact_env(&self.env))
            .field("payload_bytes", &self.payload.len())
            .field("budget", &self.budget)
            .field("meta", &self.meta)
            .finish()
    }
}

impl JobRequest {
    /// The request as it may be shown or exported: secret env values hidden.
    pub fn redacted(&self) -> JobRequest {
        let mut r = self.clone();
        r.env = redact_env(&self.env);
        if let Some(c) = r.compensation.as_mut() {
            c.env = redact_env(&c.env);
        }
        r
    }
}

/// Final status a worker reports for an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ResultStatus {
    Succeeded,
    FailedRetryable,
    FailedFatal,
    Cancelled,
}

impl ResultStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ResultStatus::Succeeded => "SUCCEEDED",
            ResultStatus::FailedRetryable => "FAILED_RETRYABLE",
            ResultStatus::FailedFatal => "FAILED_FATAL",
            ResultStatus::Cancelled => "CANCELLED",
        }
    }
}

/// Describes a job's output without carrying it; the output policy reads this.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ResultMeta {
    pub size_bytes: Option<i64>,
    pub content_type: Option<String>,
    pub labels: BTreeMap<String, String>,
}

/// A worker began an attempt (topic `ksched.results`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct JobStarted {
    pub job_id: String,
    pub attempt: i32,
    pub worker_id: String,
    pub started_at: Millis,
}

/// Progress of a running attempt (topic `ksched.results`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct JobProgress {
    pub job_id: String,
    pub attempt: i32,
    pub worker_id: String,
    /// Fraction done, 0.0 to 1.0.
    pub progress: f64,
    pub message: Option<String>,
    pub sent_at: Millis,
}

/// The outcome of an attempt (topic `ksched.results`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobResult {
    pub job_id: String,
    pub attempt: i32,
    pub worker_id: String,
    pub status: ResultStatus,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub result_ptr: Option<String>,
    pub result_meta: ResultMeta,
    pub execution_ms: i64,
    pub finished_at: Millis,
}

impl JobResult {
    /// Attempt `attempt` of `job_id` succeeded on `worker_id` at `finished_at`, after
    /// `execution_ms`, with no output described.
    pub fn succeeded(
        job_id: impl Into<String>,
        attempt: i32,
        worker_id: impl Into<String>,
        execution_ms: i64,
        finished_at: Millis,
    ) -> JobResult {
        JobResult {
            job_id: job_id.into(),
            attempt,
            worker_id: worker_id.into(),
            status: ResultStatus::Succeeded,
            error_code: None,
            error_message: None,
            result_ptr: None,
            result_meta: ResultMeta::default(),
            execution_ms,
            finished_at,
        }
    }
}

/// A worker's periodic report (topic `ksched.heartbeats`, key worker_id).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Heartbeat {
    pub worker_id: String,
    pub pool: String,
    pub active_jobs: i32,
    /// 0 means no limit.
    pub max_parallel_jobs: i32,
    /// Percent, 0 to 100.
    pub cpu_load: f64,
    /// Percent, 0 to 100.
    pub gpu_utilization: f64,
    /// Percent of memory in use, 0 to 100.
    pub memory_load: f64,
    /// Free memory in bytes, for the capacity strategy; None if the worker does not say.
    pub memory_free_bytes: Option<i64>,
    pub capabilities: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// Partitions of the pool's dispatch topic this worker consumes.
    pub owned_partitions: Vec<i32>,
    /// Jobs (job_id) the worker is running now; evidence for the reconciler.
    pub active_job_ids: Vec<String>,
    /// The worker is draining: it finishes what it runs and takes nothing new.
    pub draining: bool,
    pub sent_at: Millis,
}

/// Cancel a job (topic `ksched.control`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CancelJob {
    pub job_id: String,
    /// The tenant the requester acts for. None means an operator (no tenant check).
    pub tenant_id: Option<String>,
    pub principal_id: String,
    pub reason: Option<String>,
    pub requested_at: Millis,
    /// Cancel this batch of the tenant instead (`job_id` is then empty): its members that
    /// have not started are cancelled and its callbacks fail (SPEC §11). `tenant_id` names
    /// the batch's tenant.
    #[serde(default)]
    pub batch_id: Option<String>,
}

/// Approve a job waiting in APPROVAL_REQUIRED (topic `ksched.control`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ApproveJob {
    pub job_id: String,
    /// Must equal the job_hash journaled when approval was required.
    pub job_hash: String,
    /// Must equal the policy snapshot id journaled when approval was required.
    pub policy_snapshot: String,
    pub approver: String,
    pub comment: Option<String>,
    pub requested_at: Millis,
}

/// Reject a job waiting in APPROVAL_REQUIRED (topic `ksched.control`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RejectJob {
    pub job_id: String,
    pub approver: String,
    pub reason: Option<String>,
    pub requested_at: Millis,
}

/// Submit a dead-lettered job again, as a new job running the same request and payload
/// (topic `ksched.control`, key job_id).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RedriveJob {
    /// The dead-lettered job (FAILED, TIMEOUT or DENIED).
    pub job_id: String,
    /// The new job's id; no job may have it yet.
    pub new_job_id: String,
    /// The tenant the requester acts for (it must own the job); None for an operator.
    pub tenant_id: Option<String>,
    pub principal_id: String,
    pub reason: Option<String>,
    pub requested_at: Millis,
}

/// What a schedule does when its previous run has not ended by its next firing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ScheduleOverlap {
    /// The firing is skipped.
    #[default]
    Skip,
    /// One firing waits for the previous run to end; further ones are skipped.
    BufferOne,
    /// Every firing runs, whatever runs already.
    AllowAll,
    /// The previous run is cancelled, and the firing runs.
    CancelPrevious,
}

/// What a schedule does with firings it missed (ksched down, the schedule paused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ScheduleCatchUp {
    /// Missed firings are skipped.
    None,
    /// The latest missed firing runs (unless one on time does), the others are skipped.
    #[default]
    Last,
    /// Every missed firing within `catch_up_window_ms` runs, in order.
    All,
}

/// What a schedule is: when it fires, what it submits, and how it treats overlaps and misses
/// (SPEC §9).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ScheduleSpec {
    /// A cron expression: 5 fields (minute granularity) or 6 (seconds first), or @yearly,
    /// @monthly, @weekly, @daily, @hourly. Exactly one of `cron` and `interval_ms`.
    pub cron: Option<String>,
    /// A fixed interval in ms, counted from `start_at` (or the creation).
    pub interval_ms: Option<i64>,
    /// The IANA time zone the cron expression is read in. Default UTC.
    pub time_zone: String,
    /// The job each firing submits (its topic decides the shard and the pools).
    pub template: JobTemplate,
    pub overlap: ScheduleOverlap,
    pub catch_up: ScheduleCatchUp,
    /// With `catch_up: ALL`, how far back missed firings still run. Default 86400000 (a day).
    pub catch_up_window_ms: i64,
    /// Each firing's job waits up to this long after its time (the same for a given firing,
    /// derived from the schedule and the time). Default 0.
    pub jitter_ms: i64,
    /// No firing before this time.
    pub start_at: Option<Millis>,
    /// No firing after this time.
    pub end_at: Option<Millis>,
    /// Created paused.
    pub paused: bool,
}

/// What a [`ScheduleCommand`] asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ScheduleAction {
    #[default]
    Create,
    Update,
    Pause,
    Resume,
    /// Fire once now, outside the schedule's times.
    Trigger,
    Delete,
}

impl ScheduleAction {
    pub fn as_str(self) -> &'static str {
        match self {
            ScheduleAction::Create => "CREATE",
            ScheduleAction::Update => "UPDATE",
            ScheduleAction::Pause => "PAUSE",
            ScheduleAction::Resume => "RESUME",
            ScheduleAction::Trigger => "TRIGGER",
            ScheduleAction::Delete => "DELETE",
        }
    }
}

/// Creates, changes, pauses, resumes, triggers or deletes a schedule (topic
/// `ksched.control`, key `<tenant>:<schedule_id>`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ScheduleCommand {
    /// The schedule's name within its tenant.
    pub schedule_id: String,
    pub tenant_id: String,
    pub action: ScheduleAction,
    /// For CREATE and UPDATE: the whole schedule.
    pub spec: Option<ScheduleSpec>,
    pub principal_id: String,
    pub reason: Option<String>,
    pub requested_at: Millis,
}

/// Move a DELAYED job to another time (topic `ksched.control`, key job_id).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RescheduleJob {
    pub job_id: String,
    /// Its new time (epoch ms); one already passed releases it at the next Tick.
    pub not_before: Millis,
    /// The tenant the requester acts for (it must own the job); None for an operator.
    pub tenant_id: Option<String>,
    pub principal_id: String,
    pub reason: Option<String>,
    pub requested_at: Millis,
}

/// Advances the scheduler's timers (topic `ksched.control`). Its Kafka timestamp is the time.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Tick {
    /// Who appended it (the ticker's instance id), for audit.
    pub source: String,
    pub issued_at: Millis,
    /// The time up to which every input that could prevent a timeout has been read (the
    /// minimum over the evidence partitions of what the processor read there), set by the
    /// processor when it journals the Tick: timers, worker loss and breaker cool-downs are
    /// judged at this time, never later. Whatever a producer writes here is replaced. None
    /// in journals written before it existed: those Ticks judged at their log time.
    pub watermark: Option<Millis>,
}

/// Limits attached to a job by policy and config; carried in its Dispatch.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Constraints {
    pub max_retries: Option<i32>,
    pub max_concurrent_jobs: Option<i32>,
    pub max_runtime_ms: Option<i64>,
    pub deadline_ms: Option<i64>,
    pub labels: BTreeMap<String, String>,
}

/// A job sent to a worker (topic `ksched.dispatch.<pool>`, key worker_id).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Dispatch {
    pub job: JobRequest,
    pub attempt: i32,
    pub worker_id: String,
    pub pool: String,
    pub constraints: Constraints,
    /// Absolute deadline of the job, if it has one.
    pub deadline_at: Option<Millis>,
    pub dispatched_at: Millis,
    /// The results partition to write JobStarted, JobProgress and JobResult to (the
    /// partition the job's shard reads, the same for every dispatch to one worker); None: any
    /// partition, chosen by the job id key.
    pub reply_partition: Option<i32>,
}

/// Tells a worker to stop an attempt (topic `ksched.dispatch.<pool>`, key worker_id).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CancelDispatch {
    pub job_id: String,
    pub attempt: i32,
    pub worker_id: String,
    pub pool: String,
    pub reason: String,
    pub at: Millis,
}

/// A job (or an input record) the scheduler gave up on (topic `ksched.dlq`, key job_id).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Empty when the record could not be decoded far enough to know it.
    pub job_id: String,
    pub topic: String,
    pub tenant_id: String,
    pub reason_code: String,
    pub reason: String,
    /// The job state when it was dead-lettered, or empty for a malformed record.
    pub last_state: String,
    pub attempts: i32,
    pub cause_topic: String,
    pub cause_partition: i32,
    pub cause_offset: i64,
    pub at: Millis,
    /// For `dependency_failed`: the dependency that failed the job.
    #[serde(default)]
    pub related_job_id: Option<String>,
}

/// Serde adapter so `Vec<u8>` fields serialize as bytes (Avro `bytes`), not as a sequence.
pub(crate) mod serde_bytes_compat {
    use serde::{Deserializer, Serializer, de};

    pub(crate) fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<u8>, E> {
                Ok(v.as_bytes().to_vec())
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(b) = seq.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(out)
            }
        }
        d.deserialize_byte_buf(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_secret_env_values_and_the_payload() {
        let mut r = JobRequest {
            job_id: "j".into(),
            payload: b"payload-bytes".to_vec(),
            ..JobRequest::default()
        };
        r.env.insert("$TOKEN".into(), "s3cret".into());
        r.env.insert("MODE".into(), "fast".into());
        let mut c = JobTemplate::default();
        c.env.insert("$UNDO".into(), "undo-s3cret".into());
        r.compensation = Some(Box::new(c));
        let text = format!("{r:?} {:#?}", r);
        for hidden in ["s3cret", "undo-s3cret", "payload-bytes"] {
            assert!(!text.contains(hidden), "{hidden} in {text}");
        }
        assert!(text.contains("fast") && text.contains(HIDDEN));
    }
}
