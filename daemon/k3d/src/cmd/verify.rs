//! `k3d verify`: SHA-256 of every checkpoint file against a `sha256sum` manifest, in parallel,
//! resumable, with progress on stderr. Exit 0 when every listed file matches, 3 otherwise.
use crate::exit::{CliError, CliResult, Exit};
use k3_engine::checkpoint::manifest::{self, Manifest};
use k3_engine::checkpoint::verify::{self, ByteProgress, Verdict};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::progress::Reporter;

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory.
    model_dir: PathBuf,
    /// Manifest in `sha256sum` format (default: MODEL_DIR/SHA256SUMS).
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Files hashed at once (default: all cores).
    #[arg(long, value_parser = super::threads)]
    threads: Option<usize>,
    /// Create the manifest from the files present instead of checking against it.
    #[arg(long)]
    write_manifest: bool,
    /// Check this trunk pack (`k3d pack`) against the shards instead of checking the manifest:
    /// every block decodes, and decodes to the shards' bytes. Without it, a pack at
    /// MODEL_DIR/trunk.k3pack is checked after the manifest.
    #[arg(long, value_name = "PATH", conflicts_with = "write_manifest")]
    trunk_pack: Option<PathBuf>,
}

fn io_error(e: verify::VerifyError) -> CliError {
    CliError::new(Exit::Checkpoint, e)
}

pub fn run(args: Args) -> CliResult {
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let manifest_path = args
        .manifest
        .clone()
        .unwrap_or_else(|| args.model_dir.join(manifest::DEFAULT_NAME));
    let progress = std::sync::Arc::new(ByteProgress::default());
    if args.write_manifest {
        return write_manifest(&args.model_dir, &manifest_path, threads, progress);
    }
    if let Some(pack) = &args.trunk_pack {
        return verify_pack(&args.model_dir, pack);
    }
    let text = std::fs::read_to_string(&manifest_path).map_err(|e| {
        CliError::new(
            Exit::Usage,
            anyhow::anyhow!(
                "cannot read manifest {}: {e} (create one with `k3d verify {} --write-manifest`)",
                manifest_path.display(),
                args.model_dir.display()
            ),
        )
    })?;
    let parsed = Manifest::parse(&manifest_path.display().to_string(), &text)
        .map_err(|e| CliError::new(Exit::Usage, e))?;
    let state = verify::default_state_path(&manifest_path);
    match &state {
        Some(p) => eprintln!("k3d verify: resume state {}", p.display()),
        None => eprintln!("k3d verify: no XDG_STATE_HOME or HOME: this run cannot be resumed"),
    }
    let start = Instant::now();
    let report = {
        let _reporter = Reporter::start(progress.clone(), "k3d verify", "hashed");
        verify::verify(
            &args.model_dir,
            &parsed,
            state.as_deref(),
            threads,
            &progress,
        )
        .map_err(io_error)?
    };
    let secs = start.elapsed().as_secs_f64();
    let mut bad = 0;
    for (name, outcome) in &report.files {
        match outcome {
            Verdict::Verified => println!("{name}: OK"),
            Verdict::Resumed => println!("{name}: OK (verified earlier, unchanged since)"),
            Verdict::Missing => {
                bad += 1;
                println!("{name}: MISSING");
            }
            Verdict::Mismatch { expected, actual } => {
                bad += 1;
                println!("{name}: MISMATCH expected {expected} actual {actual}");
            }
        }
    }
    let unlisted = unlisted_shards(&args.model_dir, &parsed)?;
    for name in &unlisted {
        println!("{name}: NOT IN MANIFEST");
    }
    eprintln!(
        "k3d verify: {} files, {} hashed ({:.2} GB in {:.1} s, {:.0} MB/s), {} skipped as verified earlier",
        report.files.len(),
        report
            .files
            .iter()
            .filter(|(_, o)| !matches!(o, Verdict::Resumed | Verdict::Missing))
            .count(),
        report.hashed_bytes as f64 / 1e9,
        secs,
        report.hashed_bytes as f64 / secs.max(1e-9) / 1e6,
        report
            .files
            .iter()
            .filter(|(_, o)| *o == Verdict::Resumed)
            .count()
    );
    let pack = args.model_dir.join(k3_engine::pack::format::DEFAULT_NAME);
    let pack_result = if pack.exists() {
        verify_pack(&args.model_dir, &pack)
    } else {
        Ok(())
    };
    if bad > 0 || !unlisted.is_empty() {
        return Err(CliError::new(
            Exit::Checkpoint,
            anyhow::anyhow!(
                "{bad} listed file(s) missing or corrupt, {} shard(s) not in {}",
                unlisted.len(),
                manifest_path.display()
            ),
        ));
    }
    pack_result?;
    // The first hour (docs/running-k3.md): pull → verify → check → doctor → serve.
    eprintln!("next: k3d check {}", args.model_dir.display());
    Ok(())
}

