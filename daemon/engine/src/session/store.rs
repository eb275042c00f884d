//! The [`SessionStore`]: every named session of one daemon, who owns it, whether a request is
//! using it, and where its snapshots are (in memory, in the session directory, or both).
//!
//! Rules (issue 7 item 3, issue 35 point 6; documented for clients in `k3.proto`):
//! * A session belongs to the uid that created it (its first request), and its name is that
//!   uid's: B's `work` and A's `work` are two sessions ([`SessionKey`]). A uid sees and acts on
//!   its own; root (uid 0) administers the daemon's files anyway, so it sees every session and
//!   names another uid's as `UID/NAME`.
//! * One request at a time per session: a second one is refused
//!   ([`SessionStoreError::Busy`]) rather than queued, because its prompt was written against a
//!   conversation the first is about to change; the client retries after the first finishes.
//! * Quotas per uid ([`Quota`]): at most so many sessions, and so many bytes of session files;
//!   beyond, that uid's request is refused saying which limit ([`SessionStoreError::Quota`]). And a
//!   uid's write may not leave the filesystem too full to write again the sessions of every
//!   uid holding less ([`SessionStoreError::Reserved`]): one user's fill never costs a lighter
//!   user's session, and the heavier user is the one who gives way.
//! * Memory: in-memory snapshots count against an allowance (bytes). When a finished turn
//!   leaves the store above it, idle sessions are written to the session directory and dropped
//!   from memory — the least recently used session of the uid holding the most memory first —
//!   and the next request to one of them loads it back. When a write fails, the session
//!   whose turn is ending gives way (issue 45 point 3: its client can be told; a session
//!   whose turn already succeeded is not lost behind it): it is written instead or dropped
//!   from memory (its file, if it has one, keeps its older state), and the failure is
//!   returned. Memory never stays above the allowance.
//! * Disk: a uid's files are bounded by its share of the session filesystem too (`share.rs`,
//!   issue 45 point 1), so one user's fill cannot make another user's new session
//!   unwritable.
//! * Files: [`super::file`] format, named by owner and name ([`super::file::stem`]), in a
//!   [`SessionDir`] the daemon owns (no symlink followed, no FIFO blocked on). At start the
//!   directory is scanned: temporary files a crash left are removed; files whose header does
//!   not parse, whose fingerprint is another model's, whose name or owner disagrees with the
//!   file name, or that another uid owns (their `owner` field is not believed) are not
//!   indexed (reported by `open`), and a request naming one gets the file's error: they are
//!   never loaded. Deleting one works — that is how a user clears the refusal — for the owner
//!   its header names when the daemon wrote it, and otherwise for root only. A file an earlier
//!   k3d wrote under the bare name is indexed by its header and renamed at its next write.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use super::dir::SessionDir;
use super::file::{self, FileError, FileHeader, Stem};
use super::kept::{self, KeptIndex};
use super::share::FsRoom;
use super::share::kept_for_others;
use super::snapshot::{self, Snapshot};
use crate::model::State;

pub use super::error::{Dropped, QuotaLimit, SessionStoreError};

/// Who asks: `Some(uid)` from the socket's peer credentials.
pub type Access = Option<u32>;

/// A session: whose, and its name in that uid's namespace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionKey {
    pub owner: Option<u32>,
    pub name: String,
}

impl SessionKey {
    /// The session `name` means when `who` says it: `who`'s own, or — `UID/NAME` — the session
    /// of that uid, which only that uid and root may name.
    pub fn resolve(name: &str, who: Access) -> Result<SessionKey, SessionStoreError> {
        let invalid = || SessionStoreError::InvalidName(name.to_string());
        let (owner, bare) = match name.split_once('/') {
            Some((uid, bare)) => {
                let digits = !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_digit());
                let uid: u32 = uid.parse().ok().filter(|_| digits).ok_or_else(invalid)?;
                if !permitted(Some(uid), who) {
                    return Err(SessionStoreError::PermissionDenied {
                        name: name.to_string(),
                        owner: Some(uid),
                    });
                }
                (Some(uid), bare)
            }
            None => (who, name),
        };
        if !super::valid_name(bare) {
            return Err(invalid());
        }
        Ok(SessionKey {
            owner,
            name: bare.to_string(),
        })
    }

    /// How `who` names this session: its bare name when it is `who`'s own, else `UID/NAME`.
    pub fn shown_to(&self, who: Access) -> String {
        match self.owner {
            Some(uid) if who != Some(uid) => format!("{uid}/{}", self.name),
            _ => self.name.clone(),
        }
    }
}

impl std::fmt::Display for SessionKey {
    /// `NAME of uid UID` (for logs).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.owner {
            Some(uid) => write!(f, "{:?} of uid {uid}", self.name),
            None => write!(f, "{:?} of an unknown uid", self.name),
        }
    }
}

/// Per-uid limits on sessions (issue 35 point 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Sessions one uid may have (in memory and on disk together).
    pub sessions: usize,
    /// Bytes of session files one uid may have in the session directory.
    pub disk_bytes: u64,
}

impl Default for Quota {
    /// 64 sessions and 16 GiB of files per uid.
    fn default() -> Self {
        Quota {
            sessions: 64,
            disk_bytes: 16 << 30,
        }
    }
}

