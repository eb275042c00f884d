//! Softmax in the fixed order of spec §6.1 rule 8.

/// Probabilities `π_i = e_i / Z` in f64, `e_i = exp(s_i − max)`, `Z` summed in index order.
pub fn softmax_f64(scores: &[f64]) -> Vec<f64> {
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|&s| libm::exp(s - m)).collect();
    let mut z = 0.0f64;
    for &v in &e {
        z += v;
    }
    e.into_iter().map(|v| v / z).collect()
}
