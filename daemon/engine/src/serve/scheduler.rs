//! The scheduler thread: the only owner of the engine. It loads the model once, then steps the
//! active jobs through the [`Batch`] loop: every job whose reader has room for an event (up to
//! `max_batch`) gets one step — a prefill chunk or a token — per round.
//!
//! Events leave through each job's bounded [`super::Events`] channel. A job whose reader is not
//! keeping up (buffer full) is skipped for that round instead of blocking the thread, so one
//! slow client cannot stall the others; every step emits at most one event, and a step is taken
//! only when the buffer has room for it.
//!
//! A job's bookkeeping (admission's `finish`, its session lease) is done before its last event
//! is sent, so a client that has seen its stream end never finds the job still counted as
//! running, nor its session still in use.
//!
//! After a chat reply with automatic prefix reuse, its slot warms the caller's next turn
//! ([`super::prefix`]): a [`Warm`] member with no client, dropped as soon as a request waits
//! for a slot or the daemon stops, so it only ever uses compute nobody asked for. The states
//! that outlive the daemon are handed to [`PrefixFiles`] once the reply is out.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::admission::{Admission, Job, JobEnd};
use super::batch::{Batch, Cancel, Member, Never};
use super::caller::Caller;
use super::log::{Log, OnHealth};
use super::metrics::TimingTotals;
use super::prefix::{self, PrefixCache};
use super::prefix_files::PrefixFiles;
use super::sessions::Sessions;
use super::token_reader::TokenReader;
use super::validate::Kind;
use super::{Done, Event, FinishReason, Health, LoadFigures, ServeError};
use crate::engine::{
    Engine, EngineError, EngineOptions, GenerateRequest, Generation, LoadProgress, Step, StopReason,
};
use crate::session::Snapshot;
use crate::tokenizer::Tokenizer;
use crate::tokenizer::chat;

/// The least time between two load reports to the embedder ([`OnHealth`]: its log line and
/// systemd's status line): a 1.5 TB load reports thousands of figures, a reader wants a line
/// every few seconds. `Status` and queued jobs get every figure.
const LOAD_NOTICE_EVERY: Duration = Duration::from_secs(5);

/// How long to wait before retrying when every active reader's buffer is full.
const STALL_WAIT: Duration = Duration::from_millis(2);
/// How often parked jobs' readers are looked at (a reader that reads again tells nobody).
const PARKED_POLL: Duration = Duration::from_millis(20);

/// Everything the scheduler thread shares with the core's handle.
pub(crate) struct Shared {
    pub admission: Arc<Admission>,
    pub sessions: Arc<Sessions>,
    pub prefix: Arc<PrefixCache>,
    pub files: Arc<PrefixFiles>,
    pub metrics: Arc<TimingTotals>,
    pub log: Log,
    pub on_health: OnHealth,
    /// How long a running job's reader may take nothing, while others wait for a compute
    /// slot, before the job gives its slot back ([`park_stalled`]).
    pub stall_timeout: Duration,
}

/// A job being computed.
struct Active<'e> {
    job: Job,
    generation: Generation,
    reader: TokenReader<'e>,
    started: Instant,
    first_token: Option<Instant>,
    /// A session's state at the end of the prompt, kept as a snapshot with the
    /// end-of-generation one (a chat's next prompt may re-render this turn's reply
    /// differently, so only the prompt part would match).
    prefill: Option<Snapshot>,
    /// Its prelude states ([`prefix::prelude_points`]), written to disk once its reply is out.
    preludes: Vec<Arc<Snapshot>>,
    watch: Watch<'e>,
    /// Since when its reader's buffer has been full (it took nothing since), if it is.
    stalled_since: Option<Instant>,
    /// Parked, its resumption asked for: it waits in the queue for a slot.
    resuming: bool,
}

/// A running job's cancel check: its cancel flag, its reader gone, or the shutdown.
struct Watch<'e> {
    job_cancel: Arc<std::sync::atomic::AtomicBool>,
    abandoned: super::events::AbandonProbe,
    admission: &'e Admission,
}

impl Cancel for Watch<'_> {
    fn cancelled(&self) -> bool {
        self.job_cancel.load(Ordering::Relaxed)
            || self.abandoned.is_abandoned()
            || self.admission.stopping_all()
    }
}

