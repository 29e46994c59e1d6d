//! Rate limits (SPEC §10): a key's jobs are placed at most `N` per period, up to `burst` at
//! once after an idle spell; the others wait `rate_limited`, in queue order, and are placed
//! when the key's bucket frees, at the first entry of that time or later (a Tick at the
//! latest). Every scenario runs through `Sim`, which checks after each input that a replay
//! of the journal and the partial states agree with the live state.

mod support;

use ksched_core::events::*;
use ksched_core::records::ResultStatus;
use ksched_core::rules::{ConcurrencyRule, Rate, Rules};
use support::*;

/// `job.default` keyed by the `concurrency_key` label, at `rate` with `burst`, and at most
/// `limit` at once if given; jobs run as long as they like.
fn rated(rate: &str, burst: Option<u32>, limit: Option<u32>) -> Rules {
    let mut r = rules();
    r.timing.dispatch_timeout_ms = 24 * 3_600_000;
    r.timing.running_timeout_ms = 24 * 3_600_000;
    r.topic_concurrency.insert(
        "job.default".into(),
        ConcurrencyRule {
            key: "label:concurrency_key".into(),
            limit,
            rate: Some(rate.into()),
            burst,
            fair: false,
        },
    );
    r
}

/// A worker in `default` that takes a thousand jobs at once and keeps heartbeating.
fn roomy(sim: &mut Sim) {
    let mut w = hb("w1", "default");
    w.max_parallel_jobs = 1_000;
    sim.heartbeat(w);
    sim.keep_alive(&[("w1", "default")]);
}

#[test]
fn a_key_is_placed_at_its_rate_after_its_burst_in_queue_order() {
    // Two a second, two at once: one every 500 ms after the first two.
    let mut sim = Sim::with_rules(rated("2/s", None, None));
    roomy(&mut sim);
    let mut placed = Vec::new();
    for n in 1..=6 {
        placed.extend(
            dispatched(&sim.submit(keyed(&format!("r-{n}"), "api")))
                .into_iter()
                .map(str::to_owned),
        );
    }
    assert_eq!(placed, ["r-1", "r-2"], "the burst, then the rate");
    let w = sim.job("r-3").wait_reason.clone();
    assert_eq!(w.as_deref(), Some("rate_limited"));
    // Another key, and another tenant's key of the same name, have buckets of their own.
    assert_eq!(dispatched(&sim.submit(keyed("o-1", "batch"))), ["o-1"]);
    let mut other = keyed("globex:g-1", "api");
    other.tenant_id = "globex".into();
    assert_eq!(dispatched(&sim.submit(other)), ["globex:g-1"]);

    // r-3's token is due 500 ms after r-1's: an entry 400 ms on does not place it, the first
    // entry at or after 500 ms does (here a heartbeat at 600 ms), not only a Tick.
    sim.advance(400);
    assert!(dispatched(&sim.heartbeat(hb_roomy())).is_empty());
    sim.advance(200);
    assert_eq!(dispatched(&sim.heartbeat(hb_roomy())), ["r-3"]);
    // The ticker comes every second: each Tick places what the bucket freed since, in
    // queue order (r-4's token at +1000 ms, r-5's at +1500, r-6's at +2000).
    assert_eq!(dispatched(&sim.tick_after(400)), ["r-4"]);
    assert_eq!(sim.job_state("r-5"), JobState::Pending);
    assert_eq!(dispatched(&sim.tick_after(1_000)), ["r-5", "r-6"]);
}

fn hb_roomy() -> ksched_core::records::Heartbeat {
    let mut w = hb("w1", "default");
    w.max_parallel_jobs = 1_000;
    w
}

#[test]
fn a_rate_limited_backlog_keeps_its_order_through_placement_timeouts() {
    // One every ten seconds, placement timeouts every three: each held job's timeout comes
    // round again and again, and never takes its key's token ahead of an older job.
    let mut rules = rated("1/10s", None, None);
    rules.timing.placement_timeout_ms = 3_000;
    let mut sim = Sim::with_rules(rules);
    roomy(&mut sim);
    let ids: Vec<String> = (0..8).map(|n| format!("o-{n}")).collect();
    for (n, id) in ids.iter().enumerate() {
        sim.submit(keyed(id, "k"));
        sim.advance(if n % 2 == 0 { 700 } else { 1_300 });
    }
    // Each job succeeds as soon as it is dispatched (the worker never fills up).
    for _ in 0..90 {
        let ev = sim.tick_after(1_000);
        for id in dispatched(&ev) {
            let w = sim.job(id).worker_id.clone().unwrap();
            sim.result(id, 1, &w, ResultStatus::Succeeded);
        }
    }
    let order: Vec<String> = (sim.dispatches().iter())
        .map(|d| d.job.job_id.clone())
        .collect();
    assert_eq!(order, ids);
    assert!(sim.dead_letters().is_empty());
}

