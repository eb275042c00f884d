//! `config.json` reading and refusals (spec §2.2–§2.3): every failure is collected with its
//! JSON path and reported at once; types are strict; only supported values pass.

mod checkpoint_support;

use checkpoint_support::*;
use k3_engine::checkpoint::config::{ConfigError, MixerKind, ModelConfig};
use serde_json::{Value, json};

fn issues_of(config: &Value) -> Vec<String> {
    match ModelConfig::from_json(&config.to_string()) {
        Ok(_) => panic!("config must be refused"),
        Err(e @ ConfigError::Invalid { .. }) => e.issues().iter().map(|i| i.to_string()).collect(),
        Err(other) => panic!("expected collected issues, got {other}"),
    }
}

fn has(issues: &[String], path: &str, words: &str) {
    assert!(
        issues
            .iter()
            .any(|i| i.starts_with(&format!("{path}: ")) && i.contains(words)),
        "no issue at {path} containing {words:?} in {issues:#?}"
    );
}

fn has_all(issues: &[String], expected: &[(&str, &str)]) {
    for (path, words) in expected {
        has(issues, path, words);
    }
}

/// The value at a dotted `path` of `config` (which must have it).
fn at<'a>(config: &'a mut Value, path: &str) -> &'a mut Value {
    config
        .pointer_mut(&format!("/{}", path.replace('.', "/")))
        .unwrap_or_else(|| panic!("the tiny config has no {path}"))
}

/// Sets every dotted `path` of the tiny config to its value, then requires, from the one parse
/// that reports them all at once, an issue at each path containing its words.
fn refused(edits: &[(&str, Value, &str)]) {
    let mut config = tiny_config();
    for (path, value, _) in edits {
        *at(&mut config, path) = value.clone();
    }
    let issues = issues_of(&config);
    for (path, _, words) in edits {
        has(&issues, path, words);
    }
}

fn text(config: &mut Value) -> &mut serde_json::Map<String, Value> {
    config["text_config"].as_object_mut().unwrap()
}

fn linear(config: &mut Value) -> &mut serde_json::Map<String, Value> {
    config["text_config"]["linear_attn_config"]
        .as_object_mut()
        .unwrap()
}

#[test]
fn released_config_is_read_as_specified() {
    let c = ModelConfig::from_json(released_config_text()).expect("released config");
    assert_eq!(
        (c.hidden_size, c.num_hidden_layers, c.vocab_size),
        (7168, 93, 163_840)
    );
    assert_eq!(
        (c.num_experts, c.num_experts_per_token, c.num_shared_experts),
        (896, 16, 2)
    );
    assert_eq!(
        (
            c.kda.num_heads,
            c.kda.head_dim,
            c.kda.short_conv_kernel_size
        ),
        (96, 128, 4)
    );
    assert_eq!(c.kda.gate_lower_bound, -5.0);
    assert_eq!(
        (c.activation_situ_beta, c.activation_situ_linear_beta),
        (4.0, 25.0)
    );
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert_eq!(
        (c.bos_token_id, c.eos_token_id, c.pad_token_id),
        (Some(163_584), Some(163_586), Some(163_839))
    );
    // Released map, zero-based: MLA at 3, 7, …, 87, 91 and 92; KDA elsewhere.
    let mla: Vec<usize> = (0..93)
        .filter(|&l| c.layer_kinds[l] == MixerKind::Mla)
        .collect();
    let mut expected: Vec<usize> = (3..92).step_by(4).collect();
    expected.push(92);
    assert_eq!(mla, expected);
    assert!(!c.is_moe_layer(0) && (1..93).all(|l| c.is_moe_layer(l)));
}

#[test]
fn flat_shape_reads_the_same_model() {
    let nested = tiny_config();
    let mut flat = nested["text_config"].clone();
    for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
        flat[key] = nested[key].clone();
    }
    let a = ModelConfig::from_json(&nested.to_string()).expect("nested");
    let b = ModelConfig::from_json(&flat.to_string()).expect("flat");
    assert_eq!(a, b);
}

#[test]
fn quantization_config_may_sit_at_the_root() {
    let mut config = tiny_config();
    let q = text(&mut config).remove("quantization_config").unwrap();
    config["quantization_config"] = q;
    ModelConfig::from_json(&config.to_string()).expect("root quantization_config");
}

#[test]
fn quantization_configs_in_both_places_must_agree() {
    let mut config = tiny_config();
    let mut q = config["text_config"]["quantization_config"].clone();
    q["format"] = json!("nvfp4-pack-quantized");
    config["quantization_config"] = q;
    has(
        &issues_of(&config),
        "quantization_config",
        "differs from text_config.quantization_config",
    );
}

