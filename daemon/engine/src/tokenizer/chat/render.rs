//! Rendering a [`Conversation`] to segments and ids (spec §8.1–§8.2), checking on the way every
//! rule the template relies on.

use serde_json::json;

use super::model::continues_thinking;
use super::model::{ChatError, Conversation, Effort, Message, ResponseFormat, Role, ToolCall};
use super::model::{Tool, ToolChoice};
use super::template_json::{Json, compact_sorted};
use crate::echo::Echo;
use crate::tokenizer::{CLOSE, END_OF_MSG, OPEN, SEP, Specials, Tokenizer};

/// One unit of rendering (spec §8.1): encoded separately, never merged with its neighbours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// An added token's string, encoded with specials recognised.
    Control(&'static str),
    /// Text, encoded with specials off so typed control strings stay text.
    Text(String),
}

// The data constants of spec §8.2, byte-exact.

fn effort_text(effort: Effort) -> String {
    format!(
        "`thinking_effort` guides on how much to think in your thinking channel (not including \
         the response channel), supported values include `low`, `medium`, `high`, and `max`.\n\
         Now the system is invoked with `thinking_effort={}`.",
        effort.as_str()
    )
}

fn tool_declare_text(tools: &str) -> String {
    format!(
        "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n{tools}\n```"
    )
}

const TOOL_CHOICE_REQUIRED: &str =
    "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.";
const TOOL_CHOICE_NONE: &str = "The system is invoked with `tool_choice=none`.\nYou MUST NOT \
     call any tools in the next message.";
const JSON_OBJECT: &str = "The system is invoked with `response_format=json_object`.\nYour \
     response must be raw JSON data without markdown code blocks (```json) or any additional \
     formatting.";

fn json_schema_text(schema: &str) -> String {
    format!(
        "The system is invoked with `response_format=json_schema`.\nYour response must be raw \
         JSON data without markdown code blocks (```json) or any additional formatting.\nThe \
         JSON data must match the following schema:\n```json\n{schema}\n```"
    )
}

/// Reasoning as rendered in a think channel: blank reasoning is omitted (spec §8.2).
fn non_blank(reasoning: Option<&str>) -> &str {
    reasoning
        .filter(|r| !r.trim().is_empty())
        .unwrap_or_default()
}

/// `&` first, then `"` (spec §8.1); `<` and `>` stay.
pub(super) fn escape(value: &str) -> String {
    value.replace('&', "&amp;").replace('"', "&quot;")
}

#[derive(Default)]
struct Segments(Vec<Segment>);

impl Segments {
    fn ctrl(&mut self, name: &'static str) {
        self.0.push(Segment::Control(name));
    }

    /// Empty texts give no segment (spec §8).
    fn txt(&mut self, text: impl Into<String>) {
        let text = text.into();
        if !text.is_empty() {
            self.0.push(Segment::Text(text));
        }
    }

    fn open(&mut self, tag: &str, attrs: &[(&str, &str)]) {
        self.ctrl(OPEN);
        self.txt(tag);
        for (key, value) in attrs {
            self.txt(format!(" {key}=\"{}\"", escape(value)));
        }
        self.ctrl(SEP);
    }

    fn close(&mut self, tag: &str) {
        self.ctrl(CLOSE);
        self.txt(tag);
        self.ctrl(SEP);
    }

    fn message(&mut self, attrs: &[(&str, &str)], body: impl FnOnce(&mut Self)) {
        self.open("message", attrs);
        body(self);
        self.close("message");
        self.ctrl(END_OF_MSG);
    }

    fn system_note(&mut self, kind: &str, text: &str) {
        self.message(&[("role", "system"), ("type", kind)], |s| s.txt(text));
    }

    fn block(&mut self, tag: &str, attrs: &[(&str, &str)], text: &str) {
        self.open(tag, attrs);
        self.txt(text);
        self.close(tag);
    }

    /// An assistant message (spec §8.2 step 3): with thinking on its think channel (blank
    /// reasoning omitted, the channel still rendered), its response, its tool calls.
    fn assistant(&mut self, thinking: bool, message: &Message) {
        self.message(&[("role", "assistant")], |s| {
            if thinking {
                s.block("think", &[], non_blank(message.reasoning.as_deref()));
            }
            s.block("response", &[], &message.content);
            if !message.tool_calls.is_empty() {
                s.tool_calls(&message.tool_calls);
            }
        });
    }

