//! `ksched batches ...`: list batches, show one (its counts, members not ended, callbacks
//! waiting) and cancel one, through the HTTP API.

use clap::Subcommand;
use serde_json::{Value, json};

use super::output::{self, Format, cell, table, time_cell};
use super::{CliResult, EXIT_BAD_INPUT, Failure, Target, call, urlencode};

/// `ksched batches ...`
#[derive(Debug, Subcommand)]
pub(crate) enum BatchesCommand {
    /// List batches (open, or ended within their retention), with their counts.
    List {
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Show a batch: its counts and state, its members not ended and its callbacks waiting.
    Show {
        /// `TENANT:ID`.
        batch: String,
    },
    /// Cancel an open batch: its members that have not started are cancelled (one sent to a
    /// worker is taken back), its callbacks fail; members running go on.
    Cancel {
        /// `TENANT:ID`.
        batch: String,
        /// Who cancels (without API authentication; otherwise the caller).
        #[arg(long, default_value = "operator")]
        principal: String,
        /// Why, for the journal.
        #[arg(long)]
        reason: Option<String>,
    },
}

/// The API path of batch `TENANT:ID`.
fn path_of(batch: &str) -> Result<String, Failure> {
    match batch.split_once(':') {
        Some((tenant, id)) if !tenant.is_empty() && !id.is_empty() => Ok(format!(
            "/api/v1/batches/{}/{}",
            urlencode(tenant),
            urlencode(id)
        )),
        _ => Err(Failure::new(
            EXIT_BAD_INPUT,
            format!("{batch:?}: name a batch as TENANT:ID"),
        )),
    }
}

/// The columns of a batch's row ([`row`]).
const COLUMNS: [&str; 8] = [
    "BATCH",
    "STATE",
    "SUBMITTED",
    "SUCCEEDED",
    "FAILED",
    "NOT ENDED",
    "OPENED (UTC)",
    "ENDED (UTC)",
];

fn row(b: &Value) -> Vec<String> {
    vec![
        format!("{}:{}", cell(&b["tenant_id"]), cell(&b["batch_id"])),
        cell(&b["state"]),
        format!("{} of {}", cell(&b["joined"]), cell(&b["expected"])),
        cell(&b["succeeded"]),
        cell(&b["failed"]),
        cell(&b["running_or_waiting"]),
        time_cell(&b["opened_at"]),
        time_cell(&b["ended_at"]),
    ]
}

pub(crate) fn batches(t: &Target, command: BatchesCommand) -> CliResult {
    match command {
        BatchesCommand::List { tenant, limit } => {
            let mut q = format!("/api/v1/batches?limit={limit}");
            if let Some(tenant) = tenant {
                q.push_str(&format!("&tenant={}", urlencode(&tenant)));
            }
            let v = call(t, "GET", &q, None)?;
            match t.output {
                Format::Json => output::json(&v),
                Format::Table => {
                    let rows: Vec<Vec<String>> = (v["batches"].as_array())
                        .map(|a| a.iter().map(row).collect())
                        .unwrap_or_default();
                    table(&COLUMNS, &rows);
                }
            }
        }
        BatchesCommand::Show { batch } => {
            let v = call(t, "GET", &path_of(&batch)?, None)?;
            match t.output {
                Format::Json => output::json(&v),
                Format::Table => {
                    table(&COLUMNS, &[row(&v)]);
                    for (field, what) in [
                        ("members_not_ended", "members not ended"),
                        ("callbacks_waiting", "callbacks waiting"),
                    ] {
                        let ids: Vec<String> = (v[field].as_array().into_iter().flatten())
                            .map(cell)
                            .collect();
                        let more = if v[format!("{field}_more")].as_bool() == Some(true) {
                            " and more"
                        } else {
                            ""
                        };
                        let list = if ids.is_empty() {
                            "none".to_owned()
                        } else {
                            ids.join(", ")
                        };
                        println!("{what}: {list}{more}");
                    }
                }
            }
        }
        BatchesCommand::Cancel {
            batch,
            principal,
            reason,
        } => {
            let body = json!({ "principal": principal, "reason": reason });
            let v = call(
                t,
                "POST",
                &format!("{}/cancel", path_of(&batch)?),
                Some(body),
            )?;
            match t.output {
                Format::Json => output::json(&v),
                Format::Table => println!(
                    "{}:{}: {}",
                    cell(&v["tenant_id"]),
                    cell(&v["batch_id"]),
                    cell(&v["status"])
                ),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_named_by_tenant_and_id() {
        assert_eq!(
            path_of("acme:nightly").unwrap(),
            "/api/v1/batches/acme/nightly"
        );
        assert!(path_of("nightly").is_err());
        assert!(path_of("acme:").is_err());
    }
}
