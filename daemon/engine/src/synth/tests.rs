//! End-to-end tests of the synthesizer: files on disk, determinism, layout properties, and the
//! committed reference fixtures' fingerprints.

use std::path::Path;

use serde_json::Value;

use super::*;

/// A fresh scratch directory, removed on drop.
fn scratch(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("k3d-synth-{tag}-"))
        .tempdir()
        .unwrap()
}

fn synth(shape: &str, dir: &Path, seed: u64) -> Written {
    let plan = blueprint(&Shape::named(shape).unwrap()).unwrap();
    write(&plan, dir, seed, false, &mut |_| {}).unwrap()
}

fn header(path: &Path) -> (u64, Vec<(String, String, u64, u64)>) {
    let bytes = fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let json: Value = serde_json::from_slice(&bytes[8..8 + n as usize]).unwrap();
    let mut v: Vec<(String, String, u64, u64)> = json
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, t)| {
            let o = &t["data_offsets"];
            (
                k.clone(),
                t["dtype"].as_str().unwrap().to_string(),
                o[0].as_u64().unwrap(),
                o[1].as_u64().unwrap(),
            )
        })
        .collect();
    v.sort_by_key(|t| t.2);
    (bytes.len() as u64 - 8 - n, v)
}

#[test]
fn same_seed_same_bytes_any_thread_count() {
    let (a, b) = (scratch("det-a"), scratch("det-b"));
    let s1 = synth("tiny-c", a.path(), 5);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let s2 = pool.install(|| synth("tiny-c", b.path(), 5));
    assert_eq!(s1.content_sha256, s2.content_sha256);
    assert_eq!(s1.files, s2.files);
    let p = blueprint(&Shape::named("tiny-c").unwrap()).unwrap();
    assert_eq!(content_sha256_dir(&p, a.path()).unwrap(), s1.content_sha256);
    let c = scratch("det-c");
    assert_ne!(
        synth("tiny-c", c.path(), 6).content_sha256,
        s1.content_sha256
    );
}

/// Spec §3.2/§3.4: data tiles the file, F32 then BF16 then U8 each by bytewise name, the trunk
/// is one run before the experts, each expert's six tensors are one run in the released order.
#[test]
fn shards_have_the_released_layout() {
    let d = scratch("layout");
    synth("tiny", d.path(), 0);
    let (data_len, t) = header(&d.path().join(shard_file_name(2, 10)));
    let mut end = 0;
    for (_, _, b, e) in &t {
        assert_eq!(*b, end);
        end = *e;
    }
    assert_eq!(end, data_len);
    let rank = |d: &str| ["F32", "BF16", "U8"].iter().position(|x| *x == d).unwrap();
    for w in t.windows(2) {
        let key = |x: &(String, String, u64, u64)| (rank(&x.1), x.0.clone().into_bytes());
        assert!(key(&w[0]) < key(&w[1]), "{} before {}", w[0].0, w[1].0);
    }
    let first_expert = t.iter().position(|x| x.0.contains(".experts.")).unwrap();
    assert!(t[first_expert..].iter().all(|x| x.0.contains(".experts.")));
    let p = "language_model.model.layers.1.block_sparse_moe.experts.0.";
    let six: Vec<&str> = t[first_expert..first_expert + 6]
        .iter()
        .map(|x| x.0.strip_prefix(p).unwrap())
        .collect();
    assert_eq!(
        six,
        [
            "w1.weight_packed",
            "w1.weight_scale",
            "w2.weight_packed",
            "w2.weight_scale",
            "w3.weight_packed",
            "w3.weight_scale"
        ]
    );
    let a_log = t.iter().find(|x| x.0.ends_with("A_log")).unwrap();
    assert_eq!(a_log.1, "F32");
    assert_eq!(a_log.3 - a_log.2, 8 * 4);
}

