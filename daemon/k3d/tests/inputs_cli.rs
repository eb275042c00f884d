//! A checkpoint's inputs through the real binary (issue #19): the tokenizer files against
//! `vocab_size`, malformed tokenizer files (checkpoint errors, exit 3), the accepted variants
//! `k3d check` reports, error chains that say each cause once, a FIFO where a shard should be,
//! and the bounds of `--threads`.

mod cli_support;
#[path = "../../engine/tests/variant_support/mod.rs"]
mod variant_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use cli_support::{K3D, synth};
use k3_engine::checkpoint::safetensors::Dtype;

/// A finished `k3d` run: exit code, stdout, stderr.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Ran {
    /// The one error line of a run that exited with `code` (`k3d run` prints its plan to
    /// stderr before it loads anything).
    fn failed(&self, code: i32) -> &str {
        assert_eq!(self.code, Some(code), "stderr: {}", self.stderr);
        let errors: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| l.starts_with("k3d: error:") || l.starts_with("error:"))
            .collect();
        assert_eq!(errors.len(), 1, "{}", self.stderr);
        errors[0]
    }

    fn ok(&self) -> &str {
        assert_eq!(self.code, Some(0), "stderr: {}", self.stderr);
        &self.stdout
    }
}

/// Runs `k3d ARGS`; a run that has not exited after 60 s is killed and fails the test (a FIFO
/// opened for reading would block forever).
fn k3d(args: &[&str]) -> Ran {
    let mut child = Command::new(K3D)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn k3d");
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("k3d {args:?} still running after 60 s: it blocked");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("k3d output");
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn check(dir: &Path, json: bool) -> Ran {
    let d = dir.to_str().unwrap();
    k3d(&if json {
        vec!["check", "--json", d]
    } else {
        vec!["check", d]
    })
}

fn run(dir: &Path) -> Ran {
    k3d(&[
        "run",
        dir.to_str().unwrap(),
        "--prompt",
        "def f(x):",
        "--gen",
        "2",
    ])
}

/// Rewrites the tokenizer files of `dir` with `delta` ranks fewer (negative: the highest ranks
/// dropped) or more (new byte strings appended); the added tokens move with the first added id.
fn resize_tokenizer(dir: &Path, delta: i64) {
    let model = std::fs::read_to_string(dir.join("tiktoken.model")).unwrap();
    let mut lines: Vec<String> = model.lines().map(str::to_owned).collect();
    if delta < 0 {
        lines.truncate(lines.len() - delta.unsigned_abs() as usize);
    } else {
        let b64 = base64::engine::general_purpose::STANDARD;
        for i in 0..delta {
            let rank = lines.len();
            lines.push(format!(
                "{} {rank}",
                b64.encode(format!("\u{1}extra rank {i}"))
            ));
        }
    }
    std::fs::write(dir.join("tiktoken.model"), lines.join("\n") + "\n").unwrap();
    let path = dir.join("tokenizer_config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let decoder = config["added_tokens_decoder"].as_object().unwrap().clone();
    let shifted: serde_json::Map<String, serde_json::Value> = decoder
        .into_iter()
        .map(|(id, entry)| ((id.parse::<i64>().unwrap() + delta).to_string(), entry))
        .collect();
    config["added_tokens_decoder"] = shifted.into();
    std::fs::write(&path, config.to_string()).unwrap();
}

fn synth_tiny(root: &Path) -> std::path::PathBuf {
    let dir = root.join("model");
    synth("tiny", &dir);
    dir
}

#[test]
fn fewer_tokenizer_ids_than_rows_load_and_more_is_a_checkpoint_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = synth_tiny(tmp.path());
    resize_tokenizer(&dir, -3);
    let out = check(&dir, false);
    assert!(
        out.ok().contains("accepted variant: 3 padding row(s)"),
        "{}",
        out.stdout
    );
    let json: serde_json::Value = serde_json::from_str(check(&dir, true).ok()).unwrap();
    assert_eq!(json["tokenizer"]["padding_rows"], 3);
    run(&dir).ok();

    resize_tokenizer(&dir, 3 + 2);
    for out in [check(&dir, false), run(&dir)] {
        let err = out.failed(3);
        assert!(
            err.contains("tiktoken.model") && err.contains("vocab_size") && err.contains("ids"),
            "{err}"
        );
    }
}

#[test]
fn malformed_or_missing_tokenizer_files_are_checkpoint_errors_said_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = synth_tiny(tmp.path());
    let model = dir.join("tiktoken.model");
    let config = dir.join("tokenizer_config.json");
    let good_model = std::fs::read(&model).unwrap();
    let good_config = std::fs::read(&config).unwrap();

    let mut lines: Vec<&[u8]> = good_model.split(|&b| b == b'\n').collect();
    lines[6] = b"%%% 6";
    std::fs::write(&model, lines.join(&b'\n')).unwrap();
    for out in [check(&dir, false), run(&dir)] {
        assert!(
            out.failed(3).contains("tiktoken.model:7: bad base64"),
            "{}",
            out.stderr
        );
    }
    std::fs::write(&model, &good_model).unwrap();

    std::fs::write(&config, b"{\"added_tokens_decoder\": ").unwrap();
    for out in [check(&dir, false), run(&dir)] {
        let err = out.failed(3);
        assert!(err.contains("tokenizer_config.json: invalid JSON"), "{err}");
    }
    std::fs::write(&config, &good_config).unwrap();

    // The case: a missing tiktoken.model said "No such file or directory" three times.
    std::fs::remove_file(&model).unwrap();
    for out in [check(&dir, false), run(&dir)] {
        let err = out.failed(3);
        assert!(err.contains(&model.display().to_string()), "{err}");
        assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    }
}

