//! Circuit breaker per pool (SPEC §5): open on consecutive failures or failure ratio, hold the
//! pool's jobs while open, half-open after the cool-down with a few probes, close after enough
//! probe successes, reopen when a probe fails. Every move is journaled.

mod support;

use ksched_core::events::*;
use ksched_core::records::{Heartbeat, ResultStatus};
use support::*;

fn circuit(events: &[Event]) -> Option<&CircuitChanged> {
    events.iter().find_map(|e| match e {
        Event::CircuitChanged(c) => Some(c),
        _ => None,
    })
}

/// Runs one job to the given result on w1 and returns the events of the result.
fn run(sim: &mut Sim, id: &str, status: ResultStatus) -> Vec<Event> {
    sim.heartbeat(Heartbeat {
        max_parallel_jobs: 100,
        ..hb("w1", "default")
    });
    let mut r = job(id);
    r.labels.insert("x".into(), "y".into());
    sim.submit(r);
    let attempt = sim.job(id).attempt;
    assert!(
        attempt > 0,
        "{id} was not dispatched: {:?}",
        sim.job(id).wait_reason
    );
    sim.result(id, attempt, "w1", status)
}

fn no_retries() -> ksched_core::rules::Rules {
    let mut r = rules();
    r.retry.max_retries = 0;
    r
}

#[test]
fn opens_after_consecutive_failures_and_holds_jobs() {
    let mut sim = Sim::with_rules(no_retries());
    for i in 0..4 {
        let ev = run(&mut sim, &format!("f{i}"), ResultStatus::FailedFatal);
        assert!(circuit(&ev).is_none());
    }
    let ev = run(&mut sim, "f4", ResultStatus::FailedFatal);
    let c = circuit(&ev).unwrap();
    assert_eq!((c.from, c.to), (CircuitState::Closed, CircuitState::Open));
    assert_eq!(c.reason, "5 consecutive failures");

    let ev = sim.submit(job("held"));
    let w = waiting(&ev);
    assert_eq!(w.reason_code, "circuit_open");
    assert_eq!(sim.job_state("held"), JobState::Pending);
}

#[test]
fn a_success_resets_the_consecutive_count() {
    let mut sim = Sim::with_rules(no_retries());
    for i in 0..4 {
        run(&mut sim, &format!("f{i}"), ResultStatus::FailedFatal);
    }
    run(&mut sim, "ok", ResultStatus::Succeeded);
    let ev = run(&mut sim, "f5", ResultStatus::FailedFatal);
    assert!(circuit(&ev).is_none());
}

#[test]
fn opens_on_the_failure_ratio_over_a_full_window() {
    let mut r = no_retries();
    r.breaker.consecutive_failures = 100;
    let mut sim = Sim::with_rules(r);
    let mut opened_at = None;
    for i in 0..20 {
        let status = if i % 2 == 0 {
            ResultStatus::FailedFatal
        } else {
            ResultStatus::Succeeded
        };
        let ev = run(&mut sim, &format!("j{i}"), status);
        if let Some(c) = circuit(&ev) {
            opened_at = Some((i, c.reason.clone()));
            break;
        }
    }
    let (i, reason) = opened_at.expect("opened");
    assert_eq!(i, 19, "only once the window of 20 is full");
    assert!(reason.contains("50%"), "{reason}");
}

