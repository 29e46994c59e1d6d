//! Nothing an input says can make the scheduler do unbounded work in one journal entry, hold
//! unbounded state, or accept a record larger than the limits: work per entry is cut and
//! continued, candidates lists and histories are bounded, lost workers are forgotten, queues
//! admit up to a limit, oversized and nonsensical inputs are refused.

mod support;

use ksched_core::decide::MAX_CANDIDATES;
use ksched_core::events::*;
use ksched_core::records::{Heartbeat, JobStarted, ResultStatus};
use ksched_core::rules::Rules;
use ksched_core::state::HISTORY_MAX;
use support::*;

fn work_units(e: &JournalEntry) -> usize {
    e.events
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::JobScheduled(_)
                    | Event::JobTimedOut(_)
                    | Event::WorkerLost(_)
                    | Event::JobRetrying(_)
                    | Event::WorkerForgotten(_)
            )
        })
        .count()
}

fn small_budget() -> Rules {
    let mut r = rules();
    r.limits.max_work_per_entry = 10;
    r
}

#[test]
fn a_tick_that_times_out_many_jobs_continues_in_bounded_entries() {
    let mut sim = Sim::with_rules(small_budget());
    for i in 0..95 {
        let mut r = job(&format!("j{i:03}"));
        r.budget.deadline_ms = Some(1_000);
        sim.submit(r);
    }
    let before = sim.journal.len();
    sim.tick_after(1_000);
    for (i, e) in sim.journal[before..].iter().enumerate() {
        assert!(work_units(e) <= 10, "entry {i} did {} units", work_units(e));
    }
    assert!(
        sim.continuations >= 9,
        "{} continuations",
        sim.continuations
    );
    for i in 0..95 {
        assert_eq!(sim.job_state(&format!("j{i:03}")), JobState::Timeout);
    }
}

#[test]
fn a_heartbeat_that_can_place_many_queued_jobs_places_them_over_bounded_entries() {
    let mut sim = Sim::with_rules(small_budget());
    for i in 0..35 {
        sim.submit(job(&format!("q{i:02}")));
    }
    let before = sim.journal.len();
    sim.heartbeat(Heartbeat {
        max_parallel_jobs: 0,
        ..hb("big", "default")
    });
    let entries = &sim.journal[before..];
    assert!(entries.len() >= 4, "{} entries", entries.len());
    assert!(entries.iter().all(|e| work_units(e) <= 10));
    // Continuations are Ticks judged at the watermark already reached: they fire nothing new.
    assert!(entries[1..].iter().all(|e| matches!(
        &e.input,
        Input::Tick(t) if t.source == ksched_core::decide::CONTINUATION_SOURCE
    )));
    for i in 0..35 {
        assert_eq!(sim.job_state(&format!("q{i:02}")), JobState::Dispatched);
    }
}

#[test]
fn blocked_jobs_do_not_spend_the_budget_or_loop() {
    // A long queue of jobs whose tenant is at its limit: walking it produces no work, so no
    // continuation is asked for (a continuation that does nothing would repeat for ever).
    let mut r = small_budget();
    r.tenants.insert(
        "acme".into(),
        ksched_core::rules::TenantRules {
            max_concurrent_jobs: Some(1),
            ..Default::default()
        },
    );
    let mut sim = Sim::with_rules(r);
    for i in 0..30 {
        sim.submit(job(&format!("b{i:02}")));
    }
    let before = sim.continuations;
    sim.worker("w1", "default");
    sim.tick_after(1_000);
    assert_eq!(sim.continuations, before);
    assert_eq!(sim.state.tenant_active_jobs("acme"), 1);
}

#[test]
fn placement_events_list_a_bounded_number_of_candidates() {
    let mut sim = Sim::new();
    for i in 0..40 {
        sim.heartbeat(Heartbeat {
            cpu_load: f64::from(i),
            ..hb(&format!("w{i:02}"), "default")
        });
    }
    let ev = sim.submit(job("j"));
    let s = scheduled(&ev);
    assert_eq!(s.worker_id, "w00");
    assert_eq!(s.candidates.len(), MAX_CANDIDATES);
    assert_eq!(s.candidates_omitted, 40 - MAX_CANDIDATES as i32);
    assert!(s.candidates.iter().any(|c| c.worker_id == "w00"));
    // The best scores are the ones kept.
    assert!(
        s.candidates
            .iter()
            .all(|c| c.score.unwrap() < 16.0 / 100.0 + 1e-9)
    );
}

