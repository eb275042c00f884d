//! Reuse between agent turns on the default configuration (issue 34 point 5): two consecutive
//! requests of the real Claude Code, captured as it sent them (`tests/fixtures/agent-turns`),
//! replayed through `/v1/messages?beta=true` over keyless loopback TCP against a real daemon
//! with no memory flags — the trained fixture, the default budget, the default session
//! reserve. The second turn resends the first turn's conversation, so it must continue from
//! the state the daemon kept of it: the usage and the daemon's log say it reused at least 90 %
//! of the first turn's prompt, and its reply is the one computed afresh (reuse off).

#[path = "e2e_support.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::*;

/// How much of the first turn's prompt the second must reuse (the figure).
const REUSED_AT_LEAST: f64 = 0.9;
/// The replies are cut to this many ids: what turn 2 reuses is turn 1's prompt (its assistant
/// message is the captured one, not ours), and each generated id costs a step over ~40,000
/// positions on a shared machine.
const MAX_TOKENS: u64 = 16;

fn trained_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/trained/model")
}

/// A captured turn: its path (with `?beta=true`), the headers Claude Code sent that describe
/// the request (not the connection's), and its body with `max_tokens` cut to [`MAX_TOKENS`].
struct Turn {
    path: String,
    headers: Vec<(String, String)>,
    body: serde_json::Value,
}

fn captured(n: u32) -> Turn {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("fixtures/agent-turns/claude-code-turn-{n}.json"));
    let capture: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).expect("read the captured turn"))
            .expect("the capture is JSON");
    let connection = ["host", "content-length", "connection", "accept-encoding"];
    let headers = capture["headers"]
        .as_object()
        .expect("headers")
        .iter()
        .filter(|(k, _)| !connection.contains(&k.to_ascii_lowercase().as_str()))
        .map(|(k, v)| (k.clone(), v.as_str().expect("a header value").to_string()))
        .collect();
    let mut body = capture["body"].clone();
    body["max_tokens"] = MAX_TOKENS.into();
    Turn {
        path: capture["path"].as_str().expect("path").to_string(),
        headers,
        body,
    }
}

/// What a streamed Messages reply said: its content events in order (each `content_block_*`
/// event's data, which carry no request id), its stop reason, and the final usage's
/// `input_tokens` and `cache_read_input_tokens`.
#[derive(Debug)]
struct Replied {
    content: Vec<serde_json::Value>,
    stop_reason: serde_json::Value,
    input_tokens: u64,
    cache_read: u64,
}

impl Replied {
    fn prompt_tokens(&self) -> u64 {
        self.input_tokens + self.cache_read
    }
}

/// Sends `turn` (with `extra` fields merged into its body) to `url` with curl, as Claude Code
/// does: a streamed request whose reply is read to its end.
fn send(url: &str, turn: &Turn, extra: serde_json::Value, scratch: &Path) -> Replied {
    let mut body = turn.body.clone();
    for (k, v) in extra.as_object().expect("an object") {
        body[k] = v.clone();
    }
    let file = scratch.join("body.json");
    std::fs::write(&file, body.to_string()).expect("write the body");
    let mut curl = Command::new("curl");
    // `--max-time` only guards against a hang: a ~40,000-id turn is a prefill of ~3 min on two
    // free cores and of ~30 min on a crowded machine.
    curl.args([
        "-sS",
        "--no-buffer",
        "--max-time",
        "3600",
        "-w",
        "\n%{http_code}",
    ]);
    for (k, v) in &turn.headers {
        curl.args(["-H", &format!("{k}: {v}")]);
    }
    let out = curl
        .arg("--data-binary")
        .arg(format!("@{}", file.display()))
        .arg(format!("{url}{}", turn.path))
        .output()
        .expect("run curl (tests/run.sh installs it)");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "curl: {}", text(&out.stderr));
    let (events, status) = stdout.rsplit_once('\n').expect("a status line");
    assert_eq!(status, "200", "the turn was refused: {events}");
    let mut replied = Replied {
        content: Vec::new(),
        stop_reason: serde_json::Value::Null,
        input_tokens: 0,
        cache_read: 0,
    };
    let mut usage = None;
    for data in events.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let event: serde_json::Value =
            serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
        match event["type"].as_str() {
            Some(t) if t.starts_with("content_block_") => replied.content.push(event),
            Some("message_delta") => {
                replied.stop_reason = event["delta"]["stop_reason"].clone();
                usage = Some(event["usage"].clone());
            }
            Some("error") => panic!("the stream ended in an error: {event}"),
            _ => {}
        }
    }
    let usage = usage.unwrap_or_else(|| panic!("no message_delta with the usage:\n{events}"));
    let count = |field: &str| {
        usage[field]
            .as_u64()
            .unwrap_or_else(|| panic!("no {field} in the usage: {usage}"))
    };
    replied.input_tokens = count("input_tokens");
    replied.cache_read = count("cache_read_input_tokens");
    replied
}

