//! `ksched audit ...`: answers from the journal alone (docs/audit.md). Needs only Kafka; reads
//! the journal, never writes to a live topic. Scratch projections go to a temporary directory
//! unless `--into` names one.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use ksched_runtime::audit::{Progress, Source, Until};

use super::{CliResult, EXIT_BAD_INPUT, EXIT_FAILED, Failure, Target};

mod at;
mod export;
mod job;
mod rebuild;
mod verify;
mod what_if;

/// Exit code when an audit finds a difference (rebuild != live, a divergence in verify).
pub(crate) const EXIT_MISMATCH: u8 = 6;

#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
    #[command(subcommand)]
    pub command: AuditCommand,
    /// Journal topic (default: `<prefix>journal`).
    #[arg(long, global = true)]
    pub journal_topic: Option<String>,
    /// Journal partition: the shard to audit (`--shard` is the same flag). Each shard has its
    /// own journal partition; audit them one by one.
    #[arg(long, visible_alias = "shard", global = true, default_value_t = 0)]
    pub partition: i32,
}

#[derive(Debug, Subcommand)]
pub(crate) enum AuditCommand {
    /// Replay the journal from offset 0 into a fresh RocksDB with the processor's apply, and
    /// compare with a live projection (a stopped scheduler's data directory or a checkpoint
    /// from POST /api/v1/admin/checkpoint).
    Rebuild {
        /// Where to build (default: a temporary directory, removed afterwards).
        #[arg(long)]
        into: Option<PathBuf>,
        /// Compare with this projection, replaying up to its journal watermark.
        #[arg(long)]
        compare_with: Option<PathBuf>,
        /// Replay up to and including this journal offset.
        #[arg(long, conflicts_with = "compare_with")]
        until_offset: Option<i64>,
    },
    /// Re-run decide over every recorded input and check it reproduces the recorded events
    /// byte for byte; report each divergence with its offset.
    Verify,
    /// Everything the journal says about one job: inputs, events, decisions, coordinates.
    Job { job_id: String },
    /// The state of jobs and workers as of a time or a journal offset.
    At {
        /// UTC time: `2026-11-30T03:12:00Z`, `2026-11-30 03:12:00.250` or milliseconds.
        #[arg(required_unless_present = "offset")]
        time: Option<String>,
        /// Journal offset (its entry included).
        #[arg(long, conflicts_with = "time")]
        offset: Option<i64>,
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long)]
        pool: Option<String>,
        /// List terminal jobs too (default: only jobs not yet terminal, plus counts).
        #[arg(long)]
        all: bool,
    },
    /// Replay the recorded inputs under other pools or another policy; report where each
    /// job's outcome would differ.
    WhatIf {
        /// A pools.yaml to decide with (replaces topics, pools and tenants).
        #[arg(long)]
        pools: Option<PathBuf>,
        /// A policy directory to decide with.
        #[arg(long)]
        policy: Option<PathBuf>,
    },
    /// The journal for other systems, secrets hidden.
    Export {
        #[arg(long, value_enum, default_value_t = ExportFormat::Jsonl)]
        format: ExportFormat,
        /// Output file (default: standard output).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ExportFormat {
    /// One JSON object per entry.
    Jsonl,
    /// An Avro object container file (schema io.ksched.JournalEntry).
    Avro,
}

fn failed(e: impl std::fmt::Display) -> Failure {
    Failure::new(EXIT_FAILED, e.to_string())
}

/// Shows a replay's progress on standard error: a progress bar on a terminal (indicatif:
/// offsets done of the journal's end, rate, time left), a line per report otherwise (a log
/// keeps them).
fn progress_printer(label: &'static str) -> impl FnMut(&Progress) {
    let tty = std::io::stderr().is_terminal();
    let mut bar: Option<indicatif::ProgressBar> = None;
    move |p: &Progress| {
        let rate = format!(
            "{} entries, {} events, {:.0} events/s",
            p.entries,
            p.events,
            p.events_per_sec()
        );
        if !tty {
            let eta = p
                .eta()
                .map(|d| format!(", ETA {}s", d.as_secs()))
                .unwrap_or_default();
            eprintln!("{label}: {rate}, offset {}/{}{eta}", p.offset, p.end);
            return;
        }
        let bar = bar.get_or_insert_with(|| {
            let b = indicatif::ProgressBar::new(u64::try_from(p.end).unwrap_or(0));
            let style = indicatif::ProgressStyle::with_template(
                "{prefix}: [{bar:30}] offset {pos}/{len}, {eta} left, {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> ");
            b.set_style(style);
            b.set_prefix(label);
            b
        });
        bar.set_position(u64::try_from(p.offset).unwrap_or(0));
        bar.set_message(rate);
    }
}

