//! x86-64 SIMD paths of the hot kernels, bit-identical to the portable ones.
//!
//! Why they can be identical (spec §6.1 rules 2–3): every product — BF16×f32, E2M1·2^k×f32,
//! f32×f32 — is exact in f64, so a fused multiply-add rounds exactly like the scalar
//! `lane += w·x`; only the additions round, and each of the sixteen tree lanes receives the
//! same terms in the same order as in [`super::reduce::tree_sum`].
//!
//! The one liberty taken is *which register position holds which tree lane*. Decoding BF16 or
//! MXFP4 naturally yields the even elements of a block of sixteen in one register and the odd
//! ones in another, so instead of shuffling every weight into lane order the activation row is
//! widened to f64 once per call in the same permuted order ([`widen`]); the sixteen position
//! accumulators are mapped back to tree lanes before [`combine_lanes`] folds them. The
//! `n mod 16` tail is added one by one in index order, exactly as in the portable tree.

pub(crate) mod avx2;
pub(crate) mod avx512;
pub(crate) mod gemm;
mod gemm_avx2;
mod gemm_avx512;

use super::matmul::{Bf16Matrix, Mxfp4Matrix};
use super::mxfp4;
use super::reduce::{LANES, combine_lanes};

/// `2^(s − 127)` built in the f64 exponent field; exact for every byte 0–255 (f64's exponent
/// range covers 2^−127 … 2^128 as normals), equal to [`super::mxfp4::scale`].
#[inline]
pub(crate) const fn scale_f64(s: u8) -> f64 {
    f64::from_bits((s as u64 + (1023 - 127)) << 52)
}

/// [`scale_f64`] of every byte, so a kernel can broadcast a scale straight from memory (a
/// load, where building it in a general register and broadcasting that costs a shuffle).
pub(crate) static SCALES: [f64; 256] = {
    let mut t = [0.0f64; 256];
    let mut s = 0;
    while s < 256 {
        t[s] = scale_f64(s as u8);
        s += 1;
    }
    t
};

/// `E2M1(code) · 2^(s − 127)` for every scale byte `s` (row) and code 0–15 (column), exactly as
/// [`super::mxfp4::element`] computes it (spec §3.5; code 8 is −0): a 32 KiB table from which a
/// kernel reads the two 8-entry permute tables of a group instead of building them. Only the
/// rows of the scale bytes a checkpoint uses are ever touched (a few hundred bytes for real
/// experts, whose scales span a handful of values). Every entry is exact: magnitudes of at
/// most two significant bits times a power of two within f64's normal range.
pub(crate) static SCALED_E2M1: [[f64; 16]; 256] = {
    let mut t = [[0.0f64; 16]; 256];
    let mut s = 0;
    while s < 256 {
        let mut c = 0;
        while c < 8 {
            let v = mxfp4::E2M1_MAGNITUDE[c] as f64 * scale_f64(s as u8);
            t[s][c] = v;
            t[s][c + 8] = -v;
            c += 1;
        }
        s += 1;
    }
    t
};

/// Software prefetch distance in weight bytes, per row: each tile streams several rows at
/// once, more streams than the hardware prefetcher follows well; measured ~10 % faster on the
/// BF16 matvec than no prefetch (and than 1 KiB) on the development machine.
pub(crate) const PREFETCH_BYTES: usize = 2048;

/// Software prefetch distance of the MXFP4 tile kernels, in packed bytes ahead of each row's
/// read position: about two 4-row tiles of an expert matrix (rows of 1,536–1,792 bytes), so
/// a line arrives well before its tile starts. Once decoding became cheaper the kernel was
/// memory-latency bound on one thread: from DRAM it ran at 0.72 of its cache-resident rate
/// without prefetch, 0.85 at 4 KiB ahead, 0.95–1.0 from 7 KiB to 28 KiB ahead (flat; measured
/// on the development machine, `docs/model.md`).
pub(crate) const MXFP4_PREFETCH_BYTES: usize = 12 << 10;

/// Tree lane of each register position: position `p` of a block of sixteen holds element
/// `POSITIONS[p]` of that block, i.e. it accumulates tree lane `POSITIONS[p]`.
pub(crate) type Positions = [usize; LANES];

/// Position-ordered lane accumulators of a tile: `[row][token][position]`.
pub(crate) type Acc<const R: usize, const TC: usize> = [[[f64; LANES]; TC]; R];

/// One instruction set's tile kernels. A value of an implementing type exists only on a CPU
/// that supports the instruction set (each type's only constructor is an `unsafe fn` with that
/// contract), so holding one makes calling its `#[target_feature]` code sound.
pub(crate) trait Simd: Copy + Sync {
    /// Register-position → tree-lane map of this instruction set's kernels.
    const POSITIONS: Positions;

