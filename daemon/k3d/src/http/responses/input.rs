//! OpenAI Responses bodies (`POST /v1/responses`, what Codex speaks) to the serve core's
//! requests: `instructions` and the `input` items become the chat layer's typed
//! `Conversation` — the same one the chat-completions route builds for the same turns, so the
//! same conversation renders the same prompt whichever API carries it.
//!
//! The items, as the `openai` SDK's `ResponseInputItemParam` defines them:
//! * messages (`{"role", "content"}`, with or without `"type": "message"`): `system` and
//!   `developer` are system messages, `user` and `assistant` theirs; content is a string or
//!   text parts (`input_text`, `output_text`; other parts are refused, naming them);
//! * `reasoning` (`content` of `reasoning_text` parts, else its `summary`) is the thinking of
//!   the assistant turn it precedes;
//! * `function_call` (`call_id`, `name`, `arguments`, `namespace`) joins the assistant turn in
//!   progress (a turn's message, then its calls, as the API returns them);
//! * `function_call_output` (`call_id`, `output` a string or text parts) is a tool message.
//!
//! Unknown top-level fields are ignored, as on the chat route (Codex sends `client_metadata`,
//! `include`, `prompt_cache_key`, ...). What k3d cannot honour is refused naming the field:
//! `previous_response_id` and `conversation` (k3d keeps no responses: send the whole
//! conversation, as Codex does with `store: false`), `background`, `top_logprobs`, non-text
//! parts, `item_reference` and other items. Hosted tools (`web_search`, `file_search`, ...)
//! run on OpenAI's side: k3d has none, so they are not declared to the model (the daemon logs
//! their names); a `namespace`'s function tools are declared as `NAMESPACE.NAME`, and a call
//! of one comes back with its `namespace`.

use crate::http::body::{
    Fields, JsonKind, Submission, function_tool, schema_format, text_parts, tool_choice, value,
};
use crate::http::error::ApiError;
use k3_engine::echo::Echo;
use k3_engine::engine::Sampling;
use k3_engine::serve::{Prompt, ThinkingBudget};
use k3_engine::tokenizer::chat::{
    Conversation, Message, ResponseFormat, Role, Thinking, Tool, ToolCall,
};
use serde_json::{Map, Value};

/// The generation options a response object repeats, as the request carries them to the core:
/// `null`, or the sampling defaults, where the client set nothing (the core applies its cap).
pub struct Options {
    pub max_output_tokens: Option<usize>,
    pub sampling: Sampling,
}

/// A `/v1/responses` body read.
pub struct Parsed {
    pub submission: Submission,
    /// What the response object repeats besides the submission's options.
    pub echoed: Echoed,
    /// Hosted tools named in the request and not declared to the model.
    pub hosted_tools: Vec<String>,
}

/// The request's settings a response object repeats (the SDK's `Response` requires
/// `tools`, `tool_choice` and `parallel_tool_calls`) as the client gave them.
pub struct Echoed {
    /// `max_output_tokens`, `temperature` and `top_p` as the request carries them to the core.
    pub options: Options,
    pub instructions: Option<String>,
    pub tools: Vec<Value>,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    /// As asked (`xhigh`, `minimal`, ...), not as mapped onto K3's efforts.
    pub reasoning_effort: Option<String>,
    pub text_format: Value,
    pub store: bool,
    pub metadata: Value,
    /// `NAMESPACE.NAME` → `NAMESPACE` for the declared functions of a namespace.
    pub namespaces: Vec<(String, String)>,
}

/// Fields whose values k3d cannot honour: refused, never ignored.
const REFUSED: [(&str, &str); 4] = [
    (
        "previous_response_id",
        "k3d keeps no responses: send the whole conversation in `input` (with `store: false`, \
         as Codex does)",
    ),
    (
        "conversation",
        "k3d keeps no conversations: send the whole conversation in `input`",
    ),
    ("prompt", "k3d has no stored prompt templates"),
    (
        "background",
        "k3d runs responses in the foreground only (a stream shows progress)",
    ),
];

