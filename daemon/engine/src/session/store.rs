//! The [`SessionStore`]: every named session of one daemon, who owns it, whether a request is
//! using it, and where its snapshots are (in memory, in the session directory, or both).
//!
//! Rules (issue 7 item 3; documented for clients in `k3.proto`):
//! * A session belongs to the uid that created it (its first request). Another uid may not
//!   use, save or delete it, and does not see it in the list. Root (uid 0) administers the
//!   daemon's files anyway, so it sees and may act on every session.
//! * One request at a time per session: a second one is refused ([`SessionStoreError::Busy`]) rather
//!   than queued, because its prompt was written against a conversation the first is about to
//!   change; the client retries after the first finishes.
//! * Memory: in-memory snapshots count against an allowance (bytes). When a finished turn
//!   leaves the store above it, idle sessions are written to the session directory and dropped
//!   from memory, least recently used first; the next request to one of them loads it back.
//! * Files: [`super::file`] format, in a [`SessionDir`] the daemon owns (no symlink followed,
//!   no FIFO blocked on). At start the directory is scanned: temporary files a crash left
//!   are removed; files whose header does not parse, whose fingerprint is another model's or
//!   that another uid owns (their `owner` field is not believed) are not indexed (reported by
//!   `open`), and a request naming one gets the file's error: they are never loaded. Deleting
//!   one works — that is how a user clears the refusal — for the owner its header names when
//!   the daemon wrote it, and otherwise for root only.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::dir::SessionDir;
use super::file::{self, FileError, FileHeader};
use super::snapshot::{self, Snapshot};
use crate::echo::Echo;
use crate::model::State;

/// Why a session operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum SessionStoreError {
    #[error("invalid session name {}: use 1–64 of A-Z a-z 0-9 . _ - (not starting with '.')", Echo(.0))]
    InvalidName(String),
    #[error("no session named {}", Echo(.0))]
    NotFound(String),
    #[error("{}", permission_text(name, *owner))]
    PermissionDenied { name: String, owner: Option<u32> },
    #[error(
        "session {} is in use by request {request}; retry when it finishes",
        Echo(name)
    )]
    Busy { name: String, request: u64 },
    #[error(transparent)]
    File(#[from] FileError),
    #[error("session directory {path}: {error}")]
    Dir {
        path: PathBuf,
        error: std::io::Error,
    },
}

impl SessionStoreError {
    /// Reading or writing the session directory failed (the disk's fault, not the request's
    /// nor the model's): the session's state may not have been kept.
    pub fn is_storage_failure(&self) -> bool {
        matches!(
            self,
            SessionStoreError::File(FileError::Io { .. }) | SessionStoreError::Dir { .. }
        )
    }

    /// A storage failure because the disk (or the quota) is full.
    pub fn is_out_of_space(&self) -> bool {
        let error = match self {
            SessionStoreError::File(FileError::Io { error, .. }) | SessionStoreError::Dir { error, .. } => error,
            _ => return false,
        };
        matches!(error.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
    }
}

fn permission_text(name: &str, owner: Option<u32>) -> String {
    match owner {
        Some(uid) => format!("session {} belongs to uid {uid}", Echo(name)),
        None => format!(
            "session {} has no owner the daemon can vouch for; only root may act on it",
            Echo(name)
        ),
    }
}

/// Who asks: `Some(uid)` from the socket's peer credentials.
pub type Access = Option<u32>;

/// One session as listed.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    pub name: String,
    pub owner: Option<u32>,
    /// Length of the longest snapshot history.
    pub tokens: u64,
    /// Bytes of its snapshots' state (in memory, or as it would be once loaded).
    pub state_bytes: u64,
    pub in_memory: bool,
    /// A file in the session directory holds the current snapshots.
    pub on_disk: bool,
    /// The request using it, if any.
    pub in_use: Option<u64>,
    pub last_used: SystemTime,
}

