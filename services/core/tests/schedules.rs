//! Schedules (SPEC §9): commands, firings by scheduler time, overlap and catch-up policies,
//! jitter, start and end, pause, resume, trigger and delete. Every scenario also runs on the
//! partial states of tests/support (`Sim`), whose decisions must be the same.

mod support;

use ksched_core::events::*;
use ksched_core::records::{
    JobTemplate, ResultStatus, ScheduleAction, ScheduleCatchUp, ScheduleCommand, ScheduleOverlap,
    ScheduleSpec,
};
use ksched_core::schedule::{firing_job_id, schedule_key};
use support::*;

const MINUTE: i64 = 60_000;

fn every(ms: i64) -> ScheduleSpec {
    ScheduleSpec {
        interval_ms: Some(ms),
        template: JobTemplate {
            topic: "job.default".into(),
            payload: b"report".to_vec(),
            ..Default::default()
        },
        catch_up_window_ms: 86_400_000,
        ..Default::default()
    }
}

fn command(
    sim: &mut Sim,
    id: &str,
    action: ScheduleAction,
    spec: Option<ScheduleSpec>,
) -> Vec<Event> {
    let now = sim.now;
    sim.input(
        "ksched.control",
        Input::Schedule(ScheduleCommand {
            schedule_id: id.into(),
            tenant_id: "acme".into(),
            action,
            spec,
            principal_id: "alice".into(),
            reason: None,
            requested_at: now,
        }),
    )
}

fn create(sim: &mut Sim, id: &str, spec: ScheduleSpec) -> Vec<Event> {
    command(sim, id, ScheduleAction::Create, Some(spec))
}

fn fired(events: &[Event]) -> Vec<(i64, ScheduleOutcome, Option<String>)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ScheduleFired(f) => Some((f.slot, f.outcome, f.job_id.clone())),
            _ => None,
        })
        .collect()
}

fn outcomes(events: &[Event]) -> Vec<ScheduleOutcome> {
    fired(events).into_iter().map(|(_, o, _)| o).collect()
}

fn schedule<'s>(sim: &'s Sim, id: &str) -> &'s ksched_core::state::Schedule {
    &sim.state.schedules[&schedule_key("acme", id)]
}

fn id_at(slot: i64) -> String {
    firing_job_id("acme", "s", slot, false)
}

/// The job's worker starts it (so it runs until told otherwise).
fn start(sim: &mut Sim, job: &str) {
    let worker = sim.job(job).worker_id.clone().expect("placed");
    sim.started(job, 1, &worker);
}

fn succeed(sim: &mut Sim, job: &str) {
    let worker = sim.job(job).worker_id.clone().expect("placed");
    sim.started(job, 1, &worker);
    sim.result(job, 1, &worker, ResultStatus::Succeeded);
}

#[test]
fn an_interval_schedule_fires_each_time_once_with_its_template() {
    let mut sim = Sim::new();
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    let ev = create(&mut sim, "s", every(MINUTE));
    assert_eq!(names(&ev), ["ScheduleChanged"]);
    assert_eq!(
        schedule(&sim, "s").next_slot,
        Some(T0),
        "an interval starts at once"
    );
    let ev = sim.tick_now();
    assert_eq!(
        fired(&ev),
        [(T0, ScheduleOutcome::Submitted, Some(id_at(T0)))]
    );
    let job = sim.job(&id_at(T0));
    assert_eq!(job.request.tenant_id, "acme");
    assert_eq!(job.request.principal_id.as_deref(), Some("alice"));
    assert_eq!(job.request.labels["ksched.schedule"], "s");
    assert_eq!(job.request.labels["ksched.slot"], "2023-11-14T22:13:20Z");
    assert_eq!(sim.payload(&id_at(T0)), b"report");
    // Its history names the schedule and the firing.
    let accepted = &sim.history(&id_at(T0))[0];
    assert!(
        accepted
            .detail
            .ends_with("fired by schedule s for 2023-11-14T22:13:20Z"),
        "{accepted:?}"
    );
    assert_eq!(sim.job_state(&id_at(T0)), JobState::Dispatched);
    succeed(&mut sim, &id_at(T0));
    // Many Ticks within the minute fire nothing more.
    let ev = sim.tick_after(MINUTE - 1_000);
    assert!(fired(&ev).is_empty(), "{:?}", fired(&ev));
    let ev = sim.tick_after(1_000);
    assert_eq!(
        fired(&ev),
        [(
            T0 + MINUTE,
            ScheduleOutcome::Submitted,
            Some(id_at(T0 + MINUTE))
        )]
    );
    assert_eq!(schedule(&sim, "s").next_slot, Some(T0 + 2 * MINUTE));
    assert_eq!(schedule(&sim, "s").submitted, 2);
}