#[test]
fn topics_sharing_a_key_under_different_rates_each_keep_their_own_bucket() {
    let mut rules = rated("1/h", None, None);
    rules
        .topics
        .insert("job.fast".into(), vec!["default".into()]);
    rules.topic_concurrency.insert(
        "job.fast".into(),
        ConcurrencyRule {
            key: "label:concurrency_key".into(),
            limit: None,
            rate: Some("10/s".into()),
            burst: None,
            fair: false,
        },
    );
    let mut sim = Sim::with_rules(rules);
    roomy(&mut sim);
    assert_eq!(dispatched(&sim.submit(keyed("slow-1", "k"))), ["slow-1"]);
    // The slow topic's spent bucket does not hold the fast topic's jobs of the same key.
    let mut fast = keyed("fast-1", "k");
    fast.topic = "job.fast".into();
    assert_eq!(dispatched(&sim.submit(fast)), ["fast-1"]);
    assert_eq!(
        waiting(&sim.submit(keyed("slow-2", "k"))).reason_code,
        "rate_limited"
    );
    assert_eq!(sim.state.buckets.len(), 2);
}

#[test]
fn a_job_held_by_its_rate_is_never_dead_lettered_for_it() {
    // One an hour: the second waits far past the placement timeout.
    let mut sim = Sim::with_rules(rated("1/h", None, None));
    roomy(&mut sim);
    sim.submit(keyed("h-1", "slow"));
    let ev = sim.submit(keyed("h-2", "slow"));
    let w = waiting(&ev);
    assert_eq!(w.reason_code, "rate_limited");
    assert!(w.detail.contains("1/1h, burst 1"), "{}", w.detail);
    let timeout = sim.state.rules().unwrap().timing.placement_timeout_ms;
    let ev = sim.tick_after(timeout + 2_000);
    let again = waiting(&ev);
    assert_eq!(again.reason_code, "rate_limited");
    assert!(again.detail.contains("starts again"), "{}", again.detail);
    assert_eq!(sim.job_state("h-2"), JobState::Pending);
    // An hour after the first, its token comes.
    let rest = 3_600_000 - timeout - 2_000;
    sim.tick_after(rest);
    assert_eq!(sim.job_state("h-2"), JobState::Dispatched);
}

#[test]
fn a_full_bucket_is_forgotten_and_an_idle_key_gets_its_burst_again() {
    let mut sim = Sim::with_rules(rated("10/s", Some(3), None));
    roomy(&mut sim);
    for n in 1..=5 {
        sim.submit(keyed(&format!("b-{n}"), "k"));
    }
    assert_eq!(sim.state.buckets.len(), 1);
    sim.tick_after(1_000);
    assert_eq!(sim.job_state("b-5"), JobState::Dispatched);
    // Idle for a while: the bucket fills and is dropped (a million keys used once do not
    // stay in memory).
    sim.tick_after(2_000);
    assert!(sim.state.buckets.is_empty());
    assert!(sim.state.bucket_changes.is_empty());
    let mut placed = 0;
    for n in 6..=10 {
        placed += dispatched(&sim.submit(keyed(&format!("b-{n}"), "k"))).len();
    }
    assert_eq!(placed, 3, "the burst again");
}

#[test]
fn a_limit_and_a_rate_on_one_key_hold_by_whichever_binds() {
    // Ten a second but one at a time: the limit binds.
    let mut sim = Sim::with_rules(rated("10/s", None, Some(1)));
    roomy(&mut sim);
    assert_eq!(dispatched(&sim.submit(keyed("l-1", "k"))), ["l-1"]);
    let ev = sim.submit(keyed("l-2", "k"));
    assert_eq!(waiting(&ev).reason_code, "concurrency_limited");
    let w = sim.job("l-1").worker_id.clone().unwrap();
    let ev = sim.result("l-1", 1, &w, ResultStatus::Succeeded);
    assert_eq!(dispatched(&ev), ["l-2"]);

    // One a second with room for five at once: the rate binds.
    let mut sim = Sim::with_rules(rated("1/s", None, Some(5)));
    roomy(&mut sim);
    assert_eq!(dispatched(&sim.submit(keyed("m-1", "k"))), ["m-1"]);
    let ev = sim.submit(keyed("m-2", "k"));
    assert_eq!(waiting(&ev).reason_code, "rate_limited");
    assert_eq!(dispatched(&sim.tick_after(1_000)), ["m-2"]);
}

