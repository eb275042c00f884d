//! Gated MLA with NoPE (spec §4.6). The cache holds the latent form per position: the
//! normalised 512-wide latent and the raw 64-wide shared "rope" key — never expanded K/V.
//!
//! Per call, the cached latents are expanded through `kv_b_proj` (each position's expansion is
//! the same matrix row reductions whatever the call, so chunking cannot change a bit), then
//! each query position attends causally to positions `0..=p` (spec §6.1 rules 5 and 8).

use rayon::prelude::*;

use super::grain;
use super::mlp::{Linear, apply};
use crate::kernels::Bf16Matrix;
use crate::kernels::elementwise::sigmoid;
use crate::kernels::norm::rms_norm;
use crate::kernels::reduce::tree_sum;
use crate::kernels::softmax::softmax_f64;

/// ε of `q_a_layernorm` and `kv_a_layernorm`: the class default 1e-6, not `rms_norm_eps`
/// (spec §4.1; §5.3 item 16).
pub const LATENT_NORM_EPS: f64 = 1e-6;

/// Dimensions of an MLA layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaDims {
    pub hidden: usize,
    pub heads: usize,
    pub q_lora: usize,
    pub kv_lora: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
}

impl MlaDims {
    /// Per-head q/k width `nope + rope`; the softmax scale is its inverse square root.
    pub fn qk(&self) -> usize {
        self.nope + self.rope
    }
}

/// The layer's two latent norm gains, decoded once at load.
#[derive(Debug, Clone)]
pub struct MlaParams {
    pub q_a_norm: Vec<f32>,
    pub kv_a_norm: Vec<f32>,
}

/// The layer's matrices, borrowed from its trunk run.
pub struct MlaMatrices<'a> {
    pub q_a_proj: Bf16Matrix<'a>,
    pub q_b_proj: Bf16Matrix<'a>,
    pub kv_a_proj: Bf16Matrix<'a>,
    pub kv_b_proj: Bf16Matrix<'a>,
    pub o_proj: Bf16Matrix<'a>,
    /// The output gate, present iff `mla_use_output_gate`.
    pub g_proj: Option<Bf16Matrix<'a>>,
}

/// The latent cache of one MLA layer (spec §5.1): per position `kv_lora` normalised latent
/// values and `rope` raw shared-key values.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MlaCache {
    pub latent: Vec<f32>,
    pub rope_key: Vec<f32>,
}

/// Runs the layer on the T normed rows `xs` `[T, hidden]`, appending T cache rows; `out` is
/// `[T, hidden]`.
pub fn forward(
    dims: &MlaDims,
    m: &MlaMatrices<'_>,
    p: &MlaParams,
    xs: &[f32],
    cache: &mut MlaCache,
    out: &mut [f32],
) {
    let t = xs.len() / dims.hidden;
    let qa = apply(&m.q_a_proj, xs);
    let mut qn = vec![0.0f32; qa.len()];
    for (src, dst) in qa
        .chunks_exact(dims.q_lora)
        .zip(qn.chunks_exact_mut(dims.q_lora))
    {
        rms_norm(src, &p.q_a_norm, LATENT_NORM_EPS, dst);
    }
    let q = apply(&m.q_b_proj, &qn);

    let c = apply(&m.kv_a_proj, xs);
    let first = cache.latent.len() / dims.kv_lora;
    let mut lat = vec![0.0f32; dims.kv_lora];
    for row in c.chunks_exact(dims.kv_lora + dims.rope) {
        rms_norm(
            &row[..dims.kv_lora],
            &p.kv_a_norm,
            LATENT_NORM_EPS,
            &mut lat,
        );
        cache.latent.extend_from_slice(&lat);
        // The shared key: not normalised, not rotated, one vector for all heads.
        cache.rope_key.extend_from_slice(&row[dims.kv_lora..]);
    }
    // Per position and head: [k_nope (nope) | v (v)] (spec §3.3 row layout).
    let kv = apply(&m.kv_b_proj, &cache.latent);

    let hw = dims.nope + dims.v;
    let scale = 1.0 / (dims.qk() as f64).sqrt();
    // Outputs as [T][heads][v]; parallel over (token, head), each an independent output.
    let mut o = vec![0.0f32; t * dims.heads * dims.v];
    let work = (first + t) * (dims.qk() + dims.v);
    o.par_chunks_mut(dims.v)
        .with_min_len(grain(work))
        .enumerate()
        .for_each(|(idx, dst)| {
            let (tok, h) = (idx / dims.heads, idx % dims.heads);
            let qh = &q[(tok * dims.heads + h) * dims.qk()..(tok * dims.heads + h + 1) * dims.qk()];
            let visible = first + tok + 1;
            let scores: Vec<f64> = (0..visible)
                .map(|s| {
                    let kn = &kv[(s * dims.heads + h) * hw..(s * dims.heads + h) * hw + dims.nope];
                    let kr = &cache.rope_key[s * dims.rope..(s + 1) * dims.rope];
                    // One 192-term reduction: content dims, then the shared rope slot.
                    let dot = tree_sum(dims.qk(), |i| {
                        let key = if i < dims.nope {
                            kn[i]
                        } else {
                            kr[i - dims.nope]
                        };
                        qh[i] as f64 * key as f64
                    });
                    dot * scale
                })
                .collect();
            let pi = softmax_f64(&scores);
            for (j, y) in dst.iter_mut().enumerate() {
                let mut acc = 0.0f64;
                for (s, &w) in pi.iter().enumerate() {
                    acc += w * kv[(s * dims.heads + h) * hw + dims.nope + j] as f64;
                }
                *y = acc as f32;
            }
        });
    if let Some(g) = &m.g_proj {
        // σ(W_g x) on the heads × v outputs; no norm.
        let gl = apply(g, xs);
        for (y, &g) in o.iter_mut().zip(&gl) {
            *y = (*y as f64 * sigmoid(g as f64)) as f32;
        }
    }
    m.o_proj.apply(&o, out);
}
