//! The top-level forward pass (spec §4.2, §4.4, §4.10):
//!
//! ```text
//! cur = embed(ids)
//! for L in 0..N:  h  = AR(blocks ++ [cur])          (raw cur while no block exists)
//!                 bank cur as a snapshot if L starts a block (partial restarts)
//!                 partial += Mixer_L(RMSNorm(h))
//!                 h2 = AR(blocks ++ [partial])
//!                 cur = partial + FFN_L(RMSNorm(h2))
//! logits = lm_head · RMSNorm(AR(blocks ++ [cur]))
//! ```
//!
//! All T tokens of a call travel together: each op is batched over T rows, KDA advances in time
//! inside its layer and MLA attends causally, so any split of a sequence into calls gives the same
//! bits. Weights are reached only through the [`WeightStore`]. Several sequences can share one
//! pass ([`Model::forward_batch`]): their rows are concatenated for every row-wise op, the
//! mixers' projections included, and only the KDA recurrence and the MLA attention run per
//! sequence, on that sequence's rows and state.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rayon::prelude::*;

use super::attn_res::{aggregate, fold_query, is_block_start};
use super::bind::{TensorName, bf16_matrix, bf16_values, f32_values, mxfp4_matrix};
use super::kda::{self, KdaDims, KdaMatrices, KdaParams, KdaState};
use super::mla::{self, MlaCache, MlaDims, MlaMatrices, MlaParams};
use super::mlp::{Mlp, Situ, apply};
use super::moe::{self, Expert, MoeDims, MoeMatrices, MoeParams};
use super::router::RouterConfig;
use super::state::{LayerState, State};
use super::{ModelError, grain};
use crate::checkpoint::config::{MixerKind, ModelConfig};
use crate::checkpoint::layout::{
    FfnLayout, KdaLayout, LayerLayout, MixerLayout, MlaLayout, MlpLayout, ModelLayout, ModelTensor,
    MoeLayout, Slice,
};
use crate::checkpoint::safetensors::Dtype;
use crate::kernels::Bf16Matrix;
use crate::kernels::matmul::bf16_vector;
use crate::kernels::norm::rms_norm;
use crate::store::plan::{Budget, Census, Plan, PlanError, StateShape, StreamScheme};
use crate::store::{ExpertPrefetch, ExpertView, ModelTensorId, StoreOptions, WeightStore};

/// How the model is loaded: the memory budget and how streamed weights pass through memory
/// (issue 4). The default is the `max` budget: everything resident.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    pub budget: Budget,
    pub scheme: StreamScheme,
    /// Positions of conversation state the plan reserves memory for.
    pub max_context: u64,
    /// Prompt tokens per forward the plan reserves scratch memory for (all rows of a batched
    /// pass).
    pub max_tokens_per_call: u64,
    /// Sequences whose states are held at once (a daemon's active requests, a batch's
    /// members): the plan reserves a full-context state for each.
    pub sequences: u64,
    /// Drafted ids per speculative step the plan reserves a rollback journal for, per sequence
    /// (0 = none: speculation is unavailable). The journal holds a copy of every KDA layer's
    /// state plus the recurrence inputs of the step's tokens — 465 MB and up per sequence at
    /// K3's sizes, so it is budgeted, never assumed. The engine clamps each request's
    /// `speculate` to this.
    pub speculate: u64,
    pub store: StoreOptions,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            budget: Budget::default(),
            scheme: StreamScheme::default(),
            max_context: 4096,
            max_tokens_per_call: 32,
            sequences: 1,
            speculate: 0,
            store: StoreOptions::default(),
        }
    }
}

/// The memory plan for loading `config`/`layout` with `options`, computed before anything is
/// allocated.
pub fn plan_for(
    config: &ModelConfig,
    layout: &ModelLayout,
    options: &LoadOptions,
) -> Result<Plan, PlanError> {
    let mut census = Census::from_layout(
        layout,
        config,
        options.max_context,
        scratch_bytes(config, options.max_tokens_per_call),
    )?;
    let journal = match options.speculate {
        0 => 0,
        k => StateShape::of(config)
            .journal_bytes(1 + k)
            .ok_or_else(|| PlanError::BadCensus("speculation journal size overflows".into()))?,
    };
    census.state_bytes = census
        .state_bytes
        .saturating_add(journal)
        .saturating_mul(options.sequences.max(1));
    census.sequences = usize::try_from(options.sequences.max(1)).unwrap_or(usize::MAX);
    Plan::new(&census, options.budget, options.scheme)
}

/// f32 activations of one call of `t` tokens: the widest live set is a handful of `[t, width]`
/// buffers per op plus the logits; eight of the widest per token bounds it.
fn scratch_bytes(c: &ModelConfig, t: u64) -> u64 {
    let widest = [
        c.hidden_size,
        c.intermediate_size,
        c.num_shared_experts * c.moe_intermediate_size,
        c.num_attention_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim),
        c.kda.num_heads * c.kda.head_dim,
        c.num_experts,
    ]
    .into_iter()
    .max()
    .unwrap_or(0) as u64;
    t * 4 * (8 * widest + c.vocab_size as u64)
}

/// Which positions' logits a forward returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last input position: `[vocab]`.
    Last,
    /// Every input position: `[T, vocab]`.
    All,
}

