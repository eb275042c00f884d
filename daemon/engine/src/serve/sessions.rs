//! The serve core's sessions: the library's [`SessionStore`] behind a mutex, opened once the
//! model (and so its fingerprint) is known, and the [`SessionLease`] a job holds on the session
//! it continues.
//!
//! A lease is taken at submission ([`Sessions::lease`]: another uid's session, or one in use,
//! is refused there and then) and owned by the job. It is released exactly once, by whoever
//! ends the job: [`SessionLease::finish`] with the job's snapshots when it completes, or its
//! `Drop` — cancelled, abandoned while queued, refused at start, failed, dropped at shutdown —
//! which releases the session unchanged. No path can forget it, and none can release twice.
//!
//! File I/O happens under the mutex (spilling, loading, saving); async callers run these
//! methods off their reactor threads.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::ServeError;
use super::log::Log;
use crate::model::State;
use crate::session::store::{Dropped, Quota, Saved, SessionKey};
use crate::session::{Access, FileError, SessionInfo, SessionStore, SessionStoreError, Snapshot};

enum Phase {
    /// The model is loading; the fingerprint files are checked against is not known yet.
    Waiting,
    Open(SessionStore),
    /// The session directory could not be opened.
    Failed(String),
}

/// Figures for a status report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionFigures {
    pub count: usize,
    /// Sessions a request holds now: 0 on an idle daemon, whatever ended its requests
    /// (completion, cancel, a dropped client; issue #19 point 4).
    pub leased: usize,
    pub memory_bytes: u64,
    pub allowance_bytes: u64,
    pub dir: PathBuf,
    /// Why sessions are unavailable, if they are.
    pub error: Option<String>,
}

pub struct Sessions {
    dir: PathBuf,
    /// `None`: the memory plan's, decided when the model is loaded (see `open`).
    allowance: Option<u64>,
    quota: Quota,
    phase: Mutex<Phase>,
    /// The sessions shutdown could not write ([`Sessions::save_all`]).
    lost: Mutex<Vec<String>>,
    log: Log,
}

/// A job's hold on its session: released exactly once (see the module docs).
pub struct SessionLease {
    sessions: Arc<Sessions>,
    key: SessionKey,
    released: bool,
}

impl SessionLease {
    /// The session's name in its owner's namespace.
    pub fn name(&self) -> &str {
        &self.key.name
    }

    /// The job completed: keep `snapshots` as the session's newest states and release it.
    /// `Err` (the storage failure, naming the session) when the session had to leave memory
    /// for the allowance and could not be written, so the turn's state is not kept: its client
    /// must be told (issue 45 point 3: such a turn reported success and the session was gone).
    pub fn finish(mut self, snapshots: Vec<Snapshot>) -> Result<(), ServeError> {
        self.released = true;
        self.sessions.finish(&self.key, snapshots)
    }

    /// [`Self::finish`], then the session written to its file before returning: for a turn
    /// that ends after shutdown began, whose state outlives the daemon only on disk. `Err`
    /// (the storage failure) means it did not, and the turn's client must be told (issue
    /// 19.7: a turn's state was lost at shutdown while its client got a success).
    pub fn finish_written(mut self, snapshots: Vec<Snapshot>) -> Result<(), ServeError> {
        self.released = true;
        self.sessions.finish_written(&self.key, snapshots)
    }
}

impl Drop for SessionLease {
    fn drop(&mut self) {
        if !self.released {
            // Released unchanged: no new state of this job's is at stake, and a session
            // another one's spill dropped is logged there.
            let _ = self.sessions.finish(&self.key, Vec::new());
        }
    }
}

fn log_failures(log: Log, what: &str, failures: &[FileError]) {
    for f in failures {
        log.warn(format_args!("sessions: {what}: {f}"));
    }
}

/// Sessions a failed write dropped from memory (issue 35 point 6: they were kept above the
/// allowance): an error each, naming it. `Err` with the one that is `key`'s, whose turn's
/// client is told (the others' turns have ended).
fn own_drop(log: Log, key: &SessionKey, dropped: Vec<Dropped>) -> Result<(), ServeError> {
    let mut own = None;
    for d in dropped {
        log.error(format_args!("sessions: {d}"));
        if d.key == *key {
            own = Some(d);
        }
    }
    match own {
        Some(d) => Err(SessionStoreError::Dropped(Box::new(d)).into()),
        None => Ok(()),
    }
}

