//! Shared by the tests that drive the `k3d` binary: its path and `k3d synth`.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::Path;

/// The `k3d` binary cargo built for these tests.
pub const K3D: &str = env!("CARGO_BIN_EXE_k3d");

#[path = "../../../../tests/command_support.rs"]
pub mod command_support;

/// `k3d synth --shape SHAPE --seed 0 --force DIR`; returns the checkpoint's fingerprint.
pub fn synth(shape: &str, dir: &Path) -> String {
    command_support::synth(Path::new(K3D), shape, dir)
}
