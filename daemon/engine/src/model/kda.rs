//! Kimi Delta Attention (spec §4.5): projections, a short causal depthwise conv over carried
//! PRE-conv inputs, L2-normalised q/k, the lower-bounded per-channel decay with a per-HEAD rate,
//! the decay → read → write → read delta-rule recurrence, `o_norm` then the sigmoid gate, `o_proj`.
//!
//! The projections of all rows of a call — the T tokens of one sequence, or of several
//! ([`forward_batch`]) — are batched (each weight read once per call); the conv and the
//! recurrence then run per sequence, sequentially in time, so a T-token call equals T one-token
//! calls bit for bit (spec §6.1 rule 5) and a member of a batch equals the member alone. Heads
//! (of every member) are independent and run in parallel.

use rayon::prelude::*;

use super::mlp::{Linear, Matrix, apply};
use super::{ModelError, grain};
use crate::kernels::elementwise::{sigmoid, sigmoid_of, silu_in_place};
use crate::kernels::exp::exp_in_place;
use crate::kernels::matvec_f32_transposed;
use crate::kernels::norm::{l2_norm, rms_norm};
use crate::kernels::tree::tree_sum;

/// Dimensions and constants of a KDA layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KdaDims {
    pub hidden: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Conv taps `K`.
    pub conv: usize,
    /// Rank of the decay projection pair (`f_a_proj` rows).
    pub rank: usize,
    /// `gate_lower_bound` (negative).
    pub lower_bound: f64,
    /// ε of `o_norm`.
    pub eps: f64,
}

impl KdaDims {
    /// `P` = heads × head_dim.
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }
}

/// The layer's small parameters, decoded once at load.
#[derive(Debug, Clone)]
pub struct KdaParams {
    /// Depthwise taps of the q, k, v convs: `[P][K]`, oldest → current.
    pub conv: [Vec<f32>; 3],
    /// `exp(A_log[h])` for each head `h` (only the first `heads` stored entries).
    pub decay_rate: Vec<f64>,
    /// `[P]`, added to the decay projection inside the sigmoid.
    pub dt_bias: Vec<f32>,
    /// `[D]`, one gain shared by all heads.
    pub o_norm: Vec<f32>,
}

impl KdaParams {
    /// `a_log` is the stored (padded) `A_log`; entries past `dims.heads` are ignored (spec §3.3).
    /// The caller checks `a_log.len() ≥ dims.heads` (the loader does, naming the tensor).
    pub fn new(
        dims: &KdaDims,
        conv: [Vec<f32>; 3],
        a_log: &[f32],
        dt_bias: Vec<f32>,
        o_norm: Vec<f32>,
    ) -> Self {
        let decay_rate = a_log[..dims.heads]
            .iter()
            .map(|&a| libm::exp(a as f64))
            .collect();
        KdaParams {
            conv,
            decay_rate,
            dt_bias,
            o_norm,
        }
    }
}

/// The layer's matrices, borrowed from its trunk run (or streamed from it). A streamed layer's
/// matrices are consumed in the order [`LayerLayout::stream_order`](crate::checkpoint::layout::LayerLayout::stream_order) lists.
pub struct KdaMatrices<'a> {
    pub q_proj: Matrix<'a>,
    pub k_proj: Matrix<'a>,
    pub v_proj: Matrix<'a>,
    pub g_proj: Matrix<'a>,
    pub o_proj: Matrix<'a>,
    pub f_a_proj: Matrix<'a>,
    pub f_b_proj: Matrix<'a>,
    pub b_proj: Matrix<'a>,
}

/// What a KDA layer carries between calls (spec §5.1).
#[derive(Debug, Clone, PartialEq)]
pub struct KdaState {
    /// Per head a `D×D` matrix, row = key channel, column = value channel.
    pub s: Vec<f32>,
    /// q, k, v streams: the last `K−1` PRE-conv inputs, `[K−1][P]`, oldest first.
    pub history: [Vec<f32>; 3],
    /// Present while a speculation is open (spec §5.2 rollback): what [`KdaState::rollback`]
    /// needs to return to any position since it began. `None` otherwise, so a state that has
    /// been committed or rolled back compares equal to one that never speculated.
    pub(crate) journal: Option<Box<Journal>>,
}

