//! `k3d pack MODEL_DIR [OUT]`: write the trunk pack — a losslessly compressed copy of every
//! streamed BF16 trunk matrix and lm_head (`k3_engine::pack`) — that `k3d run`, `serve` and
//! `bench` read instead of the shards where it pays. Progress on stderr; an interrupted run
//! resumes where it stopped. Exit 0 when the pack is written, 2 on a bad command line or
//! config, 3 when the checkpoint is refused, 5 when the disk is full.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use k3_engine::checkpoint::Checkpoint;
use k3_engine::checkpoint::verify::ByteProgress;
use k3_engine::pack::PackError;
use k3_engine::pack::format::DEFAULT_NAME;

use super::progress::Reporter;
use crate::exit::{CliError, CliResult, Exit};

#[derive(clap::Args)]
pub struct Args {
    /// The model directory: config.json and the *.safetensors shards.
    model_dir: PathBuf,
    /// Where to write the pack (default: MODEL_DIR/trunk.k3pack, which `k3d verify MODEL_DIR`
    /// checks by itself; run, serve and bench read a pack given with `--trunk-pack`).
    out: Option<PathBuf>,
    /// Encoder threads (default: all cores).
    #[arg(long, value_parser = super::threads)]
    threads: Option<usize>,
    /// Replace OUT if it exists.
    #[arg(long)]
    force: bool,
}

pub fn run(args: Args) -> CliResult {
    let checkpoint = Checkpoint::open(&args.model_dir)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.model_dir.join(DEFAULT_NAME));
    if out.exists() && !args.force {
        return Err(CliError::new(
            Exit::Usage,
            anyhow::anyhow!(
                "{} exists; pass --force to replace it (check it with `k3d verify {} --trunk-pack {}`)",
                out.display(),
                args.model_dir.display(),
                out.display()
            ),
        ));
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    eprintln!("k3d pack: {} → {}", args.model_dir.display(), out.display());
    let progress = Arc::new(ByteProgress::default());
    let start = Instant::now();
    let summary = {
        let _reporter = Reporter::start(progress.clone(), "k3d pack", "packed");
        k3_engine::pack::write::pack(&checkpoint, &out, threads, &progress)
            .map_err(|e| classify(e, &out))?
    };
    let secs = start.elapsed().as_secs_f64();
    if summary.tensors > summary.resumed {
        eprintln!(
            "k3d pack: entropy of the BF16 bytes packed in this run: high byte (sign, exponent) \
             {:.3} bits, low byte {:.3} bits — an order-0 coder of each could reach {:.1} %",
            summary.high_entropy,
            summary.low_entropy,
            100.0 * (summary.high_entropy + summary.low_entropy) / 16.0
        );
    }
    eprintln!(
        "k3d pack: {} tensors ({} kept from an interrupted run), {:.3} GB → {:.3} GB ({:.1} % of \
         the shards' bytes) in {:.1} s; check it with `k3d verify {} --trunk-pack {}`",
        summary.tensors,
        summary.resumed,
        summary.original_bytes as f64 / 1e9,
        summary.packed_bytes as f64 / 1e9,
        100.0 * summary.packed_bytes as f64 / summary.original_bytes.max(1) as f64,
        secs,
        args.model_dir.display(),
        out.display()
    );
    Ok(())
}

/// A full disk is a resource error, any other failure to write `out` a plain failure, and a
/// shard that cannot be read a checkpoint error.
fn classify(e: PackError, out: &std::path::Path) -> CliError {
    let exit = match &e {
        PackError::Io { error, .. } if error.kind() == std::io::ErrorKind::StorageFull => {
            Exit::Resources
        }
        PackError::Io { path, .. }
            if path
                .as_os_str()
                .to_string_lossy()
                .starts_with(&*out.as_os_str().to_string_lossy()) =>
        {
            Exit::Failure
        }
        PackError::Write { .. } => Exit::Failure,
        _ => Exit::Checkpoint,
    };
    CliError::new(exit, e)
}
