//! A backlog costs its index entries in memory, not its records: queued jobs past the
//! window of their lanes (`limits.max_work_per_entry + 1` first jobs) leave memory once
//! written and are read back as the window reaches them, for the timers a Tick fires, and for
//! whatever re-derives every index. Every scenario runs on the partial states of `Sim`, which
//! decide the same as the full state and may hold no queued record past every window.

mod support;

use ksched_core::events::*;
use ksched_core::records::{Heartbeat, Priority, ResultStatus};
use ksched_core::rules::{ConcurrencyRule, Rules};
use ksched_core::state::TimerKind;
use support::*;

/// Rules whose entries place at most three jobs: lanes' windows of four.
fn small_entries() -> Rules {
    let mut r = rules();
    r.limits.max_work_per_entry = 3;
    // Lanes keep 5 keys in memory, 10 at most.
    r.limits.lane_keys_in_memory = 1;
    r
}

/// Queued records the partial state holds.
fn queued_in_memory(sim: &Sim) -> usize {
    (sim.partial.jobs.iter_any_order())
        .filter(|(_, j)| j.queued_at.is_some())
        .count()
}

fn submit_backlog(sim: &mut Sim, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let id = format!("j{i:02}");
            let mut req = job(&id);
            if i % 7 == 3 {
                req.priority = Priority::Critical;
            }
            sim.submit(req);
            sim.now += 1;
            id
        })
        .collect()
}

/// Runs the worker `w1` (two slots) until nothing is left; returns the dispatch order.
fn drain(sim: &mut Sim, jobs: usize) -> Vec<String> {
    drain_restarting(sim, "default", jobs, usize::MAX)
}

#[test]
fn a_backlog_past_the_windows_leaves_memory_and_still_runs_in_queue_order() {
    let mut sim = Sim::with_rules(small_entries());
    let ids = submit_backlog(&mut sim, 40);
    assert_eq!(sim.state.queued["default"], 40);
    // One lane: its window of four records, however many wait behind it.
    assert_eq!(queued_in_memory(&sim), 4, "{:?}", sim.partial.backlog);
    assert!(sim.partial.lane_problems(&sim.state).is_empty());
    // And its first 5 to 10 keys: the rest are in the store.
    let lane = sim.partial.lanes["default"].values().next().unwrap();
    assert!((5..=10).contains(&lane.head().len()) && lane.len() == 40);

    let expected: Vec<String> = (sim.state.queue_order("default").into_iter())
        .map(|k| k.job_id)
        .collect();
    assert_eq!(expected.len(), ids.len());
    assert_eq!(expected[0], "j03", "CRITICAL jobs first");
    let order = drain(&mut sim, ids.len());
    assert_eq!(order, expected, "dispatched in queue order");
    assert!(sim.state.queued.is_empty());
    assert_eq!(queued_in_memory(&sim), 0);
}

#[test]
fn placement_timeouts_of_jobs_past_the_window_fire_from_storage() {
    let mut r = small_entries();
    r.timing.placement_timeout_ms = 5_000;
    let mut sim = Sim::with_rules(r);
    let ids = submit_backlog(&mut sim, 25);
    assert_eq!(queued_in_memory(&sim), 4);
    sim.advance(12_000);
    for id in &ids {
        assert!(sim.job_state(id).is_terminal(), "{id}");
    }
    assert_eq!(sim.dead_letters().len(), ids.len());
    assert!(sim.continuations > 0, "three a Tick, the rest continued");
    assert_eq!(queued_in_memory(&sim), 0);
}

