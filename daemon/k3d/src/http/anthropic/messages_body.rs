//! Anthropic Messages bodies to the serve core's requests: the conversation as the chat layer's
//! typed `Conversation` (the same one the OpenAI route builds, so the same turns render the
//! same prompt), the options into the same core request the OpenAI routes build.
//!
//! Unlike OpenAI's clients, Anthropic's send no fields this route would have to ignore: any
//! field, block key or block type k3 does not know or cannot honour is a 400 naming it, so
//! nothing that would change the answer is dropped silently (issue 15 point 9). Keys that do
//! not change the answer are accepted: `metadata`, `service_tier`, `cache_control` (k3 reuses
//! prefixes by itself), a thinking block's `signature` (k3 does not sign its reasoning).

use crate::http::body::{Fields, Submission, not_empty, schema_format, value};
use crate::http::error::ApiError;
use k3_engine::echo::Echo;
use k3_engine::serve::{Api, Prompt, ThinkingBudget};
use k3_engine::tokenizer::chat::{
    Conversation, Effort, Message, ResponseFormat, Role, Thinking, Tool, ToolCall, ToolChoice,
};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// The fields that shape the prompt, which `count_tokens` takes too.
const CONVERSATION_FIELDS: [&str; 9] = [
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "output_config",
    "context_management",
    "cache_control",
];

/// The generation options `/v1/messages` takes besides; `prefix_reuse` is k3's extension
/// (as on the OpenAI routes).
const GENERATION_FIELDS: [&str; 9] = [
    "max_tokens",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "metadata",
    "service_tier",
    "prefix_reuse",
];

/// A `/v1/messages` body read: the options, the core's request, and whether the reasoning's
/// text is shown (`thinking.display`).
pub struct Parsed {
    pub submission: Submission,
    pub show_thinking: bool,
}

/// `POST /v1/messages`: the options and the core's request. `max_tokens` is required, as on
/// Anthropic's API; above the daemon's cap it is clamped to it, never refused (the core's
/// rule), and `stop_reason: "max_tokens"` says when it ended the reply.
pub fn messages(f: &Fields) -> Result<Parsed, ApiError> {
    let known: Vec<&str> = CONVERSATION_FIELDS
        .iter()
        .chain(&GENERATION_FIELDS)
        .copied()
        .collect();
    only_names(f.names(), "", &known)?;
    let asked = conversation(f)?;
    // Required, as on Anthropic's API.
    let max_tokens: usize = f.require("max_tokens")?;
    // The Messages API has no logit bias or penalties: the transform stays the identity.
    let mut submission = Submission::read(f, Api::Anthropic)?;
    let request = &mut submission.request;
    request.max_tokens = Some(max_tokens);
    // Absent, every token is sampled from, as on the OpenAI routes (the core's default).
    if let Some(top_k) = f.get::<usize>("top_k")? {
        request.sampling.top_k = top_k;
    }
    request.stop_strings = f.get("stop_sequences")?.unwrap_or_default();
    request.thinking_budget = asked.thinking_budget;
    request.cache_scope = f.get::<Metadata>("metadata")?.and_then(|m| m.user_id);
    request.prompt = Prompt::Chat(asked.conversation);
    Ok(Parsed {
        submission,
        show_thinking: asked.show_thinking,
    })
}

/// Anthropic's `metadata`: `user_id` names the caller (Claude Code sends its session there).
#[derive(serde::Deserialize)]
struct Metadata {
    user_id: Option<String>,
}

/// `POST /v1/messages/count_tokens`: the model named and the conversation to render.
pub fn count_tokens(f: &Fields) -> Result<(String, Conversation), ApiError> {
    only_names(f.names(), "", &CONVERSATION_FIELDS)?;
    Ok((f.require("model")?, conversation(f)?.conversation))
}

/// Refuses any key of `object` outside `known` (a `null` one counts as absent), naming it
/// under `at` (`messages[0].content[1]`; empty for the body itself).
fn only(object: &Map<String, Value>, at: &str, known: &[&str]) -> Result<(), ApiError> {
    only_names(
        object.iter().map(|(k, v)| (k.as_str(), v.is_null())),
        at,
        known,
    )
}

