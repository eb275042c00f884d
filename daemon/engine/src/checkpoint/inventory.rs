//! The tensor inventory a configuration implies (spec §3.3): every name, dtype and shape.
//!
//! The binder ([`super::layout`]) checks the files against it; writers of synthetic checkpoints
//! and benchmarks use [`layer_tensors`] / [`model_tensors`] to produce the same names.

use super::config::{MixerKind, ModelConfig};
use super::safetensors::{Dtype, TensorSpec};

/// Prefix of every text-model tensor name in the release.
pub const TEXT_PREFIX: &str = "language_model.";

/// Top-level prefixes of the out-of-scope vision model (spec conventions): never bound.
pub const IGNORED_PREFIXES: [&str; 2] = ["vision_tower.", "mm_projector."];

/// `language_model.model.layers.L.` — the prefix of layer `l`'s tensors.
pub fn layer_prefix(l: usize) -> String {
    format!("{TEXT_PREFIX}model.layers.{l}.")
}

/// The full name of one routed-expert tensor: `…layers.L.block_sparse_moe.experts.E.<part>`.
pub fn expert_name(layer_prefix: &str, expert: usize, part: &str) -> String {
    format!("{layer_prefix}{MOE}experts.{expert}.{part}")
}

const MOE: &str = "block_sparse_moe.";

/// Layer-relative suffixes (after [`layer_prefix`]); model-level names are full names.
pub mod names {
    pub const INPUT_LAYERNORM: &str = "input_layernorm.weight";
    pub const POST_ATTENTION_LAYERNORM: &str = "post_attention_layernorm.weight";
    pub const SELF_ATTENTION_RES_NORM: &str = "self_attention_res_norm.weight";
    pub const SELF_ATTENTION_RES_PROJ: &str = "self_attention_res_proj.weight";
    pub const MLP_RES_NORM: &str = "mlp_res_norm.weight";
    pub const MLP_RES_PROJ: &str = "mlp_res_proj.weight";

    pub const Q_PROJ: &str = "self_attn.q_proj.weight";
    pub const K_PROJ: &str = "self_attn.k_proj.weight";
    pub const V_PROJ: &str = "self_attn.v_proj.weight";
    /// KDA output gate and MLA output gate share this name (spec §3.3).
    pub const G_PROJ: &str = "self_attn.g_proj.weight";
    pub const O_PROJ: &str = "self_attn.o_proj.weight";
    pub const Q_CONV1D: &str = "self_attn.q_conv1d.weight";
    pub const K_CONV1D: &str = "self_attn.k_conv1d.weight";
    pub const V_CONV1D: &str = "self_attn.v_conv1d.weight";
    pub const F_A_PROJ: &str = "self_attn.f_a_proj.weight";
    pub const F_B_PROJ: &str = "self_attn.f_b_proj.weight";
    pub const B_PROJ: &str = "self_attn.b_proj.weight";
    pub const A_LOG: &str = "self_attn.A_log";
    pub const DT_BIAS: &str = "self_attn.dt_bias";
    pub const O_NORM: &str = "self_attn.o_norm.weight";

    pub const Q_A_PROJ: &str = "self_attn.q_a_proj.weight";
    pub const Q_A_LAYERNORM: &str = "self_attn.q_a_layernorm.weight";
    pub const Q_B_PROJ: &str = "self_attn.q_b_proj.weight";
    pub const KV_A_PROJ_WITH_MQA: &str = "self_attn.kv_a_proj_with_mqa.weight";
    pub const KV_A_LAYERNORM: &str = "self_attn.kv_a_layernorm.weight";
    pub const KV_B_PROJ: &str = "self_attn.kv_b_proj.weight";

    pub const MLP_GATE_PROJ: &str = "mlp.gate_proj.weight";
    pub const MLP_UP_PROJ: &str = "mlp.up_proj.weight";
    pub const MLP_DOWN_PROJ: &str = "mlp.down_proj.weight";

    pub const MOE_GATE: &str = "block_sparse_moe.gate.weight";
    pub const MOE_BIAS: &str = "block_sparse_moe.gate.e_score_correction_bias";
    pub const ROUTED_DOWN_PROJ: &str = "block_sparse_moe.routed_expert_down_proj.weight";
    pub const ROUTED_UP_PROJ: &str = "block_sparse_moe.routed_expert_up_proj.weight";
    pub const ROUTED_NORM: &str = "block_sparse_moe.routed_expert_norm.weight";
    pub const SHARED_GATE_PROJ: &str = "block_sparse_moe.shared_experts.gate_proj.weight";
    pub const SHARED_UP_PROJ: &str = "block_sparse_moe.shared_experts.up_proj.weight";
    pub const SHARED_DOWN_PROJ: &str = "block_sparse_moe.shared_experts.down_proj.weight";

