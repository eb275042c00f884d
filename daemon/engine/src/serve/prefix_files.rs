//! Kept states that outlive the daemon (issue 42 point 2): the serve core's side of
//! [`crate::session::kept`].
//!
//! * **What is written**: a local account's ([`Caller::Uid`]) prelude states — what its next
//!   session shares with this one ([`super::prefix::prelude_points`]) — and the state its
//!   conversation's next turn continues from: the warmed next turn, or the end of the reply
//!   when there is nothing to warm or the warming is dropped. The other kept states serve retries within a turn and
//!   stay in memory. An API key's callers keep theirs in memory only: a key is known by its
//!   place in the key list, which a restart may give to another key. A caller nobody vouches
//!   for keeps nothing anywhere.
//! * **When**: queued once the reply has gone out, and written by a thread of its own
//!   ([`PrefixFiles::write`]), which takes the store's lock only to reserve and to commit,
//!   never while the bytes go out; the scheduler never waits for it. A queue of
//!   [`QUEUE`] states at most: a state that finds it full is not written, and the next turn
//!   that keeps it again tries again. At shutdown the queued writes complete
//!   ([`PrefixFiles::close`]) before the daemon exits.
//! * **Loading**: a request with reuse continues from the longer of the caller's best state
//!   in memory and its best on disk ([`PrefixFiles::find`]); one loaded from disk is kept in
//!   memory again, with the bits it was written with.

use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use super::caller::Caller;
use super::log::Log;
use super::prefix::PrefixCache;
use super::sessions::Sessions;
use crate::model::State;
use crate::session::{KeptFigures, Snapshot};

/// States waiting for the writer at most.
pub const QUEUE: usize = 4;

/// One state to write.
struct Pending {
    owner: u32,
    snapshot: Arc<Snapshot>,
    prelude: bool,
}

/// The writer of kept states and their loading (see the module docs).
pub struct PrefixFiles {
    sessions: Arc<Sessions>,
    log: Log,
    /// The writer's queue and thread, started by the first write.
    writer: Mutex<Option<(SyncSender<Pending>, JoinHandle<()>)>>,
}

impl PrefixFiles {
    pub(crate) fn new(sessions: Arc<Sessions>, log: Log) -> PrefixFiles {
        PrefixFiles {
            sessions,
            log,
            writer: Mutex::new(None),
        }
    }

    /// Queues `snapshot` — a prelude state if `prelude` — to be written for `caller`, if it is
    /// a local account (see the module docs).
    pub(crate) fn write(&self, caller: &Caller, snapshot: Arc<Snapshot>, prelude: bool) {
        let Caller::Uid(owner) = *caller else {
            return;
        };
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if writer.is_none() {
            let (sender, receiver) = sync_channel(QUEUE);
            let (sessions, log) = (Arc::clone(&self.sessions), self.log);
            match std::thread::Builder::new()
                .name("k3d-prefix-writer".into())
                .spawn(move || write_all(&sessions, log, receiver))
            {
                Ok(handle) => *writer = Some((sender, handle)),
                Err(e) => {
                    self.log.warn(format_args!(
                        "prefix cache: cannot start the writer of kept states: {e}"
                    ));
                    return;
                }
            }
        }
        let Some((sender, _)) = writer.as_ref() else {
            return;
        };
        let ids = snapshot.history.len();
        let pending = Pending {
            owner,
            snapshot,
            prelude,
        };
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = sender.try_send(pending)
        {
            self.log.info(format_args!(
                "prefix cache: the kept state of uid {owner} ({ids} ids) is not written: \
                 {QUEUE} states already wait for the disk"
            ));
        }
    }

    /// Completes the queued writes and ends the writer (shutdown).
    pub(crate) fn close(&self) {
        let taken = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((sender, handle)) = taken {
            drop(sender);
            if handle.join().is_err() {
                self.log
                    .error(format_args!("the writer of kept states panicked"));
            }
        }
    }

    /// The state `caller`'s `prompt` continues from: its best kept state in memory, or — for
    /// a local account — a longer one of its states on disk, which is then kept in memory
    /// again within `room` bytes. `None` for a fresh state.
    pub(crate) fn find(
        &self,
        cache: &PrefixCache,
        caller: &Caller,
        prompt: &[u32],
        room: u64,
    ) -> Option<State> {
        let memory = cache.find(caller, prompt);
        let Caller::Uid(owner) = *caller else {
            return memory;
        };
        let longer_than = memory.as_ref().map_or(0, State::positions);
        let started = Instant::now();
        let (loaded, damaged) = self
            .sessions
            .with_open(|s| s.load_kept(owner, prompt, longer_than))
            .unwrap_or_default();
        for e in damaged {
            self.log.warn(format_args!(
                "prefix cache: a damaged kept state was removed, not loaded: {e}"
            ));
        }
        let Some((snapshot, prelude)) = loaded else {
            return memory;
        };
        let ids = snapshot.history.len();
        self.log.info(format_args!(
            "prefix cache: {ids} prompt tokens of {caller} from a kept state on disk{}, \
             loaded in {:.3}s",
            if prelude { " (a prelude)" } else { "" },
            started.elapsed().as_secs_f64()
        ));
        let state = snapshot.state.clone();
        let lengths: &[usize] = if prelude { &[ids] } else { &[] };
        cache.keep(caller, vec![Arc::new(snapshot)], lengths, room);
        Some(state)
    }

    /// The kept states on disk (zero while the session directory is not open).
    pub fn figures(&self) -> KeptFigures {
        self.sessions
            .with_open(|s| s.kept_figures())
            .unwrap_or_default()
    }
}

/// The writer thread: each queued state reserved in its owner's allowance, written without
/// the store's lock, then committed; refusals and failures logged.
fn write_all(sessions: &Sessions, log: Log, queue: Receiver<Pending>) {
    for p in queue {
        let ids = p.snapshot.history.len();
        let what = if p.prelude { "prelude state" } else { "state" };
        let reserved = sessions.with_open(|s| s.reserve_kept(p.owner, &p.snapshot, p.prelude));
        let write = match reserved {
            Some(Ok(Some(write))) => write,
            Some(Ok(None)) | None => continue,
            Some(Err(e)) => {
                log.warn(format_args!(
                    "prefix cache: the kept {what} of uid {} ({ids} ids) is not written: {e}",
                    p.owner
                ));
                continue;
            }
        };
        let started = Instant::now();
        let written = write.write(&p.snapshot);
        sessions.with_open(|s| s.commit_kept(&write, &written));
        match written {
            Ok(bytes) => log.info(format_args!(
                "prefix cache: the kept {what} of uid {} ({ids} ids) written, {bytes} bytes \
                 in {:.3}s",
                p.owner,
                started.elapsed().as_secs_f64()
            )),
            Err(e) => log.warn(format_args!(
                "prefix cache: the kept {what} of uid {} ({ids} ids) could not be written: {e}",
                p.owner
            )),
        }
    }
}
