//! What every generating route shares, whatever API it speaks: the body read and the request
//! queued on the serve core ([`submit`]), the reply's timing for the metrics ([`Timer`]), a whole reply gathered
//! ([`collect`]) and a streamed one written as Server-Sent Events ([`sse`]). An API says only
//! how its reply looks on the wire: a [`Wire`] turns each piece of the one [`Reader`] into
//! events, so a streamed reply concatenates to exactly the whole one on every API.
//!
//! Keep-alive: a long prompt's prefill can take minutes before the first token on a small
//! machine, and agents abort a stream that stays silent that long (Claude Code and Codex after
//! 300 s, which only a real event resets). After [`KEEP_ALIVE`] without an event the writer
//! sends the API's idle event ([`Wire::idle`]).

use super::App;
use super::body::{Fields, Shape, Submission};
use super::error::ApiError;
use super::reader::{Finish, OpenAiUsage, Origin, Reader, ReplyPart};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use k3_engine::serve::{Caller, Field, Prompt, ServeError, Turn};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// SSE events buffered per response: small, so a client that stops reading is noticed soon.
const SSE_BUFFER: usize = 8;
/// How long a stream may go without an event before the API's idle event is sent: well under
/// the agents' 300 s idle limits, and rare enough to cost nothing.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// A route that generates, as the serve core's refusals and the log name it.
pub struct Route {
    /// `POST /v1/messages`: names the route in the request's log line.
    pub endpoint: &'static str,
    /// The field that holds the prompt (`messages`, `prompt`, `input`).
    pub prompt_field: &'static str,
    /// The field that holds the stop strings (`stop`, `stop_sequences`).
    pub stop_field: &'static str,
    /// Whether the reply's reasoning is counted (a chat; a text completion has none).
    pub chat: bool,
}