impl Member for Active<'_> {
    fn split(&mut self) -> (&mut Generation, &(dyn Cancel + Sync)) {
        (&mut self.generation, &self.watch)
    }
    fn generation(&self) -> &Generation {
        &self.generation
    }
    /// Its reader has buffer room for the step's event (or is gone, or everything is being
    /// cancelled, so the step only ends it).
    fn ready(&self) -> bool {
        self.job.events.has_room() || self.watch.cancelled()
    }
}

/// Feeding a chat's next turn ([`prefix::next_turn`]) after its reply went out, from the
/// caller's best kept state; its state at the end is kept for the caller.
struct Warm {
    caller: Caller,
    generation: Generation,
    /// The request whose reply this warms (for the log).
    after: u64,
    /// That reply's end state, written to disk in its stead if the warming is dropped
    /// ([`PrefixFiles`]: what the next turn continues from after a restart).
    end: Option<Arc<Snapshot>>,
}

impl Member for Warm {
    fn split(&mut self) -> (&mut Generation, &(dyn Cancel + Sync)) {
        // Never cancelled mid-pass: the scheduler drops it between rounds when a request
        // waits for its slot (a pass is at most one prefill chunk).
        (&mut self.generation, &Never)
    }
    fn generation(&self) -> &Generation {
        &self.generation
    }
}

/// A member of the batch.
enum Running<'e> {
    Job(Box<Active<'e>>),
    Warm(Box<Warm>),
}

impl Member for Running<'_> {
    fn split(&mut self) -> (&mut Generation, &(dyn Cancel + Sync)) {
        match self {
            Running::Job(a) => a.split(),
            Running::Warm(w) => w.split(),
        }
    }
    fn generation(&self) -> &Generation {
        match self {
            Running::Job(a) => a.generation(),
            Running::Warm(w) => w.generation(),
        }
    }
    fn ready(&self) -> bool {
        match self {
            Running::Job(a) => a.ready(),
            Running::Warm(w) => w.ready(),
        }
    }
}

/// The state a generation holds now, with the ids it consumed.
fn snapshot(generation: &Generation) -> Snapshot {
    Snapshot {
        history: generation.consumed(),
        state: generation.state().clone(),
    }
}

/// Starts the scheduler thread. It exits once admission is closed and nothing is left to run,
/// after writing every session.
pub(crate) fn spawn(
    shared: Shared,
    model: PathBuf,
    options: EngineOptions,
    tokenizer: Arc<Tokenizer>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("k3d-scheduler".into())
        .spawn(move || {
            let log = shared.log;
            let admission = &shared.admission;
            let on_health = shared.on_health;
            // The rate is timed from the first weight report, not from the checks before it.
            let mut reads_began: Option<Instant> = None;
            let mut noticed: Option<(bool, Instant)> = None;
            let mut report = |p: LoadProgress| {
                let figures = match p {
                    LoadProgress::Checking => LoadFigures::default(),
                    LoadProgress::Weights { done, total } => {
                        let began = *reads_began.get_or_insert_with(Instant::now);
                        LoadFigures::measure(done, total, began.elapsed())
                    }
                    // Published with the engine's info right after `open` returns.
                    LoadProgress::Ready => return,
                };
                admission.set_loading(figures);
                // A new phase and the last figure are told at once, others when one is due.
                let due = noticed.is_none_or(|(reading, at)| {
                    reading != figures.reading()
                        || at.elapsed() >= LOAD_NOTICE_EVERY
                        || (figures.reading() && figures.done == figures.total)
                });
                if due {
                    noticed = Some((figures.reading(), Instant::now()));
                    on_health(&Health::Loading(figures), None);
                }
            };
            let started = Instant::now();
            log.info(format_args!("loading {}", model.display()));
            let engine = match Engine::open_with_tokenizer(&model, options, tokenizer, &mut report)
            {
                Ok(engine) => engine,
                Err(e) => {
                    log.error(format_args!("loading {} failed: {e}", model.display()));
                    admission.set_failed(e);
                    on_health(&admission.health(), None);
                    return;
                }
            };
            log.info(format_args!(
                "loaded {} in {:.2}s",
                engine.info().name,
                started.elapsed().as_secs_f64()
            ));
            shared.sessions.open(
                &engine.info().fingerprint,
                engine.model().plan().session_allowance(),
            );
            admission.set_ready(engine.info().clone(), engine.stats());
            on_health(&Health::Ready, Some(engine.info()));
            run(&shared, &engine);
            shared.files.close();
            shared.sessions.save_all();
        })
}

