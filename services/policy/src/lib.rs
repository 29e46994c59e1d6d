//! The safety kernel's policies: Rego, evaluated in-process by regorus (SPEC §5).
//!
//! A [`PolicyBundle`] is the Rego modules and the data document from `config/policy/`; its
//! snapshot id hashes both, and it travels in the journal, so a replay evaluates exactly the
//! policy that was in force. [`RegoEngine`] compiles each bundle once and memoizes decisions
//! per (snapshot, input document): they are pure functions of the two.
//!
//! # Policy contract
//! Input policy, `package ksched.input`, sees `input.job` (secret env values hidden, payload as
//! `payload_size`), `input.tenant.active_jobs` and `input.pools`:
//! - `deny` — a set of reasons; non-empty denies the job;
//! - `require_approval` — a set of reasons (or `true`); the job waits for a human;
//! - `allow` — must be `true` for the job to run when nothing above applies;
//! - `constraints` — an object with any of `max_retries`, `max_concurrent_jobs`,
//!   `max_runtime_ms`, `deadline_ms`, `labels`.
//!
//! Output policy, `package ksched.output`, sees `input.job` and `input.result`:
//! - `quarantine` — a set of reasons; non-empty quarantines the succeeded job.
//!
//! A bundle without an input package allows everything; without an output package it
//! quarantines nothing. Evaluation errors fail closed: the job is denied (or quarantined) with
//! the error as the reason. Non-deterministic builtins (`time.now_ns`, `rand.intn`,
//! `uuid.rfc4122`, `opa.runtime`) are refused at load, because a replay must decide the same.
//!
//! # Limits
//! Every evaluation is bounded by the limits of the rules journaled beside the policy
//! (`limits.policy_max_steps`, `limits.policy_max_memory_bytes`), so neither a policy nor a
//! job can make one evaluation run or grow without end. Steps are the interpreter's own
//! checkpoints (each rule, statement and loop iteration is one), counted: the same policy on
//! the same input stops at the same step in every process, so a replay decides the same.
//! Memory is what the process allocates during the evaluation, as counted by regorus's
//! allocator (mimalloc with counters, which regorus installs as the global allocator;
//! [`memory_limits_enforced`] says whether it is); a builtin that materializes a huge value (`numbers.range(1, 1e11)`) stops at the
//! limit instead of taking the machine. An evaluation stopped at either limit fails closed
//! and says so ([`PolicyDecision::limit_exceeded`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use ksched_core::events::{Reconfigure, Verdict};
use ksched_core::hash::sha256_parts;
use ksched_core::policy::{OutputDecision, PolicyDecision, PolicyEngine, constraints_from_json};
use ksched_core::rules::Rules;
use regorus::utils::limits::ExecutionTimerConfig;
use regorus::{Engine, LimitError, Value};
use serde_json::Value as Json;
use thiserror::Error;

/// Builtins whose result depends on when or where they run.
pub const FORBIDDEN_BUILTINS: &[&str] =
    &["time.now_ns", "rand.intn", "uuid.rfc4122", "opa.runtime"];

/// Decisions remembered per engine before the oldest are forgotten.
pub const MEMO_CAPACITY: usize = 16_384;

