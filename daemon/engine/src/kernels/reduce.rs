//! Dot products and sums of squares of f32 vectors with the f64 tree of [`super::tree`]
//! (spec §6.1 rules 2–3): norms, AttnRes and MLA scores. Weight products use the weight tree
//! instead (`super::matmul`).

use super::isa::{Isa, IsaKind};
use super::tree::tree_sum;
#[cfg(target_arch = "x86_64")]
use super::x86;

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
