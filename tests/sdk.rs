//! The worker SDK against the scheduler and a real broker: bounded parallelism, progress,
//! cancellation, and graceful shutdown (finish within the grace period, hand back after it).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use ksched_core::events::{Event, JobState};
use ksched_worker::{Outcome, Worker, WorkerConfig};
use support::*;
use tokio_util::sync::CancellationToken;

fn config(s: &Scheduler, id: &str, grace: Duration) -> WorkerConfig {
    let mut cfg = WorkerConfig::new(&s.bootstrap, id, "default");
    cfg.topic_prefix = s.prefix.clone();
    cfg.heartbeat_interval = Duration::from_millis(300);
    cfg.shutdown_grace = grace;
    cfg.report_host_load = false;
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_runs_more_than_max_parallel_jobs() {
    let s = Scheduler::start(vec![]).await;
    let running = Arc::new(AtomicI32::new(0));
    let peak = Arc::new(AtomicI32::new(0));
    let mut cfg = config(&s, "w1", Duration::from_secs(5));
    cfg.max_parallel_jobs = 2;
    let (r, p) = (running.clone(), peak.clone());
    let token = CancellationToken::new();
    let worker = Worker::new(cfg).unwrap();
    let t = token.clone();
    let handle = tokio::spawn(async move {
        worker
            .run(
                move |job| {
                    let (r, p) = (r.clone(), p.clone());
                    async move {
                        let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                        p.fetch_max(now, Ordering::SeqCst);
                        job.progress(0.5, "half").await;
                        // Held until a second job runs beside it (bounded): a worker that
                        // ran one job at a time would leave the peak at 1 whatever the timing.
                        let until = std::time::Instant::now() + Duration::from_secs(2);
                        while p.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < until {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        r.fetch_sub(1, Ordering::SeqCst);
                        Outcome::succeeded()
                    }
                },
                t,
            )
            .await
    });
    s.wait_worker("w1").await;
    for i in 0..8 {
        s.submit(&request(&s, &format!("par-{i}")));
    }
    for i in 0..8 {
        s.wait_job(&format!("par-{i}"), "SUCCEEDED", |j| {
            j.state == JobState::Succeeded
        })
        .await;
    }
    assert!(
        peak.load(Ordering::SeqCst) <= 2,
        "peak {}",
        peak.load(Ordering::SeqCst)
    );
    assert_eq!(peak.load(Ordering::SeqCst), 2, "it did run two at once");
    let history = s.store.history("par-0").unwrap();
    assert!(history.iter().any(|h| h.event == "JobProgressed"));
    token.cancel();
    handle.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_running_jobs_within_the_grace_period() {
    let s = Scheduler::start(vec![]).await;
    let token = CancellationToken::new();
    let worker = Worker::new(config(&s, "w1", Duration::from_secs(10))).unwrap();
    let t = token.clone();
    let handle = tokio::spawn(async move {
        worker
            .run(
                |_| async {
                    tokio::time::sleep(Duration::from_millis(1_500)).await;
                    Outcome::succeeded()
                },
                t,
            )
            .await
    });
    s.wait_worker("w1").await;
    s.submit(&request(&s, "slow"));
    s.wait_job("slow", "RUNNING", |j| j.state == JobState::Running)
        .await;
    token.cancel(); // shutdown while the job runs
    handle.await.unwrap().unwrap();
    let job = s
        .wait_job("slow", "SUCCEEDED", |j| j.state == JobState::Succeeded)
        .await;
    assert_eq!(job.attempt, 1, "finished, not handed back");
    // The scheduler saw the worker draining.
    wait_for("a draining heartbeat", Duration::from_secs(30), || {
        s.store
            .workers()
            .unwrap()
            .iter()
            .any(|(id, w)| id == "w1" && w.heartbeat.draining)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_grace_period_running_jobs_are_handed_back_and_run_elsewhere() {
    let s = Scheduler::start(vec![]).await;
    let token = CancellationToken::new();
    let worker = Worker::new(config(&s, "w1", Duration::from_millis(300))).unwrap();
    let t = token.clone();
    let handle = tokio::spawn(async move {
        worker
            .run(
                |job| async move {
                    job.cancel.cancelled().await;
                    Outcome::Cancelled
                },
                t,
            )
            .await
    });
    s.wait_worker("w1").await;
    s.submit(&request(&s, "handed"));
    s.wait_job("handed", "RUNNING", |j| j.state == JobState::Running)
        .await;
    token.cancel();
    handle.await.unwrap().unwrap();
    let w2 = s.worker("w2", |_| async { Outcome::succeeded() });
    let job = s
        .wait_job("handed", "SUCCEEDED", |j| j.state == JobState::Succeeded)
        .await;
    assert_eq!(job.attempt, 2);
    assert_eq!(job.worker_id.as_deref(), Some("w2"));
    let retried = s
        .journal()
        .into_iter()
        .flat_map(|(_, e)| e.events)
        .any(|e| matches!(e, Event::JobRetrying(r) if r.job_id == "handed" && r.error_code == "handed_back"));
    assert!(retried, "the hand-back is journaled as handed_back");
    w2.stop().await;
}

/// A job done within `start_report_delay` is reported by its result alone: no JobStarted on
/// the results topic, and the scheduler journals its start and its success in one entry
/// (one input record and one journal entry fewer per short job). A job that runs longer
/// reports its start first, while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_job_is_reported_by_its_result_alone_a_long_one_starts_first() {
    use ksched_codec::AnyRecord;
    let s = Scheduler::start(vec![]).await;
    let w = s.worker_with(
        "w1",
        |c| c.start_report_delay = Duration::from_millis(500),
        |job| async move {
            if job.job_id() == "long" {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Outcome::succeeded()
        },
    );
    s.wait_worker("w1").await;
    s.submit(&request(&s, "short"));
    s.wait_job("short", "SUCCEEDED", |j| j.state == JobState::Succeeded)
        .await;
    s.submit(&request(&s, "long"));
    s.wait_job("long", "RUNNING", |j| j.state == JobState::Running)
        .await;
    s.wait_job("long", "SUCCEEDED", |j| j.state == JobState::Succeeded)
        .await;
    w.stop().await;

    let reports: Vec<(String, &str)> = read_all(&s.bootstrap, &s.topic("results"), |b| {
        ksched_codec::decode_any(b).unwrap()
    })
    .into_iter()
    .filter_map(|(_, r)| match r {
        AnyRecord::JobStarted(x) => Some((x.job_id, "started")),
        AnyRecord::JobResult(x) => Some((x.job_id, "result")),
        _ => None,
    })
    .collect();
    let of = |id: &str| -> Vec<&str> {
        reports
            .iter()
            .filter(|(j, _)| j == id)
            .map(|(_, k)| *k)
            .collect()
    };
    assert_eq!(of("short"), ["result"], "{reports:?}");
    assert_eq!(of("long"), ["started", "result"], "{reports:?}");
    // The short job's start and success are journaled by the one entry of its result.
    let journal = s.journal();
    let entry = journal
        .iter()
        .map(|(_, e)| e)
        .find(|e| {
            e.events
                .iter()
                .any(|ev| matches!(ev, Event::JobSucceeded(j) if j.job_id == "short"))
        })
        .expect("the short job's success is journaled");
    assert!(
        entry
            .events
            .iter()
            .any(|ev| matches!(ev, Event::JobRunning(j) if j.job_id == "short")),
        "{:?}",
        entry.events
    );
}
