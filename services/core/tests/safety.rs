//! The safety kernel, approvals, idempotency, duplicates and cancel (SPEC §5, §6).

mod support;

use ksched_core::events::*;
use ksched_core::hash::job_hash;
use ksched_core::policy::{OutputDecision, PolicyDecision};
use ksched_core::records::{ApproveJob, Constraints, RejectJob, ResultStatus};
use serde_json::Value;
use support::*;

fn label_is(doc: &Value, key: &str, value: &str) -> bool {
    doc["job"]["labels"][key].as_str() == Some(value)
}

/// deny when label risk=deny, approval when risk=high, constraints when risk=limited.
fn policy() -> ScriptPolicy {
    let mut p = ScriptPolicy::default();
    p.input.push(Box::new(|doc| {
        label_is(doc, "risk", "deny").then(|| PolicyDecision {
            limit_exceeded: false,
            verdict: Verdict::Deny,
            reasons: vec!["risk=deny is never allowed".into()],
            constraints: Constraints::default(),
        })
    }));
    p.input.push(Box::new(|doc| {
        label_is(doc, "risk", "high").then(|| PolicyDecision {
            limit_exceeded: false,
            verdict: Verdict::RequireApproval,
            reasons: vec!["high risk needs a human".into()],
            constraints: Constraints {
                max_retries: Some(0),
                ..Default::default()
            },
        })
    }));
    p.input.push(Box::new(|doc| {
        label_is(doc, "risk", "limited").then(|| PolicyDecision {
            limit_exceeded: false,
            verdict: Verdict::Allow,
            reasons: vec![],
            constraints: Constraints {
                max_retries: Some(1),
                deadline_ms: Some(10_000),
                max_concurrent_jobs: Some(7),
                labels: [("placement.zone".to_owned(), "eu".to_owned())].into(),
                ..Default::default()
            },
        })
    }));
    p.output.push(Box::new(|doc| {
        (doc["result"]["labels"]["contains_pii"].as_str() == Some("true")).then(|| OutputDecision {
            limit_exceeded: false,
            quarantine: true,
            reasons: vec!["output contains PII".into()],
        })
    }));
    p
}

fn risky(id: &str, risk: &str) -> ksched_core::records::JobRequest {
    let mut r = job(id);
    r.labels.insert("risk".into(), risk.into());
    r
}

fn sim() -> Sim {
    let mut s = Sim::with_policy(rules(), policy());
    s.worker("w1", "default");
    s
}

fn approve(sim: &mut Sim, id: &str, hash: &str, snapshot: &str) -> Vec<Event> {
    sim.input(
        "ksched.control",
        Input::Approve(ApproveJob {
            job_id: id.into(),
            job_hash: hash.into(),
            policy_snapshot: snapshot.into(),
            approver: "bob".into(),
            comment: None,
            requested_at: 0,
        }),
    )
}

#[test]
fn a_denied_job_is_dead_lettered_with_safety_denied_and_the_reasons() {
    let mut sim = sim();
    let ev = sim.submit(risky("j1", "deny"));
    assert_eq!(
        names(&ev),
        [
            "JobAccepted",
            "PolicyEvaluated",
            "JobDenied",
            "DeadLettered"
        ]
    );
    let p = find(&ev, |e| match e {
        Event::PolicyEvaluated(p) => Some(p),
        _ => None,
    });
    assert_eq!(p.verdict, Verdict::Deny);
    assert_eq!(p.snapshot_id, "snap-1");
    let dl = dead_lettered(&ev);
    assert_eq!(dl.reason_code, "safety_denied");
    assert_eq!(dl.reason, "risk=deny is never allowed");
    assert_eq!(sim.job_state("j1"), JobState::Denied);
}

