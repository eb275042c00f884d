//! The serve core's reply as an Anthropic message: whole (`content` blocks: thinking, text,
//! tool_use) or streamed as Anthropic's named SSE events (`message_start`, `ping`, per block
//! `content_block_start` / `_delta` / `_stop`, `message_delta`, `message_stop`). Both are read
//! through the OpenAI routes' one `Reader` and written by the same plumbing
//! (`crate::http::stream`), so a streamed reply concatenates to the whole one.

use crate::http::App;
use crate::http::error::ApiError;
use crate::http::reader::{Finish, OpenAiUsage, Reader, ReplyPart};
use crate::http::stream::{self, Timer, Whole, Wire, collect};
use axum::http::header;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::sync::Arc;

/// What every message carries.
pub struct MessageHead {
    /// `msg_<request>`.
    pub id: String,
    /// The core's job id.
    pub request: u64,
    pub model: String,
    /// `thinking.display` is not `omitted`: the thinking blocks carry their text.
    pub show_thinking: bool,
}

/// An Anthropic message. Serialized as a struct, not through `serde_json::Value` (which sorts
/// keys), so a `tool_use` block's `input` goes out as the model wrote it.
#[derive(Serialize)]
struct AnthropicMessage<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: Vec<Block<'a>>,
    stop_reason: Option<&'static str>,
    stop_sequence: Option<&'a str>,
    usage: Value,
    /// k3's extension: where a reply broke K3's reply grammar, with the raw output.
    #[serde(skip_serializing_if = "Option::is_none")]
    k3_malformed: Option<Value>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    /// k3 does not sign its reasoning: `signature` (which Anthropic's SDK types require) is
    /// empty, and ignored when a client sends the block back.
    Thinking {
        thinking: &'a str,
        signature: &'static str,
    },
    Text {
        text: &'a str,
    },
    ToolUse {
        id: String,
        name: &'a str,
        input: Box<RawValue>,
    },
}

impl MessageHead {
    fn message<'a>(
        &'a self,
        content: Vec<Block<'a>>,
        end: Option<(&'static str, Option<&'a str>)>,
        usage: Value,
    ) -> AnthropicMessage<'a> {
        AnthropicMessage {
            id: &self.id,
            kind: "message",
            role: "assistant",
            model: &self.model,
            content,
            stop_reason: end.map(|(reason, _)| reason),
            stop_sequence: end.and_then(|(_, s)| s),
            usage,
            k3_malformed: None,
        }
    }
}

/// A tool call's id as Anthropic clients see it: unique per reply (`toolu_<request>_<call>`),
/// since agents keep calls of many turns apart by id; the template renders no id (spec §8.2),
/// so which one a client sends back does not change the prompt.
fn tool_use_id(request: u64, call_id: &str) -> String {
    format!("toolu_{request}_{call_id}")
}

/// Anthropic's usage: `input_tokens` are the prompt tokens computed for this request and
/// `cache_read_input_tokens` those a kept state already held (their sum is the prompt, as on
/// Anthropic's API); `thinking_tokens` counts the reasoning.
fn usage(u: &OpenAiUsage) -> Value {
    let cached = u.prompt_tokens_details.map_or(0, |d| d.cached_tokens);
    json!({
        "input_tokens": u.prompt_tokens - cached,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {
            "thinking_tokens": u.completion_tokens_details.map_or(0, |d| d.reasoning_tokens),
        },
    })
}

/// The `k3_malformed` extension of a reply that broke K3's reply grammar: the error and the
/// raw output.
fn malformed(finish: &Finish) -> Option<Value> {
    finish
        .malformed
        .as_ref()
        .map(|m| json!({"error": m.error, "raw": m.raw}))
}

/// Anthropic's `stop_reason` and `stop_sequence`. A reply that broke the template's grammar
/// (spec §8.4) ends like any other — its content is what was read before the break — and the
/// break is reported beside it (`k3_malformed`), never repaired.
fn ending(finish: &Finish) -> (&'static str, Option<&str>) {
    match (finish.reason, &finish.stop_string) {
        ("length", _) => ("max_tokens", None),
        ("tool_calls", _) => ("tool_use", None),
        (_, Some(s)) => ("stop_sequence", Some(s.as_str())),
        _ => ("end_turn", None),
    }
}

