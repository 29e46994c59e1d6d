//! Retries, worker loss, the reconciler and deadlines (SPEC §4).

mod support;

use ksched_core::decide::backoff_ms;
use ksched_core::events::*;
use ksched_core::records::{Heartbeat, ResultStatus};
use ksched_core::rules::RetryRules;
use support::*;

fn retrying(events: &[Event]) -> &JobRetrying {
    find(events, |e| match e {
        Event::JobRetrying(r) => Some(r),
        _ => None,
    })
}

#[test]
fn a_retryable_failure_backs_off_then_runs_again_and_succeeds() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    let ev = sim.result_with("j1", 1, "w1", ResultStatus::FailedRetryable, Some("flaky"));
    let r = retrying(&ev).clone();
    assert_eq!(r.attempt, 1);
    assert_eq!(r.error_code, "flaky");
    assert_eq!(r.backoff_ms, backoff_ms(&RetryRules::default(), "j1", 1));
    assert!((1_000..1_200).contains(&r.backoff_ms), "{}", r.backoff_ms);
    assert_eq!(r.retry_at, sim.now + r.backoff_ms);
    assert_eq!(sim.job_state("j1"), JobState::Pending);
    assert!(sim.state.queued.is_empty(), "not queued during the backoff");
    assert!(
        sim.dead_letters().is_empty(),
        "FAILED_RETRYABLE suppresses the DLQ"
    );

    // Not before retry_at.
    let ev = sim.tick_after(r.backoff_ms - 1);
    assert!(!names(&ev).contains(&"JobQueued"), "{:?}", names(&ev));
    let ev = sim.tick_after(1);
    assert!(names(&ev).contains(&"JobDispatched"), "{:?}", names(&ev));
    assert_eq!(sim.job("j1").attempt, 2);
    assert_eq!(sim.dispatches().last().unwrap().attempt, 2);
    sim.result("j1", 2, "w1", ResultStatus::Succeeded);
    assert_eq!(sim.job_state("j1"), JobState::Succeeded);
}

#[test]
fn retries_run_out_into_max_retries_exceeded() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    let mut backoffs = Vec::new();
    for attempt in 1..=4 {
        sim.worker("w1", "default");
        let ev = sim.result("j1", attempt, "w1", ResultStatus::FailedRetryable);
        if attempt < 4 {
            let r = retrying(&ev);
            backoffs.push(r.backoff_ms);
            sim.tick_after(r.backoff_ms);
            assert_eq!(sim.job("j1").attempt, attempt + 1);
        } else {
            assert_eq!(
                names(&ev),
                ["JobRunning", "JobFailed", "BreakerCounted", "DeadLettered"]
            );
            let dl = dead_lettered(&ev);
            assert_eq!(dl.reason_code, "max_retries_exceeded");
            assert_eq!(dl.attempts, 4);
        }
    }
    // 1 s, 2 s, 4 s, each plus up to 20 % jitter.
    for (i, b) in backoffs.iter().enumerate() {
        let base = 1_000 << i;
        assert!((base..base + base / 5).contains(b), "{backoffs:?}");
    }
    assert_eq!(sim.job_state("j1"), JobState::Failed);
}

#[test]
fn a_fatal_failure_fails_at_once_with_the_workers_error_code() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    let ev = sim.result_with("j1", 1, "w1", ResultStatus::FailedFatal, Some("bad_input"));
    assert_eq!(
        names(&ev),
        ["JobRunning", "JobFailed", "BreakerCounted", "DeadLettered"]
    );
    assert_eq!(dead_lettered(&ev).reason_code, "bad_input");
    let ev = {
        sim.submit(job("j2"));
        sim.result("j2", 1, "w1", ResultStatus::FailedFatal)
    };
    assert_eq!(
        dead_lettered(&ev).reason_code,
        "failed_fatal",
        "a default when the worker gives none"
    );
}

