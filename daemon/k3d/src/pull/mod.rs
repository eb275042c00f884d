//! `k3d pull`: a checkpoint from the Hugging Face Hub into a directory, resumable and checked.
//!
//! The revision is resolved to a commit once and recorded in the directory ([`record`]); the
//! commit's listing ([`hub`]) gives every file's size and digest; free space is compared with
//! what is left to fetch before the first byte; `--jobs` connections fetch files at once
//! ([`transfer`]) and the byte ranges of large ones ([`pieces`]), each file checked
//! ([`checksum`]) before it takes its final name; at the end the `SHA256SUMS` manifest of every
//! checked file is written, which `k3d verify DIR` checks offline. The Hub client is reqwest
//! (rustls on ring); the `hf-hub` crate was evaluated and refused (docs/pulling.md).

pub mod auth;
pub mod checksum;
pub mod display;
pub mod error;
pub mod hub;
pub mod pieces;
pub mod record;
pub mod retry;
pub mod transfer;

use display::Progress;
use error::PullError;
use hub::{Hub, RemoteFile};
use k3_engine::checkpoint::manifest::{self, Entry, Manifest};
use k3_engine::checkpoint::verify::Stamp;
use record::{Checked, Record};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What to pull.
pub struct Request {
    pub repo: String,
    pub dir: PathBuf,
    /// `None`: the commit recorded in `dir`, else `main`.
    pub revision: Option<String>,
    pub include: Vec<glob::Pattern>,
    pub exclude: Vec<glob::Pattern>,
    /// Connections at once, across files and the pieces of large files.
    pub jobs: usize,
    /// Files larger than this many bytes are fetched in pieces of this size.
    pub piece: u64,
    pub token: Option<String>,
    /// Bytes fetched and to fetch, for a progress report the caller runs.
    pub bytes: Arc<k3_engine::checkpoint::verify::ByteProgress>,
}

/// What a pull did.
pub struct Summary {
    pub commit: String,
    pub files: usize,
    pub fetched_files: usize,
    pub fetched_bytes: u64,
    pub kept_files: usize,
    pub seconds: f64,
}

/// How a selected file stands before fetching.
enum Plan {
    /// Checked by an earlier run and unchanged since.
    Kept,
    /// Present under its final name without a record of its check: hashed, kept if it
    /// matches, fetched again if not.
    Recheck,
    /// Missing; `have` bytes already in its partial file.
    Fetch { have: u64 },
}

