//! Debounced jobs (SPEC §10): on a topic with a debounce rule, a job with a key waits
//! DELAYED for the rule's wait; a later job of the same tenant, topic and key accepted
//! while it waits replaces it (the waiting job is cancelled) and waits in its turn, but
//! never past the max wait from the first job of the run, so a steady stream still runs.
//! Every scenario runs through `Sim`, whose partial states keep delayed jobs in the store
//! only, so replacing one reads it back as the processor does.

mod support;

use ksched_core::decide::DEBOUNCE_PRINCIPAL;
use ksched_core::events::*;
use ksched_core::records::{JobRequest, ResultStatus};
use ksched_core::rules::{DebounceRule, Rules};
use support::*;

/// `job.default` debounced by the `document` label.
fn debounced(wait: &str, max_wait: Option<&str>) -> Rules {
    let mut r = rules();
    r.topic_debounce.insert(
        "job.default".into(),
        DebounceRule {
            key: "label:document".into(),
            wait: wait.into(),
            max_wait: max_wait.map(str::to_owned),
        },
    );
    r
}

fn doc(id: &str, document: &str) -> JobRequest {
    let mut j = job(id);
    j.labels.insert("document".into(), document.into());
    j
}

fn debounce_of(events: &[Event]) -> Option<&JobDebounced> {
    events.iter().find_map(|e| match e {
        Event::JobDebounced(d) => Some(d),
        _ => None,
    })
}

fn cancelled(events: &[Event]) -> Vec<&JobCancelled> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::JobCancelled(c) => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn jobs_of_a_key_close_together_collapse_into_the_last_which_runs_after_the_wait() {
    let mut sim = Sim::with_rules(debounced("5s", None));
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    let ev = sim.submit(doc("d-1", "readme"));
    assert_eq!(
        names(&ev),
        [
            "JobAccepted",
            "PolicyEvaluated",
            "JobDebounced",
            "JobDelayed"
        ]
    );
    let d = debounce_of(&ev).unwrap();
    assert_eq!(
        (d.key.as_str(), d.first_at, d.due),
        ("readme", T0, T0 + 5_000)
    );
    assert_eq!(d.replaces, None);

    sim.advance(1_000);
    let ev = sim.submit(doc("d-2", "readme"));
    let d = debounce_of(&ev).unwrap();
    assert_eq!(d.replaces.as_deref(), Some("d-1"));
    assert_eq!(
        (d.first_at, d.due),
        (T0, T0 + 6_000),
        "the wait from d-2's acceptance"
    );
    let c = cancelled(&ev);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].job_id, "d-1");
    assert_eq!(c[0].principal_id, DEBOUNCE_PRINCIPAL);
    assert!(
        c[0].reason.as_deref().unwrap_or("").contains("d-2"),
        "{:?}",
        c[0].reason
    );
    assert_eq!(sim.job_state("d-1"), JobState::Cancelled);

    sim.advance(2_000);
    let ev = sim.submit(doc("d-3", "readme"));
    assert_eq!(debounce_of(&ev).unwrap().replaces.as_deref(), Some("d-2"));
    assert_eq!(sim.job_state("d-2"), JobState::Cancelled);

    // d-3 is due 5 s after its acceptance (T0 + 8 s), and only d-3 runs.
    let ev = sim.tick_after(4_500);
    assert!(dispatched(&ev).is_empty(), "not yet due");
    let ev = sim.tick_after(1_000);
    assert_eq!(dispatched(&ev), ["d-3"]);
    assert_eq!(sim.dispatches().len(), 1);
    assert!(
        sim.state.debounces.is_empty(),
        "the window closed with d-3's release"
    );

    // The next job of the key begins a new run.
    let ev = sim.submit(doc("d-4", "readme"));
    let d = debounce_of(&ev).unwrap();
    assert_eq!((d.replaces.as_deref(), d.first_at), (None, sim.now));
}

#[test]
fn a_steady_stream_runs_at_least_once_per_max_wait() {
    // A job every 2 s, each waiting 5 s for the next: without a max wait none would run.
    let mut sim = Sim::with_rules(debounced("5s", Some("9s")));
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    let mut ran = Vec::new();
    for n in 0..12 {
        let ev = sim.submit(doc(&format!("s-{n}"), "feed"));
        ran.extend(dispatched(&ev).into_iter().map(str::to_owned));
        let ev = sim.advance(2_000);
        ran.extend(dispatched(&ev).into_iter().map(str::to_owned));
    }
    // Run one: s-0 at 0 s ... s-4 at 8 s is due at 9 s (the max wait), and runs at the
    // Tick of 9 s. s-5 (10 s) begins the next run: s-9 (18 s) is due at 19 s.
    assert_eq!(ran, ["s-4", "s-9"]);
    let states: Vec<JobState> = (0..12).map(|n| sim.job_state(&format!("s-{n}"))).collect();
    assert_eq!(
        states.iter().filter(|s| **s == JobState::Cancelled).count(),
        9,
        "all but the two that ran and the last, still waiting: {states:?}"
    );
}

