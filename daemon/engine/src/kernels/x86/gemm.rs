//! Prefill matmuls (T ≥ 2 token rows) as register- and cache-blocked GEMMs, bit-identical to
//! the one tree of [`crate::kernels::reduce`].
//!
//! The tile kernels of [`super::drive`] decode each weight register on the fly and use it for
//! at most two tokens, so decoding (a shift and a widening per eight BF16 weights, a table
//! permute per eight MXFP4 weights) costs about as much as the multiply-adds: prefill ran at
//! about half the machine's f64 GEMM rate (issue 30). Here, as in a BLAS GEMM, both operands
//! are laid out once in the order the innermost loop consumes them:
//!
//! * the activations of a call ([`PackedTokens`]): widened to f64 once, cut into tiles of up to
//!   [`Gemm::TOKENS`] tokens, each tile stored block by block (`[block][token][16]`, the sixteen
//!   in the instruction set's register-position order, [`super::Simd::POSITIONS`]);
//! * the weights, per tile of [`Gemm::ROWS`] rows and [`K_BLOCKS`] blocks of sixteen inputs:
//!   decoded once into an f64 panel (`[block][row][16]`) that every token tile then reuses.
//!
//! The micro-kernel ([`Gemm::micro`]) keeps `rows × tokens` accumulators of one register group
//! in registers over the panel's blocks: per block one load per row and per token feeds
//! `rows × tokens` fused multiply-adds, with no decoding in the loop.
//!
//! Why the bits are the tree's (spec §6.1 rules 2–5): every product is exact in f64, so each
//! FMA rounds exactly like the scalar `lane += w·x`. Lane `p` of output (r, t) receives the
//! terms `i ≡ p (mod 16)` in increasing `i` — blocks are visited in increasing order, and
//! between two k-blocks the lane's running sum is stored and reloaded unchanged. Register groups
//! and row / token tiles are independent accumulators. The lanes are then folded by
//! [`Gemm::fold`] (the additions of [`combine_lanes`], on registers) and the `cols mod 16` tail
//! added one term at a time in index order, exactly as [`crate::kernels::reduce::tree_sum`]
//! does. The tests in `tests/kernels_simd.rs` compare
//! every shape and path with the portable reference bit for bit.
//!
//! [`combine_lanes`]: crate::kernels::reduce::combine_lanes

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::super::aligned::AlignedF64;
use super::super::matmul::{Bf16Matrix, Mxfp4Matrix};
use super::super::mxfp4;
use super::super::reduce::LANES;
use super::Positions;

/// Blocks of sixteen inputs per weight panel: 128 blocks = 2,048 inputs, so a panel of four
/// rows is 64 KiB of f64 (in a core's L2 cache while every token tile of the call passes over
/// it) and each lane's running sum is stored and reloaded once per 2,048 inputs. Measured on
/// the development machine (AMD EPYC, AVX-512, one thread, 3072 × 7168 BF16 × 96 tokens):
/// 16 blocks 46, 32 blocks 47, 64 blocks 48, 128 blocks 49 GFLOP/s; a 256-token prefill on
/// `bench` (13 GiB, 2 threads) took 0.97× the time of 64 blocks (3 interleaved pairs, issue 30).
/// Even, so a panel never splits an MXFP4 scale group of 32 inputs.
pub(crate) const K_BLOCKS: usize = 128;

/// Packed values from which [`PackedTokens::new`] packs its tiles in parallel.
const PARALLEL_MIN_VALUES: usize = 1 << 16;

/// One instruction set's GEMM pieces. A value exists only on a CPU that supports the
/// instruction set (as for [`super::Simd`]), so calling its `#[target_feature]` code is sound.
pub(crate) trait Gemm: Copy + Sync {
    /// Register-position → tree-lane map (the same as the instruction set's tile kernels).
    const POSITIONS: Positions;
    /// Weight rows per micro-kernel tile.
    const ROWS: usize;
    /// Tokens per micro-kernel tile.
    const TOKENS: usize;

