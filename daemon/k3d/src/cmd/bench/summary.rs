//! What `k3d bench` makes of its runs: per budget the medians, the bytes per token against the
//! plan, prefill against the GEMM rate, and the JSON document and table it prints.

use super::*;

pub(super) struct BudgetResult {
    pub(super) ram: String,
    pub(super) plan: Plan,
    pub(super) drive: DriveRate,
    /// The memory probe measured just before this budget's runs.
    pub(super) stream: StreamProbe,
    pub(super) runs: Vec<RunResult>,
    pub(super) work: Work,
}

/// One run's prefill against its limits (issue 30.4).
pub(super) struct PrefillFigures {
    pub(super) tokens_per_second: f64,
    /// Bytes of the experts the prompt's tokens routed to, each once.
    pub(super) union_bytes: f64,
    /// Expert bytes read (routed, excluding unconfirmed lookahead guesses) ÷ the union.
    pub(super) read_vs_union: f64,
    /// FLOPs ÷ the time not waiting for reads, and ÷ the wall time.
    pub(super) compute_gflops: f64,
    pub(super) wall_gflops: f64,
    /// The two against the f32 GEMM probe of the same run (weight products run in f32), and
    /// the compute rate against the f64 probe.
    pub(super) compute_vs_f32: f64,
    pub(super) wall_vs_f32: f64,
    pub(super) compute_vs_f64: f64,
}

impl PrefillFigures {
    pub(super) fn of(r: &ChildReport, work: &Work) -> Self {
        let p = &r.prefill;
        let flops = work.flops(p.tokens);
        let rate = |seconds: f64| if seconds > 0.0 { flops / seconds } else { 0.0 };
        let union_bytes = (r.prefill_experts * work.expert_bytes) as f64;
        let routed = (p.expert_bytes - p.lookahead_unused_bytes) as f64;
        let vs = |x: f64, gemm: &GemmRate| {
            let g = gemm.flops_per_second;
            if g > 0.0 { x / g } else { 0.0 }
        };
        PrefillFigures {
            tokens_per_second: if p.seconds > 0.0 {
                p.tokens as f64 / p.seconds
            } else {
                0.0
            },
            union_bytes,
            read_vs_union: if union_bytes > 0.0 {
                routed / union_bytes
            } else {
                0.0
            },
            compute_gflops: rate(p.compute_seconds) / 1e9,
            wall_gflops: rate(p.seconds) / 1e9,
            compute_vs_f32: vs(rate(p.compute_seconds), &r.gemm_f32),
            wall_vs_f32: vs(rate(p.seconds), &r.gemm_f32),
            compute_vs_f64: vs(rate(p.compute_seconds), &r.gemm),
        }
    }
}

/// The drive's rate the decode floor divides by: probed before the budget's runs, or given
/// (`--drive-gbps`).
pub(super) enum DriveRate {
    Probed(ProbeResult),
    /// Bytes per second.
    Given(f64),
}

impl DriveRate {
    /// Bytes per second.
    pub(super) fn rate(&self) -> f64 {
        match self {
            DriveRate::Probed(p) => p.rate(),
            DriveRate::Given(r) => *r,
        }
    }

    fn to_json(&self) -> serde_json::Value {
        match self {
            DriveRate::Probed(p) => json!({
                "read_gbps": p.rate() / 1e9,
                "pattern": p.pattern,
                "request_bytes": p.request,
                "in_flight": p.in_flight,
                "direct": p.direct,
                "reads": p.reads,
                "seconds": p.seconds,
                "warmup_seconds": p.warmup_seconds,
            }),
            DriveRate::Given(r) => json!({ "read_gbps": r / 1e9, "given": true }),
        }
    }
}

/// The per-weight compute bound's rate: one f32 fused multiply-add per weight (spec §6.1 rule
/// 2), at an f32 GEMM probe's rate ÷ 2 — or, where the run measured none, the f64 probe's,
/// which the floor then names (an f64 FMA is at most as fast, so that bound is the higher one:
/// a run beating it flags the stand-in).
#[derive(Clone, Copy)]
pub(super) struct FmaRate {
    /// Weight FMAs per second.
    pub(super) per_second: f64,
    /// The probe it came from: `f32` (weight products are f32 FMAs, spec §6.1 rule 2).
    pub(super) probe: &'static str,
}

