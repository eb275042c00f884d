//! The scheduler thread: the only owner of the engine. It loads the model once, then, round
//! after round, steps the active requests together: every request whose client can take an
//! event (up to `--max-batch`) gets one engine step — a prefill chunk or a token — through one
//! batched forward pass (`Engine::step_batch`), so they share each layer's weights and the union
//! of their experts. Requests left out of a round (buffer full, or over the cap) go first in
//! the next, so none starves another; each request has its own `Generation`, so its output is
//! exactly what it would be alone.
//!
//! Events leave through each request's bounded channel. A request whose client is not reading
//! (buffer full) is skipped for that round instead of blocking the thread, so one slow client
//! cannot stall the others; every step emits at most one event, and a step is taken only when
//! the buffer has room for it, so `try_send` of a step's event never fails for lack of space.
//!
//! A request's bookkeeping (`Shared::finish`) is done before its last event is sent, so a client
//! that has seen its stream end never finds the request still counted as running in Status.

use super::admission::{Job, Kind, Outcome, Shared, shutdown_status};
use super::channels::Channels;
use super::convert;
use super::sessions::Sessions;
use k3_engine::engine::{Engine, EngineError, EngineOptions, Generation, LoadProgress, Step};
use k3_engine::session::Snapshot;
use k3_engine::tokenizer::StreamDecoder;
use k3proto::v1 as pb;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tonic::Status;

/// How long to wait before retrying when every active client's buffer is full.
const STALL_WAIT: Duration = Duration::from_millis(2);

/// A request being computed.
struct Active<'e> {
    job: Job,
    generation: Generation,
    text: StreamDecoder<'e>,
    channels: Option<Channels<'e>>,
    started: Instant,
    session: Option<SessionRun>,
}

/// A request on a session: the session's name and the state at the end of its prompt, kept
/// as a snapshot with the end-of-generation one (a chat's next prompt may re-render this
/// turn's reply differently, so only the prompt part would match).
struct SessionRun {
    name: String,
    prefill: Option<Snapshot>,
}

/// The state a generation holds now, with the ids it consumed.
fn snapshot(generation: &Generation) -> Snapshot {
    Snapshot {
        history: generation.consumed(),
        state: generation.state().clone(),
    }
}

/// Start the scheduler thread. It exits once admission is closed and nothing is left to run.
pub fn spawn(
    shared: Arc<Shared>,
    sessions: Arc<Sessions>,
    model: PathBuf,
    options: EngineOptions,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("k3d-scheduler".into())
        .spawn(move || {
            // The engine reports phases, not bytes: progress counts phases (checking the
            // checkpoint, then loading resident weights), so done/total = 0/2, then 1/2.
            let mut report = |p: LoadProgress| match p {
                LoadProgress::Checking => {
                    crate::notify::status("loading: checking the checkpoint (step 1 of 2)");
                    shared.set_loading(0, 2)
                }
                LoadProgress::Weights => {
                    crate::notify::status("loading: reading the resident weights (step 2 of 2)");
                    shared.set_loading(1, 2)
                }
                // Published with the engine's info right after `open` returns.
                LoadProgress::Ready => {}
            };
            let started = Instant::now();
            log!("loading {}", model.display());
            let engine = match Engine::open(&model, options, &mut report) {
                Ok(engine) => engine,
                Err(e) => {
                    log_err!("loading {} failed: {e}", model.display());
                    crate::notify::status(&format!("loading failed: {e}"));
                    shared.set_failed(e.to_string());
                    return;
                }
            };
            log!(
                "loaded {} in {:.2}s",
                engine.info().name,
                started.elapsed().as_secs_f64()
            );
            crate::notify::ready(&format!(
                "serving {} (loaded in {:.1} s)",
                engine.info().name,
                started.elapsed().as_secs_f64()
            ));
            sessions.open(&engine.info().fingerprint, engine.model().plan());
            shared.set_ready(engine.info().clone(), engine.stats());
            run(&shared, &sessions, &engine);
            sessions.save_all();
        })
}

