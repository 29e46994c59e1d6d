//! Memory held per pending job: a backlog of jobs that cannot be placed (no workers) built
//! through the real core and store, as the processor builds it (decide, persist the dirty
//! keys, evict what is cold), then the same backlog loaded back from RocksDB as a restart
//! loads it. Reported as resident memory (VmRSS) before and after, per pending job.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use ksched_core::decide::Ctx;
use ksched_core::events::{Cause, Input};
use ksched_core::policy::AllowAll;
use ksched_core::records::JobRequest;
use ksched_runtime::{Config, Engine};
use ksched_store::Store;
use serde::Serialize;

use super::{BenchArgs, offline_config, phase};

#[derive(Debug, Serialize)]
pub(super) struct Memory {
    pub pending_jobs: u64,
    pub payload_bytes: usize,
    pub rss_before_mib: f64,
    pub rss_live_mib: f64,
    pub live_bytes_per_job: f64,
    pub rss_reloaded_mib: f64,
    pub reloaded_bytes_per_job: f64,
    pub build_seconds: f64,
    pub reload_seconds: f64,
    /// Of `reload_seconds`: opening RocksDB (its write-ahead log replayed), the start's
    /// reads (`load_state`) and the lanes' windows read back before the first decision.
    pub reload_open_seconds: f64,
    pub reload_start_seconds: f64,
    pub reload_windows_seconds: f64,
    /// New rules (a timeout changed) after the restart: seconds to read and decide them,
    /// and resident memory after.
    pub new_rules_seconds: f64,
    pub rss_after_new_rules_mib: f64,
    /// What memory held live and after the restart: queued records, lanes' keys and queued
    /// timers.
    pub held_live: Held,
    pub held_reloaded: Held,
}

/// What a state holds in memory of its backlog.
#[derive(Debug, Default, Serialize, serde::Deserialize)]
pub(super) struct Held {
    pub queued_records: u64,
    pub lane_keys: u64,
    pub lanes: u64,
    #[serde(default)]
    pub timer_keys: u64,
}

impl Held {
    fn of(state: &ksched_core::state::State) -> Held {
        let lanes = || state.lanes.values().flat_map(|l| l.values());
        Held {
            queued_records: (state.jobs.iter_any_order())
                .filter(|(_, j)| j.queued_at.is_some())
                .count() as u64,
            lane_keys: lanes()
                .map(|l| (l.head().len() + l.beyond().len()) as u64)
                .sum(),
            lanes: lanes().count() as u64,
            timer_keys: state.waits.keys_in_memory() as u64,
        }
    }
}

/// Resident memory of this process, in bytes (Linux).
pub(super) fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

const MIB: f64 = 1024.0 * 1024.0;

/// The bench config's first job topic, and its rules with no bound on pending jobs: what a
/// backlog built through the core needs.
pub(super) fn backlog_rules(config: &Config) -> (String, ksched_core::rules::Rules) {
    let topic = config
        .rules
        .topics
        .keys()
        .next()
        .cloned()
        .unwrap_or_default();
    let mut rules = config.rules.clone();
    rules.limits.max_pending_per_pool = i64::MAX;
    (topic, rules)
}

pub(super) fn run(config: &Config, jobs: u64, payload_bytes: usize, dir: &Path) -> Result<Memory> {
    let before = rss_bytes();
    let started = Instant::now();
    let (topic, rules) = backlog_rules(config);
    let reconfigure = Config {
        rules,
        ..config.clone()
    }
    .reconfigure();
    {
        let mut engine = Engine::open(Store::open(dir, 0)?)?;
        configure(&mut engine, &topic, reconfigure)?;
        build_backlog(&mut engine, &topic, "pending", 0, jobs, payload_bytes)?;
        anyhow::ensure!(
            engine.state().queued.values().sum::<u64>() == jobs,
            "every bench job is pending"
        );
        let live = rss_bytes();
        let build_seconds = started.elapsed().as_secs_f64();
        let held_live = Held::of(engine.state());
        drop(engine);
        // A restart in a fresh process (this one's allocator still holds what the live state
        // freed): what a start reads, then the lanes' windows.
        let out = std::process::Command::new(std::env::current_exe()?)
            .args(["bench", "--memory-load"])
            .arg(dir)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "loading the backlog in a fresh process failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let loaded: Loaded = serde_json::from_slice(&out.stdout)?;
        anyhow::ensure!(loaded.pending == jobs, "every pending job is loaded back");
        let per = |rss: u64, base: u64| rss.saturating_sub(base) as f64 / jobs.max(1) as f64;
        Ok(Memory {
            pending_jobs: jobs,
            payload_bytes,
            rss_before_mib: before as f64 / MIB,
            rss_live_mib: live as f64 / MIB,
            live_bytes_per_job: per(live, before),
            rss_reloaded_mib: loaded.rss_after as f64 / MIB,
            reloaded_bytes_per_job: per(loaded.rss_after, loaded.rss_before),
            build_seconds,
            reload_seconds: loaded.seconds,
            reload_open_seconds: loaded.open_seconds,
            reload_start_seconds: loaded.start_seconds,
            reload_windows_seconds: loaded.windows_seconds,
            new_rules_seconds: loaded.new_rules_seconds,
            rss_after_new_rules_mib: loaded.rss_after_new_rules as f64 / MIB,
            held_live,
            held_reloaded: loaded.held,
        })
    }
}

