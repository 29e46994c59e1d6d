//! Round trips, schema evolution and error handling of the single-object codec.

mod samples;

use std::fmt::Debug;

use apache_avro::{Schema, types::Value, writer::datum::GenericDatumWriter};
use ksched_codec::{AnyRecord, Error, Record, Registry, TOP_LEVEL, decode, decode_any, encode};
use ksched_core::events::{Cause, JournalEntry};
use ksched_core::records::JobRequest;
use samples::map;

fn round_trip<T: Record + PartialEq + Debug>(value: T) {
    let bytes = encode(&value).unwrap_or_else(|e| panic!("encode {}: {e}", T::NAME));
    assert_eq!(&bytes[..2], &[0xC3, 0x01], "single-object marker");
    let back: T = decode(&bytes).unwrap_or_else(|e| panic!("decode {}: {e}", T::NAME));
    assert_eq!(back, value, "{} round trip", T::NAME);
    assert!(
        ksched_codec::registry().decodes_directly::<T>(&bytes),
        "{} takes the fast decoding path",
        T::NAME
    );
    // The fast writer wrote it (and, in this debug build, wrote what apache-avro writes).
    assert!(
        ksched_codec::registry().encodes_directly(&value),
        "{} takes the fast encoding path",
        T::NAME
    );
    let general: T = ksched_codec::registry()
        .decode_general(&bytes)
        .unwrap_or_else(|e| panic!("decode {} on the general path: {e}", T::NAME));
    assert_eq!(general, value, "{} on the general path", T::NAME);
    let any = decode_any(&bytes).unwrap_or_else(|e| panic!("decode_any {}: {e}", T::NAME));
    assert_eq!(format!("io.ksched.{}", any.name()), T::NAME);
}

#[test]
fn every_top_level_record_round_trips() {
    round_trip(samples::job_request());
    round_trip(samples::job_started());
    round_trip(samples::job_progress());
    round_trip(samples::job_result());
    round_trip(samples::heartbeat());
    round_trip(samples::cancel_job());
    round_trip(samples::approve_job());
    round_trip(samples::reject_job());
    round_trip(samples::tick());
    round_trip(samples::dispatch());
    round_trip(samples::cancel_dispatch());
    round_trip(samples::dead_letter());
    round_trip(samples::redrive_job());
    round_trip(samples::reschedule_job());
    round_trip(samples::schedule_command());
}

#[test]
fn every_input_and_every_event_round_trips_in_a_journal_entry() {
    let events = samples::every_event();
    assert_eq!(events.len(), 53, "a new event needs a sample here");
    for (i, input) in samples::every_input().into_iter().enumerate() {
        round_trip(JournalEntry {
            cause: Cause {
                topic: "job.default".into(),
                partition: 2,
                offset: i as i64,
            },
            log_time: 1_700_000_000_000 + i as i64,
            input,
            events: events.clone(),
            format: ksched_core::events::DECISION_FORMAT,
        });
    }
}

#[test]
fn optional_fields_left_empty_round_trip() {
    let mut r = samples::job_request();
    r.principal_id = None;
    r.compensation = None;
    r.workflow_id = None;
    r.step_index = None;
    r.labels.clear();
    r.env.clear();
    r.payload.clear();
    r.budget = Default::default();
    r.meta = Default::default();
    round_trip(r);
}

#[test]
fn encoding_is_deterministic() {
    let a = encode(&samples::dispatch()).unwrap();
    let b = encode(&samples::dispatch()).unwrap();
    assert_eq!(a, b);
}

/// The current JobRequest schema minus the fields added after "v0", as a producer that has
/// not upgraded would still write it.
fn job_request_v0_schema() -> String {
    let current = ksched_codec::current_self_contained().unwrap();
    let mut json: serde_json::Value =
        serde_json::from_str(&current["io.ksched.JobRequest"]).unwrap();
    let fields = json["fields"].as_array_mut().unwrap();
    fields.retain(|f| {
        !matches!(
            f["name"].as_str(),
            Some("workflow_id" | "step_index" | "compensation")
        )
    });
    serde_json::to_string(&json).unwrap()
}

