//! Heartbeats left out of the journal (`redundant_heartbeat`, `processor.coalesce_heartbeats`):
//! only an idle worker's heartbeat that says what its last journaled one said, while that one
//! is recent; liveness holds and replay stays exact without them.

mod support;

use ksched_core::decide::{HEARTBEAT_LOAD_STEP, redundant_heartbeat};
use ksched_core::events::*;
use ksched_core::records::Heartbeat;
use support::*;

/// What the processor does with a heartbeat: leaves it out when redundant (checked on the
/// state it keeps, which evicts cold records, and on the full one: they must agree), else
/// decides on it.
fn beat(sim: &mut Sim, hb: Heartbeat) -> Option<Vec<Event>> {
    let left_out = redundant_heartbeat(&sim.partial, &hb, sim.now);
    assert_eq!(left_out, redundant_heartbeat(&sim.state, &hb, sim.now));
    (!left_out).then(|| sim.heartbeat(hb))
}

fn ttl() -> i64 {
    rules().timing.worker_ttl_ms
}

#[test]
fn an_idle_workers_unchanged_heartbeat_is_left_out_until_a_third_of_the_ttl_passed() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.now += 1_000;
    assert!(beat(&mut sim, hb("w1", "default")).is_none());
    sim.now += ttl() / 3 - 1_001;
    assert!(beat(&mut sim, hb("w1", "default")).is_none());
    sim.now += 1;
    let events = beat(&mut sim, hb("w1", "default")).expect("journaled: a third of the TTL passed");
    assert!(events.iter().any(|e| matches!(e, Event::WorkerUpdated(_))));
    // And the count starts again from that one.
    sim.now += 1_000;
    assert!(beat(&mut sim, hb("w1", "default")).is_none());
}

#[test]
fn a_heartbeat_that_changes_what_decisions_read_is_journaled() {
    type Change = fn(&mut Heartbeat);
    let changes: Vec<(&str, Change)> = vec![
        ("owned partitions", |h| h.owned_partitions = vec![0, 1]),
        ("draining", |h| h.draining = true),
        ("a label", |h| {
            h.labels.insert("zone".into(), "b".into());
        }),
        ("a capability", |h| h.capabilities = vec!["gpu".into()]),
        ("max parallel jobs", |h| h.max_parallel_jobs = 8),
        ("cpu beyond the step", |h| {
            h.cpu_load = HEARTBEAT_LOAD_STEP + 1.0;
        }),
        ("memory load beyond the step", |h| {
            h.memory_load = HEARTBEAT_LOAD_STEP + 1.0;
        }),
        ("free memory said for the first time", |h| {
            h.memory_free_bytes = Some(1 << 30);
        }),
        ("jobs it runs that the scheduler did not send", |h| {
            h.active_jobs = 1;
            h.active_job_ids = vec!["elsewhere".into()];
        }),
    ];
    for (what, change) in changes {
        let mut sim = Sim::new();
        sim.worker("w1", "default");
        sim.now += 1_000;
        let mut h = hb("w1", "default");
        change(&mut h);
        assert!(beat(&mut sim, h).is_some(), "{what}");
    }
    // A load that is not a number is never "close" to the last one: the heartbeat goes to
    // the decision, which refuses it.
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.now += 1_000;
    let mut h = hb("w1", "default");
    h.cpu_load = f64::NAN;
    let events = beat(&mut sim, h).expect("a NaN load is journaled");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::CommandRejected(_))),
        "{events:?}"
    );
    // Within the step, loads are not news.
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.now += 1_000;
    let mut h = hb("w1", "default");
    h.cpu_load = HEARTBEAT_LOAD_STEP - 1.0;
    assert!(beat(&mut sim, h).is_none());
}

#[test]
fn a_busy_worker_or_a_waiting_queue_keeps_every_heartbeat() {
    // A job in flight on the worker.
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    sim.now += 1_000;
    assert!(beat(&mut sim, hb("w1", "default")).is_some(), "in flight");

    // A job waiting in the worker's pool (here: its only worker drains, so it waits). The
    // same heartbeat without the job waiting is left out.
    let draining = || {
        let mut h = hb("d1", "default");
        h.draining = true;
        h
    };
    let mut sim = Sim::new();
    sim.heartbeat(draining());
    sim.now += 1_000;
    assert!(beat(&mut sim, draining()).is_none(), "idle, nothing waits");
    sim.submit(job("j2"));
    assert_eq!(sim.job("j2").state, JobState::Pending);
    sim.now += 1_000;
    assert!(beat(&mut sim, draining()).is_some(), "a queue waits");

    // A worker the scheduler does not know, or knows as lost.
    let mut sim = Sim::new();
    assert!(beat(&mut sim, hb("w9", "default")).is_some(), "unknown");
    sim.tick_after(ttl() + 1_000);
    assert!(!sim.state.workers["w9"].alive);
    assert!(beat(&mut sim, hb("w9", "default")).is_some(), "lost");
}

#[test]
fn an_idle_fleet_stays_alive_on_a_third_of_its_heartbeats_and_replays_exactly() {
    let mut sim = Sim::new();
    let fleet = ["w1", "w2", "w3"];
    for w in fleet {
        sim.worker(w, "default");
    }
    let (mut sent, mut journaled) = (0, 0);
    let mut lost = Vec::new();
    // Ten minutes: a heartbeat per worker every HEARTBEAT_MS, a Tick every TICK_MS.
    let end = sim.now + 600_000;
    let mut next_beat = sim.now + HEARTBEAT_MS;
    while sim.now < end {
        let events = sim.tick_after(TICK_MS);
        lost.extend(events.iter().filter_map(|e| match e {
            Event::WorkerLost(l) => Some(l.worker_id.clone()),
            _ => None,
        }));
        if sim.now >= next_beat {
            next_beat += HEARTBEAT_MS;
            for w in fleet {
                sent += 1;
                if beat(&mut sim, hb(w, "default")).is_some() {
                    journaled += 1;
                }
            }
        }
    }
    assert!(lost.is_empty(), "lost: {lost:?}");
    assert!(fleet.iter().all(|w| sim.state.workers[*w].alive));
    // TTL 15 s, a heartbeat every 3 s: one in two is journaled (the one 6 s after the last).
    assert!(
        journaled * 2 <= sent + fleet.len(),
        "{journaled} of {sent} journaled"
    );
    // Replay == live after every input: `Sim::check` ran on each; once more at the end.
    sim.check();
    // And a job submitted now is placed on the fleet at once.
    let events = sim.submit(job("after"));
    assert!(events.iter().any(|e| matches!(e, Event::JobDispatched(_))));
}