/// [`only`] for keys given with whether each is `null`.
fn only_names<'k>(
    keys: impl IntoIterator<Item = (&'k str, bool)>,
    at: &str,
    known: &[&str],
) -> Result<(), ApiError> {
    match keys
        .into_iter()
        .find(|&(k, null)| !null && !known.contains(&k))
    {
        None => Ok(()),
        Some((key, _)) => {
            let param = if at.is_empty() {
                key.to_string()
            } else {
                format!("{at}.{key}")
            };
            Err(ApiError::invalid(
                param,
                format!(
                    "k3 does not support the field {}; known here: {}",
                    Echo(key),
                    known.join(", ")
                ),
            ))
        }
    }
}

/// `v` (at `at`) as a JSON object.
fn object<'v>(at: &str, v: &'v Value) -> Result<&'v Map<String, Value>, ApiError> {
    v.as_object()
        .ok_or_else(|| ApiError::invalid(at, "must be an object"))
}

/// What a Messages body asks for besides its options: the conversation, K3's thinking budget
/// for it and whether the reasoning is shown.
pub struct Asked {
    pub conversation: Conversation,
    /// `thinking.budget_tokens`, or the share of the daemon's budget an effort stands for.
    pub thinking_budget: Option<ThinkingBudget>,
    /// `thinking.display: "omitted"` hides the reasoning's text (the blocks stay, empty).
    pub show_thinking: bool,
}

fn conversation(f: &Fields) -> Result<Asked, ApiError> {
    // First each turn's role alone, keeping nothing of the turns: where the last user turn is
    // (a system turn's per-turn settings apply after it) and whether the last is the
    // assistant's.
    #[derive(serde::Deserialize)]
    struct RoleOf {
        role: Option<String>,
    }
    let role_of = |raw: &RawValue| {
        serde_json::from_str::<RoleOf>(raw.get())
            .ok()
            .and_then(|r| r.role)
    };
    let (mut last_user, mut last_role) = (None, None);
    let count = f.items("messages", |i, raw: &RawValue| {
        last_role = role_of(raw);
        if last_role.as_deref() == Some("user") {
            last_user = Some(i);
        }
        Ok(())
    })?;
    not_empty("messages", count)?;
    let mut messages = Vec::new();
    if let Some(system) = f.get::<Value>("system")? {
        let text = text_content("system", &system)?;
        if !text.is_empty() {
            messages.push(Message::new(Role::System, text));
        }
    }
    let mut turn_effort = None;
    let count = f
        .items("messages", |i, raw: &RawValue| {
            let shown = Turn {
                index: i,
                later_user: last_user.is_some_and(|u| u > i),
            };
            let m: Value = serde_json::from_str(raw.get()).map_err(|e| {
                ApiError::invalid(format!("messages[{i}]"), format!("cannot be read: {e}"))
            })?;
            if let Some(effort) = turn(shown, &m, &ToolInputs::of_turn(raw)?, &mut messages)? {
                turn_effort = Some(effort);
            }
            f.within_message_limit("messages", messages.len())
        })?
        .unwrap_or_default();
    // Anthropic continues a final assistant turn (a "prefill"): so does K3's template, with
    // the message left open (`partial`), and the reply leaves the given text out.
    if last_role.as_deref() == Some("assistant") {
        let at = format!("messages[{}]", count.saturating_sub(1));
        let last = messages
            .last_mut()
            .ok_or_else(|| ApiError::internal(format!("{at} was not read")))?;
        if !last.tool_calls.is_empty() {
            return Err(ApiError::invalid(
                at,
                "the last message is an assistant turn with tool_use blocks: their results \
                 must follow in a user turn",
            ));
        }
        last.partial = true;
    }
    clear_thinking(f, &mut messages)?;
    let tools = tools(f)?;
    let (tool_choice, parallel_tool_calls) = tool_choice(f)?;
    let (thinking, response_format) = output_config(f, turn_effort)?;
    Ok(Asked {
        conversation: Conversation {
            messages,
            thinking: thinking.thinking,
            generation_prompt: true,
            tools,
            tool_choice,
            response_format,
            parallel_tool_calls,
        },
        thinking_budget: thinking.budget,
        show_thinking: thinking.shown,
    })
}