impl FmaRate {
    /// From the f32 GEMM probe's rate (two FLOPs per FMA).
    pub(super) fn of(f32_probe: &GemmRate) -> Self {
        FmaRate {
            per_second: f32_probe.flops_per_second / 2.0,
            probe: "f32",
        }
    }

    /// GFLOP/s of the probe it came from.
    pub(super) fn f32_gflops(&self) -> f64 {
        2.0 * self.per_second / 1e9
    }
}

/// One run's decode against the least time a token can take on this machine (issue 31), from
/// limits measured in the same run: a token's compute reads every trunk matrix, the head and
/// its routed experts once, from RAM at best at the memory probe's rate, and spends at least
/// one f32 multiply-add per weight ([`FmaRate`]); what the plan streams arrives at best at the
/// drive's rate ([`DriveRate`]), and streaming overlaps compute. So the floor is
/// `max(Σ_class max(bytes ÷ stream, weights ÷ FMA rate), bytes read ÷ drive rate)`. A run
/// faster than its floor ([`DecodeFloor::beaten`]) shows a probe measured too low, not a
/// decode beyond the machine's limit (issue 41.3).
pub(super) struct DecodeFloor {
    pub(super) seconds_per_token: f64,
    /// The floor, seconds per token.
    pub(super) floor: f64,
    /// Its compute part: BF16 (trunk + head) and MXFP4 (routed experts), each the slower of
    /// memory and arithmetic.
    pub(super) compute: f64,
    pub(super) bf16: f64,
    pub(super) mxfp4: f64,
    /// Bytes the compute reads per token, and the drive part: bytes read ÷ the drive's rate.
    pub(super) touched_bytes: f64,
    pub(super) drive: f64,
    /// floor ÷ seconds per token: 1 at the limit; above 1 when the run beat the floor.
    pub(super) of_limit: f64,
    stream_gbps: f64,
    drive_gbps: f64,
    fma: FmaRate,
}

impl DecodeFloor {
    pub(super) fn of(
        r: &ChildReport,
        work: &Work,
        stream: &StreamProbe,
        drive: &DriveRate,
    ) -> Self {
        let d = &r.decode;
        let seconds_per_token = d.seconds / d.tokens.max(1) as f64;
        let fma_rate = FmaRate::of(&r.gemm_f32);
        let fma = fma_rate.per_second;
        let over = |amount: f64, rate: f64| if rate > 0.0 { amount / rate } else { 0.0 };
        let bf16_bytes = (work.trunk_bytes + work.head_bytes) as f64;
        let bf16 = over(bf16_bytes, stream.bytes_per_second).max(over(bf16_bytes / 2.0, fma));
        let mxfp4_bytes = work.routed_bytes as f64;
        let mxfp4 = over(mxfp4_bytes, stream.bytes_per_second)
            .max(over(mxfp4_elements(work.routed_bytes), fma));
        let compute = bf16 + mxfp4;
        let drive_part = over(per_token(routed_bytes(d), d.tokens), drive.rate());
        let floor = compute.max(drive_part);
        DecodeFloor {
            seconds_per_token,
            floor,
            compute,
            bf16,
            mxfp4,
            touched_bytes: bf16_bytes + mxfp4_bytes,
            drive: drive_part,
            of_limit: over(floor, seconds_per_token),
            stream_gbps: stream.bytes_per_second / 1e9,
            drive_gbps: drive.rate() / 1e9,
            fma: fma_rate,
        }
    }

    /// The run took less than its floor: a probe (drive, memory or FMA) measured below what
    /// decode got, so this floor is no floor.
    pub(super) fn beaten(&self) -> bool {
        self.floor > self.seconds_per_token
    }

    /// Which limit the floor is: the drive's, or the compute's (memory or arithmetic).
    pub(super) fn bound(&self) -> &'static str {
        if self.drive > self.compute {
            "drive"
        } else {
            "memory/FMA"
        }
    }
}

