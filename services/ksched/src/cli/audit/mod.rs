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

/// Prints progress on standard error (a line updated in place on a terminal).
fn progress_printer(label: &'static str) -> impl FnMut(&Progress) {
    let tty = std::io::stderr().is_terminal();
    move |p: &Progress| {
        let eta = p
            .eta()
            .map(|d| format!(", ETA {}s", d.as_secs()))
            .unwrap_or_default();
        let line = format!(
            "{label}: {} entries, {} events, offset {}/{}, {:.0} events/s{eta}",
            p.entries,
            p.events,
            p.offset,
            p.end,
            p.events_per_sec()
        );
        if tty {
            eprint!("\r{line}   ");
        } else {
            eprintln!("{line}");
        }
    }
}

/// A scratch directory: the one given, or a temporary one removed on drop.
struct Scratch {
    path: PathBuf,
    _temp: Option<TempDir>,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(given: Option<PathBuf>) -> Result<Scratch, Failure> {
    match given {
        Some(p) => Ok(Scratch {
            path: p,
            _temp: None,
        }),
        None => {
            let p = std::env::temp_dir().join(format!(
                "ksched-audit-{}-{}",
                std::process::id(),
                uuid::Uuid::new_v4().simple()
            ));
            std::fs::create_dir_all(&p).map_err(failed)?;
            Ok(Scratch {
                path: p.clone(),
                _temp: Some(TempDir(p)),
            })
        }
    }
}

/// Parses `2026-11-30T03:12:00Z`, `2026-11-30 03:12:00.250` (UTC) or milliseconds.
pub(crate) fn parse_time(s: &str) -> Option<i64> {
    if let Ok(ms) = s.parse::<i64>() {
        return Some(ms);
    }
    let s = s.trim().trim_end_matches('Z');
    let (date, clock) = s.split_once(['T', ' '])?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = clock.split_once('.').unwrap_or((clock, "0"));
    let mut t = hms.splitn(3, ':').map(|x| x.parse::<i64>());
    let (h, mi, sec) = (
        t.next()?.ok()?,
        t.next()?.ok()?,
        t.next().unwrap_or(Ok(0)).ok()?,
    );
    let millis: i64 = format!("{frac:0<3}")[..3].parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm), inverse of output::time.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + h * 3_600 + mi * 60 + sec) * 1_000) + millis)
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
    }
}
