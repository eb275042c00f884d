//! Matrix × activations: `ys[t][r] = Σ_i W[r][i] · xs[t][i]` for T token rows.
//!
//! A BF16 or MXFP4 weight row times an activation row is a *weight product*: it accumulates in
//! f32 by fused multiply-add with the weight tree of [`super::tree`] (spec §6.1 rule 2 as
//! amended), whatever the path, so a T-token call equals T one-token calls bit for bit (rule 5).
//! Threads split only the rows (rule 4). On x86-64 a one-token call (decode) runs the kernels
//! of [`super::x86`], which decode each weight register on the fly; two or more tokens
//! (prefill, speculative verification) run the GEMM of [`super::x86::gemm`], which decodes each
//! weight once per call into an f32 panel and reuses it for every token. An f32 weight
//! ([`matmul_f32`]) is not a stored weight: its products use the f64 tree of [`super::reduce`].

use rayon::prelude::*;

use super::isa::{Isa, IsaKind};
use super::matrix::{Bf16Matrix, Mxfp4Matrix};
use super::mxfp4;
use super::reduce::dot_f32_with;
use super::scratch::zeroed;
use super::tree::weight_dot;
#[cfg(target_arch = "x86_64")]
use super::x86::{self, Weights, packed::PackedTokens};

/// Below this many multiply-adds a call stays on the calling thread (results are identical
/// either way; this only avoids scheduling overhead on tiny matrices).
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// Parallel tasks per rayon thread: a few, so a thread slowed by a noisy neighbour is helped
/// by the others, few enough that each task streams a long contiguous run of weight rows.
const TASKS_PER_THREAD: usize = 4;

/// Task row counts are multiples of this (a multiple of every SIMD tile height: 4 for the
/// AVX-512 tiles and GEMM, 2 for the AVX2 tiles, 3 for the AVX2 GEMM), so only the last task
/// of a call runs remainder tiles.
const ROW_ALIGN: usize = 12;

/// Tokens packed and multiplied per pass of a SIMD GEMM: bounds the packed activation copy
/// (64 × 7168 × 4 B = 1.8 MB) while each weight row is still read once per 64 tokens.
#[cfg(target_arch = "x86_64")]
const TOKEN_CHUNK: usize = 64;

/// Checks the shapes of a matmul call and returns the token count T.
fn token_count(rows: usize, cols: usize, xs: &[f32], ys: &[f32]) -> usize {
    assert!(
        cols > 0 && xs.len().is_multiple_of(cols),
        "activation length is not a multiple of cols"
    );
    let t = xs.len() / cols;
    assert_eq!(ys.len(), t * rows, "output length");
    t
}

/// Rows per parallel task for `rows` rows of `work_per_row` multiply-adds each; `rows` itself
/// when the call should stay on the calling thread.
fn rows_per_task(rows: usize, work_per_row: usize) -> usize {
    let threads = rayon::current_num_threads();
    if threads <= 1 || rows.saturating_mul(work_per_row) < PARALLEL_MIN_WORK {
        return rows.max(1);
    }
    let per = rows
        .div_ceil(threads * TASKS_PER_THREAD)
        .next_multiple_of(ROW_ALIGN);
    per.min(rows)
}

