//! Test-side checkpoint writer for the `checkpoint_*` tests: tiny hand-built safetensors files
//! in a fresh temporary directory. Data regions are created with `set_len` (zeros); the
//! checkpoint reader never looks at them.
#![allow(dead_code)] // each test crate uses a different part of this module

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use k3_engine::checkpoint::ModelConfig;
use k3_engine::checkpoint::inventory::{layer_tensors, model_tensors};
use k3_engine::checkpoint::safetensors::{Dtype, TensorSpec, encode_header};
use serde_json::{Value, json};

pub use tempfile::TempDir;

/// A fresh directory under the system temp dir for one test, removed on drop.
pub fn temp_dir(tag: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("k3d-checkpoint-test-{tag}-"))
        .tempdir()
        .expect("create temp dir")
}

/// The spec §9.1 validation configuration, nested as released, every key explicit.
pub fn tiny_config() -> Value {
    serde_json::from_str(
        r#"{
        "model_type": "kimi_k3",
        "architectures": ["KimiK3ForConditionalGeneration"],
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        "tie_word_embeddings": false,
        "text_config": {
            "hidden_size": 64, "num_hidden_layers": 9, "vocab_size": 256, "rms_norm_eps": 1e-5,
            "hidden_act": "situ", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
            "intermediate_size": 96, "first_k_dense_replace": 1, "moe_layer_freq": 1,
            "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 2,
            "moe_intermediate_size": 32, "routed_expert_hidden_size": 32,
            "latent_moe_use_norm": true, "moe_router_activation_func": "sigmoid",
            "moe_renormalize": true, "routed_scaling_factor": 1.0,
            "use_grouped_topk": true, "num_expert_group": 1, "topk_group": 1,
            "topk_method": "noaux_tc",
            "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 32,
            "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
            "mla_use_nope": true, "mla_use_output_gate": true, "attn_res_block_size": 3,
            "tie_word_embeddings": false, "num_nextn_predict_layers": 0,
            "linear_attn_config": {
                "num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4,
                "gate_lower_bound": -5.0, "use_full_rank_gate": true,
                "kda_layers": [1, 2, 3, 5, 6, 7], "full_attn_layers": [4, 8, 9]
            },
            "quantization_config": {
                "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
                "config_groups": {"group_0": {"weights": {
                    "num_bits": 4, "type": "float", "strategy": "group", "group_size": 32,
                    "symmetric": true, "scale_dtype": "torch.uint8"
                }}}
            }
        }
    }"#,
    )
    .expect("tiny config is JSON")
}

pub fn released_config_text() -> &'static str {
    include_str!("../../src/checkpoint/testdata/released_config.json")
}

/// Write `config` as `dir/config.json`.
pub fn write_config(dir: &Path, config: &Value) {
    fs::write(dir.join("config.json"), config.to_string()).expect("write config");
}

/// The released shard name for shard `i` (zero-based) of `n`: five digits, then six.
pub fn shard_name(i: usize, n: usize) -> String {
    format!("model-{:05}-of-{n:06}.safetensors", i + 1)
}

/// The tensors of a checkpoint for `config`, one shard per layer plus the model level, with
/// `A_log` stored padded to twice the head count (as in spec §9.1).
pub fn plan(config: &Value) -> Vec<Vec<TensorSpec>> {
    let c = ModelConfig::from_json(&config.to_string()).expect("test config is valid");
    let a_log_len = 2 * c.kda.num_heads as u64;
    let mut shards: Vec<Vec<TensorSpec>> = (0..c.num_hidden_layers)
        .map(|l| layer_tensors(&c, l, a_log_len).expect("dims fit"))
        .collect();
    shards.push(model_tensors(&c));
    shards
}

/// Write a well-formed checkpoint: config, shards in the released order, and an index file.
pub fn write_checkpoint(dir: &Path, config: &Value, shards: &[Vec<TensorSpec>]) {
    write_config(dir, config);
    let n = shards.len();
    let mut weight_map = serde_json::Map::new();
    for (i, tensors) in shards.iter().enumerate() {
        let name = shard_name(i, n);
        let (header, data_len) = encode_header(tensors).expect("encodable");
        write_file(&dir.join(&name), &header, data_len);
        for t in tensors {
            weight_map.insert(t.name.clone(), Value::from(name.clone()));
        }
    }
    let index = json!({"metadata": {}, "weight_map": weight_map});
    fs::write(dir.join("model.safetensors.index.json"), index.to_string()).expect("index");
}

/// Write a well-formed checkpoint for `tiny_config()`.
pub fn write_tiny(dir: &Path) -> Vec<Vec<TensorSpec>> {
    let config = tiny_config();
    let shards = plan(&config);
    write_checkpoint(dir, &config, &shards);
    shards
}

/// `prefix` (8-byte length + header) followed by `data_len` zero bytes, as a sparse file.
pub fn write_file(path: &Path, prefix: &[u8], data_len: u64) {
    let mut f = File::create(path).expect("create shard");
    f.write_all(prefix).expect("write header");
    f.set_len(prefix.len() as u64 + data_len)
        .expect("extend data region");
}

/// A raw shard: `header` JSON written verbatim (no padding) after its true length.
pub fn write_raw(path: &Path, header: &str, data_len: u64) {
    let mut prefix = (header.len() as u64).to_le_bytes().to_vec();
    prefix.extend_from_slice(header.as_bytes());
    write_file(path, &prefix, data_len);
}

/// A header JSON with tensors laid out back to back in exactly the given order.
pub fn header_in_order(tensors: &[TensorSpec]) -> (String, u64) {
    let mut at = 0u64;
    let mut entries = Vec::new();
    for t in tensors {
        let len = t.byte_len().expect("fits");
        entries.push(format!(
            "{}:{{\"dtype\":\"{}\",\"shape\":{:?},\"data_offsets\":[{at},{}]}}",
            Value::from(t.name.clone()),
            t.dtype.name(),
            t.shape,
            at + len
        ));
        at += len;
    }
    (format!("{{{}}}", entries.join(",")), at)
}

/// One raw header entry.
pub fn entry(name: &str, dtype: &str, shape: &[i64], begin: i64, end: i64) -> String {
    format!(
        "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":{shape:?},\"data_offsets\":[{begin},{end}]}}"
    )
}

pub fn spec(name: &str, dtype: Dtype, shape: &[u64]) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
    }
}
