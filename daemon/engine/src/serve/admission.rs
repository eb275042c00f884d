//! Admission: the one bounded queue between the transports and the scheduler thread, the
//! registry of running jobs that a cancel reaches, per-uid accounting and fairness, the model's
//! state and the counters status reports and metrics read.
//!
//! The queue is kept in service order, fair across uids (issue 19 point 5): a job goes in by
//! its *round* (its uid's running jobs plus those it has queued), behind every job of a round
//! no higher, so uids take turns and one user's many requests cannot starve another's single
//! one; a uid's own jobs keep their order. Per-uid limits ([`UidLimits`]) bound how many of one
//! uid's jobs compute at once (the others wait while other uids' jobs start) and how many may
//! wait (beyond, [`ServeError::UidBusy`] at once). The uid is the transport's: peer credentials
//! on a Unix socket; callers whose uid is unknown — HTTP over TCP among them — share one turn.
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

use super::caller::Caller;
use super::events::EventSender;
use super::sessions::SessionLease;
use super::validate::Kind;
use super::{Event, Health, LoadFigures, QueueState, ServeError, UidQueueState};
use crate::engine::{EngineError, EngineInfo, EngineStats, GenerateRequest};
use crate::tokenizer::chat::Conversation;

/// One admitted job on its way to (or in) the scheduler.
pub(crate) struct Job {
    pub id: u64,
    /// Who sent it, as its transport vouches.
    pub caller: Caller,
    /// The caller's uid (`caller.uid()`), which limits and fairness count today.
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
        caller: Caller,
        request: GenerateRequest,
        kind: Kind,
        events: EventSender,
        lease: Option<SessionLease>,
    ) -> Job {
        Job {
            id,
            uid: caller.uid(),
            caller,
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
    /// The same limits for each uid.
    pub per_uid: UidLimits,
}

/// One uid's share of the [`Capacity`] (issue 19 point 5); the default limits nothing beyond
/// the machine's own limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidLimits {
    /// Jobs of one uid computed at once (at least 1); its others wait while other uids' jobs
    /// start.
    pub max_active: usize,
    /// Jobs of one uid allowed to wait for a compute slot; beyond this,
    /// [`ServeError::UidBusy`].
    pub max_queued: usize,
}

impl Default for UidLimits {
    fn default() -> UidLimits {
        UidLimits {
            max_active: usize::MAX,
            max_queued: usize::MAX,
        }
    }
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
pub(crate) enum JobEnd {
    Completed,
    Cancelled,
    Failed,
    /// Refused when it started (a rule only the engine checks, a session refused).
    Refused,
}

impl JobEnd {
    /// How a job that ended with `error` is counted.
    pub fn of(error: &ServeError) -> JobEnd {
        if error.is_refusal() {
            JobEnd::Refused
        } else {
            JobEnd::Failed
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

/// One uid's jobs now.
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

    fn running_of(&self, uid: Option<u32>) -> usize {
        self.per_uid.get(&uid).map_or(0, |l| l.running)
    }

    /// The queue index where a new job of `uid` goes: before the first job whose round is
    /// higher than its own. A job's round is its uid's running jobs plus its uid's jobs queued
    /// ahead of it; the new job's, its uid's running plus queued jobs. So a newcomer with
    /// nothing running goes ahead of a heavy user's second job, uids alternate, and a uid's
    /// own jobs keep their order (each has a higher round than those it follows).
    fn fair_index(&self, uid: Option<u32>) -> usize {
        let own = self.per_uid.get(&uid).map_or(0, |l| l.running + l.queued);
        let mut rounds: HashMap<Option<u32>, usize> = HashMap::new();
        for (index, job) in self.queue.iter().enumerate() {
            let round = rounds
                .entry(job.uid)
                .or_insert_with(|| self.running_of(job.uid));
            if *round > own {
                return index;
            }
            *round += 1;
        }
        self.queue.len()
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
                if let Some(mut job) = self.unqueue(i) {
                    // The lease is released here, under the lock, not when `gone` is dropped
                    // after it: when the scheduler's take purges a job its reader just dropped,
                    // the reader's own purge finds nothing, and its next request on the same
                    // session must not find the session still in use (sessions never take this
                    // lock, so the order admission → sessions cannot deadlock).
                    drop(job.lease.take());
                    gone.push(job);
                }
            } else {
                i += 1;
            }
        }
        gone
    }
}

/// A consistent copy of the admission figures.
#[derive(Debug, Clone)]
pub struct AdmissionFigures {
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