    /// Decodes blocks `b0 .. b0 + nb` of the `R` BF16 rows in `rows` (row-major, `cols` wide)
    /// into `panel` as `[block][row][16]` f64 in register-position order.
    fn decode_bf16<const R: usize>(
        self,
        rows: &[u8],
        cols: usize,
        b0: usize,
        nb: usize,
        panel: &mut [f64],
    );

    /// As [`Gemm::decode_bf16`] for `R` MXFP4 rows (`b0` and `nb` even: whole scale groups).
    fn decode_mxfp4<const R: usize>(
        self,
        packed: &[u8],
        scales: &[u8],
        cols: usize,
        b0: usize,
        nb: usize,
        panel: &mut [f64],
    );

    /// `acc[r][t][p] += Σ_b panel[b][r][p] · x[b][t][p]` over `nb` blocks, for the `R` rows of
    /// a panel and the `TC` tokens of a tile (`x` is `[block][token][16]`, `acc` `[R][TC][16]`),
    /// each lane's terms added in block order.
    fn micro<const R: usize, const TC: usize>(
        self,
        panel: &[f64],
        x: &[f64],
        nb: usize,
        acc: &mut [f64],
    );

    /// [`combine_lanes`] of one accumulator's sixteen lanes, stored in register-position order
    /// (`acc.len() ≥ 16`): the same additions of the same pairs, on registers.
    ///
    /// [`combine_lanes`]: crate::kernels::reduce::combine_lanes
    fn fold(self, acc: &[f64]) -> f64;
}

/// A weight matrix in one of the stored formats, as the GEMM driver sees it.
#[derive(Clone, Copy)]
pub(crate) enum Weights<'a> {
    Bf16(Bf16Matrix<'a>),
    Mxfp4(Mxfp4Matrix<'a>),
}

impl Weights<'_> {
    fn cols(&self) -> usize {
        match self {
            Weights::Bf16(w) => w.cols,
            Weights::Mxfp4(w) => w.cols,
        }
    }

    /// The exact f64 product of weight (r, i) and `x` (the tail terms).
    fn term(&self, r: usize, i: usize, x: f64) -> f64 {
        match self {
            Weights::Bf16(w) => w.get(r, i) as f64 * x,
            Weights::Mxfp4(w) => {
                let (half, groups) = (w.cols / 2, w.cols / mxfp4::GROUP);
                let packed = &w.packed[r * half..(r + 1) * half];
                let scales = &w.scales[r * groups..(r + 1) * groups];
                mxfp4::element(packed, scales, i) * x
            }
        }
    }

    /// Decodes blocks `b0 .. b0 + nb` of rows `r0 .. r0 + R` into `panel`.
    fn decode<S: Gemm, const R: usize>(
        &self,
        s: S,
        r0: usize,
        b0: usize,
        nb: usize,
        panel: &mut [f64],
    ) {
        match self {
            Weights::Bf16(w) => {
                let rows = &w.bytes[2 * r0 * w.cols..2 * (r0 + R) * w.cols];
                s.decode_bf16::<R>(rows, w.cols, b0, nb, panel);
            }
            Weights::Mxfp4(w) => {
                let (half, groups) = (w.cols / 2, w.cols / mxfp4::GROUP);
                let packed = &w.packed[r0 * half..(r0 + R) * half];
                let scales = &w.scales[r0 * groups..(r0 + R) * groups];
                s.decode_mxfp4::<R>(packed, scales, w.cols, b0, nb, panel);
            }
        }
    }
}

/// One tile of tokens in a [`PackedTokens`].
#[derive(Clone, Copy, Debug)]
struct TokenTile {
    /// Its first token.
    first: usize,
    /// Tokens in it (1 ..= [`Gemm::TOKENS`]).
    count: usize,
    /// Where its `[block][token][16]` values start in the packed data.
    offset: usize,
}

