//! Matrix × activations: `ys[t][r] = round_f32(Σ_i W[r][i] · xs[t][i])` for T token rows.
//!
//! Each output element is reduced over `i` with the one tree of [`super::reduce`], whatever
//! the path, so a T-token call equals T one-token calls bit for bit (spec §6.1 rule 5). Threads
//! split only the rows (rule 4). On x86-64 a one-token call (decode) runs the tile kernels of
//! [`super::x86`], which decode each weight register on the fly; two or more tokens (prefill,
//! speculative verification) run the GEMM of [`super::x86::gemm`], which decodes each weight
//! once per call into an f64 panel and reuses it for every token.
//!
//! Weights stay in their stored form: BF16 bytes (little-endian, unaligned is fine) or MXFP4
//! packed nibbles + scale bytes, decoded on the fly — never widened into a copy.

use rayon::prelude::*;

use super::aligned::zeroed;
use super::isa::{Isa, IsaKind};
use super::mxfp4;
use super::reduce::{dot_f32_with, tree_sum};
#[cfg(target_arch = "x86_64")]
use super::x86;
#[cfg(target_arch = "x86_64")]
use super::x86::gemm::Weights;

/// A row-major BF16 matrix `[rows, cols]` viewed in its stored bytes.
#[derive(Clone, Copy, Debug)]
pub struct Bf16Matrix<'a> {
    pub bytes: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

impl<'a> Bf16Matrix<'a> {
    pub fn new(bytes: &'a [u8], rows: usize, cols: usize) -> Self {
        assert_eq!(bytes.len(), rows * cols * 2, "bf16 matrix byte length");
        Bf16Matrix { bytes, rows, cols }
    }

    /// Element (r, i) widened exactly to f32.
    #[inline]
    pub fn get(&self, r: usize, i: usize) -> f32 {
        let p = 2 * (r * self.cols + i);
        bf16_to_f32(self.bytes[p], self.bytes[p + 1])
    }
}

/// Widens one little-endian BF16 value exactly.
#[inline]
pub fn bf16_to_f32(lo: u8, hi: u8) -> f32 {
    f32::from_bits((u16::from_le_bytes([lo, hi]) as u32) << 16)
}

/// Widens a BF16 byte vector to f32 (small vectors only: gains, pseudo-queries).
pub fn bf16_vector(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|b| bf16_to_f32(b[0], b[1]))
        .collect()
}

/// Reads an F32 little-endian byte vector.
pub fn f32_vector(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// A row-major MXFP4 matrix `[rows, cols]`: `packed` is `[rows, cols/2]`, `scales` `[rows, cols/32]`.
#[derive(Clone, Copy, Debug)]
pub struct Mxfp4Matrix<'a> {
    pub packed: &'a [u8],
    pub scales: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

impl<'a> Mxfp4Matrix<'a> {
    pub fn new(packed: &'a [u8], scales: &'a [u8], rows: usize, cols: usize) -> Self {
        assert_eq!(
            cols % mxfp4::GROUP,
            0,
            "MXFP4 input width must be a multiple of 32"
        );
        assert_eq!(packed.len(), rows * cols / 2, "MXFP4 packed byte length");
        assert_eq!(
            scales.len(),
            rows * cols / mxfp4::GROUP,
            "MXFP4 scale byte length"
        );
        Mxfp4Matrix {
            packed,
            scales,
            rows,
            cols,
        }
    }
}

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

/// Tokens widened and multiplied per pass of a SIMD matmul: bounds the f64 activation copy
/// (64 × 7168 × 8 B = 3.7 MB) while each weight row is still read once per 64 tokens.
const TOKEN_CHUNK: usize = 64;

/// Token rows from which a SIMD matmul runs the GEMM instead of the tile kernels.
#[cfg(target_arch = "x86_64")]
const GEMM_MIN_TOKENS: usize = 2;

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

/// The portable reference: `row_dot(r, x)` is the exact f64 tree dot of row r with token row x.
fn matmul_rows(
    rows: usize,
    cols: usize,
    xs: &[f32],
    ys: &mut [f32],
    row_dot: impl Fn(usize, &[f32]) -> f64 + Sync,
) {
    let t = token_count(rows, cols, xs, ys);
    for_row_blocks(rows, cols, t, ys, |r0, out| {
        for (k, out_row) in out.chunks_mut(t).enumerate() {
            for (tok, y) in out_row.iter_mut().enumerate() {
                *y = row_dot(r0 + k, &xs[tok * cols..(tok + 1) * cols]) as f32;
            }
        }
    });
}

/// A SIMD matmul on instruction set `S`: the GEMM for two or more tokens, else the tiles.
#[cfg(target_arch = "x86_64")]
fn matmul_simd<S: x86::Simd + x86::gemm::Gemm>(
    simd: S,
    w: Weights<'_>,
    xs: &[f32],
    ys: &mut [f32],
) {
    let (rows, cols) = match w {
        Weights::Bf16(m) => (m.rows, m.cols),
        Weights::Mxfp4(m) => (m.rows, m.cols),
    };
    if token_count(rows, cols, xs, ys) >= GEMM_MIN_TOKENS {
        return matmul_gemm(simd, w, rows, cols, xs, ys);
    }
    match w {
        Weights::Bf16(w) => matmul_tiled(&x86::Bf16 { w, simd }, rows, xs, ys),
        Weights::Mxfp4(w) => matmul_tiled(&x86::Mxfp4 { w, simd }, rows, xs, ys),
    }
}

/// The GEMM path: activations packed once per token chunk, each weight decoded once per chunk
/// and task into the panels the micro-kernel reuses for every token.
#[cfg(target_arch = "x86_64")]
fn matmul_gemm<S: x86::gemm::Gemm>(
    s: S,
    w: Weights<'_>,
    rows: usize,
    cols: usize,
    xs: &[f32],
    ys: &mut [f32],
) {
    for (xc, yc) in xs
        .chunks(TOKEN_CHUNK * cols)
        .zip(ys.chunks_mut(TOKEN_CHUNK * rows))
    {
        let packed = x86::gemm::PackedTokens::new(xc, cols, &S::POSITIONS, S::TOKENS);
        let t = packed.tokens();
        for_row_blocks(rows, cols, t, yc, |r0, out| {
            x86::gemm::rows(s, w, &packed, r0, out.len() / t, out)
        });
    }
}

/// A SIMD matmul: activations widened once per token chunk, weights decoded per tile.
#[cfg(target_arch = "x86_64")]
fn matmul_tiled<K: x86::Tile>(k: &K, rows: usize, xs: &[f32], ys: &mut [f32]) {
    let cols = k.cols();
    token_count(rows, cols, xs, ys);
    for (xc, yc) in xs
        .chunks(TOKEN_CHUNK * cols)
        .zip(ys.chunks_mut(TOKEN_CHUNK * rows))
    {
        let t = xc.len() / cols;
        let xw = x86::widen(xc, cols, &<K::Simd as x86::Simd>::POSITIONS);
        for_row_blocks(rows, cols, t, yc, |r0, out| {
            <K::Simd as x86::Simd>::rows(k, r0, out.len() / t, t, &xw, out)
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
            let row = &w.bytes[2 * r * w.cols..2 * (r + 1) * w.cols];
            tree_sum(w.cols, |i| {
                bf16_to_f32(row[2 * i], row[2 * i + 1]) as f64 * x[i] as f64
            })
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
        dot_f32_with(isa, &w[r * cols..(r + 1) * cols], x)
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
                tree_sum(w.cols, |i| mxfp4::element(packed, scales, i) * x[i] as f64)
            })
        }
    }
}
