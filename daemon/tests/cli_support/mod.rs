//! Shared by the tests that drive the `k3d` binary: its path and `k3d synth`.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};

/// The `k3d` binary cargo built for these tests.
pub const K3D: &str = env!("CARGO_BIN_EXE_k3d");

#[path = "../../../tests/command_support.rs"]
pub mod command_support;

/// `k3d synth --shape SHAPE --seed 0 --force DIR`; returns the checkpoint's fingerprint.
pub fn synth(shape: &str, dir: &Path) -> String {
    command_support::synth(Path::new(K3D), shape, dir)
}

/// Default load options with a RAM budget of `ram` bytes.
pub fn ram_budget(ram: u64) -> k3d::model::LoadOptions {
    use k3d::model::LoadOptions;
    use k3d::store::plan::Budget;
    LoadOptions {
        budget: Budget {
            ram: Some(ram),
            ..Budget::default()
        },
        ..LoadOptions::default()
    }
}

/// The smallest RAM budget the plan accepts for `checkpoint` with default load options, in
/// bytes (from the refusal of a 1-byte budget).
pub fn minimum_budget(checkpoint: &k3d::checkpoint::Checkpoint) -> u64 {
    use k3d::model::plan_for;
    use k3d::store::plan::PlanError;
    match plan_for(&checkpoint.config, &checkpoint.layout, &ram_budget(1)) {
        Err(PlanError::BudgetTooSmall { needed, .. }) => needed,
        other => panic!("a 1-byte budget must be refused, got {other:?}"),
    }
}

/// `tiny` synthesised into a fresh temporary directory `k3d-NAME-PID` and opened, with default
/// load options at the smallest RAM budget its plan accepts plus one page, so that every trunk
/// layer but the largest streams.
pub fn tiny_at_minimum_budget(
    name: &str,
) -> (
    PathBuf,
    k3d::checkpoint::Checkpoint,
    k3d::model::LoadOptions,
) {
    let dir = std::env::temp_dir().join(format!("k3d-{name}-{}", std::process::id()));
    synth("tiny", &dir);
    let checkpoint = k3d::checkpoint::Checkpoint::open(&dir).expect("checkpoint");
    let options = ram_budget(minimum_budget(&checkpoint) + 4096);
    (dir, checkpoint, options)
}
