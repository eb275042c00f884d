//! `k3d doctor`: what this machine offers (CPU features, cores, RAM, cgroup limit) and, given a
//! model directory, whether its shards are all there, how fast its drive reads the way the
//! engine reads, and which `--ram-gb` to run with at what expected speed.
use crate::exit::{CliError, CliResult, Exit};
use k3_engine::advice::{self, Advice};
use k3_engine::checkpoint::{Checkpoint, CheckpointError};
use k3_engine::plan::{Census, GIB};
use k3_engine::store::direct_io::DirectPolicy;
use k3_engine::store::reader::DEFAULT_QUEUE_DEPTH;
use k3_engine::system::read_probe::{self, Pattern, ProbeOptions, ProbeResult};
use k3_engine::system::{Cpu, Disk, Memory};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Context length the advice plans conversation state for (spec §5.1: MLA latent cache grows
/// 55,296 B per position on the released model).
const PLANNED_CONTEXT: u64 = 32_768;

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory; without it only the machine is checked.
    model_dir: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Seconds to spend measuring the model's drive (timed after a warm-up of half as long).
    #[arg(long, default_value_t = 3.0)]
    probe_seconds: f64,
}

#[derive(Serialize)]
struct ShardCheck {
    index_file: bool,
    /// `metadata.total_size` of model.safetensors.index.json.
    index_total_size: Option<u64>,
    /// Tensor data bytes of the shard files present (file size minus header).
    data_bytes: Option<u64>,
    listed_files: Vec<String>,
    missing_files: Vec<String>,
    unlisted_files: Vec<String>,
    file_count: usize,
    file_bytes: u64,
    /// Why the checkpoint does not open, if it does not.
    open_error: Option<String>,
}

#[derive(Serialize)]
struct ModelReport {
    dir: PathBuf,
    disk: Disk,
    shards: ShardCheck,
    probe: Option<ProbeResult>,
    probe_error: Option<String>,
    advice: Option<Advice>,
    advice_error: Option<String>,
    planned_context: u64,
}

#[derive(Serialize)]
struct Checkup {
    cpu: Cpu,
    memory: Memory,
    usable_memory: u64,
    model: Option<ModelReport>,
}

fn gb(b: u64) -> String {
    format!("{:.2} GB", b as f64 / 1e9)
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / GIB as f64)
}