#[test]
fn a_retry_takes_a_token_too() {
    let mut sim = Sim::with_rules(rated("1/10s", None, None));
    let mut r = sim.state.rules().unwrap().clone();
    r.retry.max_retries = 3;
    r.retry.initial_backoff_ms = 100;
    r.retry.max_backoff_ms = 100;
    r.retry.jitter_ratio = 0.0;
    sim.reconfigure(&r, "snap-2");
    roomy(&mut sim);
    assert_eq!(dispatched(&sim.submit(keyed("t-1", "k"))), ["t-1"]);
    sim.result("t-1", 1, "w1", ResultStatus::FailedRetryable);
    // Its backoff passes long before the key's next token: it waits for the token.
    let ev = sim.tick_after(2_000);
    assert!(dispatched(&ev).is_empty());
    assert_eq!(sim.job("t-1").wait_reason.as_deref(), Some("rate_limited"));
    sim.tick_after(8_000);
    assert_eq!(sim.job_state("t-1"), JobState::Dispatched);
    assert_eq!(sim.job("t-1").attempt, 2);
    // The retry spent the key's token: the next job waits for the one after.
    let ev = sim.submit(keyed("t-2", "k"));
    assert_eq!(waiting(&ev).reason_code, "rate_limited");
}

#[test]
fn a_rate_added_while_jobs_wait_holds_them_and_one_removed_frees_them() {
    let mut sim = Sim::with_rules(rules());
    // No worker yet: a backlog builds.
    for n in 1..=4 {
        sim.submit(keyed(&format!("c-{n}"), "k"));
    }
    sim.reconfigure(&rated("1/min", None, None), "snap-2");
    roomy(&mut sim);
    assert_eq!(sim.job_state("c-1"), JobState::Dispatched);
    assert_eq!(sim.job_state("c-2"), JobState::Pending);
    assert!(sim.state.parked.contains_key("default"));
    // Raised: the waiting jobs take tokens of the new rate at once, not after the hour
    // the old rate's bucket is spent for.
    let ev = sim.reconfigure(&rated("1/s", Some(2), None), "snap-3");
    assert_eq!(dispatched(&ev), ["c-2", "c-3"]);
    // The rate goes: the rest are placed at once.
    let ev = sim.reconfigure(&rules(), "snap-4");
    assert_eq!(dispatched(&ev), ["c-4"]);
}

#[test]
fn rates_are_read_strictly() {
    let ok = |t: &str| Rate::parse(t, None).unwrap();
    assert_eq!(
        ok("100/s"),
        Rate {
            count: 100,
            per_ms: 1_000,
            burst: 100
        }
    );
    assert_eq!(ok("600/1m").per_ms, 60_000);
    assert_eq!(ok("5/10s").per_ms, 10_000);
    assert_eq!(ok(" 1/h ").per_ms, 3_600_000);
    assert_eq!(ok("1/500ms").per_ms, 500);
    assert_eq!(ok("3/2min").interval_us(), 40_000_000);
    assert_eq!(Rate::parse("2/s", Some(1)).unwrap().tolerance_us(), 0);
    assert_eq!(
        Rate::parse("2/s", Some(3)).unwrap().tolerance_us(),
        1_000_000
    );
    // Rounded up: never faster than asked.
    assert_eq!(ok("3/s").interval_us(), 333_334);
    for bad in [
        "", "5", "0/s", "5/0s", "-1/s", "5/s/x", "5/2d", "5/xyz", "5/1", "1/169h", "2000/1ms",
    ] {
        assert!(Rate::parse(bad, None).is_err(), "{bad:?} was read");
    }
    assert!(Rate::parse("1/s", Some(0)).is_err());
    assert!(Rate::parse("1/s", Some(2_000_000)).is_err());
    // A bucket fills in a week at most: 200 tokens of one an hour do not.
    assert!(Rate::parse("1/h", Some(168)).is_ok());
    assert!(Rate::parse("1/h", Some(169)).is_err());
    // The default burst (N) is capped at the largest burst.
    assert_eq!(ok("2000000/1h").burst, Rate::MAX_BURST);

    // In rules: a burst needs a rate, and a key needs a limit or a rate.
    let mut r = rated("1/s", None, None);
    assert!(r.validate().is_ok());
    let rule = r.topic_concurrency.get_mut("job.default").unwrap();
    rule.rate = Some("fast".into());
    assert!(r.validate().unwrap_err().to_string().contains("N/PERIOD"));
    let rule = r.topic_concurrency.get_mut("job.default").unwrap();
    rule.rate = None;
    rule.burst = Some(3);
    assert!(
        r.validate()
            .unwrap_err()
            .to_string()
            .contains("burst needs a rate")
    );
    let rule = r.topic_concurrency.get_mut("job.default").unwrap();
    rule.burst = None;
    assert!(
        r.validate()
            .unwrap_err()
            .to_string()
            .contains("a limit, a rate")
    );
}
