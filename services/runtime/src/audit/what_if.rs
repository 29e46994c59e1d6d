//! `audit what-if`: the recorded inputs decided under other pools or another policy.

use std::collections::{BTreeMap, BTreeSet};

use ksched_core::decide::{Ctx, process};
use ksched_core::events::{Event, Input, JobState, Reconfigure, Verdict};
use ksched_core::policy::{OutputDecision, PolicyDecision, PolicyEngine};
use ksched_core::records::{Millis, ScheduleAction, ScheduleCommand};
use ksched_core::schedule::schedule_key;
use ksched_core::state::State;
use ksched_core::{apply_entry, hash::sha256_parts};
use ksched_policy::{PolicyBundle, RegoEngine};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::replay::Flow;
use crate::settings::PoolsFile;

use super::{Progress, Reporting, Source};

/// What to decide under instead of what was in force.
#[derive(Debug, Clone, Default)]
pub struct Alternative {
    /// Replaces topics, pools and tenants (timers, retries and thresholds stay as recorded).
    pub pools: Option<PoolsFile>,
    /// Replaces the policy bundle.
    pub policy: Option<PolicyBundle>,
    /// Schedules taken to have been paused (from `paused_from` on, or from their start).
    pub paused_schedules: Vec<PausedSchedule>,
}

/// A schedule the alternative world pauses: `(tenant, schedule id)`, from a log time on
/// (`None`: from its creation). Recorded resumes and updates do not wake it there; a
/// recorded trigger, a human's explicit act, still fires it, as triggering a paused schedule
/// does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PausedSchedule {
    pub tenant_id: String,
    pub schedule_id: String,
    pub paused_from: Option<Millis>,
}

impl PausedSchedule {
    /// `TENANT:ID`, as the CLI and the console name a schedule.
    pub fn parse(text: &str, paused_from: Option<Millis>) -> std::result::Result<Self, String> {
        match text.trim().split_once(':') {
            Some((t, id)) if !t.is_empty() && !id.is_empty() => Ok(Self {
                tenant_id: t.to_owned(),
                schedule_id: id.to_owned(),
                paused_from,
            }),
            _ => Err(format!("{text:?}: name a schedule as TENANT:ID")),
        }
    }

    fn key(&self) -> String {
        schedule_key(&self.tenant_id, &self.schedule_id)
    }
}

impl Alternative {
    fn substitute(&self, r: &Reconfigure) -> Result<Reconfigure> {
        let mut out = r.clone();
        if let Some(p) = &self.pools {
            let mut rules = ksched_core::rules::Rules::from_json(&r.rules_json)
                .map_err(|e| Error::Audit(format!("recorded rules: {e}")))?;
            p.apply_to(&mut rules);
            rules
                .validate()
                .map_err(|e| Error::Audit(format!("alternative pools: {e}")))?;
            out.rules_json = rules.to_canonical_json();
            out.rules_id = sha256_parts([out.rules_json.as_bytes()])[..16].to_owned();
        }
        if let Some(b) = &self.policy {
            out.policy_modules = b.modules.clone();
            out.policy_data_json = b.data_json.clone();
            out.policy_snapshot = b.snapshot_id();
        }
        Ok(out)
    }
}

/// How a job ended up in one world.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    pub state: Option<JobState>,
    pub pool: Option<String>,
    pub worker: Option<String>,
    pub verdict: Option<Verdict>,
}

impl Outcome {
    pub fn to_json(&self) -> Value {
        json!({
            "state": self.state.map(JobState::as_str),
            "pool": self.pool,
            "worker": self.worker,
            "verdict": self.verdict.map(|v| format!("{v:?}")),
        })
    }
}

/// A job decided differently under the alternative.
#[derive(Debug, Clone)]
pub struct WhatIfRow {
    pub job_id: String,
    pub tenant_id: String,
    pub topic: String,
    pub actual: Outcome,
    pub alternative: Outcome,
    /// `pool`, `worker`, `verdict`, `state`.
    pub differs_in: Vec<&'static str>,
}

#[derive(Debug, Clone)]
pub struct WhatIfReport {
    pub jobs: usize,
    /// Schedules the alternative was to pause that this journal never held (`TENANT:ID`).
    pub schedules_not_found: Vec<String>,
    pub rows: Vec<WhatIfRow>,
    /// How many jobs differ in each respect.
    pub totals: BTreeMap<&'static str, usize>,
    /// Per tenant, how long its jobs waited to be placed in each world: what a limit, a
    /// rate or a weight changes even where every job ends the same.
    pub waits: Vec<TenantWaits>,
}

/// How long one tenant's jobs waited from their acceptance to their first placement, in
/// the recorded world and in the alternative.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantWaits {
    pub tenant_id: String,
    pub actual: WaitSummary,
    pub alternative: WaitSummary,
}

