//! OpenAI request bodies to the serve core's requests (`k3_engine::serve::Request`, a chat as the
//! chat layer's typed `Conversation` with its tools). Fields are read one by one from the JSON
//! object so a wrong value is a 400 naming exactly its field (`param`), and unknown fields are
//! ignored as clients expect (they send `user`, `metadata`, `store`, ...); known fields k3
//! cannot honour (`n > 1`, `logprobs`, non-text content parts, a named `tool_choice`) are
//! refused, never ignored.

use super::error::ApiError;
use k3_engine::echo::Echo;
use k3_engine::engine::LogitTransform;
use k3_engine::serve::{Api, Prompt, Request, ServeError, ThinkingBudget, validate};
use k3_engine::tokenizer::chat::{
    Conversation, Message, ResponseFormat, Role, Thinking, Tool, ToolCall, ToolChoice,
};
use serde::Deserialize;
use serde::de::{DeserializeOwned, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// A request body as a JSON object whose fields are taken by name. The body is checked once
/// and each field is read from its text only when asked for, so a body never becomes one JSON
/// tree: a list (`messages`, `input`, `tools`) is read item by item ([`Fields::items`]), each
/// item a tree only while it is turned into its typed form, and a conversation is refused as
/// soon as it has more messages than `--max-prompt-tokens` could hold
/// ([`Fields::within_message_limit`]). What preparing a body keeps is then proportional to
/// what the daemon can admit, not to the body (issue 35 point 2).
pub struct Fields<'b> {
    fields: BTreeMap<String, &'b RawValue>,
    /// The daemon's `--max-prompt-tokens`.
    max_prompt_tokens: usize,
}

impl<'b> Fields<'b> {
    /// The body's fields; `max_prompt_tokens` is the daemon's limit, which bounds how many
    /// messages a conversation read from them may have.
    pub fn parse(body: &'b [u8], max_prompt_tokens: usize) -> Result<Fields<'b>, ApiError> {
        let not_json = |e: serde_json::Error| {
            ApiError::invalid("", format!("the request body is not JSON: {e}"))
        };
        let whole: &RawValue = serde_json::from_slice(body).map_err(not_json)?;
        if !whole.get().starts_with('{') {
            return Err(ApiError::invalid(
                "",
                "the request body must be a JSON object",
            ));
        }
        // Anywhere in the body, before any of it is read (issue 45.5).
        if let Some(duplicate) = super::unique::first_duplicate(whole.get()).map_err(not_json)? {
            return Err(ApiError::invalid(duplicate.param(), duplicate.to_string()));
        }
        Ok(Fields {
            fields: serde_json::from_str(whole.get()).map_err(not_json)?,
            max_prompt_tokens,
        })
    }

    /// The text of the field `name`; absent and `null` are `None`.
    fn raw(&self, name: &str) -> Option<&'b RawValue> {
        self.fields
            .get(name)
            .copied()
            .filter(|raw| raw.get() != "null")
    }

    /// The field `name` as a `T`; absent and `null` are `None`.
    pub fn get<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, ApiError> {
        let Some(raw) = self.raw(name) else {
            return Ok(None);
        };
        // Through a tree of this field alone, so a wrong value is described as before any
        // position in the body.
        let tree: Value = serde_json::from_str(raw.get())
            .map_err(|e| ApiError::invalid(name, format!("`{name}`: {e}")))?;
        value(name, Some(&tree))
    }

    pub fn require<T: DeserializeOwned>(&self, name: &str) -> Result<T, ApiError> {
        self.get(name)?
            .ok_or_else(|| ApiError::invalid(name, format!("`{name}` is required")))
    }

    /// What kind of value the field `name` is, without reading it; absent and `null` are
    /// `None`.
    pub fn kind(&self, name: &str) -> Option<JsonKind> {
        self.raw(name)
            .map(|raw| match raw.get().as_bytes().first() {
                Some(b'[') => JsonKind::List,
                Some(b'"') => JsonKind::String,
                _ => JsonKind::Other,
            })
    }