/// `context_management`: of its edits, `clear_thinking_20251015` decides which past thinking
/// is rendered — the reasoning of all but the `keep` most recent assistant turns (default 1,
/// Anthropic's) is left out. Edits that would need the server to rewrite tool results
/// (`clear_tool_uses_20250919`) or summarise (`compact_20260112`) are refused, naming them.
fn clear_thinking(f: &Fields, messages: &mut [Message]) -> Result<(), ApiError> {
    let Some(config) = f.get::<Value>("context_management")? else {
        return Ok(());
    };
    let config = object("context_management", &config)?;
    only(config, "context_management", &["edits"])?;
    let edits: Vec<Value> =
        value("context_management.edits", config.get("edits"))?.unwrap_or_default();
    for (i, edit) in edits.iter().enumerate() {
        let at = format!("context_management.edits[{i}]");
        let edit = object(&at, edit)?;
        match kind(&at, edit)? {
            "clear_thinking_20251015" => {
                only(edit, &at, &["type", "keep"])?;
                let keep = match edit.get("keep") {
                    None | Some(Value::Null) => Some(1),
                    Some(Value::String(s)) if s == "all" => None,
                    Some(Value::Object(keep)) => {
                        let keep_at = format!("{at}.keep");
                        match kind(&keep_at, keep)? {
                            "all" => None,
                            "thinking_turns" => Some(
                                value::<usize>(&format!("{keep_at}.value"), keep.get("value"))?
                                    .ok_or_else(|| {
                                        ApiError::invalid(
                                            format!("{keep_at}.value"),
                                            "`value` (the assistant turns to keep) is required",
                                        )
                                    })?,
                            ),
                            other => {
                                return Err(ApiError::invalid(
                                    format!("{keep_at}.type"),
                                    format!("keep type {}: use thinking_turns or all", Echo(other)),
                                ));
                            }
                        }
                    }
                    Some(_) => {
                        return Err(ApiError::invalid(
                            format!("{at}.keep"),
                            "`keep` must be \"all\" or {\"type\": \"thinking_turns\", \"value\": N}",
                        ));
                    }
                };
                if let Some(keep) = keep {
                    let mut kept = 0;
                    for m in messages
                        .iter_mut()
                        .rev()
                        .filter(|m| m.role == Role::Assistant)
                    {
                        if kept < keep {
                            kept += 1;
                        } else {
                            m.reasoning = None;
                        }
                    }
                }
            }
            other => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    format!(
                        "context edit {}: k3 applies clear_thinking_20251015 only",
                        Echo(other)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The `type` of a block or option, required.
fn kind<'v>(at: &str, object: &'v Map<String, Value>) -> Result<&'v str, ApiError> {
    object
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(format!("{at}.type"), "`type` (a string) is required"))
}

/// A string, or a list of `{"type": "text", "text"}` blocks joined in order (as the OpenAI
/// route joins text parts): `system` and a tool result's `content`.
fn text_content(at: &str, v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for (j, block) in blocks.iter().enumerate() {
                let at = format!("{at}[{j}]");
                let block = object(&at, block)?;
                match kind(&at, block)? {
                    "text" => text.push_str(&text_block(&at, block)?),
                    other => return Err(unsupported_block(&at, other, "text")),
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::invalid(
            at,
            "must be a string or a list of text blocks",
        )),
    }
}

fn text_block(at: &str, block: &Map<String, Value>) -> Result<String, ApiError> {
    only(block, at, &["type", "text", "cache_control", "citations"])?;
    if block
        .get("citations")
        .is_some_and(|c| c != &Value::Array(Vec::new()) && !c.is_null())
    {
        return Err(ApiError::invalid(
            format!("{at}.citations"),
            "k3 does not read citations",
        ));
    }
    value::<String>(&format!("{at}.text"), block.get("text"))?
        .ok_or_else(|| ApiError::invalid(format!("{at}.text"), "a text block needs `text`"))
}

fn unsupported_block(at: &str, kind: &str, allowed: &str) -> ApiError {
    ApiError::invalid(
        format!("{at}.type"),
        format!("block type {}: k3 reads {allowed} blocks here", Echo(kind)),
    )
}

/// Where a message stands: its index, and whether a user turn follows it.
#[derive(Clone, Copy)]
struct Turn {
    index: usize,
    later_user: bool,
}

/// Message `i`: a user turn becomes a user message, with each `tool_result` block a tool
/// message before it (Anthropic puts results first; the template wants them right after the
/// assistant turn that called, spec §8.2); an assistant turn one assistant message; a system
/// turn (Claude Code sends them mid-conversation) a system message, which K3's template takes
/// anywhere (spec §8.2). Returns a system turn's per-turn `output_config.effort` (with its
/// path) when no user turn follows it.
fn turn(
    t: Turn,
    m: &Value,
    inputs: &ToolInputs,
    out: &mut Vec<Message>,
) -> Result<Option<(String, String)>, ApiError> {
    let i = t.index;
    let at = format!("messages[{i}]");
    let m = object(&at, m)?;
    let role: String = value(&format!("{at}.role"), m.get("role"))?
        .ok_or_else(|| ApiError::invalid(format!("{at}.role"), "every message needs a `role`"))?;
    if role == "system" {
        return system_turn(t, m, out);
    }
    only(m, &at, &["role", "content"])?;
    let content_at = format!("{at}.content");
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            let role = match role.as_str() {
                "user" => Role::User,
                "assistant" => Role::Assistant,
                other => return Err(bad_role(&at, other)),
            };
            out.push(Message::new(role, s.clone()));
            return Ok(None);
        }
        Some(Value::Array(blocks)) if !blocks.is_empty() => blocks,
        _ => {
            return Err(ApiError::invalid(
                content_at,
                "`content` must be a string or a non-empty list of blocks",
            ));
        }
    };
    match role.as_str() {
        "user" => user_turn(&content_at, blocks, out)?,
        "assistant" => {
            let message = assistant_turn(&content_at, blocks, |j| inputs.get(j))?;
            out.push(message);
        }
        other => return Err(bad_role(&at, other)),
    }
    Ok(None)
}

