//! Dependencies (SPEC §11): a job that names other jobs waits BLOCKED until its condition
//! holds, then runs as if submitted then; it fails `dependency_failed` when the condition can
//! no longer hold or its dependency timeout passes. Every scenario also runs on partial
//! states that evict blocked and ended jobs after every input and read them back, and on a
//! journal folded entry by entry (tests/support: `Sim`), so what a decision sees never
//! depends on what memory held.

mod support;

use ksched_core::events::*;
use ksched_core::records::{DependencyCondition, JobRequest, ResultStatus};
use support::*;

fn after(id: &str, deps: &[&str]) -> JobRequest {
    JobRequest {
        depends_on: deps.iter().map(|d| (*d).to_owned()).collect(),
        ..job(id)
    }
}

fn when(condition: DependencyCondition, id: &str, deps: &[&str]) -> JobRequest {
    JobRequest {
        dependency_condition: condition,
        ..after(id, deps)
    }
}

/// A worker of the default pool that takes many jobs at once.
fn big_worker(sim: &mut Sim, id: &str) {
    let mut h = hb(id, "default");
    h.max_parallel_jobs = 1_000;
    sim.heartbeat(h);
}

fn run(sim: &mut Sim, id: &str, status: ResultStatus) -> Vec<Event> {
    let attempt = sim.job(id).attempt;
    let worker = sim.job(id).worker_id.clone().expect("dispatched");
    sim.result(id, attempt, &worker, status)
}