/// Waits from acceptance to first placement (log time), in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WaitSummary {
    /// Jobs placed at least once.
    pub placed: usize,
    /// Jobs accepted and never placed (still waiting when the journal ends, or ended
    /// without a placement).
    pub unplaced: usize,
    pub p50_ms: Millis,
    pub p99_ms: Millis,
    pub max_ms: Millis,
}

impl WaitSummary {
    fn of(mut waits: Vec<Millis>, unplaced: usize) -> WaitSummary {
        waits.sort_unstable();
        let at = |q: f64| {
            let i = ((waits.len() as f64 * q).ceil() as usize).clamp(1, waits.len().max(1)) - 1;
            waits.get(i).copied().unwrap_or(0)
        };
        WaitSummary {
            placed: waits.len(),
            unplaced,
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            max_ms: waits.last().copied().unwrap_or(0),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "placed": self.placed,
            "unplaced": self.unplaced,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
        })
    }
}

/// When each job was accepted and first placed, in one world (log time).
#[derive(Debug, Default)]
struct Waits {
    accepted: BTreeMap<String, Millis>,
    placed: BTreeMap<String, Millis>,
}

impl Waits {
    fn record(&mut self, events: &[Event], log_time: Millis) {
        for e in events {
            match e {
                Event::JobAccepted(a) => {
                    self.accepted.entry(a.job_id.clone()).or_insert(log_time);
                }
                Event::JobScheduled(s) => {
                    self.placed.entry(s.job_id.clone()).or_insert(log_time);
                }
                _ => {}
            }
        }
    }

    /// Per tenant (as `tenant_of` says, for the jobs it names): the waits and the jobs
    /// never placed.
    fn by_tenant(
        &self,
        tenant_of: impl Fn(&str) -> Option<String>,
    ) -> BTreeMap<String, (Vec<Millis>, usize)> {
        let mut out: BTreeMap<String, (Vec<Millis>, usize)> = BTreeMap::new();
        for (id, accepted) in &self.accepted {
            let Some(tenant) = tenant_of(id) else {
                continue;
            };
            let entry = out.entry(tenant).or_default();
            match self.placed.get(id) {
                Some(placed) => entry.0.push(placed.saturating_sub(*accepted)),
                None => entry.1 += 1,
            }
        }
        out
    }
}

/// A job's tenant and topic, and its outcome in one world.
type Outcomes = BTreeMap<String, (String, String, Outcome)>;

fn outcomes(state: &State, verdicts: &BTreeMap<String, Verdict>) -> Outcomes {
    // Into an ordered map: the job map's order does not show.
    (state.jobs.iter_any_order())
        .map(|(id, j)| {
            (
                id.to_owned(),
                (
                    j.request.tenant_id.clone(),
                    j.request.topic.clone(),
                    Outcome {
                        state: Some(j.state),
                        pool: j.pool.clone(),
                        worker: j.worker_id.clone(),
                        verdict: verdicts.get(id).copied(),
                    },
                ),
            )
        })
        .collect()
}

fn record_verdicts(events: &[Event], verdicts: &mut BTreeMap<String, Verdict>) {
    for e in events {
        if let Event::PolicyEvaluated(p) = e {
            verdicts.insert(p.job_id.clone(), p.verdict);
        }
    }
}

/// The alternative world's policy engine for a caller who sees some tenants only: the
/// alternative policy judges the jobs of the tenants the caller sees, and the policy that
/// was in force judges the others, so a caller's policy never reads (and can tell nothing
/// of) a job it may not see.
struct Scoped<'a> {
    engine: &'a RegoEngine,
    visible: &'a dyn Fn(&str) -> bool,
    /// The bundle in force in the recorded world at the input being decided.
    recorded: std::cell::RefCell<Reconfigure>,
}

impl Scoped<'_> {
    /// The bundle that judges the job `doc` describes.
    fn bundle_for(&self, alternative: &Reconfigure, doc: &Value) -> Reconfigure {
        let tenant = doc["job"]["tenant_id"].as_str().unwrap_or("");
        if (self.visible)(tenant) {
            alternative.clone()
        } else {
            self.recorded.borrow().clone()
        }
    }
}

impl PolicyEngine for Scoped<'_> {
    fn evaluate_input(&self, bundle: &Reconfigure, doc: &Value) -> PolicyDecision {
        self.engine
            .evaluate_input(&self.bundle_for(bundle, doc), doc)
    }

    fn evaluate_output(&self, bundle: &Reconfigure, doc: &Value) -> OutputDecision {
        self.engine
            .evaluate_output(&self.bundle_for(bundle, doc), doc)
    }
}

