//! Admission: the bounded queue between the RPC layer (tokio) and the scheduler thread, the
//! registry of running requests that `Cancel` reaches, and the figures `Status` reports.
//!
//! Everything here sits behind one mutex taken only for short bookkeeping (never across
//! compute), so RPC handlers stay responsive while the engine steps (engine-lessons §9:
//! bounded queue with immediate RESOURCE_EXHAUSTED, position reported while waiting).

use k3_engine::engine::{EngineInfo, EngineStats, GenerateRequest};
use k3proto::v1 as pb;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tonic::Status;

/// The stream half the scheduler writes a request's events into.
pub type EventTx = mpsc::Sender<Result<pb::Event, Status>>;

/// How generated ids are labelled for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `Generate`: plain continuation.
    Text,
    /// `Chat`: reasoning/response channels; `thinking` says which channel the reply opens in.
    Chat { thinking: bool },
}

/// One admitted request on its way to (or in) the scheduler.
pub struct Job {
    pub id: u64,
    pub request: GenerateRequest,
    pub kind: Kind,
    pub tx: EventTx,
    /// Set by `Cancel`; the engine's cancel closure reads it between layers.
    pub cancel: Arc<AtomicBool>,
    /// Peer uid from SO_PEERCRED, for the logs.
    pub uid: Option<u32>,
    /// The session the request continues and updates, already reserved for it.
    pub session: Option<String>,
    pub admitted: Instant,
    /// Last queue position announced to the client (0 = none yet).
    announced: u32,
}

impl Job {
    pub fn new(
        id: u64,
        request: GenerateRequest,
        kind: Kind,
        tx: EventTx,
        uid: Option<u32>,
    ) -> Job {
        Job {
            id,
            request,
            kind,
            tx,
            cancel: Arc::new(AtomicBool::new(false)),
            uid,
            session: None,
            admitted: Instant::now(),
            announced: 0,
        }
    }

    /// Send an event without ever blocking the caller: events that carry state (Done, errors)
    /// are sent by the scheduler only when the channel has room (see `scheduler.rs`); advisory
    /// ones (Queued, load Progress) may be dropped when a slow client has a full buffer.
    pub fn offer(&self, event: pb::event::Event) {
        let _ = self.tx.try_send(Ok(pb::Event { event: Some(event) }));
    }

    fn announce(&mut self, position: u32) {
        if position != self.announced {
            self.announced = position;
            self.offer(pb::event::Event::Queued(pb::Queued { position }));
        }
    }
}

/// What the daemon is doing as a whole.
#[derive(Debug, Clone)]
pub enum Phase {
    Loading {
        done: u64,
        total: u64,
    },
    Ready,
    /// The model failed to load; the daemon keeps answering Status with this message.
    Failed(String),
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    pub completed: u64,
    pub cancelled: u64,
    pub failed: u64,
    pub rejected: u64,
}

/// How a request left the scheduler, for the counters.
#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    Completed,
    Cancelled,
    Failed,
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Requests computed at once (each holds its own state).
    pub max_active: usize,
    /// Requests stepped together through one forward pass, at most (`--max-batch`).
    pub max_batch: usize,
    /// Requests allowed to wait for a compute slot; beyond this, RESOURCE_EXHAUSTED.
    pub max_queue: usize,
}

/// A consistent copy of everything Status shows.
pub struct Snapshot {
    pub phase: Phase,
    pub accepting: bool,
    pub info: Option<EngineInfo>,
    pub stats: EngineStats,
    pub active: usize,
    pub queued: usize,
    pub counters: Counters,
}

struct State {
    phase: Phase,
    accepting: bool,
    queue: VecDeque<Job>,
    running: HashMap<u64, Arc<AtomicBool>>,
    counters: Counters,
    info: Option<EngineInfo>,
    stats: EngineStats,
}

pub struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    next_id: AtomicU64,
    /// Shutdown grace is over: every request, queued or running, is cancelled.
    stop_all: AtomicBool,
    pub limits: Limits,
    pub started: Instant,
}

