//! Why a session operation was refused ([`SessionStoreError`]), worded for the user who asked:
//! which session, whose it is, which per-uid limit or how much room was missing.

use std::path::PathBuf;

use super::file::FileError;
use super::store::SessionKey;
use crate::echo::Echo;

/// Why a session operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum SessionStoreError {
    #[error("invalid session name {}: use 1–64 of A-Z a-z 0-9 . _ - (not starting with '.'), or UID/NAME for another user's as root", Echo(.0))]
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
    #[error("{}", quota_text(*owner, *limit, *used))]
    Quota {
        owner: Option<u32>,
        limit: QuotaLimit,
        used: u64,
    },
    #[error(
        "session {} was not written: the session directory's filesystem has {available} bytes \
         free and writing {needed} would leave less than the {reserved} bytes kept so that the \
         sessions of users holding less can be written again; delete a session \
         (k3 sessions rm NAME)",
        Echo(name)
    )]
    Reserved {
        name: String,
        needed: u64,
        available: u64,
        reserved: u64,
    },
    /// A session that had to leave memory could not be written, so its newest state is gone
    /// ([`Dropped`]); the turn that made that state is told (issue 45 point 3).
    #[error("{0}")]
    Dropped(Box<Dropped>),
    #[error(transparent)]
    File(#[from] FileError),
    #[error("session directory {path}: {error}")]
    Dir {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// Which per-uid limit a [`SessionStoreError::Quota`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaLimit {
    /// Sessions one uid may have.
    Sessions(usize),
    /// Bytes of session files one uid may have in the session directory.
    DiskBytes(u64),
    /// Bytes of session files one uid may have as its share of what the session filesystem
    /// can hold (issue 45 point 1): `capacity` (free bytes plus every session file) divided
    /// among the `users` holding sessions and one more kept for a newcomer.
    FsShare {
        share: u64,
        capacity: u64,
        users: usize,
    },
}

fn quota_text(owner: Option<u32>, limit: QuotaLimit, used: u64) -> String {
    let who = owner.map_or_else(
        || "callers of unknown uid".to_string(),
        |u| format!("uid {u}"),
    );
    match limit {
        QuotaLimit::Sessions(n) => format!(
            "{who} has {used} sessions, the most one user may have (--sessions-per-uid {n}); \
             delete one (k3 sessions rm NAME)"
        ),
        QuotaLimit::DiskBytes(n) => format!(
            "{who}'s session files would take {used} bytes, more than one user may have \
             (--session-disk-gb-per-uid: {n} bytes); delete a session (k3 sessions rm NAME)"
        ),
        QuotaLimit::FsShare {
            share,
            capacity,
            users,
        } => format!(
            "{who}'s session files would take {used} bytes, more than one user's share of the \
             session filesystem: {capacity} bytes (free space and session files) / ({users} \
             users with sessions + 1 kept for a newcomer) = {share} bytes; delete a session \
             (k3 sessions rm NAME)"
        ),
    }
}

/// A session dropped from memory because it could not be written (see the store's module
/// docs).
#[derive(Debug)]
pub struct Dropped {
    pub key: SessionKey,
    pub error: SessionStoreError,
    /// Whether an older state of it is still on disk.
    pub older_on_disk: bool,
}

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "session {} could not be written and was dropped from memory to stay within the \
             allowance ({}): {}",
            self.key,
            if self.older_on_disk {
                "its file keeps an older state"
            } else {
                "it had no file: it is gone"
            },
            self.error
        )
    }
}

impl SessionStoreError {
    /// Reading or writing the session directory failed or was refused for want of room (the
    /// disk's or the quota's fault, not the request's nor the model's): the session's state
    /// may not have been kept.
    pub fn is_storage_failure(&self) -> bool {
        matches!(
            self,
            SessionStoreError::File(FileError::Io { .. })
                | SessionStoreError::Dir { .. }
                | SessionStoreError::Reserved { .. }
                | SessionStoreError::Dropped(_)
                | SessionStoreError::Quota {
                    limit: QuotaLimit::DiskBytes(_) | QuotaLimit::FsShare { .. },
                    ..
                }
        )
    }

    /// A storage failure because the disk, the reserve kept for others or a quota is full.
    pub fn is_out_of_space(&self) -> bool {
        let error = match self {
            SessionStoreError::File(FileError::Io { error, .. })
            | SessionStoreError::Dir { error, .. } => error,
            SessionStoreError::Reserved { .. } | SessionStoreError::Quota { .. } => return true,
            SessionStoreError::Dropped(d) => return d.error.is_out_of_space(),
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