/// The activations of one call, widened to f64 and laid out for the micro-kernel: the full
/// blocks of sixteen of each token tile as `[block][token][16]` in register-position order,
/// the `cols mod 16` tail of every token apart, in index order.
pub(crate) struct PackedTokens {
    data: AlignedF64,
    tiles: Vec<TokenTile>,
    /// `[token][cols mod 16]`.
    tails: Vec<f64>,
    tokens: usize,
    cols: usize,
}

impl PackedTokens {
    /// Packs the `xs.len() / cols` token rows of `xs` into tiles of at most `tile` tokens,
    /// sized as evenly as possible (13 tokens in tiles of 6 become 5 + 4 + 4, not 6 + 6 + 1:
    /// a narrow tile leaves the FMA units idle while its weights still have to be loaded).
    pub(crate) fn new(xs: &[f32], cols: usize, positions: &Positions, tile: usize) -> Self {
        let tokens = xs.len() / cols;
        let blocks = cols / LANES;
        let full = blocks * LANES;
        let n_tiles = tokens.div_ceil(tile.max(1));
        let mut tiles = Vec::with_capacity(n_tiles);
        let mut first = 0;
        for k in 0..n_tiles {
            let count = tokens / n_tiles + usize::from(k < tokens % n_tiles);
            tiles.push(TokenTile {
                first,
                count,
                offset: first * full,
            });
            first += count;
        }
        let mut data = AlignedF64::zeros(tokens * full);
        // Each tile's values are one contiguous run: tiles are packed in parallel when the call
        // is large, so a prefill's packing (and the first touch of the fresh buffer's pages)
        // is not a stretch where one core works and the other waits (issue 30).
        let mut runs = Vec::with_capacity(tiles.len());
        let mut rest = data.as_mut_slice();
        for t in &tiles {
            let (run, after) = rest.split_at_mut(t.count * full);
            runs.push((t, run));
            rest = after;
        }
        let pack = |(t, run): &mut (&TokenTile, &mut [f64])| {
            for b in 0..blocks {
                for j in 0..t.count {
                    let src = &xs[(t.first + j) * cols + b * LANES..][..LANES];
                    let dst = &mut run[(b * t.count + j) * LANES..][..LANES];
                    for (d, &lane) in dst.iter_mut().zip(positions) {
                        *d = src[lane] as f64;
                    }
                }
            }
        };
        if tokens * full >= PARALLEL_MIN_VALUES {
            runs.par_iter_mut().for_each(pack);
        } else {
            runs.iter_mut().for_each(pack);
        }
        let tails = xs
            .chunks_exact(cols)
            .flat_map(|x| x[full..].iter().map(|&v| v as f64))
            .collect();
        PackedTokens {
            data,
            tiles,
            tails,
            tokens,
            cols,
        }
    }

    pub(crate) fn tokens(&self) -> usize {
        self.tokens
    }
}

