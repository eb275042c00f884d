//! `k3d pull REPO DIR`: a checkpoint from the Hugging Face Hub (src/pull), then the next step.
use super::progress::Reporter;
use crate::exit::{CliError, CliResult};
use crate::pull::{self, Request};
use k3_engine::checkpoint::verify::ByteProgress;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    /// Repository on the Hub, OWNER/NAME (e.g. moonshotai/Kimi-K3).
    repo: String,
    /// Directory to pull into (created if missing). A re-run continues where it stopped.
    dir: PathBuf,
    /// Branch, tag or commit (default: the commit recorded in DIR by an earlier pull, else
    /// main). Resolved to a commit once and recorded in DIR/.k3d-pull.json.
    #[arg(long)]
    revision: Option<String>,
    /// Only files whose path matches this shell pattern (`*` spans `/`); repeatable.
    #[arg(long, value_name = "GLOB", value_parser = pattern)]
    include: Vec<glob::Pattern>,
    /// Skip files whose path matches this shell pattern; repeatable, wins over --include.
    #[arg(long, value_name = "GLOB", value_parser = pattern)]
    exclude: Vec<glob::Pattern>,
    /// Connections at once, across files and the pieces of large files.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    jobs: u16,
    /// Files larger than this many MiB are fetched in pieces of this size, in parallel (1/64
    /// to 65536).
    #[arg(long, default_value_t = 256.0, value_name = "MIB", value_parser = piece_mib)]
    piece_mib: f64,
    /// Hub token (default: HF_TOKEN, else the file `huggingface-cli login` writes).
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
}

fn pattern(text: &str) -> Result<glob::Pattern, String> {
    glob::Pattern::new(text).map_err(|e| format!("{text:?} is not a shell pattern: {e}"))
}

fn piece_mib(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(mib) if (1.0 / 64.0..=65536.0).contains(&mib) => Ok(mib),
        _ => Err(format!(
            "{text:?} is not a piece size from 1/64 to 65536 MiB"
        )),
    }
}

pub fn run(args: Args) -> CliResult {
    let dir = args.dir.clone();
    let bytes = Arc::new(ByteProgress::default());
    // A terminal gets pull's own bar; logs get a plain line every few seconds.
    let reporter = (!std::io::stderr().is_terminal())
        .then(|| Reporter::start(bytes.clone(), "k3d pull", "fetched"));
    let summary = pull::pull(Request {
        repo: args.repo.clone(),
        dir: args.dir,
        revision: args.revision,
        include: args.include,
        exclude: args.exclude,
        jobs: usize::from(args.jobs),
        piece: (args.piece_mib * 1048576.0) as u64,
        token: args.token,
        bytes,
    });
    drop(reporter);
    let summary = summary.map_err(|e| CliError::new(e.exit(), e))?;
    eprintln!(
        "k3d pull: {} files of {}@{} checked in {}: {} fetched ({:.2} GB in {:.1} s, {:.1} MB/s), {} kept from an earlier run; manifest {}",
        summary.files,
        args.repo,
        summary.commit,
        dir.display(),
        summary.fetched_files,
        summary.fetched_bytes as f64 / 1e9,
        summary.seconds,
        summary.fetched_bytes as f64 / summary.seconds.max(1e-9) / 1e6,
        summary.kept_files,
        dir.join(k3_engine::checkpoint::manifest::DEFAULT_NAME)
            .display()
    );
    eprintln!("next: k3d verify {}", dir.display());
    Ok(())
}
