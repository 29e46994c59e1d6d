//! Traces through Kafka headers (docs/operations.md, "Traces"), against the real broker and a
//! real OTLP/HTTP receiver started by the test (it decodes the collector protocol's
//! `ExportTraceServiceRequest` as sent). `ksched run` exports over its default build's OTLP
//! exporter; the test process is the worker application: an SDK worker with an
//! OpenTelemetry SDK installed as the global tracer provider, exporting to the same receiver.
//!
//! One trace, started by the "producer" (the header this test writes), must show submit ->
//! dispatch -> run -> report for each attempt, parented hop by hop across three processes'
//! worth of records; untraced and malformed-header jobs must record nothing.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use ksched_codec::{AnyRecord, trace_context};
use ksched_core::events::Input;
use ksched_core::records::JobRequest;
use ksched_worker::{Outcome, Worker};
use opentelemetry::trace::{Span as _, Tracer as _};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value::Value};
use prost::Message as _;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use tokio_util::sync::CancellationToken;

/// One span as the receiver got it.
#[derive(Debug, Clone)]
struct Seen {
    service: String,
    name: String,
    trace: String,
    span: String,
    parent: String,
    attributes: BTreeMap<String, String>,
}

impl Seen {
    fn attr(&self, key: &str) -> &str {
        self.attributes.get(key).map_or("", String::as_str)
    }
}

/// An OTLP/HTTP trace receiver on 127.0.0.1 (protobuf, as the exporters send by default).
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<Seen>>>,
    _rt: tokio::runtime::Runtime,
}

impl Receiver {
    fn start() -> Receiver {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let spans: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let kept = spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let kept = kept.clone();
                async move {
                    match ExportTraceServiceRequest::decode(body) {
                        Ok(request) => {
                            kept.lock().unwrap().extend(flatten(request));
                            (axum::http::StatusCode::OK, Vec::new())
                        }
                        Err(e) => (
                            axum::http::StatusCode::BAD_REQUEST,
                            e.to_string().into_bytes(),
                        ),
                    }
                }
            }),
        );
        rt.spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver {
            url,
            spans,
            _rt: rt,
        }
    }

    fn all(&self) -> Vec<Seen> {
        self.spans.lock().unwrap().clone()
    }

    fn named(&self, trace: &str, name: &str) -> Vec<Seen> {
        self.all()
            .into_iter()
            .filter(|s| s.trace == trace && s.name == name)
            .collect()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(kv: &[KeyValue]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(other) => format!("{other:?}"),
                None => String::new(),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

fn flatten(request: ExportTraceServiceRequest) -> Vec<Seen> {
    let mut out = Vec::new();
    for rs in request.resource_spans {
        let resource = text(&rs.resource.map(|r| r.attributes).unwrap_or_default());
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(Seen {
                    service: service.clone(),
                    name: s.name.clone(),
                    trace: hex(&s.trace_id),
                    span: hex(&s.span_id),
                    parent: hex(&s.parent_span_id),
                    attributes: text(&s.attributes),
                });
            }
        }
    }
    out
}

/// The span among `spans` of `attempt`.
fn of_attempt(spans: &[Seen], attempt: i32) -> Vec<Seen> {
    spans
        .iter()
        .filter(|s| s.attr("ksched.job.attempt") == attempt.to_string())
        .cloned()
        .collect()
}

fn produce(producer: &BaseProducer, topic: &str, id: &str, traceparent: Option<&str>) {
    let job = JobRequest {
        job_id: id.to_owned(),
        topic: topic.to_owned(),
        tenant_id: "acme".into(),
        submitted_at: 1,
        ..JobRequest::default()
    };
    let bytes = ksched_codec::encode(&job).unwrap();
    let mut record = BaseRecord::to(topic).key(id).payload(&bytes);
    if let Some(t) = traceparent {
        record = record.headers(OwnedHeaders::new().insert(Header {
            key: "traceparent",
            value: Some(t),
        }));
    }
    producer.send(record).unwrap();
}

