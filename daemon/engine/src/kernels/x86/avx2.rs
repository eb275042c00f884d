//! AVX2 + FMA kernels: 8 f32 lanes per register, two register groups per weight tree (lanes
//! 0–7 and 8–15), and the f64 dot of the f64 tree (4 f64 lanes per register).
//!
//! A block of 32 inputs is packed as [`POSITIONS`]: the even inputs 0, 2, …, 14, the odd ones
//! 1, 3, …, 15, then the same for 16–31 — what sixteen BF16 values (one ymm load) and eight
//! MXFP4 bytes decode to without a shuffle (see the parent module).

use std::arch::x86_64::*;

use super::packed::{Positions, pair_positions};
use super::{MXFP4_PREFETCH_BYTES, PREFETCH_BYTES, Simd, fold_natural, simd_forwarders};
use crate::kernels::mxfp4::{self, SCALED_E2M1_F32};
use crate::kernels::tree::{LANES, PAIR_BLOCK};

/// f32 per register.
pub(super) const WIDTH: usize = 8;

pub(super) const POSITIONS: Positions = pair_positions(WIDTH);

/// Proof that the running CPU supports AVX2 and FMA.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2(());

impl Avx2 {
    /// # Safety
    /// The running CPU must support AVX2 and FMA.
    pub(crate) unsafe fn new() -> Self {
        Avx2(())
    }
}

impl Simd for Avx2 {
    const POSITIONS: Positions = POSITIONS;

    // Two rows: 4 accumulators, 4 activation registers, the table and the decoding temporaries
    // fit the 16 ymm registers; with four rows the MXFP4 kernel spilled its accumulators to the
    // stack and ran at a fifth of the stream bandwidth (kernel_bench, issue 41).
    simd_forwarders!(2);
}

/// The even and odd inputs of sixteen BF16 values (32 bytes): a BF16 is the top half of an
/// f32, so shifting each 32-bit pair up gives the even input, masking it the odd one — exact.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn bf16_pairs(v: __m256i) -> [__m256; 2] {
    let high_half = _mm256_set1_epi32(0xffff_0000u32 as i32);
    [
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)),
        _mm256_castsi256_ps(_mm256_and_si256(v, high_half)),
    ]
}

/// The eight positive values `E2M1(c)·2^(s−127)`, c = 0–7, of scale byte `s` (f32, exact up to
/// s = 252; spec §3.5).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn mxfp4_magnitudes(s: u8) -> __m256 {
    // SAFETY: each row of the table holds 16 f32; the load reads its first 8.
    unsafe { _mm256_loadu_ps(SCALED_E2M1_F32[s as usize].as_ptr()) }
}

/// The even and odd inputs of eight MXFP4 bytes (sixteen inputs): each byte widened to a
/// 32-bit lane, its low nibble (the even input, spec §3.5) indexes the eight magnitudes (the
/// permute reads index bits 0–2) and its bit 3 becomes the f32 sign; the high nibble likewise
/// after a shift.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn mxfp4_pairs(magnitudes: __m256, bytes: __m128i) -> [__m256; 2] {
    let sign = _mm256_set1_epi32(i32::MIN);
    let code = _mm256_cvtepu8_epi32(bytes);
    let value = |code: __m256i, sign_bit: __m256i| {
        let m = _mm256_permutevar8x32_ps(magnitudes, code);
        _mm256_or_ps(m, _mm256_castsi256_ps(_mm256_and_si256(sign_bit, sign)))
    };
    [
        value(code, _mm256_slli_epi32::<28>(code)),
        value(_mm256_srli_epi32::<4>(code), _mm256_slli_epi32::<24>(code)),
    ]
}

/// The four packed activation registers of block `b`: even and odd inputs of lanes 0–7, then
/// of lanes 8–15.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn x_block(x: &[f32], b: usize) -> [__m256; 4] {
    assert!(x.len() >= PAIR_BLOCK * (b + 1), "x block bounds");
    // SAFETY: the 32 f32 at 32b are within `x` (asserted); loads are unaligned-safe.
    std::array::from_fn(|k| unsafe { _mm256_loadu_ps(x.as_ptr().add(PAIR_BLOCK * b + WIDTH * k)) })
}

/// Stores the two lane registers of each row in lane order.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn store_lanes<const R: usize>(a: &[[__m256; 2]; R], lanes: &mut [[f32; LANES]; R]) {
    for (ar, lr) in a.iter().zip(lanes.iter_mut()) {
        // SAFETY: `lr` holds 16 f32; the stores write elements 0–7 and 8–15.
        unsafe {
            _mm256_storeu_ps(lr.as_mut_ptr(), ar[0]);
            _mm256_storeu_ps(lr.as_mut_ptr().add(WIDTH), ar[1]);
        }
    }
}

