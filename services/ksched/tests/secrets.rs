//! No secret in clear outside the worker (docs/security.md#secrets), against `ksched run` and
//! the real broker: a job submitted with a `$` secret and a sealed payload runs with both
//! opened in the worker, while their bytes are found nowhere the scheduler writes — any of
//! its topics (the journal, dispatch, DLQ, results, control), its RocksDB store (files and
//! decoded column families), the audit exports, `journal tail`, its debug log, the API and
//! /metrics. A hostile producer's unsealed secret is refused (`secret_in_clear`) and its value
//! kept nowhere either; only the job topic it wrote to holds it, which shows the scan finds a
//! secret where there is one.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::*;
use ksched_core::records::JobRequest;
use ksched_worker::{Outcome, Worker};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

/// Every record (key, value, headers) of every topic starting with `prefix`, by topic,
/// transactional records of aborted transactions included.
fn topic_bytes(bootstrap: &str, prefix: &str) -> BTreeMap<String, Vec<u8>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("{prefix}scan"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_uncommitted")
        .create()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .unwrap();
    let mut out = BTreeMap::new();
    for topic in metadata.topics() {
        if !topic.name().starts_with(prefix) {
            continue;
        }
        let mut bytes = Vec::new();
        for p in topic.partitions() {
            let (low, high) = consumer
                .fetch_watermarks(topic.name(), p.id(), Duration::from_secs(10))
                .unwrap();
            if high <= low {
                continue;
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic.name(), p.id(), Offset::Offset(low))
                .unwrap();
            consumer.assign(&tpl).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                assert!(
                    std::time::Instant::now() < deadline,
                    "reading {}",
                    topic.name()
                );
                let Some(m) = consumer.poll(Duration::from_millis(500)) else {
                    // Transaction markers take offsets but are no messages: done when the
                    // position has passed the end.
                    let at = consumer.position().unwrap();
                    let read_to = at
                        .find_partition(topic.name(), p.id())
                        .and_then(|e| e.offset().to_raw())
                        .unwrap_or(-1);
                    if read_to >= high {
                        break;
                    }
                    continue;
                };
                let m = m.unwrap();
                bytes.extend_from_slice(m.key().unwrap_or_default());
                bytes.extend_from_slice(m.payload().unwrap_or_default());
                if let Some(h) = m.headers() {
                    for h in h.iter() {
                        bytes.extend_from_slice(h.value.unwrap_or_default());
                    }
                }
                if m.offset() + 1 >= high {
                    break;
                }
            }
        }
        out.insert(topic.name().to_owned(), bytes);
    }
    out
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// The bytes of every file under `dir`.
fn file_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(file_bytes(&path));
        } else {
            out.push((path.display().to_string(), std::fs::read(&path).unwrap()));
        }
    }
    out
}

