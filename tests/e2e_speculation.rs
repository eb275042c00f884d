//! Speculative decoding through the daemon: per-request `speculate`, the daemon default
//! (`--speculate`, TOML `speculate`), the acceptance counters in `Done`, and the client flag —
//! always the same ids as plain greedy.

#[path = "e2e_support.rs"]
mod e2e_support;

use e2e_support::command_support::run_ok;
use e2e_support::*;
use k3proto::v1 as pb;
use std::path::Path;
use std::process::Command;

/// `tiny-c` with seed 0 falls into a loop after this prompt (a run of one id), so n-gram drafts
/// are proposed and accepted; the plain tiny model never repeats itself in a short run.
fn looping_model() -> tempfile::TempDir {
    let dir = scratch("spec-model");
    synth_model("tiny-c", dir.path());
    dir
}

const PROMPT: [u32; 12] = [100; 12];
const MAX_TOKENS: u32 = 40;

fn request(speculate: u32) -> pb::GenerateRequest {
    let mut r = ids_request(PROMPT.to_vec(), MAX_TOKENS);
    if let Some(o) = r.options.as_mut() {
        o.speculate = speculate;
    }
    r
}

fn counters(c: &Collected) -> (u32, u32) {
    let d = c.done.as_ref().expect("a Done event");
    (d.draft_tokens_proposed, d.draft_tokens_accepted)
}

#[tokio::test]
async fn speculation_on_request_and_by_default_gives_plain_greedy_ids() {
    let model_dir = looping_model();
    let model = model_dir.path();
    let spec_off = scratch("spec-off");
    let d = Daemon::start(model, &spec_off.path().join("k3d.sock"), &[]);
    let mut c = client(&d.socket).await;
    wait_ready(&mut c).await;
    let plain = generate(&mut c, request(0)).await;
    assert!(plain.error.is_none(), "{:?}", plain.error);
    assert_eq!(plain.ids.len(), MAX_TOKENS as usize);
    assert_eq!(counters(&plain), (0, 0), "speculation is off by default");

    // Without `--speculate` no rollback journal is planned: a request asking for drafts runs
    // plain (same ids, nothing proposed).
    let unplanned = generate(&mut c, request(6)).await;
    assert_eq!(unplanned.ids, plain.ids);
    assert_eq!(counters(&unplanned), (0, 0), "no journal was planned");

    // Too many drafts per step is an invalid request, not a crash.
    let refused = c.generate(request(17)).await;
    match refused {
        Err(s) => assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}"),
        Ok(stream) => {
            let out = collect(stream.into_inner()).await;
            let s = out.error.expect("speculate 17 must be refused");
            assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
        }
    }
    drop(d);

    // The daemon default: `--speculate` applies to requests that leave it 0, and a request
    // may ask for fewer drafts.
    let spec_on = scratch("spec-on");
    let on = Daemon::start(
        model,
        &spec_on.path().join("k3d.sock"),
        &["--speculate", "6"],
    );
    let mut c = client(&on.socket).await;
    wait_ready(&mut c).await;
    let by_default = generate(&mut c, request(0)).await;
    assert_eq!(
        by_default.ids, plain.ids,
        "speculative ids differ from plain greedy"
    );
    let (proposed, accepted) = counters(&by_default);
    assert!(
        proposed > 0 && accepted > 0 && accepted <= proposed,
        "drafts {accepted}/{proposed}"
    );
    let fewer = generate(&mut c, request(2)).await;
    assert_eq!(fewer.ids, plain.ids, "speculate 2");
    let (few_proposed, _) = counters(&fewer);
    assert!(few_proposed > 0, "a request's own value is used");

    // The client flag reaches the daemon and the output is the same.
    let out = run_ok(
        Command::new(bin("k3"))
            .arg("--socket")
            .arg(&on.socket)
            .args(["run", "--ids", "--speculate", "6", "--max-tokens"])
            .arg(MAX_TOKENS.to_string())
            .arg(PROMPT.map(|i| i.to_string()).join(",")),
    );
    let ids: Vec<u32> = String::from_utf8_lossy(&out.stdout)
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("an id"))
        .collect();
    assert_eq!(ids, plain.ids, "k3 run --speculate");
    drop(on);

    // The TOML key, like the flag.
    let tmp = scratch("spec-toml");
    let dir = tmp.path();
    let config = dir.join("k3d.toml");
    std::fs::write(&config, "speculate = 6\nthreads = 1\n").expect("write config");
    let from_file = Daemon::start(
        model,
        &dir.join("k3d.sock"),
        &["--config", path_str(&config)],
    );
    let mut c = client(&from_file.socket).await;
    wait_ready(&mut c).await;
    let by_file = generate(&mut c, request(0)).await;
    assert_eq!(by_file.ids, plain.ids);
    assert_eq!(counters(&by_file), (proposed, accepted));
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 scratch path")
}
