//! The typed request a chat is rendered from: an OpenAI chat-completions request maps onto it
//! field for field (roles system/user/assistant/tool, `tool_calls`, `tool_call_id`, `tools`,
//! `tool_choice`, `response_format`, `reasoning_effort`), and every rule the template imposes on
//! it is checked by [`super::segments`] with an error naming the message index and field.

use std::str::FromStr;

use serde_json::Value;

use crate::echo::Echo;
use crate::tokenizer::TokenizerError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool result (OpenAI `role: "tool"`), answering one call of the assistant message it
    /// follows.
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One function call of an assistant turn (OpenAI `tool_calls[i]`, `type: "function"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// What `tool_call_id` of the result refers to.
    pub id: String,
    pub name: String,
    /// The arguments as a JSON string, exactly as OpenAI carries them. An object is rendered
    /// argument by argument; anything else goes raw into a `json` block (spec §8.2).
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// Rendered as a `name` attribute for user and system messages (spec §8.2). An assistant
    /// message may carry one (OpenAI's types allow it) but the template has no attribute for
    /// it there, so it is not rendered.
    pub name: Option<String>,
    /// An assistant turn's thinking-channel text (`reasoning_content`); rendered only with
    /// thinking on.
    pub reasoning: Option<String>,
    /// An assistant turn's function calls, in order.
    pub tool_calls: Vec<ToolCall>,
    /// A tool result's call id; tool messages only, and required there.
    pub tool_call_id: Option<String>,
    /// The final assistant message is continued rather than answered (Kimi's Partial Mode,
    /// Anthropic's prefilled reply): it is rendered open, in place of the generation prompt,
    /// and the reply carries on its text — in the response channel, or in the think channel
    /// when it holds reasoning and no content yet (thinking on). The reply leaves the given
    /// text out. Only on the last message, an assistant one without tool calls.
    pub partial: bool,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            name: None,
            reasoning: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            partial: false,
        }
    }

    /// A tool result answering the call `tool_call_id`.
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            tool_call_id: Some(tool_call_id.into()),
            ..Message::new(Role::Tool, content)
        }
    }
}

/// A function the model may call (OpenAI `tools[i]` with `type: "function"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// The JSON schema of the arguments.
    pub parameters: Option<Value>,
}

/// OpenAI `tool_choice`. `Required` and `Function` are enforced by constrained decoding
/// (`crate::constrain`): the reply is one or more well-formed calls (of that function only).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// No note: the model decides (OpenAI's default when tools are given).
    #[default]
    Auto,
    /// The `tool_choice=none` note; the tools are still declared, as OpenAI keeps them too.
    None,
    /// The `tool_choice=required` note; needs at least one tool.
    Required,
    /// A call of this function (OpenAI `{"type": "function", "function": {"name"}}`,
    /// Anthropic `{"type": "tool", "name"}`). The template has no note naming a function
    /// (spec §8.2 step 4), so it renders the `required` note; it must name a declared tool.
    Function(String),
}

/// OpenAI `response_format`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ResponseFormat {
    /// No note.
    #[default]
    Text,
    /// The `json_object` note.
    JsonObject,
    /// The `json_schema` note with this schema (OpenAI `json_schema.schema`).
    JsonSchema(Value),
}

/// Thinking effort (spec §8.2 step 2). `medium` is mentioned by the model's own note but is
/// not accepted by the official renderer, so it is not a value here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effort {
    Low,
    High,
    Max,
}

impl Effort {
    pub fn as_str(self) -> &'static str {
        match self {
            Effort::Low => "low",
            Effort::High => "high",
            Effort::Max => "max",
        }
    }

    /// OpenAI's `reasoning_effort` names (besides `none`, see [`Thinking::from_openai`]):
    /// `minimal` and `low` are `low`; `medium` (OpenAI's default, which the template refuses)
    /// rounds up to `high` so a client's ordinary request never thinks less than the level it
    /// asked for; `high`; `max` is accepted as K3's own top level.
    pub fn from_openai(s: &str) -> Result<Effort, ChatError> {
        match s {
            "minimal" | "low" => Ok(Effort::Low),
            "medium" | "high" => Ok(Effort::High),
            "max" => Ok(Effort::Max),
            _ => Err(ChatError::BadOpenAiEffort(s.to_owned())),
        }
    }
}