    /// The list field `name`, item by item: `each(index, item)` takes each item as a `T` (a
    /// [`Value`] tree of that item alone, or its raw text) while the next is still unread.
    /// Returns how many items there were; `None` when the field is absent or `null`. An error
    /// of `each` ends the reading and is returned.
    pub fn items<T: Deserialize<'b>>(
        &self,
        name: &str,
        each: impl FnMut(usize, T) -> Result<(), ApiError>,
    ) -> Result<Option<usize>, ApiError> {
        let Some(raw) = self.raw(name) else {
            return Ok(None);
        };
        if !raw.get().starts_with('[') {
            return Err(ApiError::invalid(name, format!("`{name}` must be a list")));
        }
        let mut reader = Items {
            each,
            refused: None,
            item: std::marker::PhantomData,
        };
        let mut items = serde_json::Deserializer::from_str(raw.get());
        match serde::Deserializer::deserialize_seq(&mut items, &mut reader) {
            Ok(count) => Ok(Some(count)),
            Err(e) => Err(reader
                .refused
                .take()
                .unwrap_or_else(|| ApiError::invalid(name, format!("`{name}`: {e}")))),
        }
    }

    /// The list field `name` (absent: empty), each item mapped by `each(index, item)`.
    pub fn list<T>(
        &self,
        name: &str,
        each: impl Fn(usize, &Value) -> Result<T, ApiError>,
    ) -> Result<Vec<T>, ApiError> {
        let mut out = Vec::new();
        self.items(name, |i, item: Value| {
            out.push(each(i, &item)?);
            Ok(())
        })?;
        Ok(out)
    }

    /// The names of the fields, each with whether it is `null`.
    pub fn names(&self) -> impl Iterator<Item = (&str, bool)> {
        self.fields
            .iter()
            .map(|(name, raw)| (name.as_str(), raw.get() == "null"))
    }

    /// Refuses a conversation read from these fields (the field `param`) once it has
    /// `messages` messages, more than the daemon's `--max-prompt-tokens` could hold (the core's
    /// rule, [`validate::within_message_limit`]): the reader stops there, keeping no more.
    pub fn within_message_limit(&self, param: &str, messages: usize) -> Result<(), ApiError> {
        validate::within_message_limit(self.max_prompt_tokens, messages)
            .map_err(|e| ApiError::from_serve(&ServeError::Invalid(e), Some(param)))
    }

    /// Refuses a request once its `tools` list has `tools` entries, more than the daemon's
    /// `--max-prompt-tokens` could hold ([`validate::within_tool_limit`]): the reader stops
    /// there, and nothing proportional to the list is done beyond reading it that far.
    pub fn within_tool_limit(&self, tools: usize) -> Result<(), ApiError> {
        validate::within_tool_limit(self.max_prompt_tokens, tools)
            .map_err(|e| ApiError::from_serve(&ServeError::Invalid(e), Some("tools")))
    }
}

/// What kind of value a field is ([`Fields::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonKind {
    List,
    String,
    Other,
}

/// A required list of `items` items (as [`Fields::items`] counted them) that must not be
/// empty.
pub fn not_empty(name: &str, items: Option<usize>) -> Result<(), ApiError> {
    match items {
        None => Err(ApiError::invalid(name, format!("`{name}` is required"))),
        Some(0) => Err(ApiError::invalid(name, format!("`{name}` is empty"))),
        Some(_) => Ok(()),
    }
}

/// Reads a list item by item for [`Fields::items`].
struct Items<T, F> {
    each: F,
    /// Why `each` stopped the reading.
    refused: Option<ApiError>,
    item: std::marker::PhantomData<T>,
}

impl<'de, T, F> Visitor<'de> for &mut Items<T, F>
where
    T: Deserialize<'de>,
    F: FnMut(usize, T) -> Result<(), ApiError>,
{
    type Value = usize;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let mut count = 0;
        while let Some(item) = seq.next_element::<T>()? {
            if let Err(e) = (self.each)(count, item) {
                self.refused = Some(e);
                return Err(serde::de::Error::custom("refused"));
            }
            count += 1;
        }
        Ok(count)
    }
}

