//! The one reduction tree (spec §6.1 rule 3).
//!
//! Sixteen f64 lanes; term `i` goes to lane `i mod 16` in increasing `i` over the full groups of
//! sixteen; lanes combine pairwise as `t_k = l_k + l_{k+8}`, `u_k = t_k + t_{k+4}`,
//! `v_k = u_k + u_{k+2}`, `sum = v_0 + v_1`; the `n mod 16` tail terms are then added one by one
//! in increasing index. SIMD kernels must reproduce exactly this association.

use super::isa::{Isa, IsaKind};
#[cfg(target_arch = "x86_64")]
use super::x86;

/// Number of f64 accumulator lanes of the tree.
pub const LANES: usize = 16;

/// Folds the sixteen lanes in the fixed order.
#[inline]
pub fn combine_lanes(l: &[f64; LANES]) -> f64 {
    let mut t = [0.0f64; 8];
    for k in 0..8 {
        t[k] = l[k] + l[k + 8];
    }
    let mut u = [0.0f64; 4];
    for k in 0..4 {
        u[k] = t[k] + t[k + 4];
    }
    let v0 = u[0] + u[2];
    let v1 = u[1] + u[3];
    v0 + v1
}

/// `Σ_{i<n} term(i)` with the fixed tree. `term` must return exact products (spec §6.1 rule 2).
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

/// `Σ a_i·b_i` of two f32 vectors, f64 tree, not rounded. Fastest path.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f64 {
    dot_f32_with(Isa::detect(), a, b)
}

/// [`dot_f32`] on a chosen path; every path gives the same bits.
pub fn dot_f32_with(isa: Isa, a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "dot of unequal lengths");
    match isa.kind() {
        // SAFETY: an `Isa` of kind Avx512 is only constructed after `IsaKind::is_supported`
        // detected AVX-512F, AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx512 => unsafe { x86::avx512::dot(a, b) },
        // SAFETY: an `Isa` of kind Avx2 is only constructed after `IsaKind::is_supported`
        // detected AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx2 => unsafe { x86::avx2::dot(a, b) },
        _ => tree_sum(a.len(), |i| a[i] as f64 * b[i] as f64),
    }
}

/// `Σ a_i²`, f64 tree, not rounded. Fastest path.
#[inline]
pub fn sum_squares(a: &[f32]) -> f64 {
    sum_squares_with(Isa::detect(), a)
}

/// [`sum_squares`] on a chosen path: the dot of `a` with itself (the same exact products).
pub fn sum_squares_with(isa: Isa, a: &[f32]) -> f64 {
    dot_f32_with(isa, a, a)
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
}
