//! The serve core's event stream read as OpenAI pieces: reasoning and content text, tool-call
//! deltas, then how the reply finished. Streamed and whole responses are both built from this
//! one reader, so they cannot disagree.
//!
//! Stop strings: the core stops after the token that completes one and emits that token;
//! OpenAI leaves the stop sequence out of the output — of the reasoning as of the content.
//! Only `Done` says that a token completed one, so the latest token's text is held back, with
//! up to the longest stop string's length less one byte before it (where a match it completes
//! may begin), and the reply is cut where the matched string begins.

use super::error::ApiError;
use k3_engine::serve::{Channel, Done, Event, Events, FinishReason, JobHandle};
use k3_engine::serve::{Malformed, ToolCallDelta};
use std::collections::VecDeque;

pub enum ReplyPart {
    Reasoning(String),
    Content(String),
    /// A tool call's start (id, name) or a fragment of its arguments' JSON text.
    ToolCall(ToolCallDelta),
    Finished(Finish),
}

pub struct Finish {
    /// `stop`, `length` or `tool_calls` (OpenAI's `finish_reason`), also for a malformed chat
    /// reply (whose break is reported beside it, never repaired).
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

/// Where a request came from, for its log line: the route and the tools it declared.
pub struct Origin {
    /// `POST /v1/messages`.
    pub endpoint: &'static str,
    pub tools: usize,
}

pub struct Reader {
    events: Events,
    origin: Origin,
    /// Whether reasoning tokens are counted in `usage` (chat only).
    chat: bool,
    reasoning_tokens: usize,
    /// The end of the reply so far, held back from a stop string.
    held: Held,
    /// The core's job id (for the response id and logs).
    pub request_id: u64,
    /// Prompt tokens after rendering (known before the first token).
    pub prompt_tokens: usize,
    /// Pieces ready to be returned, in order (released text, then what came after it).
    ready: VecDeque<ReplyPart>,
    finished: bool,
}

/// Text not yet released, of one channel (reasoning or content): the end of the reply so far,
/// which a stop string the next token completes may still cut.
#[derive(Default)]
struct Held {
    reasoning: bool,
    text: String,
    /// The longest stop string's length in bytes (0: none, nothing is held).
    longest_stop: usize,
}

impl Held {
    fn new(stop_strings: &[String]) -> Held {
        Held {
            longest_stop: stop_strings.iter().map(String::len).max().unwrap_or(0),
            ..Held::default()
        }
    }

    fn piece(reasoning: bool, text: String) -> ReplyPart {
        if reasoning {
            ReplyPart::Reasoning(text)
        } else {
            ReplyPart::Content(text)
        }
    }

    /// Everything held, as a piece (`None` when nothing is held).
    fn take(&mut self) -> Option<ReplyPart> {
        let text = std::mem::take(&mut self.text);
        (!text.is_empty()).then(|| Held::piece(self.reasoning, text))
    }

    /// Adds a token's text of one channel; queues in `out` the text that can no longer be part
    /// of a stop string (up to the longest one's length less a byte stays, where a match the
    /// next token completes may begin). Text of the other channel held so far goes out first:
    /// a stop string ends the reply, so the one cut is always in the latest text.
    fn push(&mut self, reasoning: bool, latest: &str, out: &mut VecDeque<ReplyPart>) {
        if latest.is_empty() {
            return;
        }
        if self.reasoning != reasoning {
            out.extend(self.take());
            self.reasoning = reasoning;
        }
        let keep = self.longest_stop.saturating_sub(1);
        let mut cut = self.text.len().saturating_sub(keep);
        self.text.push_str(latest);
        if self.longest_stop == 0 {
            cut = self.text.len();
        }
        while !self.text.is_char_boundary(cut) {
            cut -= 1;
        }
        if cut > 0 {
            let rest = self.text.split_off(cut);
            out.push_back(Held::piece(
                reasoning,
                std::mem::replace(&mut self.text, rest),
            ));
        }
    }

    /// Cuts the held text where the stop string that ended the reply begins.
    fn cut(&mut self, stop: &str) {
        if let Some(at) = self.text.find(stop) {
            self.text.truncate(at);
        }
    }
}

impl Reader {
    /// Reads job `job`'s events (dropping the reader abandons the job: the core cancels it at
    /// its next layer boundary).
    pub fn new(job: JobHandle, chat: bool, stop_strings: &[String], origin: Origin) -> Reader {
        Reader {
            origin,
            request_id: job.id,
            prompt_tokens: job.prompt_tokens,
            events: job.events,
            chat,
            reasoning_tokens: 0,
            held: Held::new(stop_strings),
            ready: VecDeque::new(),
            finished: false,
        }
    }