/// One member of a [`Model::forward_batch`]: the state it continues, the ids it feeds next
/// (at least one; members may feed different numbers, e.g. a prefill chunk next to decode
/// tokens) and which of their logits it wants.
pub struct Sequence<'a> {
    pub state: &'a mut State,
    pub ids: &'a [u32],
    pub want: Logits,
}

/// A layer's AttnRes and norm vectors, decoded once.
struct LayerVectors {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    /// `self_attention_res_norm ⊙ self_attention_res_proj`.
    attn_res: Vec<f32>,
    /// `mlp_res_norm ⊙ mlp_res_proj`.
    mlp_res: Vec<f32>,
}

enum MixerParams {
    Kda(KdaParams),
    Mla(MlaParams),
}

enum FfnParams {
    Dense,
    Moe(MoeParams),
}

struct LayerParams {
    vectors: LayerVectors,
    mixer: MixerParams,
    ffn: FfnParams,
}

/// The loaded Kimi K3 text model.
pub struct Model {
    config: ModelConfig,
    store: WeightStore,
    kda: KdaDims,
    mla: MlaDims,
    moe: MoeDims,
    act: Situ,
    layers: Vec<LayerParams>,
    final_norm: Vec<f32>,
    /// `output_attn_res_norm ⊙ output_attn_res_proj`.
    output_res: Vec<f32>,
    /// Wall time inside [`Model::forward_batch`], for compute vs I/O accounting.
    forward_nanos: AtomicU64,
    /// The store's read-wait seconds when the load finished: binding every layer at load reads
    /// the streamed trunk layers, and those waits are not a forward's.
    load_io_seconds: f64,
}

impl Model {
    /// Loads a checkpoint opened by [`crate::checkpoint`].
    pub fn load(
        checkpoint: &crate::checkpoint::Checkpoint,
        options: LoadOptions,
    ) -> Result<Model, ModelError> {
        let shards = checkpoint.shards.iter().map(|s| s.path.clone()).collect();
        Model::from_parts(
            checkpoint.config.clone(),
            checkpoint.layout.clone(),
            shards,
            options,
        )
    }

    /// Loads from a validated config, its layout binding and the shard paths the layout's
    /// [`crate::checkpoint::layout::ByteRun::shard`] numbers index.
    pub fn from_parts(
        config: ModelConfig,
        layout: ModelLayout,
        shards: Vec<PathBuf>,
        options: LoadOptions,
    ) -> Result<Model, ModelError> {
        let n = config.num_hidden_layers;
        if layout.layers.len() != n || config.layer_kinds.len() != n {
            return Err(ModelError::LayoutMismatch(format!(
                "config has {n} layers, the layout {} and the layer map {}",
                layout.layers.len(),
                config.layer_kinds.len()
            )));
        }
        let kda_rank = layout
            .layers
            .iter()
            .find_map(|l| match &l.mixer {
                MixerLayout::Kda(k) => k.f_a_proj.shape.first().copied(),
                MixerLayout::Mla(_) => None,
            })
            .unwrap_or(0);
        let act = Situ {
            beta1: config.activation_situ_beta,
            beta2: config.activation_situ_linear_beta,
        };
        let h = config.hidden_size;
        let model_dims = ModelDims {
            kda: KdaDims {
                hidden: h,
                heads: config.kda.num_heads,
                head_dim: config.kda.head_dim,
                conv: config.kda.short_conv_kernel_size,
                rank: kda_rank,
                lower_bound: config.kda.gate_lower_bound,
                eps: config.rms_norm_eps,
            },
            mla: MlaDims {
                hidden: h,
                heads: config.num_attention_heads,
                q_lora: config.q_lora_rank,
                kv_lora: config.kv_lora_rank,
                nope: config.qk_nope_head_dim,
                rope: config.qk_rope_head_dim,
                v: config.v_head_dim,
            },
            moe: MoeDims {
                hidden: h,
                latent: config.routed_expert_hidden_size,
                act,
                router: RouterConfig {
                    top_k: config.num_experts_per_token,
                    renormalize: config.moe_renormalize,
                    scaling_factor: config.routed_scaling_factor,
                },
                eps: config.rms_norm_eps,
            },
        };
        let plan = plan_for(&config, &layout, &options)?;
        let store = WeightStore::open(layout, &shards, plan, options.store)?;

        let mut layers = Vec::with_capacity(n);
        for (l, ll) in store.layout().layers.iter().enumerate() {
            if ll.index != l {
                return Err(ModelError::LayoutMismatch(format!(
                    "layout entry {l} describes layer {}",
                    ll.index
                )));
            }
            let trunk = store.trunk(l)?;
            let params = layer_params(&config, &model_dims, ll, &trunk)?;
            // Bind every matrix once so that a bad shape fails the load, not a later forward.
            let binder = Binder {
                config: &config,
                dims: &model_dims,
            };
            binder.mixer(ll, &trunk)?;
            match &ll.ffn {
                FfnLayout::Dense(d) => {
                    binder.dense(l, d, &trunk)?;
                }
                FfnLayout::Moe(m) => {
                    binder.moe(l, m, &trunk)?;
                }
            }
            layers.push(params);
        }
        let layout = store.layout();
        let model_vector = |t: &ModelTensor, which, name| {
            bf16_values(
                store.model_tensor(which),
                &t.slice,
                &[h],
                TensorName::model(name),
            )
        };
        let final_norm = model_vector(&layout.norm, ModelTensorId::Norm, "norm.weight")?;
        let out_norm = model_vector(
            &layout.output_attn_res_norm,
            ModelTensorId::OutputAttnResNorm,
            "output_attn_res_norm.weight",
        )?;
        let out_proj = bf16_values(
            store.model_tensor(ModelTensorId::OutputAttnResProj),
            &layout.output_attn_res_proj.slice,
            &[1, h],
            TensorName::model("output_attn_res_proj.weight"),
        )?;
        let model = Model {
            kda: model_dims.kda,
            mla: model_dims.mla,
            moe: model_dims.moe,
            act,
            layers,
            final_norm,
            output_res: fold_query(&out_norm, &out_proj),
            load_io_seconds: store.stats().io_seconds,
            store,
            config,
            forward_nanos: AtomicU64::new(0),
        };
        let table = |t: &ModelTensor, name| {
            table_shape(t, model.config.vocab_size, h, TensorName::model(name))
        };
        table(&model.store.layout().embed_tokens, "embed_tokens.weight")?;
        table(&model.store.layout().lm_head, "lm_head.weight")?;
        Ok(model)
    }