/// What the scheduler gets from `Shared::take`.
pub struct Taken {
    pub jobs: Vec<Job>,
    /// No more work will ever come: the scheduler may exit once its active set is empty.
    pub closed: bool,
}

impl Shared {
    pub fn new(limits: Limits) -> Shared {
        Shared {
            state: Mutex::new(State {
                phase: Phase::Loading { done: 0, total: 0 },
                accepting: true,
                queue: VecDeque::new(),
                running: HashMap::new(),
                counters: Counters::default(),
                info: None,
                stats: EngineStats::default(),
            }),
            wake: Condvar::new(),
            next_id: AtomicU64::new(1),
            stop_all: AtomicBool::new(false),
            limits,
            started: Instant::now(),
        }
    }

    /// The bookkeeping never panics while holding the lock, but if some thread did, the state
    /// is still consistent field by field: keep serving rather than cascade the panic.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Queue a request or refuse it with the status the client gets. On success the job's
    /// stream has its Queued event (if it has to wait) before the scheduler can see it.
    pub fn submit(&self, mut job: Job) -> Result<(), Status> {
        let mut st = self.lock();
        if !st.accepting {
            return Err(Status::unavailable(
                "k3d is shutting down and accepts no new requests",
            ));
        }
        if let Phase::Failed(msg) = &st.phase {
            return Err(Status::unavailable(format!(
                "the model failed to load, so k3d cannot generate: {msg}"
            )));
        }
        purge_abandoned(&mut st);
        let position = self.position(&st, st.queue.len());
        if position as usize > self.limits.max_queue {
            st.counters.rejected += 1;
            return Err(Status::resource_exhausted(format!(
                "k3d is busy: {} requests running and {} waiting (--max-queue {}); retry when one finishes",
                st.running.len(),
                st.queue.len(),
                self.limits.max_queue
            )));
        }
        if position > 0 {
            job.announce(position);
        }
        if let Phase::Loading { done, total } = st.phase {
            job.offer(load_progress(done, total));
        }
        st.queue.push_back(job);
        drop(st);
        self.wake.notify_all();
        Ok(())
    }

    /// 1-based position of the job at queue index `index` among those that must wait for a
    /// compute slot, or 0 if it will get one at once (while the model loads, a request that
    /// will start as soon as it is loaded waits for the load, which it is told about, not for
    /// a slot).
    fn position(&self, st: &State, index: usize) -> u32 {
        let free = match st.phase {
            Phase::Ready | Phase::Loading { .. } => {
                self.limits.max_active.saturating_sub(st.running.len())
            }
            Phase::Failed(_) => 0,
        };
        u32::try_from((index + 1).saturating_sub(free)).unwrap_or(u32::MAX)
    }

