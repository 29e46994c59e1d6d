//! Waiting (SPEC §4): the pending queue's order, placement when capacity appears, tenant
//! limits, and the placement timeout with the reason that held the job.

mod support;

use ksched_core::events::*;
use ksched_core::records::{Heartbeat, Priority, ResultStatus};
use ksched_core::rules::TenantRules;
use support::*;

#[test]
fn with_no_worker_a_job_waits_and_is_dispatched_when_a_worker_appears() {
    let mut sim = Sim::new();
    let ev = sim.submit(job("j1"));
    let w = waiting(&ev);
    assert_eq!(w.reason_code, "no_workers");
    assert!(
        w.detail.contains("no live worker in [default]"),
        "{}",
        w.detail
    );
    assert_eq!(sim.job_state("j1"), JobState::Pending);
    assert!(sim.dispatches().is_empty());

    sim.advance(2_000);
    let ev = sim.worker("w1", "default");
    assert_eq!(
        names(&ev),
        ["WorkerUpdated", "JobScheduled", "JobDispatched"]
    );
    assert_eq!(sim.job_state("j1"), JobState::Dispatched);
}

#[test]
fn the_queue_is_ordered_by_priority_then_age_then_job_id() {
    let mut sim = Sim::new();
    let submit = |sim: &mut Sim, id: &str, p: Priority| {
        let mut r = job(id);
        r.priority = p;
        sim.submit(r);
        sim.advance(10);
    };
    submit(&mut sim, "batch-old", Priority::Batch);
    submit(&mut sim, "inter", Priority::Interactive);
    submit(&mut sim, "crit-b", Priority::Critical);
    submit(&mut sim, "batch-new", Priority::Batch);
    sim.now -= 10;
    submit(&mut sim, "crit-a", Priority::Critical); // same time as batch-new, but critical
    let order: Vec<String> = sim
        .state
        .queue_order("default")
        .into_iter()
        .map(|k| k.job_id)
        .collect();
    assert_eq!(
        order,
        ["crit-b", "crit-a", "inter", "batch-old", "batch-new"]
    );

    // One slot at a time: the worker takes them in queue order.
    sim.heartbeat(Heartbeat {
        max_parallel_jobs: 1,
        ..hb("w1", "default")
    });
    let mut dispatched = vec![sim.dispatches()[0].job.job_id.clone()];
    for _ in 0..4 {
        let (id, attempt) = {
            let d = sim.dispatches();
            let last = d.last().unwrap();
            (last.job.job_id.clone(), last.attempt)
        };
        sim.result(&id, attempt, "w1", ResultStatus::Succeeded);
        sim.heartbeat(Heartbeat {
            max_parallel_jobs: 1,
            ..hb("w1", "default")
        });
        dispatched.push(sim.dispatches().last().unwrap().job.job_id.clone());
    }
    assert_eq!(
        dispatched,
        ["crit-b", "crit-a", "inter", "batch-old", "batch-new"]
    );
}

#[test]
fn a_tenant_at_its_limit_waits_and_resumes_when_a_job_ends() {
    let mut rules = rules();
    rules.tenants.insert(
        "acme".into(),
        TenantRules {
            max_concurrent_jobs: Some(1),
            ..Default::default()
        },
    );
    let mut sim = Sim::with_rules(rules);
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    let ev = sim.submit(job("j2"));
    let w = waiting(&ev);
    assert_eq!(w.reason_code, "tenant_limit");
    assert!(w.detail.contains("limit is 1"), "{}", w.detail);
    let mut other = job("k1");
    other.tenant_id = "globex".into();
    assert_eq!(
        scheduled(&sim.submit(other)).worker_id,
        "w1",
        "other tenants pass"
    );
    assert_eq!(sim.state.tenant_active_jobs("acme"), 1);

    let ev = sim.result("j1", 1, "w1", ResultStatus::Succeeded);
    assert!(names(&ev).contains(&"JobScheduled"), "{:?}", names(&ev));
    assert_eq!(sim.job_state("j2"), JobState::Dispatched);
}

