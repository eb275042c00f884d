//! Prefill kernel benchmark (not a test): the T-token matmuls of a prompt's layer pass, in
//! GFLOP/s, against the machine's f64 GEMM rate measured in the same run on the same threads
//! (`k3_engine::system::gemm_probe`, a BLAS-style broadcast DGEMM).
//!
//! `cargo run --release -p k3-engine --example prefill_bench [runs] [path]` (path: portable,
//! avx2 or avx512 to run only that one; the portable path is slow — minutes).
//!
//! Shapes: BF16 12288×7168 and 7168×12288 (a KDA projection and `o_proj`) at 64 and 256 tokens;
//! one MXFP4 routed expert (w1, w3: 3072×3584, w2: 3584×3072) at 16 and 64 tokens (what each
//! expert sees when a 256- or 1,000-token prompt routes 16 of 272 or of 256 experts). FLOPs are
//! 2 × rows × cols × tokens. Every figure is the median of `runs` (default 5) timed calls after
//! one warm-up, wall clock, on 1 and 2 threads.

use std::hint::black_box;
use std::time::{Duration, Instant};

use k3_engine::kernels::{
    Bf16Matrix, Isa, IsaKind, Mxfp4Matrix, matmul_bf16_with, matmul_mxfp4_with,
};
use k3_engine::rng::Rng;
use k3_engine::system::gemm_probe;

/// (rows, cols) of w1, w3, w2.
const EXPERT_SHAPES: [(usize, usize); 3] = [(3072, 3584), (3072, 3584), (3584, 3072)];

/// Uniform in [−1, 1).
fn unit(rng: &mut Rng) -> f32 {
    (rng.next_f64() * 2.0 - 1.0) as f32
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median wall seconds of `runs` calls of `f` after one warm-up.
fn time(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    median(
        (0..runs)
            .map(|_| {
                let start = Instant::now();
                f();
                start.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let only: Option<IsaKind> = std::env::args().nth(2).map(|a| match a.parse() {
        Ok(kind) => kind,
        Err(e) => panic!("{e}"),
    });
    let paths: Vec<Isa> = Isa::all_supported()
        .into_iter()
        .filter(|isa| only.is_none_or(|k| k == isa.kind()))
        .collect();
    let mut rng = Rng::new(42);
    let (big_r, big_c) = (12288usize, 7168usize);
    let bf16: Vec<u8> = (0..big_r * big_c)
        .flat_map(|_| (((unit(&mut rng) * 0.05).to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    let packed: Vec<Vec<u8>> = EXPERT_SHAPES
        .iter()
        .map(|&(r, c)| (0..r * c / 2).map(|_| rng.next_u64() as u8).collect())
        .collect();
    let scales: Vec<Vec<u8>> = EXPERT_SHAPES
        .iter()
        .map(|&(r, c)| {
            (0..r * c / 32)
                .map(|_| 118 + (rng.next_u64() % 5) as u8)
                .collect()
        })
        .collect();
    let xs: Vec<f32> = (0..256 * big_r.max(big_c))
        .map(|_| unit(&mut rng))
        .collect();
    println!("prefill_bench: median of {runs} runs; GFLOP/s and ratio to the GEMM probe");
    println!(
        "{:>7}  {:<28} {:<8} {:>9} {:>9} {:>6}",
        "threads", "kernel", "path", "ms", "GFLOP/s", "ratio"
    );
    for threads in [1usize, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("thread pool");
        let probe = pool.install(|| gemm_probe::measure(Duration::from_secs(2)));
        let reference = probe.flops_per_second / 1e9;
        println!(
            "{threads:>7}  {:<28} {:<8} {:>9} {reference:>9.1} {:>6}",
            format!("dgemm probe {:?}", probe.shape),
            probe.isa,
            "-",
            "1.00"
        );
        for &isa in &paths {
            let report = |name: String, flops: f64, secs: f64| {
                let g = flops / secs / 1e9;
                println!(
                    "{threads:>7}  {name:<28} {:<8} {:>9.1} {g:>9.1} {:>6.2}",
                    isa.to_string(),
                    secs * 1e3,
                    g / reference
                );
            };
            for (r, c) in [(big_r, big_c), (big_c, big_r)] {
                let w = Bf16Matrix::new(&bf16, r, c);
                for t in [64usize, 256] {
                    let mut y = vec![0.0f32; t * r];
                    let secs = time(runs, || {
                        pool.install(|| matmul_bf16_with(isa, w, &xs[..t * c], &mut y));
                        black_box(&y);
                    });
                    report(
                        format!("bf16 {r}x{c} T={t}"),
                        2.0 * (r * c * t) as f64,
                        secs,
                    );
                }
            }
            for t in [16usize, 64] {
                let mut h: Vec<Vec<f32>> = EXPERT_SHAPES
                    .iter()
                    .map(|&(r, _)| vec![0.0; t * r])
                    .collect();
                let secs = time(runs, || {
                    pool.install(|| {
                        for (k, &(r, c)) in EXPERT_SHAPES.iter().enumerate() {
                            let w = Mxfp4Matrix::new(&packed[k], &scales[k], r, c);
                            matmul_mxfp4_with(isa, w, &xs[..t * c], &mut h[k]);
                        }
                    });
                    black_box(&h);
                });
                let flops: usize = EXPERT_SHAPES.iter().map(|&(r, c)| 2 * r * c * t).sum();
                report(format!("mxfp4 expert T={t}"), flops as f64, secs);
            }
        }
    }
}
