//! AVX-512F kernels: 8 f64 lanes per register, two registers per tree of sixteen.
//!
//! Register layout of a block of sixteen elements (both weight formats): register 0 holds the
//! even elements 0, 2, …, 14, register 1 the odd ones — what BF16 pairs and MXFP4 bytes give
//! without shuffling (see the parent module for why only the activation row is permuted).

use std::arch::x86_64::*;

use super::{Acc, PREFETCH_BYTES, Positions, Simd, Tile, drive, fold_natural, tile_forwarders};
use crate::kernels::mxfp4;
use crate::kernels::reduce::LANES;

const POSITIONS: Positions = [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15];

/// Rows per tile: 4 rows × 2 tokens × 2 registers = 16 independent accumulator chains, enough to
/// hide the FMA latency, and 28 of the 32 zmm registers with the decoded weights and x.
const TILE_ROWS: usize = 4;
/// Tokens per tile (prefill): each decoded weight register feeds this many tokens.
const TILE_TOKENS: usize = 2;

/// E2M1 codes 0–7 and 8–15 as f64 (spec §3.5; code 8 is −0).
const E2M1_POS: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
const E2M1_NEG: [f64; 8] = [-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
/// Table entries 1–7 (entry 0 is ±0).
const NONZERO_ENTRIES: __mmask8 = 0xfe;
/// `(s − 127) << 52` for every scale byte: the f64 exponent-field increment of ×2^(s−127),
/// broadcast from memory (a load, not a shuffle).
static EXPONENT_STEPS: [i64; 256] = {
    let mut t = [0i64; 256];
    let mut s = 0;
    while s < 256 {
        t[s] = (s as i64 - 127) << 52;
        s += 1;
    }
    t
};

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

    tile_forwarders!();

    fn rows<K: Tile>(k: &K, r0: usize, n: usize, t: usize, xw: &[f64], out: &mut [f32]) {
        drive::<K, TILE_ROWS, TILE_TOKENS>(k, r0, n, t, xw, out);
    }
}

/// Lane accumulators of `R` BF16 rows (`w`, row-major, `cols` wide) against `TC` widened
/// token rows (`xw`).
#[target_feature(enable = "avx512f,avx2,fma")]
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
    let high_half = _mm256_set1_epi32(0xffff_0000u32 as i32);
    let mut a = [[[_mm512_setzero_pd(); 2]; TC]; R];
    for b in 0..blocks {
        let mut wv = [[_mm512_setzero_pd(); 2]; R];
        for (r, wr) in wv.iter_mut().enumerate() {
            // SAFETY: r < R and b < cols/16, so the 32 bytes at 2·(r·cols + 16b) end at most at
            // 2·R·cols ≤ w.len() (asserted); loadu has no alignment requirement.
            let v =
                unsafe { _mm256_loadu_si256(w.as_ptr().add(2 * (r * cols + LANES * b)).cast()) };
            // A prefetch never faults, and `wrapping_add` keeps the address computation defined
            // past the end of the slice.
            _mm_prefetch::<_MM_HINT_T0>(
                w.as_ptr()
                    .wrapping_add(2 * (r * cols + LANES * b) + PREFETCH_BYTES)
                    .cast(),
            );
            // Each u32 holds BF16 element 2j (low half) and 2j+1 (high half); a BF16 is the top
            // half of an f32, so a shift / a mask widens them exactly.
            wr[0] = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)));
            wr[1] = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_and_si256(v, high_half)));
        }
        accumulate(&mut a, &wv, xw, cols, b);
    }
    store(&a, acc);
}