#[test]
fn a_producer_may_not_take_a_firings_job_id() {
    let mut sim = Sim::new();
    let ev = sim.submit(job("acme:s@2030-01-01T00:00:00Z"));
    assert_eq!(dead_lettered(&ev).reason_code, "malformed_record");
    let ev = sim.submit(job("acme:s@2030-01-01T00:00:00Z/trigger"));
    assert_eq!(dead_lettered(&ev).reason_code, "malformed_record");
    // An @ alone is no firing's.
    sim.submit(job("mail-to:user@example.com"));
    assert!(sim.state.jobs.contains_key("mail-to:user@example.com"));
}

#[test]
fn overlap_skip_and_buffer_one_wait_for_the_previous_run() {
    for (overlap, expect) in [
        (
            ScheduleOverlap::Skip,
            vec![ScheduleOutcome::Skipped, ScheduleOutcome::Skipped],
        ),
        (
            ScheduleOverlap::BufferOne,
            vec![ScheduleOutcome::Buffered, ScheduleOutcome::Skipped],
        ),
    ] {
        let mut sim = Sim::new();
        sim.keep_alive(&[("w1", "default")]);
        sim.worker("w1", "default");
        create(
            &mut sim,
            "s",
            ScheduleSpec {
                overlap,
                ..every(MINUTE)
            },
        );
        sim.tick_now();
        let first = id_at(T0);
        start(&mut sim, &first);
        // Still running at the next two firings.
        let ev = sim.tick_after(2 * MINUTE);
        assert_eq!(outcomes(&ev), expect, "{overlap:?}");
        succeed(&mut sim, &first);
        let ev = sim.tick_now();
        match overlap {
            // The buffered firing runs once the previous run has ended.
            ScheduleOverlap::BufferOne => {
                assert_eq!(
                    fired(&ev),
                    [(
                        T0 + MINUTE,
                        ScheduleOutcome::Submitted,
                        Some(id_at(T0 + MINUTE))
                    )]
                );
                assert_eq!(schedule(&sim, "s").buffered, None);
            }
            _ => assert!(fired(&ev).is_empty()),
        }
        assert_eq!(schedule(&sim, "s").next_slot, Some(T0 + 3 * MINUTE));
    }
}

#[test]
fn overlap_allow_all_runs_both_and_cancel_previous_cancels_the_older_run() {
    let mut sim = Sim::new();
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    create(
        &mut sim,
        "s",
        ScheduleSpec {
            overlap: ScheduleOverlap::AllowAll,
            ..every(MINUTE)
        },
    );
    sim.tick_now();
    start(&mut sim, &id_at(T0));
    sim.tick_after(MINUTE);
    assert_eq!(sim.job_state(&id_at(T0)), JobState::Running);
    assert_eq!(sim.job_state(&id_at(T0 + MINUTE)), JobState::Dispatched);

    let mut sim = Sim::new();
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    create(
        &mut sim,
        "s",
        ScheduleSpec {
            overlap: ScheduleOverlap::CancelPrevious,
            ..every(MINUTE)
        },
    );
    sim.tick_now();
    start(&mut sim, &id_at(T0));
    let ev = sim.tick_after(MINUTE);
    let order = names(&ev);
    let cancelled = order
        .iter()
        .position(|n| *n == "JobCancelled")
        .expect("cancelled");
    let accepted = order
        .iter()
        .position(|n| *n == "JobAccepted")
        .expect("submitted");
    assert!(cancelled < accepted, "{order:?}");
    assert_eq!(sim.job_state(&id_at(T0)), JobState::Cancelled);
    assert_eq!(sim.cancel_dispatches().len(), 1, "the worker is told");
    assert_eq!(sim.job_state(&id_at(T0 + MINUTE)), JobState::Dispatched);
}

