//! Transposed matrix × activations: `ys[t][c] = round_f32(Σ_r W[r][c] · xs[t][r])` for a BF16
//! `W = [rows, cols]` read in its stored row-major bytes — the column access MLA weight
//! absorption needs (`q̃ = W_kbᵀ · q_nope`, spec §4.6) without a transposed copy of the weight.
//!
//! Each output element is reduced over `r` with the f64 tree of [`super::tree`]: term `r` in
//! lane `r mod 16` over the full groups of sixteen, lanes folded by
//! [`combine_lanes`], then the tail rows one by one (spec §6.1 rule 3). The sixteen lanes are
//! kept for a block of adjacent columns at once, so the weight is still streamed row by row and
//! the inner loop runs over contiguous columns. A T-token call equals T one-token calls bit for
//! bit (rule 5); threads split only column blocks (rule 4).
//!
//! Why the f64 tree and not the f32 weight tree of `super::matmul`: spec §6.1 rule 2 makes an
//! exception of *rows* of a weight matrix times an activation; this is a column product whose
//! result q̃ is one factor of the MLA scores, which stay f64 (`docs/model.md`). It is under
//! 0.5 % of an MLA layer's multiply-adds (64 heads × 128 × 128 per token against ~232 M).
//!
//! SIMD: the same Rust loop compiled a second time with AVX2 enabled, so the compiler can use
//! wider registers. Rust never contracts or reassociates float operations, whatever the target
//! features, so both compilations perform the same additions in the same order — the same
//! bits (checked by the tests below).

use rayon::prelude::*;

use super::isa::{Isa, IsaKind};
use super::matrix::{Bf16Matrix, bf16_to_f32};
use super::tree::{LANES, combine_lanes};

/// Columns whose sixteen f64 lanes are kept at once: 16 × 64 × 8 B = 8 KB, L1-resident.
const COL_BLOCK: usize = 64;

/// Below this many multiply-adds per token a call stays on the calling thread (results are
/// identical either way).
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// `ys = xs · W` for a BF16 weight: `xs` is `[T, rows]`, `ys` is `[T, cols]`. Fastest path.
pub fn matmul_bf16_transposed(w: Bf16Matrix<'_>, xs: &[f32], ys: &mut [f32]) {
    matmul_bf16_transposed_with(Isa::detect(), w, xs, ys);
}

/// [`matmul_bf16_transposed`] on a chosen path; every path gives the same bits.
pub fn matmul_bf16_transposed_with(isa: Isa, w: Bf16Matrix<'_>, xs: &[f32], ys: &mut [f32]) {
    assert!(
        w.rows > 0 && xs.len().is_multiple_of(w.rows),
        "activation length is not a multiple of rows"
    );
    let t = xs.len() / w.rows;
    assert_eq!(ys.len(), t * w.cols, "output length");
    if w.cols == 0 {
        return;
    }
    let parallel = w.rows * w.cols >= PARALLEL_MIN_WORK && rayon::current_num_threads() > 1;
    for (x, y) in xs.chunks_exact(w.rows).zip(ys.chunks_exact_mut(w.cols)) {
        if parallel {
            y.par_chunks_mut(COL_BLOCK)
                .enumerate()
                .for_each(|(b, out)| column_block_on(isa, w, x, b * COL_BLOCK, out));
        } else {
            for (b, out) in y.chunks_mut(COL_BLOCK).enumerate() {
                column_block_on(isa, w, x, b * COL_BLOCK, out);
            }
        }
    }
}

/// [`column_block`] compiled for `isa`.
fn column_block_on(isa: Isa, w: Bf16Matrix<'_>, x: &[f32], c0: usize, out: &mut [f32]) {
    match isa.kind() {
        // SAFETY: an `Isa` of kind Avx2 or Avx512 is only constructed after
        // `IsaKind::is_supported` detected AVX2 (and more), the one feature enabled below.
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx2 | IsaKind::Avx512 => unsafe { column_block_avx2(w, x, c0, out) },
        _ => column_block(w, x, c0, out),
    }
}