pub async fn respond(
    app: Arc<App>,
    head: MessageHead,
    reader: Reader,
    stream: bool,
    timer: Timer,
) -> Result<Response, ApiError> {
    if stream {
        let prompt_tokens = reader.prompt_tokens;
        let events = MessageEvents {
            head,
            prompt_tokens,
            blocks: Blocks::default(),
        };
        Ok(stream::sse(app, reader, timer, events))
    } else {
        let Whole {
            reasoning,
            content,
            finish,
        } = collect(&app, reader, timer).await?;
        let body = whole_body(&head, &reasoning, &content, &finish)?;
        Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
    }
}

/// The whole message as JSON text: `content` is the thinking block (if the reply reasoned),
/// the text block (if it said anything) and a `tool_use` block per call.
fn whole_body(
    head: &MessageHead,
    reasoning: &str,
    text: &str,
    finish: &Finish,
) -> Result<String, ApiError> {
    let end = ending(finish);
    let mut content = Vec::new();
    if !reasoning.is_empty() {
        content.push(Block::Thinking {
            thinking: if head.show_thinking { reasoning } else { "" },
            signature: "",
        });
    }
    if !text.is_empty() {
        content.push(Block::Text { text });
    }
    for call in &finish.tool_calls {
        let input = match RawValue::from_string(call.arguments.clone()) {
            Ok(input) => input,
            // max_tokens cut the call inside its arguments: a `tool_use` input must be an
            // object, so the incomplete call is left out and `stop_reason: "max_tokens"` says
            // why (Anthropic: retry with a larger max_tokens). A stream has sent its deltas.
            Err(_) if end.0 == "max_tokens" => continue,
            Err(e) => {
                return Err(ApiError::internal(format!(
                    "tool call {}'s arguments are not JSON: {e}",
                    call.id
                )));
            }
        };
        content.push(Block::ToolUse {
            id: tool_use_id(head.request, &call.id),
            name: &call.name,
            input,
        });
    }
    let mut message = head.message(content, Some(end), usage(&finish.usage));
    message.k3_malformed = malformed(finish);
    serde_json::to_string(&message)
        .map_err(|e| ApiError::internal(format!("encoding the message: {e}")))
}

/// The content block a streamed reply is in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
    /// The reply's call with this index.
    ToolUse(usize),
}

/// The streamed reply's blocks: each new kind of piece closes the open block and starts one.
#[derive(Default)]
struct Blocks {
    open: Option<Open>,
    /// Blocks started so far; the open one's index is one less.
    started: usize,
}

impl Blocks {
    /// The events that put the reply in block `kind` (`start`: its `content_block`).
    fn enter(&mut self, kind: Open, start: impl FnOnce() -> Value) -> Vec<Value> {
        if self.open == Some(kind) {
            return Vec::new();
        }
        let mut events: Vec<Value> = self.close().into_iter().collect();
        events.push(
            json!({"type": "content_block_start", "index": self.started, "content_block": start()}),
        );
        self.open = Some(kind);
        self.started += 1;
        events
    }

    fn delta(&self, delta: Value) -> Value {
        json!({"type": "content_block_delta", "index": self.started - 1, "delta": delta})
    }

    fn close(&mut self) -> Option<Value> {
        self.open
            .take()
            .map(|_| json!({"type": "content_block_stop", "index": self.started - 1}))
    }
}

/// The events one piece of the reply adds: a block's start (closing the open one) and its
/// delta; for the finish, the last block's stop, `message_delta` (with `k3_malformed` for a
/// reply that broke the grammar) and `message_stop`.
fn piece_events(blocks: &mut Blocks, head: &MessageHead, piece: &ReplyPart) -> Vec<Value> {
    let request = head.request;
    match piece {
        ReplyPart::Reasoning(t) => {
            let mut out = blocks.enter(
                Open::Thinking,
                || json!({"type": "thinking", "thinking": "", "signature": ""}),
            );
            if head.show_thinking {
                out.push(blocks.delta(json!({"type": "thinking_delta", "thinking": t})));
            }
            out
        }
        ReplyPart::Content(t) => {
            let mut out = blocks.enter(Open::Text, || json!({"type": "text", "text": ""}));
            out.push(blocks.delta(json!({"type": "text_delta", "text": t})));
            out
        }
        ReplyPart::ToolCall(d) => {
            let mut out = match &d.start {
                Some(start) => blocks.enter(Open::ToolUse(d.index), || {
                    json!({"type": "tool_use", "id": tool_use_id(request, &start.id),
                           "name": start.name, "input": {}})
                }),
                None => Vec::new(),
            };
            if !d.arguments.is_empty() {
                out.push(
                    blocks.delta(json!({"type": "input_json_delta", "partial_json": d.arguments})),
                );
            }
            out
        }
        ReplyPart::Finished(finish) => {
            let mut out: Vec<Value> = blocks.close().into_iter().collect();
            let (reason, sequence) = ending(finish);
            let mut delta = json!({"type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": usage(&finish.usage)});
            if let Some(m) = malformed(finish) {
                delta["k3_malformed"] = m;
            }
            out.push(delta);
            out.push(json!({"type": "message_stop"}));
            out
        }
    }
}

