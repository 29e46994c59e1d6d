//! `ksched submit`: produce a JobRequest to a job topic.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use ksched_core::records::{Budget, DependencyCondition, JobMeta, JobRequest, Priority};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::Deserialize;
use serde_json::json;

use super::output::{self, Format};
use super::{CliResult, EXIT_BAD_INPUT, EXIT_FAILED, Failure, Target};

#[derive(Debug, Args)]
pub(crate) struct SubmitArgs {
    /// A JSON job description (fields as in the JobRequest schema; payload as a string).
    /// Flags given as well override its fields.
    #[arg(long, short = 'f')]
    pub file: Option<PathBuf>,
    /// Job topic (default: job.default).
    #[arg(long)]
    pub topic: Option<String>,
    /// Job id (default: generated, `<tenant>:job-<uuid>`).
    #[arg(long)]
    pub job_id: Option<String>,
    /// Tenant (default: default).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Who submits it: what four eyes compare an approver with (default: the login name,
    /// `$USER`; a topic bound to its producer names its own instead).
    #[arg(long)]
    pub principal: Option<String>,
    /// critical, interactive or batch (default: batch).
    #[arg(long)]
    pub priority: Option<String>,
    /// Label KEY=VALUE (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// Environment KEY=VALUE (repeatable); keys starting with '$' are secret.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Payload text.
    #[arg(long, conflicts_with = "payload_file")]
    pub payload: Option<String>,
    /// Payload from a file.
    #[arg(long)]
    pub payload_file: Option<PathBuf>,
    /// Capability a pool must offer (repeatable).
    #[arg(long = "requires", value_name = "CAPABILITY")]
    pub requires: Vec<String>,
    #[arg(long)]
    pub capability: Option<String>,
    /// Risk tag for the policy (repeatable).
    #[arg(long = "risk-tag")]
    pub risk_tags: Vec<String>,
    #[arg(long)]
    pub idempotency_key: Option<String>,
    #[arg(long)]
    pub deadline_ms: Option<i64>,
    #[arg(long)]
    pub max_runtime_ms: Option<i64>,
    #[arg(long)]
    pub workflow_id: Option<String>,
    /// Keyring that seals the job's secret env values (and the payload, with
    /// --seal-payload) for its tenant before the record leaves this machine
    /// (docs/security.md#secrets). Required when a `$` env is given.
    #[arg(long, env = "KSCHED_KEYRING", value_name = "FILE")]
    pub keyring: Option<PathBuf>,
    /// Seal the payload too: only the job's workers can read it (needs --keyring).
    #[arg(long, requires = "keyring")]
    pub seal_payload: bool,
    /// W3C trace context the job continues (`00-<trace id>-<span id>-<flags>`), sent as the
    /// record's `traceparent` header; from the TRACEPARENT environment variable when set
    /// (how a traced script hands its context to the tools it runs).
    #[arg(long, env = "TRACEPARENT", value_name = "TRACEPARENT")]
    pub traceparent: Option<String>,
    /// Run no earlier than this time: RFC 3339 (`2026-12-24T18:00:00Z`, or with an offset),
    /// a date-time taken as UTC (`2026-12-24 18:00`), or epoch milliseconds. Until then the
    /// job waits DELAYED.
    #[arg(long, value_name = "TIME", conflicts_with = "delay")]
    pub at: Option<String>,
    /// Run no earlier than this long from now (`90s`, `10m`, `1h30m`, `2 days`).
    #[arg(long, value_name = "DURATION")]
    pub delay: Option<String>,
    /// Run after this job (repeatable): the job waits BLOCKED until its dependencies'
    /// condition holds (--when), and fails `dependency_failed` when it no longer can.
    #[arg(long = "after", value_name = "JOB_ID")]
    pub after: Vec<String>,
    /// When the jobs named by --after let it run: all-succeeded (default), all-terminal or
    /// any-succeeded.
    #[arg(long = "when", value_name = "CONDITION")]
    pub when: Option<String>,
    /// Longest it waits for them (`30m`, `2h`, `1 day`); the default and the most are
    /// limits.max_dependency_wait_ms.
    #[arg(long, value_name = "DURATION")]
    pub dependency_timeout: Option<String>,
    /// Make the job a member of this batch of its tenant (needs --batch-size): the batch's
    /// callbacks run once all its members ended.
    #[arg(long, value_name = "BATCH_ID", requires = "batch_size")]
    pub batch: Option<String>,
    /// How many members the batch has (every member names the same count).
    #[arg(long, value_name = "N", requires = "batch")]
    pub batch_size: Option<i32>,
    /// Make the job a callback of this batch of its tenant: it waits BLOCKED until every
    /// member ended, then runs with the counts in its request (`batch_outcome`).
    #[arg(long, value_name = "BATCH_ID", conflicts_with = "after")]
    pub after_batch: Option<String>,
}

