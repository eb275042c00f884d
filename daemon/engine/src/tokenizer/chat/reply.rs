//! Reading a generated reply (spec §8.4), one id at a time. Works on ids, not text, so a
//! control string the model spelled out as text can never be mistaken for structure. Each id is
//! classified ([`ReplyChannel`]) and may complete events ([`ReplyEvent`]): reasoning and content text,
//! a tool call's start and its arguments as OpenAI streams them (JSON text fragments), the end
//! of the turn. Text is released as whole UTF-8 only ([`StreamDecoder`]).
//!
//! The reply's grammar, after a thinking prompt (after an instruct prompt the first line is
//! absent):
//!
//! ```text
//! reasoning  <|close|> think <|sep|>  <|open|> response <|sep|>
//! content    <|close|> response <|sep|>
//! [ <|open|> tools <|sep|>
//!     ( <|open|> call tool="NAME" index="i" <|sep|>
//!         ( <|open|> argument key="K" type="T" <|sep|> value <|close|> argument <|sep|> )*
//!         | <|open|> json type="object" <|sep|> raw <|close|> json <|sep|>
//!       <|close|> call <|sep|> )*
//!   <|close|> tools <|sep|> ]
//! <|close|> message <|sep|>  (<|end_of_msg|> | [EOS])
//! ```
//!
//! Anything else — a control id inside text, a wrong tag or attribute, a value that is not of
//! its declared type, a `json` block that is not a JSON object, an id after the end, a reply
//! that stops early — is reported (a [`ReplyEvent::Malformed`] when it happens, and
//! [`MalformedReply`] with the raw text from [`ReplyReader::finish`]), never repaired. After
//! it the reader classifies every further id as [`ReplyChannel::Control`] and emits nothing.

use super::model::{Message, Role, ToolCall};
use super::template_json::{Json, escaped, quoted};
use crate::tokenizer::{Controls, StreamDecoder, Tokenizer};

/// A parsed assistant turn: store this (as [`Reply::into_message`]) and re-render history
/// from it, never the raw ids.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reply {
    /// The thinking channel's text; `None` after a prompt with thinking off.
    pub reasoning: Option<String>,
    pub content: String,
    /// Arguments are JSON text, as OpenAI carries them; ids are `call_<index>`.
    pub tool_calls: Vec<ToolCall>,
    /// Which end-of-turn id ended the reply; always set in a reply [`ReplyReader::finish`]
    /// returns as well-formed, `None` in the partial reply of a malformed or unfinished one.
    pub end_id: Option<u32>,
}

impl Reply {
    /// The assistant message that re-renders this turn.
    pub fn into_message(self) -> Message {
        Message {
            reasoning: self.reasoning,
            tool_calls: self.tool_calls,
            ..Message::new(Role::Assistant, self.content)
        }
    }
}

/// What a generated id is part of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyChannel {
    Reasoning,
    Content,
    /// A tool call's argument value or raw `json` block.
    ToolCall,
    /// Structure (control ids, tags, attributes), or anything after the end or an error.
    Control,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyEvent {
    Reasoning(String),
    Content(String),
    /// A tool call begins; `index` counts calls from 0 (OpenAI's delta index).
    ToolCallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// The next piece of call `index`'s arguments: the fragments of a call concatenate to its
    /// arguments' JSON text.
    ToolCallArguments {
        index: usize,
        fragment: String,
    },
    /// The turn ended well-formed with this id.
    End {
        end_id: u32,
    },
    /// The reply broke its grammar here; nothing further is read.
    Malformed(ReplyError),
}

