//! AVX-512F kernels: 16 f32 lanes per register, one register per weight tree, and the f64 dot
//! of the f64 tree (8 f64 lanes per register).
//!
//! A block of 32 inputs is packed as [`POSITIONS`]: the even inputs 0, 2, …, 30, then the odd
//! ones 1, 3, …, 31 — what 32 BF16 values (one zmm load) and sixteen MXFP4 bytes decode to
//! without a shuffle of the weights (see the parent module).

use std::arch::x86_64::*;

use super::packed::{Positions, pair_positions};
use super::{MXFP4_PREFETCH_BYTES, PREFETCH_BYTES, Simd, fold_natural, simd_forwarders};
use crate::kernels::mxfp4::{self, SCALED_E2M1_F32};
use crate::kernels::tree::{LANES, PAIR_BLOCK};

/// f32 per register.
pub(super) const WIDTH: usize = 16;

pub(super) const POSITIONS: Positions = pair_positions(WIDTH);

/// Proof that the running CPU supports AVX-512F, AVX2 and FMA.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512(());

impl Avx512 {
    /// # Safety
    /// The running CPU must support AVX-512F, AVX2 and FMA.
    pub(crate) unsafe fn new() -> Self {
        Avx512(())
    }
}

impl Simd for Avx512 {
    const POSITIONS: Positions = POSITIONS;

    // Four rows: 4 accumulators and 2 activation registers of the 32 zmm, four independent
    // FMA chains per block.
    simd_forwarders!(4);
}

/// The even and odd inputs of 32 BF16 values (64 bytes): a BF16 is the top half of an f32, so
/// shifting each 32-bit pair up gives the even input, masking it the odd one — exact.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(super) fn bf16_pairs(v: __m512i) -> [__m512; 2] {
    let high_half = _mm512_set1_epi32(0xffff_0000u32 as i32);
    [
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v)),
        _mm512_castsi512_ps(_mm512_and_si512(v, high_half)),
    ]
}

/// The sixteen values `E2M1(c)·2^(s−127)`, c = 0–15, of scale byte `s` (f32, exact up to
/// s = 252; spec §3.5): one register a permute indexes by nibble.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(super) fn mxfp4_table(s: u8) -> __m512 {
    // SAFETY: each row of the table holds exactly 16 f32 (512 bits).
    unsafe { _mm512_loadu_ps(SCALED_E2M1_F32[s as usize].as_ptr()) }
}

/// The even and odd inputs of sixteen MXFP4 bytes (one group of 32 inputs): each byte widened
/// to a 32-bit lane; the permute reads index bits 0–3, which are the low nibble (the even
/// input, spec §3.5), and after a shift the high nibble.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(super) fn mxfp4_pairs(table: __m512, bytes: __m128i) -> [__m512; 2] {
    let code = _mm512_cvtepu8_epi32(bytes);
    [
        _mm512_permutexvar_ps(code, table),
        _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(code), table),
    ]
}

/// The two packed activation registers of block `b`: its even inputs, then its odd ones.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn x_block(x: &[f32], b: usize) -> [__m512; 2] {
    assert!(x.len() >= PAIR_BLOCK * (b + 1), "x block bounds");
    // SAFETY: the 32 f32 at 32b are within `x` (asserted); loads are unaligned-safe.
    std::array::from_fn(|h| unsafe { _mm512_loadu_ps(x.as_ptr().add(PAIR_BLOCK * b + WIDTH * h)) })
}

/// Stores each row's lane register in lane order.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn store_lanes<const R: usize>(a: &[__m512; R], lanes: &mut [[f32; LANES]; R]) {
    for (ar, lr) in a.iter().zip(lanes.iter_mut()) {
        // SAFETY: `lr` holds exactly 16 f32.
        unsafe { _mm512_storeu_ps(lr.as_mut_ptr(), *ar) };
    }
}

