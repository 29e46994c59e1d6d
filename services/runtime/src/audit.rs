//! Replay-based audit (SPEC §8): every answer from the journal alone, with no scheduler
//! running, and nothing ever written to a live topic.
//!
//! - [`rebuild`]: the projection from offset 0, with the same `apply` as the processor;
//!   [`compare`] checks it against a live store or checkpoint, key by key.
//! - [`verify`]: re-runs `decide` on every recorded input and checks it reproduces the
//!   recorded entry byte for byte.
//! - [`timeline`]: everything the journal says about one job.
//! - [`replay_until`]: the projection as of a time or an offset.
//! - [`what_if`]: the recorded inputs decided under other pools or another policy.
//! - [`export_jsonl`] / [`export_avro`]: the journal for other systems, secrets hidden.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use ksched_core::decide::{Ctx, process};
use ksched_core::events::{Cause, Event, Input, JobState, JournalEntry, Reconfigure, Verdict};
use ksched_core::state::State;
use ksched_core::{apply_entry, hash::sha256_parts};
use ksched_policy::{PolicyBundle, RegoEngine};
use ksched_store::{CFS, Store};
use rdkafka::ClientConfig;
use serde_json::{Value, json};

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::replay::{Flow, JournalRecord, Replayer, journal_watermarks, read_journal};
use crate::settings::PoolsFile;

/// Where the journal is.
#[derive(Debug, Clone)]
pub struct Source {
    pub client: ClientConfig,
    pub topic: String,
    pub partition: i32,
}

impl Source {
    fn read(&self, from: i64, f: impl FnMut(JournalRecord) -> Result<Flow>) -> Result<(i64, i64)> {
        read_journal(&self.client, &self.topic, self.partition, from, f)
    }

    /// The journal's end (next offset) now.
    pub fn end(&self) -> Result<i64> {
        Ok(journal_watermarks(&self.client, &self.topic, self.partition)?.1)
    }
}

/// How far a replay has come, for progress displays.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub entries: u64,
    pub events: u64,
    pub offset: i64,
    /// The journal's end when the replay started.
    pub end: i64,
    pub elapsed: Duration,
}

