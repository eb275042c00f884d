//! Memory is a dial (issue 4): the real `k3d run` binary on `k3d synth` checkpoints produces the
//! same generated ids and the same `--dump-logits` bytes at every RAM budget from the minimum to
//! `max`, with 1 or 2 threads, with chunked or token-by-token prefill, and with or without the
//! routing lookahead; a budget below the minimum is refused (exit 5) and a shard that breaks
//! during a run fails it (exit 4).

use std::path::Path;
use std::process::{Command, Output};

mod cli_support;
use cli_support::{K3D, synth};

fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("k3d-stream-{name}-"))
        .tempdir()
        .expect("scratch dir")
}

fn k3d_run(dir: &Path, dump: &Path, args: &[&str]) -> Output {
    Command::new(K3D)
        .arg("run")
        .arg(dir)
        .args([
            "--ids",
            "1,2,3,4,5,6,7",
            "--gen",
            "6",
            "--json",
            "--dump-logits",
        ])
        .arg(dump)
        .args(args)
        .output()
        .expect("run k3d run")
}

/// (generated ids, logits bytes, the JSON) of a successful run.
fn ok_run(dir: &Path, tag: &str, args: &[&str]) -> (serde_json::Value, Vec<u8>, serde_json::Value) {
    let dump = dir.join(format!("logits-{tag}.f32"));
    let out = k3d_run(dir, &dump, args);
    assert!(
        out.status.success(),
        "k3d run {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let logits = std::fs::read(&dump).expect("logits file");
    (json["generated_ids"].clone(), logits, json)
}

/// The smallest budget the plan accepts, in bytes, from the refusal message of a 1-byte budget.
fn minimum_bytes(dir: &Path) -> u64 {
    let out = k3d_run(dir, &dir.join("never.f32"), &["--ram-gb", "0.000000001"]);
    assert_eq!(
        out.status.code(),
        Some(5),
        "a tiny budget is refused with exit 5"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    // "… below the minimum of 0.002237 GiB (2402176 bytes) …": the bytes in brackets.
    let at = err
        .find("minimum of ")
        .expect("the refusal names the minimum");
    let bracket = err[at..]
        .find('(')
        .expect("the minimum in bytes, in brackets")
        + at
        + 1;
    let digits: String = err[bracket..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().expect("minimum in bytes")
}

fn gib(bytes: u64) -> String {
    format!("{:.9}", bytes as f64 / (1u64 << 30) as f64)
}

/// Budgets from the minimum to max, each checked against max.
fn identical_at_every_budget(shape: &str) {
    let tmp = scratch(shape);
    let dir = tmp.path();
    synth(shape, dir);
    let min = minimum_bytes(dir);
    let (ids, logits, max_json) = ok_run(dir, "max", &["--ram-gb", "max"]);
    let full = max_json["plan"]["budget_bytes"]
        .as_u64()
        .expect("plan budget");
    assert!(full > min, "max ({full}) above the minimum ({min})");
    let mut streamed_some = false;
    for (i, b) in [
        min + 4096,
        min + (full - min) / 4,
        min + (full - min) / 2,
        full - 4096,
    ]
    .into_iter()
    .enumerate()
    {
        for threads in ["1", "2"] {
            let g = gib(b);
            let tag = format!("{i}-{threads}");
            let (i2, l2, json) = ok_run(dir, &tag, &["--ram-gb", &g, "--threads", threads]);
            assert_eq!(i2, ids, "generated ids at {g} GiB, {threads} threads");
            assert!(
                l2 == logits,
                "logits bytes at {g} GiB, {threads} threads differ from max"
            );
            let store = &json["store"];
            if store["trunk_bytes_read"].as_u64() > max_json["store"]["trunk_bytes_read"].as_u64() {
                streamed_some = true;
            }
        }
    }
    assert!(
        streamed_some,
        "some budget streamed trunk layers during the run"
    );
    // A trunk-resident budget whose expert cache is held at its minimum (the census rule gives
    // spare bytes to the cache, which would then hold nearly every expert and need no guess)
    // reads experts on a predicted routing; without the lookahead, the same output.
    let g = gib(full - 4096);
    let least_cache = ["--ram-gb", &g, "--cache-gb", "0.000000001"];
    let (i5, l5, json) = ok_run(dir, "lookahead", &least_cache);
    assert!(
        json["store"]["lookahead_bytes_read"].as_u64() > Some(0),
        "a trunk-resident budget with the least cache reads experts ahead of routing: {}",
        json["store"]
    );
    assert_eq!(i5, ids, "generated ids at {g} GiB with the least cache");
    assert!(l5 == logits, "logits at {g} GiB with the least cache");
    let no_lookahead = [&least_cache[..], &["--no-lookahead"]].concat();
    let (i4, l4, json) = ok_run(dir, "no-lookahead", &no_lookahead);
    assert_eq!(json["store"]["lookahead_bytes_read"].as_u64(), Some(0));
    assert_eq!(i4, ids, "generated ids at {g} GiB without lookahead");
    assert!(l4 == logits, "logits at {g} GiB without lookahead");
    // Token-by-token prefill under the minimum budget.
    let (i3, l3, _) = ok_run(
        dir,
        "chunk1",
        &["--ram-gb", &gib(min + 4096), "--prefill-chunk", "1"],
    );
    assert_eq!(i3, ids, "token-by-token prefill, minimum budget");
    assert!(
        l3 == logits,
        "token-by-token prefill logits at the minimum budget"
    );
}

#[test]
fn tiny_identical_at_every_budget() {
    identical_at_every_budget("tiny");
}

#[test]
fn small_identical_at_every_budget() {
    identical_at_every_budget("small");
}

#[test]
fn budget_below_minimum_is_refused_with_both_numbers() {
    let tmp = scratch("refuse");
    let dir = tmp.path();
    synth("tiny", dir);
    let out = k3d_run(dir, &dir.join("x.f32"), &["--ram-gb", "0.001"]);
    assert_eq!(out.status.code(), Some(5));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("1073741 bytes") && err.contains("minimum of"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "no output on refusal");
}
