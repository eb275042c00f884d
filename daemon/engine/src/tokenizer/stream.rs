//! Streaming detokenisation (spec §7.4 "Decoding"): text is released only as complete UTF-8, an
//! incomplete trailing sequence is held until the next token completes it, and invalid bytes
//! become U+FFFD exactly where `String::from_utf8_lossy` of the whole output would put them.

use super::Tokenizer;
use super::error::TokenizerError;

/// Turns a stream of ids into text without ever showing a broken character.
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    pending: Vec<u8>,
    position: usize,
}

impl<'t> StreamDecoder<'t> {
    pub fn new(tokenizer: &'t Tokenizer) -> Self {
        StreamDecoder {
            tokenizer,
            pending: Vec::new(),
            position: 0,
        }
    }

    /// Adds one id; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let bytes = self
            .tokenizer
            .token_bytes(id)
            .ok_or(TokenizerError::UnknownId {
                id,
                position: self.position,
                vocab_size: self.tokenizer.vocab_size(),
            })?;
        self.position += 1;
        self.pending.extend_from_slice(bytes);
        let mut text = String::new();
        let mut rest = self.pending.as_slice();
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    text.push_str(valid);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid_up_to` marks a prefix that is valid UTF-8 by definition.
                    text.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        // Invalid no matter what follows: replace, as the lossy decode would.
                        Some(len) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            rest = after.get(len..).unwrap_or_default();
                        }
                        // A truncated sequence at the end: hold it for the next id.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        Ok(text)
    }

    /// Ends the stream: a held incomplete sequence becomes U+FFFD.
    pub fn flush(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}
