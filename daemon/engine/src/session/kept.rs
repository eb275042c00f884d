//! Automatic prefix reuse's states on disk (issue 42 point 2): a local account's kept states
//! outlive the daemon, so an agent's next session after a restart continues from its prelude
//! instead of prefilling it again.
//!
//! * **Where**: the session directory, in the owner's namespace, as `UID@DIGEST.k3p`, mode
//!   0600 — the session file format ([`super::file`]: magic, version, checksum, written to a
//!   temporary file, fsynced and renamed) holding one snapshot. The header's `fingerprint` is
//!   the [`state_key`] (the model's fingerprint and the numerics contract's version), its
//!   `name` says whether the state ends a prelude, its `owner` is the uid.
//! * **Keyed** by the ids the state covers, with the state key: `DIGEST` is the SHA-256 of
//!   both ([`digest`]). A prompt finds a file by hashing its own prefixes of the lengths on
//!   disk ([`SessionStore::load_kept`]); the file's ids must then equal them. A state of
//!   another checkpoint or contract has another key: it is neither indexed nor loaded (and,
//!   being of no use to this daemon, removed at start).
//! * **Written** by the serve core after the reply, off the request's path: a [`KeptWrite`] is
//!   reserved under the store's lock ([`SessionStore::reserve_kept`]: within the allowance),
//!   written without it ([`KeptWrite::write`]), then committed.
//! * **Bounded** by the owner's allowance of session files (`Quota::disk_bytes`), shared with
//!   its named sessions: an owner's write makes room by removing its own least recently used
//!   kept states — those that do not end a prelude first; a state that does not end a prelude
//!   never removes one that does —, and its named sessions' writes remove them too. A write
//!   never takes the room kept for the sessions of users holding less
//!   ([`super::store`]'s reserve), and nobody's write removes another uid's files.
//! * **Damaged** files — truncated, modified, unreadable — are never loaded: loading checks
//!   the checksum and the ids, and a file that fails is removed and reported for the log.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use super::dir::SessionDir;
use super::file::{self, FileError, FileHeader};
use super::share::kept_for_others;
use super::snapshot::Snapshot;
use super::store::{FRAMING, SessionStore, bytes_of};
use crate::checkpoint::NUMERICS_CONTRACT;

/// File name extension of kept states.
pub const EXTENSION: &str = "k3p";
/// The header `name` of a state that ends a prelude, and of any other.
const PRELUDE: &str = "prelude";
const TURN: &str = "turn";

/// What a state on disk is bound to besides its ids: the model's fingerprint and the numerics
/// contract's version ([`NUMERICS_CONTRACT`]).
pub fn state_key(fingerprint: &str) -> String {
    format!("{fingerprint} numerics {NUMERICS_CONTRACT}")
}

fn hasher(key: &str) -> Sha256 {
    let mut h = Sha256::new();
    h.update(key.as_bytes());
    h.update([0]);
    h
}

fn feed(h: &mut Sha256, ids: &[u32]) {
    for chunk in ids.chunks(4096) {
        let bytes: Vec<u8> = chunk.iter().flat_map(|id| id.to_le_bytes()).collect();
        h.update(&bytes);
    }
}

fn hex(h: Sha256) -> String {
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The digest naming the file of the state that covers `ids` under state key `key`.
pub fn digest(key: &str, ids: &[u32]) -> String {
    let mut h = hasher(key);
    feed(&mut h, ids);
    hex(h)
}

/// `UID@DIGEST.k3p`.
pub fn file_name(owner: u32, digest: &str) -> String {
    format!("{owner}@{digest}.{EXTENSION}")
}

/// The owner and digest a kept state's file name gives, if it is one.
pub fn parse_file_name(name: &str) -> Option<(u32, &str)> {
    let (uid, digest) = name
        .strip_suffix(&format!(".{EXTENSION}"))?
        .split_once('@')?;
    let digits = !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_digit());
    let hex = digest.len() == 64
        && digest
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    (digits && hex)
        .then(|| uid.parse().ok())
        .flatten()
        .map(|uid| (uid, digest))
}

