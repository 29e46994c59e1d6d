//! `ksched audit verify`: every recorded decision made again.

use ksched_policy::RegoEngine;
use ksched_runtime::audit::{self, Source};
use serde_json::json;

use crate::cli::output::{Format, clean};
use crate::cli::{CliResult, Failure, Target};

use super::{Answers, EXIT_MISMATCH, failed, progress_printer, scratch};

pub(super) fn verify(t: &Target, src: &Source, out: &mut Answers) -> CliResult {
    let dir = scratch(None)?;
    let policy = RegoEngine::new();
    let report =
        audit::verify(src, &dir.path, &policy, progress_printer("verify")).map_err(failed)?;
    eprintln!();
    match t.output {
        Format::Json => out.json(
            src.partition,
            json!({
                "entries": report.entries,
                "events": report.events,
                "elapsed_ms": report.elapsed.as_millis() as u64,
                "divergences": report.divergences.iter().map(|d| json!({
                    "offset": d.offset, "input": d.input, "recorded": d.recorded,
                    "recomputed": d.recomputed, "detail": d.detail,
                })).collect::<Vec<_>>(),
            }),
        ),
        Format::Table => {
            println!(
                "verified {} entries ({} events) in {:.1}s: {} divergences",
                report.entries,
                report.events,
                report.elapsed.as_secs_f64(),
                report.divergences.len()
            );
            for d in &report.divergences {
                println!("offset {} {}:", d.offset, clean(&d.input));
                println!("  recorded:   {}", clean(&d.recorded.join(" ")));
                println!("  recomputed: {}", clean(&d.recomputed.join(" ")));
                println!("  {}", clean(&d.detail));
            }
        }
    }
    if report.divergences.is_empty() {
        Ok(())
    } else {
        Err(Failure::new(
            EXIT_MISMATCH,
            format!(
                "{} recorded entries were not reproduced",
                report.divergences.len()
            ),
        ))
    }
}