#[test]
fn a_record_written_with_an_older_schema_decodes_through_the_current_reader() {
    let v0_json = job_request_v0_schema();
    let registry = Registry::with_extra_writers(&[&v0_json]).unwrap();
    let v0 = Schema::parse_str(&v0_json).unwrap();
    let v0_entry = registry
        .writers()
        .find(|e| e.json == v0_json)
        .expect("v0 registered");
    assert_ne!(
        v0_entry.fingerprint,
        registry.current(JobRequest::NAME).unwrap().fingerprint
    );

    // Write a v0 record the way an old producer would: generic value, old schema, header.
    let sample = samples::job_request();
    let mut full = apache_avro::to_value(&sample).unwrap();
    if let Value::Record(fields) = &mut full {
        fields
            .retain(|(n, _)| !matches!(n.as_str(), "workflow_id" | "step_index" | "compensation"));
    }
    let full = full.resolve(&v0).unwrap();
    let mut bytes = v0_entry.header().to_vec();
    GenericDatumWriter::builder(&v0)
        .build()
        .unwrap()
        .write_value(&mut bytes, full)
        .unwrap();

    let decoded: JobRequest = registry.decode(&bytes).unwrap();
    let mut expected = sample;
    expected.workflow_id = None;
    expected.step_index = None;
    expected.compensation = None;
    assert_eq!(decoded, expected, "missing fields take their defaults");

    // The built-in registry does not know v0 and says so.
    match decode::<JobRequest>(&bytes) {
        Err(Error::UnknownFingerprint { fingerprint }) => {
            assert_eq!(fingerprint, v0_entry.fingerprint)
        }
        other => panic!("expected UnknownFingerprint, got {other:?}"),
    }
}

#[test]
fn a_newer_writer_with_an_extra_field_decodes_through_the_current_reader() {
    let current = ksched_codec::current_self_contained().unwrap();
    let mut json: serde_json::Value =
        serde_json::from_str(&current["io.ksched.JobStarted"]).unwrap();
    json["fields"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "name": "host", "type": "string", "default": "", "doc": "added later"
        }));
    let v2_json = serde_json::to_string(&json).unwrap();
    let registry = Registry::with_extra_writers(&[&v2_json]).unwrap();
    let v2 = Schema::parse_str(&v2_json).unwrap();
    let entry = registry.writers().find(|e| e.json == v2_json).unwrap();
    let mut value = apache_avro::to_value(samples::job_started()).unwrap();
    if let Value::Record(fields) = &mut value {
        fields.push(("host".into(), Value::String("box-7".into())));
    }
    let value = value.resolve(&v2).unwrap();
    let mut bytes = entry.header().to_vec();
    GenericDatumWriter::builder(&v2)
        .build()
        .unwrap()
        .write_value(&mut bytes, value)
        .unwrap();
    let decoded: ksched_core::records::JobStarted = registry.decode(&bytes).unwrap();
    assert_eq!(decoded, samples::job_started());
}

