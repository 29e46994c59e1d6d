//! Avro encoding of every ksched record: single-object encoding, or the Confluent wire format
//! of a Schema Registry.
//!
//! A single-object value is `C3 01`, the 8-byte little-endian CRC-64-AVRO fingerprint of the
//! writer schema, then the Avro binary body. Decoding looks the fingerprint up in the
//! [`Registry`] of known writer schemas and resolves the body to the current reader schema, so
//! records written by older producers keep decoding after a schema evolves. A Confluent value
//! is `00`, the 4-byte big-endian schema id, then the body (after a union's branch index when
//! the id names a union): the writer schema is fetched from the Schema Registry by id
//! ([`schema_registry`], installed with [`Registry::set_source`]), kept, and resolved the same
//! way. Bad input of any kind yields an [`Error`] that names the problem; decoding never
//! panics.

mod error;
mod fast;
mod framing;
mod registry;
mod resolve;
pub mod schema_registry;
pub mod trace_context;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use apache_avro::from_value;
use ksched_core::events::JournalEntry;
use ksched_core::records::{
    ApproveJob, CancelDispatch, CancelJob, DeadLetter, Dispatch, Heartbeat, JobProgress,
    JobRequest, JobResult, JobStarted, RedriveJob, RejectJob, RescheduleJob, ScheduleCommand, Tick,
};
use serde::{Serialize, de::DeserializeOwned};

pub use error::{Error, Result, fingerprint_hex};
pub use framing::Framing;
pub use registry::{
    CONFLUENT_MAGIC, Learned, MAX_LEARNED_IDS, NAMESPACE, Registry, SchemaEntry, SchemaSource,
    SourceError, TOP_LEVEL, current_self_contained, union_self_contained,
};

use crate::fast::Form;
use crate::resolve::Resolver;

/// Most bytes a single decoded string, bytes or collection may claim; protects against a
/// corrupt length prefix asking for gigabytes.
pub const MAX_ALLOCATION_BYTES: usize = 64 * 1024 * 1024;

/// A record type that travels on a topic with its own schema.
pub trait Record: Serialize + DeserializeOwned {
    /// Full Avro name, e.g. `io.ksched.JobRequest`.
    const NAME: &'static str;
}

macro_rules! records {
    ($($ty:ident),* $(,)?) => {
        $(impl Record for $ty { const NAME: &'static str = concat!("io.ksched.", stringify!($ty)); })*

        /// Any top-level record, for topics that carry several types.
        #[derive(Debug, Clone, PartialEq)]
        #[allow(clippy::large_enum_variant)]
        pub enum AnyRecord { $($ty($ty)),* }

        impl AnyRecord {
            /// Short record name, e.g. `JobRequest`.
            pub fn name(&self) -> &'static str {
                match self { $(AnyRecord::$ty(_) => stringify!($ty)),* }
            }
        }

        impl Registry {
            /// Decodes a record of whichever top-level type its header names.
            pub fn decode_any(&self, bytes: &[u8]) -> Result<AnyRecord> {
                let (entry, _) = self.split(bytes)?;
                match entry.name.as_str() {
                    $(concat!("io.ksched.", stringify!($ty)) => Ok(AnyRecord::$ty(self.decode(bytes)?)),)*
                    other => Err(Error::Malformed {
                        schema: other.to_owned(),
                        detail: "not a top-level ksched record".into(),
                    }),
                }
            }
        }
    };
}

records!(
    JobRequest,
    JobStarted,
    JobProgress,
    JobResult,
    Heartbeat,
    CancelJob,
    ApproveJob,
    RejectJob,
    Tick,
    Dispatch,
    CancelDispatch,
    DeadLetter,
    JournalEntry,
    RedriveJob,
    RescheduleJob,
    ScheduleCommand,
);

/// The registry of the schemas built into this binary, shared by the whole process.
///
/// # Panics
/// If the embedded schemas are invalid, which the codec's tests rule out before release.
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        apache_avro::util::max_allocation_bytes(MAX_ALLOCATION_BYTES);
        Registry::builtin().unwrap_or_else(|e| panic!("built-in schemas are invalid: {e}"))
    })
}

