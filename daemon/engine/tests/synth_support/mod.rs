//! Shared by the engine tests that need a synthetic checkpoint on disk: synthesis through the
//! library (`k3_engine::synth`, the code behind `k3d synth`) and the budgets around a model's
//! minimum.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::Path;

/// Writes shape `shape` with seed 0 into `dir` (replacing what is there), exactly as
/// `k3d synth --shape SHAPE --seed 0 --force DIR` does; returns the checkpoint's
/// content digest ([`k3_engine::synth::content_sha256`]), which the fixtures record.
pub fn synth(shape: &str, dir: &Path) -> String {
    use k3_engine::synth::{blueprint, shape::Shape, write};
    let shape = Shape::named(shape).unwrap_or_else(|| panic!("unknown synth shape {shape:?}"));
    let plan = blueprint(&shape).expect("synth plan");
    write(&plan, dir, 0, true, &mut |_| {})
        .unwrap_or_else(|e| panic!("synthesising {} failed: {e}", dir.display()))
        .content_sha256
}

/// Default load options with a RAM budget of `ram` bytes.
pub fn ram_budget(ram: u64) -> k3_engine::model::LoadOptions {
    use k3_engine::model::LoadOptions;
    use k3_engine::plan::{Budget, PlanInputs};
    LoadOptions {
        plan: PlanInputs {
            budget: Budget {
                ram: Some(ram),
                ..Budget::default()
            },
            ..PlanInputs::default()
        },
        ..LoadOptions::default()
    }
}

/// The smallest RAM budget the plan accepts for `checkpoint` with default load options, in
/// bytes (from the refusal of a 1-byte budget).
pub fn minimum_budget(checkpoint: &k3_engine::checkpoint::Checkpoint) -> u64 {
    use k3_engine::plan::{Plan, PlanError};
    match Plan::for_model(&checkpoint.config, &checkpoint.layout, &ram_budget(1).plan) {
        Err(PlanError::BudgetTooSmall { needed, .. }) => needed,
        other => panic!("a 1-byte budget must be refused, got {other:?}"),
    }
}

/// `tiny` synthesised into a fresh temporary directory `k3d-NAME-*` (removed on drop) and
/// opened, with default load options at the smallest RAM budget its plan accepts plus one page,
/// so that every trunk layer but the largest streams.
pub fn tiny_at_minimum_budget(
    name: &str,
) -> (
    tempfile::TempDir,
    k3_engine::checkpoint::Checkpoint,
    k3_engine::model::LoadOptions,
) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("k3d-{name}-"))
        .tempdir()
        .expect("temp dir");
    synth("tiny", dir.path());
    let checkpoint = k3_engine::checkpoint::Checkpoint::open(dir.path()).expect("checkpoint");
    let options = ram_budget(minimum_budget(&checkpoint) + 4096);
    (dir, checkpoint, options)
}
