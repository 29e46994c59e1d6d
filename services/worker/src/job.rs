//! One job as the handler sees it, and how it ended.

use std::collections::BTreeMap;
use std::sync::Arc;

use ksched_codec::trace_context;
use ksched_core::records::{Dispatch, JobProgress, ResultMeta};
use tokio_util::sync::CancellationToken;

use crate::now_ms;
use crate::reporter::Reporter;

/// How a job ended, as the handler reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Succeeded {
        result_ptr: Option<String>,
        meta: ResultMeta,
    },
    /// Worth another attempt (the scheduler backs off and retries).
    Retryable { code: String, message: String },
    /// Not worth retrying; `code` becomes the DLQ reason code.
    Fatal { code: String, message: String },
    /// The job stopped because its cancellation token fired.
    Cancelled,
}

impl Outcome {
    pub fn succeeded() -> Outcome {
        Outcome::Succeeded {
            result_ptr: None,
            meta: ResultMeta::default(),
        }
    }
    pub fn retryable(code: &str, message: &str) -> Outcome {
        Outcome::Retryable {
            code: code.into(),
            message: message.into(),
        }
    }
    pub fn fatal(code: &str, message: &str) -> Outcome {
        Outcome::Fatal {
            code: code.into(),
            message: message.into(),
        }
    }
}

/// One job, as the handler sees it.
#[derive(Debug, Clone)]
pub struct JobContext {
    /// The dispatch as the scheduler sent it: secret env values and a sealed payload are
    /// sealed here; [`JobContext::env`] and [`JobContext::payload`] give them opened.
    pub dispatch: Arc<Dispatch>,
    /// Fires when the scheduler cancels the attempt (CancelDispatch) or the worker hands the
    /// job back during shutdown. Handlers should stop and return [`Outcome::Cancelled`].
    pub cancel: CancellationToken,
    pub(crate) opened: Arc<ksched_secrets::Opened>,
    pub(crate) reporter: Reporter,
    /// The `traceparent` of the attempt's run span: the trace the scheduler carried in the
    /// Dispatch (its header, else the job's own), continued by this worker.
    pub(crate) trace: Option<String>,
}

/// The error code of a job whose sealed values this worker cannot open (no keyring, a key
/// it lacks — retired or shredded —, or a value altered on the way).
pub const SECRET_UNAVAILABLE: &str = "secret_unavailable";

impl JobContext {
    /// The job's environment, secret values opened. Never log it whole.
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.opened.env
    }

    /// The job's payload, opened if the producer sealed it.
    pub fn payload(&self) -> &[u8] {
        &self.opened.payload
    }

    pub fn job_id(&self) -> &str {
        &self.dispatch.job.job_id
    }

    pub fn attempt(&self) -> i32 {
        self.dispatch.attempt
    }

    /// The OpenTelemetry context of the attempt's run span (`ksched run`), to parent the
    /// handler's own spans: `tracer.start_with_context("fetch", &ctx.trace_context())`. An
    /// empty context when the job is not traced.
    pub fn trace_context(&self) -> opentelemetry::Context {
        use opentelemetry::trace::TraceContextExt;
        match self.trace.as_deref().and_then(trace_context::parse_str) {
            Some(sc) => opentelemetry::Context::new().with_remote_span_context(sc),
            None => opentelemetry::Context::new(),
        }
    }

    /// The attempt's `traceparent` (W3C), for a handler that calls other services.
    pub fn traceparent(&self) -> Option<&str> {
        self.trace.as_deref()
    }

    /// Reports progress (0.0 to 1.0).
    pub async fn progress(&self, fraction: f64, message: &str) {
        let p = JobProgress {
            job_id: self.job_id().to_owned(),
            attempt: self.attempt(),
            worker_id: self.reporter.worker_id.clone(),
            progress: fraction,
            message: (!message.is_empty()).then(|| message.to_owned()),
            sent_at: now_ms(),
        };
        self.reporter
            .send_result_topic(
                self.dispatch.reply_partition,
                self.job_id(),
                &p,
                self.trace.as_deref(),
            )
            .await;
    }
}
