//! The scheduler against a real broker: the paths of SPEC §2-§6 end to end, as seen in the
//! journal, the projection, the dispatch topic and the DLQ.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ksched_codec::AnyRecord;
use ksched_core::events::{Event, Input, JobState};
use ksched_core::records::{ApproveJob, CancelJob};
use ksched_worker::Outcome;
use support::*;

/// A producer that sends at once (1 ms linger), for tests that stream jobs.
fn quick_producer(s: &Scheduler) -> rdkafka::producer::BaseProducer {
    ksched_testkit::client_config(&s.bootstrap)
        .set("linger.ms", "1")
        .create()
        .unwrap()
}

/// Sends `req` to the scheduler's job topic, keyed by its job id, without waiting for it.
fn send_job(
    producer: &rdkafka::producer::BaseProducer,
    s: &Scheduler,
    req: &ksched_core::records::JobRequest,
) {
    let bytes = ksched_codec::encode(req).unwrap();
    producer
        .send(
            rdkafka::producer::BaseRecord::to(&s.job_topic)
                .key(&req.job_id)
                .payload(&bytes),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    producer.poll(Duration::ZERO);
}

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

/// A worker's reports to one shard go to one results partition, whatever its jobs' ids: the
/// scheduler names it in every Dispatch (one shard too) and the SDK writes there, so a
/// worker's flush is one produce request, not one per partition its jobs' ids hash to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_answers_on_the_one_results_partition_its_dispatches_name() {
    let s = Scheduler::start(vec![]).await;
    let w = s.worker("w1", |_| async move { Outcome::succeeded() });
    s.wait_worker("w1").await;
    let ids: Vec<String> = (0..8).map(|i| format!("job-reply-{i}")).collect();
    for id in &ids {
        s.submit(&request(&s, id));
    }
    for id in &ids {
        s.wait_job(id, "SUCCEEDED", |j| j.state == JobState::Succeeded)
            .await;
    }
    let named: BTreeSet<Option<i32>> = s
        .dispatch_records()
        .into_iter()
        .filter_map(|r| match r {
            AnyRecord::Dispatch(d) if ids.contains(&d.job.job_id) => Some(d.reply_partition),
            _ => None,
        })
        .collect();
    assert_eq!(
        named.len(),
        1,
        "one partition for every dispatch to w1: {named:?}"
    );
    let reply = named
        .into_iter()
        .next()
        .flatten()
        .expect("a partition named");
    let answered: BTreeSet<(String, i32)> = s
        .journal()
        .into_iter()
        .filter(|(_, e)| matches!(&e.input, Input::Result(r) if ids.contains(&r.job_id)))
        .map(|(_, e)| (e.cause.topic, e.cause.partition))
        .collect();
    assert_eq!(
        answered.len(),
        1,
        "every result on one partition: {answered:?}"
    );
    assert_eq!(answered.into_iter().next().map(|(_, p)| p), Some(reply));
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
            batch_id: None,
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

/// Pipelining (`processor.pipelined`): batch N+1 is decided while batch N commits and before
/// N's projection is written, and nothing leaves memory meanwhile. Small batches under a
/// burst put originals and their duplicates in neighbouring batches, with jobs finishing
/// (and going cold) all along: every dispatch carries its job's payload (a job accepted in
/// the batch in flight has its payload only there), a producer retry of a job id and a
/// second job with a used idempotency key are recognised, and no job is dispatched twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_decided_while_the_batch_before_commits_see_its_effects() {
    let s = Scheduler::start(vec![
        ("KSCHED__PROCESSOR__MAX_BATCH", "8".into()),
        ("KSCHED__PROCESSOR__PIPELINED", "true".into()),
    ])
    .await;
    // One job at a time: jobs wait in the queue and are dispatched as results free the slot.
    let w = s.worker_with(
        "w1",
        |c| c.max_parallel_jobs = 1,
        |_| async { Outcome::succeeded() },
    );
    s.wait_worker("w1").await;
    let producer = quick_producer(&s);
    let send = |req: &ksched_core::records::JobRequest| send_job(&producer, &s, req);
    let job = |id: String, i: usize| {
        let mut r = request(&s, &id);
        r.payload = format!("payload of {id}").into_bytes();
        r.meta.idempotency_key = Some(format!("key-{i}"));
        r
    };
    let n = 300;
    let originals: Vec<_> = (0..n).map(|i| job(format!("p-{i}"), i)).collect();
    let (mut retries, mut rivals) = (0, 0);
    for i in 0..n {
        send(&originals[i]);
        if i % 3 == 2 {
            // A producer retry of a job sent just before: the same record (same key, so
            // the same partition, after it).
            send(&originals[i - 1]);
            retries += 1;
            // Another job with the idempotency key of one sent just before.
            send(&job(format!("q-{}", i - 2), i - 2));
            rivals += 1;
        }
    }
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(30)).unwrap();

    // Of p-i and q-i (same idempotency key) whichever came first runs; the other is a
    // duplicate.
    let winner = |i: usize| -> Option<String> {
        [format!("p-{i}"), format!("q-{i}")]
            .into_iter()
            .find(|id| s.job(id).is_some_and(|j| j.state == JobState::Succeeded))
    };
    wait_for("every job to succeed", Duration::from_secs(120), || {
        (0..n).all(|i| winner(i).is_some())
    })
    .await;
    let journal = s.journal();
    let events: Vec<&Event> = journal.iter().flat_map(|(_, e)| e.events.iter()).collect();
    let accepted = events
        .iter()
        .filter(|e| matches!(e, Event::JobAccepted(_)))
        .count();
    assert_eq!(accepted, n, "one job per idempotency key");
    let duplicates = |kind: ksched_core::events::DuplicateKind| {
        events
            .iter()
            .filter(|e| matches!(e, Event::JobDuplicate(d) if d.kind == kind))
            .count()
    };
    assert_eq!(
        duplicates(ksched_core::events::DuplicateKind::SameJobId),
        retries
    );
    assert_eq!(
        duplicates(ksched_core::events::DuplicateKind::IdempotencyKey),
        rivals
    );
    let mut dispatched = std::collections::BTreeMap::new();
    for r in s.dispatch_records() {
        if let AnyRecord::Dispatch(d) = r {
            assert_eq!(
                d.job.payload,
                format!("payload of {}", d.job.job_id).into_bytes(),
                "the payload dispatched with {}",
                d.job.job_id
            );
            *dispatched.entry(d.job.job_id.clone()).or_insert(0) += 1;
        }
    }
    assert_eq!(dispatched.len(), n);
    assert!(
        dispatched.values().all(|c| *c == 1),
        "a job dispatched twice"
    );
    assert!(s.dead_letters().is_empty(), "{:?}", s.dead_letters());
    // And none of it by way of a failed batch and a rebuild (which would read everything
    // from the store written since).
    assert_eq!(s.status.metrics.recoveries.get(), 0, "the processor failed");
    w.stop().await;
    // Stopped, its last batch written: the projection is what a replay of the journal in
    // its order makes of it, and its watermark is the journal's last entry.
    let mut s = s;
    s.stop();
    let journal = s.journal();
    let mut replay = ksched_core::state::State::new();
    for (_, e) in &journal {
        ksched_core::apply_entry(&mut replay, e);
    }
    let stored = s.store.jobs().unwrap();
    assert_eq!(stored.len(), replay.jobs.len());
    for (id, job) in stored {
        assert_eq!(Some(&job), replay.jobs.get(&id), "job {id}");
    }
    assert_eq!(
        s.store.watermark().unwrap(),
        journal.last().map(|(o, _)| *o),
        "the store's watermark"
    );
}