impl Route {
    /// The parameter a refusal of the core names, as this route's API spells it (`None`: the
    /// refusal is not about the request).
    pub fn param(&self, e: &ServeError, max_tokens_param: &'static str) -> Option<&'static str> {
        let ServeError::Invalid(invalid) = e else {
            return None;
        };
        Some(match invalid.field() {
            Field::Prompt => self.prompt_field,
            Field::MaxTokens => max_tokens_param,
            Field::Stop => self.stop_field,
            Field::Temperature => "temperature",
            Field::TopP => "top_p",
            Field::LogitBias => "logit_bias",
            Field::FrequencyPenalty => "frequency_penalty",
            Field::PresencePenalty => "presence_penalty",
            Field::Speculate => "speculate",
            Field::Tools => "tools",
            Field::ToolChoice => "tool_choice",
            Field::ResponseFormat => "response_format",
        })
    }
}

/// Reads `body` as `route`'s request (`read` turns its fields into a [`Submission`] and
/// whatever else the route's reply needs, `X`) and queues it on the serve core in its reserved
/// place, rendering and tokenising it under `turn` (called in [`super::prepare`]'s closure,
/// off the async workers). The body and its fields are let go before the prompt is rendered:
/// what is kept of a request is what was read from it. The core decides the rest (defaults,
/// limits, prefix reuse and its scope). Returns the reply's [`Shape`], `X` and the reply's
/// reader.
pub fn submit<X>(
    app: &App,
    turn: Turn,
    caller: Option<Caller>,
    route: &Route,
    body: axum::body::Bytes,
    read: impl FnOnce(&Fields) -> Result<(Submission, X), ApiError>,
) -> Result<(Shape, X, Reader), ApiError> {
    let fields = Fields::parse(&body, app.core.limits().max_prompt_tokens)?;
    let (Submission { shape, request }, extra) = read(&fields)?;
    drop(fields);
    drop(body);
    app.check_model(&shape.model)?;
    app.check_ready()?;
    let origin = Origin {
        endpoint: route.endpoint,
        tools: match &request.prompt {
            Prompt::Chat(conversation) => conversation.tools.len(),
            Prompt::Text(_) | Prompt::Ids(_) => 0,
        },
    };
    let stop_strings = request.stop_strings.clone();
    let job = app
        .core
        .submit_turn(turn, caller.unwrap_or(Caller::Unknown), request)
        .map_err(|e| ApiError::from_serve(&e, route.param(&e, shape.max_tokens_param)))?;
    let reader = Reader::new(job, route.chat, &stop_strings, origin);
    Ok((shape, extra, reader))
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

    /// A piece of the reply went out (the first one is the time to first token).
    fn piece(&mut self) {
        self.first.get_or_insert_with(Instant::now);
    }

    /// The reply finished with `usage`: its figures go to the metrics.
    fn record(&self, app: &App, usage: &OpenAiUsage) {
        let ttft = self.first.map(|f| (f - self.arrived).as_secs_f64());
        let decode = self
            .first
            .filter(|_| usage.completion_tokens > 1)
            .map(|f| f.elapsed().as_secs_f64() / (usage.completion_tokens - 1) as f64);
        app.metrics
            .generation(usage.prompt_tokens, usage.completion_tokens, ttft, decode);
    }

    /// Times `piece` (the finish records the reply).
    fn observe(&mut self, app: &App, piece: &ReplyPart) {
        match piece {
            ReplyPart::Finished(finish) => self.record(app, &finish.usage),
            _ => self.piece(),
        }
    }
}

/// A whole (not streamed) reply.
pub struct Whole {
    pub reasoning: String,
    pub content: String,
    /// How it finished, with its tool calls whole.
    pub finish: Finish,
}

/// Reads the whole reply, timed for the metrics.
pub async fn collect(app: &App, mut reader: Reader, mut timer: Timer) -> Result<Whole, ApiError> {
    let (mut reasoning, mut content) = (String::new(), String::new());
    while let Some(piece) = reader.next().await {
        let piece = piece?;
        timer.observe(app, &piece);
        match piece {
            // The whole calls come with the finish.
            ReplyPart::ToolCall(_) => {}
            ReplyPart::Reasoning(t) => reasoning.push_str(&t),
            ReplyPart::Content(t) => content.push_str(&t),
            ReplyPart::Finished(finish) => {
                return Ok(Whole {
                    reasoning,
                    content,
                    finish,
                });
            }
        }
    }
    Err(ApiError::internal("the reply ended without finishing"))
}

/// How one API writes a streamed reply.
pub trait Wire: Send + 'static {
    /// The events before the reply's first piece.
    fn opening(&mut self) -> Vec<Event>;
    /// The events one piece adds; for [`ReplyPart::Finished`], the stream's last ones.
    fn piece(&mut self, piece: &ReplyPart) -> Vec<Event>;
    /// The event that reports an error once the stream has begun (its status is sent).
    fn error(&self, e: &ApiError) -> Event;
    /// The event sent after [`KEEP_ALIVE`] without one, which changes nothing for the client.
    fn idle(&self) -> Event;
}

/// Where a streamed reply's pieces come from: the core's reply ([`Reader`]), or a script in
/// tests.
trait Pieces: Send + 'static {
    /// The next piece, `None` after `Finished`; an error ends the reply. Cancel-safe: dropped
    /// while it waits (the keep-alive's turn), it loses nothing ([`Reader::next`] waits only
    /// on the core's channel).
    fn next(&mut self) -> impl Future<Output = Option<Result<ReplyPart, ApiError>>> + Send;
}

impl Pieces for Reader {
    fn next(&mut self) -> impl Future<Output = Option<Result<ReplyPart, ApiError>>> + Send {
        Reader::next(self)
    }
}

/// The reply streamed as SSE, written by `wire` on a task of its own.
pub fn sse(app: Arc<App>, reader: Reader, mut timer: Timer, wire: impl Wire) -> Response {
    let (tx, rx) = mpsc::channel(SSE_BUFFER);
    let observe = move |piece: &ReplyPart| timer.observe(&app, piece);
    tokio::spawn(write(reader, wire, observe, KEEP_ALIVE, tx));
    Sse::new(ReceiverStream::new(rx)).into_response()
}