/// `{"role": "system", "content", "clear_at", "output_config"}`: `clear_at:
/// "next_user_message"` shows it only until a user turn follows; `output_config.effort` sets
/// the effort of the turn it belongs to.
fn system_turn(
    t: Turn,
    m: &Map<String, Value>,
    out: &mut Vec<Message>,
) -> Result<Option<(String, String)>, ApiError> {
    let at = format!("messages[{}]", t.index);
    only(m, &at, &["role", "content", "clear_at", "output_config"])?;
    let shown = match value::<String>(&format!("{at}.clear_at"), m.get("clear_at"))?.as_deref() {
        None | Some("never") => true,
        Some("next_user_message") => !t.later_user,
        Some(other) => {
            return Err(ApiError::invalid(
                format!("{at}.clear_at"),
                format!("clear_at {}: use never or next_user_message", Echo(other)),
            ));
        }
    };
    let text = match m.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(c) => text_content(&format!("{at}.content"), c)?,
    };
    let effort = match m.get("output_config").filter(|c| !c.is_null()) {
        None => None,
        Some(config) => {
            let config_at = format!("{at}.output_config");
            let config = object(&config_at, config)?;
            only(config, &config_at, &["effort"])?;
            let effort_at = format!("{config_at}.effort");
            value::<String>(&effort_at, config.get("effort"))?.map(|e| (effort_at, e))
        }
    };
    if shown && !text.is_empty() {
        out.push(Message::new(Role::System, text));
    }
    Ok(effort.filter(|_| !t.later_user))
}

fn bad_role(at: &str, role: &str) -> ApiError {
    ApiError::invalid(
        format!("{at}.role"),
        format!("role {}: use user, assistant or system", Echo(role)),
    )
}

fn user_turn(at: &str, blocks: &[Value], out: &mut Vec<Message>) -> Result<(), ApiError> {
    let mut text: Option<String> = None;
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}[{j}]");
        let block = object(&at, block)?;
        match kind(&at, block)? {
            "text" => text
                .get_or_insert_default()
                .push_str(&text_block(&at, block)?),
            "tool_result" => {
                if let Some(text) = text.take() {
                    out.push(Message::new(Role::User, text));
                }
                out.push(tool_result(&at, block)?);
            }
            other => return Err(unsupported_block(&at, other, "text and tool_result")),
        }
    }
    if let Some(text) = text {
        out.push(Message::new(Role::User, text));
    }
    Ok(())
}

