//! `k3`: the thin client of the k3d daemon. It only talks to the daemon's Unix socket: run a
//! prompt, chat, show status, tokenize. Exit codes are listed in `failure.rs` (and `k3 --help`).

mod chat;
mod connect;
mod failure;
mod run;
mod sessions;
mod status;
mod stream;

use clap::{CommandFactory, Parser, Subcommand};
use failure::{Code, Failure};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "k3",
    version,
    about = "Talk to a running k3d daemon",
    after_help = "Socket: --socket, else $K3_SOCKET, else $XDG_RUNTIME_DIR/k3d.sock, else /run/k3d/k3d.sock.\n\
Exit codes: 0 ok, 1 other failure, 2 bad usage or input, 3 daemon not running, 4 permission \
denied on the socket, 5 daemon busy, unavailable or refusing this user more connections (retry later), 6 request refused as invalid, \
7 model error, 8 session refused (not found, another user's, in use, or its file is damaged), \
9 the connection to k3d failed mid-request (output cut short; not a refusal), 10 the daemon's \
session storage failed (disk full), 130 cancelled.\n\n\
Examples (with the trained 2 MB model of the repository, which continues Python code):\n  \
k3d serve --model tests/fixtures/trained/model --socket /tmp/k3d.sock --speculate 4 &\n  \
k3 --socket /tmp/k3d.sock run $'def fibonacci(n):\\n' --max-tokens 40\n  \
k3 --socket /tmp/k3d.sock run --speculate 4 \"$(cat list.py)\"   (repetitive text: drafts accepted)\n  \
k3 --socket /tmp/k3d.sock chat --no-think"
)]
struct Cli {
    /// The daemon's socket.
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Continue a prompt (no chat template) and stream the result.
    Run(run::Args),
    /// Chat interactively (history, multi-line input ending lines with `\`, /reset, /save, /exit).
    Chat(chat::Args),
    /// Show what the daemon holds and is doing.
    Status(status::Args),
    /// Print the token ids of a text (`-` reads it from stdin).
    Tokenize(status::TokenizeArgs),
    /// Print the text of token ids (arguments, or stdin; spaces or commas between them).
    Detokenize(status::DetokenizeArgs),
    /// List, remove or save your daemon sessions.
    #[command(subcommand)]
    Sessions(sessions::Command),
    /// Print a shell completion script (e.g. `k3 completions bash > ~/.local/share/bash-completion/completions/k3`).
    Completions { shell: clap_complete::Shell },
    /// Write man pages (k3.1 and one per subcommand) into DIR.
    Man { dir: PathBuf },
}

fn main() {
    let cli = Cli::parse();
    let socket = connect::resolve(cli.socket);
    let result = match cli.command {
        Command::Chat(args) => chat::run(&socket, args),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "k3", &mut std::io::stdout());
            Ok(())
        }
        Command::Man { dir } => clap_mangen::generate_to(Cli::command(), &dir).map_err(|e| {
            Failure::new(
                Code::Other,
                format!("writing man pages to {}: {e}", dir.display()),
            )
        }),
        command => runtime().and_then(|rt| {
            rt.block_on(async {
                match command {
                    Command::Run(args) => run::run(&socket, args).await,
                    Command::Status(args) => status::status(&socket, args).await,
                    Command::Tokenize(args) => status::tokenize(&socket, args).await,
                    Command::Detokenize(args) => status::detokenize(&socket, args).await,
                    Command::Sessions(command) => sessions::run(&socket, command).await,
                    Command::Chat(_) | Command::Completions { .. } | Command::Man { .. } => Ok(()),
                }
            })
        }),
    };
    if let Err(f) = result {
        // A cancel of our own (Ctrl-C) was already reported where it happened; any other
        // failure says why here, a cancel by the daemon (shutdown, a Cancel call) included.
        if f.code != Code::OutputClosed && !f.message.is_empty() {
            eprintln!("k3: {}", f.message);
        }
        std::process::exit(f.code as i32);
    }
}

/// One thread is enough for a client; it keeps start-up cheap.
pub fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(Code::Other, format!("starting the runtime: {e}")))
}

/// Writes to stdout; a reader that went away (`k3 … | head`) ends the program quietly.
pub fn print(text: &str) -> Result<(), Failure> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(Failure::output)
}

/// One JSON document on a line of stdout, serialized from the wire message itself.
pub fn print_json(value: &impl serde::Serialize) -> Result<(), Failure> {
    let text = serde_json::to_string(value)
        .map_err(|e| Failure::new(Code::Other, format!("encoding JSON: {e}")))?;
    print(&format!("{text}\n"))
}

/// The argument itself, or all of stdin when it is `-`.
pub fn argument_or_stdin(arg: String) -> Result<String, Failure> {
    if arg != "-" {
        return Ok(arg);
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
        .map_err(|e| Failure::usage(format!("reading stdin: {e}")))?;
    Ok(text)
}
