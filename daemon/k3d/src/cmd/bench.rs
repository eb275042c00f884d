//! `k3d bench`: the standard decode benchmark (issue 4 §8).
//!
//! For each `--ram-gb` budget: the memory plan; the drive's own direct-I/O rate for the reads a
//! decoded token issues under that plan ([`read_probe::decode_reads`]: the streamed layers'
//! matrices and routed experts, in the reader pool's request sizes at the engine's queue
//! depth, after a warm-up), measured just before that budget's runs (or `--drive-gbps`); then `--runs` greedy generations of the fixed
//! prompt [`PROMPT`], each in **its own child process** (`k3d bench --child`), so every run starts
//! with a fresh process (peak RSS is that run's alone) and, with `--cgroup`, a dropped page cache
//! and its own cgroup v1 memory limit. Reported per budget, as medians over the runs: decode
//! s/token and prefill seconds separately, bytes read per decoded token by class against the
//! plan's prediction, the achieved read rate (window bytes ÷ the reader pool's busy time) as a
//! fraction of the probe's, the I/O–compute overlap, peak RSS against the budget.
//!
//! Prefill (issue 30.4) is reported against two limits measured in the same child process: the
//! expert bytes it read against the **union** of experts its tokens routed to (the store's
//! expert trace; reading each needed expert once is the floor without a warm cache), and its
//! arithmetic rate against the machine's f32 GEMM rate (weight products run in f32, spec §6.1
//! rule 2), and beside it the f64 rate, measured by [`k3_engine::system::gemm_probe`] (a
//! BLAS-style register-blocked SGEMM and DGEMM on the same compute threads, each for
//! `--gemm-seconds` just before the prefill). Prefill FLOPs are counted from the
//! checkpoint's census ([`Work`]). `--prompt-tokens` takes long prompts: a prompt longer
//! than a chunk runs as layer-major passes of up to the plan's `prefill_tokens`
//! (`--prefill-tokens`), each reading every weight once.
//!
//! Decode (issue 31) is reported against its **floor** from limits measured in the same run
//! ([`summary::DecodeFloor`]): the memory read bandwidth ([`stream_probe`], measured by this
//! process on the runs' thread count just after the drive probe), the f32 FMA rate (spec §6.1
//! rule 2: a weight product is one f32 fused multiply-add; [`summary::FmaRate`]) and the drive
//! probe: a token must read its weights once and stream what the plan streams, so
//! `floor = max(trunk+head and routed experts at memory or FMA speed, bytes read ÷ drive rate)`,
//! and `floor ÷ s/token` says how close decode is to the machine's limit. A run faster than its
//! floor is flagged, not printed as a ratio above 1: one of the probes measured too low
//! (issue 41.3).
//!
//! Greedy decoding is exact at every budget (spec §6), so every run of every budget must
//! generate the same ids: a difference is reported and fails the command (exit 4).

mod cgroup;
mod summary;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, anyhow};
use k3_engine::checkpoint::Checkpoint;
use k3_engine::engine::measure::{Measured, PhaseCost, measure};
use k3_engine::engine::{Engine, EngineOptions, PREFILL_CHUNK};
use k3_engine::plan::{Census, GIB, PackPlan, Plan, StateShape, StreamScheme};
use k3_engine::store::direct_io::DirectPolicy;
use k3_engine::store::expert_cache::{PolicyKind, replay, replay_per_layer};
use k3_engine::store::reader::DEFAULT_QUEUE_DEPTH;
use k3_engine::system::ProcessMemory;
use k3_engine::system::read_probe::{self, Pattern, ProbeOptions, ProbeResult};
use k3_engine::system::stream_probe::{self, StreamProbe};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::budget::{BudgetArgs, PlanArgs};
use crate::exit::{CliError, CliResult, Exit};
use summary::{
    BudgetResult, DecodeFloor, DriveRate, PrefillFigures, bytes, per_token, print_table,
};

