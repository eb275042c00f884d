//! Activations laid out for the SIMD kernels: which input of a block of 32 sits at which
//! position of a register group ([`Positions`]), and a call's token rows packed in that order
//! once ([`PackedTokens`]), so the weights can be used exactly as they decode (see the parent
//! module for why the weight tree allows it).

use rayon::prelude::*;

use super::super::scratch::Aligned;
use super::super::tree::PAIR_BLOCK;

/// Which input of its block of 32 each packed position holds, for an instruction set whose
/// registers hold `W` f32: register group `g` (lanes `gW … gW + W − 1`) is stored as its even
/// inputs, then its odd inputs, so position `2gW + hW + j` holds input `2(gW + j) + h`.
pub(crate) type Positions = [usize; PAIR_BLOCK];

/// The [`Positions`] of registers of `width` f32 lanes (8 for AVX2, 16 for AVX-512).
pub(crate) const fn pair_positions(width: usize) -> Positions {
    let mut p = [0usize; PAIR_BLOCK];
    let mut i = 0;
    while i < PAIR_BLOCK {
        let (g, h, j) = (i / (2 * width), (i / width) % 2, i % width);
        p[i] = 2 * (g * width + j) + h;
        i += 1;
    }
    p
}

/// Packed values from which [`PackedTokens::new`] packs its tiles in parallel.
const PARALLEL_MIN_VALUES: usize = 1 << 16;

/// One tile of tokens in a [`PackedTokens`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct TokenTile {
    /// Its first token.
    pub(crate) first: usize,
    /// Tokens in it (1 ..= the GEMM's tile).
    pub(crate) count: usize,
    /// Where its `[block][token][32]` values start in the packed data.
    pub(crate) offset: usize,
}

/// The activations of one call laid out for the kernels: the full blocks of 32 of each token
/// tile as `[block][token][32]` in [`Positions`] order, the `cols mod 32` tail of every token
/// apart, in index order.
pub(crate) struct PackedTokens {
    data: Aligned<f32>,
    tiles: Vec<TokenTile>,
    /// `[token][cols mod 32]`.
    tails: Vec<f32>,
    tokens: usize,
    cols: usize,
}

impl PackedTokens {
    /// Packs the `xs.len() / cols` token rows of `xs` into tiles of at most `tile` tokens,
    /// sized as evenly as possible (13 tokens in tiles of 6 become 5 + 4 + 4, not 6 + 6 + 1:
    /// a narrow tile leaves the FMA units idle while its weights still have to be loaded).
    pub(crate) fn new(xs: &[f32], cols: usize, positions: &Positions, tile: usize) -> Self {
        let tokens = xs.len() / cols;
        let blocks = cols / PAIR_BLOCK;
        let full = blocks * PAIR_BLOCK;
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
        let mut data = Aligned::<f32>::zeros(tokens * full);
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
        let pack = |(t, run): &mut (&TokenTile, &mut [f32])| {
            for b in 0..blocks {
                for j in 0..t.count {
                    let src = &xs[(t.first + j) * cols + b * PAIR_BLOCK..][..PAIR_BLOCK];
                    let dst = &mut run[(b * t.count + j) * PAIR_BLOCK..][..PAIR_BLOCK];
                    for (d, &input) in dst.iter_mut().zip(positions) {
                        *d = src[input];
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
            .flat_map(|x| x[full..].iter().copied())
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

    /// The packed blocks (for one token: its `[block][32]` row).
    pub(crate) fn data(&self) -> &[f32] {
        self.data.as_slice()
    }

    /// The token tiles, in token order.
    pub(crate) fn tiles(&self) -> &[TokenTile] {
        &self.tiles
    }

    /// Inputs per token.
    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// Token `tok`'s tail inputs, in index order.
    pub(crate) fn tail(&self, tok: usize) -> &[f32] {
        let tail = self.cols % PAIR_BLOCK;
        &self.tails[tok * tail..(tok + 1) * tail]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tree::weight_lane;

    #[test]
    fn pair_positions_put_each_lanes_two_inputs_in_its_register_position() {
        for width in [8, 16] {
            let p = pair_positions(width);
            let mut seen = [false; PAIR_BLOCK];
            for (pos, &input) in p.iter().enumerate() {
                assert!(!seen[input], "input {input} twice");
                seen[input] = true;
                // Position `pos` is lane `pos mod W` of register group `pos / 2W`.
                let lane = (pos / (2 * width)) * width + pos % width;
                assert_eq!(weight_lane(input), lane, "width {width}, position {pos}");
                assert_eq!(input % 2, (pos / width) % 2, "even half first");
            }
        }
        assert_eq!(pair_positions(16)[..3], [0, 2, 4]);
        assert_eq!(pair_positions(16)[16..19], [1, 3, 5]);
        assert_eq!(pair_positions(8)[8..10], [1, 3]);
        assert_eq!(pair_positions(8)[16..18], [16, 18]);
    }

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
        let positions: Positions = std::array::from_fn(|p| PAIR_BLOCK - 1 - p);
        let cols = 67;
        let xs: Vec<f32> = (0..5 * cols).map(|i| i as f32).collect();
        let p = PackedTokens::new(&xs, cols, &positions, 3);
        // Tiles of 3 + 2; token 4 is the second of the second tile.
        let t = p.tiles[1];
        assert_eq!((t.first, t.count), (3, 2));
        let at = t.offset + (t.count + 1) * PAIR_BLOCK; // block 1, token 4, position 0
        assert_eq!(p.data.as_slice()[at], (4 * cols + 32 + 31) as f32);
        assert_eq!(p.tail(4), &[332.0, 333.0, 334.0]);
        assert_eq!(p.data.as_slice().as_ptr().align_offset(64), 0);
    }
}
