//! AVX2 + FMA GEMM pieces (see [`super::gemm`]): four register groups of four f64 per block of
//! sixteen — elements {0,2,4,6}, {1,3,5,7}, {8,10,12,14}, {9,11,13,15}, the tile kernels'
//! [`super::avx2`] layout — and a 3-row × 4-token micro-kernel.

use std::arch::x86_64::*;

use super::Positions;
use super::avx2::Avx2;
use super::gemm::{
    Gemm, check_bf16_panel, check_mxfp4_panel, fold_quarters, gemm_forwarders, micro_kernel,
};
use crate::kernels::mxfp4;
use crate::kernels::reduce::LANES;

const POSITIONS: Positions = [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15];

/// f64 per register.
const WIDTH: usize = 4;

impl Gemm for Avx2 {
    const POSITIONS: Positions = POSITIONS;
    /// 3 rows × 4 tokens = 12 accumulators, 3 weight registers and one activation register: all
    /// 16 ymm registers.
    const ROWS: usize = 3;
    const TOKENS: usize = 4;

    gemm_forwarders!();
}

/// `[block][row][16]` panel of `R` BF16 rows (shift / mask of each u32 pair, then widen).
#[target_feature(enable = "avx2,fma")]
fn decode_bf16<const R: usize>(rows: &[u8], cols: usize, b0: usize, nb: usize, panel: &mut [f64]) {
    check_bf16_panel(R, rows, cols, b0, nb, panel);
    let high_half = _mm_set1_epi32(0xffff_0000u32 as i32);
    for b in 0..nb {
        for r in 0..R {
            let at = 2 * (r * cols + LANES * (b0 + b));
            // SAFETY: r < R and b0 + b < cols/16, so the 32 bytes at `at` end within
            // 2·R·cols ≤ rows.len() (asserted); loadu has no alignment requirement.
            let (v0, v1) = unsafe {
                let p = rows.as_ptr().add(at);
                (_mm_loadu_si128(p.cast()), _mm_loadu_si128(p.add(16).cast()))
            };
            for (k, v) in [v0, v1].into_iter().enumerate() {
                let even = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32::<16>(v)));
                let odd = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_and_si128(v, high_half)));
                // SAFETY: (b·R + r)·16 + 8k + 8 ≤ nb·R·16 ≤ panel.len() (asserted).
                unsafe {
                    let p = panel.as_mut_ptr().add((b * R + r) * LANES + 2 * k * WIDTH);
                    _mm256_storeu_pd(p, even);
                    _mm256_storeu_pd(p.add(WIDTH), odd);
                }
            }
        }
    }
}

/// `[block][row][16]` panel of `R` MXFP4 rows: each nibble indexes the 8-entry f32 magnitude
/// table (bits 0–2), bit 3 becomes the sign, the exact E2M1 value is widened and multiplied by
/// the group's power of two (exact).
#[target_feature(enable = "avx2,fma")]
fn decode_mxfp4<const R: usize>(
    packed: &[u8],
    scales: &[u8],
    cols: usize,
    b0: usize,
    nb: usize,
    panel: &mut [f64],
) {
    let (half, groups) = check_mxfp4_panel(R, packed, scales, cols, b0, nb, panel);
    // SAFETY: E2M1_MAGNITUDE holds exactly 8 f32 (256 bits); loadu is unaligned-safe.
    let magnitude = unsafe { _mm256_loadu_ps(mxfp4::E2M1_MAGNITUDE.as_ptr()) };
    let sign = _mm256_set1_epi32(i32::MIN);
    let decode = |code: __m256i| {
        let m = _mm256_permutevar8x32_ps(magnitude, code);
        let s = _mm256_and_si256(_mm256_slli_epi32::<28>(code), sign);
        _mm256_or_ps(m, _mm256_castsi256_ps(s))
    };
    for g in b0 / 2..(b0 + nb) / 2 {
        for r in 0..R {
            let s = _mm256_set1_pd(super::SCALES[scales[r * groups + g] as usize]);
            for h in 0..2 {
                // SAFETY: r < R, g < cols/32, h < 2: the 8 bytes at r·half + 16g + 8h end
                // within R·half ≤ packed.len() (asserted); the load is unaligned-safe.
                let bytes = unsafe {
                    _mm_loadl_epi64(packed.as_ptr().add(r * half + 16 * g + 8 * h).cast())
                };
                // One byte per u32: the low nibble is the even element (spec §3.5).
                let lo_code = _mm256_cvtepu8_epi32(bytes);
                let even = decode(lo_code);
                let odd = decode(_mm256_srli_epi32::<4>(lo_code));
                let quarters = [
                    _mm256_castps256_ps128(even),
                    _mm256_castps256_ps128(odd),
                    _mm256_extractf128_ps::<1>(even),
                    _mm256_extractf128_ps::<1>(odd),
                ];
                let b = 2 * g + h - b0;
                for (k, q) in quarters.into_iter().enumerate() {
                    let v = _mm256_mul_pd(_mm256_cvtps_pd(q), s);
                    // SAFETY: b < nb, r < R, k < 4: the 4 f64 end within nb·R·16 ≤ panel.len().
                    unsafe {
                        _mm256_storeu_pd(panel.as_mut_ptr().add((b * R + r) * LANES + k * WIDTH), v)
                    };
                }
            }
        }
    }
}

/// [`Gemm::fold`]: the four groups hold tree lanes {0,2,4,6}, {1,3,5,7}, {8,10,12,14} and
/// {9,11,13,15}, so the first level `t_k = l_k + l_(k+8)` adds groups 0 and 2, 1 and 3.
#[target_feature(enable = "avx2,fma")]
fn fold(acc: &[f64]) -> f64 {
    assert!(acc.len() >= LANES, "fold bounds");
    // SAFETY: called with k < 4, so the 4 f64 at 4k are within the 16 of `acc` (asserted);
    // loadu has no alignment requirement.
    let g = |k: usize| unsafe { _mm256_loadu_pd(acc.as_ptr().add(k * WIDTH)) };
    fold_quarters(_mm256_add_pd(g(0), g(2)), _mm256_add_pd(g(1), g(3)))
}

micro_kernel!(
    "avx2,fma",
    WIDTH,
    _mm256_setzero_pd,
    _mm256_loadu_pd,
    _mm256_fmadd_pd,
    _mm256_storeu_pd
);
