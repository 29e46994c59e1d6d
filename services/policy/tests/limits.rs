//! Every evaluation is bounded: a policy that loops or builds a huge value stops at its step
//! or memory limit, fails closed, and says so; the process goes on.

use std::time::{Duration, Instant};

use ksched_core::events::{Reconfigure, Verdict};
use ksched_core::policy::{PolicyEngine, input_document};
use ksched_core::records::JobRequest;
use ksched_core::rules::Rules;
use ksched_policy::{PolicyBundle, RegoEngine, memory_limits_enforced};

fn bundle_with(rule: &str, steps: u32, memory: i64) -> Reconfigure {
    let bundle = PolicyBundle {
        modules: [(
            "input.rego".to_owned(),
            format!("package ksched.input\ndefault allow := true\n{rule}\n"),
        )]
        .into(),
        data_json: "{}".into(),
    };
    let mut rules = Rules::default();
    rules.limits.policy_max_steps = steps;
    rules.limits.policy_max_memory_bytes = memory;
    let rules_json = rules.to_canonical_json();
    Reconfigure {
        rules_id: format!("steps-{steps}-memory-{memory}"),
        rules_json,
        policy_modules: bundle.modules.clone(),
        policy_data_json: bundle.data_json.clone(),
        policy_snapshot: bundle.snapshot_id(),
    }
}

fn doc() -> serde_json::Value {
    let job = JobRequest {
        job_id: "j1".into(),
        topic: "job.default".into(),
        tenant_id: "acme".into(),
        ..Default::default()
    };
    input_document(&job, 0, 0, &[])
}

const DEFAULT_STEPS: u32 = 1_000_000;
const DEFAULT_MEMORY: i64 = 64 << 20;

