//! The serve core's reply as an OpenAI Responses object: whole, or streamed as the API's named
//! events — `response.created`, `response.in_progress`, per output item
//! `response.output_item.added` … `.done` with its content's events in between
//! (`response.reasoning_text.delta`/`.done`, `response.content_part.added`/`.done`,
//! `response.output_text.delta`/`.done`, `response.function_call_arguments.delta`/`.done`),
//! and last `response.completed` (or `response.incomplete` when `max_output_tokens` or the
//! daemon's cap ended the reply) carrying the whole response. Every event has its `type` and a
//! `sequence_number`. Both are read through the one `Reader` and built by the same item
//! constructors, so the streamed response's final object is the whole one.
//!
//! Output items, in the reply's order: a `reasoning` item (the thinking as `reasoning_text`
//! content, `summary` empty: K3 does not summarise; a client sends the item back and the
//! thinking is rendered as it was generated), a `message` with one `output_text` part, and a
//! `function_call` per call (`call_id` unique across turns, `call_<request>_<i>`; a namespaced
//! function's call carries its `namespace`).

use super::input::Echoed;
use crate::http::App;
use crate::http::body::Shape;
use crate::http::error::ApiError;
use crate::http::reader::{Finish, OpenAiUsage, Reader, ReplyPart};
use crate::http::stream::{self, Timer, Whole, Wire, collect};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::cell::Cell;
use std::sync::Arc;

/// What every response carries.
pub struct ResponseHead {
    /// The core's job id: `resp_<request>`, and its items' ids.
    pub request: u64,
    pub created_at: u64,
    /// The model named and whether the reply streams.
    pub shape: Shape,
    pub echoed: Echoed,
}

impl ResponseHead {
    fn id(&self) -> String {
        format!("resp_{}", self.request)
    }

    /// The response object. `usage` and the end are known once the reply finished.
    fn response(&self, status: &str, output: Vec<Value>, end: Option<&Finish>) -> Value {
        let e = &self.echoed;
        let mut r = json!({
            "id": self.id(),
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.shape.model,
            "output": output,
            "error": null,
            "incomplete_details": null,
            "instructions": e.instructions,
            "tools": e.tools,
            "tool_choice": e.tool_choice,
            "parallel_tool_calls": e.parallel_tool_calls,
            "max_output_tokens": e.options.max_output_tokens,
            "temperature": e.options.sampling.temperature,
            "top_p": e.options.sampling.top_p,
            "reasoning": {"effort": e.reasoning_effort, "summary": null},
            "text": {"format": e.text_format},
            "truncation": "disabled",
            "store": e.store,
            "metadata": e.metadata,
            "previous_response_id": null,
            "usage": null,
        });
        if let Some(finish) = end {
            r["usage"] = usage(&finish.usage);
            if finish.reason == "length" {
                r["incomplete_details"] = json!({"reason": "max_output_tokens"});
            }
            if let Some(m) = &finish.malformed {
                r["k3_malformed"] = json!({"error": m.error, "raw": m.raw});
            }
        }
        r
    }

    fn reasoning_id(&self) -> String {
        format!("rs_{}", self.request)
    }

    fn message_id(&self) -> String {
        format!("msg_{}", self.request)
    }

    /// A call's item id and `call_id` from the core's call index.
    fn call_ids(&self, index: usize) -> (String, String) {
        (
            format!("fc_{}_{index}", self.request),
            format!("call_{}_{index}", self.request),
        )
    }

    fn reasoning_item(&self, text: &str, status: &str) -> Value {
        let content = if status == "in_progress" {
            json!([])
        } else {
            json!([{"type": "reasoning_text", "text": text}])
        };
        json!({"type": "reasoning", "id": self.reasoning_id(), "summary": [], "content": content,
               "encrypted_content": null, "status": status})
    }

    fn message_item(&self, text: &str, status: &str) -> Value {
        let content = if status == "in_progress" {
            json!([])
        } else {
            json!([output_text(text)])
        };
        json!({"type": "message", "id": self.message_id(), "role": "assistant",
               "status": status, "content": content})
    }

