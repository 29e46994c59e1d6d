//! Run-at and delayed jobs (SPEC §9): a job with a `not_before` ahead waits DELAYED until
//! scheduler time (a Tick's watermark) reaches it, then runs as if submitted then. Every
//! scenario also runs on partial states whose delay windows hold two keys, so releases read
//! the store's index as the processor does (tests/support: `Sim`).

mod support;

use ksched_core::events::*;
use ksched_core::policy::PolicyDecision;
use ksched_core::records::{ApproveJob, Budget, RescheduleJob, ResultStatus, Tick};
use ksched_core::rules::Rules;
use support::*;

fn at(id: &str, not_before: i64) -> ksched_core::records::JobRequest {
    ksched_core::records::JobRequest {
        not_before: Some(not_before),
        ..job(id)
    }
}

fn reschedule(sim: &mut Sim, id: &str, not_before: i64, tenant: Option<&str>) -> Vec<Event> {
    let now = sim.now;
    sim.input(
        "ksched.control",
        Input::Reschedule(RescheduleJob {
            job_id: id.into(),
            not_before,
            tenant_id: tenant.map(str::to_owned),
            principal_id: "op".into(),
            reason: Some("moved".into()),
            requested_at: now,
        }),
    )
}

fn approve(sim: &mut Sim, id: &str) -> Vec<Event> {
    let hash = sim.job(id).job_hash.clone();
    sim.input(
        "ksched.control",
        Input::Approve(ApproveJob {
            job_id: id.into(),
            job_hash: hash,
            policy_snapshot: "snap-1".into(),
            approver: "bob".into(),
            comment: None,
            requested_at: 0,
        }),
    )
}

fn decision(verdict: Verdict, why: &str) -> PolicyDecision {
    PolicyDecision {
        verdict,
        reasons: vec![why.to_owned()],
        ..PolicyDecision::allow()
    }
}

fn released(events: &[Event]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::JobReleased(r) => Some(r.job_id.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_job_waits_delayed_until_its_time_then_runs_as_if_submitted_then() {
    let mut sim = Sim::new();
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    let ev = sim.submit(at("j1", T0 + 60_000));
    assert_eq!(
        names(&ev),
        ["JobAccepted", "PolicyEvaluated", "JobDelayed"],
        "judged by the policy at acceptance, then it waits"
    );
    assert_eq!(sim.job_state("j1"), JobState::Delayed);
    assert!(sim.dispatches().is_empty());
    // A worker that frees up does not take it early.
    sim.worker("w1", "default");
    let ev = sim.tick_after(59_000);
    assert!(released(&ev).is_empty(), "{:?}", names(&ev));
    assert_eq!(sim.job_state("j1"), JobState::Delayed);
    let ev = sim.tick_after(1_000);
    assert_eq!(released(&ev), ["j1"]);
    let r = find(&ev, |e| match e {
        Event::JobReleased(r) => Some(r),
        _ => None,
    });
    assert_eq!((r.not_before, r.released_at), (T0 + 60_000, T0 + 60_000));
    assert_eq!(sim.dispatches().len(), 1, "placed by the same Tick");
    assert_eq!(sim.job_state("j1"), JobState::Dispatched);
    assert_eq!(sim.job("j1").released_at, Some(T0 + 60_000));
    assert!(
        sim.history("j1")
            .iter()
            .any(|h| h.event == "JobDelayed" && h.detail.starts_with("delayed until ")),
        "{:?}",
        sim.history("j1")
    );
}

#[test]
fn a_time_already_passed_runs_now_and_a_negative_one_is_refused() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    let ev = sim.submit(at("past", T0 - 3_600_000));
    assert!(!names(&ev).contains(&"JobDelayed"));
    assert_eq!(sim.job_state("past"), JobState::Dispatched);
    sim.submit(at("now", T0));
    assert_eq!(sim.job_state("now"), JobState::Dispatched, "not after now");
    let ev = sim.submit(at("neg", -1));
    assert_eq!(dead_lettered(&ev).reason_code, "malformed_record");
    assert!(!sim.state.jobs.contains_key("neg"));
}

#[test]
fn a_delay_beyond_max_delay_is_dead_lettered() {
    let mut rules = rules();
    rules.limits.max_delay_ms = 3_600_000;
    let mut sim = Sim::with_rules(rules);
    sim.submit(at("ok", T0 + 3_600_000));
    assert_eq!(sim.job_state("ok"), JobState::Delayed);
    let ev = sim.submit(at("far", T0 + 3_600_001));
    let dl = dead_lettered(&ev);
    assert_eq!(dl.reason_code, "delay_too_long");
    assert!(dl.reason.contains("limits.max_delay_ms"), "{}", dl.reason);
    assert!(!sim.state.jobs.contains_key("far"));
    let ev = sim.submit(at("absurd", i64::MAX));
    assert_eq!(dead_lettered(&ev).reason_code, "delay_too_long");
}

#[test]
fn the_shard_holds_at_most_max_delayed_jobs() {
    let mut rules = rules();
    rules.limits.max_delayed_jobs = 2;
    let mut sim = Sim::with_rules(rules);
    sim.submit(at("a", T0 + 10_000));
    sim.submit(at("b", T0 + 10_000));
    let ev = sim.submit(at("c", T0 + 10_000));
    assert_eq!(dead_lettered(&ev).reason_code, "queue_full");
    // A job that need not wait is not counted against it.
    sim.submit(job("d"));
    assert_eq!(sim.job_state("d"), JobState::Pending);
}

#[test]
fn the_deadline_counts_from_the_release() {
    let mut sim = Sim::new();
    let ev = sim.submit(ksched_core::records::JobRequest {
        budget: Budget {
            deadline_ms: Some(5_000),
            max_runtime_ms: None,
        },
        ..at("j1", T0 + 60_000)
    });
    assert!(names(&ev).contains(&"JobDelayed"));
    // Its five seconds from acceptance pass while it waits: nothing times it out.
    let ev = sim.tick_after(30_000);
    assert!(!names(&ev).contains(&"JobTimedOut"), "{:?}", names(&ev));
    sim.tick_after(30_000);
    assert_eq!(
        sim.job_state("j1"),
        JobState::Pending,
        "released, no worker"
    );
    assert_eq!(sim.job("j1").deadline_at, Some(T0 + 65_000));
    let ev = sim.tick_after(5_000);
    let dl = dead_lettered(&ev);
    assert_eq!(dl.reason_code, "deadline_exceeded");
    assert_eq!(sim.job_state("j1"), JobState::Timeout);
}

#[test]
fn a_delayed_job_is_cancelled_and_never_released() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(at("j1", T0 + 10_000));
    let ev = sim.cancel("j1", Some("acme"));
    assert_eq!(names(&ev), ["JobCancelled"]);
    assert_eq!(sim.job_state("j1"), JobState::Cancelled);
    assert!(sim.cancel_dispatches().is_empty());
    let ev = sim.tick_after(20_000);
    assert!(released(&ev).is_empty());
    assert!(sim.dispatches().is_empty());
    // Another tenant may not cancel one.
    sim.submit(at("j2", T0 + 60_000));
    let ev = sim.cancel("j2", Some("other"));
    assert_eq!(rejected(&ev).reason_code, "tenant_mismatch");
    assert_eq!(sim.job_state("j2"), JobState::Delayed);
}