/// `v` (the field `name`) as a `T`; absent and `null` are `None`.
pub fn value<T: DeserializeOwned>(name: &str, v: Option<&Value>) -> Result<Option<T>, ApiError> {
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

/// How a reply is written, besides what the core generates: wire-only.
pub struct Shape {
    /// The model the body names (checked against the daemon's, echoed in the reply).
    pub model: String,
    pub stream: bool,
    /// OpenAI's `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// The name this API gives `max_tokens`, for refusals that concern it.
    pub max_tokens_param: &'static str,
}

/// A body read: the reply's [`Shape`] and the core's one [`Request`], which holds what the
/// client asked and nothing decided — the core validates it and applies every default and
/// limit (`k3_engine::serve::limits`).
pub struct Submission {
    pub shape: Shape,
    pub request: Request,
}

impl Submission {
    /// What every API reads alike — `model`, `stream`, `temperature`, `top_p` and k3's
    /// `prefix_reuse` — with the prompt still to be read (empty until the route's reader sets it).
    pub fn read(f: &Fields, api: Api) -> Result<Submission, ApiError> {
        let mut request = Request::new(Prompt::Ids(Vec::new()));
        request.api = api;
        // Absent, the core's defaults stand (`Sampling::default`: greedy).
        if let Some(temperature) = f.get::<f32>("temperature")? {
            request.sampling.temperature = temperature;
        }
        if let Some(top_p) = f.get::<f32>("top_p")? {
            request.sampling.top_p = top_p;
        }
        request.reuse = f.get::<bool>("prefix_reuse")?;
        Ok(Submission {
            shape: Shape {
                model: f.require("model")?,
                stream: f.get::<bool>("stream")?.unwrap_or(false),
                include_usage: false,
                max_tokens_param: "max_tokens",
            },
            request,
        })
    }

    /// [`Self::read`] for OpenAI's routes, with `max_tokens` read from the first of
    /// `max_tokens_fields` given and `prompt_cache_key` as the cache scope.
    pub fn openai(f: &Fields, max_tokens_fields: &[&'static str]) -> Result<Submission, ApiError> {
        let mut submission = Submission::read(f, Api::OpenAi)?;
        for &name in max_tokens_fields {
            if let Some(n) = f.get::<usize>(name)? {
                submission.request.max_tokens = Some(n);
                submission.shape.max_tokens_param = name;
                break;
            }
        }
        submission.request.cache_scope = f.get::<String>("prompt_cache_key")?;
        Ok(submission)
    }
}

/// What Chat Completions and Completions read alike: [`Submission::openai`], the fields k3
/// cannot honour refused (`n > 1`, `logprobs`), `seed`, `stop`, `stream_options`, and the
/// logit bias and penalties.
fn completions(f: &Fields, max_tokens_fields: &[&'static str]) -> Result<Submission, ApiError> {
    let mut submission = Submission::openai(f, max_tokens_fields)?;
    if let Some(n) = f.get::<u64>("n")?
        && n != 1
    {
        return Err(ApiError::invalid(
            "n",
            format!("`n` = {n}: k3 generates one choice (n = 1)"),
        ));
    }
    match f.get::<Value>("logprobs")? {
        None | Some(Value::Bool(false)) => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "logprobs",
                "k3 does not return log probabilities",
            ));
        }
    }
    let request = &mut submission.request;
    if let Some(seed) = f.get::<i64>("seed")? {
        request.sampling.seed = seed as u64;
    }
    request.stop_strings = match f.get::<Stop>("stop")? {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    #[derive(serde::Deserialize)]
    struct StreamOptions {
        #[serde(default)]
        include_usage: bool,
    }
    submission.shape.include_usage = f
        .get::<StreamOptions>("stream_options")?
        .is_some_and(|o| o.include_usage);
    submission.request.transform = logit_transform(f)?;
    Ok(submission)
}

/// `logit_bias` (token ids as keys), `frequency_penalty` and `presence_penalty` as the wire
/// gives them; their ranges are the engine's rules, checked by the core.
fn logit_transform(f: &Fields) -> Result<LogitTransform, ApiError> {
    let map = f
        .get::<BTreeMap<String, f32>>("logit_bias")?
        .unwrap_or_default();
    let mut bias = Vec::with_capacity(map.len());
    for (key, value) in map {
        let id = key.parse::<u32>().map_err(|_| {
            ApiError::invalid(
                "logit_bias",
                format!("`logit_bias` key {} is not a token id", Echo(&key)),
            )
        })?;
        bias.push((id, value));
    }
    bias.sort_by_key(|&(id, _)| id);
    let unchanged = LogitTransform::default();
    Ok(LogitTransform {
        bias,
        frequency_penalty: f
            .get::<f32>("frequency_penalty")?
            .unwrap_or(unchanged.frequency_penalty),
        presence_penalty: f
            .get::<f32>("presence_penalty")?
            .unwrap_or(unchanged.presence_penalty),
    })
}

/// `POST /v1/chat/completions`.
pub fn chat(f: &Fields) -> Result<Submission, ApiError> {
    let mut submission = completions(f, &["max_completion_tokens", "max_tokens"])?;
    let mut messages = Vec::new();
    let read = f.items("messages", |i, m: Value| {
        f.within_message_limit("messages", i + 1)?;
        messages.push(message(i, &m)?);
        Ok(())
    })?;
    not_empty("messages", read)?;
    let tools = tools(f)?;
    let tool_choice = tool_choice(f)?;
    let thinking = thinking(f)?;
    // An effort the client chose bounds the thinking by its share of the daemon's budget;
    // without one the daemon's budget applies.
    if let (Thinking::On(Some(effort)), Some(_)) = (thinking, f.get::<String>("reasoning_effort")?)
    {
        submission.request.thinking_budget = Some(ThinkingBudget::Effort(effort));
    }
    let conversation = Conversation {
        messages,
        thinking,
        generation_prompt: true,
        tools,
        tool_choice,
        response_format: response_format(f)?,
        parallel_tool_calls: f.get::<bool>("parallel_tool_calls")?.unwrap_or(true),
    };
    submission.request.prompt = Prompt::Chat(conversation);
    Ok(submission)
}

/// `tools`: `[{"type": "function", "function": {"name", "description", "parameters"}}]`.
fn tools(f: &Fields) -> Result<Vec<Tool>, ApiError> {
    f.list("tools", |i, t| {
        f.within_tool_limit(i + 1)?;
        let at = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                "k3 declares function tools only (`\"type\": \"function\"`)",
            ));
        }
        let function = t.get("function").filter(|v| v.is_object()).ok_or_else(|| {
            ApiError::invalid(format!("{at}.function"), "a tool needs `function`")
        })?;
        function_tool(&format!("{at}.function"), function)
    })
}