/// The daemon's start lines of requests with `prompt` tokens: the reused count of each, in
/// order (`request N started (CALLER, P prompt tokens, R reused, …)`).
fn reused_in_log(log: &str, prompt: u64) -> Vec<u64> {
    let needle = format!(", {prompt} prompt tokens, ");
    log.lines()
        .filter(|l| l.contains(" started (") && l.contains(&needle))
        .map(|l| {
            let rest = &l[l.find(&needle).expect("found") + needle.len()..];
            rest.split(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no reused count in {l:?}"))
        })
        .collect()
}

#[tokio::test]
async fn claude_codes_second_turn_reuses_the_first_on_the_default_configuration() {
    let dir = scratch("agent-turns");
    // The default configuration: no --ram-gb, no --session-gb; HTTP on loopback, no key; all
    // of CI's two cores (the default on such a machine), not the tests' usual one.
    let d = Daemon::start(
        &trained_model(),
        &dir.path().join("k3d.sock"),
        &["--http", "127.0.0.1:0", "--threads", "2"],
    );
    wait_ready(&mut client(&d.socket).await).await;
    let log = d.log_text();
    let sessions = log
        .lines()
        .find(|l| l.contains("in-memory allowance"))
        .unwrap_or_else(|| panic!("no sessions line in the log:\n{log}"));
    assert!(
        !sessions.contains("allowance 0 B") && !sessions.contains("allowance 0.000 GiB"),
        "the default plan keeps nothing between turns: {sessions}"
    );
    let url = d.tcp_url();
    let (first, second) = (captured(1), captured(2));

    let one = send(&url, &first, serde_json::json!({}), dir.path());
    let two = send(&url, &second, serde_json::json!({}), dir.path());
    let fresh = send(
        &url,
        &second,
        serde_json::json!({"prefix_reuse": false}),
        dir.path(),
    );

    // Usage: the second turn read at least 90 % of the first turn's prompt from a kept state.
    let wanted = (one.prompt_tokens() as f64 * REUSED_AT_LEAST).ceil() as u64;
    assert!(
        one.prompt_tokens() > 10_000,
        "not the real agent's prompt: {one:?}"
    );
    assert!(
        two.cache_read >= wanted,
        "turn 2 reused {} of turn 1's {} prompt tokens (< {REUSED_AT_LEAST}):\n{}",
        two.cache_read,
        one.prompt_tokens(),
        d.log_text()
    );
    assert_eq!(two.prompt_tokens(), fresh.prompt_tokens());
    assert_eq!(fresh.cache_read, 0, "reuse off computes the prompt afresh");
    // The log says the same of the same request.
    let log = d.log_text();
    assert_eq!(
        reused_in_log(&log, two.prompt_tokens()),
        [two.cache_read, 0],
        "the log's start lines of turn 2 (reused, then afresh):\n{log}"
    );
    // Exact: the reply continued from the kept state is the one computed afresh.
    assert_eq!(
        two.content, fresh.content,
        "reused and fresh replies differ"
    );
    assert_eq!(two.stop_reason, fresh.stop_reason);
    assert!(!two.content.is_empty(), "an empty reply: {two:?}");
    eprintln!(
        "turn 1: {} prompt tokens; turn 2: {} prompt tokens, {} reused ({:.1} % of turn 1)",
        one.prompt_tokens(),
        two.prompt_tokens(),
        two.cache_read,
        100.0 * two.cache_read as f64 / one.prompt_tokens() as f64
    );
}
