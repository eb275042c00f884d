//! The trained fixture holds a conversation (issue 34 point 7): a real `k3d serve` on
//! `tests/fixtures/trained/model`, asked over its HTTP API (chat completions, greedy) in the
//! shapes coding agents use, answers with well-formed turns that k3d's reply parser reads —
//! a call of the declared shell tool when tools are offered and the request is the last turn,
//! an answer once the tool's result is back, an answer with thinking and without when no tools
//! are offered. The model is trained for exactly this (`tools/train/conversations.py`); these
//! requests are not its training conversations (other wording, other tool sets).
//!
//! Ignored until the retrained fixture is committed: the model in the repository today was
//! trained before these conversations existed and holds no turn (with thinking on it writes
//! source-like text in the think channel until `max_tokens`), so these tests fail on it — they
//! are the acceptance check of the retrain (`cargo test -p k3-tests --test e2e_conversation -- --ignored`).

#[path = "e2e_support.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

fn trained_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/trained/model")
}

/// The daemon on the trained model, its HTTP API on `dir/http.sock`, once the model is loaded.
fn daemon(dir: &Path) -> (Daemon, PathBuf) {
    let http_socket = dir.join("http.sock");
    let http_arg = format!("unix:{}", http_socket.display());
    let d = Daemon::start(
        &trained_model(),
        &dir.join("k3d.sock"),
        &["--http", &http_arg],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !http_socket.exists() || http(&http_socket, "GET", "/health", "").0 != 200 {
        assert!(
            Instant::now() < deadline,
            "not healthy in 60 s:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (d, http_socket)
}

/// One greedy chat completion; its only choice, after checking the answer is a 200 with a
/// reply k3d's parser read (no `k3_malformed`).
fn complete(socket: &Path, d: &Daemon, mut body: Value) -> Value {
    body["model"] = json!("model");
    body["temperature"] = json!(0);
    body["max_tokens"] = json!(200);
    let (status, _, text) = http(socket, "POST", "/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{text}\ndaemon log:\n{}", d.log_text());
    let answer: Value = serde_json::from_str(&text).expect("a JSON answer");
    let choice = answer["choices"][0].clone();
    assert!(
        choice.get("k3_malformed").is_none(),
        "the reply is malformed: {choice}"
    );
    choice
}

fn tool(name: &str, description: &str, arguments: &[&str]) -> Value {
    let properties: serde_json::Map<String, Value> = arguments
        .iter()
        .map(|a| ((*a).to_string(), json!({"type": "string"})))
        .collect();
    json!({"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": [arguments[0]]},
    }})
}

/// The one call of a choice that must call `name`, with `key` among its string arguments; its
/// arguments as the object they parse to.
fn the_call(choice: &Value, name: &str, key: &str) -> Value {
    assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("no tool_calls: {choice}"));
    assert_eq!(calls.len(), 1, "{choice}");
    assert_eq!(calls[0]["function"]["name"], name, "{choice}");
    let arguments: Value = serde_json::from_str(
        calls[0]["function"]["arguments"]
            .as_str()
            .expect("arguments as JSON text"),
    )
    .expect("the arguments parse");
    let value = arguments[key].as_str().unwrap_or_default();
    assert!(!value.trim().is_empty(), "no {key} in {arguments}");
    calls[0].clone()
}

/// An answer in text that ends the turn, without calls.
fn the_answer(choice: &Value) -> String {
    assert_eq!(choice["finish_reason"], "stop", "{choice}");
    assert!(
        choice["message"]
            .get("tool_calls")
            .is_none_or(Value::is_null),
        "{choice}"
    );
    let content = choice["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!content.trim().is_empty(), "no content: {choice}");
    content
}

#[test]
#[ignore = "the committed trained fixture predates the conversational retrain (issue 34.7): run with --ignored on a retrained model, see tests/fixtures/trained/README.md"]
fn the_trained_fixture_calls_a_tool_and_answers_its_result() {
    let dir = scratch("conversation-tools");
    let (d, socket) = daemon(dir.path());
    // (tools, request, the shell tool and its command argument, thinking settings): the three
    // agents' shapes, with thinking at an effort, at the default and off.
    let cases = [
        (
            vec![
                tool("Read", "Reads a file.", &["file_path"]),
                tool("Bash", "Runs a bash command.", &["command", "description"]),
                tool("Write", "Writes a file.", &["file_path", "content"]),
            ],
            "List the files in the current directory.",
            ("Bash", "command"),
            json!({"reasoning_effort": "high"}),
        ),
        (
            vec![
                tool("exec_command", "Runs a command in a PTY.", &["cmd"]),
                tool("view_image", "Views an image.", &["path"]),
            ],
            "What is the git status?",
            ("exec_command", "cmd"),
            json!({}),
        ),
        (
            vec![
                tool("bash", "Executes a bash command.", &["command"]),
                tool("read", "Reads a file.", &["filePath"]),
            ],
            "Run the tests.",
            ("bash", "command"),
            json!({"thinking": false}),
        ),
    ];
    for (tools, request, (name, key), thinking) in cases {
        let mut body = json!({
            "tools": tools,
            "messages": [
                {"role": "system", "content": "You are a coding agent. Use the tools to help the user."},
                {"role": "user", "content": request},
            ],
        });
        for (k, v) in thinking.as_object().expect("settings") {
            body[k] = v.clone();
        }
        let choice = complete(&socket, &d, body.clone());
        let call = the_call(&choice, name, key);
        // The round trip: the call and its result go back; the model answers in text.
        let messages = body["messages"].as_array_mut().expect("messages");
        messages.push(
            json!({"role": "assistant", "content": choice["message"]["content"],
                             "tool_calls": [call.clone()]}),
        );
        messages.push(json!({"role": "tool", "tool_call_id": call["id"],
                             "content": "add.py\nREADME.md\n"}));
        the_answer(&complete(&socket, &d, body));
    }
}

#[test]
#[ignore = "the committed trained fixture predates the conversational retrain (issue 34.7): run with --ignored on a retrained model, see tests/fixtures/trained/README.md"]
fn the_trained_fixture_answers_without_tools_with_and_without_thinking() {
    let dir = scratch("conversation-plain");
    let (d, socket) = daemon(dir.path());
    let ask =
        json!([{"role": "user", "content": "Write a Python function that adds two numbers."}]);
    let thinking = complete(
        &socket,
        &d,
        json!({"messages": ask, "reasoning_effort": "low"}),
    );
    let reasoning = thinking["message"]["reasoning_content"]
        .as_str()
        .unwrap_or_default();
    assert!(!reasoning.trim().is_empty(), "no reasoning: {thinking}");
    assert!(the_answer(&thinking).contains("def "), "{thinking}");
    let plain = complete(&socket, &d, json!({"messages": ask, "thinking": false}));
    assert!(the_answer(&plain).contains("def "), "{plain}");
}
