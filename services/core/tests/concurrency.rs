//! Concurrency keys (SPEC §10): at most `limit` jobs of one key SCHEDULED, DISPATCHED or
//! RUNNING at once; the rest wait `concurrency_limited`, in queue order, and are placed as
//! soon as a slot frees. Every scenario runs through `Sim`, which checks after each input
//! that a replay of the journal and the partial states agree with the live state.

mod support;

use ksched_core::events::*;
use ksched_core::records::{Priority, ResultStatus};
use ksched_core::rules::{ConcurrencyRule, PoolRules, Rules};
use support::*;

/// `job.default` limited to `limit` jobs per `concurrency_key` label; jobs run as long as
/// they like (no dispatch or running timeout gets in the way).
fn limited(limit: u32) -> Rules {
    let mut r = rules();
    r.timing.dispatch_timeout_ms = 24 * 3_600_000;
    r.timing.running_timeout_ms = 24 * 3_600_000;
    r.topic_concurrency.insert(
        "job.default".into(),
        ConcurrencyRule {
            key: "label:concurrency_key".into(),
            limit: Some(limit),
            rate: None,
            burst: None,
            fair: false,
        },
    );
    r
}

fn succeed(sim: &mut Sim, id: &str) -> Vec<Event> {
    let w = sim.job(id).worker_id.clone().unwrap();
    let attempt = sim.job(id).attempt;
    sim.result(id, attempt, &w, ResultStatus::Succeeded)
}

#[test]
fn a_key_at_its_limit_holds_its_jobs_in_queue_order_and_frees_them_one_by_one() {
    let mut sim = Sim::with_rules(limited(1));
    sim.worker("w1", "default");
    sim.worker("w2", "default");
    assert_eq!(dispatched(&sim.submit(keyed("k-1", "customer-7"))), ["k-1"]);
    let ev = sim.submit(keyed("k-2", "customer-7"));
    assert!(dispatched(&ev).is_empty(), "one at a time");
    let w = waiting(&ev);
    assert_eq!(w.reason_code, "concurrency_limited");
    assert!(w.detail.contains("\"customer-7\""), "{}", w.detail);
    sim.submit(keyed("k-3", "customer-7"));
    // Another key, and a job with no key, are not held by it.
    assert_eq!(dispatched(&sim.submit(keyed("o-1", "customer-8"))), ["o-1"]);
    assert_eq!(dispatched(&sim.submit(job("free-1"))), ["free-1"]);
    assert_eq!(sim.state.key_active_jobs("acme", "customer-7"), 1);

    // k-1 ends: k-2, not k-3, takes its slot, in the same entry.
    assert_eq!(dispatched(&succeed(&mut sim, "k-1")), ["k-2"]);
    assert_eq!(sim.job_state("k-3"), JobState::Pending);
    assert_eq!(dispatched(&succeed(&mut sim, "k-2")), ["k-3"]);
    succeed(&mut sim, "k-3");
    assert_eq!(sim.state.key_active_jobs("acme", "customer-7"), 0);
    assert!(!(sim.state.key_live).contains_key(&("acme".to_owned(), "customer-7".to_owned())));
    assert!(sim.state.parked.is_empty());
}

#[test]
fn keys_are_a_tenants_own() {
    let mut sim = Sim::with_rules(limited(1));
    sim.worker("w1", "default");
    sim.submit(keyed("a-1", "shared"));
    let mut other = keyed("b-1", "shared");
    other.tenant_id = "globex".into();
    assert_eq!(
        dispatched(&sim.submit(other)),
        ["b-1"],
        "another tenant's key of the same name is another key"
    );
    let ev = sim.submit(keyed("a-2", "shared"));
    assert_eq!(waiting(&ev).reason_code, "concurrency_limited");
}