impl Sessions {
    pub(crate) fn new(dir: PathBuf, allowance: Option<u64>, quota: Quota, log: Log) -> Sessions {
        Sessions {
            dir,
            allowance,
            quota,
            phase: Mutex::new(Phase::Waiting),
            lost: Mutex::new(Vec::new()),
            log,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Phase> {
        // Every method completes its bookkeeping before returning, so a poisoned lock still
        // guards a consistent store.
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens the directory for the loaded model. Without an explicit allowance it is what the
    /// plan keeps for sessions ([`crate::plan::Plan::session_allowance`]) and nothing more:
    /// the budget bounds everything the engine keeps (issue 4). With none, idle sessions wait
    /// on disk between turns and nothing is kept for prefix reuse.
    pub(crate) fn open(&self, fingerprint: &str, planned: u64) {
        let allowance = self.allowance.unwrap_or(planned);
        let phase = match SessionStore::open(&self.dir, fingerprint, allowance) {
            Ok((mut store, skipped)) => {
                store.set_quota(self.quota);
                log_failures(self.log, "not indexed", &skipped);
                self.log.info(format_args!(
                    "sessions: {} in {}, in-memory allowance {:.3} GiB{}",
                    store.len(),
                    self.dir.display(),
                    allowance as f64 / (1u64 << 30) as f64,
                    if self.allowance.is_some() {
                        " (--session-gb)"
                    } else {
                        " (the memory plan's)"
                    }
                ));
                Phase::Open(store)
            }
            Err(e) => {
                self.log.error(format_args!("sessions unavailable: {e}"));
                Phase::Failed(e.to_string())
            }
        };
        *self.lock() = phase;
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut SessionStore) -> Result<T, SessionStoreError>,
    ) -> Result<T, ServeError> {
        match &mut *self.lock() {
            Phase::Open(store) => f(store).map_err(ServeError::from),
            Phase::Waiting => Err(ServeError::SessionsLoading),
            Phase::Failed(why) => Err(ServeError::SessionsUnavailable(why.clone())),
        }
    }

    /// `f` on the store, if the directory is open (kept prefix states: best effort, never an
    /// error for a request).
    pub(crate) fn with_open<T>(&self, f: impl FnOnce(&mut SessionStore) -> T) -> Option<T> {
        match &mut *self.lock() {
            Phase::Open(store) => Some(f(store)),
            Phase::Waiting | Phase::Failed(_) => None,
        }
    }

    /// Reserves `name` (in `who`'s namespace) for request `request` of `who`.
    pub(crate) fn lease(
        self: &Arc<Self>,
        name: &str,
        who: Access,
        request: u64,
    ) -> Result<SessionLease, ServeError> {
        let key = self.with(|s| s.reserve(name, who, request))?;
        Ok(SessionLease {
            sessions: Arc::clone(self),
            key,
            released: false,
        })
    }

    /// The state a leased session's request starts from and the prompt tokens it holds.
    pub(crate) fn start(
        &self,
        lease: &SessionLease,
        prompt: &[u32],
    ) -> Result<(Option<State>, usize), ServeError> {
        let started = Instant::now();
        let start = self.with(|s| s.start(&lease.key, prompt))?;
        // Copying a snapshot (or loading a spilled session) is the whole cost of reuse: logged
        // so it can be measured against the prefill it saves.
        self.log.info(format_args!(
            "session {}: {} prompt tokens from its state, ready in {:.3}s",
            lease.key,
            start.1,
            started.elapsed().as_secs_f64()
        ));
        Ok(start)
    }

    /// Ends the use of `key` with its new `snapshots`; `Err` if `key` itself was dropped (see
    /// [`SessionLease::finish`]).
    fn finish(&self, key: &SessionKey, snapshots: Vec<Snapshot>) -> Result<(), ServeError> {
        let dropped = self
            .with(|s| Ok(s.finish(key, snapshots)))
            .unwrap_or_default();
        own_drop(self.log, key, dropped)
    }

    /// [`Self::finish`] and the session's file written, under one lock (no other request can
    /// take the session in between).
    fn finish_written(&self, key: &SessionKey, snapshots: Vec<Snapshot>) -> Result<(), ServeError> {
        let (dropped, written) = self.with(|s| {
            let dropped = s.finish(key, snapshots);
            Ok((dropped, s.write(key)))
        })?;
        own_drop(self.log, key, dropped)?;
        written.map(|_| ()).map_err(ServeError::from)
    }

    /// The sessions `who` may see.
    pub fn list(&self, who: Access) -> Result<Vec<SessionInfo>, ServeError> {
        self.with(|s| Ok(s.list(who)))
    }

    /// Writes session `name` to the session directory now, or checks that its file already
    /// holds its state ([`SessionStore::save`]).
    pub fn save(&self, name: &str, who: Access) -> Result<Saved, ServeError> {
        let saved = self.with(|s| s.save(name, who))?;
        self.log.info(format_args!(
            "session {name:?} {} by uid {}",
            if saved.written {
                "saved"
            } else {
                "found already saved"
            },
            super::uid_text(who)
        ));
        Ok(saved)
    }

    pub fn delete(&self, name: &str, who: Access) -> Result<(), ServeError> {
        self.with(|s| s.delete(name, who))?;
        self.log.info(format_args!(
            "session {name:?} deleted by uid {}",
            super::uid_text(who)
        ));
        Ok(())
    }

    /// Writes every session whose file is not current (shutdown). Each one that could not be
    /// written is logged as an error by name and kept for [`Self::lost`]: its newest state
    /// ends with the daemon (issue 19.7: they were lost with a warning and exit status 0).
    pub(crate) fn save_all(&self) {
        let Ok(failures) = self.with(|s| Ok(s.save_all())) else {
            return;
        };
        for (key, error) in &failures {
            self.log.error(format_args!(
                "sessions: session {key} could not be written at shutdown, its newest state \
                 is lost: {error}"
            ));
        }
        let mut lost = self.lost.lock().unwrap_or_else(|p| p.into_inner());
        lost.extend(failures.into_iter().map(|(key, _)| key.shown_to(Some(0))));
    }

    /// The sessions shutdown could not write, as root names them (`UID/NAME`; empty before
    /// shutdown).
    pub fn lost(&self) -> Vec<String> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn figures(&self) -> SessionFigures {
        let dir = self.dir.clone();
        match &*self.lock() {
            Phase::Open(s) => SessionFigures {
                count: s.len(),
                leased: s.leased(),
                memory_bytes: s.memory_bytes(),
                allowance_bytes: s.allowance(),
                dir,
                error: None,
            },
            Phase::Waiting => SessionFigures {
                dir,
                ..SessionFigures::default()
            },
            Phase::Failed(why) => SessionFigures {
                dir,
                error: Some(why.clone()),
                ..SessionFigures::default()
            },
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