/// Shared driver: `block(r0, out)` fills `out = [n][t]` (row-major: row `r0 + k`, token `tok`
/// at `k·t + tok`) for the `n = out.len() / t` rows starting at `r0`. Threads own disjoint row
/// blocks (spec §6.1 rule 4); the result is transposed into `ys = [t][rows]`.
fn for_row_blocks(
    rows: usize,
    cols: usize,
    t: usize,
    ys: &mut [f32],
    block: impl Fn(usize, &mut [f32]) + Sync,
) {
    if t == 0 || rows == 0 {
        return;
    }
    let per = rows_per_task(rows, cols * t);
    let run = |by_row: &mut [f32]| {
        if per >= rows {
            block(0, by_row);
        } else {
            // Every task its own stealable job (`with_max_len(1)`): left to rayon's adaptive
            // split, a thread ran its last two tasks as one job the other could not take, and
            // at the end of a prefill matmul one core waited up to two tasks (perf: compute-1
            // idle 6 % of a 256-token prefill, gaps up to 200 ms in the dense MLP; issue 30).
            by_row
                .par_chunks_mut(per * t)
                .enumerate()
                .with_max_len(1)
                .for_each(|(i, out)| block(i * per, out));
        }
    };
    if t == 1 {
        // [1][rows] and [rows][1] are the same layout.
        run(ys);
    } else {
        let mut by_row = zeroed(rows * t);
        run(&mut by_row);
        transpose_into(&by_row, rows, t, ys);
    }
}

/// Tokens per piece of [`transpose_into`]: one 64-byte line of a `[rows][t]` row.
const TRANSPOSE_TOKENS: usize = 16;

/// `ys[tok][r] = by_row[r][tok]`, in pieces of [`TRANSPOSE_TOKENS`] tokens split among the
/// pool's threads when the call is large (a prefill's: a copy, so the split changes no bit).
/// On one thread it was a serial stretch of every prefill matmul while the other core waited.
fn transpose_into(by_row: &[f32], rows: usize, t: usize, ys: &mut [f32]) {
    let piece = |(p, ys): (usize, &mut [f32])| {
        let first = p * TRANSPOSE_TOKENS;
        let tokens = ys.len() / rows;
        for r in 0..rows {
            for (k, &v) in by_row[r * t + first..][..tokens].iter().enumerate() {
                ys[k * rows + r] = v;
            }
        }
    };
    let piece_len = TRANSPOSE_TOKENS * rows;
    if rayon::current_num_threads() <= 1 || rows * t < PARALLEL_MIN_WORK {
        ys.chunks_mut(piece_len).enumerate().for_each(piece);
    } else {
        ys.par_chunks_mut(piece_len).enumerate().for_each(piece);
    }
}

/// The portable reference: `row_dot(r, x)` is row r's product with token row x.
fn matmul_rows(
    rows: usize,
    cols: usize,
    xs: &[f32],
    ys: &mut [f32],
    row_dot: impl Fn(usize, &[f32]) -> f32 + Sync,
) {
    let t = token_count(rows, cols, xs, ys);
    for_row_blocks(rows, cols, t, ys, |r0, out| {
        for (k, out_row) in out.chunks_mut(t).enumerate() {
            for (tok, y) in out_row.iter_mut().enumerate() {
                *y = row_dot(r0 + k, &xs[tok * cols..(tok + 1) * cols]);
            }
        }
    });
}

/// A SIMD matmul on instruction set `S`: the GEMM for two or more tokens, else the one-token
/// kernels on the activation row packed once.
#[cfg(target_arch = "x86_64")]
fn matmul_simd<S: x86::Simd + x86::gemm::Gemm>(
    simd: S,
    w: Weights<'_>,
    xs: &[f32],
    ys: &mut [f32],
) {
    let (rows, cols) = (w.rows(), w.cols());
    if token_count(rows, cols, xs, ys) == 1 {
        let packed = PackedTokens::new(xs, cols, &<S as x86::Simd>::POSITIONS, 1);
        return for_row_blocks(rows, cols, 1, ys, |r0, out| {
            x86::Simd::one_token(simd, &w, &packed, r0, out)
        });
    }
    for (xc, yc) in xs
        .chunks(TOKEN_CHUNK * cols)
        .zip(ys.chunks_mut(TOKEN_CHUNK * rows))
    {
        let packed = PackedTokens::new(xc, cols, &<S as x86::gemm::Gemm>::POSITIONS, S::TOKENS);
        let t = packed.tokens();
        for_row_blocks(rows, cols, t, yc, |r0, out| {
            x86::gemm::rows(simd, w, &packed, r0, out.len() / t, out)
        });
    }
}

