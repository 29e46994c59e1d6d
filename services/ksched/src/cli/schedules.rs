//! `ksched schedules ...`: create, list, show, update, pause, resume, trigger and delete
//! schedules through the HTTP API (a ScheduleCommand each; the processor decides).

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::output::{self, Format, cell, table, time_cell};
use super::submit::{delay_ms, pairs, priority};
use super::{CliResult, EXIT_BAD_INPUT, Failure, Target, call, urlencode};

/// `ksched schedules ...`
#[derive(Debug, Subcommand)]
pub(crate) enum SchedulesCommand {
    /// Create a schedule: a cron expression (`--cron`) or an interval (`--every`), and the
    /// job each firing submits.
    Create {
        /// `TENANT:ID` (the tenant's part may be left out by a caller of one tenant).
        schedule: String,
        #[command(flatten)]
        spec: SpecArgs,
    },
    /// Replace a schedule's spec (its topic stays): the times count from its creation, its
    /// next firing comes after now.
    Update {
        /// `TENANT:ID`.
        schedule: String,
        #[command(flatten)]
        spec: SpecArgs,
    },
    /// List schedules, with their next firing.
    List {
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Show a schedule: its spec, its next firings and its latest ones with their jobs.
    Show {
        /// `TENANT:ID`.
        schedule: String,
    },
    /// Stop its firings until it is resumed.
    Pause(ActArgs),
    /// Fire again; what it missed while paused follows its catch-up policy.
    Resume(ActArgs),
    /// Fire once now (the job id ends in `/trigger`), paused or not.
    Trigger(ActArgs),
    /// Delete it (jobs it submitted run on).
    Delete(ActArgs),
}

/// Who acts on a schedule, and why.
#[derive(Debug, Args)]
pub(crate) struct ActArgs {
    /// `TENANT:ID`.
    schedule: String,
    /// Who acts (without API authentication; otherwise the caller).
    #[arg(long, default_value = "operator")]
    principal: String,
    /// Why, for the journal.
    #[arg(long)]
    reason: Option<String>,
}

/// A schedule's spec on the command line.
#[derive(Debug, Args)]
pub(crate) struct SpecArgs {
    /// A cron expression: 5 fields (`0 2 * * *`), 6 with seconds first, or @hourly,
    /// @daily, @weekly, @monthly, @yearly.
    #[arg(long, required_unless_present = "every", conflicts_with = "every")]
    cron: Option<String>,
    /// A fixed interval (`30s`, `10m`, `1h`), counted from `--start` or the creation.
    #[arg(long, value_name = "DURATION")]
    every: Option<String>,
    /// The IANA time zone the cron expression is read in.
    #[arg(long = "tz", default_value = "UTC")]
    time_zone: String,
    /// The job topic each firing submits to.
    #[arg(long)]
    topic: String,
    /// The job's payload, as text.
    #[arg(long, default_value = "")]
    payload: String,
    /// critical, interactive or batch.
    #[arg(long)]
    priority: Option<String>,
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    #[arg(long = "requires", value_name = "CAPABILITY")]
    requires: Vec<String>,
    #[arg(long)]
    deadline_ms: Option<i64>,
    #[arg(long)]
    max_runtime_ms: Option<i64>,
    /// While the previous run has not ended: skip, buffer-one, allow-all or
    /// cancel-previous.
    #[arg(long, default_value = "skip")]
    overlap: String,
    /// Firings missed while down or paused: none, last or all (within --catch-up-window).
    #[arg(long, default_value = "last")]
    catch_up: String,
    /// How far back `--catch-up all` reaches.
    #[arg(long, value_name = "DURATION", default_value = "24h")]
    catch_up_window: String,
    /// Each firing's job waits up to this long after its time (the same for a given time).
    #[arg(long, value_name = "DURATION")]
    jitter: Option<String>,
    /// No firing before this time (RFC 3339, a date-time taken as UTC, or epoch ms).
    #[arg(long, value_name = "TIME")]
    start: Option<String>,
    /// No firing after this time.
    #[arg(long, value_name = "TIME")]
    end: Option<String>,
    /// Create it paused.
    #[arg(long)]
    paused: bool,
    /// Who acts (without API authentication; otherwise the caller).
    #[arg(long, default_value = "operator")]
    principal: String,
    /// Why, for the journal.
    #[arg(long)]
    reason: Option<String>,
}

fn bad(message: String) -> Failure {
    Failure::new(EXIT_BAD_INPUT, message)
}

/// `TENANT:ID` -> (tenant, id); `ID` alone leaves the tenant to the API.
fn split(schedule: &str) -> (Option<&str>, &str) {
    match schedule.split_once(':') {
        Some((tenant, id)) => (Some(tenant), id),
        None => (None, schedule),
    }
}

fn path_of(schedule: &str) -> Result<String, Failure> {
    match split(schedule) {
        (Some(tenant), id) => Ok(format!(
            "/api/v1/schedules/{}/{}",
            urlencode(tenant),
            urlencode(id)
        )),
        (None, _) => Err(bad(format!("{schedule:?}: name a schedule as TENANT:ID"))),
    }
}

fn enum_name(text: &str, allowed: &[&str], what: &str) -> Result<String, Failure> {
    let upper = text.trim().to_ascii_uppercase().replace('-', "_");
    if allowed.contains(&upper.as_str()) {
        Ok(upper)
    } else {
        Err(bad(format!(
            "--{what} {text:?}: one of {}",
            allowed
                .iter()
                .map(|a| a.to_lowercase().replace('_', "-"))
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }
}

fn time(text: &Option<String>, what: &str) -> Result<Option<i64>, Failure> {
    text.as_ref()
        .map(|t| {
            super::audit::parse_time(t)
                .ok_or_else(|| bad(format!("--{what} {t:?} is not a time (RFC 3339, YYYY-MM-DD HH:MM[:SS] in UTC, or epoch ms)")))
        })
        .transpose()
}

impl SpecArgs {
    fn body(&self) -> Result<serde_json::Map<String, Value>, Failure> {
        let priority = self.priority.as_deref().map(priority).transpose()?;
        let mut template = json!({
            "topic": self.topic,
            "payload": self.payload,
            "labels": pairs(&self.labels, "--label")?,
            "requires": self.requires,
            "deadline_ms": self.deadline_ms,
            "max_runtime_ms": self.max_runtime_ms,
        });
        if let Some(p) = priority {
            template["priority"] = json!(p);
        }
        let mut body = serde_json::Map::new();
        body.insert("cron".into(), json!(self.cron));
        body.insert(
            "interval_ms".into(),
            json!(self.every.as_deref().map(delay_ms).transpose()?),
        );
        body.insert("time_zone".into(), json!(self.time_zone));
        body.insert("template".into(), template);
        body.insert(
            "overlap".into(),
            json!(enum_name(
                &self.overlap,
                &["SKIP", "BUFFER_ONE", "ALLOW_ALL", "CANCEL_PREVIOUS"],
                "overlap"
            )?),
        );
        body.insert(
            "catch_up".into(),
            json!(enum_name(
                &self.catch_up,
                &["NONE", "LAST", "ALL"],
                "catch-up"
            )?),
        );
        body.insert(
            "catch_up_window_ms".into(),
            json!(delay_ms(&self.catch_up_window)?),
        );
        body.insert(
            "jitter_ms".into(),
            json!(
                self.jitter
                    .as_deref()
                    .map(delay_ms)
                    .transpose()?
                    .unwrap_or(0)
            ),
        );
        body.insert("start_at".into(), json!(time(&self.start, "start")?));
        body.insert("end_at".into(), json!(time(&self.end, "end")?));
        body.insert("paused".into(), json!(self.paused));
        body.insert("principal".into(), json!(self.principal));
        body.insert("reason".into(), json!(self.reason));
        Ok(body)
    }
}

pub(crate) fn schedules(t: &Target, cmd: SchedulesCommand) -> CliResult {
    match cmd {
        SchedulesCommand::Create { schedule, spec } => {
            let (tenant, id) = split(&schedule);
            let mut body = spec.body()?;
            body.insert("schedule_id".into(), json!(id));
            body.insert("tenant".into(), json!(tenant));
            let v = call(t, "POST", "/api/v1/schedules", Some(Value::Object(body)))?;
            sent(t, &v);
        }
        SchedulesCommand::Update { schedule, spec } => {
            let path = path_of(&schedule)?;
            let v = call(t, "PUT", &path, Some(Value::Object(spec.body()?)))?;
            sent(t, &v);
        }
        SchedulesCommand::List { tenant, limit } => {
            let mut q = format!("/api/v1/schedules?limit={limit}");
            if let Some(tenant) = tenant {
                q.push_str(&format!("&tenant={}", urlencode(&tenant)));
            }
            let v = call(t, "GET", &q, None)?;
            match t.output {
                Format::Json => output::json(&v),
                Format::Table => {
                    let rows: Vec<Vec<String>> = v["schedules"]
                        .as_array()
                        .map(|a| a.iter().map(row).collect())
                        .unwrap_or_default();
                    table(&COLUMNS, &rows);
                }
            }
        }
        SchedulesCommand::Show { schedule } => {
            let v = call(t, "GET", &path_of(&schedule)?, None)?;
            match t.output {
                Format::Json => output::json(&v),
                Format::Table => {
                    table(&COLUMNS, &[row(&v)]);
                    println!(
                        "overlap {}, catch-up {}, jitter {} ms; next firings: {}",
                        cell(&v["overlap"]),
                        cell(&v["catch_up"]),
                        cell(&v["jitter_ms"]),
                        v["next_firings"]
                            .as_array()
                            .map(|a| a
                                .iter()
                                .map(|f| cell(&f["time"]))
                                .collect::<Vec<_>>()
                                .join(", "))
                            .unwrap_or_default()
                    );
                    let recent: Vec<Vec<String>> = v["recent"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .rev()
                                .map(|f| {
                                    vec![
                                        cell(&f["time"]),
                                        cell(&f["outcome"]),
                                        cell(&f["job_id"]),
                                        cell(&f["detail"]),
                                    ]
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    table(&["FIRING", "OUTCOME", "JOB", "DETAIL"], &recent);
                }
            }
        }
        SchedulesCommand::Pause(a) => act(t, a, "pause")?,
        SchedulesCommand::Resume(a) => act(t, a, "resume")?,
        SchedulesCommand::Trigger(a) => act(t, a, "trigger")?,
        SchedulesCommand::Delete(a) => act(t, a, "delete")?,
    }
    Ok(())
}

fn act(t: &Target, a: ActArgs, verb: &str) -> CliResult {
    let body = json!({ "principal": a.principal, "reason": a.reason });
    let v = call(
        t,
        "POST",
        &format!("{}/{verb}", path_of(&a.schedule)?),
        Some(body),
    )?;
    sent(t, &v);
    Ok(())
}

fn sent(t: &Target, v: &Value) {
    match t.output {
        Format::Json => output::json(v),
        Format::Table => println!(
            "{}:{}: {}",
            cell(&v["tenant_id"]),
            cell(&v["schedule_id"]),
            cell(&v["status"])
        ),
    }
}

/// The columns of a schedule's row ([`row`]).
const COLUMNS: [&str; 7] = [
    "SCHEDULE",
    "WHEN",
    "TOPIC",
    "PAUSED",
    "NEXT (UTC)",
    "LAST JOB",
    "RUNS",
];

fn row(s: &Value) -> Vec<String> {
    let when = match s["cron"].as_str() {
        Some(c) => format!("{c} ({})", cell(&s["time_zone"])),
        None => format!("every {} ms", cell(&s["interval_ms"])),
    };
    vec![
        format!("{}:{}", cell(&s["tenant_id"]), cell(&s["schedule_id"])),
        when,
        cell(&s["template"]["topic"]),
        cell(&s["paused"]),
        time_cell(&s["next_slot"]),
        cell(&s["last_job"]),
        cell(&s["submitted"]),
    ]
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        spec: SpecArgs,
    }

    fn body(flags: &[&str]) -> Result<serde_json::Map<String, Value>, Failure> {
        let cli = Cli::try_parse_from(std::iter::once("create").chain(flags.iter().copied()))
            .map_err(|e| bad(e.to_string()))?;
        cli.spec.body()
    }

    #[test]
    fn a_schedule_is_a_cron_or_an_interval_with_its_policies() {
        let b = body(&[
            "--cron",
            "0 2 * * *",
            "--tz",
            "Europe/Berlin",
            "--topic",
            "jobs",
            "--overlap",
            "buffer-one",
            "--catch-up",
            "all",
            "--jitter",
            "30s",
            "--label",
            "k=v",
        ])
        .unwrap();
        assert_eq!(b["cron"], "0 2 * * *");
        assert_eq!(b["time_zone"], "Europe/Berlin");
        assert_eq!(b["overlap"], "BUFFER_ONE");
        assert_eq!(b["catch_up"], "ALL");
        assert_eq!(b["catch_up_window_ms"], 86_400_000);
        assert_eq!(b["jitter_ms"], 30_000);
        assert_eq!(b["template"]["labels"]["k"], "v");
        let b = body(&[
            "--every",
            "10m",
            "--topic",
            "jobs",
            "--start",
            "2026-12-24T18:00:00Z",
        ])
        .unwrap();
        assert_eq!(b["interval_ms"], 600_000);
        assert_eq!(b["start_at"], 1_798_135_200_000i64);
        for bad in [
            &["--topic", "jobs"][..],
            &["--cron", "* * * * *", "--every", "1m", "--topic", "jobs"],
            &["--every", "1m", "--topic", "jobs", "--overlap", "sometimes"],
            &["--every", "1m", "--topic", "jobs", "--catch-up", "most"],
            &["--every", "soon", "--topic", "jobs"],
            &["--every", "1m", "--topic", "jobs", "--start", "tomorrow"],
        ] {
            assert!(body(bad).is_err(), "{bad:?}");
        }
        assert_eq!(split("acme:nightly"), (Some("acme"), "nightly"));
        assert!(path_of("nightly").is_err(), "a tenant is named");
    }
}
