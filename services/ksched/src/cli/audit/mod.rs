//! `ksched audit ...`: answers from the journal alone (docs/audit.md). Needs only Kafka; reads
//! the journal, never writes to a live topic. Scratch projections go to a temporary directory
//! unless `--into` names one.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use ksched_runtime::audit::{Progress, Source, Until};
use serde_json::{Value, json};

use super::output::{Format, clean};
use super::{CliResult, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NOT_FOUND, Failure, Target};

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
    /// own journal partition.
    #[arg(long, visible_alias = "shard", global = true, default_value_t = 0)]
    pub partition: i32,
    /// Every shard in turn (every partition of the journal) instead of one: tables under a
    /// heading per shard, JSON as one document with a `shards` list.
    #[arg(long, global = true, conflicts_with = "partition")]
    pub all_shards: bool,
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
    /// Replay the recorded inputs under other pools or another policy, or with schedules
    /// paused; report where each job's outcome would differ.
    WhatIf {
        /// A pools.yaml to decide with (replaces topics, pools and tenants).
        #[arg(long)]
        pools: Option<PathBuf>,
        /// A policy directory to decide with.
        #[arg(long)]
        policy: Option<PathBuf>,
        /// A schedule (TENANT:ID) taken to have been paused; repeatable.
        #[arg(long = "pause-schedule", value_name = "TENANT:ID")]
        pause_schedules: Vec<String>,
        /// When those schedules were paused (RFC 3339, `YYYY-MM-DD HH:MM[:SS]` in UTC, or
        /// epoch ms); default: from their start.
        #[arg(long, requires = "pause_schedules")]
        paused_from: Option<String>,
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
    let topic = args
        .journal_topic
        .clone()
        .unwrap_or_else(|| format!("{}journal", t.prefix));
    let partitions = if args.all_shards {
        let n = ksched_runtime::topics::partition_count(&t.settings, &topic).map_err(failed)?;
        (0..n).collect()
    } else {
        vec![args.partition]
    };
    let sources: Vec<Source> = partitions
        .into_iter()
        .map(|partition| Source {
            client: t.client_config(),
            topic: topic.clone(),
            partition,
        })
        .collect();
    let shards = Shards {
        t,
        topic: &topic,
        sources: &sources,
        all: args.all_shards,
    };
    // An offset is a position in one partition: it means nothing on the others.
    let one_partition = |what: &str| {
        if args.all_shards {
            Err(Failure::new(
                EXIT_BAD_INPUT,
                format!(
                    "{what} is an offset in one journal partition: give --shard, not --all-shards"
                ),
            ))
        } else {
            Ok(())
        }
    };
    match args.command {
        AuditCommand::Rebuild {
            into,
            compare_with,
            until_offset,
        } => {
            if until_offset.is_some() {
                one_partition("--until-offset")?;
            }
            // One directory takes every shard (its keys are prefixed by shard), as a live
            // data directory does.
            let dir = scratch(into)?;
            shards.each(|src, out| {
                rebuild::rebuild(
                    t,
                    src,
                    &dir.path,
                    compare_with.as_deref(),
                    until_offset,
                    out,
                )
            })
        }
        AuditCommand::Verify => shards.each(|src, out| verify::verify(t, src, out)),
        AuditCommand::Job { job_id } => shards.each(|src, out| job::job(t, src, &job_id, out)),
        AuditCommand::At {
            time: at_time,
            offset,
            tenant,
            pool,
            all,
        } => {
            let until = match (offset, at_time) {
                (Some(o), _) => {
                    one_partition("--offset")?;
                    Until::Offset(o)
                }
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
            shards.each(|src, out| {
                at::at(t, src, until, tenant.as_deref(), pool.as_deref(), all, out)
            })
        }
        AuditCommand::WhatIf {
            pools,
            policy,
            pause_schedules,
            paused_from,
        } => {
            let alternative =
                what_if::alternative(pools, policy, &pause_schedules, paused_from.as_deref())?;
            shards.each(|src, out| what_if::what_if(t, src, &alternative, out))
        }
        AuditCommand::Export { format, out } => {
            if format == ExportFormat::Avro && args.all_shards {
                return Err(Failure::new(
                    EXIT_BAD_INPUT,
                    "an Avro container file holds one shard's journal: export each with --shard (JSON Lines take --all-shards; each line names its partition)",
                ));
            }
            export::export(&sources, format, out)
        }
    }
}

/// The shards an audit command answers for: one (`--shard`), or every partition of the
/// journal (`--all-shards`).
struct Shards<'a> {
    t: &'a Target,
    topic: &'a str,
    sources: &'a [Source],
    all: bool,
}