#[test]
fn new_rules_and_a_clock_gap_read_the_whole_backlog_back_and_let_it_go_again() {
    let mut sim = Sim::with_rules(small_entries());
    let ids = submit_backlog(&mut sim, 30);
    // Keys by tenant now: every queued job changes lane.
    let mut r = small_entries();
    r.topic_concurrency.insert(
        "job.default".into(),
        ConcurrencyRule {
            key: "tenant".into(),
            limit: Some(1),
            rate: None,
            burst: None,
            fair: false,
        },
    );
    sim.reconfigure(&r, "snap-2");
    assert!(sim.partial.lane_problems(&sim.state).is_empty());
    assert_eq!(queued_in_memory(&sim), 4, "let go again at the checkpoint");
    sim.tick_now();
    sim.gap(60_000);
    // A clock gap moves the placement timeouts on from the timers alone: no backlog read.
    let reads = sim.cold.reads.get();
    sim.tick_now();
    assert!(
        sim.cold.reads.get() - reads < 10,
        "{} records read",
        sim.cold.reads.get() - reads
    );
    assert_eq!(sim.partial.timers, sim.state.timers);
    assert!(
        (sim.journal.iter().rev().take(3)).any(|e| names(&e.events).contains(&"ClockGap")),
        "a clock gap"
    );
    assert_eq!(queued_in_memory(&sim), 4);
    // A limit of 1: one at a time, in queue order.
    let expected: Vec<String> = (sim.state.queue_order("default").into_iter())
        .map(|k| k.job_id)
        .collect();
    let order = drain(&mut sim, ids.len());
    assert_eq!(order, expected);
}

/// 30 jobs of acme's (some critical), then 10 of zeta's.
fn two_tenants_backlog(sim: &mut Sim) -> Vec<String> {
    let mut ids = submit_backlog(sim, 30);
    for i in 0..10 {
        let id = format!("z{i:02}");
        let mut req = job(&id);
        req.tenant_id = "zeta".into();
        sim.submit(req);
        sim.now += 1;
        ids.push(id);
    }
    ids
}

#[test]
fn new_timeouts_and_weights_read_no_queued_job_back() {
    // New timeouts and a weight for zeta: queued jobs stand where they stood.
    let mut r = small_entries();
    r.timing.placement_timeout_ms /= 2;
    r.timing.dispatch_timeout_ms *= 2;
    r.tenants.insert(
        "zeta".into(),
        ksched_core::rules::TenantRules {
            weight: Some(3),
            ..Default::default()
        },
    );
    let mut sim = Sim::with_rules(small_entries());
    let ids = two_tenants_backlog(&mut sim);
    assert_eq!(queued_in_memory(&sim), 8, "two tenants' windows");
    let (reads, lane_reads, wait_reads) = (
        sim.cold.reads.get(),
        sim.cold.lane_reads.get(),
        sim.cold.wait_reads.get(),
    );
    let events = sim.reconfigure(&r, "snap-2");
    assert!(names(&events).contains(&"ConfigApplied"));
    assert_eq!(sim.cold.reads.get(), reads, "no queued record read back");
    assert_eq!(sim.cold.lane_reads.get(), lane_reads, "no lane key read");
    assert_eq!(
        sim.cold.wait_reads.get(),
        wait_reads,
        "no queued timer read"
    );
    assert_eq!(queued_in_memory(&sim), 8);
    // Every index is what a rebuild from all the records gives (`Sim::check` compares the
    // full state with its rebuild after every input), and the backlog drains as it does
    // under these rules from the start; not as under the old ones.
    let order = drain(&mut sim, ids.len());
    let mut from_start = Sim::with_rules(r);
    two_tenants_backlog(&mut from_start);
    assert_eq!(order, drain(&mut from_start, ids.len()));
    let mut unweighted = Sim::with_rules(small_entries());
    two_tenants_backlog(&mut unweighted);
    assert_ne!(order, drain(&mut unweighted, ids.len()), "zeta weighs 3");
}

#[test]
fn a_job_past_the_window_is_read_back_when_an_input_names_it() {
    let mut sim = Sim::with_rules(small_entries());
    submit_backlog(&mut sim, 20);
    assert!(!sim.partial.jobs.contains_key("j15"), "past the window");
    let events = sim.cancel("j15", None);
    assert!(
        names(&events).contains(&"JobCancelled"),
        "{:?}",
        names(&events)
    );
    assert_eq!(sim.state.queued["default"], 19);
    // A job submitted ahead of the window pushes the last of it out.
    let mut req = job("urgent");
    req.priority = Priority::Critical;
    sim.submit(req);
    assert_eq!(queued_in_memory(&sim), 4);
    let order = drain(&mut sim, 20);
    assert_eq!(order.len(), 20);
    assert_eq!(order[0], "j03");
    assert!(!order.contains(&"j15".to_owned()));
}