    /// Expert parts (after `…experts.E.`), in the release's byte order (spec §3.4).
    pub const W1_PACKED: &str = "w1.weight_packed";
    pub const W1_SCALE: &str = "w1.weight_scale";
    pub const W2_PACKED: &str = "w2.weight_packed";
    pub const W2_SCALE: &str = "w2.weight_scale";
    pub const W3_PACKED: &str = "w3.weight_packed";
    pub const W3_SCALE: &str = "w3.weight_scale";

    pub const EMBED_TOKENS: &str = "language_model.model.embed_tokens.weight";
    pub const LM_HEAD: &str = "language_model.lm_head.weight";
    pub const NORM: &str = "language_model.model.norm.weight";
    pub const OUTPUT_ATTN_RES_NORM: &str = "language_model.model.output_attn_res_norm.weight";
    pub const OUTPUT_ATTN_RES_PROJ: &str = "language_model.model.output_attn_res_proj.weight";
}

/// What shape a tensor must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShapeRule {
    Exact(Vec<u64>),
    /// One dimension of at least this length: `A_log` is stored padded (spec §3.3).
    AtLeast(u64),
}

impl ShapeRule {
    pub fn accepts(&self, shape: &[u64]) -> bool {
        match self {
            ShapeRule::Exact(s) => s.as_slice() == shape,
            ShapeRule::AtLeast(n) => matches!(shape, [len] if len >= n),
        }
    }
}

impl std::fmt::Display for ShapeRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShapeRule::Exact(s) => write!(f, "{s:?}"),
            ShapeRule::AtLeast(n) => write!(f, "[≥{n}]"),
        }
    }
}

/// One expected tensor: its name (suffix or full, see the callers), dtype and shape rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    pub name: &'static str,
    /// The dtype the release stores it in (spec §3.3), which writers use.
    pub dtype: Dtype,
    pub shape: ShapeRule,
    /// A small vector (norm gains, AttnRes projections, conv taps, `A_log`, `dt_bias`, the
    /// router bias): read once at load and widened exactly to f32, so any of
    /// [`VECTOR_DTYPES`] holds the same numbers. Re-saved and converted checkpoints commonly
    /// store these F32 or BF16 whatever the release did; mlx-lm and the C engine load them.
    /// Matrices and the MXFP4 experts must be stored as the release stores them.
    pub vector: bool,
}

/// The dtypes a small vector ([`Want::vector`]) may be stored in: each widens exactly to f32.
pub const VECTOR_DTYPES: [Dtype; 3] = [Dtype::F32, Dtype::Bf16, Dtype::F16];

impl Want {
    /// Whether a tensor stored as `dtype` satisfies this entry.
    pub fn accepts_dtype(&self, dtype: Dtype) -> bool {
        dtype == self.dtype || (self.vector && VECTOR_DTYPES.contains(&dtype))
    }

    /// What this entry accepts, for messages: `BF16 only` or `F32, BF16 or F16`.
    pub fn supported(&self) -> String {
        if self.vector {
            "F32, BF16 or F16 (a small vector)".into()
        } else {
            format!("{} only", self.dtype)
        }
    }
}

/// A configuration dimension product does not fit in 64 bits.
#[derive(Debug, Clone, thiserror::Error)]
#[error("config dimension {what} overflows 64 bits")]
pub struct DimOverflow {
    pub what: &'static str,
}

fn mul(what: &'static str, a: usize, b: usize) -> Result<u64, DimOverflow> {
    (a as u64).checked_mul(b as u64).ok_or(DimOverflow { what })
}

fn add(what: &'static str, a: usize, b: usize) -> Result<usize, DimOverflow> {
    a.checked_add(b).ok_or(DimOverflow { what })
}

fn want(name: &'static str, dtype: Dtype, shape: &[u64]) -> Want {
    Want {
        name,
        dtype,
        shape: ShapeRule::Exact(shape.to_vec()),
        vector: false,
    }
}

