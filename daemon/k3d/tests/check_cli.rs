//! `k3d check` (exit codes, one-line errors, the census as JSON) on tiny hand-written
//! checkpoints in the released layout and on every tiny synthetic shape. The tokenizer files,
//! accepted variants and FIFOs are in `inputs_cli.rs`.

#[path = "../../engine/tests/checkpoint_support/mod.rs"]
mod checkpoint_support;
mod cli_support;

use std::process::Command;

use checkpoint_support::*;
use cli_support::K3D;
use k3_engine::checkpoint::{Checkpoint, CheckpointError};

fn open(dir: &TempDir) -> Result<Checkpoint, CheckpointError> {
    Checkpoint::open(dir.path())
}

fn k3d_check(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(K3D)
        .arg("check")
        .args(args)
        .output()
        .expect("run k3d");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn k3d_check_exit_codes_and_output() {
    // A whole checkpoint (the tokenizer files included): OK, the census, and the tokenizer.
    let whole = temp_dir("whole");
    cli_support::synth("tiny", whole.path());
    let expected = open(&whole).expect("synth output binds").census;
    let w = whole.path().to_str().unwrap();
    let (code, stdout, stderr) = k3d_check(&[w]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("OK") && stdout.contains("per decoded token"),
        "{stdout}"
    );
    assert!(!stdout.contains("accepted variant"), "{stdout}");
    let (code, stdout, _) = k3d_check(&["--json", w]);
    assert_eq!(code, Some(0));
    let census: serde_json::Value = serde_json::from_str(&stdout).expect("--json prints JSON");
    assert_eq!(census["expert_bytes"], expected.expert_bytes);
    assert_eq!(census["moe_layers"], expected.moe_layers);
    assert_eq!(census["tokenizer"]["padding_rows"], 0);
    assert_eq!(census["accepted_variants"], serde_json::json!([]));

    // Shards and config without the tokenizer files: the files are checked first (below),
    // then the missing tokenizer is a checkpoint error.
    let dir = temp_dir("bin");
    write_tiny(dir.path());
    let d = dir.path().to_str().unwrap();
    let (code, _, stderr) = k3d_check(&[d]);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.contains("tiktoken.model"), "{stderr}");
    assert_eq!(stderr.matches("No such file").count(), 1, "{stderr}");

    // A corrupt shard: exit 3, one line naming the file.
    let shard = dir.path().join("model-00004-of-000010.safetensors");
    let size = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(size - 1)
        .unwrap();
    let (code, _, stderr) = k3d_check(&[d]);
    assert_eq!(code, Some(3), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("model-00004-of-000010.safetensors"),
        "{stderr}"
    );

    // A refused config: exit 2, one line naming the field (checked before the shards).
    let mut config = tiny_config();
    config["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("num_experts_per_token");
    write_config(dir.path(), &config);
    let (code, _, stderr) = k3d_check(&[d]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("text_config.num_experts_per_token: missing"),
        "{stderr}"
    );

    // A directory without a checkpoint: exit 3, the OS error said once.
    let empty = temp_dir("empty");
    let (code, _, stderr) = k3d_check(&[empty.path().to_str().unwrap()]);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.contains("config.json"), "{stderr}");
    assert_eq!(stderr.matches("No such file").count(), 1, "{stderr}");

    // Usage: no directory given.
    let (code, _, _) = k3d_check(&[]);
    assert_eq!(code, Some(2));
}

#[test]
fn k3d_check_accepts_every_tiny_synth_checkpoint() {
    for shape in ["tiny", "tiny-b", "tiny-c"] {
        let dir = temp_dir(shape);
        cli_support::synth(shape, dir.path());
        let d = dir.path().to_str().unwrap();
        let (code, stdout, stderr) = k3d_check(&["--json", d]);
        assert_eq!(code, Some(0), "check {shape}: {stderr}");
        let census: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let ck = open(&dir).expect("synth output binds");
        assert_eq!(census["trunk_bytes"], ck.census.trunk_bytes);
        // Every byte of every shard is accounted for by the binding.
        let data: u64 = ck.shards.iter().map(|s| s.data_len()).sum();
        assert_eq!(ck.census.text_bytes, data, "{shape}");
    }
}