/// Rows `r0 .. r0 + n` of `w` against every packed token: `out` is `[n][tokens]` (row-major),
/// each element the tree sum rounded to f32 once.
pub(crate) fn rows<S: Gemm>(
    s: S,
    w: Weights<'_>,
    x: &PackedTokens,
    r0: usize,
    n: usize,
    out: &mut [f32],
) {
    let cols = w.cols();
    assert_eq!(cols, x.cols, "packed tokens of another width");
    let t = x.tokens;
    assert!(out.len() >= n * t, "gemm output bounds");
    let blocks = cols / LANES;
    let full = blocks * LANES;
    let mut panel = AlignedF64::zeros(S::ROWS * K_BLOCKS * LANES);
    let mut acc = AlignedF64::zeros(S::ROWS * t * LANES);
    let mut r = r0;
    while r < r0 + n {
        let rr = S::ROWS.min(r0 + n - r);
        let acc = &mut acc.as_mut_slice()[..rr * t * LANES];
        acc.fill(0.0);
        for b0 in (0..blocks).step_by(K_BLOCKS) {
            let nb = K_BLOCKS.min(blocks - b0);
            let panel = &mut panel.as_mut_slice()[..nb * rr * LANES];
            decode_any(s, &w, rr, r, b0, nb, panel);
            for tile in &x.tiles {
                let xt = &x.data.as_slice()[tile.offset + b0 * tile.count * LANES..];
                let at = &mut acc[tile.first * rr * LANES..(tile.first + tile.count) * rr * LANES];
                micro_any(s, rr, tile.count, panel, xt, nb, at);
            }
        }
        let tail = cols - full;
        for tile in &x.tiles {
            for i in 0..rr {
                for j in 0..tile.count {
                    let at = (tile.first * rr + i * tile.count + j) * LANES;
                    let mut sum = s.fold(&acc[at..at + LANES]);
                    let tok = tile.first + j;
                    for (c, &xc) in x.tails[tok * tail..(tok + 1) * tail].iter().enumerate() {
                        sum += w.term(r + i, full + c, xc);
                    }
                    out[(r - r0 + i) * t + tok] = sum as f32;
                }
            }
        }
        r += rr;
    }
}

/// [`Weights::decode`] for a run-time row count `r` (1 ..= 4).
fn decode_any<S: Gemm>(
    s: S,
    w: &Weights<'_>,
    r: usize,
    r0: usize,
    b0: usize,
    nb: usize,
    panel: &mut [f64],
) {
    match r {
        1 => w.decode::<S, 1>(s, r0, b0, nb, panel),
        2 => w.decode::<S, 2>(s, r0, b0, nb, panel),
        3 => w.decode::<S, 3>(s, r0, b0, nb, panel),
        4 => w.decode::<S, 4>(s, r0, b0, nb, panel),
        _ => unreachable!("tile rows are 1 to 4"),
    }
}

/// [`Gemm::micro`] for a run-time tile shape: `r` rows (1 ..= 4), `tc` tokens (1 ..= 6).
fn micro_any<S: Gemm>(
    s: S,
    r: usize,
    tc: usize,
    panel: &[f64],
    x: &[f64],
    nb: usize,
    acc: &mut [f64],
) {
    fn with_rows<S: Gemm, const R: usize>(
        s: S,
        tc: usize,
        panel: &[f64],
        x: &[f64],
        nb: usize,
        acc: &mut [f64],
    ) {
        match tc {
            1 => s.micro::<R, 1>(panel, x, nb, acc),
            2 => s.micro::<R, 2>(panel, x, nb, acc),
            3 => s.micro::<R, 3>(panel, x, nb, acc),
            4 => s.micro::<R, 4>(panel, x, nb, acc),
            5 => s.micro::<R, 5>(panel, x, nb, acc),
            6 => s.micro::<R, 6>(panel, x, nb, acc),
            _ => unreachable!("token tiles are 1 to 6 tokens"),
        }
    }
    match r {
        1 => with_rows::<S, 1>(s, tc, panel, x, nb, acc),
        2 => with_rows::<S, 2>(s, tc, panel, x, nb, acc),
        3 => with_rows::<S, 3>(s, tc, panel, x, nb, acc),
        4 => with_rows::<S, 4>(s, tc, panel, x, nb, acc),
        _ => unreachable!("tile rows are 1 to 4"),
    }
}

