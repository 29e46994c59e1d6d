//! Fair share between tenants (SPEC §10): within a priority, a pool places next the job of
//! the tenant that has had the least of it for its weight, so one tenant's backlog cannot
//! hold another's jobs behind it, weights divide a busy pool in their proportion, and a
//! tenant back from idle starts even (it banks nothing while it had nothing to run).
//! Priority still comes first, and a tenant held by its limit leaves the pool to the others.

mod support;

use std::collections::VecDeque;

use ksched_core::events::*;
use ksched_core::records::{JobRequest, Priority, ResultStatus};
use ksched_core::rules::{Rules, TenantRules};
use ksched_core::state::SHARE_UNIT;
use support::*;

/// Job `n` of `tenant` (ids in the tenant's namespace, in submission order).
fn of(tenant: &str, n: usize) -> JobRequest {
    let mut j = job(&format!("{tenant}:{n:06}"));
    j.tenant_id = tenant.into();
    j
}

fn tenant_of(id: &str) -> &str {
    id.split(':').next().unwrap()
}

/// Rules with these tenant weights; jobs may wait and run as long as they like.
fn weighted(weights: &[(&str, u32)]) -> Rules {
    let mut r = rules();
    r.timing.placement_timeout_ms = 24 * 3_600_000;
    r.timing.dispatch_timeout_ms = 24 * 3_600_000;
    r.timing.running_timeout_ms = 24 * 3_600_000;
    r.limits.max_pending_per_pool = i64::MAX;
    for (tenant, weight) in weights {
        r.tenants.insert(
            (*tenant).into(),
            TenantRules {
                weight: Some(*weight),
                ..Default::default()
            },
        );
    }
    r
}

/// Rules holding each tenant's `job.default` jobs to `n` at once (a concurrency key per
/// tenant, which a Reconfigure applies to queued jobs too).
fn per_tenant(n: u32) -> Rules {
    let mut r = weighted(&[]);
    r.topic_concurrency.insert(
        "job.default".into(),
        ksched_core::rules::ConcurrencyRule {
            key: "tenant".into(),
            limit: Some(n),
            rate: None,
            burst: None,
            fair: false,
        },
    );
    r
}

/// A pool of one worker that runs `slots` jobs at once, and the jobs it runs, oldest
/// placement first.
struct Pool {
    running: VecDeque<String>,
}

impl Pool {
    fn start(sim: &mut Sim, slots: i32) -> Pool {
        let mut w = hb("w1", "default");
        w.max_parallel_jobs = slots;
        let mut pool = Pool {
            running: VecDeque::new(),
        };
        let ev = sim.heartbeat(w);
        pool.placed(&ev);
        pool
    }

    fn placed(&mut self, events: &[Event]) -> Vec<String> {
        let ids: Vec<String> = dispatched(events).into_iter().map(str::to_owned).collect();
        self.running.extend(ids.iter().cloned());
        ids
    }

    fn submit(&mut self, sim: &mut Sim, req: JobRequest) -> Vec<String> {
        let ev = sim.submit(req);
        self.placed(&ev)
    }

    /// The oldest running job succeeds; returns what its slot placed.
    fn finish_one(&mut self, sim: &mut Sim) -> Vec<String> {
        let id = self.running.pop_front().expect("a job running");
        let ev = sim.result(&id, 1, "w1", ResultStatus::Succeeded);
        self.placed(&ev)
    }

    /// The oldest running job of `tenant` succeeds; returns what its slot placed.
    fn finish_of(&mut self, sim: &mut Sim, tenant: &str) -> Vec<String> {
        let at = (self.running.iter())
            .position(|id| tenant_of(id) == tenant)
            .expect("a job of the tenant running");
        let id = self.running.remove(at).unwrap();
        let ev = sim.result(&id, 1, "w1", ResultStatus::Succeeded);
        self.placed(&ev)
    }

    /// Finishes jobs until `n` more were placed; returns them in order.
    fn next(&mut self, sim: &mut Sim, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        while out.len() < n {
            out.extend(self.finish_one(sim));
        }
        out
    }
}

