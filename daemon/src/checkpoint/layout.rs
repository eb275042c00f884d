//! The layout binding: which bytes of which shard are which tensor of the model (spec §3.3–§3.4).
//!
//! Weights are addressed by **runs**: each layer's non-expert tensors form one contiguous byte
//! range in one shard (the trunk run), and each routed expert's six tensors another (the expert
//! run). Tensors inside a run are [`Slice`]s relative to the run's start, so whoever holds a run's
//! bytes — pinned in RAM, streamed, cached — can find every tensor without another lookup.

use super::safetensors::Dtype;

/// A contiguous byte range of one shard file. `offset` is absolute within the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ByteRun {
    pub shard: usize,
    pub offset: u64,
    pub len: u64,
}

/// One tensor inside a run: byte range relative to the run start, dtype and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    pub start: usize,
    pub len: usize,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl Slice {
    /// The tensor's bytes within the bytes of its run.
    pub fn bytes<'a>(&self, run: &'a [u8]) -> &'a [u8] {
        &run[self.start..self.start + self.len]
    }
}

/// The six AttnRes/norm vectors every layer has (spec §3.3).
#[derive(Debug, Clone)]
pub struct LayerVectors {
    pub input_layernorm: Slice,
    pub post_attention_layernorm: Slice,
    pub self_attention_res_norm: Slice,
    pub self_attention_res_proj: Slice,
    pub mlp_res_norm: Slice,
    pub mlp_res_proj: Slice,
}

/// KDA mixer tensors (spec §3.3, §4.5).
#[derive(Debug, Clone)]
pub struct KdaLayout {
    pub q_proj: Slice,
    pub k_proj: Slice,
    pub v_proj: Slice,
    pub g_proj: Slice,
    pub o_proj: Slice,
    pub q_conv1d: Slice,
    pub k_conv1d: Slice,
    pub v_conv1d: Slice,
    pub f_a_proj: Slice,
    pub f_b_proj: Slice,
    pub b_proj: Slice,
    /// Padded: only the first `num_heads` entries are used (spec §3.3).
    pub a_log: Slice,
    pub dt_bias: Slice,
    pub o_norm: Slice,
}

/// Gated MLA mixer tensors (spec §3.3, §4.6).
#[derive(Debug, Clone)]
pub struct MlaLayout {
    pub q_a_proj: Slice,
    pub q_a_layernorm: Slice,
    pub q_b_proj: Slice,
    pub kv_a_proj_with_mqa: Slice,
    pub kv_a_layernorm: Slice,
    pub kv_b_proj: Slice,
    pub o_proj: Slice,
    /// Present iff `mla_use_output_gate`.
    pub g_proj: Option<Slice>,
}

#[derive(Debug, Clone)]
pub enum MixerLayout {
    Kda(KdaLayout),
    Mla(MlaLayout),
}

/// A SiTU-GLU MLP: the layer-0 dense MLP or the shared experts (spec §4.8–§4.9).
#[derive(Debug, Clone)]
pub struct MlpLayout {
    pub gate_proj: Slice,
    pub up_proj: Slice,
    pub down_proj: Slice,
}

/// The six tensors of one routed expert, relative to the expert's run (spec §3.4–§3.5).
/// `w1` = gate, `w3` = up, `w2` = down.
#[derive(Debug, Clone)]
pub struct ExpertLayout {
    pub w1_packed: Slice,
    pub w1_scale: Slice,
    pub w2_packed: Slice,
    pub w2_scale: Slice,
    pub w3_packed: Slice,
    pub w3_scale: Slice,
}

/// The non-routed MoE tensors (in the trunk run) plus where every routed expert lives.
#[derive(Debug, Clone)]
pub struct MoeLayout {
    pub gate: Slice,
    pub e_score_correction_bias: Slice,
    pub routed_expert_down_proj: Slice,
    pub routed_expert_up_proj: Slice,
    /// Present iff `latent_moe_use_norm`.
    pub routed_expert_norm: Option<Slice>,
    pub shared: MlpLayout,
    /// `experts[e]` = run of expert `e` (numeric index), each with its own sub-slices.
    pub experts: Vec<(ByteRun, ExpertLayout)>,
}

#[derive(Debug, Clone)]
pub enum FfnLayout {
    Dense(MlpLayout),
    Moe(MoeLayout),
}

/// Everything of one decoder layer.
#[derive(Debug, Clone)]
pub struct LayerLayout {
    pub index: usize,
    /// The layer's non-expert tensors: one contiguous run in one shard.
    pub trunk: ByteRun,
    pub vectors: LayerVectors,
    pub mixer: MixerLayout,
    pub ffn: FfnLayout,
}

/// A model-level tensor: its own run (the single tensor) and shape.
#[derive(Debug, Clone)]
pub struct ModelTensor {
    pub run: ByteRun,
    pub slice: Slice,
}

/// The whole text model bound to shard bytes.
#[derive(Debug, Clone)]
pub struct ModelLayout {
    pub layers: Vec<LayerLayout>,
    pub embed_tokens: ModelTensor,
    pub lm_head: ModelTensor,
    pub norm: ModelTensor,
    pub output_attn_res_norm: ModelTensor,
    pub output_attn_res_proj: ModelTensor,
}
