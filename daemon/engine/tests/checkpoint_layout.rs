//! Layout binding (spec §3.3–§3.4) and `Checkpoint::open`, on tiny hand-written checkpoints in
//! the released layout (the `k3d check` binary is tested in `daemon/k3d/tests/check_cli.rs`).

mod checkpoint_support;

use checkpoint_support::*;
use k3_engine::checkpoint::layout::{FfnLayout, IssueKind, LayoutError, MixerLayout};
use k3_engine::checkpoint::safetensors::{Dtype, TensorSpec};
use k3_engine::checkpoint::{Checkpoint, CheckpointError};

const L1: &str = "language_model.model.layers.1.";

fn open(dir: &TempDir) -> Result<Checkpoint, CheckpointError> {
    Checkpoint::open(dir.path())
}

fn layout_error(dir: &TempDir) -> LayoutError {
    match open(dir) {
        Err(CheckpointError::Layout(e)) => e,
        Err(other) => panic!("expected a layout error, got {other}"),
        Ok(_) => panic!("the checkpoint must be refused"),
    }
}

/// Write the tiny checkpoint after `edit` changed its plan; no index file (it would only
/// repeat the plan).
fn write_edited(dir: &TempDir, edit: impl FnOnce(&mut Vec<Vec<TensorSpec>>)) {
    let config = tiny_config();
    let mut shards = plan(&config);
    edit(&mut shards);
    write_checkpoint(dir.path(), &config, &shards);
    std::fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
}

fn take(shard: &mut Vec<TensorSpec>, name: &str) -> TensorSpec {
    let i = shard
        .iter()
        .position(|t| t.name == name)
        .unwrap_or_else(|| panic!("{name} planned"));
    shard.remove(i)
}

#[test]
fn tiny_checkpoint_binds_with_the_expected_census() {
    let dir = temp_dir("ok");
    write_tiny(dir.path());
    let ck = open(&dir).expect("well-formed tiny checkpoint");
    assert_eq!(ck.shards.len(), 10);
    let c = &ck.census;
    assert_eq!(
        (c.kda_layers, c.mla_layers, c.dense_layers, c.moe_layers),
        (6, 3, 1, 8)
    );
    // One expert: w1, w3 = 32×16 packed + 32×1 scale; w2 the same (latent = width = 32).
    assert_eq!(c.expert_bytes, 3 * (32 * 16 + 32));
    assert_eq!(c.experts, 8 * 8);
    assert_eq!(c.all_expert_bytes, 64 * 1632);
    assert_eq!(c.embedding_bytes, 256 * 64 * 2);
    assert_eq!(c.embedding_row_bytes, 128);
    assert_eq!(c.experts_per_token, 16);
    assert_eq!(
        c.decode_token_bytes,
        c.trunk_bytes + 16 * 1632 + 128 + 256 * 64 * 2
    );
    // Every tensor in a shard is bound: a layer shard is its trunk run plus its experts.
    for (l, layer) in ck.layout.layers.iter().enumerate() {
        let expert_bytes: u64 = match &layer.ffn {
            FfnLayout::Moe(m) => m.experts.iter().map(|(run, _)| run.len).sum(),
            FfnLayout::Dense(_) => 0,
        };
        let shard = &ck.shards[layer.trunk.shard];
        assert_eq!(
            layer.trunk.len + expert_bytes,
            shard.data_len(),
            "layer {l}"
        );
        // The released order puts F32 then BF16 first: the trunk run opens the data region.
        assert_eq!(layer.trunk.offset, shard.data_start, "layer {l}");
    }
    // Slices are relative to their run and carry dtype and shape.
    let layer1 = &ck.layout.layers[1];
    let MixerLayout::Kda(kda) = &layer1.mixer else {
        panic!("layer 1 is KDA")
    };
    assert_eq!(kda.a_log.shape, [8], "A_log is stored padded");
    assert_eq!(kda.q_conv1d.dtype, Dtype::F32);
    assert!(kda.q_proj.start + kda.q_proj.len <= layer1.trunk.len as usize);
    let FfnLayout::Moe(moe) = &layer1.ffn else {
        panic!("layer 1 is MoE")
    };
    assert_eq!(moe.experts.len(), 8);
    let (run, e) = &moe.experts[3];
    assert_eq!(run.len, 1632);
    assert_eq!(
        (e.w1_packed.start, e.w1_packed.shape.as_slice()),
        (0, &[32usize, 16][..])
    );
    assert_eq!(e.w2_scale.shape, [32, 1]);
    assert!(matches!(ck.layout.layers[3].mixer, MixerLayout::Mla(ref m) if m.g_proj.is_some()));
    assert!(matches!(ck.layout.layers[0].ffn, FfnLayout::Dense(_)));
}

