//! Owned, zero-initialised byte buffers aligned to 4096 bytes, the unit `O_DIRECT` requires of
//! buffer address, file offset and length (rust-stack.md §5; 4096 covers 4Kn NVMe,
//! engine-lessons §2.3).
//!
//! Each buffer is an anonymous mapping (page-aligned and zero-filled by the kernel, untouched
//! until used) advised `MADV_HUGEPAGE` when it spans at least 2 MiB: THP runs in `madvise` mode
//! (rust-stack.md §5), and a direct read into physically contiguous pages needs fewer
//! scatter-gather segments per request.
//!
//! A buffer can also be lent out as disjoint [`BufPart`]s so several reader threads fill one
//! window at once (a long trunk run split into 8–64 MiB requests); the parts are rejoined into
//! the buffer only after every part has been dropped.

use std::sync::Arc;

use memmap2::MmapMut;

pub use crate::plan::buffers::{ALIGN, round_up};
/// Buffers at least this large ask for transparent huge pages.
pub const HUGE: usize = 2 << 20;

#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("cannot allocate an aligned buffer of {bytes} bytes: {reason}")]
    OutOfMemory { bytes: usize, reason: String },
}

/// A zero-initialised buffer of `capacity` bytes (a positive multiple of [`ALIGN`]) at a
/// page-aligned address.
pub struct AlignedBuf {
    map: MmapMut,
}

impl AlignedBuf {
    /// A zero-filled buffer of at least `len` bytes (rounded up to [`ALIGN`], minimum one page).
    pub fn zeroed(len: usize) -> Result<Self, AllocError> {
        let oom = |reason: String| AllocError::OutOfMemory { bytes: len, reason };
        let capacity = round_up(len.max(1) as u64)
            .and_then(|c| usize::try_from(c).ok())
            .filter(|&c| c <= isize::MAX as usize)
            .ok_or_else(|| oom("size overflows".into()))?;
        let mut map = MmapMut::map_anon(capacity).map_err(|e| oom(e.to_string()))?;
        #[cfg(target_os = "linux")]
        if capacity >= HUGE {
            // Advice only: where THP is off the buffer works the same with 4 KiB pages.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        // Fault every page in now: the memory is then really resident as the plan counts it,
        // and the first read does not pay the faults (a first cold run into a fresh 1.27 GB
        // buffer ran at 0.5 GB/s against 2.8 for later ones).
        for b in map.iter_mut().step_by(ALIGN) {
            *b = 0;
        }
        Ok(Self { map })
    }

    /// Size in bytes (a multiple of [`ALIGN`]).
    pub fn capacity(&self) -> usize {
        self.map.len()
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.map
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.map
    }

    /// Lend the buffer out as disjoint parts covering `[0, end)`, each at most `part_len` bytes
    /// (`part_len` a positive multiple of [`ALIGN`]; `end ≤ capacity`), plus the [`Lender`] that
    /// gets the buffer back. Gives the buffer back unchanged if the arguments break those rules.
    pub fn into_parts(self, end: usize, part_len: usize) -> Result<(Lender, Vec<BufPart>), Self> {
        if part_len == 0 || !part_len.is_multiple_of(ALIGN) || end > self.capacity() {
            return Err(self);
        }
        let mut this = self;
        let base = this.map.as_mut_ptr();
        let owner = Arc::new(this);
        let mut parts = Vec::new();
        let mut start = 0;
        while start < end {
            let len = part_len.min(end - start);
            parts.push(BufPart {
                _owner: Arc::clone(&owner),
                base,
                start,
                len,
            });
            start += len;
        }
        Ok((Lender { owner }, parts))
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.capacity())
    }
}

/// A token for rejoining parts once they come back (kept by whoever lent the buffer).
pub struct Lender {
    owner: Arc<AlignedBuf>,
}

impl Lender {
    /// The buffer again, once every part has been dropped; otherwise `self` back.
    pub fn rejoin(self) -> Result<AlignedBuf, Self> {
        Arc::try_unwrap(self.owner).map_err(|owner| Lender { owner })
    }
}

/// A disjoint, 4096-aligned sub-range of a lent [`AlignedBuf`], writable from any thread.
pub struct BufPart {
    /// Keeps the mapping alive; never dereferenced while parts exist.
    _owner: Arc<AlignedBuf>,
    /// The mapping's first byte, taken from a unique borrow before the buffer was shared.
    base: *mut u8,
    start: usize,
    len: usize,
}

// SAFETY: needed by hand only because `base` is a raw pointer. A part grants mutable access
// only to its own range, which no other part overlaps (`into_parts` hands out disjoint ranges
// once), and the whole buffer cannot be read while parts exist: the `Arc` is private to this
// module and `Lender::rejoin` returns the buffer only when the strong count is one, i.e. after
// every part is dropped. The `Arc` keeps the mapping alive, and moving the `MmapMut` into it
// does not move the mapped memory `base` points to.
unsafe impl Send for BufPart {}

impl BufPart {
    /// Offset of this part within the buffer.
    pub fn start(&self) -> usize {
        self.start
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `base` points into the mapping `_owner` keeps alive, and
        // `start + len ≤ capacity` by construction; the range is disjoint from every other part
        // and nothing reads the buffer while parts exist (see the `Send` impl), and `&mut self`
        // makes this the only live borrow of the range.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(self.start), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_aligned_and_rounded() {
        let b = AlignedBuf::zeroed(5000).unwrap();
        assert_eq!(b.capacity(), 8192);
        assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        assert_eq!(AlignedBuf::zeroed(0).unwrap().capacity(), ALIGN);
        assert!(AlignedBuf::zeroed(usize::MAX).is_err());
        let big = AlignedBuf::zeroed(HUGE + 1).unwrap();
        assert_eq!(big.capacity(), HUGE + ALIGN);
        assert!(big.as_slice().iter().all(|&x| x == 0));
    }

    #[test]
    fn parts_are_disjoint_and_rejoin_after_drop() {
        let b = AlignedBuf::zeroed(3 * ALIGN).unwrap();
        let (lender, parts) = b.into_parts(3 * ALIGN, 2 * ALIGN).ok().unwrap();
        assert_eq!(
            parts
                .iter()
                .map(|p| (p.start(), p.len()))
                .collect::<Vec<_>>(),
            vec![(0, 2 * ALIGN), (2 * ALIGN, ALIGN)]
        );
        let handles: Vec<_> = parts
            .into_iter()
            .enumerate()
            .map(|(i, mut p)| std::thread::spawn(move || p.as_mut_slice().fill(i as u8 + 1)))
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let b = lender.rejoin().ok().unwrap();
        assert!(b.as_slice()[..2 * ALIGN].iter().all(|&x| x == 1));
        assert!(b.as_slice()[2 * ALIGN..].iter().all(|&x| x == 2));
    }

    #[test]
    fn rejoin_refused_while_a_part_lives() {
        let b = AlignedBuf::zeroed(ALIGN).unwrap();
        let (lender, parts) = b.into_parts(ALIGN, ALIGN).ok().unwrap();
        let lender = lender.rejoin().err().unwrap();
        drop(parts);
        assert!(lender.rejoin().is_ok());
    }

    #[test]
    fn bad_part_size_refused() {
        let b = AlignedBuf::zeroed(ALIGN).unwrap();
        let b = b.into_parts(ALIGN, 100).err().unwrap();
        assert!(b.into_parts(2 * ALIGN, ALIGN).is_err());
    }
}