#[test]
fn a_lost_worker_s_jobs_are_retried_as_worker_lost() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    sim.submit(job("j2"));
    sim.started("j1", 1, "w1");
    sim.advance(10_000);
    sim.worker("w2", "default");
    sim.tick_after(5_000); // w1 last seen 15 s ago: not yet lost (> ttl)
    assert!(sim.state.workers["w1"].alive);
    sim.worker("w2", "default");
    let ev = sim.tick_after(1);
    let lost = find(&ev, |e| match e {
        Event::WorkerLost(l) => Some(l),
        _ => None,
    });
    assert_eq!(lost.worker_id, "w1");
    assert_eq!(lost.job_ids, ["j1", "j2"]);
    let retries: Vec<&JobRetrying> = ev
        .iter()
        .filter_map(|e| match e {
            Event::JobRetrying(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(retries.len(), 2);
    assert!(retries.iter().all(|r| r.error_code == "worker_lost"));
    assert!(!sim.state.workers["w1"].alive);
    assert!(sim.state.workers["w1"].inflight.is_empty());
    // After the backoff they go to w2; the lost worker's late result is fenced off.
    sim.worker("w2", "default");
    sim.tick_after(2_000);
    assert_eq!(sim.job("j1").worker_id.as_deref(), Some("w2"));
    let ev = sim.result("j1", 1, "w1", ResultStatus::Succeeded);
    assert_eq!(rejected(&ev).reason_code, "stale_attempt");
    // A lost worker that comes back rejoins.
    let ev = sim.worker("w1", "default");
    match &ev[0] {
        Event::WorkerUpdated(u) => assert!(u.joined),
        e => panic!("{e:?}"),
    }
}

#[test]
fn a_draining_worker_handing_a_job_back_gets_it_retried_elsewhere() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    sim.heartbeat(Heartbeat {
        draining: true,
        ..hb("w1", "default")
    });
    sim.worker("w2", "default");
    let ev = sim.result("j1", 1, "w1", ResultStatus::Cancelled);
    assert_eq!(retrying(&ev).error_code, "handed_back");
    let ev = sim.tick_after(2_000);
    assert_eq!(scheduled(&ev).worker_id, "w2");
}

#[test]
fn reconciler_times_out_a_dispatch_that_never_started() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    for _ in 0..5 {
        sim.advance(10_000);
        sim.worker("w1", "default");
        sim.tick_after(0);
    }
    sim.advance(9_999);
    sim.worker("w1", "default");
    sim.tick_after(0);
    assert_eq!(
        sim.job_state("j1"),
        JobState::Dispatched,
        "59.999 s: not yet"
    );
    sim.advance(1);
    let ev = sim.tick_after(0); // 60 s: the timeout has elapsed
    assert_eq!(
        names(&ev),
        [
            "JobTimedOut",
            "BreakerCounted",
            "DispatchCancelled",
            "DeadLettered"
        ]
    );
    assert_eq!(dead_lettered(&ev).reason_code, "timeout");
    let c = sim.cancel_dispatches();
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].job_id.as_str(), c[0].attempt, c[0].reason.as_str()),
        ("j1", 1, "timeout")
    );
}

#[test]
fn reconciler_times_out_a_silent_running_job_but_evidence_keeps_it_alive() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    sim.submit(job("j2"));
    sim.started("j1", 1, "w1");
    sim.started("j2", 1, "w1");
    // Heartbeats list j1 only: j1 stays alive, j2 goes silent.
    for _ in 0..31 {
        sim.advance(10_000);
        sim.heartbeat(Heartbeat {
            active_jobs: 2,
            active_job_ids: vec!["j1".into()],
            ..hb("w1", "default")
        });
        sim.tick_after(0);
    }
    assert_eq!(sim.job_state("j1"), JobState::Running);
    assert_eq!(sim.job_state("j2"), JobState::Timeout);
    let dl = sim.dead_letters();
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].reason_code, "timeout");
    assert!(
        dl[0].reason.contains("no progress or heartbeat"),
        "{}",
        dl[0].reason
    );
}

#[test]
fn max_runtime_times_out_a_running_job() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    let mut r = job("j1");
    r.budget.max_runtime_ms = Some(5_000);
    sim.submit(r);
    sim.started("j1", 1, "w1");
    assert_eq!(sim.dispatches()[0].constraints.max_runtime_ms, Some(5_000));
    sim.tick_after(4_999);
    assert_eq!(sim.job_state("j1"), JobState::Running);
    let ev = sim.tick_after(1);
    assert_eq!(
        names(&ev)[..4],
        [
            "JobTimedOut",
            "BreakerCounted",
            "DispatchCancelled",
            "DeadLettered"
        ]
    );
    assert!(dead_lettered(&ev).reason.contains("max_runtime_ms 5000"));
}

