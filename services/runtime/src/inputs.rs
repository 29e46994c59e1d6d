//! Input records as the processor takes them: copied out of the consumer, checked against
//! the size limit before anything decodes them, decoded into the input their topic may
//! carry, their timestamps trusted only when the broker set them, and what was read of each
//! evidence partition tracked for the Tick watermark (docs/architecture.md, "Time").

use std::collections::{BTreeMap, BTreeSet};

use ksched_codec::{AnyRecord, decode_any, trace_context};
use ksched_core::events::{Input, MalformedRecord};
use ksched_core::reason::DlqReason;
use ksched_core::records::{JobRequest, Millis, truncate_for_display};
use opentelemetry::trace::SpanContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message, Timestamp};

use crate::topics::{InputKind, Topics};

/// An input record, copied out of the consumer.
#[derive(Debug, Clone)]
pub struct InputRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The broker's append time. None when the topic keeps the producer's CreateTime:
    /// producers do not move the scheduler's clock.
    pub log_append_time: Option<Millis>,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    /// The record's `traceparent` header, when it holds a valid one (trace_context.rs).
    pub trace: Option<SpanContext>,
}

impl InputRecord {
    /// Copies `m`; `trust_create_time` takes producers' timestamps as broker time (only for
    /// a cluster that cannot stamp append times, `topics.trust_create_time`).
    pub fn from_message(m: &BorrowedMessage<'_>, trust_create_time: bool) -> InputRecord {
        InputRecord {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            log_append_time: match m.timestamp() {
                Timestamp::LogAppendTime(t) => Some(t),
                Timestamp::CreateTime(t) if trust_create_time => Some(t),
                Timestamp::CreateTime(_) | Timestamp::NotAvailable => None,
            },
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().map(<[u8]>::to_vec),
            trace: m.headers().and_then(|h| {
                h.iter()
                    .find(|h| h.key == trace_context::HEADER)
                    .and_then(|h| trace_context::parse(h.value?))
            }),
        }
    }

    pub fn coords(&self) -> (String, i32, i64) {
        (self.topic.clone(), self.partition, self.offset)
    }

    fn key_text(&self) -> Option<String> {
        self.key
            .as_deref()
            .map(|k| truncate_for_display(&String::from_utf8_lossy(k), 256))
    }

    fn size(&self) -> i32 {
        self.payload
            .as_ref()
            .map_or(0, |p| i32::try_from(p.len()).unwrap_or(i32::MAX))
    }

    /// A refusal of this record with `reason` (what becomes its DeadLetter).
    pub fn refused(&self, reason: DlqReason, error: String) -> Input {
        Input::Malformed(MalformedRecord {
            key: self.key_text(),
            size_bytes: self.size(),
            error,
            reason_code: reason.as_str().to_owned(),
            job_id: None,
            tenant_id: None,
        })
    }
}

/// What a record is to the processor.
// Taken once per record and moved at once, like `Input` itself.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Taken {
    /// An input to decide on and journal.
    Input(Input),
    /// A watermark marker the ticker appends to each evidence partition: it only says how far
    /// that partition has been read; nothing is journaled for it.
    Marker,
}