/// The benchmark prompt's first eight ids, valid in every `k3d synth` vocabulary (≥ 512 ids)
/// and in K3's. `--prompt-tokens K` truncates or extends it ([`prompt`]).
pub const PROMPT: [u32; 8] = [100, 200, 300, 400, 50, 150, 250, 350];

/// Ids a long bench prompt draws from: every `k3d synth` vocabulary holds them.
const PROMPT_VOCAB: u64 = 512;

/// The bench's prompt of `k` tokens: [`PROMPT`], then a fixed pseudo-random sequence of ids
/// below [`PROMPT_VOCAB`] (a 64-bit LCG, Knuth's MMIX constants), so a long prompt routes like
/// varied text rather than one eight-id cycle, and is the same in every run and build.
pub fn prompt(k: usize) -> Vec<u32> {
    let mut x: u64 = 0x6b33_6265_6e63_6821;
    let tail = std::iter::from_fn(|| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        Some(((x >> 33) % PROMPT_VOCAB) as u32)
    });
    PROMPT.iter().copied().chain(tail).take(k).collect()
}

/// The longest `--prompt-tokens`: long enough for an agent's first request; the plan's context
/// must also hold it (the child refuses a prompt it cannot).
pub const MAX_PROMPT_TOKENS: usize = 65_536;

/// The work of a token, from the checkpoint's census: every trunk matrix of every layer, the
/// `top_k` routed experts of each MoE layer (an MXFP4 expert's bytes are 17 per 32 elements:
/// 16 of nibbles, one scale) and, for the last position, the `lm_head`.
///
/// Prefill FLOPs are 2 per weight element each prompt token multiplies by, plus the last
/// position's head; attention's score and value products (which grow with the prompt) are not
/// counted, so the figure slightly undercounts a long prompt. A decoded token reads each of
/// these weights once ([`summary::DecodeFloor`] sets them against the memory and FMA rates).
#[derive(Clone, Copy)]
struct Work {
    /// BF16 bytes of the trunk's matrices.
    trunk_bytes: u64,
    /// BF16 bytes of the LM head.
    head_bytes: u64,
    /// One routed expert's bytes.
    expert_bytes: u64,
    /// MXFP4 bytes of the experts one token routes to (`top_k` per MoE layer).
    routed_bytes: u64,
}

/// Weight elements in `bytes` of MXFP4 (17 bytes per 32 elements).
fn mxfp4_elements(bytes: u64) -> f64 {
    bytes as f64 * 32.0 / 17.0
}

impl Work {
    fn of(census: &Census) -> Self {
        Work {
            trunk_bytes: census.trunk_matrix_bytes.iter().sum(),
            head_bytes: census.lm_head_bytes,
            expert_bytes: census.expert_bytes,
            routed_bytes: (census.moe_layers * census.top_k) as u64 * census.expert_bytes,
        }
    }

    /// FLOPs of a prefill of `tokens`.
    fn flops(&self, tokens: usize) -> f64 {
        let per_token = 2.0 * (self.trunk_bytes as f64 / 2.0 + mxfp4_elements(self.routed_bytes));
        tokens as f64 * per_token + self.head_bytes as f64
    }
}

/// What `--cgroup` adds to each child's limit beyond its budget, for what the plan does not
/// count: the binary and its libraries, thread stacks (compute and 8 reader threads), the
/// allocator's slack and the tokenizer. Session 1 measured 153 MB peak RSS at small's 91 MB
/// minimum plan, i.e. ~62 MB outside the plan; 256 MiB leaves room for page-cache charges of
/// the shard headers and config files the child reads buffered.
pub const DEFAULT_CGROUP_OVERHEAD_MIB: u64 = 256;