/// Shard files on disk against model.safetensors.index.json.
fn check_shards(
    dir: &Path,
    opened: &Result<Checkpoint, CheckpointError>,
) -> Result<(ShardCheck, Vec<PathBuf>), CliError> {
    let read_err = |p: &Path, e: std::io::Error| {
        CliError::new(
            Exit::Checkpoint,
            anyhow::anyhow!("reading {}: {e}", p.display()),
        )
    };
    let mut present: Vec<(String, PathBuf, u64)> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| read_err(dir, e))? {
        let entry = entry.map_err(|e| read_err(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".safetensors") {
            let size = entry
                .metadata()
                .map_err(|e| read_err(&entry.path(), e))?
                .len();
            present.push((name, entry.path(), size));
        }
    }
    present.sort();
    let index_path = dir.join("model.safetensors.index.json");
    let (index_file, index_total_size, listed) = match std::fs::read_to_string(&index_path) {
        Ok(text) => {
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                CliError::new(
                    Exit::Checkpoint,
                    anyhow::anyhow!("{}: not JSON: {e}", index_path.display()),
                )
            })?;
            let total = v.pointer("/metadata/total_size").and_then(|t| t.as_u64());
            let mut files: Vec<String> = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .map(|m| {
                    m.values()
                        .filter_map(|f| f.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            files.sort();
            files.dedup();
            (true, total, files)
        }
        Err(_) => (false, None, Vec::new()),
    };
    let names: Vec<&String> = present.iter().map(|(n, _, _)| n).collect();
    let (data_bytes, open_error) = match opened {
        Ok(c) => (Some(c.shards.iter().map(|s| s.data_len()).sum()), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let check = ShardCheck {
        index_file,
        index_total_size,
        data_bytes,
        missing_files: listed
            .iter()
            .filter(|f| !names.contains(f))
            .cloned()
            .collect(),
        unlisted_files: if index_file {
            names
                .iter()
                .filter(|n| !listed.contains(n))
                .map(|n| (*n).clone())
                .collect()
        } else {
            Vec::new()
        },
        listed_files: listed,
        file_count: present.len(),
        file_bytes: present.iter().map(|(_, _, s)| s).sum(),
        open_error,
    };
    Ok((check, present.into_iter().map(|(_, p, _)| p).collect()))
}

/// One line of what a drive probe measured: `k3d doctor`'s read rate and `k3d bench`'s drive.
pub(crate) fn probe_line(p: &ProbeResult) -> String {
    format!(
        "{:.3} GB/s ({} {} reads of up to {} B, {} in flight, timed {:.1} s after {:.1} s of \
         warm-up, {})",
        p.rate() / 1e9,
        p.reads,
        p.pattern,
        p.request,
        p.in_flight,
        p.seconds,
        p.warmup_seconds,
        if p.direct { "O_DIRECT" } else { "BUFFERED" }
    )
}

fn model_report(dir: &Path, usable: u64, probe_seconds: f64) -> Result<ModelReport, CliError> {
    let disk = Disk::of(dir).map_err(|e| CliError::new(Exit::Checkpoint, e))?;
    let opened = Checkpoint::open(dir);
    let (shards, files) = check_shards(dir, &opened)?;
    let (probe, probe_error) = match read_probe::measure(
        &files,
        ProbeOptions {
            pattern: Pattern::Random {
                request: read_probe::EXPERT_READ,
            },
            in_flight: DEFAULT_QUEUE_DEPTH,
            // Timed after a warm-up (issue 41.3), as `k3d bench` times its probe.
            warmup: Duration::from_secs_f64(probe_seconds / 2.0),
            duration: Duration::from_secs_f64(probe_seconds),
            policy: DirectPolicy::Prefer,
        },
    ) {
        Ok(p) => (Some(p), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let (advice, advice_error) = match &opened {
        Err(e) => (None, Some(format!("the checkpoint does not open: {e}"))),
        Ok(c) => match Census::from_layout(&c.layout, &c.config, PLANNED_CONTEXT, 0)
            .map_err(advice::AdviceError::from)
            .and_then(|census| advice::advise(&census, usable, probe.as_ref().map(|p| p.rate())))
        {
            Ok(a) => (Some(a), None),
            Err(e) => (None, Some(e.to_string())),
        },
    };
    Ok(ModelReport {
        dir: dir.to_path_buf(),
        disk,
        shards,
        probe,
        probe_error,
        advice,
        advice_error,
        planned_context: PLANNED_CONTEXT,
    })
}

pub fn run(args: Args) -> CliResult {
    if !args.probe_seconds.is_finite() || !(0.1..=60.0).contains(&args.probe_seconds) {
        return Err(CliError::new(
            Exit::Usage,
            anyhow::anyhow!("--probe-seconds must be between 0.1 and 60"),
        ));
    }
    let cpu = Cpu::detect();
    let memory = Memory::detect().map_err(|e| CliError::new(Exit::Failure, e))?;
    let usable = memory.usable();
    let model = match &args.model_dir {
        Some(dir) => Some(model_report(dir, usable, args.probe_seconds)?),
        None => None,
    };
    let report = Checkup {
        cpu,
        memory,
        usable_memory: usable,
        model,
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(anyhow::Error::from)?
        );
    } else {
        print_text(&report);
    }
    // Scripts (and the installer's user) get a failing status for a model that will not load.
    if let Some(m) = &report.model {
        let s = &m.shards;
        if !s.missing_files.is_empty() || s.open_error.is_some() {
            return Err(CliError::new(
                Exit::Checkpoint,
                anyhow::anyhow!(
                    "{}: {} listed shard(s) missing{}",
                    m.dir.display(),
                    s.missing_files.len(),
                    if s.open_error.is_some() {
                        "; the engine refuses the checkpoint (see above)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        // The first hour (docs/running-k3.md): pull → verify → check → doctor → serve.
        if let Some(a) = &m.advice {
            eprintln!(
                "next: k3d serve --model {} --ram-gb {:.1}",
                m.dir.display(),
                a.ram_gb
            );
        }
    }
    Ok(())
}

fn print_text(r: &Checkup) {
    let c = &r.cpu;
    let yes = |b: bool| if b { "yes" } else { "no" };
    println!("machine");
    println!(
        "  cpu         {}",
        c.model.as_deref().unwrap_or("(model name unknown)")
    );
    println!(
        "  cores       {} logical, {} usable by k3d (default --threads)",
        c.logical, c.usable
    );
    println!(
        "  features    avx2 {}, fma {}, avx512f {} -> kernels: {}",
        yes(c.avx2),
        yes(c.fma),
        yes(c.avx512f),
        c.kernels
    );
    if c.kernels == "portable" {
        println!("  !! no AVX2+FMA: the portable kernels are several times slower");
    }
    let m = &r.memory;
    println!(
        "  ram         {} total, {} available",
        gib(m.total),
        gib(m.available)
    );
    match &m.cgroup {
        Some(cg) => println!(
            "  cgroup      v{} limit {} ({}), {} in use -> {} usable",
            cg.version,
            gib(cg.limit),
            cg.limit_file.display(),
            cg.usage.map_or("?".into(), gib),
            gib(r.usable_memory)
        ),
        None => println!("  cgroup      no memory limit"),
    }
    let Some(model) = &r.model else {
        println!(
            "\n(give a model directory to check its files, measure its drive and get a --ram-gb)"
        );
        return;
    };
    println!("\nmodel {}", model.dir.display());
    println!(
        "  disk        {} free of {} on this filesystem",
        gb(model.disk.free),
        gb(model.disk.size)
    );
    let s = &model.shards;
    println!("  shards      {} files, {}", s.file_count, gb(s.file_bytes));
    if s.index_file {
        match (s.index_total_size, s.data_bytes) {
            (Some(t), Some(d)) if t == d => {
                println!("  index       total_size {t} = tensor data of the shards present")
            }
            (Some(t), Some(d)) => println!(
                "  index       total_size {t}, tensor data of the shards present {d} ({} {})",
                gb(t.abs_diff(d)),
                if d < t {
                    "missing (e.g. vision tensors not bound, or shards absent)"
                } else {
                    "more than listed"
                }
            ),
            (None, _) => println!("  index       no metadata.total_size"),
            (Some(t), None) => println!("  index       total_size {t}"),
        }
        println!(
            "  listed      {} shard files in weight_map",
            s.listed_files.len()
        );
        for f in &s.missing_files {
            println!("  !! MISSING  {f} (listed in the index, not present)");
        }
        for f in &s.unlisted_files {
            println!("  !! EXTRA    {f} (present, not in the index)");
        }
    } else {
        println!("  index       no model.safetensors.index.json");
    }
    if let Some(e) = &s.open_error {
        println!("  !! the engine refuses this checkpoint: {e}");
    }
    match (&model.probe, &model.probe_error) {
        (Some(p), _) => {
            println!("  read rate   {}", probe_line(p));
            if !p.direct {
                println!(
                    "  !! read BUFFERED, through the page cache; the figure may be RAM speed, not the drive's:"
                );
                for b in &p.buffered {
                    println!("       {b}");
                }
            }
        }
        (None, Some(e)) => println!("  !! read rate not measured: {e}"),
        (None, None) => {}
    }
    match (&model.advice, &model.advice_error) {
        (Some(a), _) => {
            println!("\nrecommendation");
            println!(
                "  --ram-gb {:.1}   ({} usable minus {} headroom; everything resident needs {})",
                a.ram_gb,
                gib(a.usable_bytes),
                gib(a.headroom_bytes),
                gib(a.max_plan_bytes)
            );
            println!(
                "  plan        {} of {} trunk layers pinned; conversation state for {} tokens",
                a.pinned_layers, a.layers, model.planned_context
            );
            println!(
                "  reads       {} per token (trunk {}, experts {}, lm_head {})",
                gb(a.read_bytes_per_token),
                gb(a.read_trunk_bytes),
                gb(a.read_expert_bytes),
                gb(a.read_lm_head_bytes)
            );
            match a.seconds_per_token {
                Some(t) => println!(
                    "  expect      ~{t:.3} s/token = reads per token / measured read rate, assuming compute overlaps the reads (a floor)"
                ),
                None => println!("  expect      unknown (read rate not measured)"),
            }
        }
        (None, Some(e)) => println!("\n!! no recommendation: {e}"),
        (None, None) => {}
    }
}