/// The JSON file format: every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct JobFile {
    job_id: Option<String>,
    topic: Option<String>,
    tenant_id: Option<String>,
    principal_id: Option<String>,
    priority: Option<String>,
    labels: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
    payload: Option<String>,
    budget: Budget,
    meta: JobMeta,
    workflow_id: Option<String>,
    step_index: Option<i32>,
    /// Epoch milliseconds.
    not_before: Option<i64>,
    depends_on: Vec<String>,
    dependency_condition: Option<String>,
    dependency_timeout_ms: Option<i64>,
    batch_id: Option<String>,
    batch_size: Option<i32>,
    after_batch: Option<String>,
}

pub(super) fn pairs(items: &[String], what: &str) -> Result<BTreeMap<String, String>, Failure> {
    items
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| {
                    Failure::new(EXIT_BAD_INPUT, format!("{what} {kv:?} is not KEY=VALUE"))
                })
        })
        .collect()
}

pub(super) fn priority(s: &str) -> Result<Priority, Failure> {
    match s.to_ascii_lowercase().as_str() {
        "critical" => Ok(Priority::Critical),
        "interactive" => Ok(Priority::Interactive),
        "batch" => Ok(Priority::Batch),
        other => Err(Failure::new(
            EXIT_BAD_INPUT,
            format!("priority {other:?} is not critical, interactive or batch"),
        )),
    }
}

/// Builds the request from the file and the flags.
pub(crate) fn build(args: &SubmitArgs, now_ms: i64) -> Result<JobRequest, Failure> {
    let file: JobFile = match &args.file {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| {
                Failure::new(EXIT_BAD_INPUT, format!("reading {}: {e}", p.display()))
            })?;
            serde_json::from_str(&text)
                .map_err(|e| Failure::new(EXIT_BAD_INPUT, format!("{}: {e}", p.display())))?
        }
        None => JobFile::default(),
    };
    let mut labels = file.labels;
    labels.extend(pairs(&args.labels, "label")?);
    let mut env = file.env;
    env.extend(pairs(&args.env, "env")?);
    let payload = match (&args.payload, &args.payload_file) {
        (Some(p), _) => p.clone().into_bytes(),
        (None, Some(f)) => std::fs::read(f)
            .map_err(|e| Failure::new(EXIT_BAD_INPUT, format!("reading {}: {e}", f.display())))?,
        (None, None) => file.payload.unwrap_or_default().into_bytes(),
    };
    let mut meta = file.meta;
    meta.requires.extend(args.requires.iter().cloned());
    meta.risk_tags.extend(args.risk_tags.iter().cloned());
    if let Some(c) = &args.capability {
        meta.capability = Some(c.clone());
    }
    if let Some(k) = &args.idempotency_key {
        meta.idempotency_key = Some(k.clone());
    }
    let mut budget = file.budget;
    if args.deadline_ms.is_some() {
        budget.deadline_ms = args.deadline_ms;
    }
    if args.max_runtime_ms.is_some() {
        budget.max_runtime_ms = args.max_runtime_ms;
    }
    let prio = match args.priority.as_ref().or(file.priority.as_ref()) {
        Some(p) => priority(p)?,
        None => Priority::Batch,
    };
    let tenant_id = args
        .tenant
        .clone()
        .or(file.tenant_id)
        .unwrap_or_else(|| "default".to_owned());
    // In the tenant's namespace, which a tenant-bound topic requires (docs/security.md).
    let job_id = args
        .job_id
        .clone()
        .or(file.job_id)
        .unwrap_or_else(|| format!("{tenant_id}:job-{}", uuid::Uuid::new_v4().simple()));
    let not_before = match (&args.at, &args.delay) {
        (Some(at), _) => Some(super::audit::parse_time(at).ok_or_else(|| {
            Failure::new(
                EXIT_BAD_INPUT,
                format!("--at {at:?} is not a time (RFC 3339, YYYY-MM-DD HH:MM[:SS] in UTC, or epoch ms)"),
            )
        })?),
        (None, Some(delay)) => Some(now_ms.saturating_add(delay_ms(delay)?)),
        (None, None) => file.not_before,
    };
    let mut depends_on = file.depends_on;
    depends_on.extend(args.after.iter().cloned());
    let dependency_condition = match args.when.as_ref().or(file.dependency_condition.as_ref()) {
        None => DependencyCondition::AllSucceeded,
        Some(w) => DependencyCondition::parse(&w.replace('-', "_")).ok_or_else(|| {
            Failure::new(
                EXIT_BAD_INPUT,
                format!("--when {w:?} is not all-succeeded, all-terminal or any-succeeded"),
            )
        })?,
    };
    let dependency_timeout_ms = match &args.dependency_timeout {
        Some(d) => Some(delay_ms(d)?),
        None => file.dependency_timeout_ms,
    };
    if depends_on.is_empty() && (args.when.is_some() || args.dependency_timeout.is_some()) {
        return Err(Failure::new(
            EXIT_BAD_INPUT,
            "--when and --dependency-timeout need dependencies (--after, or depends_on in --file)",
        ));
    }
    Ok(JobRequest {
        job_id,
        topic: args
            .topic
            .clone()
            .or(file.topic)
            .unwrap_or_else(|| "job.default".to_owned()),
        tenant_id,
        principal_id: args
            .principal
            .clone()
            .or(file.principal_id)
            .or_else(login_name),
        priority: prio,
        labels,
        env,
        payload,
        budget,
        meta,
        workflow_id: args.workflow_id.clone().or(file.workflow_id),
        step_index: file.step_index,
        compensation: None,
        submitted_at: now_ms,
        traceparent: match args.traceparent.as_deref().filter(|t| !t.is_empty()) {
            None => None,
            Some(t) => Some(ksched_codec::trace_context::normalize(t).ok_or_else(|| {
                Failure::new(
                    EXIT_BAD_INPUT,
                    format!(
                        "--traceparent {t:?} is not a W3C trace context (00-<32 hex>-<16 hex>-<2 hex>)"
                    ),
                )
            })?),
        },
        not_before,
        depends_on,
        dependency_condition,
        dependency_timeout_ms,
        batch_id: args.batch.clone().or(file.batch_id),
        batch_size: args.batch_size.or(file.batch_size),
        after_batch: args.after_batch.clone().or(file.after_batch),
        batch_outcome: None,
    })
}