    /// Weight traffic of the store since load.
    pub fn store_stats(&self) -> crate::store::StoreStats {
        self.store.stats()
    }

    /// The routed-expert requests so far, when loaded with `store.record_trace`.
    pub fn expert_trace(&self) -> Option<Vec<crate::store::expert_cache::ExpertId>> {
        self.store.expert_trace()
    }

    /// Seconds spent in [`Model::forward_batch`] not waiting for reads.
    pub fn compute_seconds(&self) -> f64 {
        let total = self.forward_nanos.load(Ordering::Relaxed) as f64 * 1e-9;
        let waited = self.store.stats().io_seconds - self.load_io_seconds;
        (total - waited).max(0.0)
    }

    /// The memory plan the model was loaded with.
    pub fn plan(&self) -> &Plan {
        self.store.plan()
    }

    /// The validated configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// A fresh state for a new sequence (zero KDA state and histories, empty MLA caches).
    pub fn new_state(&self) -> State {
        State::new(
            self.config
                .layer_kinds
                .iter()
                .map(|k| match k {
                    MixerKind::Kda => LayerState::Kda(KdaState::new(&self.kda)),
                    MixerKind::Mla => LayerState::Mla(MlaCache::default()),
                })
                .collect(),
        )
    }

    /// Runs `ids` after the positions already in `state`, advancing it, and returns the logits
    /// of the last position (`[vocab]`) or of all (`[T, vocab]`). `cancel` is polled between
    /// layers. If the call fails or is cancelled after the first layer ran, `state` is poisoned.
    /// A batch of one ([`Model::forward_batch`]).
    pub fn forward(
        &self,
        state: &mut State,
        ids: &[u32],
        want: Logits,
        cancel: &dyn Fn() -> bool,
    ) -> Result<Vec<f32>, ModelError> {
        let mut batch = [Sequence { state, ids, want }];
        match self.forward_batch(&mut batch, cancel) {
            Ok(mut logits) => logits.pop().ok_or(ModelError::EmptyInput),
            Err(ModelError::Member { source, .. }) => Err(*source),
            Err(e) => Err(e),
        }
    }

