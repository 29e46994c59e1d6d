//! Job states and transitions (SPEC §2): the happy path, every allowed transition, and the
//! rejected ones, which are journaled and change nothing.

mod support;

use ksched_core::events::*;
use ksched_core::records::{JobProgress, ResultStatus};
use support::*;

#[test]
fn submit_dispatch_start_succeed() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    let ev = sim.submit(job("j1"));
    assert_eq!(
        names(&ev),
        [
            "JobAccepted",
            "PolicyEvaluated",
            "JobQueued",
            "JobScheduled",
            "JobDispatched"
        ]
    );
    assert_eq!(sim.job_state("j1"), JobState::Dispatched);
    let d = sim.dispatches();
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0].attempt, d[0].worker_id.as_str(), d[0].pool.as_str()),
        (1, "w1", "default")
    );
    assert_eq!(d[0].job.job_id, "j1");

    let ev = sim.started("j1", 1, "w1");
    assert_eq!(names(&ev), ["JobRunning"]);
    assert_eq!(sim.job_state("j1"), JobState::Running);

    let ev = sim.result("j1", 1, "w1", ResultStatus::Succeeded);
    assert_eq!(names(&ev), ["JobSucceeded", "BreakerCounted"]);
    let j = sim.job("j1");
    assert_eq!(j.state, JobState::Succeeded);
    assert_eq!(j.attempt, 1);
    let lines = sim.history("j1");
    let history: Vec<&str> = lines.iter().map(|h| h.event.as_ref()).collect();
    assert_eq!(
        history,
        [
            "JobAccepted",
            "PolicyEvaluated",
            "JobQueued",
            "JobScheduled",
            "JobDispatched",
            "JobRunning",
            "JobSucceeded"
        ]
    );
    assert!(sim.dead_letters().is_empty());
    assert_eq!(sim.state.tenant_active_jobs("acme"), 0);
}

#[test]
fn the_topic_the_record_was_read_from_overrides_the_topic_field() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    let mut r = job("j1");
    r.topic = "job.gpu".into(); // a producer cannot route itself elsewhere
    sim.input("job.default", Input::Submit(r));
    assert_eq!(sim.job("j1").request.topic, "job.default");
    assert_eq!(sim.job("j1").pools, ["default"]);
}

#[test]
fn a_result_without_a_started_implies_the_start() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    let ev = sim.result("j1", 1, "w1", ResultStatus::Succeeded);
    assert_eq!(names(&ev), ["JobRunning", "JobSucceeded", "BreakerCounted"]);
}

#[test]
fn progress_is_recorded_and_implies_the_start() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    let ev = sim.input(
        "ksched.results",
        Input::Progress(ksched_core::records::JobProgress {
            job_id: "j1".into(),
            attempt: 1,
            worker_id: "w1".into(),
            progress: 1.7, // clamped
            message: Some("warming up".into()),
            sent_at: 0,
        }),
    );
    assert_eq!(names(&ev), ["JobRunning", "JobProgressed"]);
    assert_eq!(sim.job("j1").progress, Some(1.0));
    for p in [0.2, 0.4] {
        sim.input(
            "ksched.results",
            Input::Progress(ksched_core::records::JobProgress {
                job_id: "j1".into(),
                attempt: 1,
                worker_id: "w1".into(),
                progress: p,
                message: None,
                sent_at: 0,
            }),
        );
    }
    let progress_lines = sim
        .history("j1")
        .iter()
        .filter(|h| h.event == "JobProgressed")
        .count();
    assert_eq!(
        progress_lines, 1,
        "a run of progress keeps one history line"
    );
}

#[test]
fn a_start_by_another_worker_of_the_pool_is_accepted_as_a_reassignment() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.worker("w2", "default");
    sim.submit(job("j1"));
    let chosen = sim.job("j1").worker_id.clone().unwrap();
    let other = if chosen == "w1" { "w2" } else { "w1" };
    let ev = sim.started("j1", 1, other);
    match &ev[0] {
        Event::JobRunning(r) => {
            assert_eq!(r.worker_id, other);
            assert_eq!(r.reassigned_from.as_deref(), Some(chosen.as_str()));
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(sim.job("j1").worker_id.as_deref(), Some(other));
    assert!(sim.state.workers[other].inflight.contains("j1"));
    assert!(!sim.state.workers[&chosen].inflight.contains("j1"));
}

#[test]
fn reports_for_older_attempts_are_recorded_and_ignored() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    sim.result("j1", 1, "w1", ResultStatus::FailedRetryable);
    sim.tick_after(10_000); // backoff passes, attempt 2 dispatched
    assert_eq!(sim.job("j1").attempt, 2);
    assert_eq!(sim.job_state("j1"), JobState::Dispatched);
    let ev = sim.result("j1", 1, "w1", ResultStatus::Succeeded);
    let r = rejected(&ev);
    assert_eq!(r.reason_code, "stale_attempt");
    assert_eq!(r.state, Some(JobState::Dispatched));
    assert_eq!(sim.job_state("j1"), JobState::Dispatched, "unchanged");
    let ev = sim.started("j1", 3, "w1");
    assert_eq!(rejected(&ev).reason_code, "unknown_attempt");
}