/// The record as an input: refused when larger than `max_record_bytes` (before decoding
/// anything), decoded if it is a kind its topic carries, otherwise a malformed record. A
/// job request's topic is set to the topic it was read from, so that the journal holds the
/// request exactly as the scheduler takes it.
pub fn take(topics: &Topics, rec: &InputRecord, max_record_bytes: i64) -> Taken {
    let Some(payload) = rec.payload.as_deref() else {
        return Taken::Input(rec.refused(DlqReason::MalformedRecord, "record has no value".into()));
    };
    if payload.len() as i64 > max_record_bytes {
        return Taken::Input(rec.refused(
            DlqReason::RecordTooLarge,
            format!(
                "{} bytes exceed limits.max_record_bytes {max_record_bytes}; not decoded",
                payload.len()
            ),
        ));
    }
    let record = match decode_any(payload) {
        Ok(r) => r,
        // The registry could not be asked: the record may be fine (docs/reliability.md).
        Err(e @ ksched_codec::Error::SchemaUnavailable { .. }) => {
            return Taken::Input(rec.refused(DlqReason::SchemaUnavailable, e.to_string()));
        }
        Err(e) => return Taken::Input(rec.refused(DlqReason::MalformedRecord, e.to_string())),
    };
    let kind = topics.kind(&rec.topic);
    let input = match (kind, record) {
        (InputKind::Jobs, AnyRecord::JobRequest(mut r)) => {
            let unsealed = ksched_secrets::unsealed_secrets(&r);
            if !unsealed.is_empty() {
                return Taken::Input(refuse_unsealed(rec, &r, &unsealed));
            }
            r.topic = rec.topic.clone();
            // The header first, else the body's field; only a valid value is journaled.
            r.traceparent = match &rec.trace {
                Some(header) => trace_context::format(header),
                None => r.traceparent.as_deref().and_then(trace_context::normalize),
            };
            Input::Submit(r)
        }
        (InputKind::Results, AnyRecord::JobStarted(r)) => Input::Started(r),
        (InputKind::Results, AnyRecord::JobProgress(r)) => Input::Progress(r),
        (InputKind::Results, AnyRecord::JobResult(r)) => Input::Result(r),
        (InputKind::Control, AnyRecord::CancelJob(r)) => Input::Cancel(r),
        (InputKind::Control, AnyRecord::ApproveJob(r)) => Input::Approve(r),
        (InputKind::Control, AnyRecord::RejectJob(r)) => Input::Reject(r),
        (InputKind::Control, AnyRecord::RedriveJob(r)) => Input::Redrive(r),
        (InputKind::Control, AnyRecord::RescheduleJob(r)) => Input::Reschedule(r),
        (InputKind::Control, AnyRecord::ScheduleCommand(c)) => {
            // A schedule's template is journaled as it is given: a secret in it must come
            // sealed, as in a job.
            if let Some(spec) = &c.spec {
                let probe = ksched_core::records::JobRequest {
                    job_id: format!("{}:{}", c.tenant_id, c.schedule_id),
                    tenant_id: c.tenant_id.clone(),
                    env: spec.template.env.clone(),
                    ..Default::default()
                };
                let unsealed = ksched_secrets::unsealed_secrets(&probe);
                if !unsealed.is_empty() {
                    return Taken::Input(refuse_unsealed(rec, &probe, &unsealed));
                }
            }
            Input::Schedule(c)
        }
        (InputKind::Control, AnyRecord::Tick(mut t)) => {
            // Set by the processor from what it has read, never taken from a producer.
            t.watermark = None;
            Input::Tick(t)
        }
        (InputKind::Heartbeats, AnyRecord::Heartbeat(r)) => Input::Heartbeat(r),
        (InputKind::Results | InputKind::Heartbeats, AnyRecord::Tick(_)) => return Taken::Marker,
        (kind, other) => rec.refused(
            DlqReason::MalformedRecord,
            format!(
                "a {} record does not belong on {} ({kind:?} topic)",
                other.name(),
                rec.topic
            ),
        ),
    };
    Taken::Input(input)
}

/// How far each evidence partition (results, heartbeats) has been read, in broker time:
/// the latest append time read there. Heartbeats and results are the evidence that keeps a
/// worker alive and a job from timing out; a Tick is judged at the minimum over them (and
/// its own time), so that nothing is judged on input the processor has not read yet.
#[derive(Debug, Default)]
pub struct ReadThrough {
    read: BTreeMap<(String, i32), Millis>,
    assigned: BTreeSet<(String, i32)>,
}

impl ReadThrough {
    /// The evidence partitions this processor consumes (its assignment).
    pub fn set_assignment(&mut self, evidence: impl IntoIterator<Item = (String, i32)>) {
        self.assigned = evidence.into_iter().collect();
        self.read.retain(|k, _| self.assigned.contains(k));
    }

    pub fn observe(&mut self, rec: &InputRecord) {
        let k = (rec.topic.clone(), rec.partition);
        if let Some(t) = rec.log_append_time
            && self.assigned.contains(&k)
        {
            let e = self.read.entry(k).or_insert(t);
            *e = (*e).max(t);
        }
    }

