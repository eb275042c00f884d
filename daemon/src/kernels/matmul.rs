//! Matrix × activations: `ys[t][r] = round_f32(Σ_i W[r][i] · xs[t][i])` for T token rows.
//!
//! One kernel serves decode (T = 1) and prefill (T > 1): each output element is reduced over
//! `i` with the one tree of [`super::reduce`], so a T-token call equals T one-token calls bit for
//! bit (spec §6.1 rule 5). Threads split only the rows (rule 4).
//!
//! Weights stay in their stored form: BF16 bytes (little-endian, unaligned is fine) or MXFP4
//! packed nibbles + scale bytes, decoded on the fly — never widened into a copy.

use rayon::prelude::*;

use super::mxfp4;
use super::reduce::tree_sum;

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

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 16;

/// Shared driver: `row_dot(r, x)` computes the exact f64 dot of row r with one token row `x`.
fn matmul_rows(
    rows: usize,
    cols: usize,
    xs: &[f32],
    ys: &mut [f32],
    row_dot: impl Fn(usize, &[f32]) -> f64 + Sync,
) {
    assert!(
        cols > 0 && xs.len() % cols == 0,
        "activation length is not a multiple of cols"
    );
    let t = xs.len() / cols;
    assert_eq!(ys.len(), t * rows, "output length");
    // Row-major [rows][t] scratch so that threads own disjoint row blocks; transposed after.
    let mut by_row = vec![0.0f32; rows * t];
    let work = |(block, out): (usize, &mut [f32])| {
        for (k, out_row) in out.chunks_mut(t).enumerate() {
            let r = block * ROWS_PER_TASK + k;
            for (tok, y) in out_row.iter_mut().enumerate() {
                *y = row_dot(r, &xs[tok * cols..(tok + 1) * cols]) as f32;
            }
        }
    };
    if rows * cols * t < PARALLEL_MIN_WORK {
        by_row
            .chunks_mut(ROWS_PER_TASK * t)
            .enumerate()
            .for_each(work);
    } else {
        by_row
            .par_chunks_mut(ROWS_PER_TASK * t)
            .enumerate()
            .for_each(work);
    }
    for r in 0..rows {
        for tok in 0..t {
            ys[tok * rows + r] = by_row[r * t + tok];
        }
    }
}

/// `ys = xs · Wᵀ` for a BF16 weight: `xs` is `[T, cols]`, `ys` is `[T, rows]`.
pub fn matmul_bf16(w: Bf16Matrix<'_>, xs: &[f32], ys: &mut [f32]) {
    matmul_rows(w.rows, w.cols, xs, ys, |r, x| {
        let row = &w.bytes[2 * r * w.cols..2 * (r + 1) * w.cols];
        tree_sum(w.cols, |i| {
            bf16_to_f32(row[2 * i], row[2 * i + 1]) as f64 * x[i] as f64
        })
    });
}

/// `ys = xs · Wᵀ` for an f32 weight given as a slice `[rows, cols]`.
pub fn matmul_f32(w: &[f32], rows: usize, cols: usize, xs: &[f32], ys: &mut [f32]) {
    assert_eq!(w.len(), rows * cols, "f32 matrix length");
    matmul_rows(rows, cols, xs, ys, |r, x| {
        let row = &w[r * cols..(r + 1) * cols];
        tree_sum(cols, |i| row[i] as f64 * x[i] as f64)
    });
}

/// `ys = xs · Wᵀ` for an MXFP4 weight, straight from the packed bytes.
pub fn matmul_mxfp4(w: Mxfp4Matrix<'_>, xs: &[f32], ys: &mut [f32]) {
    let half = w.cols / 2;
    let groups = w.cols / mxfp4::GROUP;
    matmul_rows(w.rows, w.cols, xs, ys, |r, x| {
        let packed = &w.packed[r * half..(r + 1) * half];
        let scales = &w.scales[r * groups..(r + 1) * groups];
        tree_sum(w.cols, |i| mxfp4::element(packed, scales, i) * x[i] as f64)
    });
}