/// A function's declaration, `{"name", "description", "parameters"}` at `at` (chat completions
/// nest it under `function`, the Responses API does not).
pub fn function_tool(at: &str, function: &Value) -> Result<Tool, ApiError> {
    let name: String = value(&format!("{at}.name"), function.get("name"))?
        .ok_or_else(|| ApiError::invalid(format!("{at}.name"), "a tool needs a name"))?;
    if name.is_empty() {
        return Err(ApiError::invalid(format!("{at}.name"), "the name is empty"));
    }
    let parameters = function.get("parameters").filter(|p| !p.is_null()).cloned();
    if parameters.as_ref().is_some_and(|p| !p.is_object()) {
        return Err(ApiError::invalid(
            format!("{at}.parameters"),
            "`parameters` must be a JSON schema object",
        ));
    }
    Ok(Tool {
        name,
        description: value(&format!("{at}.description"), function.get("description"))?,
        parameters,
    })
}

/// `tool_choice`: `"auto"`, `"none"`, `"required"`, or a named function
/// (`{"type": "function", "function": {"name"}}`); `required` and a named function are
/// enforced by constrained decoding (the reply is a call, of that function). The Responses
/// API names the function flat (`{"type": "function", "name"}`): both shapes are read. Whether
/// the tools allow the choice is the core's rule.
pub fn tool_choice(f: &Fields) -> Result<ToolChoice, ApiError> {
    let choice = match f.get::<Value>("tool_choice")? {
        None => return Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice {}: use auto, none or required", Echo(other)),
                ));
            }
        },
        Some(named) => {
            let name = named
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| named.get("name"))
                .and_then(Value::as_str)
                .filter(|_| named.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "a named tool_choice is {\"type\": \"function\", \"function\": \
                         {\"name\": …}}",
                    )
                })?;
            ToolChoice::Function(name.to_owned())
        }
    };
    Ok(choice)
}