fn count(ids: &[String], tenant: &str) -> usize {
    ids.iter().filter(|id| tenant_of(id) == tenant).count()
}

#[test]
fn a_small_tenant_is_not_stuck_behind_a_large_backlog() {
    const BACKLOG: usize = 20_000;
    let mut sim = Sim::with_rules(weighted(&[]));
    sim.checking = false;
    let mut pool = Pool::start(&mut sim, 10);
    for n in 0..BACKLOG {
        pool.submit(&mut sim, of("acme", n));
    }
    assert_eq!(pool.running.len(), 10, "the pool is full of acme's jobs");
    for n in 0..100 {
        assert!(pool.submit(&mut sim, of("globex", n)).is_empty());
    }
    // Equal weights: from globex's arrival on, the two alternate, so globex's 100 jobs
    // are placed within the next 200 placements (not after acme's 19,990 waiting ones).
    let after = pool.next(&mut sim, 200);
    assert_eq!(count(&after, "globex"), 100, "{after:?}");
    for pair in after.chunks(2) {
        assert_eq!(count(pair, "globex"), 1, "alternating: {pair:?}");
    }
    // Queue order within each tenant.
    let globex: Vec<&String> = after.iter().filter(|i| tenant_of(i) == "globex").collect();
    assert!(globex.windows(2).all(|w| w[0] < w[1]));
    // acme's backlog goes on draining alone.
    let rest = pool.next(&mut sim, 500);
    assert_eq!(count(&rest, "acme"), 500);
    sim.check();
}

#[test]
fn weights_divide_a_busy_pool_in_their_proportion() {
    let mut sim = Sim::with_rules(weighted(&[("acme", 3), ("globex", 1)]));
    sim.checking = false;
    let mut pool = Pool::start(&mut sim, 1);
    // globex's jobs are older: weights, not age, decide between tenants.
    for n in 0..600 {
        pool.submit(&mut sim, of("globex", n));
    }
    for n in 0..600 {
        pool.submit(&mut sim, of("acme", n));
    }
    let placed = pool.next(&mut sim, 800);
    assert_eq!(
        (count(&placed, "acme"), count(&placed, "globex")),
        (600, 200)
    );
    // Not only over the whole: at every point acme has had three of globex's one, give
    // or take the one placement ties between them go by job id.
    for n in 1..=placed.len() {
        let (a, g) = (count(&placed[..n], "acme"), count(&placed[..n], "globex"));
        assert!(a.abs_diff(3 * g) <= 4, "after {n}: {a} to {g}");
    }
    sim.check();
}

#[test]
fn a_tenant_back_from_idle_brings_no_banked_share() {
    let mut sim = Sim::with_rules(weighted(&[]));
    sim.checking = false;
    let mut pool = Pool::start(&mut sim, 1);
    for n in 0..100 {
        pool.submit(&mut sim, of("acme", n));
    }
    // acme ran alone for 50 placements; globex had nothing to run.
    pool.next(&mut sim, 50);
    for n in 0..20 {
        pool.submit(&mut sim, of("globex", n));
    }
    // globex comes in at the pool's clock: from then on the two alternate, not 50 of
    // globex's first to catch up.
    let placed = pool.next(&mut sim, 20);
    assert_eq!(count(&placed, "globex"), 10, "{placed:?}");
    for pair in placed.chunks(2) {
        assert_eq!(count(pair, "globex"), 1, "{pair:?}");
    }
    sim.check();
}

