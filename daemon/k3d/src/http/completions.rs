//! `POST /v1/chat/completions` and `POST /v1/completions`, streamed (SSE) and whole. Both read
//! the serve core's reply through one `Reader` (submitted, collected and streamed by
//! [`super::stream`]) and differ only in how a piece is written (`CompletionKind`), so a streamed reply
//! concatenates to exactly the whole one.

use super::App;
use super::body::{self, Shape};
use super::error::ApiError;
use super::reader::{Finish, OpenAiUsage, Reader, ReplyPart};
use super::stream::{self, Route, Timer, Whole, Wire, collect, submit};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use k3_engine::serve::{Caller, Reservation, ToolCallDelta};
use k3_engine::tokenizer::chat::ToolCall;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Which endpoint: chat completions or text completions.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum CompletionKind {
    Chat,
    Text,
}

impl CompletionKind {
    fn route(self) -> &'static Route {
        match self {
            CompletionKind::Chat => &Route {
                endpoint: "POST /v1/chat/completions",
                prompt_field: "messages",
                stop_field: "stop",
                chat: true,
            },
            CompletionKind::Text => &Route {
                endpoint: "POST /v1/completions",
                prompt_field: "prompt",
                stop_field: "stop",
                chat: false,
            },
        }
    }
}

/// What every chunk and the whole response carry.
struct CompletionHead {
    shape: CompletionKind,
    id: String,
    created: u64,
    model: String,
}

impl CompletionHead {
    fn object(&self, streamed: bool) -> &'static str {
        match (self.shape, streamed) {
            (CompletionKind::Chat, false) => "chat.completion",
            (CompletionKind::Chat, true) => "chat.completion.chunk",
            (CompletionKind::Text, _) => "text_completion",
        }
    }

    fn chunk(&self, choices: Value, usage: Option<&OpenAiUsage>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = json!(u);
        }
        v
    }

    /// One choice of a streamed chunk.
    fn delta(&self, piece: Delta<'_>, finish_reason: Option<&str>) -> Value {
        match self.shape {
            CompletionKind::Chat => {
                let delta = match piece {
                    Delta::Role => json!({"role": "assistant", "content": ""}),
                    Delta::Content(t) => json!({"content": t}),
                    Delta::Reasoning(t) => json!({"reasoning_content": t}),
                    Delta::ToolCall(d) => json!({"tool_calls": [tool_call_delta(d)]}),
                    Delta::Empty => json!({}),
                };
                json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}])
            }
            CompletionKind::Text => {
                let text = match piece {
                    Delta::Content(t) => t,
                    _ => "",
                };
                json!([{"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason}])
            }
        }
    }

    fn whole(&self, whole: &Whole) -> Value {
        let Whole {
            reasoning,
            content,
            finish,
        } = whole;
        let mut choice = match self.shape {
            CompletionKind::Chat => {
                let mut message = json!({"role": "assistant", "content": content});
                if !reasoning.is_empty() {
                    message["reasoning_content"] = json!(reasoning);
                }
                if !finish.tool_calls.is_empty() {
                    message["tool_calls"] = finish.tool_calls.iter().map(tool_call).collect();
                    if content.is_empty() {
                        // OpenAI's shape for a turn that only calls tools.
                        message["content"] = Value::Null;
                    }
                }
                json!({"index": 0, "message": message, "logprobs": null, "finish_reason": finish.reason})
            }
            CompletionKind::Text => {
                json!({"index": 0, "text": content, "logprobs": null, "finish_reason": finish.reason})
            }
        };
        malformed(&mut choice, finish);
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": finish.usage,
        })
    }
}