#[test]
fn a_reschedule_moves_a_delayed_job_and_only_a_delayed_one() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(at("later", T0 + 5_000));
    sim.submit(at("sooner", T0 + 60_000));
    let ev = reschedule(&mut sim, "later", T0 + 30_000, Some("acme"));
    let r = find(&ev, |e| match e {
        Event::JobRescheduled(r) => Some(r),
        _ => None,
    });
    assert_eq!((r.previous, r.not_before), (T0 + 5_000, T0 + 30_000));
    let ev = reschedule(&mut sim, "sooner", T0 + 1_000, None);
    assert!(names(&ev).contains(&"JobRescheduled"));
    let ev = sim.tick_after(10_000);
    assert_eq!(released(&ev), ["sooner"], "moved earlier, it goes first");
    assert_eq!(sim.job_state("later"), JobState::Delayed);
    let ev = sim.tick_after(20_000);
    assert_eq!(released(&ev), ["later"]);
    // Not waiting any more: refused, and journaled.
    let ev = reschedule(&mut sim, "later", T0 + 90_000, None);
    assert_eq!(rejected(&ev).reason_code, "not_delayed");
    sim.submit(at("x", T0 + 60_000));
    let ev = reschedule(&mut sim, "x", T0 + 60_000, Some("other"));
    assert_eq!(rejected(&ev).reason_code, "tenant_mismatch");
    let ev = reschedule(&mut sim, "x", -5, None);
    assert_eq!(rejected(&ev).reason_code, "invalid_time");
    let ev = reschedule(&mut sim, "x", i64::MAX, None);
    assert_eq!(rejected(&ev).reason_code, "invalid_time");
    let ev = reschedule(&mut sim, "nobody", T0, None);
    assert_eq!(rejected(&ev).reason_code, "unknown_job");
}