/// Encodes with the built-in registry.
pub fn encode<T: Record>(value: &T) -> Result<Vec<u8>> {
    registry().encode(value)
}

/// Decodes with the built-in registry.
pub fn decode<T: Record>(bytes: &[u8]) -> Result<T> {
    registry().decode(bytes)
}

/// Decodes any top-level record with the built-in registry.
pub fn decode_any(bytes: &[u8]) -> Result<AnyRecord> {
    registry().decode_any(bytes)
}

impl Registry {
    /// Encodes `value` with the current schema of its type.
    pub fn encode<T: Record>(&self, value: &T) -> Result<Vec<u8>> {
        let mut buf = Vec::with_capacity(256);
        self.encode_into(value, &mut buf)?;
        Ok(buf)
    }

    /// Appends the encoding of `value` to `buf`.
    pub fn encode_into<T: Record>(&self, value: &T, buf: &mut Vec<u8>) -> Result<()> {
        self.encode_framed(value, buf, |entry, buf| {
            buf.extend_from_slice(&entry.header())
        })
    }

    /// Appends `header` (given the current schema of `T`), then the body of `value` in that
    /// schema; on failure `buf` is left as it was.
    pub(crate) fn encode_framed<T: Record>(
        &self,
        value: &T,
        buf: &mut Vec<u8>,
        header: impl FnOnce(&SchemaEntry, &mut Vec<u8>),
    ) -> Result<()> {
        let entry = self.current(T::NAME).ok_or_else(|| Error::Encode {
            schema: T::NAME.to_owned(),
            detail: "no current schema of that name".into(),
        })?;
        let start = buf.len();
        header(entry, buf);
        if let Some(plan) = &entry.plan
            && !FAST_WRITER_OFF.load(Ordering::Relaxed)
        {
            let body = buf.len();
            if plan.encode(value, buf).is_some() {
                let checked = FAST_WRITES
                    .fetch_add(1, Ordering::Relaxed)
                    .is_multiple_of(CHECK_EVERY);
                if !checked || same_as_general(entry, value, buf, body, &FAST_WRITER_OFF, STRICT) {
                    return Ok(());
                }
                // It differed: apache-avro writes it below.
            }
        }
        entry.writer.write_ser(buf, value).map_err(|e| {
            buf.truncate(start);
            Error::Encode {
                schema: T::NAME.to_owned(),
                detail: e.to_string(),
            }
        })?;
        Ok(())
    }

    /// The fast path for records written with the current schema: straight from the bytes,
    /// no intermediate value tree (the compiled plan of the `fast` module, else apache-avro's serde
    /// reader), and how `body` was written (unless [`Form::Unsure`], it is all of the value:
    /// see [`Registry::whole`]). `None` when it does not fully succeed (bad input, trailing
    /// bytes); the general path then decodes or names the problem.
    fn decode_direct<T: Record>(writer: &SchemaEntry, body: &[u8]) -> Option<(T, Form)> {
        if let Some(plan) = &writer.plan {
            return plan.decode(body);
        }
        let mut cursor = body;
        let v = writer.reader.read_deser::<T>(&mut cursor).ok()?;
        cursor.is_empty().then_some((v, Form::Unsure))
    }

    /// Whether `value` encodes on the fast path (for tests and benchmarks).
    pub fn encodes_directly<T: Record>(&self, value: &T) -> bool {
        self.current(T::NAME)
            .and_then(|entry| entry.plan.as_ref())
            .is_some_and(|plan| plan.encode(value, &mut Vec::new()).is_some())
    }

    /// Whether `bytes` decode on the fast path (for tests and benchmarks).
    pub fn decodes_directly<T: Record>(&self, bytes: &[u8]) -> bool {
        self.split(bytes).is_ok_and(|(w, body)| {
            self.current(T::NAME)
                .is_some_and(|r| r.fingerprint == w.fingerprint)
                && Self::decode_direct::<T>(w, body).is_some()
        })
    }

