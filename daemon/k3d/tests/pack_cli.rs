//! `k3d pack` and `k3d verify --trunk-pack` as a user runs them (issue 31.1): a pack killed
//! midway resumes where it stopped and ends byte-identical to an uninterrupted one; the pack
//! verifies against the shards; a damaged byte makes `verify` fail with exit 3 naming the file,
//! tensor, block and offset; a pack of another checkpoint is refused; an existing output is not
//! replaced without `--force`.

mod cli_support;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use cli_support::{K3D, synth};

fn k3d(args: &[&str], paths: &[&Path]) -> Output {
    let mut cmd = Command::new(K3D);
    cmd.args(args);
    for p in paths {
        cmd.arg(p);
    }
    cmd.output().expect("k3d runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn an_interrupted_pack_resumes_and_ends_identical() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("small");
    synth("small", &model);
    let whole = dir.path().join("whole.k3pack");
    let out = k3d(&["pack"], &[&model, &whole]);
    assert!(out.status.success(), "{}", text(&out));

    // Stop a second run as soon as it has finished a tensor, then kill it.
    let resumed = dir.path().join("resumed.k3pack");
    let log = dir.path().join("resumed.k3pack.partial.log");
    let mut child = Command::new(K3D)
        .arg("pack")
        .arg(&model)
        .arg(&resumed)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("k3d pack starts");
    let start = Instant::now();
    while std::fs::read_to_string(&log).map_or(0, |t| t.lines().count()) < 1 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no tensor finished in 60 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("stop");
    let done_before_kill = std::fs::read_to_string(&log).unwrap().lines().count();
    child.kill().expect("kill");
    child.wait().expect("reaped");
    assert!(
        !resumed.exists(),
        "a killed pack leaves no file under the final name"
    );

    let out = k3d(&["pack"], &[&model, &resumed]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let kept: usize = said
        .split("tensors (")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no kept count in {said:?}"));
    assert!(
        kept >= 1 && kept >= done_before_kill.saturating_sub(1),
        "kept {kept} of the {done_before_kill} logged: {said}"
    );
    assert!(
        std::fs::read(&whole).unwrap() == std::fs::read(&resumed).unwrap(),
        "the resumed pack differs from the uninterrupted one"
    );
    assert!(
        !log.exists(),
        "the resume log is removed once the pack is complete"
    );

    let out = k3d(&["verify"], &[&model]);
    // No manifest in a synthesised directory: the manifest check fails, with usage exit 2.
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = Command::new(K3D)
        .arg("verify")
        .arg(&model)
        .arg("--trunk-pack")
        .arg(&resumed)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(": OK ("), "{}", text(&out));

    let out = k3d(&["pack"], &[&model, &resumed]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--force"), "{}", text(&out));
}

#[test]
fn damage_and_another_checkpoint_are_refused_with_exit_3() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("tiny");
    synth("tiny", &model);
    let pack = dir.path().join("tiny.k3pack");
    let out = k3d(&["pack"], &[&model, &pack]);
    assert!(out.status.success(), "{}", text(&out));

    let other = dir.path().join("tiny-b");
    synth("tiny-b", &other);
    let out = Command::new(K3D)
        .arg("verify")
        .arg(&other)
        .arg("--trunk-pack")
        .arg(&pack)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("another checkpoint"), "{}", text(&out));

    // A byte in the middle of the block data (past the 4096-byte header, before the index).
    let len = std::fs::metadata(&pack).unwrap().len();
    let at = 4096 + (len - 4096) / 3;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&pack)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x20], at).unwrap();
    drop(f);
    let out = Command::new(K3D)
        .arg("verify")
        .arg(&model)
        .arg("--trunk-pack")
        .arg(&pack)
        .output()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(3), "{said}");
    for needle in [
        pack.display().to_string(),
        "tensor ".into(),
        "block ".into(),
        "byte offset".into(),
    ] {
        assert!(said.contains(&needle), "{said:?} lacks {needle:?}");
    }
}
