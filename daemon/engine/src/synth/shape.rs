//! The named checkpoint shapes `k3d synth` can write. Every shape uses the released
//! architecture and layout (spec §2–§3); only dimensions, counts and the layer map differ.

use crate::checkpoint::config::{KdaConfig, MixerKind, ModelConfig};

/// One synthetic checkpoint: its text-model configuration plus what `config.json` does not say.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    /// The text model (spec §2.2). Its `vocab_size` and special token ids are the released
    /// ones here: they follow from the tokenizer learned for the shape (`bpe_merges` ranks plus
    /// the 256 added-token slots, spec §7.1), so [`super::plan`] sets them.
    pub config: ModelConfig,
    /// Stored length of `A_log` (padded with zeros past the KDA head count, spec §3.3).
    pub a_log_len: usize,
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
}

/// The zero-based mixer map of `n` layers whose one-based `full_attn_layers` are MLA, all
/// others KDA (spec §2.2).
pub fn layer_kinds(n: usize, full_attn_layers: &[usize]) -> Vec<MixerKind> {
    (1..=n)
        .map(|one_based| {
            if full_attn_layers.contains(&one_based) {
                MixerKind::Mla
            } else {
                MixerKind::Kda
            }
        })
        .collect()
}

/// The one-based numbers of the layers of `kind` (`kda_layers` / `full_attn_layers`).
pub fn layers_of(kinds: &[MixerKind], kind: MixerKind) -> Vec<usize> {
    kinds
        .iter()
        .enumerate()
        .filter(|&(_, &k)| k == kind)
        .map(|(l, _)| l + 1)
        .collect()
}

/// KDA settings with the released gate lower bound (spec §2.2).
fn kda(num_heads: usize, head_dim: usize, short_conv_kernel_size: usize) -> KdaConfig {
    KdaConfig {
        num_heads,
        head_dim,
        short_conv_kernel_size,
        gate_lower_bound: -5.0,
    }
}

/// The released text model (spec §2.1): every shape keeps its fixed settings (norm epsilon,
/// SiTU caps, routing flags, output gate) and overrides dimensions, counts and the layer map.
fn released() -> ModelConfig {
    ModelConfig {
        hidden_size: 7168,
        num_hidden_layers: 93,
        vocab_size: 163_840,
        rms_norm_eps: 1e-5,
        activation_situ_beta: 4.0,
        activation_situ_linear_beta: 25.0,
        intermediate_size: 33792,
        first_k_dense_replace: 1,
        moe_layer_freq: 1,
        num_experts: 896,
        num_experts_per_token: 16,
        num_shared_experts: 2,
        moe_intermediate_size: 3072,
        routed_expert_hidden_size: 3584,
        latent_moe_use_norm: true,
        moe_renormalize: true,
        routed_scaling_factor: 1.0,
        num_attention_heads: 96,
        q_lora_rank: 1536,
        kv_lora_rank: 512,
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
        mla_use_output_gate: true,
        attn_res_block_size: 12,
        kda: kda(96, 128, 4),
        // Every fourth layer and the last are MLA (spec §2.1): 24 of 93.
        layer_kinds: layer_kinds(
            93,
            &(1..=93)
                .filter(|l| l % 4 == 0 || *l == 93)
                .collect::<Vec<_>>(),
        ),
        bos_token_id: Some(163_584),
        eos_token_id: Some(163_586),
        pad_token_id: Some(163_839),
        max_position_embeddings: Some(1 << 20),
    }
}

/// The spec §9.1 validation configuration.
fn tiny() -> Shape {
    Shape {
        name: "tiny",
        a_log_len: 8,
        bpe_merges: 128,
        config: ModelConfig {
            hidden_size: 64,
            num_hidden_layers: 9,
            layer_kinds: layer_kinds(9, &[4, 8, 9]),
            attn_res_block_size: 3,
            first_k_dense_replace: 1,
            intermediate_size: 96,
            kda: kda(4, 16, 4),
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
            ..released()
        },
    }
}