pub fn responses(f: &Fields) -> Result<Parsed, ApiError> {
    // The Responses API has no seed, stop strings, logit bias or penalties.
    let mut submission = Submission::openai(f, &["max_output_tokens"])?;
    for (field, why) in REFUSED {
        match f.get::<Value>(field)? {
            None | Some(Value::Bool(false)) => {}
            Some(_) => return Err(ApiError::invalid(field, why)),
        }
    }
    if f.get::<u64>("top_logprobs")?.is_some_and(|n| n > 0) {
        return Err(ApiError::invalid(
            "top_logprobs",
            "k3 does not return log probabilities",
        ));
    }
    let instructions = f.get::<String>("instructions")?.filter(|s| !s.is_empty());
    let mut messages = Vec::new();
    if let Some(text) = &instructions {
        messages.push(Message::new(Role::System, text.clone()));
    }
    match f.kind("input") {
        None => return Err(ApiError::invalid("input", "`input` is required")),
        Some(JsonKind::String) => {
            messages.push(Message::new(Role::User, f.require::<String>("input")?))
        }
        Some(JsonKind::List) => read_items(f, &mut messages)?,
        Some(JsonKind::Other) => {
            return Err(ApiError::invalid(
                "input",
                "`input` must be a string or a list of items",
            ));
        }
    }
    if messages.is_empty() {
        return Err(ApiError::invalid("input", "`input` is empty"));
    }
    let declared = tools(f)?;
    let tool_choice = tool_choice(f)?;
    let parallel_tool_calls = f.get::<bool>("parallel_tool_calls")?.unwrap_or(true);
    let (text_format, response_format) = text_format(f)?;
    let reasoning = f.get::<Value>("reasoning")?;
    let reasoning_effort = match &reasoning {
        Some(r) => value::<String>("reasoning.effort", r.get("effort"))?,
        None => None,
    };
    let effort = match reasoning_effort.as_deref() {
        Some("xhigh") => Some("max"),
        other => other,
    };
    let thinking = Thinking::from_openai(None, effort)
        .map_err(|e| ApiError::invalid("reasoning.effort", e.to_string()))?;
    if let (Thinking::On(Some(effort)), Some(_)) = (thinking, effort) {
        submission.request.thinking_budget = Some(ThinkingBudget::Effort(effort));
    }
    let echoed = Echoed {
        options: Options {
            max_output_tokens: submission.request.max_tokens,
            sampling: submission.request.sampling.clone(),
        },
        instructions,
        tools: declared.echo,
        tool_choice: f
            .get::<Value>("tool_choice")?
            .unwrap_or_else(|| Value::from("auto")),
        parallel_tool_calls,
        reasoning_effort,
        text_format,
        store: f.get::<bool>("store")?.unwrap_or(true),
        metadata: f
            .get::<Value>("metadata")?
            .unwrap_or_else(|| Value::Object(Map::new())),
        namespaces: declared.namespaces,
    };
    let conversation = Conversation {
        messages,
        thinking,
        generation_prompt: true,
        tools: declared.tools,
        tool_choice,
        response_format,
        parallel_tool_calls,
    };
    submission.request.prompt = Prompt::Chat(conversation);
    Ok(Parsed {
        submission,
        echoed,
        hosted_tools: declared.hosted,
    })
}

/// `v` (at `at`) as a JSON object.
fn object<'v>(at: &str, v: &'v Value) -> Result<&'v Map<String, Value>, ApiError> {
    v.as_object()
        .ok_or_else(|| ApiError::invalid(at, "must be an object"))
}

fn text_field(at: &str, item: &Map<String, Value>, name: &str) -> Result<String, ApiError> {
    value::<String>(&format!("{at}.{name}"), item.get(name))?
        .ok_or_else(|| ApiError::invalid(format!("{at}.{name}"), format!("`{name}` is required")))
}

/// The assistant turn being read: its message in `messages`, while only its own items
/// (message text, function calls) follow.
struct Turn {
    /// Index of its assistant message.
    at: Option<usize>,
    /// A `reasoning` item's text, for the assistant message that follows it.
    reasoning: Option<String>,
}

/// The `input` items, one by one, into `out`.
fn read_items(f: &Fields, out: &mut Vec<Message>) -> Result<(), ApiError> {
    let mut turn = Turn {
        at: None,
        reasoning: None,
    };
    f.items("input", |i, item: Value| {
        read_item(i, &item, &mut turn, out)?;
        f.within_message_limit("input", out.len())
    })?;
    Ok(())
}

