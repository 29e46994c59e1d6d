//! Scheduler time (docs/architecture.md, "Time"): a Tick judges at its watermark, never at
//! its log time; a jump of the watermark larger than `clock_gap_ms` is a gap in the log, after
//! which evidence-based timeouts count afresh; deadlines count from acceptance.

mod support;

use ksched_core::events::*;
use ksched_core::records::{ResultStatus, Tick};
use support::*;

fn tick_at(sim: &mut Sim, log_time: i64, watermark: i64) -> Vec<Event> {
    sim.now = log_time;
    sim.input(
        "ksched.control",
        Input::Tick(Tick {
            source: "test".into(),
            issued_at: log_time,
            watermark: Some(watermark),
        }),
    )
}

fn lost(events: &[Event]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::WorkerLost(l) => Some(l.worker_id.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_tick_judges_at_its_watermark_not_at_its_log_time() {
    // The processor read a Tick stamped T0+20 s while the heartbeats were read only up to
    // T0+10 s (a backlog on their partition): the worker is not lost, its job not retried.
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    sim.started("j1", 1, "w1");
    for s in 1..=10 {
        tick_at(&mut sim, T0 + s * 2_000, T0 + s * 1_000);
    }
    let ev = tick_at(&mut sim, T0 + 20_000, T0 + 10_000);
    assert!(lost(&ev).is_empty(), "{:?}", names(&ev));
    assert!(sim.state.workers["w1"].alive);
    assert_eq!(sim.job_state("j1"), JobState::Running);
    assert_eq!(sim.state.watermark, T0 + 10_000);
    // Once the heartbeats are read through T0+16 s without one from w1, it is lost.
    let mut ev = Vec::new();
    for s in 11..=16 {
        ev.extend(tick_at(&mut sim, T0 + 20_000 + s, T0 + s * 1_000));
    }
    assert_eq!(lost(&ev), ["w1"]);
}

#[test]
fn the_watermark_never_goes_back() {
    let mut sim = Sim::new();
    tick_at(&mut sim, T0 + 5_000, T0 + 5_000);
    tick_at(&mut sim, T0 + 6_000, T0 + 1_000);
    assert_eq!(sim.state.watermark, T0 + 5_000);
}

#[test]
fn an_outage_is_a_gap_not_a_lost_worker() {
    // The broker was down for 45 s: no heartbeat could be appended, and the first Tick after
    // it is read before the workers' buffered heartbeats.
    let mut sim = Sim::new();
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    sim.started("j1", 1, "w1");
    sim.submit(job("j2")); // dispatched, not started yet
    sim.tick_after(5_000);
    sim.gap(45_000);
    let ev = sim.tick_now();
    let gap = find(&ev, |e| match e {
        Event::ClockGap(g) => Some(g),
        _ => None,
    });
    assert_eq!(gap.to - gap.from, 45_000);
    assert!(lost(&ev).is_empty(), "{:?}", names(&ev));
    assert_eq!(sim.job_state("j1"), JobState::Running);
    assert_eq!(sim.job_state("j2"), JobState::Dispatched);
    assert!(sim.state.workers["w1"].alive);
    // After the gap, silence counts again: w1 stops heartbeating and is lost ttl later.
    sim.keep_alive(&[]);
    let ev = sim.tick_after(14_000);
    assert!(lost(&ev).is_empty(), "{:?}", names(&ev));
    let ev = sim.tick_after(2_000);
    assert_eq!(lost(&ev), ["w1"]);
}

#[test]
fn a_gap_restarts_dispatch_timeouts_but_not_deadlines() {
    let mut r = rules();
    r.timing.dispatch_timeout_ms = 10_000;
    let mut sim = Sim::with_rules(r);
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    sim.submit(job("dispatched"));
    let mut late = job("late");
    late.budget.deadline_ms = Some(20_000);
    late.topic = "job.gpu".into(); // no gpu workers: it waits
    late.meta.requires = vec!["gpu".into()];
    sim.submit(late);
    sim.tick_after(5_000);
    sim.gap(30_000);
    let ev = sim.tick_now();
    // Nothing evidence-based fires in the Tick after the gap...
    assert_eq!(sim.job_state("dispatched"), JobState::Dispatched);
    // ...but the deadline (wall-clock semantics) has passed.
    assert_eq!(sim.job_state("late"), JobState::Timeout, "{:?}", names(&ev));
    assert_eq!(dead_lettered(&ev).reason_code, "deadline_exceeded");
    // The dispatch timeout counts from the end of the gap.
    sim.tick_after(9_000);
    assert_eq!(sim.job_state("dispatched"), JobState::Dispatched);
    sim.tick_after(1_000);
    assert_eq!(sim.job_state("dispatched"), JobState::Timeout);
}

#[test]
fn ticks_before_watermarks_existed_judge_at_their_log_time() {
    // A journal written before Tick.watermark: replaying it decides as it did.
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.now = T0 + 16_000;
    let ev = sim.input(
        "ksched.control",
        Input::Tick(Tick {
            source: "old".into(),
            issued_at: sim.now,
            watermark: None,
        }),
    );
    assert_eq!(lost(&ev), ["w1"]);
    assert!(!names(&ev).contains(&"ClockGap"));
}

#[test]
fn a_result_read_before_its_timeout_is_judged_wins() {
    // The result was written before the timeout, on a partition read late; the Tick that
    // would time the job out was judged at a watermark before it, so the result wins.
    let mut r = rules();
    r.timing.dispatch_timeout_ms = 5_000;
    let mut sim = Sim::with_rules(r);
    sim.worker("w1", "default");
    sim.submit(job("j"));
    tick_at(&mut sim, T0 + 6_000, T0 + 4_000);
    assert_eq!(sim.job_state("j"), JobState::Dispatched);
    sim.result("j", 1, "w1", ResultStatus::Succeeded);
    assert_eq!(sim.job_state("j"), JobState::Succeeded);
}