#[test]
fn a_limit_of_two_lets_two_run_and_a_retry_keeps_its_slot_and_its_place() {
    let mut sim = Sim::with_rules(limited(2));
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    for n in 1..=3 {
        sim.submit(keyed(&format!("j-{n}"), "k"));
    }
    assert_eq!(sim.job_state("j-1"), JobState::Dispatched);
    assert_eq!(sim.job_state("j-2"), JobState::Dispatched);
    assert_eq!(sim.job_state("j-3"), JobState::Pending);
    // j-1 fails and is retried: it keeps its slot through its backoff (j-3 still waits),
    // then comes back to its first place in the key's queue, ahead of j-3.
    let ev = sim.result_with("j-1", 1, "w1", ResultStatus::FailedRetryable, Some("flaky"));
    assert!(dispatched(&ev).is_empty(), "the retry holds its slot");
    assert_eq!(sim.state.key_active_jobs("acme", "k"), 2);
    let ev = sim.tick_after(3_000);
    assert_eq!(dispatched(&ev), ["j-1"], "back at its place, before j-3");
    assert_eq!(sim.job("j-1").attempt, 2);
    assert_eq!(sim.job_state("j-3"), JobState::Pending);
    // A slot freed by an ending job goes to j-3, the next in the key's order.
    let w = sim.job("j-2").worker_id.clone().unwrap();
    let ev = sim.result("j-2", 1, &w, ResultStatus::Succeeded);
    assert_eq!(dispatched(&ev), ["j-3"]);
    assert_eq!(
        waiting(&sim.submit(keyed("j-4", "k"))).reason_code,
        "concurrency_limited"
    );
}

#[test]
fn a_tenant_key_limits_all_of_the_tenants_jobs_on_the_topic() {
    let mut r = rules();
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
    let mut sim = Sim::with_rules(r);
    sim.worker("w1", "default");
    sim.submit(job("t-1"));
    let ev = sim.submit(job("t-2"));
    let w = waiting(&ev);
    assert_eq!(w.reason_code, "concurrency_limited");
    assert!(w.detail.contains("(the tenant's)"), "{}", w.detail);
}

#[test]
fn a_job_held_by_its_key_is_never_dead_lettered_for_it() {
    let mut sim = Sim::with_rules(limited(1));
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    sim.submit(keyed("long-1", "k"));
    sim.started("long-1", 1, "w1");
    sim.submit(keyed("next-1", "k"));
    let timeout = sim.state.rules().unwrap().timing.placement_timeout_ms;
    let ev = sim.tick_after(timeout + 2_000);
    assert!(sim.dead_letters().is_empty(), "{:?}", names(&ev));
    assert_eq!(sim.job_state("next-1"), JobState::Pending);
    let again = ev
        .iter()
        .find_map(|e| match e {
            Event::JobWaiting(w) if w.job_id == "next-1" => Some(w),
            _ => None,
        })
        .expect("its timeout started again");
    assert!(again.detail.contains("starts again"), "{}", again.detail);
    // Twice as long: still waiting, still not dead-lettered.
    sim.tick_after(timeout + 2_000);
    assert!(sim.dead_letters().is_empty());
    // The running job ends: the held one runs.
    let attempt = sim.job("long-1").attempt;
    let ev = sim.result("long-1", attempt, "w1", ResultStatus::Succeeded);
    assert_eq!(dispatched(&ev), ["next-1"]);
}

/// A job whose pools have no worker for it times out as any job does, also while its key is
/// full (a job of the key runs in another pool).
#[test]
fn a_job_whose_pools_have_no_worker_times_out_even_while_its_key_is_full() {
    let mut r = limited(1);
    r.topics.insert("job.other".into(), vec!["b".into()]);
    r.topic_concurrency.insert(
        "job.other".into(),
        ConcurrencyRule {
            key: "label:concurrency_key".into(),
            limit: Some(1),
            rate: None,
            burst: None,
            fair: false,
        },
    );
    let mut sim = Sim::with_rules(r);
    sim.keep_alive(&[("w1", "default")]);
    sim.worker("w1", "default");
    sim.submit(keyed("busy", "k"));
    let mut lonely = keyed("lonely", "k");
    lonely.topic = "job.other".into();
    assert_eq!(
        waiting(&sim.submit(lonely)).reason_code,
        "concurrency_limited"
    );
    let timeout = sim.state.rules().unwrap().timing.placement_timeout_ms;
    sim.tick_after(timeout + 2_000);
    let dl = sim.dead_letters();
    assert_eq!(dl.len(), 1, "{dl:?}");
    assert_eq!(dl[0].job_id, "lonely");
    assert_eq!(dl[0].reason_code, "no_workers");
    assert_eq!(sim.job_state("busy"), JobState::Dispatched);
}