    /// A continued final assistant message ([`Message::partial`]), left open where the reply
    /// carries on: in its think channel when it has reasoning and no content yet (thinking on),
    /// else in its response channel — the generation prompt (spec §8.2 step 5) with the given
    /// text already in it.
    fn open_assistant(&mut self, thinking: bool, message: &Message) {
        self.open("message", &[("role", "assistant")]);
        if continues_thinking(thinking, message) {
            self.open("think", &[]);
            self.txt(message.reasoning.as_deref().unwrap_or_default());
            return;
        }
        if thinking {
            self.block("think", &[], non_blank(message.reasoning.as_deref()));
        }
        self.open("response", &[]);
        self.txt(message.content.as_str());
    }

    /// A tools block (spec §8.2): per call its arguments, each with its JSON type, or the raw
    /// text in a `json` block when the arguments are not a JSON object.
    fn tool_calls(&mut self, calls: &[ToolCall]) {
        self.open("tools", &[]);
        for (i, call) in calls.iter().enumerate() {
            let index = (i + 1).to_string();
            self.open("call", &[("tool", &call.name), ("index", &index)]);
            match Json::parse(&call.arguments) {
                Ok(Json::Object(arguments)) => {
                    for (key, value) in &arguments {
                        let text = match value {
                            Json::String(s) => s.clone(),
                            other => other.spaced(),
                        };
                        self.block(
                            "argument",
                            &[("key", key), ("type", value.type_name())],
                            &text,
                        );
                    }
                }
                _ => self.block("json", &[("type", "object")], &call.arguments),
            }
            self.close("call");
        }
        self.close("tools");
    }
}

/// The function list of the tool-declare message, in OpenAI's `tools` shape.
fn tool_list(tools: &[Tool]) -> Result<String, ChatError> {
    let mut list = Vec::with_capacity(tools.len());
    // The names seen so far: a set, so that many tools cost linear time, not quadratic.
    let mut names = std::collections::HashSet::with_capacity(tools.len());
    for (index, tool) in tools.iter().enumerate() {
        if tool.name.is_empty() {
            return Err(ChatError::Tool {
                index,
                field: "name",
                reason: "is empty".into(),
            });
        }
        if !names.insert(tool.name.as_str()) {
            return Err(ChatError::Tool {
                index,
                field: "name",
                reason: format!("{} is declared twice", Echo(&tool.name)),
            });
        }
        let mut function = json!({ "name": tool.name });
        if let Some(description) = &tool.description {
            function["description"] = json!(description);
        }
        if let Some(parameters) = &tool.parameters {
            function["parameters"] = parameters.clone();
        }
        list.push(json!({ "type": "function", "function": function }));
    }
    Ok(compact_sorted(&serde_json::Value::Array(list)))
}

/// The fields each role may carry (spec §8.2 renders `name` for user and system only).
fn check_fields(index: usize, m: &Message) -> Result<(), ChatError> {
    let misplaced = |field: &str, allowed: &str| {
        ChatError::message(
            index,
            field,
            format!(
                "a {} message cannot carry it ({allowed} only)",
                m.role.as_str()
            ),
        )
    };
    // OpenAI's types give `name` to every role but tool; the template renders it for system
    // and user messages only (spec §8.2), so an assistant's is accepted and not rendered.
    if m.name.is_some() && m.role == Role::Tool {
        return Err(misplaced("name", "system, user and assistant"));
    }
    if m.partial && m.role != Role::Assistant {
        return Err(misplaced("partial", "assistant"));
    }
    if m.partial && !m.tool_calls.is_empty() {
        return Err(ChatError::message(
            index,
            "partial",
            "a continued message cannot carry tool_calls (the reply would follow them)",
        ));
    }
    if m.reasoning.is_some() && m.role != Role::Assistant {
        return Err(misplaced("reasoning_content", "assistant"));
    }
    if !m.tool_calls.is_empty() && m.role != Role::Assistant {
        return Err(misplaced("tool_calls", "assistant"));
    }
    match (m.role, &m.tool_call_id) {
        (Role::Tool, None) => Err(ChatError::message(
            index,
            "tool_call_id",
            "a tool message must name the call it answers",
        )),
        (Role::Tool, Some(id)) if id.is_empty() => {
            Err(ChatError::message(index, "tool_call_id", "is empty"))
        }
        (Role::Tool, Some(_)) | (_, None) => Ok(()),
        (_, Some(_)) => Err(misplaced("tool_call_id", "tool")),
    }?;
    for (i, call) in m.tool_calls.iter().enumerate() {
        if call.name.is_empty() {
            return Err(ChatError::message(
                index,
                format!("tool_calls[{i}].function.name"),
                "is empty",
            ));
        }
        if !call.id.is_empty() && m.tool_calls[..i].iter().any(|c| c.id == call.id) {
            return Err(ChatError::message(
                index,
                format!("tool_calls[{i}].id"),
                format!(
                    "{} is used by an earlier call of this message",
                    Echo(&call.id)
                ),
            ));
        }
    }
    Ok(())
}