/// Weight-tree lanes of `R` BF16 rows against one packed activation row.
#[target_feature(enable = "avx512f,avx2,fma")]
fn bf16_lanes<const R: usize>(w: &[u8], cols: usize, x: &[f32], lanes: &mut [[f32; LANES]; R]) {
    let blocks = cols / PAIR_BLOCK;
    assert!(
        w.len() >= 2 * R * cols && x.len() >= PAIR_BLOCK * blocks,
        "bf16 tile bounds"
    );
    let mut a = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let [x_even, x_odd] = x_block(x, b);
        for (r, lane) in a.iter_mut().enumerate() {
            let at = 2 * (r * cols + PAIR_BLOCK * b);
            // A prefetch never faults, and `wrapping_add` keeps the address computation defined
            // past the end of the slice.
            _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().wrapping_add(at + PREFETCH_BYTES).cast());
            // SAFETY: r < R and b < cols/32: the 64 bytes at `at` end within 2·R·cols ≤
            // w.len() (asserted); loadu has no alignment requirement.
            let v = unsafe { _mm512_loadu_si512(w.as_ptr().add(at).cast()) };
            let [even, odd] = bf16_pairs(v);
            *lane = _mm512_fmadd_ps(even, x_even, *lane);
            *lane = _mm512_fmadd_ps(odd, x_odd, *lane);
        }
    }
    store_lanes(&a, lanes);
}

/// Weight-tree lanes of `R` MXFP4 rows against one packed activation row (a block of 32 inputs
/// is one scale group).
#[target_feature(enable = "avx512f,avx2,fma")]
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
    let mut a = [_mm512_setzero_ps(); R];
    for g in 0..groups {
        let [x_even, x_odd] = x_block(x, g);
        for (r, lane) in a.iter_mut().enumerate() {
            let at = r * half + 16 * g;
            _mm_prefetch::<_MM_HINT_T0>(
                packed
                    .as_ptr()
                    .wrapping_add(at + MXFP4_PREFETCH_BYTES)
                    .cast(),
            );
            // SAFETY: r < R and g < cols/32: the 16 bytes at `at` end within R·half ≤
            // packed.len() (asserted); the load is unaligned-safe.
            let bytes = unsafe { _mm_loadu_si128(packed.as_ptr().add(at).cast()) };
            let [even, odd] = mxfp4_pairs(mxfp4_table(scales[r * groups + g]), bytes);
            *lane = _mm512_fmadd_ps(even, x_even, *lane);
            *lane = _mm512_fmadd_ps(odd, x_odd, *lane);
        }
    }
    store_lanes(&a, lanes);
}

/// `Σ a_i·b_i` with the f64 tree (natural lane order: register 0 = lanes 0–7).
///
/// # Safety
/// The running CPU must support AVX-512F, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn dot(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len().min(b.len());
    let full = n - n % LANES;
    let (mut l0, mut l1) = (_mm512_setzero_pd(), _mm512_setzero_pd());
    for base in (0..full).step_by(LANES) {
        // SAFETY: base + 16 ≤ full ≤ n ≤ len of both slices; loads are unaligned-safe.
        let (a0, a1, b0, b1) = unsafe {
            let (pa, pb) = (a.as_ptr().add(base), b.as_ptr().add(base));
            (
                _mm256_loadu_ps(pa),
                _mm256_loadu_ps(pa.add(8)),
                _mm256_loadu_ps(pb),
                _mm256_loadu_ps(pb.add(8)),
            )
        };
        l0 = _mm512_fmadd_pd(_mm512_cvtps_pd(a0), _mm512_cvtps_pd(b0), l0);
        l1 = _mm512_fmadd_pd(_mm512_cvtps_pd(a1), _mm512_cvtps_pd(b1), l1);
    }
    let mut lanes = [0.0f64; LANES];
    // SAFETY: `lanes` is 16 f64; the two stores write elements 0–7 and 8–15.
    unsafe {
        _mm512_storeu_pd(lanes.as_mut_ptr(), l0);
        _mm512_storeu_pd(lanes.as_mut_ptr().add(8), l1);
    }
    fold_natural(&lanes, full, n, |i| a[i] as f64 * b[i] as f64)
}
