//! Each event's text, in one place: job histories in the projection, `ksched audit job`,
//! `ksched journal tail` and `ksched dev` all say the same thing about the same event.

use std::fmt::Write;

use crate::apply::accepted_request;
use crate::events::*;

/// How many candidates a placement's text names (the event keeps them all, up to its bound).
const NAMED_CANDIDATES: usize = 3;

impl Event {
    /// One line saying what the event means. `input` is the entry's input (a JobAccepted
    /// that does not carry its request takes the topic from it).
    pub fn describe(&self, input: &Input) -> String {
        let mut s = String::new();
        self.describe_into(input, &mut s);
        s
    }

    /// [`Event::describe`], appended to `out`. A replay writes a line for nearly every
    /// event, and appending them all to one buffer spares a string, and its regrowth as the
    /// pieces are written, per line.
    pub fn describe_into(&self, input: &Input, out: &mut String) {
        // Writing to a `String` cannot fail.
        let _ = self.write_description(input, out);
    }

    fn write_description(&self, input: &Input, out: &mut String) -> std::fmt::Result {
        match self {
            Event::JobAccepted(a) => {
                let request = accepted_request(a, input);
                let topic = request.map_or("?", |r| r.topic.as_str());
                push(out, &["accepted from ", topic, " -> pools ["]);
                join(out, &a.pools, ", ");
                out.push(']');
                // A schedule's job names its schedule and firing (ScheduleFired precedes it).
                if let Some(r) = request
                    && let Some(schedule) = r.labels.get(crate::schedule::LABEL_SCHEDULE)
                    && crate::schedule::is_firing_job_id(&a.job_id)
                {
                    let slot = r
                        .labels
                        .get(crate::schedule::LABEL_SLOT)
                        .map_or("?", |s| s.as_str());
                    push(out, &["; fired by schedule ", schedule, " for ", slot]);
                }
                for n in &a.routing_notes {
                    write!(out, "; {n}")?;
                }
            }
            Event::JobDuplicate(d) => match d.kind {
                DuplicateKind::SameJobId => {
                    out.push_str("same job_id and content submitted again; ignored");
                }
                DuplicateKind::ConflictingJobId => {
                    out.push_str("same job_id with different content; dead-lettered");
                }
                DuplicateKind::IdempotencyKey => write!(
                    out,
                    "job {} reused idempotency key {} of {}; ignored",
                    d.job_id,
                    d.idempotency_key.as_deref().unwrap_or(""),
                    d.existing_job_id
                )?,
                DuplicateKind::UniqueKey => write!(
                    out,
                    "job {} refused: unique key {} was taken by {} within its topic's window",
                    d.job_id,
                    d.idempotency_key.as_deref().unwrap_or(""),
                    d.existing_job_id
                )?,
            },
            Event::PolicyEvaluated(p) => {
                write!(out, "{:?}", p.verdict)?;
                push(out, &[" under policy snapshot ", &p.snapshot_id]);
                if !p.reasons.is_empty() {
                    out.push_str(": ");
                    join(out, &p.reasons, "; ");
                }
                let c = &p.constraints;
                let limits = [
                    ("max_retries", c.max_retries.map(i64::from)),
                    ("max_concurrent_jobs", c.max_concurrent_jobs.map(i64::from)),
                    ("max_runtime_ms", c.max_runtime_ms),
                    ("deadline_ms", c.deadline_ms),
                ];
                let mut first = true;
                for (name, v) in limits {
                    if let Some(v) = v {
                        write!(out, "{}{name} {v}", if first { " (" } else { ", " })?;
                        first = false;
                    }
                }
                if !first {
                    out.push(')');
                }
            }
            Event::JobQueued(q) => {
                out.push_str("queued in [");
                join(out, &q.pools, ", ");
                push(out, &["] at priority ", q.priority.as_str()]);
            }
            Event::JobWaiting(w) => write!(out, "waiting: {} ({})", w.reason_code, w.detail)?,
            Event::JobScheduled(s) => {
                let total = s.candidates.len() + usize::try_from(s.candidates_omitted).unwrap_or(0);
                out.push_str("attempt ");
                int(out, s.attempt);
                push(
                    out,
                    &[
                        " -> ",
                        &s.worker_id,
                        " in ",
                        &s.pool,
                        " by ",
                        &s.strategy,
                        "; ",
                    ],
                );
                int(out, total);
                out.push_str(" candidates");
                let scored = s.candidates.iter().filter_map(|c| Some((c, c.score?)));
                for (i, (c, score)) in scored.take(NAMED_CANDIDATES).enumerate() {
                    let sep = if i == 0 { " (scores: " } else { ", " };
                    write!(out, "{sep}{} {score:.2}", c.worker_id)?;
                }
                if s.candidates.iter().any(|c| c.score.is_some()) {
                    out.push(')');
                }
                if !s.notes.is_empty() {
                    out.push_str("; ");
                    join(out, &s.notes, "; ");
                }
            }
            Event::JobDispatched(d) => {
                out.push_str("attempt ");
                int(out, d.attempt);
                push(out, &[" dispatched to ", &d.worker_id, " (partition "]);
                int(out, d.partition);
                out.push(')');
            }
            Event::JobRunning(r) => {
                out.push_str("attempt ");
                int(out, r.attempt);
                push(out, &[" running on ", &r.worker_id]);
                if let Some(from) = &r.reassigned_from {
                    write!(out, " (reassigned from {from})")?;
                }
            }
            Event::JobProgressed(p) => {
                write!(out, "progress {:.0}%", p.progress * 100.0)?;
                if let Some(m) = &p.message {
                    write!(out, " {m}")?;
                }
            }
            Event::JobSucceeded(s) => {
                out.push_str("attempt ");
                int(out, s.attempt);
                push(out, &[" succeeded on ", &s.worker_id, " in "]);
                int(out, s.execution_ms);
                out.push_str(" ms");
            }
            Event::JobQuarantined(q) => {
                out.push_str("output quarantined: ");
                join(out, &q.reasons, "; ");
            }
            Event::JobRetrying(r) => {
                write!(out, "attempt {} failed ({}", r.attempt, r.error_code)?;
                if let Some(m) = &r.error_message {
                    write!(out, ": {m}")?;
                }
                write!(out, "); retry in {} ms", r.backoff_ms)?;
            }
            Event::JobFailed(f) => {
                write!(out, "failed: {}", f.reason_code)?;
                if let Some(m) = &f.error_message {
                    write!(out, " ({m})")?;
                }
            }
            Event::JobCancelled(c) => {
                write!(out, "cancelled by {}", c.principal_id)?;
                if let Some(r) = &c.reason {
                    write!(out, ": {r}")?;
                }
            }
            Event::JobTimedOut(t) => write!(out, "timed out: {} ({})", t.reason_code, t.detail)?,
            Event::JobDenied(d) => {
                write!(out, "denied: {}", d.reason_code)?;
                if let Some(by) = &d.by {
                    write!(out, " by {by}")?;
                }
                if !d.reasons.is_empty() {
                    out.push_str(" (");
                    join(out, &d.reasons, "; ");
                    out.push(')');
                }
            }
            Event::ApprovalRequested(a) => {
                out.push_str("approval required (");
                join(out, &a.reasons, "; ");
                write!(
                    out,
                    "); job hash {}, policy snapshot {}",
                    a.job_hash, a.snapshot_id
                )?;
            }
            Event::JobApproved(a) => {
                write!(out, "approved by {}", a.approver)?;
                if let Some(c) = &a.comment {
                    write!(out, ": {c}")?;
                }
            }
            Event::DispatchCancelled(d) => write!(
                out,
                "CancelDispatch sent to {} for attempt {} ({})",
                d.worker_id, d.attempt, d.reason
            )?,
            Event::DeadLettered(d) => {
                let d = &d.dead_letter;
                write!(
                    out,
                    "dead-lettered {}: {} (cause {}/{}@{})",
                    d.reason_code, d.reason, d.cause_topic, d.cause_partition, d.cause_offset
                )?;
            }
            Event::CommandRejected(r) => write!(
                out,
                "{} refused: {} ({})",
                r.input_kind, r.reason_code, r.reason
            )?,
            Event::WorkerUpdated(u) => {
                let hb = &u.heartbeat;
                let verb = if u.joined { "joined" } else { "heartbeat" };
                write!(
                    out,
                    "worker {} {verb} in pool {}: {} of {} jobs, cpu {:.0}%, partitions {:?}{}",
                    u.worker_id,
                    hb.pool,
                    hb.active_jobs,
                    hb.max_parallel_jobs,
                    hb.cpu_load,
                    hb.owned_partitions,
                    if hb.draining { ", draining" } else { "" }
                )?;
            }
            Event::WorkerLost(l) => write!(
                out,
                "worker {} of pool {} lost (last seen at {}); {} jobs on it",
                l.worker_id,
                l.pool,
                l.last_seen,
                l.job_ids.len()
            )?,
            Event::CircuitChanged(c) => write!(
                out,
                "circuit of pool {} {:?} -> {:?}: {}",
                c.pool, c.from, c.to, c.reason
            )?,
            Event::SagaStepRecorded(s) => write!(
                out,
                "workflow {}: compensation of {} recorded",
                s.workflow_id, s.job_id
            )?,
            Event::SagaRollbackStarted(s) => write!(
                out,
                "workflow {}: {} failed, rolling back {} steps",
                s.workflow_id, s.failed_job_id, s.steps
            )?,
            Event::SagaCompensationSubmitted(s) => write!(
                out,
                "workflow {}: compensation {} submitted for {}",
                s.workflow_id, s.job_id, s.for_job_id
            )?,
            Event::SagaFinished(s) => {
                write!(
                    out,
                    "workflow {} {:?}: {}",
                    s.workflow_id, s.outcome, s.detail
                )?;
            }
            Event::SagaCompensationEnded(s) => write!(
                out,
                "workflow {}: compensation {} {}: {}",
                s.workflow_id,
                s.job_id,
                if s.succeeded {
                    "succeeded"
                } else {
                    "did not succeed"
                },
                s.detail
            )?,
            Event::IdempotencyPruned(p) => write!(
                out,
                "idempotency keys first seen before {} forgotten",
                p.before
            )?,
            Event::ConfigApplied(c) => write!(
                out,
                "rules {} and policy snapshot {} in force",
                c.config.rules_id, c.config.policy_snapshot
            )?,
            Event::BreakerCounted(b) => write!(
                out,
                "counted as a {} in pool {}'s circuit breaker",
                if b.failure { "failure" } else { "success" },
                b.pool
            )?,
            Event::ClockGap(g) => write!(
                out,
                "no input could be read for {} ms: evidence-based timeouts count from {}",
                g.to - g.from,
                g.to
            )?,
            Event::WorkerForgotten(w) => write!(
                out,
                "worker {} of pool {} forgotten (last seen at {})",
                w.worker_id, w.pool, w.last_seen
            )?,
            Event::JobRedriven(r) => {
                write!(
                    out,
                    "{} redriven as {} by {}",
                    r.job_id, r.new_job_id, r.principal_id
                )?;
                if let Some(why) = &r.reason {
                    write!(out, ": {why}")?;
                }
            }
            Event::JobDelayed(d) => {
                out.push_str("delayed until ");
                time(out, d.not_before);
            }
            Event::JobDebounced(d) => {
                write!(out, "debounced on key {:?}", d.key)?;
                if let Some(old) = &d.replaces {
                    write!(out, ", replacing {old}")?;
                }
                out.push_str("; runs at ");
                time(out, d.due);
                out.push_str(" unless a later job of the key replaces it (its run began at ");
                time(out, d.first_at);
                out.push(')');
            }
            Event::JobAged(a) => {
                write!(
                    out,
                    "aged to {} in its queues, having waited since ",
                    a.priority.as_str()
                )?;
                time(out, a.queued_at);
            }
            Event::DebouncesClosed(c) => {
                out.push_str("debounce windows due by ");
                time(out, c.through);
                out.push_str(" closed");
            }
            Event::JobReleased(r) => {
                out.push_str("due (not before ");
                time(out, r.not_before);
                out.push_str("), released at ");
                time(out, r.released_at);
            }
            Event::JobBlocked(b) => {
                out.push_str("blocked until its dependencies let it run: waits for [");
                let shown: Vec<String> = (b.waiting_on.iter())
                    .map(|d| crate::state::display_dependency(d).into_owned())
                    .collect();
                join(out, &shown, ", ");
                write!(
                    out,
                    "] ({} succeeded, {} ended otherwise already), at most until ",
                    b.succeeded, b.failed
                )?;
                time(out, b.until);
            }
            Event::JobAwaited(a) => push(out, &["awaited: job ", &a.dependent, " waits for it"]),
            Event::DependencyResolved(r) => match crate::state::parse_batch_name(&r.dependency) {
                Some((_, _, batch)) if r.state == JobState::Succeeded => {
                    push(out, &["its batch ", batch, " completed"])
                }
                Some((_, _, batch)) => push(
                    out,
                    &[
                        "its batch ",
                        batch,
                        " ended before its members (",
                        r.state.as_str(),
                        ")",
                    ],
                ),
                None => push(
                    out,
                    &["dependency ", &r.dependency, " ended ", r.state.as_str()],
                ),
            },
            Event::JobUnblocked(u) => write!(
                out,
                "unblocked: its dependencies let it run ({} succeeded, {} ended otherwise)",
                u.succeeded, u.failed
            )?,
            Event::DependentsSettled(d) => match crate::state::parse_batch_name(&d.job_id) {
                Some(("members", _, batch)) => push(
                    out,
                    &["every member of cancelled batch ", batch, " was reached"],
                ),
                Some((_, _, batch)) => push(out, &["every callback of batch ", batch, " was told"]),
                None => out.push_str("every job waiting for it was told of its end"),
            },
            Event::BatchOpened(b) => {
                write!(
                    out,
                    "batch {} of tenant {} opened: {} members, until ",
                    b.batch_id, b.tenant_id, b.expected
                )?;
                time(out, b.until);
            }
            Event::BatchClosed(b) => write!(
                out,
                "batch {} of tenant {} ended {} by {}: {}",
                b.batch_id,
                b.tenant_id,
                b.state.as_str(),
                b.principal_id,
                b.reason
            )?,
            Event::BatchMembersCancelled(b) => write!(
                out,
                "batch {} of tenant {}: members through {} reached, those not started cancelled",
                b.batch_id, b.tenant_id, b.through
            )?,
            Event::BatchForgotten(b) => write!(
                out,
                "batch {} of tenant {} forgotten after its retention",
                b.batch_id, b.tenant_id
            )?,
            Event::JobRescheduled(r) => {
                out.push_str("rescheduled from ");
                time(out, r.previous);
                out.push_str(" to ");
                time(out, r.not_before);
                push(out, &[" by ", &r.principal_id]);
                if let Some(why) = &r.reason {
                    write!(out, ": {why}")?;
                }
            }
            Event::ScheduleChanged(c) => {
                push(
                    out,
                    &[
                        "schedule ",
                        &c.tenant_id,
                        ":",
                        &c.schedule_id,
                        " ",
                        c.action.as_str(),
                        " by ",
                        &c.principal_id,
                    ],
                );
                match c.next_slot {
                    Some(t) => {
                        out.push_str("; next firing ");
                        time(out, t);
                    }
                    None => out.push_str("; no next firing"),
                }
                if let Some(why) = &c.reason {
                    write!(out, ": {why}")?;
                }
            }
            Event::ScheduleFired(f) => {
                push(out, &["schedule ", &f.tenant_id, ":", &f.schedule_id, " "]);
                out.push_str(if f.triggered { "triggered " } else { "fired " });
                time(out, f.slot);
                push(out, &[": ", f.outcome.as_str()]);
                if let Some(job) = &f.job_id {
                    push(out, &[" ", job]);
                }
                push(out, &[" (", &f.detail, ")"]);
            }
        }
        Ok(())
    }
}

