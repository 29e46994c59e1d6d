use thiserror::Error;

/// What stops the processor, with the coordinates it concerns.
#[derive(Debug, Error)]
pub enum Error {
    #[error("configuration {source_name}: {detail}")]
    Config { source_name: String, detail: String },

    #[error("kafka: {context}: {source}")]
    Kafka {
        context: String,
        source: rdkafka::error::KafkaError,
    },

    #[error(
        "another processor took over journal partition {partition} (transactional id {transactional_id} was fenced); this one stops"
    )]
    Fenced {
        partition: i32,
        transactional_id: String,
    },

    #[error("journal record {topic}/{partition}@{offset} does not decode: {source}")]
    Journal {
        topic: String,
        partition: i32,
        offset: i64,
        source: ksched_codec::Error,
    },

    #[error("store: {0}")]
    Store(#[from] ksched_store::Error),

    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Wraps a Kafka error with what was being done.
pub(crate) fn kafka(
    context: impl Into<String>,
) -> impl FnOnce(rdkafka::error::KafkaError) -> Error {
    let context = context.into();
    move |source| Error::Kafka { context, source }
}
