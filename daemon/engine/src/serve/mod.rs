//! # The serve core: one model, many jobs, any transport
//!
//! Everything a server needs between "a request arrived" and "its events went out", with no
//! transport in it: threads and channels, no async runtime. The gRPC service of `k3d` is a thin
//! mapping onto it (protobuf ↔ these types, peer credentials, status codes); an HTTP server is
//! another mapping onto the same [`Core`], in the same process.
//!
//! ```text
//!  transport ──submit(uid, Request)──► validate ─► lease session ─► admission queue
//!      ▲                                                               │ take
//!      │ Events (Queued, Loading, Prefill, Token, Done | Failed)       ▼
//!      └──────────────────────────────────────────────────────── scheduler thread
//!                                                                 (Batch rounds over
//!                                                                  Engine::step_batch)
//! ```
//!
//! * [`validate`] — every request limit, in one place (prompt length, the daemon's
//!   `max_tokens` cap, context, stop lists, sampling ranges, speculate) and chat rendering
//!   through the library's template.
//! * [`admission`] — the one bounded queue, fair across uids: positions, per-uid accounting
//!   and limits, cancel and abandon, the model's state, the request counters.
//! * [`sessions`] — the session store and the [`SessionLease`] a job owns: released exactly
//!   once however the job ends.
//! * [`batch`] — the one batch loop (round robin over [`crate::engine::Engine::step_batch`]),
//!   also used by the batching tests and `batch_bench`.
//! * [`token_reader`] — generated ids in, classified text pieces and tool-call deltas out, through
//!   the chat layer's one reply reader (spec §8.4).
//! * [`prefix`] — automatic prefix reuse: each caller's recent states, continued at the
//!   longest exact prefix of a later prompt (OpenAI clients resend the whole conversation);
//!   [`prefix_files`] writes a local account's to the session directory after the reply and
//!   loads them again, across restarts.
//! * [`events`] — a job's bounded event channel; dropping the receiver abandons the job.
//! * [`metrics`] — token and timing sums for a metrics endpoint.
//!
//! ## Using it
//!
//! ```
//! use k3_engine::serve::{Caller, Config, Core, Event, Prompt, Request};
//! use std::time::Duration;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # // The repository's trained 2 MB K3; sessions in a private temporary directory.
//! # let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
//! #     .join("../../tests/fixtures/trained/model");
//! # let scratch = tempfile::tempdir()?;
//! # let session_dir = scratch.path().to_path_buf();
//! let mut config = Config::new(model, session_dir); // the checkpoint; where sessions are kept
//! config.engine.threads = 1;
//! let core = Core::new(config)?;
//! core.start()?; // loads the model on the scheduler thread; jobs may be submitted already
//! let mut request = Request::new(Prompt::Text("def fibonacci(n):\n".into()));
//! request.max_tokens = Some(16);
//! let job = core.submit(Caller::Uid(1000), request)?;
//! let mut finished = None;
//! while let Some(event) = job.events.recv() {
//!     match event {
//!         Event::Token { piece, .. } => print!("{}", piece.text),
//!         Event::Done(done) => {
//!             println!("\n{:?}, {} tokens", done.finish, done.usage().completion_tokens);
//!             finished = Some(done.usage().completion_tokens);
//!         }
//!         Event::Failed(e) => return Err(e.into()),
//!         _ => {}
//!     }
//! }
//! core.close(); // stop admitting, then wait for the scheduler thread
//! assert!(core.join(Duration::from_secs(30)));
//! assert!(finished.is_some_and(|n| (1..=16).contains(&n)));
//! # Ok(()) }
//! ```
//!
//! * **Submit** ([`Core::submit`]) validates at once and either refuses with a [`ServeError`]
//!   (`Invalid`, `Busy` with the [`QueueState`], `UidBusy` with the uid's [`UidQueueState`],
//!   `ShuttingDown`, `ModelFailed`, `Session`) or returns a [`JobHandle`]: its id, its prompt
//!   length, and its [`Events`] receiver. The queue is fair across uids: jobs are served in
//!   turns, one uid's at a time, within [`UidLimits`] ([`admission`]).
//! * **Events** arrive in order: [`Event::Queued`] (position, when it must wait),
//!   [`Event::Loading`] (while the model loads), [`Event::Prefill`] per chunk or pass layer, one
//!   [`Event::Token`] per generated id (id + classified [`TokenPiece`]), then exactly one of
//!   [`Event::Done`] (finish reason, usage, timings) or [`Event::Failed`]. `recv` blocks;
//!   `poll_recv` serves an async stream with std's `Waker` only.
//! * **Cancel** ([`JobHandle::cancel`] or [`Core::cancel`] by id): a queued job leaves the queue
//!   at once; a running one stops within a layer of the forward pass when it computes alone,
//!   within one batched step when others share its pass. **Dropping the receiver** abandons the
//!   job the same way. Either way its session lease is released before anything else can see
//!   the session.
//! * **Health** ([`Core::health`]): `Loading(`[`LoadFigures`]`)` (bytes, rate, ETA), `Ready`, `Failed(error)` — readable
//!   at any time, for a health endpoint and 503s. [`Core::status`] adds the engine's figures,
//!   queue, counters and sessions; [`Core::metrics`] the counters a metrics endpoint reads.
//! * **Shutdown**: [`Core::close`] stops admitting; [`Core::drained`] says when every job has
//!   ended; [`Core::stop_all`] cancels what is left (the grace ran out); [`Core::join`] waits
//!   for the scheduler thread, which writes every session before it ends.
//!
//! A job's tokens depend only on its request (prompt, sampling, seed): never on what else is
//! batched with it, the thread count or the budget (spec §6).

