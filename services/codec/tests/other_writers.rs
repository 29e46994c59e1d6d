//! Records written as other Avro libraries write them decode to what apache-avro's encoding
//! of the same value decodes to. The rewriter below walks apache-avro's bytes by the schema
//! and writes the same values another valid way: every non-empty array and map in blocks of
//! one item, each with a negative count and its size in bytes (hamba/avro in Go writes that
//! shape; tests/fixtures/hamba holds records it wrote), counts in longer varints than
//! needed, and map entries in reverse order. Only a map that holds a key twice is refused.

#[allow(dead_code)]
mod samples;

use std::collections::HashMap;
use std::fmt::Debug;

use apache_avro::Schema;
use ksched_codec::{Record, decode, encode, registry};
use ksched_core::events::{Cause, DECISION_FORMAT, JournalEntry};

/// How a record is written again.
#[derive(Clone, Copy)]
enum Shape {
    /// Blocks of one item with their sizes, padded counts, map entries reversed.
    Other,
    /// As `Other`, and each map's first entry written twice.
    KeyTwice,
}

/// Rewrites Avro bodies of one schema (named types found as they are defined).
struct Rewriter<'s> {
    named: HashMap<String, &'s Schema>,
    shape: Shape,
}

/// Reads a zig-zag varint.
fn long(input: &mut &[u8]) -> i64 {
    let mut n: u64 = 0;
    let mut shift = 0;
    loop {
        let b = input[0];
        *input = &input[1..];
        n |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return (n >> 1) as i64 ^ -((n & 1) as i64);
        }
        shift += 7;
    }
}

/// Writes a zig-zag varint, minimal.
fn put_long(out: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// Writes a zig-zag varint one byte longer than it needs to be (valid, not minimal).
fn put_long_padded(out: &mut Vec<u8>, n: i64) {
    put_long(out, n);
    *out.last_mut().unwrap() |= 0x80;
    out.push(0);
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, rest) = input.split_at(n);
    *input = rest;
    head
}

