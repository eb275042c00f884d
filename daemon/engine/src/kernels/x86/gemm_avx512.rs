//! AVX-512F GEMM pieces (see [`super::gemm`]): two register groups of eight f64 per block of
//! sixteen, the even elements in group 0 and the odd ones in group 1 (the tile kernels'
//! [`super::avx512`] layout), a 4-row × 6-token micro-kernel.

use std::arch::x86_64::*;

use super::Positions;
use super::avx512::Avx512;
use super::gemm::{
    Gemm, check_bf16_panel, check_mxfp4_panel, fold_quarters, gemm_forwarders, micro_kernel,
};
use crate::kernels::reduce::LANES;

/// Group 0 holds elements 0, 2, …, 14 of a block, group 1 elements 1, 3, …, 15.
const POSITIONS: Positions = [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15];

/// f64 per register.
const WIDTH: usize = 8;

/// E2M1 codes 0–7 and 8–15 as f64 (spec §3.5; code 8 is −0).
const E2M1_POS: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
const E2M1_NEG: [f64; 8] = [-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

impl Gemm for Avx512 {
    const POSITIONS: Positions = POSITIONS;
    /// 4 rows × 6 tokens = 24 accumulators, 4 weight registers and one activation register of
    /// the 32: measured 49 GFLOP/s on one core of the development machine against 50 for the
    /// broadcast dgemm of `system::gemm_probe` (3 × 8 and 4 × 4 tiles: 45).
    const ROWS: usize = 4;
    const TOKENS: usize = 6;

    gemm_forwarders!();
}

/// `[block][row][16]` panel of `R` BF16 rows: a BF16 is the top half of an f32, so a shift (even
/// element) or a mask (odd element) of each u32 pair and a widening give the exact values.
#[target_feature(enable = "avx512f,avx2")]
fn decode_bf16<const R: usize>(rows: &[u8], cols: usize, b0: usize, nb: usize, panel: &mut [f64]) {
    check_bf16_panel(R, rows, cols, b0, nb, panel);
    let high_half = _mm256_set1_epi32(0xffff_0000u32 as i32);
    for b in 0..nb {
        for r in 0..R {
            // SAFETY: r < R and b0 + b < cols/16, so the 32 bytes at 2·(r·cols + 16(b0+b)) end
            // within 2·R·cols ≤ rows.len() (asserted); loadu has no alignment requirement.
            let v = unsafe {
                _mm256_loadu_si256(rows.as_ptr().add(2 * (r * cols + LANES * (b0 + b))).cast())
            };
            let even = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)));
            let odd = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_and_si256(v, high_half)));
            // SAFETY: (b·R + r + 1)·16 ≤ nb·R·16 ≤ panel.len() (asserted).
            unsafe {
                let p = panel.as_mut_ptr().add((b * R + r) * LANES);
                _mm512_storeu_pd(p, even);
                _mm512_storeu_pd(p.add(WIDTH), odd);
            }
        }
    }
}

/// `[block][row][16]` panel of `R` MXFP4 rows: per row and group of 32 the sixteen values
/// `E2M1(code)·2^(s−127)` (exact) form a two-register table that a two-source permute indexes
/// by nibble (bit 3 picks the negative half).
#[target_feature(enable = "avx512f,avx2")]
fn decode_mxfp4<const R: usize>(
    packed: &[u8],
    scales: &[u8],
    cols: usize,
    b0: usize,
    nb: usize,
    panel: &mut [f64],
) {
    let (half, groups) = check_mxfp4_panel(R, packed, scales, cols, b0, nb, panel);
    // SAFETY: both arrays hold exactly 8 f64 (512 bits); loadu has no alignment requirement.
    let (pos, neg) = unsafe {
        (
            _mm512_loadu_pd(E2M1_POS.as_ptr()),
            _mm512_loadu_pd(E2M1_NEG.as_ptr()),
        )
    };
    for g in b0 / 2..(b0 + nb) / 2 {
        for r in 0..R {
            let s = _mm512_set1_pd(super::SCALES[scales[r * groups + g] as usize]);
            // Multiplying the eight table entries by a power of two is exact.
            let (lo_table, hi_table) = (_mm512_mul_pd(pos, s), _mm512_mul_pd(neg, s));
            for h in 0..2 {
                // SAFETY: r < R, g < cols/32, h < 2: the 8 bytes at r·half + 16g + 8h end
                // within R·half ≤ packed.len() (asserted); the load is unaligned-safe.
                let bytes = unsafe {
                    _mm_loadl_epi64(packed.as_ptr().add(r * half + 16 * g + 8 * h).cast())
                };
                // One byte per u64: its low nibble is the even element (spec §3.5); the permute
                // reads only index bits 0–3.
                let lo = _mm512_cvtepu8_epi64(bytes);
                let hi = _mm512_srli_epi64::<4>(lo);
                let even = _mm512_permutex2var_pd(lo_table, lo, hi_table);
                let odd = _mm512_permutex2var_pd(lo_table, hi, hi_table);
                let b = 2 * g + h - b0;
                // SAFETY: b < nb and r < R, so (b·R + r + 1)·16 ≤ nb·R·16 ≤ panel.len().
                unsafe {
                    let p = panel.as_mut_ptr().add((b * R + r) * LANES);
                    _mm512_storeu_pd(p, even);
                    _mm512_storeu_pd(p.add(WIDTH), odd);
                }
            }
        }
    }
}

/// [`Gemm::fold`]: group 0 holds tree lanes 0, 2, …, 14 and group 1 lanes 1, 3, …, 15, so the
/// first level `t_k = l_k + l_(k+8)` adds each group's two halves.
#[target_feature(enable = "avx512f,avx2")]
fn fold(acc: &[f64]) -> f64 {
    assert!(acc.len() >= LANES, "fold bounds");
    // SAFETY: the 16 f64 are within `acc` (asserted); loadu has no alignment requirement.
    let (g0, g1) = unsafe {
        (
            _mm512_loadu_pd(acc.as_ptr()),
            _mm512_loadu_pd(acc.as_ptr().add(WIDTH)),
        )
    };
    let halves =
        |g: __m512d| _mm256_add_pd(_mm512_castpd512_pd256(g), _mm512_extractf64x4_pd::<1>(g));
    fold_quarters(halves(g0), halves(g1))
}

micro_kernel!(
    "avx512f,avx2",
    WIDTH,
    _mm512_setzero_pd,
    _mm512_loadu_pd,
    _mm512_fmadd_pd,
    _mm512_storeu_pd
);
