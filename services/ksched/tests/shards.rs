//! Shards (docs/architecture.md, "Shards"), against `ksched run` processes and the real
//! broker: six shards, each with its own pool and job topic, shared by three instances
//! through the owners' group, one standby per shard (`processor.standby_replicas: 1`). SDK
//! workers run a steady load of jobs on every pool while one instance is SIGKILLed (its
//! shards move to the two others) and then added back (the shards spread again). A tenant
//! with `max_concurrent_jobs: 2` sends bursts to every shard. Afterwards, from each shard's
//! journal: every job ended SUCCEEDED exactly once, on its own shard only; no attempt was
//! dispatched twice; the capped tenant never had more than 2 jobs placed at once on a shard
//! (tenant limits are per shard); and `audit verify` reproduces every shard's journal.
//!
//! A second test sends misdirected and hostile records straight to Kafka with two shards
//! (a result on the wrong shard's partition, another tenant's cancel, a cancel for a job no
//! shard holds) and checks that each shard decides only about what it holds.
//!
//! CI runs the short version; `KSCHED_SHARDS_FULL=1 cargo test -p ksched --test shards --
//! --nocapture` runs the full one (a heavier load held longer in every phase).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use ksched_worker::{Outcome, Worker};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const SHARDS: u32 = 6;
/// The capped tenant's limit of jobs placed at once (per shard).
const CAP: usize = 2;

/// How hard and how long the test pushes.
struct Load {
    /// Pause between two rounds of the steady load (one job per shard each round).
    every: Duration,
    /// How long each phase (all up, one killed, added back) holds the load once settled.
    hold: Duration,
    /// Jobs of the capped tenant per shard in each burst.
    burst: usize,
}

impl Load {
    fn from_env() -> Load {
        if std::env::var("KSCHED_SHARDS_FULL").is_ok_and(|v| v == "1") {
            Load {
                every: Duration::from_millis(20),
                hold: Duration::from_secs(20),
                burst: 60,
            }
        } else {
            Load {
                every: Duration::from_millis(150),
                hold: Duration::from_secs(2),
                burst: 12,
            }
        }
    }
}

/// The shards an instance owns and those it stands by for, from its readiness report.
fn roles(c: &RunningScheduler) -> Option<(BTreeSet<u64>, BTreeSet<u64>)> {
    let (_, body) = http(&format!("{}/health/ready", c.api), "GET", None).ok()?;
    let v: Value = serde_json::from_str(&body).ok()?;
    let set = |k: &str| -> Option<BTreeSet<u64>> {
        Some(v[k].as_array()?.iter().filter_map(Value::as_u64).collect())
    };
    Some((set("owned_shards")?, set("standby_shards")?))
}

/// Every shard owned by exactly one of `instances`, each owning `per` of them, and (with
/// `standbys`) stood by for by exactly one other.
fn spread(instances: &[&RunningScheduler], per: usize, standbys: bool) -> bool {
    let Some(all) = instances
        .iter()
        .map(|c| roles(c))
        .collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    (0..u64::from(SHARDS)).all(|s| {
        all.iter().filter(|(o, _)| o.contains(&s)).count() == 1
            && (!standbys || all.iter().filter(|(_, b)| b.contains(&s)).count() == 1)
    }) && all.iter().all(|(o, _)| o.len() == per)
}

