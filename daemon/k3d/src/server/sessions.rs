//! The daemon's sessions: the library's `SessionStore` behind a mutex, opened by the scheduler
//! once the model (and so its fingerprint) is known, and the mapping of its refusals to gRPC
//! statuses. File I/O happens under the mutex; callers on tokio use `spawn_blocking`.

use super::scheduler::uid_text;
use k3_engine::model::State;
use k3_engine::plan::Plan;
use k3_engine::session::{FileError, SessionInfo, SessionStore, Snapshot, StoreError};
use k3proto::v1 as pb;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Instant, UNIX_EPOCH};
use tonic::Status;

enum Phase {
    /// The model is loading; the fingerprint files are checked against is not known yet.
    Waiting,
    Open(SessionStore),
    /// The session directory could not be opened.
    Failed(String),
}

pub struct Sessions {
    dir: PathBuf,
    /// `None`: decided from the plan when the model is loaded (see `open`).
    allowance: Option<u64>,
    phase: Mutex<Phase>,
}

fn store_status(e: &StoreError) -> Status {
    let text = e.to_string();
    match e {
        StoreError::InvalidName(_) => Status::invalid_argument(text),
        StoreError::NotFound(_) => Status::not_found(text),
        StoreError::PermissionDenied { .. } => Status::permission_denied(text),
        StoreError::Busy { .. } => Status::aborted(text),
        StoreError::File(FileError::Io { .. }) | StoreError::Dir { .. } => Status::internal(text),
        StoreError::File(_) => Status::failed_precondition(format!(
            "{text}; the file was not loaded (remove it with `k3 sessions rm` as root, or delete the file)"
        )),
    }
}

fn info(s: &SessionInfo) -> pb::SessionInfo {
    pb::SessionInfo {
        name: s.name.clone(),
        owner_uid: s.owner,
        tokens: s.tokens,
        state_bytes: s.state_bytes,
        in_memory: s.in_memory,
        on_disk: s.on_disk,
        in_use_by: s.in_use.unwrap_or(0),
        last_used: s
            .last_used
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
    }
}

fn log_failures(what: &str, failures: &[FileError]) {
    for f in failures {
        log_warn!("sessions: {what}: {f}");
    }
}

impl Sessions {
    pub fn new(dir: PathBuf, allowance: Option<u64>) -> Sessions {
        Sessions {
            dir,
            allowance,
            phase: Mutex::new(Phase::Waiting),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Phase> {
        // A panic while holding the lock leaves the store consistent (every method completes
        // its bookkeeping before returning), so a poisoned lock is still usable.
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens the directory for the loaded model. Without `--session-gb` the allowance is the
    /// plan's unallocated budget and nothing more: the budget bounds everything the engine
    /// keeps (issue 4). With no headroom, idle sessions wait on disk between turns — a save and
    /// a reload, 0.15 s + 0.25 s for an 85 MB session on `bench`, small next to a streamed
    /// token — rather than overrunning the budget.
    pub fn open(&self, fingerprint: &str, plan: &Plan) {
        let allowance = self.allowance.unwrap_or_else(|| plan.headroom());
        let phase = match SessionStore::open(&self.dir, fingerprint, allowance) {
            Ok((store, skipped)) => {
                log_failures("not indexed", &skipped);
                log!(
                    "sessions: {} in {}, in-memory allowance {:.3} GiB{}",
                    store.len(),
                    self.dir.display(),
                    allowance as f64 / (1u64 << 30) as f64,
                    if self.allowance.is_some() {
                        " (--session-gb)"
                    } else {
                        " (default: the plan's headroom)"
                    }
                );
                Phase::Open(store)
            }
            Err(e) => {
                log_err!("sessions unavailable: {e}");
                Phase::Failed(e.to_string())
            }
        };
        *self.lock() = phase;
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut SessionStore) -> Result<T, StoreError>,
    ) -> Result<T, Status> {
        match &mut *self.lock() {
            Phase::Open(store) => f(store).map_err(|e| store_status(&e)),
            Phase::Waiting => Err(Status::unavailable(
                "the daemon is loading its model; sessions are available once it is ready",
            )),
            Phase::Failed(why) => Err(Status::failed_precondition(format!(
                "sessions are unavailable: {why}"
            ))),
        }
    }

    pub fn reserve(&self, name: &str, uid: Option<u32>, request: u64) -> Result<(), Status> {
        self.with(|s| s.reserve(name, uid, request))
    }

    /// The state a reserved session's request starts from and the prompt tokens it holds.
    pub fn start(&self, name: &str, prompt: &[u32]) -> Result<(Option<State>, usize), Status> {
        let started = Instant::now();
        let start = self.with(|s| s.start(name, prompt))?;
        // Copying a snapshot (or loading a spilled session) is the whole cost of reuse: logged
        // so it can be measured against the prefill it saves.
        log!(
            "session {name:?}: {} prompt tokens from its state, ready in {:.3}s",
            start.1,
            started.elapsed().as_secs_f64()
        );
        Ok(start)
    }

    pub fn finish(&self, name: &str, snapshots: Vec<Snapshot>) {
        let failures = self
            .with(|s| Ok(s.finish(name, snapshots)))
            .unwrap_or_default();
        log_failures("spilling failed (kept in memory)", &failures);
    }

    pub fn release(&self, name: &str) {
        self.finish(name, Vec::new());
    }

    pub fn list(&self, uid: Option<u32>) -> Result<pb::ListSessionsReply, Status> {
        self.with(|s| {
            Ok(pb::ListSessionsReply {
                sessions: s.list(uid).iter().map(info).collect(),
            })
        })
    }

    pub fn save(&self, name: &str, uid: Option<u32>) -> Result<pb::SaveSessionReply, Status> {
        let reply = self.with(|s| {
            let saved = s.save(name, uid)?;
            Ok(pb::SaveSessionReply {
                session: Some(info(&saved)),
                path: k3_engine::session::file::path_of(s.dir(), name)
                    .display()
                    .to_string(),
            })
        })?;
        log!("session {name:?} saved by uid {}", uid_text(uid));
        Ok(reply)
    }

    pub fn delete(&self, name: &str, uid: Option<u32>) -> Result<(), Status> {
        self.with(|s| s.delete(name, uid))?;
        log!("session {name:?} deleted by uid {}", uid_text(uid));
        Ok(())
    }

    /// Writes every session whose file is not current (shutdown).
    pub fn save_all(&self) {
        if let Ok(failures) = self.with(|s| Ok(s.save_all())) {
            log_failures("saving at shutdown failed", &failures);
        }
    }

    pub fn figures(&self) -> pb::SessionFigures {
        let dir = self.dir.display().to_string();
        match &*self.lock() {
            Phase::Open(s) => pb::SessionFigures {
                count: super::convert::count(s.len()),
                memory_bytes: s.memory_bytes(),
                allowance_bytes: s.allowance(),
                dir,
                error: String::new(),
            },
            Phase::Waiting => pb::SessionFigures {
                dir,
                ..Default::default()
            },
            Phase::Failed(why) => pb::SessionFigures {
                dir,
                error: why.clone(),
                ..Default::default()
            },
        }
    }
}
