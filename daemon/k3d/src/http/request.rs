//! OpenAI request bodies to the serve core's requests. Fields are read one by one from the
//! JSON object so a wrong value is a 400 naming exactly its field (`param`), and unknown fields
//! are ignored as clients expect (they send `user`, `metadata`, `store`, ...); known fields k3
//! cannot honour (`n > 1`, `logprobs`, non-text content parts) are refused, never ignored.

use super::error::ApiError;
use k3proto::v1 as pb;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// A request body as a JSON object whose fields are taken by name.
pub struct Fields(Map<String, Value>);

impl Fields {
    pub fn parse(body: &[u8]) -> Result<Fields, ApiError> {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(map)) => Ok(Fields(map)),
            Ok(_) => Err(ApiError::invalid(
                "",
                "the request body must be a JSON object",
            )),
            Err(e) => Err(ApiError::invalid(
                "",
                format!("the request body is not JSON: {e}"),
            )),
        }
    }

    /// The field `name` as a `T`; absent and `null` are `None`.
    pub fn get<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, ApiError> {
        value(name, self.0.get(name))
    }

    pub fn require<T: DeserializeOwned>(&self, name: &str) -> Result<T, ApiError> {
        self.get(name)?
            .ok_or_else(|| ApiError::invalid(name, format!("`{name}` is required")))
    }
}

fn value<T: DeserializeOwned>(name: &str, v: Option<&Value>) -> Result<Option<T>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => T::deserialize(v)
            .map(Some)
            .map_err(|e| ApiError::invalid(name, format!("`{name}`: {e}"))),
    }
}

/// `stop`: one string or a list of them.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// What chat and text completions share: sampling, limits, streaming.
pub struct Common {
    pub model: String,
    pub stream: bool,
    pub include_usage: bool,
    pub options: pb::GenerationOptions,
}

/// `max_tokens_fields` are the names the endpoint accepts for the output limit, in the order
/// OpenAI documents them (chat: `max_completion_tokens` supersedes `max_tokens`).
pub fn common(f: &Fields, max_tokens_fields: &[&str]) -> Result<Common, ApiError> {
    let model: String = f.require("model")?;
    if let Some(n) = f.get::<u64>("n")?
        && n != 1
    {
        return Err(ApiError::invalid(
            "n",
            format!("`n` = {n}: k3 generates one choice (n = 1)"),
        ));
    }
    // Chat takes a bool, completions an integer; either asks for what k3 does not return.
    match f.get::<Value>("logprobs")? {
        None | Some(Value::Bool(false)) => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "logprobs",
                "k3 does not return log probabilities",
            ));
        }
    }
    let mut max_tokens = 0u32;
    for name in max_tokens_fields {
        if let Some(n) = f.get::<u32>(name)? {
            if n == 0 {
                return Err(ApiError::invalid(
                    *name,
                    format!("`{name}` must be at least 1"),
                ));
            }
            max_tokens = n;
            break;
        }
    }
    let temperature = f.get::<f32>("temperature")?.unwrap_or(0.0);
    if !(temperature.is_finite() && (0.0..=2.0).contains(&temperature)) {
        return Err(ApiError::invalid(
            "temperature",
            "`temperature` must be between 0 and 2",
        ));
    }
    let top_p = f.get::<f32>("top_p")?.unwrap_or(1.0);
    if !(top_p.is_finite() && top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid("top_p", "`top_p` must be in (0, 1]"));
    }
    let seed = match f.get::<i64>("seed")? {
        // OpenAI's seed is a signed integer; the engine's is its bits.
        Some(s) => s as u64,
        None => 0,
    };
    let stop_strings = match f.get::<Stop>("stop")? {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stop_strings.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "a stop string is empty"));
    }
    let stream = f.get::<bool>("stream")?.unwrap_or(false);
    #[derive(serde::Deserialize)]
    struct StreamOptions {
        #[serde(default)]
        include_usage: bool,
    }
    let include_usage = f
        .get::<StreamOptions>("stream_options")?
        .is_some_and(|o| o.include_usage);
    Ok(Common {
        model,
        stream,
        include_usage,
        options: pb::GenerationOptions {
            max_tokens,
            sampling: Some(pb::Sampling {
                temperature,
                top_p,
                top_k: 0,
                seed,
            }),
            stop_ids: Vec::new(),
            stop_strings,
            speculate: 0,
        },
    })
}

