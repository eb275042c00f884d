//! The trained fixture model (`tests/fixtures/trained/model`) through the `k3d` binary: what the
//! demo shows is in-domain text, and exact speculation on repetitive input accepts drafts while
//! giving plain greedy's ids.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

const K3D: &str = env!("CARGO_BIN_EXE_k3d");

fn trained_model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/trained/model")
}

fn k3d_run(args: &[&str]) -> Vec<u8> {
    let out = Command::new(K3D)
        .arg("run")
        .arg(trained_model())
        .args(args)
        .output()
        .expect("k3d runs");
    assert!(
        out.status.success(),
        "k3d run {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The demo's prompt and length (packaging/demo.sh: `def fibonacci(n):` + newline, 24 tokens),
/// and longer: valid UTF-8, no control bytes but newline and tab, no added-token text
/// (`<|reserved_token_…|>`, `[EOS]` …), no replacement characters, and Python-looking.
#[test]
fn demo_continuation_is_printable_in_domain_text() {
    for tokens in ["24", "120"] {
        let out = k3d_run(&["--prompt", "def fibonacci(n):\n", "--gen", tokens]);
        let text = String::from_utf8(out).expect("the continuation is UTF-8");
        assert!(
            text.chars()
                .all(|c| !c.is_control() || c == '\n' || c == '\t'),
            "control characters in {text:?}"
        );
        assert!(
            !text.contains('\u{FFFD}'),
            "replacement character in {text:?}"
        );
        for marker in ["<|", "|>", "[EOS]", "[BOS]", "[PAD]", "[UNK]"] {
            assert!(
                !text.contains(marker),
                "added-token text {marker} in {text:?}"
            );
        }
        assert!(
            text.contains("    ") && text.contains('\n'),
            "not shaped like Python source: {text:?}"
        );
    }
}

fn json_run(extra: &[&str]) -> Value {
    let mut args = vec!["--prompt", REPETITIVE, "--gen", "64", "--json"];
    args.extend_from_slice(extra);
    serde_json::from_slice(&k3d_run(&args)).expect("--json prints one JSON object")
}

/// A list echoed with a change: the continuation repeats what the context holds.
const REPETITIVE: &str = "names = [\n    'alpha',\n    'beta',\n    'gamma',\n    'delta',\n]\nnames = [\n    'alpha',\n    'beta',\n";

#[test]
fn speculation_on_repetitive_input_accepts_drafts_and_equals_plain_greedy() {
    let plain = json_run(&[]);
    let spec = json_run(&["--speculate", "4"]);
    assert_eq!(spec["generated_ids"], plain["generated_ids"]);
    assert_eq!(plain["drafts_proposed"], 0);
    let accepted = spec["drafts_accepted"].as_u64().expect("drafts_accepted");
    assert!(accepted > 0, "no draft accepted: {spec}");
}