#[test]
fn zero_based_layer_list_is_refused_and_the_message_says_one_based() {
    let mut config = tiny_config();
    linear(&mut config)["kda_layers"] = json!([0, 1, 2, 4, 5, 6]);
    linear(&mut config)["full_attn_layers"] = json!([3, 7, 8]);
    let issues = issues_of(&config);
    has(
        &issues,
        "text_config.linear_attn_config.kda_layers",
        "entry 0 is outside 1..=9: the layer lists are one-based",
    );
    has(
        &issues,
        "text_config.linear_attn_config.kda_layers",
        "missing: 9",
    );
}

#[test]
fn layer_lists_must_partition_all_layers() {
    let mut config = tiny_config();
    linear(&mut config)["kda_layers"] = json!([1, 2, 3, 5, 6, 6, 8]);
    linear(&mut config)["full_attn_layers"] = json!([4, 8]);
    let issues = issues_of(&config);
    has_all(
        &issues,
        &[
            (
                "text_config.linear_attn_config.kda_layers",
                "one-based layer 6 is listed twice",
            ),
            (
                "text_config.linear_attn_config.full_attn_layers",
                "one-based layer 8 is also listed in kda_layers",
            ),
            ("text_config.linear_attn_config.kda_layers", "missing: 7, 9"),
        ],
    );
}

#[test]
fn missing_fields_are_all_reported_at_once() {
    let mut config = tiny_config();
    text(&mut config).remove("attn_res_block_size");
    text(&mut config).remove("latent_moe_use_norm");
    linear(&mut config).remove("gate_lower_bound");
    text(&mut config)["quantization_config"]["config_groups"]["group_0"]["weights"]
        .as_object_mut()
        .unwrap()
        .remove("group_size");
    let issues = issues_of(&config);
    assert_eq!(issues.len(), 4, "{issues:#?}");
    has_all(
        &issues,
        &[
            ("text_config.attn_res_block_size", "missing"),
            ("text_config.latent_moe_use_norm", "missing"),
            ("text_config.linear_attn_config.gate_lower_bound", "missing"),
            (
                "text_config.quantization_config.config_groups.group_0.weights.group_size",
                "missing",
            ),
        ],
    );
    // The one-line message carries every path too.
    let message = ModelConfig::from_json(&config.to_string())
        .unwrap_err()
        .to_string();
    assert!(message.starts_with("4 problem(s): "), "{message}");
    assert!(
        message.contains("text_config.linear_attn_config.gate_lower_bound: missing"),
        "{message}"
    );
}

#[test]
fn every_required_key_is_required() {
    for object in ["text_config", "text_config.linear_attn_config"] {
        let keys: Vec<String> = at(&mut tiny_config(), object)
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        for key in keys {
            let mut config = tiny_config();
            at(&mut config, object)
                .as_object_mut()
                .unwrap()
                .remove(&key);
            has(&issues_of(&config), &format!("{object}.{key}"), "missing");
        }
    }
}

#[test]
fn wrong_json_types_are_refused() {
    refused(&[
        (
            "text_config.hidden_size",
            json!("64"),
            "must be a non-negative integer, found string \"64\"",
        ),
        (
            "text_config.num_experts",
            json!(8.0),
            "must be a non-negative integer, found number 8.0",
        ),
        (
            "text_config.moe_renormalize",
            json!(1),
            "must be true or false, found number 1",
        ),
        (
            "text_config.rms_norm_eps",
            json!("1e-5"),
            "must be a number",
        ),
        (
            "text_config.linear_attn_config.kda_layers",
            json!([1, 2, 3.0, 5, 6, 7]),
            "must be an array of integers",
        ),
    ]);
}

#[test]
fn integer_valued_floats_are_accepted_for_number_keys() {
    let mut config = tiny_config();
    text(&mut config)["activation_situ_beta"] = json!(4);
    linear(&mut config)["gate_lower_bound"] = json!(-5);
    ModelConfig::from_json(&config.to_string()).expect("any JSON number for betas and bound");
}

#[test]
fn unsupported_values_are_refused() {
    refused(&[
        ("text_config.hidden_act", json!("silu"), "must be \"situ\""),
        (
            "text_config.moe_router_activation_func",
            json!("softmax"),
            "must be \"sigmoid\"",
        ),
        ("text_config.mla_use_nope", json!(false), "must be true"),
        (
            "text_config.tie_word_embeddings",
            json!(true),
            "must be false",
        ),
        (
            "text_config.num_nextn_predict_layers",
            json!(1),
            "must be 0",
        ),
        (
            "text_config.num_key_value_heads",
            json!(2),
            "must equal num_attention_heads (4), found 2",
        ),
        (
            "text_config.linear_attn_config.use_full_rank_gate",
            json!(false),
            "must be true",
        ),
        (
            "text_config.quantization_config.config_groups.group_0.weights.group_size",
            json!(16),
            "must be 32",
        ),
    ]);
}