    /// The time a Tick appended at `tick_time` may be judged at: the least of it and what
    /// every evidence partition was read through. None while an evidence partition has not
    /// been read at all since the processor started (its marker arrives within a tick).
    pub fn watermark(&self, tick_time: Millis) -> Option<Millis> {
        let mut w = tick_time;
        for k in &self.assigned {
            w = w.min(*self.read.get(k)?);
        }
        Some(w)
    }

    /// Evidence partitions not read since the start (for logs).
    pub fn unread(&self) -> Vec<String> {
        self.assigned
            .iter()
            .filter(|k| !self.read.contains_key(*k))
            .map(|(t, p)| format!("{t}/{p}"))
            .collect()
    }
}

/// Records the consumer could not deliver at all (a compressed batch it cannot decompress,
/// a record larger than it may fetch): librdkafka reports those as errors without their
/// coordinates and skips them. The next record read from the same partition shows where
/// the gap is; it becomes an `unreadable_record` dead letter there, so no record is only
/// logged. (A gap while no error is pending is normal: transaction markers, aborted
/// records.)
#[derive(Debug, Default)]
pub struct Unreadable {
    next: BTreeMap<(String, i32), i64>,
    pending: Option<String>,
}

impl Unreadable {
    pub fn error(&mut self, what: String) {
        self.pending = Some(what);
    }

    /// Notes `rec` as read; returns the unreadable records before it, when a consumer
    /// error is pending and records were skipped on its partition.
    pub fn read(&mut self, rec: &InputRecord) -> Option<InputRecord> {
        let k = (rec.topic.clone(), rec.partition);
        let expected = self.next.insert(k, rec.offset + 1);
        let first = expected.filter(|e| *e < rec.offset)?;
        let error = self.pending.take()?;
        let count = rec.offset - first;
        Some(InputRecord {
            topic: rec.topic.clone(),
            partition: rec.partition,
            offset: first,
            log_append_time: rec.log_append_time,
            key: None,
            trace: None,
            payload: Some(
                format!(
                    "offsets {first}..{} ({count} records) of {}/{} could not be read: {error}",
                    rec.offset - 1,
                    rec.topic,
                    rec.partition
                )
                .into_bytes(),
            ),
        })
    }

    /// After a rebuild, positions start over.
    pub fn reset(&mut self) {
        self.next.clear();
    }
}

/// Whether a consumer error means records were skipped (a batch that cannot be decompressed
/// or parsed, a record too large to fetch), as opposed to the connection troubles librdkafka
/// also reports through the consumer (broker down, timeouts), which lose nothing and are
/// retried by the client.
pub fn skips_records(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::BadMessage
                | RDKafkaErrorCode::BadCompression
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::UnsupportedCompressionType
                | RDKafkaErrorCode::InvalidRecord
        )
    )
}

/// The refusal of a request whose secret env values came unsealed: only ids and key names
/// go on (to the journal and the DLQ), never a value, so the secret rests nowhere the
/// scheduler writes (docs/security.md#secrets).
fn refuse_unsealed(rec: &InputRecord, r: &JobRequest, unsealed: &[String]) -> Input {
    Input::Malformed(MalformedRecord {
        key: rec.key_text(),
        size_bytes: rec.size(),
        error: format!(
            "secret env {} of job {} came unsealed: the producer must seal `$` values for the \
             job's tenant (ksched submit --keyring, docs/security.md#secrets); the record was \
             refused before it was journaled and its values are kept nowhere",
            truncate_for_display(&unsealed.join(", "), 256),
            truncate_for_display(&r.job_id, 256),
        ),
        reason_code: DlqReason::SecretInClear.as_str().to_owned(),
        job_id: Some(truncate_for_display(&r.job_id, 256)),
        tenant_id: Some(truncate_for_display(&r.tenant_id, 256)),
    })
}