#[test]
fn firings_missed_while_down_follow_the_catch_up_policy() {
    let cases = [
        // None: the missed ones are skipped; the next on time runs.
        (ScheduleCatchUp::None, 86_400_000, 0),
        // Last: the latest missed one runs, late.
        (ScheduleCatchUp::Last, 86_400_000, 1),
        // All: every one within the window, in order (here all eleven).
        (ScheduleCatchUp::All, 86_400_000, 11),
        // All within a window of 3.5 minutes: three.
        (ScheduleCatchUp::All, 3 * MINUTE + 30_000, 3),
    ];
    for (catch_up, window, runs) in cases {
        let mut sim = Sim::new();
        sim.worker("w1", "default");
        create(
            &mut sim,
            "s",
            ScheduleSpec {
                catch_up,
                catch_up_window_ms: window,
                overlap: ScheduleOverlap::AllowAll,
                ..every(MINUTE)
            },
        );
        // Down from before the first firing for ten minutes and 40 s (the grace is 30 s).
        sim.gap(10 * MINUTE + 40_000);
        let ev = sim.tick_now();
        let submitted: Vec<i64> = fired(&ev)
            .into_iter()
            .filter(|(_, o, _)| *o == ScheduleOutcome::Submitted)
            .map(|(slot, _, _)| slot)
            .collect();
        assert_eq!(
            submitted.len(),
            runs,
            "{catch_up:?} {window}: {:?}",
            fired(&ev)
        );
        if runs > 0 {
            assert_eq!(*submitted.last().unwrap(), T0 + 10 * MINUTE, "{catch_up:?}");
            assert!(submitted.windows(2).all(|w| w[0] < w[1]), "in order");
        }
        assert!(
            outcomes(&ev).contains(&ScheduleOutcome::Missed) || runs == 11,
            "{catch_up:?}: the misses are journaled"
        );
        assert_eq!(schedule(&sim, "s").next_slot, Some(T0 + 11 * MINUTE));
        // The next firing is on time again.
        let ev = sim.tick_after(MINUTE);
        assert_eq!(outcomes(&ev), [ScheduleOutcome::Submitted], "{catch_up:?}");
    }
}

#[test]
fn a_late_firing_within_the_grace_runs_and_a_later_one_with_catch_up_none_does_not() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    create(
        &mut sim,
        "s",
        ScheduleSpec {
            catch_up: ScheduleCatchUp::None,
            start_at: Some(T0 + MINUTE),
            ..every(10 * MINUTE)
        },
    );
    assert_eq!(
        schedule(&sim, "s").next_slot,
        Some(T0 + MINUTE),
        "from its start"
    );
    sim.gap(MINUTE + 20_000);
    let ev = sim.tick_now();
    assert_eq!(
        outcomes(&ev),
        [ScheduleOutcome::Submitted],
        "20 s late: on time"
    );
    sim.gap(10 * MINUTE + 20_000);
    let ev = sim.tick_now();
    assert_eq!(
        outcomes(&ev),
        [ScheduleOutcome::Missed],
        "40 s late: missed"
    );
}

#[test]
fn pause_stops_the_firings_and_resume_catches_up_the_last() {
    let mut sim = Sim::new();
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    create(&mut sim, "s", every(MINUTE));
    sim.tick_now();
    succeed(&mut sim, &id_at(T0));
    let ev = command(&mut sim, "s", ScheduleAction::Pause, None);
    assert_eq!(names(&ev), ["ScheduleChanged"]);
    let ev = command(&mut sim, "s", ScheduleAction::Pause, None);
    assert_eq!(rejected(&ev).reason_code, "invalid_transition");
    let ev = sim.tick_after(5 * MINUTE);
    assert!(fired(&ev).is_empty(), "paused: {:?}", fired(&ev));
    command(&mut sim, "s", ScheduleAction::Resume, None);
    let ev = sim.tick_now();
    // Catch-up LAST (the default): the firings missed are journaled, the latest runs.
    assert_eq!(
        outcomes(&ev),
        [ScheduleOutcome::Missed, ScheduleOutcome::Submitted]
    );
    assert_eq!(fired(&ev)[1].0, T0 + 5 * MINUTE);
}