impl std::fmt::Display for DecodeFloor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.beaten() {
            write!(
                f,
                "BEATS ITS FLOOR: probe too low ({:.3} s/token, under the {} floor's {:.3} s: \
                 the {} probe measured less than decode got) — ",
                self.seconds_per_token,
                self.bound(),
                self.floor,
                self.bound()
            )?;
        } else {
            write!(
                f,
                "{:.3} s/token = {:.2}× the floor's {:.3} s ",
                self.seconds_per_token,
                if self.floor > 0.0 {
                    self.seconds_per_token / self.floor
                } else {
                    0.0
                },
                self.floor
            )?;
        }
        write!(
            f,
            "({} bound: compute {:.3} s = BF16 {:.3} + MXFP4 {:.3} for {:.3} GB at {:.2} GB/s \
             stream or one {} FMA a weight at {:.1} G/s; drive {:.3} s at {:.3} GB/s)",
            self.bound(),
            self.compute,
            self.bf16,
            self.mxfp4,
            self.touched_bytes / 1e9,
            self.stream_gbps,
            self.fma.probe,
            self.fma.per_second / 1e9,
            self.drive,
            self.drive_gbps
        )
    }
}

pub(super) fn bytes(p: &PhaseFigures) -> u64 {
    p.trunk_bytes + p.expert_bytes + p.embedding_bytes + p.head_bytes
}

/// What the plan predicts: every byte read except guesses of the routing lookahead that the
/// routing did not confirm (the plan counts routed experts; wrong guesses are reported apart).
pub(super) fn routed_bytes(p: &PhaseFigures) -> u64 {
    bytes(p) - p.lookahead_unused_bytes
}

pub(super) fn per_token(total: u64, tokens: usize) -> f64 {
    total as f64 / tokens.max(1) as f64
}

/// Median of `values` (the mean of the middle two for an even count); 0 for none.
pub(super) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The decode figures of one run, per decoded token.
struct Derived {
    seconds_per_token: f64,
    io_seconds_per_token: f64,
    io_wait_seconds_per_token: f64,
    compute_seconds_per_token: f64,
    /// wall ÷ max(io, compute): 1 when reads hide entirely under compute (or vice versa).
    overlap_ratio: f64,
    /// wall ÷ (io + compute): 1 when nothing overlaps.
    serial_ratio: f64,
    read_gbps: f64,
    bytes_per_token: f64,
}

impl Derived {
    pub(super) fn of(d: &PhaseFigures) -> Self {
        let t = d.tokens.max(1) as f64;
        let (wall, io, compute) = (d.seconds, d.read_busy_seconds, d.compute_seconds);
        let ratio = |den: f64| if den > 0.0 { wall / den } else { 0.0 };
        Derived {
            seconds_per_token: wall / t,
            io_seconds_per_token: io / t,
            io_wait_seconds_per_token: d.io_wait_seconds / t,
            compute_seconds_per_token: compute / t,
            overlap_ratio: ratio(io.max(compute)),
            serial_ratio: ratio(io + compute),
            read_gbps: if io > 0.0 {
                d.window_bytes as f64 / io / 1e9
            } else {
                0.0
            },
            bytes_per_token: bytes(d) as f64 / t,
        }
    }
}

impl BudgetResult {
    fn med(&self, f: impl Fn(&RunResult) -> f64) -> f64 {
        median(self.runs.iter().map(f).collect())
    }

    fn derived_median(&self, f: impl Fn(&Derived) -> f64) -> f64 {
        self.med(|r| f(&Derived::of(&r.report.decode)))
    }

    fn prefill_median(&self, f: impl Fn(&PrefillFigures) -> f64) -> f64 {
        self.med(|r| f(&PrefillFigures::of(&r.report, &self.work)))
    }

