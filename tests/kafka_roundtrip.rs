//! The foundation loop against a real broker: a JobRequest produced in a Kafka transaction is
//! consumed read_committed, decoded, and equal to what was sent; an aborted one is never seen.
//! A journal reader ([`PartitionTail`]) whose consumer stops fetching replaces it.

use std::time::Duration;

use ksched_core::records::{Budget, JobMeta, JobRequest, Priority};
use ksched_runtime::tail::PartitionTail;
use ksched_testkit::{bootstrap_servers, client_config, create_topic, unique};
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

fn request(job_id: &str) -> JobRequest {
    JobRequest {
        job_id: job_id.into(),
        topic: "job.default".into(),
        tenant_id: "acme".into(),
        principal_id: Some("alice".into()),
        priority: Priority::Interactive,
        labels: [("placement.zone".to_owned(), "eu".to_owned())].into(),
        env: [("$TOKEN".to_owned(), "s3cret".to_owned())].into(),
        payload: b"echo hello".to_vec(),
        budget: Budget {
            deadline_ms: Some(60_000),
            max_runtime_ms: None,
        },
        meta: JobMeta {
            requires: vec!["linux".into()],
            ..Default::default()
        },
        workflow_id: None,
        step_index: None,
        compensation: None,
        submitted_at: 1_700_000_000_000,
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        not_before: None,
        depends_on: vec!["acme-1".into(), "acme-2".into()],
        dependency_condition: ksched_core::records::DependencyCondition::AnySucceeded,
        dependency_timeout_ms: Some(60_000),
        batch_id: Some("nightly".into()),
        batch_size: Some(3),
        after_batch: None,
        batch_outcome: Some(ksched_core::records::BatchOutcome {
            batch_id: "hourly".into(),
            succeeded: 2,
            failed: 1,
        }),
    }
}

#[test]
fn a_transactional_job_request_is_read_committed_and_decodes_equal() {
    let bootstrap = bootstrap_servers().unwrap_or_else(|e| panic!("{e}"));
    let topic = unique("job.roundtrip");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(create_topic(&bootstrap, &topic, 3)).unwrap();

    let producer: ThreadedProducer<DefaultProducerContext> = client_config(&bootstrap)
        .set("transactional.id", unique("ksched-test-tx"))
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    let timeout = Duration::from_secs(30);
    producer.init_transactions(timeout).unwrap();

    // An aborted transaction first: read_committed must never show it.
    producer.begin_transaction().unwrap();
    let aborted = ksched_codec::encode(&request("job-aborted")).unwrap();
    producer
        .send(BaseRecord::to(&topic).key("job-aborted").payload(&aborted))
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(timeout).unwrap();
    producer.abort_transaction(timeout).unwrap();

    let sent = request("job-1");
    producer.begin_transaction().unwrap();
    let bytes = ksched_codec::encode(&sent).unwrap();
    producer
        .send(BaseRecord::to(&topic).key("job-1").payload(&bytes))
        .map_err(|(e, _)| e)
        .unwrap();
    producer.commit_transaction(timeout).unwrap();

    let consumer: BaseConsumer = client_config(&bootstrap)
        .set("group.id", unique("ksched-test-group"))
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[&topic]).unwrap();

    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut received = Vec::new();
    while std::time::Instant::now() < deadline && received.is_empty() {
        if let Some(msg) = consumer.poll(Duration::from_millis(500)) {
            let msg = msg.unwrap();
            let key = String::from_utf8_lossy(msg.key().unwrap()).into_owned();
            let decoded: JobRequest = ksched_codec::decode(msg.payload().unwrap()).unwrap();
            received.push((key, decoded));
        }
    }
    // Drain briefly: nothing else (in particular not the aborted record) may arrive.
    let drain_until = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < drain_until {
        if let Some(msg) = consumer.poll(Duration::from_millis(200)) {
            let msg = msg.unwrap();
            let decoded: JobRequest = ksched_codec::decode(msg.payload().unwrap()).unwrap();
            received.push((String::new(), decoded));
        }
    }
    assert_eq!(
        received.len(),
        1,
        "exactly the committed record: {received:?}"
    );
    assert_eq!(received[0].0, "job-1");
    assert_eq!(received[0].1, sent);
}

/// A transactional producer on a fresh topic of one partition.
fn transactional(bootstrap: &str, topic: &str) -> ThreadedProducer<DefaultProducerContext> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(create_topic(bootstrap, topic, 1)).unwrap();
    let producer: ThreadedProducer<DefaultProducerContext> = client_config(bootstrap)
        .set("transactional.id", unique("ksched-test-tx"))
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    producer.init_transactions(Duration::from_secs(30)).unwrap();
    producer
}