#[test]
fn a_policy_that_loops_stops_at_its_step_limit_the_same_way_every_time() {
    // A nested comprehension: a million iterations, each several steps.
    let runaway = "deny contains \"x\" if count([1 | some i in numbers.range(1, 1000); some j in numbers.range(1, 1000)]) > 0";
    let r = bundle_with(runaway, 10_000, DEFAULT_MEMORY);
    for _ in 0..2 {
        // A fresh engine each time: no memo, the count alone decides.
        let started = Instant::now();
        let d = RegoEngine::new().evaluate_input(&r, &doc());
        assert!(d.limit_exceeded, "{d:?}");
        assert_eq!(d.verdict, Verdict::Deny);
        assert!(
            d.reasons[0].contains("more than 10000 steps (limits.policy_max_steps)"),
            "{:?}",
            d.reasons
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    // The same policy with room to finish decides normally: the limit, not the policy,
    // stopped it.
    let r = bundle_with(
        "deny contains \"x\" if count([1 | some i in numbers.range(1, 30); some j in numbers.range(1, 30)]) > 1000",
        DEFAULT_STEPS,
        DEFAULT_MEMORY,
    );
    let d = RegoEngine::new().evaluate_input(&r, &doc());
    assert!(!d.limit_exceeded && d.verdict == Verdict::Allow, "{d:?}");
}

#[test]
fn a_huge_value_stops_at_the_memory_limit_and_the_process_goes_on() {
    assert!(
        memory_limits_enforced(),
        "regorus's counting allocator is this process's"
    );
    // One step: the builtin materializes a range of 10^11 numbers. Unbounded, it takes the
    // machine's memory within a minute.
    let r = bundle_with(
        "deny contains \"x\" if count(numbers.range(1, 100000000000)) > 0",
        DEFAULT_STEPS,
        DEFAULT_MEMORY,
    );
    let started = Instant::now();
    let d = RegoEngine::new().evaluate_input(&r, &doc());
    assert!(d.limit_exceeded, "{d:?}");
    assert!(
        d.reasons[0].contains("limits.policy_max_memory_bytes"),
        "{:?}",
        d.reasons
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // The engine and the process are fine: the next evaluation decides.
    let ok = bundle_with(
        "deny contains \"y\" if input.job.tenant_id == \"globex\"",
        DEFAULT_STEPS,
        DEFAULT_MEMORY,
    );
    let d = RegoEngine::new().evaluate_input(&ok, &doc());
    assert_eq!(d.verdict, Verdict::Allow);
    assert!(!d.limit_exceeded);
}

#[test]
fn a_step_stop_is_remembered_and_a_memory_stop_is_not() {
    let engine = RegoEngine::new();
    let loops = bundle_with(
        "deny contains \"x\" if count([1 | some i in numbers.range(1, 1000); some j in numbers.range(1, 1000)]) > 0",
        1_000,
        DEFAULT_MEMORY,
    );
    engine.evaluate_input(&loops, &doc());
    engine.evaluate_input(&loops, &doc());
    let (hits, _) = engine.memo_stats();
    assert_eq!(hits, 1, "a step stop is deterministic: memoized");
    let huge = bundle_with(
        "deny contains \"x\" if count(numbers.range(1, 100000000000)) > 0",
        DEFAULT_STEPS,
        DEFAULT_MEMORY,
    );
    engine.evaluate_input(&huge, &doc());
    engine.evaluate_input(&huge, &doc());
    let (hits, _) = engine.memo_stats();
    assert_eq!(hits, 1, "a memory stop is measured: evaluated again");
}

#[test]
fn the_shipped_policies_fit_far_within_the_default_limits() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../config/policy");
    let bundle = PolicyBundle::from_dir(&dir).unwrap();
    let mut r = Reconfigure {
        rules_json: Rules::default().to_canonical_json(),
        rules_id: "defaults".into(),
        policy_modules: bundle.modules.clone(),
        policy_data_json: bundle.data_json.clone(),
        policy_snapshot: bundle.snapshot_id(),
    };
    let d = RegoEngine::new().evaluate_input(&r, &doc());
    assert!(!d.limit_exceeded && d.verdict == Verdict::Allow, "{d:?}");
    // ... with a hundredth of the default steps too.
    let mut rules = Rules::default();
    rules.limits.policy_max_steps = DEFAULT_STEPS / 100;
    r.rules_json = rules.to_canonical_json();
    r.rules_id = "hundredth".into();
    let d = RegoEngine::new().evaluate_input(&r, &doc());
    assert!(!d.limit_exceeded, "{d:?}");
}

/// A bundle compiled while another evaluation holds its memory limit compiles as it would
/// alone (regorus's parser checks the process-wide limit too): a new policy put in force on
/// one shard while another shard evaluates is never taken for a broken one.
#[test]
fn compiling_is_never_judged_by_anothers_memory_limit() {
    let huge = bundle_with(
        "deny contains \"x\" if count(numbers.range(1, 100000000000)) > 0",
        DEFAULT_STEPS,
        DEFAULT_MEMORY,
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let evaluating = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let engine = RegoEngine::new();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert!(engine.evaluate_input(&huge, &doc()).limit_exceeded);
                n += 1;
            }
            n
        })
    };
    for i in 0..200 {
        let bundle = PolicyBundle {
            modules: [(
                "input.rego".to_owned(),
                format!("package ksched.input\nallow if input.job.tenant_id != \"t{i}\"\n"),
            )]
            .into(),
            data_json: "{}".into(),
        };
        ksched_policy::compile(&bundle).unwrap_or_else(|e| panic!("compile {i}: {e}"));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(evaluating.join().unwrap() > 0);
}

/// What the default step limit means in time, printed (run with --nocapture): a figure, not
/// an assertion.
#[test]
fn how_long_the_default_step_limit_takes() {
    let r = bundle_with(
        "deny contains \"x\" if count([1 | some i in numbers.range(1, 3000); some j in numbers.range(1, 3000)]) > 0",
        DEFAULT_STEPS,
        DEFAULT_MEMORY,
    );
    let started = Instant::now();
    let d = RegoEngine::new().evaluate_input(&r, &doc());
    assert!(d.limit_exceeded, "{d:?}");
    println!(
        "{DEFAULT_STEPS} steps of a nested comprehension took {:?}",
        started.elapsed()
    );
}