#[test]
fn config_index_and_tokenizer_agree() {
    let d = scratch("cfg");
    let s = synth("tiny", d.path(), 0);
    let read = |n: &str| -> Value {
        serde_json::from_slice(&fs::read(d.path().join(n)).unwrap()).unwrap()
    };
    let cfg = read("config.json");
    let tc = &cfg["text_config"];
    let ranks = fs::read_to_string(d.path().join("tiktoken.model"))
        .unwrap()
        .lines()
        .count();
    assert_eq!(tc["vocab_size"], ranks + 256);
    assert_eq!(s.vocab_size, ranks + 256);
    assert_eq!(cfg["model_type"], "kimi_k3");
    assert_eq!(cfg["bos_token_id"], ranks);
    assert_eq!(cfg["eos_token_id"], ranks + 2);
    assert_eq!(cfg["pad_token_id"], ranks + 255);
    assert_eq!(tc["quantization_config"]["format"], "mxfp4-pack-quantized");
    assert_eq!(
        tc["linear_attn_config"]["full_attn_layers"],
        serde_json::json!([4, 8, 9])
    );
    let tok = read("tokenizer_config.json");
    assert_eq!(
        tok["added_tokens_decoder"][(ranks + 2).to_string()]["content"],
        "<|end_of_msg|>"
    );
    let index = read("model.safetensors.index.json");
    let map = index["weight_map"].as_object().unwrap();
    assert_eq!(
        map["language_model.lm_head.weight"],
        shard_file_name(10, 10)
    );
    let data: u64 = (1..=10)
        .map(|i| header(&d.path().join(shard_file_name(i, 10))).0)
        .sum();
    assert_eq!(index["metadata"]["total_size"], data);
}

#[test]
fn refuses_non_empty_dir_unless_forced_and_force_clears_stale_shards() {
    let d = scratch("force");
    fs::write(d.path().join("model-00001-of-000099.safetensors"), b"stale").unwrap();
    fs::write(d.path().join("notes.txt"), b"keep").unwrap();
    let p = blueprint(&Shape::named("tiny").unwrap()).unwrap();
    let e = write(&p, d.path(), 0, false, &mut |_| {}).unwrap_err();
    assert!(matches!(e, SynthError::NotEmpty { .. }), "{e}");
    write(&p, d.path(), 0, true, &mut |_| {}).unwrap();
    assert!(!d.path().join("model-00001-of-000099.safetensors").exists());
    assert!(d.path().join("notes.txt").exists());
}

#[test]
fn refuses_when_the_disk_is_short() {
    let e = check_space(&std::env::temp_dir(), u64::MAX / 2).unwrap_err();
    assert!(matches!(e, SynthError::NoSpace { .. }), "{e}");
    check_space(&std::env::temp_dir(), 1).unwrap();
}

/// The committed mlx-lm fixtures were computed on checkpoints with these exact bytes.
#[test]
fn reference_fixtures_match_the_synthesizer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/reference");
    for shape in ["tiny", "tiny-b", "tiny-c"] {
        let meta_path = root.join(shape).join("meta.json");
        let meta: Value = serde_json::from_slice(
            &fs::read(&meta_path).unwrap_or_else(|e| panic!("{}: {e}", meta_path.display())),
        )
        .unwrap();
        let seed = meta["seed"].as_u64().unwrap();
        let d = scratch(&format!("fixture-{shape}"));
        let s = synth(shape, d.path(), seed);
        assert_eq!(
            meta["fingerprint"].as_str(),
            Some(s.content_sha256.as_str()),
            "{shape}: fixtures stale: regenerate with tests/reference/make_fixtures.sh"
        );
        assert_eq!(meta["vocab_size"].as_u64(), Some(s.vocab_size as u64));
    }
}

/// With released counts (896 experts, vocab 163,840) the writer reproduces the released shard
/// file sizes byte-exactly (spec §3.1), which pins the header format: compact JSON, key order,
/// padding, and the data order.
#[test]
fn released_counts_give_released_shard_sizes() {
    let s = Shape::named("bench").unwrap();
    let config = ModelConfig {
        num_hidden_layers: 11,
        layer_kinds: shape::layer_kinds(11, &[4, 8]),
        num_experts: 896,
        vocab_size: 163_840,
        ..s.config
    };
    let specs = tensors::shards(&config, s.a_log_len).unwrap();
    let size = |i: usize| {
        writer::plan(String::new(), specs[i].clone())
            .unwrap()
            .file_size()
    };
    assert_eq!(size(0), 2_341_216_112);
    assert_eq!(size(1), 16_990_911_504);
    assert_eq!(size(3), 16_567_501_776);
    assert_eq!(size(10), 16_990_916_912);
    assert_eq!(size(11), 4_697_664_072);
}

/// The written `config.json` reads back as exactly the plan's config, in every shape: the
/// inventory the shards were built from is the one the reader will bind against.
#[test]
fn config_json_reads_back_as_the_plan_config() {
    for name in shape::SHAPE_NAMES {
        let p = blueprint(&Shape::named(name).unwrap()).unwrap();
        let (_, text) = p
            .small_files
            .iter()
            .find(|(n, _)| n == "config.json")
            .unwrap();
        let read = ModelConfig::from_json(std::str::from_utf8(text).unwrap()).unwrap();
        assert_eq!(read, p.config, "{name}");
    }
}
