"""The trained fixture's architecture: every K3 feature at toy sizes (spec §2).

Layer map as released (every fourth layer and the last are MLA, spec §2.1) over 9 layers:
KDA 1-3, 5-7, MLA 4, 8, 9 (one-based); AttnRes blocks of 3; layer 0 dense, 1-8 latent MoE with
2 shared experts and a sigmoid router with correction bias; SiTU-GLU everywhere.
"""

N_RANKS = 1024  # BPE ranks; the vocabulary adds 256 added-token slots (spec §7.1)
A_LOG_LEN = 4  # stored A_log length, padded past the KDA heads as released (spec §3.3)

LAYERS = 9
MLA_LAYERS = [4, 8, 9]


def text_config(n_ranks):
    """`text_config` of config.json, every key explicit (spec §9.1)."""
    vocab = n_ranks + 256
    return {
        "model_type": "kimi_linear",
        "hidden_size": 64,
        "num_hidden_layers": LAYERS,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "hidden_act": "situ",
        "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0,
        "intermediate_size": 192,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "num_experts": 16,
        "num_experts_per_token": 2,
        "num_shared_experts": 2,
        "moe_intermediate_size": 64,
        "routed_expert_hidden_size": 32,
        "latent_moe_use_norm": True,
        "moe_router_activation_func": "sigmoid",
        "moe_renormalize": True,
        "routed_scaling_factor": 1.0,
        "use_grouped_topk": True,
        "num_expert_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "q_lora_rank": 32,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "mla_use_nope": True,
        "mla_use_output_gate": True,
        "attn_res_block_size": 3,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": 0,
        "max_position_embeddings": 1048576,
        "bos_token_id": n_ranks,
        "eos_token_id": n_ranks + 2,
        "pad_token_id": n_ranks + 255,
        "linear_attn_config": {
            "num_heads": 2,
            "head_dim": 32,
            "short_conv_kernel_size": 4,
            "gate_lower_bound": -5.0,
            "use_full_rank_gate": True,
            "kda_layers": [l for l in range(1, LAYERS + 1) if l not in MLA_LAYERS],
            "full_attn_layers": MLA_LAYERS,
        },
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "mxfp4-pack-quantized",
            "config_groups": {
                "group_0": {
                    "format": "mxfp4-pack-quantized",
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 4,
                        "type": "float",
                        "strategy": "group",
                        "group_size": 32,
                        "symmetric": True,
                        "scale_dtype": "torch.uint8",
                    },
                }
            },
            "ignore": [
                "re:.*self_attn.*",
                "re:.*shared_experts.*",
                "re:.*mlp\\.(gate|up|down)_proj.*",
                "lm_head",
                "re:vision_tower.*",
                "re:mm_projector.*",
            ],
        },
    }


def config_json(n_ranks):
    """The released nested config.json (spec §2.2)."""
    tc = text_config(n_ranks)
    return {
        "model_type": "kimi_k3",
        "architectures": ["KimiK3ForConditionalGeneration"],
        "bos_token_id": tc["bos_token_id"],
        "eos_token_id": tc["eos_token_id"],
        "pad_token_id": tc["pad_token_id"],
        "media_placeholder_token_id": n_ranks + 21,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "text_config": tc,
        "vision_config": {},
    }


def training_text_config(n_ranks):
    """The same model for training: experts as plain f32 layers (no quantization_config)."""
    tc = text_config(n_ranks)
    del tc["quantization_config"]
    return tc
