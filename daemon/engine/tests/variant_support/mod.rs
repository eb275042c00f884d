//! Rewriting a checkpoint's small vectors into another dtype (issue 19's accepted variants):
//! shared by the engine's `checkpoint_variants` test and the `k3d check` tests, which include
//! this file with `#[path]`.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::Path;

use k3_engine::checkpoint::config::ModelConfig;
use k3_engine::checkpoint::inventory;
use k3_engine::checkpoint::safetensors::{
    Dtype, TensorIndex, TensorSpec, data_order, encode_header,
};

/// Every full tensor name the inventory marks as a small vector.
pub fn vector_names(c: &ModelConfig) -> Vec<String> {
    let mut out: Vec<String> = inventory::model_level(c)
        .into_iter()
        .filter(|w| w.vector)
        .map(|w| w.name.to_owned())
        .collect();
    for l in 0..c.num_hidden_layers {
        let prefix = inventory::layer_prefix(l);
        let trunk = inventory::trunk(c, l).expect("inventory");
        out.extend(
            trunk
                .into_iter()
                .filter(|w| w.vector)
                .map(|w| format!("{prefix}{}", w.name)),
        );
    }
    out
}

/// Copies the checkpoint in `from` to `to`, storing every BF16 small vector as `dtype`
/// (F32: exact; F16: asserted exact for these values). Shard headers are re-encoded in the
/// release's layout; names and files are unchanged, so the index file is copied as is.
pub fn convert(from: &Path, to: &Path, dtype: Dtype) -> usize {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    let config = ModelConfig::from_file(&from.join("config.json")).unwrap();
    let vectors = vector_names(&config);
    let index = TensorIndex::open_dir(from).unwrap();
    let mut converted = 0;
    for (s, shard) in index.shards().iter().enumerate() {
        let bytes = std::fs::read(&shard.path).unwrap();
        let mut tensors: Vec<(TensorSpec, Vec<u8>)> = Vec::new();
        for p in 0..index.len() {
            let t = index.at(p);
            if t.shard != s {
                continue;
            }
            let data = &bytes[t.offset as usize..(t.offset + t.len) as usize];
            let widen = t.dtype == Dtype::Bf16 && vectors.iter().any(|v| v == t.name);
            let (dtype, data) = if widen {
                converted += 1;
                let values = data
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32());
                let out: Vec<u8> = match dtype {
                    Dtype::F32 => values.flat_map(f32::to_le_bytes).collect(),
                    Dtype::F16 => values
                        .flat_map(|v| {
                            let h = half::f16::from_f32(v);
                            assert_eq!(
                                h.to_f32().to_bits(),
                                v.to_bits(),
                                "{} not exact in F16",
                                t.name
                            );
                            h.to_le_bytes()
                        })
                        .collect(),
                    other => panic!("no conversion to {other}"),
                };
                (dtype, out)
            } else {
                (t.dtype, data.to_vec())
            };
            let spec = TensorSpec {
                name: t.name.to_owned(),
                dtype,
                shape: t.shape.to_vec(),
            };
            tensors.push((spec, data));
        }
        let specs: Vec<TensorSpec> = tensors.iter().map(|(t, _)| t.clone()).collect();
        let (mut file, _) = encode_header(&specs).unwrap();
        tensors.sort_by(|a, b| data_order(&a.0).cmp(&data_order(&b.0)));
        for (_, data) in &tensors {
            file.extend_from_slice(data);
        }
        std::fs::write(to.join(shard.path.file_name().unwrap()), file).unwrap();
    }
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "safetensors") {
            std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
        }
    }
    converted
}