#[derive(Debug, Error)]
pub enum Error {
    #[error("reading policy directory {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("policy data {path} is not valid JSON: {detail}")]
    Data { path: String, detail: String },
    #[error("policy module {module} does not compile: {detail}")]
    Compile { module: String, detail: String },
    #[error(
        "policy module {module} uses {builtin}, which is not deterministic; replays must decide the same, so it is not allowed"
    )]
    Nondeterministic { module: String, builtin: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Rego modules and a data document.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyBundle {
    /// Module source by file name.
    pub modules: BTreeMap<String, String>,
    /// The data document, as JSON.
    pub data_json: String,
}

impl PolicyBundle {
    /// Loads every `*.rego` file (not `*_test.rego`) and an optional `data.json` from `dir`.
    pub fn from_dir(dir: &Path) -> Result<PolicyBundle> {
        let read_err = |source| Error::Read {
            path: dir.display().to_string(),
            source,
        };
        let mut modules = BTreeMap::new();
        let mut data_json = "{}".to_owned();
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .map_err(read_err)?
            .filter_map(std::result::Result::ok)
            .map(|e| e.path())
            .collect();
        entries.sort();
        for path in entries {
            let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
                continue;
            };
            if name.ends_with(".rego") && !name.ends_with("_test.rego") {
                let text = std::fs::read_to_string(&path).map_err(|source| Error::Read {
                    path: path.display().to_string(),
                    source,
                })?;
                modules.insert(name, text);
            } else if name == "data.json" {
                let text = std::fs::read_to_string(&path).map_err(|source| Error::Read {
                    path: path.display().to_string(),
                    source,
                })?;
                let v: Json = serde_json::from_str(&text).map_err(|e| Error::Data {
                    path: path.display().to_string(),
                    detail: e.to_string(),
                })?;
                data_json = v.to_string();
            }
        }
        let bundle = PolicyBundle { modules, data_json };
        compile(&bundle)?;
        Ok(bundle)
    }

    /// Hash of the modules and the data: the policy snapshot id.
    pub fn snapshot_id(&self) -> String {
        let mut parts: Vec<&[u8]> = Vec::new();
        for (name, text) in &self.modules {
            parts.push(name.as_bytes());
            parts.push(text.as_bytes());
        }
        parts.push(self.data_json.as_bytes());
        sha256_parts(parts)[..16].to_owned()
    }

    /// The bundle as journaled.
    pub fn from_reconfigure(r: &Reconfigure) -> PolicyBundle {
        PolicyBundle {
            modules: r.policy_modules.clone(),
            data_json: r.policy_data_json.clone(),
        }
    }
}

/// Compiles a bundle into an engine, refusing non-deterministic builtins. Never while an
/// evaluation's memory limit is set: regorus's parser checks that process-wide limit too,
/// and a bundle that failed to compile for another's budget would stay failed.
pub fn compile(bundle: &PolicyBundle) -> Result<Engine> {
    memory::unlimited(|| compile_now(bundle))
}

fn compile_now(bundle: &PolicyBundle) -> Result<Engine> {
    let mut engine = Engine::new();
    // `print` goes to the engine, not to standard error (which a replay child would send
    // back to a console caller), and is dropped after each evaluation.
    engine.set_gather_prints(true);
    for (name, text) in &bundle.modules {
        if let Some(b) = forbidden_builtin(text) {
            return Err(Error::Nondeterministic {
                module: name.clone(),
                builtin: b.to_owned(),
            });
        }
        engine
            .add_policy(name.clone(), text.clone())
            .map_err(|e| Error::Compile {
                module: name.clone(),
                detail: e.to_string(),
            })?;
    }
    let data = Value::from_json_str(if bundle.data_json.trim().is_empty() {
        "{}"
    } else {
        &bundle.data_json
    })
    .map_err(|e| Error::Data {
        path: "data.json".into(),
        detail: e.to_string(),
    })?;
    engine.add_data(data).map_err(|e| Error::Data {
        path: "data.json".into(),
        detail: e.to_string(),
    })?;
    Ok(engine)
}

/// The first non-deterministic builtin called in `text`, outside comments.
fn forbidden_builtin(text: &str) -> Option<&'static str> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or(""))
        .find_map(|code| {
            FORBIDDEN_BUILTINS
                .iter()
                .copied()
                .find(|b| code.contains(&format!("{b}(")))
        })
}