enum Delta<'a> {
    Role,
    Content(&'a str),
    Reasoning(&'a str),
    ToolCall(&'a ToolCallDelta),
    Empty,
}

/// A whole tool call as OpenAI returns it in a message.
fn tool_call(c: &ToolCall) -> Value {
    json!({
        "id": c.id,
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments},
    })
}

/// One streamed piece of a tool call: the first carries its id, type and name (with empty
/// arguments), later ones fragments of the arguments' JSON text.
fn tool_call_delta(d: &ToolCallDelta) -> Value {
    match &d.start {
        Some(start) => json!({
            "index": d.index,
            "id": start.id,
            "type": "function",
            "function": {"name": start.name, "arguments": d.arguments},
        }),
        None => json!({"index": d.index, "function": {"arguments": d.arguments}}),
    }
}

/// A malformed chat reply (spec §8.4) is reported, never repaired: its content is what was
/// read before the break, its `finish_reason` a standard one, and `k3_malformed` says where the
/// grammar broke, with the raw output.
fn malformed(choice: &mut Value, finish: &Finish) {
    if let Some(m) = &finish.malformed {
        choice["k3_malformed"] = json!({"error": m.error, "raw": m.raw});
    }
}

pub async fn complete(
    app: Arc<App>,
    caller: Option<Caller>,
    shape: CompletionKind,
    body: axum::body::Bytes,
    reservation: Reservation,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let (wire, (), reader) = super::prepare(&app, reservation, body, move |app, turn, body| {
        submit(app, turn, caller, shape.route(), body, |fields| {
            let submission = match shape {
                CompletionKind::Chat => body::chat(fields)?,
                CompletionKind::Text => body::completion(fields)?,
            };
            Ok((submission, ()))
        })
    })
    .await?;
    respond(app, shape, wire, reader, arrived).await
}

async fn respond(
    app: Arc<App>,
    shape: CompletionKind,
    wire: Shape,
    reader: Reader,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let head = CompletionHead {
        shape,
        id: format!(
            "{}-{}",
            if shape == CompletionKind::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            reader.request_id
        ),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: wire.model,
    };
    let timer = Timer::new(arrived);
    if wire.stream {
        let include_usage = wire.include_usage;
        Ok(stream::sse(
            app,
            reader,
            timer,
            Chunks {
                head,
                include_usage,
            },
        ))
    } else {
        let whole = collect(&app, reader, timer).await?;
        Ok(axum::Json(head.whole(&whole)).into_response())
    }
}

/// A chat or text completion streamed in OpenAI's chunks, `data: [DONE]` last.
struct Chunks {
    head: CompletionHead,
    include_usage: bool,
}

/// An SSE event carrying `v` as its data.
fn data(v: Value) -> Event {
    Event::default().data(v.to_string())
}

impl Wire for Chunks {
    fn opening(&mut self) -> Vec<Event> {
        let head = &self.head;
        match head.shape {
            CompletionKind::Chat => vec![data(head.chunk(head.delta(Delta::Role, None), None))],
            CompletionKind::Text => Vec::new(),
        }
    }

    fn piece(&mut self, piece: &ReplyPart) -> Vec<Event> {
        let head = &self.head;
        let delta = match piece {
            ReplyPart::Reasoning(t) => Delta::Reasoning(t),
            ReplyPart::Content(t) => Delta::Content(t),
            ReplyPart::ToolCall(d) => Delta::ToolCall(d),
            ReplyPart::Finished(finish) => {
                let mut choices = head.delta(Delta::Empty, Some(finish.reason));
                malformed(&mut choices[0], finish);
                let mut out = vec![data(head.chunk(choices, None))];
                if self.include_usage {
                    out.push(data(head.chunk(json!([]), Some(&finish.usage))));
                }
                out.push(Event::default().data("[DONE]"));
                return out;
            }
        };
        vec![data(head.chunk(head.delta(delta, None), None))]
    }

    fn error(&self, e: &ApiError) -> Event {
        data(e.json())
    }

    /// An SSE comment line, which OpenAI's clients skip.
    fn idle(&self) -> Event {
        Event::default().comment("keep-alive")
    }
}
