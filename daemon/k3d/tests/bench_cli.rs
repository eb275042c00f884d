//! `k3d bench` (issue 4 §8) through the binary on the `small` synthetic model: the JSON document
//! has every figure, the decode bytes read per token equal the plan's prediction class by class
//! (exact on small: nothing is left to chance by the cache at these budgets), the ids agree
//! across budgets, a refused budget fails before measuring, and `--cgroup` runs each child in
//! its own memory group (root and cgroup v1, as CI has) and removes it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

mod cli_support;
use cli_support::{K3D, synth};

/// A fresh `small` checkpoint for test `name` (tests run in parallel), and its directory, removed
/// when the test ends (each `small` is 0.33 GB).
fn small(name: &str) -> (PathBuf, tempfile::TempDir) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("k3d-bench-{name}-"))
        .tempdir()
        .expect("scratch dir");
    let model = dir.path().join("small");
    synth("small", &model);
    (model, dir)
}

fn bench(model: &Path, args: &[&str]) -> Output {
    bench_command(model, args).output().expect("run k3d bench")
}

fn bench_command(model: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(K3D);
    cmd.arg("bench")
        .arg(model)
        .args([
            "--tokens",
            "3",
            "--runs",
            "2",
            "--probe-seconds",
            "0.2",
            "--json",
        ])
        .args(args);
    cmd
}