fn run(shared: &Shared, engine: &Engine) {
    let admission = &shared.admission;
    let mut batch: Batch<Running<'_>> = Batch::new(admission.capacity.max_batch);
    let mut parked: Vec<Box<Active<'_>>> = Vec::new();
    loop {
        look_at_parked(shared, &mut parked);
        let free = admission.capacity.max_active.saturating_sub(batch.len());
        let taken = admission.take(free, batch.is_empty() && parked.is_empty());
        for job in taken.jobs {
            if let Some(a) = begin(shared, engine, job) {
                batch.push(Running::Job(Box::new(a)));
            }
        }
        for id in &taken.resumed {
            if let Some(at) = parked.iter().position(|a| a.job.id == *id) {
                let mut a = parked.swap_remove(at);
                a.resuming = false;
                a.stalled_since = None;
                shared.log.info(format_args!(
                    "request {id}: its reader reads again; resumed"
                ));
                batch.push(Running::Job(a));
            }
        }
        // A stalled reader's job gives its slot to those waiting for one.
        if !taken.waiting.is_empty() {
            park_stalled(shared, &mut batch, &mut parked);
        }
        // Warming uses only compute nobody waits for: another caller's queued request, a
        // drain or a stop takes its slot back (that turn then prefills what warming did not).
        // The caller's own next request waits for it: it continues from the warmed state.
        let stopping = taken.closed || admission.stopping_all();
        let yields =
            |w: &Warm| stopping || taken.waiting.iter().any(|c| c.as_ref() != Some(&w.caller));
        if batch
            .iter()
            .any(|m| matches!(m, Running::Warm(w) if yields(w)))
        {
            let members: Vec<_> = batch.drain().collect();
            for m in members {
                match m {
                    Running::Warm(w) if yields(&w) => {
                        if let Some(end) = w.end {
                            shared.files.write(&w.caller, end, false);
                        }
                    }
                    other => batch.push(other),
                }
            }
            if !taken.waiting.is_empty() {
                continue;
            }
        }
        if batch.is_empty() {
            if taken.closed && parked.is_empty() {
                return;
            }
            if !parked.is_empty() {
                // Nothing to compute until a parked reader reads again or a job arrives.
                admission.idle(PARKED_POLL);
            }
            continue;
        }
        let stepped = batch.round(engine);
        if stepped.is_empty() {
            admission.idle(STALL_WAIT);
        }
        mark_stalls(&mut batch);
        for (member, result) in stepped {
            let next = match member {
                Running::Job(a) => deliver(shared, engine, a, result),
                Running::Warm(w) => warmed(shared, *w, result).map(|w| Running::Warm(Box::new(w))),
            };
            if let Some(m) = next {
                batch.push(m);
            }
        }
        admission.publish_stats(engine.stats());
    }
}

/// The warming of `caller`'s next turn after the reply of `job` ([`prefix::next_turn`]), from
/// its best kept state; `None` when there is nothing to feed (or the engine refuses it).
fn warm(
    shared: &Shared,
    engine: &Engine,
    job: &Job,
    caller: &Caller,
    reply: chat::Message,
    end: Option<Arc<Snapshot>>,
) -> Option<Warm> {
    let (conversation, _) = job.conversation.as_ref()?;
    // With no room for kept states the result would be dropped at once.
    if prefix_room(shared) == 0 {
        return None;
    }
    let prompt = prefix::next_turn(engine.tokenizer(), conversation, reply)?;
    let request = GenerateRequest {
        prompt,
        max_tokens: 1,
        ..GenerateRequest::default()
    };
    let room = prefix_room(shared);
    let started = match shared
        .files
        .find(&shared.prefix, caller, &request.prompt, room)
    {
        Some(state) => engine.start_from(request, state),
        None => engine.start(request),
    };
    match started {
        Ok(generation) => Some(Warm {
            caller: caller.clone(),
            generation,
            after: job.id,
            end,
        }),
        Err(e) => {
            shared.log.warn(format_args!(
                "request {}: cannot warm the next turn: {e}",
                job.id
            ));
            None
        }
    }
}

/// Takes one step of warming: at the end of its prompt the state is kept for its caller and
/// the member ends (nothing is sampled). Returns it while there is more to feed.
fn warmed(shared: &Shared, w: Warm, result: Result<Step, EngineError>) -> Option<Warm> {
    match result {
        Ok(Step::Prefill { done, total, .. }) if done < total => Some(w),
        Ok(Step::Prefill { .. }) => {
            let fed = w.generation.state().positions() - w.generation.reused();
            shared.metrics.warmed(fed);
            shared.log.info(format_args!(
                "request {}: warmed the next turn ({} ids, {fed} fed)",
                w.after,
                w.generation.state().positions()
            ));
            let warmed = Arc::new(snapshot(&w.generation));
            let room = prefix_room(shared);
            shared
                .prefix
                .keep(&w.caller, vec![Arc::clone(&warmed)], &[], room);
            shared.files.write(&w.caller, warmed, false);
            None
        }
        Ok(_) => None,
        Err(e) => {
            shared.log.warn(format_args!(
                "request {}: warming the next turn failed: {e}",
                w.after
            ));
            None
        }
    }
}