#[test]
fn vision_tensors_are_ignored() {
    let dir = temp_dir("vision");
    write_edited(&dir, |shards| {
        shards.push(vec![
            spec("vision_tower.patch_embed.weight", Dtype::Bf16, &[4, 4]),
            spec("mm_projector.proj.weight", Dtype::Bf16, &[4]),
        ]);
    });
    open(&dir).expect("vision tensors are out of scope, not an error");
}

#[test]
fn missing_tensors_are_reported_together() {
    let dir = temp_dir("missing");
    write_edited(&dir, |shards| {
        take(&mut shards[1], &format!("{L1}self_attn.dt_bias"));
        take(
            &mut shards[1],
            &format!("{L1}block_sparse_moe.experts.5.w3.weight_scale"),
        );
    });
    match layout_error(&dir) {
        LayoutError::Tensors { issues, total } => {
            assert_eq!(total, 2, "{issues:?}");
            assert_eq!(issues[0].tensor, format!("{L1}self_attn.dt_bias"));
            assert_eq!(
                issues[1].tensor,
                format!("{L1}block_sparse_moe.experts.5.w3.weight_scale")
            );
            assert!(issues.iter().all(|i| i.kind == IssueKind::Missing));
        }
        other => panic!("expected Tensors, got {other}"),
    }
}

#[test]
fn shape_disagreeing_with_the_config_is_refused_not_reshaped() {
    let dir = temp_dir("shape");
    let name = format!("{L1}self_attn.q_proj.weight");
    write_edited(&dir, |shards| {
        let t = shards[1].iter_mut().find(|t| t.name == name).unwrap();
        t.shape = vec![32, 128]; // same byte count, transposed
    });
    let e = layout_error(&dir);
    let message = e.to_string();
    match e {
        LayoutError::Tensors { issues, total: 1 } => {
            assert_eq!(issues[0].tensor, name);
            assert_eq!(
                issues[0].file.as_deref(),
                Some("model-00002-of-000010.safetensors")
            );
            assert!(
                matches!(&issues[0].kind, IssueKind::Shape { found, .. } if found == &[32, 128])
            );
        }
        other => panic!("expected one shape issue, got {other}"),
    }
    assert!(
        message.contains("model-00002-of-000010.safetensors"),
        "{message}"
    );
    assert!(
        message.contains("shape [32, 128], config implies [64, 64]"),
        "{message}"
    );
}

/// A matrix must be stored as the release stores it (BF16): F16 and F32 matrices are refused
/// in one line naming the tensor, its dtype and what is supported.
#[test]
fn a_matrix_in_another_dtype_is_refused_naming_what_is_supported() {
    for dtype in [Dtype::F16, Dtype::F32] {
        let dir = temp_dir("dtype");
        let name = format!("{L1}self_attn.o_proj.weight");
        write_edited(&dir, |shards| {
            let t = shards[1].iter_mut().find(|t| t.name == name).unwrap();
            t.dtype = dtype;
        });
        match layout_error(&dir) {
            LayoutError::Tensors { issues, total } => {
                assert_eq!(total, 1);
                assert!(
                    matches!(
                        &issues[0].kind,
                        IssueKind::Dtype { expected: Dtype::Bf16, found, .. } if *found == dtype
                    ) && issues[0].tensor == name
                );
                let line = LayoutError::Tensors { issues, total }.to_string();
                assert!(!line.contains('\n'), "{line}");
                assert!(
                    line.contains(&format!("{name} ("))
                        && line.contains(&format!("is {dtype}; supported: BF16 only")),
                    "{line}"
                );
            }
            other => panic!("expected a dtype issue, got {other}"),
        }
    }
}