/// `{"type": "tool_result", "tool_use_id", "content", "is_error"}` as a tool message. The
/// template's tool message has no error mark (spec §8.2: `role`, `tool`, `index` only), so
/// `is_error` is checked and the result's own text is what tells the model it failed.
fn tool_result(at: &str, block: &Map<String, Value>) -> Result<Message, ApiError> {
    only(
        block,
        at,
        &[
            "type",
            "tool_use_id",
            "content",
            "is_error",
            "cache_control",
        ],
    )?;
    let id: String =
        value(&format!("{at}.tool_use_id"), block.get("tool_use_id"))?.ok_or_else(|| {
            ApiError::invalid(
                format!("{at}.tool_use_id"),
                "a tool_result needs `tool_use_id`",
            )
        })?;
    value::<bool>(&format!("{at}.is_error"), block.get("is_error"))?;
    let content = match block.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(c) => text_content(&format!("{at}.content"), c)?,
    };
    Ok(Message::tool(id, content))
}

/// An assistant turn's blocks: text (the response), `thinking` (its reasoning, rendered only
/// with thinking on, spec §8.2) and `tool_use` (its calls, `input` as the client wrote it).
fn assistant_turn(
    at: &str,
    blocks: &[Value],
    input: impl Fn(usize) -> Option<String>,
) -> Result<Message, ApiError> {
    let mut message = Message::new(Role::Assistant, String::new());
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}[{j}]");
        let block = object(&at, block)?;
        match kind(&at, block)? {
            "text" => message.content.push_str(&text_block(&at, block)?),
            "thinking" => {
                only(block, &at, &["type", "thinking", "signature"])?;
                let text: String =
                    value(&format!("{at}.thinking"), block.get("thinking"))?.unwrap_or_default();
                message.reasoning.get_or_insert_default().push_str(&text);
            }
            "tool_use" => {
                only(
                    block,
                    &at,
                    &["type", "id", "name", "input", "cache_control"],
                )?;
                let field = |name: &str| -> Result<String, ApiError> {
                    value::<String>(&format!("{at}.{name}"), block.get(name))?.ok_or_else(|| {
                        ApiError::invalid(format!("{at}.{name}"), format!("`{name}` is required"))
                    })
                };
                if !block.get("input").is_some_and(Value::is_object) {
                    return Err(ApiError::invalid(
                        format!("{at}.input"),
                        "`input` must be an object",
                    ));
                }
                let arguments = input(j).ok_or_else(|| {
                    ApiError::internal(format!("{at}.input was not found on the second reading"))
                })?;
                message.tool_calls.push(ToolCall {
                    id: field("id")?,
                    name: field("name")?,
                    arguments,
                });
            }
            other => return Err(unsupported_block(&at, other, "text, thinking and tool_use")),
        }
    }
    Ok(message)
}

/// Each `tool_use` block's `input` in one turn as the JSON text the client sent, by block.
/// `serde_json::Value` sorts object keys, but the template renders a call's arguments in their
/// order (spec §8.2), which must be the order the model wrote them in for the history to render
/// as it was generated (and for the warmed next turn to match): so the turn is read a second
/// time, keeping these texts raw.
struct ToolInputs(Vec<Option<String>>);

impl ToolInputs {
    fn of_turn(turn: &RawValue) -> Result<ToolInputs, ApiError> {
        #[derive(serde::Deserialize)]
        struct Turn<'a> {
            #[serde(borrow, default)]
            content: Option<&'a RawValue>,
        }
        #[derive(serde::Deserialize)]
        struct ToolResultBlock<'a> {
            #[serde(borrow, default)]
            input: Option<&'a RawValue>,
        }
        let unreadable = |e: serde_json::Error| {
            ApiError::invalid("messages", format!("the messages cannot be read: {e}"))
        };
        let turn: Turn = serde_json::from_str(turn.get()).map_err(unreadable)?;
        let blocks = match turn.content {
            Some(c) if c.get().starts_with('[') => {
                serde_json::from_str::<Vec<ToolResultBlock>>(c.get()).map_err(unreadable)?
            }
            _ => Vec::new(),
        };
        Ok(ToolInputs(
            blocks
                .into_iter()
                .map(|b| b.input.map(|i| i.get().to_string()))
                .collect(),
        ))
    }

    fn get(&self, block: usize) -> Option<String> {
        self.0.get(block)?.clone()
    }
}

