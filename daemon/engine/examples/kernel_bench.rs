//! Kernel benchmark (not a test): how fast the matvec kernels consume weights, as a fraction
//! of the memory bandwidth measured in the same run.
//!
//! `cargo run --release -p k3-engine --example kernel_bench [runs] [path]` (path: portable, avx2 or
//! avx512 to run only that one)
//!
//! Shapes: BF16 7168×12288 and 12288×7168 (trunk projections); one MXFP4 routed expert
//! (w1, w3: 3072×3584, w2: 3584×3072 = 17,547,264 bytes), cycling through 8 distinct experts
//! so the 32 MB L3 cannot hold the working set. Every figure is the median of `runs` (default 7)
//! timed repetitions on 1 and 2 rayon threads, for the portable path and each SIMD path the CPU
//! supports. Bandwidth: a streaming sum over a 512 MB buffer on the same thread count.
//!
//! Two clocks, because the machine is shared: `wall` GB/s is bytes per elapsed second;
//! `cpu` GB/s is bytes per (process CPU seconds / threads), i.e. the rate the threads reach
//! while they actually hold a core — the figure that says whether a kernel keeps up with memory
//! when it is not descheduled. Each ratio compares a kernel with the bandwidth measured on the
//! same clock, same thread count, same run.
//!
//! The arithmetic roof, measured in the same run: the f32 GEMM probe (`system::gemm_probe`, a
//! BLAS-style SGEMM free to sum in any order) on the same pool gives the f32 multiply-add rate
//! the cores deliver. Under the weight-product contract (spec §6.1 rule 2) every weight costs
//! at least one f32 fused multiply-add into its tree lane, so an MXFP4 matvec cannot consume
//! more than `rate` weights per second, i.e. `rate × 17/32` bytes (4.25 bits per weight with the
//! scale byte): the `mxfp4 roof (f32 FMA)` line, as a ratio of the stream bandwidth like the
//! kernels.

use std::hint::black_box;
use std::time::Instant;

use k3_engine::kernels::{
    Bf16Matrix, Isa, IsaKind, Mxfp4Matrix, matmul_bf16_with, matmul_mxfp4_with,
};
use k3_engine::rng::splitmix64;
use k3_engine::system::{gemm_probe, stream_probe};

/// splitmix64 steps, to fill buffers quickly and reproducibly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        splitmix64(&mut self.0)
    }

    /// Uniform in [−1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

const EXPERTS: usize = 8;
/// Stored bytes per MXFP4 weight: half a byte of nibble plus one scale byte per 32.
const MXFP4_BYTES_PER_WEIGHT: f64 = 0.5 + 1.0 / 32.0;
const BANDWIDTH_BYTES: usize = 512 << 20;

struct BenchExpert {
    packed: [Vec<u8>; 3],
    scales: [Vec<u8>; 3],
}

/// (rows, cols) of w1, w3, w2.
const EXPERT_SHAPES: [(usize, usize); 3] = [(3072, 3584), (3072, 3584), (3584, 3072)];

fn expert(rng: &mut Rng) -> BenchExpert {
    let mk =
        |rng: &mut Rng, n: usize, f: &dyn Fn(u64) -> u8| (0..n).map(|_| f(rng.next())).collect();
    let packed = EXPERT_SHAPES.map(|(r, c)| mk(rng, r * c / 2, &|v| v as u8));
    let scales = EXPERT_SHAPES.map(|(r, c)| mk(rng, r * c / 32, &|v| 118 + (v % 5) as u8));
    BenchExpert { packed, scales }
}