/// A `json_schema` format's schema (`param` names it): the template's `json_schema` note.
pub fn schema_format(param: &str, schema: Option<&Value>) -> Result<ResponseFormat, ApiError> {
    schema
        .filter(|s| s.is_object())
        .cloned()
        .map(ResponseFormat::JsonSchema)
        .ok_or_else(|| {
            ApiError::invalid(
                param,
                "a json_schema response format needs its schema (an object)",
            )
        })
}

/// `response_format`: `{"type": "text" | "json_object"}` or
/// `{"type": "json_schema", "json_schema": {"schema": {...}}}`.
fn response_format(f: &Fields) -> Result<ResponseFormat, ApiError> {
    let Some(format) = f.get::<Value>("response_format")? else {
        return Ok(ResponseFormat::Text);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject),
        Some("json_schema") => schema_format(
            "response_format.json_schema.schema",
            format.get("json_schema").and_then(|s| s.get("schema")),
        ),
        other => Err(ApiError::invalid(
            "response_format.type",
            format!(
                "response_format type {}: use text, json_object or json_schema",
                Echo(other.unwrap_or("(none)"))
            ),
        )),
    }
}

/// `reasoning_effort` and the `thinking` extension to K3's thinking switch and effort
/// (the chat layer's `Thinking::from_openai`: `none` → off; `minimal`/`low` → low; `medium`
/// and `high` → high; `max` (and OpenAI's `xhigh`) → max; unset → on with effort max, the
/// official default). `"thinking": {"type": "enabled" | "disabled"}` (the Kimi/DeepSeek APIs'
/// switch) or a bare bool sets the switch; off with an effort is a contradiction, refused.
fn thinking(f: &Fields) -> Result<Thinking, ApiError> {
    let effort = f.get::<String>("reasoning_effort")?;
    let effort = match effort.as_deref() {
        Some("xhigh") => Some("max"),
        other => other,
    };
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Switch {
        Bool(bool),
        Typed {
            #[serde(rename = "type")]
            kind: String,
        },
    }
    let switch = match f.get::<Switch>("thinking")? {
        None => None,
        Some(Switch::Bool(b)) => Some(b),
        Some(Switch::Typed { kind }) => match kind.as_str() {
            "enabled" => Some(true),
            "disabled" => Some(false),
            other => {
                return Err(ApiError::invalid(
                    "thinking",
                    format!(
                        "thinking.type {}: use \"enabled\" or \"disabled\"",
                        Echo(other)
                    ),
                ));
            }
        },
    };
    Thinking::from_openai(switch, effort).map_err(|e| {
        let param = if effort.is_some() {
            "reasoning_effort"
        } else {
            "thinking"
        };
        ApiError::invalid(param, e.to_string())
    })
}

fn message(i: usize, m: &Value) -> Result<Message, ApiError> {
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
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        other => {
            return Err(ApiError::invalid(
                at("role"),
                format!(
                    "role {}: use system, developer, user, assistant or tool",
                    Echo(other)
                ),
            ));
        }
    };
    let content = text_parts(&at("content"), m.get("content"), CHAT_TEXT_PARTS)?;
    let text = |field: &str| -> Result<Option<String>, ApiError> {
        Ok(value::<String>(&at(field), m.get(field))?.filter(|s| !s.is_empty()))
    };
    let tool_calls = match m.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(j, c)| tool_call(&at(&format!("tool_calls[{j}]")), c))
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid(
                at("tool_calls"),
                "`tool_calls` must be a list",
            ));
        }
    };
    Ok(Message {
        reasoning: text("reasoning_content")?,
        name: text("name")?,
        tool_calls,
        tool_call_id: text("tool_call_id")?,
        // Kimi's Partial Mode: the final assistant message is continued, not answered.
        partial: value::<bool>(&at("partial"), m.get("partial"))?.unwrap_or(false),
        ..Message::new(role, content)
    })
}

