//! Sagas (SPEC §7): compensations pushed on success, run last-first on a fatal failure, one at
//! a time, with the outcome journaled.

mod support;

use ksched_core::events::*;
use ksched_core::reason::DlqReason;
use ksched_core::records::{JobTemplate, ResultStatus};
use ksched_core::state::saga_key;
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
    assert_eq!(
        first.job_id, "acme:wf~compensation~1",
        "in the tenant's namespace"
    );
    assert_eq!(first.tenant_id.as_deref(), Some("acme"));
    let comp = sim.job(&first.job_id).request.clone();
    assert_eq!(sim.payload(&first.job_id), b"undo-2");
    assert_eq!(comp.labels["saga_compensation"], "true");
    assert_eq!(comp.labels["saga_workflow_id"], "wf");
    assert_eq!(comp.tenant_id, "acme");
    // The next compensation waits for this one to finish.
    assert!(!sim.state.jobs.contains_key("acme:wf~compensation~2"));
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
    let ended = find(&ev, |e| match e {
        Event::SagaCompensationEnded(c) => Some(c),
        _ => None,
    });
    assert_eq!(
        (ended.job_id.as_str(), ended.succeeded),
        (comp.as_str(), false)
    );
    let f = finished(&ev).unwrap();
    assert_eq!(f.outcome, SagaOutcome::CompensationFailed);
    assert_eq!(f.detail, "1 of 1 compensations did not succeed");
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
    assert!(!sim.state.sagas[&saga_key("acme", "wf")].rolling_back());
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

fn dead_letters(events: &[Event]) -> Vec<&ksched_core::records::DeadLetter> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::DeadLettered(d) => Some(&*d.dead_letter),
            _ => None,
        })
        .collect()
}

/// A step's compensation names a topic its producer may not write (and whose pools belong to
/// another tenant): it is refused at admission, dead-lettered with the reason, never run.
#[test]
fn a_compensation_on_another_topic_is_refused_and_never_runs() {
    let mut rules = rules();
    rules.topics.insert("job.prod".into(), vec!["b".into()]);
    let mut sim = Sim::with_rules(rules);
    sim.worker("w1", "default");
    sim.worker("wb", "b");
    let mut s1 = step("s1", "wf", Some("rm -rf /"));
    s1.compensation.as_mut().unwrap().topic = "job.prod".into();
    sim.submit(s1);
    sim.result("s1", 1, "w1", ResultStatus::Succeeded);
    sim.submit(step("s2", "wf", None));
    let ev = sim.result("s2", 1, "w1", ResultStatus::FailedFatal);
    let dl: Vec<_> = dead_letters(&ev)
        .into_iter()
        .filter(|d| d.job_id != "s2")
        .collect();
    assert_eq!(dl.len(), 1, "{ev:?}");
    assert_eq!(dl[0].job_id, "acme:wf~compensation~1");
    assert_eq!(dl[0].reason_code, DlqReason::TenantNotAllowed.as_str());
    assert!(
        dl[0].reason.contains("step's topic job.default"),
        "{}",
        dl[0].reason
    );
    assert!(
        !names(&ev).contains(&"JobAccepted"),
        "the compensation never became a job"
    );
    assert!(!sim.state.jobs.contains_key("acme:wf~compensation~1"));
    assert_eq!(
        finished(&ev).unwrap().outcome,
        SagaOutcome::CompensationFailed
    );
}

/// A compensation without a topic runs on its step's, and passes the topic's tenant binding
/// (its id is in the tenant's namespace).
#[test]
fn a_compensation_runs_on_its_steps_bound_topic_in_its_tenants_namespace() {
    let mut rules = rules();
    rules
        .topics
        .insert("job.acme".into(), vec!["default".into()]);
    rules
        .topic_tenants
        .insert("job.acme".into(), vec!["acme".into()]);
    let mut sim = Sim::with_rules(rules);
    sim.worker("w1", "default");
    let mut s1 = step("acme:s1", "wf", Some("undo"));
    s1.topic = "job.acme".into();
    s1.compensation.as_mut().unwrap().topic = String::new();
    sim.submit(s1);
    sim.result("acme:s1", 1, "w1", ResultStatus::Succeeded);
    let mut s2 = step("acme:s2", "wf", None);
    s2.topic = "job.acme".into();
    sim.submit(s2);
    let ev = sim.result("acme:s2", 1, "w1", ResultStatus::FailedFatal);
    let comp = submitted(&ev).unwrap().job_id.clone();
    assert_eq!(comp, "acme:wf~compensation~1");
    assert_eq!(sim.job(&comp).request.topic, "job.acme");
    assert!(
        dead_letters(&ev).iter().all(|d| d.job_id == "acme:s2"),
        "only the failed step is dead-lettered: {ev:?}"
    );
    let ev = sim.result(&comp, 1, "w1", ResultStatus::Succeeded);
    assert_eq!(finished(&ev).unwrap().outcome, SagaOutcome::Compensated);
}