#[test]
fn range_and_structure_rules() {
    refused(&[
        (
            "text_config.num_experts_per_token",
            json!(9),
            "must be at most num_experts (8), found 9",
        ),
        (
            "text_config.routed_expert_hidden_size",
            json!(48),
            "must be a multiple of 32",
        ),
        (
            "text_config.first_k_dense_replace",
            json!(10),
            "must be at most num_hidden_layers (9)",
        ),
        (
            "text_config.attn_res_block_size",
            json!(0),
            "must be at least 1",
        ),
        (
            "text_config.linear_attn_config.gate_lower_bound",
            json!(0.5),
            "must be < 0",
        ),
    ]);
}

#[test]
fn grouped_routing_must_be_inert() {
    let mut config = tiny_config();
    text(&mut config)["num_expert_group"] = json!(4);
    text(&mut config)["topk_group"] = json!(2);
    has(
        &issues_of(&config),
        "text_config.num_expert_group",
        "grouped routing must be inert",
    );
    // Every group selectable: inert.
    text(&mut config)["topk_group"] = json!(4);
    ModelConfig::from_json(&config.to_string()).expect("topk_group = num_expert_group is inert");
}

#[test]
fn null_q_lora_rank_is_refused() {
    let mut config = tiny_config();
    text(&mut config)["q_lora_rank"] = Value::Null;
    has(
        &issues_of(&config),
        "text_config.q_lora_rank",
        "must not be null",
    );
}

#[test]
fn root_tie_word_embeddings_true_is_refused() {
    let mut config = tiny_config();
    config["tie_word_embeddings"] = json!(true);
    has(&issues_of(&config), "tie_word_embeddings", "must be false");
}

#[test]
fn token_ids_must_be_integers_when_present() {
    let mut config = tiny_config();
    config["eos_token_id"] = json!("2");
    has(&issues_of(&config), "eos_token_id", "must be a token id");
}

#[test]
fn syntax_errors_and_non_objects() {
    assert!(matches!(
        ModelConfig::from_json("{\"hidden_size\": "),
        Err(ConfigError::Json { .. })
    ));
    assert!(matches!(
        ModelConfig::from_json("[1, 2]"),
        Err(ConfigError::Json { .. })
    ));
}

#[test]
fn from_file_names_the_file() {
    let dir = temp_dir("cfg");
    let mut config = tiny_config();
    text(&mut config).remove("vocab_size");
    write_config(dir.path(), &config);
    let e = ModelConfig::from_file(&dir.path().join("config.json")).unwrap_err();
    let message = e.to_string();
    assert!(
        message.contains("config.json: 1 problem(s): text_config.vocab_size: missing"),
        "{message}"
    );
    let e = ModelConfig::from_file(&dir.path().join("absent.json")).unwrap_err();
    assert!(e.is_io());
}

#[test]
fn absurd_layer_count_is_refused_without_allocating_for_it() {
    let mut config = tiny_config();
    text(&mut config)["num_hidden_layers"] = json!(1u64 << 60);
    let issues = issues_of(&config);
    has(
        &issues,
        "text_config.linear_attn_config.kda_layers",
        "together have 9 entries, fewer than the 1152921504606846976 layers",
    );
}

/// `max_position_embeddings` is informational (spec §2.2) and may be absent or null; present,
/// it is a positive integer, and it bounds what the serve core accepts.
#[test]
fn the_advertised_context_is_optional_but_never_wrong() {
    let parse = |config: &Value| ModelConfig::from_json(&config.to_string()).expect("valid");
    let mut config = tiny_config();
    text(&mut config).insert("max_position_embeddings".into(), json!(4096));
    assert_eq!(parse(&config).max_position_embeddings, Some(4096));
    text(&mut config).insert("max_position_embeddings".into(), Value::Null);
    assert_eq!(parse(&config).max_position_embeddings, None);
    text(&mut config).remove("max_position_embeddings");
    assert_eq!(parse(&config).max_position_embeddings, None);
    for wrong in [json!(0), json!("4096"), json!(-1), json!(1.5)] {
        text(&mut config).insert("max_position_embeddings".into(), wrong);
        has(
            &issues_of(&config),
            "text_config.max_position_embeddings",
            "must be a positive integer or null",
        );
    }
}
