//! Prefill matmuls (T ≥ 2 token rows) as register- and cache-blocked GEMMs, bit-identical to
//! the weight tree of [`crate::kernels::tree`].
//!
//! Decoding each weight register for each token (a shift per BF16 pair, a table permute per
//! MXFP4 nibble) costs about as much as the multiply-adds; here, as in a BLAS GEMM, both
//! operands are laid out once in the order the innermost loop consumes them:
//!
//! * the activations of a call ([`PackedTokens`]): cut into tiles of up to [`Gemm::TOKENS`]
//!   tokens, each tile stored block by block (`[block][token][32]`, the 32 inputs of a block in
//!   the instruction set's [`Positions`] order);
//! * the weights, per tile of [`Gemm::ROWS`] rows and [`K_BLOCKS`] blocks of 32 inputs: decoded
//!   once into an f32 panel (`[block][row][32]`, the same order) that every token tile reuses.
//!
//! The micro-kernel ([`Gemm::micro`]) keeps `rows × tokens` accumulators of one register group
//! in registers over the panel's blocks: per block and half (even inputs, then odd) one load
//! per row and per token feeds `rows × tokens` fused multiply-adds, with no decoding in the
//! loop.
//!
//! Why the bits are the weight tree's (spec §6.1 rules 2–5): lane `k` of output (r, t) receives
//! the fused multiply-adds of inputs `32g + 2k`, `32g + 2k + 1` for increasing `g` — blocks are
//! visited in increasing order, the even half before the odd one, and between two k-blocks the
//! lane's running sum is stored and reloaded unchanged. Register groups and row / token tiles
//! are independent accumulators. The lanes are then folded by [`super::fold_f32`] (the additions
//! of [`combine_lanes`]) and the `cols mod 32` tail fused in one term at a time in index order,
//! exactly as [`crate::kernels::tree::weight_dot`] does. The tests in `tests/kernels_simd.rs`
//! compare every shape and path with the portable reference bit for bit.
//!
//! [`combine_lanes`]: crate::kernels::tree::combine_lanes

use super::super::scratch::Aligned;
use super::super::tree::{LANES, PAIR_BLOCK, fuse_in_order};
use super::packed::{PackedTokens, Positions};
use super::{Weights, fold_f32};

/// Blocks of 32 inputs per weight panel: 64 blocks = 2,048 inputs, so a panel of four rows is
/// 32 KiB of f32 (in a core's L2 cache while every token tile of the call passes over it) and
/// each lane's running sum is stored and reloaded once per 2,048 inputs (the k-block the f64
/// kernel measured best, issue 30).
pub(crate) const K_BLOCKS: usize = 64;

/// One instruction set's GEMM pieces. A value exists only on a CPU that supports the
/// instruction set (as for [`super::Simd`]), so calling its `#[target_feature]` code is sound.
pub(crate) trait Gemm: Copy + Sync {
    /// Where each input of a block sits in the panels and packed tokens.
    const POSITIONS: Positions;
    /// Weight rows per micro-kernel tile.
    const ROWS: usize;
    /// Tokens per micro-kernel tile.
    const TOKENS: usize;

    /// Decodes blocks `b0 .. b0 + nb` of the `R` BF16 rows in `rows` (row-major, `cols` wide)
    /// into `panel` as `[block][row][32]` f32 in [`Gemm::POSITIONS`] order.
    fn decode_bf16<const R: usize>(
        self,
        rows: &[u8],
        cols: usize,
        b0: usize,
        nb: usize,
        panel: &mut [f32],
    );

    /// As [`Gemm::decode_bf16`] for `R` MXFP4 rows (a block is one scale group).
    fn decode_mxfp4<const R: usize>(
        self,
        packed: &[u8],
        scales: &[u8],
        cols: usize,
        b0: usize,
        nb: usize,
        panel: &mut [f32],
    );

    /// `acc[r][t][lane] = fma(panel[b][r][p], x[b][t][p], acc[r][t][lane])` over `nb` blocks and
    /// every position `p` of lane `lane`, even input before odd, for the `R` rows of a panel and
    /// the `TC` tokens of a tile (`x` is `[block][token][32]`, `acc` `[R][TC][16]` in lane
    /// order).
    fn micro<const R: usize, const TC: usize>(
        self,
        panel: &[f32],
        x: &[f32],
        nb: usize,
        acc: &mut [f32],
    );
}