    /// Queue a job at its fair place or refuse it (the job, and so its lease, is dropped on
    /// refusal). On success the job's stream holds its Queued event (if it must wait) before
    /// the scheduler sees it, and every job it went ahead of is told its new position.
    pub fn submit(&self, job: Job) -> Result<(), ServeError> {
        let mut st = self.lock();
        if !st.accepting {
            return Err(ServeError::ShuttingDown);
        }
        if let Health::Failed(e) = &st.health {
            return Err(ServeError::ModelFailed(Arc::clone(e)));
        }
        let gone = st.purge_abandoned();
        let uid = job.uid;
        let index = st.fair_index(uid);
        st.queue.insert(index, job);
        st.load(uid).queued += 1;
        let positions = self.positions(&st);
        let waiting: Vec<Option<u32>> = st
            .queue
            .iter()
            .zip(&positions)
            .filter(|(_, position)| **position > 0)
            .map(|(job, _)| job.uid)
            .collect();
        let own_waiting = waiting.iter().filter(|u| **u == uid).count();
        // Counted as a refusal by `Core::submit`, like every other refusal. If any of its
        // uid's jobs waits, so does the new one (it is behind them): it is among them.
        let refusal = if own_waiting > self.capacity.per_uid.max_queued {
            Some(ServeError::UidBusy(UidQueueState {
                uid,
                running: st.running_of(uid),
                waiting: own_waiting.saturating_sub(1),
                max_active: self.capacity.per_uid.max_active,
                max_queued: self.capacity.per_uid.max_queued,
            }))
        } else if waiting.len() > self.capacity.max_queue {
            Some(ServeError::Busy(QueueState {
                running: st.running.len(),
                queued: st.queue.len() - 1,
                max_queue: self.capacity.max_queue,
            }))
        } else {
            None
        };
        if let Some(error) = refusal {
            let job = st.queue.remove(index);
            st.load(uid).queued -= 1;
            st.tidy(uid);
            drop(st);
            drop((gone, job));
            return Err(error);
        }
        for (job, position) in st.queue.iter_mut().zip(positions) {
            job.announce(position);
        }
        if let Health::Loading(figures) = st.health
            && let Some(job) = st.queue.get(index)
        {
            job.events.offer(Event::Loading(figures));
        }
        st.counters.admitted += 1;
        drop(st);
        drop(gone);
        self.wake.notify_all();
        Ok(())
    }

    /// Which queued jobs a take with `free` compute slots starts: in queue order, each whose
    /// uid is below its active limit, counting those chosen before it.
    fn starters(&self, st: &State, free: usize) -> Vec<bool> {
        let mut active: HashMap<Option<u32>, usize> = HashMap::new();
        let mut free = free;
        st.queue
            .iter()
            .map(|job| {
                let active = active
                    .entry(job.uid)
                    .or_insert_with(|| st.running_of(job.uid));
                let starts = free > 0 && *active < self.capacity.per_uid.max_active;
                if starts {
                    free -= 1;
                    *active += 1;
                }
                starts
            })
            .collect()
    }

    /// Each queued job's 1-based position among those that must wait for a compute slot (or
    /// for their uid's running jobs to finish), 0 for those that will start at once.
    fn positions(&self, st: &State) -> Vec<u32> {
        // While the model loads nothing runs, and the first `max_active` jobs start as soon as
        // it is ready: they wait for the load (their Loading events say so), not for a compute
        // slot, so they are not told a queue position ("position 1" with nothing running).
        let free = self.capacity.max_active.saturating_sub(st.running.len());
        let mut waiting = 0u32;
        self.starters(st, free)
            .into_iter()
            .map(|starts| {
                if starts {
                    0
                } else {
                    waiting = waiting.saturating_add(1);
                    waiting
                }
            })
            .collect()
    }

