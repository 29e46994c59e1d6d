//! The foundation loop against a real broker: a JobRequest produced in a Kafka transaction is
//! consumed read_committed, decoded, and equal to what was sent; an aborted one is never seen.

use std::time::Duration;

use ksched_core::records::{Budget, JobMeta, JobRequest, Priority};
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
