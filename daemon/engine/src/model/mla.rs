//! Gated MLA with NoPE (spec §4.6), in the absorbed form.
//!
//! The cache holds the latent form per position (spec §4.6, §5.1): one row of `kv_lora + rope`
//! values `[lat | kr]` — the normalised latent and the raw shared "rope" key — never expanded
//! K/V. `kv_b_proj` is folded into each query and each head output instead of re-expanding the
//! cache, so the work through `kv_b_proj` is per new token, not per cached position. For query
//! token p and head h, with `W_kb_h` / `W_vb_h` the head's k_nope / v rows of `kv_b_proj`
//! (rows `(nope+v)·h …+nope−1` and `(nope+v)·h+nope …+v−1`, spec §3.3):
//!
//! ```text
//! q̃_h     = round_f32(W_kb_hᵀ · q_nope_h)                  tree over the nope rows
//! score_s = tree([q̃_h | q_rope_h] · [lat_s | kr_s]) / √(nope + rope)      s = 0..=p
//! π       = softmax(score)                                  spec §6.1 rule 8
//! m_h     = round_f32(Σ_s π_s · lat_s)                     f64, index order (rule 8)
//! o_h     = round_f32(W_vb_h · m_h)                        tree over the latent
//! ```
//!
//! In exact arithmetic this is §4.6's expanded form (`q_nope·(W_kb·lat) = (W_kbᵀ·q_nope)·lat`,
//! `Σ π·(W_vb·lat) = W_vb·(Σ π·lat)`); only the rounding points move. The score is ONE tree
//! reduction (spec §6.1 rule 3) of `kv_lora + rope` terms over the concatenated vectors, latent
//! first, then one multiply by the scale. Nothing computed for query p depends on which call
//! or chunk computed it — only on cache rows `0..=p` and the query's own inputs — so prefill in
//! one call, chunked prefill, token-by-token decode and full recompute give the same bits: one
//! form for prefill and decode alike, as §4.6's last paragraph and §6.1 rule 5 require of
//! absorption.

use rayon::prelude::*;

use super::ModelError;
use super::mlp::{Linear, Matrix, apply};
use crate::kernels::elementwise::sigmoid;
use crate::kernels::norm::rms_norm;
use crate::kernels::reduce::dot_f32_with;
use crate::kernels::softmax::{accumulate_weighted, softmax_f64_in_place};
use crate::kernels::{Bf16Matrix, Isa, matmul_bf16, matmul_bf16_transposed};

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

    /// Values cached per position: `kv_lora` latent + `rope` shared key.
    pub fn cache_width(&self) -> usize {
        self.kv_lora + self.rope
    }
}

/// The layer's two latent norm gains, decoded once at load.
#[derive(Debug, Clone)]
pub struct MlaParams {
    pub q_a_norm: Vec<f32>,
    pub kv_a_norm: Vec<f32>,
}

/// The layer's matrices, borrowed from its trunk run (or streamed from it, consumed in
/// [`LayerLayout::stream_order`](crate::checkpoint::layout::LayerLayout::stream_order)'s order).
pub struct MlaMatrices<'a> {
    pub q_a_proj: Matrix<'a>,
    pub q_b_proj: Matrix<'a>,
    pub kv_a_proj: Matrix<'a>,
    pub kv_b_proj: Matrix<'a>,
    pub o_proj: Matrix<'a>,
    /// The output gate, present iff `mla_use_output_gate`.
    pub g_proj: Option<Matrix<'a>>,
}

/// The latent cache of one MLA layer (spec §5.1): per position one row of
/// [`MlaDims::cache_width`] values, `[lat (kv_lora, normalised) | kr (rope, raw)]`. Kept as one
/// row so the score is a single contiguous dot (see the module doc).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MlaCache {
    pub rows: Vec<f32>,
}

/// Runs the layer on the T normed rows `xs` `[T, hidden]` of one sequence, appending T cache
/// rows; `out` is `[T, hidden]`. A batch of one ([`forward_batch`]).
pub fn forward(
    dims: &MlaDims,
    m: &MlaMatrices<'_>,
    p: &MlaParams,
    xs: &[f32],
    cache: &mut MlaCache,
    out: &mut [f32],
) -> Result<(), ModelError> {
    let rows = xs.len() / dims.hidden;
    forward_batch(dims, m, p, xs, &mut [(cache, rows)], out)
}