#[test]
fn a_job_history_is_bounded_but_keeps_its_start_and_end() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("j"));
    // A worker that keeps sending stale starts: every one is rejected and journaled.
    for _ in 0..HISTORY_MAX + 50 {
        sim.input(
            "ksched.results",
            Input::Started(JobStarted {
                job_id: "j".into(),
                attempt: 0,
                worker_id: "w1".into(),
                started_at: 0,
            }),
        );
    }
    sim.result("j", 1, "w1", ResultStatus::Succeeded);
    let h = sim.history("j");
    assert_eq!(h.len(), HISTORY_MAX as usize);
    assert_eq!(h[0].event, "JobAccepted");
    assert_eq!(
        h.last().unwrap().event,
        "JobSucceeded",
        "the last slot keeps the latest"
    );
    assert!(sim.job("j").history_omitted >= 50);
}

#[test]
fn lost_workers_are_forgotten_after_the_retention() {
    let mut r = rules();
    r.timing.worker_retention_ms = 60_000;
    let mut sim = Sim::with_rules(r);
    for i in 0..5 {
        sim.worker(&format!("gone-{i}"), "default");
    }
    sim.tick_after(16_000);
    assert!(sim.state.workers.values().all(|w| !w.alive));
    let ev = sim.tick_after(45_000);
    let forgotten = ev
        .iter()
        .filter(|e| matches!(e, Event::WorkerForgotten(_)))
        .count();
    assert_eq!(forgotten, 5, "{:?}", names(&ev));
    assert!(sim.state.workers.is_empty());
    // A forgotten worker that comes back is a new worker.
    let ev = sim.worker("gone-1", "default");
    let u = find(&ev, |e| match e {
        Event::WorkerUpdated(u) => Some(u),
        _ => None,
    });
    assert!(u.joined);
}

#[test]
fn a_heartbeat_does_not_rewrite_the_jobs_it_lists() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.submit(job("j"));
    sim.started("j", 1, "w1");
    let _ = sim.partial.take_dirty();
    sim.heartbeat(Heartbeat {
        active_job_ids: vec!["j".into()],
        ..hb("w1", "default")
    });
    let updated = sim
        .journal
        .last()
        .unwrap()
        .events
        .iter()
        .filter(|e| e.job_id() == Some("j"))
        .count();
    assert_eq!(updated, 0);
    // The running timeout still moves with the heartbeats (no job write needed).
    let mut r = rules();
    r.timing.running_timeout_ms = 10_000;
    let mut sim = Sim::with_rules(r);
    sim.worker("w1", "default");
    sim.submit(job("j"));
    sim.started("j", 1, "w1");
    for _ in 0..6 {
        sim.advance(3_000);
        sim.heartbeat(Heartbeat {
            active_job_ids: vec!["j".into()],
            ..hb("w1", "default")
        });
    }
    sim.tick_after(1_000);
    assert_eq!(sim.job_state("j"), JobState::Running, "kept alive");
    // Once w1 stops listing it, the last listing counts and the timeout follows.
    sim.keep_alive(&[("w1", "default")]);
    sim.tick_after(8_000);
    assert_eq!(sim.job_state("j"), JobState::Running);
    sim.tick_after(2_000);
    assert_eq!(sim.job_state("j"), JobState::Timeout);
}

