//! Properties over random input sequences:
//! - replaying the journal from an empty state equals the live state (checked after every
//!   input by `Sim::check`, together with the index invariants: no job both terminal and
//!   queued, tenant counts never negative, in-flight sets agree with job records);
//! - at most one Dispatch per (job, attempt);
//! - a terminal job never changes state again, except SUCCEEDED -> OUTPUT_QUARANTINED;
//! - decide is deterministic: the same inputs give the same journal, byte for byte.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use ksched_core::events::*;
use ksched_core::policy::{OutputDecision, PolicyDecision};
use ksched_core::records::*;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use support::*;

#[derive(Debug, Clone)]
enum Op {
    Submit {
        job: u8,
        topic: u8,
        priority: u8,
        risk: u8,
        key: Option<u8>,
        deadline: Option<u16>,
        /// Run no earlier than this many tenths of a second from now (SPEC §9).
        delay: Option<u16>,
        /// Its `concurrency_key` label (SPEC §10).
        ckey: Option<u8>,
        /// Its tenant ([`TENANTS`]): tenants share pools by weight (SPEC §10 fair share).
        tenant: u8,
        /// Its `unique_key` and `debounce_key` labels (SPEC §10): `job.multi` is unique by
        /// the one, `job.default` debounced by the other.
        fkey: Option<u8>,
        /// What it depends on (SPEC §11): one or two jobs, a condition, a timeout in seconds.
        deps: Option<(u8, u8, u8, u8)>,
        /// Its batch (SPEC §11): one of two batches of three, as a member (role 0 or 1) or a
        /// callback (role 2).
        batch: Option<(u8, u8)>,
    },
    Heartbeat {
        worker: u8,
        pool: u8,
        cpu: u8,
        max: u8,
        draining: bool,
    },
    Started {
        job: u8,
        worker: u8,
        attempt_delta: i8,
    },
    Progress {
        job: u8,
        worker: u8,
    },
    Result {
        job: u8,
        worker: u8,
        status: u8,
        attempt_delta: i8,
    },
    Cancel {
        job: u8,
        foreign: bool,
    },
    Approve {
        job: u8,
        good: bool,
    },
    Reject {
        job: u8,
    },
    /// A redrive of job `job` as `j<to>`: ids 12..16 are free until taken, lower ones are
    /// submitted jobs' (taken).
    Redrive {
        job: u8,
        to: u8,
    },
    Tick {
        ms: u32,
    },
    /// A reschedule of job `job` to this many tenths of a second from now.
    Reschedule {
        job: u8,
        delay: u16,
    },
    /// A command about schedule `s<schedule>`: create (an interval of `interval` seconds,
    /// with overlap and catch-up `policy`), pause, resume, trigger or delete.
    Schedule {
        schedule: u8,
        action: u8,
        interval: u8,
        policy: u8,
    },
    Malformed,
    /// The concurrency limits change (0: none), and the rate limits (0: none, 1: one a
    /// second, 2: three per two seconds with a burst of two).
    Limit {
        limit: u8,
        rate: u8,
    },
    /// New rules: timeouts and initech's weight change, which index queued jobs as before
    /// (the backlog in storage is not read back), and the lanes' windows, which do not
    /// (see [`run_rules`]).
    Tune {
        tune: u8,
    },
    /// The processor stops and starts again from its storage: it reads the jobs that are
    /// not queued, and the queued ones' counts only.
    Restart,
    /// An operator cancels one of the two batches.
    CancelBatch {
        batch: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..12u8, 0..4u8, 0..3u8, 0..6u8, proptest::option::of(0..3u8), proptest::option::of(1..600u16), proptest::option::of(0..600u16), proptest::option::of(0..3u8), 0..3u8, proptest::option::of(0..2u8), proptest::option::weighted(0.3, (0..12u8, 0..12u8, 0..3u8, 1..60u8)), proptest::option::weighted(0.3, (0..2u8, 0..3u8)))
            .prop_map(|(job, topic, priority, risk, key, deadline, delay, ckey, tenant, fkey, deps, batch)| Op::Submit { job, topic, priority, risk, key, deadline, delay, ckey, tenant, fkey, deps, batch }),
        2 => (0..4u8, 0..4u8, 0..100u8, 0..4u8, any::<bool>())
            .prop_map(|(worker, pool, cpu, max, draining)| Op::Heartbeat { worker, pool, cpu, max, draining: draining && worker == 3 }),
        2 => (0..12u8, 0..4u8, -1..2i8).prop_map(|(job, worker, attempt_delta)| Op::Started { job, worker, attempt_delta }),
        1 => (0..12u8, 0..4u8).prop_map(|(job, worker)| Op::Progress { job, worker }),
        3 => (0..12u8, 0..4u8, 0..5u8, -1..2i8).prop_map(|(job, worker, status, attempt_delta)| Op::Result { job, worker, status, attempt_delta }),
        1 => (0..12u8, any::<bool>()).prop_map(|(job, foreign)| Op::Cancel { job, foreign }),
        1 => (0..12u8, any::<bool>()).prop_map(|(job, good)| Op::Approve { job, good }),
        1 => (0..12u8).prop_map(|job| Op::Reject { job }),
        1 => (0..16u8, 0..16u8).prop_map(|(job, to)| Op::Redrive { job, to }),
        3 => (0..40_000u32).prop_map(|ms| Op::Tick { ms }),
        1 => (0..12u8, 0..600u16).prop_map(|(job, delay)| Op::Reschedule { job, delay }),
        1 => (0..3u8, 0..6u8, 1..30u8, 0..12u8).prop_map(|(schedule, action, interval, policy)| Op::Schedule { schedule, action, interval, policy }),
        1 => Just(Op::Malformed),
        1 => (0..4u8, 0..3u8).prop_map(|(limit, rate)| Op::Limit { limit, rate }),
        1 => Just(Op::Restart),
        1 => (0..2u8).prop_map(|batch| Op::CancelBatch { batch }),
        1 => (0..4u8).prop_map(|tune| Op::Tune { tune }),
    ]
}