impl Shards<'_> {
    /// Runs `command` for each shard. With one shard its answer and failure are the command's.
    /// With all, each table comes under its shard's heading and the JSON answers are printed
    /// together at the end; a shard that has nothing to say ("not found": a job on another
    /// shard, a time before its first entry) is noted and the others go on. The command
    /// fails with the first other failure, or "not found" when no shard had anything.
    fn each(&self, mut command: impl FnMut(&Source, &mut Answers) -> CliResult) -> CliResult {
        let mut answers = Answers {
            gathered: self.all.then(Vec::new),
        };
        if !self.all {
            return self
                .sources
                .iter()
                .try_for_each(|src| command(src, &mut answers));
        }
        let table = self.t.output == Format::Table;
        let mut failures = Vec::new();
        for (i, src) in self.sources.iter().enumerate() {
            if table {
                let gap = if i == 0 { "" } else { "\n" };
                println!(
                    "{gap}== shard {} (journal {}/{}) ==",
                    src.partition, self.topic, src.partition
                );
            }
            let Err(f) = command(src, &mut answers) else {
                continue;
            };
            if f.code == EXIT_NOT_FOUND {
                if table {
                    println!("{}", clean(&f.message));
                }
            } else {
                eprintln!("ksched: shard {}: {}", src.partition, clean(&f.message));
            }
            answers.failed(src.partition, &f);
            failures.push((src.partition, f));
        }
        if let Some(gathered) = answers.gathered.take()
            && !table
        {
            super::output::json(&json!({ "journal_topic": self.topic, "shards": gathered }));
        }
        all_shards_outcome(failures, self.sources.len())
    }
}

/// What several shards' failures make of the whole: the first failure that is not "not
/// found" (naming every failed shard), else "not found" if no shard answered.
fn all_shards_outcome(failures: Vec<(i32, Failure)>, shards: usize) -> CliResult {
    let failed: Vec<String> = failures
        .iter()
        .filter(|(_, f)| f.code != EXIT_NOT_FOUND)
        .map(|(s, _)| s.to_string())
        .collect();
    if let Some((shard, first)) = failures.iter().find(|(_, f)| f.code != EXIT_NOT_FOUND) {
        return Err(Failure::new(
            first.code,
            format!(
                "{} of {shards} shards failed (shards {}); shard {shard}: {}",
                failed.len(),
                failed.join(", "),
                first.message
            ),
        ));
    }
    if failures.len() == shards && shards > 0 {
        return Err(Failure::new(
            EXIT_NOT_FOUND,
            format!("no shard had an answer; shard 0: {}", failures[0].1.message),
        ));
    }
    Ok(())
}

/// Where an audit command's JSON answer goes: printed at once when one shard is audited;
/// with `--all-shards`, tagged with its shard and kept for one document.
pub(super) struct Answers {
    gathered: Option<Vec<Value>>,
}

impl Answers {
    pub(super) fn json(&mut self, shard: i32, answer: Value) {
        match &mut self.gathered {
            None => super::output::json(&answer),
            Some(all) => all.push(with_shard(shard, answer)),
        }
    }

    fn failed(&mut self, shard: i32, f: &Failure) {
        if let Some(all) = &mut self.gathered {
            let key = if f.code == EXIT_NOT_FOUND {
                "not_found"
            } else {
                "error"
            };
            all.push(json!({ "shard": shard, key: f.message, "exit_code": f.code }));
        }
    }
}

/// `answer` with `"shard": shard` added.
fn with_shard(shard: i32, answer: Value) -> Value {
    let mut tagged = serde_json::Map::new();
    tagged.insert("shard".into(), shard.into());
    match answer {
        Value::Object(fields) => tagged.extend(fields),
        other => {
            tagged.insert("answer".into(), other);
        }
    }
    Value::Object(tagged)
}

#[cfg(test)]
mod tests {
    use super::{EXIT_MISMATCH, EXIT_NOT_FOUND, Failure, all_shards_outcome, parse_time};
    use crate::cli::EXIT_FAILED;

    /// Across shards, "not found" on some is the normal case (a job lives on one); any other
    /// failure fails the whole, naming every shard that failed; "not found" everywhere is
    /// not found.
    #[test]
    fn one_shards_failure_fails_all_and_not_found_only_everywhere() {
        let nf = |s: i32| (s, Failure::new(EXIT_NOT_FOUND, format!("nothing on {s}")));
        assert!(all_shards_outcome(vec![], 3).is_ok());
        assert!(all_shards_outcome(vec![nf(0), nf(2)], 3).is_ok());
        let none = all_shards_outcome(vec![nf(0), nf(1), nf(2)], 3).unwrap_err();
        assert_eq!(none.code, EXIT_NOT_FOUND);
        let mixed = vec![
            nf(0),
            (
                1,
                Failure::new(EXIT_MISMATCH, "2 recorded entries were not reproduced"),
            ),
            (2, Failure::new(EXIT_FAILED, "broker gone")),
        ];
        let f = all_shards_outcome(mixed, 3).unwrap_err();
        assert_eq!(f.code, EXIT_MISMATCH);
        assert!(
            f.message.contains("2 of 3 shards failed (shards 1, 2)"),
            "{}",
            f.message
        );
        assert!(
            f.message.contains("shard 1: 2 recorded entries"),
            "{}",
            f.message
        );
    }
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