/// `POST /v1/chat/completions`.
pub struct ChatParams {
    pub common: Common,
    pub request: pb::ChatRequest,
}

pub fn chat(f: &Fields) -> Result<ChatParams, ApiError> {
    let common = common(f, &["max_completion_tokens", "max_tokens"])?;
    let raw: Vec<Value> = f.require("messages")?;
    if raw.is_empty() {
        return Err(ApiError::invalid("messages", "`messages` is empty"));
    }
    let messages = raw
        .iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    refuse_tools(f)?;
    let (thinking, effort) = thinking(f)?;
    let options = common.options.clone();
    Ok(ChatParams {
        request: pb::ChatRequest {
            messages,
            thinking: thinking.into(),
            effort: effort.into(),
            options: Some(options),
            session: String::new(),
        },
        common,
    })
}

/// Tool calling needs the typed chat layer (spec §8.2 tool declarations, §8.4 tools block);
/// until it is wired in, a request that depends on it is refused rather than answered as if
/// the tools were not there.
fn refuse_tools(f: &Fields) -> Result<(), ApiError> {
    if f.get::<Vec<Value>>("tools")?.is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::invalid(
            "tools",
            "tool calling is not available in this k3d yet",
        ));
    }
    match f.get::<Value>("tool_choice")? {
        None => {}
        Some(Value::String(s)) if s == "none" || s == "auto" => {}
        Some(_) => {
            return Err(ApiError::invalid("tool_choice", "no tools are declared"));
        }
    }
    #[derive(serde::Deserialize)]
    struct Format {
        #[serde(rename = "type")]
        kind: String,
    }
    match f.get::<Format>("response_format")? {
        None => Ok(()),
        Some(fmt) if fmt.kind == "text" => Ok(()),
        Some(fmt) => Err(ApiError::invalid(
            "response_format",
            format!(
                "response_format {:?} is not available in this k3d yet",
                fmt.kind
            ),
        )),
    }
}

/// `reasoning_effort` and the `thinking` extension to K3's thinking switch and effort
/// (spec §8.2 accepts the efforts low, high and max). OpenAI's names map as: `none` → thinking
/// off; `minimal` and `low` → low; `medium` → high (the template refuses `medium`; OpenAI's own
/// default is medium, so a client sending its default gets the next effort up); `high` → high;
/// `xhigh` and `max` → max. Unset: thinking on with effort max (the official default).
/// `"thinking": {"type": "enabled" | "disabled"}` (the Kimi/DeepSeek APIs' switch) overrides.
fn thinking(f: &Fields) -> Result<(pb::Thinking, pb::Effort), ApiError> {
    let (mut thinking, effort) = match f.get::<String>("reasoning_effort")?.as_deref() {
        None => (pb::Thinking::Default, pb::Effort::Default),
        Some("none") => (pb::Thinking::Off, pb::Effort::Default),
        Some("minimal" | "low") => (pb::Thinking::On, pb::Effort::Low),
        Some("medium" | "high") => (pb::Thinking::On, pb::Effort::High),
        Some("xhigh" | "max") => (pb::Thinking::On, pb::Effort::Max),
        Some(other) => {
            return Err(ApiError::invalid(
                "reasoning_effort",
                format!(
                    "reasoning_effort {other:?}: use none, minimal, low, medium, high, xhigh or max"
                ),
            ));
        }
    };
    #[derive(serde::Deserialize)]
    struct Switch {
        #[serde(rename = "type")]
        kind: String,
    }
    match f.get::<Switch>("thinking")?.map(|s| s.kind).as_deref() {
        None => {}
        Some("enabled") => thinking = pb::Thinking::On,
        Some("disabled") => thinking = pb::Thinking::Off,
        Some(other) => {
            return Err(ApiError::invalid(
                "thinking",
                format!("thinking.type {other:?}: use \"enabled\" or \"disabled\""),
            ));
        }
    }
    Ok((thinking, effort))
}

