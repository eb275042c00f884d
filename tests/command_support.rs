//! Running the helper commands of a test: shared by the workspace end-to-end tests
//! (`tests/e2e_support.rs`) and the `k3d` crate's CLI tests (`daemon/k3d/tests/cli_support`), which
//! both include this file with `#[path]` — they are separate crates, and one file is what they
//! can share without a support crate of its own.

use std::path::Path;
use std::process::{Command, Output};

/// Runs `cmd` to completion and returns its output; a command that cannot start or that exits
/// unsuccessfully fails the test, naming the command and quoting its stderr.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `k3d synth --shape SHAPE --seed 0 --force DIR` through the real binary at `k3d`; returns the
/// checkpoint's content digest (what the reference fixtures record as `fingerprint`).
pub fn synth(k3d: &Path, shape: &str, dir: &Path) -> String {
    synth_printed(k3d, shape, dir, "content-sha256")
}

/// [`synth`], returning the value synth prints after `key` (`content-sha256`, `fingerprint`:
/// its line is `shape S seed N vocab V bytes B content-sha256 C fingerprint F`).
pub fn synth_printed(k3d: &Path, shape: &str, dir: &Path, key: &str) -> String {
    let out = run_ok(
        Command::new(k3d)
            .args(["synth", "--shape", shape, "--seed", "0", "--force"])
            .arg(dir),
    );
    let line = String::from_utf8(out.stdout).expect("synth prints UTF-8");
    let words: Vec<&str> = line.split_whitespace().collect();
    words
        .windows(2)
        .find(|w| w[0] == key)
        .map(|w| w[1].to_string())
        .unwrap_or_else(|| panic!("synth prints no {key}: {line}"))
}