#[test]
fn a_job_needing_approval_is_approved_while_it_waits_for_its_time() {
    let mut policy = ScriptPolicy::default();
    policy.input.push(Box::new(|_| {
        Some(decision(Verdict::RequireApproval, "needs a human"))
    }));
    let mut sim = Sim::with_policy(rules(), policy);
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    sim.submit(at("j1", T0 + 60_000));
    assert_eq!(sim.job_state("j1"), JobState::ApprovalRequired);
    let ev = approve(&mut sim, "j1");
    assert_eq!(names(&ev), ["JobApproved", "JobDelayed"]);
    let ev = sim.tick_after(60_000);
    assert_eq!(released(&ev), ["j1"]);
    assert_eq!(sim.job_state("j1"), JobState::Dispatched);
    // Approved after its time: it runs at once.
    sim.submit(at("j2", T0 + 61_000));
    sim.tick_after(5_000);
    let ev = approve(&mut sim, "j2");
    assert!(!names(&ev).contains(&"JobDelayed"), "{:?}", names(&ev));
    assert!(names(&ev).contains(&"JobScheduled"), "{:?}", names(&ev));
}

#[test]
fn a_denied_job_is_refused_at_acceptance_not_at_its_time() {
    let mut policy = ScriptPolicy::default();
    policy
        .input
        .push(Box::new(|_| Some(decision(Verdict::Deny, "no"))));
    let mut sim = Sim::with_policy(rules(), policy);
    let ev = sim.submit(at("j1", T0 + 3_600_000));
    assert_eq!(dead_lettered(&ev).reason_code, "safety_denied");
    assert_eq!(sim.job_state("j1"), JobState::Denied);
}

#[test]
fn many_due_at_once_are_released_in_time_order_across_entries() {
    let mut rules = rules();
    rules.limits.max_work_per_entry = 7;
    let mut sim = Sim::with_rules(rules);
    sim.worker("w1", "default");
    // Thirty jobs due at three times, submitted out of order.
    for i in (0..30).rev() {
        sim.submit(at(&format!("j{i:02}"), T0 + 10_000 + (i / 10) * 1_000));
    }
    assert_eq!(sim.state.jobs_by_state[&JobState::Delayed], 30);
    let before = sim.continuations;
    let ev = sim.tick_after(20_000);
    let order = released(&ev);
    let expected: Vec<String> = (0..30).map(|i| format!("j{i:02}")).collect();
    assert_eq!(order, expected, "earliest first, then by id");
    assert!(
        sim.continuations > before,
        "more than one entry's work: continued"
    );
    assert_eq!(sim.state.jobs_by_state.get(&JobState::Delayed), None);
}

#[test]
fn a_watermark_that_lags_holds_a_release_back() {
    let mut sim = Sim::new();
    sim.submit(at("j1", T0 + 10_000));
    sim.now = T0 + 20_000;
    let ev = sim.input(
        "ksched.control",
        Input::Tick(Tick {
            source: "test".into(),
            issued_at: T0 + 20_000,
            watermark: Some(T0 + 9_999),
        }),
    );
    assert!(released(&ev).is_empty(), "scheduler time is the watermark");
    let ev = sim.input(
        "ksched.control",
        Input::Tick(Tick {
            source: "test".into(),
            issued_at: T0 + 20_001,
            watermark: Some(T0 + 10_000),
        }),
    );
    assert_eq!(released(&ev), ["j1"]);
}

#[test]
fn a_released_job_runs_its_attempts_like_any_other() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(at("j1", T0 + 1_000));
    sim.tick_after(1_000);
    sim.started("j1", 1, "w1");
    sim.result("j1", 1, "w1", ResultStatus::FailedRetryable);
    assert_eq!(
        sim.job_state("j1"),
        JobState::Pending,
        "a retry, not a delay"
    );
    sim.tick_after(2_000);
    sim.started("j1", 2, "w1");
    sim.result("j1", 2, "w1", ResultStatus::Succeeded);
    assert_eq!(sim.job_state("j1"), JobState::Succeeded);
}

#[test]
fn a_redriven_job_does_not_wait_again() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(at("j1", T0 + 1_000));
    sim.tick_after(1_000);
    sim.started("j1", 1, "w1");
    sim.result_with("j1", 1, "w1", ResultStatus::FailedFatal, Some("boom"));
    assert_eq!(sim.job_state("j1"), JobState::Failed);
    let now = sim.now;
    let ev = sim.input(
        "ksched.control",
        Input::Redrive(ksched_core::records::RedriveJob {
            job_id: "j1".into(),
            new_job_id: "j1-again".into(),
            tenant_id: None,
            principal_id: "op".into(),
            reason: None,
            requested_at: now,
        }),
    );
    assert!(!names(&ev).contains(&"JobDelayed"), "{:?}", names(&ev));
    assert_eq!(sim.job("j1-again").request.not_before, None);
}