/// Whether `name` is a kept state's temporary file ([`file::save_as`]), which only a write in
/// progress or one a crash interrupted leaves.
pub fn is_temp_name(name: &str) -> bool {
    name.strip_prefix('.')
        .and_then(|n| n.strip_suffix(".tmp"))
        .and_then(parse_file_name)
        .is_some()
}

/// Why a kept state was not written (logged; nothing else depends on it).
#[derive(Debug, thiserror::Error)]
pub enum KeptError {
    #[error(
        "uid {owner}'s session files and kept states would take {used} bytes, more than one \
         user may have (--session-disk-gb-per-uid: {limit} bytes)"
    )]
    Quota { owner: u32, used: u64, limit: u64 },
    #[error(
        "the session directory's filesystem has {available} bytes free: writing {needed} would \
         leave less than the {reserved} bytes kept so that the sessions of users holding less \
         can be written again"
    )]
    Reserved {
        needed: u64,
        available: u64,
        reserved: u64,
    },
    #[error("session directory {path}: {error}")]
    Dir {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    File(#[from] FileError),
}

struct KeptFile {
    tokens: usize,
    /// The file's size (while it is written: what it will take at most).
    bytes: u64,
    prelude: bool,
    last_used: SystemTime,
    /// Its write completed: it may be loaded and removed.
    written: bool,
}

/// The kept states on disk and what happened to them, for a status report and `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeptFigures {
    /// Files on disk, and their bytes.
    pub files: usize,
    pub bytes: u64,
    /// Lookups that loaded a state from disk.
    pub hits: u64,
    /// Lookups the disk held no longer state for than memory had.
    pub misses: u64,
    /// Files removed to make room in their owner's allowance.
    pub evictions: u64,
    /// Files written, and their bytes.
    pub written: u64,
    pub bytes_written: u64,
    /// Writes refused or failed, and damaged files removed.
    pub failed: u64,
}

/// Every kept state in the session directory, by owner and digest.
pub struct KeptIndex {
    key: String,
    files: BTreeMap<(u32, String), KeptFile>,
    counts: KeptFigures,
}

impl KeptIndex {
    pub(super) fn new(fingerprint: &str) -> KeptIndex {
        KeptIndex {
            key: state_key(fingerprint),
            files: BTreeMap::new(),
            counts: KeptFigures::default(),
        }
    }

    /// Bytes of `owner`'s kept states (none for a caller of unknown uid: it keeps nothing).
    pub(super) fn bytes_of(&self, owner: Option<u32>) -> u64 {
        self.files
            .iter()
            .filter(|((o, _), _)| Some(*o) == owner)
            .map(|(_, f)| f.bytes)
            .sum()
    }

    fn figures(&self) -> KeptFigures {
        let written = self.files.values().filter(|f| f.written);
        KeptFigures {
            files: written.clone().count(),
            bytes: written.map(|f| f.bytes).sum(),
            ..self.counts
        }
    }
}

/// A write of one kept state, reserved in its owner's allowance ([`SessionStore::reserve_kept`])
/// and done without the store's lock; then [`SessionStore::commit_kept`].
pub struct KeptWrite {
    dir: Arc<SessionDir>,
    owner: u32,
    digest: String,
    header: FileHeader,
}

impl KeptWrite {
    /// Writes `snapshot` (the one reserved) to its file atomically; the file's size.
    pub fn write(&self, snapshot: &Snapshot) -> Result<u64, FileError> {
        let name = file_name(self.owner, &self.digest);
        file::save_as(
            &self.dir,
            &name,
            &self.header,
            std::slice::from_ref(snapshot),
        )
    }
}

