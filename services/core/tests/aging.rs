//! Priority aging (SPEC §10): a job that has waited a pool's aging time in its queue gains
//! a priority (a journaled `JobAged`), and one more for each such time it waits on, up to
//! the rule's ceiling; it keeps its place by age, so it runs before the jobs of its new
//! priority that were queued after it. No low-priority job waits for ever behind a stream
//! of higher ones.

mod support;

use ksched_core::events::*;
use ksched_core::records::{JobRequest, Priority, ResultStatus};
use ksched_core::rules::{AgingRule, Rules};
use support::*;

const AFTER_MS: i64 = 10_000;

/// Rules where jobs wait and run as long as they like, the default pool aging by `aging`.
fn aging_rules(aging: Option<AgingRule>) -> Rules {
    let mut r = rules();
    r.timing.placement_timeout_ms = 24 * 3_600_000;
    r.timing.dispatch_timeout_ms = 24 * 3_600_000;
    r.timing.running_timeout_ms = 24 * 3_600_000;
    r.timing.worker_ttl_ms = 24 * 3_600_000;
    r.pools.get_mut("default").unwrap().aging = aging;
    r
}

fn every_10s(up_to: Priority) -> Option<AgingRule> {
    Some(AgingRule {
        after: "10s".into(),
        up_to,
    })
}

fn at(id: &str, priority: Priority) -> JobRequest {
    let mut j = job(id);
    j.priority = priority;
    j
}

fn aged(events: &[Event]) -> Vec<&JobAged> {
    (events.iter())
        .filter_map(|e| match e {
            Event::JobAged(a) => Some(a),
            _ => None,
        })
        .collect()
}

/// A worker of one slot, busy with `first`; returns the jobs placed on it from here in
/// order while a stream of `stream` jobs keeps coming: every second one job is submitted
/// and the running one finishes, for `seconds` seconds.
fn stream(
    sim: &mut Sim,
    mut running: String,
    stream: Priority,
    seconds: usize,
) -> (Vec<String>, Vec<Event>) {
    let mut placed = Vec::new();
    let mut all = Vec::new();
    for n in 0..seconds {
        all.extend(sim.tick_after(1_000));
        all.extend(sim.submit(at(&format!("s{n:03}"), stream)));
        let ev = sim.result(&running, 1, "w1", ResultStatus::Succeeded);
        let next = dispatched(&ev)[0].to_owned();
        placed.push(next.clone());
        running = next;
        all.extend(ev);
    }
    (placed, all)
}

fn one_slot(sim: &mut Sim) {
    let mut w = hb("w1", "default");
    w.max_parallel_jobs = 1;
    sim.heartbeat(w);
}

#[test]
fn without_aging_a_batch_job_waits_behind_a_stream_of_interactive_ones() {
    let mut sim = Sim::with_rules(aging_rules(None));
    one_slot(&mut sim);
    sim.submit(at("first", Priority::Interactive));
    sim.submit(at("s-early", Priority::Interactive));
    sim.submit(at("batch", Priority::Batch));
    let (placed, events) = stream(&mut sim, "first".into(), Priority::Interactive, 40);
    assert!(!placed.contains(&"batch".to_owned()), "{placed:?}");
    assert!(aged(&events).is_empty());
    sim.check();
}

#[test]
fn a_batch_job_gains_a_priority_for_each_aging_time_it_waits() {
    let mut sim = Sim::with_rules(aging_rules(every_10s(Priority::Critical)));
    one_slot(&mut sim);
    sim.submit(at("first", Priority::Critical));
    let queued = sim.now;
    sim.submit(at("batch", Priority::Batch));
    // A stream of CRITICAL jobs: the BATCH job becomes INTERACTIVE after 10 s, which is
    // still behind them, and CRITICAL after 20 s, when it is older than every one waiting.
    let (placed, events) = stream(&mut sim, "first".into(), Priority::Critical, 30);
    let steps: Vec<(Priority, i64)> = aged(&events)
        .iter()
        .map(|a| (a.priority, a.queued_at))
        .collect();
    assert_eq!(
        steps,
        [
            (Priority::Interactive, queued),
            (Priority::Critical, queued)
        ]
    );
    let at = placed.iter().position(|p| p == "batch").expect("it ran");
    // Placed at the first finish after it became CRITICAL (20 s), not at the end of the
    // stream: the jobs before it in `placed` are the stream's first ~20.
    assert!((18..=21).contains(&at), "placed {at}th: {placed:?}");
    let history = sim.history("batch");
    assert!(
        (history.iter()).any(|h| h.event == "JobAged" && h.detail.contains("aged to CRITICAL")),
        "{history:?}"
    );
    // The request keeps what it was submitted with; the placement says what aging gave.
    assert_eq!(sim.job("batch").request.priority, Priority::Batch);
    assert!(
        (history.iter()).any(|h| h
            .detail
            .contains("placed at CRITICAL priority, aged from BATCH")),
        "{history:?}"
    );
    sim.check();
}

