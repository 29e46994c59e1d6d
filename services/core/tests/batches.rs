//! Batches (SPEC §11): members submitted with one `batch_id` and its size, callbacks that
//! wait for every member to end and run with the counts, expiry, cancel, retention. Every
//! scenario also runs on partial states that evict and read back, and on a folded journal
//! (tests/support: `Sim`).

mod support;

use ksched_core::events::*;
use ksched_core::records::{BatchOutcome, JobRequest, ResultStatus};
use support::*;

fn member(id: &str, batch: &str, size: i32) -> JobRequest {
    JobRequest {
        batch_id: Some(batch.into()),
        batch_size: Some(size),
        ..job(id)
    }
}

fn callback(id: &str, batch: &str) -> JobRequest {
    JobRequest {
        after_batch: Some(batch.into()),
        ..job(id)
    }
}

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

fn dispatched_outcome(sim: &Sim, id: &str) -> Option<BatchOutcome> {
    (sim.dispatches().into_iter())
        .find(|d| d.job.job_id == id)
        .map(|d| {
            d.job
                .batch_outcome
                .clone()
                .expect("a callback's dispatch has its counts")
        })
}

fn refused(ev: &[Event]) -> Vec<String> {
    (ev.iter())
        .filter_map(|e| match e {
            Event::DeadLettered(d) => Some(d.dead_letter.reason_code.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_callback_runs_once_every_member_ended_with_the_counts_in_its_request() {
    let mut sim = Sim::new();
    big_worker(&mut sim, "w1");
    // The callback may come first: it waits for a batch not opened yet.
    sim.submit(callback("done", "b1"));
    assert_eq!(sim.job_state("done"), JobState::Blocked);
    let ev = sim.submit(member("m0", "b1", 4));
    assert!(names(&ev).contains(&"BatchOpened"), "{:?}", names(&ev));
    for i in 1..4 {
        sim.submit(member(&format!("m{i}"), "b1", 4));
    }
    let key = ("acme".to_owned(), "b1".to_owned());
    assert_eq!(sim.state.batches[&key].joined, 4);
    run(&mut sim, "m0", ResultStatus::Succeeded);
    run(&mut sim, "m1", ResultStatus::FailedFatal);
    run(&mut sim, "m2", ResultStatus::Succeeded);
    assert_eq!(sim.job_state("done"), JobState::Blocked, "m3 runs still");
    assert_eq!(sim.state.batches[&key].state, BatchState::Open);
    let ev = run(&mut sim, "m3", ResultStatus::Succeeded);
    assert!(names(&ev).contains(&"JobUnblocked"), "{:?}", names(&ev));
    assert_eq!(sim.state.batches[&key].state, BatchState::Complete);
    assert_eq!(sim.job_state("done"), JobState::Dispatched);
    let counts = BatchOutcome {
        batch_id: "b1".into(),
        succeeded: 3,
        failed: 1,
    };
    assert_eq!(dispatched_outcome(&sim, "done"), Some(counts.clone()));
    // The producer sending the released callback again is a duplicate, not a conflict.
    let ev = sim.submit(callback("done", "b1"));
    assert!(refused(&ev).is_empty(), "{:?}", names(&ev));
    // A callback submitted after the batch completed runs at once, with the same counts.
    sim.submit(callback("late", "b1"));
    assert_eq!(dispatched_outcome(&sim, "late"), Some(counts));
    assert!(sim.state.settling.is_empty());
}

#[test]
fn bad_batch_fields_are_refused_before_the_job_is_accepted() {
    let mut sim = Sim::new();
    let no_size = JobRequest {
        batch_id: Some("b".into()),
        ..job("j1")
    };
    let set_outcome = JobRequest {
        batch_outcome: Some(BatchOutcome::default()),
        ..job("j2")
    };
    let own = JobRequest {
        after_batch: Some("b".into()),
        ..member("j3", "b", 2)
    };
    let with_deps = JobRequest {
        depends_on: vec!["x".into()],
        ..callback("j4", "b")
    };
    let too_big = member("j5", "b", 2_000_000);
    // An id holding a control character could name the scheduler's internal entries.
    let control = member("j6", "\u{1}members\u{1}acme\u{1}b", 2);
    let blank = member("j7", "  ", 2);
    let huge = member("j8", &"b".repeat(10_000), 2);
    let bad_callback = callback("j9", "\u{1}batch\u{1}acme\u{1}b");
    let zero = member("j10", "b", 0);
    for r in [
        no_size,
        set_outcome,
        own,
        with_deps,
        too_big,
        control,
        blank,
        huge,
        bad_callback,
        zero,
    ] {
        let id = r.job_id.clone();
        let ev = sim.submit(r);
        assert_eq!(refused(&ev), ["invalid_batch"], "{id}");
        assert!(!sim.state.jobs.contains_key(&id), "{id}");
    }
    assert!(sim.state.batches.is_empty());
}

#[test]
fn a_batch_takes_its_size_of_members_and_no_late_or_different_one() {
    let mut sim = Sim::new();
    big_worker(&mut sim, "w1");
    sim.submit(member("m0", "b", 2));
    let ev = sim.submit(member("other-size", "b", 3));
    assert_eq!(refused(&ev), ["invalid_batch"]);
    sim.submit(member("m1", "b", 2));
    let ev = sim.submit(member("third", "b", 2));
    assert_eq!(refused(&ev), ["invalid_batch"], "full");
    run(&mut sim, "m0", ResultStatus::Succeeded);
    run(&mut sim, "m1", ResultStatus::Succeeded);
    let ev = sim.submit(member("after-end", "b", 2));
    assert_eq!(refused(&ev), ["invalid_batch"], "complete");
    // Another tenant's batch of the same id is its own.
    let theirs = JobRequest {
        tenant_id: "globex".into(),
        ..member("g0", "b", 1)
    };
    sim.submit(theirs);
    let g = ("globex".to_owned(), "b".to_owned());
    assert_eq!(sim.state.batches[&g].joined, 1);
}

#[test]
fn a_batch_with_members_missing_expires_and_its_callbacks_fail() {
    let mut rules = rules();
    rules.limits.max_dependency_wait_ms = 60_000;
    let mut sim = Sim::with_rules(rules);
    big_worker(&mut sim, "w1");
    sim.submit(member("m0", "b", 3));
    sim.tick_after(1_000);
    sim.submit(callback("done", "b"));
    run(&mut sim, "m0", ResultStatus::Succeeded);
    sim.keep_alive(&[("w1", "default")]);
    sim.tick_after(60_000);
    let key = ("acme".to_owned(), "b".to_owned());
    assert_eq!(sim.state.batches[&key].state, BatchState::Expired);
    assert_eq!(sim.job_state("done"), JobState::Failed);
    let dl = sim.dead_letters();
    let d = dl.iter().find(|d| d.job_id == "done").unwrap();
    assert_eq!(d.reason_code, "dependency_failed");
    assert!(d.reason.contains("batch b ended EXPIRED"), "{}", d.reason);
    assert_eq!(d.related_job_id, None);
    // A member coming after is refused.
    let ev = sim.submit(member("m1", "b", 3));
    assert_eq!(refused(&ev), ["invalid_batch"]);
}

#[test]
fn cancelling_a_batch_cancels_its_members_not_started_over_continuations() {
    let mut rules = rules();
    rules.limits.max_work_per_entry = 4;
    let mut sim = Sim::with_rules(rules);
    // Two members start on this worker; the rest wait in the queue.
    let mut h = hb("w1", "default");
    h.max_parallel_jobs = 2;
    sim.heartbeat(h);
    sim.keep_alive(&[("w1", "default")]);
    sim.submit(callback("done", "b"));
    for i in 0..20 {
        sim.submit(member(&format!("m{i:02}"), "b", 21));
    }
    sim.tick_after(1_000);
    let placed: Vec<String> = (0..20)
        .map(|i| format!("m{i:02}"))
        .filter(|id| sim.job_state(id) == JobState::Dispatched)
        .collect();
    assert_eq!(placed.len(), 2);
    // One of them started on its worker; the other was sent but has not started.
    let attempt = sim.job(&placed[0]).attempt;
    sim.started(&placed[0], attempt, "w1");
    let running = [placed[0].clone()];
    let before = sim.continuations;
    let ev = sim.cancel_batch("acme", "b");
    assert!(names(&ev).contains(&"BatchClosed"), "{:?}", names(&ev));
    assert!(
        sim.continuations - before >= 19 / 4,
        "bounded work per entry"
    );
    for i in 0..20 {
        let id = format!("m{i:02}");
        let want = if running.contains(&id) {
            JobState::Running
        } else {
            JobState::Cancelled
        };
        assert_eq!(sim.job_state(&id), want, "{id}");
    }
    assert_eq!(sim.job_state("done"), JobState::Failed);
    assert!(sim.state.settling.is_empty(), "{:?}", sim.state.settling);
    // The member sent to the worker is told to stop there.
    assert!(
        sim.cancel_dispatches()
            .iter()
            .any(|c| c.job_id == placed[1])
    );
    // The member that runs goes on, and counts.
    run(&mut sim, &running[0], ResultStatus::Succeeded);
    let key = ("acme".to_owned(), "b".to_owned());
    let b = &sim.state.batches[&key];
    assert_eq!(
        (b.state, b.succeeded, b.failed),
        (BatchState::Cancelled, 1, 19)
    );
    // Cancelled once only; another tenant may not name it.
    let ev = sim.cancel_batch("acme", "b");
    assert!(names(&ev).contains(&"CommandRejected"));
    let ev = sim.cancel_batch("globex", "b");
    assert!(names(&ev).contains(&"CommandRejected"));
}

#[test]
fn a_cancel_goes_on_after_a_restart() {
    let mut rules = rules();
    rules.limits.max_work_per_entry = 3;
    let mut sim = Sim::with_rules(rules);
    for i in 0..12 {
        sim.submit(member(&format!("m{i:02}"), "b", 12));
    }
    sim.submit(callback("done", "b"));
    sim.tick_after(1_000);
    // The processor stops right after the cancel's entry and the first continuation.
    sim.halt_continuations = true;
    sim.cancel_batch("acme", "b");
    sim.input(
        "ksched.control",
        ksched_core::decide::continuation(&sim.state),
    );
    sim.input(
        "ksched.control",
        ksched_core::decide::continuation(&sim.state),
    );
    let members = ksched_core::state::batch_members("acme", "b");
    let cut = sim.state.settling[&members].told_through.clone();
    assert!(cut.is_some(), "some members were reached before the stop");
    let cancelled = (0..12)
        .filter(|i| sim.job_state(&format!("m{i:02}")) == JobState::Cancelled)
        .count();
    assert!(
        cancelled > 0 && cancelled < 12,
        "{cancelled} cancelled before the stop"
    );
    sim.restart();
    sim.halt_continuations = false;
    sim.tick_after(1_000);
    for i in 0..12 {
        assert_eq!(sim.job_state(&format!("m{i:02}")), JobState::Cancelled);
    }
    assert_eq!(sim.job_state("done"), JobState::Failed);
    assert!(sim.state.settling.is_empty());
}

#[test]
fn an_ended_batch_is_forgotten_after_its_retention_and_the_shard_holds_at_most_max_batches() {
    let mut rules = rules();
    rules.limits.batch_retention_ms = 10_000;
    rules.limits.max_batches = 2;
    let mut sim = Sim::with_rules(rules);
    big_worker(&mut sim, "w1");
    sim.keep_alive(&[("w1", "default")]);
    sim.submit(member("a0", "a", 1));
    sim.submit(member("b0", "b", 1));
    let ev = sim.submit(member("c0", "c", 1));
    assert_eq!(refused(&ev), ["queue_full"]);
    run(&mut sim, "a0", ResultStatus::Succeeded);
    sim.tick_after(5_000);
    assert_eq!(sim.state.batches.len(), 2, "kept within its retention");
    let ev = sim.tick_after(6_000);
    assert!(names(&ev).contains(&"BatchForgotten"), "{:?}", names(&ev));
    assert_eq!(sim.state.batches.len(), 1);
    sim.submit(member("c0", "c", 1));
    assert_eq!(sim.job_state("c0"), JobState::Dispatched);
}

#[test]
fn a_quarantined_member_counts_as_failed() {
    let mut sim = Sim::with_policy(rules(), pii_quarantine());
    big_worker(&mut sim, "w1");
    sim.submit(member("m0", "b", 2));
    sim.submit(member("m1", "b", 2));
    sim.submit(callback("done", "b"));
    // The last member to end is the quarantined one: the batch completes in its entry.
    run(&mut sim, "m1", ResultStatus::Succeeded);
    let attempt = sim.job("m0").attempt;
    sim.succeed_with_pii("m0", attempt, "w1");
    assert_eq!(sim.job_state("m0"), JobState::OutputQuarantined);
    let outcome = dispatched_outcome(&sim, "done").expect("ran");
    assert_eq!((outcome.succeeded, outcome.failed), (1, 1));
}

#[test]
fn a_batch_id_used_again_after_its_retention_is_a_new_batch_its_old_members_stay_out_of() {
    let mut rules = rules();
    rules.limits.batch_retention_ms = 1_000;
    rules.limits.max_dependency_wait_ms = 5_000;
    let mut sim = Sim::with_rules(rules);
    let mut h = hb("w1", "default");
    h.max_parallel_jobs = 1;
    sim.heartbeat(h);
    sim.keep_alive(&[("w1", "default")]);
    // old-0 runs and old-1 waits behind it; the batch expires (a member missing), and is
    // forgotten.
    sim.submit(member("old-0", "b", 3));
    sim.submit(member("old-1", "b", 3));
    sim.tick_after(5_000);
    sim.tick_after(2_000);
    let key = ("acme".to_owned(), "b".to_owned());
    assert!(!sim.state.batches.contains_key(&key), "forgotten");
    // A new batch of the same id: the old members neither count nor are cancelled with it.
    sim.submit(callback("done", "b"));
    sim.submit(member("new-0", "b", 1));
    run(&mut sim, "old-0", ResultStatus::Succeeded);
    assert_eq!(sim.state.batches[&key].joined, 1);
    assert_eq!(
        sim.job_state("done"),
        JobState::Blocked,
        "new-0 has not ended"
    );
    sim.cancel_batch("acme", "b");
    assert_eq!(sim.job_state("new-0"), JobState::Cancelled);
    assert_ne!(sim.job_state("old-1"), JobState::Cancelled);
}

#[test]
fn at_the_cap_an_ended_batch_makes_room_before_its_time() {
    let mut rules = rules();
    rules.limits.max_batches = 2;
    let mut sim = Sim::with_rules(rules);
    big_worker(&mut sim, "w1");
    sim.submit(member("a0", "a", 1));
    sim.submit(member("b0", "b", 2));
    run(&mut sim, "a0", ResultStatus::Succeeded);
    // a ended: it is forgotten early for c; b is open, and holds its place.
    let ev = sim.submit(member("c0", "c", 1));
    assert!(names(&ev).contains(&"BatchForgotten"), "{:?}", names(&ev));
    assert_eq!(sim.state.batches.len(), 2);
    let ev = sim.submit(member("d0", "d", 1));
    assert_eq!(refused(&ev), ["queue_full"], "b open, c being told or open");
}

#[test]
fn a_callback_naming_another_tenants_batch_waits_for_its_own_tenants_and_learns_nothing() {
    let mut rules = rules();
    rules.limits.max_dependency_wait_ms = 10_000;
    let mut sim = Sim::with_rules(rules);
    big_worker(&mut sim, "w1");
    sim.keep_alive(&[("w1", "default")]);
    let theirs = JobRequest {
        tenant_id: "globex".into(),
        ..member("g0", "shared", 1)
    };
    sim.submit(theirs);
    sim.submit(callback("mine", "shared"));
    run(&mut sim, "g0", ResultStatus::Succeeded);
    let g = ("globex".to_owned(), "shared".to_owned());
    assert_eq!(sim.state.batches[&g].state, BatchState::Complete);
    assert_eq!(
        sim.job_state("mine"),
        JobState::Blocked,
        "acme has no batch shared"
    );
    // Its own tenant's batch of that id is the one it waits for; here none comes.
    sim.tick_after(11_000);
    assert_eq!(sim.job_state("mine"), JobState::Failed);
    let dl = sim.dead_letters();
    let d = dl.iter().find(|d| d.job_id == "mine").unwrap();
    assert!(d.reason.contains("batch shared"), "{}", d.reason);
    assert!(!d.reason.contains("globex"), "{}", d.reason);
}
