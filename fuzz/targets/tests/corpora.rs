//! Every committed seed (`fuzz/corpus/<target>/`) and crash-regression input
//! (`fuzz/regressions/<target>/`) through its fuzz target, as an ordinary test: a panic on
//! any of them fails the suite, with no fuzzer installed. A target without seeds fails too, so
//! a lost corpus cannot pass as a clean run.

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("corpus directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_committed_input_is_handled_without_panicking() {
    for &(name, body) in k3_fuzz::TARGETS {
        let [seeds, regressions] = k3_fuzz::corpus_dirs(&fuzz_dir(), name);
        let seeds = inputs(&seeds);
        assert!(!seeds.is_empty(), "target {name} has no seed corpus");
        for path in seeds.iter().chain(&inputs(&regressions)) {
            let data = std::fs::read(path).expect("corpus file reads");
            let run = std::panic::catch_unwind(|| body(&data));
            assert!(run.is_ok(), "target {name} panicked on {}", path.display());
        }
    }
}

#[test]
fn every_corpus_directory_names_a_target() {
    for kind in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(fuzz_dir().join(kind)) else {
            continue;
        };
        for entry in entries {
            let name = entry.expect("fuzz directory entry").file_name();
            let name = name.to_string_lossy();
            assert!(
                k3_fuzz::target(&name).is_some(),
                "fuzz/{kind}/{name} belongs to no target"
            );
        }
    }
}

/// The tokenizer targets pair a fuzzed file with the valid counterpart of the other one: the
/// `synth_tiny` seeds must be exactly those files, or every seed fails to load and the fuzzer
/// never reaches the tokenizer behind the loader (as happened with seeds learned with 128
/// merges beside a counterpart learned with 64).
#[test]
fn tokenizer_seeds_are_the_counterparts_the_targets_load_them_with() {
    let (model, config) = k3_fuzz::valid_tokenizer_files();
    let seed = |target: &str| {
        let [seeds, _] = k3_fuzz::corpus_dirs(&fuzz_dir(), target);
        std::fs::read(seeds.join("synth_tiny")).expect("synth_tiny seed reads")
    };
    assert!(
        seed("tiktoken_model") == model.as_bytes(),
        "fuzz/corpus/tiktoken_model/synth_tiny is not the target's valid tiktoken.model"
    );
    let json = |bytes: &[u8]| -> serde_json::Value {
        serde_json::from_slice(bytes).expect("tokenizer_config.json parses")
    };
    assert_eq!(
        json(&seed("tokenizer_config")),
        json(config),
        "fuzz/corpus/tokenizer_config/synth_tiny is not the target's valid tokenizer_config.json"
    );
}

/// The session seeds are files the loader accepts whole, so mutations start from the payload
/// decoder (snapshots, KDA and MLA layers) rather than from an early refusal (the first
/// snapshot seed lacked the three KDA conv histories and was refused as truncated).
#[test]
fn session_seeds_load_completely() {
    use k3_engine::session::file as session_file;
    let [seeds, _] = k3_fuzz::corpus_dirs(&fuzz_dir(), "session_file");
    let dir = tempfile::tempdir().expect("scratch directory");
    for seed in inputs(&seeds) {
        let data = std::fs::read(&seed).expect("seed reads");
        let bytes = k3_fuzz::session_file_bytes(&data).expect("seed has a mode byte");
        let path = dir.path().join("seed.k3s");
        std::fs::write(&path, bytes).expect("scratch file writes");
        let header = session_file::read_header(&path)
            .unwrap_or_else(|e| panic!("{}: header: {e}", seed.display()));
        if let Err(e) = session_file::load(&path, &header.fingerprint) {
            panic!("{}: {e}", seed.display());
        }
    }
}

/// The HTTP body seeds reach as far as their names say: the chat bodies (tools, tool results,
/// response formats), the completion bodies (text, ids) and the Anthropic messages bodies
/// (tool use and results, thinking, sampling) convert and validate, so mutations start deep in
/// the conversions and the template; `completion_ids` names an id beyond the synthetic
/// vocabulary (refused by validation), `completion_texts` two prompts and `messages_prefill` a
/// conversation ending in the assistant's turn (both refused by the conversion).
#[test]
fn http_seeds_reach_the_stage_their_names_say() {
    let [seeds, _] = k3_fuzz::corpus_dirs(&fuzz_dir(), "http_request");
    let seeds = inputs(&seeds);
    assert!(seeds.len() >= 9, "too few HTTP seeds: {seeds:?}");
    for seed in seeds {
        let name = seed.file_name().expect("a file name").to_string_lossy();
        let data = std::fs::read(&seed).expect("seed reads");
        let [chat, completion, messages] = k3_fuzz::http_request_reach(&data);
        let expected = match &*name {
            "completion_ids" => Some(false),
            // More than one prompt: refused by the conversion. (A conversation ending in the
            // assistant's turn, `messages_prefill`, is continued since issue 34.1: it reaches
            // the core like any other.)
            "completion_texts" => None,
            _ => Some(true),
        };
        let got = if name.starts_with("chat_") {
            chat
        } else if name.starts_with("messages_") {
            messages
        } else {
            completion
        };
        assert_eq!(got, expected, "fuzz/corpus/http_request/{name}");
    }
}
