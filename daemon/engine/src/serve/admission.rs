//! Admission: the one bounded queue between the transports and the scheduler thread, the
//! registry of running jobs that a cancel reaches, per-uid accounting, the model's state and the
//! counters status reports and metrics read.
//!
//! Everything sits behind one mutex taken only for short bookkeeping (never across compute),
//! so transports stay responsive while the engine steps (engine-lessons §9: a bounded queue
//! with an immediate refusal, the position reported while waiting). Jobs that leave the queue
//! without running (cancelled, abandoned, shut down, model failed) are dropped after the lock
//! is released: dropping a job releases its session lease and ends its event stream.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::events::EventSender;
use super::prefix::Caller;
use super::sessions::SessionLease;
use super::validate::Kind;
use super::{Event, Health, LoadFigures, QueueState, ServeError};
use crate::engine::{EngineError, EngineInfo, EngineStats, GenerateRequest};
use crate::tokenizer::chat::Conversation;

/// One admitted job on its way to (or in) the scheduler.
pub(crate) struct Job {
    pub id: u64,
    pub uid: Option<u32>,
    pub request: GenerateRequest,
    pub kind: Kind,
    pub events: EventSender,
    /// Set by a cancel; the engine's cancel check reads it between layers.
    pub cancel: Arc<AtomicBool>,
    /// The session the job continues and updates, leased for it at submission.
    pub lease: Option<SessionLease>,
    /// Whose kept states it may continue and adds to (without a session).
    pub reuse: Option<Caller>,
    /// A chat job's conversation, kept with `reuse` so its next turn can be warmed
    /// ([`super::prefix::next_turn`]).
    pub conversation: Option<Conversation>,
    pub admitted: Instant,
    /// Last queue position announced (0 = none yet).
    announced: u32,
}

impl Job {
    pub fn new(
        id: u64,
        uid: Option<u32>,
        request: GenerateRequest,
        kind: Kind,
        events: EventSender,
        lease: Option<SessionLease>,
    ) -> Job {
        Job {
            id,
            uid,
            request,
            kind,
            events,
            cancel: Arc::new(AtomicBool::new(false)),
            lease,
            reuse: None,
            conversation: None,
            admitted: Instant::now(),
            announced: 0,
        }
    }

    fn announce(&mut self, position: u32) {
        if position != self.announced {
            self.announced = position;
            self.events.offer(Event::Queued { position });
        }
    }
}

/// The service limits of admission and batching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Jobs computed at once (each holds its own state).
    pub max_active: usize,
    /// Jobs stepped together through one forward pass, at most.
    pub max_batch: usize,
    /// Jobs allowed to wait for a compute slot; beyond this, [`ServeError::Busy`].
    pub max_queue: usize,
}

/// Requests by how they ended.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// Admitted into the queue.
    pub admitted: u64,
    pub completed: u64,
    pub cancelled: u64,
    /// Ended by a failure of the model or of the session storage while it ran: the daemon's
    /// fault, never the request's.
    pub failed: u64,
    /// Refused, nothing computed: the queue was full, the request broke a rule, its session
    /// was refused, or k3d was not serving ([`ServeError::is_refusal`]); also one refused when
    /// it started (after admission).
    pub rejected: u64,
}

/// How a job ended, for the counters.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome {
    Completed,
    Cancelled,
    Failed,
    /// Refused when it started (a rule only the engine checks, a session refused).
    Refused,
}

impl Outcome {
    /// How a job that ended with `error` is counted.
    pub fn of(error: &ServeError) -> Outcome {
        if error.is_refusal() {
            Outcome::Refused
        } else {
            Outcome::Failed
        }
    }
}

/// Who asks [`Admission::cancel`] to cancel a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Canceller {
    /// The job's own [`super::JobHandle`]: its transport, acting for the owner.
    Handle,
    /// A caller naming the job by id, known by uid (`None`: unknown).
    Uid(Option<u32>),
}

impl Canceller {
    /// The owner and root may cancel a job; a caller of unknown uid may cancel nobody's, not
    /// even another unknown caller's (nothing says they are the same).
    fn may_cancel(self, owner: Option<u32>) -> bool {
        match self {
            Canceller::Handle => true,
            Canceller::Uid(Some(0)) => true,
            Canceller::Uid(Some(uid)) => owner == Some(uid),
            Canceller::Uid(None) => false,
        }
    }
}

/// One uid's jobs now (the fairness work reads it).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UidLoad {
    pub queued: usize,
    pub running: usize,
}