    /// The next piece, `None` after `Finished`; an error ends the reply.
    pub async fn next(&mut self) -> Option<Result<ReplyPart, ApiError>> {
        loop {
            if let Some(piece) = self.ready.pop_front() {
                return Some(Ok(piece));
            }
            if self.finished {
                return None;
            }
            let event = std::future::poll_fn(|cx| self.events.poll_recv(cx)).await;
            let Some(event) = event else {
                self.finished = true;
                return Some(Err(ApiError::internal("the reply ended without finishing")));
            };
            match event {
                Event::Token { piece, .. } => {
                    if let Some(delta) = piece.tool_call {
                        self.ready.extend(self.held.take());
                        self.ready.push_back(ReplyPart::ToolCall(delta));
                        continue;
                    }
                    match piece.channel {
                        Channel::Reasoning => {
                            self.reasoning_tokens += 1;
                            self.held.push(true, &piece.text, &mut self.ready);
                        }
                        Channel::Response | Channel::Text => {
                            self.held.push(false, &piece.text, &mut self.ready)
                        }
                        Channel::ToolCall | Channel::Control => {}
                    }
                }
                Event::Done(done) => {
                    self.finished = true;
                    let finish = self.finish(done);
                    self.ready.extend(self.held.take());
                    self.ready.push_back(ReplyPart::Finished(finish));
                }
                Event::Failed(e) => {
                    self.finished = true;
                    return Some(Err(ApiError::from_serve(&e, None)));
                }
                Event::Queued { .. } | Event::Loading { .. } | Event::Prefill { .. } => {}
            }
        }
    }

    /// How the reply finished; the held-back content is cut at a matched stop string.
    fn finish(&mut self, done: Done) -> Finish {
        let core_usage = done.usage();
        // An incomplete UTF-8 sequence at the end, shown lossily (as gRPC's Done carries it).
        self.held.text.push_str(&done.trailing_text);
        // A malformed reply still ends with one of the standard reasons: what was read before
        // the break is the reply (clients treat any other reason as a failed request).
        let reason = match &done.finish {
            FinishReason::Length => "length",
            _ if !done.tool_calls.is_empty() => "tool_calls",
            _ => "stop",
        };
        let stop_string = match done.finish {
            FinishReason::StopString(s) => {
                self.held.cut(&s);
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
        // One line per answered request (issue 34 point 9): which API, how many tools, how much
        // of the prompt a kept state held — what an operator reads to see an agent's turns.
        log!(
            "request {} answered on {}: {} tools, {} prompt tokens ({} reused), {} new, {reason}{}",
            self.request_id,
            self.origin.endpoint,
            self.origin.tools,
            usage.prompt_tokens,
            core_usage.reused_prompt_tokens,
            usage.completion_tokens,
            if done.malformed.is_some() {
                " (malformed)"
            } else {
                ""
            }
        );
        Finish {
            reason,
            usage,
            tool_calls: done.tool_calls,
            malformed: done.malformed,
            stop_string,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(out: &VecDeque<ReplyPart>) -> Vec<(bool, String)> {
        out.iter()
            .map(|p| match p {
                ReplyPart::Reasoning(t) => (true, t.clone()),
                ReplyPart::Content(t) => (false, t.clone()),
                _ => panic!("not text"),
            })
            .collect()
    }

    /// Issue 34.3: a stop string is cut out of the reasoning as out of the content (the core
    /// stops after the token completing it, `stop: ["he"]` once left `"The"` in the reasoning).
    #[test]
    fn a_stop_string_is_cut_out_of_the_reasoning_too() {
        let mut held = Held::new(&["he".into()]);
        let mut out = VecDeque::new();
        for t in ["Well, ", "T", "he"] {
            held.push(true, t, &mut out);
        }
        held.cut("he");
        out.extend(held.take());
        let reasoning: String = texts(&out).into_iter().map(|(_, t)| t).collect();
        assert_eq!(reasoning, "Well, T");
        assert!(texts(&out).iter().all(|(r, _)| *r));
    }

    /// Text of one channel is released before the other channel's begins, in order, and a
    /// multi-byte character is never split.
    #[test]
    fn channels_release_in_order_and_characters_stay_whole() {
        let mut held = Held::new(&["abc".into()]);
        let mut out = VecDeque::new();
        held.push(true, "thinké", &mut out);
        held.push(false, "answer", &mut out);
        held.push(false, "s", &mut out);
        out.extend(held.take());
        let got = texts(&out);
        let reasoning: String = got
            .iter()
            .filter(|(r, _)| *r)
            .map(|(_, t)| t.as_str())
            .collect();
        let content: String = got
            .iter()
            .filter(|(r, _)| !*r)
            .map(|(_, t)| t.as_str())
            .collect();
        assert_eq!(
            (reasoning.as_str(), content.as_str()),
            ("thinké", "answers")
        );
        let first_content = got.iter().position(|(r, _)| !*r).unwrap();
        assert!(got[first_content..].iter().all(|(r, _)| !*r));
        // Without stop strings nothing waits.
        let mut free = Held::new(&[]);
        let mut out = VecDeque::new();
        free.push(false, "x", &mut out);
        assert_eq!(texts(&out), vec![(false, "x".to_string())]);
    }
}
