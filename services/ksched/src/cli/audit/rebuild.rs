//! `ksched audit rebuild`: the projection from the journal, compared with a live one.

use std::path::Path;

use ksched_runtime::audit::{self, Source};
use ksched_store::Store;
use serde_json::json;

use crate::cli::output::{Format, table};
use crate::cli::{CliResult, EXIT_BAD_INPUT, Failure, Target};

use super::{Answers, EXIT_MISMATCH, failed, progress_printer};

/// Rebuilds `src`'s shard into `into` (which may hold other shards' rebuilds, not this one's).
pub(super) fn rebuild(
    t: &Target,
    src: &Source,
    into: &Path,
    compare_with: Option<&Path>,
    until_offset: Option<i64>,
    out: &mut Answers,
) -> CliResult {
    let partition = u16::try_from(src.partition).map_err(failed)?;
    let live =
        match compare_with {
            Some(p) => Some(Store::open_read_only(p, partition).map_err(|e| {
                Failure::new(EXIT_BAD_INPUT, format!("opening {}: {e}", p.display()))
            })?),
            None => None,
        };
    let until = match &live {
        Some(l) => Some(l.watermark().map_err(failed)?.ok_or_else(|| {
            Failure::new(
                EXIT_BAD_INPUT,
                "the live projection has no journal watermark",
            )
        })?),
        None => until_offset,
    };
    let report = audit::rebuild(src, into, until, progress_printer("rebuild")).map_err(failed)?;
    eprintln!();
    let rebuilt = Store::open_read_only(into, partition).map_err(failed)?;
    let differences = match &live {
        Some(l) => Some(audit::compare(&rebuilt, l).map_err(failed)?),
        None => None,
    };
    let equal = differences.as_ref().is_none_or(Vec::is_empty);
    match t.output {
        Format::Json => out.json(
            src.partition,
            json!({
                "entries": report.entries,
                "events": report.events,
                "last_offset": report.last_offset,
                "elapsed_ms": report.elapsed.as_millis() as u64,
                "events_per_sec": report.events_per_sec(),
                "compared": live.is_some(),
                "equal": equal,
                "differences": differences.iter().flatten().map(|d| json!({
                    "column_family": d.column_family, "key": d.key, "kind": d.kind,
                })).collect::<Vec<_>>(),
            }),
        ),
        Format::Table => {
            println!(
                "rebuilt {} entries ({} events) up to offset {} in {:.1}s: {:.0} events/s",
                report.entries,
                report.events,
                report.last_offset.map_or("-".into(), |o| o.to_string()),
                report.elapsed.as_secs_f64(),
                report.events_per_sec()
            );
            match &differences {
                None => {}
                Some(d) if d.is_empty() => println!("equal to the live projection, key for key"),
                Some(d) => {
                    println!("{} keys differ from the live projection:", d.len());
                    let rows: Vec<Vec<String>> = d
                        .iter()
                        .map(|x| vec![x.column_family.clone(), x.key.clone(), x.kind.to_owned()])
                        .collect();
                    table(&["COLUMN FAMILY", "KEY", "DIFFERENCE"], &rows);
                }
            }
        }
    }
    if equal {
        Ok(())
    } else {
        Err(Failure::new(
            EXIT_MISMATCH,
            "the rebuilt projection differs from the live one",
        ))
    }
}
