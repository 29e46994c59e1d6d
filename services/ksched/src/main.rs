//! `ksched`: one binary, subcommands in the manner of the Kafka command-line tools.

mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// An event-sourced job scheduler on Apache Kafka.
#[derive(Debug, Parser)]
#[command(name = "ksched", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the scheduler: consume job topics, results, control and heartbeats; decide; commit
    /// journal, dispatches and dead letters exactly once.
    Run(run::RunArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run::main(args),
    }
}