    /// Scheduler side: hand over up to `free` queued jobs in queue order, passing over those
    /// whose uid is at its active limit (registering them as running), and tell the rest their
    /// new positions. With `block`, wait until there is something to do (with nothing running
    /// no uid is at its limit, so a non-empty queue always gives a job).
    pub fn take(&self, free: usize, block: bool) -> Taken {
        let mut st = self.lock();
        while block && st.queue.is_empty() && st.accepting {
            st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        let gone = st.purge_abandoned();
        let starts = self.starters(&st, free);
        let (jobs, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut st.queue)
            .into_iter()
            .zip(starts)
            .partition(|(_, starts)| *starts);
        st.queue = kept.into_iter().map(|(job, _)| job).collect();
        let jobs: Vec<Job> = jobs.into_iter().map(|(job, _)| job).collect();
        for job in &jobs {
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
        }
        let positions = self.positions(&st);
        for (job, position) in st.queue.iter_mut().zip(positions) {
            job.announce(position);
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
    pub fn finish(&self, id: u64, outcome: JobEnd) {
        let mut st = self.lock();
        if let Some(r) = st.running.remove(&id) {
            st.load(r.uid).running -= 1;
            st.tidy(r.uid);
        }
        match outcome {
            JobEnd::Completed => st.counters.completed += 1,
            JobEnd::Cancelled => st.counters.cancelled += 1,
            JobEnd::Failed => st.counters.failed += 1,
            JobEnd::Refused => st.counters.rejected += 1,
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

    pub fn snapshot(&self) -> AdmissionFigures {
        let st = self.lock();
        AdmissionFigures {
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
        job_of(id, None)
    }

    fn job_of(id: u64, uid: Option<u32>) -> (Job, Events) {
        let (tx, rx) = channel(8, Box::new(|| {}));
        let request = GenerateRequest {
            prompt: vec![1, 2, 3],
            max_tokens: 4,
            ..GenerateRequest::default()
        };
        let caller = uid.map_or(Caller::Unknown, Caller::Uid);
        (Job::new(id, caller, request, Kind::Text, tx, None), rx)
    }

    fn admission(max_active: usize, per_uid: UidLimits) -> Admission {
        Admission::new(Capacity {
            max_active,
            max_batch: max_active,
            max_queue: 8,
            per_uid,
        })
    }

    /// Submits job `id` of `uid`, which must be admitted; its events (dropping them abandons
    /// the job).
    fn admit(admission: &Admission, id: u64, uid: Option<u32>) -> Events {
        let (j, rx) = job_of(id, uid);
        admission.submit(j).expect("admitted");
        rx
    }

    /// The ids of the jobs a take with `free` slots starts.
    fn take_ids(admission: &Admission, free: usize) -> Vec<u64> {
        admission
            .take(free, false)
            .jobs
            .iter()
            .map(|j| j.id)
            .collect()
    }

    /// The order one compute slot serves the queue in: each job taken alone, then finished.
    fn service_order(admission: &Admission) -> Vec<u64> {
        std::iter::from_fn(|| {
            let id = *take_ids(admission, 1).first()?;
            admission.finish(id, JobEnd::Completed);
            Some(id)
        })
        .collect()
    }

    const A: Option<u32> = Some(1001);
    const B: Option<u32> = Some(1002);

    /// Issue 19 point 5: a user's single request goes ahead of another's many queued ones,
    /// and the jobs it went ahead of are told their new places.
    #[test]
    fn a_newcomer_goes_ahead_of_a_heavy_users_queued_jobs() {
        let admission = admission(1, UidLimits::default());
        let a: Vec<Events> = (1..=4).map(|id| admit(&admission, id, A)).collect();
        assert_eq!(take_ids(&admission, 1), vec![1]);
        let b = admit(&admission, 5, B);
        assert_eq!(positions(&held(&b)), vec![1], "first in line");
        assert_eq!(positions(&held(&a[1])), vec![1, 2], "moved back one");
        assert_eq!(positions(&held(&a[3])), vec![3, 4]);
        admission.finish(1, JobEnd::Completed);
        assert_eq!(service_order(&admission), vec![5, 2, 3, 4]);
    }

    /// Uids take turns, each one's jobs in their order; callers of unknown uid (HTTP over
    /// TCP among them) share one turn.
    #[test]
    fn uids_take_turns_in_the_queue() {
        let admission = admission(1, UidLimits::default());
        let _events: Vec<Events> = [(1, A), (2, A), (3, A), (4, B), (5, B), (6, B), (7, None)]
            .into_iter()
            .map(|(id, uid)| admit(&admission, id, uid))
            .collect();
        assert_eq!(service_order(&admission), vec![1, 4, 7, 2, 5, 3, 6]);
    }

    /// A uid at its active limit leaves its queued jobs waiting, told their position, while
    /// another uid's job takes the free slot.
    #[test]
    fn a_uid_at_its_active_limit_waits_while_others_start() {
        let admission = admission(
            2,
            UidLimits {
                max_active: 1,
                ..UidLimits::default()
            },
        );
        let _a1 = admit(&admission, 1, A);
        let a2 = admit(&admission, 2, A);
        assert_eq!(take_ids(&admission, 2), vec![1], "one of A's at a time");
        assert_eq!(positions(&held(&a2)), vec![1]);
        let b = admit(&admission, 3, B);
        assert_eq!(positions(&held(&b)), Vec::<u32>::new(), "starts at once");
        assert_eq!(take_ids(&admission, 1), vec![3]);
        assert_eq!(
            admission.uid_load(A),
            UidLoad {
                queued: 1,
                running: 1
            }
        );
        admission.finish(1, JobEnd::Completed);
        assert_eq!(take_ids(&admission, 1), vec![2]);
    }

    /// A uid with as many jobs waiting as it may is refused at once, the refusal naming the
    /// limit and its value; another uid is still admitted.
    #[test]
    fn a_uid_over_its_queue_limit_is_refused_naming_the_limit() {
        let admission = admission(
            1,
            UidLimits {
                max_active: 1,
                max_queued: 1,
            },
        );
        let _a1 = admit(&admission, 1, A);
        assert_eq!(take_ids(&admission, 1), vec![1]);
        let _a2 = admit(&admission, 2, A);
        let (third, _rx) = job_of(3, A);
        let refused = admission.submit(third).expect_err("over the limit");
        let text = refused.to_string();
        assert!(
            matches!(
                refused,
                ServeError::UidBusy(UidQueueState {
                    uid: A,
                    running: 1,
                    waiting: 1,
                    max_queued: 1,
                    ..
                })
            ),
            "{refused:?}"
        );
        assert!(
            text.contains("uid 1001") && text.contains("--max-queued-per-uid 1"),
            "{text}"
        );
        assert!(text.contains("--max-active-per-uid 1"), "{text}");
        assert_eq!(
            admission.uid_load(A),
            UidLoad {
                queued: 1,
                running: 1
            }
        );
        let _b = admit(&admission, 4, B);
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
            per_uid: UidLimits::default(),
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