#[test]
fn full_queues_refuse_new_jobs_with_queue_full() {
    let mut r = rules();
    r.limits.max_pending_per_pool = 3;
    r.tenants.insert(
        "small".into(),
        ksched_core::rules::TenantRules {
            max_pending_jobs: Some(1),
            ..Default::default()
        },
    );
    let mut sim = Sim::with_rules(r);
    for i in 0..3 {
        sim.submit(job(&format!("p{i}")));
    }
    let ev = sim.submit(job("p3"));
    let dl = dead_lettered(&ev);
    assert_eq!(dl.reason_code, "queue_full");
    assert!(
        dl.reason.contains("limits.max_pending_per_pool"),
        "{}",
        dl.reason
    );
    assert!(!sim.state.jobs.contains_key("p3"), "refused, not accepted");
    // The same job id may be submitted again once there is room.
    sim.worker("w1", "default");
    let ev = sim.submit(job("p3"));
    assert_eq!(names(&ev)[0], "JobAccepted");

    let mut t = job("s1");
    t.tenant_id = "small".into();
    t.topic = "job.multi".into();
    sim.submit(t.clone());
    t.job_id = "s2".into();
    let ev = sim.submit(t);
    assert_eq!(dead_lettered(&ev).reason_code, "queue_full");
}

#[test]
fn oversized_requests_are_dead_lettered_as_record_too_large() {
    let mut r = rules();
    r.limits.max_payload_bytes = 100;
    r.limits.max_labels = 2;
    r.limits.max_entry_bytes = 16;
    let mut sim = Sim::with_rules(r);
    let mut big = job("payload");
    big.payload = vec![0; 101];
    let mut labels = job("labels");
    for k in ["a", "b", "c"] {
        labels.labels.insert(k.into(), "v".into());
    }
    let mut entry = job("entry");
    entry.env.insert("K".into(), "x".repeat(17));
    for r in [big, labels, entry] {
        let id = r.job_id.clone();
        let ev = sim.submit(r);
        let dl = dead_lettered(&ev);
        assert_eq!(
            (dl.job_id.as_str(), dl.reason_code.as_str()),
            (id.as_str(), "record_too_large")
        );
        assert!(!sim.state.jobs.contains_key(&id));
    }
    // At the limits it is fine.
    let mut ok = job("ok");
    ok.payload = vec![0; 100];
    assert_eq!(names(&sim.submit(ok))[0], "JobAccepted");
}

#[test]
fn heartbeats_with_impossible_figures_are_refused() {
    let mut r = rules();
    r.dispatch_partitions.insert("default".into(), 4);
    let mut sim = Sim::with_rules(r);
    for bad in [
        Heartbeat {
            cpu_load: f64::NAN,
            ..hb("nan", "default")
        },
        Heartbeat {
            gpu_utilization: -5.0,
            ..hb("negative", "default")
        },
        Heartbeat {
            active_jobs: -1,
            ..hb("count", "default")
        },
        Heartbeat {
            owned_partitions: vec![0, 99],
            ..hb("partition", "default")
        },
    ] {
        let id = bad.worker_id.clone();
        let ev = sim.heartbeat(bad);
        assert_eq!(rejected(&ev).reason_code, "invalid_heartbeat", "{id}");
        assert!(!sim.state.workers.contains_key(&id), "{id}");
    }
    // A NaN load can no longer win a placement over an honest worker.
    sim.worker("honest", "default");
    let ev = sim.submit(job("j"));
    assert_eq!(scheduled(&ev).worker_id, "honest");
}

#[test]
fn a_job_whose_deadline_passed_while_queued_is_not_dispatched() {
    let mut sim = Sim::new();
    let mut r = job("j");
    r.budget.deadline_ms = Some(500);
    sim.submit(r);
    // A worker appears after the deadline, before a Tick noticed it.
    sim.gap(800);
    let ev = sim.worker("w1", "default");
    assert!(!names(&ev).contains(&"JobDispatched"), "{:?}", names(&ev));
    assert_eq!(sim.job_state("j"), JobState::Timeout);
    assert_eq!(dead_lettered(&ev).reason_code, "deadline_exceeded");
}