/// The last three levels of [`combine_lanes`], from its first level's sums in two registers:
/// `t_even = (t0, t2, t4, t6)` and `t_odd = (t1, t3, t5, t7)` with `t_k = l_k + l_(k+8)`.
/// `u_k = t_k + t_(k+4)` is the sum of a register's two halves — `(u0, u2)` and `(u1, u3)` —
/// then `(u0 + u2) + (u1 + u3)`.
///
/// [`combine_lanes`]: crate::kernels::reduce::combine_lanes
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn fold_quarters(t_even: __m256d, t_odd: __m256d) -> f64 {
    let u_even = _mm_add_pd(
        _mm256_castpd256_pd128(t_even),
        _mm256_extractf128_pd::<1>(t_even),
    );
    let u_odd = _mm_add_pd(
        _mm256_castpd256_pd128(t_odd),
        _mm256_extractf128_pd::<1>(t_odd),
    );
    let v0 = _mm_cvtsd_f64(u_even) + _mm_cvtsd_f64(_mm_unpackhi_pd(u_even, u_even));
    let v1 = _mm_cvtsd_f64(u_odd) + _mm_cvtsd_f64(_mm_unpackhi_pd(u_odd, u_odd));
    v0 + v1
}

/// The bounds every instruction set's [`Gemm::decode_bf16`] relies on for its unchecked loads
/// and stores: `rows` rows of `cols` BF16, blocks `b0 .. b0 + nb` within a row, and a panel of
/// `nb × rows × 16` f64.
pub(crate) fn check_bf16_panel(
    rows: usize,
    bytes: &[u8],
    cols: usize,
    b0: usize,
    nb: usize,
    panel: &[f64],
) {
    assert!(
        bytes.len() >= 2 * rows * cols
            && (b0 + nb) * LANES <= cols
            && panel.len() >= nb * rows * LANES,
        "bf16 panel bounds"
    );
}

/// As [`check_bf16_panel`] for [`Gemm::decode_mxfp4`] (whole scale groups of 32: `b0` and `nb`
/// even); returns the bytes per packed row and the scale groups per row.
pub(crate) fn check_mxfp4_panel(
    rows: usize,
    packed: &[u8],
    scales: &[u8],
    cols: usize,
    b0: usize,
    nb: usize,
    panel: &[f64],
) -> (usize, usize) {
    let (half, groups) = (cols / 2, cols / mxfp4::GROUP);
    assert!(
        b0.is_multiple_of(2) && nb.is_multiple_of(2) && (b0 + nb) * LANES <= cols,
        "mxfp4 panels cover whole scale groups"
    );
    assert!(
        packed.len() >= rows * half
            && scales.len() >= rows * groups
            && panel.len() >= nb * rows * LANES,
        "mxfp4 panel bounds"
    );
    (half, groups)
}

/// Defines an instruction set's `micro::<R, TC>` ([`Gemm::micro`]) from its register type and
/// intrinsics: one loop for every instruction set, so each lane's terms are added in the same
/// order everywhere. Per register group of `$width` lanes: the `R × TC` accumulators are
/// loaded, run over the `nb` blocks of the panel (`[block][row][16]`) and the token tile
/// (`[block][token][16]`) — one load per row and per token feeding `R × TC` FMAs — and stored.
macro_rules! micro_kernel {
    ($features:literal, $width:expr, $zero:ident, $load:ident, $fma:ident, $store:ident) => {
        // `r` and `t` index the accumulators and the panel / tile together.
        #[allow(clippy::needless_range_loop)]
        #[target_feature(enable = $features)]
        fn micro<const R: usize, const TC: usize>(
            panel: &[f64],
            x: &[f64],
            nb: usize,
            acc: &mut [f64],
        ) {
            const W: usize = $width;
            assert!(
                panel.len() >= nb * R * LANES
                    && x.len() >= nb * TC * LANES
                    && acc.len() >= R * TC * LANES,
                "micro-kernel bounds"
            );
            for g in 0..LANES / W {
                let mut a = [[$zero(); TC]; R];
                for r in 0..R {
                    for t in 0..TC {
                        // SAFETY: (r·TC + t)·16 + W·(g + 1) ≤ R·TC·16 ≤ acc.len() (asserted).
                        a[r][t] = unsafe { $load(acc.as_ptr().add((r * TC + t) * LANES + g * W)) };
                    }
                }
                for b in 0..nb {
                    let mut w = [$zero(); R];
                    for r in 0..R {
                        // SAFETY: b < nb and r < R: the W f64 end within nb·R·16 ≤ panel.len().
                        w[r] = unsafe { $load(panel.as_ptr().add((b * R + r) * LANES + g * W)) };
                    }
                    for t in 0..TC {
                        // SAFETY: b < nb and t < TC: the W f64 end within nb·TC·16 ≤ x.len().
                        let xv = unsafe { $load(x.as_ptr().add((b * TC + t) * LANES + g * W)) };
                        for r in 0..R {
                            a[r][t] = $fma(w[r], xv, a[r][t]);
                        }
                    }
                }
                for r in 0..R {
                    for t in 0..TC {
                        // SAFETY: as for the loads of `a` above.
                        unsafe {
                            $store(acc.as_mut_ptr().add((r * TC + t) * LANES + g * W), a[r][t])
                        };
                    }
                }
            }
        }
    };
}
pub(crate) use micro_kernel;