impl SessionStore {
    /// Indexes the kept state `name` found at start. One the daemon wrote that is damaged or
    /// of another model or contract is removed (it can never be loaded), and its error
    /// returned; one it did not write is left alone, refused.
    pub(super) fn index_kept(&mut self, name: &str) -> Result<(), FileError> {
        let Some((owner, digest)) = parse_file_name(name) else {
            return Ok(());
        };
        let (path, mut f) = self.open_trusted(name)?;
        let refusal = match file::read_header_from(&path, &mut f) {
            Ok(h) if h.fingerprint != self.kept.key => FileError::Fingerprint {
                path,
                file: h.fingerprint,
                model: self.kept.key.clone(),
            },
            Ok(h) if h.owner != Some(owner) || !matches!(h.name.as_str(), PRELUDE | TURN) => {
                FileError::Field {
                    path,
                    field: "owner",
                    detail: format!(
                        "a kept state named for uid {owner} says {:?}, {:?}",
                        h.owner, h.name
                    ),
                }
            }
            Ok(h) => {
                let meta = f.metadata().ok();
                self.kept.files.insert(
                    (owner, digest.to_string()),
                    KeptFile {
                        tokens: usize::try_from(h.tokens).unwrap_or(usize::MAX),
                        bytes: meta.as_ref().map_or(0, |m| m.len()),
                        prelude: h.name == PRELUDE,
                        last_used: meta
                            .and_then(|m| m.modified().ok())
                            .unwrap_or(SystemTime::UNIX_EPOCH),
                        written: true,
                    },
                );
                return Ok(());
            }
            Err(e) => e,
        };
        let _ = self.dir.remove(name);
        Err(refusal)
    }

    /// Reserves the write of `snapshot` as a kept state of `owner` (a prelude's if `prelude`):
    /// `None` if it is on disk already (then marked used), else a [`KeptWrite`] within the
    /// owner's allowance — made by removing the owner's least recently used kept states, a
    /// prelude's only for a prelude's — and the room kept for users holding less.
    pub fn reserve_kept(
        &mut self,
        owner: u32,
        snapshot: &Snapshot,
        prelude: bool,
    ) -> Result<Option<KeptWrite>, KeptError> {
        let digest = digest(&self.kept.key, &snapshot.history);
        if let Some(f) = self.kept.files.get_mut(&(owner, digest.clone())) {
            f.last_used = SystemTime::now();
            f.prelude |= prelude;
            return Ok(None);
        }
        let refused = |counts: &mut KeptFigures, e: KeptError| {
            counts.failed += 1;
            Err(e)
        };
        let needed = bytes_of(std::slice::from_ref(snapshot)) + FRAMING;
        let limit = self.quota.disk_bytes;
        let mut used = self.files_of(Some(owner), None) + self.kept.bytes_of(Some(owner));
        let over = (used + needed).saturating_sub(limit);
        // Nothing is removed for a write that would not fit all the same.
        if over > 0 && over <= self.evictable(owner, prelude) {
            used -= self.evict_kept(Some(owner), over, prelude);
        }
        if used + needed > limit {
            let used = used + needed;
            return refused(
                &mut self.kept.counts,
                KeptError::Quota { owner, used, limit },
            );
        }
        let available = match self.dir.available_bytes() {
            Ok(bytes) => bytes,
            Err(error) => {
                let path = self.dir.path().to_path_buf();
                return refused(&mut self.kept.counts, KeptError::Dir { path, error });
            }
        };
        let reserved = kept_for_others(Some(owner), needed, &self.usage(None));
        if available < needed.saturating_add(reserved) {
            let e = KeptError::Reserved {
                needed,
                available,
                reserved,
            };
            return refused(&mut self.kept.counts, e);
        }
        self.kept.files.insert(
            (owner, digest.clone()),
            KeptFile {
                tokens: snapshot.history.len(),
                bytes: needed,
                prelude,
                last_used: SystemTime::now(),
                written: false,
            },
        );
        Ok(Some(KeptWrite {
            dir: Arc::clone(&self.dir),
            owner,
            digest,
            header: FileHeader {
                fingerprint: self.kept.key.clone(),
                name: if prelude { PRELUDE } else { TURN }.to_string(),
                owner: Some(owner),
                tokens: snapshot.history.len() as u64,
                state_bytes: snapshot.state.size_bytes() as u64,
            },
        }))
    }