    /// Runs several sequences' next tokens through one pass (issue 7 item 4): their rows are
    /// concatenated and every row-wise op (embedding, AttnRes, norms, the dense FFN, MoE
    /// routing, the routed experts, lm_head, the mixers' projections) runs once over all rows, so
    /// each layer's trunk is read once and each distinct expert of the union once per layer.
    /// Only the KDA recurrence and the MLA attention run per sequence, on that sequence's rows
    /// and state. Every op
    /// computes each row exactly as it would alone (spec §6.1 rule 5, §5), so each sequence's
    /// logits are bit-identical to a solo [`Model::forward`]. Returns one logits vector per
    /// sequence, in order, shaped by its [`Logits`] wish.
    ///
    /// Every sequence is checked (state fits this model and is not poisoned, ids non-empty and
    /// in the vocabulary) before any compute; the first that fails is reported as
    /// [`ModelError::Member`] and no state is touched. A failure or cancellation after the
    /// first layer ran poisons **every** state of the batch: they all advanced together, so
    /// none is at a consistent position. `cancel` is polled between layers.
    pub fn forward_batch(
        &self,
        seqs: &mut [Sequence<'_>],
        cancel: &dyn Fn() -> bool,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let start = Instant::now();
        let out = self.forward_timed(seqs, cancel);
        self.forward_nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }

    /// Whether `ids` can be run after `state`: the state fits this model and is not poisoned,
    /// and the ids are non-empty and in the vocabulary. [`Model::forward_batch`] checks this for
    /// every member; callers batching independent requests can check first to keep one bad
    /// member from failing the others.
    pub fn check_input(&self, state: &State, ids: &[u32]) -> Result<(), ModelError> {
        if state.poisoned {
            return Err(ModelError::StatePoisoned);
        }
        self.check_state(state)?;
        if ids.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        let vocab = self.config.vocab_size;
        if let Some((index, &id)) = ids
            .iter()
            .enumerate()
            .find(|&(_, &id)| id as usize >= vocab)
        {
            return Err(ModelError::TokenOutOfVocab { id, index, vocab });
        }
        Ok(())
    }

    fn forward_timed(
        &self,
        seqs: &mut [Sequence<'_>],
        cancel: &dyn Fn() -> bool,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        for (index, s) in seqs.iter().enumerate() {
            self.check_input(s.state, s.ids)
                .map_err(|e| ModelError::Member {
                    index,
                    source: Box::new(e),
                })?;
        }
        let h = self.config.hidden_size;
        let rows: usize = seqs.iter().map(|s| s.ids.len()).sum();
        let mut cur = Vec::with_capacity(rows * h);
        for &id in seqs.iter().flat_map(|s| s.ids) {
            // No scaling, no position embedding, no BOS insertion (spec §4.2).
            cur.extend(bf16_vector(&self.store.embedding_row(id as usize)?));
        }
        if cancel() {
            return Err(ModelError::Cancelled);
        }
        for s in seqs.iter_mut() {
            s.state.poisoned = true;
        }
        let (blocks, cur) = self.layers(seqs, cur, cancel)?;
        let logits = self.head(&blocks, &cur, seqs)?;
        for s in seqs.iter_mut() {
            s.state.positions += s.ids.len();
            s.state.poisoned = false;
        }
        Ok(logits)
    }

    /// Refuses a state made for another model: layer kinds and every carried size must match.
    fn check_state(&self, state: &State) -> Result<(), ModelError> {
        let d = &self.kda;
        let kda_state = d.heads * d.head_dim * d.head_dim;
        let kda_history = d.conv.saturating_sub(1) * d.width();
        let fits = |s: &LayerState, k: &MixerKind| match (s, k) {
            (LayerState::Kda(s), MixerKind::Kda) => {
                s.s.len() == kda_state && s.history.iter().all(|h| h.len() == kda_history)
            }
            (LayerState::Mla(c), MixerKind::Mla) => {
                c.rows.len() == state.positions * self.mla.cache_width()
            }
            _ => false,
        };
        let n = self.config.layer_kinds.len();
        if state.layers.len() != n {
            return Err(ModelError::StateMismatch(format!(
                "{} layer states for a {n}-layer model",
                state.layers.len()
            )));
        }
        match state
            .layers
            .iter()
            .zip(&self.config.layer_kinds)
            .position(|(s, k)| !fits(s, k))
        {
            None => Ok(()),
            Some(l) => Err(ModelError::StateMismatch(format!(
                "layer {l}: kind or carried sizes differ from this model's"
            ))),
        }
    }

    /// The layer loop of spec §4.4 over the rows of all sequences (concatenated in order);
    /// returns the snapshots and the final `cur`.
    fn layers(
        &self,
        seqs: &mut [Sequence<'_>],
        mut cur: Vec<f32>,
        cancel: &dyn Fn() -> bool,
    ) -> Result<(Vec<Vec<f32>>, Vec<f32>), ModelError> {
        let h = self.config.hidden_size;
        let eps = self.config.rms_norm_eps;
        let binder = Binder {
            config: &self.config,
            dims: &ModelDims {
                kda: self.kda,
                mla: self.mla,
                moe: self.moe,
            },
        };
        let mut blocks: Vec<Vec<f32>> = Vec::new();
        for (l, lp) in self.layers.iter().enumerate() {
            if l > 0 && cancel() {
                return Err(ModelError::Cancelled);
            }
            let ll = &self.store.layout().layers[l];
            let trunk = self.store.trunk(l)?;
            let h_in = if blocks.is_empty() {
                cur.clone()
            } else {
                aggregate_rows(&blocks, &cur, &lp.vectors.attn_res, eps, h)
            };
            // At a block start the finished block is banked and the partial sum restarts.
            let base = if is_block_start(l, self.config.attn_res_block_size) {
                blocks.push(cur);
                None
            } else {
                Some(cur)
            };
            let x = norm_rows(&h_in, &lp.vectors.input_norm, eps, h);
            let moe_parts = match (&lp.ffn, &ll.ffn) {
                (FfnParams::Moe(p), FfnLayout::Moe(ml)) => Some((p, binder.moe(l, ml, &trunk)?)),
                _ => None,
            };
            // Routing lookahead: this layer's experts start reading while its mixer runs.
            let mut ahead = match &moe_parts {
                Some((p, m)) => {
                    self.read_ahead(l, (p, m), &blocks, base.as_deref(), x.len() / h)?
                }
                None => None,
            };
            let mut a = vec![0.0f32; x.len()];
            let matrices = binder.mixer(ll, &trunk)?;
            // The mixers carry each sequence's own history: each gets every member's state and
            // row count, projects all rows at once and runs only the recurrence / attention per
            // sequence, on its rows.
            let mismatch = || {
                ModelError::LayoutMismatch(format!(
                    "layer {l}: mixer kind differs between config, layout and state"
                ))
            };
            match (&lp.mixer, &matrices) {
                (MixerParams::Kda(p), MixerMatrices::Kda(m)) => {
                    let mut members = mixer_states(seqs, l, |s| match s {
                        LayerState::Kda(s) => Some(s),
                        LayerState::Mla(_) => None,
                    })
                    .ok_or_else(mismatch)?;
                    kda::forward_batch(&self.kda, m, p, &x, &mut members, &mut a)
                }
                (MixerParams::Mla(p), MixerMatrices::Mla(m)) => {
                    let mut members = mixer_states(seqs, l, |s| match s {
                        LayerState::Mla(c) => Some(c),
                        LayerState::Kda(_) => None,
                    })
                    .ok_or_else(mismatch)?;
                    mla::forward_batch(&self.mla, m, p, &x, &mut members, &mut a)
                }
                _ => return Err(mismatch()),
            }
            let partial = match base {
                None => a,
                Some(mut p) => {
                    add_into(&mut p, &a);
                    p
                }
            };
            let h2 = aggregate_rows(&blocks, &partial, &lp.vectors.mlp_res, eps, h);
            let x2 = norm_rows(&h2, &lp.vectors.post_norm, eps, h);
            let mut f = vec![0.0f32; x2.len()];
            match (&lp.ffn, &ll.ffn, &moe_parts) {
                (FfnParams::Dense, FfnLayout::Dense(d), _) => {
                    binder.dense(l, d, &trunk)?.forward(self.act, &x2, &mut f)
                }
                (_, _, Some((p, m))) => {
                    let plan = moe::plan(&self.moe, m, p, &x2);
                    // As many experts at a time as the cache can hold at once; each expert's
                    // output is independent and `combine` sums in top-k order, so the grouping
                    // does not change a bit. The shared MLP runs once, while the first group's
                    // reads are in flight.
                    let mut shared = None;
                    let mut outputs = Vec::with_capacity(plan.needed.len());
                    for group in self.store.expert_groups(&plan.needed, ahead.as_ref()) {
                        // Resident experts run together, then each read as it lands.
                        self.store.experts_each(
                            l,
                            &group,
                            ahead.take(),
                            || {
                                shared.get_or_insert_with(|| moe::shared(&self.moe, m, &x2));
                            },
                            |views| {
                                let ids: Vec<usize> = views.iter().map(|v| v.expert).collect();
                                let experts = views
                                    .iter()
                                    .map(|v| binder.expert(l, v))
                                    .collect::<Result<Vec<_>, _>>()?;
                                outputs.extend(moe::run_experts(&self.moe, &plan, &ids, &experts));
                                Ok::<(), ModelError>(())
                            },
                        )?;
                    }
                    let shared = shared.unwrap_or_else(|| moe::shared(&self.moe, m, &x2));
                    f = moe::combine(&self.moe, m, p, &plan, &outputs, shared);
                }
                _ => {
                    return Err(ModelError::LayoutMismatch(format!(
                        "layer {l}: feed-forward kind differs between config and layout"
                    )));
                }
            }
            cur = partial;
            add_into(&mut cur, &f);
        }
        Ok((blocks, cur))
    }

    /// Routing lookahead (plan rule 4): starts reading the experts MoE layer `l` (router and
    /// parameters `moe`) would pick if its mixer added nothing to the residual — its router on
    /// the AttnRes mix of what is known before the mixer runs: `blocks`, and `partial` the
    /// running block sum (`None` right after a block start). The reads then run while the mixer
    /// computes instead of after routing. The guess decides only which reads start early,
    /// never a computed value.
    ///
    /// Measured on `bench` at 8.5 GiB (12 tokens): 92–99 % of each layer's 16 experts guessed
    /// right, ~100 % of the 8 most confident. Guessing further ahead, across the dense layer 0,
    /// was right only 67 % of the time from its input and 55 % from its MLP's input: it read
    /// 6–11 % more bytes per token and gained no speed, so the lookahead stays one sub-layer
    /// ahead.
    fn read_ahead(
        &self,
        l: usize,
        moe: (&MoeParams, &MoeMatrices<'_>),
        blocks: &[Vec<f32>],
        partial: Option<&[f32]>,
        rows: usize,
    ) -> Result<Option<ExpertPrefetch<'_>>, ModelError> {
        let slots = self.store.plan().lookahead_slots;
        if slots == 0 || rows * self.moe.router.top_k > slots {
            return Ok(None);
        }
        let (h, eps) = (self.config.hidden_size, self.config.rms_norm_eps);
        let zeros;
        let partial = match partial {
            Some(p) => p,
            None => {
                zeros = vec![0.0f32; rows * h];
                &zeros
            }
        };
        let vectors = &self.layers[l].vectors;
        let mix = aggregate_rows(blocks, partial, &vectors.mlp_res, eps, h);
        let x = norm_rows(&mix, &vectors.post_norm, eps, h);
        let (p, m) = moe;
        let guess = moe::predict(&self.moe, m, p, &x);
        Ok(self.store.prefetch_experts(l, &guess)?)
    }

    /// Model-level AR, final norm and lm_head (spec §4.10) for the rows each sequence wants;
    /// one logits vector per sequence.
    fn head(
        &self,
        blocks: &[Vec<f32>],
        cur: &[f32],
        seqs: &[Sequence<'_>],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let h = self.config.hidden_size;
        let eps = self.config.rms_norm_eps;
        // The wanted rows of the concatenation, and where each sequence's start.
        let mut wanted = Vec::new();
        let mut first = 0;
        for s in seqs {
            let t = s.ids.len();
            match s.want {
                Logits::Last => wanted.push(first + t - 1),
                Logits::All => wanted.extend(first..first + t),
            }
            first += t;
        }
        let gather = |src: &[f32]| -> Vec<f32> {
            wanted
                .iter()
                .flat_map(|&r| &src[r * h..(r + 1) * h])
                .copied()
                .collect()
        };
        let rows: Vec<Vec<f32>> = blocks.iter().map(|b| gather(b)).collect();
        let hl = aggregate_rows(&rows, &gather(cur), &self.output_res, eps, h);
        let normed = norm_rows(&hl, &self.final_norm, eps, h);
        let vocab = self.config.vocab_size;
        let mut logits = vec![0.0f32; wanted.len() * vocab];
        // Each logit is one row of lm_head against one hidden row, so computing them block by
        // block (a streamed lm_head) gives the same bits as one pass.
        self.store.lm_head_blocks(|first, bytes| {
            let n = bytes.len() / (2 * h).max(1);
            let s = Slice {
                start: 0,
                len: bytes.len(),
                dtype: Dtype::Bf16,
                shape: vec![n, h],
            };
            let block = bf16_matrix(bytes, &s, n, h, TensorName::model("lm_head.weight"))?;
            let ys = apply(&block, &normed);
            for (dst, src) in logits
                .chunks_exact_mut(vocab)
                .zip(ys.chunks_exact(n.max(1)))
            {
                dst[first..first + n].copy_from_slice(src);
            }
            Ok::<(), ModelError>(())
        })?;
        let mut out = Vec::with_capacity(seqs.len());
        let mut rest = logits.as_slice();
        for s in seqs {
            let n = match s.want {
                Logits::Last => 1,
                Logits::All => s.ids.len(),
            };
            let (mine, tail) = rest.split_at(n * vocab);
            rest = tail;
            if let Some(p) = mine.iter().position(|v| v.is_nan()) {
                return Err(ModelError::NanLogits {
                    row: s.ids.len() - n + p / vocab,
                    index: p % vocab,
                });
            }
            out.push(mine.to_vec());
        }
        Ok(out)
    }
}

/// Checks a `[vocab, hidden]` BF16 table's slice without reading it (it may stream).
fn table_shape(
    t: &ModelTensor,
    vocab: usize,
    h: usize,
    name: TensorName,
) -> Result<(), ModelError> {
    let s = &t.slice;
    let fits = s
        .start
        .checked_add(s.len)
        .is_some_and(|e| e as u64 <= t.run.len);
    if s.dtype != Dtype::Bf16 || s.shape != [vocab, h] || s.len != vocab * h * 2 || !fits {
        return Err(ModelError::Tensor {
            tensor: name,
            problem: format!(
                "{:?} {:?} at {}..+{} of a {}-byte run, expected BF16 [{vocab}, {h}]",
                s.dtype, s.shape, s.start, s.len, t.run.len
            ),
        });
    }
    Ok(())
}

/// Layer `l`'s mixer state of each sequence, as `pick` finds it, with the sequence's row
/// count; `None` if any sequence's state there is of the other kind.
fn mixer_states<'s, T>(
    seqs: &'s mut [Sequence<'_>],
    l: usize,
    pick: impl Fn(&'s mut LayerState) -> Option<&'s mut T>,
) -> Option<Vec<(&'s mut T, usize)>> {
    seqs.iter_mut()
        .map(|s| Some((pick(s.state.layers.get_mut(l)?)?, s.ids.len())))
        .collect()
}

/// `AR(blocks ++ [last])` for each of the token rows of `last` (rows of `blocks` aligned).
fn aggregate_rows(blocks: &[Vec<f32>], last: &[f32], f: &[f32], eps: f64, h: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; last.len()];
    out.par_chunks_mut(h)
        .with_min_len(grain(2 * (blocks.len() + 1) * h))
        .enumerate()
        .for_each(|(tok, dst)| {
            let mut sources: Vec<&[f32]> =
                blocks.iter().map(|b| &b[tok * h..(tok + 1) * h]).collect();
            sources.push(&last[tok * h..(tok + 1) * h]);
            aggregate(&sources, f, eps, dst);
        });
    out
}

/// RMSNorm of each `h`-wide row.
fn norm_rows(xs: &[f32], gain: &[f32], eps: f64, h: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; xs.len()];
    for (src, dst) in xs.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        rms_norm(src, gain, eps, dst);
    }
    out
}

