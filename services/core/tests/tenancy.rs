//! Tenant isolation from Kafka identity (docs/security.md): topics bound to tenants, job ids
//! in the tenant's namespace, default tenant limits, reports only from the worker an attempt
//! went to, heartbeats only from worker ids a pool allows.

mod support;

use ksched_core::events::*;
use ksched_core::records::ResultStatus;
use ksched_core::rules::{PoolRules, Rules, TenantRules, glob};
use support::*;

/// `job.acme` carries only acme's jobs; `job.default` any tenant's.
fn bound() -> Rules {
    let mut r = rules();
    r.topics.insert("job.acme".into(), vec!["default".into()]);
    r.topic_tenants
        .insert("job.acme".into(), vec!["acme".into()]);
    r
}

fn on_acme_topic(id: &str, tenant: &str) -> ksched_core::records::JobRequest {
    let mut j = job(id);
    j.topic = "job.acme".into();
    j.tenant_id = tenant.into();
    j
}

#[test]
fn a_job_naming_another_tenant_on_a_bound_topic_is_dead_lettered() {
    let mut sim = Sim::with_rules(bound());
    sim.worker("w1", "default");
    let ev = sim.submit(on_acme_topic("globex:j1", "globex"));
    let dl = dead_lettered(&ev);
    assert_eq!(dl.reason_code, "tenant_not_allowed");
    assert!(dl.reason.contains("tenants [acme] only"), "{}", dl.reason);
    assert!(!sim.state.jobs.contains_key("globex:j1"));
    sim.check();
}

#[test]
fn job_ids_on_a_bound_topic_are_namespaced_by_tenant() {
    let mut sim = Sim::with_rules(bound());
    sim.worker("w1", "default");
    // Outside acme's namespace: refused, so it cannot take an id another tenant will use.
    for id in ["j1", "acme", "acme:", "acmex:j1", "globex:j1"] {
        let ev = sim.submit(on_acme_topic(id, "acme"));
        assert_eq!(dead_lettered(&ev).reason_code, "tenant_not_allowed", "{id}");
    }
    let ev = sim.submit(on_acme_topic("acme:j1", "acme"));
    assert_eq!(scheduled(&ev).job_id, "acme:j1");
    sim.check();
}

#[test]
fn an_unbound_topic_carries_any_tenant_as_before() {
    let mut sim = Sim::with_rules(bound());
    sim.worker("w1", "default");
    let mut j = job("plain-id");
    j.tenant_id = "globex".into();
    assert_eq!(scheduled(&sim.submit(j)).job_id, "plain-id");
}

#[test]
fn idempotency_keys_of_two_tenants_do_not_collide() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    let mut a = job("a1");
    a.meta.idempotency_key = Some("nightly".into());
    let mut b = job("b1");
    b.tenant_id = "globex".into();
    b.meta.idempotency_key = Some("nightly".into());
    sim.submit(a);
    let ev = sim.submit(b);
    assert!(
        !names(&ev).contains(&"JobDuplicate"),
        "another tenant's key: {:?}",
        names(&ev)
    );
    assert!(sim.state.jobs.contains_key("b1"));
}

#[test]
fn the_star_tenant_holds_the_defaults_for_tenants_not_listed() {
    let mut r = rules();
    r.tenants.insert(
        "*".into(),
        TenantRules {
            max_concurrent_jobs: Some(1),
            max_pending_jobs: Some(1),
            weight: None,
        },
    );
    // Listed, with its own concurrency; its pending limit still comes from "*".
    r.tenants.insert(
        "big".into(),
        TenantRules {
            max_concurrent_jobs: Some(10),
            ..Default::default()
        },
    );
    let mut sim = Sim::with_rules(r);
    sim.worker("w1", "default");
    let unlisted = |id: &str| {
        let mut j = job(id);
        j.tenant_id = "newcomer".into();
        j
    };
    sim.submit(unlisted("n1"));
    let ev = sim.submit(unlisted("n2"));
    assert_eq!(waiting(&ev).reason_code, "tenant_limit");
    // n2 is pending; the default pending limit of 1 refuses a third.
    let ev = sim.submit(unlisted("n3"));
    assert_eq!(dead_lettered(&ev).reason_code, "queue_full");

    let big = |id: &str| {
        let mut j = job(id);
        j.tenant_id = "big".into();
        j
    };
    sim.submit(big("b1"));
    let ev = sim.submit(big("b2"));
    assert_eq!(scheduled(&ev).job_id, "b2", "big's own limit is 10");
    sim.check();
}