struct Running {
    cancel: Arc<AtomicBool>,
    uid: Option<u32>,
}

struct State {
    health: Health,
    accepting: bool,
    queue: VecDeque<Job>,
    running: HashMap<u64, Running>,
    per_uid: HashMap<Option<u32>, UidLoad>,
    counters: Counters,
    info: Option<EngineInfo>,
    stats: EngineStats,
}

impl State {
    fn load(&mut self, uid: Option<u32>) -> &mut UidLoad {
        self.per_uid.entry(uid).or_default()
    }

    /// Forget an idle uid, so the map holds only uids with work.
    fn tidy(&mut self, uid: Option<u32>) {
        if self.per_uid.get(&uid) == Some(&UidLoad::default()) {
            self.per_uid.remove(&uid);
        }
    }

    /// Remove queued job `index` (it will not run); counted as cancelled.
    fn unqueue(&mut self, index: usize) -> Option<Job> {
        let job = self.queue.remove(index)?;
        self.load(job.uid).queued -= 1;
        self.tidy(job.uid);
        self.counters.cancelled += 1;
        Some(job)
    }

    /// Queued jobs whose receiver was dropped leave the queue.
    fn purge_abandoned(&mut self) -> Vec<Job> {
        let mut gone = Vec::new();
        let mut i = 0;
        while i < self.queue.len() {
            if self.queue[i].events.is_abandoned() {
                gone.extend(self.unqueue(i));
            } else {
                i += 1;
            }
        }
        gone
    }
}

/// A consistent copy of the admission figures.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub health: Health,
    pub accepting: bool,
    pub info: Option<EngineInfo>,
    pub stats: EngineStats,
    pub active: usize,
    pub queued: usize,
    pub counters: Counters,
}

pub(crate) struct Admission {
    state: Mutex<State>,
    wake: Condvar,
    next_id: AtomicU64,
    /// Shutdown's grace is over: every job, queued or running, is cancelled.
    stop_all: AtomicBool,
    pub capacity: Capacity,
}

/// What the scheduler gets from [`Admission::take`].
pub(crate) struct Taken {
    pub jobs: Vec<Job>,
    /// Whose prefix states each job still queued after those taken continues (`None`: no
    /// automatic reuse): they wait for a compute slot.
    pub waiting: Vec<Option<Caller>>,
    /// No more work will ever come: the scheduler may exit once its active set is empty.
    pub closed: bool,
}

