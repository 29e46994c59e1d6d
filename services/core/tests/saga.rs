//! Sagas (SPEC §7): compensations pushed on success, run last-first on a fatal failure, one at
//! a time, with the outcome journaled.

mod support;

use ksched_core::events::*;
use ksched_core::records::{JobTemplate, ResultStatus};
use support::*;

fn step(id: &str, workflow: &str, compensation: Option<&str>) -> ksched_core::records::JobRequest {
    let mut r = job(id);
    r.workflow_id = Some(workflow.into());
    r.compensation = compensation.map(|c| {
        Box::new(JobTemplate {
            topic: "job.default".into(),
            payload: c.as_bytes().to_vec(),
            ..Default::default()
        })
    });
    r
}

fn finished(events: &[Event]) -> Option<&SagaFinished> {
    events.iter().find_map(|e| match e {
        Event::SagaFinished(f) => Some(f),
        _ => None,
    })
}

fn submitted(events: &[Event]) -> Option<&SagaCompensationSubmitted> {
    events.iter().find_map(|e| match e {
        Event::SagaCompensationSubmitted(s) => Some(s),
        _ => None,
    })
}

#[test]
fn compensations_run_last_first_one_at_a_time() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    for (id, comp) in [("s1", "undo-1"), ("s2", "undo-2")] {
        sim.submit(step(id, "wf", Some(comp)));
        let ev = sim.result(id, 1, "w1", ResultStatus::Succeeded);
        assert!(names(&ev).contains(&"SagaStepRecorded"));
    }
    sim.submit(step("s3", "wf", None));
    let ev = sim.result("s3", 1, "w1", ResultStatus::FailedFatal);
    let started = find(&ev, |e| match e {
        Event::SagaRollbackStarted(s) => Some(s),
        _ => None,
    });
    assert_eq!((started.failed_job_id.as_str(), started.steps), ("s3", 2));
    let first = submitted(&ev).unwrap().clone();
    assert_eq!(first.for_job_id, "s2", "last pushed, first run");
    assert_eq!(first.job_id, "wf~compensation~1");
    let comp = sim.job(&first.job_id).request.clone();
    assert_eq!(sim.payload(&first.job_id), b"undo-2");
    assert_eq!(comp.labels["saga_compensation"], "true");
    assert_eq!(comp.labels["saga_workflow_id"], "wf");
    assert_eq!(comp.tenant_id, "acme");
    // The next compensation waits for this one to finish.
    assert!(!sim.state.jobs.contains_key("wf~compensation~2"));
    let ev = sim.result(&first.job_id, 1, "w1", ResultStatus::Succeeded);
    let second = submitted(&ev).unwrap().clone();
    assert_eq!(second.for_job_id, "s1");
    assert_eq!(sim.payload(&second.job_id), b"undo-1");
    let ev = sim.result(&second.job_id, 1, "w1", ResultStatus::Succeeded);
    let f = finished(&ev).unwrap();
    assert_eq!(f.outcome, SagaOutcome::Compensated);
    assert_eq!(f.detail, "2 compensations succeeded");
}

#[test]
fn a_failing_compensation_ends_the_saga_compensation_failed() {
    let mut rules = rules();
    rules.retry.max_retries = 0;
    let mut sim = Sim::with_rules(rules);
    sim.worker("w1", "default");
    sim.submit(step("s1", "wf", Some("undo-1")));
    sim.result("s1", 1, "w1", ResultStatus::Succeeded);
    sim.submit(step("s2", "wf", None));
    let ev = sim.result("s2", 1, "w1", ResultStatus::FailedFatal);
    let comp = submitted(&ev).unwrap().job_id.clone();
    let ev = sim.result(&comp, 1, "w1", ResultStatus::FailedRetryable);
    let f = finished(&ev).unwrap();
    assert_eq!(f.outcome, SagaOutcome::CompensationFailed);
    assert!(f.detail.contains(&comp), "{}", f.detail);
}

#[test]
fn a_workflow_without_compensations_is_compensated_at_once() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(step("s1", "wf", None));
    let ev = sim.result("s1", 1, "w1", ResultStatus::FailedFatal);
    assert_eq!(finished(&ev).unwrap().outcome, SagaOutcome::Compensated);
}

#[test]
fn non_fatal_endings_do_not_roll_back() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(step("s1", "wf", Some("undo")));
    sim.result("s1", 1, "w1", ResultStatus::Succeeded);
    sim.submit(step("s2", "wf", None));
    let ev = sim.cancel("s2", None);
    assert!(submitted(&ev).is_none());
    assert!(!sim.state.sagas["wf"].rolling_back());
}

#[test]
fn a_compensation_that_cannot_be_routed_fails_the_saga() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    let mut s1 = step("s1", "wf", Some("undo"));
    s1.compensation.as_mut().unwrap().topic = "job.nowhere".into();
    sim.submit(s1);
    sim.result("s1", 1, "w1", ResultStatus::Succeeded);
    sim.submit(step("s2", "wf", None));
    let ev = sim.result("s2", 1, "w1", ResultStatus::FailedFatal);
    assert!(names(&ev).contains(&"DeadLettered"));
    assert_eq!(
        finished(&ev).unwrap().outcome,
        SagaOutcome::CompensationFailed
    );
}