/// A job accepted in one batch and dispatched in the next, decided while the first is still
/// unwritten (pipelining): its payload is read from the batch in flight, not from the store,
/// which does not have it yet. One input per batch; no worker until a heartbeat of a new one
/// (produced here, 15 ms after the job) makes the next batch place it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_placed_in_the_batch_after_its_acceptance_is_dispatched_with_its_payload() {
    // Ticks (and their watermark markers) once a second, so that few inputs come between.
    let s = Scheduler::start(vec![
        ("KSCHED__PROCESSOR__MAX_BATCH", "1".into()),
        ("KSCHED__PROCESSOR__TICK_INTERVAL_MS", "1000".into()),
        ("KSCHED__PROCESSOR__PIPELINED", "true".into()),
    ])
    .await;
    let heartbeats = s.topic("heartbeats");
    let producer: rdkafka::producer::BaseProducer = ksched_testkit::client_config(&s.bootstrap)
        .set("linger.ms", "0")
        .create()
        .unwrap();
    let send = |topic: &str, key: &str, bytes: Vec<u8>| {
        producer
            .send(
                rdkafka::producer::BaseRecord::to(topic)
                    .key(key)
                    .payload(&bytes),
            )
            .map_err(|(e, _)| e)
            .unwrap();
        // Not flush: rust-rdkafka's flush polls in 100 ms steps. With linger 0 the client
        // sends at once.
        producer.poll(Duration::ZERO);
    };
    let n = 20;
    for i in 0..n {
        let mut r = request(&s, &format!("late-{i}"));
        r.payload = format!("payload of late-{i}").into_bytes();
        send(&s.job_topic, &r.job_id, ksched_codec::encode(&r).unwrap());
        tokio::time::sleep(Duration::from_millis(15)).await;
        // A new worker with room for one job: the job waiting is placed on it.
        let hb = ksched_core::records::Heartbeat {
            worker_id: format!("hw-{i}"),
            pool: "default".into(),
            max_parallel_jobs: 1,
            owned_partitions: vec![0],
            sent_at: now_ms(),
            ..Default::default()
        };
        send(
            &heartbeats,
            &hb.worker_id,
            ksched_codec::encode(&hb).unwrap(),
        );
        rdkafka::producer::Producer::flush(&producer, Duration::from_secs(10)).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut payloads = std::collections::BTreeMap::new();
    wait_for("every job dispatched", Duration::from_secs(60), || {
        for r in s.dispatch_records() {
            if let AnyRecord::Dispatch(d) = r {
                payloads.insert(d.job.job_id.clone(), d.job.payload.clone());
            }
        }
        payloads.len() == n
    })
    .await;
    for (id, payload) in &payloads {
        assert_eq!(payload, &format!("payload of {id}").into_bytes(), "{id}");
    }
    for (o, e) in s.journal() {
        for ev in &e.events {
            if matches!(ev, Event::JobAccepted(_) | Event::JobDispatched(_)) {
                eprintln!("{o} {} {:?}", ev.name(), ev.job_id());
            }
        }
    }
    assert_eq!(s.status.metrics.recoveries.get(), 0, "the processor failed");
}

