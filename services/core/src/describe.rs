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
        match self {
            Event::JobAccepted(a) => {
                let topic = accepted_request(a, input).map_or("?", |r| r.topic.as_str());
                let mut s = format!("accepted from {topic} -> pools [{}]", a.pools.join(", "));
                for n in &a.routing_notes {
                    let _ = write!(s, "; {n}");
                }
                s
            }
            Event::JobDuplicate(d) => match d.kind {
                DuplicateKind::SameJobId => {
                    "same job_id and content submitted again; ignored".to_owned()
                }
                DuplicateKind::ConflictingJobId => {
                    "same job_id with different content; dead-lettered".to_owned()
                }
                DuplicateKind::IdempotencyKey => format!(
                    "job {} reused idempotency key {} of {}; ignored",
                    d.job_id,
                    d.idempotency_key.as_deref().unwrap_or(""),
                    d.existing_job_id
                ),
            },
            Event::PolicyEvaluated(p) => {
                let mut s = format!("{:?} under policy snapshot {}", p.verdict, p.snapshot_id);
                if !p.reasons.is_empty() {
                    let _ = write!(s, ": {}", p.reasons.join("; "));
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
                        let _ = write!(s, "{}{name} {v}", if first { " (" } else { ", " });
                        first = false;
                    }
                }
                if !first {
                    s.push(')');
                }
                s
            }
            Event::JobQueued(q) => format!(
                "queued in [{}] at priority {}",
                q.pools.join(", "),
                q.priority.as_str()
            ),
            Event::JobWaiting(w) => format!("waiting: {} ({})", w.reason_code, w.detail),
            Event::JobScheduled(s) => {
                let total = s.candidates.len() + usize::try_from(s.candidates_omitted).unwrap_or(0);
                let mut line = format!(
                    "attempt {} -> {} in {} by {}; {total} candidates",
                    s.attempt, s.worker_id, s.pool, s.strategy
                );
                let scored = s.candidates.iter().filter_map(|c| Some((c, c.score?)));
                for (i, (c, score)) in scored.take(NAMED_CANDIDATES).enumerate() {
                    let sep = if i == 0 { " (scores: " } else { ", " };
                    let _ = write!(line, "{sep}{} {score:.2}", c.worker_id);
                }
                if s.candidates.iter().any(|c| c.score.is_some()) {
                    line.push(')');
                }
                if !s.notes.is_empty() {
                    let _ = write!(line, "; {}", s.notes.join("; "));
                }
                line
            }
            Event::JobDispatched(d) => format!(
                "attempt {} dispatched to {} (partition {})",
                d.attempt, d.worker_id, d.partition
            ),
            Event::JobRunning(r) => {
                let mut s = format!("attempt {} running on {}", r.attempt, r.worker_id);
                if let Some(from) = &r.reassigned_from {
                    let _ = write!(s, " (reassigned from {from})");
                }
                s
            }
            Event::JobProgressed(p) => {
                let mut s = format!("progress {:.0}%", p.progress * 100.0);
                if let Some(m) = &p.message {
                    let _ = write!(s, " {m}");
                }
                s
            }
            Event::JobSucceeded(s) => format!(
                "attempt {} succeeded on {} in {} ms",
                s.attempt, s.worker_id, s.execution_ms
            ),
            Event::JobQuarantined(q) => format!("output quarantined: {}", q.reasons.join("; ")),
            Event::JobRetrying(r) => {
                let mut s = format!("attempt {} failed ({}", r.attempt, r.error_code);
                if let Some(m) = &r.error_message {
                    let _ = write!(s, ": {m}");
                }
                let _ = write!(s, "); retry in {} ms", r.backoff_ms);
                s
            }
            Event::JobFailed(f) => {
                let mut s = format!("failed: {}", f.reason_code);
                if let Some(m) = &f.error_message {
                    let _ = write!(s, " ({m})");
                }
                s
            }
            Event::JobCancelled(c) => {
                let mut s = format!("cancelled by {}", c.principal_id);
                if let Some(r) = &c.reason {
                    let _ = write!(s, ": {r}");
                }
                s
            }
            Event::JobTimedOut(t) => format!("timed out: {} ({})", t.reason_code, t.detail),
            Event::JobDenied(d) => {
                let mut s = format!("denied: {}", d.reason_code);
                if let Some(by) = &d.by {
                    let _ = write!(s, " by {by}");
                }
                if !d.reasons.is_empty() {
                    let _ = write!(s, " ({})", d.reasons.join("; "));
                }
                s
            }
            Event::ApprovalRequested(a) => format!(
                "approval required ({}); job hash {}, policy snapshot {}",
                a.reasons.join("; "),
                a.job_hash,
                a.snapshot_id
            ),
            Event::JobApproved(a) => {
                let mut s = format!("approved by {}", a.approver);
                if let Some(c) = &a.comment {
                    let _ = write!(s, ": {c}");
                }
                s
            }
            Event::DispatchCancelled(d) => format!(
                "CancelDispatch sent to {} for attempt {} ({})",
                d.worker_id, d.attempt, d.reason
            ),
            Event::DeadLettered(d) => {
                let d = &d.dead_letter;
                format!(
                    "dead-lettered {}: {} (cause {}/{}@{})",
                    d.reason_code, d.reason, d.cause_topic, d.cause_partition, d.cause_offset
                )
            }
            Event::CommandRejected(r) => {
                format!("{} refused: {} ({})", r.input_kind, r.reason_code, r.reason)
            }
            Event::WorkerUpdated(u) => {
                let hb = &u.heartbeat;
                let verb = if u.joined { "joined" } else { "heartbeat" };
                format!(
                    "worker {} {verb} in pool {}: {} of {} jobs, cpu {:.0}%, partitions {:?}{}",
                    u.worker_id,
                    hb.pool,
                    hb.active_jobs,
                    hb.max_parallel_jobs,
                    hb.cpu_load,
                    hb.owned_partitions,
                    if hb.draining { ", draining" } else { "" }
                )
            }
            Event::WorkerLost(l) => format!(
                "worker {} of pool {} lost (last seen at {}); {} jobs on it",
                l.worker_id,
                l.pool,
                l.last_seen,
                l.job_ids.len()
            ),
            Event::CircuitChanged(c) => format!(
                "circuit of pool {} {:?} -> {:?}: {}",
                c.pool, c.from, c.to, c.reason
            ),
            Event::SagaStepRecorded(s) => format!(
                "workflow {}: compensation of {} recorded",
                s.workflow_id, s.job_id
            ),
            Event::SagaRollbackStarted(s) => format!(
                "workflow {}: {} failed, rolling back {} steps",
                s.workflow_id, s.failed_job_id, s.steps
            ),
            Event::SagaCompensationSubmitted(s) => format!(
                "workflow {}: compensation {} submitted for {}",
                s.workflow_id, s.job_id, s.for_job_id
            ),
            Event::SagaFinished(s) => {
                format!("workflow {} {:?}: {}", s.workflow_id, s.outcome, s.detail)
            }
            Event::IdempotencyPruned(p) => {
                format!("idempotency keys first seen before {} forgotten", p.before)
            }
            Event::ConfigApplied(c) => format!(
                "rules {} and policy snapshot {} in force",
                c.config.rules_id, c.config.policy_snapshot
            ),
            Event::BreakerCounted(b) => format!(
                "counted as a {} in pool {}'s circuit breaker",
                if b.failure { "failure" } else { "success" },
                b.pool
            ),
            Event::ClockGap(g) => format!(
                "no input could be read for {} ms: evidence-based timeouts count from {}",
                g.to - g.from,
                g.to
            ),
            Event::WorkerForgotten(w) => format!(
                "worker {} of pool {} forgotten (last seen at {})",
                w.worker_id, w.pool, w.last_seen
            ),
            Event::JobRedriven(r) => {
                let mut s = format!(
                    "{} redriven as {} by {}",
                    r.job_id, r.new_job_id, r.principal_id
                );
                if let Some(why) = &r.reason {
                    let _ = write!(s, ": {why}");
                }
                s
            }
        }
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