#[test]
fn trigger_fires_now_even_when_paused_and_leaves_the_times_alone() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    create(
        &mut sim,
        "s",
        ScheduleSpec {
            paused: true,
            ..every(MINUTE)
        },
    );
    sim.advance(5_000);
    let ev = command(&mut sim, "s", ScheduleAction::Trigger, None);
    let trigger = firing_job_id("acme", "s", T0 + 5_000, true);
    assert_eq!(
        fired(&ev),
        [(
            T0 + 5_000,
            ScheduleOutcome::Submitted,
            Some(trigger.clone())
        )]
    );
    assert!(trigger.ends_with("/trigger"));
    assert_eq!(sim.job_state(&trigger), JobState::Dispatched);
    assert_eq!(schedule(&sim, "s").next_slot, Some(T0));
    assert!(schedule(&sim, "s").paused);
    // Again: its run has not ended (overlap SKIP).
    let ev = command(&mut sim, "s", ScheduleAction::Trigger, None);
    assert_eq!(outcomes(&ev), [ScheduleOutcome::Skipped]);
}

#[test]
fn a_firing_whose_job_exists_is_refused_never_run_twice() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    create(&mut sim, "s", every(MINUTE));
    sim.tick_now();
    command(&mut sim, "s", ScheduleAction::Delete, None);
    // Made again at the same time: its first firing has the old one's id.
    create(&mut sim, "s", every(MINUTE));
    let ev = sim.tick_now();
    assert_eq!(outcomes(&ev), [ScheduleOutcome::Refused]);
    assert!(!names(&ev).contains(&"JobAccepted"));
    let refused = find(&ev, |e| match e {
        Event::ScheduleFired(f) => Some(f),
        _ => None,
    });
    assert!(
        refused.detail.starts_with("duplicate_job_id"),
        "{}",
        refused.detail
    );
    assert_eq!(schedule(&sim, "s").refused, 1);
    assert_eq!(
        schedule(&sim, "s").next_slot,
        Some(T0 + MINUTE),
        "it goes on"
    );
}

#[test]
fn delete_ends_the_firings_and_leaves_the_running_job_alone() {
    let mut sim = Sim::new();
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    create(&mut sim, "s", every(MINUTE));
    sim.tick_now();
    start(&mut sim, &id_at(T0));
    command(&mut sim, "s", ScheduleAction::Delete, None);
    assert!(sim.state.schedules.is_empty());
    let ev = sim.tick_after(3 * MINUTE);
    assert!(fired(&ev).is_empty());
    assert_eq!(sim.job_state(&id_at(T0)), JobState::Running);
    let ev = command(&mut sim, "s", ScheduleAction::Pause, None);
    assert_eq!(rejected(&ev).reason_code, "unknown_schedule");
    // Created again, it starts afresh.
    create(&mut sim, "s", every(MINUTE));
    let s = schedule(&sim, "s");
    assert_eq!(s.next_slot, Some(sim.now));
}

#[test]
fn bad_commands_are_refused_with_a_reason() {
    let mut rules = rules();
    rules.limits.max_schedules = 2;
    rules
        .topic_tenants
        .insert("job.gpu".into(), vec!["globex".into()]);
    let mut sim = Sim::with_rules(rules);
    let code = |ev: Vec<Event>| rejected(&ev).reason_code.clone();
    assert_eq!(
        code(create(&mut sim, "a:b", every(MINUTE))),
        "invalid_schedule"
    );
    let mut bad = every(MINUTE);
    bad.interval_ms = Some(10);
    assert_eq!(code(create(&mut sim, "s", bad)), "invalid_schedule");
    let mut cron = every(MINUTE);
    cron.interval_ms = None;
    cron.cron = Some("0 9 * * *".into());
    cron.time_zone = "Nowhere/Atlantis".into();
    assert_eq!(code(create(&mut sim, "s", cron)), "invalid_schedule");
    let mut unmapped = every(MINUTE);
    unmapped.template.topic = "job.none".into();
    assert_eq!(code(create(&mut sim, "s", unmapped)), "invalid_schedule");
    // Another tenant's topic.
    let mut theirs = every(MINUTE);
    theirs.template.topic = "job.gpu".into();
    assert_eq!(code(create(&mut sim, "s", theirs)), "tenant_mismatch");
    assert_eq!(
        code(command(&mut sim, "s", ScheduleAction::Create, None)),
        "invalid_schedule"
    );
    assert_eq!(
        code(command(&mut sim, "nope", ScheduleAction::Trigger, None)),
        "unknown_schedule"
    );
    create(&mut sim, "s", every(MINUTE));
    assert_eq!(
        code(create(&mut sim, "s", every(MINUTE))),
        "schedule_exists"
    );
    let mut moved = every(MINUTE);
    moved.template.topic = "job.multi".into();
    assert_eq!(
        code(command(&mut sim, "s", ScheduleAction::Update, Some(moved))),
        "invalid_schedule"
    );
    create(&mut sim, "t", every(MINUTE));
    assert_eq!(
        code(create(&mut sim, "u", every(MINUTE))),
        "too_many_schedules"
    );
    assert_eq!(sim.state.schedules.len(), 2);
}