#[test]
fn the_deadline_counts_from_acceptance_in_every_non_terminal_state() {
    // PENDING (no workers)
    let mut sim = Sim::new();
    let mut r = job("p");
    r.budget.deadline_ms = Some(1_000);
    sim.submit(r);
    let ev = sim.tick_after(1_000);
    assert_eq!(names(&ev)[..2], ["JobTimedOut", "DeadLettered"]);
    assert_eq!(dead_lettered(&ev).reason_code, "deadline_exceeded");
    assert_eq!(dead_lettered(&ev).last_state, "TIMEOUT");

    // RUNNING: the attempt is cancelled on its worker.
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    let mut r = job("r");
    r.budget.deadline_ms = Some(3_000);
    sim.submit(r);
    sim.started("r", 1, "w1");
    let ev = sim.tick_after(2_000);
    assert_eq!(sim.job_state("r"), JobState::Running, "{:?}", names(&ev));
    let ev = sim.tick_after(1_000);
    assert_eq!(
        names(&ev)[..3],
        ["JobTimedOut", "DispatchCancelled", "DeadLettered"]
    );
    assert_eq!(sim.dispatches()[0].deadline_at, Some(T0 + 3_000));

    // The producer's clock counts for nothing, earlier or later, and a retry never resets
    // the deadline.
    for claimed in [T0 - 1_500, T0 + 3_600_000] {
        let mut sim = Sim::new();
        sim.worker("w1", "default");
        let mut r = job("b");
        r.budget.deadline_ms = Some(2_000);
        r.submitted_at = claimed;
        sim.submit(r);
        assert_eq!(sim.job("b").deadline_at, Some(T0 + 2_000));
        sim.result("b", 1, "w1", ResultStatus::FailedRetryable);
        let ev = sim.tick_after(1_500);
        assert_eq!(sim.job("b").attempt, 2, "retried: {:?}", names(&ev));
        assert_eq!(sim.job_state("b"), JobState::Dispatched);
        let ev = sim.tick_after(500);
        assert_eq!(dead_lettered(&ev).reason_code, "deadline_exceeded");
    }
}

/// The policy's runtime limit does not loosen a tighter one the job set (the smaller wins,
/// as for deadlines); nor does the job's loosen the policy's.
#[test]
fn the_tighter_of_the_jobs_and_the_policys_runtime_limit_applies() {
    for (job_limit, policy_limit, want) in [
        (Some(5_000), Some(60_000), Some(5_000)),
        (Some(60_000), Some(5_000), Some(5_000)),
        (None, Some(5_000), Some(5_000)),
        (Some(5_000), None, Some(5_000)),
    ] {
        let mut policy = ScriptPolicy::default();
        policy.input.push(Box::new(move |_| {
            Some(ksched_core::policy::PolicyDecision {
                limit_exceeded: false,
                verdict: Verdict::Allow,
                reasons: vec![],
                constraints: ksched_core::records::Constraints {
                    max_runtime_ms: policy_limit,
                    ..Default::default()
                },
            })
        }));
        let mut sim = Sim::with_policy(rules(), policy);
        sim.worker("w1", "default");
        let mut r = job("j1");
        r.budget.max_runtime_ms = job_limit;
        sim.submit(r);
        assert_eq!(
            sim.job("j1").constraints.max_runtime_ms,
            want,
            "job {job_limit:?}, policy {policy_limit:?}"
        );
    }
}

/// A policy's deadline of 0 (or less) is no deadline: it does not erase the job's own.
#[test]
fn a_policy_deadline_that_is_not_one_keeps_the_jobs_own() {
    let mut policy = ScriptPolicy::default();
    policy.input.push(Box::new(|_| {
        Some(ksched_core::policy::PolicyDecision {
            limit_exceeded: false,
            verdict: Verdict::Allow,
            reasons: vec![],
            constraints: ksched_core::records::Constraints {
                deadline_ms: Some(0),
                ..Default::default()
            },
        })
    }));
    let mut sim = Sim::with_policy(rules(), policy);
    let mut r = job("j1");
    r.budget.deadline_ms = Some(5_000);
    sim.submit(r);
    assert_eq!(sim.job("j1").constraints.deadline_ms, Some(5_000));
}
