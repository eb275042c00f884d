//! `config.json` → [`ModelConfig`] (spec §2). Every semantic key is required; all failures are
//! collected with their JSON paths and reported at once. Never a silent default.

/// Which token mixer a layer uses (spec §1, §2.2 layer lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MixerKind {
    /// Kimi Delta Attention, spec §4.5.
    Kda,
    /// Gated MLA with NoPE, spec §4.6.
    Mla,
}

/// KDA settings from `text_config.linear_attn_config`.
#[derive(Debug, Clone, PartialEq)]
pub struct KdaConfig {
    pub num_heads: usize,
    pub head_dim: usize,
    pub short_conv_kernel_size: usize,
    pub gate_lower_bound: f64,
}

/// The validated semantic configuration of the text model (spec §2.2). Field names follow the
/// config keys; `layer_kinds` is the zero-based map derived from the one-based lists.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    /// β₁, the SiTU gate cap.
    pub activation_situ_beta: f64,
    /// β₂, the SiTU up cap.
    pub activation_situ_linear_beta: f64,
    pub intermediate_size: usize,
    pub first_k_dense_replace: usize,
    pub moe_layer_freq: usize,
    pub num_experts: usize,
    pub num_experts_per_token: usize,
    pub num_shared_experts: usize,
    pub moe_intermediate_size: usize,
    pub routed_expert_hidden_size: usize,
    pub latent_moe_use_norm: bool,
    pub moe_renormalize: bool,
    pub routed_scaling_factor: f64,
    pub num_attention_heads: usize,
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub mla_use_output_gate: bool,
    pub attn_res_block_size: usize,
    pub kda: KdaConfig,
    /// Zero-based: `layer_kinds[L]` is layer L's mixer.
    pub layer_kinds: Vec<MixerKind>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
}

impl ModelConfig {
    /// Whether layer `l` (zero-based) has a MoE feed-forward (spec §2.2 `moe_layer_freq`).
    pub fn is_moe_layer(&self, l: usize) -> bool {
        l >= self.first_k_dense_replace && l % self.moe_layer_freq == 0
    }
}