/// The template's own names only: `low`, `high`, `max`.
impl FromStr for Effort {
    type Err = ChatError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "low" => Ok(Effort::Low),
            "high" => Ok(Effort::High),
            "max" => Ok(Effort::Max),
            _ => Err(ChatError::BadEffort(s.to_owned())),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thinking {
    Off,
    /// With an effort, an effort note is rendered first (spec §8.2 step 2).
    On(Option<Effort>),
}

/// The official renderer's default: thinking on, effort `max`.
impl Default for Thinking {
    fn default() -> Self {
        Thinking::On(Some(Effort::Max))
    }
}

impl Thinking {
    /// Thinking from an OpenAI-shaped request: the `thinking` switch (a K3 extension; absent =
    /// on, the template's default) and `reasoning_effort` (absent = `max`, the template's
    /// default; `none` = thinking off). Asking for thinking off and an effort is a
    /// contradiction, refused rather than resolved either way.
    pub fn from_openai(
        thinking: Option<bool>,
        reasoning_effort: Option<&str>,
    ) -> Result<Thinking, ChatError> {
        match (thinking, reasoning_effort) {
            (Some(false), None | Some("none")) | (None, Some("none")) => Ok(Thinking::Off),
            (Some(true), Some("none")) | (Some(false), Some(_)) => {
                Err(ChatError::ThinkingConflict {
                    thinking: thinking.unwrap_or_default(),
                    effort: reasoning_effort.unwrap_or_default().to_owned(),
                })
            }
            (_, Some(effort)) => Ok(Thinking::On(Some(Effort::from_openai(effort)?))),
            (_, None) => Ok(Thinking::default()),
        }
    }

    pub fn is_on(self) -> bool {
        matches!(self, Thinking::On(_))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    pub messages: Vec<Message>,
    pub thinking: Thinking,
    /// End with an open assistant message (spec §8.2 step 5).
    pub generation_prompt: bool,
    /// Declared in the tool-declare message (spec §8.2 step 1).
    pub tools: Vec<Tool>,
    pub tool_choice: ToolChoice,
    pub response_format: ResponseFormat,
    /// More than one call in a reply (OpenAI `parallel_tool_calls`, default true; Anthropic
    /// `disable_parallel_tool_use` inverted). Enforced when calls are constrained.
    pub parallel_tool_calls: bool,
}

impl Default for Conversation {
    fn default() -> Self {
        Conversation {
            messages: Vec::new(),
            thinking: Thinking::default(),
            generation_prompt: false,
            tools: Vec::new(),
            tool_choice: ToolChoice::default(),
            response_format: ResponseFormat::default(),
            parallel_tool_calls: true,
        }
    }
}

impl Conversation {
    /// The final message when it is continued (an assistant message with
    /// [`Message::partial`], rendered open in place of the generation prompt).
    pub fn continued(&self) -> Option<&Message> {
        self.messages
            .last()
            .filter(|m| self.generation_prompt && m.partial && m.role == Role::Assistant)
    }

    /// `tool_choice` forces the reply to call a tool (`required`, or a named function).
    pub fn forces_a_call(&self) -> bool {
        matches!(
            self.tool_choice,
            ToolChoice::Required | ToolChoice::Function(_)
        )
    }

    /// Whether the generated reply begins in the think channel (spec §8.4: after a thinking
    /// prompt the reasoning comes first); otherwise it begins in the response channel.
    pub fn reply_opens_thinking(&self) -> bool {
        match self.continued() {
            None => self.thinking.is_on(),
            Some(m) => continues_thinking(self.thinking.is_on(), m),
        }
    }

    /// The conversation with `reply` (this conversation's generated reply, as
    /// [`super::Reply::into_message`] gives it) as history: appended as the next assistant
    /// message, or, when the final message was continued, merged into it (the given text, then
    /// the reply's).
    pub fn with_reply(mut self, reply: Message) -> Conversation {
        let continued = self.continued().is_some();
        let opens_thinking = self.reply_opens_thinking();
        match self.messages.last_mut() {
            Some(last) if continued => {
                if opens_thinking {
                    let reasoning = last.reasoning.get_or_insert_default();
                    reasoning.push_str(reply.reasoning.as_deref().unwrap_or_default());
                }
                last.content.push_str(&reply.content);
                last.tool_calls = reply.tool_calls;
                last.partial = false;
            }
            _ => self.messages.push(reply),
        }
        self
    }
}

/// Whether continuing `message` carries on its reasoning (thinking on, reasoning given and no
/// content yet) rather than its response.
pub(super) fn continues_thinking(thinking: bool, message: &Message) -> bool {
    thinking && message.content.is_empty() && message.reasoning.is_some()
}

/// A request the template cannot render, naming what is wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// `field` is the OpenAI field name, e.g. `tool_call_id` or `tool_calls[1].function.name`.
    #[error("messages[{index}].{field}: {reason}")]
    Message {
        index: usize,
        field: String,
        reason: String,
    },
    #[error("tools[{index}].function.{field}: {reason}")]
    Tool {
        index: usize,
        field: &'static str,
        reason: String,
    },
    #[error("tool_choice \"required\" needs at least one tool in `tools`")]
    RequiredWithoutTools,
    #[error("tool_choice names the function {}, which is not in `tools`", Echo(.0))]
    UnknownFunction(String),
    #[error("thinking effort {} is not one of low, high, max", Echo(.0))]
    BadEffort(String),
    #[error("reasoning_effort {} is not one of none, minimal, low, medium, high, max", Echo(.0))]
    BadOpenAiEffort(String),
    #[error("thinking {thinking} contradicts reasoning_effort {}", Echo(effort))]
    ThinkingConflict { thinking: bool, effort: String },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

impl ChatError {
    pub(super) fn message(
        index: usize,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        ChatError::Message {
            index,
            field: field.into(),
            reason: reason.into(),
        }
    }
}