/// What the named sessions leave of the session allowance, for the kept states.
fn prefix_room(shared: &Shared) -> u64 {
    let figures = shared.sessions.figures();
    figures.allowance_bytes.saturating_sub(figures.memory_bytes)
}

/// Starts a job's generation, on its session's best snapshot if it has one; a job the engine
/// refuses ends here with its error.
fn begin<'e>(shared: &'e Shared, engine: &'e Engine, job: Job) -> Option<Active<'e>> {
    let request = job.request.clone();
    let kept = match (&job.lease, &job.reuse) {
        (None, Some(caller)) => {
            let room = prefix_room(shared);
            shared
                .files
                .find(&shared.prefix, caller, request.prompt(), room)
        }
        _ => None,
    };
    let started = match &job.lease {
        None => match kept {
            Some(state) => engine.start_from(request, state),
            None => engine.start(request),
        }
        .map_err(ServeError::from_engine),
        Some(lease) => match shared.sessions.start(lease, request.prompt()) {
            Ok((Some(state), _)) => engine
                .start_from(request, state)
                .map_err(ServeError::from_engine),
            Ok((None, _)) => engine.start(request).map_err(ServeError::from_engine),
            Err(e) => Err(e),
        },
    };
    match started {
        Ok(generation) => {
            shared.log.info(format_args!(
                "request {} started ({}, {} prompt tokens, {} reused, waited {:.3}s)",
                job.id,
                job.caller,
                job.request.prompt().len(),
                generation.state().positions(),
                job.admitted.elapsed().as_secs_f64()
            ));
            let watch = Watch {
                job_cancel: Arc::clone(&job.cancel),
                abandoned: job.events.abandon_probe(),
                admission: &shared.admission,
            };
            Some(Active {
                reader: TokenReader::new(engine.tokenizer(), job.kind),
                generation,
                started: Instant::now(),
                first_token: None,
                prefill: None,
                preludes: Vec::new(),
                watch,
                stalled_since: None,
                resuming: false,
                job,
            })
        }
        Err(error) => {
            shared
                .log
                .info(format_args!("request {} refused: {error}", job.id));
            let outcome = JobEnd::of(&error);
            fail(shared, job, error, outcome);
            None
        }
    }
}

