//! `k3d synth`: write a random-weight checkpoint in exactly the released layout (spec §9.1).
//! Prints on stdout the checkpoint's content digest (what the reference fixtures record) and
//! its model fingerprint (what `k3 status` and every other output show); progress goes to
//! stderr for big shapes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k3_engine::checkpoint::Checkpoint;
use k3_engine::synth::{self, SynthError, WriteProgress, shape::SHAPE_NAMES, shape::Shape};

use crate::exit::{CliError, CliResult, Exit};

/// Shapes above this size report progress on stderr.
const PROGRESS_ABOVE: u64 = 256 << 20;

#[derive(clap::Args)]
pub struct Args {
    /// Shape: tiny, tiny-b, tiny-c (tests), small (a few hundred MB), bench (released layer
    /// dims, 13.4 GB).
    #[arg(long)]
    shape: String,
    /// Output directory (created if missing; must be empty unless --force).
    out_dir: PathBuf,
    /// Seed of all random values; same shape + seed gives the same bytes on every machine.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write into a non-empty directory, replacing its checkpoint files.
    #[arg(long)]
    force: bool,
}

pub fn run(args: Args) -> CliResult {
    let Some(shape) = Shape::named(&args.shape) else {
        return Err(CliError::new(
            Exit::Usage,
            anyhow::anyhow!(
                "unknown shape {:?}; known: {}",
                args.shape,
                SHAPE_NAMES.join(", ")
            ),
        ));
    };
    let plan = synth::blueprint(&shape).map_err(|e| CliError::new(Exit::Failure, e))?;
    let total = plan.total_bytes();
    let verbose = total > PROGRESS_ABOVE;
    if verbose {
        eprintln!(
            "k3d synth: shape {} → {}: {} shards, {:.2} GB",
            shape.name,
            args.out_dir.display(),
            plan.shards.len(),
            total as f64 / 1e9
        );
    }
    let start = Instant::now();
    let mut last = start;
    let mut report = |p: WriteProgress| {
        if verbose && last.elapsed() >= Duration::from_secs(2) {
            last = Instant::now();
            let secs = start.elapsed().as_secs_f64();
            eprintln!(
                "  shard {}/{}: {:.2}/{:.2} GB, {:.0} MB/s",
                p.shard,
                p.shards,
                p.bytes_done as f64 / 1e9,
                p.bytes_total as f64 / 1e9,
                p.bytes_done as f64 / 1e6 / secs.max(1e-9)
            );
        }
    };
    let summary =
        synth::write(&plan, &args.out_dir, args.seed, args.force, &mut report).map_err(|e| {
            let exit = match e {
                SynthError::NoSpace { .. } => Exit::Resources,
                SynthError::NotEmpty { .. } => Exit::Usage,
                SynthError::Io { .. }
                | SynthError::Statvfs { .. }
                | SynthError::Dims { .. }
                | SynthError::VocabTooLarge { .. }
                | SynthError::DataOverflow { .. } => Exit::Failure,
            };
            CliError::new(exit, e)
        })?;
    if verbose {
        eprintln!(
            "k3d synth: wrote {:.2} GB in {:.1} s",
            summary.total_bytes as f64 / 1e9,
            start.elapsed().as_secs_f64()
        );
    }
    // The model fingerprint from the written directory, by the one function that computes it.
    let fingerprint = Checkpoint::open(&args.out_dir)
        .and_then(|c| c.fingerprint())
        .map_err(|e| CliError::new(Exit::Failure, e))?;
    println!(
        "shape {} seed {} vocab {} bytes {} content-sha256 {} fingerprint {fingerprint}",
        shape.name, args.seed, summary.vocab_size, summary.total_bytes, summary.content_sha256
    );
    Ok(())
}