    /// Scheduler side: hand over up to `free` queued jobs (registering them as running), and
    /// tell the rest their new positions. With `block`, wait until there is something to do.
    pub fn take(&self, free: usize, block: bool) -> Taken {
        let mut st = self.lock();
        while block && st.queue.is_empty() && st.accepting {
            st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        purge_abandoned(&mut st);
        let mut jobs = Vec::new();
        while jobs.len() < free {
            let Some(job) = st.queue.pop_front() else {
                break;
            };
            st.running.insert(job.id, Arc::clone(&job.cancel));
            jobs.push(job);
        }
        for index in 0..st.queue.len() {
            let position = self.position(&st, index);
            if let Some(job) = st.queue.get_mut(index) {
                job.announce(position);
            }
        }
        Taken {
            jobs,
            closed: !st.accepting && st.queue.is_empty(),
        }
    }

    /// Scheduler side: nothing can make progress (every active client's buffer is full); sleep
    /// until a new request or cancel arrives, or briefly so stalled streams are retried.
    pub fn idle(&self, timeout: Duration) {
        let st = self.lock();
        let _ = self.wake.wait_timeout(st, timeout);
    }

    pub fn finish(&self, id: u64, outcome: Outcome) {
        let mut st = self.lock();
        st.running.remove(&id);
        match outcome {
            Outcome::Completed => st.counters.completed += 1,
            Outcome::Cancelled => st.counters.cancelled += 1,
            Outcome::Failed => st.counters.failed += 1,
        }
    }

    /// `Cancel`: a queued request is dropped here and now; a running one is flagged and stops
    /// at the engine's next layer boundary. False if the id is neither queued nor running.
    pub fn cancel(&self, id: u64) -> bool {
        let mut st = self.lock();
        if let Some(index) = st.queue.iter().position(|j| j.id == id) {
            if let Some(job) = st.queue.remove(index) {
                let _ = job.tx.try_send(Err(Status::cancelled(format!(
                    "request {id} cancelled before it started"
                ))));
                st.counters.cancelled += 1;
            }
            drop(st);
            self.wake.notify_all();
            return true;
        }
        match st.running.get(&id) {
            Some(flag) => {
                flag.store(true, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// True once shutdown's grace ran out: running requests must stop.
    pub fn stopping_all(&self) -> bool {
        self.stop_all.load(Ordering::Relaxed)
    }

    /// Stop admitting; requests already admitted still run.
    pub fn close(&self) {
        self.lock().accepting = false;
        self.wake.notify_all();
    }

    /// Cancel everything admitted (the end of the shutdown grace): queued requests end here,
    /// running ones at their next layer boundary.
    pub fn stop_all(&self) {
        self.stop_all.store(true, Ordering::Relaxed);
        let mut st = self.lock();
        let dropped: Vec<Job> = st.queue.drain(..).collect();
        st.counters.cancelled += dropped.len() as u64;
        drop(st);
        for job in &dropped {
            let _ = job.tx.try_send(Err(shutdown_status()));
        }
        self.wake.notify_all();
    }

    /// No request queued or running.
    pub fn drained(&self) -> bool {
        let st = self.lock();
        st.queue.is_empty() && st.running.is_empty()
    }

    pub fn set_loading(&self, done: u64, total: u64) {
        let mut st = self.lock();
        st.phase = Phase::Loading { done, total };
        for job in &st.queue {
            job.offer(load_progress(done, total));
        }
    }

    pub fn set_ready(&self, info: EngineInfo, stats: EngineStats) {
        let mut st = self.lock();
        st.phase = Phase::Ready;
        st.info = Some(info);
        st.stats = stats;
        drop(st);
        self.wake.notify_all();
    }

    /// The model failed to load: every waiting request fails with the reason, and so will
    /// every later one.
    pub fn set_failed(&self, message: String) {
        let mut st = self.lock();
        for job in st.queue.drain(..) {
            let _ = job.tx.try_send(Err(Status::unavailable(format!(
                "the model failed to load: {message}"
            ))));
        }
        st.phase = Phase::Failed(message);
    }

    pub fn publish_stats(&self, stats: EngineStats) {
        self.lock().stats = stats;
    }

    pub fn snapshot(&self) -> Snapshot {
        let st = self.lock();
        Snapshot {
            phase: st.phase.clone(),
            accepting: st.accepting,
            info: st.info.clone(),
            stats: st.stats,
            active: st.running.len(),
            queued: st.queue.len(),
            counters: st.counters,
        }
    }
}

pub fn shutdown_status() -> Status {
    Status::cancelled("k3d is shutting down: the request was cancelled after the grace period")
}

fn load_progress(done: u64, total: u64) -> pb::event::Event {
    pb::event::Event::Progress(pb::Progress {
        phase: pb::Phase::Load.into(),
        done,
        total,
    })
}

/// Queued requests whose client went away leave the queue (and count as cancelled).
fn purge_abandoned(st: &mut State) {
    let before = st.queue.len();
    st.queue.retain(|j| !j.tx.is_closed());
    st.counters.cancelled += (before - st.queue.len()) as u64;
}