// The events of nearly every job (accepted, policy, queued, scheduled, dispatched, running,
// succeeded) write their pieces directly: through `write!`, the formatting machinery was most
// of a line's cost in a replay.

/// Appends `pieces` to `out`.
fn push(out: &mut String, pieces: &[&str]) {
    for p in pieces {
        out.push_str(p);
    }
}

/// Appends log time `ms` to `out` in RFC 3339 (UTC), or as a number where it is no time.
fn time(out: &mut String, ms: crate::records::Millis) {
    match jiff::Timestamp::from_millisecond(ms) {
        Ok(t) => {
            let _ = write!(out, "{t}");
        }
        Err(_) => int(out, ms),
    }
}

/// Appends `n` in decimal to `out`.
fn int(out: &mut String, n: impl itoa::Integer) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Appends `items` to `out`, `sep` between them (`join` without its new string).
fn join(out: &mut String, items: &[String], sep: &str) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(sep);
        }
        out.push_str(item);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{Constraints, Tick};

    fn candidate(worker: &str, score: Option<f64>) -> Candidate {
        Candidate {
            worker_id: worker.into(),
            pool: "p".into(),
            score,
            skipped: score.is_none().then(|| "busy".to_owned()),
        }
    }

    fn scheduled(candidates: Vec<Candidate>, notes: Vec<String>) -> Event {
        Event::JobScheduled(JobScheduled {
            job_id: "j".into(),
            attempt: 2,
            pool: "p".into(),
            worker_id: "w2".into(),
            strategy: "least_loaded".into(),
            candidates,
            notes,
            candidates_omitted: 3,
        })
    }

    fn policy(constraints: Constraints, reasons: Vec<String>) -> Event {
        Event::PolicyEvaluated(PolicyEvaluated {
            job_id: "j".into(),
            snapshot_id: "snap-1".into(),
            verdict: Verdict::Allow,
            reasons,
            constraints,
        })
    }

    /// The lines histories have always held: the text is what `ksched audit job` and the API
    /// show, so its wording stays put however it is built.
    #[test]
    fn placements_and_policy_verdicts_read_as_before() {
        let tick = Input::Tick(Tick::default());
        let five = vec![
            candidate("w1", Some(0.5)),
            candidate("w0", None),
            candidate("w2", Some(0.25)),
            candidate("w3", Some(1.0)),
            candidate("w4", Some(0.125)),
        ];
        assert_eq!(
            scheduled(five, vec!["hint a".into(), "hint b".into()]).describe(&tick),
            "attempt 2 -> w2 in p by least_loaded; 8 candidates \
             (scores: w1 0.50, w2 0.25, w3 1.00); hint a; hint b"
        );
        assert_eq!(
            scheduled(vec![candidate("w0", None)], vec![]).describe(&tick),
            "attempt 2 -> w2 in p by least_loaded; 4 candidates"
        );
        assert_eq!(
            policy(Constraints::default(), vec![]).describe(&tick),
            "Allow under policy snapshot snap-1"
        );
        let limits = Constraints {
            max_retries: Some(2),
            max_runtime_ms: Some(5_000),
            deadline_ms: Some(60_000),
            ..Constraints::default()
        };
        assert_eq!(
            policy(limits, vec!["r1".into(), "r2".into()]).describe(&tick),
            "Allow under policy snapshot snap-1: r1; r2 \
             (max_retries 2, max_runtime_ms 5000, deadline_ms 60000)"
        );
        let one = Constraints {
            max_concurrent_jobs: Some(4),
            ..Constraints::default()
        };
        assert_eq!(
            policy(one, vec![]).describe(&tick),
            "Allow under policy snapshot snap-1 (max_concurrent_jobs 4)"
        );
    }
}