/// The `Gemm` methods of an instruction set forwarding to the `#[target_feature]` functions of
/// the same names in the invoking module (see [`super::tile_forwarders`] for why a macro).
macro_rules! gemm_forwarders {
    () => {
        fn decode_bf16<const R: usize>(
            self,
            rows: &[u8],
            cols: usize,
            b0: usize,
            nb: usize,
            panel: &mut [f64],
        ) {
            // SAFETY: a value of this type exists only on a CPU with the target features of
            // `decode_bf16` (the type's only constructor is an `unsafe fn` with that contract).
            unsafe { decode_bf16::<R>(rows, cols, b0, nb, panel) }
        }

        fn decode_mxfp4<const R: usize>(
            self,
            packed: &[u8],
            scales: &[u8],
            cols: usize,
            b0: usize,
            nb: usize,
            panel: &mut [f64],
        ) {
            // SAFETY: as for `decode_bf16`.
            unsafe { decode_mxfp4::<R>(packed, scales, cols, b0, nb, panel) }
        }

        fn micro<const R: usize, const TC: usize>(
            self,
            panel: &[f64],
            x: &[f64],
            nb: usize,
            acc: &mut [f64],
        ) {
            // SAFETY: as for `decode_bf16`.
            unsafe { micro::<R, TC>(panel, x, nb, acc) }
        }

        fn fold(self, acc: &[f64]) -> f64 {
            // SAFETY: as for `decode_bf16`.
            unsafe { fold(acc) }
        }
    };
}
pub(crate) use gemm_forwarders;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_tiles_are_even_and_cover_every_token() {
        let positions: Positions = std::array::from_fn(|p| p);
        for tokens in 1..40 {
            let xs: Vec<f32> = (0..tokens * 35).map(|i| i as f32).collect();
            let p = PackedTokens::new(&xs, 35, &positions, 6);
            let counts: Vec<usize> = p.tiles.iter().map(|t| t.count).collect();
            assert_eq!(counts.iter().sum::<usize>(), tokens);
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(hi - lo <= 1 && *hi <= 6, "{tokens}: {counts:?}");
            assert_eq!(p.tiles.len(), tokens.div_ceil(6));
        }
    }

    #[test]
    fn packing_puts_block_b_token_j_at_its_place() {
        let positions: Positions = std::array::from_fn(|p| LANES - 1 - p);
        let cols = 35;
        let xs: Vec<f32> = (0..5 * cols).map(|i| i as f32).collect();
        let p = PackedTokens::new(&xs, cols, &positions, 3);
        // Tiles of 3 + 2; token 4 is the second of the second tile.
        let t = p.tiles[1];
        assert_eq!((t.first, t.count), (3, 2));
        let at = t.offset + (t.count + 1) * LANES; // block 1, token 4
        assert_eq!(p.data.as_slice()[at], (4 * cols + 16 + 15) as f32 as f64);
        assert_eq!(&p.tails[4 * 3..], &[172.0, 173.0, 174.0]);
        assert_eq!(p.data.as_slice().as_ptr().align_offset(64), 0);
    }
}