    /// Position-ordered lane accumulators over the full blocks of sixteen of the `R` BF16 rows
    /// of `w` against the `TC` widened token rows in `xw`.
    fn bf16_tile<const R: usize, const TC: usize>(
        self,
        w: Bf16Matrix<'_>,
        xw: &[f64],
        acc: &mut Acc<R, TC>,
    );

    /// As [`Simd::bf16_tile`] for the `R` MXFP4 rows of `w`.
    fn mxfp4_tile<const R: usize, const TC: usize>(
        self,
        w: Mxfp4Matrix<'_>,
        xw: &[f64],
        acc: &mut Acc<R, TC>,
    );

    /// Runs `k` over rows `r0 .. r0 + n` (all `t` tokens) with this instruction set's tile shape.
    fn rows<K: Tile>(k: &K, r0: usize, n: usize, t: usize, xw: &[f64], out: &mut [f32]);
}

/// The two tile methods of a [`Simd`] implementation, each forwarding to the `#[target_feature]`
/// function of the same name in the invoking module (taking the raw row bytes). A macro rather
/// than a default method because the callees are per-module free functions compiled for
/// different target features, which a generic cannot name; the forwarding and its safety
/// argument are the same for every instruction set.
macro_rules! tile_forwarders {
    () => {
        fn bf16_tile<const R: usize, const TC: usize>(
            self,
            w: $crate::kernels::matmul::Bf16Matrix<'_>,
            xw: &[f64],
            acc: &mut $crate::kernels::x86::Acc<R, TC>,
        ) {
            // SAFETY: a value of this type exists only on a CPU with the target features of
            // `bf16_tile` (the type's only constructor is an `unsafe fn` with that contract).
            unsafe { bf16_tile::<R, TC>(w.bytes, w.cols, xw, acc) }
        }

        fn mxfp4_tile<const R: usize, const TC: usize>(
            self,
            w: $crate::kernels::matmul::Mxfp4Matrix<'_>,
            xw: &[f64],
            acc: &mut $crate::kernels::x86::Acc<R, TC>,
        ) {
            // SAFETY: as for `bf16_tile`.
            unsafe { mxfp4_tile::<R, TC>(w.packed, w.scales, w.cols, xw, acc) }
        }
    };
}
pub(crate) use tile_forwarders;

/// A matrix in one weight format on one instruction set, as seen by the tile driver.
pub(crate) trait Tile: Sync {
    /// The instruction set that runs it: its register-position map and tile shape.
    type Simd: Simd;

    /// Input width.
    fn cols(&self) -> usize;

    /// Position-ordered lane accumulators over the full blocks of sixteen of rows
    /// `r0 .. r0 + R`, for the `TC` widened token rows in `xw` (each `cols` long).
    fn tile<const R: usize, const TC: usize>(&self, r0: usize, xw: &[f64], acc: &mut Acc<R, TC>);

    /// The exact f64 product of weight (r, i) and `x` (for the tail terms).
    fn term(&self, r: usize, i: usize, x: f64) -> f64;
}

/// A BF16 matrix on instruction set `S`.
pub(crate) struct Bf16<'a, S> {
    pub(crate) w: Bf16Matrix<'a>,
    pub(crate) simd: S,
}

impl<S: Simd> Tile for Bf16<'_, S> {
    type Simd = S;

    fn cols(&self) -> usize {
        self.w.cols
    }

    fn tile<const R: usize, const TC: usize>(&self, r0: usize, xw: &[f64], acc: &mut Acc<R, TC>) {
        let cols = self.w.cols;
        let bytes = &self.w.bytes[2 * r0 * cols..2 * (r0 + R) * cols];
        let rows = Bf16Matrix {
            bytes,
            rows: R,
            cols,
        };
        self.simd.bf16_tile::<R, TC>(rows, xw, acc);
    }

    fn term(&self, r: usize, i: usize, x: f64) -> f64 {
        self.w.get(r, i) as f64 * x
    }
}

/// An MXFP4 matrix on instruction set `S`.
pub(crate) struct Mxfp4<'a, S> {
    pub(crate) w: Mxfp4Matrix<'a>,
    pub(crate) simd: S,
}

impl<S: Simd> Mxfp4<'_, S> {
    /// Rows `r0 .. r1` as a matrix of their own.
    fn rows(&self, r0: usize, r1: usize) -> Mxfp4Matrix<'_> {
        let (cols, half, groups) = (self.w.cols, self.w.cols / 2, self.w.cols / mxfp4::GROUP);
        Mxfp4Matrix {
            packed: &self.w.packed[r0 * half..r1 * half],
            scales: &self.w.scales[r0 * groups..r1 * groups],
            rows: r1 - r0,
            cols,
        }
    }
}

impl<S: Simd> Tile for Mxfp4<'_, S> {
    type Simd = S;

    fn cols(&self) -> usize {
        self.w.cols
    }

    fn tile<const R: usize, const TC: usize>(&self, r0: usize, xw: &[f64], acc: &mut Acc<R, TC>) {
        self.simd
            .mxfp4_tile::<R, TC>(self.rows(r0, r0 + R), xw, acc);
    }

    fn term(&self, r: usize, i: usize, x: f64) -> f64 {
        let row = self.rows(r, r + 1);
        mxfp4::element(row.packed, row.scales, i) * x
    }
}