#[test]
fn priority_comes_before_fair_share() {
    let mut sim = Sim::with_rules(weighted(&[]));
    let mut pool = Pool::start(&mut sim, 1);
    for n in 0..6 {
        let mut j = of("acme", n);
        j.priority = if n < 3 {
            Priority::Batch
        } else {
            Priority::Critical
        };
        pool.submit(&mut sim, j);
    }
    for n in 0..3 {
        let mut j = of("globex", n);
        j.priority = Priority::Batch;
        pool.submit(&mut sim, j);
    }
    // acme:000 took the slot at once; acme's critical jobs come before any batch job,
    // however much acme had; then the batch jobs share, as if the critical ones had not
    // run (shares are kept per priority): acme:000 put acme's batch share at the clock,
    // where globex starts too, and acme's jobs are older.
    let placed = pool.next(&mut sim, 7);
    assert_eq!(
        placed,
        [
            "acme:000003",
            "acme:000004",
            "acme:000005",
            "acme:000001",
            "globex:000000",
            "acme:000002",
            "globex:000001",
        ]
    );
}

#[test]
fn a_tenant_held_by_its_limit_leaves_the_pool_to_the_others_and_is_owed_nothing() {
    // One job per tenant at once.
    let mut sim = Sim::with_rules(per_tenant(1));
    let mut pool = Pool::start(&mut sim, 2);
    for n in 0..12 {
        pool.submit(&mut sim, of("acme", n));
    }
    for n in 0..12 {
        pool.submit(&mut sim, of("globex", n));
    }
    // acme holds one slot; the other goes to globex's jobs one after the other.
    let running: Vec<String> = pool.running.iter().cloned().collect();
    assert_eq!(running, ["acme:000000", "globex:000000"]);
    for n in 1..=6 {
        let placed = pool.finish_of(&mut sim, "globex");
        assert_eq!(placed, [format!("globex:{n:06}")]);
    }
    // The limit is lifted: acme comes back at the clock, level with globex, not owed the
    // placements it was held from (with its older jobs it would otherwise take the next
    // six in a row).
    sim.reconfigure(&per_tenant(100), "snap-2");
    let placed = pool.next(&mut sim, 6);
    assert_eq!(count(&placed, "acme"), 3, "{placed:?}");
}

#[test]
fn a_changed_weight_applies_from_the_next_placement() {
    let mut sim = Sim::with_rules(weighted(&[]));
    let mut pool = Pool::start(&mut sim, 1);
    for n in 0..30 {
        pool.submit(&mut sim, of("acme", n));
        pool.submit(&mut sim, of("globex", n));
    }
    let even = pool.next(&mut sim, 8);
    assert_eq!(count(&even, "acme"), 4);
    sim.reconfigure(&weighted(&[("globex", 2)]), "snap-2");
    let weighted = pool.next(&mut sim, 12);
    // Placements already started at the old weight end first; from then on, two of
    // globex's for one of acme's.
    assert_eq!(count(&weighted[3..], "globex"), 6, "{weighted:?}");
}

/// The fair share of `default` at the priority of [`job`]'s jobs.
fn share(sim: &Sim) -> &ksched_core::state::PoolShare {
    &sim.state.shares[&("default".to_owned(), job("x").priority.rank())]
}

#[test]
fn shares_are_forgotten_at_a_tick_once_behind_the_clock_with_nothing_waiting() {
    let mut sim = Sim::with_rules(weighted(&[]));
    let mut pool = Pool::start(&mut sim, 1);
    for n in 0..3 {
        pool.submit(&mut sim, of("acme", n));
        pool.submit(&mut sim, of("globex", n));
    }
    for n in 3..5 {
        pool.submit(&mut sim, of("acme", n));
    }
    // a0 at once, then a1 g0 a2 g1 a3 g2, then acme alone: a4.
    pool.next(&mut sim, 7);
    // Two tenants waiting: the clock moves half a share a placement, and never stays
    // behind a placement's start; a tenant placed alone moves it a whole share.
    let u = SHARE_UNIT;
    assert_eq!(share(&sim).pass("globex"), 4 * u + u / 2);
    assert_eq!(share(&sim).pass("acme"), 5 * u);
    assert_eq!(share(&sim).clock, 5 * u);
    pool.finish_one(&mut sim);
    assert!(pool.running.is_empty());
    sim.tick_after(1_000);
    assert!(share(&sim).passes.is_empty(), "{:?}", share(&sim));
    // Back, globex starts at the clock like any newcomer.
    pool.submit(&mut sim, of("globex", 9));
    assert_eq!(pool.running.iter().collect::<Vec<_>>(), ["globex:000009"]);
    assert_eq!(share(&sim).pass("globex"), 6 * u);
}

