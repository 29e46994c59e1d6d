//! The Rego engine against the shipped policies in config/policy/ and their examples.

use std::path::PathBuf;

use ksched_core::events::{Reconfigure, Verdict};
use ksched_core::policy::{PolicyEngine, input_document, output_document};
use ksched_core::records::{JobRequest, Priority, ResultMeta};
use ksched_policy::{Error, PolicyBundle, RegoEngine};

fn config_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../config/policy")
}

fn reconfigure(bundle: &PolicyBundle) -> Reconfigure {
    Reconfigure {
        policy_modules: bundle.modules.clone(),
        policy_data_json: bundle.data_json.clone(),
        policy_snapshot: bundle.snapshot_id(),
        ..Default::default()
    }
}

/// The commented example in a shipped policy file, made active.
fn activate_example(text: &str, drop_line: Option<&str>) -> String {
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("# --- example") {
            inside = true;
            continue;
        }
        if line.starts_with("# --- end of example") {
            inside = false;
            continue;
        }
        if drop_line == Some(line) {
            continue;
        }
        out.push(if inside {
            line.strip_prefix("# ")
                .or(line.strip_prefix("#"))
                .unwrap_or(line)
        } else {
            line
        });
    }
    out.join("\n")
}

fn job(env: &str, tags: &[&str], priority: Priority) -> JobRequest {
    let mut j = JobRequest {
        job_id: "j1".into(),
        topic: "job.default".into(),
        tenant_id: "acme".into(),
        priority,
        ..Default::default()
    };
    j.labels.insert("env".into(), env.into());
    j.meta.risk_tags = tags.iter().map(|s| (*s).to_owned()).collect();
    j
}

#[test]
fn the_shipped_policies_are_permissive() {
    let bundle = PolicyBundle::from_dir(&config_dir()).unwrap();
    assert_eq!(bundle.modules.len(), 2);
    let r = reconfigure(&bundle);
    let engine = RegoEngine::new();
    let d = engine.evaluate_input(
        &r,
        &input_document(&job("prod", &["destructive"], Priority::Batch), 0, 0, &[]),
    );
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(d.constraints, Default::default());
    let mut meta = ResultMeta::default();
    meta.labels.insert("contains_pii".into(), "true".into());
    let o = engine.evaluate_output(
        &r,
        &output_document(&job("prod", &[], Priority::Batch), 0, "w1", None, &meta, 1),
    );
    assert!(!o.quarantine);
}

#[test]
fn the_commented_input_example_denies_requires_approval_and_sets_constraints() {
    let text = std::fs::read_to_string(config_dir().join("input.rego")).unwrap();
    let mut bundle = PolicyBundle::default();
    bundle
        .modules
        .insert("input.rego".into(), activate_example(&text, None));
    bundle.data_json = "{}".into();
    ksched_policy::compile(&bundle).unwrap();
    let r = reconfigure(&bundle);
    let engine = RegoEngine::new();

    let d = engine.evaluate_input(
        &r,
        &input_document(
            &job("prod", &["destructive"], Priority::Interactive),
            0,
            0,
            &[],
        ),
    );
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.reasons, ["destructive jobs are not allowed in prod"]);

    let d = engine.evaluate_input(
        &r,
        &input_document(&job("prod", &[], Priority::Interactive), 0, 0, &[]),
    );
    assert_eq!(d.verdict, Verdict::RequireApproval);
    assert_eq!(d.reasons, ["job j1 touches prod"]);

    let d = engine.evaluate_input(
        &r,
        &input_document(&job("dev", &[], Priority::Batch), 0, 0, &[]),
    );
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(d.constraints.max_retries, Some(1));
    assert_eq!(d.constraints.max_runtime_ms, Some(600_000));
    assert_eq!(d.constraints.labels["placement.zone"], "eu");

    let d = engine.evaluate_input(
        &r,
        &input_document(&job("dev", &[], Priority::Critical), 0, 0, &[]),
    );
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(d.constraints, Default::default());
}

#[test]
fn the_commented_output_example_quarantines() {
    let text = std::fs::read_to_string(config_dir().join("output.rego")).unwrap();
    let mut bundle = PolicyBundle::default();
    bundle.modules.insert(
        "output.rego".into(),
        activate_example(&text, Some("quarantine := set()")),
    );
    bundle.data_json = "{}".into();
    let r = reconfigure(&bundle);
    let engine = RegoEngine::new();
    let mut meta = ResultMeta::default();
    meta.labels.insert("contains_pii".into(), "true".into());
    meta.size_bytes = Some(2 << 30);
    let o = engine.evaluate_output(
        &r,
        &output_document(&job("dev", &[], Priority::Batch), 0, "w1", None, &meta, 1),
    );
    assert!(o.quarantine);
    assert_eq!(o.reasons.len(), 2, "{:?}", o.reasons);
    let clean = engine.evaluate_output(
        &r,
        &output_document(
            &job("dev", &[], Priority::Batch),
            0,
            "w1",
            None,
            &ResultMeta::default(),
            1,
        ),
    );
    assert!(!clean.quarantine);
}