/// Another tenant's fatal failure under the same workflow id rolls back only its own saga.
#[test]
fn a_saga_is_its_tenants_alone() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(step("a1", "wf", Some("undo-a")));
    sim.result("a1", 1, "w1", ResultStatus::Succeeded);
    let mut b1 = step("b1", "wf", None);
    b1.tenant_id = "globex".into();
    sim.submit(b1);
    let ev = sim.result("b1", 1, "w1", ResultStatus::FailedFatal);
    assert!(submitted(&ev).is_none(), "acme's compensation ran: {ev:?}");
    assert_eq!(
        finished(&ev).unwrap().tenant_id.as_deref(),
        Some("globex"),
        "globex's own (empty) saga ended"
    );
    let acme = &sim.state.sagas[&saga_key("acme", "wf")];
    assert_eq!(acme.stack.len(), 1);
    assert!(!acme.rolling_back());
}

/// SPEC §7: each compensation follows the previous one whatever way it ended; the saga ends
/// COMPENSATION_FAILED when any did not succeed.
#[test]
fn every_compensation_runs_even_after_one_fails() {
    let mut rules = rules();
    rules.retry.max_retries = 0;
    let mut sim = Sim::with_rules(rules);
    sim.worker("w1", "default");
    for id in ["s1", "s2", "s3"] {
        sim.submit(step(id, "wf", Some(&format!("undo-{id}"))));
        sim.result(id, 1, "w1", ResultStatus::Succeeded);
    }
    sim.submit(step("s4", "wf", None));
    let ev = sim.result("s4", 1, "w1", ResultStatus::FailedFatal);
    let c1 = submitted(&ev).unwrap().job_id.clone();
    let ev = sim.result(&c1, 1, "w1", ResultStatus::FailedFatal);
    let c2 = submitted(&ev).expect("the next compensation after a failed one");
    assert_eq!(c2.for_job_id, "s2");
    let c2 = c2.job_id.clone();
    let ev = sim.cancel(&c2, None);
    let c3 = submitted(&ev).expect("the next compensation after a cancelled one");
    assert_eq!(c3.for_job_id, "s1");
    let c3 = c3.job_id.clone();
    let ev = sim.result(&c3, 1, "w1", ResultStatus::Succeeded);
    let f = finished(&ev).unwrap();
    assert_eq!(f.outcome, SagaOutcome::CompensationFailed);
    assert_eq!(f.detail, "2 of 3 compensations did not succeed");
}

/// A step still running when the rollback ended, that then succeeds, is compensated too.
#[test]
fn a_step_that_succeeds_after_the_rollback_ended_is_compensated() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(step("s1", "wf", Some("undo-1")));
    sim.submit(step("s2", "wf", None));
    let ev = sim.result("s2", 1, "w1", ResultStatus::FailedFatal);
    assert_eq!(finished(&ev).unwrap().outcome, SagaOutcome::Compensated);
    let ev = sim.result("s1", 1, "w1", ResultStatus::Succeeded);
    let late = submitted(&ev).expect("the late step's compensation");
    assert_eq!(late.for_job_id, "s1");
    let late = late.job_id.clone();
    assert!(sim.state.sagas[&saga_key("acme", "wf")].rolling_back());
    let ev = sim.result(&late, 1, "w1", ResultStatus::Succeeded);
    let f = finished(&ev).unwrap();
    assert_eq!(f.outcome, SagaOutcome::Compensated);
    assert_eq!(f.detail, "1 compensations succeeded");
}

/// Job ids of compensations cannot be taken by a producer first.
#[test]
fn a_producer_cannot_take_a_compensations_id() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    let ev = sim.submit(job("acme:wf~compensation~1"));
    let dl = dead_letters(&ev);
    assert_eq!(dl[0].reason_code, DlqReason::MalformedRecord.as_str());
    assert!(!sim.state.jobs.contains_key("acme:wf~compensation~1"));
}

