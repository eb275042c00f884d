//! The OpenAI-compatible HTTP API of a real `k3d serve` on the tiny model: the official
//! `openai` Python package drives it (tests/http/, in the venv tests/run.sh installs), against
//! what gRPC answers for the same requests; loading and start-up refusals are checked here.

#[path = "e2e_support.rs"]
mod support;

use k3proto::v1 as pb;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

const KEY: &str = "k3-test-key-0123456789";
const BODY_LIMIT: usize = 65536;

/// The venv tests/run.sh creates; the tests refuse to run without it rather than skip.
fn python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join("target/venv-http/bin/python");
    assert!(
        python.exists(),
        "{} is missing: the HTTP tests need the official `openai` and `anthropic` packages in \
         that venv; run ./tests/run.sh (it creates it)",
        python.display()
    );
    python
}

fn tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("http")
}

/// The id of the model the daemon serves, from `GET /v1/models`.
fn served_model(socket: &Path) -> String {
    let (_, _, models) = http(socket, "GET", "/v1/models", "");
    let models: serde_json::Value = serde_json::from_str(&models).expect("JSON");
    models["data"][0]["id"]
        .as_str()
        .expect("the served model")
        .to_string()
}

fn texts_by_channel(r: &Collected) -> (String, String, usize) {
    let (mut reasoning, mut response, mut reasoning_tokens) = (String::new(), String::new(), 0);
    for e in &r.events {
        if let pb::event::Event::Token(t) = e {
            match pb::Channel::try_from(t.channel) {
                Ok(pb::Channel::Reasoning) => {
                    reasoning_tokens += 1;
                    reasoning.push_str(&t.text);
                }
                Ok(pb::Channel::Response) => response.push_str(&t.text),
                _ => {}
            }
        }
    }
    (reasoning, response, reasoning_tokens)
}

/// gRPC's answer to a chat, in the shape the Python tests compare with.
async fn chat_reference(
    c: &mut k3proto::v1::engine_client::EngineClient<tonic::transport::Channel>,
    thinking: pb::Thinking,
    effort: pb::Effort,
) -> serde_json::Value {
    let messages = [("system", "You are terse."), ("user", "Name three rivers.")];
    let max_tokens = 24;
    let req = pb::ChatRequest {
        messages: messages
            .iter()
            .map(|(role, content)| pb::ChatMessage {
                role: if *role == "system" {
                    pb::Role::System
                } else {
                    pb::Role::User
                }
                .into(),
                content: content.to_string(),
                ..Default::default()
            })
            .collect(),
        thinking: thinking.into(),
        effort: effort.into(),
        options: Some(pb::GenerationOptions {
            max_tokens,
            ..Default::default()
        }),
        ..Default::default()
    };
    let r = collect(c.chat(req).await.expect("chat accepted").into_inner()).await;
    assert!(r.error.is_none(), "{:?}", r.error);
    let done = r.done.clone().expect("Done");
    let (reasoning, mut response, reasoning_tokens) = texts_by_channel(&r);
    response.push_str(&done.trailing_text);
    serde_json::json!({
        "messages": messages.iter().map(|(r, c)| serde_json::json!({"role": r, "content": c})).collect::<Vec<_>>(),
        "max_tokens": max_tokens,
        "reasoning": reasoning,
        "response": response,
        "reasoning_tokens": reasoning_tokens,
        "prompt_tokens": done.prompt_tokens,
        "generated_tokens": done.generated_tokens,
        "stop_reason": if done.stop_reason == pb::StopReason::MaxTokens as i32 { "max_tokens" } else { "stop" },
    })
}