/// The run of tool messages at `start`, paired with the call each answers (by `tool_call_id`
/// among `calls`, the preceding assistant message's), in the calls' order (spec §8.2: results
/// are reordered to the assistant's call order).
fn tool_results<'c>(
    messages: &[Message],
    start: usize,
    calls: &'c [ToolCall],
) -> Result<Vec<(usize, &'c ToolCall)>, ChatError> {
    let mut run: Vec<(usize, usize)> = Vec::new(); // (message index, call position)
    for (index, m) in messages.iter().enumerate().skip(start) {
        if m.role != Role::Tool {
            break;
        }
        let id = m.tool_call_id.as_deref().unwrap_or_default();
        let position = calls.iter().position(|c| c.id == id).ok_or_else(|| {
            ChatError::message(
                index,
                "tool_call_id",
                format!(
                    "{} is not a call of the preceding assistant message",
                    Echo(id)
                ),
            )
        })?;
        if run.iter().any(|&(_, p)| p == position) {
            return Err(ChatError::message(
                index,
                "tool_call_id",
                format!("call {} already has a result", Echo(id)),
            ));
        }
        run.push((index, position));
    }
    run.sort_by_key(|&(_, position)| position);
    Ok(run
        .into_iter()
        .map(|(index, position)| (index, &calls[position]))
        .collect())
}

/// Where a rendering's prelude ends, counted in ids from its start (spec §8.2): what every
/// conversation of an agent with the same tools, effort and instructions starts with, and so
/// where automatic prefix reuse keeps a state for a new conversation to continue from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Prelude {
    /// The end of the tool-declare message (step 1), when tools are declared: it comes first,
    /// so it is shared even when a later system message changes (a date, `git status`).
    pub tools_end: Option<usize>,
    /// The end of the tool declaration, the effort note (step 2) and the system messages that
    /// open the conversation: where its first message of another role starts. 0 when there
    /// is none of them.
    pub end: usize,
}

/// [`Prelude`] counted in segments, as [`marked_segments`] finds it.
#[derive(Debug, Clone, Copy, Default)]
struct Marks {
    tools_end: Option<usize>,
    end: usize,
}

/// The segment list of a conversation (spec §8.2).
pub fn segments(conversation: &Conversation) -> Result<Vec<Segment>, ChatError> {
    Ok(marked_segments(conversation)?.0)
}

