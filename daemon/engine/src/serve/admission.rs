//! Admission: the one bounded queue between the transports and the scheduler thread, the
//! registry of running jobs that a cancel reaches, per-uid accounting and fairness, the model's
//! state and the counters status reports and metrics read.
//!
//! The queue is kept in service order, fair across uids (issue 19 point 5): a job goes in by
//! its *round* (its uid's running jobs plus those it has queued), behind every job of a round
//! no higher, so uids take turns and one user's many requests cannot starve another's single
//! one; a uid's own jobs keep their order. Per-uid limits ([`UidLimits`]) bound how many of one
//! uid's jobs compute at once (the others wait while other uids' jobs start) and how many may
//! wait (beyond, [`ServeError::UidBusy`] at once). What is counted as one "uid" here is the
//! caller's account ([`Caller::account`], issue 35 point 5): a local account as the kernel
//! names it (a Unix peer, the owner of a loopback TCP socket), each API key of a keyed TCP
//! caller, and the callers nobody vouches for, together.
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
use crate::engine::{EngineError, EngineInfo, EngineStats, ValidRequest};
use crate::tokenizer::chat::Conversation;

/// One admitted job on its way to (or in) the scheduler.
pub(crate) struct Job {
    pub id: u64,
    /// Who sent it, as its transport vouches.
    pub caller: Caller,
    /// The caller's account ([`Caller::account`]): what limits and fair turns count.
    pub account: Caller,
    /// Validated once, at submission; the engine runs it as it is.
    pub request: ValidRequest,
    pub kind: Kind,
    pub events: EventSender,
    /// Set by a cancel; the engine's cancel check reads it between layers.
    pub cancel: Arc<AtomicBool>,
    /// The session the job continues and updates, leased for it at submission.
    pub lease: Option<SessionLease>,
    /// Whose kept states it may continue and adds to (without a session).
    pub reuse: Option<Caller>,
    /// With `reuse`, a chat's conversation, to warm its next turn ([`super::prefix::next_turn`]),
    /// and where its prelude ends ([`super::prefix::prelude_points`]).
    pub conversation: Option<(Conversation, Vec<usize>)>,
    pub admitted: Instant,
    /// Last queue position announced (0 = none yet).
    announced: u32,
}