impl Weights<'_> {
    /// Decodes blocks `b0 .. b0 + nb` of rows `r0 .. r0 + R` into `panel`.
    fn decode<S: Gemm, const R: usize>(
        &self,
        s: S,
        r0: usize,
        b0: usize,
        nb: usize,
        panel: &mut [f32],
    ) {
        let (bytes, scales) = self.row_bytes(r0, R);
        match self {
            Weights::Bf16(_) => s.decode_bf16::<R>(bytes, self.cols(), b0, nb, panel),
            Weights::Mxfp4(_) => s.decode_mxfp4::<R>(bytes, scales, self.cols(), b0, nb, panel),
        }
    }
}

/// Rows `r0 .. r0 + n` of `w` against every packed token: `out` is `[n][tokens]` (row-major),
/// each element the weight tree's f32 sum.
pub(crate) fn rows<S: Gemm>(
    s: S,
    w: Weights<'_>,
    x: &PackedTokens,
    r0: usize,
    n: usize,
    out: &mut [f32],
) {
    let cols = w.cols();
    assert_eq!(cols, x.cols(), "packed tokens of another width");
    let t = x.tokens();
    assert!(out.len() >= n * t, "gemm output bounds");
    let blocks = cols / PAIR_BLOCK;
    let full = blocks * PAIR_BLOCK;
    let mut panel = Aligned::<f32>::zeros(S::ROWS * K_BLOCKS * PAIR_BLOCK);
    let mut acc = Aligned::<f32>::zeros(S::ROWS * t * LANES);
    let mut r = r0;
    while r < r0 + n {
        let rr = S::ROWS.min(r0 + n - r);
        let acc = &mut acc.as_mut_slice()[..rr * t * LANES];
        acc.fill(0.0);
        for b0 in (0..blocks).step_by(K_BLOCKS) {
            let nb = K_BLOCKS.min(blocks - b0);
            let panel = &mut panel.as_mut_slice()[..nb * rr * PAIR_BLOCK];
            decode_any(s, &w, rr, r, b0, nb, panel);
            for tile in x.tiles() {
                let xt = &x.data()[tile.offset + b0 * tile.count * PAIR_BLOCK..];
                let at = &mut acc[tile.first * rr * LANES..(tile.first + tile.count) * rr * LANES];
                micro_any(s, rr, tile.count, panel, xt, nb, at);
            }
        }
        for tile in x.tiles() {
            for i in 0..rr {
                for j in 0..tile.count {
                    let at = (tile.first * rr + i * tile.count + j) * LANES;
                    // SAFETY: a value of a `Gemm` type exists only on a CPU with AVX2 (and
                    // more), which includes the AVX `fold_f32` is compiled for.
                    let folded = unsafe { fold_f32(&acc[at..at + LANES]) };
                    let tok = tile.first + j;
                    let tail = x.tail(tok).iter().enumerate();
                    out[(r - r0 + i) * t + tok] =
                        fuse_in_order(folded, tail.map(|(c, &xc)| (w.weight(r + i, full + c), xc)));
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
    panel: &mut [f32],
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
    panel: &[f32],
    x: &[f32],
    nb: usize,
    acc: &mut [f32],
) {
    fn with_rows<S: Gemm, const R: usize>(
        s: S,
        tc: usize,
        panel: &[f32],
        x: &[f32],
        nb: usize,
        acc: &mut [f32],
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

/// The bounds every instruction set's [`Gemm::decode_bf16`] relies on for its unchecked loads
/// and stores: `rows` rows of `cols` BF16, blocks `b0 .. b0 + nb` within a row, and a panel of
/// `nb × rows × 32` f32.
pub(crate) fn check_bf16_panel(
    rows: usize,
    bytes: &[u8],
    cols: usize,
    b0: usize,
    nb: usize,
    panel: &[f32],
) {
    assert!(
        bytes.len() >= 2 * rows * cols
            && (b0 + nb) * PAIR_BLOCK <= cols
            && panel.len() >= nb * rows * PAIR_BLOCK,
        "bf16 panel bounds"
    );
}

/// As [`check_bf16_panel`] for [`Gemm::decode_mxfp4`]; returns the bytes per packed row and
/// the scale groups per row.
pub(crate) fn check_mxfp4_panel(
    rows: usize,
    packed: &[u8],
    scales: &[u8],
    cols: usize,
    b0: usize,
    nb: usize,
    panel: &[f32],
) -> (usize, usize) {
    let (half, groups) = (cols / 2, cols / PAIR_BLOCK);
    assert!(
        (b0 + nb) * PAIR_BLOCK <= cols
            && packed.len() >= rows * half
            && scales.len() >= rows * groups
            && panel.len() >= nb * rows * PAIR_BLOCK,
        "mxfp4 panel bounds"
    );
    (half, groups)
}

/// Defines an instruction set's `micro::<R, TC>` ([`Gemm::micro`]) from its register type and
/// intrinsics: one loop for every instruction set, so each lane's terms are fused in the same
/// order everywhere. Per register group of `$width` lanes (positions `2·g·W …` of a block: W
/// even inputs, then W odd ones): the `R × TC` accumulators are loaded, run over the `nb`
/// blocks of the panel and the token tile — per half one load per row and per token feeding
/// `R × TC` FMAs — and stored.
macro_rules! micro_kernel {
    ($features:literal, $width:expr, $zero:ident, $load:ident, $fma:ident, $store:ident) => {
        // `r` and `t` index the accumulators and the panel / tile together.
        #[allow(clippy::needless_range_loop)]
        #[target_feature(enable = $features)]
        fn micro<const R: usize, const TC: usize>(
            panel: &[f32],
            x: &[f32],
            nb: usize,
            acc: &mut [f32],
        ) {
            const W: usize = $width;
            const B: usize = $crate::kernels::tree::PAIR_BLOCK;
            const L: usize = $crate::kernels::tree::LANES;
            assert!(
                panel.len() >= nb * R * B && x.len() >= nb * TC * B && acc.len() >= R * TC * L,
                "micro-kernel bounds"
            );
            for g in 0..L / W {
                let mut a = [[$zero(); TC]; R];
                for r in 0..R {
                    for t in 0..TC {
                        // SAFETY: (r·TC + t)·16 + W·(g + 1) ≤ R·TC·16 ≤ acc.len() (asserted).
                        a[r][t] = unsafe { $load(acc.as_ptr().add((r * TC + t) * L + g * W)) };
                    }
                }
                for b in 0..nb {
                    for h in 0..2 {
                        let at = 2 * g * W + h * W;
                        let mut w = [$zero(); R];
                        for r in 0..R {
                            // SAFETY: b < nb, r < R, at + W ≤ 32: within nb·R·32 ≤ panel.len().
                            w[r] = unsafe { $load(panel.as_ptr().add((b * R + r) * B + at)) };
                        }
                        for t in 0..TC {
                            // SAFETY: b < nb, t < TC, at + W ≤ 32: within nb·TC·32 ≤ x.len().
                            let xv = unsafe { $load(x.as_ptr().add((b * TC + t) * B + at)) };
                            for r in 0..R {
                                a[r][t] = $fma(w[r], xv, a[r][t]);
                            }
                        }
                    }
                }
                for r in 0..R {
                    for t in 0..TC {
                        // SAFETY: as for the loads of `a` above.
                        unsafe { $store(acc.as_mut_ptr().add((r * TC + t) * L + g * W), a[r][t]) };
                    }
                }
            }
        }
    };
}
pub(crate) use micro_kernel;

/// The `Gemm` methods of an instruction set forwarding to the `#[target_feature]` functions of
/// the same names in the invoking module (see [`super::simd_forwarders`] for why a macro).
macro_rules! gemm_forwarders {
    () => {
        fn decode_bf16<const R: usize>(
            self,
            rows: &[u8],
            cols: usize,
            b0: usize,
            nb: usize,
            panel: &mut [f32],
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
            panel: &mut [f32],
        ) {
            // SAFETY: as for `decode_bf16`.
            unsafe { decode_mxfp4::<R>(packed, scales, cols, b0, nb, panel) }
        }

        fn micro<const R: usize, const TC: usize>(
            self,
            panel: &[f32],
            x: &[f32],
            nb: usize,
            acc: &mut [f32],
        ) {
            // SAFETY: as for `decode_bf16`.
            unsafe { micro::<R, TC>(panel, x, nb, acc) }
        }
    };
}
pub(crate) use gemm_forwarders;