/// [`column_block`] with AVX2 code generation; the same operations in the same order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn column_block_avx2(w: Bf16Matrix<'_>, x: &[f32], c0: usize, out: &mut [f32]) {
    column_block(w, x, c0, out)
}

/// Columns `c0 .. c0 + out.len()` of `xᵀ · W`, each by the fixed tree over the rows.
#[inline(always)]
fn column_block(w: Bf16Matrix<'_>, x: &[f32], c0: usize, out: &mut [f32]) {
    let n = out.len();
    let row = |r: usize| {
        let bytes = &w.bytes[2 * (r * w.cols + c0)..2 * (r * w.cols + c0 + n)];
        bytes.as_chunks::<2>().0
    };
    columns_by(w.rows, x, row, |b: [u8; 2]| bf16_to_f32(b[0], b[1]), out);
}

/// `out[j] = round_f32(Σ_r widen(row(r)[j]) · x[r])` by the fixed tree over the `rows` rows,
/// for the `out.len() ≤ COL_BLOCK` columns each `row(r)` holds.
#[inline(always)]
fn columns_by<'w, E: Copy + 'w>(
    rows: usize,
    x: &[f32],
    row: impl Fn(usize) -> &'w [E],
    widen: impl Fn(E) -> f32,
    out: &mut [f32],
) {
    let n = out.len();
    let full = rows - rows % LANES;
    let mut lanes = [[0.0f64; COL_BLOCK]; LANES];
    for r in 0..full {
        let xr = x[r] as f64;
        for (acc, &e) in lanes[r % LANES][..n].iter_mut().zip(row(r)) {
            *acc += widen(e) as f64 * xr;
        }
    }
    let mut sums = [0.0f64; COL_BLOCK];
    for (j, s) in sums[..n].iter_mut().enumerate() {
        *s = combine_lanes(&std::array::from_fn(|k| lanes[k][j]));
    }
    // The n mod 16 tail rows, added one by one in increasing row order.
    for (r, &xv) in x.iter().enumerate().take(rows).skip(full) {
        let xr = xv as f64;
        for (s, &e) in sums[..n].iter_mut().zip(row(r)) {
            *s += widen(e) as f64 * xr;
        }
    }
    for (y, s) in out.iter_mut().zip(&sums) {
        *y = *s as f32;
    }
}

/// `out[j] = round_f32(Σ_i x[i] · S[i][j])` for a row-major f32 `S = [x.len(), out.len()]`,
/// each sum by the fixed tree over `i` (KDA's state reads `Sᵀk` and `Sᵀq`, spec §4.5), on
/// the calling thread. Fastest path.
pub fn matvec_f32_transposed(s: &[f32], x: &[f32], out: &mut [f32]) {
    matvec_f32_transposed_with(Isa::detect(), s, x, out)
}

/// [`matvec_f32_transposed`] on a chosen path; every path gives the same bits.
pub fn matvec_f32_transposed_with(isa: Isa, s: &[f32], x: &[f32], out: &mut [f32]) {
    let cols = out.len();
    assert_eq!(s.len(), x.len() * cols, "state shape");
    for (b, block) in out.chunks_mut(COL_BLOCK).enumerate() {
        let c0 = b * COL_BLOCK;
        match isa.kind() {
            // SAFETY: an `Isa` of kind Avx2 or Avx512 is only constructed after
            // `IsaKind::is_supported` detected AVX2 (and more), the one feature enabled below.
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 | IsaKind::Avx512 => unsafe { f32_columns_avx2(s, x, c0, block) },
            _ => f32_columns(s, x, c0, block),
        }
    }
}

/// [`f32_columns`] with AVX2 code generation; the same operations in the same order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn f32_columns_avx2(s: &[f32], x: &[f32], c0: usize, out: &mut [f32]) {
    f32_columns(s, x, c0, out)
}