/// Produces `values` to partition 0 of `topic` in one transaction, committed or aborted.
fn transaction(
    producer: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    values: &[&str],
    commit: bool,
) {
    let timeout = Duration::from_secs(30);
    producer.begin_transaction().unwrap();
    for v in values {
        producer
            .send(BaseRecord::<(), str>::to(topic).partition(0).payload(*v))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    if commit {
        producer.commit_transaction(timeout).unwrap();
    } else {
        producer.flush(timeout).unwrap();
        producer.abort_transaction(timeout).unwrap();
    }
}

/// What the tail delivers within `within`, as text.
fn read_for(tail: &mut PartitionTail, within: Duration, want: usize) -> Vec<String> {
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + within;
    while got.len() < want && std::time::Instant::now() < deadline {
        if let Some(m) = tail.poll(Duration::from_millis(100)).unwrap() {
            got.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
        }
    }
    got
}

#[test]
fn a_tail_whose_consumer_stops_fetching_replaces_it_and_reads_on() {
    let bootstrap = bootstrap_servers().unwrap_or_else(|e| panic!("{e}"));
    let topic = unique("tail.stall");
    let producer = transactional(&bootstrap, &topic);
    transaction(&producer, &topic, &["a", "b"], true);
    let mut client = client_config(&bootstrap);
    client.set("group.id", unique("tail"));
    let mut tail = PartitionTail::new(&client, &topic, 0, 0)
        .unwrap()
        .stall_after(Duration::from_secs(2));
    assert_eq!(read_for(&mut tail, Duration::from_secs(30), 2), ["a", "b"]);

    // What librdkafka#5153 looks like from outside: the consumer fetches nothing more and
    // reports nothing. A paused partition behaves the same.
    let mut paused = rdkafka::TopicPartitionList::new();
    paused.add_partition(&topic, 0);
    tail.consumer().pause(&paused).unwrap();
    transaction(&producer, &topic, &["c", "d", "e"], true);

    assert_eq!(
        read_for(&mut tail, Duration::from_secs(20), 3),
        ["c", "d", "e"],
        "the stalled consumer was not replaced"
    );
    assert_eq!(tail.replaced(), 1);
}

#[test]
fn a_quiet_tail_after_commit_and_abort_markers_keeps_its_consumer_and_skips_aborted_records() {
    let bootstrap = bootstrap_servers().unwrap_or_else(|e| panic!("{e}"));
    let topic = unique("tail.quiet");
    let producer = transactional(&bootstrap, &topic);
    transaction(&producer, &topic, &["a"], true);
    transaction(&producer, &topic, &["x", "y"], false);
    transaction(&producer, &topic, &["b"], true);
    let mut client = client_config(&bootstrap);
    client.set("group.id", unique("tail"));
    let mut tail = PartitionTail::new(&client, &topic, 0, 0)
        .unwrap()
        .stall_after(Duration::from_secs(1));
    assert_eq!(read_for(&mut tail, Duration::from_secs(30), 2), ["a", "b"]);
    // Only the last commit marker lies past the last record: nothing to read, no stall.
    assert!(read_for(&mut tail, Duration::from_secs(4), 1).is_empty());
    assert_eq!(
        tail.replaced(),
        0,
        "a transaction marker was taken for a stall"
    );
    // a, commit marker, x, y, abort marker, b, commit marker: the consumer's position
    // passes the markers and the aborted records, and so does the tail's.
    assert_eq!(tail.next_offset(), 7);
}

/// What the processor's input consumer and the SDK's dispatch consumer rely on to let an
/// idle fetch wait long (500 ms, `INPUT_FETCH_WAIT_MS`, `DISPATCH_FETCH_WAIT_MS`): a
/// read_committed fetch parked at the broker is answered as soon as a transaction commits,
/// not when its wait runs out. Measured here with a 20 s wait, so that a broker that waited
/// instead would miss the 5 s bound by far (the bound is for a loaded CI machine; the
/// answer takes about a millisecond).
#[test]
fn a_parked_read_committed_fetch_is_answered_when_the_transaction_commits() {
    let bootstrap = bootstrap_servers().unwrap_or_else(|e| panic!("{e}"));
    let topic = unique("parked-fetch");
    let producer = transactional(&bootstrap, &topic);
    let consumer: BaseConsumer = client_config(&bootstrap)
        .set("group.id", unique("parked-fetch"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "20000")
        .set("socket.timeout.ms", "60000")
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, rdkafka::Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    // The first fetch finds nothing and is parked.
    assert!(consumer.poll(Duration::from_millis(1500)).is_none());
    for round in 0..3 {
        std::thread::sleep(Duration::from_millis(300));
        let value = format!("committed-{round}");
        transaction(&producer, &topic, &[&value], true);
        let committed = std::time::Instant::now();
        let got = match consumer.poll(Duration::from_secs(30)) {
            Some(Ok(m)) => String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
            Some(Err(e)) => panic!("{e}"),
            None => panic!("round {round}: nothing within 30 s of the commit"),
        };
        let waited = committed.elapsed();
        assert_eq!(got, value);
        assert!(
            waited < Duration::from_secs(5),
            "round {round}: the record came {waited:?} after its commit; a parked read_committed fetch waited out fetch.wait.max.ms"
        );
    }
}
