//! The records the projection holds: jobs, workers, breakers, sagas, idempotency keys,
//! queue keys and timers.

use std::collections::{BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::events::{CircuitState, JobState, Reconfigure, SagaOutcome};
use crate::records::{Constraints, Heartbeat, JobRequest, JobTemplate, Millis, ResultMeta};
use crate::rules::Rules;

/// The rules and policy bundle in force.
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveConfig {
    pub raw: Reconfigure,
    pub rules: Rules,
}

/// One line of a job's history: what happened, when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryItem {
    pub at: Millis,
    /// The event's name: borrowed when the line is written (no copy per event), owned when
    /// it is read back.
    pub event: std::borrow::Cow<'static, str>,
    pub detail: String,
}

/// Most lines a job's history keeps (see `State::write_history`).
pub const HISTORY_MAX: u32 = 200;

/// The history lines written since the last checkpoint, in order, as the owner of the
/// state persists them: runs of one job's consecutive lines in one journal entry, each
/// stored as one value ([`HistoryLines::runs`]). A run never spans two entries, so the
/// runs, and the store's keys, are the same whether the entries were decided live or
/// replayed, whatever the checkpoints between them.
///
/// A job's lines are numbered from 0, and a new line is either the next number or the
/// number of the job's last line, which it replaces (a run of progress keeps one line; past
/// [`HISTORY_MAX`], the last slot keeps the latest line). So a run holds lines `first,
/// first + 1, ...` with no number twice, and only its first line can replace a line written
/// before it (the job's last, in an earlier run).
///
/// The lines' names and texts are written one after another into one buffer, not a string
/// each: a replay writes a line for nearly every event. A line replaced inside its run leaves its text behind in the buffer until the
/// set is dropped.
#[derive(Debug, Clone, Default)]
pub struct HistoryLines {
    text: String,
    lines: Vec<LineAt>,
    runs: Vec<Run>,
    /// The last run may take more lines (no entry began since it did).
    open: bool,
}

/// Where a line of [`HistoryLines`] is: its time, and its name and text in the buffer
/// (`start..name_end`, `name_end..end`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct LineAt {
    at: Millis,
    start: usize,
    name_end: usize,
    end: usize,
}

/// A run of [`HistoryLines`]: its job, its first line's number, and where its lines end in
/// `lines` (they start where the run before ends).
#[derive(Debug, Clone, PartialEq)]
struct Run {
    job_id: String,
    first: u32,
    end: usize,
}

/// One line of [`HistoryLines`], borrowed. It serializes as the [`HistoryItem`] it reads
/// back as.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HistoryLine<'a> {
    pub at: Millis,
    pub event: &'a str,
    pub detail: &'a str,
}

impl HistoryLine<'_> {
    pub fn to_item(&self) -> HistoryItem {
        HistoryItem {
            at: self.at,
            event: std::borrow::Cow::Owned(self.event.to_owned()),
            detail: self.detail.to_owned(),
        }
    }
}

/// The lines of one run of [`HistoryLines`]. It serializes as the `Vec<HistoryItem>` it
/// reads back as: one stored value.
#[derive(Debug, Clone, Copy)]
pub struct RunLines<'a> {
    text: &'a str,
    lines: &'a [LineAt],
}

impl<'a> RunLines<'a> {
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    pub fn iter(self) -> impl Iterator<Item = HistoryLine<'a>> + 'a {
        let text = self.text;
        self.lines.iter().map(move |l| HistoryLine {
            at: l.at,
            event: &text[l.start..l.name_end],
            detail: &text[l.name_end..l.end],
        })
    }
}

impl Serialize for RunLines<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl HistoryLines {
    /// Empty, with room for as many lines, runs and text as `self` holds (a replay's
    /// checkpoint holds tens of thousands of lines, and growing the lists to that size
    /// again, by doubling, was a few per cent of a replay).
    pub fn sized_like(&self) -> HistoryLines {
        HistoryLines {
            text: String::with_capacity(self.text.len()),
            lines: Vec::with_capacity(self.lines.len()),
            runs: Vec::with_capacity(self.runs.len()),
            open: false,
        }
    }

    /// A journal entry begins: its lines start new runs.
    pub fn begin_entry(&mut self) {
        self.open = false;
    }