/// Checks the trunk pack at `pack` against the checkpoint in `model_dir`: exit 3 naming the
/// file, tensor, block and offset of the first damage or difference.
fn verify_pack(model_dir: &Path, pack: &Path) -> CliResult {
    let checkpoint = k3_engine::checkpoint::Checkpoint::open(model_dir)?;
    let file = k3_engine::pack::PackFile::open(pack, &checkpoint)
        .map_err(|e| CliError::new(Exit::Checkpoint, e))?;
    let progress = std::sync::Arc::new(ByteProgress::default());
    let start = Instant::now();
    let summary = {
        let _reporter = Reporter::start(progress.clone(), "k3d verify", "decoded");
        k3_engine::pack::decode_check::verify(
            &file,
            &checkpoint,
            k3_engine::pack::Path::detect(),
            &progress,
        )
        .map_err(|e| CliError::new(Exit::Checkpoint, e))?
    };
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{}: OK ({} tensors, {} blocks: {:.3} GB packed decode to the shards' {:.3} GB)",
        pack.display(),
        summary.tensors,
        summary.blocks,
        summary.packed_bytes as f64 / 1e9,
        summary.original_bytes as f64 / 1e9
    );
    eprintln!(
        "k3d verify: pack checked in {secs:.1} s ({:.0} MB/s of original bytes)",
        summary.original_bytes as f64 / secs.max(1e-9) / 1e6
    );
    Ok(())
}

/// `*.safetensors` files present but not listed: an unverified shard would be loaded.
fn unlisted_shards(dir: &Path, manifest: &Manifest) -> Result<Vec<String>, CliError> {
    let names = verify::manifest_candidates(dir, Path::new("")).map_err(io_error)?;
    Ok(names
        .into_iter()
        .filter(|n| n.ends_with(".safetensors") && manifest.get(n).is_none())
        .collect())
}

fn write_manifest(
    dir: &Path,
    path: &Path,
    threads: usize,
    progress: std::sync::Arc<ByteProgress>,
) -> CliResult {
    if path.exists() {
        return Err(CliError::new(
            Exit::Usage,
            anyhow::anyhow!(
                "{} exists; remove it first to write a new manifest",
                path.display()
            ),
        ));
    }
    let names = verify::manifest_candidates(dir, path).map_err(io_error)?;
    let start = Instant::now();
    let built = {
        let _reporter = Reporter::start(progress.clone(), "k3d verify", "hashed");
        verify::build_manifest(dir, &names, threads, &progress).map_err(io_error)?
    };
    std::fs::write(path, built.to_text()).map_err(|e| {
        CliError::new(
            Exit::Failure,
            anyhow::anyhow!("writing {}: {e}", path.display()),
        )
    })?;
    let secs = start.elapsed().as_secs_f64();
    let bytes = progress.done.load(Ordering::Relaxed);
    eprintln!(
        "k3d verify: wrote {} ({} files, {:.2} GB in {:.1} s, {:.0} MB/s)",
        path.display(),
        built.entries.len(),
        bytes as f64 / 1e9,
        secs,
        bytes as f64 / secs.max(1e-9) / 1e6
    );
    Ok(())
}
