//! Redrive: a dead-lettered job submitted again as a new job (RedriveJob -> JobAccepted +
//! JobRedriven), with the old job's request and stored payload. Every scenario also checks
//! replay == live and that the evicting, cold-loading state agrees (support::Sim::check).

mod support;

use ksched_core::events::*;
use ksched_core::outputs::Output;
use ksched_core::records::{RedriveJob, ResultStatus};
use support::*;

fn redrive(sim: &mut Sim, job_id: &str, new_job_id: &str, tenant: Option<&str>) -> Vec<Event> {
    let now = sim.now;
    sim.input(
        "ksched.control",
        Input::Redrive(RedriveJob {
            job_id: job_id.into(),
            new_job_id: new_job_id.into(),
            tenant_id: tenant.map(str::to_owned),
            principal_id: "op".into(),
            reason: Some("the bug is fixed".into()),
            requested_at: now,
        }),
    )
}

/// j1, with a payload, failed for good on w1 (FAILED_FATAL): dead-lettered.
fn failed_job(sim: &mut Sim) {
    sim.worker("w1", "default");
    let mut j = job("j1");
    j.payload = b"the work".to_vec();
    sim.submit(j);
    sim.result_with("j1", 1, "w1", ResultStatus::FailedFatal, Some("bad_input"));
    assert_eq!(sim.job_state("j1"), JobState::Failed);
}

#[test]
fn a_dead_lettered_job_runs_again_as_a_new_job_with_its_payload() {
    let mut sim = Sim::new();
    failed_job(&mut sim);
    sim.worker("w1", "default");
    let ev = redrive(&mut sim, "j1", "j1-again", None);
    assert_eq!(
        &names(&ev)[..3],
        ["JobAccepted", "JobRedriven", "PolicyEvaluated"],
        "{:?}",
        names(&ev)
    );
    assert!(names(&ev).contains(&"JobDispatched"), "{:?}", names(&ev));
    let redriven = find(&ev, |e| match e {
        Event::JobRedriven(r) => Some(r),
        _ => None,
    });
    assert_eq!(
        (redriven.job_id.as_str(), redriven.new_job_id.as_str()),
        ("j1", "j1-again")
    );
    assert_eq!(redriven.reason.as_deref(), Some("the bug is fixed"));

    // The old job stays as it ended; the new one carries its request and payload.
    assert_eq!(sim.job_state("j1"), JobState::Failed);
    let new = sim.job("j1-again");
    assert_eq!(new.request.tenant_id, "acme");
    assert_eq!(
        new.request.submitted_at, sim.now,
        "submitted by the redrive"
    );
    assert_eq!(new.payload_len, 8);
    assert_eq!(new.payload_of.as_deref(), Some("j1"));
    assert_eq!(new.payload_digest, sim.job("j1").payload_digest);
    let dispatched = sim
        .outputs
        .iter()
        .rev()
        .find_map(|o| match o {
            Output::Dispatch {
                record,
                payload_of,
                payload_len,
                ..
            } => Some((record.job.job_id.clone(), payload_of.clone(), *payload_len)),
            _ => None,
        })
        .unwrap();
    assert_eq!(dispatched, ("j1-again".into(), "j1".into(), 8));
    assert_eq!(
        sim.payload("j1"),
        b"the work",
        "the payload stays where it was"
    );

    // Both histories say who did it and why.
    for id in ["j1", "j1-again"] {
        let h = sim.history(id);
        let line = h.iter().find(|l| l.event == "JobRedriven").unwrap();
        assert_eq!(
            line.detail,
            "j1 redriven as j1-again by op: the bug is fixed"
        );
    }
    sim.result("j1-again", 1, "w1", ResultStatus::Succeeded);
    assert_eq!(sim.job_state("j1-again"), JobState::Succeeded);

    // A redriven job that fails can be redriven again: the payload still comes from j1.
    let mut sim2 = Sim::new();
    failed_job(&mut sim2);
    redrive(&mut sim2, "j1", "j2", None);
    sim2.worker("w1", "default");
    let attempt = sim2.job("j2").attempt;
    sim2.result_with(
        "j2",
        attempt,
        "w1",
        ResultStatus::FailedFatal,
        Some("again"),
    );
    redrive(&mut sim2, "j2", "j3", None);
    assert_eq!(sim2.job("j3").payload_of.as_deref(), Some("j1"));
}

#[test]
fn only_dead_lettered_jobs_are_redriven() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("ok"));
    sim.result("ok", 1, "w1", ResultStatus::Succeeded);
    let ev = redrive(&mut sim, "ok", "ok-2", None);
    assert_eq!(rejected(&ev).reason_code, "not_dead_lettered");
    assert!(!sim.state.jobs.contains_key("ok-2"));

    sim.submit(job("running"));
    let ev = redrive(&mut sim, "running", "running-2", None);
    assert_eq!(rejected(&ev).reason_code, "not_dead_lettered");

    sim.submit(job("gone"));
    sim.cancel("gone", None);
    let ev = redrive(&mut sim, "gone", "gone-2", None);
    assert_eq!(
        rejected(&ev).reason_code,
        "not_dead_lettered",
        "a cancelled job is not dead-lettered"
    );

    let ev = redrive(&mut sim, "nobody", "x", None);
    assert_eq!(rejected(&ev).reason_code, "unknown_job");
}

#[test]
fn a_redrive_never_reuses_an_id_and_stays_in_its_tenant() {
    let mut sim = Sim::new();
    failed_job(&mut sim);
    sim.submit(job("taken"));
    let ev = redrive(&mut sim, "j1", "taken", None);
    assert_eq!(rejected(&ev).reason_code, "job_id_taken");
    let ev = redrive(&mut sim, "j1", "j1", None);
    assert_eq!(rejected(&ev).reason_code, "job_id_taken");
    for bad in ["", " padded", &"x".repeat(300)] {
        let ev = redrive(&mut sim, "j1", bad, None);
        assert_eq!(rejected(&ev).reason_code, "invalid_job_id", "{bad:?}");
    }
    let ev = redrive(&mut sim, "j1", "j1-b", Some("globex"));
    assert_eq!(rejected(&ev).reason_code, "tenant_mismatch");
    let ev = redrive(&mut sim, "j1", "j1-b", Some("acme"));
    assert!(names(&ev).contains(&"JobRedriven"), "{:?}", names(&ev));
    // Redriving twice into the same id: the second is refused.
    let ev = redrive(&mut sim, "j1", "j1-b", None);
    assert_eq!(rejected(&ev).reason_code, "job_id_taken");
    assert_eq!(sim.job_state("j1-b"), JobState::Dispatched, "w1 took it");
}

#[test]
fn a_redriven_job_is_judged_and_limited_like_a_submission() {
    let mut rules = rules();
    rules.limits.max_pending_per_pool = 1;
    let mut sim = Sim::with_rules(rules);
    failed_job(&mut sim);
    // w1 is gone: the queue holds one pending job, the limit.
    sim.advance(60_000);
    sim.submit(job("waiting"));
    assert_eq!(sim.job_state("waiting"), JobState::Pending);
    let ev = redrive(&mut sim, "j1", "j1-b", None);
    assert_eq!(rejected(&ev).reason_code, "queue_full");
    assert!(!sim.state.jobs.contains_key("j1-b"));
}