#[derive(clap::Args)]
pub struct Args {
    /// The checkpoint directory.
    model_dir: PathBuf,
    /// Budgets to measure, comma-separated, each GiB (fractional allowed) or a preset name.
    /// `--trunk-gb`, `--cache-gb`, `--no-lookahead` and `--dense-lookahead` apply to every one.
    #[arg(
        long,
        value_delimiter = ',',
        required = true,
        value_name = "GIB|PRESET,..."
    )]
    ram_gb: Vec<String>,
    /// Decoded tokens measured per run (each needs its own forward pass; one more token is
    /// generated, from the prompt's logits).
    #[arg(long, default_value_t = 8)]
    tokens: usize,
    /// Prompt length K (1 to 65,536). Up to a chunk (32) prefill is one forward of K tokens,
    /// priced like a speculative step verifying K − 1 drafts (issue 16 item 4); longer, it runs
    /// as layer-major passes of up to the plan's prefill tokens (issue 30), and the report sets
    /// its expert bytes against the union its tokens route to and its GFLOP/s against the GEMM
    /// probe.
    #[arg(long, default_value_t = PROMPT.len())]
    prompt_tokens: usize,
    /// Seconds of the f64 GEMM probe each run measures on its compute threads just before its
    /// prefill (the yardstick of the prefill's GFLOP/s).
    #[arg(long, default_value_t = 2.0)]
    gemm_seconds: f64,
    /// Runs per budget; figures are medians over them.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Print one JSON document on stdout (progress stays on stderr).
    #[arg(long)]
    json: bool,
    /// Compute threads of each run (default: all cores).
    #[arg(long, value_parser = super::threads)]
    threads: Option<usize>,
    /// Plan overrides, applied to every budget (plan experiments).
    #[command(flatten)]
    plan: PlanArgs,
    /// Whole-layer trunk ring slots (default 2), for every budget (plan experiments: a deeper
    /// ring prefetches further ahead but pins less at the same budget).
    #[arg(long, value_name = "N")]
    ring_slots: Option<usize>,
    /// Chunk-stream buffer size, MiB (default 32; the plan may shrink it for a small model),
    /// for every budget (plan experiments, with `--read-ahead-gb`).
    #[arg(long, value_name = "MIB", conflicts_with = "ring_slots")]
    chunk_mib: Option<u64>,
    /// The expert cache's eviction policy in every run: `lfu-aging` (the default; counts
    /// halving every 8 × slots requests) or `lru`. Output does not depend on it.
    #[arg(long, value_name = "POLICY", default_value = "lfu-aging")]
    cache_policy: PolicyKind,
    /// Run each child in its own cgroup v1 memory group limited to budget + overhead, after
    /// dropping the page cache (needs root and cgroup v1).
    #[arg(long)]
    cgroup: bool,
    /// MiB added to each child's cgroup limit beyond its budget.
    #[arg(long, default_value_t = DEFAULT_CGROUP_OVERHEAD_MIB)]
    cgroup_overhead_mib: u64,
    /// Replay each run's routed-expert trace through LRU and LFU-aging caches of these slot
    /// counts (comma-separated) and report the bytes each avoids.
    #[arg(long, value_delimiter = ',', value_name = "SLOTS,...")]
    policy_slots: Vec<usize>,
    /// Seconds of the drive probe (timed after a warm-up of half as long), and then of the
    /// memory probe (a stream read on the runs' compute threads), before each budget.
    #[arg(long, default_value_t = 3.0)]
    probe_seconds: f64,
    /// The drive's read rate, GB/s, for the decode floor instead of probing it before each
    /// budget (a figure measured elsewhere, e.g. by fio or an earlier run).
    #[arg(long, value_name = "GB/S")]
    drive_gbps: Option<f64>,
    /// Internal: measure one run of the first budget in this process, print one JSON line.
    #[arg(long, hide = true)]
    child: bool,
    /// Internal: the cgroup the child joins before loading anything.
    #[arg(long, hide = true)]
    join_cgroup: Option<PathBuf>,
}

/// One child's report.
#[derive(Serialize, Deserialize)]
struct ChildReport {
    plan: serde_json::Value,
    generated: Vec<u32>,
    prefill: PhaseFigures,
    decode: PhaseFigures,
    peak_rss_bytes: u64,
    threads: usize,
    /// With `--policy-slots`: the trace replayed at each size and policy.
    policies: Vec<PolicyReplay>,
    /// Distinct (layer, expert) pairs the prefill's routing asked for.
    prefill_experts: u64,
    /// The f64 GEMM probe measured in the same process just before the prefill.
    gemm: GemmRate,
    /// The f32 GEMM probe, likewise: the prefill's yardstick.
    gemm_f32: GemmRate,
}