    /// A function call item; `name` as declared to the model (`NS.NAME` for a namespace's).
    fn call_item(&self, index: usize, name: &str, arguments: &str, status: &str) -> Value {
        let (id, call_id) = self.call_ids(index);
        let mut item = json!({"type": "function_call", "id": id, "call_id": call_id,
                              "name": name, "arguments": arguments, "status": status});
        if let Some((_, namespace)) = self.echoed.namespaces.iter().find(|(q, _)| q == name) {
            item["name"] = json!(&name[namespace.len() + 1..]);
            item["namespace"] = json!(namespace);
        }
        item
    }

    /// The whole reply's output items.
    fn output(&self, whole: &Whole) -> Vec<Value> {
        let mut output = Vec::new();
        if !whole.reasoning.is_empty() {
            output.push(self.reasoning_item(&whole.reasoning, "completed"));
        }
        if whole.finish.tool_calls.is_empty() {
            output.push(self.message_item(&whole.content, status(&whole.finish)));
        } else if !whole.content.is_empty() {
            output.push(self.message_item(&whole.content, "completed"));
        }
        for (index, call) in whole.finish.tool_calls.iter().enumerate() {
            output.push(self.call_item(index, &call.name, &call.arguments, "completed"));
        }
        output
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// `completed`, or `incomplete` when the token limit ended the reply.
fn status(finish: &Finish) -> &'static str {
    if finish.reason == "length" {
        "incomplete"
    } else {
        "completed"
    }
}

/// The Responses API's usage: the prompt with the tokens a kept state held, the output with
/// its reasoning.
fn usage(u: &OpenAiUsage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": u.prompt_tokens_details.map_or(0, |d| d.cached_tokens),
        },
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {
            "reasoning_tokens": u.completion_tokens_details.map_or(0, |d| d.reasoning_tokens),
        },
        "total_tokens": u.total_tokens,
    })
}

/// The response, streamed as events when the request asked for a stream.
pub async fn respond(
    app: Arc<App>,
    head: ResponseHead,
    reader: Reader,
    timer: Timer,
) -> Result<Response, ApiError> {
    if head.shape.stream {
        let events = ResponseEvents {
            head,
            sequence: Cell::new(0),
            open: None,
            done: Vec::new(),
        };
        Ok(stream::sse(app, reader, timer, events))
    } else {
        let whole = collect(&app, reader, timer).await?;
        let output = head.output(&whole);
        let body = head.response(status(&whole.finish), output, Some(&whole.finish));
        Ok(axum::Json(body).into_response())
    }
}

/// The output item a streamed reply is in, with what it has so far.
enum Open {
    Reasoning {
        text: String,
    },
    Message {
        text: String,
    },
    Call {
        index: usize,
        name: String,
        arguments: String,
    },
}

/// A response streamed as the API's events.
struct ResponseEvents {
    head: ResponseHead,
    /// The next event's `sequence_number` (the idle and error events take one too).
    sequence: Cell<u64>,
    open: Option<Open>,
    /// Finished output items, in order.
    done: Vec<Value>,
}

impl ResponseEvents {
    /// `v` as an SSE event named by its `type`, numbered.
    fn named(&self, mut v: Value) -> Event {
        let n = self.sequence.get();
        self.sequence.set(n + 1);
        v["sequence_number"] = json!(n);
        let name = v["type"].as_str().unwrap_or("error").to_string();
        Event::default().event(name).data(v.to_string())
    }

    /// The output index of the open item.
    fn index(&self) -> usize {
        self.done.len()
    }

