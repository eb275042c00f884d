//! The reference gate (spec §6.2): for each tiny synth shape and for the trained fixture model,
//! the engine's teacher-forced logits and greedy continuation against mlx-lm 0.32.2 f32
//! fixtures (`tests/fixtures/reference/`, `tests/fixtures/trained/reference/`).

mod model_support;

use std::path::{Path, PathBuf};

use k3_engine::model::{Logits, Model};
use model_support::*;
use serde_json::Value;
use sha2::{Digest, Sha256};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn ids(v: &Value, key: &str) -> Vec<u32> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("meta.json: `{key}` is not an array"))
        .iter()
        .map(|x| x.as_u64().expect("token id") as u32)
        .collect()
}

/// First index of the maximum (spec §6.1 rule 12).
fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut state = model.new_state();
    let mut out = Vec::new();
    let mut next = prompt.to_vec();
    for _ in 0..n {
        let logits = model
            .forward(&mut state, &next, Logits::Last, &no_cancel)
            .expect("forward");
        let id = argmax(&logits) as u32;
        out.push(id);
        next = vec![id];
    }
    out
}

fn read_meta(dir: &Path) -> Value {
    let path = dir.join("meta.json");
    serde_json::from_slice(
        &std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .expect("meta.json is JSON")
}

/// A tiny synth shape, written afresh (the fixtures name its seed and fingerprint).
fn gate(shape: &str) {
    let dir = fixtures().join("reference").join(shape);
    let meta = read_meta(&dir);
    let seed = meta["seed"].as_u64().expect("seed");
    let ck = synth(shape, seed);
    assert_eq!(
        ck.fingerprint,
        meta["fingerprint"].as_str().expect("fingerprint"),
        "{shape}: fixtures stale: regenerate with tests/reference/make_fixtures.sh"
    );
    compare(shape, &load(&ck.dir), &dir, &meta);
}

/// The committed trained checkpoint (`tests/fixtures/trained/model`), fingerprinted the way
/// `k3d synth` and make_fixtures.py do (sha256 of the sorted sha256sum manifest).
#[test]
fn trained_matches_mlx() {
    let model_dir = fixtures().join("trained/model");
    let dir = fixtures().join("trained/reference");
    let meta = read_meta(&dir);
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&model_dir).expect("trained model dir") {
        let path = entry.expect("dir entry").path();
        let bytes = std::fs::read(&path).expect("model file");
        let digest: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let name = path
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .into_owned();
        files.push((name, digest));
    }
    assert_eq!(
        k3_engine::synth::content_sha256(&files),
        meta["fingerprint"].as_str().expect("fingerprint"),
        "trained: fixtures stale: regenerate with tools/train/make_trained.sh"
    );
    compare("trained", &load(&model_dir), &dir, &meta);
}

/// The trained reference's last prompt is a chat prompt (`tools/train/make_trained.sh` writes
/// it as text with the control strings and tokenises it with `k3d tokenize --specials`): it is
/// exactly what the template renders for its conversation (spec §8.2) — one tool declared,
/// thinking off, a user question, the generation prompt — so mlx-lm's reference covers the
/// model on a chat turn as the daemon builds it.
#[test]
fn trained_reference_chat_prompt_is_the_rendered_conversation() {
    use k3_engine::tokenizer::Tokenizer;
    use k3_engine::tokenizer::chat::{Conversation, Message, Role, Thinking, Tool, render};

    let model_dir = fixtures().join("trained/model");
    let meta = read_meta(&fixtures().join("trained/reference"));
    let prompts = meta["prompts"].as_array().expect("prompts");
    let reference = ids(prompts.last().expect("a prompt"), "prompt");
    let conversation = Conversation {
        messages: vec![Message::new(Role::User, "What's the weather in Paris?")],
        thinking: Thinking::Off,
        generation_prompt: true,
        tools: vec![Tool {
            name: "get_weather".into(),
            description: None,
            parameters: Some(serde_json::json!({
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            })),
        }],
        ..Conversation::default()
    };
    let tokenizer = Tokenizer::load(&model_dir).expect("the trained tokenizer");
    assert_eq!(
        render(&tokenizer, &conversation).expect("renders"),
        reference
    );
}

fn compare(shape: &str, model: &Model, dir: &Path, meta: &Value) {
    let vocab = model.config().vocab_size;
    assert_eq!(meta["vocab_size"].as_u64(), Some(vocab as u64));
    let n_gen = meta["gen_tokens"].as_u64().expect("gen_tokens") as usize;
    let prompts = meta["prompts"].as_array().expect("prompts");
    assert!(!prompts.is_empty());
    for (i, p) in prompts.iter().enumerate() {
        let prompt = ids(p, "prompt");
        let generated = ids(p, "generated");
        assert_eq!(generated.len(), n_gen);
        let mut fed = prompt.clone();
        fed.extend_from_slice(&generated[..n_gen - 1]);

        let raw = std::fs::read(dir.join(p["logits"].as_str().expect("logits file")))
            .expect("logits file");
        let reference: Vec<f32> = raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(
            reference.len(),
            fed.len() * vocab,
            "{shape} prompt {i}: rows"
        );

        let mut state = model.new_state();
        let ours = model
            .forward(&mut state, &fed, Logits::All, &no_cancel)
            .expect("forward");
        let err = gate_err(&ours, &reference);
        let max_ref = reference.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        println!(
            "{shape} prompt {i}: {} rows, max|ref| {max_ref:.3}, max|Δ|/max(1,max|ref|) = {err:.3e}",
            fed.len()
        );
        assert!(
            err <= 1e-4,
            "{shape} prompt {i}: logits differ by {err:.3e}"
        );
        for (r, (a, b)) in ours.chunks(vocab).zip(reference.chunks(vocab)).enumerate() {
            assert_eq!(
                argmax(a),
                argmax(b),
                "{shape} prompt {i}: argmax differs at row {r}"
            );
        }
        assert_eq!(
            greedy(model, &prompt, n_gen),
            generated,
            "{shape} prompt {i}: greedy continuation differs"
        );
    }
}

#[test]
fn tiny_matches_mlx() {
    gate("tiny");
}

#[test]
fn tiny_b_matches_mlx() {
    gate("tiny-b");
}

#[test]
fn tiny_c_matches_mlx() {
    gate("tiny-c");
}
