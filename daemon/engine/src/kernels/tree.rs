//! The fixed reduction trees (spec §6.1 rules 2–3): one for f64 reductions, one for the f32
//! weight products. Every path — portable, AVX2, AVX-512 — reproduces exactly these
//! associations, so the answer never depends on the instruction set, the thread count, the
//! batch or the chunking.
//!
//! **The f64 tree** ([`tree_sum`]): sixteen f64 lanes; term `i` goes to lane `i mod 16` in
//! increasing `i` over the full groups of sixteen; lanes combine pairwise as
//! `t_k = l_k + l_{k+8}`, `u_k = t_k + t_{k+4}`, `v_k = u_k + u_{k+2}`, `sum = v_0 + v_1`
//! ([`combine_lanes`]); the `n mod 16` tail terms are then added one by one in increasing index.
//! Norms, softmaxes, router scores, MoE sums, KDA, MLA and AttnRes scores use it.
//!
//! **The weight tree** ([`weight_dot`]): a row of a BF16 or MXFP4 weight matrix times an
//! activation row accumulates in f32 by fused multiply-add (spec §6.1 rule 2 as amended,
//! `docs/model.md`). Sixteen f32 lanes; over the full blocks of [`PAIR_BLOCK`] = 32 inputs,
//! inputs `2k` and `2k + 1` of a block both go to lane `k` — first the even one, then the odd
//! one — so lane `k` receives inputs `32g + 2k`, `32g + 2k + 1` for `g = 0, 1, …` in increasing
//! index, each as `lane = fma(w, x, lane)`; the lanes fold by the same [`combine_lanes`] in
//! f32; the `n mod 32` tail inputs are then fused in one by one in increasing index,
//! `sum = fma(w, x, sum)`. Why pairs share a lane: both stored formats hold two consecutive
//! inputs in one unit (a 32-bit pair of BF16 values, one byte of two MXFP4 nibbles), so a
//! register decodes "the even inputs" and "the odd inputs" of a block without any shuffle and
//! each register position keeps its own lane.

use std::ops::Add;

/// Number of accumulator lanes of both trees.
pub const LANES: usize = 16;

/// Inputs per block of the weight tree: two per lane.
pub const PAIR_BLOCK: usize = 2 * LANES;

/// Folds the sixteen lanes in the fixed order (f64 lanes for the f64 tree, f32 lanes for the
/// weight tree).
#[inline]
pub fn combine_lanes<T: Copy + Add<Output = T>>(l: &[T; LANES]) -> T {
    let t: [T; 8] = std::array::from_fn(|k| l[k] + l[k + 8]);
    let u: [T; 4] = std::array::from_fn(|k| t[k] + t[k + 4]);
    let v0 = u[0] + u[2];
    let v1 = u[1] + u[3];
    v0 + v1
}

/// `Σ_{i<n} term(i)` with the f64 tree. `term` must return exact products (spec §6.1 rule 2).
#[inline]
pub fn tree_sum(n: usize, mut term: impl FnMut(usize) -> f64) -> f64 {
    let full = n - n % LANES;
    let mut lanes = [0.0f64; LANES];
    let mut base = 0;
    while base < full {
        for (k, lane) in lanes.iter_mut().enumerate() {
            *lane += term(base + k);
        }
        base += LANES;
    }
    let mut sum = combine_lanes(&lanes);
    for i in full..n {
        sum += term(i);
    }
    sum
}

/// The weight-tree lane of input `i` of a full block (`(i mod 32) / 2`).
#[inline]
pub const fn weight_lane(i: usize) -> usize {
    (i % PAIR_BLOCK) / 2
}

/// `Σ_i w(i) · x[i]` with the weight tree, in f32 by fused multiply-add: the portable
/// reference every SIMD weight product reproduces bit for bit.
#[inline]
pub fn weight_dot(x: &[f32], w: impl Fn(usize) -> f32) -> f32 {
    let n = x.len();
    let full = n - n % PAIR_BLOCK;
    let mut lanes = [0.0f32; LANES];
    for (i, &xi) in x[..full].iter().enumerate() {
        let lane = &mut lanes[weight_lane(i)];
        *lane = w(i).mul_add(xi, *lane);
    }
    let tail = x.iter().enumerate().skip(full);
    fuse_in_order(combine_lanes(&lanes), tail.map(|(i, &xi)| (w(i), xi)))
}

/// Fuses the tail terms `(w, x)` into `sum` one by one in order, `sum = fma(w, x, sum)`: the
/// last step of the weight tree, shared by every path.
#[inline]
pub fn fuse_in_order(sum: f32, terms: impl IntoIterator<Item = (f32, f32)>) -> f32 {
    terms.into_iter().fold(sum, |s, (w, x)| w.mul_add(x, s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_association_is_the_specified_one() {
        // Values chosen so that any other association rounds differently.
        let big = 1e16f64;
        let mut terms = [0.0f64; 19];
        terms[0] = big;
        terms[8] = -big;
        terms[1] = 1.0;
        terms[16] = 1.0;
        terms[17] = big;
        terms[18] = -big;
        // lanes: l0 = big, l8 = -big, l1 = 1 → t0 = 0, t1 = 1 → sum 1; then tail: 1 + 1 + big - big.
        let s = tree_sum(terms.len(), |i| terms[i]);
        let expected = ((1.0f64 + 1.0) + big) + -big;
        assert_eq!(s.to_bits(), expected.to_bits());
    }

    /// Pins the weight tree's lane map, fold and tail: each case differs in f32 from every
    /// other placement of the same terms.
    #[test]
    fn weight_tree_association_is_the_specified_one() {
        let big = 2.0f32.powi(30);
        let x = vec![1.0f32; 35];
        // Inputs 0 and 1 share lane 0 (pairs), input 16 is lane 8: l0 = big + 1 (rounds to
        // big), l8 = -big → t0 = 0. Had 1 gone to its own lane (i mod 16), the sum would be 1.
        let mut w = [0.0f32; 35];
        (w[0], w[1], w[16]) = (big, 1.0, -big);
        assert_eq!(weight_dot(&x, |i| w[i]), 0.0);
        // The tail is fused after the fold, in index order: the lanes sum to big, then -big
        // (→ 0), then 1 → 1. Tail first (-big, then 1 → -big, then the lanes) gives 0, and so
        // does fusing the tail into lane 0.
        let mut w = [0.0f32; 35];
        (w[2], w[32], w[33]) = (big, -big, 1.0);
        assert_eq!(weight_dot(&x, |i| w[i]), 1.0);
        // Each tail term is one fused operation: fma(w, x, sum) rounds once. With w = 1 + 2^-12
        // and x = 1 + 2^-12 the product alone needs 25 bits; an unfused multiply-then-add onto
        // -1 would lose the 2^-24 term.
        let e = 2.0f32.powi(-12);
        let mut w = [0.0f32; 33];
        let mut x = vec![0.0f32; 33];
        (w[0], x[0]) = (-1.0, 1.0);
        (w[32], x[32]) = (1.0 + e, 1.0 + e);
        let fused = weight_dot(&x, |i| w[i]);
        assert_eq!(fused, 2.0 * e + e * e);
    }
}