#[test]
fn half_opens_after_the_cooldown_lets_probes_through_and_closes_after_successes() {
    let mut sim = Sim::with_rules(no_retries());
    for i in 0..5 {
        run(&mut sim, &format!("f{i}"), ResultStatus::FailedFatal);
    }
    for i in 0..5 {
        sim.submit(job(&format!("q{i}")));
    }
    sim.advance(29_000);
    sim.worker("w1", "default");
    let ev = sim.tick_after(0);
    assert!(circuit(&ev).is_none(), "cool-down not over");
    sim.advance(1_000);
    // The first input after the cool-down half-opens it: here, the worker's heartbeat.
    let ev = sim.worker("w1", "default");
    let c = circuit(&ev).unwrap();
    assert_eq!((c.from, c.to), (CircuitState::Open, CircuitState::HalfOpen));
    let probes: Vec<String> = ev
        .iter()
        .filter_map(|e| match e {
            Event::JobScheduled(s) => Some(s.job_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(probes, ["q0", "q1", "q2"], "three probes, in queue order");
    assert_eq!(sim.job_state("q3"), JobState::Pending);

    sim.result("q0", 1, "w1", ResultStatus::Succeeded);
    let ev = sim.result("q1", 1, "w1", ResultStatus::Succeeded);
    let c = circuit(&ev).unwrap();
    assert_eq!(
        (c.from, c.to),
        (CircuitState::HalfOpen, CircuitState::Closed)
    );
    assert!(
        names(&ev).contains(&"JobDispatched"),
        "held jobs flow again"
    );
    assert_eq!(sim.job_state("q3"), JobState::Dispatched);
}

#[test]
fn a_failed_probe_reopens() {
    let mut sim = Sim::with_rules(no_retries());
    for i in 0..5 {
        run(&mut sim, &format!("f{i}"), ResultStatus::FailedFatal);
    }
    sim.submit(job("p"));
    sim.advance(30_000);
    sim.worker("w1", "default");
    sim.tick_after(0);
    let ev = sim.result("p", 1, "w1", ResultStatus::FailedFatal);
    let c = circuit(&ev).unwrap();
    assert_eq!((c.from, c.to), (CircuitState::HalfOpen, CircuitState::Open));
    assert_eq!(c.reason, "a probe job failed");
}

#[test]
fn worker_loss_does_not_count_against_the_pool() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    for i in 0..6 {
        sim.submit(job(&format!("j{i}")));
    }
    sim.tick_after(16_000);
    assert!(
        sim.state
            .breakers
            .get("default")
            .is_none_or(|b| b.window.is_empty()),
        "worker_lost is not a pool failure"
    );
}

fn open_after_failures(sim: &mut Sim) {
    for i in 0..5 {
        run(sim, &format!("f{i}"), ResultStatus::FailedFatal);
    }
    assert_eq!(
        sim.state.breakers["default"].state,
        CircuitState::Open,
        "setup: the circuit is open"
    );
}

#[test]
fn timeouts_found_by_ticks_count_and_open_the_circuit() {
    let mut r = no_retries();
    r.timing.dispatch_timeout_ms = 2_000;
    let mut sim = Sim::with_rules(r);
    sim.keep_alive(&[("w1", "default")]);
    sim.heartbeat(Heartbeat {
        max_parallel_jobs: 100,
        ..hb("w1", "default")
    });
    for i in 0..5 {
        sim.submit(job(&format!("t{i}")));
    }
    // Nobody starts them: every dispatch times out on a Tick, and the fifth opens it there.
    let ev = sim.tick_after(2_000);
    let counted = ev
        .iter()
        .filter(|e| matches!(e, Event::BreakerCounted(b) if b.failure))
        .count();
    assert_eq!(counted, 5, "{:?}", names(&ev));
    let c = circuit(&ev).expect("a Tick opened the circuit");
    assert_eq!((c.from, c.to), (CircuitState::Closed, CircuitState::Open));
}

#[test]
fn probes_that_end_without_a_result_free_their_slot() {
    let mut r = no_retries();
    r.breaker.cooldown_ms = 1_000;
    r.breaker.half_open_probes = 1;
    r.breaker.close_after_successes = 1;
    let mut sim = Sim::with_rules(r);
    open_after_failures(&mut sim);
    sim.tick_after(1_000);
    assert_eq!(sim.state.breakers["default"].state, CircuitState::HalfOpen);
    // The one probe goes out and is cancelled: no result ever comes.
    sim.submit(job("probe-1"));
    assert_eq!(sim.job_state("probe-1"), JobState::Dispatched);
    sim.submit(job("waits"));
    assert_eq!(
        sim.job_state("waits"),
        JobState::Pending,
        "the probe slot is taken"
    );
    sim.cancel("probe-1", None);
    // The slot is free: the next job goes out as a probe and its success closes the circuit.
    assert_eq!(sim.job_state("waits"), JobState::Dispatched);
    let attempt = sim.job("waits").attempt;
    let ev = sim.result("waits", attempt, "w1", ResultStatus::Succeeded);
    let c = circuit(&ev).expect("closed");
    assert_eq!(c.to, CircuitState::Closed);
}

#[test]
fn a_probe_whose_worker_is_lost_frees_its_slot() {
    let mut r = no_retries();
    r.breaker.cooldown_ms = 1_000;
    r.breaker.half_open_probes = 1;
    r.breaker.close_after_successes = 1;
    r.retry.max_retries = 3;
    let mut sim = Sim::with_rules(r);
    open_after_failures(&mut sim);
    sim.tick_after(1_000);
    sim.submit(job("probe"));
    assert_eq!(sim.job_state("probe"), JobState::Dispatched);
    // w1 goes silent and is lost; the probe is retried (worker_lost says nothing about the
    // pool), and the slot is free again rather than held for ever.
    sim.tick_after(16_000);
    assert!(!sim.state.workers["w1"].alive);
    assert!(sim.state.breakers["default"].probes.is_empty());
    sim.keep_alive(&[("w2", "default")]);
    let ev = sim.tick_after(5_000);
    assert!(
        ev.iter().any(
            |e| matches!(e, Event::JobDispatched(d) if d.job_id == "probe" && d.worker_id == "w2")
        ),
        "the probe went out again: {:?}",
        names(&ev)
    );
}

#[test]
fn new_rules_reset_every_breaker() {
    let mut sim = Sim::with_rules(no_retries());
    open_after_failures(&mut sim);
    let mut r = no_retries();
    r.breaker.consecutive_failures = 7;
    let ev = sim.reconfigure(&r, "snap-2");
    let c = circuit(&ev).expect("reset");
    assert_eq!((c.from, c.to), (CircuitState::Open, CircuitState::Closed));
    assert!(c.reason.contains("configuration changed"), "{}", c.reason);
    assert_eq!(
        sim.state.breakers["default"],
        ksched_core::state::Breaker::default()
    );
    // Held jobs go out at once.
    let ev = sim.submit(job("after"));
    assert!(names(&ev).contains(&"JobDispatched"), "{:?}", names(&ev));
}

/// While half-open, only the probes' ends count: jobs that were already running when the
/// circuit opened, and end now, say nothing about whether the pool recovered.
#[test]
fn while_half_open_only_the_probes_count() {
    let mut sim = Sim::with_rules(no_retries());
    sim.keep_alive(&[("w1", "default")]);
    sim.heartbeat(Heartbeat {
        max_parallel_jobs: 100,
        ..hb("w1", "default")
    });
    for id in ["x0", "x1"] {
        sim.submit(job(id));
        sim.started(id, 1, "w1");
    }
    for i in 0..5 {
        run(&mut sim, &format!("f{i}"), ResultStatus::FailedFatal);
    }
    assert_eq!(sim.state.breakers["default"].state, CircuitState::Open);
    sim.submit(job("q0"));
    sim.advance(31_000);
    assert_eq!(sim.state.breakers["default"].state, CircuitState::HalfOpen);
    assert!(sim.state.breakers["default"].probes.contains("q0"));
    for id in ["x0", "x1"] {
        let ev = sim.result(id, 1, "w1", ResultStatus::Succeeded);
        assert!(
            !names(&ev).contains(&"BreakerCounted"),
            "{id} is no probe: {ev:?}"
        );
        assert!(circuit(&ev).is_none(), "{ev:?}");
    }
    assert_eq!(sim.state.breakers["default"].state, CircuitState::HalfOpen);
    assert_eq!(sim.state.breakers["default"].probe_successes, 0);
    let ev = sim.result("q0", 1, "w1", ResultStatus::Succeeded);
    assert!(names(&ev).contains(&"BreakerCounted"), "the probe counts");
    assert_eq!(sim.state.breakers["default"].probe_successes, 1);
}