#[test]
fn policy_constraints_take_effect() {
    let mut sim = sim();
    let mut w = hb("eu", "default");
    w.labels.insert("zone".into(), "eu".into());
    sim.heartbeat(w);
    let mut r = risky("j1", "limited");
    r.budget.deadline_ms = Some(60_000);
    let ev = sim.submit(r);
    let p = find(&ev, |e| match e {
        Event::PolicyEvaluated(p) => Some(p),
        _ => None,
    });
    assert_eq!(p.constraints.max_retries, Some(1));
    assert_eq!(
        p.constraints.deadline_ms,
        Some(10_000),
        "the smaller of job and policy"
    );
    assert_eq!(p.constraints.max_concurrent_jobs, Some(7));
    assert_eq!(
        scheduled(&ev).worker_id,
        "eu",
        "policy labels constrain placement"
    );
    assert_eq!(sim.job("j1").deadline_at, Some(T0 + 10_000));
    let d = sim.dispatches()[0].clone();
    assert_eq!(d.constraints.max_retries, Some(1));
    assert_eq!(d.deadline_at, Some(T0 + 10_000));
    // max_retries 1: the second failure is final.
    sim.result("j1", 1, "eu", ResultStatus::FailedRetryable);
    sim.tick_after(2_000);
    let ev = sim.result("j1", 2, "eu", ResultStatus::FailedRetryable);
    assert_eq!(dead_lettered(&ev).reason_code, "max_retries_exceeded");
}

#[test]
fn the_policy_never_sees_secret_env_values() {
    let mut p = ScriptPolicy::default();
    p.input.push(Box::new(|doc| {
        assert_eq!(doc["job"]["env"]["$TOKEN"], "*hidden*");
        assert_eq!(doc["job"]["env"]["MODE"], "fast");
        assert!(doc["job"].get("payload").is_none());
        assert_eq!(doc["job"]["payload_size"], 3);
        None
    }));
    let mut sim = Sim::with_policy(rules(), p);
    let mut r = job("j1");
    r.env.insert("$TOKEN".into(), "s3cret".into());
    r.env.insert("MODE".into(), "fast".into());
    r.payload = b"abc".to_vec();
    sim.submit(r);
    assert!(*sim.policy.calls.borrow() > 0, "the policy was asked");
}

#[test]
fn approval_binds_the_job_hash_and_policy_snapshot() {
    let mut sim = sim();
    let ev = sim.submit(risky("j1", "high"));
    let req = find(&ev, |e| match e {
        Event::ApprovalRequested(a) => Some(a),
        _ => None,
    })
    .clone();
    assert_eq!(sim.job_state("j1"), JobState::ApprovalRequired);
    assert_eq!(req.job_hash, job_hash(&sim.job("j1").request));
    assert_eq!(req.snapshot_id, "snap-1");
    assert!(sim.dispatches().is_empty());

    let ev = approve(&mut sim, "j1", "deadbeef", "snap-1");
    assert_eq!(rejected(&ev).reason_code, "stale_job_hash");
    let ev = approve(&mut sim, "j1", &req.job_hash, "snap-0");
    assert_eq!(rejected(&ev).reason_code, "stale_policy_snapshot");
    assert_eq!(sim.job_state("j1"), JobState::ApprovalRequired);

    let calls = *sim.policy.calls.borrow();
    let ev = approve(&mut sim, "j1", &req.job_hash, "snap-1");
    assert_eq!(
        names(&ev),
        ["JobApproved", "JobQueued", "JobScheduled", "JobDispatched"]
    );
    assert_eq!(*sim.policy.calls.borrow(), calls, "not asked again");
    assert_eq!(
        sim.job("j1").constraints.max_retries,
        Some(0),
        "stored constraints kept"
    );

    let ev = approve(&mut sim, "j1", &req.job_hash, "snap-1");
    assert_eq!(
        rejected(&ev).reason_code,
        "not_awaiting_approval",
        "late approval"
    );
}

#[test]
fn approval_labels_may_change_without_invalidating_the_hash() {
    let mut a = risky("j1", "high");
    let h = job_hash(&a);
    a.labels.insert("approval_ticket".into(), "CHG-1".into());
    assert_eq!(job_hash(&a), h);
}