/// The processor asks with a document built on demand: a policy that reads nothing of its
/// input has it built once, for its first evaluation (memoized after); one that reads it
/// answers as it does with the ready document.
#[test]
fn a_document_is_built_only_for_rules_that_read_it() {
    let built = std::cell::Cell::new(0);
    let j = job("prod", &["pii"], Priority::Batch);
    let doc = || {
        built.set(built.get() + 1);
        input_document(&j, 0, 0, &[])
    };

    let mut blind = PolicyBundle::default();
    blind.modules.insert(
        "input.rego".into(),
        "package ksched.input\ndefault allow := true\n".into(),
    );
    blind.data_json = "{}".into();
    let engine = RegoEngine::new();
    for _ in 0..5 {
        let d = engine.evaluate_input_lazily(&reconfigure(&blind), &doc);
        assert_eq!(d.verdict, Verdict::Allow);
        // No output package: nothing to quarantine, nothing to build.
        let o = engine.evaluate_output_lazily(&reconfigure(&blind), &doc);
        assert!(!o.quarantine);
    }
    assert_eq!(
        built.get(),
        1,
        "a policy that reads no input needs one document"
    );

    // An input policy that reads the job, and no output package: the output document is
    // never built.
    let mut reading = PolicyBundle::default();
    reading.modules.insert(
        "input.rego".into(),
        "package ksched.input\nallow if input.job.tenant_id == \"acme\"\n".into(),
    );
    reading.data_json = "{}".into();
    let engine = RegoEngine::new();
    let o = engine.evaluate_output_lazily(&reconfigure(&reading), &doc);
    assert!(!o.quarantine);
    assert_eq!(built.get(), 1, "no output package, no output document");

    let shipped = reconfigure(&PolicyBundle::from_dir(&config_dir()).unwrap());
    let engine = RegoEngine::new();
    let lazy = engine.evaluate_input_lazily(&shipped, &doc);
    assert_eq!(built.get(), 2);
    let ready = RegoEngine::new().evaluate_input(&shipped, &input_document(&j, 0, 0, &[]));
    assert_eq!(lazy, ready);
}

#[test]
fn decisions_are_memoized_per_snapshot_and_input() {
    let bundle = PolicyBundle::from_dir(&config_dir()).unwrap();
    let r = reconfigure(&bundle);
    let engine = RegoEngine::new();
    let doc = input_document(&job("dev", &[], Priority::Batch), 0, 0, &[]);
    engine.evaluate_input(&r, &doc);
    engine.evaluate_input(&r, &doc);
    assert_eq!(engine.memo_stats(), (1, 1));
    let mut other = r.clone();
    other.policy_snapshot = "different".into();
    engine.evaluate_input(&other, &doc);
    assert_eq!(
        engine.memo_stats(),
        (1, 2),
        "another snapshot is another key"
    );
}

#[test]
fn no_allow_rule_means_default_deny_and_errors_fail_closed() {
    let mut bundle = PolicyBundle::default();
    bundle.modules.insert(
        "p.rego".into(),
        "package ksched.input\nallow if input.job.labels.team == \"core\"\n".into(),
    );
    bundle.data_json = "{}".into();
    let r = reconfigure(&bundle);
    let engine = RegoEngine::new();
    let d = engine.evaluate_input(
        &r,
        &input_document(&job("dev", &[], Priority::Batch), 0, 0, &[]),
    );
    assert_eq!(d.verdict, Verdict::Deny);
    assert!(d.reasons[0].contains("default deny"), "{:?}", d.reasons);

    let mut broken = PolicyBundle::default();
    broken.modules.insert(
        "p.rego".into(),
        "package ksched.input\nallow := 1 / 0\n".into(),
    );
    broken.data_json = "{}".into();
    let d = engine.evaluate_input(
        &reconfigure(&broken),
        &input_document(&job("dev", &[], Priority::Batch), 0, 0, &[]),
    );
    assert_eq!(d.verdict, Verdict::Deny);
}

#[test]
fn a_bundle_that_does_not_compile_says_where() {
    let dir = tempdir();
    std::fs::write(dir.join("bad.rego"), "package ksched.input\nallow if {\n").unwrap();
    match PolicyBundle::from_dir(&dir) {
        Err(Error::Compile { module, .. }) => assert_eq!(module, "bad.rego"),
        other => panic!("{other:?}"),
    }
    let r = reconfigure(&PolicyBundle {
        modules: [(
            "bad.rego".to_owned(),
            "package ksched.input\nallow if {\n".to_owned(),
        )]
        .into(),
        data_json: "{}".into(),
    });
    let d = RegoEngine::new().evaluate_input(&r, &serde_json::json!({}));
    assert_eq!(
        d.verdict,
        Verdict::Deny,
        "a journaled bundle that does not compile fails closed"
    );
}

