//! `ksched audit job`: one job's story, each event explained.

use ksched_core::events::{Event, Input};
use ksched_runtime::audit::{self, Source, cause_text, entry_json};
use serde_json::json;

use crate::cli::output::{Format, table, time};
use crate::cli::{CliResult, Failure, Target};

use super::{Answers, failed};

/// One event, explained on one line: its text, and for placements every candidate with its
/// score or why it was skipped (the audit's "why this worker").
fn explain(e: &Event, input: &Input) -> String {
    let mut line = e.describe(input);
    let (candidates, omitted) = match e {
        Event::JobScheduled(s) => (&s.candidates, s.candidates_omitted),
        Event::JobWaiting(w) => (&w.candidates, w.candidates_omitted),
        _ => return line,
    };
    if candidates.is_empty() {
        return line;
    }
    let list: Vec<String> = candidates
        .iter()
        .map(|c| match (&c.score, &c.skipped) {
            (Some(score), _) => format!("{}={score:.3}", c.worker_id),
            (None, Some(why)) => format!("{} skipped ({why})", c.worker_id),
            (None, None) => c.worker_id.clone(),
        })
        .collect();
    line.push_str(&format!("; candidates: {}", list.join(", ")));
    if omitted > 0 {
        line.push_str(&format!(" and {omitted} more"));
    }
    line
}

pub(super) fn job(t: &Target, src: &Source, job_id: &str, out: &mut Answers) -> CliResult {
    let items = audit::timeline(src, job_id).map_err(failed)?;
    if items.is_empty() {
        return Err(Failure::new(
            crate::cli::EXIT_NOT_FOUND,
            format!(
                "the journal {}/{} says nothing about job {job_id}",
                src.topic, src.partition
            ),
        ));
    }
    match t.output {
        Format::Json => {
            let list: Vec<_> = items
                .iter()
                .map(|i| entry_json(src.partition, i.offset, &i.entry))
                .collect();
            out.json(src.partition, json!({ "job_id": job_id, "timeline": list }));
        }
        Format::Table => {
            let mut rows = Vec::new();
            for i in &items {
                let input = match &i.entry.input {
                    Input::Submit(_) => "JobRequest".to_owned(),
                    other => other.kind().to_owned(),
                };
                let head = vec![
                    i.offset.to_string(),
                    time(i.entry.log_time),
                    format!("{input} from {}", cause_text(&i.entry.cause)),
                ];
                if i.entry.events.is_empty() {
                    rows.push([head.clone(), vec!["-".into()]].concat());
                }
                for (n, e) in i.entry.events.iter().enumerate() {
                    let prefix = if n == 0 {
                        head.clone()
                    } else {
                        vec![String::new(); 3]
                    };
                    rows.push(
                        [
                            prefix,
                            vec![format!("{}: {}", e.name(), explain(e, &i.entry.input))],
                        ]
                        .concat(),
                    );
                }
            }
            table(
                &["JOURNAL OFFSET", "LOG TIME (UTC)", "INPUT", "EVENTS"],
                &rows,
            );
        }
    }
    Ok(())
}