#[test]
fn a_job_is_one_trace_from_its_record_through_dispatch_and_run_to_its_result() {
    let receiver = Receiver::start();
    let rc = RunningScheduler::start(&format!(
        "log:\n  otlp_endpoint: {}/v1/traces\n  service_name: ksched-under-test\n",
        receiver.url
    ));

    // The worker application: an OpenTelemetry SDK as the global provider, and the SDK worker.
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(format!("{}/v1/traces", receiver.url))
        .build()
        .unwrap();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("traces-test-worker")
                .build(),
        )
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let token = CancellationToken::new();
    let worker = {
        let _guard = rt.enter();
        // Every attempt reports its start too (not only its result, as a job this short
        // otherwise would): each report is a span of the trace.
        let mut cfg = rc.worker_config("traced-worker");
        cfg.start_report_delay = Duration::ZERO;
        Worker::new(cfg).unwrap()
    };
    let t = token.clone();
    rt.spawn(async move {
        worker
            .run(
                |job| async move {
                    // A handler's own span, parented on the attempt's run span.
                    let tracer = opentelemetry::global::tracer("traces-test-handler");
                    let mut span = tracer.start_with_context("handler work", &job.trace_context());
                    span.end();
                    if job.attempt() == 1 && job.job_id() == "traced" {
                        return Outcome::retryable("flaky", "the first attempt fails");
                    }
                    Outcome::succeeded()
                },
                t,
            )
            .await
    });

    // The producer's span: a trace id of this run, a span id of "its" send.
    let trace = uuid::Uuid::new_v4().simple().to_string();
    let producer_span = &uuid::Uuid::new_v4().simple().to_string()[..16];
    let traceparent = format!("00-{trace}-{producer_span}-01");
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &rc.bootstrap)
        .create()
        .unwrap();
    produce(&producer, &rc.job_topic, "traced", Some(&traceparent));
    produce(&producer, &rc.job_topic, "untraced", None);
    produce(
        &producer,
        &rc.job_topic,
        "malformed",
        Some("00-not-a-trace-01"),
    );
    producer.flush(Duration::from_secs(10)).unwrap();
    for id in ["traced", "untraced", "malformed"] {
        wait_state(&rc.api, id, "SUCCEEDED");
    }

    // The records: the trace context travels in headers, and the submission's is journaled
    // in the job's request (a malformed one is not).
    let header = |r: &ksched_testkit::ReadRecord| -> Option<String> {
        r.headers
            .iter()
            .find(|(k, _)| k == trace_context::HEADER)
            .map(|(_, v)| String::from_utf8(v.clone()).unwrap())
    };
    let dispatches =
        ksched_testkit::read_to_end(&rc.bootstrap, &format!("{}dispatch.default", rc.prefix))
            .unwrap();
    let mut traced_dispatches = 0;
    for r in &dispatches {
        let Ok(AnyRecord::Dispatch(d)) = ksched_codec::decode_any(r.payload.as_deref().unwrap())
        else {
            continue;
        };
        match d.job.job_id.as_str() {
            "traced" => {
                traced_dispatches += 1;
                let h = header(r).expect("a traced job's dispatch carries traceparent");
                let sc = trace_context::parse_str(&h).expect("a valid traceparent");
                assert_eq!(sc.trace_id().to_string(), trace);
                assert_ne!(
                    sc.span_id().to_string(),
                    producer_span,
                    "{h}: not a new span"
                );
                assert_eq!(d.job.traceparent.as_deref(), Some(traceparent.as_str()));
            }
            other => {
                assert_eq!(header(r), None, "{other}'s dispatch has a traceparent");
                assert_eq!(d.job.traceparent, None, "{other}");
            }
        }
    }
    assert_eq!(traced_dispatches, 2, "two attempts of the traced job");
    let journal =
        ksched_testkit::read_to_end(&rc.bootstrap, &format!("{}journal", rc.prefix)).unwrap();
    let mut submissions = BTreeMap::new();
    for r in &journal {
        let Ok(AnyRecord::JournalEntry(e)) =
            ksched_codec::decode_any(r.payload.as_deref().unwrap())
        else {
            continue;
        };
        if let Input::Submit(req) = &e.input {
            submissions.insert(req.job_id.clone(), (req.traceparent.clone(), header(r)));
        }
    }
    let (kept, journal_header) = &submissions["traced"];
    assert_eq!(kept.as_deref(), Some(traceparent.as_str()));
    let journal_header = journal_header
        .as_deref()
        .expect("the submit entry's header");
    assert!(journal_header.contains(&trace), "{journal_header}");
    assert_eq!(submissions["untraced"], (None, None));
    assert_eq!(
        submissions["malformed"],
        (None, None),
        "a malformed header is not journaled"
    );

    // The spans: ksched exports in batches (every 5 s by default); the worker is flushed.
    provider.force_flush().unwrap();
    wait_until("every span of the traced job at the receiver", 90, || {
        receiver.named(&trace, "ksched report").len() >= 4
            && receiver.named(&trace, "ksched dispatch").len() >= 2
            && receiver.named(&trace, "ksched submit").len() == 1
            && receiver.named(&trace, "ksched run").len() >= 2
            && receiver.named(&trace, "handler work").len() >= 2
    });
    let submit = &receiver.named(&trace, "ksched submit")[0];
    assert_eq!(
        submit.parent, producer_span,
        "submit is the producer's child"
    );
    assert_eq!(submit.service, "ksched-under-test");
    assert_eq!(submit.attr("ksched.job.id"), "traced");
    assert!(
        submit.attr("ksched.events").contains("JobAccepted"),
        "{submit:?}"
    );
    assert_eq!(
        Some(submit.span.as_str()),
        journal_header.split('-').nth(2),
        "the journal record carries the submit span"
    );
    let dispatch = receiver.named(&trace, "ksched dispatch");
    let run = receiver.named(&trace, "ksched run");
    let report = receiver.named(&trace, "ksched report");
    let handler = receiver.named(&trace, "handler work");
    for attempt in [1, 2] {
        let d = of_attempt(&dispatch, attempt);
        assert_eq!(d.len(), 1, "attempt {attempt}: {dispatch:?}");
        let d = &d[0];
        assert_eq!(d.parent, producer_span, "dispatch is the producer's child");
        assert_eq!(d.service, "ksched-under-test");
        let r = of_attempt(&run, attempt);
        assert_eq!(r.len(), 1, "attempt {attempt}: {run:?}");
        let r = &r[0];
        assert_eq!(r.parent, d.span, "run is the dispatch's child");
        assert_eq!(r.service, "traces-test-worker");
        assert!(
            handler.iter().any(|h| h.parent == r.span),
            "the handler's span is the run's child: {handler:?}"
        );
        let reports = of_attempt(&report, attempt);
        assert!(
            reports.len() >= 2 && reports.iter().all(|p| p.parent == r.span),
            "attempt {attempt}: the reports are the run's children: {reports:?}"
        );
        let events: Vec<&str> = reports.iter().map(|p| p.attr("ksched.events")).collect();
        let expected = if attempt == 1 {
            "JobRetrying"
        } else {
            "JobSucceeded"
        };
        assert!(
            events.iter().any(|e| e.contains(expected)),
            "attempt {attempt}: {events:?}"
        );
        assert!(
            events.iter().any(|e| e.contains("JobRunning")),
            "{events:?}"
        );
    }

    // Nothing for the jobs that carried no (valid) trace.
    for s in receiver.all() {
        let job = s.attr("ksched.job.id");
        assert!(
            job != "untraced" && job != "malformed",
            "a span for an untraced job: {s:?}"
        );
    }

    token.cancel();
    rt.shutdown_timeout(Duration::from_secs(10));
    let _ = provider.shutdown();
    rc.stop();
}

/// `ksched submit` continues a trace (`--traceparent` or TRACEPARENT) and refuses a value
/// that is not one, before anything reaches Kafka.
#[test]
fn submit_refuses_a_malformed_traceparent() {
    let (code, _, err) = ksched(&[
        "submit",
        "--bootstrap-servers",
        "127.0.0.1:1",
        "--topic",
        "t",
        "--traceparent",
        "00-not-a-trace-01",
    ]);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("not a W3C trace context"), "{err}");
}
