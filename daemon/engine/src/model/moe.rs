//! Stable LatentMoE (spec §4.8): route on the full-width x, run the routed experts on the latent
//! `z = down · x`, sum their outputs in f64 in top-k order, RMSNorm the aggregate, project back
//! up, and add the shared MLP computed on the original x with weight 1.
//!
//! Two phases around the weight store: [`plan`] computes `z` and the routing and names the
//! experts the T tokens need (the union); [`run_expert`] runs one expert on all its tokens (its
//! weights read once), in any order; [`combine`] sums per token in top-k order (spec §6.1 rule 9).
//! [`run_experts`] runs a set of experts in parallel (independent outputs).

use rayon::prelude::*;

use super::mlp::{Linear, Matrix, Mlp, Situ, apply};
use super::router::{RouterConfig, Routing, route};
use super::{ModelError, grain};
use crate::kernels::Mxfp4Matrix;
use crate::kernels::norm::rms_norm;

/// Widths of a MoE layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeDims {
    pub hidden: usize,
    /// `routed_expert_hidden_size`, the width the experts work in.
    pub latent: usize,
    pub act: Situ,
    pub router: RouterConfig,
    /// ε of the aggregate norm.
    pub eps: f64,
}

/// The layer's small parameters, decoded once at load.
#[derive(Debug, Clone)]
pub struct MoeParams {
    pub score_bias: Vec<f32>,
    /// Gain of the aggregate RMSNorm, present iff `latent_moe_use_norm`.
    pub routed_norm: Option<Vec<f32>>,
}

/// The non-routed matrices, borrowed from the trunk run (or streamed from it, consumed in
/// [`LayerLayout::stream_order`](crate::checkpoint::layout::LayerLayout::stream_order)'s order: `latent_down`, `router`, the shared MLP,
/// `latent_up`).
pub struct MoeMatrices<'a> {
    pub router: Matrix<'a>,
    pub latent_down: Matrix<'a>,
    pub latent_up: Matrix<'a>,
    pub shared: Mlp<Matrix<'a>>,
}

/// A routed expert: `w1` = gate, `w3` = up, `w2` = down, all MXFP4.
pub type Expert<'a> = Mlp<Mxfp4Matrix<'a>>;

/// The result of the routing phase for T tokens.
pub struct MoePlan {
    /// `[T, latent]`.
    pub z: Vec<f32>,
    pub routes: Vec<Routing>,
    /// The distinct experts the T tokens use, ascending.
    pub needed: Vec<usize>,
}

/// Phase 1: latent projection and routing of the T rows of `xs`.
pub fn plan(
    dims: &MoeDims,
    m: &MoeMatrices<'_>,
    p: &MoeParams,
    xs: &[f32],
) -> Result<MoePlan, ModelError> {
    let z = apply(&m.latent_down, xs)?;
    let routes = route_rows(dims, m, p, xs)?;
    let needed = union(&routes);
    Ok(MoePlan { z, routes, needed })
}

/// The experts rows `xs` would route to, most confident first (row by row, each in top-k
/// order, each expert once): the routing lookahead's guess when `xs` approximates the layer's
/// real MoE input. The store reads them early in this order, so the least likely guesses are
/// the ones still queued — and withdrawn — when the real routing disagrees. Nothing computed
/// depends on the guess.
pub fn predict(
    dims: &MoeDims,
    m: &MoeMatrices<'_>,
    p: &MoeParams,
    xs: &[f32],
) -> Result<Vec<usize>, ModelError> {
    let mut seen = vec![false; m.router.rows()];
    let mut ranked = Vec::new();
    for r in route_rows(dims, m, p, xs)? {
        for e in r.experts {
            if let Some(s) = seen.get_mut(e)
                && !*s
            {
                *s = true;
                ranked.push(e);
            }
        }
    }
    Ok(ranked)
}

fn route_rows(
    dims: &MoeDims,
    m: &MoeMatrices<'_>,
    p: &MoeParams,
    xs: &[f32],
) -> Result<Vec<Routing>, ModelError> {
    Ok(apply(&m.router, xs)?
        .chunks_exact(m.router.rows())
        .map(|l| route(dims.router, l, &p.score_bias))
        .collect())
}

/// The distinct experts of `routes`, ascending.
fn union(routes: &[Routing]) -> Vec<usize> {
    let mut needed: Vec<usize> = routes
        .iter()
        .flat_map(|r| r.experts.iter().copied())
        .collect();
    needed.sort_unstable();
    needed.dedup();
    needed
}

/// The outputs of one routed expert for the tokens that chose it: `users[i] = (token, slot)`
/// (slot = position in that token's top-k order) and `ys[i]` its `latent`-wide output row.
pub struct ExpertOutput {
    pub users: Vec<(usize, usize)>,
    pub ys: Vec<f32>,
}