    /// The events that finish the open item.
    fn close(&mut self, last: Option<&Finish>) -> Vec<Value> {
        let Some(open) = self.open.take() else {
            return Vec::new();
        };
        let output_index = self.index();
        let h = &self.head;
        let (events, item) = match open {
            Open::Reasoning { text } => {
                let id = h.reasoning_id();
                let part = json!({"type": "reasoning_text", "text": text});
                (
                    vec![
                        json!({"type": "response.reasoning_text.done", "item_id": id,
                               "output_index": output_index, "content_index": 0, "text": text}),
                        json!({"type": "response.content_part.done", "item_id": id,
                               "output_index": output_index, "content_index": 0, "part": part}),
                    ],
                    h.reasoning_item(&text, "completed"),
                )
            }
            Open::Message { text } => {
                let id = h.message_id();
                let item_status = last.map_or("completed", status);
                (
                    vec![
                        json!({"type": "response.output_text.done", "item_id": id,
                               "output_index": output_index, "content_index": 0, "text": text,
                               "logprobs": []}),
                        json!({"type": "response.content_part.done", "item_id": id,
                               "output_index": output_index, "content_index": 0,
                               "part": output_text(&text)}),
                    ],
                    h.message_item(&text, item_status),
                )
            }
            Open::Call {
                index,
                name,
                arguments,
            } => {
                let item = h.call_item(index, &name, &arguments, last.map_or("completed", status));
                (
                    vec![json!({"type": "response.function_call_arguments.done",
                                "item_id": item["id"], "output_index": output_index,
                                "name": item["name"], "arguments": arguments})],
                    item,
                )
            }
        };
        let mut events = events;
        events.push(
            json!({"type": "response.output_item.done", "output_index": output_index,
                           "item": item}),
        );
        self.done.push(item);
        events
    }

    /// The events that open `open` as the next output item.
    fn enter(&mut self, open: Open, last: Option<&Finish>) -> Vec<Value> {
        let mut events = self.close(last);
        let output_index = self.index();
        let h = &self.head;
        match &open {
            Open::Reasoning { .. } => {
                let item = h.reasoning_item("", "in_progress");
                events.push(json!({"type": "response.output_item.added",
                                   "output_index": output_index, "item": item}));
                events.push(json!({"type": "response.content_part.added",
                                   "item_id": h.reasoning_id(), "output_index": output_index,
                                   "content_index": 0,
                                   "part": {"type": "reasoning_text", "text": ""}}));
            }
            Open::Message { .. } => {
                let item = h.message_item("", "in_progress");
                events.push(json!({"type": "response.output_item.added",
                                   "output_index": output_index, "item": item}));
                events.push(json!({"type": "response.content_part.added",
                                   "item_id": h.message_id(), "output_index": output_index,
                                   "content_index": 0, "part": output_text("")}));
            }
            Open::Call { index, name, .. } => {
                let item = h.call_item(*index, name, "", "in_progress");
                events.push(json!({"type": "response.output_item.added",
                                   "output_index": output_index, "item": item}));
            }
        }
        self.open = Some(open);
        events
    }

    /// The events one piece of the reply adds.
    fn piece_events(&mut self, piece: &ReplyPart) -> Vec<Value> {
        match piece {
            ReplyPart::Reasoning(t) => {
                let mut events = match self.open {
                    Some(Open::Reasoning { .. }) => Vec::new(),
                    _ => self.enter(
                        Open::Reasoning {
                            text: String::new(),
                        },
                        None,
                    ),
                };
                let output_index = self.index();
                if let Some(Open::Reasoning { text }) = &mut self.open {
                    text.push_str(t);
                }
                events.push(json!({"type": "response.reasoning_text.delta",
                                   "item_id": self.head.reasoning_id(),
                                   "output_index": output_index, "content_index": 0,
                                   "delta": t}));
                events
            }
            ReplyPart::Content(t) => {
                let mut events = match self.open {
                    Some(Open::Message { .. }) => Vec::new(),
                    _ => self.enter(
                        Open::Message {
                            text: String::new(),
                        },
                        None,
                    ),
                };
                let output_index = self.index();
                if let Some(Open::Message { text }) = &mut self.open {
                    text.push_str(t);
                }
                events.push(json!({"type": "response.output_text.delta",
                                   "item_id": self.head.message_id(),
                                   "output_index": output_index, "content_index": 0,
                                   "delta": t, "logprobs": []}));
                events
            }
            ReplyPart::ToolCall(d) => {
                let mut events = match &d.start {
                    Some(start) => self.enter(
                        Open::Call {
                            index: d.index,
                            name: start.name.clone(),
                            arguments: String::new(),
                        },
                        None,
                    ),
                    None => Vec::new(),
                };
                let output_index = self.index();
                if let Some(Open::Call { arguments, .. }) = &mut self.open
                    && !d.arguments.is_empty()
                {
                    arguments.push_str(&d.arguments);
                    events.push(json!({"type": "response.function_call_arguments.delta",
                                       "item_id": self.head.call_ids(d.index).0,
                                       "output_index": output_index, "delta": d.arguments}));
                }
                events
            }
            ReplyPart::Finished(finish) => {
                let mut events = self.close(Some(finish));
                // A reply with nothing to say still answers with an (empty) message, as the
                // whole response does.
                if self.done.iter().all(|i| i["type"] == "reasoning")
                    && finish.tool_calls.is_empty()
                {
                    events.extend(self.enter(
                        Open::Message {
                            text: String::new(),
                        },
                        None,
                    ));
                    events.extend(self.close(Some(finish)));
                }
                let status = status(finish);
                let kind = if status == "completed" {
                    "response.completed"
                } else {
                    "response.incomplete"
                };
                let response = self.head.response(status, self.done.clone(), Some(finish));
                events.push(json!({"type": kind, "response": response}));
                events
            }
        }
    }
}

