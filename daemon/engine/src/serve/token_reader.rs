//! A job's generated ids in, classified text pieces out. Chat replies are read by the chat
//! layer's one reply reader ([`crate::tokenizer::chat::ReplyReader`], spec §8.4), which gives
//! each id its channel and any tool-call delta it completes; at the end it gives the reply's
//! tool calls, or what was malformed. Plain continuations are text throughout.
//!
//! Every id's own text also goes out (so a client can show exactly what the model produced,
//! control ids included); the channel says what it is.

use super::validate::Kind;
use crate::tokenizer::chat::{self, Message, ReplyError, ReplyEvent, ToolCall};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Which part of a reply a generated id belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// A plain continuation (no chat template).
    Text,
    /// The chat reply's thinking channel.
    Reasoning,
    /// The chat reply's response channel: what the user is meant to read.
    Response,
    /// A tool call's argument value or raw `json` block.
    ToolCall,
    /// Reply structure (`<|open|>`, tags, `<|sep|>`, end of message): not content.
    Control,
}

/// The piece of a tool call an id completes, as OpenAI streams calls: the start carries the id
/// and the name, later deltas fragments of the arguments' JSON text, which concatenate to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallDelta {
    /// Counts the reply's calls from 0.
    pub index: usize,
    /// Set on a call's first delta only.
    pub start: Option<ToolCallStart>,
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallStart {
    /// `call_<index>`: what the tool result's `tool_call_id` refers to.
    pub id: String,
    pub name: String,
}

/// One generated id as the client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenPiece {
    pub channel: Channel,
    /// The text this id completes (may be empty while a UTF-8 sequence is incomplete).
    pub text: String,
    /// The tool-call delta this id completes, if any (at most one per id).
    pub tool_call: Option<ToolCallDelta>,
}

/// A chat reply that broke the grammar of spec §8.4: reported, never repaired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    pub error: String,
    /// The whole output as text, control ids spelled out, so nothing is lost.
    pub raw: String,
}

/// What the reader knows once the job has ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ending {
    /// Text held back at the end (an incomplete UTF-8 sequence, shown lossily).
    pub trailing_text: String,
    /// The reply's tool calls (so far, for a reply cut short by `max_tokens` or a stop).
    pub tool_calls: Vec<ToolCall>,
    /// Set when a chat reply that reached its end broke the grammar.
    pub malformed: Option<Malformed>,
    /// A chat reply as the assistant message that re-renders it in later turns (spec §8.4:
    /// history is re-rendered from messages), cut short as the reply was — for a malformed
    /// one, what was read before the error, which is what a client has of it; `None` for plain
    /// continuations.
    pub message: Option<Message>,
}

/// Reads one job's generated ids in order.
pub struct TokenReader<'t> {
    text: StreamDecoder<'t>,
    /// `None` for plain continuations.
    chat: Option<chat::ReplyReader<'t>>,
}

impl<'t> TokenReader<'t> {
    pub fn new(tokenizer: &'t Tokenizer, kind: Kind) -> TokenReader<'t> {
        TokenReader {
            text: StreamDecoder::new(tokenizer),
            chat: match kind {
                Kind::Text => None,
                Kind::Chat { thinking } => Some(chat::ReplyReader::new(tokenizer, thinking)),
            },
        }
    }

    /// The next generated id, classified, with the text it completes.
    pub fn read(&mut self, id: u32) -> TokenPiece {
        let (channel, tool_call) = match self.chat.as_mut() {
            None => (Channel::Text, None),
            Some(reader) => {
                let pushed = reader.push(id);
                let channel = match pushed.channel {
                    chat::ReplyChannel::Reasoning => Channel::Reasoning,
                    chat::ReplyChannel::Content => Channel::Response,
                    chat::ReplyChannel::ToolCall => Channel::ToolCall,
                    chat::ReplyChannel::Control => Channel::Control,
                };
                (channel, pushed.events.into_iter().find_map(delta))
            }
        };
        // The engine emits only ids of its own vocabulary; were one unknown, show U+FFFD
        // rather than fail a request whose ids are all still correct.
        let text = self
            .text
            .push(id)
            .unwrap_or_else(|_| char::REPLACEMENT_CHARACTER.to_string());
        TokenPiece {
            channel,
            text,
            tool_call,
        }
    }

    /// Ends the reply. `end_id` is the end-of-turn id that stopped a chat reply: the engine
    /// does not emit stop ids as tokens, so the reader reads it here. A reply cut short
    /// (`max_tokens`, a stop string) is not malformed: its calls so far are returned.
    /// Called once; the reader reads nothing after it.
    pub fn finish(&mut self, end_id: Option<u32>) -> Ending {
        let trailing_text = self.text.flush();
        let Some(mut reader) = self.chat.take() else {
            return Ending {
                trailing_text,
                ..Ending::default()
            };
        };
        if let Some(id) = end_id {
            reader.push(id);
        }
        let (reply, malformed) = match reader.finish() {
            Ok(reply) => (reply, None),
            Err(m) => {
                let m = *m;
                let report =
                    (!matches!(m.error, ReplyError::Truncated { .. })).then(|| Malformed {
                        error: m.error.to_string(),
                        raw: m.raw,
                    });
                (m.partial, report)
            }
        };
        Ending {
            trailing_text,
            tool_calls: reply.tool_calls.clone(),
            message: Some(reply.into_message()),
            malformed,
        }
    }
}

fn delta(event: ReplyEvent) -> Option<ToolCallDelta> {
    match event {
        ReplyEvent::ToolCallStart { index, id, name } => Some(ToolCallDelta {
            index,
            start: Some(ToolCallStart { id, name }),
            arguments: String::new(),
        }),
        ReplyEvent::ToolCallArguments { index, fragment } => Some(ToolCallDelta {
            index,
            start: None,
            arguments: fragment,
        }),
        _ => None,
    }
}
