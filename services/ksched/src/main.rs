//! `ksched`: one binary, subcommands in the manner of the Kafka command-line tools.

mod bench;
mod cli;
mod dev;
mod kafka_args;
mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cli::{Connection, DlqCommand, JobsCommand, finish};

// The global allocator is mimalloc with regorus's allocation counters, installed by regorus
// itself (feature `allocator-memory-limits`, through ksched-policy): the processor allocates
// and frees per input, and the policy engine's per-evaluation memory limit reads the counts.
use serde_json::json;

/// An event-sourced job scheduler on Apache Kafka.
#[derive(Debug, Parser)]
#[command(name = "ksched", version, long_version = LONG_VERSION.as_str(), about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process; boxing the large variants would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run the scheduler: consume job topics, results, control and heartbeats; decide; commit
    /// journal, dispatches and dead letters exactly once; serve the HTTP API.
    Run(run::RunArgs),
    /// Try ksched in one command: in-memory Kafka, the scheduler, demo workers in two pools
    /// and a stream of demo jobs, printed as they happen.
    Dev(dev::DevArgs),
    /// Submit a job (prints its id).
    Submit {
        #[command(flatten)]
        args: cli::submit::SubmitArgs,
        #[command(flatten)]
        conn: Connection,
    },
    /// Measure throughput, latency, replay, recovery and scale against a broker, beside a
    /// raw Kafka baseline (docs/performance.md).
    Bench(bench::BenchArgs),
    /// Inspect jobs.
    Jobs {
        #[command(subcommand)]
        command: JobsCommand,
        #[command(flatten)]
        conn: Connection,
    },
    /// Schedules: cron expressions or intervals that submit a job at each firing.
    Schedules {
        #[command(subcommand)]
        command: cli::schedules::SchedulesCommand,
        #[command(flatten)]
        conn: Connection,
    },
    /// Batches: jobs submitted with one batch id, and the callbacks that wait for them.
    Batches {
        #[command(subcommand)]
        command: cli::batches::BatchesCommand,
        #[command(flatten)]
        conn: Connection,
    },
    /// Inspect workers.
    Workers {
        #[command(subcommand)]
        command: WorkersCommand,
        #[command(flatten)]
        conn: Connection,
    },
    /// Cancel a job.
    Cancel {
        job_id: String,
        #[command(flatten)]
        acting: cli::Acting,
        #[command(flatten)]
        conn: Connection,
    },
    /// Approve a job waiting in APPROVAL_REQUIRED (its hash and policy snapshot are fetched).
    Approve {
        job_id: String,
        #[arg(long, default_value = "operator")]
        approver: String,
        #[arg(long)]
        comment: Option<String>,
        #[command(flatten)]
        conn: Connection,
    },
    /// Reject a job waiting in APPROVAL_REQUIRED.
    Reject {
        job_id: String,
        #[arg(long, default_value = "operator")]
        approver: String,
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        conn: Connection,
    },
    /// Inspect the dead-letter queue.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
        #[command(flatten)]
        conn: Connection,
    },
    /// Answer from the journal alone: rebuild, verify, job timelines, time travel, what-if,
    /// export. Needs only Kafka; never writes to a live topic.
    Audit {
        #[command(flatten)]
        args: cli::audit::AuditArgs,
        #[command(flatten)]
        conn: Connection,
    },
    /// The keyring that seals jobs' secrets for their tenants: rotate, retire, shred, list.
    Keys(cli::keys::KeysArgs),
    /// Read the journal.
    Journal {
        #[command(subcommand)]
        command: JournalCommand,
        #[command(flatten)]
        conn: Connection,
    },
    /// The console's time travel and what-if, which `ksched run` starts in a child process
    /// (a request on standard input, the answer on standard output).
    #[command(hide = true, name = "replay-child")]
    ReplayChild,
    /// Print a shell completion script, e.g. `ksched completions bash >
    /// /etc/bash_completion.d/ksched` or `ksched completions zsh > ~/.zfunc/_ksched`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// `ksched --version`: the version, the commit and compiler it was built with, and the
/// optional features built in.
static LONG_VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(long_version);

fn long_version() -> String {
    let b = ksched_runtime::metrics::BUILD;
    let features: Vec<&str> = [("otel", cfg!(feature = "otel"))]
        .into_iter()
        .filter_map(|(name, on)| on.then_some(name))
        .collect();
    format!(
        "{}\ncommit: {}\ncompiler: {}\nfeatures: {}",
        b.version,
        b.commit,
        b.rustc,
        if features.is_empty() {
            "none".to_owned()
        } else {
            features.join(", ")
        }
    )
}

#[derive(Debug, Subcommand)]
enum WorkersCommand {
    /// Every known worker.
    List,
}

#[derive(Debug, Subcommand)]
enum JournalCommand {
    /// Print journal entries, decoded (secrets hidden); --follow keeps going.
    Tail(cli::journal::TailArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "ksched", &mut script);
            // A closed pipe (`| head`) is the reader's choice, not an error worth a panic.
            match std::io::Write::write_all(&mut std::io::stdout(), &script) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("ksched: writing the completion script: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run(args) => run::main(args),
        Command::ReplayChild => {
            ExitCode::from(u8::try_from(ksched_runtime::audit::isolated::child_main()).unwrap_or(1))
        }
        Command::Dev(args) => dev::main(args),
        Command::Bench(args) => bench::main(args),
        Command::Submit { args, conn } => {
            finish(conn.resolve().and_then(|t| cli::submit::submit(&t, args)))
        }
        Command::Jobs { command, conn } => {
            finish(conn.resolve().and_then(|t| cli::jobs(&t, command)))
        }
        Command::Schedules { command, conn } => finish(
            conn.resolve()
                .and_then(|t| cli::schedules::schedules(&t, command)),
        ),
        Command::Batches { command, conn } => finish(
            conn.resolve()
                .and_then(|t| cli::batches::batches(&t, command)),
        ),
        Command::Workers {
            command: WorkersCommand::List,
            conn,
        } => finish(conn.resolve().and_then(|t| cli::workers_list(&t))),
        Command::Cancel {
            job_id,
            acting,
            conn,
        } => finish(
            conn.resolve()
                .and_then(|t| cli::control(&t, "cancel", &job_id, acting.body().into())),
        ),
        Command::Approve {
            job_id,
            approver,
            comment,
            conn,
        } => finish(conn.resolve().and_then(|t| {
            cli::control(
                &t,
                "approve",
                &job_id,
                json!({ "approver": approver, "comment": comment }),
            )
        })),
        Command::Reject {
            job_id,
            approver,
            reason,
            conn,
        } => finish(conn.resolve().and_then(|t| {
            cli::control(
                &t,
                "reject",
                &job_id,
                json!({ "approver": approver, "reason": reason }),
            )
        })),
        Command::Dlq { command, conn } => {
            finish(conn.resolve().and_then(|t| cli::dlq(&t, command)))
        }
        Command::Audit { args, conn } => {
            finish(conn.resolve().and_then(|t| cli::audit::audit(&t, args)))
        }
        Command::Keys(args) => finish(cli::keys::keys(args)),
        Command::Journal {
            command: JournalCommand::Tail(args),
            conn,
        } => finish(conn.resolve().and_then(|t| cli::journal::tail(&t, args))),
    }
}