/// Small vectors hold the same numbers in F32, BF16 or F16 (spec §3.3; mlx-lm and the C engine
/// load them): `A_log` (F32 in the release) stored BF16 or F16 binds, as the stored dtype.
#[test]
fn a_small_vector_in_another_float_dtype_binds() {
    for dtype in [Dtype::Bf16, Dtype::F16] {
        let dir = temp_dir("vector-dtype");
        let name = format!("{L1}self_attn.A_log");
        write_edited(&dir, |shards| {
            let t = shards[1].iter_mut().find(|t| t.name == name).unwrap();
            t.dtype = dtype;
        });
        let ck = k3_engine::checkpoint::Checkpoint::open(dir.path()).expect("binds");
        match &ck.layout.layers[1].mixer {
            k3_engine::checkpoint::layout::MixerLayout::Kda(k) => assert_eq!(k.a_log.dtype, dtype),
            _ => panic!("layer 1 of the fixture is KDA"),
        }
    }
}

#[test]
fn a_log_shorter_than_num_heads_is_refused() {
    let dir = temp_dir("alog");
    let name = format!("{L1}self_attn.A_log");
    write_edited(&dir, |shards| {
        shards[1].iter_mut().find(|t| t.name == name).unwrap().shape = vec![3];
    });
    let message = layout_error(&dir).to_string();
    assert!(
        message.contains("shape [3], config implies [≥4]"),
        "{message}"
    );
}

#[test]
fn unexpected_tensor_is_refused() {
    let dir = temp_dir("extra");
    let name = "language_model.model.layers.0.block_sparse_moe.gate.weight";
    write_edited(&dir, |shards| {
        shards[0].push(spec(name, Dtype::Bf16, &[8, 64]))
    });
    match layout_error(&dir) {
        LayoutError::Tensors { issues, total: 1 } => {
            assert_eq!(issues[0].tensor, name);
            assert_eq!(issues[0].kind, IssueKind::Unexpected);
            assert_eq!(
                issues[0].file.as_deref(),
                Some("model-00001-of-000010.safetensors")
            );
        }
        other => panic!("expected one unexpected tensor, got {other}"),
    }
}

#[test]
fn config_with_fewer_experts_than_the_files_is_refused() {
    // The files hold 8 experts per layer; a config saying 6 leaves experts 6 and 7 unbound.
    let dir = temp_dir("experts");
    write_tiny(dir.path());
    let mut config = tiny_config();
    config["text_config"]["num_experts"] = 6.into();
    write_config(dir.path(), &config);
    match layout_error(&dir) {
        LayoutError::Tensors { issues, total } => {
            // gate [8, 64] and bias [8] disagree in all 8 MoE layers; 2 × 6 expert tensors unbound.
            assert_eq!(total, 8 * (2 + 12), "{issues:?}");
            assert!(issues.iter().any(|i| {
                i.kind == IssueKind::Unexpected
                    && i.tensor
                        .ends_with("block_sparse_moe.experts.7.w2.weight_packed")
            }));
        }
        other => panic!("expected tensor issues, got {other}"),
    }
}

/// Rewrite shard `i` of the tiny plan with its tensors in exactly `order`.
fn write_shard_in_order(dir: &TempDir, i: usize, n: usize, order: &[TensorSpec]) {
    let (header, data_len) = header_in_order(order);
    write_raw(&dir.path().join(shard_name(i, n)), &header, data_len);
}

#[test]
fn non_contiguous_trunk_run_is_refused() {
    let dir = temp_dir("trunk");
    let shards = write_tiny(dir.path());
    std::fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
    // Layer 1 with one expert tensor placed between two trunk tensors.
    let mut order = shards[1].clone();
    let expert = take(
        &mut order,
        &format!("{L1}block_sparse_moe.experts.0.w1.weight_packed"),
    );
    order.insert(3, expert);
    write_shard_in_order(&dir, 1, shards.len(), &order);
    match layout_error(&dir) {
        LayoutError::RunNotContiguous {
            layer: 1,
            expert: None,
            file,
            span,
            sum,
            tensor,
            ..
        } => {
            assert_eq!(file, "model-00002-of-000010.safetensors");
            assert_eq!(span, sum + 512, "the hole is the expert tensor");
            assert_eq!(tensor, order[4].name);
        }
        other => panic!("expected RunNotContiguous for the trunk, got {other}"),
    }
}