    fn floors(&self) -> impl Iterator<Item = DecodeFloor> + '_ {
        self.runs
            .iter()
            .map(|r| DecodeFloor::of(&r.report, &self.work, &self.stream, &self.drive))
    }

    fn floor_median(&self, f: impl Fn(&DecodeFloor) -> f64) -> f64 {
        median(self.floors().map(|x| f(&x)).collect())
    }

    /// Runs faster than their floor (a probe measured too low).
    pub(super) fn beaten_runs(&self) -> usize {
        self.floors().filter(DecodeFloor::beaten).count()
    }

    fn decode_floor_json(&self) -> serde_json::Value {
        let beaten = self.beaten_runs();
        let fma = self.runs.first().map(|r| FmaRate::of(&r.report.gemm_f32));
        json!({
            "seconds_per_token": self.floor_median(|f| f.floor),
            // Not a ratio when a run beat its floor: the floor is wrong then, not decode.
            "of_limit": (beaten == 0).then(|| self.floor_median(|f| f.of_limit)),
            "beaten_runs": beaten,
            "probe_too_low": (beaten > 0).then(|| self.floors().find(DecodeFloor::beaten)
                .map(|f| f.bound())),
            "fma_probe": fma.map(|f| f.probe),
            "f32_gflops": fma.map(|f| f.f32_gflops()),
            "fma_per_second": self.med(|r| FmaRate::of(&r.report.gemm_f32).per_second),
            "compute_seconds": self.floor_median(|f| f.compute),
            "bf16_seconds": self.floor_median(|f| f.bf16),
            "mxfp4_seconds": self.floor_median(|f| f.mxfp4),
            "drive_seconds": self.floor_median(|f| f.drive),
            "touched_bytes": self.floor_median(|f| f.touched_bytes),
            "memory_probe": &self.stream,
        })
    }

    fn prefill_json(&self) -> serde_json::Value {
        json!({
            "tokens_per_second": self.prefill_median(|p| p.tokens_per_second),
            "expert_bytes": self.med(|r| (r.report.prefill.expert_bytes
                - r.report.prefill.lookahead_unused_bytes) as f64),
            "union_bytes": self.prefill_median(|p| p.union_bytes),
            "read_vs_union": self.prefill_median(|p| p.read_vs_union),
            "compute_gflops": self.prefill_median(|p| p.compute_gflops),
            "wall_gflops": self.prefill_median(|p| p.wall_gflops),
            "gemm_f32_gflops": self.med(|r| r.report.gemm_f32.flops_per_second / 1e9),
            "gemm_gflops": self.med(|r| r.report.gemm.flops_per_second / 1e9),
            "compute_vs_f32": self.prefill_median(|p| p.compute_vs_f32),
            "wall_vs_f32": self.prefill_median(|p| p.wall_vs_f32),
            "compute_vs_f64": self.prefill_median(|p| p.compute_vs_f64),
            "gemm_f32_probe": self.runs.first().map(|r| &r.report.gemm_f32),
            "gemm_probe": self.runs.first().map(|r| &r.report.gemm),
        })
    }

    /// Decode bytes of class `f` per token in the first run, and whether every run read exactly
    /// the plan's prediction for every decoded token.
    fn class(&self, f: impl Fn(&PhaseFigures) -> u64, predicted: u64) -> serde_json::Value {
        let measured: Vec<f64> = self
            .runs
            .iter()
            .map(|r| per_token(f(&r.report.decode), r.report.decode.tokens))
            .collect();
        let exact = self
            .runs
            .iter()
            .all(|r| f(&r.report.decode) == predicted * r.report.decode.tokens as u64);
        json!({
            "measured": median(measured),
            "predicted": predicted,
            "equal": exact,
        })
    }

    pub(super) fn to_json(&self) -> serde_json::Value {
        let p = &self.plan;
        let device = self.drive.rate() / 1e9;
        let read_gbps = self.derived_median(|d| d.read_gbps);
        let peak = self.med(|r| r.report.peak_rss_bytes as f64);
        json!({
            "ram_gb": self.ram,
            "plan": p,
            "plan_text": p.to_string(),
            "device": self.drive.to_json(),
            "median": {
                "decode_seconds_per_token": self.derived_median(|d| d.seconds_per_token),
                "prefill_seconds": self.med(|r| r.report.prefill.seconds),
                "prefill_bytes": self.med(|r| bytes(&r.report.prefill) as f64),
                "io_seconds_per_token": self.derived_median(|d| d.io_seconds_per_token),
                "io_wait_seconds_per_token": self.derived_median(|d| d.io_wait_seconds_per_token),
                "compute_seconds_per_token": self.derived_median(|d| d.compute_seconds_per_token),
                "overlap_ratio": self.derived_median(|d| d.overlap_ratio),
                "serial_ratio": self.derived_median(|d| d.serial_ratio),
                "read_gbps": read_gbps,
                "read_vs_device": if device > 0.0 { read_gbps / device } else { 0.0 },
                "bytes_per_token": self.derived_median(|d| d.bytes_per_token),
                "peak_rss_bytes": peak,
                "peak_rss_vs_budget": peak / p.budget as f64,
                "cgroup_peak_bytes": self.runs.iter().all(|r| r.cgroup_peak_bytes.is_some())
                    .then(|| self.med(|r| r.cgroup_peak_bytes.unwrap_or(0) as f64)),
            },
            "prefill": self.prefill_json(),
            "decode_floor": self.decode_floor_json(),
            "bytes_per_token": {
                "trunk": self.class(|d| d.trunk_bytes, p.reads.trunk),
                "experts": self.class(
                    |d| d.expert_bytes - d.lookahead_unused_bytes,
                    p.reads.experts
                ),
                "embedding": self.class(|d| d.embedding_bytes, p.reads.embedding),
                "head": self.class(|d| d.head_bytes, p.reads.lm_head),
                "total": self.class(routed_bytes, p.reads.total()),
                "lookahead_read": self.med(|r| per_token(
                    r.report.decode.lookahead_bytes, r.report.decode.tokens)),
                "lookahead_unused": self.med(|r| per_token(
                    r.report.decode.lookahead_unused_bytes, r.report.decode.tokens)),
            },
            "runs": self.runs.iter().map(|r| json!({
                "prefill": r.report.prefill,
                "decode": r.report.decode,
                "generated_ids": r.report.generated,
                "peak_rss_bytes": r.report.peak_rss_bytes,
                "threads": r.report.threads,
                "cgroup_peak_bytes": r.cgroup_peak_bytes,
                "cgroup_failcnt": r.cgroup_failcnt,
                "policies": r.report.policies,
                "prefill_experts": r.report.prefill_experts,
                "gemm": r.report.gemm,
                "gemm_f32": r.report.gemm_f32,
            })).collect::<Vec<_>>(),
        })
    }
}

