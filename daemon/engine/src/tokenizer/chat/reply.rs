//! Parsing a generated reply into reasoning and response (spec §8.4). Works on ids, not text, so
//! a control string the model spelled out as text can never be mistaken for structure.
//! Anything off the expected shape is reported, not repaired.

use crate::tokenizer::{
    CLOSE, Controls, END_OF_MSG, EOS, OPEN, SEP, Specials, Tokenizer, TokenizerError,
};

/// A parsed assistant turn: store this and re-render history from it, never the raw ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The thinking channel's text; `None` after a prompt with thinking off.
    pub reasoning: Option<String>,
    pub content: String,
    /// Which end-of-turn id ended the reply.
    pub end_id: u32,
}

#[derive(Debug, thiserror::Error)]
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
        expected: String,
        found: u32,
    },
    #[error("reply ended at position {position} while expecting {expected}")]
    Truncated { position: usize, expected: String },
    #[error("reply position {position}: a tool-call block; tool calls are not supported")]
    ToolCalls { position: usize },
    #[error("reply position {position}: {count} ids after the end-of-turn id")]
    Trailing { position: usize, count: usize },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

struct Cursor<'a> {
    tokenizer: &'a Tokenizer,
    ids: &'a [u32],
    position: usize,
    controls: Controls,
}

impl Cursor<'_> {
    fn is_control(&self, id: u32) -> bool {
        let c = self.controls;
        [c.open, c.close, c.sep, c.end_of_msg, c.eos].contains(&id)
    }

    fn next(&mut self, expected: &str) -> Result<u32, ReplyError> {
        let id = *self
            .ids
            .get(self.position)
            .ok_or_else(|| ReplyError::Truncated {
                position: self.position,
                expected: expected.to_owned(),
            })?;
        self.position += 1;
        Ok(id)
    }

    fn expect(&mut self, name: &'static str, want: u32) -> Result<(), ReplyError> {
        let found = self.next(name)?;
        if found != want {
            return Err(ReplyError::Unexpected {
                position: self.position - 1,
                expected: name.to_owned(),
                found,
            });
        }
        Ok(())
    }

    /// The tag-name ids after a control id, up to and including `<|sep|>`, must be `tag`.
    fn expect_tag(&mut self, tag: &str) -> Result<(), ReplyError> {
        for want in self.tokenizer.encode(tag, Specials::Plain)? {
            let found = self.next(tag)?;
            if found != want {
                return Err(ReplyError::Unexpected {
                    position: self.position - 1,
                    expected: format!("tag {tag:?}"),
                    found,
                });
            }
        }
        self.expect(SEP, self.controls.sep)
    }

    /// Payload ids up to the `<|close|>` that ends a channel, which is consumed.
    fn payload(&mut self, channel: &'static str) -> Result<String, ReplyError> {
        let close = self.controls.close;
        let start = self.position;
        loop {
            let id = self.next(&format!("{CLOSE} ending the {channel} channel"))?;
            if id == close {
                let ids = &self.ids[start..self.position - 1];
                return Ok(self.tokenizer.decode_text(ids)?);
            }
            if self.is_control(id) {
                return Err(ReplyError::ControlInPayload {
                    position: self.position - 1,
                    id,
                    channel,
                });
            }
        }
    }
}

/// Parses the ids generated after a prompt from [`super::render`] with a generation prompt.
/// `thinking` says whether that prompt opened the think channel (thinking on) or the response
/// channel (thinking off).
pub fn parse_reply(
    tokenizer: &Tokenizer,
    ids: &[u32],
    thinking: bool,
) -> Result<Reply, ReplyError> {
    let controls = tokenizer.controls();
    let mut cursor = Cursor {
        tokenizer,
        ids,
        position: 0,
        controls,
    };
    let reasoning = if thinking {
        let text = cursor.payload("think")?;
        cursor.expect_tag("think")?;
        cursor.expect(OPEN, controls.open)?;
        cursor.expect_tag("response")?;
        Some(text)
    } else {
        None
    };
    let content = cursor.payload("response")?;
    cursor.expect_tag("response")?;
    let position = cursor.position;
    match cursor.next(CLOSE)? {
        id if id == controls.close => {}
        id if id == controls.open => return Err(ReplyError::ToolCalls { position }),
        found => {
            return Err(ReplyError::Unexpected {
                position,
                expected: CLOSE.to_owned(),
                found,
            });
        }
    }
    cursor.expect_tag("message")?;
    let position = cursor.position;
    let end_id = cursor.next(&format!("{END_OF_MSG} or {EOS}"))?;
    if end_id != controls.end_of_msg && end_id != controls.eos {
        return Err(ReplyError::Unexpected {
            position,
            expected: format!("{END_OF_MSG} or {EOS}"),
            found: end_id,
        });
    }
    if cursor.position < ids.len() {
        return Err(ReplyError::Trailing {
            position: cursor.position,
            count: ids.len() - cursor.position,
        });
    }
    Ok(Reply {
        reasoning,
        content,
        end_id,
    })
}
