//! x86-64 SIMD paths of the hot kernels, bit-identical to the portable ones.
//!
//! Why they can be identical (spec §6.1 rules 2–3): a weight product is one fused multiply-add
//! per term into the lane [`super::tree::weight_lane`] names, in increasing input order, on every path, and
//! a fused multiply-add rounds once whatever the register width; the f64 reductions add exact
//! products, so their FMAs round like the scalar `lane += a·b`. Only *which register position
//! holds which lane* is free. Both weight formats give the even and the odd inputs of a block
//! of 32 in separate registers without a shuffle — the low and high halves of each 32-bit BF16
//! pair, the low and high nibbles of each MXFP4 byte — and those are exactly the two inputs
//! the weight tree puts in one lane. So the weights are used as they decode, and only the
//! activation row is laid out once per call in the matching order ([`packed`]).
//!
//! * [`Simd`]: the one-token kernels (decode), weights decoded in registers as they stream in;
//! * [`gemm`]: two or more tokens (prefill, speculative verification), weights decoded once per
//!   call into panels reused by every token.

pub(crate) mod avx2;
pub(crate) mod avx512;
pub(crate) mod gemm;
mod gemm_avx2;
mod gemm_avx512;
pub(crate) mod packed;

use std::arch::x86_64::*;

use super::matrix::{Bf16Matrix, Mxfp4Matrix};
use super::mxfp4;
use super::tree::{LANES, PAIR_BLOCK, combine_lanes, fuse_in_order};
use packed::{PackedTokens, Positions};

/// Software prefetch distance in weight bytes, per row: each tile streams several rows at
/// once, more streams than the hardware prefetcher follows well; measured ~10 % faster on the
/// BF16 matvec than no prefetch (and than 1 KiB) on the development machine.
pub(crate) const PREFETCH_BYTES: usize = 2048;

/// Software prefetch distance of the MXFP4 tile kernels, in packed bytes ahead of each row's
/// read position: about two 4-row tiles of an expert matrix (rows of 1,536–1,792 bytes), so
/// a line arrives well before its tile starts. From DRAM the kernel ran at 0.72 of its
/// cache-resident rate without prefetch, 0.85 at 4 KiB ahead, 0.95–1.0 from 7 KiB to 28 KiB
/// ahead (flat; measured on the development machine, `docs/model.md`).
pub(crate) const MXFP4_PREFETCH_BYTES: usize = 12 << 10;

/// One instruction set's one-token kernels. A value of an implementing type exists only on a
/// CPU that supports the instruction set (each type's only constructor is an `unsafe fn` with
/// that contract), so holding one makes calling its `#[target_feature]` code sound.
pub(crate) trait Simd: Copy + Sync {
    /// Where each input of a block sits in the packed activation row.
    const POSITIONS: Positions;

    /// The sixteen weight-tree lanes (in lane order) of each of the `R` BF16 rows in `rows`
    /// (row-major, `cols` wide) against one packed activation row `x`, over the full blocks.
    fn bf16_lanes<const R: usize>(
        self,
        rows: &[u8],
        cols: usize,
        x: &[f32],
        lanes: &mut [[f32; LANES]; R],
    );

    /// As [`Simd::bf16_lanes`] for `R` MXFP4 rows.
    fn mxfp4_lanes<const R: usize>(
        self,
        packed: &[u8],
        scales: &[u8],
        cols: usize,
        x: &[f32],
        lanes: &mut [[f32; LANES]; R],
    );