/// Decides the bench's rules (`reconfigure`) first, as the processor does at its start.
fn configure(
    engine: &mut Engine,
    topic: &str,
    reconfigure: ksched_core::events::Reconfigure,
) -> Result<()> {
    let ctx = Ctx { policy: &AllowAll };
    let cause = Cause {
        topic: topic.to_owned(),
        partition: 0,
        offset: -1,
    };
    engine.decide(&ctx, cause, 1, Input::Reconfigure(reconfigure))?;
    Ok(())
}

/// Submits `jobs` pending jobs (100 tenants, `payload_bytes` each, ids `<name>-<n>`) to
/// `topic` through `engine`, one input a millisecond of log time, input `first` the first,
/// checkpointing every 5,000 as the processor does.
fn build_backlog(
    engine: &mut Engine,
    topic: &str,
    name: &str,
    first: u64,
    jobs: u64,
    payload_bytes: usize,
) -> Result<()> {
    let ctx = Ctx { policy: &AllowAll };
    let cause = |offset: i64| Cause {
        topic: topic.to_owned(),
        partition: 0,
        offset,
    };
    let payload = vec![7u8; payload_bytes];
    let first = i64::try_from(first).unwrap_or(0);
    let mut last = first;
    for n in 0..jobs {
        let request = JobRequest {
            job_id: format!("{name}-{n:09}"),
            topic: topic.to_owned(),
            tenant_id: format!("tenant-{}", n % 100),
            principal_id: Some("bench".into()),
            payload: payload.clone(),
            ..Default::default()
        };
        last = first + i64::try_from(n).unwrap_or(i64::MAX);
        engine.decide(&ctx, cause(last), 1_000 + last, Input::Submit(request))?;
        if n % 5_000 == 4_999 {
            engine.checkpoint(Some(last))?;
        }
    }
    engine.checkpoint(Some(last))?;
    Ok(())
}