/// `acc += x` elementwise in f32 (one rounding per element).
fn add_into(acc: &mut [f32], x: &[f32]) {
    for (a, &b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

/// The op dimensions derived from the config.
struct ModelDims {
    kda: KdaDims,
    mla: MlaDims,
    moe: MoeDims,
}

enum MixerMatrices<'a> {
    Kda(KdaMatrices<'a>),
    Mla(MlaMatrices<'a>),
}

/// Binds a layer's matrices in its trunk bytes, checking every shape against the config.
struct Binder<'c> {
    config: &'c ModelConfig,
    dims: &'c ModelDims,
}

impl Binder<'_> {
    fn mixer<'a>(&self, ll: &LayerLayout, run: &'a [u8]) -> Result<MixerMatrices<'a>, ModelError> {
        let l = ll.index;
        let h = self.config.hidden_size;
        let m = |s, rows, cols, name| bf16_matrix(run, s, rows, cols, TensorName::layer(l, name));
        Ok(match &ll.mixer {
            MixerLayout::Kda(k) => {
                let d = &self.dims.kda;
                let pw = d.width();
                MixerMatrices::Kda(KdaMatrices {
                    q_proj: m(&k.q_proj, pw, h, "self_attn.q_proj.weight")?,
                    k_proj: m(&k.k_proj, pw, h, "self_attn.k_proj.weight")?,
                    v_proj: m(&k.v_proj, pw, h, "self_attn.v_proj.weight")?,
                    g_proj: m(&k.g_proj, pw, h, "self_attn.g_proj.weight")?,
                    o_proj: m(&k.o_proj, h, pw, "self_attn.o_proj.weight")?,
                    f_a_proj: m(&k.f_a_proj, d.rank, h, "self_attn.f_a_proj.weight")?,
                    f_b_proj: m(&k.f_b_proj, pw, d.rank, "self_attn.f_b_proj.weight")?,
                    b_proj: m(&k.b_proj, d.heads, h, "self_attn.b_proj.weight")?,
                })
            }
            MixerLayout::Mla(a) => {
                let d = &self.dims.mla;
                let g_proj = match (&a.g_proj, self.config.mla_use_output_gate) {
                    (Some(g), true) => Some(m(g, d.heads * d.v, h, "self_attn.g_proj.weight")?),
                    (None, false) => None,
                    (g, _) => {
                        return Err(ModelError::LayoutMismatch(format!(
                            "layer {l}: mla_use_output_gate is {} but g_proj is {}",
                            self.config.mla_use_output_gate,
                            if g.is_some() { "present" } else { "absent" }
                        )));
                    }
                };
                MixerMatrices::Mla(MlaMatrices {
                    q_a_proj: m(&a.q_a_proj, d.q_lora, h, "self_attn.q_a_proj.weight")?,
                    q_b_proj: m(
                        &a.q_b_proj,
                        d.heads * d.qk(),
                        d.q_lora,
                        "self_attn.q_b_proj.weight",
                    )?,
                    kv_a_proj: m(
                        &a.kv_a_proj_with_mqa,
                        d.kv_lora + d.rope,
                        h,
                        "self_attn.kv_a_proj_with_mqa.weight",
                    )?,
                    kv_b_proj: m(
                        &a.kv_b_proj,
                        d.heads * (d.nope + d.v),
                        d.kv_lora,
                        "self_attn.kv_b_proj.weight",
                    )?,
                    o_proj: m(&a.o_proj, h, d.heads * d.v, "self_attn.o_proj.weight")?,
                    g_proj,
                })
            }
        })
    }

    fn dense<'a>(
        &self,
        l: usize,
        d: &MlpLayout,
        run: &'a [u8],
    ) -> Result<Mlp<Bf16Matrix<'a>>, ModelError> {
        self.mlp(l, d, self.config.intermediate_size, run, DENSE_NAMES)
    }

    fn mlp<'a>(
        &self,
        l: usize,
        d: &MlpLayout,
        width: usize,
        run: &'a [u8],
        names: [&'static str; 3],
    ) -> Result<Mlp<Bf16Matrix<'a>>, ModelError> {
        let h = self.config.hidden_size;
        let t = |name| TensorName::layer(l, name);
        Ok(Mlp {
            gate: bf16_matrix(run, &d.gate_proj, width, h, t(names[0]))?,
            up: bf16_matrix(run, &d.up_proj, width, h, t(names[1]))?,
            down: bf16_matrix(run, &d.down_proj, h, width, t(names[2]))?,
        })
    }

    fn moe<'a>(
        &self,
        l: usize,
        m: &MoeLayout,
        run: &'a [u8],
    ) -> Result<MoeMatrices<'a>, ModelError> {
        let c = self.config;
        let h = c.hidden_size;
        let latent = c.routed_expert_hidden_size;
        let t = |name| TensorName::layer(l, name);
        Ok(MoeMatrices {
            router: bf16_matrix(
                run,
                &m.gate,
                c.num_experts,
                h,
                t("block_sparse_moe.gate.weight"),
            )?,
            latent_down: bf16_matrix(
                run,
                &m.routed_expert_down_proj,
                latent,
                h,
                t("block_sparse_moe.routed_expert_down_proj.weight"),
            )?,
            latent_up: bf16_matrix(
                run,
                &m.routed_expert_up_proj,
                h,
                latent,
                t("block_sparse_moe.routed_expert_up_proj.weight"),
            )?,
            shared: self.mlp(
                l,
                &m.shared,
                c.num_shared_experts * c.moe_intermediate_size,
                run,
                SHARED_NAMES,
            )?,
        })
    }

    fn expert<'a>(&self, l: usize, v: &'a ExpertView<'_>) -> Result<Expert<'a>, ModelError> {
        let latent = self.config.routed_expert_hidden_size;
        let width = self.config.moe_intermediate_size;
        let e = v.expert;
        let x = &v.layout;
        let t = |a, b| (TensorName::expert(l, e, a), TensorName::expert(l, e, b));
        Ok(Mlp {
            gate: mxfp4_matrix(
                v.bytes(),
                &x.w1_packed,
                &x.w1_scale,
                width,
                latent,
                t("w1.weight_packed", "w1.weight_scale"),
            )?,
            up: mxfp4_matrix(
                v.bytes(),
                &x.w3_packed,
                &x.w3_scale,
                width,
                latent,
                t("w3.weight_packed", "w3.weight_scale"),
            )?,
            down: mxfp4_matrix(
                v.bytes(),
                &x.w2_packed,
                &x.w2_scale,
                latent,
                width,
                t("w2.weight_packed", "w2.weight_scale"),
            )?,
        })
    }
}