/// An assistant message's `tool_calls[j]`: `{"id", "type": "function", "function": {"name",
/// "arguments"}}`, arguments as JSON text (checked by the template when it renders them).
fn tool_call(at: &str, c: &Value) -> Result<ToolCall, ApiError> {
    let function = c.get("function").filter(|v| v.is_object()).ok_or_else(|| {
        ApiError::invalid(format!("{at}.function"), "a tool call needs `function`")
    })?;
    let field = |v: Option<&Value>, name: &str| -> Result<String, ApiError> {
        value::<String>(&format!("{at}.{name}"), v)?.ok_or_else(|| {
            ApiError::invalid(format!("{at}.{name}"), format!("`{name}` is required"))
        })
    };
    Ok(ToolCall {
        id: field(c.get("id"), "id")?,
        name: field(function.get("name"), "function.name")?,
        arguments: field(function.get("arguments"), "function.arguments")?,
    })
}

/// The text parts chat completions reads in a message's `content`.
const CHAT_TEXT_PARTS: &[&str] = &["text"];

/// A message's `content`: a string, a list of text parts (`{"type": K, "text": ...}` with `K`
/// one of `kinds`, joined in order), or absent/null (an assistant turn that only called tools).
/// Chat completions and the Responses API read the same shape with their own part types.
pub fn text_parts(at: &str, v: Option<&Value>, kinds: &[&str]) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let part_at = format!("{at}[{j}]");
                let kind = part.get("type").and_then(Value::as_str);
                if !kind.is_some_and(|k| kinds.contains(&k)) {
                    return Err(ApiError::invalid(
                        format!("{part_at}.type"),
                        format!(
                            "content part type {}: k3 reads text parts only",
                            Echo(kind.unwrap_or("(none)"))
                        ),
                    ));
                }
                match part.get("text").and_then(Value::as_str) {
                    Some(t) => text.push_str(t),
                    None => {
                        return Err(ApiError::invalid(
                            format!("{part_at}.text"),
                            "a text part needs `text` (a string)",
                        ));
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::invalid(
            at,
            "must be a string or a list of text parts",
        )),
    }
}