impl KdaState {
    /// The zero state of a sequence start.
    pub fn new(dims: &KdaDims) -> Self {
        let hist = vec![0.0f32; dims.conv.saturating_sub(1) * dims.width()];
        KdaState {
            s: vec![0.0f32; dims.heads * dims.head_dim * dims.head_dim],
            history: [hist.clone(), hist.clone(), hist],
            journal: None,
        }
    }

    /// Snapshots `S` and the conv histories and starts recording every later forward's
    /// per-token inputs. An open journal is replaced (the caller refuses nested speculation).
    pub(crate) fn begin_journal(&mut self) {
        self.journal = Some(Box::new(Journal {
            s: self.s.clone(),
            history: self.history.clone(),
            tokens: 0,
            heads: 0,
            pre: Default::default(),
            k: Vec::new(),
            v: Vec::new(),
            alpha: Vec::new(),
            beta: Vec::new(),
        }));
    }

    /// Tokens recorded since [`KdaState::begin_journal`], if a journal is open.
    pub(crate) fn journaled(&self) -> Option<usize> {
        self.journal.as_ref().map(|j| j.tokens)
    }

    /// Values held by the open journal (0 without one).
    pub(crate) fn journal_len(&self) -> usize {
        self.journal.as_ref().map_or(0, |j| {
            j.s.len()
                + j.history.iter().chain(&j.pre).map(Vec::len).sum::<usize>()
                + j.k.len()
                + j.v.len()
                + j.alpha.len()
                + j.beta.len()
        })
    }

    /// Closes the journal keeping everything fed since it opened.
    pub(crate) fn commit(&mut self) {
        self.journal = None;
    }

    /// Closes the journal keeping only the first `keep` tokens fed since it opened: restores the
    /// snapshot, pushes those tokens' PRE-conv inputs into the histories and replays the state
    /// update of the recurrence for them with the very function the forward used
    /// ([`write_step`]) on the very inputs it recorded, so the result is bit-identical to a
    /// state that was only ever fed those tokens. The caller checks `keep ≤ journaled()`.
    pub(crate) fn rollback(&mut self, keep: usize) {
        let Some(j) = self.journal.take() else {
            return;
        };
        if keep >= j.tokens {
            return;
        }
        let j = *j;
        let Journal { s, mut history, .. } = j;
        let pw = j.k.len() / j.tokens.max(1);
        for (hist, pre) in history.iter_mut().zip(&j.pre) {
            for row in pre.chunks_exact(pw).take(keep) {
                push_history(hist, row);
            }
        }
        self.s = s;
        self.history = history;
        if keep == 0 || j.heads == 0 {
            return;
        }
        let d = pw / j.heads;
        let heads = j.heads;
        self.s
            .par_chunks_mut(d * d)
            .with_min_len(grain(4 * keep * d * d))
            .enumerate()
            .for_each(|(h, s)| {
                let mut k = vec![0.0f32; d];
                let mut u = vec![0.0f32; d];
                for tok in 0..keep {
                    let ch = tok * pw + h * d..tok * pw + (h + 1) * d;
                    let beta = j.beta[tok * heads + h] as f64;
                    write_step(
                        s,
                        &j.k[ch.clone()],
                        &j.v[ch.clone()],
                        &j.alpha[ch],
                        beta,
                        &mut k,
                        &mut u,
                    );
                }
            });
    }
}

/// A KDA layer's speculation journal: the state when it opened and, per token fed since, the
/// PRE-conv q/k/v rows (for the histories) and exactly what the state update consumes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Journal {
    s: Vec<f32>,
    history: [Vec<f32>; 3],
    tokens: usize,
    /// Heads of the recorded rows (0 until a forward recorded some).
    heads: usize,
    /// PRE-conv q, k, v: `[tokens, P]` each.
    pre: [Vec<f32>; 3],
    /// Post-conv k and v, and α: `[tokens, P]`; β: `[tokens, heads]`.
    k: Vec<f32>,
    v: Vec<f32>,
    alpha: Vec<f32>,
    beta: Vec<f32>,
}