/// A limit added while a key's jobs run counts them: no fourth starts beside three.
#[test]
fn a_limit_added_while_jobs_run_counts_the_running_ones() {
    let mut sim = Sim::with_rules(limited(1));
    sim.worker("w1", "default");
    let mut unlimited = limited(1);
    unlimited.topic_concurrency.clear();
    sim.reconfigure(&unlimited, "snap-2");
    for n in 1..=3 {
        assert_eq!(
            dispatched(&sim.submit(keyed(&format!("u-{n}"), "k"))).len(),
            1
        );
    }
    sim.reconfigure(&limited(2), "snap-3");
    assert_eq!(sim.state.key_active_jobs("acme", "k"), 3);
    let ev = sim.submit(keyed("u-4", "k"));
    assert_eq!(waiting(&ev).reason_code, "concurrency_limited");
    // Two of the three end: still at the limit of two with u-3 running, then u-4 runs.
    assert!(dispatched(&succeed(&mut sim, "u-1")).is_empty());
    assert_eq!(dispatched(&succeed(&mut sim, "u-2")), ["u-4"]);
}

/// Lanes whose key is at its limit are parked, so a pass never spends its look budget on
/// them: with `max_scan_per_entry` 1 and a hundred held keys queued ahead (higher priority),
/// a job behind them is still placed at once.
#[test]
fn held_keys_ahead_in_the_queue_do_not_hold_up_the_jobs_behind_them() {
    let mut r = limited(1);
    r.limits.max_scan_per_entry = 1;
    let mut sim = Sim::with_rules(r);
    let mut w = hb("w1", "default");
    w.max_parallel_jobs = 1_000;
    sim.heartbeat(w);
    for n in 0..100 {
        for m in 0..2 {
            let mut j = keyed(&format!("k{n}-{m}"), &format!("key-{n}"));
            j.priority = Priority::Interactive;
            sim.submit(j);
        }
    }
    assert_eq!(sim.state.parked.get("default").map(|p| p.len()), Some(100));
    assert_eq!(dispatched(&sim.submit(job("behind"))), ["behind"]);
}

/// A slot freed in one pool places the key's job waiting in another pool in the same entry.
#[test]
fn a_slot_freed_in_one_pool_wakes_the_keys_jobs_in_another() {
    let mut r = limited(1);
    r.topics.insert("job.other".into(), vec!["b".into()]);
    r.topic_concurrency.insert(
        "job.other".into(),
        ConcurrencyRule {
            key: "label:concurrency_key".into(),
            limit: Some(1),
            rate: None,
            burst: None,
            fair: false,
        },
    );
    let mut sim = Sim::with_rules(r);
    sim.worker("w1", "default");
    sim.worker("wb", "b");
    sim.submit(keyed("here", "k"));
    let mut there = keyed("there", "k");
    there.topic = "job.other".into();
    assert_eq!(
        waiting(&sim.submit(there)).reason_code,
        "concurrency_limited"
    );
    let ev = succeed(&mut sim, "here");
    assert_eq!(dispatched(&ev), ["there"], "placed by the result's entry");
    assert_eq!(sim.job("there").worker_id.as_deref(), Some("wb"));
}

#[test]
fn a_reconfigure_applies_the_new_limit_to_waiting_jobs() {
    let mut sim = Sim::with_rules(limited(1));
    sim.worker("w1", "default");
    sim.submit(keyed("r-1", "k"));
    sim.submit(keyed("r-2", "k"));
    sim.submit(keyed("r-3", "k"));
    let ev = sim.reconfigure(&limited(2), "snap-2");
    assert_eq!(dispatched(&ev), ["r-2"]);
    assert_eq!(sim.job_state("r-3"), JobState::Pending);
    // Without a limit, the rest run.
    let ev = sim.reconfigure(&rules(), "snap-3");
    assert_eq!(dispatched(&ev), ["r-3"]);
    assert!(sim.job("r-3").concurrency.is_none());
    // Running jobs follow the rules in force too: without a limit they count for no key.
    assert_eq!(sim.state.key_active_jobs("acme", "k"), 0);
    assert!(sim.job("r-1").concurrency.is_none());
}

#[test]
fn a_shard_holds_at_most_max_concurrency_keys_live_keys() {
    let mut r = limited(1);
    r.limits.max_concurrency_keys = 2;
    let mut sim = Sim::with_rules(r);
    sim.submit(keyed("a", "one"));
    sim.submit(keyed("b", "two"));
    sim.submit(keyed("c", "one"));
    let ev = sim.submit(keyed("d", "three"));
    let dl = dead_lettered(&ev);
    assert_eq!(dl.reason_code, "queue_full");
    assert!(dl.reason.contains("max_concurrency_keys"), "{}", dl.reason);
    // A job without a key is not counted.
    assert_eq!(sim.job_state("a"), JobState::Pending);
    sim.submit(job("no-key"));
    assert_eq!(sim.job_state("no-key"), JobState::Pending);
    // Once a key's jobs are gone, a new key fits.
    sim.cancel("b", None);
    sim.submit(keyed("e", "three"));
    assert_eq!(sim.job_state("e"), JobState::Pending);
}