#[test]
fn a_stream_of_new_tenants_cannot_hold_an_old_one_back() {
    // Each job of a new tenant starts at the clock; the clock moves with every placement,
    // so acme, ahead of it, still gets its turn (a fair one among those waiting).
    let mut sim = Sim::with_rules(weighted(&[]));
    sim.checking = false;
    let mut pool = Pool::start(&mut sim, 1);
    for n in 0..60 {
        pool.submit(&mut sim, of("acme", n));
    }
    pool.next(&mut sim, 5);
    // Whenever no new tenant has a job waiting, a new one submits one: acme always
    // competes with one newcomer, each starting at the clock.
    let mut placed = Vec::new();
    let mut newcomer: Option<String> = None;
    for n in 0..60 {
        if newcomer.is_none() {
            let j = of(&format!("new{n}"), 0);
            newcomer = Some(j.job_id.clone());
            pool.submit(&mut sim, j);
        }
        let now = pool.finish_one(&mut sim);
        if now.iter().any(|id| Some(id) == newcomer.as_ref()) {
            newcomer = None;
        }
        placed.extend(now);
    }
    // Two tenants waiting at every placement: acme has its half, give or take one.
    assert!(count(&placed, "acme").abs_diff(30) <= 1, "{placed:?}");
    // Newcomers placed and gone fall behind the clock and are forgotten.
    sim.tick_after(1_000);
    assert!(share(&sim).passes.len() <= 3, "{:?}", share(&sim).passes);
    sim.check();
}

#[test]
fn a_tenant_with_many_held_lanes_costs_a_pass_a_few_looks() {
    use ksched_core::decide::GROUP_HELD_BOUND;
    let mut r = weighted(&[]);
    r.tenants.insert(
        "acme".into(),
        TenantRules {
            max_concurrent_jobs: Some(1),
            ..Default::default()
        },
    );
    r.limits.max_scan_per_entry = 20;
    let mut sim = Sim::with_rules(r);
    sim.checking = false;
    let mut pool = Pool::start(&mut sim, 3);
    pool.submit(&mut sim, of("acme", 0));
    // 50 lanes of acme (each job asks for other memory), held by its limit.
    for n in 1..=50 {
        let mut j = of("acme", n);
        j.labels.insert("memory".into(), format!("{n}"));
        pool.submit(&mut sim, j);
    }
    for n in 0..30 {
        pool.submit(&mut sim, of("globex", n));
    }
    // acme's held group stands first (its pass is the lowest, and its jobs the oldest),
    // but a pass gives up on it after a few looks: globex takes the two free slots, not
    // starved by passes that spend their bound of 20 on acme's 50 lanes.
    let running: Vec<String> = pool.running.iter().cloned().collect();
    assert_eq!(count(&running, "globex"), 2, "{running:?}");
    // Each slot acme's ended job frees goes to acme's next; every other to globex; none
    // stays empty.
    let placed = pool.next(&mut sim, 9);
    assert_eq!(count(&placed, "globex"), 6, "{placed:?}");
    assert_eq!(pool.running.len(), 3);
    const { assert!(GROUP_HELD_BOUND < 20) };
    sim.check();
}