fn ok_json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "k3d bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document on stdout")
}

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Every run's decode bytes, class by class, are the plan's per-token prediction × tokens.
fn check_budget(b: &serde_json::Value) {
    let reads = &b["plan"]["reads"];
    let runs = b["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "two runs per budget");
    for run in runs {
        let d = &run["decode"];
        let tokens = u(&d["tokens"]);
        assert_eq!(tokens, 3, "decode tokens measured");
        for (measured, predicted) in [
            ("trunk_bytes", "trunk"),
            ("expert_bytes", "experts"),
            ("embedding_bytes", "embedding"),
            ("head_bytes", "lm_head"),
        ] {
            assert_eq!(
                u(&d[measured]),
                u(&reads[predicted]) * tokens,
                "{measured} at --ram-gb {}: run {run}",
                b["ram_gb"]
            );
        }
        assert!(f(&d["seconds"]) > 0.0);
        assert!(f(&d["compute_seconds"]) > 0.0);
        assert!(u(&run["peak_rss_bytes"]) > 0);
        assert!(f(&run["prefill"]["seconds"]) > 0.0);
        assert_eq!(
            u(&run["prefill"]["tokens"]),
            8,
            "the 8-token built-in prompt"
        );
    }
    for class in ["trunk", "experts", "embedding", "head", "total"] {
        assert_eq!(
            b["bytes_per_token"][class]["equal"], true,
            "{class} at {}",
            b["ram_gb"]
        );
    }
    let m = &b["median"];
    for key in [
        "decode_seconds_per_token",
        "prefill_seconds",
        "compute_seconds_per_token",
        "overlap_ratio",
        "serial_ratio",
        "peak_rss_bytes",
        "peak_rss_vs_budget",
    ] {
        assert!(f(&m[key]) > 0.0, "median {key} = {}", m[key]);
    }
    // Decode against its floor (issue 31): the memory probe ran, the compute part is the BF16
    // and MXFP4 parts together (medians of two runs are means, so the sum holds), the floor is
    // at least the compute part, and the ratio is floor ÷ s/token.
    let floor = &b["decode_floor"];
    let probe = &floor["memory_probe"];
    assert_eq!(u(&probe["bytes"]), 256 << 20, "the memory probe's buffer");
    assert!(f(&probe["bytes_per_second"]) > 0.0 && u(&probe["passes"]) >= 2);
    let (compute, bf16, mxfp4) = (
        f(&floor["compute_seconds"]),
        f(&floor["bf16_seconds"]),
        f(&floor["mxfp4_seconds"]),
    );
    assert!(bf16 > 0.0 && mxfp4 > 0.0, "{floor}");
    assert!(
        (compute - (bf16 + mxfp4)).abs() <= 1e-9 * compute,
        "{floor}"
    );
    let seconds = f(&floor["seconds_per_token"]);
    assert!(seconds >= compute * (1.0 - 1e-12), "{floor}");
    assert!(f(&floor["touched_bytes"]) > 0.0);
    // The FMA bound's rate is the f32 probe's (weight products are f32 FMAs, spec §6.1 rule
    // 2), named; one FMA per weight is the f32 GEMM probe's FLOP rate ÷ 2 (both medians over
    // the runs).
    assert_eq!(floor["fma_probe"], "f32", "{floor}");
    assert!(f(&floor["f32_gflops"]) > 0.0, "{floor}");
    let gemm = f(&b["prefill"]["gemm_f32_gflops"]) * 1e9;
    assert!(
        (f(&floor["fma_per_second"]) - gemm / 2.0).abs() <= 1e-9 * gemm,
        "{floor}"
    );
    // A ratio only when no run beat its floor (issue 41.3); else the probe is named.
    match u(&floor["beaten_runs"]) {
        0 => assert!(f(&floor["of_limit"]) > 0.0, "{floor}"),
        _ => {
            assert!(floor["of_limit"].is_null(), "{floor}");
            assert!(floor["probe_too_low"].is_string(), "{floor}");
        }
    }
    let device = &b["device"];
    assert!(f(&device["read_gbps"]) > 0.0, "drive probe measured");
    assert_eq!(device["pattern"], "decode", "decode's own reads");
    let request = u(&device["request_bytes"]);
    assert!(
        request > 0 && request <= 32 << 20,
        "the reader pool's requests: {request}"
    );
    assert_eq!(u(&device["in_flight"]), 8, "the engine's queue depth");
    assert!(f(&device["warmup_seconds"]) > 0.0, "timed after a warm-up");
}

#[test]
fn bench_reports_plan_exact_bytes_and_identical_ids() {
    let (model, _scratch) = small("two-budgets");
    // 0.09 GiB is just above small's minimum (streams trunk, experts and the embedding); max
    // keeps everything resident and reads nothing per token.
    let doc = ok_json(&bench(&model, &["--ram-gb", "0.09,max"]));
    assert_eq!(doc["ids_identical"], true);
    assert_eq!(doc["prompt_ids"].as_array().map(Vec::len), Some(8));
    let ids = doc["generated_ids"].as_array().expect("ids");
    assert_eq!(
        ids.len(),
        4,
        "3 decoded tokens + the one sampled after prefill"
    );
    let budgets = doc["budgets"].as_array().expect("budgets");
    assert_eq!(budgets.len(), 2);
    for b in budgets {
        check_budget(b);
        for run in b["runs"].as_array().expect("runs") {
            assert_eq!(&run["generated_ids"], &doc["generated_ids"]);
        }
    }
    let tight = &budgets[0];
    assert!(
        u(&tight["plan"]["reads"]["trunk"]) > 0,
        "0.09 GiB streams trunk"
    );
    assert!(f(&tight["median"]["read_gbps"]) > 0.0);
    assert!(f(&tight["median"]["io_seconds_per_token"]) > 0.0);
    let full = &budgets[1];
    assert_eq!(u(&full["bytes_per_token"]["total"]["predicted"]), 0);
    // A token reads the same weights at every budget; only what streams from the drive differs.
    assert_eq!(
        tight["decode_floor"]["touched_bytes"],
        full["decode_floor"]["touched_bytes"]
    );
    assert!(f(&tight["decode_floor"]["drive_seconds"]) > 0.0);
    assert_eq!(
        f(&full["decode_floor"]["drive_seconds"]),
        0.0,
        "nothing streams"
    );
}

/// `--prompt-tokens K` (issue 16 item 4): the prefill phase is one forward of K tokens, the
/// built-in prompt cut or extended; the document gives the rollback journal a verify step of K
/// fed ids would copy. Outside 1..=65,536 it is refused before anything runs.
#[test]
fn bench_prompt_tokens_sets_the_prefill_forward() {
    let dir = tempfile::Builder::new()
        .prefix("k3d-bench-prompt-tokens-")
        .tempdir()
        .expect("scratch dir");
    let model = dir.path().join("tiny");
    synth("tiny", &model);
    let builtin = [100, 200, 300, 400, 50, 150, 250, 350];
    let mut journals = Vec::new();
    for k in [1usize, 5, 13] {
        let doc = ok_json(&bench(
            &model,
            &["--ram-gb", "max", "--prompt-tokens", &k.to_string()],
        ));
        let ids = doc["prompt_ids"].as_array().expect("prompt ids");
        assert_eq!(ids.len(), k, "K = {k}");
        let head: Vec<u64> = ids.iter().take(8).map(u).collect();
        assert_eq!(
            head,
            builtin[..k.min(8)],
            "K = {k}: the built-in prompt first"
        );
        assert!(
            ids.iter().all(|id| u(id) < 512),
            "ids every synth vocabulary holds"
        );
        for run in doc["budgets"][0]["runs"].as_array().expect("runs") {
            assert_eq!(u(&run["prefill"]["tokens"]), k as u64, "prefill of K = {k}");
            assert_eq!(u(&run["decode"]["tokens"]), 3);
        }
        journals.push(u(&doc["verify_journal_bytes"]));
    }
    // The journal is a state copy plus a fixed amount per fed id (spec §5.2).
    let per_id = (journals[1] - journals[0]) / 4;
    assert!(per_id > 0 && journals[0] > per_id, "{journals:?}");
    assert_eq!(journals[2] - journals[1], 8 * per_id, "{journals:?}");
    for k in ["0", "65537"] {
        let out = bench(&model, &["--ram-gb", "max", "--prompt-tokens", k]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "--prompt-tokens {k}: a usage error"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--prompt-tokens"), "{err}");
    }
}

/// A long prompt (issue 30.4) at a budget that streams the experts: one layer-major pass per
/// plan-sized run of tokens reads each routed expert at most once per pass, so the expert bytes
/// read are at most passes × the union the prompt routes to; the prefill's GFLOP/s and the GEMM
/// probe of the same run are reported, the ratio taken run by run.
#[test]
fn bench_long_prompt_reports_union_and_gemm_ratio() {
    let (model, _scratch) = small("long-prompt");
    let k = 100u64;
    let doc = ok_json(&bench(
        &model,
        &[
            "--ram-gb",
            "0.09",
            "--prompt-tokens",
            &k.to_string(),
            "--gemm-seconds",
            "0.2",
        ],
    ));
    assert_eq!(doc["ids_identical"], true);
    let b = &doc["budgets"][0];
    let pass = u(&b["plan"]["prefill_tokens"]);
    assert!(pass > 0, "the plan holds a layer-major pass");
    let passes = k.div_ceil(pass) as f64;
    let p = &b["prefill"];
    let (read, union) = (f(&p["expert_bytes"]), f(&p["union_bytes"]));
    assert!(union > 0.0 && read > 0.0, "0.09 GiB streams experts: {p}");
    assert!(
        read <= passes * union,
        "read {read} B of experts, more than {passes} pass(es) × the union {union} B"
    );
    assert!((f(&p["read_vs_union"]) - read / union).abs() < 1e-9 * passes);
    for key in [
        "tokens_per_second",
        "compute_gflops",
        "wall_gflops",
        "gemm_gflops",
        "gemm_f32_gflops",
    ] {
        assert!(f(&p[key]) > 0.0, "prefill {key} = {}", p[key]);
    }
    // Each ratio is taken run by run (probe and prefill of the same process), then the median:
    // against the f32 probe (the weight products' precision) and the f64 one.
    let flops = f(&doc["prefill_flops"]);
    for (probe, key) in [("gemm_f32", "compute_vs_f32"), ("gemm", "compute_vs_f64")] {
        let ratios: Vec<f64> = b["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .map(|r| flops / f(&r["prefill"]["compute_seconds"]) / f(&r[probe]["flops_per_second"]))
            .collect();
        let (lo, hi) = ratios
            .iter()
            .fold((f64::MAX, 0f64), |(l, h), &x| (l.min(x), h.max(x)));
        let median = f(&p[key]);
        assert!(
            median >= lo * 0.999 && median <= hi * 1.001,
            "{key}: {median} outside {ratios:?}"
        );
    }
    assert!(p["gemm_probe"]["isa"].is_string());
    assert!(p["gemm_f32_probe"]["isa"].is_string());
    for run in b["runs"].as_array().expect("runs") {
        assert_eq!(u(&run["prefill"]["tokens"]), k);
    }
}

/// Issue 41.3: a run faster than its floor is flagged, never printed as a ratio above 1. With
/// `--drive-gbps` far below the drive's real rate, the drive part of the floor (bytes streamed
/// per token ÷ that rate) exceeds what each run took: every run beats its floor, the document
/// gives no `of_limit` and names the drive as the probe too low, and the table and each run's
/// line say so. The floor's arithmetic still holds: drive part = bytes read per token ÷ rate.
#[test]
fn bench_flags_a_run_that_beats_its_floor() {
    let (model, _scratch) = small("beats-floor");
    let rate = 1e5; // 0.0001 GB/s
    let out = bench(&model, &["--ram-gb", "0.09", "--drive-gbps", "0.0001"]);
    let doc = ok_json(&out);
    let b = &doc["budgets"][0];
    assert_eq!(b["device"]["given"], true);
    assert_eq!(f(&b["device"]["read_gbps"]), 0.0001);
    let floor = &b["decode_floor"];
    assert_eq!(u(&floor["beaten_runs"]), 2, "{floor}");
    assert!(floor["of_limit"].is_null(), "{floor}");
    assert_eq!(floor["probe_too_low"], "drive", "{floor}");
    let per_token = f(&b["bytes_per_token"]["total"]["measured"]);
    let drive = f(&floor["drive_seconds"]);
    assert!(
        (drive - per_token / rate).abs() <= 1e-9 * drive,
        "drive part {drive} s for {per_token} B/token at {rate} B/s"
    );
    assert!(f(&floor["seconds_per_token"]) >= drive * (1.0 - 1e-12));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("BEATS ITS FLOOR: probe too low").count(),
        2,
        "{err}"
    );
    // The table (without --json) shows no ratio for the budget.
    let table = Command::new(K3D)
        .arg("bench")
        .arg(&model)
        .args(["--ram-gb", "0.09", "--drive-gbps", "0.0001"])
        .args(["--tokens", "2", "--runs", "1", "--probe-seconds", "0.2"])
        .output()
        .expect("run k3d bench");
    assert!(table.status.success());
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("beaten×1"), "{text}");
    for bad in ["0", "-1", "nan"] {
        let out = bench(&model, &["--ram-gb", "0.09", "--drive-gbps", bad]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "--drive-gbps {bad}: a usage error"
        );
    }
}

#[test]
fn bench_refuses_a_budget_below_the_minimum_before_measuring() {
    let (model, _scratch) = small("refused");
    let out = bench(&model, &["--ram-gb", "max,0.001"]);
    assert_eq!(out.status.code(), Some(5), "exit 5: not enough budget");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--ram-gb 0.001") && err.contains("minimum"),
        "{err}"
    );
    assert!(!err.contains("run 1/"), "nothing was measured: {err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn bench_cgroup_limits_each_child_and_cleans_up() {
    let (model, _scratch) = small("cgroup");
    let child = bench_command(
        &model,
        &[
            "--ram-gb",
            "0.09",
            "--cgroup",
            "--cgroup-overhead-mib",
            "128",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("run k3d bench");
    // Its groups are named after its pid: other benchmarks on the machine (another checkout's
    // tests, in the same parent group) may be running theirs.
    let own_groups = format!("k3d-bench-{}-", child.id());
    let doc = ok_json(&child.wait_with_output().expect("wait for k3d bench"));
    let b = &doc["budgets"][0];
    check_budget(b);
    let limit = u(&b["plan"]["budget"]) + (128 << 20);
    for run in b["runs"].as_array().expect("runs") {
        let peak = u(&run["cgroup_peak_bytes"]);
        assert!(
            peak > 0 && peak <= limit,
            "cgroup peak {peak} within {limit}"
        );
        assert_eq!(u(&run["cgroup_failcnt"]), 0, "the limit was never hit");
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
    let rel = own
        .lines()
        .find_map(|l| {
            l.split_once(":memory:")
                .map(|(_, p)| p.trim_start_matches('/').to_string())
        })
        .expect("a cgroup v1 memory line");
    let parent = Path::new("/sys/fs/cgroup/memory").join(rel);
    let left: Vec<_> = std::fs::read_dir(&parent)
        .expect("own memory cgroup")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(&own_groups))
        .collect();
    assert!(left.is_empty(), "cgroups left behind: {left:?}");
}
