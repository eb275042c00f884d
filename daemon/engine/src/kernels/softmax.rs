//! Softmax in the fixed order of spec §6.1 rule 8.

use super::exp::exp_in_place;
use super::isa::{Isa, IsaKind};

/// Probabilities `π_i = e_i / Z` in f64, `e_i = exp(s_i − max)`, `Z` summed in index order.
pub fn softmax_f64(scores: &[f64]) -> Vec<f64> {
    let mut pi = scores.to_vec();
    softmax_f64_in_place(&mut pi);
    pi
}

/// [`softmax_f64`] overwriting the scores with the probabilities (no allocation; the `exp`s
/// run on vector lanes with `libm::exp`'s bits, `kernels::exp`).
pub fn softmax_f64_in_place(scores: &mut [f64]) {
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    for s in scores.iter_mut() {
        *s -= m;
    }
    exp_in_place(scores);
    let mut z = 0.0f64;
    for &v in scores.iter() {
        z += v;
    }
    for v in scores.iter_mut() {
        *v /= z;
    }
}

/// One term of a probability-weighted sum of rows (spec §6.1 rule 8: f64, index order):
/// `acc[j] += w · row[j]` for every `j`. Elementwise, so every path gives the same bits; the
/// vector paths only widen the registers. Fastest path.
#[inline]
pub fn accumulate_weighted(isa: Isa, acc: &mut [f64], w: f64, row: &[f32]) {
    assert_eq!(acc.len(), row.len(), "accumulator width");
    match isa.kind() {
        // SAFETY: an `Isa` of kind Avx512 is only constructed after `IsaKind::is_supported`
        // detected AVX-512F, AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx512 => unsafe { accumulate_avx512(acc, w, row) },
        // SAFETY: an `Isa` of kind Avx2 is only constructed after `IsaKind::is_supported`
        // detected AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx2 => unsafe { accumulate_avx2(acc, w, row) },
        _ => accumulate(acc, w, row),
    }
}

/// # Safety
/// The running CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn accumulate_avx512(acc: &mut [f64], w: f64, row: &[f32]) {
    accumulate(acc, w, row)
}

/// # Safety
/// The running CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn accumulate_avx2(acc: &mut [f64], w: f64, row: &[f32]) {
    accumulate(acc, w, row)
}

/// A multiply then an add per element (Rust never fuses them).
#[inline(always)]
fn accumulate(acc: &mut [f64], w: f64, row: &[f32]) {
    for (a, &x) in acc.iter_mut().zip(row) {
        *a += w * x as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u64) -> Vec<f64> {
        let mut z = seed;
        (0..n)
            .map(|_| {
                z ^= z << 13;
                z ^= z >> 7;
                z ^= z << 17;
                ((z >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 60.0
            })
            .collect()
    }

    /// Rule 8 written out with scalar `libm::exp`: what the in-place, vector-`exp` softmax
    /// must equal bit for bit.
    #[test]
    fn softmax_is_rule_8_with_libm_exp() {
        for n in [1, 7, 8, 9, 100, 4099] {
            let scores = values(n, 0x5eed + n as u64);
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|&s| libm::exp(s - m)).collect();
            let z = e.iter().fold(0.0, |z, &v| z + v);
            let want: Vec<u64> = e.iter().map(|v| (v / z).to_bits()).collect();
            let got: Vec<u64> = softmax_f64(&scores).iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "n = {n}");
        }
    }

    #[test]
    fn the_weighted_sum_has_the_same_bits_on_every_path() {
        let rows: Vec<f32> = values(37 * 9, 7).iter().map(|&v| v as f32).collect();
        let weights = values(9, 11);
        let sum = |isa: Isa| {
            let mut acc = vec![0.0f64; 37];
            for (row, &w) in rows.chunks_exact(37).zip(&weights) {
                accumulate_weighted(isa, &mut acc, w, row);
            }
            acc.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        for isa in Isa::all_supported() {
            assert_eq!(sum(isa), sum(Isa::portable()), "{isa:?}");
        }
    }
}
