//! Bad input and bad neighbours against the real broker: nothing stops or fools the
//! scheduler. Oversized, compressed, malformed and oddly written (valid) records in a stream, a record the broker
//! refuses, a topic whose timestamps producers set, and a second instance on the same
//! configuration. The stream always completes; what cannot be scheduled is dead-lettered
//! with a reason; nothing stalls.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use ksched_core::events::{Event, JobState};
use ksched_core::records::{Heartbeat, JobRequest};
use ksched_testkit::client_config;
use ksched_worker::Outcome;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use support::*;

fn produce_with(bootstrap: &str, topic: &str, key: &str, bytes: &[u8], props: &[(&str, &str)]) {
    let mut cfg = client_config(bootstrap);
    for (k, v) in props {
        cfg.set(*k, *v);
    }
    let producer: BaseProducer = cfg.create().unwrap();
    producer
        .send(BaseRecord::to(topic).key(key).payload(bytes))
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(Duration::from_secs(30)).unwrap();
}

fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    client_config(bootstrap).create().unwrap()
}

async fn all_terminal(s: &Scheduler, ids: &[String]) {
    for id in ids {
        s.wait_job(id, "terminal", |j| j.state.is_terminal()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_in_a_stream_are_dead_lettered_and_the_stream_completes() {
    let s = Scheduler::start(vec![]).await;
    let w = s.worker("w1", |_| async { Outcome::succeeded() });
    s.wait_worker("w1").await;
    let mut ids = Vec::new();
    let mut submit_plain = |s: &Scheduler, n: usize| {
        for i in 0..n {
            let id = format!("plain-{}-{i}", ids.len());
            s.submit(&request(s, &id));
            ids.push(id);
        }
    };
    submit_plain(&s, 20);

    // A 900 kB job: over limits.max_record_bytes (512 KiB), refused before decoding.
    let mut big = request(&s, "big");
    big.payload = vec![b'x'; 900 * 1024];
    let bytes = ksched_codec::encode(&big).unwrap();
    produce_with(
        &s.bootstrap,
        &s.job_topic,
        "big",
        &bytes,
        &[("message.max.bytes", "2000000")],
    );
    submit_plain(&s, 5);

    // Jobs from producers of every compression codec Kafka clients use.
    let mut odd_but_valid = Vec::new();
    for codec in ["gzip", "snappy", "lz4", "zstd"] {
        let id = format!("compressed-{codec}");
        let bytes = ksched_codec::encode(&request(&s, &id)).unwrap();
        produce_with(
            &s.bootstrap,
            &s.job_topic,
            &id,
            &bytes,
            &[("compression.type", codec)],
        );
        odd_but_valid.push(id);
    }
    // A job as a Go producer using hamba/avro writes it: its labels map as one block with a
    // negative count and the block's size in bytes, the entries in Go's random order. Valid
    // Avro, not what apache-avro writes; it was dead-lettered as malformed before.
    let mut go = request(&s, "written-by-hamba");
    go.labels = [("a", "1"), ("b", "2")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let canonical = ksched_codec::encode(&go).unwrap();
    let map: &[u8] = &[0x04, 0x02, b'a', 0x02, b'1', 0x02, b'b', 0x02, b'2', 0x00];
    let at = canonical
        .windows(map.len())
        .position(|w| w == map)
        .expect("the labels in the encoding");
    let mut bytes = canonical[..at].to_vec();
    // count -2, size 8, "b" -> "2", "a" -> "1", end
    bytes.extend([
        0x03, 0x10, 0x02, b'b', 0x02, b'2', 0x02, b'a', 0x02, b'1', 0x00,
    ]);
    bytes.extend(&canonical[at + map.len()..]);
    produce_with(&s.bootstrap, &s.job_topic, "written-by-hamba", &bytes, &[]);
    odd_but_valid.push("written-by-hamba".to_owned());
    // Garbage, a heartbeat with a NaN load and one claiming a partition the topic lacks.
    s.produce_raw(&s.job_topic, "junk", b"\x00\x01 not avro");
    let heartbeats = s.topic("heartbeats");
    s.produce(
        &heartbeats,
        "nan",
        &Heartbeat {
            worker_id: "nan".into(),
            pool: "default".into(),
            cpu_load: f64::NAN,
            owned_partitions: vec![0],
            ..Default::default()
        },
    );
    s.produce(
        &heartbeats,
        "far",
        &Heartbeat {
            worker_id: "far".into(),
            pool: "default".into(),
            owned_partitions: vec![99],
            ..Default::default()
        },
    );
    submit_plain(&s, 20);

    all_terminal(&s, &ids).await;
    for id in ids.iter().chain(&odd_but_valid) {
        let j = s
            .wait_job(id, "SUCCEEDED", |j| j.state == JobState::Succeeded)
            .await;
        assert_eq!(j.attempt, 1, "{id}");
    }
    let dl: BTreeMap<String, String> = s
        .dead_letters()
        .into_iter()
        .map(|d| (d.reason_code.clone(), d.reason))
        .collect();
    let big_reason = dl
        .get("record_too_large")
        .expect("the 900 kB job is dead-lettered");
    assert!(
        big_reason.contains("limits.max_record_bytes"),
        "{big_reason}"
    );
    assert!(dl.contains_key("malformed_record"), "{dl:?}");
    assert!(s.job("big").is_none(), "never accepted");
    let refused: Vec<String> = s
        .journal()
        .into_iter()
        .flat_map(|(_, e)| e.events)
        .filter_map(|e| match e {
            Event::CommandRejected(r) if r.reason_code == "invalid_heartbeat" => Some(r.reason),
            _ => None,
        })
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(refused.iter().any(|r| r.contains("NaN")));
    assert!(refused.iter().any(|r| r.contains("partition 99")));
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_whose_journal_entry_the_broker_refuses_is_set_aside() {
    let s = Scheduler::start(vec![]).await;
    let w = s.worker("w1", |_| async { Outcome::succeeded() });
    s.wait_worker("w1").await;
    // The journal now refuses records over 64 kB (an operator's mistake, or a smaller limit
    // than ksched was started with): one input's entry cannot be written, ever.
    let journal = s.topic("journal");
    let mut change = AlterConfig::new(ResourceSpecifier::Topic(&journal));
    change = change.set("max.message.bytes", "65536");
    let r = admin(&s.bootstrap)
        .alter_configs(&[change], &AdminOptions::new())
        .await
        .unwrap();
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut ids = Vec::new();
    for i in 0..10 {
        let id = format!("before-{i}");
        s.submit(&request(&s, &id));
        ids.push(id);
    }
    let mut heavy = request(&s, "heavy");
    // Within limits.max_payload_bytes, and incompressible (the processor's producer uses lz4).
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    heavy.payload = (0..100 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    s.submit(&heavy);
    for i in 0..10 {
        let id = format!("after-{i}");
        s.submit(&request(&s, &id));
        ids.push(id);
    }
    for id in &ids {
        s.wait_job(id, "SUCCEEDED", |j| j.state == JobState::Succeeded)
            .await;
    }
    let dl = s.dead_letters();
    let aside: Vec<_> = dl
        .iter()
        .filter(|d| d.reason_code == "processing_failed")
        .collect();
    assert_eq!(aside.len(), 1, "{dl:?}");
    assert_eq!(aside[0].job_id, "heavy");
    assert!(aside[0].reason.contains("set aside"), "{}", aside[0].reason);
    assert!(s.job("heavy").is_none());
    assert!(s.status.metrics.set_aside.get() >= 1);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_topic_whose_producers_set_timestamps_is_refused_with_the_fix() {
    let bootstrap = ksched_testkit::bootstrap_servers().unwrap();
    let prefix = format!("{}.", ksched_testkit::unique("ts"));
    let control = format!("{prefix}control");
    let topic = NewTopic::new(&control, 1, TopicReplication::Fixed(1))
        .set("message.timestamp.type", "CreateTime");
    admin(&bootstrap)
        .create_topics(&[topic], &AdminOptions::new())
        .await
        .unwrap();
    let Err(err) = Scheduler::try_start(vec![("KSCHED__TOPICS__PREFIX", prefix.clone())]).await
    else {
        panic!("a control topic with CreateTime was accepted");
    };
    assert!(
        err.contains(&control) && err.contains("CreateTime"),
        "{err}"
    );
    assert!(
        err.contains("message.timestamp.type=LogAppendTime"),
        "the fix: {err}"
    );
}

/// A worker for `s`, once it has run a first job.
async fn running_a_job(s: &Scheduler) -> WorkerHandle {
    let w = s.worker("w1", |_| async { Outcome::succeeded() });
    s.wait_worker("w1").await;
    s.submit(&request(s, "first"));
    s.wait_job("first", "SUCCEEDED", |j| j.state == JobState::Succeeded)
        .await;
    w
}

/// Waits until `store` shows job `id` SUCCEEDED.
async fn wait_succeeded(store: &ksched_store::Store, id: &str, who: &str) {
    wait_for(
        &format!("{who} to show {id} SUCCEEDED"),
        Duration::from_secs(60),
        || {
            store
                .job(id)
                .unwrap()
                .is_some_and(|j| j.state == JobState::Succeeded)
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_stands_by_and_takes_over_when_the_first_stops() {
    let mut s = Scheduler::start(vec![]).await;
    let w = running_a_job(&s).await;
    // The same configuration on another machine (another data directory).
    let dir = tempfile::tempdir().unwrap();
    let mut config = s.config.clone();
    config.settings.storage.data_dir = dir.path().join("data");
    let second = ksched_runtime::Scheduler::start(config).await.unwrap();
    assert!(
        second.wait_ready(Duration::from_secs(60)),
        "the second caught up with the journal"
    );
    assert!(!second.status.is_owner(), "the second stands by");
    assert!(
        s.status.is_owner() && s.status.stopped().is_none(),
        "the first owns"
    );
    // The first keeps scheduling; the standby's store follows the journal.
    s.submit(&request(&s, "during"));
    s.wait_job("during", "SUCCEEDED", |j| j.state == JobState::Succeeded)
        .await;
    wait_succeeded(&second.store, "during", "the standby").await;

    // The first stops (as on SIGTERM): the second owns the journal after the lease's
    // session timeout, and schedules.
    s.stop();
    wait_for(
        "the second to own the journal",
        Duration::from_secs(60),
        || second.status.is_owner(),
    )
    .await;
    s.submit(&request(&s, "after"));
    wait_succeeded(&second.store, "after", "the new owner").await;
    w.stop().await;
    second.stop().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_lease_a_second_instance_fences_the_first_and_one_gives_way() {
    let s = Scheduler::start(vec![("KSCHED__PROCESSOR__LEASE", "false".into())]).await;
    let w = running_a_job(&s).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = s.config.clone();
    assert!(!config.settings.processor.lease);
    config.settings.storage.data_dir = dir.path().join("data");
    let second = ksched_runtime::Scheduler::start(config).await.unwrap();
    // Each fences the other as it (re)starts; the one fenced twice in a row stops.
    wait_for("one of the two to stop", Duration::from_secs(120), || {
        s.status.stopped().is_some() || second.status.stopped().is_some()
    })
    .await;
    let second_gave_way = second.status.stopped().is_some();
    let (stopped, other) = if second_gave_way {
        (&second.status, &s.store)
    } else {
        (&s.status, &second.store)
    };
    let why = stopped.stopped().unwrap();
    assert!(
        why.contains("another processor took over") || why.contains("took its inputs"),
        "{why}"
    );
    assert!(!stopped.is_caught_up(), "not ready");
    // The other one schedules.
    s.submit(&request(&s, "second"));
    wait_succeeded(other, "second", "the instance that stayed").await;
    w.stop().await;
    // The one that gave way reports why it stopped; the other stops cleanly.
    match second.stop() {
        Ok(()) => assert!(!second_gave_way, "the second gave way, yet stopped cleanly"),
        Err(
            e @ (ksched_runtime::Error::Fenced { .. } | ksched_runtime::Error::Replaced { .. }),
        ) => {
            assert!(second_gave_way, "the second stayed, yet stopped with: {e}")
        }
        Err(e) => panic!("the second stopped with: {e}"),
    }
}

/// Two instances starting at once initialise the shard's two transactional ids one after
/// the other, so each can be left holding one: a fence on the second id alone must not count
/// toward giving way, or both instances could stop. Here another client takes the second id
/// twice in a minute; the processor recovers each time and keeps scheduling (it stopped at
/// the second fence when every fenced id counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_on_the_second_transactional_id_alone_do_not_stop_the_processor() {
    let s = Scheduler::start(vec![("KSCHED__PROCESSOR__LEASE", "false".into())]).await;
    assert_eq!(s.config.settings.processor.transactional_producers, 2);
    let w = running_a_job(&s).await;
    let id = format!("{}-journal-0-b", s.config.settings.processor.group_id);
    let recoveries = || s.status.metrics.recoveries.get();
    for round in 0..2 {
        let before = recoveries();
        let other: BaseProducer = client_config(&s.bootstrap)
            .set("transactional.id", &id)
            .create()
            .unwrap();
        other.init_transactions(Duration::from_secs(30)).unwrap();
        // Jobs until the processor has used its second producer, been fenced and recovered.
        let mut n = 0;
        while recoveries() == before {
            assert!(n < 20, "round {round}: the processor never met the fence");
            let job = format!("r{round}-{n}");
            s.submit(&request(&s, &job));
            s.wait_job(&job, "SUCCEEDED", |j| j.state == JobState::Succeeded)
                .await;
            n += 1;
        }
        assert!(
            s.status.stopped().is_none(),
            "round {round}: the processor stopped: {:?}",
            s.status.stopped()
        );
        let job = format!("after-{round}");
        s.submit(&request(&s, &job));
        s.wait_job(&job, "SUCCEEDED", |j| j.state == JobState::Succeeded)
            .await;
    }
    w.stop().await;
}

#[test]
fn requests_are_journaled_once() {
    // The request travels in the entry's input only (JobAccepted carries none): a job near
    // the size limit makes one journal record of about its size, not two or three.
    let r = JobRequest {
        job_id: "j".into(),
        payload: vec![1; 100_000],
        ..Default::default()
    };
    let entry = ksched_core::events::JournalEntry {
        cause: Default::default(),
        log_time: 0,
        input: ksched_core::events::Input::Submit(r.clone()),
        events: vec![Event::JobAccepted(ksched_core::events::JobAccepted {
            job_id: "j".into(),
            request: None,
            job_hash: String::new(),
            pools: vec![],
            routing_notes: vec![],
            unique_key: None,
        })],
        format: ksched_core::events::DECISION_FORMAT,
    };
    let bytes = ksched_codec::encode(&entry).unwrap();
    assert!(bytes.len() < 101_000, "{} bytes", bytes.len());
}

/// A transaction that a crashed processor left open on its shard's second transactional id
/// (`<id>-b`) is aborted when the shard's processor starts again, even one configured with a
/// single producer: the journal's readers (read_committed) are not held behind it until the
/// transaction times out, and the setting can change between runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_left_open_on_either_producer_is_aborted_at_start() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;

    let mut s = Scheduler::start(vec![(
        "KSCHED__PROCESSOR__TRANSACTIONAL_PRODUCERS",
        "1".into(),
    )])
    .await;
    assert_eq!(s.config.settings.processor.transactional_producers, 1);
    let w = running_a_job(&s).await;
    s.stop();
    // What a processor that died mid-transaction leaves: a record in the journal, in a
    // transaction that stays open for ten minutes unless someone aborts it.
    let journal = s.topic("journal");
    let id = format!("{}-journal-0-b", s.config.settings.processor.group_id);
    let zombie: BaseProducer = client_config(&s.bootstrap)
        .set("transactional.id", &id)
        .set("transaction.timeout.ms", "600000")
        .create()
        .unwrap();
    zombie.init_transactions(Duration::from_secs(30)).unwrap();
    zombie.begin_transaction().unwrap();
    zombie
        .send(BaseRecord::to(&journal).partition(0).key("x").payload("x"))
        .map_err(|(e, _)| e)
        .unwrap();
    zombie.flush(Duration::from_secs(30)).unwrap();
    std::mem::forget(zombie);

    let s = s.restart().await;
    s.submit(&request(&s, "after"));
    s.wait_job("after", "SUCCEEDED", |j| j.state == JobState::Succeeded)
        .await;
    // The journal shows it to a read_committed reader.
    let reader: BaseConsumer = client_config(&s.bootstrap)
        .set("group.id", ksched_testkit::unique("reader"))
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(&journal, 0, rdkafka::Offset::Beginning)
        .unwrap();
    reader.assign(&tpl).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut seen = false;
    while !seen && std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = reader.poll(Duration::from_millis(200))
            && let Some(Ok(entry)) = m
                .payload()
                .map(ksched_codec::decode::<ksched_core::events::JournalEntry>)
        {
            seen = entry
                .events
                .iter()
                .any(|e| matches!(e, Event::JobSucceeded(j) if j.job_id == "after"));
        }
    }
    assert!(
        seen,
        "the journal's committed records stop at the transaction left open on {id}"
    );
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_short_of_its_reserve_refuses_new_jobs_and_nothing_else() {
    let mut s = Scheduler::start(vec![]).await;
    // A job accepted before the disk runs short, still running when it does.
    let w = s.worker("w1", |_| async {
        tokio::time::sleep(Duration::from_secs(4)).await;
        Outcome::succeeded()
    });
    s.wait_worker("w1").await;
    let running = "disk-running";
    s.submit(&request(&s, running));
    s.wait_job(running, "RUNNING", |j| j.state == JobState::Running)
        .await;
    // A reserve larger than any disk: the disk is short from here on.
    s.stop();
    s.config.settings.storage.min_free_disk_bytes = 1 << 62;
    let mut s = s.restart().await;
    let refused = "disk-new";
    s.submit(&request(&s, refused));
    // The running job's own id again: a duplicate, as ever, not a refusal.
    s.submit(&request(&s, running));
    wait_for(
        "the new job to be dead-lettered",
        Duration::from_secs(60),
        || s.dead_letters().iter().any(|d| d.job_id == refused),
    )
    .await;
    // What was accepted before goes on: its result is taken, and it ends.
    let j = s
        .wait_job(running, "SUCCEEDED", |j| j.state == JobState::Succeeded)
        .await;
    assert_eq!(j.dlq_reason, None, "the duplicate left it alone");
    let dl = s.dead_letters();
    let d = dl.iter().find(|d| d.job_id == refused).unwrap();
    assert_eq!(d.reason_code, "storage_full", "{d:?}");
    assert!(
        d.reason.contains("storage.min_free_disk_bytes"),
        "{}",
        d.reason
    );
    assert!(
        (dl.iter())
            .filter(|d| d.job_id == running)
            .all(|d| d.reason_code == "duplicate_job_id"),
        "the duplicate is decided as ever: {dl:?}"
    );
    let journal = s.journal();
    let accepted = |id: &str| {
        (journal.iter()).any(|(_, e)| {
            (e.events.iter()).any(|ev| matches!(ev, Event::JobAccepted(a) if a.job_id == id))
        })
    };
    assert!(
        !accepted(refused),
        "refused before it was journaled as a job"
    );
    assert!(s.job(refused).is_none());
    // Once space is freed (here: no reserve), the same id is taken and runs.
    s.stop();
    s.config.settings.storage.min_free_disk_bytes = 0;
    let s = s.restart().await;
    s.submit(&request(&s, refused));
    s.wait_job(refused, "SUCCEEDED", |j| j.state == JobState::Succeeded)
        .await;
    w.stop().await;
}
