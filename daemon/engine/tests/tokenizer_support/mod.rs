//! Shared helpers of the tokenizer tests: fixture paths, the real rank files from the
//! tiktoken-rs dev-dependency, scratch directories and vocabularies built on the fly.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer")
}

/// A real rank file (`o200k_base.tiktoken`, `cl100k_base.tiktoken`) from the tiktoken-rs
/// crate's sources, located with `cargo metadata`. Panics loudly when it cannot be found:
/// the parity tests must not pass without their vocabulary.
pub fn tiktoken_asset(name: &str) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    // Only the host's packages are in the registry on a fresh machine (cargo downloads what the
    // build needs): without the filter, an offline `cargo metadata` wants every platform's.
    let host = Command::new(&cargo)
        .arg("-vV")
        .output()
        .expect("running cargo -vV");
    let host = String::from_utf8_lossy(&host.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("cargo -vV names the host triple");
    let output = Command::new(&cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
            &host,
            "--manifest-path",
        ])
        .arg(&manifest)
        .output()
        .expect("running cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&output.stdout).expect("metadata JSON");
    let package = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == "tiktoken-rs")
        .expect("tiktoken-rs is not in the dependency graph (it is a dev-dependency of k3-engine)");
    let dir = Path::new(package["manifest_path"].as_str().expect("manifest_path"))
        .parent()
        .expect("crate dir")
        .join("assets");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: the tiktoken-rs sources must be in the cargo registry",
        path.display()
    );
    path
}

/// A fresh empty scratch directory for one test, removed on drop.
pub fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("k3-tokenizer-{name}-"))
        .tempdir()
        .expect("scratch dir")
}

pub fn read_ids(path: &Path) -> Vec<u32> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .split_whitespace()
        .map(|s| s.parse().expect("id"))
        .collect()
}

/// Single bytes in the GPT-2 order K3 uses (`!` = 0, `"` = 1, `.` = 13, `a` = 64).
pub fn gpt2_byte_order() -> Vec<u8> {
    let mut order: Vec<u8> = (b'!'..=b'~')
        .chain(0xa1..=0xac)
        .chain(0xae..=0xff)
        .collect();
    let rest: Vec<u8> = (0..=255u8).filter(|b| !order.contains(b)).collect();
    order.extend(rest);
    order
}

/// Writes `tokens` (rank = index) as a tiktoken.model file.
pub fn write_model(path: &Path, tokens: &[Vec<u8>]) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let text: String = tokens
        .iter()
        .enumerate()
        .map(|(rank, t)| format!("{} {rank}\n", b64.encode(t)))
        .collect();
    std::fs::write(path, text).expect("write tiktoken.model");
}

/// K3's added-token table (spec §7.2) for ids 163,584.., as committed in the fixtures.
pub fn k3_config() -> PathBuf {
    fixtures().join("k3/tokenizer_config.json")
}