/// Runs expert `e` (weights `w`) on every token of `plan` that routed to it, reading the weights
/// once: `W2_e · SiTU-GLU(W1_e z, W3_e z)`. Independent of every other expert, so experts can be
/// computed in any order — e.g. as their reads complete.
pub fn run_expert(
    dims: &MoeDims,
    plan: &MoePlan,
    e: usize,
    w: &Expert<'_>,
) -> Result<ExpertOutput, ModelError> {
    let lw = dims.latent;
    let users: Vec<(usize, usize)> = plan
        .routes
        .iter()
        .enumerate()
        .filter_map(|(tok, r)| r.experts.iter().position(|&x| x == e).map(|j| (tok, j)))
        .collect();
    let mut zs = Vec::with_capacity(users.len() * lw);
    for &(tok, _) in &users {
        zs.extend_from_slice(&plan.z[tok * lw..(tok + 1) * lw]);
    }
    let mut ys = vec![0.0f32; users.len() * lw];
    w.forward(dims.act, &zs, &mut ys)?;
    Ok(ExpertOutput { users, ys })
}

/// Runs experts `ids[i]` (weights `experts[i]`), in parallel over experts.
pub fn run_experts(
    dims: &MoeDims,
    plan: &MoePlan,
    ids: &[usize],
    experts: &[Expert<'_>],
) -> Result<Vec<ExpertOutput>, ModelError> {
    let expert_work = experts.first().map_or(0, |w| 3 * w.gate.rows * w.gate.cols);
    ids.par_iter()
        .zip(experts)
        .with_min_len(grain(expert_work))
        .map(|(&e, w)| run_expert(dims, plan, e, w))
        .collect()
}

/// The shared MLP on the ORIGINAL x, `[T, hidden]`. It does not depend on routing, so the
/// layer loop runs it while the routed experts are still being read (their reads are issued
/// first), hiding compute under I/O; [`combine`] adds it.
pub fn shared(dims: &MoeDims, m: &MoeMatrices<'_>, xs: &[f32]) -> Result<Vec<f32>, ModelError> {
    let mut out = vec![0.0f32; xs.len()];
    m.shared.forward(dims.act, xs, &mut out)?;
    Ok(out)
}

/// Sums each token's expert outputs in f64 in top-k order (whatever order `outputs` come in),
/// applies the aggregate norm and the up-projection, and adds the [`shared`] MLP's output
/// (weight 1): `out = shared + routed`.
pub fn combine(
    dims: &MoeDims,
    m: &MoeMatrices<'_>,
    p: &MoeParams,
    plan: &MoePlan,
    outputs: &[ExpertOutput],
    shared: Vec<f32>,
) -> Result<Vec<f32>, ModelError> {
    let t = plan.routes.len();
    let k = dims.router.top_k;
    let lw = dims.latent;
    // Where token `tok`'s j-th expert output is: (output, row). The outputs are read in place:
    // copying them into one `[t][k][latent]` buffer (59 MB at 256 tokens of `bench`) was a
    // serial stretch of every MoE layer of a long prompt, mostly the kernel zeroing its fresh
    // pages (issue 30). A slot no output fills reads zeros, as that buffer's did.
    let mut at: Vec<Option<(usize, usize)>> = vec![None; t * k];
    for (i, o) in outputs.iter().enumerate() {
        for (row, &(tok, j)) in o.users.iter().enumerate() {
            at[tok * k + j] = Some((i, row));
        }
    }
    let zeros = vec![0.0f32; lw];
    // acc = Σ_j w_j · y_j in f64, in top-k order, rounded once; then the aggregate norm. Each
    // token is independent, so tokens are split among the threads with the same bits.
    let mut agg = vec![0.0f32; t * lw];
    agg.par_chunks_mut(lw)
        .enumerate()
        .with_min_len(grain(k * lw))
        .for_each_init(
            || vec![0.0f64; lw],
            |acc, (tok, dst)| {
                acc.fill(0.0);
                for (j, &w) in plan.routes[tok].weights.iter().enumerate() {
                    let y = match at[tok * k + j] {
                        Some((i, row)) => &outputs[i].ys[row * lw..(row + 1) * lw],
                        None => &zeros,
                    };
                    for (a, &yi) in acc.iter_mut().zip(y) {
                        *a += w as f64 * yi as f64;
                    }
                }
                for (d, &a) in dst.iter_mut().zip(acc.iter()) {
                    *d = a as f32;
                }
                if let Some(gain) = &p.routed_norm {
                    let raw = dst.to_vec();
                    rms_norm(&raw, gain, dims.eps, dst);
                }
            },
        );
    let routed = apply(&m.latent_up, &agg)?;
    let mut out = shared;
    for (o, &r) in out.iter_mut().zip(&routed) {
        *o += r;
    }
    Ok(out)
}
