//! Showing a Generate/Chat event stream: text (or ids, or JSON lines) on stdout; queue
//! position, progress and the closing rate on stderr — a bar with rate and ETA on a terminal
//! (indicatif), plain lines otherwise. Ctrl-C cancels the request (Cancel, then dropping the
//! stream), not the program. Colour (dimmed reasoning) only on a terminal and without
//! `NO_COLOR` (no-color.org); the reasoning is labelled either way.

use crate::failure::{Code, Failure};
use indicatif::{ProgressBar, ProgressStyle};
use k3proto::v1 as pb;
use k3proto::v1::engine_client::EngineClient;
use pb::event::Event;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Decoded text.
    Text,
    /// Generated ids, space-separated, one line.
    Ids,
    /// One JSON object per event.
    Json,
}

/// How the reasoning channel is shown (Chat only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reasoning {
    /// Labelled, and dimmed where colour is allowed.
    Show,
    Hide,
}

pub struct Show {
    pub format: Format,
    pub reasoning: Reasoning,
    /// Print the closing statistics line on stderr.
    pub stats: bool,
}

/// What a finished (or cancelled) stream produced.
#[derive(Default)]
pub struct Produced {
    pub response: String,
    pub reasoning: String,
    pub ids: Vec<u32>,
    pub cancelled: bool,
}

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";
/// Written where the reasoning starts, and where the answer follows it.
pub const THINKING_LABEL: &str = "[thinking]\n";
pub const ANSWER_LABEL: &str = "\n[answer]\n";

