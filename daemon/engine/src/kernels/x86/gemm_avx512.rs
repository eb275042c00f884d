//! AVX-512F GEMM pieces (see [`super::gemm`]): one register group of sixteen f32 lanes per
//! block of 32 inputs (its even inputs, then its odd ones: the one-token kernels' [`super::avx512`]
//! layout), a 4-row × 6-token micro-kernel.

use std::arch::x86_64::*;

use super::avx512::{Avx512, POSITIONS, WIDTH, bf16_pairs, mxfp4_pairs, mxfp4_table};
use super::gemm::{Gemm, check_bf16_panel, check_mxfp4_panel, gemm_forwarders, micro_kernel};
use super::packed::Positions;
use crate::kernels::tree::PAIR_BLOCK;

impl Gemm for Avx512 {
    const POSITIONS: Positions = POSITIONS;
    /// 4 rows × 6 tokens = 24 accumulators, 4 weight registers and one activation register of
    /// the 32 (the shape the f64 kernel measured best: 3 × 8 and 4 × 4 tiles were slower).
    const ROWS: usize = 4;
    const TOKENS: usize = 6;

    gemm_forwarders!();
}

/// Stores a block's two halves at panel offset `at`.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn store_pairs(panel: &mut [f32], at: usize, [even, odd]: [__m512; 2]) {
    assert!(panel.len() >= at + PAIR_BLOCK, "panel store bounds");
    // SAFETY: the 32 f32 at `at` are within `panel` (asserted); stores are unaligned-safe.
    unsafe {
        _mm512_storeu_ps(panel.as_mut_ptr().add(at), even);
        _mm512_storeu_ps(panel.as_mut_ptr().add(at + WIDTH), odd);
    }
}

/// `[block][row][32]` panel of `R` BF16 rows (shift / mask of each 32-bit pair).
#[target_feature(enable = "avx512f,avx2,fma")]
fn decode_bf16<const R: usize>(rows: &[u8], cols: usize, b0: usize, nb: usize, panel: &mut [f32]) {
    check_bf16_panel(R, rows, cols, b0, nb, panel);
    for b in 0..nb {
        for r in 0..R {
            // SAFETY: r < R and b0 + b < cols/32, so the 64 bytes at 2·(r·cols + 32(b0+b)) end
            // within 2·R·cols ≤ rows.len() (asserted); loadu has no alignment requirement.
            let v = unsafe {
                _mm512_loadu_si512(
                    rows.as_ptr()
                        .add(2 * (r * cols + PAIR_BLOCK * (b0 + b)))
                        .cast(),
                )
            };
            store_pairs(panel, (b * R + r) * PAIR_BLOCK, bf16_pairs(v));
        }
    }
}

/// `[block][row][32]` panel of `R` MXFP4 rows: per row and block (one scale group) the sixteen
/// values of the scale form the table a permute indexes by nibble.
#[target_feature(enable = "avx512f,avx2,fma")]
fn decode_mxfp4<const R: usize>(
    packed: &[u8],
    scales: &[u8],
    cols: usize,
    b0: usize,
    nb: usize,
    panel: &mut [f32],
) {
    let (half, groups) = check_mxfp4_panel(R, packed, scales, cols, b0, nb, panel);
    for b in 0..nb {
        let g = b0 + b;
        for r in 0..R {
            // SAFETY: r < R and g < cols/32: the 16 bytes at r·half + 16g end within
            // R·half ≤ packed.len() (asserted); the load is unaligned-safe.
            let bytes = unsafe { _mm_loadu_si128(packed.as_ptr().add(r * half + 16 * g).cast()) };
            let table = mxfp4_table(scales[r * groups + g]);
            store_pairs(panel, (b * R + r) * PAIR_BLOCK, mxfp4_pairs(table, bytes));
        }
    }
}

micro_kernel!(
    "avx512f,avx2,fma",
    WIDTH,
    _mm512_setzero_ps,
    _mm512_loadu_ps,
    _mm512_fmadd_ps,
    _mm512_storeu_ps
);