const DENSE_NAMES: [&str; 3] = [
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
];
const SHARED_NAMES: [&str; 3] = [
    "block_sparse_moe.shared_experts.gate_proj.weight",
    "block_sparse_moe.shared_experts.up_proj.weight",
    "block_sparse_moe.shared_experts.down_proj.weight",
];

/// Decodes a layer's small tensors (vectors, conv taps, decay parameters, biases) once.
fn layer_params(
    config: &ModelConfig,
    dims: &ModelDims,
    ll: &LayerLayout,
    run: &[u8],
) -> Result<LayerParams, ModelError> {
    let l = ll.index;
    let h = config.hidden_size;
    let t = |name| TensorName::layer(l, name);
    let v = &ll.vectors;
    let vec_h = |s, name| bf16_values(run, s, &[h], t(name));
    let proj = |s, name| bf16_values(run, s, &[1, h], t(name));
    let vectors = LayerVectors {
        input_norm: vec_h(&v.input_layernorm, "input_layernorm.weight")?,
        post_norm: vec_h(
            &v.post_attention_layernorm,
            "post_attention_layernorm.weight",
        )?,
        attn_res: fold_query(
            &vec_h(&v.self_attention_res_norm, "self_attention_res_norm.weight")?,
            &proj(&v.self_attention_res_proj, "self_attention_res_proj.weight")?,
        ),
        mlp_res: fold_query(
            &vec_h(&v.mlp_res_norm, "mlp_res_norm.weight")?,
            &proj(&v.mlp_res_proj, "mlp_res_proj.weight")?,
        ),
    };
    let kind_matches = matches!(
        (&ll.mixer, config.layer_kinds.get(l)),
        (MixerLayout::Kda(_), Some(MixerKind::Kda)) | (MixerLayout::Mla(_), Some(MixerKind::Mla))
    );
    if !kind_matches {
        return Err(ModelError::LayoutMismatch(format!(
            "layer {l}: the layout's mixer differs from the config's layer map"
        )));
    }
    let mixer = match &ll.mixer {
        MixerLayout::Kda(k) => MixerParams::Kda(kda_params(&dims.kda, k, run, l)?),
        MixerLayout::Mla(a) => MixerParams::Mla(mla_params(&dims.mla, a, run, l)?),
    };
    let ffn = match (&ll.ffn, config.is_moe_layer(l)) {
        (FfnLayout::Dense(_), false) => FfnParams::Dense,
        (FfnLayout::Moe(m), true) => {
            let score_bias = f32_values(
                run,
                &m.e_score_correction_bias,
                &[config.num_experts],
                t("block_sparse_moe.gate.e_score_correction_bias"),
            )?;
            let routed_norm = match (&m.routed_expert_norm, config.latent_moe_use_norm) {
                (Some(s), true) => Some(bf16_values(
                    run,
                    s,
                    &[config.routed_expert_hidden_size],
                    t("block_sparse_moe.routed_expert_norm.weight"),
                )?),
                (None, false) => None,
                _ => {
                    return Err(ModelError::LayoutMismatch(format!(
                        "layer {l}: latent_moe_use_norm disagrees with the presence of \
                         routed_expert_norm"
                    )));
                }
            };
            FfnParams::Moe(MoeParams {
                score_bias,
                routed_norm,
            })
        }
        _ => {
            return Err(ModelError::LayoutMismatch(format!(
                "layer {l}: the layout's feed-forward kind differs from first_k_dense_replace / \
                 moe_layer_freq"
            )));
        }
    };
    Ok(LayerParams {
        vectors,
        mixer,
        ffn,
    })
}

