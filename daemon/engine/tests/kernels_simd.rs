//! Every SIMD path against the portable reference, bit for bit (spec §6.1 rules 3–5): random
//! inputs of many lengths including subnormals, signed zeros and huge magnitudes; every MXFP4
//! scale byte and nibble; T-token calls against T one-token calls; 1 against 2 threads.
//!
//! On a CPU without AVX2 / AVX-512 only the portable path exists and these tests compare it
//! with itself; the list of compared paths is printed so a run shows what it covered.

use k3_engine::kernels::reduce::{dot_f32_with, sum_squares_with};
use k3_engine::kernels::{
    Bf16Matrix, Isa, Mxfp4Matrix, matmul_bf16, matmul_bf16_with, matmul_f32_with, matmul_mxfp4,
    matmul_mxfp4_with,
};
use k3_engine::rng::splitmix64;

/// splitmix64 steps: a small deterministic generator (tests must not depend on a seed source).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        splitmix64(&mut self.0)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A finite f32 from a mix designed to expose any change of summation order: ordinary
    /// values, huge and tiny magnitudes (cancellation, absorption), subnormals, ±0.
    fn f32(&mut self) -> f32 {
        let sign = if self.next() & 1 == 0 { 1.0f32 } else { -1.0 };
        let unit = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        match self.below(16) {
            0 => sign * 0.0,
            1 => f32::from_bits((self.next() as u32) & 0x807f_ffff), // subnormal (or ±0)
            2 => sign * unit * 1e30,
            3 => sign * unit * 1e-30,
            4 => sign * (1 + self.below(1000)) as f32 * 2.0f32.powi(self.below(40) as i32),
            _ => sign * unit * 2.0f32.powi(self.below(20) as i32 - 10),
        }
    }

    /// Finite BF16 bytes from the same kind of mix (the high half of a finite f32).
    fn bf16_bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(2 * n);
        for _ in 0..n {
            let h = loop {
                let h = if self.below(4) == 0 {
                    self.next() as u16 // any bit pattern …
                } else {
                    (self.f32().to_bits() >> 16) as u16
                };
                if h & 0x7f80 != 0x7f80 {
                    break h; // … that is not Inf/NaN
                }
            };
            out.extend_from_slice(&h.to_le_bytes());
        }
        out
    }

    fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }

    fn bytes(&mut self, n: usize, below: u64) -> Vec<u8> {
        (0..n).map(|_| self.below(below) as u8).collect()
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const LENGTHS: [usize; 13] = [0, 1, 2, 15, 16, 17, 31, 32, 33, 100, 257, 1001, 7168];
const TOKENS: [usize; 4] = [1, 2, 3, 7];
const ROWS: [usize; 5] = [1, 3, 4, 5, 9];

fn simd_paths() -> Vec<Isa> {
    let paths = Isa::all_supported();
    eprintln!("paths compared: {paths:?}");
    paths
}

#[test]
fn dot_and_sum_of_squares_match_portable_bits() {
    let mut rng = Rng(1);
    for &n in &LENGTHS {
        for _ in 0..8 {
            let a = rng.f32s(n);
            let b = rng.f32s(n);
            let want_dot = dot_f32_with(Isa::portable(), &a, &b).to_bits();
            let want_ss = sum_squares_with(Isa::portable(), &a).to_bits();
            for isa in simd_paths() {
                assert_eq!(
                    dot_f32_with(isa, &a, &b).to_bits(),
                    want_dot,
                    "{isa} dot n={n}"
                );
                assert_eq!(
                    sum_squares_with(isa, &a).to_bits(),
                    want_ss,
                    "{isa} ss n={n}"
                );
            }
        }
    }
}

#[test]
fn bf16_matmul_matches_portable_bits() {
    let mut rng = Rng(2);
    for &cols in LENGTHS.iter().filter(|&&c| c > 0) {
        for &rows in &ROWS {
            let w = rng.bf16_bytes(rows * cols);
            let m = Bf16Matrix::new(&w, rows, cols);
            for &t in &TOKENS {
                let xs = rng.f32s(t * cols);
                let mut want = vec![0.0f32; t * rows];
                matmul_bf16_with(Isa::portable(), m, &xs, &mut want);
                for isa in simd_paths() {
                    let mut got = vec![f32::NAN; t * rows];
                    matmul_bf16_with(isa, m, &xs, &mut got);
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{isa} rows={rows} cols={cols} T={t}"
                    );
                }
            }
        }
    }
}