/// Milliseconds of a duration written as jiff reads one (`90s`, `10m`, `1h30m`, `2 days`,
/// or ISO 8601 `PT10M`); never negative.
pub(crate) fn delay_ms(text: &str) -> Result<i64, Failure> {
    let bad = || {
        Failure::new(
            EXIT_BAD_INPUT,
            format!("{text:?} is not a duration (e.g. 90s, 10m, 1h30m, 2 days)"),
        )
    };
    let d: jiff::SignedDuration = text.trim().parse().map_err(|_| bad())?;
    if d.is_negative() {
        return Err(bad());
    }
    i64::try_from(d.as_millis()).map_err(|_| bad())
}

/// Seals the request's secrets with the keyring; without one, a secret is an error (the
/// scheduler would refuse it unsealed, `secret_in_clear`).
pub(crate) fn seal(args: &SubmitArgs, request: &mut JobRequest) -> Result<(), Failure> {
    let Some(path) = &args.keyring else {
        let unsealed = ksched_secrets::unsealed_secrets(request);
        if unsealed.is_empty() {
            return Ok(());
        }
        return Err(Failure::new(
            EXIT_BAD_INPUT,
            format!(
                "{} secret (`$` key): secrets are sealed before they leave this machine, so give \
                 --keyring FILE (or KSCHED_KEYRING) with a key for tenant {} (ksched keys rotate \
                 --keyring FILE --tenant {}; docs/security.md#secrets)",
                unsealed.join(", "),
                request.tenant_id,
                request.tenant_id
            ),
        ));
    };
    let keyring = ksched_secrets::Keyring::load(path)
        .map_err(|e| Failure::new(EXIT_BAD_INPUT, e.to_string()))?;
    keyring
        .seal_request(request, args.seal_payload)
        .map_err(|e| Failure::new(EXIT_BAD_INPUT, e.to_string()))?;
    Ok(())
}