/// [`segments`], and where its prelude ends among them.
fn marked_segments(conversation: &Conversation) -> Result<(Vec<Segment>, Marks), ChatError> {
    let mut out = Segments::default();
    let mut marks = Marks::default();
    let thinking = conversation.thinking.is_on();
    let messages = &conversation.messages;
    if !conversation.tools.is_empty() {
        out.system_note(
            "tool-declare",
            &tool_declare_text(&tool_list(&conversation.tools)?),
        );
        marks.tools_end = Some(out.0.len());
    }
    match &conversation.tool_choice {
        ToolChoice::Required if conversation.tools.is_empty() => {
            return Err(ChatError::RequiredWithoutTools);
        }
        ToolChoice::Function(name) if !conversation.tools.iter().any(|t| &t.name == name) => {
            return Err(ChatError::UnknownFunction(name.clone()));
        }
        _ => {}
    }
    if let super::Thinking::On(Some(effort)) = conversation.thinking {
        out.system_note("thinking-effort", &effort_text(effort));
    }
    marks.end = out.0.len();
    // Whether only system messages have been rendered so far (the prelude goes on).
    let mut leading = true;
    // The calls of the last assistant message, while only tool messages have followed it.
    let mut calls: Option<&[ToolCall]> = None;
    let mut index = 0;
    while let Some(message) = messages.get(index) {
        check_fields(index, message)?;
        let role = message.role.as_str();
        match message.role {
            Role::System | Role::User => {
                let mut attrs = vec![("role", role)];
                if let Some(name) = &message.name {
                    attrs.push(("name", name));
                }
                out.message(&attrs, |s| s.txt(message.content.as_str()));
                leading &= message.role == Role::System;
                if leading {
                    marks.end = out.0.len();
                }
                calls = None;
            }
            Role::Assistant if message.partial => {
                leading = false;
                if index + 1 != messages.len() {
                    return Err(ChatError::message(
                        index,
                        "partial",
                        "only the last message can be continued",
                    ));
                }
                if !conversation.generation_prompt {
                    out.assistant(thinking, message);
                }
                // Otherwise it is rendered open in place of the generation prompt, below.
                calls = Some(&message.tool_calls);
            }
            Role::Assistant => {
                leading = false;
                out.assistant(thinking, message);
                calls = Some(&message.tool_calls);
            }
            Role::Tool => {
                let Some(answered) = calls.filter(|c| !c.is_empty()) else {
                    return Err(ChatError::message(
                        index,
                        "role",
                        "a tool message must follow an assistant message with tool_calls",
                    ));
                };
                let run = tool_results(messages, index, answered)?;
                for (i, &(at, call)) in run.iter().enumerate() {
                    check_fields(at, &messages[at])?;
                    let position = (i + 1).to_string();
                    let attrs = [("role", role), ("tool", &call.name), ("index", &position)];
                    out.message(&attrs, |s| s.txt(messages[at].content.as_str()));
                }
                index += run.len();
                calls = None;
                continue;
            }
        }
        index += 1;
    }
    match conversation.tool_choice {
        ToolChoice::Auto => {}
        ToolChoice::None => out.system_note("tool-choice", TOOL_CHOICE_NONE),
        // The template has no note naming a function: `required` is what it says to the
        // model, and constrained decoding holds the reply to the named function.
        ToolChoice::Required | ToolChoice::Function(_) => {
            out.system_note("tool-choice", TOOL_CHOICE_REQUIRED)
        }
    }
    match &conversation.response_format {
        ResponseFormat::Text => {}
        ResponseFormat::JsonObject => out.system_note("response-format", JSON_OBJECT),
        ResponseFormat::JsonSchema(schema) => out.system_note(
            "response-format",
            &json_schema_text(&compact_sorted(schema)),
        ),
    }
    match conversation.continued() {
        Some(message) => out.open_assistant(thinking, message),
        None if conversation.generation_prompt => {
            out.open("message", &[("role", "assistant")]);
            out.open(if thinking { "think" } else { "response" }, &[]);
        }
        None => {}
    }
    Ok((out.0, marks))
}

/// Renders a conversation to prompt ids (spec §8): each segment encoded on its own.
pub fn render(tokenizer: &Tokenizer, conversation: &Conversation) -> Result<Vec<u32>, ChatError> {
    Ok(render_with_prelude(tokenizer, conversation)?.0)
}

/// [`render`], and where the prompt's prelude ends in its ids.
pub fn render_with_prelude(
    tokenizer: &Tokenizer,
    conversation: &Conversation,
) -> Result<(Vec<u32>, Prelude), ChatError> {
    let mut ids = Vec::new();
    let prelude = encode_segments(tokenizer, conversation, |encoded| ids.extend(encoded))?;
    Ok((ids, prelude))
}

