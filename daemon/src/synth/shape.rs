//! The named checkpoint shapes `k3d synth` can write. Every shape uses the released
//! architecture and layout (spec §2–§3); only dimensions, counts and the layer map differ.

use crate::checkpoint::config::MixerKind;

/// The dimensions of one synthetic checkpoint. Field names follow the `config.json` keys
/// (spec §2.2) where one exists. The vocabulary size is not here: it is the size of the
/// tokenizer learned for the shape (`bpe_merges`) plus the 256 added-token slots (spec §7.1).
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    /// One-based layer numbers of the MLA layers (`full_attn_layers`); all others are KDA.
    pub full_attn_layers: Vec<usize>,
    pub attn_res_block_size: usize,
    pub first_k_dense_replace: usize,
    /// Dense MLP width (`intermediate_size`).
    pub intermediate_size: usize,
    pub kda_num_heads: usize,
    pub kda_head_dim: usize,
    /// Stored length of `A_log` (padded with zeros past `kda_num_heads`, spec §3.3).
    pub a_log_len: usize,
    pub short_conv_kernel_size: usize,
    pub num_attention_heads: usize,
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub num_experts: usize,
    pub num_experts_per_token: usize,
    pub num_shared_experts: usize,
    /// Expert width (`moe_intermediate_size`), the w2 MXFP4 input dim.
    pub moe_intermediate_size: usize,
    /// Latent width (`routed_expert_hidden_size`), the w1/w3 MXFP4 input dim.
    pub routed_expert_hidden_size: usize,
    /// BPE merges to learn for the tokenizer (fewer if the embedded corpus runs out).
    pub bpe_merges: usize,
}

/// Names accepted by [`Shape::named`], in the order `k3d synth --help` lists them.
pub const SHAPE_NAMES: [&str; 5] = ["tiny", "tiny-b", "tiny-c", "small", "bench"];

impl Shape {
    /// The named shape, or `None` for an unknown name.
    pub fn named(name: &str) -> Option<Shape> {
        match name {
            "tiny" => Some(tiny()),
            "tiny-b" => Some(tiny_b()),
            "tiny-c" => Some(tiny_c()),
            "small" => Some(small()),
            "bench" => Some(bench()),
            _ => None,
        }
    }

    /// Zero-based mixer map derived from the one-based `full_attn_layers`.
    pub fn layer_kinds(&self) -> Vec<MixerKind> {
        (1..=self.num_hidden_layers)
            .map(|one_based| {
                if self.full_attn_layers.contains(&one_based) {
                    MixerKind::Mla
                } else {
                    MixerKind::Kda
                }
            })
            .collect()
    }

    /// One-based KDA layer numbers (`kda_layers`): the complement of `full_attn_layers`.
    pub fn kda_layers(&self) -> Vec<usize> {
        (1..=self.num_hidden_layers)
            .filter(|l| !self.full_attn_layers.contains(l))
            .collect()
    }

    /// Whether zero-based layer `l` has a MoE feed-forward (`moe_layer_freq` is always 1 here).
    pub fn is_moe_layer(&self, l: usize) -> bool {
        l >= self.first_k_dense_replace
    }
}

/// The spec §9.1 validation configuration.
fn tiny() -> Shape {
    Shape {
        name: "tiny",
        hidden_size: 64,
        num_hidden_layers: 9,
        full_attn_layers: vec![4, 8, 9],
        attn_res_block_size: 3,
        first_k_dense_replace: 1,
        intermediate_size: 96,
        kda_num_heads: 4,
        kda_head_dim: 16,
        a_log_len: 8,
        short_conv_kernel_size: 4,
        num_attention_heads: 4,
        q_lora_rank: 32,
        kv_lora_rank: 32,
        qk_nope_head_dim: 16,
        qk_rope_head_dim: 8,
        v_head_dim: 16,
        num_experts: 8,
        num_experts_per_token: 2,
        num_shared_experts: 2,
        moe_intermediate_size: 32,
        routed_expert_hidden_size: 32,
        bpe_merges: 128,
    }
}

/// A wider variant: two dense layers, block size 4, MLA early and at the end, top-4 of 16,
/// one shared expert, uneven MLA dims (rope wider than nope, v ≠ nope).
fn tiny_b() -> Shape {
    Shape {
        name: "tiny-b",
        hidden_size: 96,
        num_hidden_layers: 10,
        full_attn_layers: vec![2, 5, 9, 10],
        attn_res_block_size: 4,
        first_k_dense_replace: 2,
        intermediate_size: 128,
        kda_num_heads: 6,
        kda_head_dim: 16,
        a_log_len: 16,
        short_conv_kernel_size: 4,
        num_attention_heads: 6,
        q_lora_rank: 48,
        kv_lora_rank: 32,
        qk_nope_head_dim: 8,
        qk_rope_head_dim: 16,
        v_head_dim: 24,
        num_experts: 16,
        num_experts_per_token: 4,
        num_shared_experts: 1,
        moe_intermediate_size: 64,
        routed_expert_hidden_size: 64,
        bpe_merges: 160,
    }
}