/// Drains `jobs` pending jobs of the pool `default` built in `engine` through one worker of
/// 1,000 slots whose every job succeeds at once, deciding and checkpointing as the
/// processor does (every 1,000 inputs, with the worker's heartbeat and a Tick every 1,000
/// results: a second of log time), after input `first`; returns placements per second.
fn drain(engine: &mut Engine, first: u64, jobs: u64) -> Result<f64> {
    use ksched_core::events::Event;
    use ksched_core::records::{Heartbeat, JobResult};
    let ctx = Ctx { policy: &AllowAll };
    // One input a millisecond of log time, after the backlog's.
    let offset = std::cell::Cell::new(i64::try_from(first).unwrap_or(0) + 1);
    let now = || 1_000 + offset.get();
    let mut placed: Vec<(String, i32)> = Vec::new();
    let decide =
        |engine: &mut Engine, input: Input, placed: &mut Vec<(String, i32)>| -> Result<()> {
            let mut input = input;
            loop {
                offset.set(offset.get() + 1);
                let cause = Cause {
                    topic: "bench".into(),
                    partition: 0,
                    offset: offset.get(),
                };
                let p = engine.decide(&ctx, cause, now(), input)?;
                placed.extend(p.entry.events.iter().filter_map(|e| match e {
                    Event::JobDispatched(d) => Some((d.job_id.clone(), d.attempt)),
                    _ => None,
                }));
                if offset.get() % 1_000 == 0 {
                    engine.checkpoint(Some(offset.get()))?;
                }
                if !p.more {
                    return Ok(());
                }
                input = engine.continuation();
            }
        };
    let started = Instant::now();
    let heartbeat = |at| Heartbeat {
        worker_id: "drain".into(),
        pool: "default".into(),
        max_parallel_jobs: 1_000,
        owned_partitions: vec![0],
        sent_at: at,
        ..Default::default()
    };
    decide(engine, Input::Heartbeat(heartbeat(now())), &mut placed)?;
    let mut done = 0;
    while done < jobs {
        anyhow::ensure!(!placed.is_empty(), "nothing placed after {done} jobs");
        for (id, attempt) in std::mem::take(&mut placed) {
            let result = JobResult::succeeded(id, attempt, "drain", 1, now());
            decide(engine, Input::Result(result), &mut placed)?;
            done += 1;
            // A second of log time: the worker's heartbeat and the ticker's Tick.
            if done % 1_000 == 0 {
                decide(engine, Input::Heartbeat(heartbeat(now())), &mut placed)?;
                let tick = ksched_core::records::Tick {
                    source: "bench".into(),
                    issued_at: now(),
                    watermark: Some(now()),
                };
                decide(engine, Input::Tick(tick), &mut placed)?;
            }
        }
    }
    engine.checkpoint(Some(offset.get()))?;
    Ok(jobs as f64 / started.elapsed().as_secs_f64())
}