fn run(shared: &Shared, sessions: &Sessions, engine: &Engine) {
    let mut active: VecDeque<Active<'_>> = VecDeque::new();
    loop {
        let free = shared.limits.max_active.saturating_sub(active.len());
        let taken = shared.take(free, active.is_empty());
        for job in taken.jobs {
            if let Some(a) = begin(shared, sessions, engine, job) {
                active.push_back(a);
            }
        }
        if active.is_empty() {
            if taken.closed {
                return;
            }
            continue;
        }
        // This round's batch: the first `max_batch` requests, in turn order, whose client can
        // take an event. The rest keep their place ahead of the stepped ones, which go to the
        // back: every request is stepped within a few rounds whatever the batch cap.
        let mut batch = Vec::new();
        let mut rest = VecDeque::new();
        for a in active.drain(..) {
            if batch.len() < shared.limits.max_batch && has_room(shared, &a) {
                batch.push(a);
            } else {
                rest.push_back(a);
            }
        }
        active = rest;
        if batch.is_empty() {
            shared.idle(STALL_WAIT);
        } else {
            let results = step_batch(shared, engine, &mut batch);
            for (mut a, result) in batch.into_iter().zip(results) {
                if deliver(shared, sessions, engine, &mut a, result) {
                    active.push_back(a);
                }
            }
        }
        shared.publish_stats(engine.stats());
    }
}

/// Whether a request may be stepped now: its client has buffer room for the step's event (or
/// is gone, or everything is being cancelled, so the step only ends it).
fn has_room(shared: &Shared, a: &Active<'_>) -> bool {
    a.job.tx.capacity() > 0 || a.job.tx.is_closed() || shared.stopping_all()
}

/// One engine step of every request of `batch`, through one forward pass. Each request has its
/// own cancel check (its Cancel flag, its client gone, the shutdown): the pass stops between
/// layers only when all are cancelled; one cancelled alone is dropped when the pass ends.
fn step_batch(
    shared: &Shared,
    engine: &Engine,
    batch: &mut [Active<'_>],
) -> Vec<Result<Step, EngineError>> {
    let checks: Vec<_> = batch
        .iter()
        .map(|a| {
            let flag = Arc::clone(&a.job.cancel);
            let tx = a.job.tx.clone();
            move || flag.load(Ordering::Relaxed) || tx.is_closed() || shared.stopping_all()
        })
        .collect();
    let cancels: Vec<&(dyn Fn() -> bool + Sync)> = checks
        .iter()
        .map(|c| c as &(dyn Fn() -> bool + Sync))
        .collect();
    let mut gens: Vec<&mut Generation> = batch.iter_mut().map(|a| &mut a.generation).collect();
    engine.step_batch(&mut gens, &cancels)
}

/// Start a request's generation, on its session's best snapshot if it has one; an invalid
/// request fails here with INVALID_ARGUMENT, an unloadable session file with its status.
fn begin<'e>(
    shared: &Shared,
    sessions: &Sessions,
    engine: &'e Engine,
    job: Job,
) -> Option<Active<'e>> {
    let channels = match job.kind {
        Kind::Text => None,
        Kind::Chat { thinking } => Some(Channels::new(engine.tokenizer(), thinking)),
    };
    let request = job.request.clone();
    let started = match &job.session {
        None => engine.start(request).map_err(|e| convert::engine_error(&e)),
        Some(name) => match sessions.start(name, &request.prompt) {
            Ok((Some(state), _)) => engine
                .start_from(request, state)
                .map_err(|e| convert::engine_error(&e)),
            Ok((None, _)) => engine.start(request).map_err(|e| convert::engine_error(&e)),
            Err(status) => Err(status),
        },
    };
    match started {
        Ok(generation) => {
            log!(
                "request {} started (uid {}, {} prompt tokens, {} from its session, waited {:.3}s)",
                job.id,
                uid_text(job.uid),
                job.request.prompt.len(),
                generation.state().positions(),
                job.admitted.elapsed().as_secs_f64()
            );
            Some(Active {
                generation,
                text: StreamDecoder::new(engine.tokenizer()),
                channels,
                started: Instant::now(),
                session: job.session.clone().map(|name| SessionRun {
                    name,
                    prefill: None,
                }),
                job,
            })
        }
        Err(status) => {
            log!("request {} refused: {}", job.id, status.message());
            if let Some(name) = &job.session {
                sessions.release(name);
            }
            shared.finish(job.id, Outcome::Failed);
            let _ = job.tx.try_send(Err(status));
            None
        }
    }
}