/// [`k3_engine::system::gemm_probe::GemmProbe`] on the wire between child and parent.
#[derive(Serialize, Deserialize, Clone)]
struct GemmRate {
    flops_per_second: f64,
    isa: String,
    shape: [usize; 3],
    threads: usize,
}

impl GemmRate {
    fn of(p: &k3_engine::system::gemm_probe::GemmProbe) -> Self {
        GemmRate {
            flops_per_second: p.flops_per_second,
            isa: p.isa.to_string(),
            shape: p.shape,
            threads: p.threads,
        }
    }
}

/// Expert bytes one cache size and policy reads and avoids over a run's trace.
#[derive(Serialize, Deserialize, Clone)]
struct PolicyReplay {
    slots: usize,
    policy: String,
    requests: u64,
    bytes_read: u64,
    bytes_avoided: u64,
}

/// [`PhaseCost`] on the wire between child and parent.
#[derive(Serialize, Deserialize, Clone, Copy)]
struct PhaseFigures {
    tokens: usize,
    seconds: f64,
    trunk_bytes: u64,
    expert_bytes: u64,
    embedding_bytes: u64,
    head_bytes: u64,
    window_bytes: u64,
    lookahead_bytes: u64,
    lookahead_unused_bytes: u64,
    io_wait_seconds: f64,
    read_busy_seconds: f64,
    compute_seconds: f64,
    #[serde(default)]
    pack_bytes: u64,
    #[serde(default)]
    pack_decoded_bytes: u64,
    #[serde(default)]
    pack_decode_seconds: f64,
}

impl From<PhaseCost> for PhaseFigures {
    fn from(p: PhaseCost) -> Self {
        PhaseFigures {
            tokens: p.tokens,
            seconds: p.seconds,
            trunk_bytes: p.trunk_bytes,
            expert_bytes: p.expert_bytes,
            embedding_bytes: p.embedding_bytes,
            head_bytes: p.head_bytes,
            window_bytes: p.window_bytes,
            lookahead_bytes: p.lookahead_bytes,
            lookahead_unused_bytes: p.lookahead_unused_bytes,
            io_wait_seconds: p.io_wait_seconds,
            read_busy_seconds: p.read_busy_seconds,
            compute_seconds: p.compute_seconds,
            pack_bytes: p.pack_bytes,
            pack_decoded_bytes: p.pack_decoded_bytes,
            pack_decode_seconds: p.pack_decode_seconds,
        }
    }
}

impl Args {
    fn budget_args(&self, ram: &str) -> BudgetArgs {
        BudgetArgs::new(ram, &self.plan)
    }

    fn engine_options(&self, ram: &str) -> Result<EngineOptions, CliError> {
        let mut options = EngineOptions {
            model: self.budget_args(ram).load_options()?,
            ..EngineOptions::default()
        };
        if let Some(t) = self.threads {
            options.threads = t;
        }
        options.model.store.record_trace = !self.policy_slots.is_empty();
        options.model.store.cache_policy = self.cache_policy;
        if let Some(slots) = self.ring_slots {
            options.model.plan.scheme = StreamScheme::Ring { slots };
        }
        if let (Some(mib), StreamScheme::Chunks { in_flight, .. }) =
            (self.chunk_mib, options.model.plan.scheme)
        {
            let chunk = mib.checked_mul(1 << 20).filter(|&c| c > 0).ok_or_else(|| {
                CliError::new(Exit::Usage, anyhow!("--chunk-mib {mib}: not a buffer size"))
            })?;
            options.model.plan.scheme = StreamScheme::Chunks { chunk, in_flight };
        }
        Ok(options)
    }
}

