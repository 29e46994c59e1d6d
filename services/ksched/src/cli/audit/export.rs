//! `ksched audit export`: the journal as JSON Lines or Avro, secrets hidden.

use std::io::Write;
use std::path::PathBuf;

use ksched_runtime::audit::{self, Source};

use crate::cli::{CliResult, EXIT_BAD_INPUT, Failure};

use super::{ExportFormat, failed, progress_printer};

/// Exports each source's journal in turn into one output (JSON Lines name each entry's
/// partition; an Avro container takes one source).
pub(super) fn export(sources: &[Source], format: ExportFormat, out: Option<PathBuf>) -> CliResult {
    let mut sink: Box<dyn Write> = match &out {
        Some(p) => Box::new(std::io::BufWriter::new(std::fs::File::create(p).map_err(
            |e| Failure::new(EXIT_BAD_INPUT, format!("{}: {e}", p.display())),
        )?)),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let mut n = 0;
    for src in sources {
        n += match format {
            ExportFormat::Jsonl => audit::export_jsonl(src, &mut sink, progress_printer("export")),
            ExportFormat::Avro => audit::export_avro(src, &mut sink, progress_printer("export")),
        }
        .map_err(failed)?;
    }
    sink.flush().map_err(failed)?;
    eprintln!("exported {n} journal entries");
    Ok(())
}