struct Entry {
    owner: Option<u32>,
    /// `None` while only the file holds them.
    snapshots: Option<Vec<Snapshot>>,
    on_disk: bool,
    in_use: Option<u64>,
    /// Logical clock of the last use (LRU order).
    tick: u64,
    last_used: SystemTime,
    tokens: u64,
    state_bytes: u64,
}

impl Entry {
    fn info(&self, name: &str) -> SessionInfo {
        SessionInfo {
            name: name.to_string(),
            owner: self.owner,
            tokens: self.tokens,
            state_bytes: self.state_bytes,
            in_memory: self.snapshots.is_some(),
            on_disk: self.on_disk,
            in_use: self.in_use,
            last_used: self.last_used,
        }
    }

    fn memory(&self) -> u64 {
        if self.snapshots.is_some() {
            self.state_bytes
        } else {
            0
        }
    }
}

/// Bytes a set of snapshots holds: the states plus the id histories.
fn bytes_of(snapshots: &[Snapshot]) -> u64 {
    snapshots
        .iter()
        .map(|s| (s.state.size_bytes() + 4 * s.history.len()) as u64)
        .sum()
}

fn tokens_of(snapshots: &[Snapshot]) -> u64 {
    snapshots
        .iter()
        .map(|s| s.history.len() as u64)
        .max()
        .unwrap_or(0)
}

/// Whether `who` may act on a session owned by `owner` (root may act on all).
fn permitted(owner: Option<u32>, who: Access) -> bool {
    who == Some(0) || owner == who
}

/// Every session of one daemon. Not thread-safe by itself: the server wraps it in a mutex.
pub struct SessionStore {
    dir: SessionDir,
    fingerprint: String,
    allowance: u64,
    sessions: BTreeMap<String, Entry>,
    clock: u64,
}

impl SessionStore {
    /// Opens (creating, mode 0700) the session directory — refused unless the daemon owns it
    /// and only the daemon may write into it ([`SessionDir::open`]) —, removes the temporary
    /// files of saves a crash interrupted, and indexes the sessions saved there for the model
    /// with `fingerprint`. Files that cannot be indexed or removed are returned with why.
    pub fn open(
        dir: &Path,
        fingerprint: &str,
        allowance: u64,
    ) -> Result<(SessionStore, Vec<FileError>), SessionStoreError> {
        let dir_err = |error| SessionStoreError::Dir {
            path: dir.to_path_buf(),
            error,
        };
        let session_dir = SessionDir::open(dir).map_err(dir_err)?;
        let names = session_dir.names().map_err(dir_err)?;
        let mut store = SessionStore {
            dir: session_dir,
            fingerprint: fingerprint.to_string(),
            allowance,
            sessions: BTreeMap::new(),
            clock: 0,
        };
        let mut skipped = Vec::new();
        let extension = format!(".{}", file::EXTENSION);
        for entry in names {
            if file::is_temp_name(&entry) {
                // A save renames its temporary file away when it completes, so this one is
                // from a save a crash interrupted; the file it was to replace is still whole.
                if let Err(error) = store.dir.remove(&entry) {
                    skipped.push(FileError::Io {
                        path: dir.join(&entry),
                        error,
                    });
                }
                continue;
            }
            let Some(name) = entry.strip_suffix(&extension) else {
                continue;
            };
            if !super::valid_name(name) {
                continue;
            }
            if let Err(e) = store.index(name) {
                skipped.push(e);
            }
        }
        Ok((store, skipped))
    }

    /// Opens session `name`'s file if the daemon may believe what it says: a regular file (no
    /// symlink is followed, a FIFO is refused without blocking) that the daemon's uid owns.
    fn open_trusted(&self, name: &str) -> Result<(PathBuf, File), FileError> {
        let path = file::path_of(self.dir.path(), name);
        let (file, file_uid) = match self.dir.open_file(&file::file_name(name)) {
            Ok(opened) => opened,
            Err(error) => return Err(FileError::Io { path, error }),
        };
        if file_uid != self.dir.uid() {
            return Err(FileError::Untrusted {
                path,
                file_uid,
                daemon_uid: self.dir.uid(),
            });
        }
        Ok((path, file))
    }