/// Where the reply broke its grammar; `position` counts the reply's ids from 0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    #[error("reply position {position}: control id {id} inside the {channel} text")]
    ControlInPayload {
        position: usize,
        id: u32,
        channel: &'static str,
    },
    #[error("reply position {position}: expected {expected}, found id {found}")]
    Unexpected {
        position: usize,
        expected: &'static str,
        found: u32,
    },
    #[error("reply position {position}: expected {expected}, found the tag {tag:?}")]
    BadTag {
        position: usize,
        expected: &'static str,
        tag: String,
    },
    #[error("reply position {position}: tool call {call}: {reason}")]
    BadToolCall {
        position: usize,
        call: usize,
        reason: String,
    },
    #[error("reply position {position}: id {id} is outside the vocabulary")]
    UnknownId { position: usize, id: u32 },
    #[error("reply position {position}: id {id} after the end of the turn")]
    Trailing { position: usize, id: u32 },
    #[error("the reply stopped after {position} ids, while expecting {expected}")]
    Truncated {
        position: usize,
        expected: &'static str,
    },
}

/// A reply that broke its grammar: the error, what was read before it, and the whole output
/// as text (control ids spelled out) so nothing the model produced is lost.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error}")]
pub struct MalformedReply {
    pub error: ReplyError,
    pub partial: Reply,
    pub raw: String,
}

/// Which text a payload holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Payload {
    Reasoning,
    Content,
    /// An argument value of a JSON type (`string` values are JSON-escaped as they stream).
    Argument {
        string: bool,
    },
    Json,
}

impl Payload {
    fn tag(self) -> &'static str {
        match self {
            Payload::Reasoning => "think",
            Payload::Content => "response",
            Payload::Argument { .. } => "argument",
            Payload::Json => "json",
        }
    }

    fn channel(self) -> ReplyChannel {
        match self {
            Payload::Reasoning => ReplyChannel::Reasoning,
            Payload::Content => ReplyChannel::Content,
            Payload::Argument { .. } | Payload::Json => ReplyChannel::ToolCall,
        }
    }
}

/// Places in the grammar between payloads, where a control id is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// After `<|close|> think <|sep|>`: `<|open|> response`.
    AfterThink,
    /// After the response: `<|open|> tools` or `<|close|> message`.
    AfterContent,
    /// Inside the tools block: `<|open|> call` or `<|close|> tools`.
    Tools,
    /// Inside a call: `<|open|> argument`, `<|open|> json` (first only) or `<|close|> call`.
    Call,
    /// After a call's `json` block: `<|close|> call`.
    AfterJson,
    /// After `<|close|> tools <|sep|>`: `<|close|> message`.
    AfterTools,
    /// After `<|close|> message <|sep|>`: the end id.
    End,
}

impl Place {
    fn expected(self) -> &'static str {
        match self {
            Place::AfterThink => "<|open|> response",
            Place::AfterContent => "<|open|> tools or <|close|> message",
            Place::Tools => "<|open|> call or <|close|> tools",
            Place::Call => "<|open|> argument, <|open|> json or <|close|> call",
            Place::AfterJson => "<|close|> call",
            Place::AfterTools => "<|close|> message",
            Place::End => "<|end_of_msg|> or [EOS]",
        }
    }
}

enum ReadState {
    Payload(Payload),
    /// The ids of a tag after `<|open|>` (`opening`) or `<|close|>`, up to its `<|sep|>`; a
    /// closing tag ends `payload` when there is one.
    Tag {
        opening: bool,
        ids: Vec<u32>,
        place: Place,
        payload: Option<Payload>,
    },
    Between(Place),
    Ended,
    Failed,
}

/// The call being read: its arguments so far (for the fragments' separators and the checks).
struct OpenCall {
    keys: Vec<String>,
    value: String,
    value_type: &'static str,
}

/// Reads a reply id by id. Create it with the mode of the generation prompt.
pub struct ReplyReader<'t> {
    tokenizer: &'t Tokenizer,
    controls: Controls,
    state: ReadState,
    text: StreamDecoder<'t>,
    position: usize,
    ids: Vec<u32>,
    reply: Reply,
    call: Option<OpenCall>,
    error: Option<ReplyError>,
}

/// The result of one [`ReplyReader::push`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    pub channel: ReplyChannel,
    pub events: Vec<ReplyEvent>,
}