/// Sends the outcome of one step of `a` to its client. Returns whether it is still running.
fn deliver(
    shared: &Shared,
    sessions: &Sessions,
    engine: &Engine,
    a: &mut Active<'_>,
    result: Result<Step, EngineError>,
) -> bool {
    match result {
        Ok(Step::Prefill { done, total }) => {
            if let Some(run) = a.session.as_mut().filter(|_| done == total) {
                run.prefill = Some(snapshot(&a.generation));
            }
            a.job.offer(pb::event::Event::Progress(pb::Progress {
                phase: pb::Phase::Prefill.into(),
                done: done as u64,
                total: total as u64,
            }));
            true
        }
        Ok(Step::Token { id }) => {
            let (channel, tool_call) = match a.channels.as_mut() {
                Some(c) => c.classify(id),
                None => (pb::Channel::Text, None),
            };
            // The engine emits only ids of its own vocabulary; were one unknown, show U+FFFD
            // rather than fail a request whose ids are all still correct.
            let text = a
                .text
                .push(id)
                .unwrap_or_else(|_| char::REPLACEMENT_CHARACTER.to_string());
            a.job.offer(pb::event::Event::Token(pb::Token {
                id,
                text,
                channel: channel.into(),
                tool_call,
            }));
            true
        }
        Ok(Step::Finished(summary)) => {
            let queued = a.started.duration_since(a.job.admitted).as_secs_f64();
            log!(
                "request {} done: {} tokens, {}, {:.3}s",
                a.job.id,
                summary.generated_tokens,
                summary.stop_reason,
                a.started.elapsed().as_secs_f64()
            );
            let trailing = a.text.flush();
            let end_of_turn = match a.job.kind {
                Kind::Chat { .. } => engine.tokenizer().end_of_turn_ids().to_vec(),
                Kind::Text => Vec::new(),
            };
            if let Some(run) = a.session.take() {
                // Before Done: the client's next turn must find the session free.
                let end = snapshot(&a.generation);
                sessions.finish(&run.name, run.prefill.into_iter().chain([end]).collect());
            }
            shared.finish(a.job.id, Outcome::Completed);
            let mut done = convert::done(&summary, &end_of_turn, queued, trailing);
            if let Some(channels) = a.channels.take() {
                let end_id =
                    (done.stop_reason == pb::StopReason::EndOfTurn as i32).then_some(done.stop_id);
                (done.tool_calls, done.malformed) = channels.finish(end_id);
            }
            a.job.offer(pb::event::Event::Done(done));
            false
        }
        Err(EngineError::Cancelled) => {
            let (why, status) = if a.job.cancel.load(Ordering::Relaxed) {
                let status = Status::cancelled(format!("request {} cancelled", a.job.id));
                ("by a Cancel call", status)
            } else if shared.stopping_all() {
                ("at shutdown, after the grace period", shutdown_status())
            } else {
                let status = Status::cancelled("the client went away");
                ("the client went away", status)
            };
            log!("request {} cancelled: {why}", a.job.id);
            if let Some(run) = a.session.take() {
                sessions.release(&run.name);
            }
            shared.finish(a.job.id, Outcome::Cancelled);
            let _ = a.job.tx.try_send(Err(status));
            false
        }
        Err(e) => {
            log_err!("request {} failed: {e}", a.job.id);
            if let Some(run) = a.session.take() {
                sessions.release(&run.name);
            }
            shared.finish(a.job.id, Outcome::Failed);
            let _ = a.job.tx.try_send(Err(convert::engine_error(&e)));
            false
        }
    }
}

pub fn uid_text(uid: Option<u32>) -> String {
    uid.map_or_else(|| "unknown".to_string(), |u| u.to_string())
}
