//! Which channel each generated id of a Chat reply belongs to (spec §8.4: after a thinking
//! prompt, reasoning until `<|close|> think <|sep|> <|open|> response <|sep|>`, then response;
//! the structure ids themselves are control).

use k3_engine::tokenizer::{Controls, Tokenizer};
use k3proto::v1 as pb;

/// Labels each generated id of a Chat reply. A tag is the ids between `<|open|>`/`<|close|>`
/// and `<|sep|>`; opening `think` switches to reasoning, opening `response` to response.
pub struct Channels {
    controls: Controls,
    current: pb::Channel,
    /// Some(ids so far) while inside `<|open|> tag` (before its `<|sep|>`).
    opening: Option<Vec<u32>>,
    /// Inside `<|close|> tag` (before its `<|sep|>`).
    closing: bool,
}

impl Channels {
    pub fn new(controls: Controls, thinking: bool) -> Channels {
        Channels {
            controls,
            current: if thinking {
                pb::Channel::Reasoning
            } else {
                pb::Channel::Response
            },
            opening: None,
            closing: false,
        }
    }

    pub fn classify(&mut self, tokenizer: &Tokenizer, id: u32) -> pb::Channel {
        let m = self.controls;
        if id == m.open {
            self.opening = Some(Vec::new());
            return pb::Channel::Control;
        }
        if id == m.close {
            self.closing = true;
            return pb::Channel::Control;
        }
        if id == m.sep {
            if let Some(tag) = self.opening.take() {
                let name = tokenizer.decode(&tag).unwrap_or_default();
                match name.as_slice() {
                    b"think" => self.current = pb::Channel::Reasoning,
                    b"response" => self.current = pb::Channel::Response,
                    _ => {}
                }
            }
            self.closing = false;
            return pb::Channel::Control;
        }
        if id == m.end_of_msg || id == m.eos {
            return pb::Channel::Control;
        }
        if let Some(tag) = self.opening.as_mut() {
            tag.push(id);
            return pb::Channel::Control;
        }
        if self.closing {
            return pb::Channel::Control;
        }
        self.current
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use k3_engine::tokenizer::Specials;

    /// A byte-level tokenizer (ranks = the 256 bytes) with the K3 added tokens after them.
    fn tokenizer() -> Tokenizer {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path();
        let ranks: String = (0u8..=255)
            .map(|b| {
                let key = base64::engine::general_purpose::STANDARD.encode([b]);
                format!("{key} {b}\n")
            })
            .collect();
        std::fs::write(dir.join("tiktoken.model"), ranks).expect("ranks");
        let names = [
            "[BOS]",
            "[EOS]",
            "<|end_of_msg|>",
            "<|open|>",
            "<|close|>",
            "<|sep|>",
        ];
        let decoder: serde_json::Map<String, serde_json::Value> = names
            .iter()
            .enumerate()
            .map(|(i, n)| ((256 + i).to_string(), serde_json::json!({ "content": n })))
            .collect();
        let config = serde_json::json!({ "added_tokens_decoder": decoder });
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("config");
        Tokenizer::load(dir).expect("byte tokenizer")
    }

    #[test]
    fn a_thinking_reply_is_reasoning_then_response_with_structure_as_control() {
        let t = tokenizer();
        let reply = "ab<|close|>think<|sep|><|open|>response<|sep|>cd\
                     <|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>";
        let ids = t.encode(reply, Specials::Recognised).expect("encode");
        let mut channels = Channels::new(t.controls(), true);
        let labels: Vec<pb::Channel> = ids.iter().map(|&id| channels.classify(&t, id)).collect();
        let text_of = |want: pb::Channel| -> String {
            let picked: Vec<u32> = ids
                .iter()
                .zip(&labels)
                .filter(|(_, l)| **l == want)
                .map(|(id, _)| *id)
                .collect();
            String::from_utf8(t.decode(&picked).expect("decode")).expect("utf8")
        };
        assert_eq!(text_of(pb::Channel::Reasoning), "ab");
        assert_eq!(text_of(pb::Channel::Response), "cd");
        assert_eq!(
            text_of(pb::Channel::Control),
            "<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>\
             <|close|>message<|sep|><|end_of_msg|>"
        );
    }

    #[test]
    fn without_thinking_the_reply_is_response() {
        let t = tokenizer();
        let ids = t
            .encode("hi<|close|>response<|sep|>", Specials::Recognised)
            .expect("encode");
        let mut channels = Channels::new(t.controls(), false);
        let labels: Vec<pb::Channel> = ids.iter().map(|&id| channels.classify(&t, id)).collect();
        assert_eq!(
            &labels[..2],
            &[pb::Channel::Response, pb::Channel::Response]
        );
        assert!(labels[2..].iter().all(|l| *l == pb::Channel::Control));
    }
}