#[test]
fn a_tenant_forgotten_while_parked_starts_at_the_clock_when_a_reconfigure_frees_it() {
    let mut sim = Sim::with_rules(per_tenant(1));
    let mut pool = Pool::start(&mut sim, 2);
    pool.submit(&mut sim, of("acme", 0));
    pool.submit(&mut sim, of("acme", 1));
    for n in 0..8 {
        pool.submit(&mut sim, of("globex", n));
    }
    // globex runs on, its clock passes acme's pass; acme's waiting job is parked (its key
    // at its limit), out of the pass: a Tick forgets acme.
    pool.finish_of(&mut sim, "globex");
    pool.finish_of(&mut sim, "globex");
    sim.tick_after(1_000);
    assert!(
        !share(&sim).passes.contains_key("acme"),
        "{:?}",
        share(&sim)
    );
    // The limit is lifted: the rebuilt pass holds acme's job again, at the clock, and a
    // job acme submits next joins it there (Sim checks the indexes against a rebuild and
    // a replay after every input).
    sim.reconfigure(&per_tenant(100), "snap-2");
    assert_eq!(share(&sim).pass("acme"), share(&sim).clock);
    pool.submit(&mut sim, of("acme", 2));
    let placed = pool.next(&mut sim, 4);
    assert_eq!(count(&placed, "acme"), 2, "{placed:?}");
}

#[test]
fn weights_out_of_range_are_refused_with_the_tenant_named() {
    for bad in [0, ksched_core::rules::MAX_SHARE_WEIGHT + 1, u32::MAX] {
        let err = weighted(&[("acme", bad)]).validate().unwrap_err().0;
        assert!(err.contains("tenant acme: weight"), "{err}");
    }
    let mut r = weighted(&[("acme", ksched_core::rules::MAX_SHARE_WEIGHT)]);
    r.tenants.insert(
        "*".into(),
        TenantRules {
            weight: Some(2),
            ..Default::default()
        },
    );
    assert!(r.validate().is_ok());
    assert_eq!(
        (r.share_weight("acme"), r.share_weight("globex")),
        (1_000, 2)
    );
}

/// Rules giving `job.default`'s jobs their `customer` label as concurrency key; with
/// `fair` the keys take turns within their tenant's share (and have no limit), without
/// it they only count (under a limit no test reaches).
fn by_customer(fair: bool) -> Rules {
    let mut r = weighted(&[]);
    r.topic_concurrency.insert(
        "job.default".into(),
        ksched_core::rules::ConcurrencyRule {
            key: "label:customer".into(),
            limit: (!fair).then_some(1_000_000),
            rate: None,
            burst: None,
            fair,
        },
    );
    r
}

/// Job `n` of `tenant` for `customer` (none: no label).
fn for_customer(tenant: &str, n: usize, customer: Option<&str>) -> JobRequest {
    let mut j = of(tenant, n);
    if let Some(c) = customer {
        j.labels.insert("customer".into(), c.into());
        j.job_id = format!("{tenant}:{c}-{n:06}");
    }
    j
}

fn customer_of(id: &str) -> &str {
    let rest = id.split(':').nth(1).unwrap();
    rest.split_once('-').map_or("", |(c, _)| c)
}

/// acme: 500 jobs of customer `big`, then 10 of `small` and 10 without a customer.
fn big_then_small(sim: &mut Sim, pool: &mut Pool) {
    for n in 0..500 {
        pool.submit(sim, for_customer("acme", n, Some("big")));
    }
    for n in 0..10 {
        pool.submit(sim, for_customer("acme", n, Some("small")));
        pool.submit(sim, for_customer("acme", 1_000 + n, None));
    }
}

#[test]
fn a_tenants_fair_keys_take_turns() {
    let mut sim = Sim::with_rules(by_customer(true));
    sim.checking = false;
    let mut pool = Pool::start(&mut sim, 1);
    big_then_small(&mut sim, &mut pool);
    // Three turns waiting (big, small, and the jobs without a key as one): they take
    // turns, so small's 10 and the 10 without a key are placed within the next 30.
    let placed = pool.next(&mut sim, 30);
    let of_turn = |c: &str| placed.iter().filter(|id| customer_of(id) == c).count();
    assert_eq!(
        (of_turn("big"), of_turn("small"), of_turn("")),
        (10, 10, 10)
    );
    for three in placed.chunks(3) {
        let mut turns: Vec<&str> = three.iter().map(|id| customer_of(id)).collect();
        turns.sort();
        assert_eq!(turns, ["", "big", "small"], "{placed:?}");
    }
    // Queue order within each key.
    for c in ["big", "small", ""] {
        let ids: Vec<&String> = placed.iter().filter(|i| customer_of(i) == c).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    }
    // Ties between turns go by key, "" first; the placement says whose turn it was.
    assert_eq!(
        placed[..3]
            .iter()
            .map(|id| customer_of(id))
            .collect::<Vec<_>>(),
        ["", "big", "small"]
    );
    let history = sim.history("acme:small-000000");
    assert!(
        (history.iter()).any(|h| h
            .detail
            .contains("turns of tenant acme in pool default: key \"small\"")),
        "{history:?}"
    );
    sim.check();
}