/// Runs `round` six times, three with `true` and three with `false`, interleaved so that a
/// machine that changes speed weighs on both alike; returns the median rate of each, in
/// that order.
fn interleaved(mut round: impl FnMut(usize, bool) -> Result<f64>) -> Result<(f64, f64)> {
    let mut rates: [Vec<f64>; 2] = Default::default();
    for (n, with) in [true, false, false, true, true, false]
        .into_iter()
        .enumerate()
    {
        rates[usize::from(!with)].push(round(n, with)?);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    Ok((median(&mut rates[0]), median(&mut rates[1])))
}

/// What `--backlog-drain` measured.
#[derive(Debug, Serialize)]
pub(super) struct Drain {
    pub pending_jobs: u64,
    /// Placements a second draining the backlog with the records past each lane's window in
    /// RocksDB, read back as the windows slide (the median of three rounds).
    pub from_storage_per_second: f64,
    /// The same with every record in memory (the median of three rounds).
    pub in_memory_per_second: f64,
    pub ratio: f64,
}

/// `ksched bench --backlog-drain N`: the cost of reading queued records back. N pending jobs
/// are built six times, three as the processor keeps them (records past each lane's window
/// leave memory) and three with every record in memory, interleaved, and each backlog is
/// drained by a worker of 1,000 slots through the real core and store (no broker needed).
pub(super) fn drain_only(args: &BenchArgs, jobs: u64) -> Result<()> {
    let (dir, config) = offline_config(args, "bench.drain.")?;
    let (topic, rules) = backlog_rules(&config);
    let reconfigure = Config {
        rules,
        ..config.clone()
    }
    .reconfigure();
    // Each round builds its backlog in a store of its own.
    let (storage, memory) = interleaved(|round, evicting| {
        let name = if evicting {
            "from storage"
        } else {
            "in memory"
        };
        phase(&format!(
            "backlog drain: {jobs} pending jobs, records {name} (round {})",
            round + 1
        ));
        let store = Store::open(&dir.path().join(format!("round-{round}")), 0)?;
        let mut state = store.load_state()?;
        if !evicting {
            state.backlog = ksched_core::state::Backlog::default();
        }
        let mut engine = Engine::with_state(store, state);
        configure(&mut engine, &topic, reconfigure.clone())?;
        build_backlog(&mut engine, &topic, "pending", 0, jobs, args.memory_payload)?;
        let in_memory = engine.state().jobs.len();
        anyhow::ensure!(
            !evicting || (in_memory as u64) < jobs,
            "{jobs} jobs fit in the windows (100 tenants, each a lane): nothing waits in storage; drain more"
        );
        let rate = drain(&mut engine, jobs, jobs)?;
        eprintln!("        {rate:.0} placements/s ({in_memory} records in memory before)");
        Ok(rate)
    })?;
    let d = Drain {
        pending_jobs: jobs,
        from_storage_per_second: storage,
        in_memory_per_second: memory,
        ratio: storage / memory.max(f64::MIN_POSITIVE),
    };
    eprintln!(
        "        from storage / in memory, medians of 3: {:.2} ({:.0} / {:.0} placements/s)",
        d.ratio, d.from_storage_per_second, d.in_memory_per_second
    );
    std::fs::write(&args.out, serde_json::to_string_pretty(&d)?)?;
    Ok(())
}

/// What `--backlog-beside` measured.
#[derive(Debug, Serialize)]
pub(super) struct Beside {
    pub backlog_jobs: u64,
    pub drained_jobs: u64,
    /// Placements a second of the drained jobs beside the backlog (the median of three).
    pub beside_backlog_per_second: f64,
    /// The same with no backlog (the median of three).
    pub no_backlog_per_second: f64,
    pub ratio: f64,
}

/// `ksched bench --backlog-beside N`: what a backlog waiting in storage costs the jobs
/// beside it. Each of six rounds (three with N pending jobs in a pool without workers,
/// three without, interleaved) builds its store through the real core and store, then
/// 100,000 jobs of another pool, and drains those with one worker of 1,000 slots (no broker
/// needed). The backlog's placement timeouts are a day: they stay pending throughout.
pub(super) fn beside_only(args: &BenchArgs, backlog: u64) -> Result<()> {
    const DRAINED: u64 = 100_000;
    let (dir, config) = offline_config(args, "bench.beside.")?;
    let (topic, mut rules) = backlog_rules(&config);
    let idle_topic = format!("{topic}.idle");
    rules.topics.insert(idle_topic.clone(), vec!["idle".into()]);
    rules
        .pools
        .insert("idle".into(), ksched_core::rules::PoolRules::default());
    rules.timing.placement_timeout_ms = 24 * 3_600_000;
    let reconfigure = Config {
        rules,
        ..config.clone()
    }
    .reconfigure();
    let (beside, alone) = interleaved(|round, with| {
        let pending = if with { backlog } else { 0 };
        phase(&format!(
            "beside a backlog: {DRAINED} jobs drained beside {pending} pending (round {})",
            round + 1
        ));
        // Each round's store goes with the round (three of ten million jobs would fill a
        // small disk).
        let round_dir = tempfile::tempdir_in(dir.path())?;
        let mut engine = Engine::open(Store::open(round_dir.path(), 0)?)?;
        configure(&mut engine, &topic, reconfigure.clone())?;
        build_backlog(
            &mut engine,
            &idle_topic,
            "idle",
            0,
            pending,
            args.memory_payload,
        )?;
        build_backlog(
            &mut engine,
            &topic,
            "work",
            pending,
            DRAINED,
            args.memory_payload,
        )?;
        let rate = drain(&mut engine, pending + DRAINED, DRAINED)?;
        let left = engine.state().queued.get("idle").copied().unwrap_or(0);
        anyhow::ensure!(
            left == pending,
            "the backlog stayed pending ({left} of {pending})"
        );
        eprintln!(
            "        {rate:.0} placements/s ({} records in memory after)",
            engine.state().jobs.len()
        );
        drop(engine);
        drop(round_dir);
        Ok(rate)
    })?;
    let b = Beside {
        backlog_jobs: backlog,
        drained_jobs: DRAINED,
        beside_backlog_per_second: beside,
        no_backlog_per_second: alone,
        ratio: beside / alone.max(f64::MIN_POSITIVE),
    };
    eprintln!(
        "        beside {backlog} pending / beside none, medians of 3: {:.2} ({:.0} / {:.0} placements/s)",
        b.ratio, b.beside_backlog_per_second, b.no_backlog_per_second
    );
    std::fs::write(&args.out, serde_json::to_string_pretty(&b)?)?;
    Ok(())
}

/// What a fresh process measured loading a backlog.
#[derive(Debug, Serialize, serde::Deserialize)]
pub(super) struct Loaded {
    pub pending: u64,
    pub rss_before: u64,
    pub rss_after: u64,
    pub seconds: f64,
    pub open_seconds: f64,
    pub start_seconds: f64,
    pub windows_seconds: f64,
    pub held: Held,
    /// Then new rules (a timeout changed), decided as the processor decides them: how long
    /// reading and deciding took, and memory after.
    #[serde(default)]
    pub new_rules_seconds: f64,
    #[serde(default)]
    pub rss_after_new_rules: u64,
}

/// Loads the store at `dir` as a restarting processor does and prints what it cost (JSON).
pub(super) fn load(dir: &Path) -> Result<()> {
    let rss_before = rss_bytes();
    let started = Instant::now();
    let store = Store::open(dir, 0)?;
    let opened = started.elapsed().as_secs_f64();
    // Ready to decide: what a start reads, and what the first decision reads before it.
    let mut state = store.load_state()?;
    let read = started.elapsed().as_secs_f64();
    state.refill_windows(&store)?;
    let seconds = started.elapsed().as_secs_f64();
    let held = Held::of(&state);
    let rss_after = rss_bytes();
    let new_rules = Instant::now();
    new_timeouts(&mut state, &store)?;
    let new_rules_seconds = new_rules.elapsed().as_secs_f64();
    let loaded = Loaded {
        pending: state.queued.values().sum(),
        rss_before,
        rss_after,
        seconds,
        open_seconds: opened,
        start_seconds: read - opened,
        windows_seconds: seconds - read,
        held,
        new_rules_seconds,
        rss_after_new_rules: rss_bytes(),
    };
    println!("{}", serde_json::to_string(&loaded)?);
    Ok(())
}

/// Puts the rules in force with a longer placement timeout, as a `Reconfigure` would:
/// what it reads from `store`, then the decision.
fn new_timeouts(state: &mut ksched_core::state::State, store: &Store) -> Result<()> {
    let raw = (state.config.as_ref()).map(|c| (c.raw.clone(), c.rules.clone()));
    let Some((raw, mut rules)) = raw else {
        anyhow::bail!("the bench's store has no rules in force");
    };
    rules.timing.placement_timeout_ms += 1_000;
    let input = Input::Reconfigure(ksched_core::events::Reconfigure {
        rules_json: rules.to_canonical_json(),
        rules_id: "bench-new-timeouts".into(),
        ..raw
    });
    state.load_for_input(&input, store)?;
    let cause = Cause {
        topic: "bench".into(),
        partition: 0,
        offset: -1,
    };
    let now = state.clock;
    let p = ksched_core::decide::process(state, &Ctx { policy: &AllowAll }, cause, now, input);
    anyhow::ensure!(
        (p.entry.events.iter()).any(|e| matches!(e, ksched_core::events::Event::ConfigApplied(_))),
        "the new rules are put in force"
    );
    Ok(())
}

/// `ksched bench --memory N`: resident memory per pending job, live and after a restart.
pub(super) fn memory_only(args: &BenchArgs, jobs: u64) -> Result<()> {
    let (dir, config) = offline_config(args, "bench.memory.")?;
    phase(&format!(
        "memory: {jobs} pending jobs with {} byte payloads",
        args.memory_payload
    ));
    let m = run(
        &config,
        jobs,
        args.memory_payload,
        &dir.path().join("store"),
    )?;
    eprintln!(
        "        live: RSS {:.0} MiB -> {:.0} MiB, {:.0} bytes per pending job (built in {:.1} s)",
        m.rss_before_mib, m.rss_live_mib, m.live_bytes_per_job, m.build_seconds
    );
    eprintln!(
        "        after a restart: RSS {:.0} MiB, {:.0} bytes per pending job (ready to decide in {:.2} s: RocksDB opened in {:.2} s, the start's reads {:.2} s, the lanes' windows {:.2} s)",
        m.rss_reloaded_mib,
        m.reloaded_bytes_per_job,
        m.reload_seconds,
        m.reload_open_seconds,
        m.reload_start_seconds,
        m.reload_windows_seconds
    );
    eprintln!(
        "        then new rules (a timeout changed): decided in {:.2} s, RSS {:.0} MiB after",
        m.new_rules_seconds, m.rss_after_new_rules_mib
    );
    for (when, h) in [
        ("live", &m.held_live),
        ("after a restart", &m.held_reloaded),
    ] {
        eprintln!(
            "        in memory {when}: {} queued records, {} keys of {} lanes, {} queued timers",
            h.queued_records, h.lane_keys, h.lanes, h.timer_keys
        );
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&m)?)?;
    Ok(())
}
