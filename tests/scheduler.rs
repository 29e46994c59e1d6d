//! The scheduler against a real broker: the paths of SPEC §2-§6 end to end, as seen in the
//! journal, the projection, the dispatch topic and the DLQ.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ksched_codec::AnyRecord;
use ksched_core::events::{Event, Input, JobState};
use ksched_core::records::{ApproveJob, CancelJob};
use ksched_worker::Outcome;
use support::*;

fn event_names(
    entries: &[(i64, ksched_core::events::JournalEntry)],
    job: &str,
) -> Vec<&'static str> {
    entries
        .iter()
        .flat_map(|(_, e)| e.events.iter())
        .filter(|e| e.job_id() == Some(job))
        .map(Event::name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_dispatch_start_result_succeeded() {
    let s = Scheduler::start(vec![]).await;
    let w = s.worker("w1", |job| async move {
        job.progress(0.5, "halfway").await;
        Outcome::succeeded()
    });
    s.wait_worker("w1").await;
    s.submit(&request(&s, "job-ok"));
    let job = s
        .wait_job("job-ok", "SUCCEEDED", |j| j.state == JobState::Succeeded)
        .await;
    assert_eq!(job.attempt, 1);
    assert_eq!(job.worker_id.as_deref(), Some("w1"));

    let journal = s.journal();
    let names = event_names(&journal, "job-ok");
    assert_eq!(
        names,
        [
            "JobAccepted",
            "PolicyEvaluated",
            "JobQueued",
            "JobScheduled",
            "JobDispatched",
            "JobRunning",
            "JobProgressed",
            "JobSucceeded",
            "BreakerCounted"
        ],
        "journal of job-ok"
    );
    // The journal records the input of every entry, with its coordinates.
    let submit = journal
        .iter()
        .find(|(_, e)| matches!(&e.input, Input::Submit(r) if r.job_id == "job-ok"))
        .unwrap();
    assert_eq!(submit.1.cause.topic, s.job_topic);
    let dispatches: Vec<_> = s
        .dispatch_records()
        .into_iter()
        .filter_map(|r| match r {
            AnyRecord::Dispatch(d) => Some(d),
            _ => None,
        })
        .collect();
    assert_eq!(dispatches.len(), 1);
    assert_eq!(
        (dispatches[0].job.job_id.as_str(), dispatches[0].attempt),
        ("job-ok", 1)
    );
    assert!(s.dead_letters().is_empty());
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retryable_failure_is_retried_and_then_succeeds() {
    let s = Scheduler::start(vec![]).await;
    let w = s.worker("w1", |job| async move {
        if job.attempt() == 1 {
            Outcome::retryable("flaky", "first attempt fails")
        } else {
            Outcome::succeeded()
        }
    });
    s.submit(&request(&s, "job-retry"));
    let job = s
        .wait_job("job-retry", "SUCCEEDED", |j| j.state == JobState::Succeeded)
        .await;
    assert_eq!(job.attempt, 2);
    let names = event_names(&s.journal(), "job-retry");
    assert!(names.contains(&"JobRetrying"), "{names:?}");
    assert_eq!(names.iter().filter(|n| **n == "JobDispatched").count(), 2);
    assert!(s.dead_letters().is_empty(), "a retry is not dead-lettered");
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_failure_goes_to_the_dlq_with_the_workers_code() {
    let s = Scheduler::start(vec![]).await;
    let w = s.worker("w1", |_| async {
        Outcome::fatal("bad_input", "payload is not JSON")
    });
    s.submit(&request(&s, "job-fatal"));
    s.wait_job("job-fatal", "FAILED", |j| j.state == JobState::Failed)
        .await;
    let dl = s.dead_letters();
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].job_id, "job-fatal");
    assert_eq!(dl[0].reason_code, "bad_input");
    assert_eq!(dl[0].reason, "payload is not JSON");
    assert_eq!(dl[0].attempts, 1);
    assert_eq!(dl[0].cause_topic, s.topic("results"));
    assert_eq!(
        s.store.dead_letters().unwrap().len(),
        1,
        "the DLQ projection"
    );
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_worker_a_job_waits_and_is_dispatched_when_one_appears() {
    let s = Scheduler::start(vec![]).await;
    s.submit(&request(&s, "job-wait"));
    let job = s
        .wait_job("job-wait", "waiting", |j| j.wait_reason.is_some())
        .await;
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(job.wait_reason.as_deref(), Some("no_workers"));
    // Not a pause: the scheduler decides three more inputs (Ticks, which retry placement)
    // and the job still waits.
    let seen = s.store.watermark().unwrap().unwrap_or(-1);
    wait_for(
        "three more journal entries",
        Duration::from_secs(30),
        || s.store.watermark().unwrap().unwrap_or(-1) >= seen + 3,
    )
    .await;
    let job = s.job("job-wait").unwrap();
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(job.wait_reason.as_deref(), Some("no_workers"));

    let w = s.worker("late", |_| async { Outcome::succeeded() });
    let job = s
        .wait_job("job-wait", "SUCCEEDED", |j| j.state == JobState::Succeeded)
        .await;
    assert_eq!(job.worker_id.as_deref(), Some("late"));
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_flow() {
    let s = Scheduler::start(vec![]).await;
    let w = s.worker("w1", |_| async { Outcome::succeeded() });
    let mut r = request(&s, "job-approve");
    r.labels.insert("approval".into(), "required".into());
    s.submit(&r);
    let job = s
        .wait_job("job-approve", "APPROVAL_REQUIRED", |j| {
            j.state == JobState::ApprovalRequired
        })
        .await;
    let snapshot = job.policy_snapshot.clone().unwrap();
    let control = s.topic("control");
    // A wrong hash is refused and journaled; the job waits on.
    s.produce(
        &control,
        "job-approve",
        &ApproveJob {
            job_id: "job-approve".into(),
            job_hash: "0".repeat(64),
            policy_snapshot: snapshot.clone(),
            approver: "bob".into(),
            comment: None,
            requested_at: now_ms(),
        },
    );
    s.produce(
        &control,
        "job-approve",
        &ApproveJob {
            job_id: "job-approve".into(),
            job_hash: job.job_hash.clone(),
            policy_snapshot: snapshot,
            approver: "bob".into(),
            comment: Some("ok".into()),
            requested_at: now_ms(),
        },
    );
    s.wait_job("job-approve", "SUCCEEDED", |j| {
        j.state == JobState::Succeeded
    })
    .await;
    let journal = s.journal();
    let rejected = journal
        .iter()
        .flat_map(|(_, e)| e.events.iter())
        .find_map(|e| match e {
            Event::CommandRejected(r) if r.job_id == "job-approve" => Some(r.clone()),
            _ => None,
        })
        .expect("the stale approval is journaled");
    assert_eq!(rejected.reason_code, "stale_job_hash");
    let names = event_names(&journal, "job-approve");
    let approved = names.iter().position(|n| *n == "JobApproved").unwrap();
    let requested = names
        .iter()
        .position(|n| *n == "ApprovalRequested")
        .unwrap();
    assert!(requested < approved);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_job_cancels_it_on_its_worker() {
    let s = Scheduler::start(vec![]).await;
    let saw_cancel = Arc::new(AtomicU32::new(0));
    let seen = saw_cancel.clone();
    let w = s.worker("w1", move |job| {
        let seen = seen.clone();
        async move {
            job.progress(0.1, "working").await;
            job.cancel.cancelled().await;
            seen.fetch_add(1, Ordering::Relaxed);
            Outcome::Cancelled
        }
    });
    s.submit(&request(&s, "job-cancel"));
    s.wait_job("job-cancel", "RUNNING", |j| j.state == JobState::Running)
        .await;
    s.produce(
        &s.topic("control"),
        "job-cancel",
        &CancelJob {
            job_id: "job-cancel".into(),
            tenant_id: Some("acme".into()),
            principal_id: "alice".into(),
            reason: Some("not needed".into()),
            requested_at: now_ms(),
        },
    );
    s.wait_job("job-cancel", "CANCELLED", |j| {
        j.state == JobState::Cancelled
    })
    .await;
    wait_for(
        "the worker to see the cancel",
        Duration::from_secs(30),
        || saw_cancel.load(Ordering::Relaxed) == 1,
    )
    .await;
    let cancels: Vec<_> = s
        .dispatch_records()
        .into_iter()
        .filter_map(|r| match r {
            AnyRecord::CancelDispatch(c) => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(cancels.len(), 1);
    assert_eq!(
        (cancels[0].job_id.as_str(), cancels[0].reason.as_str()),
        ("job-cancel", "cancelled")
    );
    // The worker's CANCELLED result arrives after the job is terminal: journaled, ignored.
    wait_for(
        "the late result to be journaled",
        Duration::from_secs(30),
        || {
            s.journal().iter().any(|(_, e)| {
                matches!(&e.input, Input::Result(r) if r.job_id == "job-cancel")
                    && matches!(e.events.first(), Some(Event::CommandRejected(_)))
            })
        },
    )
    .await;
    assert_eq!(s.job("job-cancel").unwrap().state, JobState::Cancelled);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_record_is_dead_lettered_and_the_next_record_is_processed() {
    let s = Scheduler::start(vec![]).await;
    let w = s.worker("w1", |_| async { Outcome::succeeded() });
    s.produce_raw(&s.job_topic, "job-garbage", b"{\"job_id\": \"not avro\"}");
    s.submit(&request(&s, "job-after"));
    s.wait_job("job-after", "SUCCEEDED", |j| j.state == JobState::Succeeded)
        .await;
    let dl = s.dead_letters();
    assert_eq!(dl.len(), 1, "{dl:?}");
    assert_eq!(dl[0].reason_code, "malformed_record");
    assert_eq!(dl[0].cause_topic, s.job_topic);
    assert!(dl[0].reason.contains("job-garbage"), "{}", dl[0].reason);
    assert!(dl[0].reason.contains("C3 01"), "{}", dl[0].reason);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_scheduler_resumes_from_its_store_and_the_journal() {
    let mut s = Scheduler::start(vec![]).await;
    let w = s.worker("w1", |_| async { Outcome::succeeded() });
    s.submit(&request(&s, "before"));
    s.wait_job("before", "SUCCEEDED", |j| j.state == JobState::Succeeded)
        .await;
    w.stop().await;
    s.stop();
    let entries = s.journal().len();
    assert!(entries > 0);
    // Restart on the same store and topics: nothing is replayed twice, inputs resume.
    let mut s = s.restart().await;
    let w = s.worker("w2", |_| async { Outcome::succeeded() });
    s.submit(&request(&s, "after"));
    s.wait_job("after", "SUCCEEDED", |j| j.state == JobState::Succeeded)
        .await;
    let journal = s.journal();
    let accepted = journal
        .iter()
        .flat_map(|(_, e)| e.events.iter())
        .filter(|e| matches!(e, Event::JobAccepted(_)))
        .count();
    assert_eq!(accepted, 2, "each job accepted once across the restart");
    w.stop().await;
    s.stop();
}