#[test]
fn keys_tenants_and_topics_debounce_apart_and_a_job_without_a_key_is_not_held() {
    let mut r = debounced("5s", None);
    r.topics.insert("job.other".into(), vec!["default".into()]);
    r.topic_debounce
        .insert("job.other".into(), r.topic_debounce["job.default"].clone());
    let mut sim = Sim::with_rules(r);
    sim.submit(doc("a-1", "x"));
    let mut globex = doc("globex:a-1", "x");
    globex.tenant_id = "globex".into();
    let mut other_topic = doc("a-2", "x");
    other_topic.topic = "job.other".into();
    for j in [doc("b-1", "y"), globex, other_topic] {
        let ev = sim.submit(j);
        assert_eq!(debounce_of(&ev).unwrap().replaces, None);
    }
    let ev = sim.submit(job("plain"));
    assert!(debounce_of(&ev).is_none());
    assert_eq!(sim.job_state("plain"), JobState::Pending);
    assert_eq!(sim.job_state("a-1"), JobState::Delayed);
}

#[test]
fn a_waiting_job_cancelled_or_rescheduled_leaves_its_run_and_the_next_job_begins_another() {
    let mut sim = Sim::with_rules(debounced("5s", None));
    sim.submit(doc("c-1", "k"));
    sim.cancel("c-1", None);
    let ev = sim.submit(doc("c-2", "k"));
    assert_eq!(
        debounce_of(&ev).unwrap().replaces,
        None,
        "c-1 was cancelled"
    );
    assert!(cancelled(&ev).is_empty());

    let now = sim.now;
    sim.input(
        "ksched.control",
        Input::Reschedule(ksched_core::records::RescheduleJob {
            job_id: "c-2".into(),
            not_before: now + 60_000,
            tenant_id: None,
            principal_id: "op".into(),
            reason: None,
            requested_at: now,
        }),
    );
    let ev = sim.submit(doc("c-3", "k"));
    assert_eq!(
        debounce_of(&ev).unwrap().replaces,
        None,
        "c-2 waits for a time of its own now"
    );
    assert_eq!(sim.job_state("c-2"), JobState::Delayed);
}

#[test]
fn a_job_of_its_own_later_time_waits_for_it_out_of_the_windows_reach() {
    let mut sim = Sim::with_rules(debounced("5s", None));
    let mut j = doc("t-1", "k");
    j.not_before = Some(T0 + 3_600_000);
    let ev = sim.submit(j);
    assert_eq!(
        debounce_of(&ev).unwrap().due,
        T0 + 5_000,
        "the window keeps its time"
    );
    assert_eq!(sim.job("t-1").delayed_until, Some(T0 + 3_600_000));
    // A later job of the key does not replace it: it begins a run of its own.
    sim.advance(1_000);
    let ev = sim.submit(doc("t-2", "k"));
    let d = debounce_of(&ev).unwrap();
    assert_eq!((d.replaces.as_deref(), d.due), (None, T0 + 6_000));
    assert_eq!(sim.job_state("t-1"), JobState::Delayed);
    // Its window closes at its own time, not the job's: a year's not_before cannot hold a
    // window (and a place under `limits.max_concurrency_keys`) open.
    sim.tick_after(6_000);
    assert!(sim.state.debounces.is_empty());
}

#[test]
fn a_job_approved_late_does_not_replace_a_later_request_it_is_replaced() {
    let mut policy = ScriptPolicy::default();
    policy.input.push(Box::new(|doc| {
        (doc["job"]["labels"]["risk"].as_str() == Some("high")).then(|| {
            ksched_core::policy::PolicyDecision {
                verdict: Verdict::RequireApproval,
                reasons: vec!["high risk".into()],
                ..ksched_core::policy::PolicyDecision::allow()
            }
        })
    }));
    let mut sim = Sim::with_policy(debounced("5s", None), policy);
    let mut old = doc("old", "k");
    old.labels.insert("risk".into(), "high".into());
    sim.submit(old);
    assert_eq!(sim.job_state("old"), JobState::ApprovalRequired);
    sim.advance(1_000);
    sim.submit(doc("new", "k"));
    sim.advance(1_000);
    let hash = sim.job("old").job_hash.clone();
    let ev = sim.input(
        "ksched.control",
        Input::Approve(ksched_core::records::ApproveJob {
            job_id: "old".into(),
            job_hash: hash,
            policy_snapshot: "snap-1".into(),
            approver: "bob".into(),
            comment: None,
            requested_at: 0,
        }),
    );
    let c = cancelled(&ev);
    assert_eq!(c.len(), 1, "{:?}", names(&ev));
    assert_eq!(c[0].job_id, "old", "the later request wins");
    assert!(c[0].reason.as_deref().unwrap_or("").contains("new"));
    assert_eq!(sim.job_state("new"), JobState::Delayed);
    assert!(debounce_of(&ev).is_none());
}