pub fn run(args: Args) -> CliResult {
    if args.child {
        return child(&args);
    }
    let usage = |m: String| CliError::new(Exit::Usage, anyhow!(m));
    if args.runs == 0 || args.tokens == 0 {
        return Err(usage("--runs and --tokens must be at least 1".into()));
    }
    if !(1..=MAX_PROMPT_TOKENS).contains(&args.prompt_tokens) {
        return Err(usage(format!(
            "--prompt-tokens must be between 1 and {MAX_PROMPT_TOKENS}"
        )));
    }
    if !args.gemm_seconds.is_finite() || !(0.1..=60.0).contains(&args.gemm_seconds) {
        return Err(usage("--gemm-seconds must be between 0.1 and 60".into()));
    }
    if !args.probe_seconds.is_finite() || !(0.1..=60.0).contains(&args.probe_seconds) {
        return Err(usage("--probe-seconds must be between 0.1 and 60".into()));
    }
    if let Some(g) = args.drive_gbps
        && !(g.is_finite() && g > 0.0)
    {
        return Err(usage(format!("--drive-gbps {g}: not a positive rate")));
    }
    if args.cgroup {
        cgroup::check_available().map_err(|e| CliError::new(Exit::Resources, e))?;
    }
    let checkpoint = Checkpoint::open(&args.model_dir)
        .map_err(|e| CliError::from(k3_engine::engine::EngineError::from(e)))?;
    let files: Vec<PathBuf> = checkpoint.shards.iter().map(|s| s.path.clone()).collect();
    // What a verify step of K fed ids copies besides its forward (spec §5.2).
    let journal_bytes = (args.prompt_tokens <= PREFILL_CHUNK)
        .then(|| StateShape::of(&checkpoint.config).journal_bytes(args.prompt_tokens as u64));
    let census = Census::from_layout(&checkpoint.layout, &checkpoint.config, 0, 0)
        .map_err(|e| CliError::new(Exit::Checkpoint, e))?;
    let work = Work::of(&census);
    // Every plan first: a refused budget fails before anything is measured.
    let mut plans = Vec::new();
    for ram in &args.ram_gb {
        let options = args.engine_options(ram)?;
        // As the child will plan it: a pack's decode buffer reserved (the child's own plan,
        // in its report, says whether it reads the pack).
        let inputs = k3_engine::plan::PlanInputs {
            trunk_pack: options.model.trunk_pack.is_some(),
            ..options.model.plan
        };
        let plan =
            k3_engine::plan::Plan::for_model(&checkpoint.config, &checkpoint.layout, &inputs)
                .map_err(|e| CliError::new(Exit::Resources, anyhow!("--ram-gb {ram}: {e}")))?;
        plans.push(plan);
    }
    let layout = checkpoint.layout;
    let exe = std::env::current_exe().context("locating the k3d binary")?;
    let mut budgets = Vec::new();
    for (ram, plan) in args.ram_gb.iter().zip(&plans) {
        eprintln!("k3d bench: --ram-gb {ram}\n{plan}");
        if args.cgroup {
            cgroup::drop_page_cache()?;
        }
        let drive = match args.drive_gbps {
            Some(gbps) => {
                eprintln!("k3d bench:   drive: {gbps:.3} GB/s (--drive-gbps, not probed)");
                DriveRate::Given(gbps * 1e9)
            }
            None => {
                let probe = drive_probe(&files, &layout, plan, &census, args.probe_seconds)?;
                eprintln!("k3d bench:   drive: {}", super::doctor::probe_line(&probe));
                DriveRate::Probed(probe)
            }
        };
        let threads = args.engine_options(ram)?.threads;
        let stream = stream_probe::measure(threads, Duration::from_secs_f64(args.probe_seconds))
            .context("the memory probe's thread pool")?;
        eprintln!(
            "k3d bench:   memory: {:.2} GB/s stream read ({} passes over {} MiB, {} threads)",
            stream.bytes_per_second / 1e9,
            stream.passes,
            stream.bytes >> 20,
            stream.threads
        );
        let mut runs = Vec::new();
        for r in 0..args.runs {
            let run = one_child(&args, &exe, ram, plan, r)?;
            let pre = PrefillFigures::of(&run.report, &work);
            let floor = DecodeFloor::of(&run.report, &work, &stream, &drive);
            eprintln!(
                "k3d bench:   run {}/{}: {:.3} s/token decode, prefill {:.2} s ({:.1} tokens/s, \
                 experts {:.2}× the union, {:.1} GFLOP/s = {:.2}× the f32 GEMM probe's {:.1}, \
                 {:.2}× the f64 probe's {:.1}), {:.3} GB read per token",
                r + 1,
                args.runs,
                run.report.decode.seconds / run.report.decode.tokens.max(1) as f64,
                run.report.prefill.seconds,
                pre.tokens_per_second,
                pre.read_vs_union,
                pre.compute_gflops,
                pre.compute_vs_f32,
                run.report.gemm_f32.flops_per_second / 1e9,
                pre.compute_vs_f64,
                run.report.gemm.flops_per_second / 1e9,
                per_token(bytes(&run.report.decode), run.report.decode.tokens) / 1e9
            );
            eprintln!("k3d bench:     decode floor: {floor}");
            let d = &run.report.decode;
            if d.pack_bytes > 0 {
                eprintln!(
                    "k3d bench:     trunk pack: {:.3} GB read per token for {:.3} GB of shard bytes \
                     ({:.1} %), decoded at {:.2} GB/s ({:.3} s per token)",
                    per_token(d.pack_bytes, d.tokens) / 1e9,
                    per_token(d.pack_decoded_bytes, d.tokens) / 1e9,
                    100.0 * d.pack_bytes as f64 / d.pack_decoded_bytes.max(1) as f64,
                    d.pack_bytes as f64 / d.pack_decode_seconds.max(1e-9) / 1e9,
                    d.pack_decode_seconds / d.tokens.max(1) as f64
                );
            }
            runs.push(run);
        }
        let mut plan = plan.clone();
        if plan.pack != PackPlan::None
            && let Some(first) = runs.first()
        {
            // Whether the pack is read, and so what a token reads, is decided in the child
            // (it measures the drive and the decoder at load): compare with its plan.
            let field = |name: &str| first.report.plan.get(name).cloned().unwrap_or_default();
            plan.pack = serde_json::from_value(field("pack")).map_err(anyhow::Error::from)?;
            plan.reads = serde_json::from_value(field("reads")).map_err(anyhow::Error::from)?;
            eprintln!("k3d bench:   trunk pack {}", plan.pack);
        }
        budgets.push(BudgetResult {
            ram: ram.clone(),
            plan,
            drive,
            stream,
            runs,
            work,
        });
    }
    let reference = budgets
        .first()
        .and_then(|b| b.runs.first())
        .map(|r| r.report.generated.clone())
        .unwrap_or_default();
    let mismatches: Vec<String> = budgets
        .iter()
        .flat_map(|b| {
            b.runs
                .iter()
                .enumerate()
                .filter(|(_, r)| r.report.generated != reference)
                .map(|(i, r)| {
                    format!(
                        "--ram-gb {} run {}: {:?} (first run: {:?})",
                        b.ram,
                        i + 1,
                        r.report.generated,
                        reference
                    )
                })
        })
        .collect();
    let document = json!({
        "model_dir": args.model_dir,
        "prompt_tokens": args.prompt_tokens,
        "prompt_ids": prompt(args.prompt_tokens),
        "prefill_flops": work.flops(args.prompt_tokens),
        "verify_journal_bytes": journal_bytes,
        "decode_tokens": args.tokens,
        "runs": args.runs,
        "cgroup": args.cgroup,
        "cgroup_overhead_bytes": args.cgroup.then_some(args.cgroup_overhead_mib << 20),
        "generated_ids": reference,
        "ids_identical": mismatches.is_empty(),
        "budgets": budgets.iter().map(BudgetResult::to_json).collect::<Vec<_>>(),
    });
    if args.json {
        println!("{document}");
    } else {
        print_table(&budgets);
    }
    if !mismatches.is_empty() {
        return Err(CliError::new(
            Exit::RunInvalid,
            anyhow!(
                "generated ids differ between runs (greedy output must not depend on the budget):\n  {}",
                mismatches.join("\n  ")
            ),
        ));
    }
    eprintln!(
        "k3d bench: generated ids identical across {} budget(s) × {} run(s)",
        budgets.len(),
        args.runs
    );
    Ok(())
}

