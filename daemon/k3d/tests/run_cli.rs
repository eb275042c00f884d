//! `k3d run` as scripts and benchmarks use it: the real binary on `k3d synth` checkpoints,
//! checked against the mlx-lm reference fixtures (`tests/fixtures/reference`), and its output
//! contract (`--json` fields, `--dump-logits` rows) pinned.

use std::path::{Path, PathBuf};
use std::process::Command;

mod cli_support;
use cli_support::command_support::run_ok;
use cli_support::{K3D, synth};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/reference")
}

struct Run {
    json: serde_json::Value,
    logits: Vec<f32>,
}

fn run(dir: &Path, ids: &[u64], generate: usize, extra: &[&str]) -> Run {
    let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
    let dump = dir.join(format!("logits-{}-{}.f32", generate, extra.join("_")));
    let out = run_ok(
        Command::new(K3D)
            .arg("run")
            .arg(dir)
            .args([
                "--ids",
                &ids.join(","),
                "--gen",
                &generate.to_string(),
                "--json",
                "--dump-logits",
            ])
            .arg(&dump)
            .args(extra),
    );
    let json = serde_json::from_slice(&out.stdout).expect("k3d run --json prints one JSON object");
    let bytes = std::fs::read(&dump).expect("logits file");
    let logits = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Run { json, logits }
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id"))
        .collect()
}

/// Greedy ids equal mlx-lm's exactly; logits within 1e-4 relative (spec §6.2 gate).
#[test]
fn k3d_run_matches_the_mlx_reference_on_every_tiny_shape() {
    for shape in ["tiny", "tiny-b", "tiny-c"] {
        let meta: serde_json::Value = serde_json::from_slice(
            &std::fs::read(fixtures().join(shape).join("meta.json")).expect("fixture meta.json"),
        )
        .expect("meta.json parses");
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("model");
        let fingerprint = synth(shape, &dir);
        assert_eq!(
            fingerprint,
            meta["fingerprint"].as_str().unwrap_or_default(),
            "fixtures stale: regenerate with tests/reference/make_fixtures.sh"
        );
        let vocab = meta["vocab_size"].as_u64().expect("vocab") as usize;
        for prompt in meta["prompts"].as_array().expect("prompts") {
            let expected = ids(&prompt["generated"]);
            let r = run(&dir, &ids(&prompt["prompt"]), expected.len(), &[]);
            assert_eq!(
                ids(&r.json["generated_ids"]),
                expected,
                "{shape}: greedy ids differ from mlx-lm"
            );
            let reference: Vec<f32> = std::fs::read(
                fixtures()
                    .join(shape)
                    .join(prompt["logits"].as_str().expect("name")),
            )
            .expect("fixture logits")
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
            assert_eq!(
                r.logits.len(),
                reference.len(),
                "{shape}: dump rows differ from prompt_len + gen − 1"
            );
            assert_eq!(r.logits.len() % vocab, 0);
            let scale = reference.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            let worst = r
                .logits
                .iter()
                .zip(&reference)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            eprintln!(
                "{shape}: max |Δ| / max(1, max|ref|) = {:.2e}",
                worst / scale
            );
            assert!(
                worst <= 1e-4 * scale,
                "{shape}: logits differ from mlx-lm by {worst}"
            );
        }
    }
}

/// Output does not depend on threads or prefill chunking: ids and logit bytes identical.
#[test]
fn k3d_run_is_bit_identical_across_threads_and_prefill_chunks() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("model");
    synth("tiny-b", &dir);
    let prompt = [5u64, 17, 300, 42, 9, 101, 7, 64, 64, 3];
    let base = run(
        &dir,
        &prompt,
        10,
        &["--threads", "1", "--prefill-chunk", "1"],
    );
    for extra in [
        ["--threads", "2", "--prefill-chunk", "32"],
        ["--threads", "2", "--prefill-chunk", "3"],
    ] {
        let other = run(&dir, &prompt, 10, &extra);
        assert_eq!(
            ids(&base.json["generated_ids"]),
            ids(&other.json["generated_ids"])
        );
        let same = base
            .logits
            .iter()
            .zip(&other.logits)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same && base.logits.len() == other.logits.len(),
            "logit bytes differ for {extra:?}"
        );
    }
}

/// `--json` carries the documented fields; `--gen 0` dumps exactly one row per prompt token.
#[test]
fn k3d_run_json_fields_and_gen_zero_rows() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("model");
    synth("tiny", &dir);
    let r = run(&dir, &[1, 2, 3, 4], 0, &[]);
    for field in [
        "prompt_ids",
        "generated_ids",
        "seconds_per_token",
        "peak_rss_bytes",
        "bytes_read",
        "bytes_avoided",
    ] {
        assert!(
            r.json.get(field).is_some(),
            "--json lacks {field}: {}",
            r.json
        );
    }
    assert_eq!(ids(&r.json["generated_ids"]), Vec::<u64>::new());
    assert_eq!(r.logits.len(), 4 * 640, "--gen 0 must dump prompt_len rows");
}

/// Bad input: exit codes and one-line errors, never a panic.
#[test]
fn k3d_run_refuses_bad_input_with_documented_exit_codes() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("model");
    synth("tiny", &dir);
    let status = |args: &[&str]| {
        let out = Command::new(K3D)
            .arg("run")
            .arg(&dir)
            .args(args)
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains("panicked"), "k3d panicked: {stderr}");
        (out.status.code(), stderr)
    };
    let (code, err) = status(&["--ids", "1,99999", "--gen", "1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("99999") && err.contains("vocabulary"), "{err}");
    let (code, err) = status(&["--ids", "1", "--gen", "999999999"]);
    assert_eq!(code, Some(2), "{err}");
    // A truncated shard is a checkpoint error (exit 3) naming the file.
    let shard = dir.join("model-00002-of-000010.safetensors");
    let len = std::fs::metadata(&shard).expect("shard exists").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .expect("open shard");
    f.set_len(len / 2).expect("truncate");
    let (code, err) = status(&["--ids", "1,2", "--gen", "1"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("model-00002-of-000010.safetensors"), "{err}");
}
