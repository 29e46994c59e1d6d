//! The operator commands: submit, jobs, workers, cancel, approve, reject, dlq, journal, keys.
//!
//! Queries and approve/reject/cancel go through the HTTP API of `ksched run` (`--api`);
//! `submit` and `journal tail` talk to Kafka directly (`--bootstrap-servers`), so they work
//! without a running scheduler. Defaults come from `config/ksched.yaml` when it exists.
//!
//! Exit codes: 0 done, 1 failed (unreachable, server error), 2 usage, 3 not found,
//! 4 conflict (e.g. the job is not awaiting approval), 5 rejected input, 6 not authenticated
//! or not allowed.

pub(crate) mod audit;
pub(crate) mod batches;
pub(crate) mod journal;
pub(crate) mod keys;
pub(crate) mod output;
pub(crate) mod schedules;
pub(crate) mod submit;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use output::{Format, cell, table, time_cell};

pub(crate) const EXIT_FAILED: u8 = 1;
pub(crate) const EXIT_USAGE: u8 = 2;
pub(crate) const EXIT_NOT_FOUND: u8 = 3;
pub(crate) const EXIT_CONFLICT: u8 = 4;
pub(crate) const EXIT_BAD_INPUT: u8 = 5;
pub(crate) const EXIT_DENIED: u8 = 6;

/// Where the tools connect, shared by every operator command.
#[derive(Debug, Clone, Args)]
pub(crate) struct Connection {
    /// Settings file to take Kafka, the topic prefix and the HTTP address from, layered with
    /// `KSCHED__*` variables and flags exactly as `ksched run` does (default:
    /// config/ksched.yaml when it exists).
    #[arg(long, global = true, env = "KSCHED_CONFIG")]
    pub config: Option<PathBuf>,
    /// Kafka bootstrap servers (default: from the settings).
    #[arg(long, global = true, env = "KAFKA_BOOTSTRAP_SERVERS")]
    pub bootstrap_servers: Option<String>,
    #[command(flatten)]
    pub kafka: crate::kafka_args::KafkaArgs,
    /// Base URL of the scheduler's HTTP API (default: from the settings).
    #[arg(long, global = true, env = "KSCHED_API")]
    pub api: Option<String>,
    /// API token, when the API requires one (http.tokens_file); better from the environment
    /// than on a command line others can list.
    #[arg(long, global = true, env = "KSCHED_API_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// CA certificate (PEM) the API's TLS certificate must chain to, for an API served over
    /// TLS with a private CA (default: the public web roots).
    #[arg(long, global = true, env = "KSCHED_API_CA")]
    pub api_ca: Option<PathBuf>,
    /// Client certificate (PEM) for an API that requires mutual TLS; with --api-key.
    #[arg(long, global = true, env = "KSCHED_API_CERT", requires = "api_key")]
    pub api_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, global = true, env = "KSCHED_API_KEY", requires = "api_cert")]
    pub api_key: Option<PathBuf>,
    /// ksched's topic prefix (default: from the settings).
    #[arg(long, global = true)]
    pub prefix: Option<String>,
    /// Output format.
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// Resolved connection settings.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The effective settings (file, then environment, then flags).
    pub settings: ksched_runtime::Settings,
    pub bootstrap: String,
    pub api: String,
    pub token: Option<String>,
    /// How the CLI speaks TLS to the API.
    pub api_tls: ureq::tls::TlsConfig,
    pub prefix: String,
    pub output: Format,
}

impl Target {
    /// A Kafka client configuration with every property of the settings and flags.
    pub(crate) fn client_config(&self) -> rdkafka::ClientConfig {
        ksched_runtime::topics::client_config(&self.settings)
    }

    /// Fails with a clear message when the brokers refuse this client's credentials or the
    /// client does not trust their certificate (instead of a timeout later).
    pub(crate) fn check_credentials(&self) -> Result<(), Failure> {
        ksched_runtime::topics::check_credentials(&self.settings)
            .map_err(|e| Failure::new(EXIT_FAILED, e.to_string()))
    }
}