#[test]
fn f32_matmul_matches_portable_bits() {
    let mut rng = Rng(3);
    for &cols in [1usize, 17, 33, 100].iter() {
        let rows = 5;
        let w = rng.f32s(rows * cols);
        for &t in &TOKENS {
            let xs = rng.f32s(t * cols);
            let mut want = vec![0.0f32; t * rows];
            matmul_f32_with(Isa::portable(), &w, rows, cols, &xs, &mut want);
            for isa in simd_paths() {
                let mut got = vec![f32::NAN; t * rows];
                matmul_f32_with(isa, &w, rows, cols, &xs, &mut got);
                assert_eq!(bits(&got), bits(&want), "{isa} cols={cols} T={t}");
            }
        }
    }
}

fn check_mxfp4(packed: &[u8], scales: &[u8], rows: usize, cols: usize, xs: &[f32], what: &str) {
    let m = Mxfp4Matrix::new(packed, scales, rows, cols);
    let t = xs.len() / cols;
    let mut want = vec![0.0f32; t * rows];
    matmul_mxfp4_with(Isa::portable(), m, xs, &mut want);
    for isa in simd_paths() {
        let mut got = vec![f32::NAN; t * rows];
        matmul_mxfp4_with(isa, m, xs, &mut got);
        assert_eq!(
            bits(&got),
            bits(&want),
            "{isa} {what} rows={rows} cols={cols} T={t}"
        );
    }
}

#[test]
fn mxfp4_matmul_matches_portable_bits() {
    let mut rng = Rng(4);
    for &cols in &[32usize, 64, 96, 160, 3072, 3584] {
        for &rows in &ROWS {
            let packed = rng.bytes(rows * cols / 2, 256);
            // Realistic scales (near 2^0) half the time, the whole 0–254 range otherwise.
            let scales: Vec<u8> = (0..rows * cols / 32)
                .map(|_| {
                    if rng.below(2) == 0 {
                        120 + rng.below(16) as u8
                    } else {
                        rng.below(255) as u8
                    }
                })
                .collect();
            for &t in &TOKENS {
                let xs = rng.f32s(t * cols);
                check_mxfp4(&packed, &scales, rows, cols, &xs, "random");
            }
        }
    }
}

#[test]
fn mxfp4_every_scale_byte_and_every_nibble() {
    // 255 rows × 512 inputs: row s carries scale byte s in every group, and every row holds every
    // byte value 0–255 (both nibbles of every code, in both positions) once.
    let (rows, cols) = (255usize, 512usize);
    let mut rng = Rng(5);
    let mut packed = Vec::with_capacity(rows * cols / 2);
    for r in 0..rows {
        packed.extend((0..256).map(|c| ((c + r) % 256) as u8));
    }
    let scales: Vec<u8> = (0..rows)
        .flat_map(|s| std::iter::repeat_n(s as u8, cols / 32))
        .collect();
    for &t in &TOKENS {
        // Moderate activations so that 2^127 · 6 · x stays finite in f32 for most rows and the
        // extreme rows saturate identically on every path.
        let xs: Vec<f32> = (0..t * cols).map(|_| rng.f32().clamp(-1e3, 1e3)).collect();
        check_mxfp4(&packed, &scales, rows, cols, &xs, "all scales");
    }
}