/// `POST /v1/completions`: the prompt as text or token ids, continued without a template.
pub fn completion(f: &Fields) -> Result<Submission, ApiError> {
    let mut submission = completions(f, &["max_tokens"])?;
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Given {
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
    let prompt = match f.require::<Given>("prompt")? {
        Given::Text(t) => Prompt::Text(t),
        Given::Ids(ids) => Prompt::Ids(ids),
        Given::Texts(mut v) => {
            one(v.len())?;
            Prompt::Text(v.remove(0))
        }
        Given::IdLists(mut v) => {
            one(v.len())?;
            Prompt::Ids(v.remove(0))
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
    submission.request.prompt = prompt;
    Ok(submission)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k3_engine::tokenizer::chat;

    /// A chat body of `count` one-letter user messages, then `after` as further items.
    fn chat_body(count: usize, after: &str) -> Vec<u8> {
        let mut items = vec![r#"{"role":"user","content":"a"}"#; count].join(",");
        items.push_str(after);
        format!(r#"{{"model":"k3","messages":[{items}]}}"#).into_bytes()
    }

    /// `refused` is the 400 of a request over `--max-prompt-tokens` (`limit`), on `param`,
    /// saying `says`.
    fn over_the_prompt_limit(refused: &ApiError, param: &str, says: &str, limit: usize) {
        assert_eq!(refused.status, axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(refused.code, Some("context_length_exceeded"));
        assert_eq!(refused.param.as_deref(), Some(param));
        let accepts = format!("{limit} this daemon accepts (--max-prompt-tokens)");
        assert!(
            refused.message.contains(says) && refused.message.contains(&accepts),
            "{}",
            refused.message
        );
    }

    #[test]
    fn a_conversation_is_refused_as_soon_as_it_has_more_messages_than_the_limit_can_hold() {
        // 70 tokens hold at most 10 messages of at least 7 ids each.
        let limit = 10 * chat::LEAST_IDS_PER_MESSAGE;
        let body = chat_body(10, "");
        let read = chat(&Fields::parse(&body, limit).expect("fields")).expect("10 messages");
        let Prompt::Chat(conversation) = read.request.prompt else {
            panic!("not a chat");
        };
        assert_eq!(conversation.messages.len(), 10);
        // The 11th is refused before anything after it is read: the broken item that follows
        // is never looked at.
        let body = chat_body(11, r#",{"role":5}"#);
        let refused = chat(&Fields::parse(&body, limit).expect("fields"))
            .err()
            .expect("refused");
        over_the_prompt_limit(&refused, "messages", "at least 11 messages", limit);
        // Within the limit, the broken item is read and refused for what it is.
        let refused = chat(&Fields::parse(&body, 100 * limit).expect("fields"))
            .err()
            .expect("refused");
        assert_eq!(refused.param.as_deref(), Some("messages[11].role"));
    }

    #[test]
    fn a_request_is_refused_as_soon_as_it_declares_more_tools_than_the_limit_can_hold() {
        // 40 tokens hold at most 10 tools of at least 4 ids each.
        let limit = 10 * chat::LEAST_IDS_PER_TOOL;
        // Each API: the rest of a body, its tool's shape (`#` numbers it) and its reader.
        type Read = fn(&Fields) -> Result<(), ApiError>;
        let apis: [(&str, &str, Read); 3] = [
            (
                r#""messages":[{"role":"user","content":"a"}]"#,
                r#"{"type":"function","function":{"name":"t#"}}"#,
                |f| chat(f).map(drop),
            ),
            (
                r#""max_tokens":1,"messages":[{"role":"user","content":"a"}]"#,
                r#"{"name":"t#","input_schema":{}}"#,
                |f| crate::http::anthropic::messages_body::messages(f).map(drop),
            ),
            (
                r#""input":"a""#,
                r#"{"type":"function","name":"t#"}"#,
                |f| crate::http::responses::input::responses(f).map(drop),
            ),
        ];
        for (rest, tool, read) in apis {
            let body = |count: usize, after: &str| {
                let tools: Vec<String> = (0..count)
                    .map(|i| tool.replace('#', &i.to_string()))
                    .collect();
                let tools = tools.join(",");
                format!(r#"{{"model":"k3",{rest},"tools":[{tools}{after}]}}"#).into_bytes()
            };
            read(&Fields::parse(&body(10, ""), limit).expect("fields")).expect("10 tools");
            // The 11th is refused before anything after it is read: the broken item that
            // follows is never looked at.
            let broken = body(11, r#",{"name":5}"#);
            let refused =
                read(&Fields::parse(&broken, limit).expect("fields")).expect_err("11 tools");
            over_the_prompt_limit(&refused, "tools", "at least 11 tools", limit);
            let anthropic = refused.anthropic_message.as_deref().unwrap_or_default();
            assert!(
                anthropic.starts_with("prompt is too long: 11 tools or more"),
                "{anthropic}"
            );
            // Within a larger limit, the broken item is read and refused for what it is.
            let refused = read(&Fields::parse(&broken, 100 * limit).expect("fields"))
                .expect_err("a broken tool");
            assert!(
                refused
                    .param
                    .as_deref()
                    .is_some_and(|p| p.starts_with("tools[11]")),
                "{:?}",
                refused.param
            );
        }
    }

    #[test]
    fn fields_are_read_only_when_asked_for_and_lists_item_by_item() {
        let body = br#" {"model": "k3", "n": null, "stop": ["x"], "tools": {"a": 1}} "#;
        let f = Fields::parse(body, 100).expect("fields");
        assert_eq!(
            f.get::<String>("model").expect("model").as_deref(),
            Some("k3")
        );
        // null is absent, as an absent field is.
        assert_eq!(f.get::<u64>("n").expect("n"), None);
        assert_eq!(f.kind("n"), None);
        assert_eq!(f.kind("stop"), Some(JsonKind::List));
        assert_eq!(f.kind("model"), Some(JsonKind::String));
        let wrong = f.get::<u64>("model").expect_err("a string is no number");
        assert_eq!(wrong.param.as_deref(), Some("model"));
        let not_a_list = f.list("tools", |_, v| Ok(v.clone())).expect_err("refused");
        assert!(not_a_list.message.contains("`tools` must be a list"));
        let names: Vec<_> = f.names().collect();
        assert_eq!(
            names,
            [
                ("model", false),
                ("n", true),
                ("stop", false),
                ("tools", false)
            ]
        );
        for (body, says) in [
            (&b"[1]"[..], "must be a JSON object"),
            (b"{\"a\": 1", "is not JSON"),
            (b"{\"a\": 1} x", "is not JSON"),
        ] {
            let e = Fields::parse(body, 100).err().expect("refused");
            assert!(e.message.contains(says), "{}", e.message);
        }
    }
}
