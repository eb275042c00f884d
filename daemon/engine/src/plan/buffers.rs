//! The sizes of the buffers the store allocates, defined once so that what the plan prices is
//! what the store allocates (engine-lessons §2.1–§2.3, §8.1).
//!
//! The store's direct-I/O path ([`crate::store::direct_io`], [`crate::store::direct_buffer`]) and
//! reader pool ([`crate::store::reader`]) use these constants; they live here, below the
//! store, because the plan must know them before anything is opened.

/// Alignment of every buffer, file offset and read length on the direct path.
pub const ALIGN: usize = 4096;

/// Bounds of one request when a long run is split for several reader threads (§2.2). The
/// largest is also the most a streamed lm_head block takes at once (the plan's piece).
pub const MIN_CHUNK: usize = 8 << 20;
pub const MAX_CHUNK: usize = 64 << 20;

/// Requests in flight by default. On this project's (virtual) disk, `examples/read_bench.rs`
/// (medians of 3 cold runs, two sweeps) gave 17.5 MB expert reads 1.5–2.3 GB/s at depth 1 and
/// 2.0–2.7 GB/s at depths 4, 8 and 16 with no consistent winner among those three; 8 matches
/// what engine-lessons §2.2 found on NVMe, and idle reader threads cost nothing.
pub const DEFAULT_QUEUE_DEPTH: usize = 8;
/// Request size for long runs by default: 32 and 64 MiB requests were within noise of each
/// other (2.5–3.0 GB/s at depth 8, same sweeps); 32 halves a chunk stream's memory.
pub const DEFAULT_CHUNK: usize = 32 << 20;

/// `n` rounded up to a multiple of [`ALIGN`], or `None` on overflow.
pub fn round_up(n: u64) -> Option<u64> {
    let a = ALIGN as u64;
    n.checked_add(a - 1).map(|v| v & !(a - 1))
}

/// Buffer bytes that hold the aligned window of *any* run of `len` bytes, whatever its offset:
/// `round_up(len) + 4096` (17,551,360 for one K3 expert, whose length is 4,284 pages).
pub fn window_capacity(len: u64) -> Option<u64> {
    round_up(len).and_then(|l| l.checked_add(ALIGN as u64))
}