/// The parts of the input document a bundle's modules can read, found in their source: for
/// each reference to the root document `input`, its longest static path (`input.job.tenant`
/// reads `job.tenant`; `input.job[k]` reads `job`; `import input.job as j` reads `job`).
/// None when a reference may read the whole document (a bare `input`, as in `input[k]`,
/// `f(input)` or `with input as`). Conservative by construction: text in comments and
/// strings only adds paths or falls back to the whole document.
fn input_paths(bundle: &PolicyBundle) -> Option<Vec<Vec<String>>> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut paths: Vec<Vec<String>> = Vec::new();
    for text in bundle.modules.values() {
        let mut from = 0;
        while let Some(at) = text[from..].find("input").map(|i| from + i) {
            from = at + "input".len();
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| ident(c) || c == '.') {
                // `myinput`, or `ksched.input` (a package, not the document).
                continue;
            }
            let rest = &text[from..];
            if rest.chars().next().is_some_and(ident) {
                continue; // `input_x`, `inputs`
            }
            let mut path = Vec::new();
            let mut r = rest;
            while let Some(after_dot) = r.strip_prefix('.') {
                let len = after_dot
                    .find(|c: char| !ident(c))
                    .unwrap_or(after_dot.len());
                if len == 0 {
                    break;
                }
                path.push(after_dot[..len].to_owned());
                r = &after_dot[len..];
            }
            if path.is_empty() {
                return None;
            }
            paths.push(path);
        }
    }
    paths.sort();
    paths.dedup();
    // A path under another one adds nothing: the shorter one's subtree holds it.
    let kept: Vec<Vec<String>> = paths
        .iter()
        .filter(|p| !paths.iter().any(|q| q.len() < p.len() && p.starts_with(q)))
        .cloned()
        .collect();
    Some(kept)
}

/// What of `doc` a policy reading `paths` can see: the memo key's document part. Two
/// documents with the same projection get the same decision. A missing field (`~`) is told
/// apart from a null one (Rego treats undefined and null differently).
fn projection(doc: &Json, paths: Option<&[Vec<String>]>) -> String {
    let Some(paths) = paths else {
        return doc.to_string();
    };
    let mut key = String::new();
    for p in paths {
        let mut v = Some(doc);
        for segment in p {
            v = v.and_then(|v| v.get(segment));
        }
        key.push_str(&p.join("."));
        key.push('=');
        match v {
            Some(v) => key.push_str(&v.to_string()),
            None => key.push('~'),
        }
        key.push('\u{0}');
    }
    key
}

struct Compiled {
    engine: Option<Engine>,
    /// What the bundle can read of its input ([`input_paths`]).
    input_paths: Option<Vec<Vec<String>>>,
    has_input: bool,
    has_output: bool,
    error: Option<String>,
}

struct Memo<V> {
    map: HashMap<String, V>,
    order: VecDeque<String>,
}