    /// Records how the reserved `write` went: its file indexed at its size, or forgotten.
    pub fn commit_kept(&mut self, write: &KeptWrite, written: &Result<u64, FileError>) {
        let key = (write.owner, write.digest.clone());
        match written {
            Ok(size) => {
                if let Some(f) = self.kept.files.get_mut(&key) {
                    f.bytes = *size;
                    f.written = true;
                }
                self.kept.counts.written += 1;
                self.kept.counts.bytes_written += size;
            }
            Err(_) => {
                self.kept.files.remove(&key);
                self.kept.counts.failed += 1;
            }
        }
    }

    /// Bytes of `owner`'s kept states that [`Self::evict_kept`] may remove.
    fn evictable(&self, owner: u32, preludes: bool) -> u64 {
        self.kept
            .files
            .iter()
            .filter(|((o, _), f)| *o == owner && f.written && (preludes || !f.prelude))
            .map(|(_, f)| f.bytes)
            .sum()
    }

    /// Removes `owner`'s least recently used kept states until `bytes` are freed or none is
    /// left that may go (a prelude's only when `preludes`, after every other); the bytes freed.
    pub(super) fn evict_kept(&mut self, owner: Option<u32>, bytes: u64, preludes: bool) -> u64 {
        let Some(uid) = owner else {
            return 0;
        };
        let mut freed = 0;
        while freed < bytes {
            let victim = self
                .kept
                .files
                .iter()
                .filter(|((o, _), f)| *o == uid && f.written && (preludes || !f.prelude))
                .min_by_key(|(_, f)| (f.prelude, f.last_used))
                .map(|(k, _)| k.clone());
            let Some(key) = victim else { break };
            if let Some(f) = self.kept.files.remove(&key) {
                let _ = self.dir.remove(&file_name(key.0, &key.1));
                freed += f.bytes;
                self.kept.counts.evictions += 1;
            }
        }
        freed
    }

    /// The longest kept state of `owner` on disk whose ids are a strict prefix of `prompt` and
    /// longer than `longer_than` (what memory holds), with whether it ends a prelude; and the
    /// errors of the damaged files met on the way, which are removed, never loaded.
    pub fn load_kept(
        &mut self,
        owner: u32,
        prompt: &[u32],
        longer_than: usize,
    ) -> (Option<(Snapshot, bool)>, Vec<FileError>) {
        let mut lengths: Vec<usize> = self
            .kept
            .files
            .iter()
            .filter(|((o, _), f)| *o == owner && f.written)
            .map(|(_, f)| f.tokens)
            .filter(|&n| n > longer_than && n < prompt.len())
            .collect();
        lengths.sort_unstable();
        lengths.dedup();
        // Each prefix hashed once: the hasher goes on from one length to the next.
        let mut h = hasher(&self.kept.key);
        let mut fed = 0;
        let mut wanted = Vec::with_capacity(lengths.len());
        for n in lengths {
            feed(&mut h, &prompt[fed..n]);
            fed = n;
            wanted.push((n, hex(h.clone())));
        }
        let mut damaged = Vec::new();
        for (n, digest) in wanted.into_iter().rev() {
            let key = (owner, digest);
            if !self.kept.files.contains_key(&key) {
                continue;
            }
            match self.read_kept(&key, &prompt[..n]) {
                Ok(snapshot) => {
                    let prelude = self.kept.files.get_mut(&key).is_some_and(|f| {
                        f.last_used = SystemTime::now();
                        f.prelude
                    });
                    self.kept.counts.hits += 1;
                    return (Some((snapshot, prelude)), damaged);
                }
                Err(e) => {
                    self.kept.files.remove(&key);
                    let _ = self.dir.remove(&file_name(key.0, &key.1));
                    self.kept.counts.failed += 1;
                    damaged.push(e);
                }
            }
        }
        self.kept.counts.misses += 1;
        (None, damaged)
    }

    /// Loads and checks the kept state `key`, which must cover exactly `ids`.
    fn read_kept(&self, key: &(u32, String), ids: &[u32]) -> Result<Snapshot, FileError> {
        let (path, f) = self.open_trusted(&file_name(key.0, &key.1))?;
        let (_, mut snapshots) = file::load_from(&path, f, &self.kept.key)?;
        match snapshots.pop() {
            Some(s) if snapshots.is_empty() && s.history == ids => Ok(s),
            _ => Err(FileError::Field {
                path,
                field: "history",
                detail: "not the one state its name says it holds".into(),
            }),
        }
    }

