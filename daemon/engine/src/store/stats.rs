//! The store's accounting: bytes read per class and bytes a resident copy saved, time waited
//! on reads, the expert cache's counters, and how the routing lookahead's guesses fared per
//! layer (engine-lessons §4.2: bytes, not hit rates). Counted as the store works, read out as
//! one [`StoreStats`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::WeightStore;
use super::expert_cache::{CacheCounters, ExpertId};

/// Weight traffic and time since the store was created (engine-lessons §4.2: bytes, not hit
/// rates).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StoreStats {
    /// Bytes read from the shard files, all classes.
    pub bytes_read: u64,
    pub trunk_bytes_read: u64,
    pub expert_bytes_read: u64,
    pub embedding_bytes_read: u64,
    pub head_bytes_read: u64,
    /// Bytes handed to the model from memory that a store without them resident would have
    /// had to read.
    pub bytes_avoided: u64,
    /// Seconds the calling (compute) thread waited for reads.
    pub io_seconds: f64,
    /// Seconds during which at least one read was executing, waited for or not (the reader
    /// pool's busy time): with `io_seconds` it tells how much of the reading compute hid.
    pub read_busy_seconds: f64,
    /// Bytes the reader threads moved, whole aligned windows (≥ `bytes_read`, which counts
    /// payload): the numerator of the achieved read bandwidth.
    pub window_bytes_read: u64,
    /// Expert bytes read ahead of routing on a predicted routing ([`WeightStore::prefetch_experts`]),
    /// included in `expert_bytes_read`.
    pub lookahead_bytes_read: u64,
    /// The part of `lookahead_bytes_read` the real routing did not ask for: what wrong guesses
    /// cost (the experts stay cached).
    pub lookahead_unused_bytes: u64,
    /// The expert cache's requests, hits and reads since the store was created.
    pub cache: CacheCounters,
    /// Bytes of expert cache slots holding an expert now (of [`crate::plan::Plan::cache_bytes`]).
    pub cache_resident_bytes: u64,
    /// Bytes read from the trunk pack (included in `trunk_bytes_read` and `head_bytes_read`).
    pub pack_bytes_read: u64,
    /// The shard bytes those decoded to.
    pub pack_decoded_bytes: u64,
    /// Seconds the compute threads spent decoding them.
    pub pack_decode_seconds: f64,
}

/// How the routing lookahead's guesses for one MoE layer fared ([`WeightStore::lookahead_by_layer`]):
/// counted in experts, whether or not a guess needed a read, so it scores the prediction
/// itself rather than the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerGuesses {
    pub layer: usize,
    /// Routings of this layer that had a guess (one per forward pass over it).
    pub guessed_passes: u64,
    /// Of those, the ones guessed before an earlier layer ran ([`super::ExpertPrefetch::early`]).
    pub early_passes: u64,
    /// Experts guessed, summed over those passes.
    pub predicted: u64,
    /// Experts the routing then asked for, summed over those passes.
    pub routed: u64,
    /// Experts both guessed and asked for: `confirmed / routed` is the share of the routing
    /// that was read ahead, `confirmed / predicted` the share of the guesses that were right.
    pub confirmed: u64,
}

#[derive(Debug, Default)]
pub(super) struct GuessCounters {
    passes: AtomicU64,
    early: AtomicU64,
    predicted: AtomicU64,
    routed: AtomicU64,
    confirmed: AtomicU64,
}

impl GuessCounters {
    /// Scores one pass's guess: `predicted` experts (guessed `early` or not) against the
    /// `routed` ones the routing then asked for.
    pub(super) fn score(&self, predicted: &[usize], early: bool, routed: &[usize]) {
        let confirmed = predicted.iter().filter(|e| routed.contains(e)).count();
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.early.fetch_add(u64::from(early), Ordering::Relaxed);
        self.predicted
            .fetch_add(predicted.len() as u64, Ordering::Relaxed);
        self.routed
            .fetch_add(routed.len() as u64, Ordering::Relaxed);
        self.confirmed
            .fetch_add(confirmed as u64, Ordering::Relaxed);
    }
}

/// Byte classes of [`StoreStats`].
#[derive(Debug, Clone, Copy)]
pub(super) enum Class {
    Trunk,
    Experts,
    Embedding,
    Head,
}