#[test]
fn a_secret_is_found_nowhere_the_scheduler_writes() {
    let c = RunningScheduler::start("log:\n  level: debug\n");
    let keyring = c.dir.path().join("keyring.json");
    let mut ring = ksched_secrets::Keyring::new();
    ring.rotate("acme").unwrap();
    ring.save(&keyring).unwrap();
    let token = format!("token-{}", uuid::Uuid::new_v4().simple());
    let payload = format!("payload-{}", uuid::Uuid::new_v4().simple());
    let hostile = format!("hostile-{}", uuid::Uuid::new_v4().simple());

    // The worker opens both and says whether they were what was submitted.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stop = CancellationToken::new();
    let worker = {
        let _guard = rt.enter();
        Worker::new(
            c.worker_config("vault-worker")
                .with_keyring(&keyring)
                .unwrap(),
        )
        .unwrap()
    };
    let (want_token, want_payload, s) = (token.clone(), payload.clone(), stop.clone());
    rt.spawn(async move {
        worker
            .run(
                move |job| {
                    let ok = job.env().get("$TOKEN") == Some(&want_token)
                        && job.payload() == want_payload.as_bytes();
                    async move {
                        if ok {
                            Outcome::succeeded()
                        } else {
                            Outcome::fatal("secret_mismatch", "the opened values differ")
                        }
                    }
                },
                s,
            )
            .await
    });

    let (code, out, err) = c.cli(&[
        "submit",
        "--keyring",
        &path_str(&keyring),
        "--seal-payload",
        "--topic",
        &c.job_topic,
        "--job-id",
        "acme:vault-1",
        "--tenant",
        "acme",
        "--env",
        &format!("$TOKEN={token}"),
        "--env",
        "MODE=plain",
        "--payload",
        &payload,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    wait_state(&c.api, "acme:vault-1", "SUCCEEDED");

    // A producer that ignores the rules writes a secret in clear.
    let mut hostile_job = JobRequest {
        job_id: "acme:hostile-1".into(),
        topic: c.job_topic.clone(),
        tenant_id: "acme".into(),
        submitted_at: 1,
        ..JobRequest::default()
    };
    hostile_job.env.insert("$TOKEN".into(), hostile.clone());
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &c.bootstrap)
        .create()
        .unwrap();
    let bytes = ksched_codec::encode(&hostile_job).unwrap();
    producer
        .send(
            BaseRecord::to(&c.job_topic)
                .key("acme:hostile-1")
                .payload(&bytes),
        )
        .unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
    wait_until("the unsealed secret to be dead-lettered", 60, || {
        json(&format!("{}/api/v1/dlq", c.api))["dead_letters"]
            .as_array()
            .is_some_and(|d| {
                d.iter().any(|d| {
                    d["job_id"] == "acme:hostile-1" && d["reason_code"] == "secret_in_clear"
                })
            })
    });
    assert_eq!(
        job_state(&c.api, "acme:hostile-1"),
        None,
        "a refused submission never becomes a job"
    );

    // What an operator or an auditor can get: the API, metrics, exports, the journal tail.
    let mut answers = String::new();
    for path in [
        "/api/v1/jobs/acme:vault-1",
        "/api/v1/jobs/acme:vault-1/history",
        "/api/v1/jobs",
        "/api/v1/dlq",
        "/metrics",
    ] {
        let (code, body) = http(&format!("{}{path}", c.api), "GET", None).unwrap();
        assert_eq!(code, 200, "{path}: {body}");
        answers.push_str(&body);
    }
    let view = json(&format!("{}/api/v1/jobs/acme:vault-1", c.api));
    assert_eq!(view["env"]["$TOKEN"], "*hidden*");
    assert_eq!(view["env"]["MODE"], "plain");
    let jsonl = c.dir.path().join("export.jsonl");
    let avro = c.dir.path().join("export.avro");
    for (format, file) in [("jsonl", &jsonl), ("avro", &avro)] {
        let (code, _, err) = c.cli(&[
            "audit",
            "export",
            "--format",
            format,
            "--out",
            &path_str(file),
        ]);
        assert_eq!(code, 0, "{err}");
    }
    answers.push_str(&std::fs::read_to_string(&jsonl).unwrap());
    let reader = apache_avro::Reader::new(std::fs::File::open(&avro).unwrap()).unwrap();
    let mut avro_entries = 0;
    for value in reader {
        answers.push_str(&format!("{:?}", value.unwrap()));
        avro_entries += 1;
    }
    assert!(avro_entries > 0);
    let (code, tail, err) = c.cli(&["journal", "tail", "--from-beginning", "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    assert!(tail.contains("acme:vault-1"), "{tail}");
    answers.push_str(&tail);

    stop.cancel();
    let topics = topic_bytes(&c.bootstrap, &c.prefix);
    let (prefix, job_topic) = (c.prefix.clone(), c.job_topic.clone());
    let dir = c.stop_keeping_dir();
    let log = std::fs::read_to_string(dir.path().join("ksched.log")).unwrap();
    assert!(
        log.contains("DEBUG"),
        "the log is at debug level, so the scan reads everything ksched logs"
    );

    // RocksDB: the files as they lie on disk, and every column family decoded.
    let data = dir.path().join("data");
    let store_files = file_bytes(&data);
    let store = ksched_store::Store::open_read_only(&data, 0).unwrap();
    let mut store_values = Vec::new();
    for cf in ksched_store::CFS {
        for (k, v) in store.raw(cf).unwrap() {
            store_values.extend(k);
            store_values.extend(v);
        }
    }
    let job = store.job("acme:vault-1").unwrap().unwrap();
    let sealed_token = job.request.env["$TOKEN"].clone();
    assert!(ksched_secrets::is_sealed(&sealed_token));
    assert!(ksched_secrets::is_sealed_payload(
        &store.payload("acme:vault-1").unwrap().unwrap()
    ));

    // The positive controls: the scans see the sealed values, and the hostile clear value
    // in the one place it was written.
    assert!(
        contains(&store_values, &sealed_token),
        "the store scan sees values"
    );
    // Views and exports show secret values as *hidden*, not even sealed.
    assert!(
        !answers.contains(&sealed_token),
        "a sealed value is in an answer"
    );
    let exported = std::fs::read_to_string(&jsonl).unwrap();
    assert!(
        exported.contains("\"$TOKEN\":\"*hidden*\""),
        "the export names the secret, hidden"
    );
    let journal = &topics[&format!("{prefix}journal")];
    assert!(
        contains(journal, &sealed_token),
        "the topic scan sees the journal"
    );
    assert!(
        contains(&topics[&job_topic], &hostile),
        "the topic scan finds a clear secret where one is"
    );
    assert!(contains(
        &topics[&format!("{prefix}dispatch.default")],
        &sealed_token
    ));

    for secret in [&token, &payload, &hostile] {
        for (topic, bytes) in &topics {
            if *topic == job_topic && secret == &hostile {
                continue;
            }
            assert!(!contains(bytes, secret), "{secret} in topic {topic}");
        }
        for (file, bytes) in &store_files {
            assert!(!contains(bytes, secret), "{secret} in {file}");
        }
        assert!(!contains(&store_values, secret), "{secret} in RocksDB");
        assert!(!answers.contains(secret.as_str()), "{secret} in an answer");
        assert!(!log.contains(secret.as_str()), "{secret} in the log");
    }
    // Not even in the job topic: the CLI sealed them before they left.
    assert!(!contains(&topics[&job_topic], &token));
    assert!(!contains(&topics[&job_topic], &payload));
}