/// A small vector entry ([`Want::vector`]).
fn vector(name: &'static str, dtype: Dtype, shape: &[u64]) -> Want {
    Want {
        vector: true,
        ..want(name, dtype, shape)
    }
}

/// The non-expert tensors of layer `l` (names are suffixes after [`layer_prefix`]).
pub fn trunk(c: &ModelConfig, l: usize) -> Result<Vec<Want>, DimOverflow> {
    use Dtype::{Bf16, F32};
    use names::*;
    let h = c.hidden_size as u64;
    let mut w = vec![
        vector(INPUT_LAYERNORM, Bf16, &[h]),
        vector(POST_ATTENTION_LAYERNORM, Bf16, &[h]),
        vector(SELF_ATTENTION_RES_NORM, Bf16, &[h]),
        vector(SELF_ATTENTION_RES_PROJ, Bf16, &[1, h]),
        vector(MLP_RES_NORM, Bf16, &[h]),
        vector(MLP_RES_PROJ, Bf16, &[1, h]),
    ];
    match c.layer_kinds.get(l) {
        Some(MixerKind::Kda) => {
            let k = &c.kda;
            let p = mul(
                "linear_attn_config.num_heads × head_dim",
                k.num_heads,
                k.head_dim,
            )?;
            let d = k.head_dim as u64;
            let conv = [p, 1, k.short_conv_kernel_size as u64];
            w.extend([
                want(Q_PROJ, Bf16, &[p, h]),
                want(K_PROJ, Bf16, &[p, h]),
                want(V_PROJ, Bf16, &[p, h]),
                want(G_PROJ, Bf16, &[p, h]),
                want(O_PROJ, Bf16, &[h, p]),
                vector(Q_CONV1D, F32, &conv),
                vector(K_CONV1D, F32, &conv),
                vector(V_CONV1D, F32, &conv),
                want(F_A_PROJ, Bf16, &[d, h]),
                want(F_B_PROJ, Bf16, &[p, d]),
                want(B_PROJ, Bf16, &[k.num_heads as u64, h]),
                Want {
                    shape: ShapeRule::AtLeast(k.num_heads as u64),
                    ..vector(A_LOG, F32, &[])
                },
                vector(DT_BIAS, F32, &[p]),
                vector(O_NORM, F32, &[d]),
            ]);
        }
        Some(MixerKind::Mla) => {
            let heads = c.num_attention_heads;
            let qh = add("qk_nope + qk_rope", c.qk_nope_head_dim, c.qk_rope_head_dim)?;
            let q_rows = mul("num_attention_heads × (qk_nope + qk_rope)", heads, qh)?;
            let kv_rows = mul(
                "num_attention_heads × (qk_nope + v_head_dim)",
                heads,
                add("qk_nope + v_head_dim", c.qk_nope_head_dim, c.v_head_dim)?,
            )?;
            let kv_a_rows =
                add("kv_lora_rank + qk_rope", c.kv_lora_rank, c.qk_rope_head_dim)? as u64;
            let out = mul("num_attention_heads × v_head_dim", heads, c.v_head_dim)?;
            let (ql, kvl) = (c.q_lora_rank as u64, c.kv_lora_rank as u64);
            w.extend([
                want(Q_A_PROJ, Bf16, &[ql, h]),
                vector(Q_A_LAYERNORM, Bf16, &[ql]),
                want(Q_B_PROJ, Bf16, &[q_rows, ql]),
                want(KV_A_PROJ_WITH_MQA, Bf16, &[kv_a_rows, h]),
                vector(KV_A_LAYERNORM, Bf16, &[kvl]),
                want(KV_B_PROJ, Bf16, &[kv_rows, kvl]),
                want(O_PROJ, Bf16, &[h, out]),
            ]);
            if c.mla_use_output_gate {
                w.push(want(G_PROJ, Bf16, &[out, h]));
            }
        }
        None => {}
    }
    if c.is_moe_layer(l) {
        let e = c.num_experts as u64;
        let latent = c.routed_expert_hidden_size as u64;
        let shared = mul(
            "num_shared_experts × moe_intermediate_size",
            c.num_shared_experts,
            c.moe_intermediate_size,
        )?;
        w.extend([
            want(MOE_GATE, Bf16, &[e, h]),
            vector(MOE_BIAS, F32, &[e]),
            want(ROUTED_DOWN_PROJ, Bf16, &[latent, h]),
            want(ROUTED_UP_PROJ, Bf16, &[h, latent]),
            want(SHARED_GATE_PROJ, Bf16, &[shared, h]),
            want(SHARED_UP_PROJ, Bf16, &[shared, h]),
            want(SHARED_DOWN_PROJ, Bf16, &[h, shared]),
        ]);
        if c.latent_moe_use_norm {
            w.push(vector(ROUTED_NORM, Bf16, &[latent]));
        }
    } else {
        let i = c.intermediate_size as u64;
        w.extend([
            want(MLP_GATE_PROJ, Bf16, &[i, h]),
            want(MLP_UP_PROJ, Bf16, &[i, h]),
            want(MLP_DOWN_PROJ, Bf16, &[h, i]),
        ]);
    }
    Ok(w)
}

