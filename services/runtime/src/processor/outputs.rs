//! What a batch sends: journal entries, dispatches and dead letters, encoded and queued
//! into the open transaction.

use std::time::{Duration, Instant};

use ksched_codec::{Framing, Record, trace_context};
use ksched_core::events::JournalEntry;
use ksched_core::outputs::Output;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;

use super::Processor;
use crate::error::{Error, Result, kafka};
use crate::positions::{self};

impl Processor {
    /// One record decided on, encoded: sent at once in the open transaction, or kept in the
    /// outbox until the transaction begins.
    pub(super) fn queue(
        &mut self,
        topic: String,
        partition: Option<i32>,
        key: Vec<u8>,
        payload: Vec<u8>,
        trace: Option<String>,
        positions: Option<String>,
    ) -> Result<()> {
        let counters = if topic == self.topics.journal {
            &self.counters.journal
        } else if topic == self.topics.dlq {
            &self.counters.dlq
        } else {
            &self.counters.dispatch
        };
        // The positions header is journal bytes too (a batch's first record carries it).
        let header = positions
            .as_ref()
            .map_or(0, |p| positions::HEADER.len() + p.len());
        counters.count(key.len() + payload.len() + header);
        let o = Outgoing {
            topic,
            partition,
            key,
            payload,
            trace,
            positions,
        };
        if self.open {
            self.produce(o)
        } else {
            self.outbox.push(o);
            Ok(())
        }
    }

    /// Sends one record in the open transaction. A full producer queue is waited out for at
    /// most the transaction timeout; a record the client refuses outright fails at once.
    pub(super) fn produce(&mut self, o: Outgoing) -> Result<()> {
        let mut record = BaseRecord::to(&o.topic).key(&o.key).payload(&o.payload);
        if let Some(p) = o.partition.filter(|p| *p >= 0) {
            record = record.partition(p);
        }
        if o.trace.is_some() || o.positions.is_some() {
            let mut headers = OwnedHeaders::new();
            if let Some(t) = &o.trace {
                headers = headers.insert(Header {
                    key: trace_context::HEADER,
                    value: Some(t),
                });
            }
            if let Some(p) = &o.positions {
                headers = headers.insert(Header {
                    key: positions::HEADER,
                    value: Some(p),
                });
            }
            record = record.headers(headers);
        }
        let deadline = Instant::now()
            + Duration::from_millis(self.config.settings.processor.transaction_timeout_ms);
        loop {
            match self.producer().send(record) {
                Ok(()) => {
                    self.producer().context().acks.sent();
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r))
                    if Instant::now() < deadline =>
                {
                    crate::topics::serve_deliveries(self.producer());
                    record = r;
                }
                Err((e, _)) => return Err(kafka(format!("producing to {}", o.topic))(e)),
            }
        }
        Ok(())
    }

    pub(super) fn send_entry(&mut self, entry: &JournalEntry, trace: Option<String>) -> Result<()> {
        let bytes = encode_or_fail(&self.config.framing, &self.topics.journal, entry)?;
        let journal = self.topics.journal.clone();
        let partition = self.config.settings.processor.journal_partition;
        let positions = self.positions_header.take();
        self.queue(
            journal,
            Some(partition),
            entry.key().into_bytes(),
            bytes,
            trace,
            positions,
        )
    }

    pub(super) fn send_output(&mut self, out: Output) -> Result<()> {
        match out {
            Output::Dispatch {
                pool,
                partition,
                mut record,
                payload_len,
                payload_of,
            } => {
                if payload_len > 0 {
                    record.job.payload = self.payload(&payload_of)?;
                }
                record.reply_partition = self
                    .shard
                    .reply_partition(&record.worker_id, self.results_partitions);
                let topic = self.topics.dispatch(&pool);
                let bytes = encode_or_fail(&self.config.framing, &topic, record.as_ref())?;
                let trace = self.spans.dispatched(&record, &topic);
                self.queue(
                    topic,
                    Some(partition),
                    record.worker_id.as_bytes().to_vec(),
                    bytes,
                    trace,
                    None,
                )
            }
            Output::CancelDispatch {
                pool,
                partition,
                record,
            } => {
                let topic = self.topics.dispatch(&pool);
                let bytes = encode_or_fail(&self.config.framing, &topic, &record)?;
                self.queue(
                    topic,
                    Some(partition),
                    record.worker_id.into_bytes(),
                    bytes,
                    None,
                    None,
                )
            }
            Output::DeadLetter(dl) => {
                let topic = self.topics.dlq.clone();
                let key = if dl.job_id.is_empty() {
                    format!(
                        "{}/{}/{}",
                        dl.cause_topic, dl.cause_partition, dl.cause_offset
                    )
                } else {
                    dl.job_id.clone()
                };
                let bytes = encode_or_fail(&self.config.framing, &topic, &dl)?;
                self.queue(topic, None, key.into_bytes(), bytes, None, None)
            }
        }
    }

    /// A job's payload: accepted in this batch or the one in flight (not written yet), or
    /// from the store.
    pub(super) fn payload(&self, job_id: &str) -> Result<Vec<u8>> {
        if let Some(p) = self
            .engine
            .state()
            .dirty
            .as_ref()
            .and_then(|d| d.payloads.get(job_id))
            .or_else(|| self.in_flight.as_ref()?.pending.payload(job_id))
            .or_else(|| self.engine.payload_being_written(job_id))
        {
            return Ok(p.clone());
        }
        self.engine.store().payload(job_id)?.ok_or_else(|| {
            Error::Store(ksched_store::Error::Decode {
                what: format!("the payload of job {job_id}"),
                detail: "it is missing".into(),
            })
        })
    }
}

/// A record decided on, encoded, waiting for its transaction to begin.
pub(super) struct Outgoing {
    topic: String,
    partition: Option<i32>,
    key: Vec<u8>,
    payload: Vec<u8>,
    /// The record's `traceparent` header, for a traced job's records.
    trace: Option<String>,
    /// The shard's input positions ([`positions::HEADER`]), on a batch's first journal
    /// record.
    positions: Option<String>,
}

/// Encodes a record the processor writes; a value that does not encode is refused like a
/// record the broker refuses (it is the input's, not the broker's, problem).
fn encode_or_fail<T: Record>(framing: &Framing, topic: &str, value: &T) -> Result<Vec<u8>> {
    framing.encode(topic, value).map_err(|e| {
        kafka(format!("producing {} (it does not encode: {e})", T::NAME))(
            KafkaError::MessageProduction(RDKafkaErrorCode::InvalidMessage),
        )
    })
}
