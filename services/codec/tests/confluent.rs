//! The Confluent wire format: `00`, a 4-byte big-endian Schema Registry id, then the body
//! (after a union's branch index). Ids are learned from a schema source (the registry
//! client in production, a map here); what a source cannot give is an error that says so.

#[allow(dead_code)]
mod samples;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use apache_avro::{Schema, types::Value, writer::datum::GenericDatumWriter};
use ksched_codec::{
    AnyRecord, Error, Registry, SchemaSource, SourceError, current_self_contained,
    union_self_contained,
};
use ksched_core::records::{CancelDispatch, Dispatch, JobRequest};

/// A schema source over a fixed map that can be switched to "unavailable".
struct MapSource {
    schemas: HashMap<u32, String>,
    down: AtomicBool,
    asked: AtomicUsize,
}

impl SchemaSource for MapSource {
    fn schema(&self, id: u32) -> Result<String, SourceError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(SourceError::Unavailable("connection refused".into()));
        }
        self.schemas
            .get(&id)
            .cloned()
            .ok_or_else(|| SourceError::NotFound("HTTP 404".into()))
    }
}

fn source(schemas: &[(u32, String)]) -> Arc<MapSource> {
    Arc::new(MapSource {
        schemas: schemas.iter().cloned().collect(),
        down: AtomicBool::new(false),
        asked: AtomicUsize::new(0),
    })
}

fn confluent<T: ksched_codec::Record>(
    reg: &Registry,
    v: &T,
    id: u32,
    branch: Option<u32>,
) -> Vec<u8> {
    let mut buf = Vec::new();
    reg.encode_confluent_into(v, id, branch, &mut buf).unwrap();
    buf
}

#[test]
fn a_record_in_the_confluent_format_decodes_once_its_id_is_fetched_and_is_cached() {
    let current = current_self_contained().unwrap();
    let reg = Registry::builtin().unwrap();
    let src = source(&[(41, current["io.ksched.JobRequest"].clone())]);
    reg.set_source(src.clone());
    let bytes = confluent(&reg, &samples::job_request(), 41, None);
    assert_eq!(&bytes[..5], &[0, 0, 0, 0, 41]);
    let back: JobRequest = reg.decode(&bytes).unwrap();
    assert_eq!(back, samples::job_request());
    assert!(
        reg.decodes_directly::<JobRequest>(&bytes),
        "the registry's copy of the current schema takes the fast path"
    );
    // Learned once: the source is down now and the id still decodes.
    src.down.store(true, Ordering::SeqCst);
    let again: JobRequest = reg.decode(&bytes).unwrap();
    assert_eq!(again, samples::job_request());
    assert_eq!(src.asked.load(Ordering::SeqCst), 1);
    // An id never seen while the source is down: unavailable, not unknown.
    let mut other = bytes.clone();
    other[4] = 42;
    assert!(matches!(
        reg.decode::<JobRequest>(&other),
        Err(Error::SchemaUnavailable { id: 42, .. })
    ));
}

#[test]
fn a_newer_producer_schema_from_the_registry_resolves_to_the_current_reader() {
    let current = current_self_contained().unwrap();
    let mut json: serde_json::Value =
        serde_json::from_str(&current["io.ksched.JobRequest"]).unwrap();
    json["fields"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "name": "x_cost_center", "type": ["null", "string"], "default": null
        }));
    let v2_json = serde_json::to_string(&json).unwrap();
    let v2 = Schema::parse_str(&v2_json).unwrap();
    let reg = Registry::builtin().unwrap();
    reg.set_source(source(&[(7, v2_json)]));
    let mut value = apache_avro::to_value(samples::job_request()).unwrap();
    if let Value::Record(fields) = &mut value {
        fields.push((
            "x_cost_center".into(),
            Value::Union(1, Box::new(Value::String("cc-9".into()))),
        ));
    }
    let value = value.resolve(&v2).unwrap();
    let mut bytes = vec![0, 0, 0, 0, 7];
    GenericDatumWriter::builder(&v2)
        .build()
        .unwrap()
        .write_value(&mut bytes, value)
        .unwrap();
    let back: JobRequest = reg.decode(&bytes).unwrap();
    assert_eq!(back, samples::job_request());
    assert!(!reg.decodes_directly::<JobRequest>(&bytes));
}

#[test]
fn a_topic_union_carries_each_of_its_records_with_its_branch_index() {
    let union = union_self_contained(&["io.ksched.Dispatch", "io.ksched.CancelDispatch"]).unwrap();
    Schema::parse_str(&union).expect("the union is a valid Avro schema");
    let reg = Registry::builtin().unwrap();
    reg.set_source(source(&[(3, union)]));
    let d = confluent(&reg, &samples::dispatch(), 3, Some(0));
    let c = confluent(&reg, &samples::cancel_dispatch(), 3, Some(1));
    assert_eq!(d[5], 0, "branch 0");
    assert_eq!(c[5], 2, "branch 1, zig-zag");
    match reg.decode_any(&d).unwrap() {
        AnyRecord::Dispatch(x) => assert_eq!(x, samples::dispatch()),
        other => panic!("expected a Dispatch, got {}", other.name()),
    }
    let back: CancelDispatch = reg.decode(&c).unwrap();
    assert_eq!(back, samples::cancel_dispatch());
    assert!(matches!(
        reg.decode::<Dispatch>(&c),
        Err(Error::SchemaMismatch { .. })
    ));
    // A branch the union does not have.
    let mut bad = c.clone();
    bad[5] = 8;
    assert!(matches!(
        reg.decode_any(&bad),
        Err(Error::Malformed { detail, .. }) if detail.contains("branch 4")
    ));
}

#[test]
fn hostile_confluent_headers_are_errors_that_name_the_problem() {
    let reg = Registry::builtin().unwrap();
    assert_eq!(reg.decode_any(&[0, 0, 1]), Err(Error::Truncated { len: 3 }));
    // No source: an id cannot be looked up.
    let e = reg.decode_any(&[0, 0, 0, 0, 9, 1, 2]).unwrap_err();
    assert!(matches!(&e, Error::UnknownSchemaId { id: 9, .. }), "{e:?}");
    assert!(e.to_string().contains("no schema registry"), "{e}");
    // The source does not have it.
    reg.set_source(source(&[(5, "{\"type\": \"string\"}".into())]));
    assert!(matches!(
        reg.decode_any(&[0, 0, 0, 0, 10, 1]),
        Err(Error::UnknownSchemaId { id: 10, .. })
    ));
    // It has it, but it is not a record.
    assert!(matches!(
        reg.decode_any(&[0, 0, 0, 0, 5, 1]),
        Err(Error::Schema { .. })
    ));
    // Id 0xFFFFFFFF, big-endian.
    assert!(matches!(
        reg.decode_any(&[0, 0xFF, 0xFF, 0xFF, 0xFF]),
        Err(Error::UnknownSchemaId { id: u32::MAX, .. })
    ));
}