/// Columns `c0 .. c0 + out.len()` of `xᵀ · S` for a row-major f32 `S` of `x.len()` rows.
#[inline(always)]
fn f32_columns(s: &[f32], x: &[f32], c0: usize, out: &mut [f32]) {
    let (n, cols) = (out.len(), s.len() / x.len().max(1));
    let row = |r: usize| &s[r * cols + c0..r * cols + c0 + n];
    columns_by(x.len(), x, row, |v: f32| v, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tree::tree_sum;

    /// Deterministic bf16 bytes and f32 activations with mixed signs and magnitudes.
    fn data(rows: usize, cols: usize, t: usize) -> (Vec<u8>, Vec<f32>) {
        let mut z = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            z
        };
        let bytes = (0..rows * cols)
            .flat_map(|_| {
                let v = ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0;
                ((v.to_bits() >> 16) as u16).to_le_bytes()
            })
            .collect();
        let xs = (0..rows * t)
            .map(|i| ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * (1 + i % 7) as f32)
            .collect();
        (bytes, xs)
    }

    /// Column c of `xᵀW` by the reference tree, element access only.
    fn reference(w: Bf16Matrix<'_>, x: &[f32], c: usize) -> f32 {
        tree_sum(w.rows, |r| w.get(r, c) as f64 * x[r] as f64) as f32
    }

    #[test]
    fn every_column_is_the_tree_over_rows() {
        // Row counts around the 16-lane groups, column counts around the 64-column block.
        for (rows, cols) in [(1, 1), (15, 3), (16, 64), (17, 65), (128, 512), (131, 200)] {
            let t = 3;
            let (bytes, xs) = data(rows, cols, t);
            let w = Bf16Matrix::new(&bytes, rows, cols);
            let mut ys = vec![0.0f32; t * cols];
            matmul_bf16_transposed(w, &xs, &mut ys);
            for tok in 0..t {
                let x = &xs[tok * rows..(tok + 1) * rows];
                for c in 0..cols {
                    assert_eq!(
                        ys[tok * cols + c].to_bits(),
                        reference(w, x, c).to_bits(),
                        "rows {rows} cols {cols} token {tok} column {c}"
                    );
                }
                // One token alone gives the same bits as within the batch.
                let mut one = vec![0.0f32; cols];
                matmul_bf16_transposed(w, x, &mut one);
                assert_eq!(one, ys[tok * cols..(tok + 1) * cols]);
            }
        }
    }

    #[test]
    fn f32_state_columns_are_the_tree_on_every_path() {
        for (rows, cols) in [(1, 1), (15, 3), (16, 64), (17, 65), (128, 128), (131, 200)] {
            let (_, s) = data(rows * cols, 1, 1);
            let (_, x) = data(rows, 1, 2);
            let (s, x) = (&s[..], &x[rows..]);
            for isa in Isa::all_supported() {
                let mut out = vec![0.0f32; cols];
                matvec_f32_transposed_with(isa, s, x, &mut out);
                for (c, y) in out.iter().enumerate() {
                    let tree = tree_sum(rows, |r| x[r] as f64 * s[r * cols + c] as f64);
                    assert_eq!(
                        y.to_bits(),
                        (tree as f32).to_bits(),
                        "{isa:?} {rows}×{cols} column {c}"
                    );
                }
            }
        }
    }

    #[test]
    fn thread_count_does_not_change_bits() {
        let (rows, cols, t) = (128, 512, 2);
        let (bytes, xs) = data(rows, cols, t);
        let w = Bf16Matrix::new(&bytes, rows, cols);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("thread pool");
            let mut ys = vec![0.0f32; t * cols];
            pool.install(|| matmul_bf16_transposed(w, &xs, &mut ys));
            ys.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(3));
    }

    #[test]
    fn every_supported_path_gives_the_portable_bits() {
        for (rows, cols) in [(17, 65), (128, 512), (131, 200)] {
            let t = 2;
            let (bytes, xs) = data(rows, cols, t);
            let w = Bf16Matrix::new(&bytes, rows, cols);
            let run = |isa: Isa| {
                let mut ys = vec![0.0f32; t * cols];
                matmul_bf16_transposed_with(isa, w, &xs, &mut ys);
                ys.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            let portable = run(Isa::portable());
            for isa in Isa::all_supported() {
                assert_eq!(
                    run(isa),
                    portable,
                    "{:?} rows {rows} cols {cols}",
                    isa.kind()
                );
            }
        }
    }
}