/// A start that agrees with the job (its worker reported progress first, or started it
/// twice) is no refusal: nothing happens and nothing is journaled against it.
#[test]
fn a_start_after_progress_or_a_second_start_changes_nothing_and_refuses_nothing() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    sim.input(
        "ksched.results",
        Input::Progress(JobProgress {
            job_id: "j1".into(),
            attempt: 1,
            worker_id: "w1".into(),
            progress: 0.5,
            message: None,
            sent_at: 0,
        }),
    );
    assert_eq!(sim.job_state("j1"), JobState::Running);
    for _ in 0..2 {
        let ev = sim.started("j1", 1, "w1");
        assert!(ev.is_empty(), "{ev:?}");
    }
    assert_eq!(sim.job_state("j1"), JobState::Running);
    // From another worker it is still refused.
    let ev = sim.started("j1", 1, "w2");
    assert_eq!(rejected(&ev).reason_code, "not_assigned_worker");
}

#[test]
fn terminal_jobs_never_change_and_the_rejection_is_journaled() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    sim.result("j1", 1, "w1", ResultStatus::Succeeded);
    for ev in [
        sim.started("j1", 1, "w1"),
        sim.result("j1", 1, "w1", ResultStatus::FailedFatal),
        sim.cancel("j1", None),
    ] {
        let r = rejected(&ev);
        assert_eq!(r.reason_code, "invalid_transition", "{r:?}");
        assert_eq!(r.state, Some(JobState::Succeeded));
        assert_eq!(r.job_id, "j1");
    }
    assert_eq!(sim.job_state("j1"), JobState::Succeeded);
    let rejections = sim
        .history("j1")
        .iter()
        .filter(|h| h.event == "CommandRejected")
        .count();
    assert_eq!(rejections, 3, "each rejection is in the job's history");
}

#[test]
fn reports_for_unknown_jobs_are_rejected() {
    let mut sim = Sim::new();
    let ev = sim.started("nope", 1, "w1");
    let r = rejected(&ev);
    assert_eq!(r.reason_code, "unknown_job");
    assert_eq!(r.job_id, "");
    assert_eq!(r.state, None);
}

#[test]
fn the_transition_table_matches_the_spec() {
    use JobState::*;
    let allowed = [
        (Pending, Scheduled),
        (Pending, Denied),
        (Pending, ApprovalRequired),
        (Pending, Cancelled),
        (Pending, Timeout),
        (Pending, Failed),
        // Run-at (SPEC §9): an allowed or approved job waits for its time.
        (Pending, Delayed),
        (Delayed, Pending),
        (Delayed, Cancelled),
        // Dependencies (SPEC §11): an allowed or approved job waits for other jobs.
        (Pending, Blocked),
        (Blocked, Pending),
        (Blocked, Cancelled),
        (Blocked, Failed),
        (ApprovalRequired, Pending),
        (ApprovalRequired, Denied),
        (ApprovalRequired, Cancelled),
        (ApprovalRequired, Timeout),
        (Scheduled, Dispatched),
        (Scheduled, Cancelled),
        (Scheduled, Timeout),
        (Dispatched, Running),
        (Dispatched, Succeeded),
        (Dispatched, Pending),
        (Dispatched, Failed),
        (Dispatched, Cancelled),
        (Dispatched, Timeout),
        (Running, Succeeded),
        (Running, Pending),
        (Running, Failed),
        (Running, Cancelled),
        (Running, Timeout),
        (Succeeded, OutputQuarantined),
    ];
    for from in JobState::ALL {
        for to in JobState::ALL {
            assert_eq!(
                from.can_transition(to),
                allowed.contains(&(from, to)),
                "{from} -> {to}"
            );
        }
    }
    for t in [
        Succeeded,
        Failed,
        Cancelled,
        Timeout,
        Denied,
        OutputQuarantined,
    ] {
        assert!(t.is_terminal());
    }
}

#[test]
fn every_state_change_in_the_journal_follows_the_transition_table() {
    // Drive a job through many paths and check each journaled change against the table.
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("a"));
    sim.result("a", 1, "w1", ResultStatus::FailedRetryable);
    sim.tick_after(5_000);
    sim.started("a", 2, "w1");
    sim.result("a", 2, "w1", ResultStatus::Succeeded);
    sim.submit(job("b"));
    sim.cancel("b", Some("acme"));
    sim.submit(job("c"));
    sim.keep_alive(&[("w1", "default")]); // alive, but c is never started
    sim.advance(61_000);
    sim.tick_after(0); // dispatch timeout
    let mut last: std::collections::BTreeMap<String, JobState> = Default::default();
    sim.replay_each(|replay, e| {
        if let Some(id) = e.job_id()
            && let Some(j) = replay.jobs.get(id)
        {
            if let Some(prev) = last.get(id)
                && *prev != j.state
            {
                assert!(prev.can_transition(j.state), "{id}: {prev} -> {}", j.state);
            }
            last.insert(id.to_owned(), j.state);
        }
    });
    assert_eq!(last["a"], JobState::Succeeded);
    assert_eq!(last["b"], JobState::Cancelled);
    assert_eq!(last["c"], JobState::Timeout);
}
