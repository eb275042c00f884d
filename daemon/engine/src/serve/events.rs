//! A job's event stream: a small bounded channel from the scheduler thread to whoever holds the
//! [`Events`] receiver — a blocking thread ([`Events::recv`]) or an async task
//! ([`Events::poll_recv`], std's `Waker` only, no runtime).
//!
//! Why not `std::sync::mpsc`: the scheduler must know, without blocking, whether a receiver has
//! room for a step's event (a slow reader is skipped for a round rather than stalling the
//! batch) and whether the receiver is gone (dropping [`Events`] abandons the job: a queued job
//! leaves the queue, a running one is cancelled at its next layer boundary). Neither question
//! can be asked of a std channel.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::Event;

struct MailboxState {
    queue: VecDeque<Event>,
    /// The receiver was dropped: the job is abandoned.
    abandoned: bool,
    /// The sender was dropped: no event follows those queued.
    ended: bool,
    waker: Option<Waker>,
}

struct Mailbox {
    state: Mutex<MailboxState>,
    ready: Condvar,
    capacity: usize,
    /// Called (outside the lock) when the receiver is dropped, so the scheduler wakes and
    /// notices the abandon at once (a queued job's session lease is released right then).
    on_abandon: Box<dyn Fn() + Send + Sync>,
}

impl Mailbox {
    /// The bookkeeping never panics while holding the lock; a poisoned lock is still
    /// consistent, so it is used as is.
    fn lock(&self) -> MutexGuard<'_, MailboxState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The scheduler's half (crate-internal): never blocks.
pub(crate) struct EventSender {
    channel: Arc<Mailbox>,
}

/// The receiving half of a job's events, held by the transport. Dropping it abandons the job.
///
/// Events arrive in order; the last one is [`Event::Done`] or [`Event::Failed`], after which
/// [`Events::recv`] returns `None`.
pub struct Events {
    channel: Arc<Mailbox>,
}

/// A channel holding at most `capacity` step events (advisory and final events may exceed it
/// by one, see [`EventSender::send`]).
pub(crate) fn channel(
    capacity: usize,
    on_abandon: Box<dyn Fn() + Send + Sync>,
) -> (EventSender, Events) {
    let channel = Arc::new(Mailbox {
        state: Mutex::new(MailboxState {
            queue: VecDeque::new(),
            abandoned: false,
            ended: false,
            waker: None,
        }),
        ready: Condvar::new(),
        capacity: capacity.max(1),
        on_abandon,
    });
    (
        EventSender {
            channel: Arc::clone(&channel),
        },
        Events { channel },
    )
}

/// Whether a job's receiver is gone, asked from the compute threads between layers.
pub(crate) struct AbandonProbe {
    channel: Arc<Mailbox>,
}

impl AbandonProbe {
    pub(crate) fn is_abandoned(&self) -> bool {
        self.channel.lock().abandoned
    }
}

impl EventSender {
    pub(crate) fn abandon_probe(&self) -> AbandonProbe {
        AbandonProbe {
            channel: Arc::clone(&self.channel),
        }
    }

    /// Room for one more step event.
    pub(crate) fn has_room(&self) -> bool {
        self.channel.lock().queue.len() < self.channel.capacity
    }

    /// The receiver is gone.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.channel.lock().abandoned
    }

    /// Queue an event whatever the buffer holds. The scheduler sends a step's event only when
    /// [`Self::has_room`] said so, and a job's final event once, so the buffer exceeds its
    /// capacity by at most one.
    pub(crate) fn send(&self, event: Event) {
        let waker = {
            let mut st = self.channel.lock();
            if st.abandoned {
                return;
            }
            st.queue.push_back(event);
            st.waker.take()
        };
        self.channel.ready.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Queue an advisory event (queue position, load progress) only if there is room: a slow
    /// reader may miss some, never blocks anyone.
    pub(crate) fn offer(&self, event: Event) {
        if self.has_room() {
            self.send(event);
        }
    }
}

impl Drop for EventSender {
    fn drop(&mut self) {
        let waker = {
            let mut st = self.channel.lock();
            st.ended = true;
            st.waker.take()
        };
        self.channel.ready.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl Events {
    /// The next event, waiting for it; `None` once the stream has ended.
    pub fn recv(&self) -> Option<Event> {
        let mut st = self.channel.lock();
        loop {
            if let Some(e) = st.queue.pop_front() {
                return Some(e);
            }
            if st.ended {
                return None;
            }
            st = self
                .channel
                .ready
                .wait(st)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Like [`Self::recv`], waiting at most `timeout`: `Err(())` if nothing came in time.
    #[allow(clippy::result_unit_err)]
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<Event>, ()> {
        let mut st = self.channel.lock();
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(e) = st.queue.pop_front() {
                return Ok(Some(e));
            }
            if st.ended {
                return Ok(None);
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(());
            }
            st = self
                .channel
                .ready
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The async form of [`Self::recv`]: `Ready(None)` once the stream has ended. Registers
    /// `cx`'s waker when nothing is queued (the `Stream::poll_next` contract).
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let mut st = self.channel.lock();
        if let Some(e) = st.queue.pop_front() {
            return Poll::Ready(Some(e));
        }
        if st.ended {
            return Poll::Ready(None);
        }
        st.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        {
            let mut st = self.channel.lock();
            st.abandoned = true;
            st.queue.clear();
        }
        (self.channel.on_abandon)();
    }
}