/// `name key="value" …` of a tag, values unescaped (the inverse of spec §8.1's `escape`).
fn parse_tag(tag: &str) -> Option<(&str, Vec<(&str, String)>)> {
    let (name, mut rest) = tag.split_once(' ').map_or((tag, ""), |(n, r)| (n, r));
    let mut attrs = Vec::new();
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let (value, after) = after.split_once('"')?;
        attrs.push((key, unescape(value)?));
        rest = match after.strip_prefix(' ') {
            Some(more) if !more.is_empty() => more,
            Some(_) => return None,
            None if after.is_empty() => "",
            None => return None,
        };
    }
    Some((name, attrs))
}

fn unescape(value: &str) -> Option<String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let (entity, len) = if rest.starts_with("&amp;") {
            ('&', 5)
        } else if rest.starts_with("&quot;") {
            ('"', 6)
        } else {
            return None;
        };
        out.push(entity);
        rest = &rest[len..];
    }
    out.push_str(rest);
    Some(out)
}

/// The argument types of spec §8.2.
const ARGUMENT_TYPES: [&str; 6] = ["string", "number", "boolean", "null", "object", "array"];

impl<'t> ReplyReader<'t> {
    /// `thinking`: the generation prompt opened the think channel (else the response channel).
    pub fn new(tokenizer: &'t Tokenizer, thinking: bool) -> Self {
        let first = if thinking {
            Payload::Reasoning
        } else {
            Payload::Content
        };
        ReplyReader {
            tokenizer,
            controls: tokenizer.controls(),
            state: ReadState::Payload(first),
            text: StreamDecoder::new(tokenizer),
            position: 0,
            ids: Vec::new(),
            reply: Reply {
                reasoning: thinking.then(String::new),
                ..Reply::default()
            },
            call: None,
            error: None,
        }
    }

    /// Reads the next generated id.
    pub fn push(&mut self, id: u32) -> Pushed {
        let position = self.position;
        self.position += 1;
        self.ids.push(id);
        let mut events = Vec::new();
        let channel = match self.step(id, position, &mut events) {
            Ok(channel) => channel,
            Err(error) => {
                self.state = ReadState::Failed;
                self.error = Some(error.clone());
                events.push(ReplyEvent::Malformed(error));
                ReplyChannel::Control
            }
        };
        Pushed { channel, events }
    }

    /// The reply, once every id is pushed: well-formed only if it reached its end id.
    pub fn finish(mut self) -> Result<Reply, Box<MalformedReply>> {
        let error = match (&self.state, self.error.take()) {
            (ReadState::Ended, _) => return Ok(self.reply),
            (_, Some(error)) => error,
            (state, None) => ReplyError::Truncated {
                position: self.position,
                expected: match state {
                    ReadState::Payload(p) => match p {
                        Payload::Reasoning => "<|close|> ending the think channel",
                        Payload::Content => "<|close|> ending the response channel",
                        Payload::Argument { .. } => "<|close|> ending an argument",
                        Payload::Json => "<|close|> ending a json block",
                    },
                    ReadState::Tag { .. } => "<|sep|> ending a tag",
                    ReadState::Between(place) => place.expected(),
                    ReadState::Ended | ReadState::Failed => "nothing",
                },
            },
        };
        // Unknown ids have no bytes; that one is then the error itself.
        let raw = String::from_utf8_lossy(&self.bytes_of(&self.ids)).into_owned();
        Err(Box::new(MalformedReply {
            error,
            partial: self.reply,
            raw,
        }))
    }