impl<V> Default for Memo<V> {
    fn default() -> Self {
        Memo {
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<V: Clone> Memo<V> {
    fn get(&self, k: &str) -> Option<V> {
        self.map.get(k).cloned()
    }
    fn put(&mut self, k: String, v: V) {
        if self.map.len() >= MEMO_CAPACITY
            && let Some(old) = self.order.pop_front()
        {
            self.map.remove(&old);
        }
        self.order.push_back(k.clone());
        self.map.insert(k, v);
    }
}

#[derive(Default)]
struct Inner {
    engines: HashMap<String, Compiled>,
    /// The limits of each rule set seen, by rules id.
    bounds: HashMap<String, Bounds>,
    input_memo: Memo<PolicyDecision>,
    output_memo: Memo<OutputDecision>,
    hits: u64,
    misses: u64,
}

/// Rego policies via regorus, compiled per snapshot and memoized per input.
#[derive(Default)]
pub struct RegoEngine {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for RegoEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegoEngine").finish_non_exhaustive()
    }
}

impl RegoEngine {
    pub fn new() -> RegoEngine {
        RegoEngine::default()
    }

    /// (memo hits, memo misses) so far.
    pub fn memo_stats(&self) -> (u64, u64) {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (inner.hits, inner.misses)
    }

    fn with_engine<T>(
        &self,
        bundle: &Reconfigure,
        f: impl FnOnce(&mut Compiled, &mut Inner) -> T,
    ) -> T {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let inner = &mut *guard;
        let snapshot = bundle.policy_snapshot.clone();
        let mut compiled = inner.engines.remove(&snapshot).unwrap_or_else(|| {
            let source = PolicyBundle::from_reconfigure(bundle);
            match compile(&source) {
                Ok(engine) => {
                    let packages = engine.get_packages().unwrap_or_default();
                    Compiled {
                        input_paths: input_paths(&source),
                        has_input: packages.iter().any(|p| p == "data.ksched.input"),
                        has_output: packages.iter().any(|p| p == "data.ksched.output"),
                        engine: Some(engine),
                        error: None,
                    }
                }
                Err(e) => Compiled {
                    engine: None,
                    input_paths: None,
                    has_input: true,
                    has_output: true,
                    error: Some(e.to_string()),
                },
            }
        });
        let out = f(&mut compiled, inner);
        inner.engines.insert(snapshot, compiled);
        out
    }
}

/// Why an evaluation gave no answer.
#[derive(Debug, Clone, PartialEq)]
enum Stop {
    /// The policy failed (a builtin error, a conflict, an input that does not convert).
    Failed(String),
    /// It took more than `limits.policy_max_steps` steps (deterministic).
    Steps(u32),
    /// It allocated more than `limits.policy_max_memory_bytes` (measured).
    Memory(u64),
}

impl Stop {
    fn from_error(e: &anyhow::Error, bounds: Bounds) -> Stop {
        match e.downcast_ref::<LimitError>() {
            // The step budget is a zero time limit checked every `steps` steps (bounded()).
            Some(LimitError::TimeLimitExceeded { .. }) => Stop::Steps(bounds.steps),
            Some(LimitError::MemoryLimitExceeded { .. }) => Stop::Memory(bounds.memory),
            _ => Stop::Failed(e.to_string()),
        }
    }

    fn reason(&self) -> String {
        match self {
            Stop::Failed(e) => e.clone(),
            Stop::Steps(n) => {
                format!("the evaluation took more than {n} steps (limits.policy_max_steps)")
            }
            Stop::Memory(n) => format!(
                "the evaluation allocated more than {n} bytes (limits.policy_max_memory_bytes)"
            ),
        }
    }
}

/// What bounds one evaluation: the limits of the rules journaled beside the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bounds {
    steps: u32,
    memory: u64,
}

impl Bounds {
    /// The limits in `rules_json`; a bundle without readable rules (a test's) gets the
    /// defaults.
    fn of(rules_json: &str) -> Bounds {
        let limits = Rules::from_json(rules_json)
            .map(|r| r.limits)
            .unwrap_or_default();
        Bounds {
            steps: limits.policy_max_steps.max(1),
            memory: u64::try_from(limits.policy_max_memory_bytes)
                .unwrap_or(0)
                .max(1),
        }
    }
}

/// Runs one evaluation of `engine` within `bounds`: at most `bounds.steps` interpreter steps
/// and `bounds.memory` bytes allocated beyond what the process held at the start.
fn bounded<T>(
    engine: &mut Engine,
    bounds: Bounds,
    evaluate: impl FnOnce(&mut Engine) -> std::result::Result<T, anyhow::Error>,
) -> std::result::Result<T, Stop> {
    // regorus checks its timer at every step but reads the clock only every
    // `check_interval` steps; with a limit of zero that first reading fails, at exactly
    // `steps` steps. A step count, not a duration: the same in every process and replay.
    engine.set_execution_timer_config(ExecutionTimerConfig {
        limit: Duration::ZERO,
        check_interval: NonZeroU32::new(bounds.steps).unwrap_or(NonZeroU32::MIN),
    });
    memory::within(bounds.memory, || {
        let out = evaluate(&mut *engine);
        let _ = engine.take_prints();
        out
    })
    .map_err(|e| Stop::from_error(&e, bounds))
}

/// Memory budgets per evaluation, on regorus's allocator-counted, process-wide limit.
mod memory {
    use std::sync::Mutex;

    /// One budgeted evaluation at a time in the process, since the limit is process-wide.
    /// (The scheduler evaluates on one engine, under its lock, anyway.)
    static GATE: Mutex<()> = Mutex::new(());

    /// Lifts the limit however the evaluation ends.
    struct Lift;

    impl Drop for Lift {
        fn drop(&mut self) {
            regorus::set_global_memory_limit(None);
        }
    }