/// `tools`: `[{"name", "description", "input_schema"}]` (client tools; Anthropic's server
/// tools, which have another `type`, run on Anthropic's side and are refused).
fn tools(f: &Fields) -> Result<Vec<Tool>, ApiError> {
    f.list("tools", |i, t| {
        f.within_tool_limit(i + 1)?;
        let at = format!("tools[{i}]");
        let t = object(&at, t)?;
        only(
            t,
            &at,
            &[
                "type",
                "name",
                "description",
                "input_schema",
                "cache_control",
            ],
        )?;
        if let Some(kind) = t.get("type").filter(|k| !k.is_null())
            && kind.as_str() != Some("custom")
        {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                "k3 declares client tools only (no `type`, or \"custom\")",
            ));
        }
        let name: String = value(&format!("{at}.name"), t.get("name"))?
            .filter(|n: &String| !n.is_empty())
            .ok_or_else(|| ApiError::invalid(format!("{at}.name"), "a tool needs a name"))?;
        let schema = t
            .get("input_schema")
            .filter(|s| s.is_object())
            .cloned()
            .ok_or_else(|| {
                ApiError::invalid(
                    format!("{at}.input_schema"),
                    "a tool needs `input_schema`, a JSON schema object",
                )
            })?;
        Ok(Tool {
            name,
            description: value(&format!("{at}.description"), t.get("description"))?,
            parameters: Some(schema),
        })
    })
}

/// `tool_choice`: `{"type": "auto" | "none"}` are the template's notes (spec §8.2 step 4: none
/// for auto, `none`); `any` and `{"type": "tool", "name"}` are enforced by constrained decoding
/// (a call, of that tool), as is `disable_parallel_tool_use` with them (exactly one call).
/// With `auto` nothing constrains the reply, so `disable_parallel_tool_use` there is refused,
/// not ignored. Returns the choice and whether parallel calls are allowed.
fn tool_choice(f: &Fields) -> Result<(ToolChoice, bool), ApiError> {
    let Some(choice) = f.get::<Value>("tool_choice")? else {
        return Ok((ToolChoice::Auto, true));
    };
    let choice = object("tool_choice", &choice)?;
    only(
        choice,
        "tool_choice",
        &["type", "name", "disable_parallel_tool_use"],
    )?;
    let single = value::<bool>(
        "tool_choice.disable_parallel_tool_use",
        choice.get("disable_parallel_tool_use"),
    )? == Some(true);
    let choice = match kind("tool_choice", choice)? {
        "auto" if single => {
            return Err(ApiError::invalid(
                "tool_choice.disable_parallel_tool_use",
                "with tool_choice \"auto\" nothing holds K3's reply to one tool call: use \
                 \"any\" or \"tool\" (enforced), or leave it out",
            ));
        }
        "auto" => ToolChoice::Auto,
        "none" => ToolChoice::None,
        "any" => ToolChoice::Required,
        "tool" => {
            let name: String = value("tool_choice.name", choice.get("name"))?.ok_or_else(|| {
                ApiError::invalid("tool_choice.name", "tool_choice \"tool\" needs `name`")
            })?;
            ToolChoice::Function(name)
        }
        other => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                format!(
                    "tool_choice type {}: use auto, any, tool or none",
                    Echo(other)
                ),
            ));
        }
    };
    Ok((choice, !single))
}

/// The thinking a Messages request asks for.
struct ThinkingAsk {
    thinking: Thinking,
    budget: Option<ThinkingBudget>,
    shown: bool,
}

