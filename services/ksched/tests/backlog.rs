//! A backlog far longer than the processor keeps in memory, against the real broker and two
//! `ksched run` processes (an owner and a standby). With `limits.max_work_per_entry: 4`, a
//! lane's window is its first five jobs: the records of the others wait in RocksDB and are
//! read back as the window reaches them. The owner is SIGKILLed while most of the backlog
//! waits, and the standby goes on from its own store: every job runs exactly once, and the
//! jobs of each priority start in the order they were submitted.

mod common;

use std::time::Duration;

use common::*;
use ksched_core::records::{JobRequest, Priority};
use rdkafka::producer::{BaseRecord, Producer};

const JOBS: usize = 150;

#[test]
fn a_backlog_past_the_windows_runs_once_in_queue_order_across_a_kill_and_a_takeover() {
    let routes = |prefix: &str| {
        format!("topics:\n  {prefix}jobs:\n    pools: default\npools:\n  default: {{}}\n")
    };
    let (mut owner, standby) =
        owner_and_standby_of(RunningScheduler::start_with_rules_and_scheduler(
            &routes,
            "  limits:\n    max_work_per_entry: 4\n    lane_keys_in_memory: 1\n",
        ));

    let (_rt, stop, started) = run_recording_worker(&owner, "backlog-worker", 1, 20);
    // One partition (one key): the jobs are accepted in the order they are produced. One in
    // five is CRITICAL, and goes before the BATCH ones that wait.
    let producer = producer_of(&owner);
    let topic = owner.job_topic.clone();
    let mut submitted: [Vec<String>; 2] = Default::default();
    for i in 0..JOBS {
        let critical = i % 5 == 4;
        let id = format!("{}-{i:03}", if critical { "crit" } else { "batch" });
        let job = JobRequest {
            job_id: id.clone(),
            topic: topic.clone(),
            tenant_id: "acme".into(),
            priority: if critical {
                Priority::Critical
            } else {
                Priority::Batch
            },
            ..Default::default()
        };
        let bytes = ksched_codec::encode(&job).unwrap();
        producer
            .send(BaseRecord::to(&topic).key("backlog").payload(&bytes))
            .unwrap();
        producer.poll(Duration::ZERO);
        submitted[usize::from(critical)].push(id);
    }
    producer.flush(Duration::from_secs(10)).unwrap();

    // The owner holds the windows' records, not the backlog's.
    let gauge = |text: &str, series: &str| -> f64 {
        (text.lines())
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let mut seen = (0.0, 0.0);
    wait_until("most of the backlog to wait in storage", 60, || {
        let Ok((200, text)) = http(&format!("{}/metrics", owner.api), "GET", None) else {
            return false;
        };
        seen = (
            gauge(&text, "ksched_queue_depth{pool=\"default\"}"),
            gauge(&text, "ksched_jobs_in_memory"),
        );
        seen.0 >= 50.0 && seen.1 < seen.0 / 2.0
    });
    let (queued, in_memory) = seen;
    wait_until("a fifth of the jobs to start", 60, || {
        started.lock().unwrap().len() >= JOBS / 5
    });
    owner.kill();
    let at_kill = started.lock().unwrap().len();
    wait_until("the standby to take over", 60, || {
        role(&standby).as_deref() == Some("owner")
    });
    wait_until("every job to start", 120, || {
        started.lock().unwrap().len() >= JOBS
    });
    std::thread::sleep(Duration::from_secs(2));
    stop.cancel();
    let started = started.lock().unwrap().clone();
    let mut once = started.clone();
    once.sort();
    once.dedup();
    assert_eq!(once.len(), JOBS, "a job did not run: {started:?}");
    assert_eq!(started.len(), JOBS, "a job ran twice: {started:?}");
    // Within each priority, in the order submitted: before and after the kill
    // ({at_kill} had started), from memory and from storage.
    for (priority, ids) in ["batch", "crit"].iter().zip(&submitted) {
        let order: Vec<&String> = (started.iter())
            .filter(|id| id.starts_with(priority))
            .collect();
        let expected: Vec<&String> = ids.iter().collect();
        assert_eq!(
            order, expected,
            "{priority} jobs out of order ({at_kill} started before the kill; {in_memory} records in memory with {queued} queued)"
        );
    }
    let (code, out, err) = standby.cli(&["audit", "verify"]);
    assert_eq!(code, 0, "{out}{err}");
}