    /// Runs `evaluate` with at most `budget` bytes allocated beyond what the process holds
    /// now. Other threads' allocations in the meantime count too: the budget is generous
    /// against them, and a stop it causes is not memoized.
    pub(crate) fn within<T>(budget: u64, evaluate: impl FnOnce() -> T) -> T {
        let _gate = GATE.lock().unwrap_or_else(|p| p.into_inner());
        // Publishes this thread's pending count first, so the base is current.
        let live = regorus_mimalloc::global_allocation_stats_snapshot().allocated;
        regorus::set_global_memory_limit(Some(live.saturating_add(budget)));
        let _lift = Lift;
        evaluate()
    }

    /// Runs `f` with no memory limit set, waiting for a limited evaluation to end first.
    pub(crate) fn unlimited<T>(f: impl FnOnce() -> T) -> T {
        let _gate = GATE.lock().unwrap_or_else(|p| p.into_inner());
        f()
    }

    /// Whether allocations are counted: regorus's allocator is the process's global one.
    pub(crate) fn counted() -> bool {
        let before = regorus_mimalloc::global_allocation_stats_snapshot().allocated;
        let probe: Vec<u8> = Vec::with_capacity(4 << 20);
        let during = regorus_mimalloc::global_allocation_stats_snapshot().allocated;
        drop(std::hint::black_box(probe));
        during >= before.saturating_add(4 << 20)
    }
}

/// Whether this process counts its allocations, so that `limits.policy_max_memory_bytes`
/// is enforced. regorus installs its counting allocator (mimalloc) as the global allocator
/// of every binary that links this crate; this says whether that held. Step limits hold
/// either way.
pub fn memory_limits_enforced() -> bool {
    memory::counted()
}

/// Evaluates a whole package (`data.ksched.input`) for `doc` as the input: an object with
/// the rules that are defined (undefined rules are absent). The document is converted within
/// the evaluation's limits too: regorus checks the memory limit while it converts.
fn package(
    engine: &mut Engine,
    path: &str,
    doc: &Json,
    bounds: Bounds,
) -> std::result::Result<Json, Stop> {
    let results = bounded(engine, bounds, |engine| {
        let input: Value = serde::Deserialize::deserialize(doc).map_err(anyhow::Error::new)?;
        engine.set_input(input);
        engine.eval_query(path.to_owned(), false)
    })?;
    let value = results
        .result
        .first()
        .and_then(|r| r.expressions.first())
        .map(|e| e.value.clone())
        .unwrap_or(Value::Undefined);
    if value == Value::Undefined {
        return Ok(Json::Object(Default::default()));
    }
    serde_json::to_value(&value).map_err(|e| Stop::Failed(e.to_string()))
}

/// A set (or array) of reasons; `true` counts as one unnamed reason.
fn reasons(v: Option<&Json>, default: &str) -> Vec<String> {
    match v {
        Some(Json::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_owned))
            .collect(),
        Some(Json::Bool(true)) => vec![default.to_owned()],
        Some(Json::String(s)) => vec![s.clone()],
        _ => Vec::new(),
    }
}

fn evaluate_input(
    engine: &mut Engine,
    doc: &Json,
    bounds: Bounds,
) -> std::result::Result<PolicyDecision, Stop> {
    let pkg = package(engine, "data.ksched.input", doc, bounds)?;
    let deny = reasons(pkg.get("deny"), "denied by policy");
    let constraints = pkg
        .get("constraints")
        .map(constraints_from_json)
        .unwrap_or_default();
    if !deny.is_empty() {
        return Ok(PolicyDecision {
            verdict: Verdict::Deny,
            reasons: deny,
            constraints,
            limit_exceeded: false,
        });
    }
    let approval = reasons(pkg.get("require_approval"), "approval required by policy");
    if !approval.is_empty() {
        return Ok(PolicyDecision {
            verdict: Verdict::RequireApproval,
            reasons: approval,
            constraints,
            limit_exceeded: false,
        });
    }
    let allowed = pkg.get("allow") == Some(&Json::Bool(true));
    Ok(if allowed {
        PolicyDecision {
            verdict: Verdict::Allow,
            reasons: Vec::new(),
            constraints,
            limit_exceeded: false,
        }
    } else {
        PolicyDecision {
            verdict: Verdict::Deny,
            reasons: vec!["not allowed: no allow rule matched (default deny)".into()],
            constraints,
            limit_exceeded: false,
        }
    })
}