/// `thinking` and `output_config` (`effort`, `format`) to K3's thinking switch, effort and
/// budget, and the response-format note. They are independent controls, as on Anthropic's
/// API:
///
/// * `thinking` switches it: off unless asked for (Anthropic's default; K3's template would
///   think by default). `{"type": "enabled", "budget_tokens": N}` thinks at most N tokens
///   (then k3d closes the thinking and the model answers); `{"type": "adaptive"}` thinks within
///   the budget of the effort (or the daemon's `--thinking-budget`); `{"type": "disabled"}`
///   does not think. `display: "omitted"` keeps the thinking blocks but empties their text.
/// * `output_config.effort` (`turn_effort`, a system message's per-turn one, overrides it) is
///   K3's effort note and the budget's share — with thinking on. With thinking off it changes
///   nothing K3 can express (the template renders an effort only in the think channel, spec
///   §8.2 step 2): accepted, not refused. `low` → `low`; `medium`, `high` → `high`; `xhigh`,
///   `max` → `max` (the OpenAI route's mapping).
fn output_config(
    f: &Fields,
    turn_effort: Option<(String, String)>,
) -> Result<(ThinkingAsk, ResponseFormat), ApiError> {
    let mut budget = None;
    let mut shown = true;
    let on = match f.get::<Value>("thinking")? {
        None => false,
        Some(t) => {
            let t = object("thinking", &t)?;
            only(
                t,
                "thinking",
                &["type", "budget_tokens", "display", "block_binding"],
            )?;
            match value::<String>("thinking.display", t.get("display"))?.as_deref() {
                None | Some("summarized" | "updates") => {}
                Some("omitted") => shown = false,
                Some(other) => {
                    return Err(ApiError::invalid(
                        "thinking.display",
                        format!("display {}: use summarized or omitted", Echo(other)),
                    ));
                }
            }
            match kind("thinking", t)? {
                "enabled" => {
                    let tokens = value::<usize>("thinking.budget_tokens", t.get("budget_tokens"))?
                        .filter(|&b| b > 0)
                        .ok_or_else(|| {
                            ApiError::invalid(
                                "thinking.budget_tokens",
                                "thinking \"enabled\" needs `budget_tokens`, a positive integer",
                            )
                        })?;
                    budget = Some(ThinkingBudget::Tokens(tokens));
                    true
                }
                "adaptive" => true,
                "disabled" => false,
                other => {
                    return Err(ApiError::invalid(
                        "thinking.type",
                        format!(
                            "thinking type {}: use enabled, adaptive or disabled",
                            Echo(other)
                        ),
                    ));
                }
            }
        }
    };
    let config = f.get::<Value>("output_config")?;
    let config = match &config {
        Some(c) => Some(object("output_config", c)?),
        None => None,
    };
    if let Some(c) = config {
        only(c, "output_config", &["effort", "format"])?;
    }
    let (effort_at, effort) = match turn_effort {
        Some((at, e)) => (at, Some(e)),
        None => (
            "output_config.effort".to_string(),
            config
                .map(|c| value::<String>("output_config.effort", c.get("effort")))
                .transpose()?
                .flatten(),
        ),
    };
    let effort = effort
        .map(|e| match e.as_str() {
            "low" => Ok(Effort::Low),
            "medium" | "high" => Ok(Effort::High),
            "xhigh" | "max" => Ok(Effort::Max),
            other => Err(ApiError::invalid(
                &effort_at,
                format!(
                    "effort {}: use low, medium, high, xhigh or max (thinking.type \"disabled\" turns thinking off)",
                    Echo(other)
                ),
            )),
        })
        .transpose()?;
    let thinking = match (on, effort) {
        (false, _) => Thinking::Off,
        // K3's default effort note (`max`) when none is asked for.
        (true, None) => Thinking::default(),
        (true, Some(effort)) => {
            budget = budget.or(Some(ThinkingBudget::Effort(effort)));
            Thinking::On(Some(effort))
        }
    };
    let thinking = ThinkingAsk {
        thinking,
        budget: budget.filter(|_| on),
        shown,
    };
    let format = match config
        .and_then(|c| c.get("format"))
        .filter(|v| !v.is_null())
    {
        None => ResponseFormat::Text,
        Some(format) => {
            let format = object("output_config.format", format)?;
            only(format, "output_config.format", &["type", "schema"])?;
            match kind("output_config.format", format)? {
                "json_schema" => {
                    schema_format("output_config.format.schema", format.get("schema"))?
                }
                other => {
                    return Err(ApiError::invalid(
                        "output_config.format.type",
                        format!("format type {}: use json_schema", Echo(other)),
                    ));
                }
            }
        }
    };
    Ok((thinking, format))
}