/// `ys = xs · Wᵀ` for a BF16 weight: `xs` is `[T, cols]`, `ys` is `[T, rows]`. Fastest path.
pub fn matmul_bf16(w: Bf16Matrix<'_>, xs: &[f32], ys: &mut [f32]) {
    matmul_bf16_with(Isa::detect(), w, xs, ys);
}

/// [`matmul_bf16`] on a chosen path; every path gives the same bits.
pub fn matmul_bf16_with(isa: Isa, w: Bf16Matrix<'_>, xs: &[f32], ys: &mut [f32]) {
    match isa.kind() {
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx512 => {
            // SAFETY: an `Isa` of kind Avx512 is only constructed after
            // `IsaKind::is_supported` detected AVX-512F, AVX2 and FMA.
            let simd = unsafe { x86::avx512::Avx512::new() };
            matmul_simd(simd, Weights::Bf16(w), xs, ys);
        }
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx2 => {
            // SAFETY: an `Isa` of kind Avx2 is only constructed after
            // `IsaKind::is_supported` detected AVX2 and FMA.
            let simd = unsafe { x86::avx2::Avx2::new() };
            matmul_simd(simd, Weights::Bf16(w), xs, ys);
        }
        _ => matmul_rows(w.rows, w.cols, xs, ys, |r, x| {
            weight_dot(x, |i| w.get(r, i))
        }),
    }
}

/// `ys = xs · Wᵀ` for an f32 weight given as a slice `[rows, cols]` (rows by [`super::reduce::dot_f32`]).
pub fn matmul_f32(w: &[f32], rows: usize, cols: usize, xs: &[f32], ys: &mut [f32]) {
    matmul_f32_with(Isa::detect(), w, rows, cols, xs, ys);
}

/// [`matmul_f32`] on a chosen path; every path gives the same bits.
pub fn matmul_f32_with(isa: Isa, w: &[f32], rows: usize, cols: usize, xs: &[f32], ys: &mut [f32]) {
    assert_eq!(w.len(), rows * cols, "f32 matrix length");
    matmul_rows(rows, cols, xs, ys, |r, x| {
        dot_f32_with(isa, &w[r * cols..(r + 1) * cols], x) as f32
    });
}

/// `ys = xs · Wᵀ` for an MXFP4 weight, straight from the packed bytes. Fastest path.
pub fn matmul_mxfp4(w: Mxfp4Matrix<'_>, xs: &[f32], ys: &mut [f32]) {
    matmul_mxfp4_with(Isa::detect(), w, xs, ys);
}

/// [`matmul_mxfp4`] on a chosen path; every path gives the same bits.
pub fn matmul_mxfp4_with(isa: Isa, w: Mxfp4Matrix<'_>, xs: &[f32], ys: &mut [f32]) {
    match isa.kind() {
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx512 => {
            // SAFETY: an `Isa` of kind Avx512 is only constructed after
            // `IsaKind::is_supported` detected AVX-512F, AVX2 and FMA.
            let simd = unsafe { x86::avx512::Avx512::new() };
            matmul_simd(simd, Weights::Mxfp4(w), xs, ys);
        }
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx2 => {
            // SAFETY: an `Isa` of kind Avx2 is only constructed after
            // `IsaKind::is_supported` detected AVX2 and FMA.
            let simd = unsafe { x86::avx2::Avx2::new() };
            matmul_simd(simd, Weights::Mxfp4(w), xs, ys);
        }
        _ => {
            let half = w.cols / 2;
            let groups = w.cols / mxfp4::GROUP;
            matmul_rows(w.rows, w.cols, xs, ys, |r, x| {
                let packed = &w.packed[r * half..(r + 1) * half];
                let scales = &w.scales[r * groups..(r + 1) * groups];
                weight_dot(x, |i| mxfp4::weight(packed, scales, i))
            })
        }
    }
}