fn evaluate_output(
    engine: &mut Engine,
    doc: &Json,
    bounds: Bounds,
) -> std::result::Result<OutputDecision, Stop> {
    let pkg = package(engine, "data.ksched.output", doc, bounds)?;
    let q = reasons(pkg.get("quarantine"), "quarantined by output policy");
    Ok(OutputDecision {
        quarantine: !q.is_empty(),
        reasons: q,
        limit_exceeded: false,
    })
}

/// An input document, ready or built on demand.
#[derive(Clone, Copy)]
enum Doc<'a> {
    Ready(&'a Json),
    Build(&'a dyn Fn() -> Json),
}

impl<'a> Doc<'a> {
    fn get(self) -> Cow<'a, Json> {
        match self {
            Doc::Ready(doc) => Cow::Borrowed(doc),
            Doc::Build(build) => Cow::Owned(build()),
        }
    }
}

impl RegoEngine {
    /// The memo key of an evaluation, and the document if it had to be built for it. A
    /// bundle known to read nothing of its input has one key per snapshot and needs no
    /// document until a miss.
    fn memo_key<'a>(
        bundle: &Reconfigure,
        bounds: Bounds,
        compiled: &Compiled,
        doc: Doc<'a>,
    ) -> (String, Option<Cow<'a, Json>>) {
        let paths = compiled.input_paths.as_deref();
        // A decision depends on the step limit too (one stopped at it would not be under
        // a larger one).
        let head = format!("{}\u{0}{}\u{0}", bundle.policy_snapshot, bounds.steps);
        if paths.is_some_and(<[_]>::is_empty) {
            return (head, None);
        }
        let built = doc.get();
        let key = format!("{head}{}", projection(&built, paths));
        (key, Some(built))
    }

    /// The limits of the rules in `bundle`, parsed once per rule set.
    fn bounds(inner: &mut Inner, bundle: &Reconfigure) -> Bounds {
        if let Some(b) = inner.bounds.get(&bundle.rules_id) {
            return *b;
        }
        if inner.bounds.len() >= 64 {
            inner.bounds.clear();
        }
        let b = Bounds::of(&bundle.rules_json);
        inner.bounds.insert(bundle.rules_id.clone(), b);
        b
    }

    /// Asks one of the two policies: its answer without a package, from the memo, or
    /// evaluated (failing closed on an error).
    fn decide<T: Clone>(&self, bundle: &Reconfigure, doc: Doc<'_>, side: &Side<T>) -> T {
        self.with_engine(bundle, |compiled, inner| {
            if compiled.engine.is_some() && compiled.error.is_none() && !(side.present)(compiled) {
                // No package: nothing to evaluate, no document to build.
                return (side.absent)();
            }
            let bounds = Self::bounds(inner, bundle);
            let (key, built) = Self::memo_key(bundle, bounds, compiled, doc);
            if let Some(hit) = (side.memo)(inner).get(&key) {
                inner.hits += 1;
                return hit;
            }
            inner.misses += 1;
            let outcome = match (&mut compiled.engine, &compiled.error) {
                (_, Some(e)) => Err(Stop::Failed(e.clone())),
                (Some(engine), None) => {
                    let doc = built.unwrap_or_else(|| doc.get());
                    (side.evaluate)(engine, &doc, bounds)
                }
                (None, None) => Err(Stop::Failed("no engine".into())),
            };
            let decision = match &outcome {
                Ok(d) => d.clone(),
                Err(stop @ Stop::Failed(_)) => (side.closed)(&stop.reason(), false),
                Err(stop) => (side.closed)(&stop.reason(), true),
            };
            // A memory stop is measured, not counted: the next evaluation may pass.
            if !matches!(outcome, Err(Stop::Memory(_))) {
                (side.memo)(inner).put(key, decision.clone());
            }
            decision
        })
    }
}