    /// Decodes a `T` on the general path only (a tree of Avro values, resolved and then
    /// converted): what [`Registry::decode`] does when the fast path cannot. For tests and
    /// benchmarks that compare the two paths.
    #[doc(hidden)]
    pub fn decode_general<T: Record>(&self, bytes: &[u8]) -> Result<T> {
        self.decode_with(bytes, false)
    }

    /// Decodes a `T`, resolving an older writer schema to the current one.
    pub fn decode<T: Record>(&self, bytes: &[u8]) -> Result<T> {
        self.decode_with(bytes, true)
    }

    fn decode_with<T: Record>(&self, bytes: &[u8], fast: bool) -> Result<T> {
        let (writer, body) = self.split(bytes)?;
        if writer.name != T::NAME {
            return Err(Error::SchemaMismatch {
                expected: T::NAME,
                found: writer.name.clone(),
            });
        }
        let reader = self.current(T::NAME).ok_or_else(|| Error::Malformed {
            schema: T::NAME.to_owned(),
            detail: "no current schema of that name".into(),
        })?;
        let malformed = |detail: String| Error::Malformed {
            schema: writer.name.clone(),
            detail,
        };
        if fast
            && writer.fingerprint == reader.fingerprint
            && let Some((v, form)) = Self::decode_direct::<T>(writer, body)
        {
            // The plan reads strictly: every byte of a body it decodes is in the value, unless
            // a map's keys came out of order (one may be there twice) or a field was skipped.
            return match form {
                Form::Canonical | Form::Valid => Ok(v),
                Form::Unsure => Self::whole(writer, body, v),
            };
        }
        let mut cursor = body;
        let value = writer
            .reader
            .read_value(&mut cursor)
            .map_err(|e| malformed(e.to_string()))?;
        if !cursor.is_empty() {
            return Err(Error::TrailingBytes {
                schema: writer.name.clone(),
                count: cursor.len(),
            });
        }
        let value = if writer.fingerprint == reader.fingerprint {
            value
        } else {
            Resolver {
                writer_names: &writer.names,
                reader_names: &reader.names,
            }
            .resolve(value, writer.schema, reader.schema)
            .map_err(|detail| Error::Resolution {
                schema: T::NAME.to_owned(),
                writer_fingerprint: writer.fingerprint,
                detail,
            })?
        };
        let v = from_value::<T>(&value).map_err(|e| malformed(e.to_string()))?;
        if writer.fingerprint == reader.fingerprint {
            Self::whole(writer, body, v)
        } else {
            Ok(v)
        }
    }

    /// `v`, decoded from `body` with the current schema, if it is all of `body`.
    /// apache-avro reads a `["null", T]` union whose value is cut short as null, so a
    /// record cut inside a trailing optional field (a JobRequest's `traceparent`) decoded
    /// as if the field were absent. Records from producers are read again strictly by the
    /// schema's plan ([`Plan::check`](fast::Plan::check)), except those the plan itself
    /// decoded with every byte in the value ([`Form`]); the journal, which only ksched writes
    /// (in transactions), is not, to keep replays at full speed.
    ///
    /// Valid Avro that apache-avro would write otherwise is read (another library's blocks
    /// with their sizes, map entries in any order: hamba/avro in Go writes both), but a map
    /// that holds a key twice is refused: Avro readers disagree on which value wins, and the
    /// journal, the policy and the worker must all see the one the producer meant.
    fn whole<T: Record>(writer: &SchemaEntry, body: &[u8], v: T) -> Result<T> {
        if T::NAME == "io.ksched.JournalEntry" {
            return Ok(v);
        }
        let malformed = |detail: String| Error::Malformed {
            schema: writer.name.clone(),
            detail,
        };
        let Some(plan) = &writer.plan else {
            let mut again = Vec::with_capacity(body.len());
            return match writer.writer.write_ser(&mut again, &v) {
                Ok(_) if again.len() == body.len() => Ok(v),
                _ => Err(malformed(format!(
                    "the body ({} bytes) is not one whole record: what it decodes to takes {} bytes (cut short inside a field?)",
                    body.len(),
                    again.len()
                ))),
            };
        };
        match plan.check(body) {
            Ok(None) => Ok(v),
            Ok(Some(key)) => Err(malformed(format!(
                "a map holds the key {key:?} more than once (Avro readers disagree on which value wins)"
            ))),
            Err(_) => Err(malformed(format!(
                "the body ({} bytes) is not one whole record (cut short inside a field?)",
                body.len()
            ))),
        }
    }
}