#[test]
fn a_policy_change_re_evaluates_on_approval() {
    let mut sim = sim();
    let ev = sim.submit(risky("j1", "high"));
    let hash = find(&ev, |e| match e {
        Event::ApprovalRequested(a) => Some(&a.job_hash),
        _ => None,
    })
    .clone();
    sim.submit(risky("j2", "high"));
    sim.reconfigure(&rules(), "snap-2");
    // Still requires approval under the new policy: approve again under snap-2.
    let ev = approve(&mut sim, "j1", &hash, "snap-1");
    assert_eq!(rejected(&ev).reason_code, "stale_policy_snapshot");
    let again = find(&ev, |e| match e {
        Event::ApprovalRequested(a) => Some(a),
        _ => None,
    });
    assert_eq!(again.snapshot_id, "snap-2");
    let ev = approve(&mut sim, "j1", &hash, "snap-2");
    assert!(names(&ev).contains(&"JobDispatched"), "{:?}", names(&ev));

    // Under a new policy that allows it, the approval goes through after re-evaluation.
    let mut sim2 = Sim::with_policy(rules(), policy());
    sim2.worker("w1", "default");
    let ev = sim2.submit(risky("k1", "high"));
    let hash = find(&ev, |e| match e {
        Event::ApprovalRequested(a) => Some(&a.job_hash),
        _ => None,
    })
    .clone();
    sim2.policy.input.clear();
    sim2.reconfigure(&rules(), "snap-3");
    let ev = approve(&mut sim2, "k1", &hash, "snap-1");
    assert_eq!(
        names(&ev)[..3],
        ["PolicyEvaluated", "JobApproved", "JobQueued"]
    );
}

#[test]
fn a_rejection_denies_and_dead_letters_as_approval_rejected() {
    let mut sim = sim();
    sim.submit(risky("j1", "high"));
    let ev = sim.input(
        "ksched.control",
        Input::Reject(RejectJob {
            job_id: "j1".into(),
            approver: "bob".into(),
            reason: Some("not today".into()),
            requested_at: 0,
        }),
    );
    assert_eq!(names(&ev), ["JobDenied", "DeadLettered"]);
    let dl = dead_lettered(&ev);
    assert_eq!(dl.reason_code, "approval_rejected");
    assert_eq!(dl.reason, "rejected by bob: not today");
    assert_eq!(sim.job_state("j1"), JobState::Denied);
    let ev = sim.input(
        "ksched.control",
        Input::Reject(RejectJob {
            job_id: "j1".into(),
            approver: "bob".into(),
            reason: None,
            requested_at: 0,
        }),
    );
    assert_eq!(rejected(&ev).reason_code, "not_awaiting_approval");
}

#[test]
fn output_policy_quarantines_a_succeeded_job() {
    let mut sim = sim();
    sim.submit(job("j1"));
    let ev = sim.input(
        "ksched.results",
        Input::Result(ksched_core::records::JobResult {
            job_id: "j1".into(),
            attempt: 1,
            worker_id: "w1".into(),
            status: ResultStatus::Succeeded,
            error_code: None,
            error_message: None,
            result_ptr: Some("s3://out".into()),
            result_meta: ksched_core::records::ResultMeta {
                labels: [("contains_pii".to_owned(), "true".to_owned())].into(),
                ..Default::default()
            },
            execution_ms: 3,
            finished_at: 0,
        }),
    );
    assert_eq!(
        names(&ev),
        [
            "JobRunning",
            "JobSucceeded",
            "BreakerCounted",
            "JobQuarantined",
            "DeadLettered"
        ]
    );
    assert_eq!(dead_lettered(&ev).reason_code, "output_quarantined");
    assert_eq!(sim.job_state("j1"), JobState::OutputQuarantined);
}

