//! `ksched keys`: the keyring that seals jobs' secrets for their tenants
//! (docs/security.md#secrets). Producers and workers hold it; the scheduler never does.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use ksched_secrets::Keyring;
use serde_json::json;

use super::output::{self, Format};
use super::{CliResult, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_USAGE, Failure};

#[derive(Debug, Args)]
pub(crate) struct KeysArgs {
    /// The keyring file (JSON, mode 600; created by the first `rotate`).
    #[arg(long, env = "KSCHED_KEYRING", value_name = "FILE")]
    pub keyring: PathBuf,
    #[arg(long, short = 'o', value_enum, default_value_t = Format::Table)]
    pub output: Format,
    #[command(subcommand)]
    pub command: KeysCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum KeysCommand {
    /// Add a fresh key for a tenant and seal with it from now on (creates the file and the
    /// tenant when needed). Values sealed with older keys still open.
    Rotate {
        #[arg(long)]
        tenant: String,
    },
    /// Delete one of a tenant's older keys: the values it sealed stop opening.
    Retire {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        kid: String,
    },
    /// Crypto-shredding: delete every key of a tenant, so that every secret ever sealed for it
    /// stops opening, wherever it is stored (the journal is not rewritten). Give the keyring
    /// file back to producers and workers, and delete every other copy (backups too).
    Shred {
        #[arg(long)]
        tenant: String,
        /// Confirm: this cannot be undone.
        #[arg(long)]
        yes: bool,
    },
    /// Tenants and their key ids (never the keys).
    List,
}

fn load(path: &Path, create: bool) -> Result<Keyring, Failure> {
    if create && !path.exists() {
        return Ok(Keyring::new());
    }
    Keyring::load(path).map_err(|e| Failure::new(EXIT_BAD_INPUT, e.to_string()))
}

fn save(keyring: &Keyring, path: &Path) -> CliResult {
    keyring
        .save(path)
        .map_err(|e| Failure::new(EXIT_FAILED, e.to_string()))
}

pub(crate) fn keys(args: KeysArgs) -> CliResult {
    let path = args.keyring.as_path();
    let said = match args.command {
        KeysCommand::Rotate { tenant } => {
            let mut k = load(path, true)?;
            let kid = k
                .rotate(&tenant)
                .map_err(|e| Failure::new(EXIT_BAD_INPUT, e.to_string()))?;
            save(&k, path)?;
            json!({ "tenant": tenant, "active": kid, "keyring": path })
        }
        KeysCommand::Retire { tenant, kid } => {
            let mut k = load(path, false)?;
            k.retire(&tenant, &kid)
                .map_err(|e| Failure::new(EXIT_BAD_INPUT, e.to_string()))?;
            save(&k, path)?;
            json!({ "tenant": tenant, "retired": kid, "keyring": path })
        }
        KeysCommand::Shred { tenant, yes } => {
            if !yes {
                return Err(Failure::new(
                    EXIT_USAGE,
                    format!(
                        "shredding makes every secret ever sealed for tenant {tenant} unreadable for good: add --yes"
                    ),
                ));
            }
            let mut k = load(path, false)?;
            let n = k
                .shred(&tenant)
                .map_err(|e| Failure::new(EXIT_BAD_INPUT, e.to_string()))?;
            save(&k, path)?;
            json!({ "tenant": tenant, "keys_deleted": n, "keyring": path })
        }
        KeysCommand::List => {
            let k = load(path, false)?;
            let tenants: Vec<_> = k
                .tenants()
                .into_iter()
                .map(|t| json!({ "tenant": t.tenant, "active": t.active, "kids": t.kids }))
                .collect();
            match args.output {
                Format::Json => output::json(&json!(tenants)),
                Format::Table => output::table(
                    &["TENANT", "ACTIVE", "KEYS"],
                    &tenants
                        .iter()
                        .map(|t| {
                            vec![
                                output::cell(&t["tenant"]),
                                output::cell(&t["active"]),
                                t["kids"]
                                    .as_array()
                                    .map(|a| a.iter().map(output::cell).collect::<Vec<_>>())
                                    .unwrap_or_default()
                                    .join(","),
                            ]
                        })
                        .collect::<Vec<_>>(),
                ),
            }
            return Ok(());
        }
    };
    match args.output {
        Format::Json => output::json(&said),
        Format::Table => println!("{said}"),
    }
    Ok(())
}
