//! A Chat reply on the wire: each generated id goes through the engine's one reply reader
//! (`k3_engine::tokenizer::chat::ReplyReader`, spec §8.4), which gives its channel and any
//! tool-call delta for its Token; at the end, the reply's tool calls (or what was malformed)
//! for Done.

use k3_engine::tokenizer::Tokenizer;
use k3_engine::tokenizer::chat::{Channel, ReplyError, ReplyEvent, ReplyReader};
use k3proto::v1 as pb;

pub struct Channels<'t> {
    reader: ReplyReader<'t>,
}

impl<'t> Channels<'t> {
    pub fn new(tokenizer: &'t Tokenizer, thinking: bool) -> Channels<'t> {
        Channels {
            reader: ReplyReader::new(tokenizer, thinking),
        }
    }

    /// The channel of a generated id, and the tool-call delta it completes, if any (an id
    /// completes at most one: a call's start or one fragment of its arguments).
    pub fn classify(&mut self, id: u32) -> (pb::Channel, Option<pb::ToolCallDelta>) {
        let pushed = self.reader.push(id);
        let channel = match pushed.channel {
            Channel::Reasoning => pb::Channel::Reasoning,
            Channel::Content => pb::Channel::Response,
            Channel::ToolCall => pb::Channel::ToolCall,
            Channel::Control => pb::Channel::Control,
        };
        let delta = pushed.events.into_iter().find_map(|event| match event {
            ReplyEvent::ToolCallStart { index, id, name } => Some(pb::ToolCallDelta {
                index: wire_index(index),
                id,
                name,
                arguments: String::new(),
            }),
            ReplyEvent::ToolCallArguments { index, fragment } => Some(pb::ToolCallDelta {
                index: wire_index(index),
                arguments: fragment,
                ..Default::default()
            }),
            _ => None,
        });
        (channel, delta)
    }

    /// Done's tool calls and malformed report. `end_id` is the end-of-turn id that stopped the
    /// generation (the engine does not emit stop ids as tokens, so it is read here). A reply
    /// cut short (max_tokens, a stop string) is not malformed: its calls so far are returned.
    pub fn finish(
        mut self,
        end_id: Option<u32>,
    ) -> (Vec<pb::ToolCall>, Option<pb::MalformedReply>) {
        if let Some(id) = end_id {
            self.reader.push(id);
        }
        let (reply, malformed) = match self.reader.finish() {
            Ok(reply) => (reply, None),
            Err(m) => {
                let m = *m;
                let report = (!matches!(m.error, ReplyError::Truncated { .. })).then(|| {
                    pb::MalformedReply {
                        error: m.error.to_string(),
                        raw: m.raw,
                    }
                });
                (m.partial, report)
            }
        };
        let calls = reply
            .tool_calls
            .into_iter()
            .map(|c| pb::ToolCall {
                id: c.id,
                name: c.name,
                arguments: c.arguments,
            })
            .collect();
        (calls, malformed)
    }
}

/// A reply's call count fits u32 (it is bounded by the tokens generated).
fn wire_index(index: usize) -> u32 {
    u32::try_from(index).unwrap_or(u32::MAX)
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
        let mut channels = Channels::new(&t, true);
        let labels: Vec<pb::Channel> = ids.iter().map(|&id| channels.classify(id).0).collect();
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
        let mut channels = Channels::new(&t, false);
        let labels: Vec<pb::Channel> = ids.iter().map(|&id| channels.classify(id).0).collect();
        assert_eq!(
            &labels[..2],
            &[pb::Channel::Response, pb::Channel::Response]
        );
        assert!(labels[2..].iter().all(|l| *l == pb::Channel::Control));
    }

    #[test]
    fn tool_calls_stream_as_deltas_and_arrive_whole_in_done() {
        let t = tokenizer();
        let reply = "<|close|>response<|sep|><|open|>tools<|sep|>\
                     <|open|>call tool=\"f\" index=\"1\"<|sep|>\
                     <|open|>argument key=\"a\" type=\"number\"<|sep|>12<|close|>argument<|sep|>\
                     <|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>";
        let ids = t.encode(reply, Specials::Recognised).expect("encode");
        let mut channels = Channels::new(&t, false);
        let classified: Vec<_> = ids.iter().map(|&id| channels.classify(id)).collect();
        let deltas: Vec<&pb::ToolCallDelta> =
            classified.iter().filter_map(|(_, d)| d.as_ref()).collect();
        assert_eq!(
            (deltas[0].id.as_str(), deltas[0].name.as_str()),
            ("call_0", "f")
        );
        let arguments: String = deltas.iter().map(|d| d.arguments.as_str()).collect();
        assert_eq!(arguments, r#"{"a":12}"#);
        let value: String = ids
            .iter()
            .zip(&classified)
            .filter(|(_, (c, _))| *c == pb::Channel::ToolCall)
            .map(|(id, _)| char::from(*id as u8))
            .collect();
        assert_eq!(value, "12");
        // The end id is not a token: finish reads it.
        let (calls, malformed) = channels.finish(Some(t.controls().end_of_msg));
        assert!(malformed.is_none(), "{malformed:?}");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].arguments, arguments);

        // Cut short by max_tokens: not malformed.
        let mut cut = Channels::new(&t, false);
        for id in t.encode("partial", Specials::Plain).expect("encode") {
            cut.classify(id);
        }
        assert_eq!(cut.finish(None), (vec![], None));

        // A control id inside the response is reported with the raw output.
        let mut bad = Channels::new(&t, false);
        for id in t.encode("a<|sep|>b", Specials::Recognised).expect("encode") {
            bad.classify(id);
        }
        let (_, malformed) = bad.finish(Some(t.controls().end_of_msg));
        let malformed = malformed.expect("malformed");
        assert_eq!(malformed.raw, "a<|sep|>b<|end_of_msg|>");
        assert!(
            malformed.error.contains("position 1"),
            "{}",
            malformed.error
        );
    }
}