/// One of the two policies: whether the bundle has its package, its memo, its answer
/// without a package and on a failure, and its evaluation.
struct Side<T> {
    present: fn(&Compiled) -> bool,
    memo: fn(&mut Inner) -> &mut Memo<T>,
    absent: fn() -> T,
    /// The answer when evaluation gave none: the reason, and whether a limit stopped it.
    closed: fn(&str, bool) -> T,
    evaluate: fn(&mut Engine, &Json, Bounds) -> std::result::Result<T, Stop>,
}

const INPUT: Side<PolicyDecision> = Side {
    present: |c| c.has_input,
    memo: |i| &mut i.input_memo,
    absent: PolicyDecision::allow,
    closed: fail_closed,
    evaluate: evaluate_input,
};

const OUTPUT: Side<OutputDecision> = Side {
    present: |c| c.has_output,
    memo: |i| &mut i.output_memo,
    absent: OutputDecision::default,
    closed: quarantine_closed,
    evaluate: evaluate_output,
};

impl PolicyEngine for RegoEngine {
    fn evaluate_input(&self, bundle: &Reconfigure, doc: &Json) -> PolicyDecision {
        self.decide(bundle, Doc::Ready(doc), &INPUT)
    }

    fn evaluate_output(&self, bundle: &Reconfigure, doc: &Json) -> OutputDecision {
        self.decide(bundle, Doc::Ready(doc), &OUTPUT)
    }

    fn evaluate_input_lazily(
        &self,
        bundle: &Reconfigure,
        doc: &dyn Fn() -> Json,
    ) -> PolicyDecision {
        self.decide(bundle, Doc::Build(doc), &INPUT)
    }

    fn evaluate_output_lazily(
        &self,
        bundle: &Reconfigure,
        doc: &dyn Fn() -> Json,
    ) -> OutputDecision {
        self.decide(bundle, Doc::Build(doc), &OUTPUT)
    }
}

fn fail_closed(error: &str, limit_exceeded: bool) -> PolicyDecision {
    PolicyDecision {
        verdict: Verdict::Deny,
        reasons: vec![format!("policy evaluation failed: {error}")],
        constraints: Default::default(),
        limit_exceeded,
    }
}

fn quarantine_closed(error: &str, limit_exceeded: bool) -> OutputDecision {
    OutputDecision {
        quarantine: true,
        reasons: vec![format!("output policy evaluation failed: {error}")],
        limit_exceeded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths_of(text: &str) -> Option<Vec<Vec<String>>> {
        let mut b = PolicyBundle::default();
        b.modules.insert("p.rego".into(), text.into());
        input_paths(&b)
    }

    fn p(s: &str) -> Vec<String> {
        s.split('.').map(str::to_owned).collect()
    }

    #[test]
    fn static_references_to_the_input_are_found_and_others_fall_back_to_all_of_it() {
        let text = "package ksched.input\nimport input.meta as m\nallow if input.job.tenant_id == \"a\"\n\
                    deny if input.job.labels[k] == \"x\"\nx if data.ksched.input.allow\ny := myinput.z\n";
        assert_eq!(
            paths_of(text),
            Some(vec![p("job.labels"), p("job.tenant_id"), p("meta")])
        );
        // Under a shorter path, a longer one adds nothing.
        assert_eq!(
            paths_of("allow if input.job.a.b\nallow if input.job.a\n"),
            Some(vec![p("job.a")])
        );
        for whole in [
            "allow if input[k]",
            "allow if f(input)",
            "allow if x with input as {}",
            "allow if input\n",
        ] {
            assert_eq!(paths_of(whole), None, "{whole}");
        }
        assert_eq!(paths_of("default allow := true\n"), Some(vec![]));
    }

    #[test]
    fn a_projection_tells_missing_from_null_and_ignores_other_fields() {
        let paths = vec![p("job.team")];
        let a = projection(
            &serde_json::json!({"job": {"team": null, "id": 1}}),
            Some(&paths),
        );
        let b = projection(&serde_json::json!({"job": {"id": 2}}), Some(&paths));
        let c = projection(
            &serde_json::json!({"job": {"team": null, "id": 3}}),
            Some(&paths),
        );
        assert_ne!(a, b);
        assert_eq!(a, c);
    }
}
