//! The K3 chat template, XTML (spec §8): a conversation becomes a list of segments, each encoded
//! on its own — control segments with added tokens recognised, text segments never — and the
//! ids concatenated. Tool declarations and response formats (§8.2 steps 1 and 4) are not
//! rendered; the conversation, thinking channel, effort note and generation prompt are.

mod reply;

use std::str::FromStr;

pub use reply::{Reply, ReplyError, parse_reply};

use super::{CLOSE, END_OF_MSG, OPEN, SEP, Specials, Tokenizer, TokenizerError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// Rendered as a `name` attribute for user and system messages (spec §8.2).
    pub name: Option<String>,
    /// An assistant turn's thinking-channel text; rendered only with thinking on.
    pub reasoning: Option<String>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            name: None,
            reasoning: None,
        }
    }
}

/// Thinking effort (spec §8.2 step 2). `medium` is mentioned by the model's own note but is
/// not accepted by the official renderer, so it is an error here too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effort {
    Low,
    High,
    Max,
}

impl Effort {
    fn as_str(self) -> &'static str {
        match self {
            Effort::Low => "low",
            Effort::High => "high",
            Effort::Max => "max",
        }
    }
}

impl FromStr for Effort {
    type Err = TokenizerError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "low" => Ok(Effort::Low),
            "high" => Ok(Effort::High),
            "max" => Ok(Effort::Max),
            _ => Err(TokenizerError::BadEffort(s.to_owned())),
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

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Conversation {
    pub messages: Vec<Message>,
    pub thinking: Thinking,
    /// End with an open assistant message (spec §8.2 step 5).
    pub generation_prompt: bool,
}

/// One unit of rendering (spec §8.1): encoded separately, never merged with its neighbours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// An added token's string, encoded with specials recognised.
    Control(&'static str),
    /// Text, encoded with specials off so typed control strings stay text.
    Text(String),
}

/// The effort note's text (spec §8.2 data constant `effort`), byte-exact.
fn effort_text(effort: Effort) -> String {
    format!(
        "`thinking_effort` guides on how much to think in your thinking channel (not including \
         the response channel), supported values include `low`, `medium`, `high`, and `max`.\n\
         Now the system is invoked with `thinking_effort={}`.",
        effort.as_str()
    )
}

/// `&` first, then `"` (spec §8.1); `<` and `>` stay.
fn escape(value: &str) -> String {
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

    fn channel(&mut self, tag: &str, text: &str) {
        self.open(tag, &[]);
        self.txt(text);
        self.close(tag);
    }
}

/// The segment list of a conversation (spec §8.2).
pub fn segments(conversation: &Conversation) -> Vec<Segment> {
    let mut out = Segments::default();
    let thinking = matches!(conversation.thinking, Thinking::On(_));
    if let Thinking::On(Some(effort)) = conversation.thinking {
        out.message(&[("role", "system"), ("type", "thinking-effort")], |s| {
            s.txt(effort_text(effort))
        });
    }
    for message in &conversation.messages {
        let role = message.role.as_str();
        match message.role {
            Role::System | Role::User => {
                let mut attrs = vec![("role", role)];
                if let Some(name) = &message.name {
                    attrs.push(("name", name));
                }
                out.message(&attrs, |s| s.txt(message.content.as_str()));
            }
            Role::Assistant => out.message(&[("role", role)], |s| {
                if thinking {
                    let reasoning = message.reasoning.as_deref().unwrap_or_default();
                    // Blank reasoning is omitted, but the think channel is still rendered.
                    let reasoning = if reasoning.trim().is_empty() {
                        ""
                    } else {
                        reasoning
                    };
                    s.channel("think", reasoning);
                }
                s.channel("response", &message.content);
            }),
        }
    }
    if conversation.generation_prompt {
        out.open("message", &[("role", "assistant")]);
        out.open(if thinking { "think" } else { "response" }, &[]);
    }
    out.0
}

/// Renders a conversation to prompt ids (spec §8): each segment encoded on its own.
pub fn render(
    tokenizer: &Tokenizer,
    conversation: &Conversation,
) -> Result<Vec<u32>, TokenizerError> {
    let mut ids = Vec::new();
    for segment in segments(conversation) {
        let encoded = match &segment {
            Segment::Control(name) => tokenizer.encode(name, Specials::Recognised)?,
            Segment::Text(text) => tokenizer.encode(text, Specials::Plain)?,
        };
        ids.extend(encoded);
    }
    Ok(ids)
}