impl Connection {
    /// Loads the settings as `ksched run` does; a settings file that was asked for and is
    /// missing, or that does not parse, is an error (exit 2), never a silent default.
    pub(crate) fn resolve(&self) -> Result<Target, Failure> {
        let bad = |e: ksched_runtime::Error| Failure::new(EXIT_USAGE, e.to_string());
        let default = std::path::Path::new(crate::run::DEFAULT_CONFIG);
        let path = match &self.config {
            Some(p) if !p.exists() => {
                return Err(Failure::new(
                    EXIT_USAGE,
                    format!("settings file {} not found", p.display()),
                ));
            }
            Some(p) => Some(p.as_path()),
            None => default.exists().then_some(default),
        };
        let flags = ksched_runtime::settings::Overrides {
            bootstrap_servers: self.bootstrap_servers.clone(),
            kafka_properties: self.kafka.properties().map_err(bad)?,
            ..Default::default()
        };
        let settings =
            ksched_runtime::settings::load_settings(path, std::env::vars(), &flags).map_err(bad)?;
        // Journal and DLQ records in the Confluent wire format name their schema by registry
        // id: the tools look unknown ids up where the scheduler registered them.
        ksched_runtime::schemas::install(&settings).map_err(bad)?;
        let scheme = if settings.http.tls.is_some() {
            "https"
        } else {
            "http"
        };
        Ok(Target {
            bootstrap: settings.kafka.bootstrap_servers.clone(),
            api: self
                .api
                .clone()
                .unwrap_or_else(|| format!("{scheme}://{}", settings.http.listen))
                .trim_end_matches('/')
                .to_owned(),
            token: self.token.clone(),
            api_tls: self.api_tls()?,
            prefix: self
                .prefix
                .clone()
                .unwrap_or_else(|| settings.topics.prefix.clone()),
            output: self.output,
            settings,
        })
    }
}

impl Connection {
    /// The CLI's TLS towards the API: the public web roots, or `--api-ca`; a client
    /// certificate with `--api-cert` and `--api-key`.
    fn api_tls(&self) -> Result<ureq::tls::TlsConfig, Failure> {
        use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};
        let read = |p: &PathBuf| {
            std::fs::read(p)
                .map_err(|e| Failure::new(EXIT_USAGE, format!("cannot read {}: {e}", p.display())))
        };
        let certs = |p: &PathBuf| -> Result<Vec<Certificate<'static>>, Failure> {
            let pem = read(p)?;
            let certs: Vec<Certificate<'static>> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            if certs.is_empty() {
                return Err(Failure::new(
                    EXIT_USAGE,
                    format!("{} holds no PEM certificate", p.display()),
                ));
            }
            Ok(certs)
        };
        let mut tls = TlsConfig::builder();
        if let Some(ca) = &self.api_ca {
            tls = tls.root_certs(RootCerts::new_with_certs(&certs(ca)?));
        }
        if let (Some(cert), Some(key)) = (&self.api_cert, &self.api_key) {
            let key = PrivateKey::from_pem(&read(key)?).map_err(|e| {
                Failure::new(
                    EXIT_USAGE,
                    format!("{} is not a PEM private key: {e}", key.display()),
                )
            })?;
            tls = tls.client_cert(Some(ClientCert::new_with_certs(&certs(cert)?, key)));
        }
        Ok(tls.build())
    }
}

/// A failure with the exit code that says what kind.
#[derive(Debug)]
pub(crate) struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

pub(crate) type CliResult = Result<(), Failure>;

/// Runs a command, printing a failure and returning its exit code.
pub(crate) fn finish(r: CliResult) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("ksched: {}", output::clean(&f.message));
            ExitCode::from(f.code)
        }
    }
}