fn describe(instances: &[&RunningScheduler]) -> String {
    instances
        .iter()
        .map(|c| format!("{:?}", roles(c)))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn shards_spread_over_instances_and_move_when_one_is_killed() {
    let load = Load::from_env();
    let a = RunningScheduler::start_sharded(
        SHARDS,
        &format!("tenants:\n  capped: {{max_concurrent_jobs: {CAP}}}\n"),
        "  standby_replicas: 1\n",
    );
    let mut b = a.another_instance();
    let c = a.another_instance();
    // Cooperative-sticky: each newcomer gets its share, taken from the others'; each shard
    // gets one standby among the two instances that do not own it.
    wait_until("the shards to spread over three instances", 90, || {
        spread(&[&a, &b, &c], 2, true)
    });
    println!("all up: {}", describe(&[&a, &b, &c]));

    let rt = tokio::runtime::Runtime::new().unwrap();
    let stop = CancellationToken::new();
    for s in 0..SHARDS {
        let _guard = rt.enter();
        let mut cfg = a.worker_config(&format!("w-{s}"));
        cfg.pool = format!("pool-{s}");
        let worker = Worker::new(cfg).unwrap();
        let stop = stop.clone();
        rt.spawn(async move {
            worker
                .run(
                    |_| async {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        Outcome::succeeded()
                    },
                    stop,
                )
                .await
        });
    }
    let producer = || -> BaseProducer {
        ClientConfig::new()
            .set("bootstrap.servers", &a.bootstrap)
            .set("enable.idempotence", "true")
            .create()
            .unwrap()
    };
    let topic = {
        let prefix = a.prefix.clone();
        move |s: u32| format!("{prefix}jobs-{s}")
    };

    // The steady load: one job per shard every `load.every`, from the start to the end.
    let ids: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    let phase: Arc<Mutex<&'static str>> = Arc::new(Mutex::new("up"));
    let loading = Arc::new(AtomicBool::new(true));
    let steady = {
        let (ids, phase, loading, topic) = (ids.clone(), phase.clone(), loading.clone(), topic);
        let producer = producer();
        let every = load.every;
        std::thread::spawn(move || {
            let mut i = 0u64;
            while loading.load(Ordering::Relaxed) {
                let tag = *phase.lock().unwrap();
                for s in 0..SHARDS {
                    let id = format!("acme:{tag}-{s}-{i}");
                    submit(&producer, &topic(s), &id);
                    ids.lock().unwrap().insert(id, s);
                }
                i += 1;
                std::thread::sleep(every);
            }
            producer.flush(Duration::from_secs(10)).unwrap();
        })
    };
    let bursts = producer();
    let burst = |tag: &str| {
        for s in 0..SHARDS {
            for i in 0..load.burst {
                let id = format!("capped:{tag}-{s}-{i}");
                submit_as(&bursts, &format!("{}jobs-{s}", a.prefix), &id, "capped");
                ids.lock().unwrap().insert(id, s);
            }
        }
        bursts.flush(Duration::from_secs(10)).unwrap();
    };
    burst("up");
    // Jobs run on every shard, whichever instance owns it. An instance answers from its own
    // store, current only for the shards it owns or stands by for: ask them all (a store
    // that does not follow a shard can lag, never contradict: SUCCEEDED is final).
    let succeeded = |apis: &[&str], id: &str| {
        apis.iter()
            .any(|api| job_state(api, id).as_deref() == Some("SUCCEEDED"))
    };
    let apis = [a.api.clone(), b.api.clone(), c.api.clone()];
    let apis: Vec<&str> = apis.iter().map(String::as_str).collect();
    wait_until("a job of every shard to succeed", 90, || {
        (0..SHARDS).all(|s| succeeded(&apis, &format!("acme:up-{s}-0")))
    });
    std::thread::sleep(load.hold);

    let killed = Instant::now();
    *phase.lock().unwrap() = "killed";
    let b_shards = roles(&b).unwrap().0;
    b.kill();
    burst("killed");
    wait_until("the two survivors to own every shard", 60, || {
        spread(&[&a, &c], 3, false)
    });
    let moved = killed.elapsed().as_secs_f64();
    wait_until("each shard to have a standby again", 30, || {
        spread(&[&a, &c], 3, true)
    });
    println!(
        "shards {b_shards:?} moved {moved:.1} s after the SIGKILL (lease session timeout 2 s), standbys chosen again at {:.1} s: {}",
        killed.elapsed().as_secs_f64(),
        describe(&[&a, &c])
    );
    std::thread::sleep(load.hold);

    // Added back (same host and data directory): the shards spread again.
    let back = Instant::now();
    *phase.lock().unwrap() = "back";
    b.start_again();
    burst("back");
    wait_until("the shards to spread again", 90, || {
        spread(&[&a, &b, &c], 2, false)
    });
    let moved = back.elapsed().as_secs_f64();
    wait_until("the standbys to spread again", 30, || {
        spread(&[&a, &b, &c], 2, true)
    });
    println!(
        "instance added back: it owns {:?} {moved:.1} s after it started, standbys chosen again at {:.1} s: {}",
        roles(&b).unwrap().0,
        back.elapsed().as_secs_f64(),
        describe(&[&a, &b, &c])
    );
    std::thread::sleep(load.hold);
    loading.store(false, Ordering::Relaxed);
    steady.join().unwrap();

    let ids = ids.lock().unwrap().clone();
    println!("{} jobs submitted over {SHARDS} shards", ids.len());
    for id in ids.keys() {
        wait_until(&format!("{id} to succeed"), 120, || succeeded(&apis, id));
    }
    stop.cancel();

    // From every shard's journal: each job succeeded once, on its own shard; no attempt was
    // dispatched twice; the capped tenant never had more than CAP jobs placed at once.
    let mut succeeded: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    let mut capped_peaks = Vec::new();
    // Every shard's journal in one export; each line names its partition (its shard).
    let (code, export, err) = a.cli(&["audit", "--all-shards", "export"]);
    assert_eq!(code, 0, "{err}");
    let mut by_shard: BTreeMap<u32, Vec<Value>> = BTreeMap::new();
    for line in export.lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        let s = u32::try_from(entry["partition"].as_i64().unwrap()).unwrap();
        by_shard.entry(s).or_default().push(entry);
    }
    assert_eq!(
        by_shard.keys().copied().collect::<Vec<_>>(),
        (0..SHARDS).collect::<Vec<_>>(),
        "every shard's journal exported"
    );
    for (s, entries) in by_shard {
        let mut dispatched: BTreeMap<(String, i64), u32> = BTreeMap::new();
        let mut placed: BTreeSet<String> = BTreeSet::new();
        let mut peak = 0;
        for entry in entries {
            for e in entry["events"].as_array().into_iter().flatten() {
                let job = e["job_id"].as_str().unwrap_or_default().to_owned();
                let capped = job.starts_with("capped:");
                match e["type"].as_str() {
                    Some("JobScheduled") if capped => {
                        placed.insert(job.clone());
                        peak = peak.max(placed.len());
                    }
                    Some("JobDispatched") => {
                        *dispatched
                            .entry((job.clone(), e["attempt"].as_i64().unwrap()))
                            .or_default() += 1;
                    }
                    Some(
                        "JobRetrying" | "JobFailed" | "JobCancelled" | "JobTimedOut"
                        | "DeadLettered" | "JobQuarantined",
                    ) => {
                        placed.remove(&job);
                    }
                    _ => {}
                }
                if e["type"].as_str() == Some("JobSucceeded") {
                    placed.remove(&job);
                    let n = succeeded.entry(job).or_insert((s, 0));
                    assert_eq!(n.0, s, "a job succeeded on two shards");
                    n.1 += 1;
                }
            }
        }
        let twice: Vec<_> = dispatched.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "shard {s}: attempts dispatched twice: {twice:?}"
        );
        assert!(
            peak <= CAP,
            "shard {s}: the capped tenant had {peak} jobs placed at once (limit {CAP})"
        );
        capped_peaks.push(peak);
    }
    // Every recorded decision made again, shard by shard, in one command.
    let (code, out, err) = a.cli(&["audit", "--all-shards", "verify", "-o", "json"]);
    assert_eq!(code, 0, "audit verify of every shard: {out}{err}");
    let verified: Value = serde_json::from_str(&out).unwrap();
    let shards = verified["shards"].as_array().unwrap();
    assert_eq!(shards.len(), SHARDS as usize, "{out}");
    for (s, v) in shards.iter().enumerate() {
        assert_eq!(v["shard"], s, "{out}");
        assert!(v["entries"].as_u64().unwrap() > 0, "{out}");
        assert_eq!(v["divergences"], serde_json::json!([]), "{out}");
    }
    // A job's story without knowing its shard: the shards that never saw it say so, and
    // the command answers with the one that did.
    let (id, shard) = ids.iter().next().unwrap();
    let (code, out, err) = a.cli(&["audit", "--all-shards", "job", id]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("== shard {shard} ")), "{out}");
    assert!(out.contains("JobSucceeded"), "{out}");
    assert_eq!(
        out.matches("says nothing about job").count(),
        SHARDS as usize - 1,
        "{out}"
    );
    let (code, _, err) = a.cli(&["audit", "--all-shards", "job", "no-such-job"]);
    assert_eq!(code, 3, "not found on any shard: {err}");
    // An offset is one partition's: refused across shards.
    let (code, _, err) = a.cli(&["audit", "--all-shards", "at", "--offset", "3"]);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("give --shard"), "{err}");
    println!("the capped tenant's most jobs placed at once, per shard: {capped_peaks:?}");
    // The limit was reached, not only respected: bursts of CAP x 6 jobs queue behind it.
    assert!(capped_peaks.iter().all(|p| *p == CAP), "{capped_peaks:?}");
    for (id, shard) in &ids {
        assert_eq!(
            succeeded.get(id),
            Some(&(*shard, 1)),
            "{id} succeeded once, on shard {shard}"
        );
    }
}