/// Runs the layer on the T normed rows `xs` `[T, hidden]` of one sequence, advancing `state`;
/// `out` is `[T, hidden]`. A batch of one ([`forward_batch`]).
pub fn forward(
    dims: &KdaDims,
    m: &KdaMatrices<'_>,
    p: &KdaParams,
    xs: &[f32],
    state: &mut KdaState,
    out: &mut [f32],
) -> Result<(), ModelError> {
    let rows = xs.len() / dims.hidden;
    forward_batch(dims, m, p, xs, &mut [(state, rows)], out)
}

/// Runs the layer on the rows `xs` `[rows, hidden]` of several sequences, concatenated in
/// `members` order, each `(state, rows)` advancing its own state by its own rows; `out` is
/// `[rows, hidden]`. The projections and `o_proj` are row-independent, so they run once over
/// all rows (each weight read once per call, whatever the batch); only the conv and the
/// recurrence, which carry a sequence's history, run per member — all members' heads in one
/// parallel pass (independent outputs, spec §6.1 rule 4). Each row's bits are those of the
/// member alone.
pub fn forward_batch(
    dims: &KdaDims,
    m: &KdaMatrices<'_>,
    p: &KdaParams,
    xs: &[f32],
    members: &mut [(&mut KdaState, usize)],
    out: &mut [f32],
) -> Result<(), ModelError> {
    let mut x = KdaProjections::new(dims, m, p, xs)?;
    let mut first = 0;
    for (state, rows) in members.iter_mut() {
        x.convolve(dims, p, first..first + *rows, state);
        first += *rows;
    }
    let o = x.recurrence(dims, p, members);
    m.o_proj.apply(&o, out)
}

/// The inputs of the recurrence for every row of a call: the row-independent projections of
/// `xs` (α and β through their elementwise maps), with q, k, v PRE-conv until
/// [`KdaProjections::convolve`] ran on their rows. `[rows, P]` each, β `[rows, heads]`.
struct KdaProjections {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    alpha: Vec<f32>,
    beta: Vec<f32>,
    gate: Vec<f32>,
}

/// Decay elements per parallel piece of [`decay_factors`] (a decode token's few
/// thousand stay one piece, on the calling thread).
const ALPHA_PIECE: usize = 1 << 13;

/// The decay factors α of every decay-projection element `z` (`[rows][P]`):
/// α = exp(lb · σ(exp(A_log[h]) · (z + dt_bias))), one f64 evaluation, one rounding (spec §4.5).
fn decay_factors(dims: &KdaDims, p: &KdaParams, decay_proj: &[f32]) -> Vec<f32> {
    let pw = dims.width();
    // Both exponentials run on vector lanes with libm's bits (`kernels::exp`), in pieces
    // split among the threads (elements are independent: the split changes no bit); one
    // by one on one thread they were a serial stretch of a long prompt's KDA layers while
    // the other core waited (issue 30).
    let mut alpha = vec![0.0f32; decay_proj.len()];
    alpha
        .par_chunks_mut(ALPHA_PIECE)
        .zip(decay_proj.par_chunks(ALPHA_PIECE))
        .enumerate()
        .for_each(|(piece, (alpha, z))| {
            let first = piece * ALPHA_PIECE;
            // e^(−y) with y = exp(A_log[h]) · (z + dt_bias), as `sigmoid(y)` takes it.
            let mut g: Vec<f64> = z
                .iter()
                .enumerate()
                .map(|(j, &z)| {
                    let c = (first + j) % pw;
                    -(p.decay_rate[c / dims.head_dim] * (z as f64 + p.dt_bias[c] as f64))
                })
                .collect();
            exp_in_place(&mut g);
            for e in g.iter_mut() {
                *e = dims.lower_bound * sigmoid_of(*e);
            }
            exp_in_place(&mut g);
            for (a, &e) in alpha.iter_mut().zip(&g) {
                *a = e as f32;
            }
        });
    alpha
}