/// Runs a pull to the end on its own runtime.
pub fn pull(request: Request) -> Result<Summary, PullError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(request.jobs.clamp(1, 4))
        .enable_all()
        .build()
        .map_err(|e| PullError::Usage(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(run(request))
}

fn selected(request: &Request, file: &RemoteFile) -> bool {
    let hit = |patterns: &[glob::Pattern]| patterns.iter().any(|p| p.matches(&file.path));
    (request.include.is_empty() || hit(&request.include)) && !hit(&request.exclude)
}

/// The directory exists and this user may create files in it.
fn writable(dir: &Path) -> Result<(), PullError> {
    let unwritable = |error| PullError::Unwritable {
        dir: dir.to_path_buf(),
        error,
    };
    std::fs::create_dir_all(dir).map_err(unwritable)?;
    let probe = dir.join(".k3d-pull.probe");
    std::fs::write(&probe, b"").map_err(unwritable)?;
    std::fs::remove_file(&probe).map_err(unwritable)
}

/// The commit to pull: the one recorded in `dir` unless `--revision` names another (refused:
/// a directory never mixes two commits), else the one the revision names now.
async fn commit(
    hub: &Hub,
    request: &Request,
    recorded: Option<&Record>,
) -> Result<Record, PullError> {
    if let Some(r) = recorded {
        if r.repo != request.repo {
            return Err(PullError::OtherRepo {
                record: record::path(&request.dir),
                recorded: r.repo.clone(),
                repo: request.repo.clone(),
            });
        }
        if let Some(rev) = &request.revision {
            let resolved = if hub::is_commit(rev) {
                rev.clone()
            } else {
                hub.commit(rev).await?
            };
            if resolved != r.commit {
                return Err(PullError::RevisionMoved {
                    dir: request.dir.clone(),
                    revision: rev.clone(),
                    recorded: r.commit.clone(),
                    resolved,
                });
            }
        }
        return Ok(r.clone());
    }
    let revision = request
        .revision
        .clone()
        .unwrap_or_else(|| "main".to_string());
    let commit = hub.commit(&revision).await?;
    Ok(Record {
        repo: request.repo.clone(),
        revision,
        commit,
        endpoint: hub.endpoint.clone(),
        files: Default::default(),
    })
}

async fn run(request: Request) -> Result<Summary, PullError> {
    let start = Instant::now();
    let dir = request.dir.clone();
    writable(&dir)?;
    let token = auth::token(request.token.as_deref());
    let hub = Arc::new(Hub::new(&auth::endpoint(), &request.repo, token)?);
    let recorded = Record::load(&dir)?;
    let record = commit(&hub, &request, recorded.as_ref()).await?;
    if recorded.is_some() {
        eprintln!(
            "k3d pull: continuing commit {} of {} (`{}`), recorded in {}",
            record.commit,
            record.repo,
            record.revision,
            record::path(&dir).display()
        );
    }
    record.save(&dir)?;
    let listing = hub.files(&record.commit).await?;
    let files: Vec<RemoteFile> = listing
        .iter()
        .filter(|f| selected(&request, f))
        .cloned()
        .collect();
    if files.is_empty() {
        return Err(PullError::Usage(format!(
            "no file of {}@{} matches --include/--exclude ({} files listed)",
            request.repo,
            record.commit,
            listing.len()
        )));
    }
    for own in [manifest::DEFAULT_NAME, record::NAME] {
        if files.iter().any(|f| f.path == own) {
            return Err(PullError::Usage(format!(
                "{} has a file named {own}, which `k3d pull` writes itself: add --exclude {own}",
                request.repo
            )));
        }
    }
    let plans: Vec<(RemoteFile, Plan)> = files
        .into_iter()
        .map(|f| {
            let target = dir.join(&f.path);
            let plan = if record.unchanged(&dir, &f.path) {
                Plan::Kept
            } else if target.exists() {
                Plan::Recheck
            } else {
                let part = transfer::partial_path(&target);
                let have = if f.size > request.piece {
                    pieces::have(&part, f.size, request.piece)
                } else {
                    std::fs::metadata(&part).map_or(0, |m| m.len())
                };
                Plan::Fetch {
                    have: have.min(f.size),
                }
            };
            (f, plan)
        })
        .collect();
    let need: u64 = plans
        .iter()
        .map(|(f, p)| match p {
            Plan::Kept | Plan::Recheck => 0,
            Plan::Fetch { have } => f.size - have,
        })
        .sum();
    let disk = k3_engine::system::Disk::of(&dir).map_err(|e| PullError::Io {
        path: dir.clone(),
        error: std::io::Error::other(e.to_string()),
    })?;
    if need > disk.free {
        return Err(PullError::NoSpace {
            dir: dir.clone(),
            need,
            free: disk.free,
        });
    }
    let total: u64 = plans.iter().map(|(f, _)| f.size).sum();
    let kept = plans
        .iter()
        .filter(|(_, p)| matches!(p, Plan::Kept))
        .count();
    eprintln!(
        "k3d pull: {}@{} into {}: {} files, {:.2} GB; {} already checked; {:.2} GB to fetch ({:.2} GB free there), {} at once",
        request.repo,
        record.commit,
        dir.display(),
        plans.len(),
        total as f64 / 1e9,
        kept,
        need as f64 / 1e9,
        disk.free as f64 / 1e9,
        request.jobs
    );
    let progress = Arc::new(Progress::start(request.bytes.clone(), need));
    let record = Arc::new(Mutex::new(record));
    let mut queue: Vec<(RemoteFile, Plan)> = plans
        .into_iter()
        .filter(|(_, p)| !matches!(p, Plan::Kept))
        .collect();
    // Largest last, so popping takes them first: the long files start early.
    queue.sort_by_key(|(f, _)| f.size);
    let fetched = queue
        .iter()
        .filter(|(_, p)| matches!(p, Plan::Fetch { .. }))
        .count();
    let queue = Arc::new(Mutex::new(queue));
    let connections = Arc::new(tokio::sync::Semaphore::new(request.jobs.max(1)));
    let piece = request.piece;
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..request.jobs.max(1) {
        let (queue, hub, progress, record, dir, connections) = (
            queue.clone(),
            hub.clone(),
            progress.clone(),
            record.clone(),
            dir.clone(),
            connections.clone(),
        );
        workers.spawn(async move {
            loop {
                let next = queue.lock().expect("queue lock").pop();
                let Some((file, plan)) = next else {
                    return Ok::<(), PullError>(());
                };
                let commit = record.lock().expect("record lock").commit.clone();
                let sha256 = match plan {
                    Plan::Recheck => match recheck(&dir, &file).await? {
                        Some(sha) => {
                            progress.line(&format!("{}: present and matching, kept", file.path));
                            Some(sha)
                        }
                        None => {
                            progress.line(&format!(
                                "{}: present but not the listed bytes: deleted, fetching it",
                                file.path
                            ));
                            progress.refetch(file.size);
                            None
                        }
                    },
                    _ => None,
                };
                let sha256 = match sha256 {
                    Some(s) => s,
                    None => {
                        let fetch = transfer::Fetch {
                            hub: &hub,
                            commit: &commit,
                            file: &file,
                            dir: &dir,
                            progress: &progress,
                            connections: &connections,
                            piece,
                        };
                        let sha = fetch.run().await?;
                        progress.line(&format!("{}: {} bytes, checked", file.path, file.size));
                        sha
                    }
                };
                let target = dir.join(&file.path);
                let stamp = Stamp::of(&target).map_err(|e| PullError::Io {
                    path: target.clone(),
                    error: std::io::Error::other(e.to_string()),
                })?;
                let mut r = record.lock().expect("record lock");
                r.files.insert(
                    file.path.clone(),
                    Checked {
                        stamp,
                        sha256: manifest::hex(&sha256),
                    },
                );
                r.save(&dir)?;
            }
        });
    }
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(PullError::Usage(format!("a transfer task failed: {e}"))),
        }
    }
    let fetched_bytes = progress.done();
    drop(progress);
    let record = record.lock().expect("record lock").clone();
    write_manifest(&dir, &record, &listing)?;
    Ok(Summary {
        commit: record.commit.clone(),
        files: listing
            .iter()
            .filter(|f| record.files.contains_key(&f.path))
            .count(),
        fetched_files: fetched,
        fetched_bytes,
        kept_files: kept,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The sha256 of a file found under its final name, if it is the listed one; a mismatching
/// one is deleted.
async fn recheck(dir: &Path, file: &RemoteFile) -> Result<Option<[u8; 32]>, PullError> {
    let path = dir.join(&file.path);
    let len = std::fs::metadata(&path).map_or(0, |m| m.len());
    if len == file.size {
        let (f, p) = (file.clone(), path.clone());
        let digest = tokio::task::spawn_blocking(move || checksum::Digest::of_prefix(&f, &p, len))
            .await
            .map_err(|e| PullError::Usage(format!("hashing task failed: {e}")))?
            .map_err(|error| PullError::Io {
                path: path.clone(),
                error,
            })?;
        if let Ok(sha) = digest.check(file) {
            return Ok(Some(sha));
        }
    }
    std::fs::remove_file(&path).map_err(|e| PullError::write(&path, e))?;
    Ok(None)
}

/// `DIR/SHA256SUMS`: every file of the commit checked so far (by this run or an earlier one,
/// whatever its `--include`), in the listing's order.
fn write_manifest(dir: &Path, record: &Record, listing: &[RemoteFile]) -> Result<(), PullError> {
    let mut entries = Vec::new();
    for f in listing {
        let Some(checked) = record.files.get(&f.path) else {
            continue;
        };
        let sha256 = manifest::parse_hex(&checked.sha256).ok_or_else(|| {
            PullError::Usage(format!(
                "{}: {} has no valid sha256; delete the record to start over",
                record::path(dir).display(),
                f.path
            ))
        })?;
        entries.push(Entry {
            name: f.path.clone(),
            sha256,
        });
    }
    let path = dir.join(manifest::DEFAULT_NAME);
    let tmp = dir.join(format!("{}.tmp", manifest::DEFAULT_NAME));
    std::fs::write(&tmp, Manifest { entries }.to_text()).map_err(|e| PullError::write(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| PullError::write(&path, e))
}