pub mod admission;
pub mod batch;
pub mod caller;
mod error;
pub mod events;
pub mod limits;
mod load;
mod log;
pub mod metrics;
pub mod prefix;
pub mod prefix_files;
mod prep;
mod scheduler;
pub mod sessions;
pub mod token_reader;
pub mod validate;

pub use admission::{AdmissionFigures, Canceller, Capacity, Counters, UidLimits, UidLoad};
pub use batch::{Batch, Member};
pub use caller::Caller;
pub use error::{QueueState, STORAGE_FAILED, ServeError, UidQueueState};
pub use events::Events;
pub use limits::{Api, LimitError, Limits, ThinkingBudget};
pub use load::LoadFigures;
pub use log::{Level, Log, OnHealth, ignore_health};
pub use metrics::Timings;
pub use prefix::{PrefixCache, PrefixFigures};
pub use prefix_files::PrefixFiles;
pub use prep::{PREP_TURNS, PrepTurn};
pub use sessions::{SessionFigures, SessionLease, Sessions};
pub use token_reader::{
    Channel, Ending, Malformed, TokenPiece, TokenReader, ToolCallDelta, ToolCallStart,
};
pub use validate::{Field, Invalid, Kind, Prompt, Request};

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::checkpoint::config::{ConfigError, ModelConfig};
use crate::engine::{EngineError, EngineOptions, EngineStats, PassProgress, Summary};
use crate::tokenizer::chat::{Conversation, ToolCall};
use crate::tokenizer::{Tokenizer, TokenizerError};
use admission::{Admission, Job};
use metrics::TimingTotals;
use prep::PrepPool;
use validate::ModelLimits;

/// Events buffered per job: small, so a reader that stops reading is noticed quickly and holds
/// little memory (rust-stack §3).
pub const STREAM_BUFFER: usize = 8;

/// One event of a job.
#[derive(Debug, Clone)]
pub enum Event {
    /// The job waits for a compute slot: `position` jobs (this one included) are ahead of the
    /// slot. Sent when the position changes.
    Queued { position: u32 },
    /// The model is still loading: resident bytes read, rate and time left.
    Loading(LoadFigures),
    /// Prefill progressed: `done` of `total` prompt tokens are in the state; during a
    /// layer-major pass over the next tokens, `pass` says how many layers of it have run
    /// (issue 30: a long prompt's one pass reports every layer).
    Prefill {
        done: usize,
        total: usize,
        pass: Option<PassProgress>,
    },
    /// One generated id and the text it completes, classified.
    Token { id: u32, piece: TokenPiece },
    /// The job completed. Last event.
    Done(Done),
    /// The job ended without completing (cancelled, abandoned, shut down, refused when it
    /// started, or the model failed). Last event.
    Failed(ServeError),
}

/// Why a completed job stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// It generated `max_tokens` tokens.
    Length,
    /// A chat reply ended its turn with this id (spec §8.4), not emitted.
    EndOfTurn(u32),
    /// One of the request's stop ids, not emitted.
    StopId(u32),
    /// The output now ends with this stop string.
    StopString(String),
}

/// Token counts of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens a session already held (not prefilled).
    pub reused_prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// The end of a completed job.