    pub fn kept_figures(&self) -> KeptFigures {
        self.kept.figures()
    }
}

#[cfg(test)]
mod tests {
    use super::super::snapshot::tests::{scratch, snap};
    use super::super::store::Quota;
    use super::*;

    fn store(dir: &std::path::Path, fingerprint: &str) -> SessionStore {
        let (store, skipped) = SessionStore::open(dir, fingerprint, u64::MAX).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        store
    }

    fn kept(store: &mut SessionStore, owner: u32, history: &[u32], prelude: bool) -> bool {
        let snapshot = snap(history);
        match store.reserve_kept(owner, &snapshot, prelude).unwrap() {
            Some(w) => {
                let written = w.write(&snapshot);
                store.commit_kept(&w, &written);
                written.unwrap();
                true
            }
            None => false,
        }
    }

    #[test]
    fn a_kept_state_outlives_the_store_with_the_same_bits_and_only_for_its_owner() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = scratch("kept-restart");
        let dir = tmp.path().join("sessions");
        let mut s = store(&dir, "fp");
        assert!(kept(&mut s, 10, &[1, 2, 3], true));
        assert!(kept(&mut s, 10, &[1, 2, 3, 4, 5], false));
        assert!(!kept(&mut s, 10, &[1, 2, 3], false), "on disk already");
        let figures = s.kept_figures();
        assert_eq!((figures.files, figures.written), (2, 2));
        let name = file_name(10, &digest(&state_key("fp"), &[1, 2, 3]));
        let mode = std::fs::metadata(dir.join(&name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        drop(s);
        let mut again = store(&dir, "fp");
        // The longest strict prefix; loaded bit for bit.
        let (loaded, damaged) = again.load_kept(10, &[1, 2, 3, 4, 5, 6], 0);
        assert!(damaged.is_empty());
        assert_eq!(loaded, Some((snap(&[1, 2, 3, 4, 5]), false)));
        let (loaded, _) = again.load_kept(10, &[1, 2, 3, 4, 9], 0);
        assert_eq!(loaded, Some((snap(&[1, 2, 3]), true)));
        // Not longer than what memory has; equal to the prompt; another uid's: nothing.
        assert_eq!(again.load_kept(10, &[1, 2, 3, 4, 9], 3).0, None);
        assert_eq!(again.load_kept(10, &[1, 2, 3], 0).0, None);
        assert_eq!(again.load_kept(11, &[1, 2, 3, 4, 5, 6], 0).0, None);
        let figures = again.kept_figures();
        assert_eq!((figures.hits, figures.misses), (2, 3));
        // Another model or numerics contract: not indexed, and removed.
        let (_, skipped) = SessionStore::open(&dir, "other", u64::MAX).unwrap();
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(!dir.join(&name).exists());
    }

    #[test]
    fn a_damaged_file_is_never_loaded_and_a_crashed_write_leaves_nothing() {
        let tmp = scratch("kept-damage");
        let dir = tmp.path().join("sessions");
        let mut s = store(&dir, "fp");
        assert!(kept(&mut s, 10, &[1, 2], false));
        assert!(kept(&mut s, 10, &[1, 2, 3, 4], false));
        let long = dir.join(file_name(10, &digest(&state_key("fp"), &[1, 2, 3, 4])));
        let bytes = std::fs::read(&long).unwrap();
        // Truncated: the shorter state is continued instead, and the damaged file is gone.
        std::fs::write(&long, &bytes[..bytes.len() - 7]).unwrap();
        let (loaded, damaged) = s.load_kept(10, &[1, 2, 3, 4, 5], 0);
        assert_eq!(loaded, Some((snap(&[1, 2]), false)));
        assert!(
            matches!(damaged.as_slice(), [FileError::Truncated { .. }]),
            "{damaged:?}"
        );
        assert!(!long.exists());
        // A flipped byte: the checksum refuses it.
        assert!(kept(&mut s, 10, &[1, 2, 3, 4], false));
        let mut flipped = bytes.clone();
        let at = flipped.len() - 40;
        flipped[at] ^= 1;
        std::fs::write(&long, &flipped).unwrap();
        let (_, damaged) = s.load_kept(10, &[1, 2, 3, 4, 5], 0);
        assert!(
            matches!(damaged.as_slice(), [FileError::Checksum { .. }]),
            "{damaged:?}"
        );
        // A write a crash interrupted leaves its temporary file: removed at start.
        let temp = dir.join(format!(".{}.tmp", file_name(10, &"a".repeat(64))));
        std::fs::write(&temp, b"half").unwrap();
        let _ = store(&dir, "fp");
        assert!(!temp.exists());
    }

    #[test]
    fn the_owners_allowance_is_shared_with_its_sessions_and_preludes_go_last() {
        let tmp = scratch("kept-quota");
        let dir = tmp.path().join("sessions");
        let mut s = store(&dir, "fp");
        // What a write needs at most, and what the file of a 3-id state takes.
        let one = bytes_of(&[snap(&[1, 2, 3])]) + FRAMING;
        assert!(kept(&mut s, 12, &[1, 2, 3], false));
        let size = s.kept.bytes_of(Some(12));
        // Room for three.
        s.set_quota(Quota {
            sessions: 64,
            disk_bytes: 2 * size + one,
        });
        assert!(kept(&mut s, 10, &[9, 9, 9], true));
        assert!(kept(&mut s, 10, &[1, 1, 1], false));
        assert!(kept(&mut s, 10, &[2, 2, 2], false));
        assert!(kept(&mut s, 11, &[3, 3, 3], false));
        // A fourth of uid 10: its oldest state that is not a prelude's makes room.
        assert!(kept(&mut s, 10, &[4, 4, 4], false));
        assert_eq!(s.load_kept(10, &[1, 1, 1, 0], 0).0, None);
        assert!(s.load_kept(10, &[9, 9, 9, 0], 0).0.is_some());
        assert!(
            s.load_kept(11, &[3, 3, 3, 0], 0).0.is_some(),
            "uid 11's stays"
        );
        // A state that is not a prelude's never removes a prelude's: refused when only
        // preludes are left to go.
        s.set_quota(Quota {
            sessions: 64,
            disk_bytes: one,
        });
        let refused = s.reserve_kept(10, &snap(&[5, 5, 5]), false);
        assert!(matches!(refused, Err(KeptError::Quota { owner: 10, .. })));
        assert!(s.load_kept(10, &[9, 9, 9, 0], 0).0.is_some());
        assert!(
            s.load_kept(10, &[4, 4, 4, 0], 0).0.is_some(),
            "nothing removed for it"
        );
        // A named session's write takes the room of its owner's kept states, preludes too.
        let key = s.reserve("work", Some(10), 1).unwrap();
        s.finish(&key, vec![snap(&[1, 2, 3])]);
        s.save("work", Some(10)).unwrap();
        assert_eq!(s.load_kept(10, &[9, 9, 9, 0], 0).0, None);
        assert!(s.kept_figures().evictions >= 3);
    }

    #[test]
    fn names_parse_only_as_written() {
        let d = digest("k", &[1]);
        assert_eq!(parse_file_name(&file_name(7, &d)), Some((7, d.as_str())));
        assert!(is_temp_name(&format!(".{}.tmp", file_name(7, &d))));
        for bad in [
            format!("x@{d}.k3p"),
            format!("@{d}.k3p"),
            format!("7@{}.k3p", &d[1..]),
            format!("7@{}.k3p", d.to_uppercase()),
            format!("7@{d}.k3s"),
            format!("99999999999@{d}.k3p"),
        ] {
            assert_eq!(parse_file_name(&bad), None, "{bad}");
        }
        // Different ids or another key: another file.
        assert_ne!(digest("k", &[1, 2]), digest("k", &[1]));
        assert_ne!(digest("j", &[1]), d);
        assert!(state_key("fp").ends_with(&format!("numerics {NUMERICS_CONTRACT}")));
    }
}