/// The drive's rate for the reads a decoded token issues under `plan` (issue 41.3): the
/// streamed layers' matrices and, unless the cache holds every expert, `top_k` experts of each
/// MoE layer, in the reader pool's requests at its queue depth, timed after a warm-up of half
/// the probe's time.
fn drive_probe(
    files: &[PathBuf],
    layout: &k3_engine::checkpoint::layout::ModelLayout,
    plan: &Plan,
    census: &Census,
    seconds: f64,
) -> Result<ProbeResult, CliError> {
    let streamed: Vec<usize> = (0..plan.layer_count)
        .filter(|l| !plan.pinned_layers.contains(l))
        .collect();
    let experts = plan.idle_cache_slots() < census.pool();
    let seed = std::process::id() as u64;
    let runs = read_probe::decode_reads(layout, &streamed, experts, census.top_k, seed);
    read_probe::measure(
        files,
        ProbeOptions {
            pattern: Pattern::Decode(runs),
            in_flight: DEFAULT_QUEUE_DEPTH,
            warmup: Duration::from_secs_f64(seconds / 2.0),
            duration: Duration::from_secs_f64(seconds),
            policy: DirectPolicy::Prefer,
        },
    )
    .map_err(|e| CliError::new(Exit::Failure, anyhow!("drive probe: {e}")))
}

