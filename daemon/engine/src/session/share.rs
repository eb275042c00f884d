//! How much of the session filesystem one uid may use (issue 45 point 1): its share of what
//! the filesystem can hold ([`FsRoom`]), and the room a write must leave for the other uids'
//! sessions ([`kept_for_others`]). The arithmetic is in `docs/serve-core.md`.

use std::collections::BTreeMap;

use super::error::QuotaLimit;

/// What the session filesystem can hold, and among how many users (issue 45 point 1). One
/// uid's [`FsRoom::share`] is `capacity` — the free bytes plus the session files on it, all a
/// session could ever use — divided among the `users` that hold sessions and one more, kept
/// for a user whose first session is yet to come. A uid alone may fill half of it; a uid that
/// comes finds room, and a uid above its share (it filled before others came) may not grow:
/// the heavier user gives way, as with [`kept_for_others`].
pub(super) struct FsRoom {
    /// Free bytes ([`super::dir::SessionDir::available_bytes`]).
    pub(super) available: u64,
    /// Free bytes plus every session file's.
    pub(super) capacity: u64,
    /// Uids holding a session, counting the one asking.
    pub(super) users: usize,
}

impl FsRoom {
    pub(super) fn share(&self) -> u64 {
        self.capacity / (self.users as u64 + 1)
    }

    pub(super) fn limit(&self) -> QuotaLimit {
        QuotaLimit::FsShare {
            share: self.share(),
            capacity: self.capacity,
            users: self.users,
        }
    }
}

/// Bytes a write of `needed` bytes by `owner` must leave free on the session filesystem, given
/// what each owner's other sessions take (`usage`, this write's session left out): room for
/// every owner who would then hold no more than `owner` to write each of its sessions again
/// (a write needs its new file beside the old one until the rename) at twice its size, since
/// a turn grows it. The heaviest owner gives way: one user's fill never costs a lighter
/// user's session, and a lighter user is never held back by room kept for a heavier one.
pub(super) fn kept_for_others(
    owner: Option<u32>,
    needed: u64,
    usage: &BTreeMap<Option<u32>, u64>,
) -> u64 {
    let mine = usage.get(&owner).copied().unwrap_or(0) + needed;
    usage
        .iter()
        .filter(|&(other, used)| *other != owner && *used <= mine)
        .map(|(_, used)| used.saturating_mul(2))
        .sum()
}