/// A record set aside that names a job whose record waits in storage is written into that
/// job's history, on the partial states as on the full one (Sim::check compares every job).
#[test]
fn a_record_set_aside_for_a_job_past_the_window_reads_the_job_back() {
    let mut sim = Sim::with_rules(small_entries());
    submit_backlog(&mut sim, 20);
    assert!(!sim.partial.jobs.contains_key("j15"), "past the window");
    let before = sim.job("j15").history_lines;
    sim.input(
        "job.default",
        Input::Malformed(MalformedRecord {
            key: Some("j15".into()),
            size_bytes: 10,
            error: "an unsealed secret".into(),
            reason_code: "malformed_record".into(),
            job_id: Some("j15".into()),
            tenant_id: Some("acme".into()),
        }),
    );
    assert!(
        sim.job("j15").history_lines > before,
        "the job's history says so"
    );
    assert_eq!(sim.job_state("j15"), JobState::Pending);
}

/// A Tick that journals a clock gap moves the placement timeouts past it first: the timers
/// it then fires are others (deadlines here) of jobs whose records wait in storage, and it
/// reads those back, not the records of timeouts it will not fire.
#[test]
fn deadlines_past_the_window_fire_after_a_clock_gap() {
    let mut sim = Sim::with_rules(small_entries());
    sim.tick_now();
    submit_backlog(&mut sim, 20);
    sim.advance(60_000);
    for i in 0..10 {
        let mut req = job(&format!("d{i}"));
        req.budget.deadline_ms = Some(8 * 60_000);
        sim.submit(req);
        sim.now += 1;
    }
    assert!(!sim.partial.jobs.contains_key("d0"), "past the window");
    sim.advance(3 * 60_000);
    // Placement timeouts of the first 20 were due at 5 minutes, the deadlines at 9.
    sim.gap(6 * 60_000);
    let events = sim.tick_now();
    assert!(names(&events).contains(&"ClockGap"));
    for i in 0..10 {
        assert_eq!(sim.job_state(&format!("d{i}")), JobState::Timeout, "d{i}");
    }
    assert_eq!(sim.state.queued["default"], 20, "the others wait on");
}

#[test]
fn a_job_queued_while_its_lanes_head_runs_short_still_leaves_memory() {
    let mut sim = Sim::with_rules(small_entries());
    for i in 0..20 {
        sim.submit(job(&format!("j{i:02}")));
        sim.now += 1;
    }
    // A worker of ten slots: each entry places three jobs (its work bound), so the lane's
    // head in memory ends the entries below a window's worth.
    sim.heartbeat(Heartbeat {
        max_parallel_jobs: 10,
        ..hb("w1", "default")
    });
    // "late" comes in past the head, in an entry that places three more: past every window
    // once the head is read back, its record must still leave memory.
    sim.submit(job("late"));
    sim.now += 1;
    sim.submit(job("later"));
    sim.now += 1;
    sim.tick_now();
    assert_eq!(sim.dispatches().len(), 10, "as many as the worker takes");
    assert!(
        !sim.partial.jobs.contains_key("late"),
        "late stays in memory"
    );
    assert!(sim.partial.lingering_queued().is_empty());
}

#[test]
fn new_rules_that_end_aging_drop_the_stored_aging_steps_of_jobs_past_the_window() {
    // A pool that ages every 10 s up to critical, with a backlog of batch jobs: each has an
    // aging step, most of them in storage only.
    let mut r = small_entries();
    r.timing.placement_timeout_ms = 24 * 3_600_000;
    r.pools.get_mut("default").unwrap().aging = Some(ksched_core::rules::AgingRule {
        after: "10s".into(),
        up_to: Priority::Critical,
    });
    let mut sim = Sim::with_rules(r.clone());
    for i in 0..30 {
        let mut req = job(&format!("j{i:02}"));
        req.priority = Priority::Batch;
        sim.submit(req);
        sim.now += 1;
    }
    assert_eq!(queued_in_memory(&sim), 4);
    // New rules without aging: no job has an aging step any more, and none may age from
    // an entry the store held until its delete was written.
    r.pools.get_mut("default").unwrap().aging = None;
    sim.reconfigure(&r, "snap-2");
    let events = sim.tick_after(60_000);
    let aged: Vec<&Event> = (events.iter())
        .filter(|e| matches!(e, Event::JobAged(_)))
        .collect();
    assert!(aged.is_empty(), "{aged:?}");
    assert!(sim.partial.waits.aging.is_empty());
    assert!(sim.cold.waits.iter().all(|(k, _)| *k != TimerKind::Aging));
}