#[test]
fn without_fair_a_tenants_big_key_goes_first_by_age() {
    let mut sim = Sim::with_rules(by_customer(false));
    sim.checking = false;
    let mut pool = Pool::start(&mut sim, 1);
    big_then_small(&mut sim, &mut pool);
    // Queue order (age, then job id: the 10 without a key sort first here), so `small`
    // waits for `big`'s 499.
    let placed = pool.next(&mut sim, 30);
    assert!(
        placed.iter().all(|id| customer_of(id) != "small"),
        "{placed:?}"
    );
    assert_eq!(
        placed.iter().filter(|id| customer_of(id) == "big").count(),
        20
    );
    sim.check();
}

#[test]
fn a_tenants_many_keys_take_no_more_than_its_share() {
    let mut sim = Sim::with_rules(by_customer(true));
    sim.checking = false;
    let mut pool = Pool::start(&mut sim, 1);
    // acme spreads 200 jobs over 50 customers; globex has 100 jobs without keys.
    for n in 0..200 {
        let customer = format!("c{:02}", n % 50);
        pool.submit(&mut sim, for_customer("acme", n, Some(&customer)));
    }
    for n in 0..100 {
        pool.submit(&mut sim, of("globex", n));
    }
    let placed = pool.next(&mut sim, 100);
    assert_eq!(count(&placed, "globex"), 50, "{placed:?}");
    // acme's 50 go one to each customer.
    let customers: std::collections::BTreeSet<&str> = (placed.iter())
        .filter(|id| tenant_of(id) == "acme")
        .map(|id| customer_of(id))
        .collect();
    assert_eq!(customers.len(), 50, "{customers:?}");
    sim.check();
}

#[test]
fn turns_survive_new_rules_and_are_forgotten_when_idle() {
    let mut sim = Sim::with_rules(by_customer(true));
    let mut pool = Pool::start(&mut sim, 1);
    big_then_small(&mut sim, &mut pool);
    pool.next(&mut sim, 6);
    let turns = share(&sim).turns["acme"].clone();
    assert_eq!(turns.passes.len(), 3, "{turns:?}");
    // New rules rebuild the indexes: the turns go on where they were.
    let mut r = by_customer(true);
    r.tenants.insert(
        "globex".into(),
        TenantRules {
            weight: Some(2),
            ..Default::default()
        },
    );
    sim.reconfigure(&r, "snap-2");
    assert_eq!(share(&sim).turns["acme"], turns);
    let placed = pool.next(&mut sim, 3);
    let mut turns: Vec<&str> = placed.iter().map(|id| customer_of(id)).collect();
    turns.sort();
    assert_eq!(turns, ["", "big", "small"], "{placed:?}");
    // Everything placed and run: at a Tick the tenant's turns are forgotten.
    while !pool.running.is_empty() {
        pool.finish_one(&mut sim);
    }
    sim.tick_after(1_000);
    assert!(!share(&sim).turns.contains_key("acme"), "{:?}", share(&sim));
    sim.check();
}

#[test]
fn fair_keys_need_a_label() {
    let mut r = by_customer(true);
    r.topic_concurrency.get_mut("job.default").unwrap().key = "tenant".into();
    assert!(r.validate().unwrap_err().0.contains("label:NAME"));
    let mut r = by_customer(true);
    r.topic_concurrency.get_mut("job.default").unwrap().fair = false;
    r.topic_concurrency.get_mut("job.default").unwrap().limit = None;
    assert!(r.validate().is_err(), "a rule that does nothing");
}