impl Progress {
    pub fn events_per_sec(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Estimated time left, from the offset rate so far.
    pub fn eta(&self) -> Option<Duration> {
        let done = self.offset.max(1) as f64;
        let left = (self.end - self.offset).max(0) as f64;
        (done > 0.0).then(|| Duration::from_secs_f64(self.elapsed.as_secs_f64() * left / done))
    }
}

/// What a rebuild did.
#[derive(Debug, Clone)]
pub struct RebuildReport {
    pub entries: u64,
    pub events: u64,
    pub last_offset: Option<i64>,
    pub elapsed: Duration,
}

impl RebuildReport {
    pub fn events_per_sec(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Replays the journal from offset 0 (up to and including `until`, if given) into a new
/// store at `into`, with the processor's `apply`.
pub fn rebuild(
    src: &Source,
    into: &Path,
    until: Option<i64>,
    mut progress: impl FnMut(&Progress),
) -> Result<RebuildReport> {
    let store = Store::open(into, partition_u16(src.partition)?)?;
    if store.watermark()?.is_some() {
        return Err(Error::Audit(format!(
            "{} already holds a projection; rebuild needs an empty directory",
            into.display()
        )));
    }
    let end = src.end()?;
    let started = Instant::now();
    let mut engine = Engine::open(store)?;
    let mut r = Replayer::new(&mut engine);
    let mut last_report = Instant::now();
    src.read(0, |rec| {
        if until.is_some_and(|u| rec.offset > u) {
            return Ok(Flow::Stop);
        }
        r.apply(rec.offset, &rec.entry)?;
        if last_report.elapsed() >= Duration::from_millis(500) {
            last_report = Instant::now();
            progress(&Progress {
                entries: r.applied,
                events: r.events,
                offset: rec.offset,
                end,
                elapsed: started.elapsed(),
            });
        }
        Ok(Flow::Continue)
    })?;
    r.persist()?;
    let report = RebuildReport {
        entries: r.applied,
        events: r.events,
        last_offset: r.last_offset,
        elapsed: started.elapsed(),
    };
    engine.store().flush()?;
    Ok(report)
}

fn partition_u16(p: i32) -> Result<u16> {
    u16::try_from(p).map_err(|_| Error::Audit(format!("journal partition {p} out of range")))
}

/// One key on which two projections disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    pub column_family: String,
    pub key: String,
    /// `only in rebuilt`, `only in live`, or `values differ`.
    pub kind: &'static str,
}

fn printable(key: &[u8]) -> String {
    if key
        .iter()
        .all(|b| b.is_ascii_graphic() || *b == b' ' || *b == 0)
    {
        String::from_utf8_lossy(key).replace('\0', "|")
    } else {
        key.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Compares every column family of two projections, key by key and byte by byte.
pub fn compare(rebuilt: &Store, live: &Store) -> Result<Vec<Difference>> {
    let mut out = Vec::new();
    for cf in CFS {
        let a: BTreeMap<Vec<u8>, Vec<u8>> = rebuilt.raw(cf)?.into_iter().collect();
        let b: BTreeMap<Vec<u8>, Vec<u8>> = live.raw(cf)?.into_iter().collect();
        let keys: BTreeSet<&Vec<u8>> = a.keys().chain(b.keys()).collect();
        for k in keys {
            let kind = match (a.get(k), b.get(k)) {
                (Some(x), Some(y)) if x == y => continue,
                (Some(_), Some(_)) => "values differ",
                (Some(_), None) => "only in rebuilt",
                (None, _) => "only in live",
            };
            out.push(Difference {
                column_family: (*cf).to_owned(),
                key: printable(k),
                kind,
            });
        }
    }
    Ok(out)
}

/// A recorded entry that `decide` does not reproduce.
#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    pub offset: i64,
    pub input: String,
    pub recorded: Vec<String>,
    pub recomputed: Vec<String>,
    pub detail: String,
}

#[derive(Debug, Clone)]
pub struct VerifyReport {
    pub entries: u64,
    pub events: u64,
    pub divergences: Vec<Divergence>,
    pub elapsed: Duration,
}

fn summary(entry: &JournalEntry) -> Vec<String> {
    entry
        .events
        .iter()
        .map(|e| match e.job_id().or(e.worker_id()) {
            Some(id) => format!("{}({id})", e.name()),
            None => e.name().to_owned(),
        })
        .collect()
}

/// Where two entries first differ, for the report.
fn first_difference(recorded: &JournalEntry, recomputed: &JournalEntry) -> String {
    if recorded.events.len() != recomputed.events.len() {
        return format!(
            "{} events recorded, {} recomputed",
            recorded.events.len(),
            recomputed.events.len()
        );
    }
    for (i, (a, b)) in recorded.events.iter().zip(&recomputed.events).enumerate() {
        if a != b {
            return format!("event {i} ({}): recorded {a:?}, recomputed {b:?}", a.name());
        }
    }
    "the events are equal but their encoding differs".into()
}

/// Re-runs `decide` over every recorded input, in journal order, from the state the recorded
/// events produce, and checks that it reproduces each entry byte for byte (when the entry was
/// written with the current schema; structurally otherwise). After a divergence it continues
/// from the recorded events, so one tampered entry is reported once. `scratch` holds the
/// working projection (an empty directory).
pub fn verify(
    src: &Source,
    scratch: &Path,
    policy: &RegoEngine,
    mut progress: impl FnMut(&Progress),
) -> Result<VerifyReport> {
    let store = Store::open(scratch, partition_u16(src.partition)?)?;
    let end = src.end()?;
    let started = Instant::now();
    let mut engine = Engine::open(store)?;
    let mut since_persist: Vec<JournalEntry> = Vec::new();
    let mut entries = 0u64;
    let mut events = 0u64;
    let mut last_offset = None;
    let mut divergences = Vec::new();
    let mut last_report = Instant::now();
    let ctx = Ctx { policy };
    src.read(0, |rec| {
        let recorded = &rec.entry;
        let recomputed = engine.decide_again(&ctx, recorded)?;
        let writer_is_current = ksched_codec::registry()
            .split(&rec.raw)
            .ok()
            .and_then(|(w, _)| {
                ksched_codec::registry()
                    .current(&w.name)
                    .map(|c| c.fingerprint == w.fingerprint)
            })
            .unwrap_or(false);
        let same = if writer_is_current {
            ksched_codec::encode(&recomputed).is_ok_and(|bytes| bytes == rec.raw)
        } else {
            recomputed == *recorded
        };
        if !same {
            divergences.push(Divergence {
                offset: rec.offset,
                input: format!(
                    "{}({})",
                    recorded.input.kind(),
                    recorded.input.job_id().unwrap_or("")
                ),
                recorded: summary(recorded),
                recomputed: summary(&recomputed),
                detail: first_difference(recorded, &recomputed),
            });
            // Continue from what the journal says happened, not from what we recomputed.
            engine.reload()?;
            for e in since_persist.iter().chain(std::iter::once(recorded)) {
                engine.fold(e)?;
            }
        }
        since_persist.push(recorded.clone());
        entries += 1;
        events += recorded.events.len() as u64;
        last_offset = Some(rec.offset);
        if engine.checkpoint_due() {
            engine.checkpoint(last_offset)?;
            since_persist.clear();
        }
        if last_report.elapsed() >= Duration::from_millis(500) {
            last_report = Instant::now();
            progress(&Progress {
                entries,
                events,
                offset: rec.offset,
                end,
                elapsed: started.elapsed(),
            });
        }
        Ok(Flow::Continue)
    })?;
    Ok(VerifyReport {
        entries,
        events,
        divergences,
        elapsed: started.elapsed(),
    })
}

/// One journal entry that concerns a job.
#[derive(Debug, Clone)]
pub struct TimelineItem {
    pub offset: i64,
    pub entry: JournalEntry,
}

fn concerns(entry: &JournalEntry, job_id: &str) -> bool {
    entry.input.job_id() == Some(job_id)
        || entry.events.iter().any(|e| {
            e.job_id() == Some(job_id)
                || matches!(e, Event::JobDuplicate(d) if d.existing_job_id == job_id)
                || matches!(e, Event::WorkerLost(l) if l.job_ids.iter().any(|j| j == job_id))
        })
}

/// Every entry that concerns `job_id`, in journal order, secrets hidden; only the events of
/// each entry that concern the job are kept.
pub fn timeline(src: &Source, job_id: &str) -> Result<Vec<TimelineItem>> {
    let mut out = Vec::new();
    src.read(0, |rec| {
        if concerns(&rec.entry, job_id) {
            let mut entry = rec.entry.redacted();
            entry.events.retain(|e| {
                e.job_id() == Some(job_id)
                    || matches!(e, Event::JobDuplicate(d) if d.existing_job_id == job_id)
                    || matches!(e, Event::WorkerLost(l) if l.job_ids.iter().any(|j| j == job_id))
            });
            out.push(TimelineItem {
                offset: rec.offset,
                entry,
            });
        }
        Ok(Flow::Continue)
    })?;
    Ok(out)
}

/// Up to where a time-travel replay goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// The entry at this journal offset is the last applied.
    Offset(i64),
    /// The last entry applied is the last whose log time is at or before this (ms).
    Time(i64),
}

/// Replays into a new store at `into` up to `until`; returns the store and the last offset
/// and log time applied.
pub fn replay_until(
    src: &Source,
    into: &Path,
    until: Until,
) -> Result<(Store, Option<(i64, i64)>)> {
    let store = Store::open(into, partition_u16(src.partition)?)?;
    let mut engine = Engine::open(store)?;
    let mut r = Replayer::new(&mut engine);
    let mut last = None;
    src.read(0, |rec| {
        let past = match until {
            Until::Offset(o) => rec.offset > o,
            Until::Time(t) => rec.entry.log_time > t,
        };
        if past {
            return Ok(Flow::Stop);
        }
        r.apply(rec.offset, &rec.entry)?;
        last = Some((rec.offset, rec.entry.log_time));
        Ok(Flow::Continue)
    })?;
    r.persist()?;
    Ok((engine.into_store(), last))
}

/// What to decide under instead of what was in force.
#[derive(Debug, Clone, Default)]
pub struct Alternative {
    /// Replaces topics, pools and tenants (timers, retries and thresholds stay as recorded).
    pub pools: Option<PoolsFile>,
    /// Replaces the policy bundle.
    pub policy: Option<PolicyBundle>,
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
    pub topic: String,
    pub actual: Outcome,
    pub alternative: Outcome,
    /// `pool`, `worker`, `verdict`, `state`.
    pub differs_in: Vec<&'static str>,
}

#[derive(Debug, Clone)]
pub struct WhatIfReport {
    pub jobs: usize,
    pub rows: Vec<WhatIfRow>,
    /// How many jobs differ in each respect.
    pub totals: BTreeMap<&'static str, usize>,
}

fn outcomes(
    state: &State,
    verdicts: &BTreeMap<String, Verdict>,
) -> BTreeMap<String, (String, Outcome)> {
    state
        .jobs
        .iter()
        .map(|(id, j)| {
            (
                id.clone(),
                (
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

/// Replays the recorded inputs through `decide` under `alt` and reports, per job, where the
/// outcome differs from what happened. Recorded approvals and rejections stand in the
/// alternative world (an approval that matched its job's policy snapshot then is taken to
/// match the snapshot the job has there). Holds both worlds in memory.
pub fn what_if(src: &Source, alt: &Alternative, policy: &RegoEngine) -> Result<WhatIfReport> {
    let mut actual = State::new();
    let mut other = State::new();
    let mut actual_verdicts = BTreeMap::new();
    let mut other_verdicts = BTreeMap::new();
    let ctx = Ctx { policy };
    src.read(0, |rec| {
        apply_entry(&mut actual, &rec.entry);
        record_verdicts(&rec.entry.events, &mut actual_verdicts);
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
        Ok(Flow::Continue)
    })?;
    let a = outcomes(&actual, &actual_verdicts);
    let b = outcomes(&other, &other_verdicts);
    let ids: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let mut rows = Vec::new();
    let mut totals: BTreeMap<&'static str, usize> = BTreeMap::new();
    for id in &ids {
        let (topic, x) = a.get(*id).cloned().unwrap_or_default();
        let (topic_b, y) = b.get(*id).cloned().unwrap_or_default();
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
            topic: if topic.is_empty() { topic_b } else { topic },
            actual: x,
            alternative: y,
            differs_in,
        });
    }
    Ok(WhatIfReport {
        jobs: ids.len(),
        rows,
        totals,
    })
}

fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Byte arrays (payloads) as base64 strings, so exports stay readable.
fn payloads_as_base64(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, x) in map.iter_mut() {
                if k == "payload"
                    && let Value::Array(items) = x
                {
                    let bytes: Vec<u8> = items
                        .iter()
                        .filter_map(|i| i.as_u64().and_then(|u| u8::try_from(u).ok()))
                        .collect();
                    *x = Value::String(base64(&bytes));
                } else {
                    payloads_as_base64(x);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(payloads_as_base64),
        _ => {}
    }
}

/// A tagged enum value (`{"Submit": {...}}`) as `{"type": name, ...}`.
fn tagged(value: Value, name: &str) -> Value {
    let inner = match value {
        Value::Object(map) if map.len() == 1 => map.into_iter().next().map(|(_, v)| v),
        other => Some(other),
    };
    match inner {
        Some(Value::Object(mut fields)) => {
            fields.insert("type".into(), Value::String(name.to_owned()));
            Value::Object(fields)
        }
        other => json!({ "type": name, "value": other }),
    }
}

/// One journal record as exported JSON: secrets hidden, payloads base64, inputs and events
/// tagged with their record type.
pub fn entry_json(partition: i32, offset: i64, entry: &JournalEntry) -> Value {
    let e = entry.redacted();
    let input = tagged(
        serde_json::to_value(&e.input).unwrap_or(Value::Null),
        e.input.kind(),
    );
    let events: Vec<Value> = e
        .events
        .iter()
        .map(|ev| tagged(serde_json::to_value(ev).unwrap_or(Value::Null), ev.name()))
        .collect();
    let mut v = json!({
        "partition": partition,
        "offset": offset,
        "cause": { "topic": e.cause.topic, "partition": e.cause.partition, "offset": e.cause.offset },
        "log_time": e.log_time,
        "input": input,
        "events": events,
    });
    payloads_as_base64(&mut v);
    v
}

/// Writes the journal as JSON Lines; returns the number of entries.
pub fn export_jsonl(src: &Source, out: &mut dyn Write) -> Result<u64> {
    let mut n = 0;
    src.read(0, |rec| {
        let line = entry_json(rec.partition, rec.offset, &rec.entry);
        writeln!(out, "{line}").map_err(crate::error::io("writing the export"))?;
        n += 1;
        Ok(Flow::Continue)
    })?;
    Ok(n)
}

/// Writes the journal as an Avro object container file (schema `io.ksched.JournalEntry`,
/// deflate), secrets hidden; returns the number of entries.
pub fn export_avro(src: &Source, out: &mut dyn Write) -> Result<u64> {
    let entry_schema = ksched_codec::registry()
        .current("io.ksched.JournalEntry")
        .ok_or_else(|| Error::Audit("no JournalEntry schema".into()))?
        .schema;
    let mut writer = apache_avro::Writer::with_codec(
        entry_schema,
        out,
        apache_avro::Codec::Deflate(Default::default()),
    )
    .map_err(|e| Error::Audit(format!("starting the Avro export: {e}")))?;
    writer
        .add_user_metadata("ksched.journal.topic".into(), src.topic.as_bytes())
        .map_err(|e| Error::Audit(e.to_string()))?;
    let mut n = 0;
    src.read(0, |rec| {
        writer
            .append_ser(rec.entry.redacted())
            .map_err(|e| Error::Audit(format!("writing the Avro export: {e}")))?;
        n += 1;
        Ok(Flow::Continue)
    })?;
    writer
        .flush()
        .map_err(|e| Error::Audit(format!("writing the Avro export: {e}")))?;
    Ok(n)
}

/// Cause of an entry, shortened for tables.
pub fn cause_text(c: &Cause) -> String {
    format!("{}/{}@{}", c.topic, c.partition, c.offset)
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(super::base64(input.as_bytes()), expected);
        }
    }
}