    /// Adds line `seq` of job `job_id`.
    pub fn push(&mut self, job_id: &str, seq: u32, item: HistoryItem) {
        self.push_with(job_id, seq, item.at, &item.event, |text| {
            text.push_str(&item.detail);
        });
    }

    /// Adds line `seq` of job `job_id`, named `event`, whose text `describe` appends to the
    /// string it is given. The line extends the last run when that run is the same job's,
    /// in the same entry, and ends at `seq` (replaced) or at `seq - 1`; otherwise it starts
    /// a run.
    pub fn push_with(
        &mut self,
        job_id: &str,
        seq: u32,
        at: Millis,
        event: &str,
        describe: impl FnOnce(&mut String),
    ) {
        let start = self.text.len();
        self.text.push_str(event);
        let name_end = self.text.len();
        describe(&mut self.text);
        let line = LineAt {
            at,
            start,
            name_end,
            end: self.text.len(),
        };
        let first_of_run = self
            .runs
            .len()
            .checked_sub(2)
            .map_or(0, |i| self.runs[i].end);
        let open = std::mem::replace(&mut self.open, true);
        if let Some(run) = self.runs.last_mut()
            && open
            && run.job_id == job_id
        {
            // A run is never empty: its last line is `first + len - 1`.
            let last = run.first + (run.end - first_of_run - 1) as u32;
            if seq == last {
                self.lines[run.end - 1] = line;
                return;
            }
            if seq == last + 1 {
                self.lines.push(line);
                run.end += 1;
                return;
            }
        }
        self.lines.push(line);
        self.runs.push(Run {
            job_id: job_id.to_owned(),
            first: seq,
            end: self.lines.len(),
        });
    }

    /// The runs in the order they were written: job id, first line's number, lines.
    pub fn runs(&self) -> impl Iterator<Item = (&str, u32, RunLines<'_>)> {
        let mut start = 0;
        self.runs.iter().map(move |r| {
            let lines = RunLines {
                text: &self.text,
                lines: &self.lines[start..r.end],
            };
            start = r.end;
            (r.job_id.as_str(), r.first, lines)
        })
    }

    /// Every line held, in the order written, with its job and number. A run's first line
    /// may replace an earlier run's last (the same job and number); a reader keeps the later.
    pub fn lines(&self) -> impl Iterator<Item = (&str, u32, HistoryLine<'_>)> {
        self.runs().flat_map(|(job_id, first, lines)| {
            (first..)
                .zip(lines.iter())
                .map(move |(seq, line)| (job_id, seq, line))
        })
    }

    /// Lines held (a line replaced inside its run counts once).
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Runs held: the values a checkpoint writes.
    pub fn run_count(&self) -> usize {
        self.runs.len()
    }
}