fn policy() -> ScriptPolicy {
    let mut p = ScriptPolicy::default();
    p.input.push(Box::new(|doc| {
        let risk = doc["job"]["labels"]["risk"].as_str()?;
        Some(match risk {
            "deny" => PolicyDecision {
                limit_exceeded: false,
                verdict: Verdict::Deny,
                reasons: vec!["no".into()],
                constraints: Constraints::default(),
            },
            "approve" => PolicyDecision {
                limit_exceeded: false,
                verdict: Verdict::RequireApproval,
                reasons: vec!["human".into()],
                constraints: Constraints::default(),
            },
            _ => PolicyDecision {
                limit_exceeded: false,
                verdict: Verdict::Allow,
                reasons: vec![],
                constraints: Constraints {
                    max_retries: Some(1),
                    max_concurrent_jobs: Some(3),
                    ..Default::default()
                },
            },
        })
    }));
    p.output.push(Box::new(|doc| {
        (doc["job"]["labels"]["risk"].as_str() == Some("pii")).then(|| OutputDecision {
            limit_exceeded: false,
            quarantine: true,
            reasons: vec!["pii".into()],
        })
    }));
    p
}

const TOPICS: [&str; 4] = ["job.default", "job.multi", "job.gpu", "job.unmapped"];
const POOLS: [&str; 4] = ["default", "a", "b", "gpu"];
/// Two of three jobs are acme's (the tenant sagas and schedules use).
const TENANTS: [&str; 3] = ["acme", "acme", "initech"];
const RISKS: [&str; 6] = ["", "", "deny", "approve", "limited", "pii"];