/// The compensation's id is looked up in storage before the decision (a partial state
/// loads it), so a job held only on disk under it is seen, never overwritten.
#[test]
fn the_next_compensation_id_is_loaded_from_storage_before_deciding() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(step("s1", "wf", Some("undo")));
    sim.result("s1", 1, "w1", ResultStatus::Succeeded);
    sim.submit(step("s2", "wf", None));
    sim.started("s2", 1, "w1");
    let mut cold = ksched_core::state::State::tracking_changes();
    let mut storage = ColdMap::default();
    storage.jobs.extend(sim.cold.jobs.clone());
    storage.sagas.extend(sim.cold.sagas.clone());
    let mut taken = sim.job("s1").clone();
    taken.request.job_id = "acme:wf~compensation~1".into();
    storage.jobs.insert("acme:wf~compensation~1".into(), taken);
    let input = Input::Result(ksched_core::records::JobResult {
        job_id: "s2".into(),
        attempt: 1,
        worker_id: "w1".into(),
        status: ResultStatus::FailedFatal,
        error_code: None,
        error_message: None,
        result_ptr: None,
        result_meta: Default::default(),
        execution_ms: 1,
        finished_at: 0,
    });
    cold.load_for_input(&input, &storage)
        .unwrap_or_else(|e| match e {});
    assert!(cold.sagas.contains_key(&saga_key("acme", "wf")));
    assert!(
        cold.jobs.contains_key("acme:wf~compensation~1"),
        "the id the next compensation takes is loaded"
    );
}

/// A redrive may not take a compensation's id either.
#[test]
fn a_redrive_cannot_take_a_compensations_id() {
    let mut rules = rules();
    rules.retry.max_retries = 0;
    let mut sim = Sim::with_rules(rules);
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    sim.result("j1", 1, "w1", ResultStatus::FailedFatal);
    let ev = sim.input(
        "ksched.control",
        Input::Redrive(ksched_core::records::RedriveJob {
            job_id: "j1".into(),
            new_job_id: "acme:wf~compensation~1".into(),
            tenant_id: None,
            principal_id: "op".into(),
            reason: None,
            requested_at: 0,
        }),
    );
    assert!(names(&ev).contains(&"CommandRejected"), "{ev:?}");
    assert!(!sim.state.jobs.contains_key("acme:wf~compensation~1"));
}

/// A step recorded by a scheduler before sagas were the tenant's (decision format 2, keyed
/// by the workflow alone) is still compensated when a step of its tenant fails after the
/// upgrade.
#[test]
fn a_step_recorded_before_sagas_were_the_tenants_is_compensated_after_the_upgrade() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(step("s1", "wf", Some("undo-1")));
    let ev = sim.result("s1", 1, "w1", ResultStatus::Succeeded);
    // Take the step back out and journal it as the older scheduler did.
    let recorded = find(&ev, |e| match e {
        Event::SagaStepRecorded(r) => Some(r),
        _ => None,
    })
    .clone();
    let mut legacy = sim.journal[sim.last].clone();
    legacy.format = 2;
    legacy.events = vec![Event::SagaStepRecorded(recorded)];
    legacy.input = Input::Tick(ksched_core::records::Tick {
        source: "older".into(),
        issued_at: sim.now,
        watermark: None,
    });
    // The current entry's own push is undone by a rollback-free state: start over with a
    // scheduler that saw only the legacy push.
    let mut sim2 = Sim::new();
    sim2.worker("w1", "default");
    sim2.submit(step("s1", "wf", Some("undo-1")));
    sim2.started("s1", 1, "w1");
    sim2.inject(legacy);
    assert!(
        sim2.state.sagas.contains_key("wf"),
        "kept under the workflow alone"
    );
    sim2.submit(step("s2", "wf", None));
    let ev = sim2.result("s2", 1, "w1", ResultStatus::FailedFatal);
    let c = submitted(&ev).expect("the legacy step's compensation runs");
    assert_eq!(c.for_job_id, "s1");
    assert_eq!(c.tenant_id, None, "the saga keyed by its workflow");
    let comp = c.job_id.clone();
    let ev = sim2.result(&comp, 1, "w1", ResultStatus::Succeeded);
    assert_eq!(finished(&ev).unwrap().outcome, SagaOutcome::Compensated);
}

/// A compensation's template carries no idempotency key into its job: it would take over
/// the key of one of the tenant's own submissions.
#[test]
fn a_compensation_takes_no_idempotency_key() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    let mut s1 = step("s1", "wf", Some("undo"));
    s1.compensation.as_mut().unwrap().meta.idempotency_key = Some("order-7".into());
    sim.submit(s1);
    sim.result("s1", 1, "w1", ResultStatus::Succeeded);
    sim.submit(step("s2", "wf", None));
    let ev = sim.result("s2", 1, "w1", ResultStatus::FailedFatal);
    let comp = submitted(&ev).unwrap().job_id.clone();
    assert_eq!(sim.job(&comp).request.meta.idempotency_key, None);
    let mut order = job("order");
    order.meta.idempotency_key = Some("order-7".into());
    let ev = sim.submit(order);
    assert!(
        names(&ev).contains(&"JobAccepted"),
        "the key is the tenant's own"
    );
}