impl KdaProjections {
    /// The projections in [`LayerLayout::stream_order`](crate::checkpoint::layout::LayerLayout::stream_order)'s order.
    fn new(
        dims: &KdaDims,
        m: &KdaMatrices<'_>,
        p: &KdaParams,
        xs: &[f32],
    ) -> Result<Self, ModelError> {
        // One low-rank pair shared by all heads, no activation in between.
        let decay_proj = apply(&m.f_b_proj, &apply(&m.f_a_proj, xs)?)?;
        let alpha = decay_factors(dims, p, &decay_proj);
        let beta = apply(&m.b_proj, xs)?
            .iter()
            .map(|&b| sigmoid(b as f64) as f32)
            .collect();
        Ok(KdaProjections {
            q: apply(&m.q_proj, xs)?,
            k: apply(&m.k_proj, xs)?,
            v: apply(&m.v_proj, xs)?,
            alpha,
            beta,
            gate: apply(&m.g_proj, xs)?,
        })
    }

    /// The short convs of one member's `rows` (in place on q, k, v), advancing its histories,
    /// and its journal entries (spec §5.2): the PRE-conv rows, then what the recurrence's
    /// state update consumes.
    fn convolve(
        &mut self,
        dims: &KdaDims,
        p: &KdaParams,
        rows: std::ops::Range<usize>,
        state: &mut KdaState,
    ) {
        let pw = dims.width();
        let span = rows.start * pw..rows.end * pw;
        let (q, k, v) = (
            &mut self.q[span.clone()],
            &mut self.k[span.clone()],
            &mut self.v[span.clone()],
        );
        if let Some(j) = &mut state.journal {
            for (dst, src) in j.pre.iter_mut().zip([&*q, &*k, &*v]) {
                dst.extend_from_slice(src);
            }
        }
        let [hq, hk, hv] = &mut state.history;
        // Three independent convolutions (their own taps, history and rows): run side by side
        // so a prefill's serial token loop occupies both cores (the bits are per element).
        rayon::join(
            || short_conv(&p.conv[0], dims.conv, hq, q),
            || {
                rayon::join(
                    || short_conv(&p.conv[1], dims.conv, hk, k),
                    || short_conv(&p.conv[2], dims.conv, hv, v),
                )
            },
        );
        if let Some(j) = &mut state.journal {
            j.k.extend_from_slice(k);
            j.v.extend_from_slice(v);
            j.alpha.extend_from_slice(&self.alpha[span]);
            j.beta
                .extend_from_slice(&self.beta[rows.start * dims.heads..rows.end * dims.heads]);
            j.tokens += rows.len();
            j.heads = dims.heads;
        }
    }