pub(super) fn print_table(budgets: &[BudgetResult]) {
    println!(
        "{:>10} {:>7} {:>9} {:>9} {:>9} {:>8} {:>7} {:>8} {:>7} {:>7} {:>7} {:>9} {:>5}",
        "budget",
        "pinned",
        "s/token",
        "prefill",
        "GB/token",
        "plan",
        "unused",
        "GB/s",
        "device",
        "ratio",
        "overlap",
        "peak RSS",
        "=plan"
    );
    for b in budgets {
        let device = b.drive.rate() / 1e9;
        let gbps = b.derived_median(|d| d.read_gbps);
        let total = b.class(routed_bytes, b.plan.reads.total());
        println!(
            "{:>10} {:>7} {:>9.3} {:>9.2} {:>9.3} {:>8.3} {:>7.3} {:>8.2} {:>7.2} {:>6.0}% {:>7.2} {:>8.2}G {:>5}",
            format!("{:.2}G", b.plan.budget as f64 / GIB as f64),
            format!("{}/{}", b.plan.pinned_layers.len(), b.plan.layer_count),
            b.derived_median(|d| d.seconds_per_token),
            b.med(|r| r.report.prefill.seconds),
            b.derived_median(|d| d.bytes_per_token) / 1e9,
            b.plan.reads.total() as f64 / 1e9,
            b.med(|r| per_token(
                r.report.decode.lookahead_unused_bytes,
                r.report.decode.tokens
            )) / 1e9,
            gbps,
            device,
            if device > 0.0 {
                100.0 * gbps / device
            } else {
                0.0
            },
            b.derived_median(|d| d.overlap_ratio),
            b.med(|r| r.report.peak_rss_bytes as f64) / GIB as f64,
            if total["equal"].as_bool() == Some(true) {
                "yes"
            } else {
                "NO"
            }
        );
    }
    for b in budgets {
        // Routing is identical in every run (greedy, same ids): the first run's replay stands.
        let Some(first) = b.runs.first() else {
            continue;
        };
        let tokens = (first.report.generated.len() + first.report.prefill.tokens) as f64;
        for p in &first.report.policies {
            println!(
                "{:>10} cache {:>5} slots {:>9}: {:>8.3} GB read, {:>8.3} GB avoided per token (over {} prompt + generated tokens)",
                format!("{:.2}G", b.plan.budget as f64 / GIB as f64),
                p.slots,
                p.policy,
                p.bytes_read as f64 / tokens / 1e9,
                p.bytes_avoided as f64 / tokens / 1e9,
                tokens
            );
        }
    }
    println!(
        "\n{:>10} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "budget",
        "s/token",
        "floor",
        "limit",
        "bound",
        "BF16",
        "MXFP4",
        "drive",
        "stream",
        "GB/token"
    );
    for b in budgets {
        let bound = b.floors().next().map_or("-", |f| f.bound());
        // A run that beat its floor shows a probe measured too low: no ratio then.
        let limit = match b.beaten_runs() {
            0 => format!("{:.2}", b.floor_median(|f| f.of_limit)),
            n => format!("beaten×{n}"),
        };
        println!(
            "{:>10} {:>9.3} {:>9.3} {:>9} {:>10} {:>9.3} {:>9.3} {:>9.3} {:>8.2}G {:>9.3}",
            format!("{:.2}G", b.plan.budget as f64 / GIB as f64),
            b.derived_median(|d| d.seconds_per_token),
            b.floor_median(|f| f.floor),
            limit,
            bound,
            b.floor_median(|f| f.bf16),
            b.floor_median(|f| f.mxfp4),
            b.floor_median(|f| f.drive),
            b.stream.bytes_per_second / 1e9,
            b.floor_median(|f| f.touched_bytes) / 1e9,
        );
    }
    println!(
        "(decode against its floor, medians: floor = max(BF16 + MXFP4, drive) s/token, each \
         compute class the slower of its bytes ÷ the stream probe and one f32 FMA per weight at \
         the f32 GEMM probe's rate; drive = bytes read ÷ the drive probe of decode's own reads; limit = floor ÷ \
         s/token, 1 at the limit; beaten×N: N runs were faster than their floor, so a probe \
         measured too low and the floor is no floor; GB/token = weight bytes the compute reads)"
    );
    println!(
        "\n{:>10} {:>7} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9} {:>7} {:>7} {:>9} {:>7}",
        "budget",
        "tokens",
        "seconds",
        "tokens/s",
        "experts",
        "/union",
        "GFLOP/s",
        "wall",
        "f32 GEMM",
        "ratio",
        "wall",
        "f64 GEMM",
        "ratio"
    );
    for b in budgets {
        let tokens = b.runs.first().map_or(0, |r| r.report.prefill.tokens);
        println!(
            "{:>10} {:>7} {:>9.2} {:>9.1} {:>8.2}G {:>7.2} {:>9.1} {:>9.1} {:>9.1} {:>7.2} {:>7.2} \
             {:>9.1} {:>7.2}",
            format!("{:.2}G", b.plan.budget as f64 / GIB as f64),
            tokens,
            b.med(|r| r.report.prefill.seconds),
            b.prefill_median(|p| p.tokens_per_second),
            b.med(
                |r| (r.report.prefill.expert_bytes - r.report.prefill.lookahead_unused_bytes)
                    as f64
            ) / 1e9,
            b.prefill_median(|p| p.read_vs_union),
            b.prefill_median(|p| p.compute_gflops),
            b.prefill_median(|p| p.wall_gflops),
            b.med(|r| r.report.gemm_f32.flops_per_second / 1e9),
            b.prefill_median(|p| p.compute_vs_f32),
            b.prefill_median(|p| p.wall_vs_f32),
            b.med(|r| r.report.gemm.flops_per_second / 1e9),
            b.prefill_median(|p| p.compute_vs_f64),
        );
    }
    println!(
        "(prefill medians; experts = routed expert bytes read, /union = that ÷ the bytes of the \
         experts its tokens route to, each once; GFLOP/s = census FLOPs ÷ compute time (wall: \
         ÷ wall time); f32 GEMM = the SGEMM probe on the same threads in the same run (weight \
         products run in f32); ratio = GFLOP/s ÷ f32 GEMM; f64 GEMM and f64 ratio likewise for the \
         DGEMM probe)"
    );
    println!(
        "(medians; s/token = decode wall per token; unused = GB/token the routing lookahead \
         read on wrong guesses, =plan compares the rest with the plan; GB/s = read window bytes \
         ÷ reader busy time; overlap = wall ÷ max(io, compute))"
    );
}
