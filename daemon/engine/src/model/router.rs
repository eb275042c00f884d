//! The MoE router (spec §4.7): independent sigmoids, the correction bias steering selection
//! only, ties to the lower expert index, unbiased renormalised weights in top-k order.

use crate::kernels::elementwise::sigmoid;

/// Router settings from the config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouterConfig {
    pub top_k: usize,
    pub renormalize: bool,
    pub scaling_factor: f64,
}

/// One token's routing decision: `experts[j]` with weight `weights[j]`, in top-k order
/// (descending biased score, ties by ascending index).
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

/// Routes one token given its router logits `gate.weight · x` and the correction bias.
pub fn route(cfg: RouterConfig, logits: &[f32], bias: &[f32]) -> Routing {
    // s_e = σ(logit_e), an f32 activation; choice_e = s_e + bias_e is the selection key only.
    let scores: Vec<f32> = logits.iter().map(|&l| sigmoid(l as f64) as f32).collect();
    let choice: Vec<f32> = scores
        .iter()
        .zip(bias)
        .map(|(&s, &b)| (s as f64 + b as f64) as f32)
        .collect();
    let mut order: Vec<usize> = (0..scores.len()).collect();
    // Descending choice, ties → lower index; total_cmp keeps this a total order whatever the data.
    order.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
    order.truncate(cfg.top_k);
    let picked: Vec<f64> = order.iter().map(|&e| scores[e] as f64).collect();
    // Renormalisation sum in f64, in top-k order (spec §6.1 rule 9).
    let denom = if cfg.renormalize && cfg.top_k > 1 {
        let mut sum = 0.0f64;
        for &w in &picked {
            sum += w;
        }
        sum + 1e-20
    } else {
        1.0
    };
    let weights = picked
        .iter()
        .map(|&w| (w / denom * cfg.scaling_factor) as f32)
        .collect();
    Routing {
        experts: order,
        weights,
    }
}