/// Runs the layer on the rows `xs` `[rows, hidden]` of several sequences, concatenated in
/// `members` order, each `(cache, rows)` appending its own rows to its own cache; `out` is
/// `[rows, hidden]`. Everything but the attention over a cache is row-independent and runs
/// once over all rows, so each weight — the projections, each head's `kv_b_proj` rows, the
/// gate and `o_proj` — is read once per call whatever the batch; each query attends only to
/// its own sequence's cache. Each row's bits are those of the member alone.
pub fn forward_batch(
    dims: &MlaDims,
    m: &MlaMatrices<'_>,
    p: &MlaParams,
    xs: &[f32],
    members: &mut [(&mut MlaCache, usize)],
    out: &mut [f32],
) -> Result<(), ModelError> {
    let x = MlaProjections::new(dims, m, p, xs)?;
    let cw = dims.cache_width();
    let mut first = 0;
    for (cache, rows) in members.iter_mut() {
        let latent = &x.latent[first * cw..(first + *rows) * cw];
        for row in latent.chunks_exact(cw) {
            let at = cache.rows.len();
            cache.rows.resize(at + cw, 0.0);
            let (lat, kr) = cache.rows[at..].split_at_mut(dims.kv_lora);
            rms_norm(&row[..dims.kv_lora], &p.kv_a_norm, LATENT_NORM_EPS, lat);
            // The shared key: not normalised, not rotated, one vector for all heads.
            kr.copy_from_slice(&row[dims.kv_lora..]);
        }
        first += *rows;
    }
    let caches: Vec<(&[f32], usize)> = members
        .iter()
        .map(|(cache, rows)| (cache.rows.as_slice(), *rows))
        .collect();
    let kv_b = m.kv_b_proj.whole()?;
    let mut o = attend(dims, &kv_b, &x.q, &caches);
    if let Some(gl) = &x.gate {
        // σ(W_g x) on the heads × v outputs; no norm.
        for (y, &g) in o.iter_mut().zip(gl) {
            *y = (*y as f64 * sigmoid(g as f64)) as f32;
        }
    }
    m.o_proj.apply(&o, out)
}

/// The row-independent projections of every row of a call.
struct MlaProjections {
    /// The queries `[rows, heads, nope + rope]`.
    q: Vec<f32>,
    /// `kv_a_proj`'s rows `[rows, kv_lora + rope]`, before the latent norm.
    latent: Vec<f32>,
    /// The output gate's logits `[rows, heads × v]`, iff the layer has one.
    gate: Option<Vec<f32>>,
}

impl MlaProjections {
    /// The projections in [`LayerLayout::stream_order`](crate::checkpoint::layout::LayerLayout::stream_order)'s order.
    fn new(
        dims: &MlaDims,
        m: &MlaMatrices<'_>,
        p: &MlaParams,
        xs: &[f32],
    ) -> Result<Self, ModelError> {
        let qa = apply(&m.q_a_proj, xs)?;
        let mut qn = vec![0.0f32; qa.len()];
        for (src, dst) in qa
            .chunks_exact(dims.q_lora)
            .zip(qn.chunks_exact_mut(dims.q_lora))
        {
            rms_norm(src, &p.q_a_norm, LATENT_NORM_EPS, dst);
        }
        Ok(MlaProjections {
            q: apply(&m.q_b_proj, &qn)?,
            latent: apply(&m.kv_a_proj, xs)?,
            gate: m.g_proj.as_ref().map(|g| apply(g, xs)).transpose()?,
        })
    }
}