#[derive(Debug, Default)]
pub(super) struct Traffic {
    read: [AtomicU64; 4],
    avoided: AtomicU64,
    io_nanos: AtomicU64,
    lookahead_read: AtomicU64,
    lookahead_unused: AtomicU64,
    pack_read: AtomicU64,
    pack_decoded: AtomicU64,
    pack_decode_nanos: AtomicU64,
}

impl Traffic {
    pub(super) fn avoided(&self, n: usize) {
        self.avoided.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub(super) fn read(&self, class: Class, n: u64) {
        self.read[class as usize].fetch_add(n, Ordering::Relaxed);
    }
    /// Counts an expert read of `len` bytes: a `guessed` one (the routing lookahead's) also as
    /// read ahead, and as unused when the routing did not ask for it (`wanted`).
    pub(super) fn expert_read(&self, len: u64, guessed: bool, wanted: bool) {
        self.read(Class::Experts, len);
        if guessed {
            self.lookahead_read.fetch_add(len, Ordering::Relaxed);
        }
        if !wanted {
            self.lookahead_unused.fetch_add(len, Ordering::Relaxed);
        }
    }

    /// Counts `n` bytes read from the trunk pack.
    pub(super) fn pack_read(&self, n: u64) {
        self.pack_read.fetch_add(n, Ordering::Relaxed);
    }

    /// Runs `f` (decoding pack bytes into `decoded` shard bytes) and counts its wall time.
    pub(super) fn decoding<T>(&self, decoded: u64, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        self.pack_decode_nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.pack_decoded.fetch_add(decoded, Ordering::Relaxed);
        out
    }

    /// Runs `f` (a wait on reads) and charges its wall time to I/O.
    pub(super) fn waiting<T>(&self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        self.io_nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }
}

impl WeightStore {
    /// Weight traffic so far.
    pub fn stats(&self) -> StoreStats {
        let r = |c: Class| self.traffic.read[c as usize].load(Ordering::Relaxed);
        let pool = self.pool.stats();
        let (trunk, experts, embedding, head) = (
            r(Class::Trunk),
            r(Class::Experts),
            r(Class::Embedding),
            r(Class::Head),
        );
        StoreStats {
            bytes_read: trunk + experts + embedding + head,
            trunk_bytes_read: trunk,
            expert_bytes_read: experts,
            embedding_bytes_read: embedding,
            head_bytes_read: head,
            bytes_avoided: self.traffic.avoided.load(Ordering::Relaxed),
            io_seconds: self.traffic.io_nanos.load(Ordering::Relaxed) as f64 * 1e-9,
            read_busy_seconds: pool.busy_nanos as f64 * 1e-9,
            window_bytes_read: pool.bytes,
            lookahead_bytes_read: self.traffic.lookahead_read.load(Ordering::Relaxed),
            lookahead_unused_bytes: self.traffic.lookahead_unused.load(Ordering::Relaxed),
            cache: self.cache.counters(),
            cache_resident_bytes: self.cache.resident_bytes(),
            pack_bytes_read: self.traffic.pack_read.load(Ordering::Relaxed),
            pack_decoded_bytes: self.traffic.pack_decoded.load(Ordering::Relaxed),
            pack_decode_seconds: self.traffic.pack_decode_nanos.load(Ordering::Relaxed) as f64
                * 1e-9,
        }
    }

    /// The routing lookahead's record per MoE layer that had guesses, ascending.
    pub fn lookahead_by_layer(&self) -> Vec<LayerGuesses> {
        self.guesses
            .iter()
            .enumerate()
            .map(|(layer, g)| LayerGuesses {
                layer,
                guessed_passes: g.passes.load(Ordering::Relaxed),
                early_passes: g.early.load(Ordering::Relaxed),
                predicted: g.predicted.load(Ordering::Relaxed),
                routed: g.routed.load(Ordering::Relaxed),
                confirmed: g.confirmed.load(Ordering::Relaxed),
            })
            .filter(|g| g.guessed_passes > 0)
            .collect()
    }

    /// The routed-expert requests so far, in order, if the store records them.
    pub fn expert_trace(&self) -> Option<Vec<ExpertId>> {
        let trace = self.trace.as_ref()?;
        Some(trace.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }
}