fn unblocked(events: &[Event]) -> Vec<&str> {
    (events.iter())
        .filter_map(|e| match e {
            Event::JobUnblocked(u) => Some(u.job_id.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_job_waits_blocked_until_all_its_dependencies_succeed_then_runs() {
    let mut sim = Sim::new();
    big_worker(&mut sim, "w1");
    sim.submit(job("a"));
    sim.submit(job("b"));
    let ev = sim.submit(after("c", &["a", "b"]));
    assert_eq!(
        names(&ev),
        [
            "JobAccepted",
            "PolicyEvaluated",
            "JobBlocked",
            "JobAwaited",
            "JobAwaited"
        ]
    );
    assert_eq!(sim.job_state("c"), JobState::Blocked);
    assert!(sim.job("a").awaited && sim.job("b").awaited);
    let ev = run(&mut sim, "a", ResultStatus::Succeeded);
    assert!(unblocked(&ev).is_empty(), "{:?}", names(&ev));
    assert_eq!(sim.job_state("c"), JobState::Blocked, "b has not ended");
    assert!(
        sim.continuations > 0,
        "a's end is told at once, by a continuation"
    );
    let ev = run(&mut sim, "b", ResultStatus::Succeeded);
    assert_eq!(unblocked(&ev), ["c"]);
    assert_eq!(
        sim.job_state("c"),
        JobState::Dispatched,
        "placed in the same entry"
    );
    assert!(sim.state.settling.is_empty(), "a and b are settled");
    let history: Vec<String> = (sim.history("c").iter())
        .map(|h| h.event.to_string())
        .collect();
    for e in [
        "JobBlocked",
        "DependencyResolved",
        "JobUnblocked",
        "JobScheduled",
    ] {
        assert!(history.iter().any(|h| h == e), "{e} in {history:?}");
    }
    let blocked = sim.history("c");
    let line = blocked.iter().find(|h| h.event == "JobBlocked").unwrap();
    assert!(line.detail.contains("waits for [a, b]"), "{}", line.detail);
}

#[test]
fn dependencies_already_ended_count_at_once_even_from_storage() {
    let mut sim = Sim::new();
    big_worker(&mut sim, "w1");
    sim.submit(job("ok"));
    run(&mut sim, "ok", ResultStatus::Succeeded);
    sim.submit(job("bad"));
    run(&mut sim, "bad", ResultStatus::FailedFatal);
    // Both left the partial states' memory; they are read back to decide.
    assert!(!sim.partial.jobs.contains_key("ok"));
    let ev = sim.submit(after("runs", &["ok"]));
    assert_eq!(unblocked(&ev), ["runs"]);
    assert_eq!(sim.job_state("runs"), JobState::Dispatched);
    assert!(!sim.job("ok").awaited, "an ended job is not marked");
    let ev = sim.submit(after("fails", &["ok", "bad"]));
    let dl = dead_lettered(&ev);
    assert_eq!(dl.reason_code, "dependency_failed");
    assert_eq!(dl.related_job_id.as_deref(), Some("bad"));
    assert_eq!(sim.job_state("fails"), JobState::Failed);
    // All terminal runs whatever they ended as.
    let ev = sim.submit(when(
        DependencyCondition::AllTerminal,
        "any",
        &["ok", "bad"],
    ));
    assert_eq!(unblocked(&ev), ["any"]);
}

#[test]
fn all_succeeded_fails_at_the_first_other_end_naming_it() {
    let mut sim = Sim::new();
    big_worker(&mut sim, "w1");
    sim.submit(job("a"));
    sim.submit(job("b"));
    sim.submit(after("c", &["a", "b"]));
    run(&mut sim, "b", ResultStatus::FailedFatal);
    assert_eq!(sim.job_state("c"), JobState::Failed);
    let dl = (sim.dead_letters().into_iter())
        .find(|d| d.job_id == "c")
        .expect("c dead-lettered");
    assert_eq!(dl.reason_code, "dependency_failed");
    assert_eq!(dl.related_job_id.as_deref(), Some("b"));
    assert!(dl.reason.contains("ALL_SUCCEEDED"), "{}", dl.reason);
    // a ending later finds nobody waiting.
    let ev = run(&mut sim, "a", ResultStatus::Succeeded);
    assert!(
        !names(&ev).contains(&"DependencyResolved"),
        "{:?}",
        names(&ev)
    );
    assert!(sim.state.settling.is_empty());
}

#[test]
fn all_terminal_waits_for_every_end_and_any_succeeded_for_the_first_success() {
    let mut sim = Sim::new();
    big_worker(&mut sim, "w1");
    for id in ["a", "b", "c"] {
        sim.submit(job(id));
    }
    sim.submit(when(DependencyCondition::AllTerminal, "all", &["a", "b"]));
    sim.submit(when(
        DependencyCondition::AnySucceeded,
        "any",
        &["a", "b", "c"],
    ));
    sim.submit(when(DependencyCondition::AnySucceeded, "none", &["a", "b"]));
    run(&mut sim, "a", ResultStatus::FailedFatal);
    assert_eq!(sim.job_state("all"), JobState::Blocked);
    assert_eq!(sim.job_state("any"), JobState::Blocked);
    assert_eq!(
        sim.job_state("none"),
        JobState::Blocked,
        "b may still succeed"
    );
    sim.cancel("b", None);
    assert_eq!(sim.job_state("all"), JobState::Dispatched, "a and b ended");
    assert_eq!(sim.job_state("none"), JobState::Failed, "neither succeeded");
    assert_eq!(
        sim.job_state("any"),
        JobState::Blocked,
        "c may still succeed"
    );
    run(&mut sim, "c", ResultStatus::Succeeded);
    assert_eq!(sim.job_state("any"), JobState::Dispatched);
    assert_eq!(sim.job("any").awaiting.as_ref().unwrap().succeeded, 1);
}

#[test]
fn a_dependency_submitted_later_is_waited_for_and_marked_when_it_comes() {
    let mut sim = Sim::new();
    big_worker(&mut sim, "w1");
    sim.submit(after("c", &["later"]));
    assert_eq!(sim.job_state("c"), JobState::Blocked);
    // Time passes; c is in storage only.
    sim.tick_after(5_000);
    assert!(!sim.partial.jobs.contains_key("c"));
    let ev = sim.submit(job("later"));
    assert!(names(&ev).contains(&"JobAwaited"), "{:?}", names(&ev));
    assert!(sim.job("later").awaited);
    run(&mut sim, "later", ResultStatus::Succeeded);
    assert_eq!(sim.job_state("c"), JobState::Dispatched);
}

#[test]
fn a_dependency_never_submitted_fails_the_job_at_its_timeout() {
    let mut sim = Sim::new();
    big_worker(&mut sim, "w1");
    let ev = sim.submit(JobRequest {
        dependency_timeout_ms: Some(10_000),
        ..after("c", &["ghost", "ghost-2"])
    });
    let b = find(&ev, |e| match e {
        Event::JobBlocked(b) => Some(b),
        _ => None,
    });
    assert_eq!(b.until, T0 + 10_000);
    sim.tick_after(9_000);
    assert_eq!(sim.job_state("c"), JobState::Blocked);
    let ev = sim.tick_after(1_000);
    let dl = dead_lettered(&ev);
    assert_eq!(dl.reason_code, "dependency_failed");
    assert_eq!(dl.related_job_id.as_deref(), Some("ghost"));
    assert!(dl.reason.contains("ghost, ghost-2"), "{}", dl.reason);
    assert_eq!(sim.job_state("c"), JobState::Failed);
}

#[test]
fn another_tenants_job_is_waited_for_as_if_it_did_not_exist() {
    let mut sim = Sim::new();
    big_worker(&mut sim, "w1");
    sim.submit(JobRequest {
        tenant_id: "other".into(),
        ..job("theirs")
    });
    run(&mut sim, "theirs", ResultStatus::Succeeded);
    sim.submit(JobRequest {
        tenant_id: "other".into(),
        ..job("theirs-running")
    });
    let ev = sim.submit(JobRequest {
        dependency_timeout_ms: Some(5_000),
        ..after("mine", &["theirs", "theirs-running"])
    });
    let b = find(&ev, |e| match e {
        Event::JobBlocked(b) => Some(b),
        _ => None,
    });
    assert_eq!(b.waiting_on, ["theirs", "theirs-running"]);
    assert_eq!(b.succeeded, 0, "their success is not seen");
    assert!(
        !names(&ev).contains(&"JobAwaited"),
        "their job is not marked"
    );
    let ev = run(&mut sim, "theirs-running", ResultStatus::Succeeded);
    assert!(!names(&ev).contains(&"DependencyResolved"));
    let ev = sim.tick_after(5_000);
    assert_eq!(dead_lettered(&ev).reason_code, "dependency_failed");
}

#[test]
fn bad_dependencies_are_refused_before_the_job_is_accepted() {
    let mut rules = rules();
    rules.limits.max_dependencies = 3;
    let mut sim = Sim::with_rules(rules);
    for (req, why) in [
        (after("self", &["self"]), "itself"),
        (after("twice", &["a", "a"]), "twice"),
        (after("many", &["a", "b", "c", "d"]), "max_dependencies"),
        (after("empty", &[""]), "bytes"),
        (
            JobRequest {
                dependency_timeout_ms: Some(0),
                ..after("zero", &["a"])
            },
            "positive",
        ),
        (
            JobRequest {
                dependency_timeout_ms: Some(8 * 24 * 3_600_000),
                ..after("long", &["a"])
            },
            "max_dependency_wait_ms",
        ),
    ] {
        let id = req.job_id.clone();
        let ev = sim.submit(req);
        let dl = dead_lettered(&ev);
        assert_eq!(dl.reason_code, "invalid_dependencies", "{id}");
        assert!(dl.reason.contains(why), "{id}: {}", dl.reason);
        assert!(!sim.state.jobs.contains_key(&id), "{id} not accepted");
    }
}

#[test]
fn a_shard_holds_at_most_max_blocked_jobs() {
    let mut rules = rules();
    rules.limits.max_blocked_jobs = 1;
    let mut sim = Sim::with_rules(rules);
    sim.submit(after("one", &["x"]));
    let ev = sim.submit(after("two", &["x"]));
    assert_eq!(dead_lettered(&ev).reason_code, "queue_full");
    assert!(!sim.state.jobs.contains_key("two"));
}

#[test]
fn a_blocked_job_is_cancelled_and_its_dependency_ending_leaves_it_so() {
    let mut sim = Sim::new();
    big_worker(&mut sim, "w1");
    sim.submit(job("a"));
    sim.submit(after("c", &["a"]));
    sim.cancel("c", None);
    assert_eq!(sim.job_state("c"), JobState::Cancelled);
    let ev = run(&mut sim, "a", ResultStatus::Succeeded);
    assert!(!names(&ev).contains(&"DependencyResolved"));
    assert_eq!(sim.job_state("c"), JobState::Cancelled);
}

#[test]
fn a_failure_travels_down_a_chain() {
    let mut sim = Sim::new();
    big_worker(&mut sim, "w1");
    sim.submit(job("a"));
    sim.submit(after("b", &["a"]));
    sim.submit(after("c", &["b"]));
    sim.submit(when(DependencyCondition::AllTerminal, "cleanup", &["c"]));
    run(&mut sim, "a", ResultStatus::FailedFatal);
    for (id, related) in [("b", "a"), ("c", "b")] {
        assert_eq!(sim.job_state(id), JobState::Failed, "{id}");
        let dl = (sim.dead_letters().into_iter())
            .find(|d| d.job_id == id)
            .unwrap();
        assert_eq!(dl.related_job_id.as_deref(), Some(related));
    }
    assert_eq!(
        sim.job_state("cleanup"),
        JobState::Dispatched,
        "runs after all"
    );
}

#[test]
fn a_job_with_many_dependents_releases_them_over_continuations() {
    let mut rules = rules();
    rules.limits.max_work_per_entry = 4;
    let mut sim = Sim::with_rules(rules);
    big_worker(&mut sim, "w1");
    sim.submit(job("root"));
    for i in 0..25 {
        sim.submit(after(&format!("d{i:02}"), &["root"]));
    }
    // Settled in storage: the partial states read the dependents back as they go.
    sim.tick_after(1_000);
    let before = sim.continuations;
    run(&mut sim, "root", ResultStatus::Succeeded);
    assert!(
        sim.continuations - before >= 25 / 4,
        "bounded work per entry: {} continuations",
        sim.continuations - before
    );
    for i in 0..25 {
        let id = format!("d{i:02}");
        assert_ne!(sim.job_state(&id), JobState::Blocked, "{id}");
    }
    assert!(sim.state.settling.is_empty());
}

#[test]
fn settling_goes_on_after_a_restart() {
    let mut rules = rules();
    rules.limits.max_work_per_entry = 3;
    let mut sim = Sim::with_rules(rules);
    big_worker(&mut sim, "w1");
    sim.submit(job("root"));
    for i in 0..10 {
        sim.submit(after(&format!("d{i}"), &["root"]));
    }
    sim.tick_after(1_000);
    run(&mut sim, "root", ResultStatus::Succeeded);
    sim.restart();
    sim.submit(after("late", &["root"]));
    assert_eq!(sim.job_state("late"), JobState::Dispatched);
    for i in 0..10 {
        assert_ne!(sim.job_state(&format!("d{i}")), JobState::Blocked);
    }
}

#[test]
fn an_unblocked_job_keeps_its_time_and_its_deadline_counts_from_its_release() {
    let mut sim = Sim::new();
    sim.keep_alive(&[("w1", "default")]);
    big_worker(&mut sim, "w1");
    sim.submit(job("a"));
    sim.submit(JobRequest {
        not_before: Some(T0 + 60_000),
        budget: ksched_core::records::Budget {
            deadline_ms: Some(120_000),
            max_runtime_ms: None,
        },
        ..after("c", &["a"])
    });
    assert_eq!(sim.job_state("c"), JobState::Blocked);
    sim.tick_after(10_000);
    run(&mut sim, "a", ResultStatus::Succeeded);
    assert_eq!(
        sim.job_state("c"),
        JobState::Delayed,
        "then it waits for its time"
    );
    let released_at = sim.job("c").released_at.unwrap();
    assert_eq!(sim.job("c").deadline_at, Some(released_at + 120_000));
    sim.tick_after(50_000);
    assert_eq!(sim.job_state("c"), JobState::Dispatched);
}

#[test]
fn a_dependency_whose_output_is_quarantined_did_not_succeed() {
    let mut sim = Sim::with_policy(rules(), pii_quarantine());
    big_worker(&mut sim, "w1");
    sim.submit(job("a"));
    sim.submit(after("needs-a", &["a"]));
    sim.submit(when(DependencyCondition::AnySucceeded, "any-a", &["a"]));
    sim.submit(when(DependencyCondition::AllTerminal, "after-a", &["a"]));
    let attempt = sim.job("a").attempt;
    sim.succeed_with_pii("a", attempt, "w1");
    assert_eq!(sim.job_state("a"), JobState::OutputQuarantined);
    assert_eq!(
        sim.job_state("needs-a"),
        JobState::Failed,
        "its output was refused"
    );
    assert_eq!(sim.job_state("any-a"), JobState::Failed);
    assert_eq!(sim.job_state("after-a"), JobState::Dispatched);
    // A job submitted afterwards judges it the same way.
    sim.submit(after("late", &["a"]));
    assert_eq!(sim.job_state("late"), JobState::Failed);
}

#[test]
fn a_job_that_would_close_a_cycle_fails_at_once() {
    let mut sim = Sim::new();
    sim.submit(after("a", &["b"]));
    assert_eq!(sim.job_state("a"), JobState::Blocked);
    let ev = sim.submit(after("b", &["a"]));
    let dl = dead_lettered(&ev);
    assert_eq!(dl.reason_code, "dependency_failed");
    assert_eq!(dl.related_job_id.as_deref(), Some("a"));
    assert!(dl.reason.contains("cycle"), "{}", dl.reason);
    // b's end tells a: it waited for b, which failed.
    assert_eq!(sim.job_state("a"), JobState::Failed);
}

#[test]
fn firing_and_compensation_ids_are_not_waited_for() {
    let mut sim = Sim::new();
    for dep in ["acme:nightly@2026-12-07T02:00:00Z", "wf~compensation~1"] {
        let ev = sim.submit(after("c", &[dep]));
        let dl = dead_lettered(&ev);
        assert_eq!(dl.reason_code, "invalid_dependencies", "{dep}");
    }
}

#[test]
fn a_redriven_job_is_waited_for_under_its_new_id() {
    let mut sim = Sim::new();
    big_worker(&mut sim, "w1");
    sim.submit(job("broken"));
    run(&mut sim, "broken", ResultStatus::FailedFatal);
    sim.submit(after("c", &["fixed"]));
    sim.tick_after(2_000);
    let now = sim.now;
    let ev = sim.input(
        "ksched.control",
        Input::Redrive(ksched_core::records::RedriveJob {
            job_id: "broken".into(),
            new_job_id: "fixed".into(),
            tenant_id: None,
            principal_id: "op".into(),
            reason: None,
            requested_at: now,
        }),
    );
    assert!(names(&ev).contains(&"JobAwaited"), "{:?}", names(&ev));
    run(&mut sim, "fixed", ResultStatus::Succeeded);
    assert_eq!(sim.job_state("c"), JobState::Dispatched);
}

#[test]
fn an_approved_job_waits_for_every_dependency_whatever_the_limit_became() {
    let mut policy = ScriptPolicy::default();
    policy.input.push(Box::new(|doc| {
        (doc["job"]["labels"]["risk"].as_str() == Some("review")).then(|| {
            ksched_core::policy::PolicyDecision {
                verdict: Verdict::RequireApproval,
                reasons: vec!["review".into()],
                ..ksched_core::policy::PolicyDecision::allow()
            }
        })
    }));
    let mut sim = Sim::with_policy(rules(), policy);
    big_worker(&mut sim, "w1");
    for id in ["a", "b", "c"] {
        sim.submit(job(id));
        run(&mut sim, id, ResultStatus::Succeeded);
    }
    let mut req = after("reviewed", &["a", "b", "c"]);
    req.labels.insert("risk".into(), "review".into());
    sim.submit(req);
    assert_eq!(sim.job_state("reviewed"), JobState::ApprovalRequired);
    let mut lower = rules();
    lower.limits.max_dependencies = 1;
    sim.reconfigure(&lower, "snap-2");
    sim.tick_after(2_000);
    // Approved under the snapshot it was judged by last (the new rules judge it again).
    let mut ev = Vec::new();
    for _ in 0..2 {
        let hash = sim.job("reviewed").job_hash.clone();
        let snapshot = sim.job("reviewed").policy_snapshot.clone().unwrap();
        ev = sim.input(
            "ksched.control",
            Input::Approve(ksched_core::records::ApproveJob {
                job_id: "reviewed".into(),
                job_hash: hash,
                policy_snapshot: snapshot,
                approver: "bob".into(),
                comment: None,
                requested_at: 0,
            }),
        );
    }
    assert_eq!(
        sim.job_state("reviewed"),
        JobState::Dispatched,
        "its three succeeded: {ev:?}"
    );
}
