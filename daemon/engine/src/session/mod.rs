//! Named conversations that stay warm: a session keeps the exact token history its model state
//! has consumed and state snapshots taken at turn boundaries, so the next request that extends
//! that history prefills only its new tokens (issue 7 items 1–3; spec §5.1–5.2).
//!
//! * [`snapshot`] — the reuse rule: which snapshot, if any, a prompt may continue from.
//! * [`dir`] — the session directory, trusted only when it is the daemon's own.
//! * [`file`] — the on-disk format (fingerprinted, checksummed, written atomically).
//! * [`store`] — the [`SessionStore`]: ownership, one user at a time, the memory allowance
//!   with least-recently-used spilling to the session directory, and reloading on demand;
//!   its refusals ([`SessionStoreError`]) are worded in `error.rs`.
//! * `share` — how much of the session filesystem one uid may use (issue 45 point 1).
//! * [`kept`] — automatic prefix reuse's states in the session directory, in each uid's
//!   namespace and within its allowance of session files (issue 42 point 2).
//!
//! KDA state cannot be truncated (spec §5.2), so a snapshot is reused only when its whole
//! history is an exact prefix of the prompt; there is no partial reuse.

pub mod dir;
mod error;
pub mod file;
pub mod kept;
mod share;
pub mod snapshot;
pub mod store;

pub use dir::SessionDir;
pub use file::{FileError, FileHeader};
pub use kept::{KeptFigures, KeptWrite};
pub use snapshot::{MAX_SNAPSHOTS, Snapshot};
pub use store::{Access, SessionInfo, SessionStore, SessionStoreError};

/// Longest session name accepted.
pub const MAX_NAME_LEN: usize = 64;

/// Whether `name` can name a session: 1–64 of `A-Z a-z 0-9 . _ -`, not starting with `.`.
/// Names become file names in the session directory, so nothing else is allowed.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    #[test]
    fn names() {
        assert!(super::valid_name("chat-1.a_B"));
        for bad in ["", ".hidden", "a/b", "..", "x y", &"n".repeat(65)] {
            assert!(!super::valid_name(bad), "{bad:?}");
        }
    }
}
