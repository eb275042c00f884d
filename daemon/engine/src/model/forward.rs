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

mod lookahead;

use super::attn_res::{aggregate, is_block_start};
use super::bind::{
    Binder, FfnParams, LayerParams, MixerMatrices, MixerParams, ModelDims, TensorName, Trunk,
    bf16_matrix,
};
use super::kda::{self, KdaState};
use super::mla::{self, MlaCache};
use super::mlp::apply;
use super::moe::{self, MoeMatrices, MoeParams};
use super::state::{LayerState, State};
use super::{ModelError, grain};
use crate::checkpoint::config::{MixerKind, ModelConfig};
use crate::checkpoint::inventory::names;
use crate::checkpoint::layout::{FfnLayout, LayerLayout, ModelLayout, Slice};
use crate::checkpoint::safetensors::Dtype;
use crate::kernels::matrix::bf16_vector;
use crate::kernels::norm::rms_norm;
use crate::pack::PackFile;
use crate::plan::{DenseLookahead, Plan, PlanInputs};
use crate::store::{ExpertPrefetch, PackOffer, StoreError, StoreOptions, TrunkView, WeightStore};

/// How the model is loaded: what the memory plan must hold ([`PlanInputs`]: budget, stream
/// scheme, context, batch, speculation) and how the store reads. The default is the `max`
/// budget: everything resident.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub plan: PlanInputs,
    pub store: StoreOptions,
    /// A trunk pack to read streamed matrices from ([`crate::pack`]); the plan reserves its
    /// decode buffer and uses it where it pays ([`crate::plan::PackPlan`]).
    pub trunk_pack: Option<TrunkPack>,
}

/// Which trunk pack a load reads, and whether always (where it can be read at all) or only
/// where the plan measured that it pays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrunkPack {
    pub path: PathBuf,
    pub always: bool,
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

/// A forward pass in progress (issue 30): begun by [`Model::begin`], advanced layer by layer by
/// [`Model::advance`] until it returns the logits. It holds what the layer loop carries between
/// layers — the AttnRes snapshots and the running sum, every member's rows concatenated — and
/// nothing of the store.
pub struct Pass {
    /// Per member: ids fed, the state's positions before the pass, the logits it wants.
    members: Vec<(usize, usize, Logits)>,
    blocks: Vec<Vec<f32>>,
    cur: Vec<f32>,
    /// The next layer to run (the layer count once complete, or after a failure).
    next: usize,
    layers: usize,
}

impl Pass {
    /// Layers run so far.
    pub fn layers_done(&self) -> usize {
        self.next
    }

    /// Layers of the model.
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// Token rows of the pass (all members).
    pub fn rows(&self) -> usize {
        self.members.iter().map(|m| m.0).sum()
    }

    /// Bytes of activations held between two layers.
    pub fn held_bytes(&self) -> usize {
        4 * (self.cur.len() + self.blocks.iter().map(Vec::len).sum::<usize>())
    }
}