#[test]
fn a_cancelled_running_job_frees_its_keys_slot() {
    let mut sim = Sim::with_rules(limited(1));
    sim.worker("w1", "default");
    sim.submit(keyed("c-1", "k"));
    sim.submit(keyed("c-2", "k"));
    let ev = sim.cancel("c-1", None);
    assert_eq!(dispatched(&ev), ["c-2"]);
}

#[test]
fn rules_with_a_bad_concurrency_rule_are_refused() {
    let mut r = limited(0);
    assert!(r.validate().unwrap_err().0.contains("at least 1"));
    r.topic_concurrency.get_mut("job.default").unwrap().limit = Some(1);
    r.topic_concurrency.get_mut("job.default").unwrap().key = "header:x".into();
    assert!(r.validate().unwrap_err().0.contains("label:NAME"));
    let mut r = limited(1);
    r.topic_concurrency.insert(
        "job.unmapped".into(),
        ConcurrencyRule {
            key: "tenant".into(),
            limit: Some(1),
            rate: None,
            burst: None,
            fair: false,
        },
    );
    assert!(r.validate().unwrap_err().0.contains("maps to no pool"));
    let _ = PoolRules::default();
}

/// A key the input policy imposes wins over the producer's own label, so a producer cannot
/// escape it by giving each job a key of its own.
#[test]
fn a_key_the_policy_imposes_cannot_be_escaped_by_the_producers_label() {
    let mut policy = ScriptPolicy::default();
    policy.input.push(Box::new(|_| {
        let mut d = ksched_core::policy::PolicyDecision::allow();
        d.constraints
            .labels
            .insert("concurrency_key".into(), "imposed".into());
        Some(d)
    }));
    let mut sim = Sim::with_policy(limited(1), policy);
    sim.worker("w1", "default");
    assert_eq!(dispatched(&sim.submit(keyed("p-1", "mine-1"))), ["p-1"]);
    let ev = sim.submit(keyed("p-2", "mine-2"));
    let w = waiting(&ev);
    assert_eq!(w.reason_code, "concurrency_limited");
    assert!(w.detail.contains("\"imposed\""), "{}", w.detail);
}

/// A key's jobs in a pool stand in the pass as one: its oldest queued job. However many
/// lanes they make (here each asks for a worker of its own), reaching or leaving the limit
/// moves one entry, and the key's jobs are tried oldest first.
#[test]
fn a_keys_jobs_in_a_pool_stand_as_one_oldest_first() {
    let mut sim = Sim::with_rules(limited(1));
    let mut w = hb("w1", "default");
    w.max_parallel_jobs = 1_000;
    sim.heartbeat(w);
    for n in 0..200 {
        let mut j = keyed(&format!("h-{n:03}"), "k");
        j.labels
            .insert("preferred_worker_id".into(), format!("w-{n}"));
        sim.submit(j);
    }
    let heads = |sim: &Sim| {
        let walked = sim.state.lane_heads.get("default").map_or(0, |h| h.len());
        let parked = sim.state.parked.get("default").map_or(0, |s| s.len());
        (walked, parked)
    };
    assert_eq!(heads(&sim), (0, 1), "199 lanes, one parked entry");
    assert_eq!(sim.state.lanes["default"].len(), 199);
    assert_eq!(dispatched(&succeed(&mut sim, "h-000")), ["h-001"]);
    assert_eq!(heads(&sim), (0, 1));
    // The oldest held for another reason holds the key's younger jobs behind it.
    let mut sim = Sim::with_rules(limited(1));
    sim.worker("w1", "default");
    let mut first = keyed("old", "k");
    first.labels.insert("placement.zone".into(), "mars".into());
    assert_eq!(waiting(&sim.submit(first)).reason_code, "no_workers");
    let ev = sim.submit(keyed("young", "k"));
    assert!(dispatched(&ev).is_empty(), "in order: behind the oldest");
    // Until the oldest is dead-lettered: then the next runs.
    let timeout = sim.state.rules().unwrap().timing.placement_timeout_ms;
    sim.keep_alive(&[("w1", "default")]);
    sim.tick_after(timeout + 2_000);
    assert_eq!(sim.job_state("old"), JobState::Failed);
    assert_eq!(sim.job_state("young"), JobState::Dispatched);
}
