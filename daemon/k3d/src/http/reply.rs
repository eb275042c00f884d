//! The serve core's event stream read as OpenAI pieces: reasoning and content text, then how
//! the reply finished. Streamed and whole responses are both built from this one reader, so
//! they cannot disagree.
//!
//! Stop strings: the core stops after the token that completes one and emits that token
//! (proto `GenerationOptions.stop_strings`); OpenAI leaves the stop sequence out of the
//! output. Only `Done` says that a token completed one, so the latest token's text is held
//! back, with up to the longest stop string's length less one byte before it (where a match
//! it completes may begin), and the reply is cut where the matched string begins.

use super::error::ApiError;
use crate::server::EventStream;
use k3proto::v1 as pb;
use tokio_stream::StreamExt;

pub enum Piece {
    Reasoning(String),
    Content(String),
    Finished(Finish),
}

pub struct Finish {
    /// `stop` or `length` (OpenAI's `finish_reason`).
    pub reason: &'static str,
    pub usage: Usage,
}

#[derive(Clone, Copy, Default, serde::Serialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<Details>,
}

#[derive(Clone, Copy, Default, serde::Serialize)]
pub struct Details {
    pub reasoning_tokens: u32,
}

pub struct Reader {
    events: EventStream,
    /// Whether reasoning tokens are counted in `usage` (chat only).
    chat: bool,
    reasoning_tokens: u32,
    /// Content not yet released: it may be the beginning of a stop string.
    held: String,
    longest_stop: usize,
    /// The core's request id (for logs and cancel).
    pub request_id: u64,
    /// The finish, once the last content before it has been returned.
    pending: Option<Finish>,
    finished: bool,
}

impl Reader {
    /// Waits for the core's `Accepted`, so admission errors arrive before any response starts.
    pub async fn start(
        mut events: EventStream,
        chat: bool,
        stop_strings: &[String],
    ) -> Result<Reader, ApiError> {
        loop {
            match events.next().await {
                Some(Ok(pb::Event {
                    event: Some(pb::event::Event::Accepted(a)),
                })) => {
                    return Ok(Reader {
                        events,
                        chat,
                        reasoning_tokens: 0,
                        held: String::new(),
                        longest_stop: stop_strings.iter().map(String::len).max().unwrap_or(0),
                        request_id: a.request_id,
                        pending: None,
                        finished: false,
                    });
                }
                Some(Ok(_)) => {}
                Some(Err(status)) => return Err(ApiError::from_status(&status, None)),
                None => {
                    return Err(ApiError::internal(
                        "the serve core ended the request before accepting it",
                    ));
                }
            }
        }
    }

    /// The next piece, `None` after `Finished`; an error ends the reply.
    pub async fn next(&mut self) -> Option<Result<Piece, ApiError>> {
        if let Some(finish) = self.pending.take() {
            return Some(Ok(Piece::Finished(finish)));
        }
        if self.finished {
            return None;
        }
        loop {
            let event = match self.events.next().await {
                Some(Ok(pb::Event { event: Some(e) })) => e,
                Some(Ok(pb::Event { event: None })) => continue,
                Some(Err(status)) => {
                    self.finished = true;
                    return Some(Err(ApiError::from_status(&status, None)));
                }
                None => {
                    self.finished = true;
                    return Some(Err(ApiError::internal("the reply ended without finishing")));
                }
            };
            match event {
                pb::event::Event::Token(t) => match pb::Channel::try_from(t.channel) {
                    Ok(pb::Channel::Reasoning) => {
                        self.reasoning_tokens += 1;
                        if !t.text.is_empty() {
                            return Some(Ok(Piece::Reasoning(t.text)));
                        }
                    }
                    Ok(pb::Channel::Response | pb::Channel::Text) => {
                        if let Some(text) = self.release(&t.text) {
                            return Some(Ok(Piece::Content(text)));
                        }
                    }
                    Ok(pb::Channel::Control) | Err(_) => {}
                },
                pb::event::Event::Done(done) => {
                    self.finished = true;
                    let finish = self.finish(done);
                    let held = std::mem::take(&mut self.held);
                    if held.is_empty() {
                        return Some(Ok(Piece::Finished(finish)));
                    }
                    self.pending = Some(finish);
                    return Some(Ok(Piece::Content(held)));
                }
                pb::event::Event::Accepted(_)
                | pb::event::Event::Queued(_)
                | pb::event::Event::Progress(_) => {}
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
    fn finish(&mut self, done: pb::Done) -> Finish {
        self.held.push_str(&done.trailing_text);
        let reason = match pb::StopReason::try_from(done.stop_reason) {
            Ok(pb::StopReason::MaxTokens) => "length",
            _ => "stop",
        };
        if !done.stop_string.is_empty()
            && let Some(at) = self.held.find(&done.stop_string)
        {
            self.held.truncate(at);
        }
        let usage = Usage {
            prompt_tokens: done.prompt_tokens,
            completion_tokens: done.generated_tokens,
            total_tokens: done.prompt_tokens.saturating_add(done.generated_tokens),
            completion_tokens_details: self.chat.then_some(Details {
                reasoning_tokens: self.reasoning_tokens,
            }),
        };
        Finish { reason, usage }
    }
}