/// One measured run inside this process: the child side of [`one_child`].
fn child(args: &Args) -> CliResult {
    if let Some(dir) = &args.join_cgroup {
        cgroup::join(dir).map_err(|e| CliError::new(Exit::Resources, e))?;
    }
    let ram = args
        .ram_gb
        .first()
        .ok_or_else(|| CliError::new(Exit::Usage, anyhow!("--child needs one --ram-gb")))?;
    let mut options = args.engine_options(ram)?;
    // The union of experts the prefill routes to comes from the trace.
    options.model.store.record_trace = true;
    let engine = Engine::open(&args.model_dir, options, &mut |_| {})?;
    let [probe_f32, probe] = engine.gemm_probes(Duration::from_secs_f64(args.gemm_seconds));
    let measured: Measured = measure(&engine, &prompt(args.prompt_tokens), args.tokens)?;
    let prefill_experts = measured
        .prefill_experts
        .ok_or_else(|| anyhow!("the store did not record the expert trace"))?;
    let policies = replay_policies(&args.model_dir, &engine, &args.policy_slots)?;
    let report = ChildReport {
        plan: serde_json::to_value(engine.model().plan()).map_err(anyhow::Error::from)?,
        generated: measured.generated,
        prefill: measured.prefill.into(),
        decode: measured.decode.into(),
        peak_rss_bytes: ProcessMemory::now().peak_rss,
        threads: engine.options().threads,
        policies,
        prefill_experts,
        gemm: GemmRate::of(&probe),
        gemm_f32: GemmRate::of(&probe_f32),
    };
    println!(
        "{}",
        serde_json::to_string(&report).map_err(anyhow::Error::from)?
    );
    Ok(())
}