/// Calls the HTTP API; maps statuses to exit codes.
pub(crate) fn call(
    t: &Target,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<Value, Failure> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(t.api_tls.clone())
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let url = format!("{}{path}", t.api);
    let bearer = t.token.as_ref().map(|tok| format!("Bearer {tok}"));
    let resp = match (method, body) {
        ("GET", _) => {
            let mut r = agent.get(&url);
            if let Some(b) = &bearer {
                r = r.header("Authorization", b);
            }
            r.call()
        }
        ("PUT", body) => {
            let mut r = agent.put(&url);
            if let Some(b) = &bearer {
                r = r.header("Authorization", b);
            }
            r.send_json(body.unwrap_or_else(|| json!({})))
        }
        (_, body) => {
            let mut r = agent.post(&url);
            if let Some(b) = &bearer {
                r = r.header("Authorization", b);
            }
            r.send_json(body.unwrap_or_else(|| json!({})))
        }
    };
    let mut resp = resp.map_err(|e| {
        Failure::new(
            EXIT_FAILED,
            format!(
                "cannot reach the scheduler's HTTP API at {} ({e}); is `ksched run` up? (--api to point elsewhere)",
                t.api
            ),
        )
    })?;
    let status = resp.status().as_u16();
    let value: Value = resp.body_mut().read_json().unwrap_or_else(
        |_| json!({ "error": format!("HTTP {status} with a body that is not JSON") }),
    );
    let message = || {
        value
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("request failed")
            .to_owned()
    };
    match status {
        200..=299 => Ok(value),
        404 => Err(Failure::new(EXIT_NOT_FOUND, message())),
        409 => Err(Failure::new(EXIT_CONFLICT, message())),
        400 => Err(Failure::new(EXIT_BAD_INPUT, message())),
        401 | 403 => Err(Failure::new(
            EXIT_DENIED,
            format!(
                "HTTP {status}: {}{}",
                message(),
                if status == 401 {
                    " (--token or KSCHED_API_TOKEN)"
                } else {
                    ""
                }
            ),
        )),
        _ => Err(Failure::new(
            EXIT_FAILED,
            format!("HTTP {status}: {}", message()),
        )),
    }
}

/// `ksched jobs ...`
#[derive(Debug, Subcommand)]
pub(crate) enum JobsCommand {
    /// Show one job.
    Get { job_id: String },
    /// List jobs (filters combine).
    List {
        /// DELAYED, BLOCKED, PENDING, APPROVAL_REQUIRED, SCHEDULED, DISPATCHED, RUNNING,
        /// SUCCEEDED, FAILED, CANCELLED, TIMEOUT, DENIED or OUTPUT_QUARANTINED.
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long)]
        pool: Option<String>,
        #[arg(long)]
        topic: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// A job's history: every event, in order.
    History { job_id: String },
    /// Move a DELAYED job to another time (journaled, with who did it and why).
    Reschedule {
        job_id: String,
        /// Its new time: RFC 3339, a date-time taken as UTC, or epoch milliseconds.
        #[arg(
            long,
            value_name = "TIME",
            required_unless_present = "delay",
            conflicts_with = "delay"
        )]
        at: Option<String>,
        /// Its new time as a duration from now (`90s`, `10m`, `1h30m`).
        #[arg(long, value_name = "DURATION")]
        delay: Option<String>,
        #[command(flatten)]
        acting: Acting,
    },
}