/// Item `i` of `input`: a message of its own, or part of the assistant turn being read.
fn read_item(
    i: usize,
    item: &Value,
    turn: &mut Turn,
    out: &mut Vec<Message>,
) -> Result<(), ApiError> {
    let at = format!("input[{i}]");
    let item = object(&at, item)?;
    let kind = item.get("type").and_then(Value::as_str);
    // An easy input message may leave `type` out.
    let kind = match (kind, item.get("role")) {
        (None, Some(_)) => "message",
        (Some(k), _) => k,
        (None, None) => {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                "an input item needs a `type` (or a `role`, for a message)",
            ));
        }
    };
    match kind {
        "message" => {
            let role: String = text_field(&at, item, "role")?;
            let content = required(&at, item, "content", "a string or a list of text parts")?;
            let content = text_parts(&format!("{at}.content"), Some(content), TEXT_PARTS)?;
            match role.as_str() {
                "assistant" => {
                    let message = assistant(turn, out);
                    message.content.push_str(&content);
                }
                "user" | "system" | "developer" => {
                    let role = if role == "user" {
                        Role::User
                    } else {
                        Role::System
                    };
                    out.push(Message::new(role, content));
                    turn.at = None;
                }
                other => {
                    return Err(ApiError::invalid(
                        format!("{at}.role"),
                        format!(
                            "role {}: use user, assistant, system or developer",
                            Echo(other)
                        ),
                    ));
                }
            }
        }
        "reasoning" => {
            let text = reasoning_text(&at, item)?;
            // A reasoning item opens the turn it belongs to.
            turn.at = None;
            turn.reasoning.get_or_insert_default().push_str(&text);
        }
        "function_call" => {
            let name = text_field(&at, item, "name")?;
            let name = match value::<String>(&format!("{at}.namespace"), item.get("namespace"))? {
                Some(namespace) if !namespace.is_empty() => format!("{namespace}.{name}"),
                _ => name,
            };
            let call = ToolCall {
                id: text_field(&at, item, "call_id")?,
                name,
                arguments: text_field(&at, item, "arguments")?,
            };
            assistant(turn, out).tool_calls.push(call);
        }
        "function_call_output" => {
            let id = text_field(&at, item, "call_id")?;
            let output = match required(&at, item, "output", "a string or a list of text parts")? {
                Value::String(s) => s.clone(),
                other => text_parts(&format!("{at}.output"), Some(other), TEXT_PARTS)?,
            };
            out.push(Message::tool(id, output));
            turn.at = None;
        }
        other => {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                format!(
                    "input item type {}: k3 reads message, reasoning, function_call and \
                     function_call_output items",
                    Echo(other)
                ),
            ));
        }
    }
    Ok(())
}

/// The field `name` an item must have (`what` it holds, for the refusal): absent or `null`
/// is a 400 naming it, not an empty message (issue 45.5: `{"role": "user"}` was answered).
fn required<'v>(
    at: &str,
    item: &'v Map<String, Value>,
    name: &str,
    what: &str,
) -> Result<&'v Value, ApiError> {
    match item.get(name) {
        Some(v) if !v.is_null() => Ok(v),
        _ => Err(ApiError::invalid(
            format!("{at}.{name}"),
            format!("`{at}.{name}` is required: {what}"),
        )),
    }
}

/// The assistant message of the turn being read, opened (with the reasoning that preceded it)
/// if there is none.
fn assistant<'m>(turn: &mut Turn, out: &'m mut Vec<Message>) -> &'m mut Message {
    let at = match turn.at {
        Some(at) => at,
        None => {
            let mut message = Message::new(Role::Assistant, String::new());
            message.reasoning = turn.reasoning.take();
            out.push(message);
            out.len() - 1
        }
    };
    turn.at = Some(at);
    &mut out[at]
}