/// The rules of a run, with concurrency limits of `limit` (0: none) and rate limits as
/// [`Op::Limit`] says: `job.default` by its `concurrency_key` label, `job.multi` one key per
/// tenant. initech weighs 3 in fair share when `limit` is even, 1 when odd, `tune` more.
/// Three pools age. `job.default`'s keys are fair between themselves unless `limit` is 2.
/// `tune` also shortens the placement timeout and lengthens the dispatch timeout, and from
/// 2 on widens the lanes' windows.
fn run_rules(limit: u8, rate: u8, tune: u8) -> ksched_core::rules::Rules {
    let mut r = rules();
    r.breaker.consecutive_failures = 3;
    r.breaker.window = 6;
    r.breaker.cooldown_ms = 5_000;
    r.timing.dispatch_timeout_ms = 20_000 + 5_000 * i64::from(tune);
    r.timing.placement_timeout_ms = 60_000 - 15_000 * i64::from(tune);
    r.limits.max_concurrency_keys = 2;
    // Lanes' windows of three jobs (four when `tune` is 2 or 3): placements read queued
    // records back from storage.
    r.limits.max_work_per_entry = 2 + u32::from(tune / 2);
    // Lanes keep 4 keys in memory, 8 at most: longer ones are read back from the store.
    r.limits.lane_keys_in_memory = 1;
    r.topic_unique.insert(
        "job.multi".into(),
        ksched_core::rules::UniqueRule {
            key: "label:unique_key".into(),
            window: "2s".into(),
        },
    );
    r.topic_debounce.insert(
        "job.default".into(),
        ksched_core::rules::DebounceRule {
            key: "label:debounce_key".into(),
            wait: "300ms".into(),
            max_wait: Some("1s".into()),
        },
    );
    // Jobs in `default`, `a` and `b` gain a priority a second they wait: up to CRITICAL
    // when `rate` is even, INTERACTIVE when odd.
    for pool in ["default", "a", "b"] {
        r.pools.get_mut(pool).unwrap().aging = Some(ksched_core::rules::AgingRule {
            after: "1s".into(),
            up_to: if rate.is_multiple_of(2) {
                Priority::Critical
            } else {
                Priority::Interactive
            },
        });
    }
    r.tenants.insert(
        "initech".into(),
        ksched_core::rules::TenantRules {
            weight: Some(if limit.is_multiple_of(2) { 3 } else { 1 } + u32::from(tune)),
            ..Default::default()
        },
    );
    let (rate, burst) = match rate {
        1 => (Some("1/s".to_owned()), Some(1)),
        2 => (Some("3/2s".to_owned()), Some(2)),
        _ => (None, None),
    };
    // `job.default`'s keys take turns within their tenant's share unless `limit` is 2 (with
    // no limit and no rate: only that).
    for (topic, key, fair) in [
        ("job.default", "label:concurrency_key", limit != 2),
        ("job.multi", "tenant", false),
    ] {
        if limit > 0 || rate.is_some() || fair {
            r.topic_concurrency.insert(
                topic.into(),
                ksched_core::rules::ConcurrencyRule {
                    key: key.into(),
                    limit: (limit > 0).then_some(u32::from(limit)),
                    rate: rate.clone(),
                    burst,
                    fair,
                },
            );
        }
    }
    r
}