/// A job as the scheduler knows it. Its payload and history are not held here: the payload
/// is written once when the job is accepted and read back when it is dispatched, the history
/// is appended line by line (see [`Dirty`](super::Dirty)), so a backlog of pending jobs costs memory for
/// what decisions read, not for what the jobs carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// The request without its payload (see `payload_len` and `payload_digest`).
    pub request: JobRequest,
    pub payload_len: u64,
    /// First 16 bytes of the payload's SHA-256: a resubmission is "the same job" only with
    /// the same payload.
    pub payload_digest: [u8; 16],
    /// The job whose stored payload this one runs: a redriven job (JobRedriven) reads the
    /// dead-lettered job's, which stays where it was written. None: its own.
    pub payload_of: Option<String>,
    pub job_hash: String,
    pub state: JobState,
    /// Pools the job may run in, in preference order.
    pub pools: Vec<String>,
    /// Attempts dispatched so far (the current attempt's number).
    pub attempt: i32,
    pub constraints: Constraints,
    pub policy_snapshot: Option<String>,
    pub worker_id: Option<String>,
    pub pool: Option<String>,
    pub partition: Option<i32>,
    pub accepted_at: Millis,
    pub updated_at: Millis,
    /// Set while the job sits in its pools' pending queues.
    pub queued_at: Option<Millis>,
    /// When it was first queued. A job with a concurrency key stands in its queues by this
    /// time, so a retry comes back to its place in its key's order.
    pub first_queued_at: Option<Millis>,
    /// Set while the job waits out a retry backoff.
    pub retry_at: Option<Millis>,
    pub dispatched_at: Option<Millis>,
    pub started_at: Option<Millis>,
    /// Last sign of life of the running attempt (start, progress, or a heartbeat listing it).
    pub last_evidence_at: Option<Millis>,
    pub deadline_at: Option<Millis>,
    /// While DELAYED: when it becomes due (its `not_before`, or a reschedule's).
    pub delayed_until: Option<Millis>,
    /// When it left DELAYED (JobReleased): its deadline counts from here, as if submitted
    /// then (SPEC §9).
    pub released_at: Option<Millis>,
    /// Its concurrency key and that key's limit (SPEC §10), as the rules in force said when
    /// it was last queued, and again whenever they change while it is queued or active.
    pub concurrency: Option<KeyLimit>,
    /// While queued and held by its concurrency key past `placement_timeout`: when its
    /// placement timeout started again (a job waits for its key as long as it takes).
    pub placement_from: Option<Millis>,
    pub wait_reason: Option<String>,
    pub progress: Option<f64>,
    pub last_error: Option<String>,
    pub result_ptr: Option<String>,
    pub result_meta: Option<ResultMeta>,
    pub execution_ms: Option<i64>,
    pub dlq_reason: Option<String>,
    /// History lines written so far (the next line's number).
    pub history_lines: u32,
    /// Lines not kept because the history reached its bound (the last slot keeps the
    /// latest).
    pub history_omitted: u32,
    /// The last line is progress (the next progress replaces it).
    pub history_progress: bool,
    /// Priorities gained by aging (SPEC §10) while queued, since it was last queued: it
    /// stands in its queues at [`Job::queue_rank`].
    pub aged: u8,
    /// Since it was BLOCKED (SPEC §11): how its dependencies stand.
    pub awaiting: Option<Box<Awaiting>>,
    /// A job waits (or waited) for this one: its end is told to its dependents
    /// ([`State::settling`](super::State::settling)).
    pub awaited: bool,
}

/// How a BLOCKED job's dependencies stand (SPEC §11).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Awaiting {
    /// The dependencies not ended yet, in id order.
    pub open: Vec<String>,
    /// Dependencies that SUCCEEDED.
    pub succeeded: i32,
    /// Dependencies that ended otherwise.
    pub failed: i32,
}

impl Job {
    /// The rank it stands in its queues at: its priority's, less what aging gave it.
    pub fn queue_rank(&self) -> u8 {
        self.request.priority.rank().saturating_sub(self.aged)
    }

    /// The job's effective memory demand in bytes (label `memory`: bytes, or with a
    /// Ki/Mi/Gi/K/M/G suffix), for the capacity strategy.
    pub fn memory_demand(&self) -> Option<i64> {
        self.request
            .labels
            .get("memory")
            .and_then(|s| parse_bytes(s))
    }

    /// Retries allowed after the first attempt.
    pub fn max_retries(&self, rules: &Rules) -> i32 {
        self.constraints
            .max_retries
            .unwrap_or(rules.retry.max_retries)
            .max(0)
    }

    /// Longest an attempt may run, if limited.
    pub fn max_runtime_ms(&self) -> Option<i64> {
        self.constraints
            .max_runtime_ms
            .or(self.request.budget.max_runtime_ms)
            .filter(|v| *v > 0)
    }
}

/// Parses `512`, `512Mi`, `2G`, `1.5Gi` into bytes.
pub fn parse_bytes(s: &str) -> Option<i64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "K" | "KB" => 1e3,
        "M" | "MB" => 1e6,
        "G" | "GB" => 1e9,
        "T" | "TB" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let v = n * mult;
    (v.is_finite() && (0.0..9.0e18).contains(&v)).then_some(v as i64)
}

/// A worker as the scheduler knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Worker {
    pub heartbeat: Heartbeat,
    pub joined_at: Millis,
    pub last_seen: Millis,
    pub alive: bool,
    /// Jobs the worker reported running that the scheduler does not count as in flight on it
    /// (e.g. cancelled or timed out but not stopped yet), as of its last heartbeat.
    pub foreign_active: i32,
    /// Memory of jobs dispatched since the last heartbeat, for the capacity strategy.
    pub reserved_memory: i64,
    /// Derived: jobs SCHEDULED, DISPATCHED or RUNNING on this worker.
    #[serde(skip)]
    pub inflight: BTreeSet<String>,
}