#[test]
fn new_rules_that_lower_the_aging_ceiling_age_none_past_it_from_stored_steps() {
    // Interactive and batch jobs aging up to critical, most of their steps in storage.
    let mut r = small_entries();
    r.timing.placement_timeout_ms = 24 * 3_600_000;
    let aging = |up_to| {
        Some(ksched_core::rules::AgingRule {
            after: "10s".into(),
            up_to,
        })
    };
    r.pools.get_mut("default").unwrap().aging = aging(Priority::Critical);
    let mut sim = Sim::with_rules(r.clone());
    for i in 0..30 {
        let mut req = job(&format!("j{i:02}"));
        req.priority = if i % 2 == 0 {
            Priority::Interactive
        } else {
            Priority::Batch
        };
        sim.submit(req);
        sim.now += 1;
    }
    // Up to interactive now: the interactive jobs' steps go, the batch jobs' stay, and the
    // index of those left is read back as they fire while the deletes are being written.
    r.pools.get_mut("default").unwrap().aging = aging(Priority::Interactive);
    sim.reconfigure(&r, "snap-2");
    let events = sim.tick_after(60_000);
    let aged: Vec<&JobAged> = (events.iter())
        .filter_map(|e| match e {
            Event::JobAged(a) => Some(a),
            _ => None,
        })
        .collect();
    assert_eq!(aged.len(), 15, "each batch job one step: {aged:?}");
    assert!(aged.iter().all(|a| a.priority == Priority::Interactive));
    assert!(sim.partial.waits.aging.is_empty());
}

/// Runs worker `w1` of `pool` (two slots) until `jobs` jobs have ended, starting the partial
/// state again from its storage after every `restart_every` rounds; returns the dispatch
/// order.
fn drain_restarting(sim: &mut Sim, pool: &str, jobs: usize, restart_every: usize) -> Vec<String> {
    let beat = |sim: &mut Sim| {
        sim.heartbeat(Heartbeat {
            max_parallel_jobs: 2,
            ..hb("w1", pool)
        })
    };
    beat(sim);
    let (mut done, mut round) = (0, 0);
    while done < jobs {
        let running: Vec<(String, i32)> = (sim.dispatches().iter())
            .map(|d| (d.job.job_id.clone(), d.attempt))
            .filter(|(id, _)| sim.job_state(id) == JobState::Dispatched)
            .collect();
        assert!(!running.is_empty(), "nothing dispatched after {done} jobs");
        round += 1;
        if round % restart_every == 0 {
            // Jobs dispatched and not ended: read at the start, with the queued ones' counts.
            sim.restart();
        }
        for (id, attempt) in running {
            sim.result(&id, attempt, "w1", ResultStatus::Succeeded);
            done += 1;
        }
        beat(sim);
    }
    (sim.dispatches().iter())
        .map(|d| d.job.job_id.clone())
        .collect()
}