#[test]
fn idempotency_keys_dedupe_within_retention_only() {
    let mut sim = sim();
    let keyed = |id: &str| {
        let mut r = job(id);
        r.meta.idempotency_key = Some("pay-42".into());
        r
    };
    sim.submit(keyed("j1"));
    let ev = sim.submit(keyed("j2"));
    assert_eq!(names(&ev), ["JobDuplicate"]);
    let d = find(&ev, |e| match e {
        Event::JobDuplicate(d) => Some(d),
        _ => None,
    });
    assert_eq!(
        (d.kind, d.existing_job_id.as_str()),
        (DuplicateKind::IdempotencyKey, "j1")
    );
    assert!(!sim.state.jobs.contains_key("j2"));
    // Another tenant may use the same key.
    let mut other = keyed("k1");
    other.tenant_id = "globex".into();
    assert_eq!(names(&sim.submit(other))[0], "JobAccepted");
    // After the retention (7 days) the key is free again.
    sim.gap(7 * 24 * 3_600_000);
    let ev = sim.submit(keyed("j3"));
    assert_eq!(names(&ev)[0], "JobAccepted");
}

#[test]
fn idempotency_keys_are_pruned_after_retention() {
    let mut r = rules();
    r.timing.idempotency_retention_ms = 10_000;
    let mut sim = Sim::with_policy(r, policy());
    let mut req = job("j1");
    req.meta.idempotency_key = Some("k".into());
    sim.submit(req);
    sim.tick_after(5_000);
    assert_eq!(sim.state.idempotency.len(), 1);
    // Pruned at the first prune (every retention / 4) after the retention passed.
    sim.tick_after(8_000);
    assert!(sim.state.idempotency.is_empty());
}

#[test]
fn duplicate_job_ids_are_ignored_or_dead_lettered_when_the_content_differs() {
    let mut sim = sim();
    sim.submit(job("j1"));
    let ev = sim.submit(job("j1"));
    assert_eq!(names(&ev), ["JobDuplicate"]);
    let mut changed = job("j1");
    changed.payload = b"different".to_vec();
    let ev = sim.submit(changed);
    assert_eq!(names(&ev), ["JobDuplicate", "DeadLettered"]);
    let dl = dead_lettered(&ev);
    assert_eq!(dl.reason_code, "duplicate_job_id");
    assert_eq!(dl.job_id, "j1");
    assert_eq!(
        sim.job_state("j1"),
        JobState::Dispatched,
        "the original is untouched"
    );
    assert_eq!(sim.job("j1").dlq_reason, None);
}

#[test]
fn malformed_requests_are_dead_lettered() {
    let mut sim = sim();
    let mut r = job("");
    r.tenant_id = "acme".into();
    let ev = sim.submit(r);
    assert_eq!(dead_lettered(&ev).reason_code, "malformed_record");
    let ev = sim.input(
        "job.default",
        Input::Malformed(MalformedRecord {
            key: Some("k".into()),
            size_bytes: 4,
            error: "bad marker".into(),
            reason_code: "malformed_record".into(),
            ..Default::default()
        }),
    );
    let dl = dead_lettered(&ev);
    assert_eq!(dl.reason_code, "malformed_record");
    assert_eq!(
        (dl.cause_topic.as_str(), dl.cause_offset),
        ("job.default", sim.offset - 1)
    );
}

#[test]
fn cancel_pending_running_and_terminal_jobs() {
    let mut sim = Sim::with_policy(rules(), policy());
    sim.submit(job("pending"));
    let ev = sim.cancel("pending", Some("acme"));
    assert_eq!(names(&ev), ["JobCancelled"]);
    assert!(sim.state.queued.is_empty());

    sim.worker("w1", "default");
    sim.submit(job("running"));
    sim.started("running", 1, "w1");
    let ev = sim.cancel("running", None);
    assert_eq!(names(&ev), ["JobCancelled", "DispatchCancelled"]);
    let c = sim.cancel_dispatches()[0].clone();
    assert_eq!(
        (c.job_id.as_str(), c.worker_id.as_str(), c.reason.as_str()),
        ("running", "w1", "cancelled")
    );
    assert_eq!(sim.job_state("running"), JobState::Cancelled);
    // The worker's CANCELLED result afterwards is recorded and changes nothing.
    let ev = sim.result("running", 1, "w1", ResultStatus::Cancelled);
    assert_eq!(rejected(&ev).reason_code, "invalid_transition");

    let ev = sim.cancel("running", None);
    assert_eq!(rejected(&ev).reason_code, "invalid_transition");
}