/// Lane accumulators of `R` MXFP4 rows against `TC` widened token rows. Per group of 32 the
/// sixteen possible values `E2M1(code)·2^(s−127)` form a two-register table; a two-source
/// permute indexed by the nibble (bit 3 picks the negative half) decodes eight weights at once.
#[target_feature(enable = "avx512f,avx2,fma")]
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
    // SAFETY: both arrays hold exactly 8 f64 (512 bits); loadu has no alignment requirement.
    let (pos, neg) = unsafe {
        (
            _mm512_loadu_pd(E2M1_POS.as_ptr()),
            _mm512_loadu_pd(E2M1_NEG.as_ptr()),
        )
    };
    let mut a = [[[_mm512_setzero_pd(); 2]; TC]; R];
    for g in 0..groups {
        let mut table = [[_mm512_setzero_pd(); 2]; R];
        for (r, tr) in table.iter_mut().enumerate() {
            // ×2^(s−127) is exact; for the non-zero entries (exponents −1 … 2) it is the same as
            // adding s − 127 to the f64 exponent field, which stays normal for every byte s;
            // entries 0 (±0) are left alone. Integer adds can issue on every vector pipe,
            // leaving the multiply pipes to the FMAs.
            let k = _mm512_set1_epi64(EXPONENT_STEPS[scales[r * groups + g] as usize]);
            *tr = [pos, neg].map(|v| {
                let v = _mm512_castpd_si512(v);
                _mm512_castsi512_pd(_mm512_mask_add_epi64(v, NONZERO_ENTRIES, v, k))
            });
        }
        for h in 0..2 {
            let b = 2 * g + h;
            let mut wv = [[_mm512_setzero_pd(); 2]; R];
            for (r, wr) in wv.iter_mut().enumerate() {
                // SAFETY: r < R, g < cols/32, h < 2: the 8 bytes at r·half + 16g + 8h end at
                // most at R·half ≤ packed.len() (asserted); the load is unaligned-safe.
                let bytes = unsafe {
                    _mm_loadl_epi64(packed.as_ptr().add(r * half + 16 * g + 8 * h).cast())
                };
                // One byte per u64: its low nibble is the even element (spec §3.5); the
                // permute reads only index bits 0–3.
                let lo = _mm512_cvtepu8_epi64(bytes);
                let hi = _mm512_srli_epi64::<4>(lo);
                wr[0] = _mm512_permutex2var_pd(table[r][0], lo, table[r][1]);
                wr[1] = _mm512_permutex2var_pd(table[r][0], hi, table[r][1]);
            }
            accumulate(&mut a, &wv, xw, cols, b);
        }
    }
    store(&a, acc);
}

/// `a[r][t] += wv[r] · x_t` over block `b` for every row and token of the tile.
// `t` indexes the token dimension of `a` (inner) and the rows of `xw` together.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn accumulate<const R: usize, const TC: usize>(
    a: &mut [[[__m512d; 2]; TC]; R],
    wv: &[[__m512d; 2]; R],
    xw: &[f64],
    cols: usize,
    b: usize,
) {
    assert!(
        xw.len() >= TC * cols && LANES * (b + 1) <= cols,
        "x tile bounds"
    );
    for t in 0..TC {
        // SAFETY: t < TC and 16(b+1) ≤ cols (asserted), so the 16 f64 at t·cols + 16b end
        // within TC·cols ≤ xw.len(); loads are unaligned-safe.
        let (x0, x1) = unsafe {
            let p = xw.as_ptr().add(t * cols + LANES * b);
            (_mm512_loadu_pd(p), _mm512_loadu_pd(p.add(8)))
        };
        for r in 0..R {
            a[r][t][0] = _mm512_fmadd_pd(wv[r][0], x0, a[r][t][0]);
            a[r][t][1] = _mm512_fmadd_pd(wv[r][1], x1, a[r][t][1]);
        }
    }
}

#[target_feature(enable = "avx512f,avx2,fma")]
fn store<const R: usize, const TC: usize>(a: &[[[__m512d; 2]; TC]; R], acc: &mut Acc<R, TC>) {
    for (ar, accr) in a.iter().zip(acc.iter_mut()) {
        for (at, acct) in ar.iter().zip(accr.iter_mut()) {
            // SAFETY: `acct` is 16 f64; the two stores write elements 0–7 and 8–15.
            unsafe {
                _mm512_storeu_pd(acct.as_mut_ptr(), at[0]);
                _mm512_storeu_pd(acct.as_mut_ptr().add(8), at[1]);
            }
        }
    }
}

/// `Σ a_i·b_i` with the fixed tree (natural lane order: register 0 = lanes 0–7).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_the_e2m1_codes() {
        for c in 0..8u8 {
            assert_eq!(
                E2M1_POS[c as usize].to_bits(),
                (mxfp4::e2m1(c) as f64).to_bits()
            );
            assert_eq!(
                E2M1_NEG[c as usize].to_bits(),
                (mxfp4::e2m1(c | 8) as f64).to_bits()
            );
        }
    }
}
