//! `POST /v1/chat/completions` and `POST /v1/completions`, streamed (SSE) and whole. Both read
//! the serve core's reply through one `Reader` and differ only in how a piece is written
//! (`Shape`), so a streamed reply concatenates to exactly the whole one.

use super::error::ApiError;
use super::reply::{Finish, Piece, Reader, Usage};
use super::request::{self, Common, Fields};
use super::{App, Peer};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use k3_engine::serve::{Caller, Request as CoreRequest, ToolCallDelta};
use k3_engine::tokenizer::chat::ToolCall;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// SSE events buffered per response: small, so a client that stops reading is noticed soon.
const SSE_BUFFER: usize = 8;

/// Which endpoint: chat completions or text completions.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Chat,
    Text,
}

/// What every chunk and the whole response carry.
struct Head {
    shape: Shape,
    id: String,
    created: u64,
    model: String,
}

impl Head {
    fn object(&self, streamed: bool) -> &'static str {
        match (self.shape, streamed) {
            (Shape::Chat, false) => "chat.completion",
            (Shape::Chat, true) => "chat.completion.chunk",
            (Shape::Text, _) => "text_completion",
        }
    }

    fn chunk(&self, choices: Value, usage: Option<&Usage>) -> Value {
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
            Shape::Chat => {
                let delta = match piece {
                    Delta::Role => json!({"role": "assistant", "content": ""}),
                    Delta::Content(t) => json!({"content": t}),
                    Delta::Reasoning(t) => json!({"reasoning_content": t}),
                    Delta::ToolCall(d) => json!({"tool_calls": [tool_call_delta(d)]}),
                    Delta::Empty => json!({}),
                };
                json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}])
            }
            Shape::Text => {
                let text = match piece {
                    Delta::Content(t) => t,
                    _ => "",
                };
                json!([{"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason}])
            }
        }
    }

    fn whole(&self, reasoning: &str, content: &str, finish: &Finish) -> Value {
        let mut choice = match self.shape {
            Shape::Chat => {
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
            Shape::Text => {
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
    peer: Peer,
    caller: Option<Caller>,
    shape: Shape,
    body: &[u8],
    arrived: Instant,
) -> Result<Response, ApiError> {
    let fields = Fields::parse(body)?;
    // The core's refusals name values, not fields: the field they concern is the prompt.
    let (common, request, param): (Common, CoreRequest, &str) = match shape {
        Shape::Chat => {
            let p = request::chat(&fields)?;
            (p.common, p.request, "messages")
        }
        Shape::Text => {
            let p = request::completion(&fields)?;
            (p.common, p.request, "prompt")
        }
    };
    let reader = submit(
        &app,
        peer,
        caller,
        &common,
        request,
        shape == Shape::Chat,
        param,
    )
    .await?;
    respond(app, shape, common, reader, arrived).await
}

/// Queues `request` on the serve core for every route that generates (`chat`: whether its
/// reasoning is counted); `param` is the field the core's refusals concern.
pub async fn submit(
    app: &App,
    peer: Peer,
    caller: Option<Caller>,
    common: &Common,
    mut request: CoreRequest,
    chat: bool,
    param: &str,
) -> Result<Reader, ApiError> {
    app.check_model(&common.model)?;
    app.check_ready()?;
    // Clients resend the whole conversation each turn: continue from the caller's longest
    // kept prefix (bit-identical to computing it afresh) unless told not to.
    if common.prefix_reuse {
        request.reuse = caller;
    }
    // Submission tokenises and renders the prompt (seconds for a large one): off the async
    // workers, which every other request shares.
    let core = Arc::clone(&app.core);
    let uid = peer.uid();
    let job = tokio::task::spawn_blocking(move || core.submit(uid, request))
        .await
        .map_err(|e| ApiError::internal(format!("the request's task failed: {e}")))?
        .map_err(|e| ApiError::from_serve(&e, Some(param)))?;
    Ok(Reader::new(job, chat, &common.stop_strings))
}

async fn respond(
    app: Arc<App>,
    shape: Shape,
    common: Common,
    reader: Reader,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let head = Head {
        shape,
        id: format!(
            "{}-{}",
            if shape == Shape::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            reader.request_id
        ),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: common.model,
    };
    let timer = Timer::new(arrived);
    if common.stream {
        let (tx, rx) = mpsc::channel(SSE_BUFFER);
        tokio::spawn(stream(app, head, reader, common.include_usage, timer, tx));
        Ok(Sse::new(ReceiverStream::new(rx)).into_response())
    } else {
        whole(app, head, reader, timer).await
    }
}

/// Time to first token and decode time per token, for the metrics.
pub struct Timer {
    arrived: Instant,
    first: Option<Instant>,
}

impl Timer {
    pub fn new(arrived: Instant) -> Timer {
        Timer {
            arrived,
            first: None,
        }
    }

    pub fn piece(&mut self) {
        self.first.get_or_insert_with(Instant::now);
    }

    pub fn record(&self, app: &App, usage: &Usage) {
        let ttft = self.first.map(|f| (f - self.arrived).as_secs_f64());
        let decode = self
            .first
            .filter(|_| usage.completion_tokens > 1)
            .map(|f| f.elapsed().as_secs_f64() / (usage.completion_tokens - 1) as f64);
        app.metrics
            .generation(usage.prompt_tokens, usage.completion_tokens, ttft, decode);
    }
}

async fn whole(
    app: Arc<App>,
    head: Head,
    reader: Reader,
    timer: Timer,
) -> Result<Response, ApiError> {
    let (reasoning, content, finish) = collect(&app, reader, timer).await?;
    Ok(axum::Json(head.whole(&reasoning, &content, &finish)).into_response())
}

/// A whole (not streamed) reply: its reasoning, its content and how it finished (with its
/// tool calls), timed for the metrics.
pub async fn collect(
    app: &App,
    mut reader: Reader,
    mut timer: Timer,
) -> Result<(String, String, Finish), ApiError> {
    let (mut reasoning, mut content) = (String::new(), String::new());
    while let Some(piece) = reader.next().await {
        match piece? {
            // The whole calls come with the finish.
            Piece::ToolCall(_) => timer.piece(),
            Piece::Reasoning(t) => {
                timer.piece();
                reasoning.push_str(&t);
            }
            Piece::Content(t) => {
                timer.piece();
                content.push_str(&t);
            }
            Piece::Finished(finish) => {
                timer.record(app, &finish.usage);
                return Ok((reasoning, content, finish));
            }
        }
    }
    Err(ApiError::internal("the reply ended without finishing"))
}

/// Writes the reply as SSE into `tx`. Ends as soon as the client is gone (the response body,
/// and with it `tx`'s receiver, is dropped): dropping `reader` closes the core's stream, which
/// cancels the generation at its next layer boundary (as a gRPC client that goes away does).
async fn stream(
    app: Arc<App>,
    head: Head,
    mut reader: Reader,
    include_usage: bool,
    mut timer: Timer,
    tx: mpsc::Sender<Result<Event, Infallible>>,
) {
    let send = |v: Value| {
        let tx = tx.clone();
        async move {
            tx.send(Ok(Event::default().data(v.to_string())))
                .await
                .is_ok()
        }
    };
    if head.shape == Shape::Chat && !send(head.chunk(head.delta(Delta::Role, None), None)).await {
        return;
    }
    loop {
        let piece = tokio::select! {
            piece = reader.next() => piece,
            () = tx.closed() => return,
        };
        let chunk = match piece {
            None => return,
            Some(Err(e)) => {
                let _ = send(e.json()).await;
                return;
            }
            Some(Ok(Piece::Reasoning(t))) => {
                timer.piece();
                head.chunk(head.delta(Delta::Reasoning(&t), None), None)
            }
            Some(Ok(Piece::Content(t))) => {
                timer.piece();
                head.chunk(head.delta(Delta::Content(&t), None), None)
            }
            Some(Ok(Piece::ToolCall(d))) => {
                timer.piece();
                head.chunk(head.delta(Delta::ToolCall(&d), None), None)
            }
            Some(Ok(Piece::Finished(finish))) => {
                timer.record(&app, &finish.usage);
                let mut choices = head.delta(Delta::Empty, Some(finish.reason));
                malformed(&mut choices[0], &finish);
                let last = head.chunk(choices, None);
                if !send(last).await {
                    return;
                }
                if include_usage && !send(head.chunk(json!([]), Some(&finish.usage))).await {
                    return;
                }
                let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
                return;
            }
        };
        if !send(chunk).await {
            return;
        }
    }
}