/// gRPC's answer to a conversation with a tool declared, a call in its history and the
/// call's result (spec §8.2): the Python tests send the same through `tools`, `tool_calls`
/// and a `role: "tool"` message and must get the same prompt and reply.
async fn tools_reference(
    c: &mut k3proto::v1::engine_client::EngineClient<tonic::transport::Channel>,
) -> serde_json::Value {
    let parameters =
        r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}"#;
    let message = |role: pb::Role, content: &str| pb::ChatMessage {
        role: role.into(),
        content: content.into(),
        ..Default::default()
    };
    let req = pb::ChatRequest {
        messages: vec![
            message(pb::Role::User, "Weather in Paris?"),
            pb::ChatMessage {
                tool_calls: vec![pb::ToolCall {
                    id: "call_0".into(),
                    name: "get_weather".into(),
                    arguments: r#"{"city": "Paris"}"#.into(),
                }],
                ..message(pb::Role::Assistant, "")
            },
            pb::ChatMessage {
                tool_call_id: "call_0".into(),
                ..message(pb::Role::Tool, "sunny, 21 C")
            },
        ],
        thinking: pb::Thinking::Off.into(),
        options: Some(pb::GenerationOptions {
            max_tokens: 12,
            ..Default::default()
        }),
        tools: vec![pb::Tool {
            name: "get_weather".into(),
            description: "Current weather of a city".into(),
            parameters: parameters.into(),
        }],
        tool_choice: pb::ToolChoice::Auto.into(),
        ..Default::default()
    };
    let r = collect(c.chat(req).await.expect("chat accepted").into_inner()).await;
    assert!(r.error.is_none(), "{:?}", r.error);
    let done = r.done.clone().expect("Done");
    let (_, mut response, _) = texts_by_channel(&r);
    response.push_str(&done.trailing_text);
    serde_json::json!({
        "parameters": serde_json::from_str::<serde_json::Value>(parameters).expect("schema"),
        "max_tokens": 12,
        "response": response,
        "prompt_tokens": done.prompt_tokens,
        "tool_calls": done.tool_calls.len(),
    })
}

/// A daemon on the tiny model serving HTTP on `dir/http.sock` and loopback TCP, with a key and
/// a small body limit from its config file; `args` are more flags. Returns it with the HTTP
/// socket and a gRPC client, once the model is ready.
async fn keyed_daemon(dir: &Path, args: &[&str]) -> Keyed {
    keyed_daemon_on(tiny_model(), dir, args).await
}

/// A ready daemon, its HTTP socket and a gRPC client.
type Keyed = (
    Daemon,
    PathBuf,
    k3proto::v1::engine_client::EngineClient<tonic::transport::Channel>,
);

/// [`keyed_daemon`] on the checkpoint `model`.
async fn keyed_daemon_on(model: &Path, dir: &Path, args: &[&str]) -> Keyed {
    let http_socket = dir.join("http.sock");
    let config = dir.join("k3d.toml");
    std::fs::write(
        &config,
        format!(
            "http = [\"unix:{}\", \"127.0.0.1:0\"]\nhttp_api_keys = [\"{KEY}\"]\nhttp_body_limit = {BODY_LIMIT}\n",
            http_socket.display()
        ),
    )
    .expect("write the config");
    let socket = dir.join("k3d.sock");
    let config_arg = config.display().to_string();
    let mut all = vec!["--config", &config_arg];
    all.extend_from_slice(args);
    let d = Daemon::start(model, &socket, &all);
    let mut c = client(&socket).await;
    wait_ready(&mut c).await;
    (d, http_socket, c)
}

/// Runs `tests/http/<file>` under pytest against `d` (its HTTP socket, TCP address, key and
/// model id in the environment, with `env`), failing with pytest's report and the daemon's log.
fn pytest(python: &Path, file: &str, d: &Daemon, http_socket: &Path, env: &[(&str, &Path)]) {
    pytest_on(tiny_model(), python, file, d, http_socket, env)
}

/// [`pytest`] against a daemon serving the checkpoint `model`.
fn pytest_on(
    model: &Path,
    python: &Path,
    file: &str,
    d: &Daemon,
    http_socket: &Path,
    env: &[(&str, &Path)],
) {
    let model_id = std::fs::canonicalize(model)
        .expect("model dir")
        .file_name()
        .expect("a name")
        .to_string_lossy()
        .into_owned();
    let mut command = Command::new(python);
    command
        .args(["-m", "pytest", "-q", "-s", "-p", "no:cacheprovider"])
        .arg(tests_dir().join(file))
        .env("K3_HTTP_SOCKET", http_socket)
        .env("K3_HTTP_URL", d.tcp_url())
        .env("K3_HTTP_KEY", KEY)
        .env("K3_MODEL", &model_id)
        .env("K3_BODY_LIMIT", BODY_LIMIT.to_string());
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().expect("run pytest");
    let report = format!(
        "{}{}\ndaemon log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        d.log_text()
    );
    assert!(out.status.success(), "{file} failed:\n{report}");
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
}