/// A wider variant: two dense layers, block size 4, MLA early and at the end, top-4 of 16,
/// one shared expert, uneven MLA dims (rope wider than nope, v ≠ nope).
fn tiny_b() -> Shape {
    Shape {
        name: "tiny-b",
        a_log_len: 16,
        bpe_merges: 160,
        config: ModelConfig {
            hidden_size: 96,
            num_hidden_layers: 10,
            layer_kinds: layer_kinds(10, &[2, 5, 9, 10]),
            attn_res_block_size: 4,
            first_k_dense_replace: 2,
            intermediate_size: 128,
            kda: kda(6, 16, 4),
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
            ..released()
        },
    }
}

/// Edge cases: block size 1 (every layer starts a block), no dense layer, an MLA first layer,
/// top-1 routing (no renormalisation, spec §4.7), three shared experts, a short conv of 2 taps,
/// `A_log` padded 2 → 4, and a latent narrower than the expert width.
fn tiny_c() -> Shape {
    Shape {
        name: "tiny-c",
        a_log_len: 4,
        bpe_merges: 96,
        config: ModelConfig {
            hidden_size: 64,
            num_hidden_layers: 7,
            layer_kinds: layer_kinds(7, &[1, 3, 6, 7]),
            attn_res_block_size: 1,
            first_k_dense_replace: 0,
            intermediate_size: 64,
            kda: kda(2, 32, 2),
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
            ..released()
        },
    }
}

/// A few hundred MB in several shards: big enough for I/O paths (multi-MB runs, many
/// experts), small enough for CI.
fn small() -> Shape {
    Shape {
        name: "small",
        a_log_len: 16,
        bpe_merges: 1024,
        config: ModelConfig {
            hidden_size: 1024,
            num_hidden_layers: 8,
            layer_kinds: layer_kinds(8, &[4, 7, 8]),
            attn_res_block_size: 4,
            first_k_dense_replace: 1,
            intermediate_size: 4096,
            kda: kda(8, 128, 4),
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
            ..released()
        },
    }
}

/// Released per-layer dimensions (spec §2.1, §3.3) with 6 layers and 64 experts per layer:
/// every tensor, trunk run and 17,547,264-byte expert run has its released size, so I/O and
/// kernel timings per layer are real. Layer map: KDA+dense, KDA, KDA, MLA, KDA, MLA — the
/// released kinds of layers 0, 1, 2, 3 and a final MLA.
fn bench() -> Shape {
    Shape {
        name: "bench",
        a_log_len: 128,
        bpe_merges: 1024,
        config: ModelConfig {
            num_hidden_layers: 6,
            layer_kinds: layer_kinds(6, &[4, 6]),
            attn_res_block_size: 3,
            num_experts: 64,
            ..released()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_shape_is_consistent() {
        for name in SHAPE_NAMES {
            let s = Shape::named(name).unwrap();
            let c = &s.config;
            assert_eq!(s.name, name);
            assert_eq!(c.routed_expert_hidden_size % 32, 0, "{name}: MXFP4 groups");
            assert_eq!(c.moe_intermediate_size % 32, 0, "{name}: MXFP4 groups");
            assert!(s.a_log_len >= c.kda.num_heads, "{name}");
            assert!(c.num_experts_per_token <= c.num_experts, "{name}");
            assert!(c.first_k_dense_replace <= c.num_hidden_layers, "{name}");
            assert_eq!(c.layer_kinds.len(), c.num_hidden_layers, "{name}");
        }
        assert!(Shape::named("huge").is_none());
    }

    #[test]
    fn tiny_is_the_spec_validation_config() {
        let kinds = Shape::named("tiny").unwrap().config.layer_kinds;
        let mla: Vec<usize> = (0..9).filter(|&l| kinds[l] == MixerKind::Mla).collect();
        assert_eq!(mla, vec![3, 7, 8]);
        assert_eq!(layers_of(&kinds, MixerKind::Kda), vec![1, 2, 3, 5, 6, 7]);
        assert_eq!(layers_of(&kinds, MixerKind::Mla), vec![4, 8, 9]);
    }

    /// The fixed settings every shape inherits are the released config's (spec §2.1).
    #[test]
    fn released_is_the_released_config() {
        let text = include_str!("../checkpoint/testdata/released_config.json");
        assert_eq!(ModelConfig::from_json(text).unwrap(), released());
    }
}
