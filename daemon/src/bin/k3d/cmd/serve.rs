//! `k3d serve`: load a model once and serve it over a Unix socket (see `server/`).
use crate::exit::{CliError, CliResult, Exit};
use crate::server;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (config.json, shards, tokenizer files).
    #[arg(long)]
    model: PathBuf,
    /// Where to create the socket. Ignored when systemd passes one (socket activation).
    #[arg(long)]
    socket: PathBuf,
    /// Compute threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Engine configuration file (memory plan); not read yet by this version of the engine.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Requests that may wait for a compute slot; more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 16)]
    max_queue: usize,
    /// Requests computed at once, stepped round-robin (each holds its own state).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    max_active: u16,
    /// Permissions of the socket file: 0660 (owner and group) or 0600 (owner only).
    #[arg(long, default_value = "0660", value_parser = ["0660", "0600"])]
    socket_mode: String,
    /// Group owning the socket; its members may connect (with --socket-mode 0660).
    #[arg(long)]
    socket_group: Option<String>,
    /// On SIGTERM/SIGINT, seconds to let running requests finish before cancelling them.
    #[arg(long, default_value_t = 10.0)]
    shutdown_grace: f64,
    #[command(flatten)]
    budget: super::budget::BudgetArgs,
}

pub fn run(args: Args) -> CliResult {
    if let Some(config) = &args.config {
        return Err(CliError::new(
            Exit::Usage,
            anyhow::anyhow!(
                "--config {}: engine configuration files are not supported by this build yet",
                config.display()
            ),
        ));
    }
    if !args.shutdown_grace.is_finite() || !(0.0..=3600.0).contains(&args.shutdown_grace) {
        return Err(CliError::new(
            Exit::Usage,
            anyhow::anyhow!("--shutdown-grace must be between 0 and 3600 seconds"),
        ));
    }
    let threads = match args.threads {
        Some(0) => {
            return Err(CliError::new(
                Exit::Usage,
                anyhow::anyhow!("--threads must be at least 1"),
            ));
        }
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let mode = if args.socket_mode == "0600" {
        0o600
    } else {
        0o660
    };
    server::run(server::Config {
        model: args.model,
        socket: server::SocketSpec {
            path: args.socket,
            mode,
            group: args.socket_group,
        },
        threads,
        model_options: args.budget.load_options()?,
        limits: server::Limits {
            max_active: usize::from(args.max_active),
            max_queue: args.max_queue,
        },
        grace: Duration::from_secs_f64(args.shutdown_grace),
    })
}
