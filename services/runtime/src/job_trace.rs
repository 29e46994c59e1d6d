//! The scheduler's spans of a traced job (docs/operations.md, "Traces").
//!
//! A job is traced when its record carries a valid W3C `traceparent` header (or its request
//! the field): ksched continues that trace, it never starts one. The live processor records
//! a span for each decision on a traced input and for each dispatch of a traced job, and puts
//! the span's `traceparent` on the journal and dispatch records it writes, so the worker's
//! run and its reports continue the same trace:
//!
//! ```text
//! producer span (the job record's traceparent)
//! ├── ksched submit      the decision on the submission (accepted, queued, denied, ...)
//! └── ksched dispatch    each dispatch; the Dispatch record carries its traceparent
//!     └── ksched run     the worker SDK's span of the attempt; its reports carry it
//!         └── ksched report  the decision on each JobStarted, JobProgress, JobResult
//! ```
//!
//! Spans go through the OpenTelemetry API: without an exporter installed (no endpoint
//! configured, or a build without the `otel` feature) nothing is recorded, and the headers
//! carry the parent's context on unchanged. Replays (recovery, audit) record no spans.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ksched_codec::trace_context;
use ksched_core::events::{Event, Input, JournalEntry};
use ksched_core::records::Dispatch;
use opentelemetry::global::{BoxedSpan, BoxedTracer};
use opentelemetry::trace::{
    Span, SpanContext, SpanKind, Status, TraceContextExt, Tracer, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};

/// The instrumentation scope of the scheduler's job spans.
pub const SCOPE: &str = "ksched";

/// Records the spans of traced jobs.
pub struct JobSpans {
    tracer: BoxedTracer,
}

impl std::fmt::Debug for JobSpans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobSpans").finish_non_exhaustive()
    }
}

impl Default for JobSpans {
    /// Spans through the global tracer provider (the one `ksched run` installs when trace
    /// export is configured; a no-op otherwise).
    fn default() -> JobSpans {
        JobSpans {
            tracer: opentelemetry::global::tracer_provider().tracer(SCOPE),
        }
    }
}

/// What a traced input's span needs from before the input is decided on (the decision
/// consumes it).
#[derive(Debug)]
pub struct Traced {
    parent: SpanContext,
    name: &'static str,
    /// When the broker appended the input (ms), else None: the span starts at the decision.
    read_at: Option<i64>,
    attributes: Vec<KeyValue>,
}

impl Traced {
    /// The trace `input` continues, if any: a submission's own (kept in its request), or a
    /// worker report's record header.
    pub fn of(input: &Input, header: Option<&SpanContext>, read_at: Option<i64>) -> Option<Traced> {
        let report = |name: &'static str, job_id: &str, attempt: i32, worker: &str| {
            Some(Traced {
                parent: header?.clone(),
                name,
                read_at,
                attributes: vec![
                    KeyValue::new("ksched.job.id", job_id.to_owned()),
                    KeyValue::new("ksched.job.attempt", i64::from(attempt)),
                    KeyValue::new("ksched.worker.id", worker.to_owned()),
                ],
            })
        };
        match input {
            Input::Submit(r) => Some(Traced {
                parent: trace_context::parse_str(r.traceparent.as_deref()?)?,
                name: "ksched submit",
                read_at,
                attributes: vec![
                    KeyValue::new("ksched.job.id", r.job_id.clone()),
                    KeyValue::new("ksched.tenant.id", r.tenant_id.clone()),
                    KeyValue::new("messaging.system", "kafka"),
                    KeyValue::new("messaging.source.name", r.topic.clone()),
                ],
            }),
            Input::Started(s) => report("ksched report", &s.job_id, s.attempt, &s.worker_id),
            Input::Progress(p) => report("ksched report", &p.job_id, p.attempt, &p.worker_id),
            Input::Result(r) => {
                report("ksched report", &r.job_id, r.attempt, &r.worker_id).map(|mut t| {
                    t.attributes
                        .push(KeyValue::new("ksched.result.status", r.status.as_str()));
                    t
                })
            }
            _ => None,
        }
    }
}