#[tokio::test]
async fn the_openai_python_client_gets_what_grpc_gets() {
    let python = python();
    let tmp = scratch("http-openai");
    let dir = tmp.path();
    let (d, http_socket, mut c) = keyed_daemon(
        dir,
        &[
            "--max-active",
            "1",
            "--max-queue",
            "0",
            // Room for kept states: prefix reuse lives in the session allowance.
            "--session-gb",
            "0.25",
        ],
    )
    .await;
    let off = chat_reference(&mut c, pb::Thinking::Off, pb::Effort::Default).await;
    let on = chat_reference(&mut c, pb::Thinking::On, pb::Effort::High).await;
    let tools = tools_reference(&mut c).await;
    let generated = generate(&mut c, ids_request(prompt(3), 8)).await;
    assert!(generated.error.is_none(), "{:?}", generated.error);
    let mut text = generated.text.clone();
    text.push_str(&generated.done.as_ref().expect("Done").trailing_text);
    let reference = serde_json::json!({
        "chat_off": off,
        "chat_on": on,
        "tools": tools,
        "generate": {"prompt_ids": prompt(3), "max_tokens": 8, "ids": generated.ids, "text": text},
    });
    let reference_path = dir.join("reference.json");
    std::fs::write(&reference_path, reference.to_string()).expect("write the reference");
    pytest(
        &python,
        "test_openai.py",
        &d,
        &http_socket,
        &[("K3_REFERENCE", &reference_path)],
    );
    // Issue 34 point 9: the suite's refusals are each in the log with endpoint, status and
    // reason (the field at fault), and every answered request names its endpoint, its tool
    // count and its reused tokens.
    let log = d.log_text();
    for line in [
        "HTTP 400 on POST /v1/chat/completions: temperature: ",
        "HTTP 400 on POST /v1/chat/completions: messages[0].role: ",
        "HTTP 404 on POST /v1/chat/completions: model: ",
        "HTTP 404 on POST \"/v1/nothing\": ",
        "HTTP 413 on POST /v1/chat/completions: ",
        "HTTP 401 on GET /v1/models: the API key is not one of this daemon's keys",
        "HTTP 401 on GET /v1/models: an API key is required",
    ] {
        assert_eq!(log.matches(line).count(), 1, "{line:?} once in:\n{log}");
    }
    let answered = |endpoint: &str, tools: usize| {
        log.lines().any(|l| {
            l.contains(&format!("answered on POST {endpoint}: {tools} tools, "))
                && l.contains(" reused), ")
        })
    };
    assert!(
        answered("/v1/chat/completions", 1),
        "a tool request:\n{log}"
    );
    assert!(answered("/v1/chat/completions", 0), "{log}");
    assert!(answered("/v1/completions", 0), "{log}");
    assert!(answered("/v1/responses", 0), "{log}");
}

/// Anthropic's Messages API through the official `anthropic` package, against the OpenAI
/// route of the same daemon (the same conversation must render the same prompt and get the
/// same greedy reply), on the socket and on TCP with the key (issue 15 point 9).
#[tokio::test]
async fn the_anthropic_python_client_gets_what_the_openai_route_gets() {
    let python = python();
    let tmp = scratch("http-anthropic");
    // A small cap, so that a request over it (Claude Code's 32,000) is clamped quickly.
    let (d, http_socket, _c) = keyed_daemon(
        tmp.path(),
        &["--session-gb", "0.25", "--max-tokens-cap", "64"],
    )
    .await;
    pytest(&python, "test_anthropic.py", &d, &http_socket, &[]);
}

/// Constrained decoding (issue 34 point 6) through the official `openai` and `anthropic`
/// packages on the trained fixture: forced tool calls and JSON output parse, streamed and
/// whole, valid against their schemas by `jsonschema`; schemas outside the subset are refused
/// naming their path. The thinking budget (point 4) closes the fixture's endless thinking.
#[tokio::test]
async fn constrained_replies_parse_in_the_official_clients_and_are_valid() {
    let python = python();
    let tmp = scratch("http-constrained");
    let model = trained_model();
    let (d, http_socket, _c) =
        keyed_daemon_on(&model, tmp.path(), &["--thinking-budget", "16"]).await;
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/agent-tools");
    pytest_on(
        &model,
        &python,
        "test_constrained.py",
        &d,
        &http_socket,
        &[("K3_AGENT_TOOLS", &tools)],
    );
}