#[test]
fn a_submission_is_journaled_once() {
    let mut sim = Sim::new();
    let mut r = job("j");
    r.payload = vec![7; 1_000];
    sim.submit(r);
    let entry = &sim.journal[sim.last];
    let accepted = find(&entry.events, |e| match e {
        Event::JobAccepted(a) => Some(a),
        _ => None,
    });
    assert!(
        accepted.request.is_none(),
        "the request is the entry's input"
    );
    // A request whose topic the producer misstated is journaled as the scheduler took it.
    let mut lying = job("lying");
    lying.topic = "job.gpu".into();
    let ev = sim.input("job.default", Input::Submit(lying));
    let accepted = find(&ev, |e| match e {
        Event::JobAccepted(a) => Some(a),
        _ => None,
    });
    assert_eq!(
        accepted.request.as_ref().map(|r| r.topic.as_str()),
        Some("job.default")
    );
}

/// A heartbeat's record stays in memory while the worker is known: every part a producer
/// chooses is bounded, and a heartbeat past a bound is refused with the reason.
#[test]
fn heartbeats_larger_than_the_limits_are_refused() {
    let mut sim = Sim::new();
    let refused = |sim: &mut Sim, hb: Heartbeat, why: &str| {
        let ev = sim.heartbeat(hb);
        let r = rejected(&ev);
        assert_eq!(r.reason_code, "invalid_heartbeat");
        assert!(r.reason.contains(why), "{why}: {}", r.reason);
    };
    refused(
        &mut sim,
        hb(&"w".repeat(10_000), "default"),
        "worker_id must be at most",
    );
    refused(
        &mut sim,
        hb("w\u{7}1", "default"),
        "without control characters",
    );
    let mut many = hb("w1", "default");
    many.labels = (0..1_000).map(|i| (format!("k{i}"), "v".into())).collect();
    refused(&mut sim, many, "labels");
    let mut caps = hb("w1", "default");
    caps.capabilities = (0..1_000).map(|i| format!("c{i}")).collect();
    refused(&mut sim, caps, "capabilities");
    let mut long = hb("w1", "default");
    long.labels.insert("k".into(), "v".repeat(100_000));
    refused(&mut sim, long, "limits.max_entry_bytes");
    let mut jobs = hb("w1", "default");
    jobs.active_job_ids = (0..20_000).map(|i| format!("j{i}")).collect();
    refused(&mut sim, jobs, "limits.max_active_job_ids");
    let mut bulky = hb("w1", "default");
    bulky.labels = (0..60)
        .map(|i| (format!("k{i}"), "v".repeat(1_000)))
        .collect();
    refused(&mut sim, bulky, "limits.max_heartbeat_bytes");
    assert!(sim.state.workers.is_empty());
    // Within the limits it is taken.
    let ev = sim.worker("w1", "default");
    assert!(names(&ev).contains(&"WorkerUpdated"));
}

/// A producer of heartbeats cannot grow the worker records without end: past
/// `max_workers_per_pool` a new worker id is refused, known ones go on.
#[test]
fn a_pool_holds_at_most_max_workers_per_pool_worker_records() {
    let mut rules = rules();
    rules.limits.max_workers_per_pool = 3;
    let mut sim = Sim::with_rules(rules);
    for i in 0..3 {
        sim.worker(&format!("w{i}"), "default");
    }
    let ev = sim.worker("w3", "default");
    assert!(
        rejected(&ev).reason.contains("limits.max_workers_per_pool"),
        "{}",
        rejected(&ev).reason
    );
    assert!(!sim.state.workers.contains_key("w3"));
    let ev = sim.worker("w0", "default");
    assert!(
        names(&ev).contains(&"WorkerUpdated"),
        "a known worker goes on"
    );
    // Another pool has room of its own; a worker moving into the full pool is refused.
    sim.worker("a0", "a");
    let ev = sim.worker("a0", "default");
    assert_eq!(rejected(&ev).reason_code, "invalid_heartbeat");
    assert_eq!(sim.state.workers["a0"].heartbeat.pool, "a");
    assert_eq!(sim.state.workers_by_pool["default"], 3);
    assert_eq!(sim.state.workers_by_pool["a"], 1);
}

