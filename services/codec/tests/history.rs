//! Every released version of every top-level schema is kept in `schemas/history/`, so records
//! written with it keep decoding. Changing a schema without recording the new version fails
//! here; `KSCHED_UPDATE_SCHEMA_HISTORY=1 cargo test -p ksched-codec --test history` records it.

use std::path::PathBuf;

use apache_avro::schema_compatibility::SchemaCompatibility;
use ksched_codec::{TOP_LEVEL, current_self_contained, registry};

fn history_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../schemas/history")
}

#[test]
fn the_current_version_of_every_top_level_schema_is_in_the_history() {
    let update = std::env::var_os("KSCHED_UPDATE_SCHEMA_HISTORY").is_some();
    let mut missing = Vec::new();
    for (name, json) in current_self_contained().unwrap() {
        let entry = registry().current(&name).unwrap();
        let short = name.trim_start_matches("io.ksched.");
        let file = history_dir().join(format!(
            "{short}.{}.avsc",
            ksched_codec::fingerprint_hex(entry.fingerprint)
        ));
        if file.exists() {
            let stored = std::fs::read_to_string(&file).unwrap();
            let stored = ksched_codec::Registry::with_extra_writers(&[&stored]).unwrap();
            assert!(
                stored.writers().any(|w| w.json.trim() == json.trim()),
                "{} does not hold the schema its name says",
                file.display()
            );
        } else if update {
            std::fs::create_dir_all(history_dir()).unwrap();
            std::fs::write(&file, format!("{json}\n")).unwrap();
        } else {
            missing.push(file.display().to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "schemas changed without recording the new versions: {missing:?}\n\
         check the change is compatible (docs/schema-evolution.md), then run\n\
         KSCHED_UPDATE_SCHEMA_HISTORY=1 cargo test -p ksched-codec --test history"
    );
}

#[test]
fn every_historical_version_is_readable_by_the_current_reader() {
    let mut checked = 0;
    for entry in registry().writers() {
        assert!(
            TOP_LEVEL.contains(&entry.name.as_str()),
            "history holds {}, which is not a top-level record",
            entry.name
        );
        let reader = registry().current(&entry.name).unwrap();
        if let Err(e) = SchemaCompatibility::can_read(entry.schema, reader.schema) {
            panic!(
                "{} version {} can no longer be read by the current schema: {e}",
                entry.name,
                ksched_codec::fingerprint_hex(entry.fingerprint)
            );
        }
        checked += 1;
    }
    assert!(checked >= TOP_LEVEL.len());
}

/// A record written by an older release, with the older schema it was written with, decodes
/// into today's type: here a Tick from before watermarks existed (its `watermark` is None).
#[test]
fn a_tick_written_before_watermarks_existed_decodes() {
    use apache_avro::types::Value;
    let old = registry()
        .writers()
        .find(|w| w.name == "io.ksched.Tick" && !w.json.contains("watermark"))
        .expect("schemas/history holds the Tick schema from before watermarks");
    assert_ne!(
        old.fingerprint,
        registry().current("io.ksched.Tick").unwrap().fingerprint,
        "an older version, not the current one"
    );
    let datum = apache_avro::writer::datum::GenericDatumWriter::builder(old.schema)
        .build()
        .unwrap()
        .write_value_to_vec(Value::Record(vec![
            ("source".into(), Value::String("ticker-2025".into())),
            (
                "issued_at".into(),
                Value::TimestampMillis(1_700_000_000_000),
            ),
        ]))
        .unwrap();
    let mut bytes = old.header().to_vec();
    bytes.extend(datum);
    match ksched_codec::decode_any(&bytes).unwrap() {
        ksched_codec::AnyRecord::Tick(t) => {
            assert_eq!(t.source, "ticker-2025");
            assert_eq!(t.issued_at, 1_700_000_000_000);
            assert_eq!(t.watermark, None, "the new field takes its default");
        }
        other => panic!("decoded as {}", other.name()),
    }
}