#[test]
fn placement_timeout_dead_letters_with_the_reason_that_held_the_job() {
    // no_workers
    let mut sim = Sim::new();
    sim.submit(job("j1"));
    sim.tick_after(299_999);
    assert_eq!(sim.job_state("j1"), JobState::Pending);
    let ev = sim.tick_after(1);
    assert_eq!(names(&ev), ["JobFailed", "DeadLettered"]);
    let dl = dead_lettered(&ev);
    assert_eq!(dl.reason_code, "no_workers");
    assert_eq!(dl.last_state, "FAILED");
    assert_eq!(sim.job_state("j1"), JobState::Failed);
    assert!(sim.state.queued.is_empty(), "no longer queued");

    // pool_overloaded
    let mut sim = Sim::new();
    let keep_alive = |sim: &mut Sim| {
        sim.heartbeat(Heartbeat {
            cpu_load: 99.0,
            ..hb("hot", "default")
        })
    };
    keep_alive(&mut sim);
    sim.submit(job("j1"));
    for _ in 0..30 {
        sim.advance(10_000);
        keep_alive(&mut sim);
        sim.tick_after(0);
    }
    assert_eq!(sim.dead_letters()[0].reason_code, "pool_overloaded");

    // tenant_limit
    let mut rules = rules();
    rules.tenants.insert(
        "acme".into(),
        TenantRules {
            max_concurrent_jobs: Some(1),
            ..Default::default()
        },
    );
    let mut sim = Sim::with_rules(rules);
    sim.worker("w1", "default");
    sim.submit(job("j1"));
    sim.started("j1", 1, "w1");
    sim.submit(job("j2"));
    for _ in 0..30 {
        sim.advance(10_000);
        sim.worker("w1", "default");
        sim.input(
            "ksched.results",
            Input::Progress(ksched_core::records::JobProgress {
                job_id: "j1".into(),
                attempt: 1,
                worker_id: "w1".into(),
                progress: 0.5,
                message: None,
                sent_at: 0,
            }),
        );
        sim.tick_after(0);
    }
    let dl = sim.dead_letters();
    assert_eq!(dl.len(), 1, "{dl:?}");
    assert_eq!(dl[0].reason_code, "tenant_limit");
    assert_eq!(dl[0].job_id, "j2");
}

#[test]
fn an_overloaded_worker_is_used_once_its_heartbeat_says_it_cooled_down() {
    let mut sim = Sim::new();
    sim.heartbeat(Heartbeat {
        cpu_load: 99.0,
        ..hb("w1", "default")
    });
    let ev = sim.submit(job("j1"));
    assert_eq!(waiting(&ev).reason_code, "pool_overloaded");
    // Ticks retry placement, but nothing says the worker cooled down yet.
    let ev = sim.tick_after(500);
    assert!(!names(&ev).contains(&"JobDispatched"), "{:?}", names(&ev));
    // The worker cools down, and says so in its next heartbeat; the heartbeat places it.
    let ev = sim.heartbeat(hb("w1", "default"));
    assert!(names(&ev).contains(&"JobDispatched"), "{:?}", names(&ev));
}

#[test]
fn a_tick_retries_placement_when_only_time_has_changed() {
    // A pool's circuit is open, holding j1; nothing arrives but time. The Tick after the
    // cool-down half-opens the circuit and places j1 itself.
    let mut rules = rules();
    rules.retry.max_retries = 0;
    rules.breaker.consecutive_failures = 1;
    rules.breaker.cooldown_ms = 5_000;
    let mut sim = Sim::with_rules(rules);
    sim.worker("w1", "default");
    sim.submit(job("bad"));
    sim.result("bad", 1, "w1", ResultStatus::FailedFatal);
    let ev = sim.submit(job("j1"));
    assert_eq!(waiting(&ev).reason_code, "circuit_open");
    sim.now += 4_000;
    let ev = sim.tick_now();
    assert!(!names(&ev).contains(&"JobDispatched"), "cool-down not over");
    sim.now += 1_000;
    let ev = sim.tick_now();
    assert!(names(&ev).contains(&"JobDispatched"), "{:?}", names(&ev));
    assert_eq!(sim.job_state("j1"), JobState::Dispatched);
}

#[test]
fn a_full_pool_stops_the_pass_early() {
    let mut sim = Sim::new();
    for i in 0..50 {
        sim.submit(job(&format!("j{i:02}")));
    }
    // One slot: exactly one dispatch, and the remaining 49 stay queued in order.
    let ev = sim.heartbeat(Heartbeat {
        max_parallel_jobs: 1,
        ..hb("w1", "default")
    });
    assert_eq!(
        names(&ev),
        ["WorkerUpdated", "JobScheduled", "JobDispatched"]
    );
    assert_eq!(sim.state.queued["default"], 49);
}

#[test]
fn queued_jobs_are_counted_by_the_reason_they_wait() {
    let mut sim = Sim::new();
    let counts = |sim: &Sim| {
        (sim.state.waiting_by_reason.iter())
            .map(|(r, n)| ((*r).to_owned(), *n))
            .collect::<Vec<_>>()
    };
    sim.submit(job("j1"));
    sim.submit(job("j2"));
    assert_eq!(counts(&sim), [("no_workers".to_owned(), 2)]);
    // A worker of one slot takes j1; j2 waits on, counted under its last reason until its
    // next JobWaiting says another.
    sim.heartbeat(Heartbeat {
        max_parallel_jobs: 1,
        ..hb("w1", "default")
    });
    assert_eq!(counts(&sim), [("no_workers".to_owned(), 1)]);
    sim.submit(job("j3"));
    assert_eq!(
        counts(&sim),
        [
            ("no_workers".to_owned(), 1),
            ("pool_overloaded".to_owned(), 1)
        ]
    );
    sim.cancel("j2", None);
    sim.cancel("j3", None);
    assert!(counts(&sim).is_empty());
}