#[test]
fn aging_stops_at_the_rules_ceiling() {
    let mut sim = Sim::with_rules(aging_rules(every_10s(Priority::Interactive)));
    one_slot(&mut sim);
    sim.submit(at("first", Priority::Critical));
    sim.submit(at("batch", Priority::Batch));
    let (placed, events) = stream(&mut sim, "first".into(), Priority::Critical, 40);
    let steps: Vec<Priority> = aged(&events).iter().map(|a| a.priority).collect();
    assert_eq!(steps, [Priority::Interactive]);
    assert!(!placed.contains(&"batch".to_owned()), "{placed:?}");
    assert_eq!(sim.job("batch").queue_rank(), Priority::Interactive.rank());
    sim.check();
}

#[test]
fn an_aged_job_goes_before_younger_jobs_of_its_new_priority_only() {
    let mut sim = Sim::with_rules(aging_rules(every_10s(Priority::Interactive)));
    one_slot(&mut sim);
    sim.submit(at("first", Priority::Critical));
    sim.submit(at("i-old", Priority::Interactive));
    sim.tick_after(1_000);
    sim.submit(at("batch", Priority::Batch));
    sim.tick_after(1_000);
    sim.submit(at("i-young", Priority::Interactive));
    let ev = sim.tick_after(AFTER_MS);
    assert_eq!(aged(&ev).len(), 1, "{:?}", names(&ev));
    // INTERACTIVE now, by age between the two INTERACTIVE jobs.
    let ev = sim.result("first", 1, "w1", ResultStatus::Succeeded);
    assert_eq!(dispatched(&ev), ["i-old"]);
    let ev = sim.result("i-old", 1, "w1", ResultStatus::Succeeded);
    assert_eq!(dispatched(&ev), ["batch"]);
    let ev = sim.result("batch", 1, "w1", ResultStatus::Succeeded);
    assert_eq!(dispatched(&ev), ["i-young"]);
    sim.check();
}

#[test]
fn a_job_queued_again_starts_at_its_own_priority_and_ages_anew() {
    let mut sim = Sim::with_rules(aging_rules(every_10s(Priority::Critical)));
    one_slot(&mut sim);
    sim.submit(at("first", Priority::Interactive));
    sim.submit(at("batch", Priority::Batch));
    let ev = sim.tick_after(AFTER_MS);
    assert_eq!(aged(&ev).len(), 1);
    assert_eq!(sim.job("batch").queue_rank(), Priority::Interactive.rank());
    sim.result("first", 1, "w1", ResultStatus::Succeeded);
    assert_eq!(sim.job_state("batch"), JobState::Dispatched);
    // It fails and is queued again after its backoff: BATCH again, aging from then.
    let ev = sim.result_with("batch", 1, "w1", ResultStatus::FailedRetryable, Some("x"));
    assert!(names(&ev).contains(&"JobRetrying"));
    sim.submit(at("i-busy", Priority::Interactive));
    let ev = sim.tick_after(2_000);
    assert!(names(&ev).contains(&"JobQueued"), "{:?}", names(&ev));
    assert_eq!(sim.job("batch").aged, 0);
    assert_eq!(sim.job("batch").queue_rank(), Priority::Batch.rank());
    let requeued = sim.job("batch").queued_at.unwrap();
    let ev = sim.tick_after(AFTER_MS - 2_000);
    assert!(
        aged(&ev).is_empty(),
        "not before 10 s from its new queueing"
    );
    let ev = sim.tick_after(2_000);
    let steps = aged(&ev);
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].queued_at, requeued);
    sim.check();
}

#[test]
fn aging_given_by_new_rules_counts_from_when_the_job_was_queued() {
    let mut sim = Sim::with_rules(aging_rules(None));
    one_slot(&mut sim);
    sim.submit(at("first", Priority::Interactive));
    sim.submit(at("batch", Priority::Batch));
    let ev = sim.tick_after(3 * AFTER_MS);
    assert!(aged(&ev).is_empty());
    sim.reconfigure(&aging_rules(every_10s(Priority::Critical)), "aging");
    // Waited 30 s already: its first step is due, and the next at each Tick after.
    let ev = sim.tick_after(1_000);
    assert_eq!(aged(&ev).len(), 1, "{:?}", names(&ev));
    let ev = sim.tick_after(1_000);
    assert_eq!(aged(&ev).len(), 1, "{:?}", names(&ev));
    assert_eq!(sim.job("batch").queue_rank(), Priority::Critical.rank());
    // Rules without aging leave what was gained and give no more.
    sim.reconfigure(&aging_rules(None), "none");
    assert_eq!(sim.job("batch").queue_rank(), Priority::Critical.rank());
    sim.check();
}