    /// The inputs of `rows` rows from row `first`.
    fn rows(&self, dims: &KdaDims, first: usize, rows: usize) -> HeadInputs<'_> {
        let span = first * dims.width()..(first + rows) * dims.width();
        HeadInputs {
            q: &self.q[span.clone()],
            k: &self.k[span.clone()],
            v: &self.v[span.clone()],
            alpha: &self.alpha[span.clone()],
            beta: &self.beta[first * dims.heads..(first + rows) * dims.heads],
            gate: &self.gate[span],
            tokens: rows,
        }
    }

    /// Every member's recurrence over its rows (after [`KdaProjections::convolve`]), advancing
    /// its state; returns the gated head outputs `[rows, P]`, the input of `o_proj`.
    fn recurrence(
        &self,
        dims: &KdaDims,
        p: &KdaParams,
        members: &mut [(&mut KdaState, usize)],
    ) -> Vec<f32> {
        let (d, pw) = (dims.head_dim, dims.width());
        let total = self.q.len() / pw.max(1);
        // Per member and head: outputs as [member][head][T][D] so that tasks own disjoint
        // memory.
        let mut by_head = vec![0.0f32; total * pw];
        let widest = members.iter().map(|(_, rows)| *rows).max().unwrap_or(0);
        let mut tasks = Vec::with_capacity(members.len() * dims.heads);
        let (mut rest, mut first) = (by_head.as_mut_slice(), 0);
        for (state, rows) in members.iter_mut() {
            let (mine, tail) = rest.split_at_mut(*rows * pw);
            rest = tail;
            if *rows > 0 {
                let inputs = self.rows(dims, first, *rows);
                let heads = mine.chunks_mut(*rows * d).zip(state.s.chunks_mut(d * d));
                tasks.extend(heads.enumerate().map(|(h, (o, s))| (inputs, h, o, s)));
            }
            first += *rows;
        }
        tasks
            .into_par_iter()
            .with_min_len(grain(4 * widest * d * d))
            .for_each(|(x, h, o, s)| head_recurrence(dims, p, &x, h, s, o));
        let mut o = vec![0.0f32; total * pw];
        let mut first = 0;
        for (_, t) in members.iter() {
            let mine = &by_head[first * pw..(first + t) * pw];
            for h in 0..dims.heads {
                for tok in 0..*t {
                    o[(first + tok) * pw + h * d..(first + tok) * pw + (h + 1) * d]
                        .copy_from_slice(&mine[(h * t + tok) * d..(h * t + tok + 1) * d]);
                }
            }
            first += t;
        }
        o
    }
}

/// Per-token inputs of the recurrence, `[T, P]` (β: `[T, heads]`).
#[derive(Clone, Copy)]
struct HeadInputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    alpha: &'a [f32],
    beta: &'a [f32],
    gate: &'a [f32],
    tokens: usize,
}

/// The recurrence of head `h` over the T tokens, then `o_norm` and the gate; `out` is `[T][D]`.
fn head_recurrence(
    dims: &KdaDims,
    p: &KdaParams,
    x: &HeadInputs<'_>,
    h: usize,
    s: &mut [f32],
    out: &mut [f32],
) {
    let d = dims.head_dim;
    let pw = dims.width();
    let q_scale = 1.0 / (d as f64).sqrt();
    let mut q = vec![0.0f32; d];
    let mut k = vec![0.0f32; d];
    let mut u = vec![0.0f32; d];
    let mut o = vec![0.0f32; d];
    for tok in 0..x.tokens {
        let ch = tok * pw + h * d..tok * pw + (h + 1) * d;
        let beta = x.beta[tok * dims.heads + h] as f64;
        write_step(
            s,
            &x.k[ch.clone()],
            &x.v[ch.clone()],
            &x.alpha[ch.clone()],
            beta,
            &mut k,
            &mut u,
        );
        // q: L2 norm first, then the D^-1/2 scale (spec §4.5; §5.3 item 4).
        l2_norm(&x.q[ch.clone()], &mut q);
        for qi in q.iter_mut() {
            *qi = (*qi as f64 * q_scale) as f32;
        }
        // 4. read the updated state with the scaled query: o = Sᵀq.
        matvec_f32_transposed(s, &q, &mut o);
        // o_norm first, then the sigmoid gate (spec §5.3 item 7).
        let dst = &mut out[tok * d..(tok + 1) * d];
        rms_norm(&o, &p.o_norm, dims.eps, dst);
        for (y, &g) in dst.iter_mut().zip(&x.gate[ch.clone()]) {
            *y = (*y as f64 * sigmoid(g as f64)) as f32;
        }
    }
}