impl Admission {
    pub fn new(capacity: Capacity) -> Admission {
        Admission {
            state: Mutex::new(State {
                health: Health::Loading(LoadFigures::default()),
                accepting: true,
                queue: VecDeque::new(),
                running: HashMap::new(),
                per_uid: HashMap::new(),
                counters: Counters::default(),
                info: None,
                stats: EngineStats::default(),
            }),
            wake: Condvar::new(),
            next_id: AtomicU64::new(1),
            stop_all: AtomicBool::new(false),
            capacity,
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

    /// Refuses early what admission would refuse anyway (shutting down, model failed), before
    /// validation and session leasing do any work.
    pub fn check_open(&self) -> Result<(), ServeError> {
        let st = self.lock();
        if !st.accepting {
            return Err(ServeError::ShuttingDown);
        }
        if let Health::Failed(e) = &st.health {
            return Err(ServeError::ModelFailed(Arc::clone(e)));
        }
        Ok(())
    }

    /// Drops queued jobs whose receiver is gone (releasing their leases) and wakes the
    /// scheduler. Called when a receiver is dropped and before a session is leased.
    pub fn purge_abandoned(&self) {
        let gone = self.lock().purge_abandoned();
        self.wake.notify_all();
        drop(gone);
    }

    /// Queue a job or refuse it (the job, and so its lease, is dropped on refusal). On success
    /// the job's stream holds its Queued event (if it must wait) before the scheduler sees it.
    pub fn submit(&self, mut job: Job) -> Result<(), ServeError> {
        let mut st = self.lock();
        if !st.accepting {
            return Err(ServeError::ShuttingDown);
        }
        if let Health::Failed(e) = &st.health {
            return Err(ServeError::ModelFailed(Arc::clone(e)));
        }
        let gone = st.purge_abandoned();
        let position = self.position(&st, st.queue.len());
        if position as usize > self.capacity.max_queue {
            // Counted as a refusal by `Core::submit`, like every other refusal.
            let state = QueueState {
                running: st.running.len(),
                queued: st.queue.len(),
                max_queue: self.capacity.max_queue,
            };
            drop(st);
            drop(gone);
            return Err(ServeError::Busy(state));
        }
        if position > 0 {
            job.announce(position);
        }
        if let Health::Loading(figures) = st.health {
            job.events.offer(Event::Loading(figures));
        }
        st.load(job.uid).queued += 1;
        st.counters.admitted += 1;
        st.queue.push_back(job);
        drop(st);
        drop(gone);
        self.wake.notify_all();
        Ok(())
    }

    /// 1-based position of the job at queue index `index` among those that must wait for a
    /// compute slot, or 0 if it will start at once.
    fn position(&self, st: &State, index: usize) -> u32 {
        // While the model loads nothing runs, and the first `max_active` jobs start as soon as
        // it is ready: they wait for the load (their Loading events say so), not for a compute
        // slot, so they are not told a queue position ("position 1" with nothing running).
        let free = self.capacity.max_active.saturating_sub(st.running.len());
        u32::try_from((index + 1).saturating_sub(free)).unwrap_or(u32::MAX)
    }

    /// Scheduler side: hand over up to `free` queued jobs (registering them as running), and
    /// tell the rest their new positions. With `block`, wait until there is something to do.
    pub fn take(&self, free: usize, block: bool) -> Taken {
        let mut st = self.lock();
        while block && st.queue.is_empty() && st.accepting {
            st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        let gone = st.purge_abandoned();
        let mut jobs = Vec::new();
        while jobs.len() < free {
            let Some(job) = st.queue.pop_front() else {
                break;
            };
            let load = st.load(job.uid);
            load.queued -= 1;
            load.running += 1;
            st.running.insert(
                job.id,
                Running {
                    cancel: Arc::clone(&job.cancel),
                    uid: job.uid,
                },
            );
            jobs.push(job);
        }
        for index in 0..st.queue.len() {
            let position = self.position(&st, index);
            if let Some(job) = st.queue.get_mut(index) {
                job.announce(position);
            }
        }
        let closed = !st.accepting && st.queue.is_empty();
        let waiting = st.queue.iter().map(|j| j.reuse.clone()).collect();
        drop(st);
        drop(gone);
        Taken {
            jobs,
            waiting,
            closed,
        }
    }

    /// Scheduler side: nothing can make progress (every active reader's buffer is full); sleep
    /// until a new job, cancel or abandon arrives, or briefly so stalled streams are retried.
    pub fn idle(&self, timeout: Duration) {
        let st = self.lock();
        let _ = self.wake.wait_timeout(st, timeout);
    }

    /// A running job ended.
    pub fn finish(&self, id: u64, outcome: Outcome) {
        let mut st = self.lock();
        if let Some(r) = st.running.remove(&id) {
            st.load(r.uid).running -= 1;
            st.tidy(r.uid);
        }
        match outcome {
            Outcome::Completed => st.counters.completed += 1,
            Outcome::Cancelled => st.counters.cancelled += 1,
            Outcome::Failed => st.counters.failed += 1,
            Outcome::Refused => st.counters.rejected += 1,
        }
    }

    /// A submission was refused before it was queued.
    pub fn refused(&self) {
        self.lock().counters.rejected += 1;
    }

    /// A queued job leaves here and now (its lease released, its stream ended with
    /// [`ServeError::CancelledQueued`]); a running one is flagged and stops at the engine's
    /// next layer boundary. `by` is who asks: the job's own handle, or a caller by uid, who
    /// must be its owner or root ([`ServeError::NotYours`] otherwise).
    pub fn cancel(&self, id: u64, by: Canceller) -> Result<(), ServeError> {
        let mut st = self.lock();
        let owner = match st.queue.iter().find(|j| j.id == id) {
            Some(job) => Some(job.uid),
            None => st.running.get(&id).map(|r| r.uid),
        };
        if let Some(owner) = owner
            && !by.may_cancel(owner)
        {
            return Err(ServeError::NotYours(id));
        }
        if let Some(index) = st.queue.iter().position(|j| j.id == id) {
            let job = st.unqueue(index);
            drop(st);
            if let Some(job) = job {
                job.events
                    .send(Event::Failed(ServeError::CancelledQueued(id)));
            }
            self.wake.notify_all();
            return Ok(());
        }
        match st.running.get(&id) {
            Some(r) => {
                r.cancel.store(true, Ordering::Relaxed);
                drop(st);
                self.wake.notify_all();
                Ok(())
            }
            None => Err(ServeError::UnknownRequest(id)),
        }
    }

    /// True once shutdown's grace ran out: running jobs must stop.
    pub fn stopping_all(&self) -> bool {
        self.stop_all.load(Ordering::Relaxed)
    }

    /// False once shutdown began ([`Self::close`]).
    pub fn accepting(&self) -> bool {
        self.lock().accepting
    }

    /// Stop admitting; jobs already admitted still run.
    pub fn close(&self) {
        self.lock().accepting = false;
        self.wake.notify_all();
    }

    /// Cancel everything admitted (the end of the shutdown grace): queued jobs end here,
    /// running ones at their next layer boundary.
    pub fn stop_all(&self) {
        self.stop_all.store(true, Ordering::Relaxed);
        let dropped = self.drain_queue();
        for job in &dropped {
            job.events.send(Event::Failed(ServeError::Shutdown));
        }
        drop(dropped);
        self.wake.notify_all();
    }

    fn drain_queue(&self) -> Vec<Job> {
        let mut st = self.lock();
        let mut out = Vec::new();
        while let Some(job) = st.unqueue(0) {
            out.push(job);
        }
        out
    }

    /// No job queued or running.
    pub fn drained(&self) -> bool {
        let st = self.lock();
        st.queue.is_empty() && st.running.is_empty()
    }

    pub fn set_loading(&self, figures: LoadFigures) {
        let mut st = self.lock();
        st.health = Health::Loading(figures);
        for job in &st.queue {
            job.events.offer(Event::Loading(figures));
        }
    }

    pub fn set_ready(&self, info: EngineInfo, stats: EngineStats) {
        let mut st = self.lock();
        st.health = Health::Ready;
        st.info = Some(info);
        st.stats = stats;
        drop(st);
        self.wake.notify_all();
    }

    /// The model failed to load: every waiting job fails with the reason, and so will every
    /// later submission.
    pub fn set_failed(&self, error: EngineError) {
        let error = Arc::new(error);
        self.lock().health = Health::Failed(Arc::clone(&error));
        let dropped = self.drain_queue();
        for job in &dropped {
            job.events
                .send(Event::Failed(ServeError::ModelFailed(Arc::clone(&error))));
        }
        self.wake.notify_all();
    }

    pub fn publish_stats(&self, stats: EngineStats) {
        self.lock().stats = stats;
    }

    pub fn health(&self) -> Health {
        self.lock().health.clone()
    }

    pub fn uid_load(&self, uid: Option<u32>) -> UidLoad {
        self.lock().per_uid.get(&uid).copied().unwrap_or_default()
    }

    pub fn snapshot(&self) -> Snapshot {
        let st = self.lock();
        Snapshot {
            health: st.health.clone(),
            accepting: st.accepting,
            info: st.info.clone(),
            stats: st.stats,
            active: st.running.len(),
            queued: st.queue.len(),
            counters: st.counters,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::events::{Events, channel};

    fn job(id: u64) -> (Job, Events) {
        let (tx, rx) = channel(8, Box::new(|| {}));
        let request = GenerateRequest {
            prompt: vec![1, 2, 3],
            max_tokens: 4,
            ..GenerateRequest::default()
        };
        (Job::new(id, None, request, Kind::Text, tx, None), rx)
    }

    /// The events a job holds now, without waiting.
    fn held(rx: &Events) -> Vec<Event> {
        std::iter::from_fn(|| rx.recv_timeout(Duration::ZERO).ok().flatten()).collect()
    }

    fn positions(events: &[Event]) -> Vec<u32> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Queued { position } => Some(*position),
                _ => None,
            })
            .collect()
    }

    /// While the model loads, the jobs that will start once it is ready hear of the load and
    /// of no queue position; only those beyond `max_active` are told where they wait.
    #[test]
    fn jobs_within_the_compute_slots_get_no_queue_position_while_loading() {
        let admission = Admission::new(Capacity {
            max_active: 2,
            max_batch: 2,
            max_queue: 4,
        });
        admission.set_loading(LoadFigures::measure(
            1 << 20,
            4 << 20,
            Duration::from_secs(1),
        ));
        let jobs: Vec<Events> = (0..3)
            .map(|i| {
                let (j, rx) = job(i);
                admission.submit(j).expect("admitted");
                rx
            })
            .collect();
        for rx in &jobs[..2] {
            let events = held(rx);
            assert_eq!(positions(&events), Vec::<u32>::new(), "{events:?}");
            assert!(
                matches!(events.as_slice(), [Event::Loading(f)] if f.done == 1 << 20),
                "{events:?}"
            );
        }
        assert_eq!(
            positions(&held(&jobs[2])),
            vec![1],
            "the third waits for a slot"
        );
    }
}