impl Job {
    pub fn new(
        id: u64,
        caller: Caller,
        request: ValidRequest,
        kind: Kind,
        events: EventSender,
        lease: Option<SessionLease>,
    ) -> Job {
        Job {
            id,
            account: caller.account(),
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

/// A place in the queue: an admitted job, or the place reserved for one whose request is
/// still being read and tokenised ([`Admission::reserve`]: the limits are checked before any
/// of that work, so a refusal costs nothing and a flood holds no memory).
enum Entry {
    /// Boxed: a job is large beside the other entries, which the queue holds by value.
    Job(Box<Job>),
    Reserved {
        id: u64,
        account: Caller,
    },
    /// A parked job ([`Admission::park`]) whose reader reads again: it waits for a compute
    /// slot in turn like any job, and goes back into the batch as it was.
    Resume {
        id: u64,
        account: Caller,
    },
}

impl Entry {
    fn account(&self) -> &Caller {
        match self {
            Entry::Job(job) => &job.account,
            Entry::Reserved { account, .. } | Entry::Resume { account, .. } => account,
        }
    }

    fn job(&self) -> Option<&Job> {
        match self {
            Entry::Job(job) => Some(job),
            Entry::Reserved { .. } | Entry::Resume { .. } => None,
        }
    }

    /// Something to start: a job, or a parked job to resume (not a reserved place).
    fn startable(&self) -> bool {
        !matches!(self, Entry::Reserved { .. })
    }

    fn is_reserved(&self, id: u64) -> bool {
        matches!(self, Entry::Reserved { id: reserved, .. } if *reserved == id)
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

impl UidLimits {
    /// One user's default share of a daemon-wide limit: half of it (at least 1), so that one
    /// user never holds every compute slot or every place in the queue while another waits
    /// (issue 35 point 5). With `--max-active 1` the one slot is shared in time instead: a
    /// stalled reader gives it back.
    pub fn share_of(limit: usize) -> usize {
        (limit / 2).max(1)
    }
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
    /// Running jobs whose reader took nothing for the stall timeout while others waited:
    /// parked with their state, or (no room to keep it) cancelled — those are in `cancelled`
    /// too.
    pub stalled: u64,
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
    /// Parked: their reader stalled and their compute slot went to others.
    pub parked: usize,
}

struct Running {
    cancel: Arc<AtomicBool>,
    /// The owner's uid, for cancels.
    uid: Option<u32>,
    account: Caller,
}

struct State {
    health: Health,
    accepting: bool,
    queue: VecDeque<Entry>,
    running: HashMap<u64, Running>,
    /// Jobs parked by the scheduler (their readers stalled): no compute slot, their state
    /// kept; cancels reach them here.
    parked: HashMap<u64, Running>,
    /// By account ([`Caller::account`]).
    per_uid: HashMap<Caller, UidLoad>,
    counters: Counters,
    info: Option<EngineInfo>,
    stats: EngineStats,
}

impl State {
    fn load(&mut self, account: &Caller) -> &mut UidLoad {
        self.per_uid.entry(account.clone()).or_default()
    }

    fn running_of(&self, account: &Caller) -> usize {
        self.per_uid.get(account).map_or(0, |l| l.running)
    }

    /// The queue index where a new job of `uid` goes: before the first job whose round is
    /// higher than its own. A job's round is its uid's running jobs plus its uid's jobs queued
    /// ahead of it; the new job's, its uid's running plus queued jobs. So a newcomer with
    /// nothing running goes ahead of a heavy user's second job, uids alternate, and a uid's
    /// own jobs keep their order (each has a higher round than those it follows).
    fn fair_index(&self, account: &Caller) -> usize {
        let own = self
            .per_uid
            .get(account)
            .map_or(0, |l| l.running + l.queued);
        let mut rounds: HashMap<&Caller, usize> = HashMap::new();
        for (index, entry) in self.queue.iter().enumerate() {
            let round = rounds
                .entry(entry.account())
                .or_insert_with(|| self.running_of(entry.account()));
            if *round > own {
                return index;
            }
            *round += 1;
        }
        self.queue.len()
    }

    /// Forget an idle uid, so the map holds only uids with work.
    fn tidy(&mut self, account: &Caller) {
        if self.per_uid.get(account) == Some(&UidLoad::default()) {
            self.per_uid.remove(account);
        }
    }

    /// Remove queue entry `index`: a job (it will not run) is counted as cancelled, a
    /// reservation only gives its place back.
    fn unqueue(&mut self, index: usize) -> Option<Entry> {
        let entry = self.queue.remove(index)?;
        self.load(entry.account()).queued -= 1;
        self.tidy(entry.account());
        if let Entry::Job(_) = entry {
            self.counters.cancelled += 1;
        }
        Some(entry)
    }

    /// A queued job or a parked one to resume is there to start.
    fn has_startable(&self) -> bool {
        self.queue.iter().any(Entry::startable)
    }

    /// Queued jobs whose receiver was dropped leave the queue.
    fn purge_abandoned(&mut self) -> Vec<Job> {
        let mut gone = Vec::new();
        let mut i = 0;
        while i < self.queue.len() {
            if self.queue[i].job().is_some_and(|j| j.events.is_abandoned()) {
                if let Some(Entry::Job(mut job)) = self.unqueue(i) {
                    // The lease is released here, under the lock, not when `gone` is dropped
                    // after it: when the scheduler's take purges a job its reader just dropped,
                    // the reader's own purge finds nothing, and its next request on the same
                    // session must not find the session still in use (sessions never take this
                    // lock, so the order admission → sessions cannot deadlock).
                    drop(job.lease.take());
                    gone.push(*job);
                }
            } else {
                i += 1;
            }
        }
        gone
    }
}

/// A consistent copy of the admission figures: health, the loaded model, engine figures and
/// the jobs queued, running and parked ([`super::Status::admission`]).
#[derive(Debug, Clone)]
pub struct AdmissionFigures {
    pub health: Health,
    pub accepting: bool,
    pub info: Option<EngineInfo>,
    pub stats: EngineStats,
    pub active: usize,
    pub queued: usize,
    /// Parked jobs (stalled readers).
    pub parked: usize,
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
    /// Parked jobs to put back into the batch, by id (registered as running again).
    pub resumed: Vec<u64>,
    /// Whose prefix states each job still queued after those taken continues (`None`: no
    /// automatic reuse, or a parked job to resume): they wait for a compute slot. Reserved
    /// places are not among them.
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
                parked: HashMap::new(),
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

    /// Drops queued jobs whose receiver is gone (releasing their leases) and wakes the
    /// scheduler. Called when a receiver is dropped and before a session is leased.
    pub fn purge_abandoned(&self) {
        let gone = self.lock().purge_abandoned();
        self.wake.notify_all();
        drop(gone);
    }

    /// Holds a place for job `id` of `uid` at its fair place in the queue, or refuses at once
    /// (not serving, the queue full, the uid's share full) — before its request is read,
    /// parsed or tokenised, so a refused request costs nothing. The place counts as one of
    /// the uid's waiting jobs for every later refusal until [`Self::fill`] puts the job in it
    /// or [`Self::unreserve`] gives it back; it never starts by itself.
    pub fn reserve(&self, id: u64, account: Caller) -> Result<(), ServeError> {
        let mut st = self.lock();
        Self::serving(&st)?;
        let gone = st.purge_abandoned();
        let index = st.fair_index(&account);
        let entry = Entry::Reserved {
            id,
            account: account.clone(),
        };
        st.queue.insert(index, entry);
        st.load(&account).queued += 1;
        let refusal = self.over_limits(&st, &account);
        if refusal.is_some() {
            st.unqueue(index);
        }
        drop(st);
        drop(gone);
        refusal.map_or(Ok(()), Err)
    }

    /// Why nothing is admitted now, if so: shutdown began, or the model failed to load.
    fn serving(st: &State) -> Result<(), ServeError> {
        if !st.accepting {
            return Err(ServeError::ShuttingDown);
        }
        if let Health::Failed(e) = &st.health {
            return Err(ServeError::ModelFailed(Arc::clone(e)));
        }
        Ok(())
    }

    /// The refusal a queue holding a new entry of `account` calls for, counting every
    /// reserved place as a job (each will be one, or be given back): more waiting jobs than
    /// `max_queue`, or than the account's `max_queued`. If any of its account's jobs waits, so
    /// does the new one (it is behind them): it is among them.
    fn over_limits(&self, st: &State, account: &Caller) -> Option<ServeError> {
        let free = self.capacity.max_active.saturating_sub(st.running.len());
        let waiting: Vec<&Caller> = st
            .queue
            .iter()
            .zip(self.starters(st, free, true))
            .filter(|(_, starts)| !starts)
            .map(|(entry, _)| entry.account())
            .collect();
        let own_waiting = waiting.iter().filter(|a| **a == account).count();
        if own_waiting > self.capacity.per_uid.max_queued {
            Some(ServeError::UidBusy(UidQueueState {
                account: account.clone(),
                running: st.running_of(account),
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
        }
    }

    /// Puts `job` in the place reserved for it ([`Self::reserve`] with its id). Its stream
    /// then holds its Queued event (if it must wait) before the scheduler sees it, and every
    /// job it went ahead of is told its new position. Refused (the job, and so its lease,
    /// dropped) when shutdown began or the model failed meanwhile.
    pub fn fill(&self, job: Job) -> Result<(), ServeError> {
        let mut st = self.lock();
        let place = st.queue.iter().position(|e| e.is_reserved(job.id));
        let index = match (Self::serving(&st), place) {
            (Ok(()), Some(index)) => index,
            (refused, place) => {
                if let Some(index) = place {
                    st.unqueue(index);
                }
                drop(st);
                self.wake.notify_all();
                drop(job);
                // A place is only taken away by a shutdown or a failed load.
                return Err(refused.err().unwrap_or(ServeError::ShuttingDown));
            }
        };
        st.queue[index] = Entry::Job(Box::new(job));
        let positions = self.positions(&st);
        for (entry, position) in st.queue.iter_mut().zip(positions) {
            if let Entry::Job(job) = entry {
                job.announce(position);
            }
        }
        if let Health::Loading(figures) = st.health
            && let Some(job) = st.queue.get(index).and_then(Entry::job)
        {
            job.events.offer(Event::Loading(figures));
        }
        st.counters.admitted += 1;
        drop(st);
        self.wake.notify_all();
        Ok(())
    }

    /// Gives back the place reserved for `id` (its request was refused while being prepared,
    /// or its reader went away); nothing if it was filled or already taken away.
    pub fn unreserve(&self, id: u64) {
        let mut st = self.lock();
        if let Some(index) = st.queue.iter().position(|e| e.is_reserved(id)) {
            st.unqueue(index);
        }
        drop(st);
        self.wake.notify_all();
    }

    /// Queue a job at its fair place or refuse it: [`Self::reserve`] and [`Self::fill`] at
    /// once (the job, and so its lease, is dropped on refusal).
    #[cfg(test)]
    pub fn submit(&self, job: Job) -> Result<(), ServeError> {
        self.reserve(job.id, job.account.clone())?;
        self.fill(job)
    }

    /// Which queue entries a take with `free` compute slots starts: in queue order, each whose
    /// uid is below its active limit, counting those chosen before it. A reserved place has
    /// no job to start: `reserved_start` says whether it is counted as one that would (to
    /// refuse early what its job would make too many) or passed over (to take jobs now).
    fn starters(&self, st: &State, free: usize, reserved_start: bool) -> Vec<bool> {
        let mut active: HashMap<&Caller, usize> = HashMap::new();
        let mut free = free;
        st.queue
            .iter()
            .map(|entry| {
                if !reserved_start && !entry.startable() {
                    return false;
                }
                let active = active
                    .entry(entry.account())
                    .or_insert_with(|| st.running_of(entry.account()));
                let starts = free > 0 && *active < self.capacity.per_uid.max_active;
                if starts {
                    free -= 1;
                    *active += 1;
                }
                starts
            })
            .collect()
    }

    /// Each queue entry's 1-based position among the jobs that must wait for a compute slot
    /// (or for their uid's running jobs to finish), 0 for those that will start at once and
    /// for reserved places (they are told nothing).
    fn positions(&self, st: &State) -> Vec<u32> {
        // While the model loads nothing runs, and the first `max_active` jobs start as soon as
        // it is ready: they wait for the load (their Loading events say so), not for a compute
        // slot, so they are not told a queue position ("position 1" with nothing running).
        let free = self.capacity.max_active.saturating_sub(st.running.len());
        let mut waiting = 0u32;
        self.starters(st, free, false)
            .into_iter()
            .zip(&st.queue)
            .map(|(starts, entry)| {
                if starts || entry.job().is_none() {
                    0
                } else {
                    waiting = waiting.saturating_add(1);
                    waiting
                }
            })
            .collect()
    }

    /// Scheduler side: hand over up to `free` queued jobs in queue order, passing over those
    /// whose uid is at its active limit and reserved places (registering the jobs as running),
    /// and tell the rest their new positions. With `block`, wait until there is a job to take
    /// (with nothing running no uid is at its limit, so a queued job always gives one).
    pub fn take(&self, free: usize, block: bool) -> Taken {
        let mut st = self.lock();
        while block && !st.has_startable() && (st.accepting || !st.queue.is_empty()) {
            st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        let gone = st.purge_abandoned();
        let starts = self.starters(&st, free, false);
        let (taken, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut st.queue)
            .into_iter()
            .zip(starts)
            .partition(|(_, starts)| *starts);
        st.queue = kept.into_iter().map(|(entry, _)| entry).collect();
        let mut jobs = Vec::new();
        let mut resumed = Vec::new();
        for (entry, _) in taken {
            match entry {
                Entry::Job(job) => jobs.push(*job),
                Entry::Resume { id, account } => {
                    let load = st.load(&account);
                    load.queued -= 1;
                    load.parked -= 1;
                    load.running += 1;
                    if let Some(r) = st.parked.remove(&id) {
                        st.running.insert(id, r);
                    }
                    resumed.push(id);
                }
                Entry::Reserved { .. } => {}
            }
        }
        for job in &jobs {
            let load = st.load(&job.account);
            load.queued -= 1;
            load.running += 1;
            st.running.insert(
                job.id,
                Running {
                    cancel: Arc::clone(&job.cancel),
                    uid: job.caller.uid(),
                    account: job.account.clone(),
                },
            );
        }
        let positions = self.positions(&st);
        for (entry, position) in st.queue.iter_mut().zip(positions) {
            if let Entry::Job(job) = entry {
                job.announce(position);
            }
        }
        let closed = !st.accepting && st.queue.is_empty();
        // A reserved place asks for nothing yet (its request is still being read): warming
        // keeps its slot and no stalled job is parked for it until its job fills it.
        let waiting = st
            .queue
            .iter()
            .filter(|e| e.startable())
            .map(|e| e.job().and_then(|j| j.reuse.clone()))
            .collect();
        drop(st);
        drop(gone);
        Taken {
            jobs,
            resumed,
            waiting,
            closed,
        }
    }

    /// Scheduler side: running job `id`'s reader stalled and others wait, so it gives its
    /// compute slot back while its state is kept ([`Self::resume`] when its reader reads
    /// again; cancels still reach it).
    pub fn park(&self, id: u64) {
        let mut st = self.lock();
        if let Some(r) = st.running.remove(&id) {
            let load = st.load(&r.account);
            load.running -= 1;
            load.parked += 1;
            st.parked.insert(id, r);
            st.counters.stalled += 1;
        }
        drop(st);
        self.wake.notify_all();
    }

    /// Scheduler side: parked job `id`'s reader reads again; it waits for a compute slot at
    /// its fair place (never refused: it was admitted), then comes back in [`Taken::resumed`].
    pub fn resume(&self, id: u64) {
        let mut st = self.lock();
        let Some(account) = st.parked.get(&id).map(|r| r.account.clone()) else {
            return;
        };
        let index = st.fair_index(&account);
        st.load(&account).queued += 1;
        st.queue.insert(index, Entry::Resume { id, account });
        drop(st);
        self.wake.notify_all();
    }

    /// A running job stalled and could not be parked: cancelled (counted by [`Self::finish`]
    /// as such, and here as stalled).
    pub fn stalled(&self) {
        self.lock().counters.stalled += 1;
    }

    /// Scheduler side: nothing can make progress (every active reader's buffer is full); sleep
    /// until a new job, cancel or abandon arrives, or briefly so stalled streams are retried.
    pub fn idle(&self, timeout: Duration) {
        let st = self.lock();
        let _ = self.wake.wait_timeout(st, timeout);
    }

    /// A running (or parked) job ended.
    pub fn finish(&self, id: u64, outcome: JobEnd) {
        let mut st = self.lock();
        if let Some(r) = st.running.remove(&id) {
            st.load(&r.account).running -= 1;
            st.tidy(&r.account);
        } else if let Some(r) = st.parked.remove(&id) {
            // A parked job that ended (cancelled, abandoned, shut down) gives back its claim.
            if let Some(index) = st
                .queue
                .iter()
                .position(|e| matches!(e, Entry::Resume { id: r_id, .. } if *r_id == id))
            {
                st.queue.remove(index);
                st.load(&r.account).queued -= 1;
            }
            st.load(&r.account).parked -= 1;
            st.tidy(&r.account);
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
        let queued = st
            .queue
            .iter()
            .position(|e| e.job().is_some_and(|j| j.id == id));
        let owner = match queued {
            Some(index) => st.queue[index].job().map(|j| j.caller.uid()),
            None => st
                .running
                .get(&id)
                .or_else(|| st.parked.get(&id))
                .map(|r| r.uid),
        };
        if let Some(owner) = owner
            && !by.may_cancel(owner)
        {
            return Err(ServeError::NotYours(id));
        }
        if let Some(index) = queued {
            let job = st.unqueue(index);
            drop(st);
            if let Some(Entry::Job(job)) = job {
                job.events
                    .send(Event::Failed(ServeError::CancelledQueued(id)));
            }
            self.wake.notify_all();
            return Ok(());
        }
        match st.running.get(&id).or_else(|| st.parked.get(&id)) {
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

    /// Empties the queue: its jobs, to be told why; reserved places just go (their
    /// requests are refused when they try to fill them).
    fn drain_queue(&self) -> Vec<Job> {
        let mut st = self.lock();
        let mut out = Vec::new();
        while let Some(entry) = st.unqueue(0) {
            if let Entry::Job(job) = entry {
                out.push(*job);
            }
        }
        out
    }

    /// No job queued, running or parked.
    pub fn drained(&self) -> bool {
        let st = self.lock();
        st.queue.is_empty() && st.running.is_empty() && st.parked.is_empty()
    }

    pub fn set_loading(&self, figures: LoadFigures) {
        let mut st = self.lock();
        st.health = Health::Loading(figures);
        for job in st.queue.iter().filter_map(Entry::job) {
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

    pub fn uid_load(&self, account: &Caller) -> UidLoad {
        self.lock()
            .per_uid
            .get(account)
            .copied()
            .unwrap_or_default()
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
            parked: st.parked.len(),
            counters: st.counters,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::events::{Events, channel};

    fn job(id: u64) -> (Job, Events) {
        job_of(id, Caller::Unknown)
    }

    fn job_of(id: u64, caller: Caller) -> (Job, Events) {
        let (tx, rx) = channel(8, Box::new(|| {}));
        let request = crate::engine::GenerateRequest {
            prompt: vec![1, 2, 3],
            max_tokens: 4,
            ..crate::engine::GenerateRequest::default()
        }
        .validate(8)
        .expect("a valid request");
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
    fn admit(admission: &Admission, id: u64, caller: Caller) -> Events {
        let (j, rx) = job_of(id, caller);
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

    const A: Caller = Caller::Uid(1001);
    const B: Caller = Caller::Uid(1002);

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
        let _events: Vec<Events> = [
            (1, A),
            (2, A),
            (3, A),
            (4, B),
            (5, B),
            (6, B),
            (7, Caller::Unknown),
        ]
        .into_iter()
        .map(|(id, caller)| admit(&admission, id, caller))
        .collect();
        assert_eq!(service_order(&admission), vec![1, 4, 7, 2, 5, 3, 6]);
    }

    /// Issue 35 point 5: each API key is an account of its own and takes its own turn (TCP
    /// callers no longer share one); the names one key's callers give themselves do not give
    /// them more turns than the key has.
    #[test]
    fn each_key_takes_its_own_turn_and_its_scopes_share_it() {
        let admission = admission(1, UidLimits::default());
        let key = |key, scope: &str| Caller::Key {
            key,
            scope: Some(scope.into()),
        };
        let _events: Vec<Events> = [
            (1, key(0, "a")),
            (2, key(0, "b")),
            (3, key(0, "c")),
            (4, key(1, "a")),
            (5, Caller::Unknown),
        ]
        .into_iter()
        .map(|(id, caller)| admit(&admission, id, caller))
        .collect();
        assert_eq!(service_order(&admission), vec![1, 4, 5, 2, 3]);
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
            admission.uid_load(&A),
            UidLoad {
                queued: 1,
                running: 1,
                parked: 0
            }
        );
        admission.finish(1, JobEnd::Completed);
        assert_eq!(take_ids(&admission, 1), vec![2]);
    }

    /// One compute slot, one running and one waiting job per uid; A's job 1 running.
    fn one_of_a_running() -> (Admission, Events) {
        let admission = admission(
            1,
            UidLimits {
                max_active: 1,
                max_queued: 1,
            },
        );
        let a1 = admit(&admission, 1, A);
        assert_eq!(take_ids(&admission, 1), vec![1]);
        (admission, a1)
    }

    /// A uid with as many jobs waiting as it may is refused at once, the refusal naming the
    /// limit and its value; another uid is still admitted.
    #[test]
    fn a_uid_over_its_queue_limit_is_refused_naming_the_limit() {
        let (admission, _a1) = one_of_a_running();
        let _a2 = admit(&admission, 2, A);
        let (third, _rx) = job_of(3, A);
        let refused = admission.submit(third).expect_err("over the limit");
        let text = refused.to_string();
        assert!(
            matches!(
                refused,
                ServeError::UidBusy(UidQueueState {
                    account: A,
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
            admission.uid_load(&A),
            UidLoad {
                queued: 1,
                running: 1,
                parked: 0
            }
        );
        let _b = admit(&admission, 4, B);
    }

    /// Issue 35 point 2: a place is reserved, and refused beyond the uid's share, before the
    /// request is read; it starts nothing until its job fills it, and giving it back frees it.
    #[test]
    fn a_reserved_place_counts_against_the_limits_and_starts_only_once_filled() {
        let (admission, _a1) = one_of_a_running();
        admission.reserve(2, A).expect("one waiting place");
        assert!(
            matches!(admission.reserve(3, A), Err(ServeError::UidBusy(_))),
            "a second waiting place of the same uid"
        );
        admission.reserve(4, B).expect("another uid's place");
        admission.unreserve(2);
        admission.reserve(3, A).expect("the place came back");
        admission.finish(1, JobEnd::Completed);
        assert_eq!(
            take_ids(&admission, 1),
            Vec::<u64>::new(),
            "nothing to start"
        );
        let (job, _rx) = job_of(3, A);
        admission.fill(job).expect("filled");
        assert_eq!(take_ids(&admission, 1), vec![3]);
        admission.unreserve(4);
        assert_eq!(admission.snapshot().queued, 0);
        let (late, _rx) = job_of(4, B);
        assert!(
            matches!(admission.fill(late), Err(ServeError::ShuttingDown)),
            "a place given back cannot be filled"
        );
    }

    /// Issue 35 point 4: a parked job's slot goes to the one waiting; resumed, it waits its
    /// turn for a slot; a cancel still reaches it while parked.
    #[test]
    fn a_parked_job_gives_its_slot_back_and_resumes_in_turn() {
        let admission = admission(1, UidLimits::default());
        let _a = admit(&admission, 1, A);
        assert_eq!(take_ids(&admission, 1), vec![1]);
        let _b = admit(&admission, 2, B);
        admission.park(1);
        assert_eq!(take_ids(&admission, 1), vec![2], "the parked job's slot");
        admission.resume(1);
        assert!(
            admission.take(0, false).resumed.is_empty(),
            "B holds the slot"
        );
        admission.finish(2, JobEnd::Completed);
        assert_eq!(admission.take(1, false).resumed, vec![1]);
        admission.park(1);
        admission
            .cancel(1, Canceller::Uid(A.uid()))
            .expect("cancel reaches a parked job");
        admission.finish(1, JobEnd::Cancelled);
        assert!(admission.drained());
        let counters = admission.snapshot().counters;
        assert_eq!((counters.stalled, counters.cancelled), (2, 1));
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