/// Steps 1–3 of the recurrence for one token of one head: L2-normalise the post-conv key
/// `k_in` into `k`, decay each key row of `s` by α, read `u = Sᵀk`, delta-rule write. The forward
/// and [`KdaState::rollback`]'s replay both go through here, which is what makes a replayed
/// state bit-identical to a fed one. `k` and `u` are `D`-wide scratch.
fn write_step(
    s: &mut [f32],
    k_in: &[f32],
    v: &[f32],
    alpha: &[f32],
    beta: f64,
    k: &mut [f32],
    u: &mut [f32],
) {
    let d = k.len();
    l2_norm(k_in, k);
    // 1. decay each key row.
    for (row, &a) in s.chunks_exact_mut(d).zip(alpha) {
        for sij in row.iter_mut() {
            *sij = (*sij as f64 * a as f64) as f32;
        }
    }
    // 2. read with the key: u = Sᵀk.
    matvec_f32_transposed(s, k, u);
    // 3. delta-rule write: S[i][j] += k_i·β·(v_j − u_j), right side in f64.
    for (row, &ki) in s.chunks_exact_mut(d).zip(k.iter()) {
        let kb = ki as f64 * beta;
        for ((sij, &vj), &uj) in row.iter_mut().zip(v).zip(u.iter()) {
            *sij = (*sij as f64 + kb * (vj as f64 - uj as f64)) as f32;
        }
    }
}

/// Causal depthwise conv + SiLU over T rows of `xs` `[T, P]`, in place, with the carried history
/// of PRE-conv inputs `hist` `[K−1][P]` (oldest first), which is advanced token by token.
fn short_conv(taps: &[f32], kernel: usize, hist: &mut [f32], xs: &mut [f32]) {
    let pw = taps.len() / kernel;
    let mut pre = vec![0.0f32; pw];
    for row in xs.chunks_exact_mut(pw) {
        pre.copy_from_slice(row);
        for (c, y) in row.iter_mut().enumerate() {
            let w = &taps[c * kernel..(c + 1) * kernel];
            // Tap K−1 is the current token; taps 0..K−1 read the history, oldest first.
            let sum = tree_sum(kernel, |j| {
                let x = if j + 1 == kernel {
                    pre[c]
                } else {
                    hist[j * pw + c]
                };
                w[j] as f64 * x as f64
            });
            *y = sum as f32;
        }
        push_history(hist, &pre);
    }
    // SiLU over all rows at once (the history keeps pre-conv rows, so no row reads another's
    // output): its exps on vector lanes, the same bits, one scratch per call (issue 30).
    silu_in_place(xs);
}

/// Appends one PRE-conv row to a `[K−1][P]` history, dropping the oldest (nothing when K = 1).
fn push_history(hist: &mut [f32], row: &[f32]) {
    let pw = row.len();
    if hist.len() >= pw && pw > 0 {
        hist.copy_within(pw.., 0);
        let last = hist.len() - pw;
        hist[last..].copy_from_slice(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::elementwise::sigmoid;
    use crate::rng::Rng;

    #[test]
    fn decay_factors_have_the_scalar_formulas_bits() {
        let dims = KdaDims {
            hidden: 64,
            heads: 3,
            head_dim: 40,
            conv: 4,
            rank: 8,
            lower_bound: -5.0,
            eps: 1e-6,
        };
        let pw = dims.width();
        let mut rng = Rng::new(7);
        let p = KdaParams {
            conv: [vec![], vec![], vec![]],
            decay_rate: (0..dims.heads)
                .map(|_| (4.0 * rng.next_f64() - 2.0).exp())
                .collect(),
            dt_bias: (0..pw)
                .map(|_| (2.0 * rng.next_f64() - 1.0) as f32)
                .collect(),
            o_norm: vec![],
        };
        // 300 rows (several parallel pieces and a partial one); projections of every size,
        // including ones that saturate the sigmoid both ways.
        let z: Vec<f32> = (0..300 * pw)
            .map(|i| {
                let u = 2.0 * rng.next_f64() - 1.0;
                (u * [1.0, 10.0, 100.0, 1e4][i % 4]) as f32
            })
            .collect();
        let alpha = decay_factors(&dims, &p, &z);
        for (i, (&a, &z)) in alpha.iter().zip(&z).enumerate() {
            let c = i % pw;
            let x = z as f64 + p.dt_bias[c] as f64;
            let g = dims.lower_bound * sigmoid(p.decay_rate[c / dims.head_dim] * x);
            let want = libm::exp(g) as f32;
            assert_eq!(a.to_bits(), want.to_bits(), "element {i}: z {z}");
        }
    }
}