/// The absorbed attention (module doc) of the queries `q` `[rows, heads, nope + rope]`, whose
/// rows belong to `caches` in order: per member its cache (the member's rows already appended)
/// and how many of the rows are its — the last that many positions of the cache; `kv_b` is
/// `kv_b_proj`'s bytes. Returns the head outputs `[rows, heads, v]`.
fn attend(dims: &MlaDims, kv_b: &[u8], q: &[f32], caches: &[(&[f32], usize)]) -> Vec<f32> {
    let (lw, cw) = (dims.kv_lora, dims.cache_width());
    let t: usize = caches.iter().map(|(_, rows)| rows).sum();
    // Head h's `n` rows of kv_b_proj from row `from` within the head's [k_nope | v] block
    // (spec §3.3 row layout), viewed in the stored bytes.
    let hw = dims.nope + dims.v;
    let head_rows = |h: usize, from: usize, n: usize| {
        let r0 = h * hw + from;
        Bf16Matrix::new(&kv_b[2 * r0 * lw..2 * (r0 + n) * lw], n, lw)
    };
    let scale = 1.0 / (dims.qk() as f64).sqrt();
    let isa = Isa::detect();
    // One task per head (independent outputs, spec §6.1 rule 4): all rows' queries through
    // its kv_b_proj rows, each row's causal attention over its own sequence's cache, and all
    // rows' outputs `[rows][v]`.
    let per_head: Vec<Vec<f32>> = (0..dims.heads)
        .into_par_iter()
        .map(|h| {
            let q_head = |tok: usize| {
                let at = (tok * dims.heads + h) * dims.qk();
                q[at..at + dims.qk()].split_at(dims.nope)
            };
            let q_nope: Vec<f32> = (0..t).flat_map(|tok| q_head(tok).0).copied().collect();
            let mut q_lat = vec![0.0f32; t * lw];
            matmul_bf16_transposed(head_rows(h, 0, dims.nope), &q_nope, &mut q_lat);
            let mut mix = vec![0.0f32; t * lw];
            let mut block = QueryBlock::new(isa, cw, lw, scale);
            let mut tok = 0;
            for &(rows, n) in caches {
                // The member's rows are the cache's last `n` positions.
                let first = rows.len() / cw - n;
                for start in (0..n).step_by(QUERY_BLOCK) {
                    let b = QUERY_BLOCK.min(n - start);
                    let queries =
                        (tok..tok + b).map(|tok| (&q_lat[tok * lw..(tok + 1) * lw], q_head(tok).1));
                    block.attend(rows, first + start, queries);
                    for (y, &a) in mix[tok * lw..(tok + b) * lw].iter_mut().zip(&block.acc) {
                        *y = a as f32;
                    }
                    tok += b;
                }
            }
            let mut o_head = vec![0.0f32; t * dims.v];
            matmul_bf16(head_rows(h, dims.nope, dims.v), &mix, &mut o_head);
            o_head
        })
        .collect();
    // Outputs as [rows][heads][v].
    let mut o = vec![0.0f32; t * dims.heads * dims.v];
    for (h, o_head) in per_head.iter().enumerate() {
        for (tok, src) in o_head.chunks_exact(dims.v).enumerate() {
            let at = (tok * dims.heads + h) * dims.v;
            o[at..at + dims.v].copy_from_slice(src);
        }
    }
    o
}

/// Queries of one head attended together: each cache row is then loaded once per block
/// instead of once per query (at 40,000 positions a head's rows are megabytes, far beyond the
/// core's caches). Blocking changes no bit: every score is the same dot, every softmax the same
/// row, and each query's mix sums its own positions in index order.
const QUERY_BLOCK: usize = 16;

/// The buffers of one [`QUERY_BLOCK`] of queries, reused from block to block.
struct QueryBlock {
    isa: Isa,
    /// Cache row width (`kv_lora + rope`) and latent width (`kv_lora`).
    cw: usize,
    lw: usize,
    /// The score scale `1/√(nope + rope)`.
    scale: f64,
    /// The queries `[b][cw]`: `[q̃_h | q_rope_h]`.
    queries: Vec<f32>,
    /// Query i's scores, then probabilities, over positions `0..=at0 + i`, at `i · width`.
    scores: Vec<f64>,
    /// The mixes `[b][lw]`, f64 (module doc: `m_h`).
    acc: Vec<f64>,
}

impl QueryBlock {
    fn new(isa: Isa, cw: usize, lw: usize, scale: f64) -> QueryBlock {
        QueryBlock {
            isa,
            cw,
            lw,
            scale,
            queries: Vec::new(),
            scores: Vec::new(),
            acc: Vec::new(),
        }
    }

    /// Attends the queries at positions `at0, at0 + 1, …` (given as their latent and rope
    /// parts) over `rows`, the member's cache rows; leaves the mixes in `self.acc`.
    fn attend<'q>(
        &mut self,
        rows: &[f32],
        at0: usize,
        queries: impl Iterator<Item = (&'q [f32], &'q [f32])>,
    ) {
        let (cw, lw) = (self.cw, self.lw);
        self.queries.clear();
        for (lat, rope) in queries {
            self.queries.extend_from_slice(lat);
            self.queries.extend_from_slice(rope);
        }
        let b = self.queries.len() / cw;
        let width = at0 + b;
        let keys = || rows[..width * cw].chunks_exact(cw).enumerate();
        self.scores.clear();
        self.scores.resize(b * width, 0.0);
        // Query i sees positions 0..=at0 + i.
        for (s, key) in keys() {
            for i in s.saturating_sub(at0)..b {
                let query = &self.queries[i * cw..(i + 1) * cw];
                self.scores[i * width + s] = dot_f32_with(self.isa, query, key) * self.scale;
            }
        }
        for i in 0..b {
            softmax_f64_in_place(&mut self.scores[i * width..i * width + at0 + i + 1]);
        }
        self.acc.clear();
        self.acc.resize(b * lw, 0.0);
        for (s, key) in keys() {
            for i in s.saturating_sub(at0)..b {
                let w = self.scores[i * width + s];
                accumulate_weighted(self.isa, &mut self.acc[i * lw..(i + 1) * lw], w, &key[..lw]);
            }
        }
    }
}