#[test]
fn check_reports_the_accepted_variants() {
    let tmp = tempfile::tempdir().unwrap();
    let original = synth_tiny(tmp.path());
    let converted_dir = tmp.path().join("f32-vectors");
    let converted = variant_support::convert(&original, &converted_dir, Dtype::F32);
    assert!(converted > 10, "only {converted} vectors converted");
    let out = check(&converted_dir, false);
    let expected = format!(
        "accepted variant: {converted} small vector(s) stored F32 where the release stores BF16 \
         (widened exactly to f32; e.g. "
    );
    assert!(out.ok().contains(&expected), "{}", out.stdout);
    let json: serde_json::Value = serde_json::from_str(check(&converted_dir, true).ok()).unwrap();
    let variants = json["accepted_variants"].as_array().unwrap();
    assert_eq!(variants.len(), 1, "{variants:?}");
    assert_eq!(variants[0]["stored_dtype"], "F32");
    assert_eq!(variants[0]["release_dtype"], "BF16");
    assert_eq!(variants[0]["tensors"], converted);
    // The released layout itself uses no variant.
    let json: serde_json::Value = serde_json::from_str(check(&original, true).ok()).unwrap();
    assert_eq!(json["accepted_variants"], serde_json::json!([]));
}

#[test]
fn a_fifo_shard_is_refused_without_blocking() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = synth_tiny(tmp.path());
    let shard = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .expect("a shard");
    std::fs::remove_file(&shard).unwrap();
    nix::unistd::mkfifo(&shard, nix::sys::stat::Mode::S_IRWXU).unwrap();
    for out in [check(&dir, false), run(&dir)] {
        let err = out.failed(3);
        assert!(
            err.contains(&shard.display().to_string())
                && err.contains("a FIFO, not a regular file"),
            "{err}"
        );
    }
}

#[test]
fn threads_outside_1_to_1024_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("not-loaded");
    let d = dir.to_str().unwrap();
    for n in ["0", "100000", "1025"] {
        for args in [
            vec!["run", d, "--ids", "1", "--threads", n],
            vec!["bench", d, "--ram-gb", "1", "--threads", n],
            vec!["verify", d, "--threads", n],
            vec!["serve", "--model", d, "--threads", n],
        ] {
            let out = k3d(&args);
            assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
            assert!(
                out.stderr.contains("use 1 to 1024"),
                "{args:?}: {}",
                out.stderr
            );
        }
    }
    // The same bound for `threads` in a --config file.
    let config = tmp.path().join("k3d.toml");
    std::fs::write(&config, format!("model = {d:?}\nthreads = 100000\n")).unwrap();
    let out = k3d(&["serve", "--config", config.to_str().unwrap()]);
    assert!(out.failed(2).contains("use 1 to 1024"), "{}", out.stderr);
}