impl Worker {
    /// `active_jobs` in the score: the scheduler's own in-flight dispatches to this worker,
    /// which change at every dispatch and every result, plus what the worker runs that the
    /// scheduler no longer counts. (A heartbeat figure plus "dispatches since" would keep a
    /// worker looking full until its next heartbeat after its jobs finished.)
    pub fn effective_active(&self) -> i32 {
        i32::try_from(self.inflight.len())
            .unwrap_or(i32::MAX)
            .saturating_add(self.foreign_active)
    }

    pub fn free_memory(&self) -> Option<i64> {
        self.heartbeat
            .memory_free_bytes
            .map(|m| m.saturating_sub(self.reserved_memory))
    }
}

/// A pool's circuit breaker.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Breaker {
    pub state: CircuitState,
    pub consecutive_failures: i32,
    /// Last results, oldest first; `true` is a failure.
    pub window: VecDeque<bool>,
    pub opened_at: Option<Millis>,
    /// Probe jobs let through while half-open that are still SCHEDULED, DISPATCHED or
    /// RUNNING. A probe that ends any way frees its slot, with a result or without one
    /// (timed out, cancelled, its worker lost), so probes can never hold the pool closed.
    pub probes: BTreeSet<String>,
    pub probe_successes: i32,
}

impl Breaker {
    pub fn failure_ratio(&self) -> f64 {
        if self.window.is_empty() {
            return 0.0;
        }
        self.window.iter().filter(|f| **f).count() as f64 / self.window.len() as f64
    }
}

/// One step of a workflow whose compensation is on the stack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SagaStep {
    pub job_id: String,
    pub tenant_id: String,
    pub principal_id: Option<String>,
    pub compensation: JobTemplate,
    /// The step's topic (None: recorded before it was kept).
    pub topic: Option<String>,
}

/// A workflow's compensation stack and rollback progress.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Saga {
    pub stack: Vec<SagaStep>,
    /// Set once a step failed fatally.
    pub failed_job_id: Option<String>,
    /// The compensation job running now, during rollback.
    pub running: Option<String>,
    pub compensations_submitted: i32,
    /// Compensations that did not succeed (ended another way, or were refused).
    pub compensations_failed: i32,
    pub outcome: Option<SagaOutcome>,
}

impl Saga {
    pub fn rolling_back(&self) -> bool {
        self.failed_job_id.is_some() && self.outcome.is_none()
    }
}

/// The key of a tenant's saga: its tenant and workflow, joined by a character neither may
/// hold (a unit separator: ids with control characters are refused).
pub fn saga_key(tenant: &str, workflow: &str) -> String {
    let mut k = String::with_capacity(tenant.len() + workflow.len() + 1);
    k.push_str(tenant);
    k.push('\u{1f}');
    k.push_str(workflow);
    k
}

/// The key of the saga an event names: its tenant's, or the workflow's alone for a saga
/// begun before sagas were keyed by tenant (`tenant` None).
pub fn saga_key_of(tenant: Option<&str>, workflow: &str) -> String {
    match tenant {
        Some(t) => saga_key(t, workflow),
        None => workflow.to_owned(),
    }
}

/// The key of the saga a recorded step joins: by tenant from decision format 3, by
/// workflow alone before.
pub fn step_saga_key(e: &crate::events::SagaStepRecorded, format: i32) -> String {
    saga_key_of(
        (format >= 3).then_some(e.tenant_id.as_str()),
        &e.workflow_id,
    )
}

/// An idempotency key's owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdempotencyEntry {
    pub job_id: String,
    pub seen_at: Millis,
}

/// What a queued job's placement depends on besides its place in the queue: its tenant and
/// the tenant limit it is held to, the pools it may run in, its placement labels, the worker
/// it prefers and the memory it needs. Within one pass, jobs of one lane are placed or held
/// alike (nothing a pass does frees capacity), so a pass looks at a lane's first job only
/// until it is placed: a lane of 100,000 jobs held by their tenant's limit costs one look.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Lane {
    pub tenant: String,
    pub limit: Option<i32>,
    pub pools: Vec<String>,
    /// Job labels (its own and the policy's) that constrain placement, in order.
    pub placement: Vec<(String, String)>,
    pub preferred_worker: Option<String>,
    pub memory: Option<i64>,
    /// Its concurrency key and limit: the lanes of one key and limit in a pool stand in a
    /// pass as one, their first head ([`crate::state::State::key_groups`]), parked out of
    /// every pass while the key is at its limit ([`crate::state::State::parked`]).
    pub concurrency: Option<KeyLimit>,
}