#[test]
fn a_cancel_from_another_tenant_is_rejected() {
    let mut sim = sim();
    sim.submit(job("j1"));
    let ev = sim.cancel("j1", Some("globex"));
    let r = rejected(&ev);
    assert_eq!(r.reason_code, "tenant_mismatch");
    assert!(r.reason.contains("tenant globex"), "{}", r.reason);
    assert_eq!(sim.job_state("j1"), JobState::Dispatched);
}

/// Four eyes in the core: a control record on Kafka by the job's own submitter is refused,
/// not only an API call (before, the API checked, and a principal with Write on the control
/// topic approved their own job).
#[test]
fn four_eyes_refuse_the_submitter_whichever_way_the_decision_comes() {
    let mut rules = rules();
    rules.four_eyes = true;
    let mut sim = Sim::with_policy(rules, policy());
    sim.worker("w1", "default");
    // `risky` jobs are submitted by alice.
    sim.submit(risky("j1", "high"));
    let job = sim.job("j1").clone();
    assert_eq!(job.request.principal_id.as_deref(), Some("alice"));
    let by = |approver: &str| ApproveJob {
        job_id: "j1".into(),
        job_hash: job.job_hash.clone(),
        policy_snapshot: "snap-1".into(),
        approver: approver.into(),
        comment: None,
        requested_at: 0,
    };
    let ev = sim.input("ksched.control", Input::Approve(by("alice")));
    let r = rejected(&ev);
    assert_eq!(r.reason_code, "four_eyes");
    assert!(r.reason.contains("alice submitted job j1"), "{}", r.reason);
    let ev = sim.input(
        "ksched.control",
        Input::Reject(RejectJob {
            job_id: "j1".into(),
            approver: "alice".into(),
            reason: None,
            requested_at: 0,
        }),
    );
    assert_eq!(rejected(&ev).reason_code, "four_eyes");
    assert_eq!(sim.job_state("j1"), JobState::ApprovalRequired);

    let ev = sim.input("ksched.control", Input::Approve(by("bob")));
    assert!(names(&ev).contains(&"JobApproved"), "{:?}", names(&ev));
    sim.check();
}

/// Rules journaled before four eyes existed (and rules with it off) let the submitter decide.
#[test]
fn without_four_eyes_the_submitter_may_approve() {
    let old_json = rules()
        .to_canonical_json()
        .replace(",\"four_eyes\":false", "");
    assert!(!old_json.contains("four_eyes"), "{old_json}");
    let rules = ksched_core::rules::Rules::from_json(&old_json).unwrap();
    assert!(!rules.four_eyes, "an old rule set reads as four eyes off");
    let mut sim = Sim::with_policy(rules, policy());
    sim.submit(risky("j1", "high"));
    let job = sim.job("j1").clone();
    let ev = sim.input(
        "ksched.control",
        Input::Approve(ApproveJob {
            job_id: "j1".into(),
            job_hash: job.job_hash,
            policy_snapshot: "snap-1".into(),
            approver: "alice".into(),
            comment: None,
            requested_at: 0,
        }),
    );
    assert!(names(&ev).contains(&"JobApproved"), "{:?}", names(&ev));
}