#[test]
fn an_update_changes_the_times_from_now_on() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    create(&mut sim, "s", every(MINUTE));
    sim.tick_now();
    sim.advance(10_000);
    let ev = command(
        &mut sim,
        "s",
        ScheduleAction::Update,
        Some(every(5 * MINUTE)),
    );
    assert_eq!(names(&ev), ["ScheduleChanged"]);
    // Counted from its creation: T0 + 5 min.
    assert_eq!(schedule(&sim, "s").next_slot, Some(T0 + 5 * MINUTE));
    assert_eq!(schedule(&sim, "s").submitted, 1, "its history stays");
}

#[test]
fn jitter_delays_each_firings_job_the_same_way_every_time() {
    let mut sim = Sim::new();
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    create(
        &mut sim,
        "s",
        ScheduleSpec {
            jitter_ms: 30_000,
            ..every(MINUTE)
        },
    );
    sim.tick_now();
    let id = id_at(T0);
    let jitter = ksched_core::schedule::jitter_of("acme", "s", T0, 30_000);
    assert!(jitter > 0, "this firing's jitter is {jitter}");
    assert_eq!(sim.job_state(&id), JobState::Delayed);
    assert_eq!(sim.job(&id).delayed_until, Some(T0 + jitter));
    sim.tick_after(30_000);
    assert_eq!(sim.job_state(&id), JobState::Dispatched);
}

#[test]
fn a_schedule_ends_at_its_end() {
    let mut sim = Sim::new();
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    create(
        &mut sim,
        "s",
        ScheduleSpec {
            end_at: Some(T0 + 2 * MINUTE),
            overlap: ScheduleOverlap::AllowAll,
            ..every(MINUTE)
        },
    );
    let mut all = sim.tick_now();
    all.extend(sim.tick_after(5 * MINUTE));
    assert_eq!(
        fired(&all).iter().map(|f| f.0).collect::<Vec<_>>(),
        [T0, T0 + MINUTE, T0 + 2 * MINUTE]
    );
    assert_eq!(schedule(&sim, "s").next_slot, None);
}

#[test]
fn many_schedules_due_at_once_fire_over_continuations_each_once() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    for i in 0..250 {
        create(&mut sim, &format!("s{i}"), every(MINUTE));
    }
    let before = sim.continuations;
    let ev = sim.tick_now();
    let fired = fired(&ev);
    assert_eq!(fired.len(), 250);
    assert!(sim.continuations > before, "cut at the per-entry bound");
    let ids: std::collections::BTreeSet<_> = fired.iter().map(|f| f.2.clone()).collect();
    assert_eq!(ids.len(), 250);
    assert_eq!(sim.state.jobs.len(), 250);
}

#[test]
fn a_previous_run_still_waiting_out_its_jitter_counts_as_running() {
    let mut sim = Sim::new();
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    let jitter = ksched_core::schedule::jitter_of("acme", "s", T0, 10 * MINUTE);
    assert!(jitter > 2 * MINUTE, "this firing waits {jitter} ms");
    create(
        &mut sim,
        "s",
        ScheduleSpec {
            jitter_ms: 10 * MINUTE,
            ..every(MINUTE)
        },
    );
    sim.tick_now();
    assert_eq!(sim.job_state(&id_at(T0)), JobState::Delayed);
    // The partial states keep a DELAYED job in storage only: the decision loads it.
    let ev = sim.tick_after(MINUTE);
    assert_eq!(outcomes(&ev), [ScheduleOutcome::Skipped]);
}

#[test]
fn catch_up_all_follows_the_overlap_policy_and_never_narrower_than_the_grace() {
    // With SKIP, the first missed firing runs, and those after it overlap with it.
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    create(
        &mut sim,
        "s",
        ScheduleSpec {
            catch_up: ScheduleCatchUp::All,
            ..every(MINUTE)
        },
    );
    sim.gap(3 * MINUTE + 40_000);
    let ev = sim.tick_now();
    assert_eq!(
        outcomes(&ev),
        [
            ScheduleOutcome::Submitted,
            ScheduleOutcome::Skipped,
            ScheduleOutcome::Skipped,
            ScheduleOutcome::Skipped
        ]
    );
    // A window of 0 is the grace: a firing a little late still runs.
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    create(
        &mut sim,
        "s",
        ScheduleSpec {
            catch_up: ScheduleCatchUp::All,
            catch_up_window_ms: 0,
            ..every(MINUTE)
        },
    );
    sim.gap(20_000);
    let ev = sim.tick_now();
    assert_eq!(outcomes(&ev), [ScheduleOutcome::Submitted]);
}