fn expert_bytes() -> usize {
    EXPERT_SHAPES
        .iter()
        .map(|&(r, c)| r * c / 2 + r * c / 32)
        .sum()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// CPU seconds used by the whole process so far (all threads).
fn process_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_PROCESS_CPUTIME_ID is always available
    // on Linux, and a failure leaves `ts` zero (the benchmark would then show 0 CPU time).
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Median (wall seconds, CPU seconds / threads) of `runs` calls of `f(i)` after one warm-up.
fn time(runs: usize, threads: usize, mut f: impl FnMut(usize)) -> (f64, f64) {
    f(0);
    let (mut wall, mut cpu) = (Vec::new(), Vec::new());
    for i in 1..=runs {
        let (start, cpu0) = (Instant::now(), process_cpu());
        f(i);
        wall.push(start.elapsed().as_secs_f64());
        cpu.push((process_cpu() - cpu0) / threads as f64);
    }
    (median(wall), median(cpu))
}

/// Streaming read of `buf` split across the pool's threads ([`stream_probe::pass`], the pass
/// `k3d bench` measures decode against): (wall, cpu) seconds.
fn bandwidth(pool: &rayon::ThreadPool, buf: &[u64], runs: usize) -> (f64, f64) {
    time(runs, pool.current_num_threads(), |_| {
        black_box(pool.install(|| stream_probe::pass(buf)));
    })
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(7);
    let mut rng = Rng(42);
    let (big_r, big_c) = (7168usize, 12288usize);
    // BF16 weights of realistic magnitude (no subnormals, no NaN).
    let bf16: Vec<u8> = (0..big_r * big_c)
        .flat_map(|_| (((rng.unit() * 0.05).to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    let x_big: Vec<f32> = (0..big_c.max(big_r)).map(|_| rng.unit()).collect();
    let experts: Vec<BenchExpert> = (0..EXPERTS).map(|_| expert(&mut rng)).collect();
    let x_exp: Vec<f32> = (0..3584).map(|_| rng.unit()).collect();
    let stream = stream_probe::buffer(BANDWIDTH_BYTES);

    let only: Option<IsaKind> = std::env::args().nth(2).map(|a| match a.parse() {
        Ok(kind) => kind,
        Err(e) => panic!("{e}"),
    });
    let paths: Vec<Isa> = Isa::all_supported()
        .into_iter()
        .filter(|isa| only.is_none_or(|k| k == isa.kind()))
        .collect();
    println!(
        "kernel_bench: median of {runs} runs; paths {:?}; expert = {} bytes ({EXPERTS} experts cycled)",
        paths.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        expert_bytes()
    );
    println!(
        "{:>7}  {:<23} {:<8} {:>8} | {:>8} {:>8} {:>6} | {:>8} {:>8} {:>6}",
        "threads", "kernel", "path", "ms", "wall", "bw", "ratio", "cpu", "bw", "ratio"
    );
    for threads in [1usize, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("thread pool");
        let stream_bytes = (stream.len() * 8) as f64;
        let (bw_wall, bw_cpu) = bandwidth(&pool, &stream, runs);
        let (bw_wall, bw_cpu) = (stream_bytes / bw_wall / 1e9, stream_bytes / bw_cpu / 1e9);
        println!(
            "{threads:>7}  {:<23} {:<8} {:>8} | {bw_wall:>8.2} {bw_wall:>8.2} {:>6} | {bw_cpu:>8.2} {bw_cpu:>8.2} {:>6}",
            "stream read 512 MB", "-", "-", "1.00", "1.00"
        );
        // One f32 fused multiply-add per weight is the contract's floor: the probe's FMA rate
        // bounds the weights/s of any exact MXFP4 matvec (both clocks: the probe is timed by
        // wall clock on an otherwise idle pool).
        let probe = pool.install(|| gemm_probe::measure_f32(std::time::Duration::from_secs(1)));
        let fma_per_s = probe.flops_per_second / 2.0;
        let roof = fma_per_s * MXFP4_BYTES_PER_WEIGHT / 1e9;
        println!(
            "{threads:>7}  {:<23} {:<8} {:>8} | {roof:>8.2} {bw_wall:>8.2} {:>6.2} | {roof:>8.2} {bw_cpu:>8.2} {:>6.2}   ({:.1} GFLOP/s sgemm probe)",
            "mxfp4 roof (f32 FMA)",
            probe.isa,
            "-",
            roof / bw_wall,
            roof / bw_cpu,
            probe.flops_per_second / 1e9
        );
        for &isa in &paths {
            let report = |name: &str, bytes: usize, (wall, cpu): (f64, f64)| {
                let (gw, gc) = (bytes as f64 / wall / 1e9, bytes as f64 / cpu / 1e9);
                println!(
                    "{threads:>7}  {name:<23} {:<8} {:>8.2} | {gw:>8.2} {bw_wall:>8.2} {:>6.2} | {gc:>8.2} {bw_cpu:>8.2} {:>6.2}",
                    isa.to_string(),
                    wall * 1e3,
                    gw / bw_wall,
                    gc / bw_cpu
                );
            };
            for (r, c) in [(big_r, big_c), (big_c, big_r)] {
                let w = Bf16Matrix::new(&bf16, r, c);
                let mut y = vec![0.0f32; r];
                let secs = time(runs, threads, |_| {
                    pool.install(|| matmul_bf16_with(isa, w, &x_big[..c], &mut y));
                    black_box(&y);
                });
                report(&format!("bf16 {r}x{c}"), bf16.len(), secs);
            }
            let mut h = [vec![0.0f32; 3072], vec![0.0f32; 3072], vec![0.0f32; 3584]];
            let secs = time(runs, threads, |i| {
                let e = &experts[i % EXPERTS];
                pool.install(|| {
                    for (k, &(r, c)) in EXPERT_SHAPES.iter().enumerate() {
                        let w = Mxfp4Matrix::new(&e.packed[k], &e.scales[k], r, c);
                        matmul_mxfp4_with(isa, w, &x_exp[..c], &mut h[k]);
                    }
                });
                black_box(&h);
            });
            report("mxfp4 expert w1+w3+w2", expert_bytes(), secs);
        }
    }
}