    /// The owner a session file the daemon will not load names, if the daemon wrote it and its
    /// header reads; `None` otherwise.
    fn claimed_owner(&self, name: &str) -> Option<u32> {
        let (path, mut f) = self.open_trusted(name).ok()?;
        file::read_header_from(&path, &mut f).ok()?.owner
    }

    fn index(&mut self, name: &str) -> Result<(), FileError> {
        let (path, mut f) = self.open_trusted(name)?;
        let h = file::read_header_from(&path, &mut f)?;
        if h.fingerprint != self.fingerprint {
            return Err(FileError::Fingerprint {
                path: path.to_path_buf(),
                file: h.fingerprint,
                model: self.fingerprint.clone(),
            });
        }
        if h.name != name {
            return Err(FileError::Field {
                path: path.to_path_buf(),
                field: "name",
                detail: format!("{:?} inside a file named for {name:?}", h.name),
            });
        }
        let last_used = f
            .metadata()
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        self.sessions.insert(
            name.to_string(),
            Entry {
                owner: h.owner,
                snapshots: None,
                on_disk: true,
                in_use: None,
                tick: 0,
                last_used,
                tokens: h.tokens,
                state_bytes: h.state_bytes,
            },
        );
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn allowance(&self) -> u64 {
        self.allowance
    }

    /// Bytes of snapshots held in memory.
    pub fn memory_bytes(&self) -> u64 {
        self.sessions.values().map(Entry::memory).sum()
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Sessions a request holds now (reserved and not yet finished or released).
    pub fn leased(&self) -> usize {
        self.sessions
            .values()
            .filter(|e| e.in_use.is_some())
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    fn checked(name: &str) -> Result<(), SessionStoreError> {
        if super::valid_name(name) {
            Ok(())
        } else {
            Err(SessionStoreError::InvalidName(name.to_string()))
        }
    }

    /// The entry `who` may act on.
    fn entry_for(&mut self, name: &str, who: Access) -> Result<&mut Entry, SessionStoreError> {
        Self::checked(name)?;
        if !self.sessions.contains_key(name) && self.dir.contains(&file::file_name(name)) {
            // A file the start-up scan could not index: its own error says why.
            self.index(name)?;
        }
        let entry = self
            .sessions
            .get_mut(name)
            .ok_or_else(|| SessionStoreError::NotFound(name.to_string()))?;
        if permitted(entry.owner, who) {
            Ok(entry)
        } else {
            Err(SessionStoreError::PermissionDenied {
                name: name.to_string(),
                owner: entry.owner,
            })
        }
    }

    /// Marks session `name` in use by `request`, creating it (owned by `who`) if it does not
    /// exist. Refused if another uid owns it or another request is using it.
    pub fn reserve(&mut self, name: &str, who: Access, request: u64) -> Result<(), SessionStoreError> {
        match self.entry_for(name, who) {
            Err(SessionStoreError::NotFound(_)) => {
                self.clock += 1;
                self.sessions.insert(
                    name.to_string(),
                    Entry {
                        owner: who,
                        snapshots: Some(Vec::new()),
                        on_disk: false,
                        in_use: Some(request),
                        tick: self.clock,
                        last_used: SystemTime::now(),
                        tokens: 0,
                        state_bytes: 0,
                    },
                );
                Ok(())
            }
            Err(e) => Err(e),
            Ok(entry) => match entry.in_use {
                Some(other) => Err(SessionStoreError::Busy {
                    name: name.to_string(),
                    request: other,
                }),
                None => {
                    entry.in_use = Some(request);
                    Ok(())
                }
            },
        }
    }

    /// Where a request on reserved session `name` starts: a copy of the best snapshot's state
    /// for `prompt` (the reuse rule of [`snapshot::best`]) and how many prompt tokens it holds,
    /// or `None`/0 for a fresh state. Loads the session from its file if it was spilled.
    pub fn start(
        &mut self,
        name: &str,
        prompt: &[u32],
    ) -> Result<(Option<State>, usize), SessionStoreError> {
        self.clock += 1;
        let tick = self.clock;
        let spilled = self
            .sessions
            .get(name)
            .ok_or_else(|| SessionStoreError::NotFound(name.to_string()))?
            .snapshots
            .is_none();
        let loaded = if spilled {
            let (path, f) = self.open_trusted(name)?;
            Some(file::load_from(&path, f, &self.fingerprint)?)
        } else {
            None
        };
        let entry = self
            .sessions
            .get_mut(name)
            .ok_or_else(|| SessionStoreError::NotFound(name.to_string()))?;
        if let Some((header, snaps)) = loaded {
            entry.owner = header.owner;
            entry.tokens = tokens_of(&snaps);
            entry.state_bytes = bytes_of(&snaps);
            entry.snapshots = Some(snaps);
        }
        entry.tick = tick;
        entry.last_used = SystemTime::now();
        let snaps = entry.snapshots.as_deref().unwrap_or_default();
        Ok(match snapshot::best(snaps, prompt) {
            Some(i) => (Some(snaps[i].state.clone()), snaps[i].history.len()),
            None => (None, 0),
        })
    }

    /// Ends the use of session `name`, adding `snapshots` (oldest first) taken by the request;
    /// then spills idle sessions while memory is above the allowance. Returns the spill
    /// failures (those sessions stay in memory).
    pub fn finish(&mut self, name: &str, snapshots: Vec<Snapshot>) -> Vec<FileError> {
        if let Some(entry) = self.sessions.get_mut(name) {
            entry.in_use = None;
            if !snapshots.is_empty() {
                let snaps = entry.snapshots.get_or_insert_with(Vec::new);
                for s in snapshots {
                    snapshot::push(snaps, s);
                }
                entry.tokens = tokens_of(snaps);
                entry.state_bytes = bytes_of(snaps);
                entry.on_disk = false;
            }
        }
        self.spill()
    }

    /// Writes idle sessions to disk and drops them from memory, least recently used first,
    /// until memory is within the allowance or no idle session is left in memory.
    fn spill(&mut self) -> Vec<FileError> {
        let mut failures = Vec::new();
        while self.memory_bytes() > self.allowance {
            let victim = self
                .sessions
                .iter()
                .filter(|(_, e)| e.in_use.is_none() && e.memory() > 0)
                .filter(|(n, _)| !failures.iter().any(|f: &(String, FileError)| &f.0 == *n))
                .min_by_key(|(_, e)| e.tick)
                .map(|(n, _)| n.clone());
            let Some(name) = victim else { break };
            match self.write(&name) {
                Ok(_) => {
                    if let Some(e) = self.sessions.get_mut(&name) {
                        e.snapshots = None;
                    }
                }
                Err(e) => failures.push((name, e)),
            }
        }
        failures.into_iter().map(|(_, e)| e).collect()
    }

    /// Writes session `name`'s in-memory snapshots to its file (if they are not already
    /// there). Returns the file size, or 0 when there was nothing new to write.
    pub fn write(&mut self, name: &str) -> Result<u64, FileError> {
        let Some(entry) = self.sessions.get_mut(name) else {
            return Ok(0);
        };
        let Some(snaps) = entry.snapshots.as_deref() else {
            return Ok(0);
        };
        if entry.on_disk {
            return Ok(0);
        }
        let header = FileHeader {
            fingerprint: self.fingerprint.clone(),
            name: name.to_string(),
            owner: entry.owner,
            tokens: entry.tokens,
            state_bytes: entry.state_bytes,
        };
        let size = file::save(&self.dir, &header, snaps)?;
        entry.on_disk = true;
        Ok(size)
    }

    /// Ends the use of `name` without new snapshots (the request failed or was cancelled).
    pub fn release(&mut self, name: &str) {
        self.finish(name, Vec::new());
    }

    /// The sessions `who` may see, by name.
    pub fn list(&self, who: Access) -> Vec<SessionInfo> {
        self.sessions
            .iter()
            .filter(|(_, e)| permitted(e.owner, who))
            .map(|(n, e)| e.info(n))
            .collect()
    }

    /// Writes session `name` to the session directory now (it stays in memory).
    pub fn save(&mut self, name: &str, who: Access) -> Result<SessionInfo, SessionStoreError> {
        self.entry_for(name, who)?;
        self.write(name)?;
        let entry = self
            .sessions
            .get(name)
            .ok_or_else(|| SessionStoreError::NotFound(name.to_string()))?;
        Ok(entry.info(name))
    }

    /// Forgets session `name` and removes its file. Refused while a request uses it. A file
    /// the daemon will not load (damaged, another format version or model, not the daemon's
    /// own, not a regular file) is removed too — the refusal tells the user to do exactly
    /// that —, by the owner its header names if the daemon wrote it, else by root only.
    pub fn delete(&mut self, name: &str, who: Access) -> Result<(), SessionStoreError> {
        match self.entry_for(name, who) {
            Ok(entry) => {
                if let Some(request) = entry.in_use {
                    return Err(SessionStoreError::Busy {
                        name: name.to_string(),
                        request,
                    });
                }
            }
            Err(SessionStoreError::File(_)) => {
                let owner = self.claimed_owner(name);
                if !permitted(owner, who) {
                    return Err(SessionStoreError::PermissionDenied {
                        name: name.to_string(),
                        owner,
                    });
                }
            }
            Err(e) => return Err(e),
        }
        match self.dir.remove(&file::file_name(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                let path = file::path_of(self.dir.path(), name);
                return Err(FileError::Io { path, error }.into());
            }
        }
        self.sessions.remove(name);
        Ok(())
    }

    /// Writes every in-memory session whose file is not current (daemon shutdown). Returns
    /// the failures with the session each concerns: those sessions' newest states are lost.
    pub fn save_all(&mut self) -> Vec<(String, FileError)> {
        let names: Vec<String> = self.sessions.keys().cloned().collect();
        names
            .into_iter()
            .filter_map(|n| self.write(&n).err().map(|e| (n, e)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::snapshot::tests::{scratch, snap};
    use super::*;

    fn turn(
        store: &mut SessionStore,
        name: &str,
        who: Access,
        prompt: &[u32],
        full: &[u32],
    ) -> usize {
        store.reserve(name, who, 1).unwrap();
        let (_, reused) = store.start(name, prompt).unwrap();
        assert!(
            store
                .finish(name, vec![snap(prompt), snap(full)])
                .is_empty()
        );
        reused
    }

    #[test]
    fn reuse_across_turns_and_ownership() {
        let tmp = scratch("store-own");
        let dir = tmp.path().join("sessions");
        let (mut s, skipped) = SessionStore::open(&dir, "fp", u64::MAX).unwrap();
        assert!(skipped.is_empty());
        assert_eq!(turn(&mut s, "a", Some(10), &[1, 2, 3], &[1, 2, 3, 4]), 0);
        assert_eq!(
            turn(&mut s, "a", Some(10), &[1, 2, 3, 4, 5], &[1, 2, 3, 4, 5, 6]),
            4
        );
        // Another uid: refused everywhere, and does not see it.
        for e in [
            s.reserve("a", Some(11), 2).unwrap_err(),
            s.save("a", Some(11)).unwrap_err(),
            s.delete("a", Some(11)).unwrap_err(),
        ] {
            assert!(
                matches!(
                    e,
                    SessionStoreError::PermissionDenied {
                        owner: Some(10),
                        ..
                    }
                ),
                "{e:?}"
            );
        }
        assert!(s.list(Some(11)).is_empty());
        assert_eq!(s.list(Some(10)).len(), 1);
        assert_eq!(s.list(Some(0)).len(), 1);
        // One request at a time; leased while it runs, not after its release.
        assert_eq!(s.leased(), 0);
        s.reserve("a", Some(10), 7).unwrap();
        assert_eq!(s.leased(), 1);
        assert!(matches!(
            s.reserve("a", Some(10), 8),
            Err(SessionStoreError::Busy { request: 7, .. })
        ));
        assert!(matches!(
            s.delete("a", Some(10)),
            Err(SessionStoreError::Busy { .. })
        ));
        s.release("a");
        assert_eq!(s.leased(), 0);
        assert!(matches!(
            s.reserve("../x", Some(10), 9),
            Err(SessionStoreError::InvalidName(_))
        ));
        s.delete("a", Some(10)).unwrap();
        assert!(matches!(
            s.save("a", Some(10)),
            Err(SessionStoreError::NotFound(_))
        ));
    }

    #[test]
    fn spill_reload_and_restart() {
        let tmp = scratch("store-spill");
        let dir = tmp.path().join("sessions");
        let one = bytes_of(&[snap(&[1, 2]), snap(&[1, 2, 3])]);
        // Room for one session's snapshots only.
        let (mut s, _) = SessionStore::open(&dir, "fp", one).unwrap();
        assert_eq!(turn(&mut s, "x", Some(5), &[1, 2], &[1, 2, 3]), 0);
        assert_eq!(turn(&mut s, "y", Some(5), &[1, 2], &[1, 2, 3]), 0);
        let listed = s.list(Some(5));
        assert!(!listed[0].in_memory && listed[0].on_disk, "{listed:?}");
        assert!(listed[1].in_memory);
        assert!(s.memory_bytes() <= one);
        // x comes back from disk with its snapshots; y is spilled in turn.
        s.reserve("x", Some(5), 3).unwrap();
        let (state, reused) = s.start("x", &[1, 2, 3, 9]).unwrap();
        assert_eq!((state, reused), (Some(snap(&[1, 2, 3]).state), 3));
        s.release("x");
        assert!(!s.list(Some(5))[1].in_memory);
        assert!(s.save_all().is_empty());
        // A restart indexes both; the other model's store indexes neither.
        let (mut again, skipped) = SessionStore::open(&dir, "fp", one).unwrap();
        assert!(skipped.is_empty());
        assert_eq!(again.len(), 2);
        again.reserve("y", Some(5), 1).unwrap();
        assert_eq!(again.start("y", &[1, 2, 3, 4]).unwrap().1, 3);
        let (mut other, skipped) = SessionStore::open(&dir, "other", one).unwrap();
        assert_eq!((other.len(), skipped.len()), (0, 2));
        assert!(matches!(
            other.reserve("y", Some(5), 1),
            Err(SessionStoreError::File(FileError::Fingerprint { .. }))
        ));
    }

    #[test]
    fn corrupt_file_is_refused_at_use() {
        let tmp = scratch("store-corrupt");
        let dir = tmp.path().join("sessions");
        let (mut s, _) = SessionStore::open(&dir, "fp", u64::MAX).unwrap();
        turn(&mut s, "c", Some(5), &[1, 2], &[1, 2, 3]);
        s.save("c", Some(5)).unwrap();
        let path = file::path_of(&dir, "c");
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 40;
        bytes[last] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let (mut again, skipped) = SessionStore::open(&dir, "fp", u64::MAX).unwrap();
        // The header is intact, so it is listed; using it reports the checksum.
        assert!(skipped.is_empty());
        again.reserve("c", Some(5), 1).unwrap();
        assert!(matches!(
            again.start("c", &[1, 2, 3, 4]),
            Err(SessionStoreError::File(FileError::Checksum { .. }))
        ));
        again.release("c");
    }
}