/// Edge cases: block size 1 (every layer starts a block), no dense layer, an MLA first layer,
/// top-1 routing (no renormalisation, spec §4.7), three shared experts, a short conv of 2 taps,
/// `A_log` padded 2 → 4, and a latent narrower than the expert width.
fn tiny_c() -> Shape {
    Shape {
        name: "tiny-c",
        hidden_size: 64,
        num_hidden_layers: 7,
        full_attn_layers: vec![1, 3, 6, 7],
        attn_res_block_size: 1,
        first_k_dense_replace: 0,
        intermediate_size: 64,
        kda_num_heads: 2,
        kda_head_dim: 32,
        a_log_len: 4,
        short_conv_kernel_size: 2,
        num_attention_heads: 2,
        q_lora_rank: 16,
        kv_lora_rank: 64,
        qk_nope_head_dim: 32,
        qk_rope_head_dim: 16,
        v_head_dim: 32,
        num_experts: 4,
        num_experts_per_token: 1,
        num_shared_experts: 3,
        moe_intermediate_size: 64,
        routed_expert_hidden_size: 32,
        bpe_merges: 96,
    }
}

/// A few hundred MB in several shards: big enough for I/O paths (multi-MB runs, many
/// experts), small enough for CI.
fn small() -> Shape {
    Shape {
        name: "small",
        hidden_size: 1024,
        num_hidden_layers: 8,
        full_attn_layers: vec![4, 7, 8],
        attn_res_block_size: 4,
        first_k_dense_replace: 1,
        intermediate_size: 4096,
        kda_num_heads: 8,
        kda_head_dim: 128,
        a_log_len: 16,
        short_conv_kernel_size: 4,
        num_attention_heads: 8,
        q_lora_rank: 384,
        kv_lora_rank: 128,
        qk_nope_head_dim: 64,
        qk_rope_head_dim: 32,
        v_head_dim: 64,
        num_experts: 64,
        num_experts_per_token: 8,
        num_shared_experts: 2,
        moe_intermediate_size: 512,
        routed_expert_hidden_size: 512,
        bpe_merges: 1024,
    }
}

/// Released per-layer dimensions (spec §2.1, §3.3) with 6 layers and 64 experts per layer:
/// every tensor, trunk run and 17,547,264-byte expert run has its released size, so I/O and
/// kernel timings per layer are real. Layer map: KDA+dense, KDA, KDA, MLA, KDA, MLA — the
/// released kinds of layers 0, 1, 2, 3 and a final MLA.
fn bench() -> Shape {
    Shape {
        name: "bench",
        hidden_size: 7168,
        num_hidden_layers: 6,
        full_attn_layers: vec![4, 6],
        attn_res_block_size: 3,
        first_k_dense_replace: 1,
        intermediate_size: 33792,
        kda_num_heads: 96,
        kda_head_dim: 128,
        a_log_len: 128,
        short_conv_kernel_size: 4,
        num_attention_heads: 96,
        q_lora_rank: 1536,
        kv_lora_rank: 512,
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
        num_experts: 64,
        num_experts_per_token: 16,
        num_shared_experts: 2,
        moe_intermediate_size: 3072,
        routed_expert_hidden_size: 3584,
        bpe_merges: 1024,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_shape_is_consistent() {
        for name in SHAPE_NAMES {
            let s = Shape::named(name).unwrap();
            assert_eq!(s.name, name);
            assert_eq!(s.routed_expert_hidden_size % 32, 0, "{name}: MXFP4 groups");
            assert_eq!(s.moe_intermediate_size % 32, 0, "{name}: MXFP4 groups");
            assert!(s.a_log_len >= s.kda_num_heads, "{name}");
            assert!(s.num_experts_per_token <= s.num_experts, "{name}");
            assert!(s.first_k_dense_replace <= s.num_hidden_layers, "{name}");
            assert!(
                s.full_attn_layers
                    .iter()
                    .all(|&l| (1..=s.num_hidden_layers).contains(&l)),
                "{name}"
            );
            assert_eq!(
                s.kda_layers().len() + s.full_attn_layers.len(),
                s.num_hidden_layers
            );
        }
        assert!(Shape::named("huge").is_none());
    }

    #[test]
    fn tiny_is_the_spec_validation_config() {
        let s = Shape::named("tiny").unwrap();
        let kinds = s.layer_kinds();
        let mla: Vec<usize> = (0..9).filter(|&l| kinds[l] == MixerKind::Mla).collect();
        assert_eq!(mla, vec![3, 7, 8]);
        assert_eq!(s.kda_layers(), vec![1, 2, 3, 5, 6, 7]);
    }
}
