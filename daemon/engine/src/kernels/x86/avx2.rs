//! AVX2 + FMA kernels: 4 f64 lanes per register, four registers per tree of sixteen.
//!
//! Register layout of a block of sixteen elements (both weight formats): elements
//! {0,2,4,6}, {1,3,5,7}, {8,10,12,14}, {9,11,13,15} — the even/odd split that BF16 pairs and
//! MXFP4 bytes give without shuffling (see the parent module).

use std::arch::x86_64::*;

use super::{
    Acc, PREFETCH_BYTES, Positions, SCALES, Simd, Tile, drive, fold_natural, tile_forwarders,
};
use crate::kernels::mxfp4;
use crate::kernels::reduce::LANES;

const POSITIONS: Positions = [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15];

/// Decode (one token): 2 rows × 4 registers = 8 accumulator chains in the 16 ymm registers.
const DECODE_ROWS: usize = 2;
/// Prefill: 1 row × 2 tokens, each decoded weight register feeding both tokens.
const PREFILL_TOKENS: usize = 2;

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

    tile_forwarders!();

    fn rows<K: Tile>(k: &K, r0: usize, n: usize, t: usize, xw: &[f64], out: &mut [f32]) {
        if t == 1 {
            drive::<K, DECODE_ROWS, 1>(k, r0, n, t, xw, out);
        } else {
            drive::<K, 1, PREFILL_TOKENS>(k, r0, n, t, xw, out);
        }
    }
}

#[target_feature(enable = "avx2,fma")]
fn bf16_tile<const R: usize, const TC: usize>(
    w: &[u8],
    cols: usize,
    xw: &[f64],
    acc: &mut Acc<R, TC>,
) {
    assert!(
        w.len() >= 2 * R * cols && xw.len() >= TC * cols,
        "bf16 tile bounds"
    );
    let blocks = cols / LANES;
    let high_half = _mm_set1_epi32(0xffff_0000u32 as i32);
    let mut a = [[[_mm256_setzero_pd(); 4]; TC]; R];
    for b in 0..blocks {
        let mut wv = [[_mm256_setzero_pd(); 4]; R];
        for (r, wr) in wv.iter_mut().enumerate() {
            // SAFETY: r < R and b < cols/16, so the 32 bytes at 2·(r·cols + 16b) end at most at
            // 2·R·cols ≤ w.len() (asserted); loadu has no alignment requirement.
            let (v0, v1) = unsafe {
                let p = w.as_ptr().add(2 * (r * cols + LANES * b));
                (_mm_loadu_si128(p.cast()), _mm_loadu_si128(p.add(16).cast()))
            };
            // A prefetch never faults, and `wrapping_add` keeps the address computation defined
            // past the end of the slice.
            _mm_prefetch::<_MM_HINT_T0>(
                w.as_ptr()
                    .wrapping_add(2 * (r * cols + LANES * b) + PREFETCH_BYTES)
                    .cast(),
            );
            // A BF16 is the top half of an f32: shift the even element up, mask the odd one.
            for (k, v) in [v0, v1].into_iter().enumerate() {
                wr[2 * k] = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32::<16>(v)));
                wr[2 * k + 1] = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_and_si128(v, high_half)));
            }
        }
        accumulate(&mut a, &wv, xw, cols, b);
    }
    store(&a, acc);
}