fn run(ops: &[Op]) -> Sim {
    let mut sim = Sim::with_policy(run_rules(1, 0, 0), policy());
    // The rules in force: (limit, rate, tune).
    let mut rules_of = (1, 0, 0);
    for op in ops {
        sim.advance(7);
        match op.clone() {
            Op::Submit {
                job: j,
                topic,
                priority,
                risk,
                key,
                deadline,
                delay,
                ckey,
                tenant,
                fkey,
                deps,
                batch,
            } => {
                let mut req = job(&format!("j{j}"));
                match batch {
                    Some((b, 2)) => req.after_batch = Some(format!("b{b}")),
                    Some((b, _)) => {
                        req.batch_id = Some(format!("b{b}"));
                        req.batch_size = Some(3);
                    }
                    None => {}
                }
                if let Some((a, b, condition, timeout)) = deps {
                    req.depends_on = vec![format!("j{a}")];
                    if b != a {
                        req.depends_on.push(format!("j{b}"));
                    }
                    req.dependency_condition = [
                        DependencyCondition::AllSucceeded,
                        DependencyCondition::AllTerminal,
                        DependencyCondition::AnySucceeded,
                    ][condition as usize];
                    req.dependency_timeout_ms = Some(i64::from(timeout) * 1_000);
                }
                req.tenant_id = TENANTS[tenant as usize].into();
                if let Some(c) = ckey {
                    req.labels.insert("concurrency_key".into(), format!("c{c}"));
                }
                if let Some(f) = fkey {
                    req.labels.insert("unique_key".into(), format!("f{f}"));
                    req.labels.insert("debounce_key".into(), format!("f{f}"));
                }
                req.not_before = delay.map(|d| sim.now + i64::from(d) * 100);
                req.topic = TOPICS[topic as usize].into();
                req.priority =
                    [Priority::Critical, Priority::Interactive, Priority::Batch][priority as usize];
                if !RISKS[risk as usize].is_empty() {
                    req.labels
                        .insert("risk".into(), RISKS[risk as usize].into());
                }
                req.meta.idempotency_key = key.map(|k| format!("k{k}"));
                req.budget.deadline_ms = deadline.map(|d| i64::from(d) * 100);
                if topic == 2 {
                    req.meta.requires = vec!["gpu".into()];
                }
                req.workflow_id = (j % 3 == 0).then(|| "wf".to_owned());
                req.compensation = (j % 3 == 0).then(|| {
                    Box::new(JobTemplate {
                        topic: "job.default".into(),
                        ..Default::default()
                    })
                });
                req.submitted_at = sim.now;
                let topic = req.topic.clone();
                sim.input(&topic, Input::Submit(req));
            }
            Op::Heartbeat {
                worker,
                pool,
                cpu,
                max,
                draining,
            } => {
                let mut h = hb(&format!("w{worker}"), POOLS[pool as usize]);
                h.cpu_load = f64::from(cpu);
                h.max_parallel_jobs = i32::from(max);
                h.draining = draining;
                sim.heartbeat(h);
            }
            Op::Started {
                job,
                worker,
                attempt_delta,
            } => {
                let id = format!("j{job}");
                let attempt = current_attempt(&sim, &id) + i32::from(attempt_delta);
                sim.started(&id, attempt, &format!("w{worker}"));
            }
            Op::Progress { job, worker } => {
                let id = format!("j{job}");
                let attempt = current_attempt(&sim, &id);
                sim.input(
                    "ksched.results",
                    Input::Progress(JobProgress {
                        job_id: id,
                        attempt,
                        worker_id: format!("w{worker}"),
                        progress: 0.5,
                        message: None,
                        sent_at: 0,
                    }),
                );
            }
            Op::Result {
                job,
                worker,
                status,
                attempt_delta,
            } => {
                let id = format!("j{job}");
                let attempt = current_attempt(&sim, &id) + i32::from(attempt_delta);
                let status = [
                    ResultStatus::Succeeded,
                    ResultStatus::Succeeded,
                    ResultStatus::FailedRetryable,
                    ResultStatus::FailedFatal,
                    ResultStatus::Cancelled,
                ][status as usize];
                sim.result(&id, attempt, &format!("w{worker}"), status);
            }
            Op::Cancel { job, foreign } => {
                sim.cancel(
                    &format!("j{job}"),
                    Some(if foreign { "globex" } else { "acme" }),
                );
            }
            Op::Approve { job, good } => {
                let id = format!("j{job}");
                let (hash, snap) = sim
                    .state
                    .jobs
                    .get(&id)
                    .map(|j| {
                        (
                            j.job_hash.clone(),
                            j.policy_snapshot.clone().unwrap_or_default(),
                        )
                    })
                    .unwrap_or_default();
                sim.input(
                    "ksched.control",
                    Input::Approve(ApproveJob {
                        job_id: id,
                        job_hash: if good { hash } else { "x".into() },
                        policy_snapshot: snap,
                        approver: "bob".into(),
                        comment: None,
                        requested_at: 0,
                    }),
                );
            }
            Op::Reject { job } => {
                sim.input(
                    "ksched.control",
                    Input::Reject(RejectJob {
                        job_id: format!("j{job}"),
                        approver: "bob".into(),
                        reason: None,
                        requested_at: 0,
                    }),
                );
            }
            Op::Redrive { job, to } => {
                sim.input(
                    "ksched.control",
                    Input::Redrive(RedriveJob {
                        job_id: format!("j{job}"),
                        new_job_id: format!("j{to}"),
                        tenant_id: None,
                        principal_id: "op".into(),
                        reason: None,
                        requested_at: 0,
                    }),
                );
            }
            Op::Tick { ms } => {
                // A jump: scenarios of every length, gaps (ClockGap) included.
                sim.gap(i64::from(ms));
                sim.tick_now();
            }
            Op::Reschedule { job, delay } => {
                let not_before = sim.now + i64::from(delay) * 100;
                sim.input(
                    "ksched.control",
                    Input::Reschedule(RescheduleJob {
                        job_id: format!("j{job}"),
                        not_before,
                        tenant_id: None,
                        principal_id: "op".into(),
                        reason: None,
                        requested_at: 0,
                    }),
                );
            }
            Op::Schedule {
                schedule,
                action,
                interval,
                policy,
            } => {
                let action = [
                    ScheduleAction::Create,
                    ScheduleAction::Update,
                    ScheduleAction::Pause,
                    ScheduleAction::Resume,
                    ScheduleAction::Trigger,
                    ScheduleAction::Delete,
                ][usize::from(action)];
                let spec = ScheduleSpec {
                    interval_ms: Some(i64::from(interval) * 1_000),
                    template: JobTemplate {
                        topic: "job.default".into(),
                        ..Default::default()
                    },
                    overlap: [
                        ScheduleOverlap::Skip,
                        ScheduleOverlap::BufferOne,
                        ScheduleOverlap::AllowAll,
                        ScheduleOverlap::CancelPrevious,
                    ][usize::from(policy % 4)],
                    catch_up: [
                        ScheduleCatchUp::None,
                        ScheduleCatchUp::Last,
                        ScheduleCatchUp::All,
                    ][usize::from(policy / 4)],
                    catch_up_window_ms: 20_000,
                    jitter_ms: i64::from(policy % 3) * 1_500,
                    ..Default::default()
                };
                let now = sim.now;
                sim.input(
                    "ksched.control",
                    Input::Schedule(ScheduleCommand {
                        schedule_id: format!("s{schedule}"),
                        tenant_id: "acme".into(),
                        action,
                        spec: matches!(action, ScheduleAction::Create | ScheduleAction::Update)
                            .then_some(spec),
                        principal_id: "alice".into(),
                        reason: None,
                        requested_at: now,
                    }),
                );
            }
            Op::Limit { limit, rate } => {
                rules_of = (limit, rate, rules_of.2);
                sim.reconfigure(&run_rules(limit, rate, rules_of.2), "snap-1");
            }
            Op::Tune { tune } => {
                rules_of.2 = tune;
                let (limit, rate, tune) = rules_of;
                sim.reconfigure(&run_rules(limit, rate, tune), "snap-1");
            }
            Op::Restart => sim.restart(),
            Op::CancelBatch { batch } => {
                sim.cancel_batch("acme", &format!("b{batch}"));
            }
            Op::Malformed => {
                sim.input(
                    "job.default",
                    Input::Malformed(MalformedRecord {
                        key: None,
                        size_bytes: 1,
                        error: "junk".into(),
                        ..Default::default()
                    }),
                );
            }
        }
    }
    sim
}

