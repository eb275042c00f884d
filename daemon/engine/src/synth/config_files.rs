//! `config.json`, `generation_config.json` and `model.safetensors.index.json` of a synthetic
//! checkpoint. `config.json` has the released nested shape with every key of spec §2.2
//! explicit (spec §9.1: readers such as mlx-lm silently default missing keys).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::shape::layers_of;
use super::tokenizer_files::{BOS_OFFSET, EOS_OFFSET, MEDIA_PAD_OFFSET, PAD_OFFSET};
use crate::checkpoint::config::{MixerKind, ModelConfig};

/// Special ids derived from the number of BPE ranks (spec §2.1, §7.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: usize,
    pub eos: usize,
    pub pad: usize,
    pub media_pad: usize,
}

impl SpecialIds {
    pub fn after_ranks(n_ranks: usize) -> Self {
        SpecialIds {
            bos: n_ranks + BOS_OFFSET,
            eos: n_ranks + EOS_OFFSET,
            pad: n_ranks + PAD_OFFSET,
            media_pad: n_ranks + MEDIA_PAD_OFFSET,
        }
    }
}

/// The nested `config.json` of text model `c`; the special ids are `ids` (those of `c` too).
pub fn config_json(c: &ModelConfig, ids: SpecialIds) -> Value {
    let mut text = json!({
        "model_type": "kimi_linear",
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_hidden_layers,
        "vocab_size": c.vocab_size,
        "rms_norm_eps": c.rms_norm_eps,
        "hidden_act": "situ",
        "activation_situ_beta": c.activation_situ_beta,
        "activation_situ_linear_beta": c.activation_situ_linear_beta,
        "intermediate_size": c.intermediate_size,
        "first_k_dense_replace": c.first_k_dense_replace,
        "moe_layer_freq": c.moe_layer_freq,
        "num_experts": c.num_experts,
        "num_experts_per_token": c.num_experts_per_token,
        "num_shared_experts": c.num_shared_experts,
        "moe_intermediate_size": c.moe_intermediate_size,
        "routed_expert_hidden_size": c.routed_expert_hidden_size,
        "latent_moe_use_norm": c.latent_moe_use_norm,
        "moe_router_activation_func": "sigmoid",
        "moe_renormalize": c.moe_renormalize,
        "routed_scaling_factor": c.routed_scaling_factor,
        "use_grouped_topk": true,
        "num_expert_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_attention_heads,
        "q_lora_rank": c.q_lora_rank,
        "kv_lora_rank": c.kv_lora_rank,
        "qk_nope_head_dim": c.qk_nope_head_dim,
        "qk_rope_head_dim": c.qk_rope_head_dim,
        "v_head_dim": c.v_head_dim,
        "mla_use_nope": true,
        "mla_use_output_gate": c.mla_use_output_gate,
        "attn_res_block_size": c.attn_res_block_size,
        "tie_word_embeddings": false,
        "num_nextn_predict_layers": 0,
        "max_position_embeddings": c.max_position_embeddings,
        "bos_token_id": ids.bos,
        "eos_token_id": ids.eos,
        "pad_token_id": ids.pad,
    });
    let linear = json!({
        "num_heads": c.kda.num_heads,
        "head_dim": c.kda.head_dim,
        "short_conv_kernel_size": c.kda.short_conv_kernel_size,
        "gate_lower_bound": c.kda.gate_lower_bound,
        "use_full_rank_gate": true,
        "kda_layers": layers_of(&c.layer_kinds, MixerKind::Kda),
        "full_attn_layers": layers_of(&c.layer_kinds, MixerKind::Mla),
    });
    let weights = json!({
        "num_bits": 4,
        "type": "float",
        "strategy": "group",
        "group_size": 32,
        "symmetric": true,
        "scale_dtype": "torch.uint8",
    });
    let quant = json!({
        "quant_method": "compressed-tensors",
        "format": "mxfp4-pack-quantized",
        "config_groups": {
            "group_0": {
                "format": "mxfp4-pack-quantized",
                "targets": ["Linear"],
                "weights": weights,
            },
        },
        "ignore": [
            "re:.*self_attn.*",
            "re:.*shared_experts.*",
            "re:.*mlp\\.(gate|up|down)_proj.*",
            "lm_head",
            "re:vision_tower.*",
            "re:mm_projector.*",
        ],
    });
    if let Value::Object(m) = &mut text {
        m.insert("linear_attn_config".into(), linear);
        m.insert("quantization_config".into(), quant);
    }
    json!({
        "model_type": "kimi_k3",
        "architectures": ["KimiK3ForConditionalGeneration"],
        "bos_token_id": ids.bos,
        "eos_token_id": ids.eos,
        "pad_token_id": ids.pad,
        "media_placeholder_token_id": ids.media_pad,
        "tie_word_embeddings": false,
        "dtype": "bfloat16",
        "text_config": text,
        "vision_config": {},
    })
}

pub fn generation_config_json(ids: SpecialIds) -> Value {
    json!({ "bos_token_id": ids.bos, "eos_token_id": ids.eos })
}

/// `model.safetensors.index.json`: `metadata.total_size` (tensor data bytes, no headers) and
/// the name → shard file map.
pub fn index_json(total_size: u64, weight_map: &BTreeMap<String, String>) -> Value {
    json!({ "metadata": { "total_size": total_size }, "weight_map": weight_map })
}
