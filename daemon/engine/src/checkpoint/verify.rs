//! Checking a model directory against a SHA-256 manifest ([`super::manifest`]) with several
//! files hashed at once, resumably: each file that verifies is recorded in a small state file
//! keyed by name, size and modification time, so an interrupted run (1.56 TB takes a while)
//! skips what it already checked when the file has not changed since.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::manifest::{Entry, Manifest, hex};

/// Bytes per read while hashing.
const READ_SIZE: usize = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("reading {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("writing {path}: {error}")]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// Identity of a file's contents as far as resuming goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    pub size: u64,
    pub mtime_ns: i128,
}

impl Stamp {
    pub fn of(path: &Path) -> Result<Stamp, VerifyError> {
        let meta = std::fs::metadata(path).map_err(|error| VerifyError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        use std::os::unix::fs::MetadataExt;
        Ok(Stamp {
            size: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        })
    }
}

/// What a previous run verified: file name → (stamp, digest that matched).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ResumeState {
    pub files: BTreeMap<String, (Stamp, String)>,
}

impl ResumeState {
    /// The state at `path`; empty if absent or unreadable (a fresh start is always safe).
    pub fn load(path: &Path) -> ResumeState {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default()
    }

    /// Write atomically (temporary file, then rename) so a killed run leaves a valid state.
    pub fn save(&self, path: &Path) -> Result<(), VerifyError> {
        let err = |error| VerifyError::Write {
            path: path.to_path_buf(),
            error,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let tmp = path.with_extension("tmp");
        let text = serde_json::to_string(self).map_err(|e| err(std::io::Error::other(e)))?;
        std::fs::write(&tmp, text).map_err(err)?;
        std::fs::rename(&tmp, path).map_err(err)
    }
}

/// Where the resume state of `manifest` lives: `$XDG_STATE_HOME/k3/verify/` (default
/// `~/.local/state`), one file per manifest keyed by its absolute path, so a read-only model
/// directory is never written to. `None` when neither variable is set.
pub fn default_state_path(manifest: &Path) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
    let abs = std::path::absolute(manifest).unwrap_or_else(|_| manifest.to_path_buf());
    let key = Sha256::digest(abs.as_os_str().as_encoded_bytes());
    let key: String = key.iter().take(8).map(|b| format!("{b:02x}")).collect();
    Some(base.join("k3").join("verify").join(format!("{key}.json")))
}

/// Bytes done of long byte-counting work (hashing here, packing in [`crate::pack`]), updated as
/// it goes; read them from another thread.
#[derive(Debug, Default)]
pub struct ByteProgress {
    /// Bytes of the files to hash in this run (skipped files excluded).
    pub total: AtomicU64,
    pub done: AtomicU64,
}

/// SHA-256 of a file, adding bytes to `progress.done` as they are hashed. The pages read are
/// dropped from the page cache as we go: verifying a checkpoint larger than RAM should not
/// evict everything else.
pub fn hash_file(path: &Path, progress: &ByteProgress) -> Result<[u8; 32], VerifyError> {
    let err = |error| VerifyError::Read {
        path: path.to_path_buf(),
        error,
    };
    let mut file = crate::input_file::open(path).map_err(err)?;
    use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
    // Advice only; a filesystem that ignores it changes nothing but cache use.
    let _ = posix_fadvise(&file, 0, 0, PosixFadviseAdvice::POSIX_FADV_SEQUENTIAL);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; READ_SIZE];
    let mut offset: i64 = 0;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(err(e)),
        };
        let chunk = buf.get(..n).unwrap_or(&buf);
        hasher.update(chunk);
        let _ = posix_fadvise(
            &file,
            offset,
            n as i64,
            PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        );
        offset = offset.saturating_add(n as i64);
        progress.done.fetch_add(n as u64, Ordering::Relaxed);
    }
    Ok(hasher.finalize().into())
}

/// The verdict on one listed file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Verified,
    /// Verified by an earlier run and unchanged since (same size and mtime).
    Resumed,
    Mismatch {
        expected: String,
        actual: String,
    },
    Missing,
}

/// Every listed file's verdict, in manifest order.
#[derive(Debug, Clone)]
pub struct Report {
    pub files: Vec<(String, Verdict)>,
    /// Bytes hashed in this run.
    pub hashed_bytes: u64,
}

impl Report {
    pub fn all_good(&self) -> bool {
        self.files
            .iter()
            .all(|(_, o)| matches!(o, Verdict::Verified | Verdict::Resumed))
    }
}