/// Sends the outcome of one step of `a` to its reader. Returns what runs on in its slot: the
/// job itself, or the warming of its caller's next turn.
fn deliver<'e>(
    shared: &Shared,
    engine: &Engine,
    mut a: Box<Active<'e>>,
    result: Result<Step, EngineError>,
) -> Option<Running<'e>> {
    match result {
        Ok(Step::Prefill { done, total, pass }) => {
            if a.job.lease.is_some() && done == total {
                a.prefill = Some(snapshot(&a.generation));
            }
            if let Some(caller) = &a.job.reuse {
                // The states at the job's keep points ([`prefix::keep_points`]), kept at once:
                // within the allowance from the moment they exist.
                let kept: Vec<Arc<Snapshot>> = a
                    .generation
                    .take_kept()
                    .into_iter()
                    .map(|state| {
                        Arc::new(Snapshot {
                            history: a.job.request.prompt()[..state.positions()].to_vec(),
                            state,
                        })
                    })
                    .collect();
                let prelude = a.job.conversation.as_ref().map_or(&[][..], |(_, p)| p);
                a.preludes.extend(
                    kept.iter()
                        .filter(|s| prelude.contains(&s.history.len()))
                        .cloned(),
                );
                if !kept.is_empty() {
                    shared
                        .prefix
                        .keep(caller, kept, prelude, prefix_room(shared));
                }
            }
            a.job.events.send(Event::Prefill { done, total, pass });
            Some(Running::Job(a))
        }
        Ok(Step::Token { id }) => {
            if a.first_token.is_none() {
                a.first_token = Some(Instant::now());
                shared
                    .metrics
                    .first_token(a.first_token_seconds().unwrap_or(0.0));
            }
            let piece = a.reader.read(id);
            a.job.events.send(Event::Token { id, piece });
            Some(Running::Job(a))
        }
        Ok(Step::Finished(summary)) => {
            let queued_seconds = a.started.duration_since(a.job.admitted).as_secs_f64();
            shared.log.info(format_args!(
                "request {} done: {} tokens, {:?}, {:.3}s",
                a.job.id,
                summary.generated_tokens,
                summary.stop_reason,
                a.started.elapsed().as_secs_f64()
            ));
            shared.metrics.finished(&summary);
            let end_of_turn = match a.job.kind {
                Kind::Chat { .. } => engine.tokenizer().end_of_turn_ids().to_vec(),
                Kind::Text => Vec::new(),
            };
            let finish = match &summary.stop_reason {
                StopReason::MaxTokens => FinishReason::Length,
                StopReason::StopId(id) if end_of_turn.contains(id) => FinishReason::EndOfTurn(*id),
                StopReason::StopId(id) => FinishReason::StopId(*id),
                StopReason::StopString(s) => FinishReason::StopString(s.clone()),
            };
            let mut unkept = None;
            let mut end_kept = None;
            if let Some(lease) = a.job.lease.take() {
                // Before Done: the client's next turn must find the session free.
                let end = snapshot(&a.generation);
                let snapshots = a.prefill.take().into_iter().chain([end]).collect();
                // Its client is told if its state was not kept (issue 45.3: such a turn
                // succeeded and the session was gone).
                unkept = if shared.admission.accepting() {
                    lease.finish(snapshots).err()
                } else {
                    // Shutdown began: the daemon exits once its jobs end, so the turn's state
                    // is kept only if it reaches the disk (issue 19.7).
                    lease.finish_written(snapshots).err()
                };
            } else if let Some(caller) = &a.job.reuse {
                // Before Done too: the caller's next request may follow at once. Kept states
                // take only what the named sessions leave of their allowance.
                let end = Arc::new(snapshot(&a.generation));
                let room = prefix_room(shared);
                shared
                    .prefix
                    .keep(caller, vec![Arc::clone(&end)], &[], room);
                end_kept = Some(end);
            }
            if let Some(error) = unkept {
                shared.log.error(format_args!(
                    "request {}: the session's new state was not kept: {error}",
                    a.job.id
                ));
                shared.admission.finish(a.job.id, JobEnd::of(&error));
                a.job.events.send(Event::Failed(error));
                return None;
            }
            shared.admission.finish(a.job.id, JobEnd::Completed);
            let end_id = match finish {
                FinishReason::EndOfTurn(id) => Some(id),
                _ => None,
            };
            let ending = a.reader.finish(end_id);
            if let Some(m) = &ending.malformed {
                shared.log.warn(format_args!(
                    "request {}: malformed reply: {}",
                    a.job.id, m.error
                ));
            }
            a.job.events.send(Event::Done(Done {
                finish,
                trailing_text: ending.trailing_text,
                tool_calls: ending.tool_calls,
                malformed: ending.malformed,
                queued_seconds,
                summary,
            }));
            // The reply is out: the states that outlive the daemon go to the disk — the
            // prelude's, and the next turn's start (the warmed one once it is fed, else the
            // end of this reply).
            let caller = a.job.reuse.as_ref()?;
            for kept in a.preludes.drain(..) {
                shared.files.write(caller, kept, true);
            }
            let warming = ending
                .message
                .and_then(|reply| warm(shared, engine, &a.job, caller, reply, end_kept.clone()));
            if let (None, Some(end)) = (&warming, end_kept) {
                shared.files.write(caller, end, false);
            }
            warming.map(|w| Running::Warm(Box::new(w)))
        }
        Err(EngineError::Cancelled) => {
            end_cancelled(shared, a.job);
            None
        }
        Err(e) => {
            shared
                .log
                .error(format_args!("request {} failed: {e}", a.job.id));
            let error = ServeError::from_engine(e);
            let outcome = JobEnd::of(&error);
            fail(shared, a.job, error, outcome);
            None
        }
    }
}

/// Ends `job` with `error`: its lease released and admission told before its reader hears.
fn fail(shared: &Shared, mut job: Job, error: ServeError, outcome: JobEnd) {
    drop(job.lease.take());
    shared.admission.finish(job.id, outcome);
    job.events.send(Event::Failed(error));
}