    fn step(
        &mut self,
        id: u32,
        position: usize,
        events: &mut Vec<ReplyEvent>,
    ) -> Result<ReplyChannel, ReplyError> {
        let c = self.controls;
        if self.tokenizer.token_bytes(id).is_none() {
            return Err(ReplyError::UnknownId { position, id });
        }
        let control = self.controls.contains(id);
        match &mut self.state {
            ReadState::Failed => Ok(ReplyChannel::Control),
            ReadState::Ended => Err(ReplyError::Trailing { position, id }),
            ReadState::Payload(payload) => {
                let payload = *payload;
                if id == c.close {
                    let rest = self.text.flush();
                    self.payload_text(payload, &rest, events);
                    self.state = ReadState::Tag {
                        opening: false,
                        ids: Vec::new(),
                        place: Place::End, // replaced once the tag is read
                        payload: Some(payload),
                    };
                    return Ok(ReplyChannel::Control);
                }
                if control {
                    return Err(ReplyError::ControlInPayload {
                        position,
                        id,
                        channel: payload.tag(),
                    });
                }
                // Known id (checked above), so the decoder cannot fail.
                let piece = self.text.push(id).unwrap_or_default();
                self.payload_text(payload, &piece, events);
                Ok(payload.channel())
            }
            ReadState::Tag {
                opening,
                ids,
                place,
                payload,
            } => {
                if id == c.sep {
                    let (opening, ids, place, payload) =
                        (*opening, std::mem::take(ids), *place, *payload);
                    let tag = self.tag_text(&ids, position)?;
                    self.state = self.tag(opening, &tag, place, payload, position, events)?;
                } else if control {
                    return Err(ReplyError::ControlInPayload {
                        position,
                        id,
                        channel: "tag",
                    });
                } else {
                    ids.push(id);
                }
                Ok(ReplyChannel::Control)
            }
            ReadState::Between(place) => {
                let place = *place;
                if place == Place::End {
                    if id == c.end_of_msg || id == c.eos {
                        self.reply.end_id = Some(id);
                        self.state = ReadState::Ended;
                        events.push(ReplyEvent::End { end_id: id });
                        return Ok(ReplyChannel::Control);
                    }
                } else if id == c.open || id == c.close {
                    self.state = ReadState::Tag {
                        opening: id == c.open,
                        ids: Vec::new(),
                        place,
                        payload: None,
                    };
                    return Ok(ReplyChannel::Control);
                }
                Err(ReplyError::Unexpected {
                    position,
                    expected: place.expected(),
                    found: id,
                })
            }
        }
    }

    /// The bytes of ids the reader has let in: all are in the vocabulary (checked first).
    fn bytes_of(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter()
            .filter_map(|&id| self.tokenizer.token_bytes(id))
            .flatten()
            .copied()
            .collect()
    }