/// Run `work` over `items` on `threads` threads, largest first, collecting results in order.
fn parallel<T: Sync, R: Send>(
    items: &[T],
    size: impl Fn(&T) -> u64,
    threads: usize,
    work: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(items.get(i).map_or(0, &size)));
    let queue = Mutex::new(order);
    let results: Mutex<Vec<(usize, R)>> = Mutex::new(Vec::with_capacity(items.len()));
    std::thread::scope(|s| {
        for _ in 0..threads.max(1).min(items.len().max(1)) {
            s.spawn(|| {
                loop {
                    let next = queue.lock().map(|mut q| q.pop()).unwrap_or(None);
                    let Some(i) = next.and_then(|i| items.get(i).map(|t| (i, t))) else {
                        break;
                    };
                    let r = work(i.1);
                    if let Ok(mut out) = results.lock() {
                        out.push((i.0, r));
                    }
                }
            });
        }
    });
    let mut out = results.into_inner().unwrap_or_else(|p| p.into_inner());
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

/// Check every file of `manifest` under `dir` on `threads` threads, skipping files `state_path`
/// records as verified with the same stamp and digest, and recording each newly verified file
/// there as soon as it is done.
pub fn verify(
    dir: &Path,
    manifest: &Manifest,
    state_path: Option<&Path>,
    threads: usize,
    progress: &ByteProgress,
) -> Result<Report, VerifyError> {
    let state = Mutex::new(state_path.map(ResumeState::load).unwrap_or_default());
    // Decide up front what needs hashing, so the progress total is right.
    let mut plan: Vec<(&Entry, Option<Stamp>, bool)> = Vec::new();
    for e in &manifest.entries {
        let path = dir.join(&e.name);
        let stamp = match Stamp::of(&path) {
            Ok(s) => Some(s),
            Err(VerifyError::Read { error, .. })
                if error.kind() == std::io::ErrorKind::NotFound =>
            {
                None
            }
            Err(other) => return Err(other),
        };
        let expected = hex(&e.sha256);
        let resumed = stamp.is_some_and(|s| {
            state
                .lock()
                .is_ok_and(|st| st.files.get(&e.name) == Some(&(s, expected.clone())))
        });
        if let (Some(s), false) = (stamp, resumed) {
            progress.total.fetch_add(s.size, Ordering::Relaxed);
        }
        plan.push((e, stamp, resumed));
    }
    let results = parallel(
        &plan,
        |(_, stamp, resumed)| {
            if *resumed {
                0
            } else {
                stamp.map_or(0, |s| s.size)
            }
        },
        threads,
        |(e, stamp, resumed)| -> Result<Verdict, VerifyError> {
            let Some(stamp) = stamp else {
                return Ok(Verdict::Missing);
            };
            if *resumed {
                return Ok(Verdict::Resumed);
            }
            let path = dir.join(&e.name);
            let actual = hex(&hash_file(&path, progress)?);
            let expected = hex(&e.sha256);
            // Record only if the file did not change while we read it.
            let unchanged = Stamp::of(&path).is_ok_and(|s| s == *stamp);
            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
            if actual == expected {
                if unchanged {
                    st.files.insert(e.name.clone(), (*stamp, expected));
                    if let Some(p) = state_path {
                        st.save(p)?;
                    }
                }
                Ok(Verdict::Verified)
            } else {
                if st.files.remove(&e.name).is_some()
                    && let Some(p) = state_path
                {
                    st.save(p)?;
                }
                Ok(Verdict::Mismatch { expected, actual })
            }
        },
    );
    let mut files = Vec::with_capacity(results.len());
    for ((e, _, _), r) in plan.iter().zip(results) {
        files.push((e.name.clone(), r?));
    }
    Ok(Report {
        files,
        hashed_bytes: progress.done.load(Ordering::Relaxed),
    })
}

/// Hash `names` under `dir` into a manifest (in the order given).
pub fn build_manifest(
    dir: &Path,
    names: &[String],
    threads: usize,
    progress: &ByteProgress,
) -> Result<Manifest, VerifyError> {
    let mut sized = Vec::with_capacity(names.len());
    for n in names {
        let s = Stamp::of(&dir.join(n))?;
        progress.total.fetch_add(s.size, Ordering::Relaxed);
        sized.push((n, s.size));
    }
    let digests = parallel(
        &sized,
        |(_, s)| *s,
        threads,
        |(n, _)| hash_file(&dir.join(n), progress),
    );
    let mut entries = Vec::with_capacity(names.len());
    for ((n, _), d) in sized.iter().zip(digests) {
        entries.push(Entry {
            name: (*n).clone(),
            sha256: d?,
        });
    }
    Ok(Manifest { entries })
}

/// The files a new manifest covers: every regular, non-hidden file directly in `dir` except
/// the manifest itself, sorted by name (shards, index, config, tokenizer and the rest).
pub fn manifest_candidates(dir: &Path, manifest: &Path) -> Result<Vec<String>, VerifyError> {
    let err = |error| VerifyError::Read {
        path: dir.to_path_buf(),
        error,
    };
    let skip = std::path::absolute(manifest).ok();
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(err)? {
        let entry = entry.map_err(err)?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let is_file = entry.file_type().map_err(err)?.is_file();
        let path = std::path::absolute(entry.path()).ok();
        if is_file && !name.starts_with('.') && path != skip {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}