/// Widens `T` token rows of `cols` f32 values to f64, each full block of sixteen permuted into
/// register-position order, the tail left in index order.
pub(crate) fn widen(xs: &[f32], cols: usize, positions: &Positions) -> Vec<f64> {
    let full = cols - cols % LANES;
    let mut out = Vec::with_capacity(xs.len());
    for x in xs.chunks_exact(cols) {
        for block in x[..full].chunks_exact(LANES) {
            out.extend(positions.iter().map(|&lane| block[lane] as f64));
        }
        out.extend(x[full..].iter().map(|&v| v as f64));
    }
    out
}

/// Runs `k` over rows `r0 .. r0 + n` in tiles of `R` rows × `TC` tokens (weights loaded once per
/// tile and shared by its tokens), with 1-row / 1-token tiles for the remainders.
pub(crate) fn drive<K: Tile, const R: usize, const TC: usize>(
    k: &K,
    r0: usize,
    n: usize,
    t: usize,
    xw: &[f64],
    out: &mut [f32],
) {
    let cols = k.cols();
    let mut r = r0;
    while r < r0 + n {
        if r + R <= r0 + n {
            drive_tokens::<K, R, TC>(k, cols, r, r0, t, xw, out);
            r += R;
        } else {
            drive_tokens::<K, 1, TC>(k, cols, r, r0, t, xw, out);
            r += 1;
        }
    }
}

fn drive_tokens<K: Tile, const R: usize, const TC: usize>(
    k: &K,
    cols: usize,
    r: usize,
    r0: usize,
    t: usize,
    xw: &[f64],
    out: &mut [f32],
) {
    let mut tok = 0;
    while tok < t {
        if tok + TC <= t {
            finish_tile::<K, R, TC>(k, cols, r, r0, tok, t, xw, out);
            tok += TC;
        } else {
            finish_tile::<K, R, 1>(k, cols, r, r0, tok, t, xw, out);
            tok += 1;
        }
    }
}

/// One tile: SIMD lanes, then the fixed lane fold and the tail in index order, rounded once.
#[allow(clippy::too_many_arguments)]
fn finish_tile<K: Tile, const R: usize, const TC: usize>(
    k: &K,
    cols: usize,
    r: usize,
    r0: usize,
    tok: usize,
    t: usize,
    xw: &[f64],
    out: &mut [f32],
) {
    let mut acc: Acc<R, TC> = [[[0.0f64; LANES]; TC]; R];
    k.tile::<R, TC>(r, &xw[tok * cols..(tok + TC) * cols], &mut acc);
    let full = cols - cols % LANES;
    for (i, acc_row) in acc.iter().enumerate() {
        for (j, positions) in acc_row.iter().enumerate() {
            let mut lanes = [0.0f64; LANES];
            for (p, &v) in positions.iter().enumerate() {
                lanes[K::Simd::POSITIONS[p]] = v;
            }
            let mut sum = combine_lanes(&lanes);
            let x = &xw[(tok + j) * cols..(tok + j + 1) * cols];
            for (c, &xc) in x.iter().enumerate().skip(full) {
                sum += k.term(r + i, c, xc);
            }
            out[(r + i - r0) * t + tok + j] = sum as f32;
        }
    }
}

/// Maps a position-ordered accumulator set of a natural-order kernel (dot, sum of squares)
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
    fn exponent_field_scale_equals_the_reference_for_every_byte() {
        for s in 0..=255u8 {
            assert_eq!(
                scale_f64(s).to_bits(),
                super::super::mxfp4::scale(s).to_bits(),
                "s = {s}"
            );
        }
    }

    #[test]
    fn scaled_table_is_the_reference_decoding_for_every_scale_and_code() {
        for s in 0..=255u8 {
            for code in 0..16u8 {
                // Element 0 of a one-byte row is its low nibble.
                let want = super::super::mxfp4::element(&[code], &[s], 0);
                assert_eq!(
                    SCALED_E2M1[s as usize][code as usize].to_bits(),
                    want.to_bits(),
                    "s = {s}, code = {code}"
                );
            }
        }
    }

    #[test]
    fn widen_permutes_full_blocks_and_keeps_the_tail() {
        let x: Vec<f32> = (0..35).map(|i| i as f32).collect();
        let mut rev = [0usize; LANES];
        for (p, lane) in rev.iter_mut().enumerate() {
            *lane = LANES - 1 - p;
        }
        let w = widen(&x, 35, &rev);
        assert_eq!(w[0], 15.0);
        assert_eq!(w[15], 0.0);
        assert_eq!(w[16], 31.0);
        assert_eq!(&w[32..], &[32.0, 33.0, 34.0]);
    }
}
