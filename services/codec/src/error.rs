use thiserror::Error;

/// Why a record could not be encoded or decoded. Every variant names what was wrong so the
/// DLQ entry of a malformed record tells the producer what to fix.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    #[error(
        "record is {len} bytes, shorter than its header (10 bytes for single-object encoding: \
         C3 01 + fingerprint; 5 for the Confluent wire format: 00 + schema id)"
    )]
    Truncated { len: usize },

    #[error(
        "record starts with neither the Avro single-object marker C3 01 nor the Confluent \
         wire format's magic byte 00 (found {found:02X?}); producers must write Avro \
         single-object encoding or use a Schema Registry serializer"
    )]
    BadMagic { found: [u8; 2] },

    #[error("schema id {id} (Confluent wire format) is unknown: {detail}")]
    UnknownSchemaId { id: u32, detail: String },

    #[error(
        "schema id {id} (Confluent wire format) could not be fetched from the schema registry: \
         {detail}"
    )]
    SchemaUnavailable { id: u32, detail: String },

    #[error(
        "unknown writer schema fingerprint {}: the record was written with a schema this ksched \
         does not know (newer producer, or a schema missing from schemas/history/)",
        fingerprint_hex(*fingerprint)
    )]
    UnknownFingerprint { fingerprint: u64 },

    #[error("expected a {expected} record, but it was written as {found}")]
    SchemaMismatch {
        expected: &'static str,
        found: String,
    },

    #[error("{schema} body does not decode: {detail}")]
    Malformed { schema: String, detail: String },

    #[error("{schema} body has {count} unread trailing bytes")]
    TrailingBytes { schema: String, count: usize },

    #[error(
        "cannot resolve {schema} written with schema {} to the current reader: {detail}",
        fingerprint_hex(*writer_fingerprint)
    )]
    Resolution {
        schema: String,
        writer_fingerprint: u64,
        detail: String,
    },

    #[error("cannot encode {schema}: {detail}")]
    Encode { schema: String, detail: String },

    #[error("schema {name} is invalid: {detail}")]
    Schema { name: String, detail: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A fingerprint as hex of its header bytes (little-endian), the form fastavro and the
/// `schemas/history/` file names use.
pub fn fingerprint_hex(fingerprint: u64) -> String {
    format!("{:016x}", fingerprint.swap_bytes())
}