/// The refusal of a new job while the disk under the store is short of its reserve
/// (`storage.min_free_disk_bytes`, see [`crate::disk`]): dead-lettered with its id, never
/// journaled as a job, so the same id may be submitted again later.
pub fn refuse_for_disk(rec: &InputRecord, r: &JobRequest, free: u64, reserve: u64) -> Input {
    Input::Malformed(MalformedRecord {
        key: rec.key_text(),
        size_bytes: rec.size(),
        error: format!(
            "job {} was refused: the disk under the scheduler's store has {free} bytes free, \
             under its reserve of {reserve} (storage.min_free_disk_bytes); submit it again \
             once space is freed",
            truncate_for_display(&r.job_id, 256),
        ),
        reason_code: DlqReason::StorageFull.as_str().to_owned(),
        job_id: Some(truncate_for_display(&r.job_id, 256)),
        tenant_id: Some(truncate_for_display(&r.tenant_id, 256)),
    })
}

/// The input for records the consumer skipped (see [`Unreadable`]).
pub fn unreadable_input(gap: &InputRecord) -> Input {
    let error = gap
        .payload
        .as_deref()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    Input::Malformed(MalformedRecord {
        key: None,
        size_bytes: 0,
        error,
        reason_code: DlqReason::UnreadableRecord.as_str().to_owned(),
        job_id: None,
        tenant_id: None,
    })
}