#[test]
fn errors_name_the_problem() {
    assert_eq!(
        decode::<JobRequest>(&[0xC3, 0x01, 1]),
        Err(Error::Truncated { len: 3 })
    );
    assert_eq!(
        decode::<JobRequest>(b"{\"job_id\":\"x\"}"),
        Err(Error::BadMagic {
            found: [b'{', b'"']
        })
    );
    let unknown = [0xC3, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 0];
    assert!(matches!(
        decode::<JobRequest>(&unknown),
        Err(Error::UnknownFingerprint { fingerprint }) if fingerprint == 0x0807060504030201
    ));
    let tick = encode(&samples::tick()).unwrap();
    assert_eq!(
        decode::<JobRequest>(&tick),
        Err(Error::SchemaMismatch {
            expected: "io.ksched.JobRequest",
            found: "io.ksched.Tick".into()
        })
    );
    let mut truncated = encode(&samples::job_request()).unwrap();
    truncated.truncate(truncated.len() - 5);
    let got = decode::<JobRequest>(&truncated);
    assert!(matches!(got, Err(Error::Malformed { .. })), "{got:?}");
    let mut trailing = encode(&samples::tick()).unwrap();
    trailing.extend_from_slice(&[0, 0]);
    assert_eq!(
        decode::<ksched_core::records::Tick>(&trailing),
        Err(Error::TrailingBytes {
            schema: "io.ksched.Tick".into(),
            count: 2
        })
    );
    // Messages are for people.
    let msg = Error::BadMagic { found: [0, 0] }.to_string();
    assert!(msg.contains("single-object"), "{msg}");
}

#[test]
fn a_huge_length_prefix_is_an_error_not_an_allocation() {
    let mut bytes = encode(&samples::tick()).unwrap()[..10].to_vec();
    // "source" string length: zig-zag varint of ~2^62.
    bytes.extend_from_slice(&[0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]);
    assert!(decode::<ksched_core::records::Tick>(&bytes).is_err());
}

#[test]
fn decode_any_reports_the_writer_type() {
    let bytes = encode(&samples::heartbeat()).unwrap();
    assert!(matches!(decode_any(&bytes), Ok(AnyRecord::Heartbeat(_))));
}

#[test]
fn every_top_level_schema_has_a_distinct_fingerprint() {
    let reg = ksched_codec::registry();
    let mut fps: Vec<u64> = TOP_LEVEL
        .iter()
        .map(|n| reg.current(n).unwrap().fingerprint)
        .collect();
    fps.sort_unstable();
    fps.dedup();
    assert_eq!(fps.len(), TOP_LEVEL.len());
}

/// A record cut anywhere inside its trailing optional field is refused, not read as if the
/// field were absent (apache-avro reads a cut-short union as null).
#[test]
fn a_record_cut_inside_a_trailing_optional_field_is_malformed() {
    let full = encode(&samples::job_request()).unwrap();
    assert!(decode::<JobRequest>(&full).unwrap().traceparent.is_some());
    for cut in 1..=56 {
        let got = decode::<JobRequest>(&full[..full.len() - cut]);
        assert!(
            matches!(got, Err(Error::Malformed { .. })),
            "cut {cut}: {got:?}"
        );
    }
    let mut dispatch = samples::dispatch();
    dispatch.reply_partition = Some(300);
    let full = encode(&dispatch).unwrap();
    for cut in 1..=2 {
        let got = decode::<ksched_core::records::Dispatch>(&full[..full.len() - cut]);
        assert!(got.is_err(), "cut {cut}: {got:?}");
    }
}

/// `bytes` with the first occurrence of `from` replaced by `to` (same length).
fn patched(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("the pattern is in the encoding");
    let mut out = bytes.to_vec();
    out[at..at + from.len()].copy_from_slice(to);
    out
}