/// Sends `payload` to `topic`'s partition `partition`, keyed by `key`, and waits for it.
fn send_to(producer: &BaseProducer, topic: &str, partition: i32, key: &str, payload: &[u8]) {
    use rdkafka::producer::BaseRecord;
    producer
        .send(
            BaseRecord::to(topic)
                .partition(partition)
                .key(key)
                .payload(payload),
        )
        .unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
}

/// Every event of every shard's journal, as (shard, input type, event).
fn journal_events(c: &RunningScheduler) -> Vec<(i64, String, Value)> {
    let (code, out, err) = c.cli(&["audit", "--all-shards", "export"]);
    assert_eq!(code, 0, "{err}");
    let mut events = Vec::new();
    for line in out.lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        let shard = entry["partition"].as_i64().unwrap();
        let input = entry["input"]["type"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        for e in entry["events"].as_array().into_iter().flatten() {
            events.push((shard, input.clone(), e.clone()));
        }
    }
    events
}

/// Misdirected and hostile inputs with two shards, against the real broker: a result for a
/// running job of shard 0 written to shard 1's results partition, a cancel that claims
/// another tenant, and a cancel for a job no shard holds, each produced straight to Kafka.
/// A shard decides only about what it holds: the misdirected result is refused on shard 1
/// (`unknown_job`) and leaves the job running on shard 0; the other tenant's cancel is
/// refused (`tenant_mismatch`) by the job's shard alone and ignored by the other; the cancel
/// of a job no shard holds is journaled by neither (the documented limit with more than one
/// shard; the API answers 404 for it). The job then succeeds once, on its own shard.
#[test]
fn misdirected_and_hostile_inputs_change_nothing_on_other_shards() {
    use ksched_core::records::{CancelJob, JobResult};
    let a = RunningScheduler::start_sharded(2, "", "");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stop = CancellationToken::new();
    let release = Arc::new(AtomicBool::new(false));
    {
        let _guard = rt.enter();
        let mut cfg = a.worker_config("w-0");
        cfg.pool = "pool-0".into();
        let worker = Worker::new(cfg).unwrap();
        let (stop, release) = (stop.clone(), release.clone());
        rt.spawn(async move {
            worker
                .run(
                    move |_| {
                        let release = release.clone();
                        async move {
                            while !release.load(Ordering::Relaxed) {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            Outcome::succeeded()
                        }
                    },
                    stop,
                )
                .await
        });
    }
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &a.bootstrap)
        .create()
        .unwrap();
    let (held, queued, ghost) = ("acme:held-0", "acme:queued-1", "acme:ghost");
    submit(&producer, &format!("{}jobs-0", a.prefix), held);
    // Pool 1 has no worker: this job waits on shard 1.
    submit(&producer, &format!("{}jobs-1", a.prefix), queued);
    producer.flush(Duration::from_secs(10)).unwrap();
    wait_state(&a.api, held, "RUNNING");
    wait_until(&format!("{queued} to be known"), 60, || {
        job_state(&a.api, queued).is_some()
    });

    // The worker's result, but on shard 1's results partition (1 % 2 == 1).
    let result = JobResult::succeeded(held, 1, "w-0", 1, 1);
    let results = format!("{}results", a.prefix);
    send_to(
        &producer,
        &results,
        1,
        held,
        &ksched_codec::encode(&result).unwrap(),
    );
    // On one control partition, in this order: a cancel for a job no shard holds, another
    // tenant's cancel of the running job, and a cancel shard 1 takes (its waiting job).
    // Once both shards decided on the last two, both read past the first.
    let control = format!("{}control", a.prefix);
    let cancel = |job_id: &str, tenant: Option<&str>| CancelJob {
        job_id: job_id.into(),
        tenant_id: tenant.map(Into::into),
        principal_id: "mallory".into(),
        reason: None,
        requested_at: 1,
        batch_id: None,
    };
    for c in [
        cancel(ghost, None),
        cancel(held, Some("globex")),
        cancel(queued, None),
    ] {
        send_to(
            &producer,
            &control,
            0,
            &c.job_id,
            &ksched_codec::encode(&c).unwrap(),
        );
    }
    wait_state(&a.api, queued, "CANCELLED");
    let refused = |events: &[(i64, String, Value)], code: &str, input: &str| -> Vec<i64> {
        events
            .iter()
            .filter(|(_, i, e)| {
                i == input
                    && e["type"] == "CommandRejected"
                    && e["reason_code"] == code
                    && (e["job_id"] == held
                        || e["reason"].as_str().is_some_and(|r| r.contains(held)))
            })
            .map(|(s, _, _)| *s)
            .collect()
    };
    let mut events = Vec::new();
    wait_until(
        "the other tenant's cancel and the misdirected result to be refused",
        60,
        || {
            events = journal_events(&a);
            !refused(&events, "tenant_mismatch", "CancelJob").is_empty()
                && !refused(&events, "unknown_job", "JobResult").is_empty()
        },
    );
    assert_eq!(
        refused(&events, "tenant_mismatch", "CancelJob"),
        vec![0],
        "{events:#?}"
    );
    assert_eq!(
        refused(&events, "unknown_job", "JobResult"),
        vec![1],
        "{events:#?}"
    );
    let ghostly: Vec<_> = events
        .iter()
        .filter(|(_, _, e)| e.to_string().contains(ghost))
        .collect();
    assert!(ghostly.is_empty(), "no shard holds {ghost}: {ghostly:#?}");
    let (code, _) = http(
        &format!("{}/api/v1/jobs/{ghost}/cancel", a.api),
        "POST",
        Some(r#"{"principal": "ops"}"#),
    )
    .unwrap();
    assert_eq!(
        code, 404,
        "the API refuses a command for a job no shard holds"
    );
    assert_eq!(job_state(&a.api, held).as_deref(), Some("RUNNING"));

    release.store(true, Ordering::Relaxed);
    wait_state(&a.api, held, "SUCCEEDED");
    stop.cancel();
    let events = journal_events(&a);
    let succeeded: Vec<i64> = events
        .iter()
        .filter(|(_, _, e)| e["type"] == "JobSucceeded" && e["job_id"] == held)
        .map(|(s, _, _)| *s)
        .collect();
    assert_eq!(succeeded, vec![0], "{held} succeeded once, on its shard");
    let (code, out, err) = a.cli(&["audit", "--all-shards", "verify"]);
    assert_eq!(code, 0, "{out}{err}");
}

/// A pool moved to another shard would be read there from the beginning of its topic and
/// run every retained job again: `ksched run` refuses, naming the topic, the pool and the
/// commands that hand the position over; once it is handed over, the new shard takes only
/// what comes after, and no job runs twice.
#[test]
fn a_pool_moved_to_another_shard_is_refused_until_its_position_is_handed_over() {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use std::process::Command;
    let mut a = RunningScheduler::start_sharded(2, "", "");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stop = CancellationToken::new();
    {
        let _guard = rt.enter();
        for pool in ["pool-0", "pool-1"] {
            let mut cfg = a.worker_config(&format!("w-{pool}"));
            cfg.pool = pool.into();
            let worker = Worker::new(cfg).unwrap();
            let stop = stop.clone();
            rt.spawn(async move { worker.run(|_| async { Outcome::succeeded() }, stop).await });
        }
    }
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &a.bootstrap)
        .create()
        .unwrap();
    let topic = format!("{}jobs-0", a.prefix);
    for i in 0..10 {
        submit(&producer, &topic, &format!("before-{i}"));
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    for i in 0..10 {
        wait_state(&a.api, &format!("before-{i}"), "SUCCEEDED");
    }
    a.terminate();

    // pool-0 (and its topic jobs-0) moves from shard 0 to shard 1.
    let pools = a.dir.path().join("pools.yaml");
    let text = std::fs::read_to_string(&pools).unwrap();
    std::fs::write(
        &pools,
        text.replace("pool-0: {shard: 0}", "pool-0: {shard: 1}"),
    )
    .unwrap();
    let refused = Command::new(bin())
        .args(["run", "--config"])
        .arg(&a.config)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    for part in [
        format!("job topic {topic} (pools pool-0) would move from shard 0 to shard 1"),
        "kafka-consumer-groups.sh".to_owned(),
        "--reset-offsets --to-offset".to_owned(),
    ] {
        assert!(said.contains(&part), "{part:?} in {said}");
    }

    // Hand the position over as the refusal says (what its kafka-consumer-groups.sh
    // commands do): shard 1's group commits the offsets it names.
    let mut offsets = rdkafka::TopicPartitionList::new();
    for command in said.split("kafka-consumer-groups.sh").skip(1) {
        let words: Vec<&str> = command.split_whitespace().collect();
        let after = |flag: &str| words[words.iter().position(|w| *w == flag).unwrap() + 1];
        let (t, p) = after("--topic").split_once(':').unwrap();
        let offset: i64 = after("--to-offset").trim_end_matches(';').parse().unwrap();
        offsets
            .add_partition_offset(t, p.parse().unwrap(), rdkafka::Offset::Offset(offset))
            .unwrap();
        assert_eq!(
            after("--group"),
            format!("{}processor-shard-1", a.prefix),
            "the joining shard's group"
        );
    }
    assert!(offsets.count() > 0, "{said}");
    let new: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &a.bootstrap)
        .set("group.id", format!("{}processor-shard-1", a.prefix))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    new.commit(&offsets, CommitMode::Sync).unwrap();

    a.start_again();
    submit(&producer, &topic, "after-0");
    producer.flush(Duration::from_secs(10)).unwrap();
    wait_state(&a.api, "after-0", "SUCCEEDED");
    std::thread::sleep(Duration::from_secs(2));
    // Every job exists once, on one shard: none was read again and run a second time.
    let listed = json(&format!("{}/api/v1/jobs?topic={topic}&limit=100", a.api));
    let ids: Vec<&str> = listed["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 11, "{ids:?}");
    for j in listed["jobs"].as_array().unwrap() {
        assert_eq!(j["attempt"], 1, "{j}");
    }
    stop.cancel();
}
