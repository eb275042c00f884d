//! The serve core's event stream read as OpenAI pieces: reasoning and content text, tool-call
//! deltas, then how the reply finished. Streamed and whole responses are both built from this
//! one reader, so they cannot disagree.
//!
//! Stop strings: the core stops after the token that completes one and emits that token;
//! OpenAI leaves the stop sequence out of the output. Only `Done` says that a token completed
//! one, so the latest token's text is held back, with up to the longest stop string's length
//! less one byte before it (where a match it completes may begin), and the reply is cut where
//! the matched string begins.

use super::error::ApiError;
use k3_engine::serve::{Channel, Done, Event, Events, FinishReason, JobHandle};
use k3_engine::serve::{Malformed, ToolCallDelta};

pub enum ReplyPart {
    Reasoning(String),
    Content(String),
    /// A tool call's start (id, name) or a fragment of its arguments' JSON text.
    ToolCall(ToolCallDelta),
    Finished(Finish),
}

pub struct Finish {
    /// `stop`, `length` or `tool_calls` (OpenAI's `finish_reason`); `error` for a malformed
    /// chat reply (reported, never repaired).
    pub reason: &'static str,
    pub usage: OpenAiUsage,
    /// The reply's tool calls, whole: `(id, name, arguments)`.
    pub tool_calls: Vec<k3_engine::tokenizer::chat::ToolCall>,
    /// What was malformed, with the raw output (`k3_malformed` in the response).
    pub malformed: Option<Malformed>,
    /// The stop string that ended the reply (Anthropic's `stop_sequence`).
    pub stop_string: Option<String>,
}

#[derive(Clone, Copy, Default, serde::Serialize)]
pub struct OpenAiUsage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptDetails>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<Details>,
}

/// OpenAI's `cached_tokens`: prompt tokens a kept state already held (not prefilled).
#[derive(Clone, Copy, Default, serde::Serialize)]
pub struct PromptDetails {
    pub cached_tokens: usize,
}

#[derive(Clone, Copy, Default, serde::Serialize)]
pub struct Details {
    pub reasoning_tokens: usize,
}

pub struct Reader {
    events: Events,
    /// Whether reasoning tokens are counted in `usage` (chat only).
    chat: bool,
    reasoning_tokens: usize,
    /// Content not yet released: it may be the beginning of a stop string.
    held: String,
    longest_stop: usize,
    /// The core's job id (for the response id and logs).
    pub request_id: u64,
    /// Prompt tokens after rendering (known before the first token).
    pub prompt_tokens: usize,
    /// The finish, once the last content before it has been returned.
    pending: Option<Finish>,
    finished: bool,
}

impl Reader {
    /// Reads job `job`'s events (dropping the reader abandons the job: the core cancels it at
    /// its next layer boundary).
    pub fn new(job: JobHandle, chat: bool, stop_strings: &[String]) -> Reader {
        Reader {
            request_id: job.id,
            prompt_tokens: job.prompt_tokens,
            events: job.events,
            chat,
            reasoning_tokens: 0,
            held: String::new(),
            longest_stop: stop_strings.iter().map(String::len).max().unwrap_or(0),
            pending: None,
            finished: false,
        }
    }

    /// The next piece, `None` after `Finished`; an error ends the reply.
    pub async fn next(&mut self) -> Option<Result<ReplyPart, ApiError>> {
        if let Some(finish) = self.pending.take() {
            return Some(Ok(ReplyPart::Finished(finish)));
        }
        if self.finished {
            return None;
        }
        loop {
            let event = std::future::poll_fn(|cx| self.events.poll_recv(cx)).await;
            let Some(event) = event else {
                self.finished = true;
                return Some(Err(ApiError::internal("the reply ended without finishing")));
            };
            match event {
                Event::Token { piece, .. } => {
                    if let Some(delta) = piece.tool_call {
                        return Some(Ok(ReplyPart::ToolCall(delta)));
                    }
                    match piece.channel {
                        Channel::Reasoning => {
                            self.reasoning_tokens += 1;
                            if !piece.text.is_empty() {
                                return Some(Ok(ReplyPart::Reasoning(piece.text)));
                            }
                        }
                        Channel::Response | Channel::Text => {
                            if let Some(text) = self.release(&piece.text) {
                                return Some(Ok(ReplyPart::Content(text)));
                            }
                        }
                        Channel::ToolCall | Channel::Control => {}
                    }
                }
                Event::Done(done) => {
                    self.finished = true;
                    let finish = self.finish(done);
                    let held = std::mem::take(&mut self.held);
                    if held.is_empty() {
                        return Some(Ok(ReplyPart::Finished(finish)));
                    }
                    self.pending = Some(finish);
                    return Some(Ok(ReplyPart::Content(held)));
                }
                Event::Failed(e) => {
                    self.finished = true;
                    return Some(Err(ApiError::from_serve(&e, None)));
                }
                Event::Queued { .. } | Event::Loading { .. } | Event::Prefill { .. } => {}
            }
        }
    }

    /// Adds a token's text; returns the content that can no longer be part of a stop string.
    fn release(&mut self, latest: &str) -> Option<String> {
        let keep = self.longest_stop.saturating_sub(1);
        let mut cut = self.held.len().saturating_sub(keep);
        self.held.push_str(latest);
        if self.longest_stop == 0 {
            // No stop strings: nothing is ever cut, so nothing waits.
            cut = self.held.len();
        }
        while !self.held.is_char_boundary(cut) {
            cut -= 1;
        }
        (cut > 0).then(|| {
            let rest = self.held.split_off(cut);
            std::mem::replace(&mut self.held, rest)
        })
    }

    /// How the reply finished; the held-back content is cut at a matched stop string.
    fn finish(&mut self, done: Done) -> Finish {
        let core_usage = done.usage();
        // An incomplete UTF-8 sequence at the end, shown lossily (as gRPC's Done carries it).
        self.held.push_str(&done.trailing_text);
        let reason = match (&done.finish, &done.malformed) {
            (_, Some(_)) => "error",
            (FinishReason::Length, None) => "length",
            (_, None) if !done.tool_calls.is_empty() => "tool_calls",
            (_, None) => "stop",
        };
        let stop_string = match done.finish {
            FinishReason::StopString(s) => {
                if let Some(at) = self.held.find(s.as_str()) {
                    self.held.truncate(at);
                }
                Some(s)
            }
            _ => None,
        };
        let usage = OpenAiUsage {
            prompt_tokens: core_usage.prompt_tokens,
            completion_tokens: core_usage.completion_tokens,
            total_tokens: core_usage.prompt_tokens + core_usage.completion_tokens,
            // Always told, 0 included, as OpenAI does: a client reads the reuse of each reply.
            prompt_tokens_details: Some(PromptDetails {
                cached_tokens: core_usage.reused_prompt_tokens,
            }),
            completion_tokens_details: self.chat.then_some(Details {
                reasoning_tokens: self.reasoning_tokens,
            }),
        };
        Finish {
            reason,
            usage,
            tool_calls: done.tool_calls,
            malformed: done.malformed,
            stop_string,
        }
    }
}
