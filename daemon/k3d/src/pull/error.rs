//! Why a pull stopped: each error says what happened, to which repo, revision or file, and
//! what to do; [`PullError::exit`] gives its documented exit code (docs/reference.md).

use crate::exit::Exit;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error(
        "{endpoint} answered {status} for {repo}: {why}; send a token that may read it with \
         --token, HF_TOKEN or `huggingface-cli login`{token}, and if the repository is gated \
         accept its licence at {endpoint}/{repo} first"
    )]
    Refused {
        endpoint: String,
        repo: String,
        status: u16,
        /// What the refusal means, with the Hub's own `X-Error-Message` when it sent one.
        why: String,
        /// ` (the token sent came from …)`, or ` (no token was sent)`.
        token: String,
    },
    #[error("{what} not found at {endpoint} (404{detail}): {advice}")]
    NotFound {
        endpoint: String,
        what: String,
        detail: String,
        advice: &'static str,
    },
    #[error(
        "{what}: gave up after {attempts} attempts without progress ({last}); the Hub or the \
         network is failing: run the same command again later, it continues where it stopped"
    )]
    Unreachable {
        what: String,
        attempts: u32,
        last: String,
    },
    #[error("{url}: the Hub's answer is not what its API returns: {detail}")]
    Protocol { url: String, detail: String },
    #[error(
        "{file}: {what} mismatch twice (expected {expected}, got {actual}); the copy was \
         deleted: the Hub or something between it and this machine corrupts this file"
    )]
    Corrupt {
        file: String,
        what: &'static str,
        expected: String,
        actual: String,
    },
    #[error(
        "{dir} has {free} bytes free ({free_gb:.2} GB) but {need} bytes ({need_gb:.2} GB) are left \
         to fetch: free space there or pull into a bigger filesystem",
        free_gb = *free as f64 / 1e9,
        need_gb = *need as f64 / 1e9
    )]
    NoSpace { dir: PathBuf, need: u64, free: u64 },
    #[error(
        "{path}: the disk is full ({error}); the bytes written so far are kept: free space and \
         run the same command again, it continues where it stopped"
    )]
    DiskFull {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "{dir} is not a directory this user can write ({error}): create it, fix its permissions or choose another"
    )]
    Unwritable { dir: PathBuf, error: std::io::Error },
    #[error(
        "{dir} holds commit {recorded} (recorded in {record}) but revision {revision} is commit \
         {resolved}: to finish {recorded}, run without --revision; to pull {resolved}, use \
         another directory or delete {record}",
        record = dir.join(super::record::NAME).display()
    )]
    RevisionMoved {
        dir: PathBuf,
        revision: String,
        recorded: String,
        resolved: String,
    },
    #[error(
        "{record} records repository {recorded}, not {repo}: pull {repo} into another directory"
    )]
    OtherRepo {
        record: PathBuf,
        recorded: String,
        repo: String,
    },
    #[error("{0}")]
    Usage(String),
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
}

impl PullError {
    /// The exit code of this error's class (documented in docs/reference.md).
    pub fn exit(&self) -> Exit {
        match self {
            PullError::Refused { .. } | PullError::NotFound { .. } => Exit::HubRefused,
            PullError::Unreachable { .. } | PullError::Protocol { .. } => Exit::HubUnreachable,
            PullError::Corrupt { .. } => Exit::Checkpoint,
            PullError::NoSpace { .. } | PullError::DiskFull { .. } => Exit::Resources,
            PullError::Unwritable { .. }
            | PullError::RevisionMoved { .. }
            | PullError::OtherRepo { .. }
            | PullError::Usage(_) => Exit::Usage,
            PullError::Io { .. } => Exit::Failure,
        }
    }

    /// A write error at `path`: a full disk is told apart from other failures.
    pub fn write(path: &std::path::Path, error: std::io::Error) -> PullError {
        if error.raw_os_error() == Some(libc::ENOSPC) || error.raw_os_error() == Some(libc::EDQUOT)
        {
            PullError::DiskFull {
                path: path.to_path_buf(),
                error,
            }
        } else {
            PullError::Io {
                path: path.to_path_buf(),
                error,
            }
        }
    }
}
