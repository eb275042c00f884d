//! AVX-512F kernels: 8 f64 lanes per register, two registers per tree of sixteen.
//!
//! Register layout of a block of sixteen elements (both weight formats): register 0 holds the
//! even elements 0, 2, …, 14, register 1 the odd ones — what BF16 pairs and MXFP4 bytes give
//! without shuffling (see the parent module for why only the activation row is permuted).

use std::arch::x86_64::*;

use super::{
    Acc, MXFP4_PREFETCH_BYTES, PREFETCH_BYTES, Positions, SCALED_E2M1, Simd, Tile, drive,
    fold_natural, tile_forwarders,
};
use crate::kernels::mxfp4;
use crate::kernels::reduce::LANES;

const POSITIONS: Positions = [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15];

/// Rows per tile: 4 rows × 2 tokens × 2 registers = 16 independent accumulator chains, enough to
/// hide the FMA latency, and 28 of the 32 zmm registers with the decoded weights and x.
const TILE_ROWS: usize = 4;
/// Tokens per tile (prefill): each decoded weight register feeds this many tokens.
const TILE_TOKENS: usize = 2;

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

/// Lane accumulators of `R` MXFP4 rows against `TC` widened token rows.
///
/// Decoding costs three vector operations per eight weights besides the multiply-add, all of
/// them off the load path: for each row and group of 32 the sixteen values
/// `E2M1(code)·2^(s−127)` are two registers read from [`SCALED_E2M1`] (no arithmetic); per
/// eight packed bytes one broadcast load, two variable shifts that put each byte's low and high
/// nibble in the low bits of its own lane, and two two-source permutes indexed by the nibble
/// (bits 0–2 pick the magnitude, bit 3 the negative half; the permute ignores the other bits).
/// The shuffle that widened bytes to lanes before (`vpmovzxbq`) shared its pipe with the
/// permutes; the shifts and the broadcast do not (measured in `docs/model.md`).
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
    // Right shifts that bring byte `l` of a broadcast u64 of packed weights to the low bits of
    // lane `l`: its low nibble (the even element 2l, spec §3.5), then its high nibble (2l + 1).
    // Built with `setr` so the compiler sees constants below 64 (it guards a shift vector it
    // cannot see with a compare and a masked shift, which cost registers and spills).
    let even_shifts = _mm512_setr_epi64(0, 8, 16, 24, 32, 40, 48, 56);
    let odd_shifts = _mm512_setr_epi64(4, 12, 20, 28, 36, 44, 52, 60);
    let mut a = [[[_mm512_setzero_pd(); 2]; TC]; R];
    for g in 0..groups {
        let mut table = [[_mm512_setzero_pd(); 2]; R];
        for (r, tr) in table.iter_mut().enumerate() {
            // A prefetch never faults, and `wrapping_add` keeps the address computation defined
            // past the end of the slice.
            _mm_prefetch::<_MM_HINT_T0>(
                packed
                    .as_ptr()
                    .wrapping_add(r * half + 16 * g + MXFP4_PREFETCH_BYTES)
                    .cast(),
            );
            let values = &SCALED_E2M1[scales[r * groups + g] as usize];
            // SAFETY: `values` is 16 f64; the loads read elements 0–7 and 8–15.
            *tr = unsafe {
                [
                    _mm512_loadu_pd(values.as_ptr()),
                    _mm512_loadu_pd(values.as_ptr().add(8)),
                ]
            };
        }
        for h in 0..2 {
            let b = 2 * g + h;
            let mut wv = [[_mm512_setzero_pd(); 2]; R];
            for (r, wr) in wv.iter_mut().enumerate() {
                // SAFETY: r < R, g < cols/32, h < 2: the 8 bytes at r·half + 16g + 8h end at
                // most at R·half ≤ packed.len() (asserted); read_unaligned has no alignment
                // requirement. Byte l of the u64 is packed byte l (x86 is little-endian).
                let bytes = unsafe {
                    packed
                        .as_ptr()
                        .add(r * half + 16 * g + 8 * h)
                        .cast::<i64>()
                        .read_unaligned()
                };
                // Broadcast straight from memory: a load, no shuffle.
                let q = _mm512_set1_epi64(bytes);
                let even = _mm512_srlv_epi64(q, even_shifts);
                let odd = _mm512_srlv_epi64(q, odd_shifts);
                wr[0] = _mm512_permutex2var_pd(table[r][0], even, table[r][1]);
                wr[1] = _mm512_permutex2var_pd(table[r][0], odd, table[r][1]);
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