#[test]
fn saga_compensations_are_not_debounced() {
    let mut r = debounced("5s", None);
    r.topic_debounce.get_mut("job.default").unwrap().key = "tenant".into();
    let mut sim = Sim::with_rules(r);
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    let step = |id: &str| {
        let mut j = job(id);
        j.workflow_id = Some("wf".into());
        j.compensation = Some(Box::new(ksched_core::records::JobTemplate {
            topic: "job.default".into(),
            ..Default::default()
        }));
        j
    };
    let ev = sim.submit(step("step-1"));
    assert!(debounce_of(&ev).is_none(), "a saga step");
    assert_eq!(dispatched(&ev), ["step-1"]);
    sim.started("step-1", 1, "w1");
    sim.result("step-1", 1, "w1", ResultStatus::Succeeded);
    // A plain job of the tenant waits under the tenant's key...
    assert!(debounce_of(&sim.submit(job("plain"))).is_some());
    // ...and step 2's failure submits step 1's compensation, which neither waits nor
    // replaces it.
    assert_eq!(dispatched(&sim.submit(step("step-2"))), ["step-2"]);
    sim.started("step-2", 1, "w1");
    let ev = sim.result("step-2", 1, "w1", ResultStatus::FailedFatal);
    assert!(
        names(&ev).contains(&"SagaCompensationSubmitted"),
        "{:?}",
        names(&ev)
    );
    assert!(debounce_of(&ev).is_none());
    assert!(cancelled(&ev).is_empty());
    assert_eq!(sim.job_state("plain"), JobState::Delayed);
}

#[test]
fn a_job_at_the_windows_time_begins_a_new_run_even_before_the_tick_releases_the_last() {
    let mut sim = Sim::with_rules(debounced("5s", None));
    sim.submit(doc("e-1", "k"));
    // No Tick at 5 s: the next input is read at the window's time exactly.
    sim.gap(5_000);
    let ev = sim.submit(doc("e-2", "k"));
    assert_eq!(debounce_of(&ev).unwrap().replaces, None);
    assert_eq!(
        sim.job_state("e-1"),
        JobState::Delayed,
        "released at the next Tick"
    );
    let ev = sim.tick_now();
    assert!(names(&ev).contains(&"JobReleased"));
    assert_eq!(sim.job_state("e-1"), JobState::Pending);
}

#[test]
fn debounce_windows_are_bounded_per_shard() {
    let mut r = debounced("5s", None);
    r.limits.max_concurrency_keys = 2;
    let mut sim = Sim::with_rules(r);
    sim.submit(doc("k-1", "a"));
    sim.submit(doc("k-2", "b"));
    let ev = sim.submit(doc("k-3", "c"));
    assert_eq!(names(&ev), ["DeadLettered"]);
    let dl = sim.dead_letters();
    assert_eq!(dl[0].reason_code, "queue_full");
    assert!(
        dl[0].reason.contains("debounce windows"),
        "{}",
        dl[0].reason
    );
    // An open key still takes jobs, and a closed window frees a place.
    assert!(debounce_of(&sim.submit(doc("k-4", "a"))).is_some());
    sim.tick_after(6_000);
    assert!(debounce_of(&sim.submit(doc("k-5", "c"))).is_some());
}

#[test]
fn debounce_rules_are_checked() {
    let ok = |wait: &str, max: Option<&str>| debounced(wait, max).validate().is_ok();
    assert!(ok("5s", None));
    assert!(ok("5s", Some("5s")));
    assert!(!ok("5s", Some("4s")), "max_wait under wait");
    assert!(!ok("0s", None));
    assert!(!ok("soon", None));
    let mut r = debounced("5s", None);
    r.topic_debounce.get_mut("job.default").unwrap().key = "document".into();
    assert!(r.validate().is_err());
}