#[test]
fn non_deterministic_builtins_are_refused() {
    let dir = tempdir();
    std::fs::write(
        dir.join("clock.rego"),
        "package ksched.input\nallow if time.now_ns() > 0\n",
    )
    .unwrap();
    match PolicyBundle::from_dir(&dir) {
        Err(Error::Nondeterministic { builtin, .. }) => assert_eq!(builtin, "time.now_ns"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_snapshot_id_changes_with_modules_and_data() {
    let a = PolicyBundle::from_dir(&config_dir()).unwrap();
    let mut b = a.clone();
    assert_eq!(a.snapshot_id(), b.snapshot_id());
    b.data_json = "{\"x\":1}".into();
    assert_ne!(a.snapshot_id(), b.snapshot_id());
    let mut c = a.clone();
    c.modules.insert("extra.rego".into(), "package x\n".into());
    assert_ne!(a.snapshot_id(), c.snapshot_id());
}

fn tempdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "ksched-policy-test-{}-{}",
        std::process::id(),
        uuid_like()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn uuid_like() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn numbers_and_nested_values_of_the_input_reach_the_policy_intact() {
    let mut bundle = PolicyBundle::default();
    bundle.modules.insert(
        "p.rego".into(),
        "package ksched.input\n\
         default allow := true\n\
         deny contains sprintf(\"tenant %s has %d active jobs\", [input.tenant.id, input.tenant.active_jobs]) if input.tenant.active_jobs >= 3\n\
         require_approval contains \"label\" if input.job.labels.env == \"prod\"\n"
            .into(),
    );
    bundle.data_json = "{}".into();
    let r = reconfigure(&bundle);
    let engine = RegoEngine::new();
    let d = engine.evaluate_input(
        &r,
        &input_document(&job("dev", &[], Priority::Batch), 0, 3, &[]),
    );
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.reasons.len(), 1);
    assert!(
        d.reasons[0].ends_with("has 3 active jobs"),
        "{:?}",
        d.reasons
    );
    let d = engine.evaluate_input(
        &r,
        &input_document(&job("prod", &[], Priority::Batch), 0, 2, &[]),
    );
    assert_eq!(d.verdict, Verdict::RequireApproval);
    let d = engine.evaluate_input(
        &r,
        &input_document(&job("dev", &[], Priority::Batch), 0, 2, &[]),
    );
    assert_eq!(d.verdict, Verdict::Allow);
}

fn inline(text: &str) -> Reconfigure {
    let mut bundle = PolicyBundle::default();
    bundle.modules.insert("p.rego".into(), text.into());
    bundle.data_json = "{}".into();
    reconfigure(&bundle)
}

/// The memo keys a decision by what the policy can read of the input: jobs that differ only
/// in fields it never names share one evaluation, and a change in a field it names is
/// evaluated anew (with the right verdict).
#[test]
fn jobs_differing_only_in_fields_the_policy_never_reads_share_one_evaluation() {
    let r = inline(
        "package ksched.input\nimport rego.v1\ndefault allow := true\ndeny contains \"evil\" if input.job.tenant_id == \"evil\"\n",
    );
    let engine = RegoEngine::new();
    let mut j = job("dev", &[], Priority::Batch);
    for i in 0..5 {
        j.job_id = format!("j-{i}");
        j.labels.insert("n".into(), i.to_string());
        let d = engine.evaluate_input(&r, &input_document(&j, 0, 0, &[]));
        assert_eq!(d.verdict, Verdict::Allow);
    }
    assert_eq!(engine.memo_stats(), (4, 1), "one evaluation for five jobs");
    j.tenant_id = "evil".into();
    let d = engine.evaluate_input(&r, &input_document(&j, 0, 0, &[]));
    assert_eq!(d.verdict, Verdict::Deny, "the field it reads changed");
    assert_eq!(engine.memo_stats(), (4, 2));
}

/// A policy that may read the whole input (a bare `input`) is evaluated for every distinct
/// document, as before.
#[test]
fn a_policy_reading_the_whole_input_is_evaluated_for_every_distinct_document() {
    let r =
        inline("package ksched.input\nimport rego.v1\nallow if count(object.keys(input)) > 0\n");
    let engine = RegoEngine::new();
    let mut j = job("dev", &[], Priority::Batch);
    for i in 0..3 {
        j.job_id = format!("j-{i}");
        let d = engine.evaluate_input(&r, &input_document(&j, 0, 0, &[]));
        assert_eq!(d.verdict, Verdict::Allow);
    }
    assert_eq!(engine.memo_stats(), (0, 3));
}

/// A label absent and a label present are different inputs even where the value compared
/// is the same text: the projection keeps "missing" apart from any value.
#[test]
fn a_missing_field_is_not_mistaken_for_a_present_one() {
    let r = inline(
        "package ksched.input\nimport rego.v1\ndefault allow := false\nallow if not input.job.labels.team\n",
    );
    let engine = RegoEngine::new();
    let mut j = job("dev", &[], Priority::Batch);
    assert_eq!(
        engine
            .evaluate_input(&r, &input_document(&j, 0, 0, &[]))
            .verdict,
        Verdict::Allow
    );
    j.labels.insert("team".into(), "core".into());
    assert_eq!(
        engine
            .evaluate_input(&r, &input_document(&j, 0, 0, &[]))
            .verdict,
        Verdict::Deny
    );
}