/// A scratch directory: the one given, or a temporary one removed on drop.
struct Scratch {
    path: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

fn scratch(given: Option<PathBuf>) -> Result<Scratch, Failure> {
    match given {
        Some(p) => Ok(Scratch {
            path: p,
            _temp: None,
        }),
        None => {
            let temp = tempfile::Builder::new()
                .prefix("ksched-audit-")
                .tempdir()
                .map_err(failed)?;
            Ok(Scratch {
                path: temp.path().to_path_buf(),
                _temp: Some(temp),
            })
        }
    }
}

/// Parses an instant: RFC 3339 with an offset (`2026-11-30T03:12:00Z`,
/// `2026-11-30T04:12:00+01:00`), a civil date-time taken as UTC (`2026-11-30 03:12:00.250`,
/// as the tools print them), or milliseconds since the epoch. Invalid dates (February 30th)
/// and any other text are None, never a panic (jiff does the calendar).
pub(crate) fn parse_time(s: &str) -> Option<i64> {
    let s = s.trim();
    if let Ok(ms) = s.parse::<i64>() {
        return Some(ms);
    }
    if let Ok(ts) = s.parse::<jiff::Timestamp>() {
        return Some(ts.as_millisecond());
    }
    let civil: jiff::civil::DateTime = s.parse().ok()?;
    let ts = civil.to_zoned(jiff::tz::TimeZone::UTC).ok()?.timestamp();
    Some(ts.as_millisecond())
}

pub(crate) fn audit(t: &Target, args: AuditArgs) -> CliResult {
    t.check_credentials()?;
    let client = t.client_config();
    let src = Source {
        client,
        topic: args
            .journal_topic
            .clone()
            .unwrap_or_else(|| format!("{}journal", t.prefix)),
        partition: args.partition,
    };
    match args.command {
        AuditCommand::Rebuild {
            into,
            compare_with,
            until_offset,
        } => rebuild::rebuild(t, &src, into, compare_with, until_offset),
        AuditCommand::Verify => verify::verify(t, &src),
        AuditCommand::Job { job_id } => job::job(t, &src, &job_id),
        AuditCommand::At {
            time: at_time,
            offset,
            tenant,
            pool,
            all,
        } => {
            let until = match (offset, at_time) {
                (Some(o), _) => Until::Offset(o),
                (None, Some(s)) => Until::Time(parse_time(&s).ok_or_else(|| {
                    Failure::new(
                        EXIT_BAD_INPUT,
                        format!(
                            "cannot read the time {s:?}; use 2026-11-30T03:12:00Z or milliseconds"
                        ),
                    )
                })?),
                (None, None) => {
                    return Err(Failure::new(EXIT_BAD_INPUT, "give a TIME or --offset"));
                }
            };
            at::at(t, &src, until, tenant, pool, all)
        }
        AuditCommand::WhatIf { pools, policy } => what_if::what_if(t, &src, pools, policy),
        AuditCommand::Export { format, out } => export::export(&src, format, out),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_time;
    use crate::cli::output::time;

    #[test]
    fn times_parse_as_they_print() {
        for ms in [0, 1_700_000_000_123, 951_782_400_000, 1_796_000_000_999] {
            assert_eq!(parse_time(&time(ms)), Some(ms), "{}", time(ms));
        }
        assert_eq!(parse_time("2023-11-14T22:13:20Z"), Some(1_700_000_000_000));
        assert_eq!(parse_time("1700000000000"), Some(1_700_000_000_000));
        assert_eq!(parse_time("yesterday"), None);
        assert_eq!(parse_time("2023-13-01T00:00:00Z"), None);
        assert_eq!(
            parse_time("2023-11-14T23:13:20+01:00"),
            Some(1_700_000_000_000)
        );
        assert_eq!(parse_time("2023-11-14 22:13:20.5"), Some(1_700_000_000_500));
    }

    /// The hand-written parser sliced the fraction at byte 3 and panicked on multi-byte
    /// input, and took February 30th for March 2nd.
    #[test]
    fn hostile_times_are_refused_not_a_panic() {
        for s in [
            "2023-11-14 22:13:20.é",
            "2023-11-14 22:13:20.éé",
            "2023-11-14T22:13:20.日本Z",
            "２０２３-11-14T22:13:20Z",
            "2023-02-30T00:00:00Z",
            "2023-11-14T25:00:00Z",
            "",
            "T",
            "-",
        ] {
            assert_eq!(parse_time(s), None, "{s:?}");
        }
    }
}