impl Wire for ResponseEvents {
    fn opening(&mut self) -> Vec<Event> {
        let response = self.head.response("in_progress", Vec::new(), None);
        vec![
            self.named(json!({"type": "response.created", "response": response})),
            self.named(json!({"type": "response.in_progress", "response": response})),
        ]
    }

    fn piece(&mut self, piece: &ReplyPart) -> Vec<Event> {
        let events = self.piece_events(piece);
        events.into_iter().map(|v| self.named(v)).collect()
    }

    /// A failure after the stream began ends it with `response.failed` (what Codex reads).
    fn error(&self, e: &ApiError) -> Event {
        let mut response = self.head.response("failed", self.done.clone(), None);
        let body = e.json();
        response["error"] = json!({"code": body["error"]["code"].as_str().unwrap_or("server_error"),
                                   "message": body["error"]["message"]});
        self.named(json!({"type": "response.failed", "response": response}))
    }

    /// The API's own lifecycle event: nothing changes for the client.
    fn idle(&self) -> Event {
        let response = self.head.response("in_progress", Vec::new(), None);
        self.named(json!({"type": "response.in_progress", "response": response}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::body::Fields;
    use crate::http::responses::input::responses;

    /// A response repeats the request's settings as the client gave them. A Responses body has no seed
    /// or stop strings: given, they are ignored.
    #[test]
    fn a_response_repeats_the_settings_it_was_asked_with() {
        let body = br#"{"model": "k3", "input": "hi", "max_output_tokens": 7, "temperature": 0.5,
            "top_p": 0.25, "reasoning": {"effort": "xhigh"}, "store": false,
            "metadata": {"a": "b"}, "tool_choice": "none", "seed": 3, "stop": ["x"]}"#;
        let parsed = responses(&Fields::parse(body, 1000).expect("fields")).expect("read");
        let request = &parsed.submission.request;
        assert_eq!((request.max_tokens, request.sampling.seed), (Some(7), 0));
        assert!(request.stop_strings.is_empty());
        let head = ResponseHead {
            request: 9,
            created_at: 1,
            shape: parsed.submission.shape,
            echoed: parsed.echoed,
        };
        let r = head.response("completed", Vec::new(), None);
        assert_eq!(r["id"], "resp_9");
        assert_eq!(r["model"], "k3");
        assert_eq!(r["max_output_tokens"], 7);
        assert_eq!(r["temperature"], 0.5);
        assert_eq!(r["top_p"], 0.25);
        assert_eq!(r["reasoning"]["effort"], "xhigh");
        assert_eq!(r["store"], false);
        assert_eq!(r["metadata"], serde_json::json!({"a": "b"}));
        assert_eq!(r["tool_choice"], "none");
        assert_eq!(r["text"]["format"]["type"], "text");
    }
}