#[test]
fn a_map_with_a_key_twice_is_refused_and_one_out_of_order_is_read() {
    let mut r = samples::job_request();
    r.labels = [("a", "1"), ("b", "2")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let bytes = encode(&r).unwrap();
    // count 2, "a" -> "1", "b" -> "2", end
    let map = [0x04, 0x02, b'a', 0x02, b'1', 0x02, b'b', 0x02, b'2', 0x00];
    let twice = patched(
        &bytes,
        &map,
        &[0x04, 0x02, b'a', 0x02, b'1', 0x02, b'a', 0x02, b'2', 0x00],
    );
    let err = decode::<JobRequest>(&twice).unwrap_err().to_string();
    assert!(
        err.contains(r#"a map holds the key "a" more than once"#),
        "{err}"
    );
    let reversed = patched(
        &bytes,
        &map,
        &[0x04, 0x02, b'b', 0x02, b'2', 0x02, b'a', 0x02, b'1', 0x00],
    );
    assert_eq!(decode::<JobRequest>(&reversed).unwrap(), r);
}

/// The bodies `fixtures/hamba` wrote with hamba/avro, the Go library (`go run .` there), by
/// record name, behind the single-object header of the current schema.
fn written_by_hamba(name: &str) -> Vec<u8> {
    let line = include_str!("fixtures/hamba/bodies.hex")
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in bodies.hex"));
    let body: Vec<u8> = (0..line.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&line[i..i + 2], 16).expect("hex"))
        .collect();
    body
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// A Go producer or worker using hamba/avro writes every non-empty array and map as a block
/// with a negative item count and its size in bytes, and map entries in Go's random order:
/// valid Avro, not what apache-avro writes. Its records are read as what they say (they were
/// refused as "not one whole record" before).
#[test]
fn records_written_by_hamba_avro_decode() {
    use ksched_core::records::{Budget, Heartbeat, JobMeta, JobTemplate, Priority};
    let framed = |header_of: Vec<u8>, body: Vec<u8>| {
        let mut bytes = header_of[..10].to_vec();
        bytes.extend(body);
        bytes
    };
    let request = JobRequest {
        job_id: "job-go-1".into(),
        topic: "jobs.default".into(),
        tenant_id: "acme".into(),
        principal_id: Some("svc-go".into()),
        priority: Priority::Interactive,
        labels: map(&[
            ("zone", "eu-1"),
            ("arch", "x86"),
            ("team", "payments"),
            ("gpu", "no"),
        ]),
        env: map(&[("MODE", "fast"), ("LEVEL", "3")]),
        payload: b"hello from go".to_vec(),
        budget: Budget {
            deadline_ms: Some(60_000),
            max_runtime_ms: None,
        },
        meta: JobMeta {
            idempotency_key: Some("idem-7".into()),
            capability: Some("shell.exec".into()),
            risk_tags: strings(&["prod", "pii"]),
            requires: strings(&["linux"]),
            actor_id: None,
        },
        workflow_id: Some("wf-1".into()),
        step_index: Some(2),
        compensation: Some(Box::new(JobTemplate {
            topic: "jobs.undo".into(),
            priority: Priority::Batch,
            labels: map(&[("a", "1"), ("b", "2")]),
            meta: JobMeta {
                requires: strings(&["linux", "x86"]),
                ..JobMeta::default()
            },
            ..JobTemplate::default()
        })),
        submitted_at: 1_764_000_000_000,
        traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
        not_before: Some(1_764_000_060_000),
        ..JobRequest::default()
    };
    let bytes = framed(encode(&request).unwrap(), written_by_hamba("JobRequest"));
    assert_ne!(
        bytes,
        encode(&request).unwrap(),
        "not what apache-avro writes"
    );
    assert_eq!(decode::<JobRequest>(&bytes).unwrap(), request);
    assert_eq!(
        ksched_codec::registry()
            .decode_general::<JobRequest>(&bytes)
            .unwrap(),
        request,
        "the general path reads it too"
    );
    // The sample's pool, loads, free memory and partitions; the rest as the Go side wrote.
    let heartbeat = Heartbeat {
        worker_id: "go-worker-1".into(),
        capabilities: strings(&["linux", "x86", "shell.exec"]),
        labels: map(&[("zone", "eu-1"), ("rack", "r7")]),
        active_job_ids: strings(&["job-go-1"]),
        sent_at: 1_764_000_000_500,
        ..samples::heartbeat()
    };
    let bytes = framed(encode(&heartbeat).unwrap(), written_by_hamba("Heartbeat"));
    assert_eq!(decode::<Heartbeat>(&bytes).unwrap(), heartbeat);
}