/// Pauses, in the alternative world, each schedule `alt` names that is active there and whose
/// pause has begun by `log_time`, through a pause command decided like any other (so the
/// schedule's record and its due index agree). `seen` collects the named schedules that
/// existed at any point (paused or not, before its pause began or after).
fn pause_hypothesised(
    other: &mut State,
    ctx: &Ctx<'_>,
    alt: &Alternative,
    cause: &ksched_core::events::Cause,
    log_time: Millis,
    seen: &mut BTreeSet<String>,
) {
    for p in &alt.paused_schedules {
        if p.paused_from.is_some_and(|from| log_time < from) {
            if other.schedules.contains_key(&p.key()) {
                seen.insert(p.key());
            }
            continue;
        }
        let key = p.key();
        let Some(schedule) = other.schedules.get(&key) else {
            continue;
        };
        let active = !schedule.paused;
        seen.insert(key);
        if !active {
            continue;
        }
        let command = ScheduleCommand {
            schedule_id: p.schedule_id.clone(),
            tenant_id: p.tenant_id.clone(),
            action: ScheduleAction::Pause,
            spec: None,
            principal_id: "what-if".into(),
            reason: Some("paused in the alternative world".into()),
            requested_at: log_time,
        };
        process(
            other,
            ctx,
            cause.clone(),
            log_time,
            Input::Schedule(command),
        );
    }
}