impl<'s> Rewriter<'s> {
    fn new(schema: &'s Schema, shape: Shape) -> Rewriter<'s> {
        let mut r = Rewriter {
            named: HashMap::new(),
            shape,
        };
        r.collect(schema);
        r
    }

    /// Notes every named type `schema` defines.
    fn collect(&mut self, schema: &'s Schema) {
        match schema {
            Schema::Record(rec) => {
                self.named.insert(rec.name.fullname(None), schema);
                for f in &rec.fields {
                    self.collect(&f.schema);
                }
            }
            Schema::Enum(e) => {
                self.named.insert(e.name.fullname(None), schema);
            }
            Schema::Fixed(f) => {
                self.named.insert(f.name.fullname(None), schema);
            }
            Schema::Array(a) => self.collect(&a.items),
            Schema::Map(m) => self.collect(&m.types),
            Schema::Union(u) => u.variants().iter().for_each(|v| self.collect(v)),
            _ => {}
        }
    }

    /// Reads one value of `schema` from `input` (apache-avro's encoding) and writes it to
    /// `out` in the rewriter's shape.
    fn value(&self, schema: &Schema, input: &mut &[u8], out: &mut Vec<u8>) {
        match schema {
            Schema::Null => {}
            Schema::Boolean => out.push(take(input, 1)[0]),
            Schema::Float => out.extend(take(input, 4)),
            Schema::Double => out.extend(take(input, 8)),
            Schema::Bytes | Schema::String => {
                let n = long(input);
                put_long(out, n);
                out.extend(take(input, n as usize));
            }
            Schema::Fixed(f) => out.extend(take(input, f.size)),
            Schema::Record(rec) => {
                for f in &rec.fields {
                    self.value(&f.schema, input, out);
                }
            }
            Schema::Union(u) => {
                let i = long(input);
                put_long(out, i);
                self.value(&u.variants()[i as usize], input, out);
            }
            Schema::Ref { name } => {
                let target = self.named[&name.fullname(None)];
                self.value(target, input, out);
            }
            Schema::Array(a) => {
                let items = self.items(input, |input, item| self.value(&a.items, input, item));
                self.blocks(items, out);
            }
            Schema::Map(m) => {
                let key = Schema::String;
                let mut entries = self.items(input, |input, entry| {
                    self.value(&key, input, entry);
                    self.value(&m.types, input, entry);
                });
                entries.reverse();
                if let (Shape::KeyTwice, Some(first)) = (self.shape, entries.first().cloned()) {
                    entries.push(first);
                }
                self.blocks(entries, out);
            }
            // Int, Long, Enum and the logical types over them: a varint.
            _ => {
                let n = long(input);
                put_long(out, n);
            }
        }
    }

    /// The items of an array or map in apache-avro's encoding (blocks with positive counts),
    /// each rewritten on its own.
    fn items(&self, input: &mut &[u8], item: impl Fn(&mut &[u8], &mut Vec<u8>)) -> Vec<Vec<u8>> {
        let mut items = Vec::new();
        loop {
            let count = long(input);
            assert!(count >= 0, "apache-avro writes positive counts");
            if count == 0 {
                return items;
            }
            for _ in 0..count {
                let mut one = Vec::new();
                item(input, &mut one);
                items.push(one);
            }
        }
    }

    /// Writes items as blocks of one, each a negative count (padded) and its size, then the
    /// end.
    fn blocks(&self, items: Vec<Vec<u8>>, out: &mut Vec<u8>) {
        for item in items {
            put_long_padded(out, -1);
            put_long(out, item.len() as i64);
            out.extend(item);
        }
        out.push(0);
    }
}

/// `value` encoded by ksched, then its body rewritten in `shape`, behind the same header.
fn rewritten<T: Record>(value: &T, shape: Shape) -> Vec<u8> {
    let bytes = encode(value).unwrap();
    let entry = registry().current(T::NAME).unwrap();
    let (header, mut body) = bytes.split_at(10);
    let mut out = header.to_vec();
    Rewriter::new(entry.schema, shape).value(entry.schema, &mut body, &mut out);
    assert!(
        body.is_empty(),
        "{}: the rewriter read the whole body",
        T::NAME
    );
    out
}

/// `value`, rewritten as another library writes it, decodes to itself on both paths; whether
/// the rewriting changed anything (a record without arrays or maps is written the same).
fn reads_back<T: Record + PartialEq + Debug>(value: T) -> bool {
    let bytes = rewritten(&value, Shape::Other);
    let changed = bytes != encode(&value).unwrap();
    let fast: T = decode(&bytes).unwrap_or_else(|e| panic!("{}: {e}", T::NAME));
    assert_eq!(fast, value, "{}", T::NAME);
    let general: T = registry()
        .decode_general(&bytes)
        .unwrap_or_else(|e| panic!("{} on the general path: {e}", T::NAME));
    assert_eq!(general, value, "{} on the general path", T::NAME);
    changed
}

#[test]
fn every_record_written_another_valid_way_reads_back() {
    assert!(reads_back(samples::job_request()));
    reads_back(samples::job_started());
    reads_back(samples::job_progress());
    reads_back(samples::job_result());
    assert!(reads_back(samples::heartbeat()));
    reads_back(samples::cancel_job());
    reads_back(samples::approve_job());
    reads_back(samples::reject_job());
    reads_back(samples::tick());
    assert!(reads_back(samples::dispatch()));
    reads_back(samples::cancel_dispatch());
    reads_back(samples::dead_letter());
    for input in samples::every_input() {
        assert!(reads_back(JournalEntry {
            cause: Cause {
                topic: "job.default".into(),
                partition: 0,
                offset: 7,
            },
            log_time: 1_700_000_000_000,
            input,
            events: samples::every_event(),
            format: DECISION_FORMAT,
        }));
    }
}

/// A key written twice in any map of a producer's record, nested ones too, is refused with
/// its name, whichever path reads it.
#[test]
fn a_key_twice_in_any_map_is_refused() {
    use ksched_core::records::{Heartbeat, JobRequest};
    let mut request = samples::job_request();
    assert!(
        !request.labels.is_empty() && request.compensation.is_some(),
        "the sample has maps at two depths"
    );
    let twice = rewritten(&request, Shape::KeyTwice);
    for got in [
        decode::<JobRequest>(&twice),
        registry().decode_general::<JobRequest>(&twice),
    ] {
        let err = got.unwrap_err().to_string();
        assert!(err.contains("more than once"), "{err}");
    }
    // Only the compensation's labels hold a map entry: the nested map alone is caught.
    request.labels.clear();
    request.env.clear();
    let nested = request.compensation.as_mut().unwrap();
    nested.env.clear();
    let key = nested.labels.keys().next().expect("a nested label").clone();
    let err = decode::<JobRequest>(&rewritten(&request, Shape::KeyTwice))
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("{key:?} more than once")), "{err}");
    let err = decode::<Heartbeat>(&rewritten(&samples::heartbeat(), Shape::KeyTwice))
        .unwrap_err()
        .to_string();
    assert!(err.contains("more than once"), "{err}");
}
