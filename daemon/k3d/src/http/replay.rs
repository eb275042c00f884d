//! The first requests real agents sent (`tests/fixtures/agent-requests/`, captured against
//! k3d before issue 34, when each was refused or answered badly), replayed through the routes'
//! readers and the serve core's validation with the trained fixture's tokenizer: each must be
//! accepted and render a prompt. The agents themselves are run by `tests/e2e_agents.rs`.

use super::body::{self, Fields};
use super::{anthropic, responses};
use k3_engine::serve::validate::{ModelLimits, Validated, VocabCache, validate};
use k3_engine::serve::{Caller, Limits, Request};
use k3_engine::tokenizer::Tokenizer;
use k3_engine::tokenizer::chat::Role;
use serde_json::Value;
use std::path::Path;

fn fixtures() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures"))
}

/// A captured request: its path and its body as the agent sent it.
fn captured(name: &str) -> (String, Vec<u8>) {
    let path = fixtures().join("agent-requests").join(name);
    let text = std::fs::read_to_string(&path).expect("the captured request");
    let captured: Value = serde_json::from_str(&text).expect("JSON");
    let body = serde_json::to_vec(&captured["body"]).expect("the body");
    (captured["path"].as_str().expect("path").to_string(), body)
}

/// The serve core's validation on the trained fixture (its tokenizer, its context).
fn validated(request: Request) -> Validated {
    let tokenizer = Tokenizer::load(&fixtures().join("trained/model")).expect("tokenizer");
    let model = ModelLimits {
        vocab_size: tokenizer.vocab_size(),
        context: 1 << 20,
    };
    validate(
        &tokenizer,
        &VocabCache::default(),
        model,
        &Limits::default(),
        // A known caller: the conversation is kept for prefix reuse, so it can be inspected.
        Caller::Uid(1000),
        request,
    )
    .expect("validated")
}

#[test]
fn claude_codes_first_requests_are_accepted() {
    for name in ["claude-code.json", "claude-code-system-mid.json"] {
        let (path, body) = captured(name);
        assert!(path.starts_with("/v1/messages"), "{path}");
        let fields =
            Fields::parse(&body, Limits::default().max_prompt_tokens).expect("JSON object");
        let parsed = anthropic::messages_body::messages(&fields).expect(name);
        let v = validated(parsed.submission.request);
        let conversation = v.conversation.expect("a chat").0;
        // Its system message inside `messages` stands where it was sent (after the first user
        // turn), and the 24 tools are declared.
        let roles: Vec<Role> = conversation.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::System, Role::User, Role::System], "{name}");
        assert_eq!(conversation.tools.len(), 24);
        // 32,000 asked for, the daemon's cap given.
        assert_eq!(v.request.get().max_tokens, Limits::default().max_tokens_cap);
        // Adaptive thinking at effort "high": thinking on, effort high.
        assert!(conversation.thinking.is_on(), "{name}");
    }
}

#[test]
fn codexs_first_request_is_accepted() {
    let (path, body) = captured("codex.json");
    assert_eq!(path, "/v1/responses");
    let fields = Fields::parse(&body, Limits::default().max_prompt_tokens).expect("JSON object");
    let parsed = responses::input::responses(&fields).expect("codex");
    assert_eq!(parsed.hosted_tools, ["web_search"]);
    let v = validated(parsed.submission.request);
    let conversation = v.conversation.expect("a chat").0;
    let roles: Vec<Role> = conversation.messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::System, Role::System, Role::User, Role::User]);
    // Seven functions and the five of the `multi_agent_v1` namespace.
    assert_eq!(conversation.tools.len(), 12);
    assert!(
        conversation
            .tools
            .iter()
            .any(|t| t.name == "multi_agent_v1.spawn_agent")
    );
    assert_eq!(parsed.echoed.namespaces.len(), 5);
}

#[test]
fn aider_and_opencode_requests_are_accepted() {
    for name in [
        "aider.json",
        "opencode.json",
        "opencode-assistant-last.json",
    ] {
        let (path, body) = captured(name);
        assert_eq!(path, "/v1/chat/completions");
        let fields =
            Fields::parse(&body, Limits::default().max_prompt_tokens).expect("JSON object");
        let chat = body::chat(&fields).expect(name);
        let v = validated(chat.request);
        let conversation = v.conversation.expect("a chat").0;
        // Even when it ends with the assistant's message (opencode's retry), a new assistant
        // turn is generated.
        assert!(conversation.generation_prompt);
        assert!(conversation.continued().is_none(), "{name}");
    }
    // aider sends no max_tokens: the reply may run up to the cap, not 256.
    let (_, body) = captured("aider.json");
    let chat =
        body::chat(&Fields::parse(&body, Limits::default().max_prompt_tokens).expect("JSON"))
            .expect("aider");
    assert_eq!(
        validated(chat.request).request.get().max_tokens,
        Limits::default().max_tokens_cap
    );
}