#[test]
fn a_result_from_a_worker_the_attempt_does_not_run_on_is_refused() {
    let mut sim = Sim::new();
    sim.worker("w1", "default");
    sim.worker("w2", "default");
    let ev = sim.submit(job("j1"));
    let worker = scheduled(&ev).worker_id.clone();
    let other = if worker == "w1" { "w2" } else { "w1" };
    sim.started("j1", 1, &worker);

    let ev = sim.result("j1", 1, other, ResultStatus::Succeeded);
    let r = rejected(&ev);
    assert_eq!(r.reason_code, "not_assigned_worker");
    assert!(r.reason.contains(&worker), "{}", r.reason);
    assert_eq!(sim.job_state("j1"), JobState::Running);
    // Nor may it report progress.
    let ev = sim.input(
        "ksched.results",
        Input::Progress(ksched_core::records::JobProgress {
            job_id: "j1".into(),
            attempt: 1,
            worker_id: other.into(),
            progress: 0.9,
            message: None,
            sent_at: sim.now,
        }),
    );
    assert_eq!(rejected(&ev).reason_code, "not_assigned_worker");

    let ev = sim.result("j1", 1, &worker, ResultStatus::Succeeded);
    assert!(names(&ev).contains(&"JobSucceeded"), "{:?}", names(&ev));
    sim.check();
}

#[test]
fn a_dispatched_attempt_may_be_started_by_another_live_worker_of_its_pool_only() {
    let mut r = rules();
    r.topics.insert("job.gpu".into(), vec!["gpu".into()]);
    let mut sim = Sim::with_rules(r);
    sim.worker("w1", "default");
    sim.worker("g1", "gpu");
    sim.submit(job("j1"));
    // A worker of another pool, and a worker never heard of, cannot take it.
    for stranger in ["g1", "nobody"] {
        let ev = sim.started("j1", 1, stranger);
        assert_eq!(
            rejected(&ev).reason_code,
            "not_assigned_worker",
            "{stranger}"
        );
    }
    assert_eq!(sim.job_state("j1"), JobState::Dispatched);
    // A worker of the pool that took the dispatch partition over in a rebalance can.
    sim.worker("w2", "default");
    let ev = sim.started("j1", 1, "w2");
    let running = find(&ev, |e| match e {
        Event::JobRunning(r) => Some(r),
        _ => None,
    });
    assert_eq!(running.reassigned_from.as_deref(), Some("w1"));
    sim.check();
}

#[test]
fn heartbeats_for_a_pool_come_only_from_the_worker_ids_it_allows() {
    let mut r = rules();
    r.pools.insert(
        "gpu".into(),
        PoolRules {
            requires: vec!["gpu".into()],
            workers: vec!["gpu-*".into(), "trusted".into()],
            ..Default::default()
        },
    );
    let mut sim = Sim::with_rules(r);
    let ev = sim.worker("cpu-1", "gpu");
    let r = rejected(&ev);
    assert_eq!(r.reason_code, "invalid_heartbeat");
    assert!(r.reason.contains("cpu-1"), "{}", r.reason);
    assert!(!sim.state.workers.contains_key("cpu-1"));
    for ok in ["gpu-7", "trusted"] {
        let ev = sim.worker(ok, "gpu");
        assert!(
            names(&ev).contains(&"WorkerUpdated"),
            "{ok}: {:?}",
            names(&ev)
        );
    }
    // Pools without patterns take any id.
    assert!(names(&sim.worker("anyone", "default")).contains(&"WorkerUpdated"));
}

#[test]
fn glob_patterns() {
    assert!(glob("gpu-*", "gpu-1"));
    assert!(glob("gpu-*", "gpu-"));
    assert!(!glob("gpu-*", "cpu-1"));
    assert!(glob("*-east-*", "w-east-3"));
    assert!(!glob("*-east-*", "w-west-3"));
    assert!(glob("a*b*c", "abc"));
    assert!(!glob("a*b*c", "acb"));
    assert!(glob("*", ""));
    assert!(glob("exact", "exact"));
    assert!(!glob("exact", "exactly"));
    assert!(!glob("ab*ba", "aba"), "prefix and suffix may not overlap");
}

#[test]
fn tenant_bindings_are_validated() {
    let mut r = bound();
    r.topic_tenants
        .insert("job.acme".into(), vec!["ac:me".into()]);
    assert!(r.validate().unwrap_err().0.contains("ac:me"));
    let mut r = bound();
    r.topic_tenants
        .insert("job.nowhere".into(), vec!["acme".into()]);
    assert!(r.validate().unwrap_err().0.contains("job.nowhere"));
    let mut r = bound();
    r.topic_tenants.insert("job.acme".into(), vec![]);
    assert!(r.validate().is_err());
    let mut r = rules();
    r.tenants.insert("*".into(), TenantRules::default());
    assert!(r.validate().is_ok(), "\"*\" holds the defaults");
}
