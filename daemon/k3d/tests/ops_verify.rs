//! `k3d verify` on a tiny synthetic checkpoint: a written manifest agrees with coreutils'
//! `sha256sum -c`; one flipped byte fails with exit 3 naming the file and both digests; a
//! re-run skips the files already verified and unchanged, and re-hashes a changed one.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const K3D: &str = env!("CARGO_BIN_EXE_k3d");

struct Case {
    dir: tempfile::TempDir,
    model: PathBuf,
    state: PathBuf,
}

impl Case {
    fn new(name: &str) -> Case {
        let dir = tempfile::Builder::new()
            .prefix(&format!("k3-ops-verify-{name}-"))
            .tempdir()
            .unwrap();
        let model = dir.path().join("tiny");
        let out = Command::new(K3D)
            .args(["synth", "--shape", "tiny"])
            .arg(&model)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "synth: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Case {
            state: dir.path().join("state"),
            dir,
            model,
        }
    }

    fn verify(&self, extra: &[&str]) -> (i32, String, String) {
        let out: Output = Command::new(K3D)
            .arg("verify")
            .arg(&self.model)
            .args(extra)
            .env("XDG_STATE_HOME", &self.state)
            .output()
            .unwrap();
        (
            out.status.code().expect("exited"),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn shards(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.model)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".safetensors"))
            .collect();
        v.sort();
        v
    }
}

fn flip_byte(path: &Path, at: usize) -> Vec<u8> {
    let original = std::fs::read(path).unwrap();
    let mut bytes = original.clone();
    bytes[at] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
    original
}

fn line_for<'a>(stdout: &'a str, name: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(&format!("{name}: ")))
        .unwrap_or_else(|| panic!("no line for {name} in\n{stdout}"))
}

#[test]
fn written_manifest_matches_sha256sum_and_covers_every_file() {
    let case = Case::new("write");
    let (code, _, err) = case.verify(&["--write-manifest", "--threads", "2"]);
    assert_eq!(code, 0, "{err}");
    let manifest = std::fs::read_to_string(case.model.join("SHA256SUMS")).unwrap();
    let names: Vec<&str> = manifest.lines().map(|l| &l[66..]).collect();
    for must in [
        "config.json",
        "model.safetensors.index.json",
        "tiktoken.model",
        "tokenizer_config.json",
    ] {
        assert!(names.contains(&must), "{must} not in manifest:\n{manifest}");
    }
    for s in case.shards() {
        assert!(names.contains(&s.as_str()), "{s} not in manifest");
    }
    // An independent implementation agrees with every digest.
    let check = Command::new("sha256sum")
        .args(["-c", "--strict", "SHA256SUMS"])
        .current_dir(&case.model)
        .output()
        .expect("sha256sum (coreutils) is needed for this test");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    // Refuses to overwrite.
    let (code, _, err) = case.verify(&["--write-manifest"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn flipped_byte_exits_3_naming_file_and_both_hashes_and_resume_skips_verified_files() {
    let case = Case::new("flip");
    assert_eq!(case.verify(&["--write-manifest"]).0, 0);
    let shards = case.shards();
    let victim = &shards[3];
    let original = flip_byte(&case.model.join(victim), 4000);

    let (code, out, err) = case.verify(&["--threads", "2"]);
    assert_eq!(code, 3, "stdout:\n{out}\nstderr:\n{err}");
    let line = line_for(&out, victim);
    let manifest = std::fs::read_to_string(case.model.join("SHA256SUMS")).unwrap();
    let expected = &manifest
        .lines()
        .find(|l| l.ends_with(victim.as_str()))
        .unwrap()[..64];
    assert!(
        line.starts_with(&format!("{victim}: MISMATCH expected {expected} actual ")),
        "{line}"
    );
    let actual = line.rsplit(' ').next().unwrap();
    assert_eq!(actual.len(), 64);
    assert_ne!(actual, expected);
    assert!(err.contains("1 listed file(s) missing or corrupt"), "{err}");
    for s in shards.iter().filter(|s| *s != victim) {
        assert_eq!(line_for(&out, s), format!("{s}: OK"));
    }

    // Restore the bytes (new mtime): only that file is hashed again; the rest resume.
    std::fs::write(case.model.join(victim), original).unwrap();
    let (code, out, err) = case.verify(&[]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(line_for(&out, victim), format!("{victim}: OK"));
    let victim_size = std::fs::metadata(case.model.join(victim)).unwrap().len();
    for s in shards.iter().filter(|s| *s != victim) {
        assert_eq!(
            line_for(&out, s),
            format!("{s}: OK (verified earlier, unchanged since)")
        );
    }
    assert!(
        err.contains(&format!("{:.2} GB in", victim_size as f64 / 1e9)) && err.contains("1 hashed"),
        "only the restored file was hashed: {err}"
    );

    // Everything verified now: a third run hashes nothing.
    let (code, out, err) = case.verify(&[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .all(|l| l.ends_with("(verified earlier, unchanged since)")),
        "{out}"
    );
    assert!(err.contains("0 hashed"), "{err}");

    // A changed file whose size and mtime are back where they were would be trusted; one whose
    // contents change normally gets a new mtime and is hashed again, and caught.
    flip_byte(&case.model.join(victim), 10);
    let (code, out, _) = case.verify(&[]);
    assert_eq!(code, 3);
    assert!(line_for(&out, victim).contains("MISMATCH"));
}

#[test]
fn missing_and_unlisted_files_exit_3() {
    let case = Case::new("missing");
    assert_eq!(case.verify(&["--write-manifest"]).0, 0);
    let shards = case.shards();
    std::fs::rename(case.model.join(&shards[0]), case.dir.path().join("moved")).unwrap();
    let (code, out, _) = case.verify(&[]);
    assert_eq!(code, 3);
    assert_eq!(
        line_for(&out, &shards[0]),
        format!("{}: MISSING", shards[0])
    );

    std::fs::rename(case.dir.path().join("moved"), case.model.join(&shards[0])).unwrap();
    std::fs::write(case.model.join("model-extra.safetensors"), b"x").unwrap();
    let (code, out, _) = case.verify(&[]);
    assert_eq!(code, 3);
    assert_eq!(
        line_for(&out, "model-extra.safetensors"),
        "model-extra.safetensors: NOT IN MANIFEST"
    );
}

#[test]
fn manifest_problems_are_usage_errors() {
    let case = Case::new("usage");
    let (code, _, err) = case.verify(&[]);
    assert_eq!(code, 2);
    assert!(err.contains("--write-manifest"), "{err}");
    let bad = case.dir.path().join("bad.sums");
    std::fs::write(&bad, "nothex  config.json\n").unwrap();
    let (code, _, err) = case.verify(&["--manifest", bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("bad.sums:1:"), "{err}");
}