/// A message streamed as Anthropic's SSE events, each named by its `type`. An error after the
/// stream began is an `error` event.
struct MessageEvents {
    head: MessageHead,
    /// The prompt's size, known at once; what a kept state held is known at the end
    /// (`message_delta`'s usage, whose figures replace these).
    prompt_tokens: usize,
    blocks: Blocks,
}

/// `v` as an SSE event named by its `type`.
fn named(v: Value) -> Event {
    let name = v["type"].as_str().unwrap_or("error").to_string();
    Event::default().event(name).data(v.to_string())
}

impl Wire for MessageEvents {
    fn opening(&mut self) -> Vec<Event> {
        let usage = json!({"input_tokens": self.prompt_tokens, "output_tokens": 0});
        let start = self.head.message(Vec::new(), None, usage);
        vec![
            named(json!({"type": "message_start", "message": start})),
            named(json!({"type": "ping"})),
        ]
    }

    fn piece(&mut self, piece: &ReplyPart) -> Vec<Event> {
        piece_events(&mut self.blocks, &self.head, piece)
            .into_iter()
            .map(named)
            .collect()
    }

    fn error(&self, e: &ApiError) -> Event {
        named(e.anthropic_json())
    }

    /// Anthropic's own idle event.
    fn idle(&self) -> Event {
        named(json!({"type": "ping"}))
    }
}

#[cfg(test)]
mod tests {
    //! The reply's pieces as a scripted sequence (the random test models never call tools in
    //! the grammar, so the e2e tests cannot make them): the events a streaming client reads,
    //! and the whole message, tool calls included.

    use super::*;
    use crate::http::reader::{Details, PromptDetails};
    use k3_engine::serve::{ToolCallDelta, ToolCallStart};
    use k3_engine::tokenizer::chat::ToolCall;

    fn finish(reason: &'static str, stop_string: Option<&str>) -> Finish {
        Finish {
            reason,
            usage: OpenAiUsage {
                prompt_tokens: 30,
                completion_tokens: 9,
                total_tokens: 39,
                prompt_tokens_details: Some(PromptDetails { cached_tokens: 20 }),
                completion_tokens_details: Some(Details {
                    reasoning_tokens: 2,
                }),
            },
            tool_calls: vec![
                ToolCall {
                    id: "call_0".into(),
                    name: "get_weather".into(),
                    arguments: r#"{"unit": "C", "city": "Paris"}"#.into(),
                },
                ToolCall {
                    id: "call_1".into(),
                    name: "get_time".into(),
                    arguments: "{}".into(),
                },
            ],
            malformed: None,
            stop_string: stop_string.map(str::to_string),
        }
    }

    fn head(request: u64) -> MessageHead {
        MessageHead {
            id: format!("msg_{request}"),
            request,
            model: "tiny".into(),
            show_thinking: true,
        }
    }

    fn call(index: usize, start: Option<&str>, arguments: &str) -> ReplyPart {
        ReplyPart::ToolCall(ToolCallDelta {
            index,
            start: start.map(|name| ToolCallStart {
                id: format!("call_{index}"),
                name: name.into(),
            }),
            arguments: arguments.into(),
        })
    }