/// The prefill GEMM's blocking (issue 30): token tiles of every width and uneven splits,
/// row tiles with every remainder, several weight panels (1,024 inputs each) with a partial
/// last one, and token counts across the 64-token chunk — each output against the portable
/// tree, bit for bit.
#[test]
fn gemm_tiles_and_panels_match_portable_bits() {
    let mut rng = Rng(9);
    let tokens: Vec<usize> = (2..=13).chain([64, 65]).collect();
    let rows_list = [1usize, 2, 3, 4, 5, 7, 12, 13];
    // BF16: two full panels, a partial one, and a tail of five inputs.
    let cols = 2 * 1024 + 16 + 5;
    for &rows in &rows_list {
        let w = rng.bf16_bytes(rows * cols);
        let m = Bf16Matrix::new(&w, rows, cols);
        for &t in &tokens {
            let xs = rng.f32s(t * cols);
            let mut want = vec![0.0f32; t * rows];
            matmul_bf16_with(Isa::portable(), m, &xs, &mut want);
            for isa in simd_paths() {
                let mut got = vec![f32::NAN; t * rows];
                matmul_bf16_with(isa, m, &xs, &mut got);
                assert_eq!(bits(&got), bits(&want), "{isa} bf16 rows={rows} T={t}");
            }
        }
    }
    // MXFP4: one full panel and a partial one of two blocks (one scale group).
    let cols = 1024 + 32;
    for &rows in &rows_list {
        let packed = rng.bytes(rows * cols / 2, 256);
        let scales: Vec<u8> = (0..rows * cols / 32)
            .map(|_| 110 + rng.below(30) as u8)
            .collect();
        for &t in &tokens {
            let xs = rng.f32s(t * cols);
            check_mxfp4(&packed, &scales, rows, cols, &xs, "panels");
        }
    }
}

/// Each token's row of a T-token call `batched` (`rows` outputs per token, `cols` inputs)
/// equals `one_token_call` on that token's row.
fn each_token_is_its_one_token_call(
    (rows, cols): (usize, usize),
    one_token_call: impl Fn(&[f32], &mut [f32]),
    xs: &[f32],
    batched: &[f32],
    what: &str,
) {
    for tok in 0..xs.len() / cols {
        let mut one = vec![0.0f32; rows];
        one_token_call(&xs[tok * cols..(tok + 1) * cols], &mut one);
        assert_eq!(
            bits(&one),
            bits(&batched[tok * rows..(tok + 1) * rows]),
            "{what} tok={tok}"
        );
    }
}

#[test]
fn t_token_call_equals_t_one_token_calls() {
    let mut rng = Rng(6);
    let (rows, cols) = (37usize, 7168usize);
    let w = rng.bf16_bytes(rows * cols);
    let bf = Bf16Matrix::new(&w, rows, cols);
    let (mrows, mcols) = (37usize, 3584usize);
    let packed = rng.bytes(mrows * mcols / 2, 256);
    let scales = rng.bytes(mrows * mcols / 32, 255);
    let mx = Mxfp4Matrix::new(&packed, &scales, mrows, mcols);
    for isa in simd_paths() {
        for &t in &[2usize, 3, 7, 70] {
            let xs = rng.f32s(t * cols);
            let mut batched = vec![0.0f32; t * rows];
            matmul_bf16_with(isa, bf, &xs, &mut batched);
            let xm = rng.f32s(t * mcols);
            let mut mbatched = vec![0.0f32; t * mrows];
            matmul_mxfp4_with(isa, mx, &xm, &mut mbatched);
            each_token_is_its_one_token_call(
                (rows, cols),
                |x, y| matmul_bf16_with(isa, bf, x, y),
                &xs,
                &batched,
                &format!("{isa} bf16 T={t}"),
            );
            each_token_is_its_one_token_call(
                (mrows, mcols),
                |x, y| matmul_mxfp4_with(isa, mx, x, y),
                &xm,
                &mbatched,
                &format!("{isa} mxfp4 T={t}"),
            );
        }
    }
}