/// Fast writes so far in this process; every [`CHECK_EVERY`]th is checked.
static FAST_WRITES: AtomicU64 = AtomicU64::new(0);

/// Set once a checked fast write differed from apache-avro's: from then on, every record of
/// this process is written by apache-avro.
static FAST_WRITER_OFF: AtomicBool = AtomicBool::new(false);

/// One fast write in this many is written again by apache-avro and compared: all of them in
/// debug builds (every test), one in 1,024 in release builds (an apache-avro write costs a
/// few microseconds: a few nanoseconds a record on average).
const CHECK_EVERY: u64 = if cfg!(debug_assertions) { 1 } else { 1024 };

/// Whether a difference panics (debug builds: every test) or turns the fast writer off.
const STRICT: bool = cfg!(debug_assertions);

/// Whether the fast writer was turned off in this process because a record it wrote
/// differed from apache-avro's (a bug to report; records are then written by apache-avro).
pub fn fast_writer_off() -> bool {
    FAST_WRITER_OFF.load(Ordering::Relaxed)
}

/// Checks the body the fast writer appended to `buf` (from `body` on) against apache-avro's
/// writer; true if they agree. If they do not: `strict` panics; otherwise the body is cut
/// from `buf` (for apache-avro to write), `off` is set (the fast writer is not used again),
/// the error is logged, and the answer is false.
fn same_as_general<T: Record>(
    entry: &SchemaEntry,
    value: &T,
    buf: &mut Vec<u8>,
    body: usize,
    off: &AtomicBool,
    strict: bool,
) -> bool {
    let mut general = Vec::new();
    let written = entry.writer.write_ser(&mut general, value);
    if written.is_ok() && general == buf[body..] {
        return true;
    }
    assert!(
        !strict,
        "the fast writer wrote a {} differently from apache-avro",
        T::NAME
    );
    off.store(true, Ordering::Relaxed);
    tracing::error!(
        schema = T::NAME,
        "the fast Avro writer wrote a record differently from apache-avro: it is off for the \
         rest of this process, every record is written by apache-avro (a bug: please report it)"
    );
    buf.truncate(body);
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fast body that differs from apache-avro's is cut (apache-avro writes it then), and
    /// the fast writer is turned off (here a local switch); in strict mode it panics.
    #[test]
    fn a_fast_write_that_differs_is_replaced_and_turns_the_fast_writer_off() {
        let value = JobProgress::default();
        let entry = registry().current(JobProgress::NAME).unwrap();
        let mut expected = b"head".to_vec();
        entry.writer.write_ser(&mut expected, &value).unwrap();
        let off = AtomicBool::new(false);
        let mut buf = expected.clone();
        assert!(same_as_general(entry, &value, &mut buf, 4, &off, false));
        assert!(!off.load(Ordering::Relaxed), "agreeing writes leave it on");
        let mut wrong = b"head".to_vec();
        wrong.extend([0x02, 0x02, 0x02]);
        assert!(!same_as_general(entry, &value, &mut wrong, 4, &off, false));
        assert_eq!(wrong, b"head", "the fast body is cut");
        assert!(off.load(Ordering::Relaxed));
        let strict = std::panic::catch_unwind(|| {
            let mut wrong = b"head\x02".to_vec();
            same_as_general(entry, &value, &mut wrong, 4, &AtomicBool::new(false), true)
        });
        assert!(strict.is_err(), "strict mode panics");
    }
}
