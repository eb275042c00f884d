//! Owned, zero-initialised byte buffers aligned to 4096 bytes, the unit `O_DIRECT` requires of
//! buffer address, file offset and length (rust-stack.md §5; 4096 covers 4Kn NVMe,
//! engine-lessons §2.3).
//!
//! A buffer can also be lent out as disjoint [`BufPart`]s so several reader threads fill one
//! window at once (a long trunk run split into 8–64 MiB requests); the parts are rejoined into
//! the buffer only after every part has been dropped.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::Arc;

/// Alignment of every buffer, file offset and read length on the direct path.
pub const ALIGN: usize = 4096;

/// `n` rounded up to a multiple of [`ALIGN`], or `None` on overflow.
pub fn round_up(n: u64) -> Option<u64> {
    let a = ALIGN as u64;
    n.checked_add(a - 1).map(|v| v & !(a - 1))
}

#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("cannot allocate an aligned buffer of {bytes} bytes (out of memory or size overflow)")]
    OutOfMemory { bytes: usize },
}

/// A heap buffer of `capacity` bytes (a positive multiple of [`ALIGN`]) at a 4096-aligned address.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    capacity: usize,
}

// SAFETY: `AlignedBuf` uniquely owns its allocation (like `Box<[u8]>`); nothing else holds the
// pointer, so moving it to another thread or sharing `&AlignedBuf` (which only permits reads)
// between threads is as sound as for `Box<[u8]>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: see above; `&AlignedBuf` exposes only `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zero-filled buffer of at least `len` bytes (rounded up to [`ALIGN`], minimum one page).
    pub fn zeroed(len: usize) -> Result<Self, AllocError> {
        let oom = AllocError::OutOfMemory { bytes: len };
        let capacity = round_up(len.max(1) as u64)
            .and_then(|c| usize::try_from(c).ok())
            .ok_or(AllocError::OutOfMemory { bytes: len })?;
        let layout = Layout::from_size_align(capacity, ALIGN).map_err(|_| oom)?;
        // SAFETY: `layout` has non-zero size (capacity ≥ ALIGN) as `alloc_zeroed` requires.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(AllocError::OutOfMemory { bytes: len })?;
        Ok(Self { ptr, capacity })
    }

    /// Size in bytes (a multiple of [`ALIGN`]).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `capacity` initialised (zeroed or since written) bytes owned
        // by `self`; the shared borrow of `self` prevents any `&mut` access for its lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.capacity) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and the unique borrow of `self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity) }
    }

    /// Lend the buffer out as disjoint parts covering `[0, end)`, each at most `part_len` bytes
    /// (`part_len` a positive multiple of [`ALIGN`]; `end ≤ capacity`), plus the [`Lender`] that
    /// gets the buffer back. Gives the buffer back unchanged if the arguments break those rules.
    pub fn into_parts(self, end: usize, part_len: usize) -> Result<(Lender, Vec<BufPart>), Self> {
        if part_len == 0 || !part_len.is_multiple_of(ALIGN) || end > self.capacity {
            return Err(self);
        }
        let owner = Arc::new(self);
        let mut parts = Vec::new();
        let mut start = 0;
        while start < end {
            let len = part_len.min(end - start);
            parts.push(BufPart {
                owner: Arc::clone(&owner),
                start,
                len,
            });
            start += len;
        }
        Ok((Lender { owner }, parts))
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` was returned by `alloc_zeroed` with exactly this layout (the layout was
        // valid at construction, so re-creating it cannot fail) and is freed only here.
        unsafe {
            alloc::dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.capacity, ALIGN),
            )
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.capacity)
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
    owner: Arc<AlignedBuf>,
    start: usize,
    len: usize,
}

// SAFETY: a part grants mutable access only to its own range, which no other part overlaps
// (`into_parts` hands out disjoint ranges once), and the whole buffer cannot be read while parts
// exist: the `Arc` is private to this module and `Lender::rejoin` returns the buffer only when
// the strong count is one, i.e. after every part is dropped. The `Arc` keeps the memory alive.
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
        // SAFETY: `start + len ≤ capacity` by construction; the range is disjoint from every
        // other part and nothing reads the buffer while parts exist (see the `Send` impl), and
        // `&mut self` makes this the only live borrow of the range.
        unsafe { std::slice::from_raw_parts_mut(self.owner.ptr.as_ptr().add(self.start), self.len) }
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