impl Job {
    /// Its concurrency key and limit under `rules`: the policy's label first, so a key the
    /// policy imposes cannot be escaped by a label of the producer's, then its own.
    pub fn concurrency_under(&self, rules: &crate::rules::Rules) -> Option<KeyLimit> {
        rules.concurrency_of(&self.request.topic, |name| {
            (self.constraints.labels.get(name))
                .or_else(|| self.request.labels.get(name))
                .map(String::as_str)
        })
    }
}

/// A job's concurrency key (its tenant's own), the most jobs of that key that may be
/// SCHEDULED, DISPATCHED or RUNNING at once (`u32::MAX`: no limit), and the rate its jobs
/// may be placed at, if limited.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KeyLimit {
    pub key: String,
    pub limit: u32,
    pub rate: Option<crate::rules::Rate>,
    /// The key takes turns with the tenant's other keys in its share of a pool
    /// ([`crate::rules::ConcurrencyRule::fair`]).
    pub fair: bool,
}

impl KeyLimit {
    /// Whether the key may hold its jobs back (a limit, a rate): only then do its lanes in
    /// a pool stand in a pass as one group, oldest first. A key that only takes turns
    /// leaves its lanes apart, as a job without a key would.
    pub fn holds(&self) -> bool {
        self.limit != u32::MAX || self.rate.is_some()
    }
}

/// A key's token bucket (SPEC §10 rate limits), as GCRA keeps one: the time its next token
/// is due, and how far ahead of it a placement may take one (the burst of the last job
/// that took a token). A key placed at its rate with the bucket empty is held until
/// [`Bucket::free_at`]; a bucket past [`Bucket::full_at`] is full, and forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// Microseconds of log time.
    pub next_token_us: i64,
    pub tolerance_us: i64,
}

impl Bucket {
    /// The first millisecond at which a token may be taken.
    pub fn free_at(&self) -> Millis {
        ceil_ms(self.next_token_us - self.tolerance_us)
    }

    /// The first millisecond at which the bucket is full again (as if it never was used).
    pub fn full_at(&self) -> Millis {
        ceil_ms(self.next_token_us)
    }

    /// When the bucket's state next changes, seen at `clock`: it frees, or it fills.
    pub fn next_change(&self, clock: Millis) -> Millis {
        let free = self.free_at();
        if free > clock { free } else { self.full_at() }
    }
}

fn ceil_ms(us: i64) -> Millis {
    us.div_euclid(1_000) + i64::from(us.rem_euclid(1_000) != 0)
}

/// Position of a job in a pool's pending queue: priority, then age, then job_id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueueKey {
    pub rank: u8,
    pub queued_at: Millis,
    pub job_id: String,
}

/// What a due timer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimerKind {
    Deadline,
    RetryAt,
    PlacementTimeout,
    DispatchTimeout,
    RunningTimeout,
    MaxRuntime,
    /// A queued job gains a priority ([`crate::rules::AgingRule`]).
    Aging,
}