#[test]
fn a_cancelled_or_placed_job_does_not_age() {
    let mut sim = Sim::with_rules(aging_rules(every_10s(Priority::Critical)));
    one_slot(&mut sim);
    sim.submit(at("first", Priority::Batch));
    sim.submit(at("gone", Priority::Batch));
    sim.cancel("gone", None);
    let ev = sim.tick_after(3 * AFTER_MS);
    assert!(aged(&ev).is_empty(), "{:?}", names(&ev));
    assert!(sim.state.timers.iter().all(|t| t.job_id != "gone"));
    let waits = sim.state.waits.each().flat_map(|(_, s)| s.head().iter());
    assert!(waits.into_iter().all(|t| t.job_id != "gone"));
    sim.check();
}

#[test]
fn aging_rules_are_checked() {
    for (after, ok) in [
        ("10s", true),
        ("1s", true),
        ("999ms", false),
        ("soon", false),
    ] {
        let mut r = aging_rules(Some(AgingRule {
            after: after.into(),
            up_to: Priority::Critical,
        }));
        r.timing.placement_timeout_ms = 60_000;
        assert_eq!(r.validate().is_ok(), ok, "{after}: {:?}", r.validate());
    }
    // A topic's pools age alike: a job has one priority in all its queues.
    let mut r = aging_rules(None);
    r.pools.get_mut("a").unwrap().aging = every_10s(Priority::Critical);
    let e = r.validate().unwrap_err().0;
    assert!(e.contains("topic job.multi") && e.contains("aging"), "{e}");
    r.pools.get_mut("b").unwrap().aging = every_10s(Priority::Critical);
    assert!(r.validate().is_ok());
    let parsed: ksched_core::rules::PoolRules =
        serde_json::from_str(r#"{"aging": {"after": "30s", "up_to": "INTERACTIVE"}}"#).unwrap();
    assert_eq!(
        parsed.aging,
        Some(AgingRule {
            after: "30s".into(),
            up_to: Priority::Interactive
        })
    );
    let parsed: ksched_core::rules::PoolRules =
        serde_json::from_str(r#"{"aging": {"after": "30s"}}"#).unwrap();
    assert_eq!(parsed.aging.unwrap().up_to, Priority::Critical);
}

#[test]
fn a_backlog_given_aging_at_once_ages_a_budget_at_a_time() {
    let mut sim = Sim::with_rules(aging_rules(None));
    one_slot(&mut sim);
    sim.submit(at("first", Priority::Interactive));
    for n in 0..450 {
        sim.submit(at(&format!("b{n:03}"), Priority::Batch));
    }
    sim.tick_after(AFTER_MS);
    sim.reconfigure(&aging_rules(every_10s(Priority::Interactive)), "aging");
    let from = sim.journal.len();
    let ev = sim.tick_after(1_000);
    // Every waiting job ages at this Tick, over entries that continue it, each aging at
    // most half of what the work bound allows.
    assert_eq!(aged(&ev).len(), 450);
    let bound = sim.state.rules().unwrap().limits.max_work_per_entry as usize;
    let most = (sim.journal[from..].iter())
        .map(|e| aged(&e.events).len())
        .max()
        .unwrap();
    assert_eq!(most, bound / 2);
    assert!(sim.journal.len() - from >= 450 / (bound / 2), "continued");
    sim.check();
}

#[test]
fn a_backlog_of_aging_steps_does_not_stand_before_a_deadline() {
    let mut sim = Sim::with_rules(aging_rules(None));
    one_slot(&mut sim);
    sim.submit(at("first", Priority::Interactive));
    for n in 0..300 {
        sim.submit(at(&format!("b{n:03}"), Priority::Batch));
    }
    let mut late = at("late", Priority::Batch);
    late.budget.deadline_ms = Some(25_000);
    sim.submit(late);
    sim.tick_after(AFTER_MS);
    // Aging given now: 300 steps due since 10 s, before the deadline (25 s).
    sim.reconfigure(&aging_rules(every_10s(Priority::Interactive)), "aging");
    // Nothing read for 20 s: the next Tick finds both due.
    sim.gap(20_000);
    let from = sim.journal.len();
    sim.tick_now();
    // The deadline is acted on in the Tick's first entry, not after the aging backlog.
    let first = &sim.journal[from].events;
    assert!(
        first
            .iter()
            .any(|e| matches!(e, Event::JobTimedOut(t) if t.job_id == "late")),
        "{:?}",
        names(first)
    );
    sim.check();
}