#[test]
fn non_contiguous_expert_is_refused() {
    let dir = temp_dir("expert");
    let shards = write_tiny(dir.path());
    std::fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
    let mut order = shards[2].clone();
    let name = "language_model.model.layers.2.block_sparse_moe.experts.4.w2.weight_scale";
    let moved = take(&mut order, name);
    order.push(moved);
    write_shard_in_order(&dir, 2, shards.len(), &order);
    let e = layout_error(&dir);
    let message = e.to_string();
    match e {
        LayoutError::RunNotContiguous {
            layer: 2,
            expert: Some(4),
            file,
            ..
        } => {
            assert_eq!(file, "model-00003-of-000010.safetensors");
        }
        other => panic!("expected RunNotContiguous for expert 4, got {other}"),
    }
    assert!(message.contains("layer 2 expert 4"), "{message}");
}

#[test]
fn expert_run_in_any_internal_order_is_accepted() {
    // The six sub-tensor offsets come from the header (spec §3.4): w3 before w1 is fine.
    let dir = temp_dir("order");
    let shards = write_tiny(dir.path());
    std::fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
    let mut order = shards[1].clone();
    order.reverse();
    write_shard_in_order(&dir, 1, shards.len(), &order);
    let ck = open(&dir).expect("reversed but contiguous runs bind");
    let FfnLayout::Moe(moe) = &ck.layout.layers[1].ffn else {
        panic!("MoE")
    };
    let (_, e) = &moe.experts[0];
    assert_eq!(e.w3_scale.start, 0, "reversed: w3 scale comes first");
}

#[test]
fn trunk_split_across_shards_is_refused() {
    let dir = temp_dir("split");
    let name = format!("{L1}mlp_res_norm.weight");
    write_edited(&dir, |shards| {
        let t = take(&mut shards[1], &name);
        shards[9].push(t);
    });
    match layout_error(&dir) {
        LayoutError::RunSplit {
            layer: 1,
            expert: None,
            other,
            other_file,
            ..
        } => {
            assert_eq!(other, name);
            assert_eq!(other_file, "model-00010-of-000010.safetensors");
        }
        other => panic!("expected RunSplit, got {other}"),
    }
}

#[test]
fn index_file_disagreeing_is_a_checkpoint_error() {
    let dir = temp_dir("idx");
    write_tiny(dir.path());
    let path = dir.path().join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let text = text.replacen("model-00002-of-000010", "model-00003-of-000010", 1);
    std::fs::write(&path, text).unwrap();
    let e = open(&dir).unwrap_err();
    assert!(!e.is_config());
    assert!(
        e.to_string()
            .contains("model.safetensors.index.json: weight_map maps"),
        "{e}"
    );
}

#[test]
fn config_refusal_is_a_config_error() {
    let dir = temp_dir("cfg");
    write_tiny(dir.path());
    let mut config = tiny_config();
    config["text_config"]["hidden_act"] = "gelu".into();
    write_config(dir.path(), &config);
    let e = open(&dir).unwrap_err();
    assert!(e.is_config(), "{e}");
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let e = open(&dir).unwrap_err();
    assert!(
        !e.is_config(),
        "a missing config.json is a missing checkpoint file: {e}"
    );
}

#[test]
fn absurd_expert_count_is_refused_by_arithmetic() {
    let dir = temp_dir("absurd");
    write_tiny(dir.path());
    let mut config = tiny_config();
    config["text_config"]["num_experts"] = 1_000_000_000_000u64.into();
    write_config(dir.path(), &config);
    match layout_error(&dir) {
        LayoutError::FarTooMany { implied, present } => {
            assert_eq!(present, 23 + 5 * (28 + 48) + 3 * (22 + 48) + 5);
            assert!(implied > 1_000_000_000_000);
        }
        other => panic!("expected FarTooMany, got {other}"),
    }
}