/// Workers name their own error codes; the counts of dead letters by reason keep at most
/// `MAX_COUNTED_REASONS` codes, the rest together, and an absurd code is not taken at all.
#[test]
fn worker_error_codes_cannot_grow_the_counts_without_end() {
    let mut rules = rules();
    rules.retry.max_retries = 0;
    // The failures must not open the circuit: every job is dispatched and fails.
    rules.breaker.consecutive_failures = 1_000_000;
    rules.breaker.window = 1_000_000;
    let mut sim = Sim::with_rules(rules);
    sim.heartbeat(Heartbeat {
        max_parallel_jobs: 1_000,
        ..hb("w1", "default")
    });
    let n = ksched_core::apply::MAX_COUNTED_REASONS + 10;
    for i in 0..n {
        let id = format!("j{i}");
        sim.submit(job(&id));
        sim.result_with(
            &id,
            1,
            "w1",
            ResultStatus::FailedFatal,
            Some(&format!("code-{i}")),
        );
    }
    assert_eq!(
        sim.state.dead_letters_by_reason.len(),
        ksched_core::apply::MAX_COUNTED_REASONS + 1
    );
    assert!(sim.state.dead_letters_by_reason[ksched_core::apply::OTHER_REASONS] >= 10);
    sim.submit(job("long"));
    let ev = sim.result_with(
        "long",
        1,
        "w1",
        ResultStatus::FailedFatal,
        Some(&"x".repeat(10_000)),
    );
    assert_eq!(dead_lettered(&ev).reason_code, "failed_fatal");
}

/// Jobs held by their tenant's limit fill the head of a queue: a pass looks at their lane
/// once and passes the rest over, so another tenant's job behind them is placed at once,
/// and when the tenant gets a slot its oldest job goes first.
#[test]
fn a_pass_looks_at_a_lane_of_held_jobs_once_and_keeps_queue_order() {
    let mut rules = rules();
    rules.tenants.insert(
        "acme".into(),
        ksched_core::rules::TenantRules {
            max_concurrent_jobs: Some(1),
            max_pending_jobs: None,
            weight: None,
        },
    );
    let mut sim = Sim::with_rules(rules);
    sim.heartbeat(Heartbeat {
        max_parallel_jobs: 100,
        ..hb("w1", "default")
    });
    sim.submit(job("acme-0"));
    for i in 1..=60 {
        sim.submit(job(&format!("acme-{i:02}")));
    }
    assert_eq!(
        sim.state.lane_heads["default"].len(),
        1,
        "sixty held jobs, one lane"
    );
    let mut other = job("globex-1");
    other.tenant_id = "globex".into();
    sim.submit(other);
    assert_eq!(sim.job_state("globex-1"), JobState::Dispatched);
    // acme's slot frees: its oldest waiting job is placed, not a later one.
    let ev = sim.result("acme-0", 1, "w1", ResultStatus::Succeeded);
    assert_eq!(scheduled(&ev).job_id, "acme-01");
    assert_eq!(sim.job_state("acme-02"), JobState::Pending);
}

/// Lanes held for labels no worker has are looked at one per lane, at most
/// `max_scan_per_entry` per pass; a placeable job behind more of them than that waits for
/// the held ones to leave (their placement timeout), never costs a pass more.
#[test]
fn a_pass_holds_at_most_max_scan_per_entry_lanes() {
    let mut three = rules();
    three.limits.max_scan_per_entry = 3;
    let mut sim = Sim::with_rules(three);
    sim.heartbeat(Heartbeat {
        max_parallel_jobs: 100,
        ..hb("w1", "default")
    });
    for i in 0..5 {
        let mut r = job(&format!("a-mars-{i}"));
        r.labels
            .insert("placement.zone".into(), format!("mars-{i}"));
        sim.submit(r);
    }
    assert_eq!(sim.state.lane_heads["default"].len(), 5, "one lane each");
    // Later in the queue (same time, a later id) than the held ones.
    let ev = sim.submit(job("z-earth"));
    assert!(
        !names(&ev).contains(&"JobScheduled"),
        "behind five held lanes, the pass stopped after three"
    );
    let mut bounded = rules();
    bounded.limits.max_scan_per_entry = 10;
    sim.reconfigure(&bounded, "snap-1");
    assert_eq!(sim.job_state("z-earth"), JobState::Dispatched);
}