#[derive(Debug, Clone)]
pub struct Done {
    pub finish: FinishReason,
    /// Text the reply reader held back at the end (an incomplete UTF-8 sequence, lossily).
    pub trailing_text: String,
    /// A chat reply's tool calls (arguments as JSON text, ids `call_<index>`); for a reply cut
    /// short, the calls completed so far.
    pub tool_calls: Vec<ToolCall>,
    /// Set when a chat reply broke the grammar of spec §8.4 (reported, never repaired).
    pub malformed: Option<Malformed>,
    /// Seconds between admission and the first step.
    pub queued_seconds: f64,
    /// The engine's report: timings, bytes read and avoided, drafts.
    pub summary: Summary,
}

impl Done {
    pub fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.summary.prompt_tokens,
            reused_prompt_tokens: self.summary.reused_tokens,
            completion_tokens: self.summary.generated_tokens,
        }
    }
}

/// The model's state.
#[derive(Debug, Clone)]
pub enum Health {
    /// Loading: resident bytes read of the total, rate and time left.
    Loading(LoadFigures),
    Ready,
    /// The model could not be loaded; nothing will be generated.
    Failed(Arc<EngineError>),
}

/// A submitted job, as its transport holds it.
pub struct JobHandle {
    pub id: u64,
    /// Prompt tokens after rendering and tokenising.
    pub prompt_tokens: usize,
    /// The job's events. Dropping it abandons the job.
    pub events: Events,
    admission: Arc<Admission>,
}

impl JobHandle {
    /// Cancels the job (see [`Core::cancel`]); its stream then ends with [`Event::Failed`].
    pub fn cancel(&self) {
        // A job that already ended is no longer known: nothing to cancel.
        let _ = self.admission.cancel(self.id, Canceller::Handle);
    }
}

/// A place held in the admission queue for one request, taken before the request is read or
/// tokenised ([`Core::reserve`]). Dropping it gives the place back.
pub struct Reservation {
    id: u64,
    /// The account the place is counted for.
    account: Caller,
    admission: Arc<Admission>,
    /// The job is in its place (nothing to give back).
    filled: bool,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.filled {
            self.admission.unreserve(self.id);
        }
    }
}

/// A reservation whose turn in the preparation pool has come ([`Core::turn`]): parse, render
/// and tokenise now, then [`Core::submit_turn`] or [`Core::count_tokens`]. Dropping it gives
/// back both the turn and the place.
pub struct Turn {
    reservation: Reservation,
    _turn: PrepTurn,
}

/// Everything [`Core::status`] reports.
#[derive(Debug, Clone)]
pub struct Status {
    /// Health, the loaded model, engine figures and the jobs queued, running and parked: one
    /// consistent copy.
    pub admission: AdmissionFigures,
    pub capacity: Capacity,
    pub limits: Limits,
    pub stall_timeout: Duration,
    pub sessions: SessionFigures,
    /// States kept for automatic prefix reuse.
    pub prefix: PrefixFigures,
    pub uptime: Duration,
}

/// What a metrics endpoint reads ([`Core::metrics`]).
#[derive(Debug, Clone)]
pub struct MetricsSnapshot {
    pub counters: Counters,
    pub active: usize,
    pub queue_depth: usize,
    /// Jobs parked because their reader stalled.
    pub parked: usize,
    pub timings: Timings,
    /// Engine figures: bytes read and avoided, cache hits and misses, forward passes, batched
    /// passes and the widest batch.
    pub engine: EngineStats,
    /// Kept prefix states on disk: files, hits, misses, evictions, writes.
    pub prefix_files: crate::session::KeptFigures,
}

/// How a [`Core`] is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// The checkpoint directory.
    pub model: PathBuf,
    /// Threads, prefill chunk and memory plan of the engine.
    pub engine: EngineOptions,
    pub capacity: Capacity,
    pub limits: Limits,
    /// Where sessions are saved and spilled.
    pub session_dir: PathBuf,
    /// In-memory session allowance in bytes; `None` = the memory plan's
    /// ([`crate::plan::Plan::session_allowance`]).
    pub session_bytes: Option<u64>,
    /// Sessions and bytes of session files one uid may have.
    pub session_quota: crate::session::store::Quota,
    pub log: Log,
    /// Told about every change of the model's state (load phases, ready, failed).
    pub on_health: OnHealth,
    /// How long a running job's reader may take nothing, while others wait for a compute
    /// slot, before the job gives its slot back (`--stall-timeout`; issue 35 point 4).
    pub stall_timeout: Duration,
}

