//! The reply reader: a job's generated ids in, classified text pieces out. This is the one
//! place the serve core reads the reply structure of spec §8.4, behind a narrow interface
//! ([`ReplyReader::new`], [`ReplyReader::read`], [`ReplyReader::finish`]), so replacing the
//! classification with the tokenizer library's streaming reply reader is a change to this file
//! alone.
//!
//! Chat replies (spec §8.4): after a thinking prompt the reply is reasoning until
//! `<|close|> think <|sep|> <|open|> response <|sep|>`, then response; the structure ids
//! themselves are control. Plain continuations are text throughout.

use super::validate::Kind;
use crate::tokenizer::{Controls, StreamDecoder, Tokenizer};

/// Which part of a reply a generated id belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// A plain continuation (no chat template).
    Text,
    /// The chat reply's thinking channel.
    Reasoning,
    /// The chat reply's response channel: what the user is meant to read.
    Response,
    /// Reply structure (`<|open|>`, tags, `<|sep|>`, end of message): not content.
    Control,
}

/// One generated id as the client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub channel: Channel,
    /// The text this id completes (may be empty while a UTF-8 sequence is incomplete).
    pub text: String,
}

/// Reads one job's generated ids in order.
pub struct ReplyReader<'t> {
    tokenizer: &'t Tokenizer,
    text: StreamDecoder<'t>,
    /// `None` for plain continuations.
    chat: Option<ChatChannels>,
}

impl<'t> ReplyReader<'t> {
    pub fn new(tokenizer: &'t Tokenizer, kind: Kind) -> ReplyReader<'t> {
        ReplyReader {
            tokenizer,
            text: StreamDecoder::new(tokenizer),
            chat: match kind {
                Kind::Text => None,
                Kind::Chat { thinking } => Some(ChatChannels::new(tokenizer.controls(), thinking)),
            },
        }
    }

    /// The next generated id, classified, with the text it completes.
    pub fn read(&mut self, id: u32) -> Piece {
        let channel = match self.chat.as_mut() {
            Some(c) => c.classify(self.tokenizer, id),
            None => Channel::Text,
        };
        // The engine emits only ids of its own vocabulary; were one unknown, show U+FFFD
        // rather than fail a request whose ids are all still correct.
        let text = self
            .text
            .push(id)
            .unwrap_or_else(|_| char::REPLACEMENT_CHARACTER.to_string());
        Piece { channel, text }
    }

    /// Text held back at the end (an incomplete UTF-8 sequence, shown lossily).
    pub fn finish(&mut self) -> String {
        self.text.flush()
    }
}

/// Labels each generated id of a chat reply. A tag is the ids between `<|open|>`/`<|close|>`
/// and `<|sep|>`; opening `think` switches to reasoning, opening `response` to response.
struct ChatChannels {
    controls: Controls,
    current: Channel,
    /// Some(ids so far) while inside `<|open|> tag` (before its `<|sep|>`).
    opening: Option<Vec<u32>>,
    /// Inside `<|close|> tag` (before its `<|sep|>`).
    closing: bool,
}

impl ChatChannels {
    fn new(controls: Controls, thinking: bool) -> ChatChannels {
        ChatChannels {
            controls,
            current: if thinking {
                Channel::Reasoning
            } else {
                Channel::Response
            },
            opening: None,
            closing: false,
        }
    }

    fn classify(&mut self, tokenizer: &Tokenizer, id: u32) -> Channel {
        let m = self.controls;
        if id == m.open {
            self.opening = Some(Vec::new());
            return Channel::Control;
        }
        if id == m.close {
            self.closing = true;
            return Channel::Control;
        }
        if id == m.sep {
            if let Some(tag) = self.opening.take() {
                let name = tokenizer.decode(&tag).unwrap_or_default();
                match name.as_slice() {
                    b"think" => self.current = Channel::Reasoning,
                    b"response" => self.current = Channel::Response,
                    _ => {}
                }
            }
            self.closing = false;
            return Channel::Control;
        }
        if id == m.end_of_msg || id == m.eos {
            return Channel::Control;
        }
        if let Some(tag) = self.opening.as_mut() {
            tag.push(id);
            return Channel::Control;
        }
        if self.closing {
            return Channel::Control;
        }
        self.current
    }
}
