//! AVX2 + FMA GEMM pieces (see [`super::gemm`]): two register groups of eight f32 lanes per
//! block of 32 inputs (lanes 0–7: even inputs 0–14, odd inputs 1–15; lanes 8–15 likewise for
//! 16–31: the one-token kernels' [`super::avx2`] layout), a 3-row × 3-token micro-kernel.

use std::arch::x86_64::*;

use super::avx2::{Avx2, POSITIONS, WIDTH, bf16_pairs, mxfp4_magnitudes, mxfp4_pairs};
use super::gemm::{Gemm, check_bf16_panel, check_mxfp4_panel, gemm_forwarders, micro_kernel};
use super::packed::Positions;
use crate::kernels::tree::PAIR_BLOCK;

impl Gemm for Avx2 {
    const POSITIONS: Positions = POSITIONS;
    /// 3 rows × 3 tokens = 9 accumulators, 3 weight registers and one activation register of
    /// the 16 ymm registers, 6 loads per 9 FMAs. 3 × 4 used all 16, and the compiler spilled
    /// accumulators to the stack in the inner loop (a store and a reload in each FMA chain):
    /// prefill ran at half the rate of numpy's SGEMM (issue 41).
    const ROWS: usize = 3;
    const TOKENS: usize = 3;

    gemm_forwarders!();
}

/// Stores one register group's two halves (sixteen inputs) at panel offset `at`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn store_pairs(panel: &mut [f32], at: usize, [even, odd]: [__m256; 2]) {
    assert!(panel.len() >= at + 2 * WIDTH, "panel store bounds");
    // SAFETY: the 16 f32 at `at` are within `panel` (asserted); stores are unaligned-safe.
    unsafe {
        _mm256_storeu_ps(panel.as_mut_ptr().add(at), even);
        _mm256_storeu_ps(panel.as_mut_ptr().add(at + WIDTH), odd);
    }
}

/// `[block][row][32]` panel of `R` BF16 rows (shift / mask of each 32-bit pair).
#[target_feature(enable = "avx2,fma")]
fn decode_bf16<const R: usize>(rows: &[u8], cols: usize, b0: usize, nb: usize, panel: &mut [f32]) {
    check_bf16_panel(R, rows, cols, b0, nb, panel);
    for b in 0..nb {
        for r in 0..R {
            let at = 2 * (r * cols + PAIR_BLOCK * (b0 + b));
            for g in 0..2 {
                // SAFETY: r < R, b0 + b < cols/32 and g < 2: the 32 bytes at at + 32g end
                // within 2·R·cols ≤ rows.len() (asserted); loadu has no alignment requirement.
                let v = unsafe { _mm256_loadu_si256(rows.as_ptr().add(at + 32 * g).cast()) };
                store_pairs(
                    panel,
                    (b * R + r) * PAIR_BLOCK + 2 * WIDTH * g,
                    bf16_pairs(v),
                );
            }
        }
    }
}

/// `[block][row][32]` panel of `R` MXFP4 rows: per row and block (one scale group) the eight
/// magnitudes of the scale, indexed by nibble, the sign from bit 3.
#[target_feature(enable = "avx2,fma")]
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
            let magnitudes = mxfp4_magnitudes(scales[r * groups + g]);
            for q in 0..2 {
                // SAFETY: r < R, g < cols/32, q < 2: the 8 bytes at r·half + 16g + 8q end within
                // R·half ≤ packed.len() (asserted); the load is unaligned-safe.
                let bytes = unsafe {
                    _mm_loadl_epi64(packed.as_ptr().add(r * half + 16 * g + 8 * q).cast())
                };
                let at = (b * R + r) * PAIR_BLOCK + 2 * WIDTH * q;
                store_pairs(panel, at, mxfp4_pairs(magnitudes, bytes));
            }
        }
    }
}

micro_kernel!(
    "avx2,fma",
    WIDTH,
    _mm256_setzero_ps,
    _mm256_loadu_ps,
    _mm256_fmadd_ps,
    _mm256_storeu_ps
);
