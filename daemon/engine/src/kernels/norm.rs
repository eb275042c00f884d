//! RMSNorm and L2Norm (spec §4.1, §6.1 rule 7).

use super::reduce::sum_squares;

/// `out_i = round_f32((x_i · inv) · w_i)` with `inv = 1/sqrt(Σx²/n + ε)` in f64. No `1 + w`.
pub fn rms_norm(x: &[f32], gain: &[f32], eps: f64, out: &mut [f32]) {
    assert!(
        x.len() == gain.len() && x.len() == out.len(),
        "rms_norm length mismatch"
    );
    let inv = rms_inverse(x, eps);
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(gain) {
        *o = ((xi as f64 * inv) * wi as f64) as f32;
    }
}

/// `1 / sqrt(mean(x²) + ε)` in f64, the RMS normaliser shared by RMSNorm and AttnRes keys.
#[inline]
pub fn rms_inverse(x: &[f32], eps: f64) -> f64 {
    1.0 / (sum_squares(x) / x.len() as f64 + eps).sqrt()
}

/// ε inside the KDA q/k L2 norm (spec §4.1): a sum, not a mean, no gain.
pub const L2_NORM_EPS: f64 = 1e-6;

/// `out_i = round_f32(x_i · inv)`, `inv = 1/sqrt(Σx² + 1e-6)`.
pub fn l2_norm(x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "l2_norm length mismatch");
    let inv = 1.0 / (sum_squares(x) + L2_NORM_EPS).sqrt();
    for (o, &xi) in out.iter_mut().zip(x) {
        *o = (xi as f64 * inv) as f32;
    }
}