/// One session as listed.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    /// As the asking uid names it ([`SessionKey::shown_to`]).
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

/// What [`SessionStore::save`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Saved {
    pub info: SessionInfo,
    /// The session's file.
    pub path: PathBuf,
    /// `false`: the file already held the session's state (checked, not assumed), so nothing
    /// was written now.
    pub written: bool,
}

struct Entry {
    /// `None` while only the file holds them.
    snapshots: Option<Vec<Snapshot>>,
    on_disk: bool,
    /// The name of its file in the session directory, if it has one (current or older).
    file: Option<String>,
    /// That file's size.
    file_bytes: u64,
    in_use: Option<u64>,
    /// Logical clock of the last use (LRU order).
    tick: u64,
    last_used: SystemTime,
    tokens: u64,
    state_bytes: u64,
}

impl Entry {
    fn info(&self, key: &SessionKey, who: Access) -> SessionInfo {
        SessionInfo {
            name: key.shown_to(who),
            owner: key.owner,
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

    /// What writing it again needs on disk at most: its file, or its state and histories in
    /// the file format plus the framing.
    fn write_bytes(&self) -> u64 {
        self.file_bytes.max(self.state_bytes + FRAMING)
    }
}

/// Bytes a session file needs beyond its snapshots' states and histories, at most: the
/// preamble, a header of at most 4 KiB, per snapshot its count and per layer a kind byte and
/// four array lengths (33 bytes; K3 has 93 layers), and the checksum — for the
/// [`snapshot::MAX_SNAPSHOTS`] snapshots this store keeps.
pub(super) const FRAMING: u64 = 16 << 10;

/// Bytes a set of snapshots holds: the states plus the id histories.
pub(super) fn bytes_of(snapshots: &[Snapshot]) -> u64 {
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
    /// Shared with the writes of kept states, which run without the store's lock.
    pub(super) dir: Arc<SessionDir>,
    fingerprint: String,
    allowance: u64,
    pub(super) quota: Quota,
    sessions: BTreeMap<SessionKey, Entry>,
    clock: u64,
    /// Automatic prefix reuse's states in the session directory ([`kept`]).
    pub(super) kept: KeptIndex,
}

impl SessionStore {
    /// Opens (creating, mode 0700) the session directory — refused unless the daemon owns it
    /// and only the daemon may write into it ([`SessionDir::open`]) —, removes the temporary
    /// files of saves a crash interrupted, and indexes the sessions saved there for the model
    /// with `fingerprint`. Files that cannot be indexed or removed are returned with why.
    /// Quotas are [`Quota::default`] until [`Self::set_quota`].
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
            dir: Arc::new(session_dir),
            // Named sessions are bound like kept states: a state is the exact result of its
            // ids only under the numerics contract it was computed with (issue 41).
            fingerprint: kept::state_key(fingerprint),
            allowance,
            quota: Quota::default(),
            sessions: BTreeMap::new(),
            clock: 0,
            kept: KeptIndex::new(fingerprint),
        };
        let mut skipped = Vec::new();
        let extension = format!(".{}", file::EXTENSION);
        for entry in names {
            if file::is_temp_name(&entry) || kept::is_temp_name(&entry) {
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
            if kept::parse_file_name(&entry).is_some() {
                if let Err(e) = store.index_kept(&entry) {
                    skipped.push(e);
                }
                continue;
            }
            let Some(stem) = entry.strip_suffix(&extension) else {
                continue;
            };
            if file::parse_stem(stem).is_none() {
                continue;
            }
            if let Err(e) = store.index(&entry) {
                skipped.push(e);
            }
        }
        Ok((store, skipped))
    }

    pub fn set_quota(&mut self, quota: Quota) {
        self.quota = quota;
    }

    /// Opens the file `file_name` if the daemon may believe what it says: a regular file (no
    /// symlink is followed, a FIFO is refused without blocking) that the daemon's uid owns.
    pub(super) fn open_trusted(&self, file_name: &str) -> Result<(PathBuf, File), FileError> {
        let path = self.dir.path().join(file_name);
        let (file, file_uid) = match self.dir.open_file(file_name) {
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
    fn claimed_owner(&self, file_name: &str) -> Option<u32> {
        let (path, mut f) = self.open_trusted(file_name).ok()?;
        file::read_header_from(&path, &mut f).ok()?.owner
    }

    /// Indexes the file `file_name` (`STEM.k3s`): its header must be this model's and agree
    /// with the owner and name its stem gives. A bare-named file (an earlier k3d's) is indexed
    /// under the owner and name its header gives, unless that session has a file of its own.
    fn index(&mut self, file_name: &str) -> Result<(), FileError> {
        let (path, mut f) = self.open_trusted(file_name)?;
        let h = file::read_header_from(&path, &mut f)?;
        if h.fingerprint != self.fingerprint {
            return Err(FileError::Fingerprint {
                path: path.to_path_buf(),
                file: h.fingerprint,
                model: self.fingerprint.clone(),
            });
        }
        let stem = file_name
            .strip_suffix(&format!(".{}", file::EXTENSION))
            .unwrap_or(file_name);
        let field = |field: &'static str, detail: String| FileError::Field {
            path: path.to_path_buf(),
            field,
            detail,
        };
        match file::parse_stem(stem) {
            Some(Stem::Owned { owner, name }) => {
                if h.name != name {
                    return Err(field(
                        "name",
                        format!("{:?} inside a file named for {name:?}", h.name),
                    ));
                }
                if h.owner != owner {
                    return Err(field(
                        "owner",
                        format!("{:?} inside a file named for {owner:?}", h.owner),
                    ));
                }
            }
            Some(Stem::Bare(name)) => {
                if h.name != name {
                    return Err(field(
                        "name",
                        format!("{:?} inside a file named for {name:?}", h.name),
                    ));
                }
                let key = SessionKey {
                    owner: h.owner,
                    name: h.name.clone(),
                };
                if self.sessions.contains_key(&key) {
                    return Err(field(
                        "name",
                        format!("an earlier k3d's file of session {key}, which has a newer one"),
                    ));
                }
            }
            None => return Err(field("name", format!("{stem:?} names no session"))),
        }
        let meta = f.metadata();
        let last_used = meta
            .as_ref()
            .ok()
            .and_then(|m| m.modified().ok())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let file_bytes = meta.map_or(0, |m| m.len());
        let key = SessionKey {
            owner: h.owner,
            name: h.name,
        };
        // A session's own file replaces an earlier k3d's bare one indexed before it.
        self.sessions.insert(
            key,
            Entry {
                snapshots: None,
                on_disk: true,
                file: Some(file_name.to_string()),
                file_bytes,
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

    /// Bytes of `owner`'s session files, `except`'s left out.
    pub(super) fn files_of(&self, owner: Option<u32>, except: Option<&SessionKey>) -> u64 {
        self.sessions
            .iter()
            .filter(|(k, _)| k.owner == owner && Some(*k) != except)
            .map(|(_, e)| e.file_bytes)
            .sum()
    }

    /// What writing each owner's sessions again needs on disk ([`kept_for_others`]),
    /// `except`'s left out.
    pub(super) fn usage(&self, except: Option<&SessionKey>) -> BTreeMap<Option<u32>, u64> {
        let mut usage: BTreeMap<Option<u32>, u64> = BTreeMap::new();
        for (k, e) in self.sessions.iter().filter(|(k, _)| Some(*k) != except) {
            *usage.entry(k.owner).or_default() += e.write_bytes();
        }
        usage
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

    /// The file of session `key` on disk: its current name if it has one, else the one it
    /// would be written to.
    pub fn path_of(&self, key: &SessionKey) -> PathBuf {
        let current = self.sessions.get(key).and_then(|e| e.file.clone());
        self.dir
            .path()
            .join(current.unwrap_or_else(|| file::file_name(&file::stem(key.owner, &key.name))))
    }

    /// What the session filesystem can hold, and among how many users, `owner` counted.
    fn fs_room(&self, owner: Option<u32>) -> Result<FsRoom, SessionStoreError> {
        let available = self
            .dir
            .available_bytes()
            .map_err(|error| SessionStoreError::Dir {
                path: self.dir.path().to_path_buf(),
                error,
            })?;
        let files: u64 = self.sessions.values().map(|e| e.file_bytes).sum();
        let mut owners: BTreeSet<Option<u32>> = self.sessions.keys().map(|k| k.owner).collect();
        owners.insert(owner);
        Ok(FsRoom {
            available,
            capacity: available.saturating_add(files),
            users: owners.len(),
        })
    }

    /// The entry `name` names for `who` and its key.
    fn entry_for(
        &mut self,
        name: &str,
        who: Access,
    ) -> Result<(SessionKey, &mut Entry), SessionStoreError> {
        let key = SessionKey::resolve(name, who)?;
        let own_file = file::file_name(&file::stem(key.owner, &key.name));
        if !self.sessions.contains_key(&key) && self.dir.contains(&own_file) {
            // A file the start-up scan could not index: its own error says why.
            self.index(&own_file)?;
        }
        let entry = self
            .sessions
            .get_mut(&key)
            .ok_or_else(|| SessionStoreError::NotFound(name.to_string()))?;
        Ok((key, entry))
    }

    /// Marks session `name` of `who` in use by `request`, creating it (owned by `who`, within
    /// its quota) if it does not exist. Refused if another request is using it. Returns the
    /// session's key, which the later calls for this request take.
    pub fn reserve(
        &mut self,
        name: &str,
        who: Access,
        request: u64,
    ) -> Result<SessionKey, SessionStoreError> {
        match self.entry_for(name, who) {
            Err(SessionStoreError::NotFound(_)) => {
                let key = SessionKey::resolve(name, who)?;
                let owned = self
                    .sessions
                    .keys()
                    .filter(|k| k.owner == key.owner)
                    .count();
                if owned >= self.quota.sessions {
                    return Err(SessionStoreError::Quota {
                        owner: key.owner,
                        limit: QuotaLimit::Sessions(self.quota.sessions),
                        used: owned as u64,
                    });
                }
                self.clock += 1;
                self.sessions.insert(
                    key.clone(),
                    Entry {
                        snapshots: Some(Vec::new()),
                        on_disk: false,
                        file: None,
                        file_bytes: 0,
                        in_use: Some(request),
                        tick: self.clock,
                        last_used: SystemTime::now(),
                        tokens: 0,
                        state_bytes: 0,
                    },
                );
                Ok(key)
            }
            Err(e) => Err(e),
            Ok((key, entry)) => match entry.in_use {
                Some(other) => Err(SessionStoreError::Busy {
                    name: name.to_string(),
                    request: other,
                }),
                None => {
                    entry.in_use = Some(request);
                    Ok(key)
                }
            },
        }
    }

    /// Where a request on reserved session `key` starts: a copy of the best snapshot's state
    /// for `prompt` (the reuse rule of [`snapshot::best`]) and how many prompt tokens it holds,
    /// or `None`/0 for a fresh state. Loads the session from its file if it was spilled.
    pub fn start(
        &mut self,
        key: &SessionKey,
        prompt: &[u32],
    ) -> Result<(Option<State>, usize), SessionStoreError> {
        self.clock += 1;
        let tick = self.clock;
        let not_found = || SessionStoreError::NotFound(key.name.clone());
        let entry = self.sessions.get(key).ok_or_else(not_found)?;
        let loaded = match (&entry.snapshots, &entry.file) {
            (None, Some(file_name)) => {
                let (path, f) = self.open_trusted(file_name)?;
                Some(file::load_from(&path, f, &self.fingerprint)?)
            }
            _ => None,
        };
        let entry = self.sessions.get_mut(key).ok_or_else(not_found)?;
        if let Some((_, snaps)) = loaded {
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

    /// Ends the use of session `key`, adding `snapshots` (oldest first) taken by the request;
    /// then spills idle sessions while memory is above the allowance. Returns the sessions a
    /// failed write dropped from memory.
    pub fn finish(&mut self, key: &SessionKey, snapshots: Vec<Snapshot>) -> Vec<Dropped> {
        if let Some(entry) = self.sessions.get_mut(key) {
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
        self.spill(key)
    }

    /// Writes idle sessions to disk and drops them from memory until memory is within the
    /// allowance or no idle session is left in memory: the least recently used session of the
    /// owner holding the most memory first, so one user's sessions never push out another's
    /// while they take more.
    ///
    /// When a session cannot be written, the one that gives way is `finishing` — the session
    /// whose turn ends now, whose client can still be told (issue 45 point 3) — not one whose
    /// turn already reported success: `finishing` is written instead, or dropped (its older
    /// file, if any, kept) with the failure returned, and the session that could not be
    /// written stays in memory. Only when that is not enough (no `finishing` state in memory
    /// to give) is a session that cannot be written dropped all the same, its failure
    /// returned too: memory never stays above the allowance.
    fn spill(&mut self, finishing: &SessionKey) -> Vec<Dropped> {
        let mut dropped = Vec::new();
        // Sessions whose write failed this time, left in memory for `finishing` to give way.
        let mut unwritable: Vec<SessionKey> = Vec::new();
        while self.memory_bytes() > self.allowance {
            let mut held: BTreeMap<Option<u32>, u64> = BTreeMap::new();
            for (k, e) in &self.sessions {
                *held.entry(k.owner).or_default() += e.memory();
            }
            let victim = self
                .sessions
                .iter()
                .filter(|(k, e)| e.in_use.is_none() && e.memory() > 0 && !unwritable.contains(k))
                .max_by_key(|(k, e)| (held.get(&k.owner).copied(), std::cmp::Reverse(e.tick)))
                .map(|(k, _)| k.clone());
            let key = match victim {
                Some(key) => key,
                None if !unwritable.is_empty() => {
                    // Nothing else can give way: the first that could not be written goes.
                    let key = unwritable.remove(0);
                    let error = self.write(&key).err();
                    self.evict(&key, error, &mut dropped);
                    continue;
                }
                None => break,
            };
            match self.write(&key) {
                Ok(_) => self.evict(&key, None, &mut dropped),
                Err(_) if key != *finishing && self.memory_of(finishing) > 0 => {
                    unwritable.push(key);
                    let error = self.write(finishing).err();
                    self.evict(finishing, error, &mut dropped);
                }
                Err(error) => self.evict(&key, Some(error), &mut dropped),
            }
        }
        dropped
    }

    fn memory_of(&self, key: &SessionKey) -> u64 {
        self.sessions.get(key).map_or(0, Entry::memory)
    }

    /// Drops session `key`'s snapshots from memory: written (`error` `None`), or not — then
    /// it is gone but for its older file, if it has one, and `dropped` says so.
    fn evict(
        &mut self,
        key: &SessionKey,
        error: Option<SessionStoreError>,
        dropped: &mut Vec<Dropped>,
    ) {
        let Some(entry) = self.sessions.get_mut(key) else {
            return;
        };
        entry.snapshots = None;
        let Some(error) = error else {
            return;
        };
        let older_on_disk = entry.file.is_some();
        if older_on_disk {
            self.reread_header(key);
        } else {
            self.sessions.remove(key);
        }
        dropped.push(Dropped {
            key: key.clone(),
            error,
            older_on_disk,
        });
    }

    /// After a failed write dropped a session's newest state: its figures from its file again.
    fn reread_header(&mut self, key: &SessionKey) {
        let Some(file_name) = self.sessions.get(key).and_then(|e| e.file.clone()) else {
            return;
        };
        let header = self
            .open_trusted(&file_name)
            .ok()
            .and_then(|(path, mut f)| file::read_header_from(&path, &mut f).ok());
        if let (Some(h), Some(entry)) = (header, self.sessions.get_mut(key)) {
            entry.tokens = h.tokens;
            entry.state_bytes = h.state_bytes;
            entry.on_disk = true;
        }
    }

    /// Writes session `key`'s in-memory snapshots to its file (if they are not already
    /// there), within its owner's quota and never into the room kept for the other owners'
    /// sessions. Returns the file size, or 0 when there was nothing new to write.
    pub fn write(&mut self, key: &SessionKey) -> Result<u64, SessionStoreError> {
        let unwritten = self.sessions.get(key).filter(|e| !e.on_disk);
        let Some(needed) =
            unwritten.and_then(|e| Some(bytes_of(e.snapshots.as_deref()?) + FRAMING))
        else {
            return Ok(0);
        };
        let mut owners_files = self.files_of(key.owner, Some(key)) + self.kept.bytes_of(key.owner);
        let over = (owners_files + needed).saturating_sub(self.quota.disk_bytes);
        if over > 0 {
            // The owner's kept prefix states share its allowance and give way to its sessions.
            owners_files -= self.evict_kept(key.owner, over, true);
        }
        let Some(entry) = self.sessions.get(key) else {
            return Ok(0);
        };
        let Some(snaps) = entry.snapshots.as_deref() else {
            return Ok(0);
        };
        let used = owners_files + needed;
        if used > self.quota.disk_bytes {
            return Err(SessionStoreError::Quota {
                owner: key.owner,
                limit: QuotaLimit::DiskBytes(self.quota.disk_bytes),
                used,
            });
        }
        let room = self.fs_room(key.owner)?;
        // Where the filesystem has the room, the share decides; where it has not, the write
        // fails by itself and says so (a disk full of other files is no user's share).
        if used > room.share() && room.available >= needed {
            return Err(SessionStoreError::Quota {
                owner: key.owner,
                limit: room.limit(),
                used,
            });
        }
        let usage = self.usage(Some(key));
        let available = room.available;
        let reserved = kept_for_others(key.owner, needed, &usage);
        // With nothing kept for others the filesystem alone decides (a full one says so).
        if reserved > 0 && available < needed.saturating_add(reserved) {
            return Err(SessionStoreError::Reserved {
                name: key.name.clone(),
                needed,
                available,
                reserved,
            });
        }
        let header = FileHeader {
            fingerprint: self.fingerprint.clone(),
            name: key.name.clone(),
            owner: key.owner,
            tokens: entry.tokens,
            state_bytes: entry.state_bytes,
        };
        let size = file::save(&self.dir, &header, snaps)?;
        let written = file::file_name(&file::stem(key.owner, &key.name));
        let previous = self.sessions.get(key).and_then(|e| e.file.clone());
        if let Some(old) = previous.filter(|old| *old != written) {
            // An earlier k3d's bare-named file: the session's own file replaces it.
            let _ = self.dir.remove(&old);
        }
        if let Some(entry) = self.sessions.get_mut(key) {
            entry.on_disk = true;
            entry.file = Some(written);
            entry.file_bytes = size;
        }
        Ok(size)
    }

    /// Ends the use of `key` without new snapshots (the request failed or was cancelled).
    pub fn release(&mut self, key: &SessionKey) -> Vec<Dropped> {
        self.finish(key, Vec::new())
    }

    /// The sessions `who` may see, by owner and name.
    pub fn list(&self, who: Access) -> Vec<SessionInfo> {
        self.sessions
            .iter()
            .filter(|(k, _)| permitted(k.owner, who))
            .map(|(k, e)| e.info(k, who))
            .collect()
    }

    /// Writes session `name` to the session directory now (it stays in memory), unless its
    /// file already holds its state: then that file is read back (it must be there, the
    /// daemon's, with this session's header) rather than believed, so a save never reports
    /// a state as on disk that is not (issue 45 point 5).
    pub fn save(&mut self, name: &str, who: Access) -> Result<Saved, SessionStoreError> {
        let (key, _) = self.entry_for(name, who)?;
        let written = self.write(&key)? > 0;
        let entry = self
            .sessions
            .get(&key)
            .ok_or_else(|| SessionStoreError::NotFound(name.to_string()))?;
        if !written {
            let file_name = entry
                .file
                .clone()
                .unwrap_or_else(|| file::file_name(&file::stem(key.owner, &key.name)));
            let (path, mut f) = self.open_trusted(&file_name)?;
            let h = file::read_header_from(&path, &mut f)?;
            if h.tokens != entry.tokens || h.name != key.name || h.owner != key.owner {
                return Err(FileError::Field {
                    path,
                    field: "tokens",
                    detail: format!(
                        "the file holds {} tokens of session {:?}, the daemon {} of {:?}",
                        h.tokens, h.name, entry.tokens, key.name
                    ),
                }
                .into());
            }
        }
        Ok(Saved {
            info: entry.info(&key, who),
            path: self.path_of(&key),
            written,
        })
    }

    /// Forgets session `name` and removes its file. Refused while a request uses it. A file
    /// the daemon will not load (damaged, another format version or model, not the daemon's
    /// own, not a regular file) is removed too — the refusal tells the user to do exactly
    /// that —, by the owner its header names if the daemon wrote it, else by root only.
    pub fn delete(&mut self, name: &str, who: Access) -> Result<(), SessionStoreError> {
        let key = SessionKey::resolve(name, who)?;
        let own_file = file::file_name(&file::stem(key.owner, &key.name));
        let file_name = match self.entry_for(name, who) {
            Ok((_, entry)) => {
                if let Some(request) = entry.in_use {
                    return Err(SessionStoreError::Busy {
                        name: name.to_string(),
                        request,
                    });
                }
                entry.file.clone()
            }
            Err(SessionStoreError::File(_)) => {
                let owner = self.claimed_owner(&own_file);
                if !permitted(owner, who) {
                    return Err(SessionStoreError::PermissionDenied {
                        name: name.to_string(),
                        owner,
                    });
                }
                Some(own_file)
            }
            Err(e) => return Err(e),
        };
        if let Some(file_name) = file_name {
            match self.dir.remove(&file_name) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    let path = self.dir.path().join(&file_name);
                    return Err(FileError::Io { path, error }.into());
                }
            }
        }
        self.sessions.remove(&key);
        Ok(())
    }

    /// Writes every in-memory session whose file is not current (daemon shutdown). Returns
    /// the failures with the session each concerns: those sessions' newest states are lost.
    pub fn save_all(&mut self) -> Vec<(SessionKey, SessionStoreError)> {
        let keys: Vec<SessionKey> = self.sessions.keys().cloned().collect();
        keys.into_iter()
            .filter_map(|k| self.write(&k).err().map(|e| (k, e)))
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
        let key = store.reserve(name, who, 1).unwrap();
        let (_, reused) = store.start(&key, prompt).unwrap();
        assert!(
            store
                .finish(&key, vec![snap(prompt), snap(full)])
                .is_empty()
        );
        reused
    }

    fn key(owner: u32, name: &str) -> SessionKey {
        SessionKey {
            owner: Some(owner),
            name: name.into(),
        }
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
        // Another uid naming it as 10/a: refused everywhere; it does not see it.
        for e in [
            s.reserve("10/a", Some(11), 2).unwrap_err(),
            s.save("10/a", Some(11)).unwrap_err(),
            s.delete("10/a", Some(11)).unwrap_err(),
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
        assert_eq!(s.list(Some(10))[0].name, "a");
        // Root sees it by owner and name, and names it so.
        let listed = s.list(Some(0));
        assert_eq!(
            (listed[0].name.as_str(), listed[0].owner),
            ("10/a", Some(10))
        );
        assert!(s.save("10/a", Some(0)).is_ok());
        // One request at a time; leased while it runs, not after its release.
        assert_eq!(s.leased(), 0);
        let a = s.reserve("a", Some(10), 7).unwrap();
        assert_eq!(s.leased(), 1);
        assert!(matches!(
            s.reserve("a", Some(10), 8),
            Err(SessionStoreError::Busy { request: 7, .. })
        ));
        assert!(matches!(
            s.delete("a", Some(10)),
            Err(SessionStoreError::Busy { .. })
        ));
        s.release(&a);
        assert_eq!(s.leased(), 0);
        for bad in ["../x", "x/a", "10/../a", "/a"] {
            assert!(
                matches!(
                    s.reserve(bad, Some(10), 9),
                    Err(SessionStoreError::InvalidName(_))
                ),
                "{bad}"
            );
        }
        s.delete("a", Some(10)).unwrap();
        assert!(matches!(
            s.save("a", Some(10)),
            Err(SessionStoreError::NotFound(_))
        ));
    }

    /// Issue 35 point 6: B's `work` is not A's — each uid has its own names, files and state.
    #[test]
    fn names_are_per_uid() {
        let tmp = scratch("store-names");
        let dir = tmp.path().join("sessions");
        let (mut s, _) = SessionStore::open(&dir, "fp", u64::MAX).unwrap();
        turn(&mut s, "work", Some(10), &[1, 2], &[1, 2, 3]);
        turn(&mut s, "work", Some(11), &[7, 8], &[7, 8, 9]);
        assert_eq!(s.len(), 2);
        assert_eq!(
            turn(&mut s, "work", Some(10), &[1, 2, 3, 4], &[1, 2, 3, 4]),
            3
        );
        assert_eq!(
            turn(&mut s, "work", Some(11), &[7, 8, 9, 4], &[7, 8, 9, 4]),
            3
        );
        assert!(s.save_all().is_empty());
        for (owner, history) in [(10, [1, 2, 3, 4]), (11, [7, 8, 9, 4])] {
            let path = s.path_of(&key(owner, "work"));
            assert!(
                path.ends_with(format!("{owner}@work.k3s")),
                "{}",
                path.display()
            );
            let (h, snaps) = file::load(&path, &kept::state_key("fp")).unwrap();
            assert_eq!((h.owner, h.name.as_str()), (Some(owner), "work"));
            assert_eq!(snaps.last().unwrap().history, history);
        }
        // Deleting one leaves the other.
        s.delete("work", Some(11)).unwrap();
        assert_eq!(s.list(Some(10)).len(), 1);
        let (again, skipped) = SessionStore::open(&dir, "fp", u64::MAX).unwrap();
        assert!(skipped.is_empty());
        assert_eq!(again.list(Some(0)).len(), 1);
    }

    #[test]
    fn an_earlier_k3ds_bare_named_file_is_indexed_by_its_header_and_renamed_at_its_next_write() {
        let tmp = scratch("store-bare");
        let dir = tmp.path().join("sessions");
        let sessions = SessionDir::open(&dir).unwrap();
        let header = FileHeader {
            fingerprint: kept::state_key("fp"),
            name: "old".into(),
            owner: Some(10),
            tokens: 2,
            state_bytes: 0,
        };
        let stem_file = file::path_of(&dir, Some(10), "old");
        file::save(&sessions, &header, &[snap(&[1, 2])]).unwrap();
        std::fs::rename(&stem_file, dir.join("old.k3s")).unwrap();
        let (mut s, skipped) = SessionStore::open(&dir, "fp", u64::MAX).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        assert!(s.list(Some(11)).is_empty());
        assert_eq!(turn(&mut s, "old", Some(10), &[1, 2, 3], &[1, 2, 3, 4]), 2);
        assert!(s.save_all().is_empty());
        assert!(stem_file.exists() && !dir.join("old.k3s").exists());
    }

    #[test]
    fn a_uid_has_at_most_its_quota_of_sessions_and_file_bytes() {
        let tmp = scratch("store-quota");
        let dir = tmp.path().join("sessions");
        let (mut s, _) = SessionStore::open(&dir, "fp", u64::MAX).unwrap();
        s.set_quota(Quota {
            sessions: 2,
            disk_bytes: 2 * (bytes_of(&[snap(&[1, 2]), snap(&[1, 2, 3])]) + FRAMING),
        });
        turn(&mut s, "a", Some(10), &[1, 2], &[1, 2, 3]);
        turn(&mut s, "b", Some(10), &[1, 2], &[1, 2, 3]);
        let refused = s.reserve("c", Some(10), 3).unwrap_err();
        assert!(
            matches!(
                refused,
                SessionStoreError::Quota {
                    limit: QuotaLimit::Sessions(2),
                    used: 2,
                    ..
                }
            ),
            "{refused:?}"
        );
        assert!(
            refused.to_string().contains("--sessions-per-uid 2"),
            "{refused}"
        );
        // Another uid is not counted against it.
        turn(&mut s, "c", Some(11), &[1, 2], &[1, 2, 3]);
        assert!(s.save("a", Some(10)).is_ok() && s.save("b", Some(10)).is_ok());
        // A session grown past the file quota is not written.
        let b = s.reserve("b", Some(10), 4).unwrap();
        s.start(&b, &[1, 2, 3, 4]).unwrap();
        s.finish(&b, vec![snap(&(0..20_000).collect::<Vec<_>>())]);
        let e = s.save("b", Some(10)).unwrap_err();
        assert!(
            matches!(
                e,
                SessionStoreError::Quota {
                    limit: QuotaLimit::DiskBytes(_),
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.is_storage_failure() && e.is_out_of_space());
    }

    /// Issue 45 point 1: the arithmetic of a uid's share, and the refusal that gives it.
    #[test]
    fn a_uids_share_of_the_filesystem_keeps_room_for_a_newcomer() {
        let room = |users| FsRoom {
            available: 1 << 20,
            capacity: 2 << 20,
            users,
        };
        assert_eq!(room(1).share(), 1 << 20, "alone: half");
        assert_eq!(room(2).share(), (2 << 20) / 3, "two: a third each");
        let e = SessionStoreError::Quota {
            owner: Some(1001),
            limit: room(2).limit(),
            used: 900_000,
        };
        assert!(e.is_storage_failure() && e.is_out_of_space());
        let text = e.to_string();
        assert!(
            text.contains("uid 1001's session files would take 900000 bytes")
                && text.contains(
                    "2097152 bytes (free space and session files) / (2 users with sessions + 1 \
                     kept for a newcomer) = 699050 bytes"
                ),
            "{text}"
        );
    }

    #[test]
    fn the_heavier_user_gives_way_to_the_room_kept_for_lighter_ones() {
        let usage: BTreeMap<Option<u32>, u64> = [(Some(10), 100), (Some(11), 1000)].into();
        // 11 writing 50 more: 10 holds less, so twice 10's bytes stay free.
        assert_eq!(kept_for_others(Some(11), 50, &usage), 200);
        // 10 writing: 11 holds more than 10 would, so nothing is kept for it.
        assert_eq!(kept_for_others(Some(10), 50, &usage), 0);
        // 10 growing past 11: now 11 is the lighter one.
        assert_eq!(kept_for_others(Some(10), 950, &usage), 2000);
        // A new user with nothing yet: everyone heavier is on its own.
        assert_eq!(kept_for_others(Some(12), 10, &usage), 0);
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
        let x = s.reserve("x", Some(5), 3).unwrap();
        let (state, reused) = s.start(&x, &[1, 2, 3, 9]).unwrap();
        assert_eq!((state, reused), (Some(snap(&[1, 2, 3]).state), 3));
        s.release(&x);
        assert!(!s.list(Some(5))[1].in_memory);
        assert!(s.save_all().is_empty());
        // A restart indexes both; the other model's store indexes neither.
        let (mut again, skipped) = SessionStore::open(&dir, "fp", one).unwrap();
        assert!(skipped.is_empty());
        assert_eq!(again.len(), 2);
        let y = again.reserve("y", Some(5), 1).unwrap();
        assert_eq!(again.start(&y, &[1, 2, 3, 4]).unwrap().1, 3);
        let (mut other, skipped) = SessionStore::open(&dir, "other", one).unwrap();
        assert_eq!((other.len(), skipped.len()), (0, 2));
        assert!(matches!(
            other.reserve("y", Some(5), 1),
            Err(SessionStoreError::File(FileError::Fingerprint { .. }))
        ));
    }

    /// Memory: the user holding the most spills first, and a session whose write fails is
    /// dropped from memory with the failure reported — never kept above the allowance.
    #[test]
    fn the_heaviest_user_spills_first_and_a_failed_spill_is_dropped_not_kept() {
        let tmp = scratch("store-fair");
        let dir = tmp.path().join("sessions");
        let one = bytes_of(&[snap(&[1, 2]), snap(&[1, 2, 3])]);
        let (mut s, _) = SessionStore::open(&dir, "fp", 3 * one).unwrap();
        turn(&mut s, "a", Some(10), &[1, 2], &[1, 2, 3]);
        turn(&mut s, "b1", Some(11), &[1, 2], &[1, 2, 3]);
        turn(&mut s, "b2", Some(11), &[1, 2], &[1, 2, 3]);
        // B's third: B holds the most, so B's oldest spills although A's is older.
        turn(&mut s, "b3", Some(11), &[1, 2], &[1, 2, 3]);
        let in_memory = |s: &SessionStore, who| -> Vec<String> {
            s.list(Some(who))
                .into_iter()
                .filter(|i| i.in_memory)
                .map(|i| i.name)
                .collect()
        };
        assert_eq!(in_memory(&s, 10), ["a"]);
        assert_eq!(in_memory(&s, 11), ["b2", "b3"]);
        // Nothing of B's can be written (its quota is too small). The session whose turn
        // ends gives way — dropped, not kept, and returned for its client (issue 45.3) — not
        // b2, whose turn already succeeded.
        s.set_quota(Quota {
            sessions: 64,
            disk_bytes: 1,
        });
        let b4 = s.reserve("b4", Some(11), 9).unwrap();
        let dropped = s.finish(&b4, vec![snap(&[1, 2]), snap(&[1, 2, 3])]);
        assert_eq!(dropped.len(), 1, "{dropped:?}");
        assert_eq!(dropped[0].key, key(11, "b4"));
        assert!(!dropped[0].older_on_disk);
        assert!(
            dropped[0].to_string().contains("it is gone"),
            "{}",
            dropped[0]
        );
        assert!(s.memory_bytes() <= 3 * one);
        assert_eq!(in_memory(&s, 10), ["a"], "A's session is untouched");
        assert_eq!(
            in_memory(&s, 11),
            ["b2", "b3"],
            "B's earlier sessions are kept"
        );
        // Memory above the allowance (a spilled session loaded back by a running turn) and a
        // finishing session with no state to give: what cannot be written is dropped all the
        // same, reported — never kept above the allowance.
        let b1 = s.reserve("b1", Some(11), 10).unwrap();
        s.start(&b1, &[1, 2, 3, 4]).unwrap();
        assert!(s.memory_bytes() > 3 * one);
        let empty = s.reserve("c", Some(12), 11).unwrap();
        let dropped = s.release(&empty);
        assert!(s.memory_bytes() <= 3 * one);
        assert_eq!(dropped.len(), 1, "{dropped:?}");
        assert_eq!(dropped[0].key, key(11, "b2"), "the heaviest user's oldest");
    }

    #[test]
    fn corrupt_file_is_refused_at_use() {
        let tmp = scratch("store-corrupt");
        let dir = tmp.path().join("sessions");
        let (mut s, _) = SessionStore::open(&dir, "fp", u64::MAX).unwrap();
        turn(&mut s, "c", Some(5), &[1, 2], &[1, 2, 3]);
        s.save("c", Some(5)).unwrap();
        let path = file::path_of(&dir, Some(5), "c");
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 40;
        bytes[last] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let (mut again, skipped) = SessionStore::open(&dir, "fp", u64::MAX).unwrap();
        // The header is intact, so it is listed; using it reports the checksum.
        assert!(skipped.is_empty());
        let c = again.reserve("c", Some(5), 1).unwrap();
        assert!(matches!(
            again.start(&c, &[1, 2, 3, 4]),
            Err(SessionStoreError::File(FileError::Checksum { .. }))
        ));
        again.release(&c);
    }
}
