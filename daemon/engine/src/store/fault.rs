//! Test-only failing weight reads (cargo feature `fault-injection`, off by default; issue 19
//! point 3): a test arms [`Faults`] with the byte runs of a class of weights — a layer's trunk,
//! some routed experts — and every read of the store that touches one of them fails, with `EIO`
//! or short, exactly where a failing drive would make it fail: in [`super::direct_io`], below
//! the reader threads, the expert cache, the ring and the chunk stream. What the tests then
//! check is the store's real error path, not a mock of it.
//!
//! The switch is reached through [`super::StoreOptions::faults`] as a `&'static` (a test leaks
//! one `Faults`), so the options stay `Copy` and no global exists. Without the feature none of
//! this is compiled and no read pays for it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::checkpoint::layout::ByteRun;

/// How an armed read fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The `pread` fails with `EIO`, as on a bad sector.
    Eio,
    /// End of file arrives after half of the bytes the read needed (rounded down to a page),
    /// as when a shard is cut short under the daemon.
    Short,
}

/// Which reads fail, shared by the test and the store it opened.
#[derive(Debug, Default)]
pub struct Faults {
    armed: Mutex<Option<(Vec<ByteRun>, FaultKind)>>,
    hits: AtomicU64,
}

impl Faults {
    pub fn new() -> Faults {
        Faults::default()
    }

    /// From now on, every read whose run overlaps one of `runs` fails as `kind`.
    pub fn arm(&self, runs: Vec<ByteRun>, kind: FaultKind) {
        *self.lock() = Some((runs, kind));
    }

    /// Reads succeed again.
    pub fn disarm(&self) {
        *self.lock() = None;
    }

    /// How many reads have been made to fail so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Whether the read of `run` must fail, and how. Runs are compared by their payload bytes,
    /// not their aligned windows, so a neighbour sharing a page with a target is not hit.
    pub(super) fn hit(&self, run: ByteRun) -> Option<FaultKind> {
        let armed = self.lock();
        let (targets, kind) = armed.as_ref()?;
        let overlaps = |t: &ByteRun| {
            t.shard == run.shard
                && run.offset < t.offset.saturating_add(t.len)
                && t.offset < run.offset.saturating_add(run.len)
        };
        targets.iter().any(overlaps).then(|| {
            self.hits.fetch_add(1, Ordering::Relaxed);
            *kind
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Vec<ByteRun>, FaultKind)>> {
        // Only whole values are stored under the lock, so a poisoned one is consistent.
        self.armed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reads_overlapping_an_armed_run_fail() {
        let f = Faults::new();
        let run = |shard, offset, len| ByteRun { shard, offset, len };
        assert_eq!(f.hit(run(0, 0, 100)), None);
        f.arm(vec![run(1, 1000, 100)], FaultKind::Eio);
        assert_eq!(f.hit(run(1, 1050, 8)), Some(FaultKind::Eio));
        assert_eq!(f.hit(run(1, 900, 101)), Some(FaultKind::Eio));
        // Adjacent payloads (same page, different bytes) and other shards are not hit.
        assert_eq!(f.hit(run(1, 900, 100)), None);
        assert_eq!(f.hit(run(1, 1100, 50)), None);
        assert_eq!(f.hit(run(0, 1000, 100)), None);
        assert_eq!(f.hits(), 2);
        f.disarm();
        assert_eq!(f.hit(run(1, 1050, 8)), None);
    }
}