fn kda_params(d: &KdaDims, k: &KdaLayout, run: &[u8], l: usize) -> Result<KdaParams, ModelError> {
    let pw = d.width();
    let t = |name| TensorName::layer(l, name);
    let conv = |s, name| f32_values(run, s, &[pw, 1, d.conv], t(name));
    // A_log is stored padded (spec §3.3): any length ≥ heads; only the first `heads` are used.
    let a_log_len = k.a_log.shape.first().copied().unwrap_or(0);
    if k.a_log.shape.len() != 1 || a_log_len < d.heads {
        return Err(ModelError::Tensor {
            tensor: t("self_attn.A_log"),
            problem: format!(
                "shape {:?}, expected [n] with n ≥ {}",
                k.a_log.shape, d.heads
            ),
        });
    }
    let a_log = f32_values(run, &k.a_log, &[a_log_len], t("self_attn.A_log"))?;
    Ok(KdaParams::new(
        d,
        [
            conv(&k.q_conv1d, "self_attn.q_conv1d.weight")?,
            conv(&k.k_conv1d, "self_attn.k_conv1d.weight")?,
            conv(&k.v_conv1d, "self_attn.v_conv1d.weight")?,
        ],
        &a_log,
        f32_values(run, &k.dt_bias, &[pw], t("self_attn.dt_bias"))?,
        f32_values(run, &k.o_norm, &[d.head_dim], t("self_attn.o_norm.weight"))?,
    ))
}

fn mla_params(d: &MlaDims, a: &MlaLayout, run: &[u8], l: usize) -> Result<MlaParams, ModelError> {
    let t = |name| TensorName::layer(l, name);
    Ok(MlaParams {
        q_a_norm: bf16_values(
            run,
            &a.q_a_layernorm,
            &[d.q_lora],
            t("self_attn.q_a_layernorm.weight"),
        )?,
        kv_a_norm: bf16_values(
            run,
            &a.kv_a_layernorm,
            &[d.kv_lora],
            t("self_attn.kv_a_layernorm.weight"),
        )?,
    })
}