/// Escape sequences are allowed on stdout: a terminal, and no `NO_COLOR` (any value but empty).
fn colour(tty_out: bool) -> bool {
    tty_out && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// How often a load's progress is printed as a plain line (stderr not a terminal): the daemon
/// sends a figure per 64 MiB read, a log wants a line every few seconds.
const LOAD_LINE_EVERY: Duration = Duration::from_secs(5);

/// Plain load lines, one per [`LOAD_LINE_EVERY`] at most, plus the first line of each stage
/// (checking the checkpoint, reading the weights) and the last figure.
#[derive(Default)]
struct LoadLines {
    last: Option<(bool, Instant)>,
}

impl LoadLines {
    fn offer(&mut self, p: &pb::Progress) {
        let reading = p.total > 0;
        let due = self.last.is_none_or(|(was, at)| {
            was != reading || at.elapsed() >= LOAD_LINE_EVERY || (reading && p.done == p.total)
        });
        if due {
            self.last = Some((reading, Instant::now()));
            eprintln!("k3: loading the model: {}", p.text);
        }
    }
}

/// `, layer L of N` while a layer-major pass runs (a long prompt is one pass over every layer,
/// so its progress is by layer), else nothing.
fn pass_text(p: &pb::Progress) -> String {
    if p.layers > 0 {
        format!(", layer {} of {}", p.layers_done, p.layers)
    } else {
        String::new()
    }
}

/// The progress shown on a terminal: a spinner while the model loads, a bar with rate and
/// ETA during prefill. Drawn only when stderr is a terminal.
#[derive(Default)]
struct Bar {
    shown: Option<(i32, ProgressBar)>,
}

impl Bar {
    fn update(&mut self, p: &pb::Progress) {
        if self
            .shown
            .as_ref()
            .is_some_and(|(phase, _)| *phase != p.phase)
        {
            self.clear();
        }
        let (_, bar) = self.shown.get_or_insert_with(|| (p.phase, new_bar(p)));
        if p.phase == pb::Phase::Load as i32 {
            bar.set_message(format!("loading the model: {}", p.text));
        } else {
            bar.set_length(p.total);
            bar.set_position(p.done);
            bar.set_message(pass_text(p));
        }
    }

    fn clear(&mut self) {
        if let Some((_, bar)) = self.shown.take() {
            bar.finish_and_clear();
        }
    }

    fn is_shown(&self) -> bool {
        self.shown.is_some()
    }
}

fn new_bar(p: &pb::Progress) -> ProgressBar {
    if p.phase == pb::Phase::Load as i32 {
        let bar = ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("k3: {spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        bar
    } else {
        ProgressBar::new(p.total).with_style(
            ProgressStyle::with_template(
                "k3: prefill [{bar:30}] {pos}/{len} tokens{msg}, {per_sec}, ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("#>-"),
        )
    }
}

/// The Ctrl-C listener. Made once, before the request is sent, so a Ctrl-C that comes while the
/// request is being set up is not lost (a listener only sees signals after its creation).
pub fn interrupts() -> Result<Signal, Failure> {
    signal(SignalKind::interrupt())
        .map_err(|e| Failure::new(Code::Other, format!("installing the Ctrl-C handler: {e}")))
}

/// The request id of a stream whose `Accepted` event (always its first) was not read yet: a
/// Ctrl-C can come before it. Cancel is sent by id because dropping the stream is not enough
/// here: the reset it causes leaves only when the connection task runs, and the client's
/// current-thread runtime stops running it once the call returns (a REPL then waits at its
/// prompt while k3d generates on). Bounded, so a daemon that stopped answering cannot hold the
/// Ctrl-C up.
async fn accepted_id(stream: &mut tonic::Streaming<pb::Event>) -> Option<u64> {
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next()).await;
    match first {
        Ok(Some(Ok(pb::Event {
            event: Some(Event::Accepted(a)),
        }))) => Some(a.request_id),
        _ => None,
    }
}

pub async fn show(
    client: &mut EngineClient<Channel>,
    stream: tonic::Streaming<pb::Event>,
    how: &Show,
    interrupts: &mut Signal,
) -> Result<Produced, Failure> {
    let mut stream = stream;
    let tty_out = std::io::stdout().is_terminal();
    let tty_err = std::io::stderr().is_terminal();
    let colour = colour(tty_out);
    let mut out = std::io::stdout().lock();
    let mut outcome = Produced::default();
    let mut request_id = None;
    let mut dimmed = false;
    let mut bar = Bar::default();
    let mut load_lines = LoadLines::default();
    // The channel last written (for labels) and whether the text written so far ends a line.
    let mut last_channel = None;
    let mut line_ended = true;
    let started = Instant::now();
    let mut first_token = None;
    loop {
        let next = tokio::select! {
            next = stream.next() => next,
            _ = interrupts.recv() => {
                let id = match request_id {
                    Some(id) => Some(id),
                    None => accepted_id(&mut stream).await,
                };
                if let Some(id) = id {
                    let _ = client.cancel(pb::CancelRequest { request_id: id }).await;
                }
                if dimmed { let _ = write!(out, "{RESET}"); }
                let _ = out.flush();
                outcome.cancelled = true;
                let after_bar = bar.is_shown();
                bar.clear();
                eprintln!("{}[cancelled]", if after_bar || tty_out { "\n" } else { "" });
                return Ok(outcome);
            }
        };
        let event = match next {
            None => break,
            Some(Err(status)) => {
                if dimmed {
                    let _ = write!(out, "{RESET}");
                }
                let _ = out.flush();
                bar.clear();
                return Err(status.into());
            }
            Some(Ok(pb::Event { event: None })) => continue,
            Some(Ok(pb::Event { event: Some(e) })) => e,
        };
        if how.format == Format::Json {
            writeln!(out, "{}", json(&event)).map_err(Failure::output)?;
        }
        match event {
            Event::Accepted(a) => request_id = Some(a.request_id),
            Event::Queued(q) if how.format != Format::Json => {
                eprintln!("k3: waiting for a compute slot (position {})", q.position);
            }
            Event::Progress(p) if how.format != Format::Json => {
                if tty_err {
                    bar.update(&p);
                } else if p.phase == pb::Phase::Load as i32 {
                    load_lines.offer(&p);
                } else {
                    eprintln!("k3: prefill {}/{}{}", p.done, p.total, pass_text(&p));
                }
            }
            Event::Token(t) => {
                bar.clear();
                first_token.get_or_insert_with(Instant::now);
                outcome.ids.push(t.id);
                let channel = pb::Channel::try_from(t.channel).unwrap_or(pb::Channel::Text);
                match channel {
                    pb::Channel::Reasoning => outcome.reasoning.push_str(&t.text),
                    pb::Channel::Response | pb::Channel::Text => outcome.response.push_str(&t.text),
                    // The client declares no tools, so a tool-call block is the model's own
                    // structure here: shown only with --json, like the other structure ids.
                    pb::Channel::Control | pb::Channel::ToolCall => {}
                }
                match how.format {
                    Format::Json => {}
                    Format::Ids => {
                        let sep = if outcome.ids.len() > 1 { " " } else { "" };
                        write!(out, "{sep}{}", t.id).map_err(Failure::output)?;
                    }
                    Format::Text => {
                        let shown = match channel {
                            pb::Channel::Control | pb::Channel::ToolCall => None,
                            pb::Channel::Reasoning if how.reasoning == Reasoning::Hide => None,
                            pb::Channel::Reasoning => Some(true),
                            _ => Some(false),
                        };
                        if let Some(dim) = shown {
                            if colour && dim != dimmed {
                                write!(out, "{}", if dim { DIM } else { RESET })
                                    .map_err(Failure::output)?;
                                dimmed = dim;
                            }
                            let label = match (last_channel, channel) {
                                (Some(pb::Channel::Reasoning), pb::Channel::Reasoning) => "",
                                (_, pb::Channel::Reasoning) => THINKING_LABEL,
                                (Some(pb::Channel::Reasoning), _) => ANSWER_LABEL,
                                _ => "",
                            };
                            last_channel = Some(channel);
                            write!(out, "{label}{}", t.text).map_err(Failure::output)?;
                            if !t.text.is_empty() {
                                line_ended = t.text.ends_with('\n');
                            }
                        }
                    }
                }
                out.flush().map_err(Failure::output)?;
            }
            Event::Done(d) => {
                if dimmed {
                    write!(out, "{RESET}").map_err(Failure::output)?;
                }
                match how.format {
                    Format::Json => {}
                    Format::Ids => writeln!(out).map_err(Failure::output)?,
                    Format::Text => {
                        write!(out, "{}", d.trailing_text).map_err(Failure::output)?;
                        if !d.trailing_text.is_empty() {
                            line_ended = d.trailing_text.ends_with('\n');
                        }
                        // Text ends with a newline, so the next prompt or line starts on its own.
                        if !line_ended {
                            writeln!(out).map_err(Failure::output)?;
                        }
                    }
                }
                out.flush().map_err(Failure::output)?;
                if how.stats && how.format != Format::Json {
                    eprintln!("{}", summary(&d, started, first_token));
                }
            }
            Event::Queued(_) | Event::Progress(_) => {}
        }
    }
    Ok(outcome)
}

fn summary(d: &pb::Done, started: Instant, first_token: Option<Instant>) -> String {
    let t = d.timings.unwrap_or_default();
    let rate = if t.decode_seconds > 0.0 {
        d.generated_tokens as f64 / t.decode_seconds
    } else {
        0.0
    };
    let reason = stop_reason(d.stop_reason);
    let ttft = first_token.map_or(String::new(), |f| {
        format!(
            ", first token after {:.2} s",
            f.duration_since(started).as_secs_f64()
        )
    });
    let reused = if d.reused_prompt_tokens > 0 {
        format!(" ({} from the session)", d.reused_prompt_tokens)
    } else {
        String::new()
    };
    format!(
        "k3: {} tokens at {rate:.2} tokens/s ({reason}); prompt {} tokens{reused}, prefill {:.2} s{ttft}",
        d.generated_tokens, d.prompt_tokens, t.prefill_seconds
    )
}

/// The JSON line for one event: `{"event": NAME, ...fields}`.
pub fn json(event: &Event) -> serde_json::Value {
    use serde_json::json;
    match event {
        Event::Accepted(a) => {
            json!({"event": "accepted", "request_id": a.request_id, "prompt_tokens": a.prompt_tokens})
        }
        Event::Queued(q) => json!({"event": "queued", "position": q.position}),
        Event::Progress(p) => json!({
            "event": "progress",
            "phase": if p.phase == pb::Phase::Load as i32 { "load" } else { "prefill" },
            "done": p.done, "total": p.total,
            "bytes_per_second": p.bytes_per_second, "eta_seconds": p.eta_seconds,
            "layers_done": p.layers_done, "layers": p.layers,
        }),
        Event::Token(t) => json!({
            "event": "token", "id": t.id, "text": t.text,
            "channel": pb::Channel::try_from(t.channel)
                .map(|c| c.as_str_name().trim_start_matches("CHANNEL_").to_lowercase())
                .unwrap_or_else(|_| "unknown".into()),
        }),
        Event::Done(d) => {
            let t = d.timings.unwrap_or_default();
            json!({
                "event": "done",
                "stop_reason": stop_reason(d.stop_reason),
                "stop_id": d.stop_id, "stop_string": d.stop_string,
                "prompt_tokens": d.prompt_tokens, "generated_tokens": d.generated_tokens,
                "reused_prompt_tokens": d.reused_prompt_tokens,
                "queued_seconds": t.queued_seconds, "prefill_seconds": t.prefill_seconds,
                "decode_seconds": t.decode_seconds,
                "bytes_read": d.bytes_read, "bytes_avoided": d.bytes_avoided,
                "trailing_text": d.trailing_text,
                "draft_tokens_proposed": d.draft_tokens_proposed,
                "draft_tokens_accepted": d.draft_tokens_accepted,
            })
        }
    }
}

/// `max_tokens`, `stop_id`, `end_of_turn`, ... for a wire stop reason.
fn stop_reason(value: i32) -> String {
    pb::StopReason::try_from(value)
        .map(|r| {
            r.as_str_name()
                .trim_start_matches("STOP_REASON_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| "unknown".into())
}