/// A call large enough (rows × T ≥ 2^16) that its `[rows][T]` → `[T][rows]` transposition is
/// split among threads, with T not a multiple of the 16-token pieces: every token's row equals
/// its one-token call (which has nothing to transpose), on 1 and 2 threads and every path.
#[test]
fn a_large_call_is_transposed_exactly_on_every_thread_count() {
    let mut rng = Rng(8);
    let (rows, cols, t) = (301usize, 48usize, 250usize);
    let w = rng.bf16_bytes(rows * cols);
    let bf = Bf16Matrix::new(&w, rows, cols);
    let xs = rng.f32s(t * cols);
    for isa in Isa::all_supported() {
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("thread pool");
            let batched = pool.install(|| {
                let mut y = vec![0.0f32; t * rows];
                matmul_bf16_with(isa, bf, &xs, &mut y);
                y
            });
            each_token_is_its_one_token_call(
                (bf.rows, bf.cols),
                |x, y| matmul_bf16_with(isa, bf, x, y),
                &xs,
                &batched,
                &format!("{isa} bf16 {threads} threads"),
            );
        }
    }
}

#[test]
fn one_and_two_threads_give_the_same_bits() {
    let mut rng = Rng(7);
    // Big enough to be split into parallel tasks (≥ 2^16 multiply-adds), odd row count.
    let (rows, cols) = (203usize, 1001usize);
    let w = rng.bf16_bytes(rows * cols);
    let bf = Bf16Matrix::new(&w, rows, cols);
    let (mrows, mcols) = (203usize, 1024usize);
    let packed = rng.bytes(mrows * mcols / 2, 256);
    let scales = rng.bytes(mrows * mcols / 32, 255);
    let mx = Mxfp4Matrix::new(&packed, &scales, mrows, mcols);
    let run = |threads: usize, t: usize, xs: &[f32], xm: &[f32]| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("thread pool");
        pool.install(|| {
            let mut y = vec![0.0f32; t * rows];
            matmul_bf16(bf, xs, &mut y);
            let mut ym = vec![0.0f32; t * mrows];
            matmul_mxfp4(mx, xm, &mut ym);
            (bits(&y), bits(&ym))
        })
    };
    for &t in &TOKENS {
        let xs = rng.f32s(t * cols);
        let xm = rng.f32s(t * mcols);
        assert_eq!(run(1, t, &xs, &xm), run(2, t, &xs, &xm), "T={t}");
        assert_eq!(run(1, t, &xs, &xm), run(3, t, &xs, &xm), "T={t}");
    }
}

#[test]
fn non_finite_inputs_give_non_finite_results_on_every_path() {
    // NaN payloads may legitimately differ between paths; what must agree is which outputs are
    // NaN and the exact bits of every other output (±Inf included).
    let mut rng = Rng(8);
    let (rows, cols) = (6usize, 40usize);
    let mut w = rng.bf16_bytes(rows * cols);
    w[2 * 3..2 * 3 + 2].copy_from_slice(&0x7f80u16.to_le_bytes()); // +Inf in row 0
    let mut xs = rng.f32s(2 * cols);
    xs[cols + 5] = f32::NAN; // token 1: NaN everywhere
    xs[7] = f32::INFINITY;
    let m = Bf16Matrix::new(&w, rows, cols);
    let mut want = vec![0.0f32; 2 * rows];
    matmul_bf16_with(Isa::portable(), m, &xs, &mut want);
    assert!(want[rows..].iter().all(|v| v.is_nan()));
    for isa in simd_paths() {
        let mut got = vec![0.0f32; 2 * rows];
        matmul_bf16_with(isa, m, &xs, &mut got);
        for (g, w) in got.iter().zip(&want) {
            assert!(
                g.is_nan() == w.is_nan() && (w.is_nan() || g.to_bits() == w.to_bits()),
                "{isa}: {g} vs {w}"
            );
        }
    }
}