/// Thousands of delayed jobs on partial states with two-key windows: memory holds a bounded
/// window while the store's index holds the rest, and every one is released exactly once,
/// in order, as the full state releases them.
#[test]
fn a_window_of_two_keys_releases_a_backlog_exactly_once() {
    let mut rules: Rules = rules();
    rules.limits.max_work_per_entry = 50;
    let mut sim = Sim::with_rules(rules);
    for i in 0..400 {
        // Ids and times in different orders.
        let due = T0 + 1_000 + ((i * 7919) % 400) * 25;
        sim.submit(at(&format!("j{i:03}"), due));
    }
    assert!(sim.partial.delays.window_len() <= 2);
    assert!(sim.partial.jobs.len() < 10, "delayed jobs left memory");
    let ev = sim.tick_after(15_000);
    let order = released(&ev);
    assert_eq!(order.len(), 400);
    let mut unique = order.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), 400, "each once");
    let dues: Vec<i64> = order
        .iter()
        .map(|id| sim.job(id).request.not_before.unwrap())
        .collect();
    assert!(dues.windows(2).all(|w| w[0] <= w[1]), "in time order");
    assert!(
        sim.cold.delays.is_empty(),
        "the store's index is empty again"
    );
}

/// A job delayed past the window whose record the store has not been written yet (written
/// behind) is released from memory: the Tick right after it reads a store that lacks it.
#[test]
fn a_job_delayed_past_the_window_and_not_yet_written_is_released() {
    let mut sim = Sim::new();
    sim.submit(at("a", T0 + 100));
    sim.submit(at("b", T0 + 200));
    // Past the two-key window: in the store's index only once its batch is written, and the
    // state written one input late has not written it when the next Tick comes.
    sim.submit(at("c", T0 + 300));
    assert_eq!(sim.behind.delays.beyond_len(), 1);
    let ev = sim.tick_after(300);
    assert_eq!(released(&ev), ["a", "b", "c"]);
}

/// A key the store's index still holds for a job rescheduled in memory (not yet written) is
/// not the job's any more: it is released once, at its new time.
#[test]
fn a_stale_key_in_the_stores_index_does_not_release_a_rescheduled_job() {
    let mut sim = Sim::new();
    for (id, due) in [("a", 100), ("b", 200), ("c", 300), ("d", 400)] {
        sim.submit(at(id, T0 + due));
    }
    // Everything written everywhere (the state written behind writes at the next input).
    sim.worker("w0", "other");
    let ev = reschedule(&mut sim, "d", T0 + 250, None);
    assert!(names(&ev).contains(&"JobRescheduled"));
    let ev = sim.tick_after(500);
    assert_eq!(released(&ev), ["a", "b", "d", "c"]);
}

#[test]
fn a_delayed_job_awaiting_approval_does_not_time_out_before_its_time() {
    let mut policy = ScriptPolicy::default();
    policy.input.push(Box::new(|_| {
        Some(decision(Verdict::RequireApproval, "prod"))
    }));
    let mut sim = Sim::with_policy(rules(), policy);
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    let mut request = at("j1", T0 + 3_600_000);
    request.budget = Budget {
        deadline_ms: Some(60_000),
        ..Budget::default()
    };
    sim.submit(request);
    assert_eq!(sim.job_state("j1"), JobState::ApprovalRequired);
    // An hour passes without an approval: its deadline counts from its time.
    sim.tick_after(3_600_000 - 1_000);
    assert_eq!(sim.job_state("j1"), JobState::ApprovalRequired);
    approve(&mut sim, "j1");
    sim.tick_after(2_000);
    assert_eq!(sim.job_state("j1"), JobState::Dispatched);
}

/// More jobs due at once than an entry's work bound: all of them are released by the Tick
/// that finds them due (its continuations), not one bound's worth per Tick.
#[test]
fn jobs_due_at_once_beyond_the_work_bound_are_released_by_one_tick() {
    let mut rules: Rules = rules();
    rules.limits.max_work_per_entry = 10;
    let mut sim = Sim::with_rules(rules);
    for i in 0..60 {
        sim.submit(at(&format!("j{i:03}"), T0 + 1_000 + (i % 3) * 100));
    }
    // Ticks at +1000 (20 due) and at +1200 (40 due): each releases all it finds due.
    let ev = sim.tick_after(1_200);
    let mut order = released(&ev);
    assert_eq!(order.len(), 60, "{order:?}");
    order.sort_unstable();
    order.dedup();
    assert_eq!(order.len(), 60, "each once");
}