/// Writes the reply into `tx`, each piece `observe`d (timed) before it goes out, the idle
/// event after `keep_alive` without one. Ends as soon as the client is gone (the response body,
/// and with it `tx`'s receiver, is dropped): dropping `pieces` closes the core's stream, which
/// cancels the generation at its next layer boundary (as a gRPC client that goes away does).
async fn write(
    mut pieces: impl Pieces,
    mut wire: impl Wire,
    mut observe: impl FnMut(&ReplyPart) + Send + 'static,
    keep_alive: Duration,
    tx: mpsc::Sender<Result<Event, Infallible>>,
) {
    let send = |events: Vec<Event>| {
        let tx = tx.clone();
        async move {
            for event in events {
                if tx.send(Ok(event)).await.is_err() {
                    return false;
                }
            }
            true
        }
    };
    if !send(wire.opening()).await {
        return;
    }
    loop {
        let piece = tokio::select! {
            piece = pieces.next() => piece,
            () = tx.closed() => return,
            () = tokio::time::sleep(keep_alive) => {
                if !send(vec![wire.idle()]).await {
                    return;
                }
                continue;
            }
        };
        let piece = match piece {
            None => return,
            Some(Err(e)) => {
                let _ = send(vec![wire.error(&e)]).await;
                return;
            }
            Some(Ok(piece)) => piece,
        };
        observe(&piece);
        if !send(wire.piece(&piece)).await || matches!(piece, ReplyPart::Finished(_)) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::reader::Finish;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Pieces after a silence, as a long prefill gives them (cancel-safe, as the writer
    /// needs: the silence ends at a fixed time however often a wait is dropped).
    struct Script {
        until: tokio::time::Instant,
        pieces: Vec<ReplyPart>,
    }

    impl Script {
        fn after(silence: Duration, pieces: Vec<ReplyPart>) -> Script {
            Script {
                until: tokio::time::Instant::now() + silence,
                pieces,
            }
        }
    }

    impl Pieces for Script {
        async fn next(&mut self) -> Option<Result<ReplyPart, ApiError>> {
            tokio::time::sleep_until(self.until).await;
            (!self.pieces.is_empty()).then(|| Ok(self.pieces.remove(0)))
        }
    }

    /// Counts the idle events it is asked for.
    struct Counting(Arc<AtomicUsize>);

    impl Wire for Counting {
        fn opening(&mut self) -> Vec<Event> {
            vec![Event::default().data("opening")]
        }
        fn piece(&mut self, _: &ReplyPart) -> Vec<Event> {
            vec![Event::default().data("piece")]
        }
        fn error(&self, _: &ApiError) -> Event {
            Event::default().data("error")
        }
        fn idle(&self) -> Event {
            self.0.fetch_add(1, Ordering::SeqCst);
            Event::default().comment("idle")
        }
    }

    fn finished() -> ReplyPart {
        ReplyPart::Finished(Finish {
            reason: "stop",
            usage: OpenAiUsage::default(),
            tool_calls: Vec::new(),
            malformed: None,
            stop_string: None,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_stream_gets_an_idle_event_every_keep_alive_and_then_its_pieces() {
        let idle = Arc::new(AtomicUsize::new(0));
        let script = Script::after(
            KEEP_ALIVE * 2 + KEEP_ALIVE / 2,
            vec![ReplyPart::Content("hi".into()), finished()],
        );
        let observed = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&observed);
        let observe = move |_: &ReplyPart| {
            seen.fetch_add(1, Ordering::SeqCst);
        };
        let (tx, mut rx) = mpsc::channel(SSE_BUFFER);
        let writer = tokio::spawn(write(
            script,
            Counting(Arc::clone(&idle)),
            observe,
            KEEP_ALIVE,
            tx,
        ));
        let mut events = 0;
        while rx.recv().await.is_some() {
            events += 1;
        }
        writer.await.expect("the writer ends");
        assert_eq!(
            idle.load(Ordering::SeqCst),
            2,
            "one idle event per silent interval"
        );
        assert_eq!(observed.load(Ordering::SeqCst), 2, "both pieces timed");
        assert_eq!(events, 1 + 2 + 2, "opening, two idle events, two pieces");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_never_falls_silent_gets_no_idle_event() {
        let idle = Arc::new(AtomicUsize::new(0));
        let script = Script::after(KEEP_ALIVE / 2, vec![finished()]);
        let (tx, mut rx) = mpsc::channel(SSE_BUFFER);
        tokio::spawn(write(
            script,
            Counting(Arc::clone(&idle)),
            |_| {},
            KEEP_ALIVE,
            tx,
        ));
        while rx.recv().await.is_some() {}
        assert_eq!(idle.load(Ordering::SeqCst), 0);
    }
}