/// Ends a job whose cancel check fired: by a Cancel call, the shutdown, or its reader gone.
fn end_cancelled(shared: &Shared, job: Job) {
    let error = if job.cancel.load(Ordering::Relaxed) {
        ServeError::Cancelled(job.id)
    } else if shared.admission.stopping_all() {
        ServeError::Shutdown
    } else {
        ServeError::Abandoned
    };
    shared
        .log
        .info(format_args!("request {} cancelled: {error}", job.id));
    fail(shared, job, error, JobEnd::Cancelled);
}

/// Notes, after a round, since when each job's reader has had no room: it took nothing since
/// (its transport stopped taking events, as a client that does not read makes it).
fn mark_stalls(batch: &mut Batch<Running<'_>>) {
    let now = Instant::now();
    for member in batch.iter_mut() {
        if let Running::Job(a) = member {
            if a.job.events.has_room() {
                a.stalled_since = None;
            } else {
                a.stalled_since.get_or_insert(now);
            }
        }
    }
}

/// Issue 35 point 4: while others wait for a compute slot, a job whose reader took nothing
/// for the stall timeout gives its slot back. Its state is kept (parked, out of the batch,
/// resumed exactly where it stopped once its reader reads again) when what the session
/// allowance leaves has room for it; otherwise it is cancelled with [`ServeError::Stalled`],
/// which its reader finds after the events it left unread.
fn park_stalled<'e>(
    shared: &Shared,
    batch: &mut Batch<Running<'e>>,
    parked: &mut Vec<Box<Active<'e>>>,
) {
    let timeout = shared.stall_timeout;
    let stalled = |a: &Active<'_>| {
        a.stalled_since.is_some_and(|t| t.elapsed() >= timeout) && !a.watch.cancelled()
    };
    if !batch
        .iter()
        .any(|m| matches!(m, Running::Job(a) if stalled(a)))
    {
        return;
    }
    let members: Vec<_> = batch.drain().collect();
    for member in members {
        let a = match member {
            Running::Job(a) if stalled(&a) => a,
            other => {
                batch.push(other);
                continue;
            }
        };
        let seconds = a.stalled_since.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let bytes = kept_bytes(&a);
        let room = parking_room(shared, parked);
        if bytes <= room {
            shared.admission.park(a.job.id);
            shared.log.warn(format_args!(
                "request {} ({}): its reader took nothing for {seconds:.1} s \
                 (stall_timeout) while others waited; parked with its state ({bytes} bytes) \
                 to give its compute slot back",
                a.job.id, a.job.caller
            ));
            parked.push(a);
        } else {
            shared.log.warn(format_args!(
                "request {} ({}): its reader took nothing for {seconds:.1} s \
                 (stall_timeout) while others waited; cancelled: its state ({bytes} bytes) \
                 does not fit the {room} bytes the session allowance has left",
                a.job.id, a.job.caller
            ));
            shared.admission.stalled();
            let id = a.job.id;
            fail(
                shared,
                a.job,
                ServeError::Stalled { id, seconds },
                JobEnd::Cancelled,
            );
        }
    }
}

/// Bytes a parked job keeps: its state and the snapshot it took at the end of its prompt.
fn kept_bytes(a: &Active<'_>) -> u64 {
    let prefill = a
        .prefill
        .as_ref()
        .map_or(0, |s| s.state.size_bytes() + 4 * s.history.len());
    (a.generation.state().size_bytes() + prefill) as u64
}

/// What the session allowance leaves for parked states: the named sessions and the kept
/// prefix states come first.
fn parking_room(shared: &Shared, parked: &[Box<Active<'_>>]) -> u64 {
    let held: u64 = parked.iter().map(|a| kept_bytes(a)).sum();
    prefix_room(shared)
        .saturating_sub(shared.prefix.figures().bytes)
        .saturating_sub(held)
}

/// Parked jobs: one that was cancelled, whose reader went away or that the shutdown stops
/// ends here; one whose reader has room again asks for a compute slot.
fn look_at_parked(shared: &Shared, parked: &mut Vec<Box<Active<'_>>>) {
    let mut i = 0;
    while i < parked.len() {
        if parked[i].watch.cancelled() {
            end_cancelled(shared, parked.swap_remove(i).job);
            continue;
        }
        if !parked[i].resuming && parked[i].job.events.has_room() {
            parked[i].resuming = true;
            shared.admission.resume(parked[i].job.id);
        }
        i += 1;
    }
}

impl Active<'_> {
    /// Seconds from admission to the first generated token.
    fn first_token_seconds(&self) -> Option<f64> {
        self.first_token
            .map(|t| t.duration_since(self.job.admitted).as_secs_f64())
    }
}
