//! `k3d tokenize` / `k3d detokenize`: the stdin/stdout contract scripts rely on, exit 2 with a
//! located message for bad input and exit 3 for bad tokenizer files (a checkpoint error).

#[path = "../../engine/tests/tokenizer_support/mod.rs"]
mod tokenizer_support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use k3_engine::tokenizer::{Specials, Tokenizer};
use tokenizer_support::{fixtures, scratch};

fn k3d(args: &[&str], dir: &Path, stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_k3d"))
        .args(args)
        .arg("--tok")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn k3d");
    // k3d may reject its arguments and exit before reading stdin: a broken pipe is fine.
    match child.stdin.take().unwrap().write_all(stdin) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("stdin: {e}"),
        _ => {}
    }
    child.wait_with_output().expect("k3d output")
}

fn tiny_dir() -> std::path::PathBuf {
    fixtures().join("tiny")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "k3d failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("UTF-8 stdout")
}

/// The stderr of a run that failed with exit `code`, in one line.
fn failed(out: &Output, code: i32) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr
}

fn usage_error(out: &Output) -> String {
    failed(out, 2)
}

fn checkpoint_error(out: &Output) -> String {
    failed(out, 3)
}

#[test]
fn tokenize_plain_json_and_specials() {
    let t = Tokenizer::load(&tiny_dir()).unwrap();
    let text = "hello world <|open|> 中文\n";
    let plain = t.encode(text, Specials::Plain).unwrap();
    let expected: Vec<String> = plain.iter().map(u32::to_string).collect();
    let out = ok(&k3d(&["tokenize"], &tiny_dir(), text.as_bytes()));
    assert_eq!(out, expected.join(" ") + "\n");
    let out = ok(&k3d(&["tokenize", "--json"], &tiny_dir(), text.as_bytes()));
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json, serde_json::json!({ "ids": plain }));
    assert_eq!(out.lines().count(), 1);
    let out = ok(&k3d(
        &["tokenize", "--specials"],
        &tiny_dir(),
        text.as_bytes(),
    ));
    let ids: Vec<u32> = out.split_whitespace().map(|s| s.parse().unwrap()).collect();
    assert_eq!(ids, t.encode(text, Specials::Recognised).unwrap());
    assert!(ids.contains(&t.controls().open));
    assert!(!plain.contains(&t.controls().open));
    assert_eq!(ok(&k3d(&["tokenize"], &tiny_dir(), b"")), "\n");
}

#[test]
fn detokenize_writes_exact_bytes() {
    let t = Tokenizer::load(&tiny_dir()).unwrap();
    let text = std::fs::read_to_string(fixtures().join("o200k/corpus.txt")).unwrap();
    let ids = t.encode(&text, Specials::Plain).unwrap();
    // Mixed separators: commas, spaces, newlines, tabs.
    let input: String = ids
        .iter()
        .enumerate()
        .map(|(i, id)| format!("{id}{}", [",", " ", "\n", ", ", "\t"][i % 5]))
        .collect();
    let out = k3d(&["detokenize"], &tiny_dir(), input.as_bytes());
    assert!(out.status.success());
    assert_eq!(out.stdout, text.as_bytes());
    // Ids may decode to bytes that are not UTF-8 on their own: written exactly.
    let e4 = (0..t.rank_count() as u32)
        .find(|&i| t.token_bytes(i) == Some(&[0xe4][..]))
        .unwrap();
    let out = k3d(&["detokenize"], &tiny_dir(), e4.to_string().as_bytes());
    assert_eq!(out.stdout, [0xe4]);
}

#[test]
fn invalid_utf8_on_stdin_exits_2_with_offset() {
    let err = usage_error(&k3d(&["tokenize"], &tiny_dir(), b"abc\xffdef"));
    assert!(
        err.contains("not valid UTF-8") && err.contains("offset 3"),
        "{err}"
    );
}

#[test]
fn unparsable_id_exits_2_with_offset() {
    let err = usage_error(&k3d(&["detokenize"], &tiny_dir(), b"12, 7x 3"));
    assert!(err.contains("offset 4") && err.contains("\"7x\""), "{err}");
    let err = usage_error(&k3d(&["detokenize"], &tiny_dir(), b"1 -2"));
    assert!(err.contains("offset 2"), "{err}");
}

#[test]
fn unknown_id_exits_2_with_position() {
    let err = usage_error(&k3d(&["detokenize"], &tiny_dir(), b"1 2 99999"));
    assert!(err.contains("99999") && err.contains("position 2"), "{err}");
}

#[test]
fn malformed_model_exits_3_with_line() {
    let tmp = scratch("cli-badmodel");
    let dir = tmp.path();
    let model = std::fs::read_to_string(tiny_dir().join("tiktoken.model")).unwrap();
    let mut lines: Vec<&str> = model.lines().collect();
    lines[6] = "%%% 6";
    std::fs::write(dir.join("tiktoken.model"), lines.join("\n")).unwrap();
    std::fs::copy(
        tiny_dir().join("tokenizer_config.json"),
        dir.join("tokenizer_config.json"),
    )
    .unwrap();
    let err = checkpoint_error(&k3d(&["tokenize"], dir, b"x"));
    assert!(err.contains("tiktoken.model:7: bad base64"), "{err}");
}

#[test]
fn added_id_outside_vocabulary_exits_3() {
    let tmp = scratch("cli-badadded");
    let dir = tmp.path();
    std::fs::copy(
        tiny_dir().join("tiktoken.model"),
        dir.join("tiktoken.model"),
    )
    .unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"added_tokens_decoder": {"900000": {"content": "<|x|>"}}}"#,
    )
    .unwrap();
    let err = checkpoint_error(&k3d(&["detokenize"], dir, b"1"));
    assert!(
        err.contains("\"900000\"") && err.contains("outside"),
        "{err}"
    );
}

#[test]
fn missing_model_file_exits_3_saying_the_os_error_once() {
    let tmp = scratch("cli-nomodel");
    let dir = tmp.path();
    std::fs::copy(
        tiny_dir().join("tokenizer_config.json"),
        dir.join("tokenizer_config.json"),
    )
    .unwrap();
    let err = checkpoint_error(&k3d(&["tokenize"], dir, b"x"));
    assert!(err.contains("tiktoken.model"), "{err}");
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}