/// Finished jobs leave memory after every batch, also under a load that never lets the
/// processor idle. They used to leave only when no input came for 100 ms (or, pipelined,
/// every second), so with the default settings a steady stream of jobs kept every job it
/// had finished in memory for as long as the stream lasted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_jobs_leave_memory_under_a_load_that_never_pauses() {
    let mut s = Scheduler::start(vec![]).await;
    let w = s.worker("w1", |_| async { Outcome::succeeded() });
    s.wait_worker("w1").await;
    let producer = quick_producer(&s);
    let succeeded = || {
        s.status
            .metrics
            .jobs
            .with_label_values(&[JobState::Succeeded.as_str()])
            .get()
    };
    // A job every 20 ms (the processor's first poll waits 100 ms for input), until 150
    // have finished.
    let mut sent = 0;
    let started = std::time::Instant::now();
    while succeeded() < 150 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "150 jobs did not finish in 120 s ({} did)",
            succeeded()
        );
        send_job(&producer, &s, &request(&s, &format!("steady-{sent}")));
        sent += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Read while the stream still flows: the gauge is set after each batch is written.
    let in_memory = s.status.metrics.jobs_in_memory.get();
    let finished = succeeded();
    assert!(
        in_memory < 50,
        "{in_memory} jobs in memory with {finished} finished and {} sent",
        sent
    );
    w.stop().await;
    s.stop();
}