/// A `reasoning` item's text: its `reasoning_text` content, else its summary (what a client
/// that asked for summaries only has of it).
fn reasoning_text(at: &str, item: &Map<String, Value>) -> Result<String, ApiError> {
    let parts = |field: &str| -> Result<Option<String>, ApiError> {
        let Some(list) = value::<Vec<Value>>(&format!("{at}.{field}"), item.get(field))? else {
            return Ok(None);
        };
        let mut text = String::new();
        for (j, part) in list.iter().enumerate() {
            let part_at = format!("{at}.{field}[{j}]");
            let part = object(&part_at, part)?;
            text.push_str(&text_field(&part_at, part, "text")?);
        }
        Ok(Some(text))
    };
    Ok(match parts("content")? {
        Some(text) if !text.is_empty() => text,
        _ => parts("summary")?.unwrap_or_default(),
    })
}

/// The text parts a Responses message's `content` (or a tool output) may hold.
const TEXT_PARTS: &[&str] = &["input_text", "output_text", "text"];

/// The tools as declared to the model, as echoed, and what was left out.
struct Declared {
    tools: Vec<Tool>,
    echo: Vec<Value>,
    hosted: Vec<String>,
    namespaces: Vec<(String, String)>,
}

/// Tools that run on OpenAI's side; k3d has none of them to offer.
const HOSTED: [&str; 9] = [
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "computer_use_preview",
    "computer",
    "image_generation",
    "mcp",
    "local_shell",
];

/// `tools`: flat function tools (`{"type": "function", "name", "description",
/// "parameters", "strict"}`), `namespace` groups of them, and hosted tools (left out).
fn tools(f: &Fields) -> Result<Declared, ApiError> {
    let mut declared = Declared {
        tools: Vec::new(),
        echo: Vec::new(),
        hosted: Vec::new(),
        namespaces: Vec::new(),
    };
    f.items("tools", |i, t: Value| {
        // Every entry counts, hosted ones too (a client sends a handful), and each function of
        // a namespace (below).
        f.within_tool_limit(i + 1)?;
        let t = &t;
        let at = format!("tools[{i}]");
        let object = object(&at, t)?;
        let kind = object.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "function" => {
                declared.tools.push(function_tool(&at, t)?);
                declared.echo.push(t.clone());
            }
            "namespace" => {
                let namespace = text_field(&at, object, "name")?;
                let inner: Vec<Value> =
                    value(&format!("{at}.tools"), object.get("tools"))?.unwrap_or_default();
                for (j, tool) in inner.iter().enumerate() {
                    let tool_at = format!("{at}.tools[{j}]");
                    if tool.get("type").and_then(Value::as_str) != Some("function") {
                        return Err(ApiError::invalid(
                            format!("{tool_at}.type"),
                            "k3 declares a namespace's function tools only",
                        ));
                    }
                    f.within_tool_limit(declared.tools.len() + 1)?;
                    let mut function = function_tool(&tool_at, tool)?;
                    let qualified = format!("{namespace}.{}", function.name);
                    declared
                        .namespaces
                        .push((qualified.clone(), namespace.clone()));
                    function.name = qualified;
                    declared.tools.push(function);
                }
                declared.echo.push(t.clone());
            }
            hosted if HOSTED.iter().any(|h| hosted.starts_with(h)) => {
                declared.hosted.push(hosted.to_string());
            }
            other => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    format!(
                        "tool type {}: k3 declares function tools (and namespaces of them)",
                        Echo(other)
                    ),
                ));
            }
        }
        Ok(())
    })?;
    Ok(declared)
}

/// `text.format`: `{"type": "text" | "json_object"}` or `{"type": "json_schema", "name",
/// "schema", "strict"}`; with what the response echoes.
fn text_format(f: &Fields) -> Result<(Value, ResponseFormat), ApiError> {
    let text = f.get::<Value>("text")?;
    let Some(format) = text
        .as_ref()
        .and_then(|t| t.get("format"))
        .filter(|v| !v.is_null())
    else {
        return Ok((serde_json::json!({"type": "text"}), ResponseFormat::Text));
    };
    let kind = format.get("type").and_then(Value::as_str);
    let response_format = match kind {
        Some("text") => ResponseFormat::Text,
        Some("json_object") => ResponseFormat::JsonObject,
        Some("json_schema") => schema_format("text.format.schema", format.get("schema"))?,
        other => {
            return Err(ApiError::invalid(
                "text.format.type",
                format!(
                    "format type {}: use text, json_object or json_schema",
                    Echo(other.unwrap_or("(none)"))
                ),
            ));
        }
    };
    Ok((format.clone(), response_format))
}