fn message(i: usize, m: &Value) -> Result<pb::ChatMessage, ApiError> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let Value::Object(m) = m else {
        return Err(ApiError::invalid(
            format!("messages[{i}]"),
            "a message must be an object",
        ));
    };
    let role: String = value(&at("role"), m.get("role"))?
        .ok_or_else(|| ApiError::invalid(at("role"), "every message needs a `role`"))?;
    let role = match role.as_str() {
        // OpenAI's newer name for system instructions.
        "system" | "developer" => pb::Role::System,
        "user" => pb::Role::User,
        "assistant" => pb::Role::Assistant,
        "tool" => {
            return Err(ApiError::invalid(
                at("role"),
                "tool results need tool calling, which is not available in this k3d yet",
            ));
        }
        other => {
            return Err(ApiError::invalid(
                at("role"),
                format!("role {other:?}: use system, developer, user or assistant"),
            ));
        }
    };
    if m.get("tool_calls").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::invalid(
            at("tool_calls"),
            "tool calling is not available in this k3d yet",
        ));
    }
    let content = content(&at("content"), m.get("content"))?;
    let text = |field: &str| -> Result<String, ApiError> {
        Ok(value::<String>(&at(field), m.get(field))?.unwrap_or_default())
    };
    Ok(pb::ChatMessage {
        role: role.into(),
        content,
        reasoning: text("reasoning_content")?,
        name: text("name")?,
    })
}

/// `content`: a string, a list of `{"type": "text", "text": ...}` parts (joined in order), or
/// absent/null (an assistant turn that only called tools).
pub fn content(param: &str, v: Option<&Value>) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let at = format!("{param}[{j}]");
                let kind = part.get("type").and_then(Value::as_str);
                match (kind, part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (Some("text"), None) => {
                        return Err(ApiError::invalid(at, "a text part needs `text`"));
                    }
                    (other, _) => {
                        return Err(ApiError::invalid(
                            at,
                            format!(
                                "content part type {:?}: k3 reads text parts only",
                                other.unwrap_or("(none)")
                            ),
                        ));
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::invalid(
            param,
            "`content` must be a string or a list of text parts",
        )),
    }
}

/// `POST /v1/completions`: the prompt as text or token ids, continued without a template.
pub struct CompletionParams {
    pub common: Common,
    pub request: pb::GenerateRequest,
}

pub fn completion(f: &Fields) -> Result<CompletionParams, ApiError> {
    let common = common(f, &["max_tokens"])?;
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Prompt {
        Text(String),
        Ids(Vec<u32>),
        // One prompt per choice: k3 makes one choice, so a list holds exactly one.
        Texts(Vec<String>),
        IdLists(Vec<Vec<u32>>),
    }
    let one = |n: usize| {
        if n == 1 {
            Ok(())
        } else {
            Err(ApiError::invalid(
                "prompt",
                format!("{n} prompts given: k3 completes one per request"),
            ))
        }
    };
    let prompt = match f.require::<Prompt>("prompt")? {
        Prompt::Text(t) => pb::generate_request::Prompt::Text(t),
        Prompt::Ids(ids) => pb::generate_request::Prompt::Ids(pb::TokenIds { ids }),
        Prompt::Texts(mut v) => {
            one(v.len())?;
            pb::generate_request::Prompt::Text(v.remove(0))
        }
        Prompt::IdLists(mut v) => {
            one(v.len())?;
            pb::generate_request::Prompt::Ids(pb::TokenIds { ids: v.remove(0) })
        }
    };
    for refused in ["suffix", "echo", "best_of"] {
        match f.get::<Value>(refused)? {
            None | Some(Value::Bool(false)) => {}
            Some(Value::Number(n)) if refused == "best_of" && n.as_u64() == Some(1) => {}
            Some(_) => {
                return Err(ApiError::invalid(
                    refused,
                    format!("k3 does not support `{refused}`"),
                ));
            }
        }
    }
    Ok(CompletionParams {
        request: pb::GenerateRequest {
            prompt: Some(prompt),
            options: Some(common.options.clone()),
            session: String::new(),
        },
        common,
    })
}