impl JobSpans {
    /// Records the span of the decision on a traced input (its journal entry's events as
    /// attributes); returns the `traceparent` for the entry's journal record.
    pub fn decided(&self, traced: Traced, entry: &JournalEntry) -> Option<String> {
        let events: Vec<&str> = entry.events.iter().map(Event::name).collect();
        let failed = entry.events.iter().find_map(|e| match e {
            Event::JobDenied(_) => Some("denied"),
            Event::JobFailed(_) => Some("failed"),
            Event::JobTimedOut(_) => Some("timed out"),
            Event::DeadLettered(_) => Some("dead-lettered"),
            _ => None,
        });
        let mut attributes = traced.attributes;
        attributes.push(KeyValue::new("ksched.events", events.join(",")));
        attributes.push(KeyValue::new(
            "ksched.journal.cause",
            format!(
                "{}/{}/{}",
                entry.cause.topic, entry.cause.partition, entry.cause.offset
            ),
        ));
        let now = SystemTime::now();
        let start = traced.read_at.map_or(now, at).min(now);
        let mut span = self.start(
            &traced.parent,
            traced.name,
            SpanKind::Consumer,
            start,
            attributes,
        );
        if let Some(why) = failed {
            span.set_status(Status::error(why));
        }
        let header = trace_context::format(span.span_context());
        span.end_with_timestamp(now);
        header
    }

    /// Records the span of a traced job's dispatch; returns the `traceparent` for the
    /// Dispatch record (the worker's run continues it). None for an untraced job.
    pub fn dispatched(&self, d: &Dispatch, topic: &str) -> Option<String> {
        let parent = trace_context::parse_str(d.job.traceparent.as_deref()?)?;
        let now = SystemTime::now();
        let mut span = self.start(
            &parent,
            "ksched dispatch",
            SpanKind::Producer,
            now,
            vec![
                KeyValue::new("ksched.job.id", d.job.job_id.clone()),
                KeyValue::new("ksched.job.attempt", i64::from(d.attempt)),
                KeyValue::new("ksched.worker.id", d.worker_id.clone()),
                KeyValue::new("ksched.pool", d.pool.clone()),
                KeyValue::new("messaging.system", "kafka"),
                KeyValue::new("messaging.destination.name", topic.to_owned()),
            ],
        );
        let header = trace_context::format(span.span_context());
        span.end_with_timestamp(now);
        header
    }

    fn start(
        &self,
        parent: &SpanContext,
        name: &'static str,
        kind: SpanKind,
        start: SystemTime,
        attributes: Vec<KeyValue>,
    ) -> BoxedSpan {
        let cx = Context::new().with_remote_span_context(parent.clone());
        self.tracer
            .span_builder(name)
            .with_kind(kind)
            .with_start_time(start)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &cx)
    }
}

/// A broker time in ms as a `SystemTime`.
fn at(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use ksched_core::events::Cause;
    use ksched_core::records::{JobRequest, JobResult};

    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn entry(input: Input) -> JournalEntry {
        JournalEntry {
            cause: Cause {
                topic: "jobs".into(),
                partition: 0,
                offset: 7,
            },
            log_time: 0,
            input,
            events: Vec::new(),
            format: 1,
        }
    }

    #[test]
    fn untraced_inputs_have_no_span() {
        let submit = Input::Submit(JobRequest {
            job_id: "j".into(),
            ..JobRequest::default()
        });
        assert!(Traced::of(&submit, None, None).is_none());
        let result = Input::Result(JobResult {
            job_id: "j".into(),
            attempt: 1,
            worker_id: "w".into(),
            status: ksched_core::records::ResultStatus::Succeeded,
            error_code: None,
            error_message: None,
            result_ptr: None,
            result_meta: Default::default(),
            execution_ms: 1,
            finished_at: 1,
        });
        assert!(Traced::of(&result, None, None).is_none());
        // A submission's header is already in its request: the record header is not read
        // for it a second time.
        let header = trace_context::parse_str(PARENT);
        assert!(Traced::of(&submit, header.as_ref(), None).is_none());
    }

    /// Without an exporter (the global no-op provider) the headers carry the parent's
    /// context on unchanged, so a trace survives a scheduler that records nothing.
    #[test]
    fn without_an_exporter_the_parent_context_passes_through() {
        let spans = JobSpans::default();
        let submit = Input::Submit(JobRequest {
            job_id: "j".into(),
            traceparent: Some(PARENT.into()),
            ..JobRequest::default()
        });
        let traced = Traced::of(&submit, None, Some(1)).expect("traced");
        assert_eq!(
            spans.decided(traced, &entry(submit)).as_deref(),
            Some(PARENT)
        );
        let mut d = Dispatch::default();
        assert!(spans.dispatched(&d, "dispatch.default").is_none());
        d.job.traceparent = Some(PARENT.into());
        assert_eq!(
            spans.dispatched(&d, "dispatch.default").as_deref(),
            Some(PARENT)
        );
        // A value that does not parse is no trace.
        d.job.traceparent = Some("00-nonsense".into());
        assert!(spans.dispatched(&d, "dispatch.default").is_none());
    }
}
