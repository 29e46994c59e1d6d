//! Unique jobs (SPEC §10): on a topic with a unique rule, a job whose key a job of the same
//! tenant on the same topic was accepted with less than the rule's window ago is refused as
//! a duplicate (`JobDuplicate`, kind `UniqueKey`), whatever became of the first job. Every
//! scenario runs through `Sim`, whose partial states hold no idempotency keys between
//! inputs, so a decision reads the key from the store as the processor does.

mod support;

use ksched_core::events::*;
use ksched_core::records::{JobRequest, ResultStatus};
use ksched_core::rules::{Rules, UniqueRule};
use support::*;

const HOUR: i64 = 3_600_000;

/// `job.default` with one job per `key` for `window`.
fn unique(key: &str, window: &str) -> Rules {
    let mut r = rules();
    r.topic_unique.insert(
        "job.default".into(),
        UniqueRule {
            key: key.into(),
            window: window.into(),
        },
    );
    r
}

fn report(id: &str, report: &str) -> JobRequest {
    let mut j = job(id);
    j.labels.insert("report".into(), report.into());
    j
}

/// The (job, existing job, kind) of each duplicate among `events`.
fn duplicates(events: &[Event]) -> Vec<(&str, &str, DuplicateKind)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::JobDuplicate(d) => Some((&*d.job_id, &*d.existing_job_id, d.kind)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_second_job_of_a_key_within_the_window_is_refused_even_after_the_first_finished() {
    let mut sim = Sim::with_rules(unique("label:report", "1h"));
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    let ev = sim.submit(report("r-1", "daily-sales"));
    assert_eq!(dispatched(&ev), ["r-1"]);
    let ev = sim.submit(report("r-2", "daily-sales"));
    assert_eq!(
        duplicates(&ev),
        [("r-2", "r-1", DuplicateKind::UniqueKey)],
        "while the first runs"
    );
    assert_eq!(
        names(&ev),
        ["JobDuplicate"],
        "nothing else: no job, no dead letter"
    );
    assert!(!sim.state.jobs.contains_key("r-2"));

    sim.started("r-1", 1, "w1");
    sim.result("r-1", 1, "w1", ResultStatus::Succeeded);
    sim.advance(HOUR - 60_000);
    let ev = sim.submit(report("r-3", "daily-sales"));
    assert_eq!(
        duplicates(&ev),
        [("r-3", "r-1", DuplicateKind::UniqueKey)],
        "after the first succeeded, still inside its window"
    );
    // The refusals are in the first job's history, where `jobs history` and audits show them.
    let history = sim.history("r-1");
    let lines: Vec<&str> = history.iter().map(|h| &*h.event).collect();
    assert_eq!(
        lines.iter().filter(|l| **l == "JobDuplicate").count(),
        2,
        "{lines:?}"
    );

    // An hour after r-1 was accepted the key is free again, and r-4 takes it anew.
    sim.advance(60_000);
    let ev = sim.submit(report("r-4", "daily-sales"));
    assert_eq!(dispatched(&ev), ["r-4"]);
    sim.advance(HOUR - 1);
    let ev = sim.submit(report("r-5", "daily-sales"));
    assert_eq!(duplicates(&ev), [("r-5", "r-4", DuplicateKind::UniqueKey)]);
}

#[test]
fn keys_are_a_tenants_own_on_its_topic_and_a_job_without_one_is_not_held() {
    let mut r = unique("label:report", "1h");
    r.topics.insert("job.other".into(), vec!["default".into()]);
    let mut sim = Sim::with_rules(r);
    sim.submit(report("r-1", "weekly"));
    let mut globex = report("globex:r-1", "weekly");
    globex.tenant_id = "globex".into();
    let mut other_topic = report("r-2", "weekly");
    other_topic.topic = "job.other".into();
    for j in [globex, other_topic, job("plain-1"), job("plain-2")] {
        let id = j.job_id.clone();
        let ev = sim.submit(j);
        assert_eq!(names(&ev)[0], "JobAccepted", "{id}");
    }
    let mut empty = report("r-3", "");
    empty.job_id = "r-3".into();
    assert_eq!(
        names(&sim.submit(empty))[0],
        "JobAccepted",
        "an empty key is none"
    );
    let ev = sim.submit(report("r-4", "weekly"));
    assert_eq!(duplicates(&ev), [("r-4", "r-1", DuplicateKind::UniqueKey)]);
}

#[test]
fn a_payload_key_admits_one_job_per_distinct_payload() {
    let mut sim = Sim::with_rules(unique("payload", "10m"));
    let with = |id: &str, payload: &[u8]| JobRequest {
        payload: payload.to_vec(),
        ..job(id)
    };
    assert_eq!(
        names(&sim.submit(with("p-1", b"resize img-7")))[0],
        "JobAccepted"
    );
    assert_eq!(
        names(&sim.submit(with("p-2", b"resize img-8")))[0],
        "JobAccepted"
    );
    let ev = sim.submit(with("p-3", b"resize img-7"));
    assert_eq!(duplicates(&ev), [("p-3", "p-1", DuplicateKind::UniqueKey)]);
    let Event::JobDuplicate(d) = &ev[0] else {
        unreachable!()
    };
    assert!(
        d.idempotency_key
            .as_deref()
            .is_some_and(|k| k.starts_with("payload:")),
        "{d:?}"
    );
}

#[test]
fn unique_keys_and_idempotency_keys_never_meet() {
    // A producer's idempotency key spelled like a unique key is its own key.
    let mut sim = Sim::with_rules(unique("label:report", "1h"));
    sim.submit(report("r-1", "x"));
    let mut j = job("i-1");
    j.meta.idempotency_key = Some("label:x".into());
    assert_eq!(names(&sim.submit(j))[0], "JobAccepted");
    let mut j = report("i-2", "y");
    j.meta.idempotency_key = Some("label:x".into());
    let ev = sim.submit(j);
    assert_eq!(
        duplicates(&ev),
        [("i-2", "i-1", DuplicateKind::IdempotencyKey)]
    );
}

#[test]
fn a_job_dead_lettered_before_acceptance_takes_no_key() {
    let mut r = unique("label:report", "1h");
    r.limits.max_pending_per_pool = 1;
    let mut sim = Sim::with_rules(r);
    sim.submit(job("filler"));
    let ev = sim.submit(report("r-1", "k"));
    assert_eq!(names(&ev), ["DeadLettered"], "queue full");
    sim.cancel("filler", None);
    assert_eq!(names(&sim.submit(report("r-2", "k")))[0], "JobAccepted");
    let ev = sim.submit(report("r-3", "k"));
    assert_eq!(duplicates(&ev), [("r-3", "r-2", DuplicateKind::UniqueKey)]);
}

#[test]
fn a_window_is_refused_unless_the_keys_are_kept_that_long() {
    // 168h is the default retention; "7d" is no span (days are written in hours).
    for (window, ok) in [("1h", true), ("7d", false), ("168h", true), ("169h", false)] {
        let r = unique("label:report", window);
        assert_eq!(r.validate().is_ok(), ok, "{window}: {:?}", r.validate());
    }
    let mut r = unique("label:report", "169h");
    r.timing.idempotency_retention_ms = 30 * 24 * HOUR;
    assert!(r.validate().is_ok(), "a longer retention allows it");
    for key in ["report", "label:", "tenant"] {
        let e = unique(key, "1h").validate().unwrap_err();
        assert!(e.to_string().contains("unique key"), "{e}");
    }
}