/// Default `--stall-timeout`: long enough for a reader busy with something else for a
/// moment, short enough that others do not wait long behind one that stopped.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(10);

impl Config {
    /// Defaults: all cores, 4 active jobs batched together, 16 queued, no per-uid limits,
    /// quiet.
    pub fn new(model: PathBuf, session_dir: PathBuf) -> Config {
        Config {
            model,
            engine: EngineOptions::default(),
            capacity: Capacity {
                max_active: 4,
                max_batch: 4,
                max_queue: 16,
                per_uid: UidLimits::default(),
            },
            limits: Limits::default(),
            session_dir,
            session_bytes: None,
            session_quota: crate::session::store::Quota::default(),
            log: Log::QUIET,
            on_health: ignore_health,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
        }
    }
}

/// Why a core could not be set up (before anything is loaded).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Said once: the tokenizer's error is shown here and is not also the source.
    #[error("loading the tokenizer of {}: {error}", dir.display())]
    Tokenizer { dir: PathBuf, error: TokenizerError },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("starting the scheduler thread: {0}")]
    Thread(std::io::Error),
    #[error("the core was already started")]
    AlreadyStarted,
}

/// The serve core (see the module docs).
pub struct Core {
    admission: Arc<Admission>,
    /// Where requests are parsed, rendered and tokenised, a few at a time.
    prep: Arc<PrepPool>,
    sessions: Arc<Sessions>,
    prefix: Arc<PrefixCache>,
    files: Arc<PrefixFiles>,
    metrics: Arc<TimingTotals>,
    /// The model's tokenizer, loaded before anything else so prompts can be validated and
    /// tokenised while the model loads; the engine shares it.
    tokenizer: Arc<Tokenizer>,
    /// The vocabulary as constrained decoding sees it (built on first use).
    vocab: validate::VocabCache,
    model_limits: ModelLimits,
    limits: Limits,
    log: Log,
    on_health: OnHealth,
    stall_timeout: Duration,
    /// Taken by [`Core::start`].
    pending: Mutex<Option<(PathBuf, EngineOptions)>>,
    scheduler: Mutex<Option<JoinHandle<()>>>,
    started: Instant,
}

impl Core {
    /// Loads the tokenizer and reads the model's config (no thread yet: a caller may still
    /// bind sockets, which changes the process umask for an instant).
    pub fn new(config: Config) -> Result<Core, StartError> {
        let model_config = ModelConfig::from_file(&config.model.join("config.json"))?;
        // Refuses a tokenizer with ids the embedding has no row for before anything loads.
        let tokenizer =
            Tokenizer::load_for_vocab(&config.model, model_config.vocab_size).map_err(|error| {
                StartError::Tokenizer {
                    dir: config.model.clone(),
                    error,
                }
            })?;
        let tokenizer = Arc::new(tokenizer);
        let model_limits = ModelLimits {
            vocab_size: model_config.vocab_size,
            // Absent, the engine's absolute `max_tokens` limit bounds requests instead.
            context: model_config.max_position_embeddings.unwrap_or(usize::MAX),
        };
        let mut capacity = config.capacity;
        capacity.max_active = capacity.max_active.max(1);
        capacity.max_batch = capacity.max_batch.max(1);
        capacity.per_uid.max_active = capacity.per_uid.max_active.max(1);
        let sessions = Arc::new(Sessions::new(
            config.session_dir,
            config.session_bytes,
            config.session_quota,
            config.log,
        ));
        Ok(Core {
            admission: Arc::new(Admission::new(capacity)),
            prep: PrepPool::new(PREP_TURNS),
            files: Arc::new(PrefixFiles::new(Arc::clone(&sessions), config.log)),
            sessions,
            prefix: Arc::new(PrefixCache::default()),
            metrics: Arc::new(TimingTotals::default()),
            tokenizer,
            vocab: validate::VocabCache::default(),
            model_limits,
            limits: config.limits,
            log: config.log,
            on_health: config.on_health,
            stall_timeout: config.stall_timeout,
            pending: Mutex::new(Some((config.model, config.engine))),
            scheduler: Mutex::new(None),
            started: Instant::now(),
        })
    }

