//! Block Attention Residuals (spec §4.3–§4.4): the aggregator that feeds every sub-layer a
//! softmax mixture of block snapshots, and the block schedule.

use crate::kernels::norm::rms_inverse;
use crate::kernels::reduce::dot_f32;
use crate::kernels::softmax::softmax_f64;

/// Whether layer `layer` (zero-based) starts a new block: `L mod B == 0` (spec §4.4) — not
/// `(L+1) mod B` (spec §5.3 item 13).
pub fn is_block_start(layer: usize, block_size: usize) -> bool {
    layer.is_multiple_of(block_size)
}

/// Folds a norm gain and a pseudo-query into the score vector `f = n ⊙ p` (spec §4.3). The
/// product of two BF16 values is exact in f32.
pub fn fold_query(norm: &[f32], proj: &[f32]) -> Vec<f32> {
    norm.iter().zip(proj).map(|(&n, &p)| n * p).collect()
}

/// `AR(sources; f)` for one token: keys are the RMS-normalised sources, values the raw sources.
/// `out = Σ_b π_b · s_b`, each element summed in f64 in source order and rounded once.
pub fn aggregate(sources: &[&[f32]], f: &[f32], eps: f64, out: &mut [f32]) {
    let scores: Vec<f64> = sources
        .iter()
        .map(|s| rms_inverse(s, eps) * dot_f32(f, s))
        .collect();
    let pi = softmax_f64(&scores);
    for (i, o) in out.iter_mut().enumerate() {
        let mut acc = 0.0f64;
        for (p, s) in pi.iter().zip(sources) {
            acc += p * s[i] as f64;
        }
        *o = acc as f32;
    }
}