/// The six tensors of one routed expert (names are parts after `…experts.E.`), in the release's
/// byte order. MXFP4: two inputs per packed byte, one scale byte per 32 inputs (spec §3.5).
pub fn expert(c: &ModelConfig) -> [Want; 6] {
    use Dtype::U8;
    use names::*;
    let width = c.moe_intermediate_size as u64;
    let latent = c.routed_expert_hidden_size as u64;
    [
        want(W1_PACKED, U8, &[width, latent / 2]),
        want(W1_SCALE, U8, &[width, latent / 32]),
        want(W2_PACKED, U8, &[latent, width / 2]),
        want(W2_SCALE, U8, &[latent, width / 32]),
        want(W3_PACKED, U8, &[width, latent / 2]),
        want(W3_SCALE, U8, &[width, latent / 32]),
    ]
}

/// The five model-level tensors (full names).
pub fn model_level(c: &ModelConfig) -> Vec<Want> {
    use Dtype::Bf16;
    use names::*;
    let (v, h) = (c.vocab_size as u64, c.hidden_size as u64);
    vec![
        want(EMBED_TOKENS, Bf16, &[v, h]),
        want(LM_HEAD, Bf16, &[v, h]),
        vector(NORM, Bf16, &[h]),
        vector(OUTPUT_ATTN_RES_NORM, Bf16, &[h]),
        vector(OUTPUT_ATTN_RES_PROJ, Bf16, &[1, h]),
    ]
}

fn spec(name: String, w: &Want, a_log_len: u64) -> TensorSpec {
    let shape = match &w.shape {
        ShapeRule::Exact(s) => s.clone(),
        ShapeRule::AtLeast(n) => vec![a_log_len.max(*n)],
    };
    TensorSpec {
        name,
        dtype: w.dtype,
        shape,
    }
}

/// Every tensor of layer `l` with full names, for writers: the trunk, then all experts, each
/// with the inventory entry it comes from (whose `name` is the layer- or expert-relative part,
/// one of [`names`]). `a_log_len` is the stored (padded) `A_log` length; the release stores
/// 128 for 96 heads.
pub fn layer_entries(
    c: &ModelConfig,
    l: usize,
    a_log_len: u64,
) -> Result<Vec<(TensorSpec, Want)>, DimOverflow> {
    let prefix = layer_prefix(l);
    let mut out: Vec<(TensorSpec, Want)> = trunk(c, l)?
        .into_iter()
        .map(|w| (spec(format!("{prefix}{}", w.name), &w, a_log_len), w))
        .collect();
    if c.is_moe_layer(l) {
        let parts = expert(c);
        for e in 0..c.num_experts {
            out.extend(parts.iter().map(|w| {
                (
                    spec(expert_name(&prefix, e, w.name), w, a_log_len),
                    w.clone(),
                )
            }));
        }
    }
    Ok(out)
}

/// [`layer_entries`] without the entries.
pub fn layer_tensors(
    c: &ModelConfig,
    l: usize,
    a_log_len: u64,
) -> Result<Vec<TensorSpec>, DimOverflow> {
    Ok(layer_entries(c, l, a_log_len)?
        .into_iter()
        .map(|(t, _)| t)
        .collect())
}

/// The model-level tensors with full names, for writers, each with its inventory entry.
pub fn model_entries(c: &ModelConfig) -> Vec<(TensorSpec, Want)> {
    model_level(c)
        .into_iter()
        .map(|w| (spec(w.name.to_owned(), &w, 0), w))
        .collect()
}

/// [`model_entries`] without the entries.
pub fn model_tensors(c: &ModelConfig) -> Vec<TensorSpec> {
    model_entries(c).into_iter().map(|(t, _)| t).collect()
}