fn query(pairs: &[(&str, Option<String>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", urlencode(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// Every byte but RFC 3986's unreserved characters (`A-Z a-z 0-9 - . _ ~`) percent-encoded:
/// safe in a path segment and in a query value alike (a job id may hold `/`, `?`, `#`, `%`).
const COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

pub(crate) fn urlencode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, COMPONENT).to_string()
}

pub(crate) fn jobs(t: &Target, cmd: JobsCommand) -> CliResult {
    match cmd {
        JobsCommand::Get { job_id } => {
            let v = call(
                t,
                "GET",
                &format!("/api/v1/jobs/{}", urlencode(&job_id)),
                None,
            )?;
            match t.output {
                Format::Json => output::json(&v),
                Format::Table => {
                    let fields = [
                        "job_id",
                        "state",
                        "tenant_id",
                        "principal_id",
                        "topic",
                        "priority",
                        "queue_priority",
                        "pools",
                        "pool",
                        "worker_id",
                        "attempt",
                        "wait_reason",
                        "progress",
                        "last_error",
                        "dlq_reason",
                        "result_ptr",
                        "job_hash",
                        "policy_snapshot",
                        "labels",
                        "env",
                        "payload_size",
                        "constraints",
                        // What it waits for, and what waits for it (SPEC §11).
                        "depends_on",
                        "dependency_condition",
                        "waiting_on",
                        "dependencies_succeeded",
                        "dependencies_failed",
                        "dependents",
                        // Its batch, the batch it is a callback of, and how that one ended.
                        "batch_id",
                        "batch_size",
                        "after_batch",
                        "batch_outcome",
                    ];
                    let mut rows: Vec<Vec<String>> = fields
                        .iter()
                        .map(|f| vec![(*f).to_owned(), cell(&v[*f])])
                        .collect();
                    for f in [
                        "submitted_at",
                        "accepted_at",
                        "updated_at",
                        "deadline_at",
                        "retry_at",
                    ] {
                        rows.push(vec![f.to_owned(), time_cell(&v[f])]);
                    }
                    table(&["FIELD", "VALUE"], &rows);
                }
            }
        }
        JobsCommand::List {
            state,
            tenant,
            pool,
            topic,
            limit,
        } => {
            let q = query(&[
                ("state", state),
                ("tenant", tenant),
                ("pool", pool),
                ("topic", topic),
                ("limit", Some(limit.to_string())),
            ]);
            let v = call(t, "GET", &format!("/api/v1/jobs{q}"), None)?;
            match t.output {
                Format::Json => output::json(&v),
                Format::Table => {
                    let rows: Vec<Vec<String>> = v["jobs"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .map(|j| {
                                    vec![
                                        cell(&j["job_id"]),
                                        cell(&j["state"]),
                                        cell(&j["tenant_id"]),
                                        cell(&j["pool"]),
                                        cell(&j["worker_id"]),
                                        cell(&j["attempt"]),
                                        time_cell(&j["updated_at"]),
                                    ]
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    table(&ksched_api::JOB_COLUMNS, &rows);
                }
            }
        }
        JobsCommand::History { job_id } => {
            let v = call(
                t,
                "GET",
                &format!("/api/v1/jobs/{}/history", urlencode(&job_id)),
                None,
            )?;
            match t.output {
                Format::Json => output::json(&v),
                Format::Table => {
                    let rows: Vec<Vec<String>> = v["history"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .map(|h| {
                                    vec![time_cell(&h["at"]), cell(&h["event"]), cell(&h["detail"])]
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    println!(
                        "{} {} (attempt {})",
                        cell(&v["job_id"]),
                        cell(&v["state"]),
                        cell(&v["attempt"])
                    );
                    table(&["AT (UTC)", "EVENT", "DETAIL"], &rows);
                }
            }
        }
        JobsCommand::Reschedule {
            job_id,
            at,
            delay,
            acting,
        } => {
            let not_before = match (at, delay) {
                (Some(at), _) => audit::parse_time(&at).ok_or_else(|| {
                    Failure::new(
                        EXIT_BAD_INPUT,
                        format!("--at {at:?} is not a time (RFC 3339, YYYY-MM-DD HH:MM[:SS] in UTC, or epoch ms)"),
                    )
                })?,
                (None, Some(d)) => ksched_runtime::clock::wall_clock_ms().saturating_add(submit::delay_ms(&d)?),
                (None, None) => unreachable!("clap requires --at or --delay"),
            };
            let mut body = acting.body();
            body.insert("not_before".into(), json!(not_before));
            control(t, "reschedule", &job_id, Value::Object(body))?;
        }
    }
    Ok(())
}

pub(crate) fn workers_list(t: &Target) -> CliResult {
    let v = call(t, "GET", "/api/v1/workers", None)?;
    match t.output {
        Format::Json => output::json(&v),
        Format::Table => {
            let rows: Vec<Vec<String>> = v["workers"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|w| {
                            vec![
                                cell(&w["worker_id"]),
                                cell(&w["pool"]),
                                cell(&w["alive"]),
                                format!(
                                    "{}/{}",
                                    cell(&w["active_jobs"]),
                                    cell(&w["max_parallel_jobs"])
                                ),
                                format!("{:.0}", w["cpu_load"].as_f64().unwrap_or(0.0)),
                                cell(&w["owned_partitions"]),
                                cell(&w["draining"]),
                                time_cell(&w["last_seen"]),
                            ]
                        })
                        .collect()
                })
                .unwrap_or_default();
            table(
                &[
                    "WORKER",
                    "POOL",
                    "ALIVE",
                    "ACTIVE/MAX",
                    "CPU%",
                    "PARTITIONS",
                    "DRAINING",
                    "LAST SEEN (UTC)",
                ],
                &rows,
            );
        }
    }
    Ok(())
}

pub(crate) fn control(t: &Target, action: &str, job_id: &str, body: Value) -> CliResult {
    let v = call(
        t,
        "POST",
        &format!("/api/v1/jobs/{}/{action}", urlencode(job_id)),
        Some(body),
    )?;
    match t.output {
        Format::Json => output::json(&v),
        Format::Table => println!("{job_id}: {}", cell(&v["status"])),
    }
    Ok(())
}

/// `ksched dlq ...`
#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// Dead letters, newest first.
    List {
        /// Only this reason code.
        #[arg(long)]
        reason: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// The dead letters of one job.
    Show { job_id: String },
    /// Submit a dead-lettered job (FAILED, TIMEOUT, DENIED) again as a new job: the same
    /// request and payload, routed, judged and limited like a new submission. Journaled
    /// (JobRedriven) with who did it and why.
    Redrive {
        job_id: String,
        /// The new job's id (default: `<JOB_ID>.redrive-<unix ms>`).
        #[arg(long)]
        new_id: Option<String>,
        #[command(flatten)]
        acting: Acting,
    },
}

/// Who acts on a job, for whom, and why: the body of a cancel or a redrive.
#[derive(Debug, Args)]
pub(crate) struct Acting {
    /// Who acts (without API authentication; otherwise the caller).
    #[arg(long, default_value = "operator")]
    pub principal: String,
    /// The tenant the principal acts for; it must own the job (omit as an operator).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Why, for the journal.
    #[arg(long)]
    pub reason: Option<String>,
}

impl Acting {
    /// The request body's fields.
    pub(crate) fn body(&self) -> serde_json::Map<String, Value> {
        let mut body = serde_json::Map::new();
        body.insert("principal".into(), json!(self.principal));
        body.insert("tenant".into(), json!(self.tenant));
        body.insert("reason".into(), json!(self.reason));
        body
    }
}

pub(crate) fn dlq(t: &Target, cmd: DlqCommand) -> CliResult {
    let (q, show) = match &cmd {
        DlqCommand::Redrive {
            job_id,
            new_id,
            acting,
        } => {
            let mut body = acting.body();
            body.insert("new_job_id".into(), json!(new_id));
            let v = call(
                t,
                "POST",
                &format!("/api/v1/jobs/{}/redrive", urlencode(job_id)),
                Some(Value::Object(body)),
            )?;
            match t.output {
                Format::Json => output::json(&v),
                Format::Table => println!(
                    "{job_id}: {} as {}",
                    cell(&v["status"]),
                    cell(&v["new_job_id"])
                ),
            }
            return Ok(());
        }
        DlqCommand::List { reason, limit } => (
            query(&[
                ("reason", reason.clone()),
                ("limit", Some(limit.to_string())),
            ]),
            None,
        ),
        DlqCommand::Show { job_id } => (
            query(&[
                ("job_id", Some(job_id.clone())),
                ("limit", Some("1000".into())),
            ]),
            Some(job_id.clone()),
        ),
    };
    let v = call(t, "GET", &format!("/api/v1/dlq{q}"), None)?;
    let list = v["dead_letters"].as_array().cloned().unwrap_or_default();
    if let Some(id) = &show
        && list.is_empty()
    {
        return Err(Failure::new(
            EXIT_NOT_FOUND,
            format!("no dead letter for job {id}"),
        ));
    }
    match t.output {
        Format::Json => output::json(&v),
        Format::Table if show.is_some() => {
            for d in &list {
                let rows: Vec<Vec<String>> = [
                    "job_id",
                    "reason_code",
                    "reason",
                    "last_state",
                    "attempts",
                    "topic",
                    "tenant_id",
                    "cause",
                ]
                .iter()
                .map(|f| vec![(*f).to_owned(), cell(&d[*f])])
                .chain([vec!["at".to_owned(), time_cell(&d["at"])]])
                .collect();
                table(&["FIELD", "VALUE"], &rows);
            }
        }
        Format::Table => {
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|d| {
                    vec![
                        time_cell(&d["at"]),
                        cell(&d["job_id"]),
                        cell(&d["reason_code"]),
                        cell(&d["attempts"]),
                        cell(&d["reason"]),
                    ]
                })
                .collect();
            table(
                &["AT (UTC)", "JOB", "REASON CODE", "ATTEMPTS", "REASON"],
                &rows,
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn job_ids_are_one_url_component_whatever_they_hold() {
        assert_eq!(super::urlencode("job-1_x.y~z"), "job-1_x.y~z");
        assert_eq!(
            super::urlencode("acme:a/b?c#d%e é"),
            "acme%3Aa%2Fb%3Fc%23d%25e%20%C3%A9"
        );
        assert_eq!(
            super::query(&[("state", Some("A&B=C".into())), ("tenant", None)]),
            "?state=A%26B%3DC"
        );
    }
}
