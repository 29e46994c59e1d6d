use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use thiserror::Error;

/// An input record's coordinates.
pub type Coords = (String, i32, i64);

/// What stops the processor, with the coordinates it concerns. The supervisor
/// (`run_processor`) decides from the variant what to do next: retry after a pause, set an
/// input aside, or stop.
#[derive(Debug, Error)]
pub enum Error {
    #[error("configuration {source_name}: {detail}")]
    Config { source_name: String, detail: String },

    #[error("kafka: {context}: {source}")]
    Kafka { context: String, source: KafkaError },

    /// The brokers refused this client's identity: retrying cannot help.
    #[error("cannot connect to Kafka at {bootstrap}: {detail}. {hint}")]
    Refused {
        bootstrap: String,
        detail: String,
        hint: &'static str,
    },

    #[error(
        "another processor took over journal partition {partition} (transactional id {transactional_id} was fenced); this one stops"
    )]
    Fenced {
        partition: i32,
        transactional_id: String,
    },

    #[error(
        "another consumer joined the processor group with this instance's id ({instance_id}) and took its inputs; this one stops: {detail}"
    )]
    Replaced { instance_id: String, detail: String },

    #[error("journal record {topic}/{partition}@{offset} does not decode: {source}")]
    Journal {
        topic: String,
        partition: i32,
        offset: i64,
        source: ksched_codec::Error,
    },

    #[error(
        "the store in {path} reflects journal offset {store_offset}, but {topic}/{partition} ends at {journal_end}: the store belongs to another journal (or the journal was deleted). Move the data directory away to rebuild it from this journal"
    )]
    StoreAheadOfJournal {
        path: String,
        store_offset: i64,
        topic: String,
        partition: i32,
        journal_end: i64,
    },

    #[error(
        "the journal {topic}/{partition} starts at offset {journal_start}, but the store needs entries from {needed}: the journal lost records (retention or compaction on the journal?). Restore them, or accept the loss by moving the data directory away and rebuilding from what is left"
    )]
    JournalTruncated {
        topic: String,
        partition: i32,
        journal_start: i64,
        needed: i64,
    },

    #[error("store: {0}")]
    Store(#[from] ksched_store::Error),

    #[error(
        "the disk holding the store {path} is full ({detail}). The processor stopped cleanly: what it committed is in the journal. Free space and start ksched again; it catches the store up from the journal"
    )]
    DiskFull { path: String, detail: String },

    /// Writing what a batch of inputs caused failed in a way that retrying the same batch
    /// cannot fix (the broker refused a record, a topic or partition does not exist, a
    /// decision panicked). Which input caused it is not known yet: the inputs are retried one
    /// per transaction.
    /// Nothing was read for `seconds` although the ticker writes to the inputs all the time.
    #[error(
        "no input record for {seconds} s although the ticker writes one every tick: the input consumer is stuck; rebuilding the processor"
    )]
    InputsStalled { seconds: u64 },

    #[error(
        "{call} did not return within {seconds} s (librdkafka can wait forever for a coordinator that went away); rebuilding the processor with a new producer"
    )]
    TransactionStuck { call: &'static str, seconds: u64 },

    #[error("a batch of {inputs} inputs could not be committed: {detail}")]
    BatchFailed {
        inputs: usize,
        /// Per input partition, the last offset of the batch.
        ranges: BTreeMap<(String, i32), i64>,
        detail: String,
    },

    /// Deciding on one input, or writing what it caused, failed deterministically. The
    /// input is set aside (dead-lettered `processing_failed`) so that the scheduler goes on.
    #[error("input {}/{}@{} could not be processed: {detail}", .coords.0, .coords.1, .coords.2)]
    InputFailed { coords: Coords, detail: String },

    /// A thread, a socket or a file the process needs could not be had.
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },

    /// Records of a transaction the broker did not acknowledge in time: the batch is retried.
    #[error("{records} records of the transaction were not acknowledged within {timeout:?}")]
    Unacknowledged { records: i32, timeout: Duration },

    /// A topic the metadata does not list (not created yet, or deleted).
    #[error("topic {topic} is not in the metadata")]
    UnknownTopic { topic: String },

    /// An audit question that cannot be answered as asked (a directory that is not empty, a
    /// what-if with rules that do not hold together, an export that cannot be written).
    #[error("{0}")]
    Audit(String),

    /// A state the processor's own code should never reach (a consumer used before it was
    /// created); retried like a transient error, and worth a bug report.
    #[error("internal error: {0}")]
    Invariant(&'static str),
}

/// Wraps an I/O error with what was being done.
pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let context = context.into();
    move |source| Error::Io { context, source }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Wraps a Kafka error with what was being done.
pub fn kafka(context: impl Into<String>) -> impl FnOnce(KafkaError) -> Error {
    let context = context.into();
    move |source| Error::Kafka { context, source }
}

/// Whether a record the broker or the client refused was refused for what it is (its size,
/// its topic, its partition, its content): producing it again fails again. Everything else
/// (transport, timeouts, leadership, coordinators, replicas) may pass.
pub(crate) fn refused_for_what_it_is(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode::*;
    matches!(
        code,
        MessageSizeTooLarge
            | InvalidMessageSize
            | InvalidMessage
            | InvalidRecord
            | MessageBatchTooLarge
            | UnknownPartition
            | UnknownTopic
            | UnknownTopicOrPartition
            | InvalidArgument
            | InvalidTopic
            | InvalidPartitions
            | BadMessage
    )
}

impl Error {
    /// The process cannot go on: another instance owns the journal partition, the journal
    /// or the store is not what it must be (or its disk is full), or the configuration is
    /// wrong.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Error::Fenced { .. }
                | Error::Refused { .. }
                | Error::Replaced { .. }
                | Error::Journal { .. }
                | Error::StoreAheadOfJournal { .. }
                | Error::JournalTruncated { .. }
                | Error::Config { .. }
                | Error::DiskFull { .. }
                | Error::Store(_)
        )
    }
}