    /// Starts the scheduler thread, which loads the model and then runs jobs.
    pub fn start(&self) -> Result<(), StartError> {
        let (model, options) = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or(StartError::AlreadyStarted)?;
        let handle = scheduler::spawn(
            scheduler::Shared {
                admission: Arc::clone(&self.admission),
                sessions: Arc::clone(&self.sessions),
                prefix: Arc::clone(&self.prefix),
                files: Arc::clone(&self.files),
                metrics: Arc::clone(&self.metrics),
                log: self.log,
                on_health: self.on_health,
                stall_timeout: self.stall_timeout,
            },
            model,
            options,
            Arc::clone(&self.tokenizer),
        )
        .map_err(StartError::Thread)?;
        *self.scheduler.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        Ok(())
    }

    /// Validates `request` and queues it for `caller` (as its transport vouches for it: see
    /// [`Caller`]): [`Self::reserve`], [`Self::turn`] and [`Self::submit_turn`] in one, for a
    /// transport whose request is already in memory. Refusals are immediate and cost nothing.
    /// Blocks while waiting for a preparation turn.
    pub fn submit(&self, caller: Caller, request: Request) -> Result<JobHandle, ServeError> {
        let turn = self.turn(self.reserve(&caller)?);
        self.submit_turn(turn, caller, request)
    }

    /// Holds a place in the queue for one request of `caller`'s account
    /// ([`Caller::account`]: what limits and fair turns count), or refuses at once (not
    /// serving, the queue full, the account's `max_queued` reached: counted as rejected) — to
    /// be called before the request is read, parsed or tokenised, so that a refused request
    /// costs nothing and a flood of large bodies holds no memory (issue 35 point 2).
    pub fn reserve(&self, caller: &Caller) -> Result<Reservation, ServeError> {
        let id = self.admission.next_id();
        let account = caller.account();
        if let Err(e) = self.admission.reserve(id, account.clone()) {
            self.admission.refused();
            return Err(e);
        }
        Ok(Reservation {
            id,
            account,
            admission: Arc::clone(&self.admission),
            filled: false,
        })
    }

    /// Waits (blocking the calling thread) for a turn in the preparation pool: at most
    /// [`PREP_TURNS`] requests are parsed, rendered and tokenised at once, in turns fair
    /// across accounts ([`prep`]).
    pub fn turn(&self, reservation: Reservation) -> Turn {
        let turn = self.prep.enter(reservation.account.clone());
        Turn {
            reservation,
            _turn: turn,
        }
    }

    /// Validates (renders, tokenises) `request` of `caller` and queues it in its reserved
    /// place, then gives the turn back. The place stays counted for the account it was
    /// reserved for (a caller's account is known before its request is read: a key's scope,
    /// read from the body, narrows the caller, never its account). Refusals are counted as
    /// rejected.
    pub fn submit_turn(
        &self,
        turn: Turn,
        caller: Caller,
        request: Request,
    ) -> Result<JobHandle, ServeError> {
        let submitted = self.try_submit(turn.reservation, caller, request);
        if submitted.is_err() {
            self.admission.refused();
        }
        submitted
    }

    /// The number of prompt tokens `conversation` renders to as a chat request, within the
    /// same limits a request is held to (`max_prompt_tokens`, refused beyond it naming it):
    /// what `/v1/messages/count_tokens` answers. Nothing is queued; the place is given back.
    pub fn count_tokens(
        &self,
        turn: Turn,
        conversation: Conversation,
    ) -> Result<usize, ServeError> {
        let limit = self.limits.max_prompt_tokens;
        let rendered = validate::render_chat(&self.tokenizer, conversation, limit);
        drop(turn);
        match rendered? {
            Ok((ids, ..)) => Ok(ids.len()),
            Err(tokens) => Err(ServeError::Invalid(Invalid::PromptTooLong {
                tokens,
                limit,
            })),
        }
    }

