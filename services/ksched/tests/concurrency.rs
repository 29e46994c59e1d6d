//! Concurrency keys against the real broker and two `ksched run` processes (an owner and a
//! standby): jobs of two keys limited to one at a time go to a worker that would run eight
//! at once; the owner is SIGKILLed halfway and the standby goes on. At no moment do two jobs
//! of one key run together, each key's jobs start in the order they were submitted, and
//! every job runs exactly once.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use ksched_core::records::JobRequest;
use ksched_worker::{Outcome, Worker};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};
use tokio_util::sync::CancellationToken;

/// What the worker saw of each key: jobs running now, the most at once, and the order jobs
/// started in.
#[derive(Default)]
struct Seen {
    running: BTreeMap<String, u32>,
    most: BTreeMap<String, u32>,
    started: BTreeMap<String, Vec<String>>,
    runs: BTreeMap<String, u32>,
}

#[test]
fn a_limit_of_one_is_never_two_across_a_kill_and_a_takeover() {
    let routes = |prefix: &str| {
        format!(
            "topics:\n  {prefix}jobs:\n    pools: default\n    concurrency: {{key: \"label:customer\", limit: 1}}\npools:\n  default: {{}}\n"
        )
    };
    let (mut owner, standby) = owner_and_standby_of(RunningScheduler::start_with_rules(&routes));

    let seen: Arc<Mutex<Seen>> = Arc::default();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stop = CancellationToken::new();
    {
        let _guard = rt.enter();
        let mut cfg = owner.worker_config("key-worker");
        cfg.max_parallel_jobs = 8;
        let worker = Worker::new(cfg).unwrap();
        let (s, seen) = (stop.clone(), seen.clone());
        rt.spawn(async move {
            worker
                .run(
                    move |job| {
                        let seen = seen.clone();
                        async move {
                            let key = job.dispatch.job.labels["customer"].clone();
                            let id = job.dispatch.job.job_id.clone();
                            {
                                let mut s = seen.lock().unwrap();
                                let n = s.running.entry(key.clone()).or_default();
                                *n += 1;
                                let now = *n;
                                let most = s.most.entry(key.clone()).or_default();
                                *most = (*most).max(now);
                                s.started.entry(key.clone()).or_default().push(id.clone());
                                *s.runs.entry(id).or_default() += 1;
                            }
                            tokio::time::sleep(Duration::from_millis(250)).await;
                            *seen.lock().unwrap().running.get_mut(&key).unwrap() -= 1;
                            Outcome::succeeded()
                        }
                    },
                    s,
                )
                .await
        });
    }
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &owner.bootstrap)
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    let topic = owner.job_topic.clone();
    let mut submitted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in 0..24 {
        let key = if i % 2 == 0 { "c1" } else { "c2" };
        let id = format!("acme:k{i:02}");
        let mut job = JobRequest {
            job_id: id.clone(),
            topic: topic.clone(),
            tenant_id: "acme".into(),
            ..Default::default()
        };
        job.labels.insert("customer".into(), key.into());
        produce_job(&producer, &job);
        // One at a time, so each key's queue order is its submission order.
        producer.flush(Duration::from_secs(10)).unwrap();
        submitted.entry(key.into()).or_default().push(id);
    }

    wait_until("a few jobs to run", 60, || {
        seen.lock().unwrap().runs.len() >= 6
    });
    owner.kill();
    wait_until("the standby to take over", 60, || {
        role(&standby).as_deref() == Some("owner")
    });
    wait_until("every job to run", 120, || {
        seen.lock().unwrap().runs.len() == 24
    });
    // Nothing more arrives (no job runs twice after the takeover).
    std::thread::sleep(Duration::from_secs(2));
    stop.cancel();
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen.most,
        BTreeMap::from([("c1".to_owned(), 1), ("c2".to_owned(), 1)]),
        "two jobs of one key ran at once"
    );
    assert!(
        seen.runs.values().all(|n| *n == 1),
        "a job ran twice: {:?}",
        seen.runs
    );
    assert_eq!(
        seen.started, submitted,
        "each key's jobs in submission order"
    );
    let (code, out, err) = standby.cli(&["audit", "verify"]);
    assert_eq!(code, 0, "{out}{err}");
}