    /// A tag's text; the ids of a tag the model wrote must decode as UTF-8.
    fn tag_text(&self, ids: &[u32], position: usize) -> Result<String, ReplyError> {
        String::from_utf8(self.bytes_of(ids)).map_err(|e| ReplyError::BadTag {
            position,
            expected: "a tag in UTF-8",
            tag: String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    fn payload_text(&mut self, payload: Payload, text: &str, events: &mut Vec<ReplyEvent>) {
        if text.is_empty() {
            return;
        }
        match payload {
            Payload::Reasoning => {
                self.reply.reasoning.get_or_insert_default().push_str(text);
                events.push(ReplyEvent::Reasoning(text.to_owned()));
            }
            Payload::Content => {
                self.reply.content.push_str(text);
                events.push(ReplyEvent::Content(text.to_owned()));
            }
            Payload::Argument { string } => {
                if let Some(call) = &mut self.call {
                    call.value.push_str(text);
                }
                let fragment = if string {
                    escaped(text)
                } else {
                    text.to_owned()
                };
                self.arguments(fragment, events);
            }
            Payload::Json => {
                if let Some(call) = &mut self.call {
                    call.value.push_str(text);
                }
                self.arguments(text.to_owned(), events);
            }
        }
    }

    /// Appends to the current call's arguments and emits the fragment.
    fn arguments(&mut self, fragment: String, events: &mut Vec<ReplyEvent>) {
        if fragment.is_empty() {
            return;
        }
        let index = self.reply.tool_calls.len().saturating_sub(1);
        if let Some(call) = self.reply.tool_calls.last_mut() {
            call.arguments.push_str(&fragment);
        }
        events.push(ReplyEvent::ToolCallArguments { index, fragment });
    }

    fn bad_call(&self, position: usize, reason: impl Into<String>) -> ReplyError {
        ReplyError::BadToolCall {
            position,
            call: self.reply.tool_calls.len().saturating_sub(1),
            reason: reason.into(),
        }
    }

    /// A complete tag at `place` (or ending `payload`): checks it and returns the next state.
    fn tag(
        &mut self,
        opening: bool,
        tag: &str,
        place: Place,
        payload: Option<Payload>,
        position: usize,
        events: &mut Vec<ReplyEvent>,
    ) -> Result<ReadState, ReplyError> {
        let bad_tag = |expected: &'static str| ReplyError::BadTag {
            position,
            expected,
            tag: tag.to_owned(),
        };
        let (name, attrs) = parse_tag(tag).ok_or_else(|| bad_tag("a well-formed tag"))?;
        if let Some(payload) = payload {
            // `<|close|> tag <|sep|>` ending a payload: its own tag, no attributes.
            if name != payload.tag() || !attrs.is_empty() {
                return Err(bad_tag(match payload {
                    Payload::Reasoning => "think",
                    Payload::Content => "response",
                    Payload::Argument { .. } => "argument",
                    Payload::Json => "json",
                }));
            }
            return Ok(match payload {
                Payload::Reasoning => ReadState::Between(Place::AfterThink),
                Payload::Content => ReadState::Between(Place::AfterContent),
                Payload::Argument { string } => {
                    self.end_argument(string, position, events)?;
                    ReadState::Between(Place::Call)
                }
                Payload::Json => {
                    let raw = self.call.as_ref().map(|c| c.value.as_str()).unwrap_or("");
                    if !matches!(Json::parse(raw), Ok(Json::Object(_))) {
                        return Err(self.bad_call(position, "its json block is not a JSON object"));
                    }
                    ReadState::Between(Place::AfterJson)
                }
            });
        }
        let no_attrs = attrs.is_empty();
        match (place, opening, name) {
            (Place::AfterThink, true, "response") if no_attrs => {
                Ok(ReadState::Payload(Payload::Content))
            }
            (Place::AfterContent, true, "tools") if no_attrs => {
                Ok(ReadState::Between(Place::Tools))
            }
            (Place::AfterContent | Place::AfterTools, false, "message") if no_attrs => {
                Ok(ReadState::Between(Place::End))
            }
            (Place::Tools, true, "call") => {
                self.start_call(&attrs, position, events)?;
                Ok(ReadState::Between(Place::Call))
            }
            (Place::Tools, false, "tools") if no_attrs => Ok(ReadState::Between(Place::AfterTools)),
            (Place::Call, true, "argument") => self.start_argument(&attrs, position, events),
            (Place::Call, true, "json") => {
                let first = self.call.as_ref().is_some_and(|c| c.keys.is_empty());
                if attrs != [("type", "object".to_owned())] || !first {
                    return Err(self.bad_call(
                        position,
                        "a json block must be a call's only content, with type=\"object\"",
                    ));
                }
                if let Some(call) = &mut self.call {
                    call.value.clear();
                }
                Ok(ReadState::Payload(Payload::Json))
            }
            (Place::Call | Place::AfterJson, false, "call") if no_attrs => {
                if let Some(call) = self.call.take() {
                    let closing = match (place, call.keys.is_empty()) {
                        (Place::AfterJson, _) => "",
                        (_, true) => "{}",
                        (_, false) => "}",
                    };
                    self.arguments(closing.to_owned(), events);
                }
                Ok(ReadState::Between(Place::Tools))
            }
            _ => Err(bad_tag(place.expected())),
        }
    }

    fn start_call(
        &mut self,
        attrs: &[(&str, String)],
        position: usize,
        events: &mut Vec<ReplyEvent>,
    ) -> Result<(), ReplyError> {
        let index = self.reply.tool_calls.len();
        let bad = |reason: String| ReplyError::BadToolCall {
            position,
            call: index,
            reason,
        };
        let [("tool", name), ("index", number)] = attrs else {
            return Err(bad(format!(
                "its tag must carry tool=\"…\" index=\"…\", not {attrs:?}"
            )));
        };
        if name.is_empty() {
            return Err(bad("its tool name is empty".into()));
        }
        if *number != (index + 1).to_string() {
            return Err(bad(format!(
                "it is call {} but carries index=\"{number}\"",
                index + 1
            )));
        }
        let id = format!("call_{index}");
        self.reply.tool_calls.push(ToolCall {
            id: id.clone(),
            name: name.clone(),
            arguments: String::new(),
        });
        self.call = Some(OpenCall {
            keys: Vec::new(),
            value: String::new(),
            value_type: "",
        });
        events.push(ReplyEvent::ToolCallStart {
            index,
            id,
            name: name.clone(),
        });
        Ok(())
    }

    fn start_argument(
        &mut self,
        attrs: &[(&str, String)],
        position: usize,
        events: &mut Vec<ReplyEvent>,
    ) -> Result<ReadState, ReplyError> {
        let [("key", key), ("type", value_type)] = attrs else {
            return Err(self.bad_call(
                position,
                format!("an argument tag must carry key=\"…\" type=\"…\", not {attrs:?}"),
            ));
        };
        let Some(value_type) = ARGUMENT_TYPES.iter().find(|t| **t == value_type) else {
            return Err(self.bad_call(
                position,
                format!("argument {key:?} has the unknown type {value_type:?}"),
            ));
        };
        let Some(call) = self.call.as_mut() else {
            return Err(self.bad_call(position, "an argument outside a call"));
        };
        if call.keys.contains(key) {
            return Err(self.bad_call(position, format!("argument {key:?} is given twice")));
        }
        let separator = if call.keys.is_empty() { "{" } else { "," };
        call.keys.push(key.clone());
        call.value.clear();
        call.value_type = value_type;
        let string = *value_type == "string";
        let mut fragment = format!("{separator}{}:", quoted(key));
        if string {
            fragment.push('"');
        }
        self.arguments(fragment, events);
        Ok(ReadState::Payload(Payload::Argument { string }))
    }

    /// An argument's value is complete: a non-string one must be JSON of its declared type.
    fn end_argument(
        &mut self,
        string: bool,
        position: usize,
        events: &mut Vec<ReplyEvent>,
    ) -> Result<(), ReplyError> {
        if string {
            self.arguments("\"".into(), events);
            return Ok(());
        }
        let Some(call) = &self.call else {
            return Err(self.bad_call(position, "an argument outside a call"));
        };
        let key = call.keys.last().cloned().unwrap_or_default();
        match Json::parse(&call.value) {
            Ok(value) if value.type_name() == call.value_type => Ok(()),
            Ok(value) => Err(self.bad_call(
                position,
                format!(
                    "argument {key:?} is declared {} but its value {:?} is {}",
                    call.value_type,
                    call.value,
                    value.type_name()
                ),
            )),
            Err(e) => Err(self.bad_call(
                position,
                format!(
                    "argument {key:?} ({}) is not JSON: {e}: {:?}",
                    call.value_type, call.value
                ),
            )),
        }
    }
}

/// Reads a whole reply: the ids generated after a prompt from [`super::render`] with a
/// generation prompt, including the end id. `thinking`: that prompt opened the think channel.
pub fn parse_reply(
    tokenizer: &Tokenizer,
    ids: &[u32],
    thinking: bool,
) -> Result<Reply, Box<MalformedReply>> {
    let mut reader = ReplyReader::new(tokenizer, thinking);
    for &id in ids {
        reader.push(id);
    }
    reader.finish()
}