/// Weight-tree lanes of `R` BF16 rows against one packed activation row.
#[target_feature(enable = "avx2,fma")]
fn bf16_lanes<const R: usize>(w: &[u8], cols: usize, x: &[f32], lanes: &mut [[f32; LANES]; R]) {
    let blocks = cols / PAIR_BLOCK;
    assert!(
        w.len() >= 2 * R * cols && x.len() >= PAIR_BLOCK * blocks,
        "bf16 tile bounds"
    );
    let mut a = [[_mm256_setzero_ps(); 2]; R];
    for b in 0..blocks {
        let xb = x_block(x, b);
        for (r, ar) in a.iter_mut().enumerate() {
            let at = 2 * (r * cols + PAIR_BLOCK * b);
            // A prefetch never faults, and `wrapping_add` keeps the address computation defined
            // past the end of the slice.
            _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().wrapping_add(at + PREFETCH_BYTES).cast());
            for (g, lane) in ar.iter_mut().enumerate() {
                // SAFETY: r < R, b < cols/32, g < 2: the 32 bytes at at + 32g end within
                // 2·R·cols ≤ w.len() (asserted); loadu has no alignment requirement.
                let v = unsafe { _mm256_loadu_si256(w.as_ptr().add(at + 32 * g).cast()) };
                let [even, odd] = bf16_pairs(v);
                *lane = _mm256_fmadd_ps(even, xb[2 * g], *lane);
                *lane = _mm256_fmadd_ps(odd, xb[2 * g + 1], *lane);
            }
        }
    }
    store_lanes(&a, lanes);
}

/// Weight-tree lanes of `R` MXFP4 rows against one packed activation row (a block of 32 inputs
/// is one scale group).
#[target_feature(enable = "avx2,fma")]
fn mxfp4_lanes<const R: usize>(
    packed: &[u8],
    scales: &[u8],
    cols: usize,
    x: &[f32],
    lanes: &mut [[f32; LANES]; R],
) {
    let (half, groups) = (cols / 2, cols / mxfp4::GROUP);
    assert!(
        packed.len() >= R * half && scales.len() >= R * groups && x.len() >= PAIR_BLOCK * groups,
        "mxfp4 tile bounds"
    );
    let mut a = [[_mm256_setzero_ps(); 2]; R];
    for g in 0..groups {
        let xb = x_block(x, g);
        for (r, ar) in a.iter_mut().enumerate() {
            let at = r * half + 16 * g;
            _mm_prefetch::<_MM_HINT_T0>(
                packed
                    .as_ptr()
                    .wrapping_add(at + MXFP4_PREFETCH_BYTES)
                    .cast(),
            );
            let magnitudes = mxfp4_magnitudes(scales[r * groups + g]);
            for (q, lane) in ar.iter_mut().enumerate() {
                // SAFETY: r < R, g < cols/32, q < 2: the 8 bytes at at + 8q end within
                // R·half ≤ packed.len() (asserted); the load is unaligned-safe.
                let bytes = unsafe { _mm_loadl_epi64(packed.as_ptr().add(at + 8 * q).cast()) };
                let [even, odd] = mxfp4_pairs(magnitudes, bytes);
                *lane = _mm256_fmadd_ps(even, xb[2 * q], *lane);
                *lane = _mm256_fmadd_ps(odd, xb[2 * q + 1], *lane);
            }
        }
    }
    store_lanes(&a, lanes);
}

/// `Σ a_i·b_i` with the f64 tree (natural lane order: register k = lanes 4k … 4k+3).
///
/// # Safety
/// The running CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len().min(b.len());
    let full = n - n % LANES;
    let mut l = [_mm256_setzero_pd(); 4];
    for base in (0..full).step_by(LANES) {
        for (k, lk) in l.iter_mut().enumerate() {
            // SAFETY: base + 4k + 4 ≤ base + 16 ≤ full ≤ n ≤ len of both slices.
            let (va, vb) = unsafe {
                (
                    _mm_loadu_ps(a.as_ptr().add(base + 4 * k)),
                    _mm_loadu_ps(b.as_ptr().add(base + 4 * k)),
                )
            };
            *lk = _mm256_fmadd_pd(_mm256_cvtps_pd(va), _mm256_cvtps_pd(vb), *lk);
        }
    }
    let mut lanes = [0.0f64; LANES];
    for (k, &v) in l.iter().enumerate() {
        // SAFETY: `lanes` is 16 f64 and k < 4: the store writes elements 4k … 4k+3.
        unsafe { _mm256_storeu_pd(lanes.as_mut_ptr().add(4 * k), v) };
    }
    fold_natural(&lanes, full, n, |i| a[i] as f64 * b[i] as f64)
}