/// A policy evaluation stopped at its step or memory limit denies the job with its own
/// reason code, so an operator tells a runaway policy from a denial.
#[test]
fn a_policy_stopped_at_a_limit_dead_letters_policy_limit_exceeded() {
    let mut p = ScriptPolicy::default();
    p.input.push(Box::new(|doc| {
        label_is(doc, "risk", "runaway").then(|| PolicyDecision {
            limit_exceeded: true,
            verdict: Verdict::Deny,
            reasons: vec![
                "policy evaluation failed: the evaluation took more than 10 steps".into(),
            ],
            constraints: Constraints::default(),
        })
    }));
    p.output.push(Box::new(|doc| {
        label_is(doc, "risk", "runaway-output").then(|| OutputDecision {
            limit_exceeded: true,
            quarantine: true,
            reasons: vec!["output policy evaluation failed: too many steps".into()],
        })
    }));
    let mut sim = Sim::with_policy(rules(), p);
    sim.worker("w1", "default");
    let ev = sim.submit(risky("j1", "runaway"));
    assert_eq!(dead_lettered(&ev).reason_code, "policy_limit_exceeded");
    assert_eq!(sim.job_state("j1"), JobState::Denied);
    sim.submit(risky("j2", "runaway-output"));
    let ev = sim.result("j2", 1, "w1", ResultStatus::Succeeded);
    assert_eq!(dead_lettered(&ev).reason_code, "policy_limit_exceeded");
    assert_eq!(sim.job_state("j2"), JobState::OutputQuarantined);
}

/// Four eyes need to know who submitted a job: an approval of a job naming no submitter is
/// refused, and a job that needs approval but names none is denied at once (nobody could
/// approve it).
#[test]
fn four_eyes_refuse_what_they_cannot_tell_apart() {
    let mut rules = rules();
    rules.four_eyes = true;
    let mut sim = Sim::with_policy(rules, policy());
    sim.worker("w1", "default");
    let mut anonymous = risky("j1", "high");
    anonymous.principal_id = None;
    let ev = sim.submit(anonymous);
    assert_eq!(dead_lettered(&ev).reason_code, "submitter_unknown");
    assert!(
        dead_lettered(&ev).reason.contains("names no submitter"),
        "{}",
        dead_lettered(&ev).reason
    );
    assert_eq!(sim.job_state("j1"), JobState::Denied);
}

/// On a topic bound to its producer, a job is that principal's: one naming none is given
/// it (so four eyes refuse its self-approval), one naming another is refused.
#[test]
fn a_topic_bound_to_a_principal_makes_its_jobs_that_principals() {
    let mut rules = rules();
    rules.four_eyes = true;
    rules
        .topic_principals
        .insert("job.default".into(), "svc-acme".into());
    let mut sim = Sim::with_policy(rules, policy());
    sim.worker("w1", "default");
    let mut j1 = risky("j1", "high");
    j1.principal_id = None;
    sim.submit(j1);
    assert_eq!(
        sim.job("j1").request.principal_id.as_deref(),
        Some("svc-acme")
    );
    assert_eq!(sim.job_state("j1"), JobState::ApprovalRequired);
    let job = sim.job("j1").clone();
    let ev = sim.input(
        "ksched.control",
        Input::Approve(ApproveJob {
            job_id: "j1".into(),
            job_hash: job.job_hash.clone(),
            policy_snapshot: "snap-1".into(),
            approver: "svc-acme".into(),
            comment: None,
            requested_at: 0,
        }),
    );
    assert_eq!(rejected(&ev).reason_code, "four_eyes");
    let mut j2 = risky("j2", "high");
    j2.principal_id = Some("mallory".into());
    let ev = sim.submit(j2);
    assert_eq!(dead_lettered(&ev).reason_code, "tenant_not_allowed");
    assert!(!sim.state.jobs.contains_key("j2"));
}

/// `<tenant>:` begins a tenant's job ids: a tenant id holding a colon is refused, so no
/// tenant can take ids in another's namespace.
#[test]
fn a_tenant_id_with_a_colon_is_refused() {
    let mut sim = sim();
    let mut r = job("a:b:c");
    r.tenant_id = "a:b".into();
    let ev = sim.submit(r);
    assert_eq!(dead_lettered(&ev).reason_code, "malformed_record");
    assert!(dead_lettered(&ev).reason.contains("must not contain ':'"));
}