#[test]
fn a_pass_does_not_look_again_at_lanes_it_found_held_after_each_placement() {
    let mut sim = Sim::with_rules(weighted(&[]));
    // Four lanes no worker matches, queued before 20 jobs any worker takes.
    for n in 0..4 {
        let mut j = of("acme", n);
        j.labels.insert("node.zone".into(), format!("mars-{n}"));
        sim.submit(j);
    }
    for n in 4..24 {
        sim.submit(of("acme", n));
    }
    // A worker with ten free slots comes: one pass fills them all, each placement
    // going on from where the pass stood, not back over the held lanes (which would
    // spend the tenant's bound of held looks after one or two placements).
    let mut w = hb("w1", "default");
    w.max_parallel_jobs = 10;
    let ev = sim.heartbeat(w);
    assert_eq!(dispatched(&ev).len(), 10, "{:?}", names(&ev));
    sim.check();
}

#[test]
fn a_key_that_only_takes_turns_does_not_hold_its_jobs_behind_its_oldest() {
    let mut sim = Sim::with_rules(by_customer(true));
    // The key's oldest job asks for a zone no worker has; its others go on.
    let mut j = for_customer("acme", 0, Some("big"));
    j.labels.insert("node.zone".into(), "mars".into());
    sim.submit(j);
    for n in 1..4 {
        sim.submit(for_customer("acme", n, Some("big")));
    }
    let ev = sim.worker("w1", "default");
    assert_eq!(dispatched(&ev).len(), 3, "{:?}", names(&ev));
    sim.check();
}

#[test]
fn a_tenant_back_before_a_tick_comes_back_at_the_clock() {
    let mut sim = Sim::with_rules(weighted(&[]));
    sim.checking = false;
    let mut pool = Pool::start(&mut sim, 1);
    for n in 0..100 {
        pool.submit(&mut sim, of("acme", n));
    }
    pool.submit(&mut sim, of("globex", 0));
    pool.next(&mut sim, 2);
    // globex has nothing waiting while acme runs alone; no Tick forgets its pass.
    pool.next(&mut sim, 20);
    let (rank, clock) = (job("x").priority.rank(), share(&sim).clock);
    assert!(share(&sim).pass("globex") < clock);
    // Coming back it starts at the clock, where acme stands: acme's older job goes
    // first, then they alternate (its old pass, behind, would have put it first).
    for n in 1..5 {
        pool.submit(&mut sim, of("globex", n));
    }
    assert_eq!(sim.state.share_pass("default", rank, "globex"), clock);
    let placed = pool.next(&mut sim, 4);
    assert_eq!(
        placed.iter().map(|id| tenant_of(id)).collect::<Vec<_>>(),
        ["acme", "globex", "acme", "globex"]
    );
    sim.check();
}

#[test]
fn a_turn_already_waiting_keeps_its_pass_when_another_of_its_lanes_comes() {
    // Checked after every input: the live indexes equal a rebuild from the stored passes.
    let mut sim = Sim::with_rules(by_customer(true));
    let mut w = hb("w1", "default");
    w.max_parallel_jobs = 1;
    sim.heartbeat(w);
    // acme's jobs without a key wait (a zone no worker has) in the "" turn, at 0 with no
    // turns kept; a fair key's job is placed, which starts acme's turns.
    let mut j = for_customer("acme", 0, None);
    j.labels.insert("node.zone".into(), "mars".into());
    sim.submit(j);
    sim.submit(for_customer("acme", 1, Some("k")));
    sim.submit(for_customer("acme", 2, Some("k2")));
    // Another lane of the "" turn comes: the turn's pass stays where it stands.
    let mut j = for_customer("acme", 3, None);
    j.labels.insert("node.zone".into(), "venus".into());
    sim.submit(j);
    assert_eq!(share(&sim).turn_pass("acme", ""), 0);
    sim.check();
}
