//! `k3d`: the Kimi K3 daemon and its offline tools.
//!
//! Every subcommand lives in `cmd/<name>.rs`; this file only parses and dispatches, and turns
//! errors into one line on stderr and a documented exit code (see `exit.rs`). The modules are
//! the crate's library (`lib.rs`).

use clap::{CommandFactory, Parser, Subcommand};
use k3d::cmd;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "k3d",
    version,
    about = "Kimi K3 on one machine: daemon and offline tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a checkpoint directory and print its byte census.
    Check(cmd::check::Args),
    /// Write a random-weight checkpoint in exactly the released layout.
    Synth(cmd::synth::Args),
    /// Generate greedily from a prompt (text or ids), offline (tests and benchmarks use this).
    Run(cmd::run::Args),
    /// Text on stdin to token ids on stdout.
    Tokenize(cmd::tokenize::TokenizeArgs),
    /// Token ids on stdin (comma or whitespace separated) to their exact bytes on stdout.
    Detokenize(cmd::tokenize::DetokenizeArgs),
    /// Load a model once and serve it: gRPC to `k3` clients on a Unix socket and, with --http,
    /// the OpenAI and Anthropic HTTP APIs.
    // Boxed: its many settings make it far larger than the other commands' arguments.
    Serve(Box<cmd::serve::Args>),
    /// Check this machine (and a model directory) and recommend a memory budget.
    Doctor(cmd::doctor::Args),
    /// Download a checkpoint from the Hugging Face Hub: resumable, every file checked, the
    /// manifest for `k3d verify` written.
    Pull(cmd::pull::Args),
    /// SHA-256 every checkpoint file against a manifest (resumable).
    Verify(cmd::verify::Args),
    /// Write the trunk pack: a losslessly compressed copy of the BF16 trunk, read instead of the
    /// shards where it pays.
    Pack(cmd::pack::Args),
    /// The standard decode benchmark: budgets × runs, medians, against the plan and the drive.
    Bench(cmd::bench::Args),
    /// Print a shell completion script (e.g. `k3d completions bash > /etc/bash_completion.d/k3d`).
    Completions { shell: clap_complete::Shell },
    /// Write man pages (k3d.1 and one per subcommand) into DIR.
    Man { dir: PathBuf },
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check(args) => cmd::check::run(args),
        Command::Synth(args) => cmd::synth::run(args),
        Command::Run(args) => cmd::run::run(args),
        Command::Tokenize(args) => cmd::tokenize::tokenize(args),
        Command::Detokenize(args) => cmd::tokenize::detokenize(args),
        Command::Serve(args) => cmd::serve::run(*args),
        Command::Doctor(args) => cmd::doctor::run(args),
        Command::Pull(args) => cmd::pull::run(args),
        Command::Verify(args) => cmd::verify::run(args),
        Command::Pack(args) => cmd::pack::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "k3d", &mut std::io::stdout());
            Ok(())
        }
        Command::Man { dir } => clap_mangen::generate_to(Cli::command(), &dir)
            .map_err(|e| anyhow::anyhow!("writing man pages to {}: {e}", dir.display()).into()),
    };
    if let Err(e) = result {
        eprintln!("k3d: error: {:#}", e.error);
        std::process::exit(e.exit as i32);
    }
}