/// The fewest ids a message renders to (spec §8.2): its open tag (`OPEN`, `message`, a role
/// attribute, `SEP`) and either its close (`CLOSE`, `message`, `SEP`, `END_OF_MSG`) or — a
/// continued last message, left open — the open tag of the channel the reply carries on in
/// (`OPEN`, `response` or `think`, `SEP`). A text segment is never empty, so it encodes to at
/// least one id. A conversation of `n` messages renders to at least `n` times this many ids:
/// one with more messages than a limit allows this way is over it without being rendered
/// (`serve::validate::within_message_limit`), so its readers can refuse it while they read it.
pub const LEAST_IDS_PER_MESSAGE: usize = 7;

/// The most messages a conversation rendering to at most `limit` ids can have.
pub fn most_messages(limit: usize) -> usize {
    limit / LEAST_IDS_PER_MESSAGE
}

/// The fewest ids a declared tool adds to the prompt (spec §8.2): each is an object
/// `{"function":{"name":…},"type":"function"}` (keys sorted; a description and parameters
/// only add to it) in the tool-declare message's one text segment. Its four fixed words —
/// `function`, `name`, `type`, `function` — are runs of lowercase letters each between `"`s,
/// and a piece of the pre-tokenisation (§7.3) holds at most one run of letters (the letter
/// alternatives take an optional non-letter, then letters; the others take no letter), so
/// the four are in four different pieces whatever the name; every piece encodes to at least
/// one id (§7.4), and the long-run guard only cuts pieces further. A conversation declaring
/// `n` tools so renders to at least `n` times this many ids: one declaring more than a
/// limit allows this way is over it without being rendered, and its readers can refuse it
/// while they read its tools.
pub const LEAST_IDS_PER_TOOL: usize = 4;

/// The most tools a conversation rendering to at most `limit` ids can declare.
pub fn most_tools(limit: usize) -> usize {
    limit / LEAST_IDS_PER_TOOL
}

/// A rendering held to a length limit ([`render_limited`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limited {
    /// At most the limit: the prompt ids, and where its prelude ends in them.
    Within(Vec<u32>, Prelude),
    /// Over the limit: how many ids the whole conversation renders to (the ids past the limit
    /// were counted and dropped, so memory stays at the limit's, whatever the conversation).
    Over(usize),
}

/// [`render`], keeping at most `limit` ids: a conversation that renders to more is counted to
/// the end (each segment encoded and dropped) so the refusal can say how long it is.
pub fn render_limited(
    tokenizer: &Tokenizer,
    conversation: &Conversation,
    limit: usize,
) -> Result<Limited, ChatError> {
    let mut ids = Vec::new();
    let mut count = 0usize;
    let prelude = encode_segments(tokenizer, conversation, |encoded| {
        count = count.saturating_add(encoded.len());
        if count <= limit {
            ids.extend(encoded);
        } else {
            ids = Vec::new();
        }
    })?;
    Ok(if count <= limit {
        Limited::Within(ids, prelude)
    } else {
        Limited::Over(count)
    })
}

/// Encodes each segment of `conversation` in order (control segments with added tokens
/// recognised, text never) and hands its ids to `each`; returns where the prelude ends in
/// those ids (segments are encoded one by one, so a segment boundary is an id boundary).
fn encode_segments(
    tokenizer: &Tokenizer,
    conversation: &Conversation,
    mut each: impl FnMut(Vec<u32>),
) -> Result<Prelude, ChatError> {
    let (segments, marks) = marked_segments(conversation)?;
    let mut prelude = Prelude::default();
    let mut count = 0usize;
    for (index, segment) in segments.iter().enumerate() {
        if marks.tools_end == Some(index) {
            prelude.tools_end = Some(count);
        }
        if marks.end == index {
            prelude.end = count;
        }
        let encoded = match segment {
            Segment::Control(name) => tokenizer.encode(name, Specials::Recognised)?,
            Segment::Text(text) => tokenizer.encode(text, Specials::Plain)?,
        };
        count = count.saturating_add(encoded.len());
        each(encoded);
    }
    if marks.tools_end == Some(segments.len()) {
        prelude.tools_end = Some(count);
    }
    if marks.end == segments.len() {
        prelude.end = count;
    }
    Ok(prelude)
}