/// Issue 45.4: a forced tool choice is honoured within a small max_tokens, with the daemon's
/// default thinking budget (the fixture would think until it ran out), through the official
/// `openai` (Chat Completions and Responses) and `anthropic` packages, streamed and whole.
#[tokio::test]
async fn forced_tool_calls_are_made_within_max_tokens() {
    let python = python();
    let tmp = scratch("http-forced");
    let model = trained_model();
    let (d, http_socket, _c) = keyed_daemon_on(&model, tmp.path(), &[]).await;
    // test_forced.py takes its clients from test_constrained.py, which reads this at import.
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/agent-tools");
    pytest_on(
        &model,
        &python,
        "test_forced.py",
        &d,
        &http_socket,
        &[("K3_AGENT_TOOLS", &tools)],
    );
}

/// The committed trained checkpoint.
fn trained_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/trained/model")
}

#[test]
fn health_says_loading_and_generation_is_503_until_the_model_is_ready() {
    let tmp = scratch("http-loading");
    let dir = tmp.path();
    // The `small` shape takes seconds to load: the HTTP socket is up long before it is ready.
    let model = synth_model("small", &dir.join("small"));
    let http_socket = dir.join("http.sock");
    let endpoint = format!("unix:{}", http_socket.display());
    let d = Daemon::start(&model, &dir.join("k3d.sock"), &["--http", &endpoint]);
    d.wait_for_log("] loading ", Duration::from_secs(30));
    let (status, _, body) = http(&http_socket, "GET", "/health", "");
    assert_eq!(status, 503, "{body}");
    let health: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(health["status"], "loading", "{body}");
    assert!(health["progress"]["total"].is_number(), "{body}");
    let chat =
        r#"{"model": "small", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}"#;
    let (status, head, body) = http(&http_socket, "POST", "/v1/chat/completions", chat);
    assert_eq!(status, 503, "{body}");
    assert!(head.contains("retry-after: 1"), "{head}");
    let error: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("loading"),
        "{body}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _, body) = http(&http_socket, "GET", "/health", "");
        if status == 200 {
            assert!(body.contains("\"ready\""), "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not ready in 60 s: {body}\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, _, body) = http(&http_socket, "POST", "/v1/chat/completions", chat);
    assert_eq!(status, 200, "{body}");
    let reply: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(reply["usage"]["completion_tokens"], 2, "{body}");
}

#[test]
fn a_non_loopback_http_address_without_keys_is_refused_at_start() {
    let tmp = scratch("http-exposed");
    let dir = tmp.path();
    let out = Command::new(bin("k3d"))
        .args(["serve", "--model"])
        .arg(tiny_model())
        .arg("--socket")
        .arg(dir.join("k3d.sock"))
        .args(["--http", "0.0.0.0:0"])
        .output()
        .expect("run k3d");
    assert_eq!(out.status.code(), Some(2), "a usage error");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("0.0.0.0:0") && err.contains("http_api_keys"),
        "{err}"
    );
    assert!(!dir.join("k3d.sock").exists(), "nothing is left bound");
}

#[tokio::test]
async fn the_neovim_plugin_streams_a_reply_into_a_split_and_cancels() {
    let nvim = Path::new("/usr/bin/nvim");
    assert!(
        nvim.exists(),
        "nvim is missing: the editor plugin test needs Debian's neovim (./tests/run.sh installs it)"
    );
    let tmp = scratch("http-nvim");
    let dir = tmp.path();
    let http_socket = dir.join("http.sock");
    let endpoint = format!("unix:{}", http_socket.display());
    let socket = dir.join("k3d.sock");
    let _d = Daemon::start(tiny_model(), &socket, &["--http", &endpoint]);
    let mut c = client(&socket).await;
    wait_ready(&mut c).await;
    let (_, _, models) = http(&http_socket, "GET", "/v1/models", "");
    let models: serde_json::Value = serde_json::from_str(&models).expect("JSON");
    let ask = |content: &str, max_tokens: u32| -> serde_json::Value {
        let body = serde_json::json!({
            "model": models["data"][0]["id"],
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, "thinking": {"type": "disabled"},
        });
        let (code, _, reply) = http(
            &http_socket,
            "POST",
            "/v1/chat/completions",
            &body.to_string(),
        );
        assert_eq!(code, 200, "{reply}");
        serde_json::from_str(&reply).expect("JSON")
    };
    // The cancel needs a reply still running when its first text arrives: the random model
    // ends some turns within a few tokens, so take a prompt whose greedy reply runs 200.
    let prompt = (0..40)
        .map(|i| format!("Tell me story number {i}."))
        .find(|p| ask(p, 200)["choices"][0]["finish_reason"] == "length")
        .expect("a prompt with a long reply");
    // What the plugin must show: the whole (non-streamed) reply to the same request.
    let whole = ask(&prompt, 12);
    let expected = whole["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    let plugin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/editors/nvim");
    let out_path = dir.join("reply.txt");
    let before = status(&mut c).await.requests_cancelled;
    let run = tokio::task::spawn_blocking({
        let (plugin, out_path, http_socket, prompt) = (
            plugin.clone(),
            out_path.clone(),
            http_socket.clone(),
            prompt.clone(),
        );
        move || {
            Command::new("/usr/bin/nvim")
                .args(["--headless", "-u", "NONE", "-i", "NONE", "--cmd"])
                .arg(format!("set rtp^={}", plugin.display()))
                .arg("--cmd")
                .arg("runtime! plugin/k3.lua")
                .arg("-c")
                .arg(format!(
                    "luafile {}",
                    tests_dir().join("nvim_headless.lua").display()
                ))
                .env("K3_HTTP_SOCKET", &http_socket)
                .env("K3_OUT", &out_path)
                .env("K3_PROMPT", &prompt)
                .output()
                .expect("run nvim")
        }
    })
    .await
    .expect("nvim task");
    let error = std::fs::read_to_string(out_path.with_extension("txt.error")).unwrap_or_default();
    assert!(
        run.status.success() && error.is_empty(),
        "nvim failed ({}): {error}\n{}{}",
        run.status,
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let reply = std::fs::read_to_string(&out_path).expect("the plugin wrote the reply");
    assert_eq!(reply, expected, "the streamed split holds the whole reply");
    let cancel =
        std::fs::read_to_string(out_path.with_extension("txt.cancel")).expect("cancel result");
    assert_eq!(cancel, "cancelled");
    // Closing the connection stopped the compute.
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let s = status(&mut c).await;
        if s.active_requests == 0 {
            assert_eq!(s.requests_cancelled, before + 1);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cancelled reply still computes"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Every 400/404 quotes the caller's input cut short: a 100 KB role, model name or mistyped
/// field comes back as an excerpt with its length, not echoed whole.
#[test]
fn errors_quote_huge_inputs_cut_short_with_their_length() {
    let tmp = scratch("http-echo");
    let dir = tmp.path();
    let http_socket = dir.join("http.sock");
    let endpoint = format!("unix:{}", http_socket.display());
    let d = Daemon::start(tiny_model(), &dir.join("k3d.sock"), &["--http", &endpoint]);
    d.wait_for_log("HTTP API on", Duration::from_secs(30));
    let model = served_model(&http_socket);
    let huge = "x".repeat(100_000);
    let bodies = [
        (
            400,
            format!(
                r#"{{"model": "{model}", "messages": [{{"role": "{huge}", "content": "hi"}}]}}"#
            ),
        ),
        (
            404,
            format!(r#"{{"model": "{huge}", "messages": [{{"role": "user", "content": "hi"}}]}}"#),
        ),
        (
            400,
            format!(
                r#"{{"model": "{model}", "messages": [{{"role": "user", "content": "hi"}}], "max_tokens": "{huge}"}}"#
            ),
        ),
    ];
    for (want, body) in bodies {
        let (status, _, reply) = http(&http_socket, "POST", "/v1/chat/completions", &body);
        assert_eq!(status, want, "{}", &reply[..reply.len().min(300)]);
        let error: serde_json::Value = serde_json::from_str(&reply).expect("JSON");
        let message = error["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.len() < 1100,
            "{} bytes: {}",
            message.len(),
            &message[..200]
        );
        assert!(message.contains("bytes)"), "{message}");
    }
}

/// Issue 19 point 5 on HTTP: a caller at its per-uid limits gets 429 with Retry-After at once,
/// the message naming both limits, although a compute slot is free (it is another uid's).
#[tokio::test]
async fn a_uid_over_its_limits_gets_429_naming_them() {
    let tmp = scratch("http-uid-limits");
    let dir = tmp.path();
    let http_socket = dir.join("http.sock");
    let endpoint = format!("unix:{}", http_socket.display());
    let socket = dir.join("k3d.sock");
    let _d = Daemon::start(
        tiny_model(),
        &socket,
        &[
            "--http",
            &endpoint,
            "--max-active",
            "2",
            "--max-active-per-uid",
            "1",
            "--max-queued-per-uid",
            "0",
        ],
    );
    let mut c = client(&socket).await;
    wait_ready(&mut c).await;
    // This uid's one compute slot taken over gRPC; HTTP on the Unix socket is the same uid.
    let _running = computing(&mut c, prompt(0)).await;
    let ids = format!(
        r#"{{"model": "{}", "prompt": {:?}, "max_tokens": 2}}"#,
        served_model(&http_socket),
        prompt(1)
    );
    let (status, head, body) = http(&http_socket, "POST", "/v1/completions", &ids);
    assert_eq!(status, 429, "{body}");
    assert!(head.contains("retry-after: 1"), "{head}");
    let error: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let message = error["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("--max-active-per-uid 1") && message.contains("--max-queued-per-uid 0"),
        "{body}"
    );
}

/// A ready daemon on the tiny model with an HTTP endpoint on a Unix socket, and that socket.
async fn unix_http_daemon(dir: &Path, extra: &[&str]) -> (Daemon, PathBuf) {
    let http_socket = dir.join("http.sock");
    let endpoint = format!("unix:{}", http_socket.display());
    let mut args = vec!["--http", endpoint.as_str()];
    args.extend_from_slice(extra);
    let d = Daemon::start(tiny_model(), &dir.join("k3d.sock"), &args);
    wait_ready(&mut client(&d.socket).await).await;
    d.wait_for_log("HTTP API on", Duration::from_secs(30));
    (d, http_socket)
}

/// The error `reply` (either API's shape): its type, its message, and OpenAI's `param`.
fn error_of(reply: &str) -> (String, String, String) {
    let body: serde_json::Value = serde_json::from_str(reply).expect("a JSON error body");
    let field = |name: &str| body["error"][name].as_str().unwrap_or("").to_string();
    (field("type"), field("message"), field("param"))
}

/// Issue 45.5: a body with a key twice was answered from the last (`{"messages": [A],
/// "messages": [B]}` answered B): a parser differential against a proxy that reads the first.
/// Every route now refuses it with a 400 naming the key and where it is; and a Responses input
/// item without content is a 400 naming it, not an empty message answered 200.
#[tokio::test]
async fn duplicate_keys_and_a_contentless_responses_item_are_400_naming_them() {
    let tmp = scratch("http-dup");
    let (_d, http_socket) = unix_http_daemon(tmp.path(), &[]).await;
    let model = served_model(&http_socket);
    let a = r#"[{"role": "user", "content": "A"}]"#;
    let b = r#"[{"role": "user", "content": "B"}]"#;
    let top = |list: &str| {
        format!(r#"{{"model": "{model}", "{list}": {a}, "max_tokens": 2, "{list}": {b}}}"#)
    };
    let nested = format!(
        r#"{{"model": "{model}", "max_tokens": 2, "messages": [{{"role": "user", "content": "A", "content": "B"}}]}}"#
    );
    let prompt =
        format!(r#"{{"model": "{model}", "prompt": "A", "max_tokens": 2, "prompt": "B"}}"#);
    let cases = [
        ("/v1/chat/completions", top("messages"), "messages", ""),
        (
            "/v1/chat/completions",
            nested.clone(),
            "content",
            "messages[0]",
        ),
        ("/v1/completions", prompt, "prompt", ""),
        ("/v1/responses", top("input"), "input", ""),
        ("/v1/messages", top("messages"), "messages", ""),
        ("/v1/messages", nested.clone(), "content", "messages[0]"),
        ("/v1/messages/count_tokens", top("messages"), "messages", ""),
    ];
    for (route, body, key, at) in cases {
        let (status, _, reply) = http(&http_socket, "POST", route, &body);
        assert_eq!(status, 400, "{route}: {reply}");
        let (kind, message, param) = error_of(&reply);
        assert_eq!(kind, "invalid_request_error", "{route}: {reply}");
        assert!(
            message.contains(&format!("has the key \"{key}\" more than once")),
            "{route}: {reply}"
        );
        let path = if at.is_empty() {
            key.to_string()
        } else {
            format!("{at}.{key}")
        };
        if route.starts_with("/v1/messages") {
            // Anthropic's shape has no `param`: the message begins with the field.
            assert!(
                message.starts_with(&format!("{path}: ")),
                "{route}: {reply}"
            );
        } else {
            assert_eq!(param, path, "{route}: {reply}");
        }
    }

    for item in [
        r#"{"role": "user"}"#,
        r#"{"role": "user", "content": null}"#,
    ] {
        let body = format!(r#"{{"model": "{model}", "max_output_tokens": 2, "input": [{item}]}}"#);
        let (status, _, reply) = http(&http_socket, "POST", "/v1/responses", &body);
        assert_eq!(status, 400, "{item}: {reply}");
        let (_, message, param) = error_of(&reply);
        assert_eq!(param, "input[0].content", "{reply}");
        assert!(message.contains("is required"), "{reply}");
    }
    let output = format!(
        r#"{{"model": "{model}", "max_output_tokens": 2, "input": [{{"type": "function_call_output", "call_id": "c"}}]}}"#
    );
    let (status, _, reply) = http(&http_socket, "POST", "/v1/responses", &output);
    assert_eq!(status, 400, "{reply}");
    assert_eq!(error_of(&reply).2, "input[0].output", "{reply}");
}

/// Issue 45.5: a stream the shutdown cancelled after its grace got an error event typed
/// `invalid_request_error`, as if the client were at fault. It is the server's: OpenAI's
/// `server_error`, Anthropic's `overloaded_error`, and it says k3d was shutting down.
#[tokio::test]
async fn a_stream_cancelled_by_the_shutdown_gets_a_server_side_error_saying_so() {
    let tmp = scratch("http-shutdown");
    let (mut d, http_socket) = unix_http_daemon(tmp.path(), &["--shutdown-grace", "0.2"]).await;
    let model = served_model(&http_socket);
    let long = |route: &str| {
        let body = match route {
            "/v1/messages" => format!(
                r#"{{"model": "{model}", "max_tokens": 4000, "stream": true, "messages": [{{"role": "user", "content": "hi"}}]}}"#
            ),
            _ => format!(
                r#"{{"model": "{model}", "max_tokens": 4000, "stream": true, "thinking": {{"type": "disabled"}}, "messages": [{{"role": "user", "content": "hi"}}]}}"#
            ),
        };
        let mut s = std::os::unix::net::UnixStream::connect(&http_socket).expect("connect");
        write!(
            s,
            "POST {route} HTTP/1.1\r\nHost: k3d\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
        // Until its first event: it is computing.
        let mut first = [0u8; 512];
        let n = s.read(&mut first).expect("the stream's head");
        assert!(n > 0, "{route}: the stream began");
        (s, String::from_utf8_lossy(&first[..n]).into_owned())
    };
    let streams = [long("/v1/chat/completions"), long("/v1/messages")];
    d.signal(libc::SIGTERM);
    let mut seen = Vec::new();
    for (mut s, head) in streams {
        let mut rest = String::new();
        let _ = s.read_to_string(&mut rest);
        seen.push(head + &rest);
    }
    for (text, kind) in seen.iter().zip(["server_error", "overloaded_error"]) {
        let error = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|data| serde_json::from_str::<serde_json::Value>(data).ok())
            .find(|v| v.get("error").is_some())
            .unwrap_or_else(|| panic!("an error event: {text}"));
        assert_eq!(error["error"]["type"], kind, "{error}");
        let message = error["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains("shutting down"), "{error}");
    }
    assert_eq!(
        d.wait(Duration::from_secs(10)).code(),
        Some(0),
        "{}",
        d.log_text()
    );
}