    /// Rows `r0 .. r0 + out.len()` of `w` against the one packed token of `x`
    /// ([`one_token_rows`] with this instruction set's tile height).
    fn one_token(self, w: &Weights<'_>, x: &PackedTokens, r0: usize, out: &mut [f32]);
}

/// The forwarding methods of a [`Simd`] implementation, each calling the `#[target_feature]`
/// function of the same name in the invoking module. A macro rather than a default method
/// because the callees are per-module free functions compiled for different target features,
/// which a generic cannot name; the forwarding and its safety argument are the same for every
/// instruction set.
///
/// `$rows` is the one-token tile height: as many rows as keep every accumulator, the activation
/// block and the decoding temporaries in registers (a spilled accumulator puts a store and a
/// reload into each FMA chain).
macro_rules! simd_forwarders {
    ($rows:expr) => {
        fn one_token(
            self,
            w: &$crate::kernels::x86::Weights<'_>,
            x: &$crate::kernels::x86::packed::PackedTokens,
            r0: usize,
            out: &mut [f32],
        ) {
            $crate::kernels::x86::one_token_rows::<Self, { $rows }>(self, w, x, r0, out)
        }

        fn bf16_lanes<const R: usize>(
            self,
            rows: &[u8],
            cols: usize,
            x: &[f32],
            lanes: &mut [[f32; $crate::kernels::tree::LANES]; R],
        ) {
            // SAFETY: a value of this type exists only on a CPU with the target features of
            // `bf16_lanes` (the type's only constructor is an `unsafe fn` with that contract).
            unsafe { bf16_lanes::<R>(rows, cols, x, lanes) }
        }

        fn mxfp4_lanes<const R: usize>(
            self,
            packed: &[u8],
            scales: &[u8],
            cols: usize,
            x: &[f32],
            lanes: &mut [[f32; $crate::kernels::tree::LANES]; R],
        ) {
            // SAFETY: as for `bf16_lanes`.
            unsafe { mxfp4_lanes::<R>(packed, scales, cols, x, lanes) }
        }
    };
}
pub(crate) use simd_forwarders;

/// A weight matrix in one of the stored formats, as the SIMD drivers see it.
#[derive(Clone, Copy)]
pub(crate) enum Weights<'a> {
    Bf16(Bf16Matrix<'a>),
    Mxfp4(Mxfp4Matrix<'a>),
}

impl Weights<'_> {
    pub(crate) fn rows(&self) -> usize {
        match self {
            Weights::Bf16(w) => w.rows,
            Weights::Mxfp4(w) => w.rows,
        }
    }

    pub(crate) fn cols(&self) -> usize {
        match self {
            Weights::Bf16(w) => w.cols,
            Weights::Mxfp4(w) => w.cols,
        }
    }

    /// Weight (r, i) as the f32 the product multiplies (the tail terms).
    pub(crate) fn weight(&self, r: usize, i: usize) -> f32 {
        match self {
            Weights::Bf16(w) => w.get(r, i),
            Weights::Mxfp4(w) => {
                let (half, groups) = (w.cols / 2, w.cols / mxfp4::GROUP);
                let packed = &w.packed[r * half..(r + 1) * half];
                let scales = &w.scales[r * groups..(r + 1) * groups];
                mxfp4::weight(packed, scales, i)
            }
        }
    }

    /// The stored bytes of rows `r0 .. r0 + n`: BF16 bytes, or MXFP4 packed bytes and scales
    /// (empty for BF16).
    pub(crate) fn row_bytes(&self, r0: usize, n: usize) -> (&[u8], &[u8]) {
        match self {
            Weights::Bf16(w) => (&w.bytes[2 * r0 * w.cols..2 * (r0 + n) * w.cols], &[]),
            Weights::Mxfp4(w) => {
                let (half, groups) = (w.cols / 2, w.cols / mxfp4::GROUP);
                (
                    &w.packed[r0 * half..(r0 + n) * half],
                    &w.scales[r0 * groups..(r0 + n) * groups],
                )
            }
        }
    }

    /// The weight tree of rows `r .. r + out.len()` against the one packed token of `x`: the
    /// lanes from `s`, the fold, the tail fused in index order.
    fn finish<S: Simd, const R: usize>(&self, s: S, r: usize, x: &PackedTokens, out: &mut [f32]) {
        let cols = self.cols();
        let mut lanes = [[0.0f32; LANES]; R];
        let (bytes, scales) = self.row_bytes(r, R);
        match self {
            Weights::Bf16(_) => s.bf16_lanes::<R>(bytes, cols, x.data(), &mut lanes),
            Weights::Mxfp4(_) => s.mxfp4_lanes::<R>(bytes, scales, cols, x.data(), &mut lanes),
        }
        let full = cols - cols % PAIR_BLOCK;
        for (i, (lanes, y)) in lanes.iter().zip(out.iter_mut()).enumerate() {
            let tail = x.tail(0).iter().enumerate();
            *y = fuse_in_order(
                combine_lanes(lanes),
                tail.map(|(c, &xc)| (self.weight(r + i, full + c), xc)),
            );
        }
    }
}

/// Rows `r0 .. r0 + out.len()` of `w` against the one token of `x` (packed with
/// `S::POSITIONS`), in tiles of `R` rows and single rows for the remainder.
pub(crate) fn one_token_rows<S: Simd, const R: usize>(
    s: S,
    w: &Weights<'_>,
    x: &PackedTokens,
    r0: usize,
    out: &mut [f32],
) {
    assert_eq!(x.tokens(), 1, "one-token kernels take one token");
    let mut done = 0;
    while done < out.len() {
        let y = &mut out[done..];
        if y.len() >= R {
            w.finish::<S, R>(s, r0 + done, x, &mut y[..R]);
            done += R;
        } else {
            w.finish::<S, 1>(s, r0 + done, x, &mut y[..1]);
            done += 1;
        }
    }
}

/// [`combine_lanes`] of sixteen f32 lanes stored in lane order, on registers: the same
/// additions of the same pairs (`t_k = l_k + l_(k+8)` adds the two halves, `u_k = t_k + t_(k+4)`
/// the halves of `t`, `v_k = u_k + u_(k+2)` the halves of `u`, then `v_0 + v_1`).
#[target_feature(enable = "avx")]
pub(crate) fn fold_f32(lanes: &[f32]) -> f32 {
    assert!(lanes.len() >= LANES, "fold bounds");
    // SAFETY: the 16 f32 are within `lanes` (asserted); loadu has no alignment requirement.
    let t = unsafe {
        _mm256_add_ps(
            _mm256_loadu_ps(lanes.as_ptr()),
            _mm256_loadu_ps(lanes.as_ptr().add(8)),
        )
    };
    let u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t));
    let v = _mm_add_ps(u, _mm_movehl_ps(u, u));
    _mm_cvtss_f32(v) + _mm_cvtss_f32(_mm_shuffle_ps::<1>(v, v))
}

/// Maps a position-ordered accumulator set of a natural-order f64 kernel (dot, sum of squares)
/// straight to the tree fold and adds the tail `tail(i)` for `i` in `full .. n`.
pub(crate) fn fold_natural(
    acc: &[f64; LANES],
    full: usize,
    n: usize,
    tail: impl Fn(usize) -> f64,
) -> f64 {
    let mut sum = combine_lanes(acc);
    for i in full..n {
        sum += tail(i);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_register_fold_is_combine_lanes() {
        if !std::is_x86_feature_detected!("avx") {
            return;
        }
        let big = 2.0f32.powi(30);
        let mut l = [0.0f32; LANES];
        (l[0], l[8], l[1], l[5], l[3]) = (big, -big, 1.0, big, -big);
        for k in 0..LANES {
            let mut m = l;
            m[k] += 0.75;
            // SAFETY: AVX was detected above.
            let got = unsafe { fold_f32(&m) };
            assert_eq!(got.to_bits(), combine_lanes(&m).to_bits(), "lane {k}");
        }
    }
}