/// An input set aside after processing it failed deterministically: dead-lettered with what
/// failed, so the producer learns of it and the journal explains it.
pub fn set_aside(rec: &InputRecord, input: Option<&Input>, detail: &str) -> Input {
    let (job_id, tenant_id) = match input {
        Some(Input::Submit(r)) => (Some(r.job_id.clone()), Some(r.tenant_id.clone())),
        Some(other) => (other.job_id().map(str::to_owned), None),
        None => (None, None),
    };
    Input::Malformed(MalformedRecord {
        key: rec.key_text(),
        size_bytes: rec.size(),
        error: format!(
            "processing it failed and it was set aside so that scheduling could go on: {detail}"
        ),
        reason_code: DlqReason::ProcessingFailed.as_str().to_owned(),
        job_id,
        tenant_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_errors_that_skip_records_count_as_unreadable() {
        let consumption = |c| KafkaError::MessageConsumption(c);
        assert!(skips_records(&consumption(
            RDKafkaErrorCode::BadCompression
        )));
        assert!(skips_records(&consumption(RDKafkaErrorCode::BadMessage)));
        assert!(skips_records(&consumption(
            RDKafkaErrorCode::MessageSizeTooLarge
        )));
        // A broker going away mid-fetch loses nothing: the client fetches again.
        for transient in [
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::OperationTimedOut,
            RDKafkaErrorCode::NotLeaderForPartition,
        ] {
            assert!(!skips_records(&consumption(transient)), "{transient:?}");
        }
        assert!(!skips_records(&KafkaError::Global(
            RDKafkaErrorCode::BrokerTransportFailure
        )));
    }

    fn rec(topic: &str, partition: i32, offset: i64, t: Option<i64>) -> InputRecord {
        InputRecord {
            topic: topic.into(),
            partition,
            offset,
            log_append_time: t,
            key: None,
            payload: None,
            trace: None,
        }
    }

    #[test]
    fn the_watermark_is_the_least_read_evidence_partition() {
        let mut r = ReadThrough::default();
        r.set_assignment([("hb".to_owned(), 0), ("res".to_owned(), 0)]);
        r.observe(&rec("hb", 0, 1, Some(100)));
        assert_eq!(r.watermark(500), None, "res not read yet");
        r.observe(&rec("res", 0, 1, Some(300)));
        assert_eq!(r.watermark(500), Some(100));
        r.observe(&rec("hb", 0, 2, Some(700)));
        assert_eq!(r.watermark(500), Some(300));
        // Producer timestamps (CreateTime) say nothing about what was read.
        r.observe(&rec("res", 0, 2, None));
        assert_eq!(r.watermark(900), Some(300));
        // Partitions outside the assignment do not hold it back.
        r.observe(&rec("jobs", 0, 1, Some(10)));
        assert_eq!(r.watermark(900), Some(300));
    }

    #[test]
    fn a_request_with_an_unsealed_secret_is_refused_without_its_value() {
        let topics = Topics::new(
            "ksched.",
            vec!["job.default".into()],
            vec!["default".into()],
        );
        let mut r = JobRequest {
            job_id: "acme:job-1".into(),
            tenant_id: "acme".into(),
            ..JobRequest::default()
        };
        r.env.insert("$TOKEN".into(), "s3cret-in-clear".into());
        r.env.insert("MODE".into(), "fast".into());
        let mut record = rec("job.default", 0, 7, Some(1));
        record.payload = Some(ksched_codec::encode(&r).unwrap());
        let Taken::Input(Input::Malformed(m)) = take(&topics, &record, 1 << 20) else {
            panic!("not refused");
        };
        assert_eq!(m.reason_code, "secret_in_clear");
        assert_eq!(m.job_id.as_deref(), Some("acme:job-1"));
        assert_eq!(m.tenant_id.as_deref(), Some("acme"));
        assert!(m.error.contains("$TOKEN"), "{}", m.error);
        assert!(!format!("{m:?}").contains("s3cret-in-clear"));

        // Sealed, the same request is taken as a submission.
        let mut keyring = ksched_secrets::Keyring::new();
        keyring.rotate("acme").unwrap();
        keyring.seal_request(&mut r, false).unwrap();
        record.payload = Some(ksched_codec::encode(&r).unwrap());
        assert!(matches!(
            take(&topics, &record, 1 << 20),
            Taken::Input(Input::Submit(_))
        ));
        // A value that only looks hidden is no seal either.
        r.env.insert("$OTHER".into(), "*hidden*".into());
        record.payload = Some(ksched_codec::encode(&r).unwrap());
        assert!(matches!(
            take(&topics, &record, 1 << 20),
            Taken::Input(Input::Malformed(_))
        ));
    }

    #[test]
    fn a_schedule_whose_template_holds_an_unsealed_secret_is_refused_without_its_value() {
        use ksched_core::records::{JobTemplate, ScheduleAction, ScheduleCommand, ScheduleSpec};
        let topics = Topics::new(
            "ksched.",
            vec!["job.default".into()],
            vec!["default".into()],
        );
        let mut sealed = JobRequest {
            job_id: "acme:nightly".into(),
            tenant_id: "acme".into(),
            ..JobRequest::default()
        };
        sealed.env.insert("$TOKEN".into(), "s3cret-in-clear".into());
        let clear = sealed.env.clone();
        let mut keyring = ksched_secrets::Keyring::new();
        keyring.rotate("acme").unwrap();
        keyring.seal_request(&mut sealed, false).unwrap();
        let command = |env| ScheduleCommand {
            schedule_id: "nightly".into(),
            tenant_id: "acme".into(),
            action: ScheduleAction::Create,
            spec: Some(ScheduleSpec {
                interval_ms: Some(60_000),
                template: JobTemplate {
                    topic: "job.default".into(),
                    env,
                    ..JobTemplate::default()
                },
                ..ScheduleSpec::default()
            }),
            principal_id: "alice".into(),
            reason: None,
            requested_at: 1,
        };
        let mut record = rec(&topics.control, 0, 3, Some(1));
        record.payload = Some(ksched_codec::encode(&command(clear)).unwrap());
        let Taken::Input(Input::Malformed(m)) = take(&topics, &record, 1 << 20) else {
            panic!("not refused");
        };
        assert_eq!(m.reason_code, "secret_in_clear");
        assert!(m.error.contains("$TOKEN"), "{}", m.error);
        assert!(!format!("{m:?}").contains("s3cret-in-clear"));
        // Sealed for the tenant, it is taken as a schedule command.
        record.payload = Some(ksched_codec::encode(&command(sealed.env)).unwrap());
        assert!(matches!(
            take(&topics, &record, 1 << 20),
            Taken::Input(Input::Schedule(_))
        ));
    }

    #[test]
    fn a_skipped_record_is_found_at_the_next_one_of_its_partition() {
        let mut u = Unreadable::default();
        assert!(u.read(&rec("t", 0, 5, None)).is_none());
        // A gap without an error: transaction markers, not a loss.
        assert!(u.read(&rec("t", 0, 8, None)).is_none());
        u.error("bad compression".into());
        let gap = u.read(&rec("t", 0, 11, None)).expect("gap");
        assert_eq!((gap.partition, gap.offset), (0, 9));
        assert!(
            String::from_utf8(gap.payload.unwrap())
                .unwrap()
                .contains("offsets 9..10")
        );
    }
}
