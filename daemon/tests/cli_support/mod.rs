//! Shared by the tests that drive the `k3d` binary: its path and `k3d synth`.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::Path;
use std::process::Command;

/// The `k3d` binary cargo built for these tests.
pub const K3D: &str = env!("CARGO_BIN_EXE_k3d");

/// `k3d synth --shape SHAPE --seed 0 --force DIR`; returns the checkpoint's fingerprint.
pub fn synth(shape: &str, dir: &Path) -> String {
    let out = Command::new(K3D)
        .args(["synth", "--shape", shape, "--seed", "0", "--force"])
        .arg(dir)
        .output()
        .expect("run k3d synth");
    assert!(
        out.status.success(),
        "k3d synth failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).expect("utf-8");
    line.split_whitespace()
        .last()
        .expect("fingerprint")
        .to_string()
}

/// The smallest RAM budget the plan accepts for `checkpoint` with default load options, in
/// bytes (from the refusal of a 1-byte budget).
pub fn minimum_budget(checkpoint: &k3d::checkpoint::Checkpoint) -> u64 {
    use k3d::model::{LoadOptions, plan_for};
    use k3d::store::plan::{Budget, PlanError};
    let one_byte = LoadOptions {
        budget: Budget {
            ram: Some(1),
            ..Budget::default()
        },
        ..LoadOptions::default()
    };
    match plan_for(&checkpoint.config, &checkpoint.layout, &one_byte) {
        Err(PlanError::BudgetTooSmall { needed, .. }) => needed,
        other => panic!("a 1-byte budget must be refused, got {other:?}"),
    }
}