fn current_attempt(sim: &Sim, id: &str) -> i32 {
    sim.state.jobs.get(id).map_or(1, |j| j.attempt)
}

proptest! {
    // The checked-in regressions (properties.proptest-regressions, beside this file) run
    // first, every time.
    // PROPTEST_CASES sets how many random histories a run tries (256 unless set).
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn replay_equals_live_and_invariants_hold(ops in proptest::collection::vec(op(), 1..120)) {
        // Sim::check asserts replay == live and the index invariants after every input.
        let sim = run(&ops);

        // At most one Dispatch per (job, attempt).
        let mut seen = BTreeSet::new();
        for d in sim.dispatches() {
            prop_assert!(seen.insert((d.job.job_id.clone(), d.attempt)), "dispatched twice: {} #{}", d.job.job_id, d.attempt);
        }

        // Terminal means terminal (but SUCCEEDED -> OUTPUT_QUARANTINED), and every change
        // follows the transition table.
        let mut last: BTreeMap<String, JobState> = BTreeMap::new();
        let mut bad = Vec::new();
        let mut buckets = BTreeMap::new();
        sim.replay_each(|replay, e| {
            // A placement takes a token only from a bucket that had one (SPEC §10): the
            // key's bucket as the event before left it frees no later than now.
            if let Event::JobScheduled(p) = e
                && let Some(j) = replay.jobs.get(&p.job_id)
                && let Some(c) = j.concurrency.as_ref().filter(|c| c.rate.is_some())
            {
                let k = (j.request.tenant_id.clone(), c.key.clone(), c.rate.unwrap());
                if let Some(b) = buckets.get(&k).filter(|b: &&ksched_core::state::Bucket| b.free_at() > replay.clock) {
                    bad.push(format!("{}: key {:?} placed at {} with its rate spent until {}", p.job_id, c.key, replay.clock, b.free_at()));
                }
            }
            buckets.clone_from(&replay.buckets);
            // A placement never takes a concurrency key past its job's limit (SPEC §10),
            // counted from the job records.
            if let Event::JobScheduled(p) = e
                && let Some(j) = replay.jobs.get(&p.job_id)
                && let Some(c) = &j.concurrency
            {
                let active = (replay.jobs.iter_any_order())
                    .filter(|(_, o)| o.state.is_active() && o.request.tenant_id == j.request.tenant_id)
                    .filter(|(_, o)| o.concurrency.as_ref().is_some_and(|k| k.key == c.key))
                    .count();
                if active > c.limit as usize {
                    bad.push(format!("{}: key {:?} has {active} active, limit {}", p.job_id, c.key, c.limit));
                }
            }
            if let Some(id) = e.job_id() && let Some(j) = replay.jobs.get(id) {
                if let Some(prev) = last.get(id) && *prev != j.state && !prev.can_transition(j.state) {
                    bad.push(format!("{id}: {prev} -> {}", j.state));
                }
                last.insert(id.to_owned(), j.state);
            }
        });
        prop_assert!(bad.is_empty(), "transitions outside the table: {bad:?}");
        // The tenant index is the tenant's active jobs, counted from the jobs themselves.
        let mut counted = std::collections::BTreeMap::<String, i64>::new();
        for (_, j) in (sim.state.jobs.iter_any_order()).filter(|(_, j)| j.state.is_active()) {
            *counted.entry(j.request.tenant_id.clone()).or_default() += 1;
        }
        prop_assert_eq!(&sim.state.tenant_active, &counted);
    }

    #[test]
    fn decide_is_deterministic(ops in proptest::collection::vec(op(), 1..60)) {
        let a = run(&ops);
        let b = run(&ops);
        prop_assert_eq!(format!("{:?}", a.journal), format!("{:?}", b.journal));
        prop_assert_eq!(format!("{:?}", a.outputs), format!("{:?}", b.outputs));
    }
}