/// Replays the recorded inputs through `decide` under `alt` and reports, per job, where the
/// outcome differs from what happened. Recorded approvals and rejections stand in the
/// alternative world (an approval that matched its job's policy snapshot then is taken to
/// match the snapshot the job has there). Holds both worlds in memory.
///
/// Only jobs of tenants `visible` accepts count, in the rows, the totals and the number of
/// jobs: a job's tenant is the one it has in the world it exists in (its request's, the
/// same in both), so a job that exists only in the alternative world shows only to its own
/// tenant's callers. With `scoped`, the alternative policy judges only those jobs; the
/// others are judged by the policy that was in force (`Scoped`).
pub fn what_if(
    src: &Source,
    alt: &Alternative,
    policy: &RegoEngine,
    visible: &dyn Fn(&str) -> bool,
    scoped: bool,
    progress: impl FnMut(&Progress),
) -> Result<WhatIfReport> {
    let mut reporting = Reporting::start(src, progress)?;
    let (mut entries, mut events) = (0, 0);
    let mut actual = State::new();
    let mut other = State::new();
    let mut actual_verdicts = BTreeMap::new();
    let mut other_verdicts = BTreeMap::new();
    let (mut actual_waits, mut other_waits) = (Waits::default(), Waits::default());
    let scoped = scoped.then(|| Scoped {
        engine: policy,
        visible,
        recorded: std::cell::RefCell::new(Reconfigure::default()),
    });
    let ctx = Ctx {
        policy: match &scoped {
            Some(s) => s,
            None => policy,
        },
    };
    let mut seen = BTreeSet::new();
    src.read(0, |rec| {
        pause_hypothesised(
            &mut other,
            &ctx,
            alt,
            &rec.entry.cause,
            rec.entry.log_time,
            &mut seen,
        );
        apply_entry(&mut actual, &rec.entry);
        if let (Some(s), Some(c)) = (&scoped, &actual.config) {
            *s.recorded.borrow_mut() = c.raw.clone();
        }
        record_verdicts(&rec.entry.events, &mut actual_verdicts);
        actual_waits.record(&rec.entry.events, rec.entry.log_time);
        let input = match &rec.entry.input {
            Input::Reconfigure(r) => Input::Reconfigure(alt.substitute(r)?),
            // Human decisions stand: an approval that matched its job's snapshot then
            // matches the snapshot the job has in the alternative world.
            Input::Approve(a) => {
                let mut a = a.clone();
                let then = actual
                    .jobs
                    .get(&a.job_id)
                    .and_then(|j| j.policy_snapshot.clone());
                let now = other
                    .jobs
                    .get(&a.job_id)
                    .and_then(|j| j.policy_snapshot.clone());
                if let (Some(then), Some(now)) = (then, now)
                    && then == a.policy_snapshot
                {
                    a.policy_snapshot = now;
                }
                Input::Approve(a)
            }
            other => other.clone(),
        };
        let p = process(
            &mut other,
            &ctx,
            rec.entry.cause.clone(),
            rec.entry.log_time,
            input,
        );
        record_verdicts(&p.entry.events, &mut other_verdicts);
        other_waits.record(&p.entry.events, p.entry.log_time);
        // A schedule the input made or woke is paused before anything else is decided.
        pause_hypothesised(
            &mut other,
            &ctx,
            alt,
            &rec.entry.cause,
            rec.entry.log_time,
            &mut seen,
        );
        entries += 1;
        events += rec.entry.events.len() as u64;
        reporting.done(entries, events, rec.offset);
        Ok(Flow::Continue)
    })?;
    let a = outcomes(&actual, &actual_verdicts);
    let b = outcomes(&other, &other_verdicts);
    let tenant = |id: &String| {
        a.get(id)
            .or_else(|| b.get(id))
            .map_or("", |(t, _, _)| t.as_str())
    };
    let ids: BTreeSet<&String> = a
        .keys()
        .chain(b.keys())
        .filter(|id| visible(tenant(id)))
        .collect();
    let mut rows = Vec::new();
    let mut totals: BTreeMap<&'static str, usize> = BTreeMap::new();
    for id in &ids {
        let (tenant_id, topic, x) = a.get(*id).cloned().unwrap_or_default();
        let (tenant_b, topic_b, y) = b.get(*id).cloned().unwrap_or_default();
        let mut differs_in = Vec::new();
        if x.verdict != y.verdict {
            differs_in.push("verdict");
        }
        if x.pool != y.pool {
            differs_in.push("pool");
        }
        if x.worker != y.worker {
            differs_in.push("worker");
        }
        if x.state != y.state {
            differs_in.push("state");
        }
        if differs_in.is_empty() {
            continue;
        }
        for d in &differs_in {
            *totals.entry(d).or_default() += 1;
        }
        rows.push(WhatIfRow {
            job_id: (*id).clone(),
            tenant_id: if tenant_id.is_empty() {
                tenant_b
            } else {
                tenant_id
            },
            topic: if topic.is_empty() { topic_b } else { topic },
            actual: x,
            alternative: y,
            differs_in,
        });
    }
    let tenant_of = |id: &str| {
        let id = id.to_owned();
        Some(tenant(&id).to_owned()).filter(|t| visible(t))
    };
    let (mut xs, mut ys) = (
        actual_waits.by_tenant(tenant_of),
        other_waits.by_tenant(tenant_of),
    );
    let tenants: BTreeSet<String> = xs.keys().chain(ys.keys()).cloned().collect();
    let waits = tenants
        .into_iter()
        .map(|t| {
            let (x, x_unplaced) = xs.remove(&t).unwrap_or_default();
            let (y, y_unplaced) = ys.remove(&t).unwrap_or_default();
            TenantWaits {
                tenant_id: t,
                actual: WaitSummary::of(x, x_unplaced),
                alternative: WaitSummary::of(y, y_unplaced),
            }
        })
        .collect();
    let schedules_not_found = (alt.paused_schedules.iter())
        .map(PausedSchedule::key)
        .filter(|k| !seen.contains(k) && !other.schedules.contains_key(k))
        .collect();
    Ok(WhatIfReport {
        jobs: ids.len(),
        schedules_not_found,
        rows,
        totals,
        waits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_summaries_take_nearest_rank_percentiles() {
        let s = WaitSummary::of((1..=200).rev().collect(), 3);
        assert_eq!((s.placed, s.unplaced), (200, 3));
        assert_eq!((s.p50_ms, s.p99_ms, s.max_ms), (100, 198, 200));
        assert_eq!(
            WaitSummary::of(vec![], 2),
            WaitSummary {
                unplaced: 2,
                ..WaitSummary::default()
            }
        );
        assert_eq!(WaitSummary::of(vec![7], 0).p99_ms, 7);
    }

    #[test]
    fn waits_run_from_the_first_acceptance_to_the_first_placement() {
        let accepted = |id: &str| {
            Event::JobAccepted(ksched_core::events::JobAccepted {
                job_id: id.into(),
                request: None,
                job_hash: String::new(),
                pools: vec![],
                routing_notes: vec![],
                unique_key: None,
            })
        };
        let scheduled = |id: &str| {
            Event::JobScheduled(ksched_core::events::JobScheduled {
                job_id: id.into(),
                attempt: 1,
                pool: "default".into(),
                worker_id: "w1".into(),
                strategy: "least_loaded".into(),
                candidates: vec![],
                notes: vec![],
                candidates_omitted: 0,
            })
        };
        let mut w = Waits::default();
        w.record(&[accepted("a"), accepted("b"), accepted("c")], 1_000);
        w.record(&[scheduled("a")], 1_040);
        w.record(&[scheduled("a"), scheduled("b")], 1_500);
        let by = w.by_tenant(|id| (id != "c").then(|| "acme".to_owned()));
        assert_eq!(by["acme"], (vec![40, 500], 0), "c's tenant is not shown");
        let by = w.by_tenant(|_| Some("acme".to_owned()));
        assert_eq!(by["acme"].1, 1, "c was never placed");
    }
}