/// The run's expert trace through each cache size × {LRU, LFU-aging} (store::expert_cache's
/// replay: the same bookkeeping as the live cache, no buffers).
fn replay_policies(
    dir: &Path,
    engine: &Engine,
    slots: &[usize],
) -> Result<Vec<PolicyReplay>, CliError> {
    if slots.is_empty() {
        return Ok(Vec::new());
    }
    let trace = engine
        .model()
        .expert_trace()
        .ok_or_else(|| anyhow!("the store did not record the expert trace"))?;
    let checkpoint = Checkpoint::open(dir)
        .map_err(|e| CliError::from(k3_engine::engine::EngineError::from(e)))?;
    let expert_bytes = Census::from_layout(&checkpoint.layout, &checkpoint.config, 0, 0)
        .map_err(|e| CliError::new(Exit::Checkpoint, e))?
        .expert_bytes;
    let mut out = Vec::new();
    for &n in slots {
        for policy in [PolicyKind::Lru, PolicyKind::LfuAging { period: 0 }] {
            // One cache shared by every layer (what the store builds), then the same slots
            // split evenly per MoE layer.
            let shared = replay(&trace, expert_bytes, n.max(1), policy);
            let per_layer = replay_per_layer(&trace, expert_bytes, n.max(1), policy);
            for (c, suffix) in [(shared, ""), (per_layer, "/layer")] {
                out.push(PolicyReplay {
                    slots: n,
                    policy: format!("{}{suffix}", policy.build(1).name()),
                    requests: c.requests,
                    bytes_read: c.bytes_read,
                    bytes_avoided: c.bytes_avoided,
                });
            }
        }
    }
    Ok(out)
}

struct RunResult {
    report: ChildReport,
    /// With `--cgroup`: the group's peak charge and how often it hit the limit.
    cgroup_peak_bytes: Option<u64>,
    cgroup_failcnt: Option<u64>,
}

/// Runs one child for budget `ram`, in a fresh memory group with `--cgroup`.
fn one_child(
    args: &Args,
    exe: &Path,
    ram: &str,
    plan: &Plan,
    index: usize,
) -> Result<RunResult, CliError> {
    let group = if args.cgroup {
        cgroup::drop_page_cache()?;
        let limit = plan.budget + (args.cgroup_overhead_mib << 20);
        let name = format!("k3d-bench-{}-{index}", std::process::id());
        Some(
            cgroup::MemoryGroup::create(&name, limit)
                .map_err(|e| CliError::new(Exit::Resources, e))?,
        )
    } else {
        None
    };
    let mut cmd = Command::new(exe);
    cmd.arg("bench")
        .arg(&args.model_dir)
        .args(["--child", "--ram-gb", ram, "--tokens"])
        .arg(args.tokens.to_string())
        .arg("--prompt-tokens")
        .arg(args.prompt_tokens.to_string())
        .arg("--gemm-seconds")
        .arg(args.gemm_seconds.to_string());
    if let Some(t) = args.threads {
        cmd.args(["--threads", &t.to_string()]);
    }
    cmd.args(args.plan.to_args());
    if let Some(n) = args.ring_slots {
        cmd.args(["--ring-slots", &n.to_string()]);
    }
    if let Some(m) = args.chunk_mib {
        cmd.args(["--chunk-mib", &m.to_string()]);
    }
    cmd.args(["--cache-policy", args.cache_policy.name()]);
    if !args.policy_slots.is_empty() {
        let list: Vec<String> = args.policy_slots.iter().map(|n| n.to_string()).collect();
        cmd.args(["--policy-slots", &list.join(",")]);
    }
    if let Some(g) = &group {
        cmd.arg("--join-cgroup").arg(g.dir());
    }
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("starting a benchmark child")?;
    if !out.status.success() {
        let killed = group
            .as_ref()
            .and_then(|g| g.failcnt().ok())
            .filter(|&f| f > 0)
            .map(|f| {
                format!(
                    " (its cgroup hit the limit {f} times: the budget plus overhead was exceeded)"
                )
            })
            .unwrap_or_default();
        return Err(CliError::new(
            Exit::RunInvalid,
            anyhow!(
                "--ram-gb {ram} run {}: the child failed with {}{killed}",
                index + 1,
                out.status
            ),
        ));
    }
    let report: ChildReport = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("--ram-gb {ram}: the child's report is not the expected JSON"))?;
    let (cgroup_peak_bytes, cgroup_failcnt) = match &group {
        Some(g) => (Some(g.max_usage()?), Some(g.failcnt()?)),
        None => (None, None),
    };
    Ok(RunResult {
        report,
        cgroup_peak_bytes,
        cgroup_failcnt,
    })
}