/// The loaded Kimi K3 text model.
pub struct Model {
    config: ModelConfig,
    store: WeightStore,
    dims: ModelDims,
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
        Model::load_reporting(checkpoint, options, &mut |_, _| {})
    }

    /// [`Model::load`], reporting the resident bytes read as
    /// [`WeightStore::open_reporting`] does.
    pub fn load_reporting(
        checkpoint: &crate::checkpoint::Checkpoint,
        options: LoadOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Model, ModelError> {
        let shards = checkpoint.shards.iter().map(|s| s.path.clone()).collect();
        // The pack is checked against this checkpoint (fingerprint, every tensor's place and
        // shape) before anything is planned.
        let pack = match &options.trunk_pack {
            Some(t) => Some(PackOffer {
                file: PackFile::open(&t.path, checkpoint)
                    .map_err(|e| StoreError::Pack(Box::new(e)))?,
                always: t.always,
            }),
            None => None,
        };
        Model::assemble(
            checkpoint.config.clone(),
            checkpoint.layout.clone(),
            shards,
            options,
            pack,
            progress,
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
        Model::from_parts_reporting(config, layout, shards, options, &mut |_, _| {})
    }

    /// [`Model::from_parts`], reporting the resident bytes read as
    /// [`WeightStore::open_reporting`] does. A trunk pack needs the checkpoint it is checked
    /// against: [`Model::load`].
    pub fn from_parts_reporting(
        config: ModelConfig,
        layout: ModelLayout,
        shards: Vec<PathBuf>,
        options: LoadOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Model, ModelError> {
        if options.trunk_pack.is_some() {
            return Err(ModelError::LayoutMismatch(
                "a trunk pack is checked against its checkpoint: load with Model::load".into(),
            ));
        }
        Model::assemble(config, layout, shards, options, None, progress)
    }

    fn assemble(
        config: ModelConfig,
        layout: ModelLayout,
        shards: Vec<PathBuf>,
        options: LoadOptions,
        pack: Option<PackOffer>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Model, ModelError> {
        let n = config.num_hidden_layers;
        if layout.layers.len() != n || config.layer_kinds.len() != n {
            return Err(ModelError::LayoutMismatch(format!(
                "config has {n} layers, the layout {} and the layer map {}",
                layout.layers.len(),
                config.layer_kinds.len()
            )));
        }
        let dims = ModelDims::of(&config, &layout);
        let inputs = PlanInputs {
            trunk_pack: pack.is_some(),
            ..options.plan
        };
        let plan = Plan::for_model(&config, &layout, &inputs)?;
        let store = WeightStore::open_reporting(
            layout,
            &shards,
            plan,
            options.store,
            &LayerLayout::stream_order,
            pack,
            progress,
        )?;

        let binder = Binder {
            config: &config,
            dims: &dims,
        };
        let mut layers = Vec::with_capacity(n);
        for (l, ll) in store.layout().layers.iter().enumerate() {
            if ll.index != l {
                return Err(ModelError::LayoutMismatch(format!(
                    "layout entry {l} describes layer {}",
                    ll.index
                )));
            }
            let view = store.trunk(l)?;
            let trunk = match &view {
                TrunkView::Bytes(b) => Trunk::Whole(b),
                // A chunk-streamed layer's small tensors are read on their own: its whole run
                // never is (the plan counts no buffer for it).
                TrunkView::Chunks => Trunk::Streamed {
                    store: &store,
                    layer: l,
                    run_len: ll.trunk.len,
                    small: store.trunk_tensors(l, &ll.small_tensors())?,
                },
            };
            layers.push(binder.layer(ll, &trunk)?);
        }
        let vectors = binder.model_vectors(&store)?;
        binder.tables(store.layout())?;
        let model = Model {
            dims,
            layers,
            final_norm: vectors.final_norm,
            output_res: vectors.output_res,
            load_io_seconds: store.stats().io_seconds,
            store,
            config,
            forward_nanos: AtomicU64::new(0),
        };
        Ok(model)
    }

    /// Weight traffic of the store since load.
    pub fn store_stats(&self) -> crate::store::StoreStats {
        self.store.stats()
    }

    /// How the routing lookahead's guesses fared, per MoE layer.
    pub fn lookahead_by_layer(&self) -> Vec<crate::store::LayerGuesses> {
        self.store.lookahead_by_layer()
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

    /// Frees up to `n` expert-cache slots for a prefill pass's activations; returns how many
    /// (`store::WeightStore::lend_cache_slots`).
    pub fn lend_cache_slots(&self, n: usize) -> usize {
        self.store.lend_cache_slots(n)
    }

    /// Takes back `n` expert-cache slots lent by [`Model::lend_cache_slots`].
    pub fn give_back_cache_slots(&self, n: usize) {
        self.store.give_back_cache_slots(n)
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
                    MixerKind::Kda => LayerState::Kda(KdaState::new(&self.dims.kda)),
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
            Err(ModelError::Member { error, .. }) => Err(*error),
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
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let mut pass = self.begin(seqs, cancel)?;
        self.advance(&mut pass, seqs, usize::MAX, cancel)?
            .ok_or_else(|| {
                ModelError::PassMismatch("a whole pass ended before its last layer".into())
            })
    }

    /// Starts a layer-major pass over `seqs` (issue 30): checks every member as
    /// [`Model::forward_batch`] does, looks up the embedding rows and marks the states poisoned
    /// until the pass ends. [`Model::advance`] then runs its layers, as many per call as asked,
    /// with the same members; between two calls the pass holds only its members' activations
    /// (no weights, no expert-cache slots), so other passes — another sequence's decode step —
    /// may run in between. A pass whose caller gives up simply drops it: its states stay
    /// poisoned.
    pub fn begin(
        &self,
        seqs: &mut [Sequence<'_>],
        cancel: &dyn Fn() -> bool,
    ) -> Result<Pass, ModelError> {
        self.timed(|| self.begin_timed(seqs, cancel))
    }

    /// Runs up to `layers` more layers of `pass` (at least one) over the same members it began
    /// with; after the last layer the model-level head, and the states advance. Returns the
    /// logits (one vector per member, as [`Model::forward_batch`]) once the pass is complete,
    /// `None` before. `cancel` is polled before every layer but the first of the pass and
    /// between the expert groups of a MoE layer; a cancelled or failed pass leaves its states
    /// poisoned.
    pub fn advance(
        &self,
        pass: &mut Pass,
        seqs: &mut [Sequence<'_>],
        layers: usize,
        cancel: &dyn Fn() -> bool,
    ) -> Result<Option<Vec<Vec<f32>>>, ModelError> {
        self.timed(|| self.advance_timed(pass, seqs, layers.max(1), cancel))
    }

    /// Runs `f`, adding its wall time to the forward time ([`Model::compute_seconds`]).
    fn timed<T>(&self, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
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

    fn begin_timed(
        &self,
        seqs: &mut [Sequence<'_>],
        cancel: &dyn Fn() -> bool,
    ) -> Result<Pass, ModelError> {
        for (index, s) in seqs.iter().enumerate() {
            self.check_input(s.state, s.ids)
                .map_err(|e| ModelError::Member {
                    index,
                    error: Box::new(e),
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
        Ok(Pass {
            members: seqs
                .iter()
                .map(|s| (s.ids.len(), s.state.positions, s.want))
                .collect(),
            blocks: Vec::new(),
            cur,
            next: 0,
            layers: self.layers.len(),
        })
    }

    fn advance_timed(
        &self,
        pass: &mut Pass,
        seqs: &mut [Sequence<'_>],
        layers: usize,
        cancel: &dyn Fn() -> bool,
    ) -> Result<Option<Vec<Vec<f32>>>, ModelError> {
        let same = pass.members.len() == seqs.len()
            && pass
                .members
                .iter()
                .zip(seqs.iter())
                .all(|(&(n, at, want), s)| {
                    n == s.ids.len()
                        && at == s.state.positions
                        && want == s.want
                        && s.state.poisoned
                });
        if !same || pass.next >= pass.layers {
            return Err(ModelError::PassMismatch(format!(
                "advancing a pass at layer {} of {} with other members than it began with",
                pass.next, pass.layers
            )));
        }
        let end = pass.next.saturating_add(layers).min(pass.layers);
        self.layers(pass, seqs, end, cancel)?;
        if pass.next < pass.layers {
            return Ok(None);
        }
        let logits = self.head(&pass.blocks, &pass.cur, seqs)?;
        for s in seqs.iter_mut() {
            s.state.positions += s.ids.len();
            s.state.poisoned = false;
        }
        Ok(Some(logits))
    }

    /// Refuses a state made for another model: layer kinds and every carried size must match.
    fn check_state(&self, state: &State) -> Result<(), ModelError> {
        let d = &self.dims.kda;
        let kda_state = d.heads * d.head_dim * d.head_dim;
        let kda_history = d.conv.saturating_sub(1) * d.width();
        let fits = |s: &LayerState, k: &MixerKind| match (s, k) {
            (LayerState::Kda(s), MixerKind::Kda) => {
                s.s.len() == kda_state && s.history.iter().all(|h| h.len() == kda_history)
            }
            (LayerState::Mla(c), MixerKind::Mla) => {
                c.rows.len() == state.positions * self.dims.mla.cache_width()
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

    /// The layer loop of spec §4.4 over the rows of all sequences (concatenated in order), from
    /// the pass's next layer up to (not including) `end`, advancing its snapshots and `cur`.
    fn layers(
        &self,
        pass: &mut Pass,
        seqs: &mut [Sequence<'_>],
        end: usize,
        cancel: &dyn Fn() -> bool,
    ) -> Result<(), ModelError> {
        let h = self.config.hidden_size;
        let eps = self.config.rms_norm_eps;
        let binder = Binder {
            config: &self.config,
            dims: &self.dims,
        };
        let dense_lookahead = self.store.plan().dense_lookahead;
        let rows = pass.cur.len() / h;
        let blocks = &mut pass.blocks;
        let mut cur = std::mem::take(&mut pass.cur);
        // The next layer's guess, made across a dense layer (issue 16). Never kept past this
        // call: a pass resumed later must hold no cache slots in between.
        let mut early: Option<ExpertPrefetch<'_>> = None;
        for (l, lp) in self.layers.iter().enumerate().take(end).skip(pass.next) {
            if l > 0 && cancel() {
                return Err(ModelError::Cancelled);
            }
            // Whatever happens in this layer, the pass is not resumable past a failure.
            pass.next = pass.layers;
            let ll = &self.store.layout().layers[l];
            let view = self.store.trunk(l)?;
            let trunk = Trunk::of(&view, &self.store, l);
            let h_in = if blocks.is_empty() {
                cur.clone()
            } else {
                aggregate_rows(blocks, &cur, &lp.vectors.attn_res, eps, h)
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
            // Routing lookahead: this layer's experts start reading while its mixer runs, or
            // earlier if guessed across the dense layer before it.
            let mut ahead = match (&moe_parts, early.take()) {
                (Some(_), Some(guessed)) => Some(guessed),
                (Some((p, m)), None) => {
                    self.read_ahead(l, (p, m), blocks, base.as_deref(), rows)?
                }
                (None, _) => None,
            };
            if moe_parts.is_none() && dense_lookahead == DenseLookahead::Input {
                early = self.read_across_dense(l, blocks, base.as_deref(), rows)?;
            }
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
                    kda::forward_batch(&self.dims.kda, m, p, &x, &mut members, &mut a)?
                }
                (MixerParams::Mla(p), MixerMatrices::Mla(m)) => {
                    let mut members = mixer_states(seqs, l, |s| match s {
                        LayerState::Mla(c) => Some(c),
                        LayerState::Kda(_) => None,
                    })
                    .ok_or_else(mismatch)?;
                    mla::forward_batch(&self.dims.mla, m, p, &x, &mut members, &mut a)?
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
            if moe_parts.is_none() && dense_lookahead == DenseLookahead::MlpInput {
                early = self.read_across_dense(l, blocks, Some(&partial), rows)?;
            }
            let h2 = aggregate_rows(blocks, &partial, &lp.vectors.mlp_res, eps, h);
            let x2 = norm_rows(&h2, &lp.vectors.post_norm, eps, h);
            let mut f = vec![0.0f32; x2.len()];
            match (&lp.ffn, &ll.ffn, &moe_parts) {
                (FfnParams::Dense, FfnLayout::Dense(d), _) => {
                    binder
                        .dense(l, d, &trunk)?
                        .forward(self.dims.moe.act, &x2, &mut f)?
                }
                (_, _, Some((p, m))) => {
                    let plan = moe::plan(&self.dims.moe, m, p, &x2)?;
                    // As many experts at a time as the cache can hold at once; each expert's
                    // output is independent and `combine` sums in top-k order, so the grouping
                    // does not change a bit. The shared MLP runs once, while the first group's
                    // reads are in flight.
                    let mut shared = None;
                    let mut outputs = Vec::with_capacity(plan.needed.len());
                    for (g, group) in self
                        .store
                        .expert_groups(&plan.needed, ahead.as_ref())
                        .into_iter()
                        .enumerate()
                    {
                        // A long prompt's layer can take minutes: cancelling waits at most
                        // for one group of experts.
                        if g > 0 && cancel() {
                            return Err(ModelError::Cancelled);
                        }
                        // Resident experts run together, then each read as it lands.
                        self.store.experts_each(
                            l,
                            &group,
                            ahead.take(),
                            || {
                                shared.get_or_insert_with(|| moe::shared(&self.dims.moe, m, &x2));
                            },
                            |views| {
                                let ids: Vec<usize> = views.iter().map(|v| v.expert).collect();
                                let experts = views
                                    .iter()
                                    .map(|v| binder.expert(l, v))
                                    .collect::<Result<Vec<_>, _>>()?;
                                outputs.extend(moe::run_experts(
                                    &self.dims.moe,
                                    &plan,
                                    &ids,
                                    &experts,
                                )?);
                                Ok::<(), ModelError>(())
                            },
                        )?;
                    }
                    let shared = match shared {
                        Some(s) => s?,
                        None => moe::shared(&self.dims.moe, m, &x2)?,
                    };
                    f = moe::combine(&self.dims.moe, m, p, &plan, &outputs, shared)?;
                }
                _ => {
                    return Err(ModelError::LayoutMismatch(format!(
                        "layer {l}: feed-forward kind differs between config and layout"
                    )));
                }
            }
            cur = partial;
            add_into(&mut cur, &f);
            pass.next = l + 1;
        }
        pass.cur = cur;
        Ok(())
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
            let block = bf16_matrix(bytes, &s, n, h, TensorName::model(names::LM_HEAD))?;
            let ys = apply(&block, &normed)?;
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
