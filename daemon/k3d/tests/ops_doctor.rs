//! `k3d doctor` on this machine and on a tiny synthetic checkpoint: machine facts, a real read
//! measurement, the index cross-check and a budget recommendation; a missing shard is named
//! and fails with exit 3.

use std::process::Command;

const K3D: &str = env!("CARGO_BIN_EXE_k3d");

fn doctor(args: &[&str]) -> (i32, serde_json::Value, String) {
    let out = Command::new(K3D).arg("doctor").args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --json printed no JSON ({e}): {stderr}"));
    (out.status.code().expect("exited"), json, stderr)
}

/// A tiny checkpoint in a fresh temporary directory of its own, removed on drop.
fn tiny(name: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix(&format!("k3-ops-doctor-{name}-"))
        .tempdir()
        .unwrap();
    let out = Command::new(K3D)
        .args(["synth", "--shape", "tiny"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    dir
}

#[test]
fn machine_only() {
    let (code, j, err) = doctor(&["--json"]);
    assert_eq!(code, 0, "{err}");
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total_kb: u64 = meminfo
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(j["memory"]["total"].as_u64(), Some(total_kb * 1024));
    assert!(j["memory"]["available"].as_u64().unwrap() > 0);
    assert!(j["usable_memory"].as_u64().unwrap() <= j["memory"]["available"].as_u64().unwrap());
    let kernels = j["cpu"]["kernels"].as_str().unwrap();
    assert!(["portable", "avx2", "avx512"].contains(&kernels));
    assert_eq!(
        kernels == "avx512",
        j["cpu"]["avx512f"] == true && j["cpu"]["avx2"] == true && j["cpu"]["fma"] == true
    );
    assert!(j["cpu"]["usable"].as_u64().unwrap() >= 1);
    assert!(j["model"].is_null());
}

#[test]
fn tiny_model_measured_and_advised() {
    let tmp = tiny("ok");
    let dir = tmp.path();
    let (code, j, err) = doctor(&[dir.to_str().unwrap(), "--json", "--probe-seconds", "0.3"]);
    assert_eq!(code, 0, "{err}");
    let m = &j["model"];
    let s = &m["shards"];
    assert_eq!(s["file_count"], 10);
    assert_eq!(s["listed_files"].as_array().unwrap().len(), 10);
    assert!(s["missing_files"].as_array().unwrap().is_empty());
    assert_eq!(
        s["index_total_size"], s["data_bytes"],
        "synth writes total_size = tensor data"
    );
    assert!(m["disk"]["free"].as_u64().unwrap() > 0);
    let p = &m["probe"];
    assert!(
        p["reads"].as_u64().unwrap() > 0 && p["bytes"].as_u64().unwrap() > 0,
        "{p}"
    );
    assert_eq!(p["request"], 17_547_264);
    let a = &m["advice"];
    assert!(a["ram_gb"].as_f64().unwrap() > 0.0, "{j}");
    assert!(
        a["budget_bytes"].as_u64() >= a["max_plan_bytes"].as_u64(),
        "plenty of RAM for tiny"
    );
    assert_eq!(a["read_trunk_bytes"], 0, "every trunk layer pinned");
    assert_eq!(a["pinned_layers"], a["layers"]);
    assert!(a["seconds_per_token"].is_number());

    // Text form: the actionable lines are there.
    let out = Command::new(K3D)
        .args(["doctor", dir.to_str().unwrap(), "--probe-seconds", "0.2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("--ram-gb ") && text.contains("GB/s") && text.contains("kernels:"),
        "{text}"
    );
}

#[test]
fn missing_shard_is_named_and_fails() {
    let tmp = tiny("missing");
    let dir = tmp.path();
    let gone = "model-00004-of-000010.safetensors";
    std::fs::remove_file(dir.join(gone)).unwrap();
    let (code, j, err) = doctor(&[dir.to_str().unwrap(), "--json", "--probe-seconds", "0.1"]);
    assert_eq!(code, 3, "{err}");
    assert_eq!(
        j["model"]["shards"]["missing_files"],
        serde_json::json!([gone])
    );
    assert!(j["model"]["advice"].is_null());
    assert!(
        j["model"]["advice_error"]
            .as_str()
            .unwrap()
            .contains("does not open")
    );
}