    fn try_submit(
        &self,
        mut reservation: Reservation,
        caller: Caller,
        request: Request,
    ) -> Result<JobHandle, ServeError> {
        let id = reservation.id;
        let validated = validate::validate(
            &self.tokenizer,
            &self.vocab,
            self.model_limits,
            &self.limits,
            caller,
            request,
        )?;
        let lease = match &validated.session {
            Some(name) => {
                // A queued job whose reader is gone must not keep its session in use.
                self.admission.purge_abandoned();
                Some(self.sessions.lease(name, validated.caller.uid(), id)?)
            }
            None => None,
        };
        let weak = Arc::downgrade(&self.admission);
        let (sender, events) = events::channel(
            STREAM_BUFFER,
            Box::new(move || {
                if let Some(admission) = weak.upgrade() {
                    admission.purge_abandoned();
                }
            }),
        );
        let prompt_tokens = validated.request.prompt().len();
        self.log.info(format_args!(
            "request {id}: {} from {} ({prompt_tokens} prompt tokens, max {} new{})",
            match validated.kind {
                Kind::Text => "Generate",
                Kind::Chat { .. } => "Chat",
            },
            validated.caller,
            validated.request.get().max_tokens,
            validated
                .session
                .as_ref()
                .map_or_else(String::new, |n| format!(", session {n:?}"))
        ));
        let mut job = Job::new(
            id,
            validated.caller,
            validated.request,
            validated.kind,
            sender,
            lease,
        );
        job.reuse = validated.reuse.then(|| job.caller.clone());
        job.conversation = validated.conversation;
        // From here the place is the job's: filled, or taken away with the job's refusal.
        reservation.filled = true;
        if let Err(e) = self.admission.fill(job) {
            self.log.info(format_args!("request {id} refused: {e}"));
            return Err(e);
        }
        Ok(JobHandle {
            id,
            prompt_tokens,
            events,
            admission: Arc::clone(&self.admission),
        })
    }

    /// Cancels job `id` for caller `uid`: a queued job ends at once, a running one at its
    /// next layer boundary. Only the job's owner and root may ([`ServeError::NotYours`]);
    /// [`ServeError::UnknownRequest`] if it is neither queued nor running.
    pub fn cancel(&self, id: u64, uid: Option<u32>) -> Result<(), ServeError> {
        self.admission.cancel(id, Canceller::Uid(uid))
    }

    pub fn health(&self) -> Health {
        self.admission.health()
    }

    pub fn status(&self) -> Status {
        Status {
            admission: self.admission.snapshot(),
            capacity: self.admission.capacity,
            limits: self.limits,
            stall_timeout: self.stall_timeout,
            sessions: self.sessions.figures(),
            prefix: self.prefix.figures(),
            uptime: self.started.elapsed(),
        }
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        let snap = self.admission.snapshot();
        MetricsSnapshot {
            counters: snap.counters,
            active: snap.active,
            queue_depth: snap.queued,
            parked: snap.parked,
            timings: self.metrics.timings(),
            engine: snap.stats,
            prefix_files: self.files.figures(),
        }
    }

    /// The queued, running and parked jobs of `caller`'s account (what its limits count).
    pub fn uid_load(&self, caller: &Caller) -> UidLoad {
        self.admission.uid_load(&caller.account())
    }

    /// The session store (list, save, delete; may touch the disk).
    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// The model's tokenizer (tokenize and detokenize calls need no engine).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The model's context in positions (`max_position_embeddings`; `None` when its config
    /// does not say): prompt and reply together never exceed it.
    pub fn context_length(&self) -> Option<usize> {
        Some(self.model_limits.context).filter(|&c| c != usize::MAX)
    }

    /// Stops admitting: later submissions get [`ServeError::ShuttingDown`]; admitted jobs run.
    pub fn close(&self) {
        self.admission.close();
    }

    /// No job is queued or running.
    pub fn drained(&self) -> bool {
        self.admission.drained()
    }

    /// Cancels every admitted job (shutdown's grace ran out): queued ones end here, running
    /// ones at their next layer boundary, with [`ServeError::Shutdown`].
    pub fn stop_all(&self) {
        self.admission.stop_all();
    }

    /// Waits up to `limit` for the scheduler thread to end (after [`Self::close`] and the last
    /// job; it writes every session first). A thread still loading the model cannot be
    /// interrupted and is not waited for: it holds nothing that must be saved. True if the
    /// thread ended (or never started).
    pub fn join(&self, limit: Duration) -> bool {
        let mut slot = self.scheduler.lock().unwrap_or_else(|p| p.into_inner());
        let Some(handle) = slot.take() else {
            return true;
        };
        let deadline = Instant::now() + limit;
        while !handle.is_finished()
            && Instant::now() < deadline
            && !matches!(self.health(), Health::Loading { .. })
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        if !handle.is_finished() {
            *slot = Some(handle);
            return false;
        }
        if handle.join().is_err() {
            self.log
                .error(format_args!("the scheduler thread panicked"));
        }
        true
    }
}

/// A uid for the logs.
pub fn uid_text(uid: Option<u32>) -> String {
    uid.map_or_else(|| "unknown".to_string(), |u| u.to_string())
}