#[test]
fn a_start_reads_no_queued_job_and_still_runs_the_backlog_in_queue_order() {
    let mut sim = Sim::with_rules(small_entries());
    let ids = submit_backlog(&mut sim, 40);
    // What a start reads: no queued job; each lane is its count.
    let reads = sim.cold.reads.get();
    let started = sim.cold.start(&sim.partial);
    assert_eq!(
        sim.cold.reads.get(),
        reads,
        "a start reads no queued record"
    );
    assert!(started.jobs.is_empty());
    assert_eq!(started.queued, sim.state.queued);
    assert_eq!(started.tenant_pending, sim.state.tenant_pending);
    assert_eq!(started.waiting_by_reason, sim.state.waiting_by_reason);
    let lane = started.lanes["default"].values().next().unwrap();
    assert!(lane.head().is_empty() && lane.len() == 40, "counted");
    // Then, before the first decision, the lane's first keys and its window's records.
    sim.restart();
    assert_eq!(sim.cold.reads.get() - reads, 4, "the window's records");
    assert_eq!(queued_in_memory(&sim), 4);

    let expected: Vec<String> = (sim.state.queue_order("default").into_iter())
        .map(|k| k.job_id)
        .collect();
    let order = drain_restarting(&mut sim, "default", ids.len(), 3);
    assert_eq!(order, expected, "dispatched in queue order across starts");
    assert!(sim.partial.queued.is_empty() && sim.partial.tenant_pending.is_empty());
}

#[test]
fn a_start_counts_the_tenants_keys_and_pools_of_lanes_it_has_not_read() {
    // Keyed jobs of two tenants in two pools at once (`job.multi`: a and b), one at a time
    // per key, with deadlines and aging steps most of which wait in storage.
    let mut r = small_entries();
    r.timing.placement_timeout_ms = 24 * 3_600_000;
    r.topic_concurrency.insert(
        "job.multi".into(),
        ConcurrencyRule {
            key: "label:ck".into(),
            limit: Some(1),
            rate: None,
            burst: None,
            fair: false,
        },
    );
    for pool in ["a", "b"] {
        r.pools.get_mut(pool).unwrap().aging = Some(ksched_core::rules::AgingRule {
            after: "10s".into(),
            up_to: Priority::Critical,
        });
    }
    assert!(r.validate().is_ok());
    let mut sim = Sim::with_rules(r);
    let n = 36;
    for i in 0..n {
        let mut req = job(&format!("m{i:02}"));
        req.topic = "job.multi".into();
        req.tenant_id = if i % 3 == 0 { "zeta" } else { "acme" }.into();
        req.priority = Priority::Batch;
        req.labels.insert("ck".into(), format!("k{}", i % 2));
        if i % 4 == 0 {
            req.budget.deadline_ms = Some(3_600_000);
        }
        sim.submit(req);
        sim.now += 1;
    }
    // One job of each tenant's key runs: the keys' groups are parked.
    sim.heartbeat(Heartbeat {
        max_parallel_jobs: 8,
        ..hb("w1", "a")
    });
    assert_eq!(sim.dispatches().len(), 4);
    let started = sim.cold.start(&sim.partial);
    assert!(
        started
            .jobs
            .iter_any_order()
            .all(|(_, j)| j.queued_at.is_none())
    );
    assert_eq!(started.jobs.len(), 4, "the running ones");
    sim.restart();
    assert_eq!(sim.partial.queued, sim.state.queued);
    assert_eq!(sim.partial.tenant_pending, sim.state.tenant_pending);
    assert_eq!(sim.partial.key_live, sim.state.key_live);
    assert_eq!(sim.partial.key_active, sim.state.key_active);
    assert_eq!(sim.partial.waiting_by_reason, sim.state.waiting_by_reason);
    assert_eq!(
        sim.partial.waits.deadline.len(),
        sim.state.waits.deadline.len()
    );
    // Steps fire from storage after a start, and the keys' groups stay parked.
    sim.keep_alive(&[("w1", "a")]);
    sim.tick_after(25_000);
    sim.keep_alive(&[]);
    assert_eq!(sim.partial.parked, sim.state.parked);
    assert_eq!(sim.partial.lane_heads, sim.state.lane_heads);
    sim.restart();
    let order = drain_restarting(&mut sim, "a", n, 2);
    let ran: std::collections::BTreeSet<&String> = order.iter().collect();
    assert_eq!(ran.len(), n);
    assert!(
        ran.iter()
            .all(|id| sim.job_state(id) == JobState::Succeeded)
    );
    assert!(sim.partial.key_live.is_empty() && sim.partial.queued.is_empty());
}