/// A job timer, ordered by due time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timer {
    pub due: Millis,
    pub kind: TimerKind,
    pub job_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(detail: &str) -> HistoryItem {
        HistoryItem {
            at: 0,
            event: "E".into(),
            detail: detail.to_owned(),
        }
    }

    fn runs(h: &HistoryLines) -> Vec<(&str, u32, Vec<&str>)> {
        h.runs()
            .map(|(job, first, lines)| (job, first, lines.iter().map(|l| l.detail).collect()))
            .collect()
    }

    #[test]
    fn a_jobs_consecutive_lines_make_one_run_and_a_replaced_line_keeps_its_place() {
        let mut h = HistoryLines::default();
        h.push("a", 0, item("a0"));
        h.push("a", 1, item("a1"));
        h.push("a", 1, item("a1'")); // replaces the run's last line
        h.push("b", 0, item("b0"));
        h.push("a", 2, item("a2")); // the same job again, after another: a new run
        h.push("a", 2, item("a2'"));
        h.push("a", 3, item("a3"));
        h.push("ab", 0, item("ab0"));
        h.push("ab", 0, item("ab0'"));
        assert_eq!(
            runs(&h),
            vec![
                ("a", 0, vec!["a0", "a1'"]),
                ("b", 0, vec!["b0"]),
                ("a", 2, vec!["a2'", "a3"]),
                ("ab", 0, vec!["ab0'"]),
            ]
        );
        assert_eq!((h.len(), h.run_count()), (6, 4));
        let lines: Vec<(&str, u32)> = h.lines().map(|(j, s, _)| (j, s)).collect();
        assert_eq!(
            lines,
            vec![("a", 0), ("a", 1), ("b", 0), ("a", 2), ("a", 3), ("ab", 0)]
        );
        // A new entry starts new runs, even for the job whose lines came last.
        h.begin_entry();
        h.push("ab", 1, item("ab1"));
        h.push("ab", 2, item("ab2"));
        h.begin_entry();
        h.push("ab", 2, item("ab2'"));
        assert_eq!(
            runs(&h)[4..],
            [("ab", 1, vec!["ab1", "ab2"]), ("ab", 2, vec!["ab2'"])]
        );
        // A run that starts by replacing the job's last line of an earlier run.
        let mut later = h.sized_like();
        later.push("a", 3, item("a3'"));
        later.push("a", 4, item("a4"));
        assert_eq!(runs(&later), vec![("a", 3, vec!["a3'", "a4"])]);
    }

    /// A run is stored as the `Vec<HistoryItem>` the store reads back: the same fields, in
    /// the same order, whatever was replaced in the shared text on the way.
    #[test]
    fn a_runs_lines_serialize_as_the_items_they_read_back_as() {
        let mut h = HistoryLines::default();
        h.push("a", 0, item("a0"));
        h.push_with("a", 1, 7, "JobProgressed", |t| t.push_str("progress 10%"));
        h.push_with("a", 1, 8, "JobProgressed", |t| t.push_str("progress 20%"));
        h.push("b", 0, item(""));
        let stored: Vec<String> = h
            .runs()
            .map(|(_, _, lines)| serde_json::to_string(&lines).unwrap())
            .collect();
        let expected = [
            vec![
                item("a0"),
                HistoryItem {
                    at: 8,
                    event: "JobProgressed".into(),
                    detail: "progress 20%".into(),
                },
            ],
            vec![item("")],
        ];
        let expected: Vec<String> = expected
            .iter()
            .map(|items| serde_json::to_string(items).unwrap())
            .collect();
        assert_eq!(stored, expected);
        let read: Vec<HistoryItem> = h.lines().map(|(_, _, l)| l.to_item()).collect();
        assert_eq!(read[1].detail, "progress 20%");
        assert_eq!(read.len(), 3);
    }
}

/// A schedule (SPEC §9): its spec, who made it, and where its firings stand.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Schedule {
    pub schedule_id: String,
    pub tenant_id: String,
    /// Who created or last changed it; its jobs are submitted as this principal.
    pub principal_id: String,
    pub spec: crate::records::ScheduleSpec,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// Its next firing (before jitter); None when it has ended.
    pub next_slot: Option<Millis>,
    pub paused: bool,
    /// The job of its latest firing, which the overlap policy looks at.
    pub last_job: Option<String>,
    /// A firing waiting for the previous run to end (overlap BUFFER_ONE).
    pub buffered: Option<Millis>,
    /// Its latest firings, newest last (at most [`Schedule::RECENT`]).
    pub recent: Vec<Firing>,
    pub submitted: u64,
    pub skipped: u64,
    pub missed: u64,
    pub refused: u64,
}

impl Schedule {
    /// How many firings a schedule remembers.
    pub const RECENT: usize = 10;

    /// Whether a Tick should look at it by `t`: active, with a firing due.
    pub fn due_by(&self, t: Millis) -> bool {
        !self.paused && self.next_slot.is_some_and(|s| s <= t)
    }
}

/// One firing of a schedule, as its list of recent firings shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Firing {
    pub slot: Millis,
    /// SUBMITTED, SKIPPED, BUFFERED, MISSED or REFUSED.
    pub outcome: String,
    pub job_id: Option<String>,
    pub triggered: bool,
    pub detail: String,
}

/// An open debounce window (SPEC §10): the job of its key waiting to run, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Debounce {
    /// The job waiting DELAYED under the key (the last accepted).
    pub job_id: String,
    /// When the run of jobs began: the first one's acceptance (log time).
    pub first_at: Millis,
    /// When the waiting job is due: the window closes then.
    pub due: Millis,
}