/// MXFP4 rows: each nibble indexes an 8-entry f32 magnitude table (the permute reads index
/// bits 0–2), bit 3 becomes the f32 sign; the exact E2M1 value is widened to f64 and multiplied
/// by the group's power of two (exact).
#[target_feature(enable = "avx2,fma")]
fn mxfp4_tile<const R: usize, const TC: usize>(
    packed: &[u8],
    scales: &[u8],
    cols: usize,
    xw: &[f64],
    acc: &mut Acc<R, TC>,
) {
    let (half, groups) = (cols / 2, cols / mxfp4::GROUP);
    assert!(
        packed.len() >= R * half && scales.len() >= R * groups && xw.len() >= TC * cols,
        "mxfp4 tile bounds"
    );
    // SAFETY: E2M1_MAGNITUDE holds exactly 8 f32 (256 bits); loadu is unaligned-safe.
    let magnitude = unsafe { _mm256_loadu_ps(mxfp4::E2M1_MAGNITUDE.as_ptr()) };
    let sign = _mm256_set1_epi32(i32::MIN);
    let decode = |code: __m256i| {
        let m = _mm256_permutevar8x32_ps(magnitude, code);
        let s = _mm256_and_si256(_mm256_slli_epi32::<28>(code), sign);
        _mm256_or_ps(m, _mm256_castsi256_ps(s))
    };
    let mut a = [[[_mm256_setzero_pd(); 4]; TC]; R];
    for g in 0..groups {
        for h in 0..2 {
            let b = 2 * g + h;
            let mut wv = [[_mm256_setzero_pd(); 4]; R];
            for (r, wr) in wv.iter_mut().enumerate() {
                let s = _mm256_set1_pd(SCALES[scales[r * groups + g] as usize]);
                // SAFETY: r < R, g < cols/32, h < 2: the 8 bytes at r·half + 16g + 8h end at
                // most at R·half ≤ packed.len() (asserted); the load is unaligned-safe.
                let bytes = unsafe {
                    _mm_loadl_epi64(packed.as_ptr().add(r * half + 16 * g + 8 * h).cast())
                };
                // One byte per u32: the low nibble is the even element (spec §3.5).
                let lo_code = _mm256_cvtepu8_epi32(bytes);
                let even = decode(lo_code);
                let odd = decode(_mm256_srli_epi32::<4>(lo_code));
                let halves = [
                    _mm256_castps256_ps128(even),
                    _mm256_castps256_ps128(odd),
                    _mm256_extractf128_ps::<1>(even),
                    _mm256_extractf128_ps::<1>(odd),
                ];
                for (w, q) in wr.iter_mut().zip(halves) {
                    *w = _mm256_mul_pd(_mm256_cvtps_pd(q), s);
                }
            }
            accumulate(&mut a, &wv, xw, cols, b);
        }
    }
    store(&a, acc);
}

/// `a[r][t] += wv[r] · x_t` over block `b` for every row and token of the tile.
// `t` indexes the token dimension of `a` (inner) and the rows of `xw` together.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn accumulate<const R: usize, const TC: usize>(
    a: &mut [[[__m256d; 4]; TC]; R],
    wv: &[[__m256d; 4]; R],
    xw: &[f64],
    cols: usize,
    b: usize,
) {
    assert!(
        xw.len() >= TC * cols && LANES * (b + 1) <= cols,
        "x tile bounds"
    );
    for t in 0..TC {
        let mut x = [_mm256_setzero_pd(); 4];
        for (k, xk) in x.iter_mut().enumerate() {
            // SAFETY: t < TC, 16(b+1) ≤ cols (asserted) and k < 4, so the 4 f64 at
            // t·cols + 16b + 4k end within TC·cols ≤ xw.len().
            *xk = unsafe { _mm256_loadu_pd(xw.as_ptr().add(t * cols + LANES * b + 4 * k)) };
        }
        for r in 0..R {
            for k in 0..4 {
                a[r][t][k] = _mm256_fmadd_pd(wv[r][k], x[k], a[r][t][k]);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma")]
fn store<const R: usize, const TC: usize>(a: &[[[__m256d; 4]; TC]; R], acc: &mut Acc<R, TC>) {
    for (ar, accr) in a.iter().zip(acc.iter_mut()) {
        for (at, acct) in ar.iter().zip(accr.iter_mut()) {
            for (k, &v) in at.iter().enumerate() {
                // SAFETY: `acct` is 16 f64 and k < 4: the store writes elements 4k … 4k+3.
                unsafe { _mm256_storeu_pd(acct.as_mut_ptr().add(4 * k), v) };
            }
        }
    }
}

/// `Σ a_i·b_i` with the fixed tree (natural lane order: register k = lanes 4k … 4k+3).
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