#[test]
fn catch_up_all_runs_about_a_thousand_firings_at_most() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    create(
        &mut sim,
        "s",
        ScheduleSpec {
            catch_up: ScheduleCatchUp::All,
            overlap: ScheduleOverlap::AllowAll,
            paused: true,
            ..every(1_000)
        },
    );
    // Paused for an hour: 3,600 firings missed, a day's window.
    sim.gap(3_600_000);
    command(&mut sim, "s", ScheduleAction::Resume, None);
    let ev = sim.tick_now();
    let fired = fired(&ev);
    let submitted = fired
        .iter()
        .filter(|f| f.1 == ScheduleOutcome::Submitted)
        .count();
    assert!(
        (1_000..=1_001).contains(&submitted),
        "{submitted} caught up"
    );
    assert_eq!(fired[0].1, ScheduleOutcome::Missed, "the older ones");
    assert_eq!(fired.last().unwrap().0, T0 + 3_600_000);
}

#[test]
fn an_update_keeps_a_paused_schedule_paused() {
    let mut sim = Sim::new();
    create(&mut sim, "s", every(MINUTE));
    command(&mut sim, "s", ScheduleAction::Pause, None);
    command(
        &mut sim,
        "s",
        ScheduleAction::Update,
        Some(every(2 * MINUTE)),
    );
    assert!(schedule(&sim, "s").paused);
    let ev = sim.tick_after(5 * MINUTE);
    assert!(fired(&ev).is_empty());
}

#[test]
fn a_trigger_takes_its_id_from_the_command_and_never_runs_twice() {
    let mut sim = Sim::new();
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    create(
        &mut sim,
        "s",
        ScheduleSpec {
            overlap: ScheduleOverlap::AllowAll,
            paused: true,
            ..every(MINUTE)
        },
    );
    let trigger = |sim: &mut Sim| {
        sim.input(
            "ksched.control",
            Input::Schedule(ScheduleCommand {
                schedule_id: "s".into(),
                tenant_id: "acme".into(),
                action: ScheduleAction::Trigger,
                spec: None,
                principal_id: "alice".into(),
                reason: None,
                requested_at: T0 + 1,
            }),
        )
    };
    trigger(&mut sim);
    let id = firing_job_id("acme", "s", T0 + 1, true);
    succeed(&mut sim, &id);
    sim.tick_after(10_000);
    // The same command again (its job ended and left memory): refused, not run again.
    let ev = trigger(&mut sim);
    assert_eq!(outcomes(&ev), [ScheduleOutcome::Refused]);
    assert_eq!(sim.job_state(&id), JobState::Succeeded);
}

#[test]
fn odd_ids_and_a_missing_principal_are_refused() {
    let mut sim = Sim::new();
    for id in ["..", ".hidden", "a\u{200b}b", "naïve"] {
        let ev = create(&mut sim, id, every(MINUTE));
        assert_eq!(rejected(&ev).reason_code, "invalid_schedule", "{id:?}");
    }
    let ev = sim.input(
        "ksched.control",
        Input::Schedule(ScheduleCommand {
            schedule_id: "s".into(),
            tenant_id: "acme".into(),
            action: ScheduleAction::Create,
            spec: Some(every(MINUTE)),
            principal_id: String::new(),
            reason: None,
            requested_at: T0,
        }),
    );
    assert_eq!(rejected(&ev).reason_code, "invalid_schedule");
    // A tenant and id so long that the triggered job's id would not fit.
    let long = "x".repeat(120);
    let tenant = "t".repeat(120);
    let ev = sim.input(
        "ksched.control",
        Input::Schedule(ScheduleCommand {
            schedule_id: long,
            tenant_id: tenant,
            action: ScheduleAction::Create,
            spec: Some(every(MINUTE)),
            principal_id: "alice".into(),
            reason: None,
            requested_at: T0,
        }),
    );
    assert_eq!(rejected(&ev).reason_code, "invalid_schedule");
    assert!(sim.state.schedules.is_empty());
}