    #[test]
    fn streamed_blocks_open_close_and_index_in_order_and_concatenate_to_the_whole() {
        let pieces = [
            ReplyPart::Reasoning("Let me".into()),
            ReplyPart::Reasoning(" see.".into()),
            ReplyPart::Content("Checking.".into()),
            call(0, Some("get_weather"), ""),
            call(0, None, r#"{"unit": "C", "#),
            call(0, None, r#""city": "Paris"}"#),
            call(1, Some("get_time"), "{}"),
            ReplyPart::Finished(finish("tool_calls", None)),
        ];
        let mut blocks = Blocks::default();
        let events: Vec<Value> = pieces
            .iter()
            .flat_map(|p| piece_events(&mut blocks, &head(7), p))
            .collect();
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        // Thinking (two deltas), text, a call in three pieces (the first only starts it), a
        // call in one, then the finish.
        let blocks_expected = "start delta delta stop start delta stop start delta delta stop \
                               start delta stop";
        let expected: Vec<String> = blocks_expected
            .split_whitespace()
            .map(|k| format!("content_block_{k}"))
            .chain(["message_delta".into(), "message_stop".into()])
            .collect();
        assert_eq!(kinds, expected);
        // Every delta and stop belongs to the block started last.
        let mut open = None;
        for e in &events {
            match e["type"].as_str().unwrap() {
                "content_block_start" => {
                    let index = e["index"].as_u64().unwrap();
                    assert_eq!(index, open.map_or(0, |i: u64| i + 1));
                    open = Some(index);
                }
                "content_block_delta" | "content_block_stop" => {
                    assert_eq!(e["index"].as_u64(), open)
                }
                _ => {}
            }
        }
        // Accumulated as a client does, the blocks equal the whole message's.
        let mut content: Vec<Value> = Vec::new();
        let mut json_text = String::new();
        for e in &events {
            match e["type"].as_str().unwrap() {
                "content_block_start" => content.push(e["content_block"].clone()),
                "content_block_delta" => {
                    let block = content.last_mut().unwrap();
                    let d = &e["delta"];
                    match d["type"].as_str().unwrap() {
                        "thinking_delta" => {
                            let t = block["thinking"].as_str().unwrap().to_string();
                            block["thinking"] = json!(t + d["thinking"].as_str().unwrap());
                        }
                        "text_delta" => {
                            let t = block["text"].as_str().unwrap().to_string();
                            block["text"] = json!(t + d["text"].as_str().unwrap());
                        }
                        "input_json_delta" => {
                            json_text.push_str(d["partial_json"].as_str().unwrap())
                        }
                        other => panic!("delta {other}"),
                    }
                }
                "content_block_stop" if !json_text.is_empty() => {
                    content.last_mut().unwrap()["input"] =
                        serde_json::from_str(&std::mem::take(&mut json_text)).unwrap();
                }
                _ => {}
            }
        }
        let head = head(7);
        let whole: Value = serde_json::from_str(
            &whole_body(
                &head,
                "Let me see.",
                "Checking.",
                &finish("tool_calls", None),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(Value::Array(content), whole["content"]);
        assert_eq!(whole["content"][2]["id"], "toolu_7_call_0");
        let delta = &events[events.len() - 2];
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
        assert_eq!(delta["usage"], whole["usage"]);
        assert_eq!(
            whole["usage"],
            json!({"input_tokens": 10, "cache_read_input_tokens": 20,
                   "cache_creation_input_tokens": 0, "output_tokens": 9,
                   "output_tokens_details": {"thinking_tokens": 2}})
        );
    }

    #[test]
    fn a_tool_use_input_keeps_the_order_the_model_wrote_its_keys_in() {
        let body = whole_body(&head(1), "", "", &finish("tool_calls", None)).unwrap();
        assert!(
            body.contains(r#""input":{"unit": "C", "city": "Paris"}"#),
            "{body}"
        );
    }

    #[test]
    fn stop_reasons_map_and_a_malformed_reply_ends_as_usual_with_the_break_reported() {
        let reasons = [
            (finish("length", None), "max_tokens", Value::Null),
            (finish("stop", Some("##")), "stop_sequence", json!("##")),
            (finish("stop", None), "end_turn", Value::Null),
        ];
        for (f, reason, sequence) in reasons {
            let events = piece_events(&mut Blocks::default(), &head(1), &ReplyPart::Finished(f));
            assert_eq!(events[0]["delta"]["stop_reason"], reason);
            assert_eq!(events[0]["delta"]["stop_sequence"], sequence);
        }
        let mut broken = finish("stop", None);
        broken.tool_calls.clear();
        broken.malformed = Some(k3_engine::serve::Malformed {
            error: "a control id inside an argument".into(),
            raw: "<|open|>tools".into(),
        });
        let events = piece_events(
            &mut Blocks::default(),
            &head(1),
            &ReplyPart::Finished(broken),
        );
        assert_eq!(events[0]["type"], "message_delta");
        assert_eq!(events[0]["delta"]["stop_reason"], "end_turn");
        assert_eq!(events[0]["k3_malformed"]["raw"], "<|open|>tools");
        assert_eq!(events[1]["type"], "message_stop");
    }
}