pub(crate) fn submit(t: &Target, args: SubmitArgs) -> CliResult {
    let mut request = build(&args, ksched_runtime::clock::wall_clock_ms())?;
    seal(&args, &mut request)?;
    let bytes = ksched_codec::encode(&request)
        .map_err(|e| Failure::new(EXIT_BAD_INPUT, format!("encoding the job: {e}")))?;
    t.check_credentials()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(EXIT_FAILED, e.to_string()))?;
    let (partition, offset) = rt.block_on(async {
        let producer: FutureProducer = t
            .client_config()
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", "15000")
            .create()
            .map_err(|e| Failure::new(EXIT_FAILED, format!("kafka: {e}")))?;
        let mut record = FutureRecord::to(&request.topic)
            .key(&request.job_id)
            .payload(&bytes);
        if let Some(t) = &request.traceparent {
            record = record.headers(OwnedHeaders::new().insert(Header {
                key: ksched_codec::trace_context::HEADER,
                value: Some(t),
            }));
        }
        producer
            .send(record, Duration::from_secs(15))
            .await
            .map(|d| (d.partition, d.offset))
            .map_err(|(e, _)| {
                Failure::new(
                    EXIT_FAILED,
                    format!(
                        "could not produce to {} at {}: {e} (does the topic exist? is the broker up?)",
                        request.topic, t.bootstrap
                    ),
                )
            })
    })?;
    match t.output {
        Format::Json => output::json(&json!({
            "job_id": request.job_id,
            "topic": request.topic,
            "partition": partition,
            "offset": offset,
        })),
        Format::Table => println!("{}", request.job_id),
    }
    Ok(())
}

/// The submitter when none is named: the user running the command (its login name, or its
/// user id where no name is set).
fn login_name() -> Option<String> {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|k| std::env::var(k).ok())
        .map(|u| u.trim().to_owned())
        .filter(|u| !u.is_empty())
        .or_else(|| Some(format!("uid-{}", rustix::process::getuid().as_raw())))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SubmitArgs,
    }

    fn built(flags: &[&str]) -> Result<JobRequest, Failure> {
        let cli = Cli::try_parse_from(std::iter::once("submit").chain(flags.iter().copied()))
            .map_err(|e| Failure::new(EXIT_BAD_INPUT, e.to_string()))?;
        build(&cli.args, 1_000_000)
    }

    #[test]
    fn a_job_runs_after_others_under_a_condition_and_a_timeout() {
        let r = built(&[]).unwrap();
        assert!(r.depends_on.is_empty() && r.dependency_timeout_ms.is_none());
        let r = built(&["--after", "a", "--after", "b", "--when", "any-succeeded"]).unwrap();
        assert_eq!(r.depends_on, ["a", "b"]);
        assert_eq!(r.dependency_condition, DependencyCondition::AnySucceeded);
        let r = built(&["--after", "a", "--dependency-timeout", "2h"]).unwrap();
        assert_eq!(r.dependency_condition, DependencyCondition::AllSucceeded);
        assert_eq!(r.dependency_timeout_ms, Some(7_200_000));
        assert!(built(&["--after", "a", "--when", "sometimes"]).is_err());
        assert!(
            built(&["--when", "all-terminal"]).is_err(),
            "--when needs --after"
        );
    }

    #[test]
    fn a_job_joins_a_batch_or_waits_for_one() {
        let r = built(&["--batch", "nightly", "--batch-size", "3"]).unwrap();
        assert_eq!(r.batch_id.as_deref(), Some("nightly"));
        assert_eq!(r.batch_size, Some(3));
        let r = built(&["--after-batch", "nightly"]).unwrap();
        assert_eq!(r.after_batch.as_deref(), Some("nightly"));
        assert!(r.batch_id.is_none() && r.batch_outcome.is_none());
    }

    #[test]
    fn a_job_is_run_at_a_time_or_after_a_delay() {
        assert_eq!(built(&[]).unwrap().not_before, None);
        assert_eq!(
            built(&["--delay", "90s"]).unwrap().not_before,
            Some(1_090_000)
        );
        assert_eq!(
            built(&["--delay", "1h30m"]).unwrap().not_before,
            Some(1_000_000 + 5_400_000)
        );
        assert_eq!(
            built(&["--at", "2026-12-24T18:00:00Z"]).unwrap().not_before,
            Some(1_798_135_200_000)
        );
        assert_eq!(
            built(&["--at", "2026-12-24 18:00"]).unwrap().not_before,
            Some(1_798_135_200_000),
            "a civil time is UTC"
        );
        for bad in [
            &["--delay", "-5m"][..],
            &["--delay", "soon"],
            &["--at", "tomorrow"],
            &["--at", "2026-12-24T18:00:00Z", "--delay", "1m"],
        ] {
            assert!(built(bad).is_err(), "{bad:?}");
        }
    }
}
