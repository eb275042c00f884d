//! Where weight bytes live, under one RAM budget (issue 4; engine-lessons §1–§4, §8).
//!
//! The model never touches a file: it asks the [`WeightStore`] for the bytes of one layer's
//! trunk run ([`WeightStore::trunk`]), for a *set* of routed experts right after routing
//! ([`WeightStore::experts_each`]), for embedding rows and for the model-level tensors. The
//! [`Plan`] (computed by [`crate::plan`]) decides, before anything is allocated, what is resident:
//!
//! * pinned trunk layers are read once at load into aligned buffers; the others stream through
//!   a ring of ≥ 2 whole-layer slots, the next streamed layer read while the current computes,
//!   or through the [`chunks`] stream: a few aligned chunks of whole rows, read ahead across
//!   tensor and layer boundaries and consumed by the forward pass as they land
//!   ([`WeightStore::trunk_rows`]);
//! * routed experts pass through the [`expert_cache::ExpertCache`]: the misses of one request
//!   are issued as one batch to the [`reader::ReaderPool`];
//! * the embedding is resident or read one row at a time; lm_head is resident or read in row
//!   blocks ([`WeightStore::lm_head_blocks`]).
//!
//! The bytes handed out are the stored bytes whatever the budget, so the forward pass is
//! bit-identical at every budget. A failed or short read fails the request with file, offset
//! and errno (§8.2): no expert is skipped, no buffer is served after a failed read. MXFP4 scale
//! bytes of an expert are verified the first time it is handed out (spec §3.5).

pub mod aligned;
mod chunks;
pub mod direct_io;
pub mod expert_cache;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod reader;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use crate::plan::{self, Plan, Residency};
use aligned::AlignedBuf;
use direct_io::{DirectPolicy, LoadedRun, ReadError, ReadFailure, ShardSet, Window};
use expert_cache::{
    Acquired, CacheCounters, CacheError, ExpertCache, ExpertId, PolicyKind, Ticket,
};
use reader::{Batch, Priority, ReaderConfig, ReaderPool};

use crate::checkpoint::layout::{
    ByteRun, ExpertLayout, FfnLayout, LayerLayout, ModelLayout, MoeLayout, Slice,
};
use crate::kernels::mxfp4;
use chunks::{ChunkStream, Unit};

impl StoreError {
    /// A failed read of `what` names it; any other error passes unchanged.
    fn reading(self, what: Weights) -> StoreError {
        match self {
            StoreError::Read(error) => StoreError::WeightRead { what, error },
            other => other,
        }
    }
}

impl From<reader::PoolError> for StoreError {
    fn from(e: reader::PoolError) -> Self {
        StoreError::Pool(e)
    }
}

impl From<aligned::AllocError> for StoreError {
    fn from(e: aligned::AllocError) -> Self {
        StoreError::Alloc(e)
    }
}

/// Which weights a failed read was for, so the error names its class beside the file and
/// offset (issue 19.3). Routed experts are named by [`CacheError::Read`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weights {
    Trunk { layer: usize },
    LmHead,
    Embedding,
}

impl std::fmt::Display for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Weights::Trunk { layer } => write!(f, "the trunk of layer {layer}"),
            Weights::LmHead => f.write_str("lm_head"),
            Weights::Embedding => f.write_str("an embedding row"),
        }
    }
}

/// Failures of the weight store. Every variant names the file and offset it concerns.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A read of streamed weights failed: which ones, then the read's file, offset and errno.
    #[error("reading {what}: {error}")]
    WeightRead { what: Weights, error: ReadError },
    #[error(transparent)]
    Expert(#[from] CacheError),
    /// These two include their cause's message, so they are not also its `source` (as
    /// `#[from]` would make them): a `{:#}` chain says each cause once.
    #[error("reader threads: {0}")]
    Pool(reader::PoolError),
    #[error("allocating a weight buffer: {0}")]
    Alloc(aligned::AllocError),
    #[error("layer {layer} does not exist (the model has {count} layers)")]
    NoSuchLayer { layer: usize, count: usize },
    #[error("layer {layer} has no routed experts")]
    NotMoe { layer: usize },
    #[error("layer {layer}: expert {expert} does not exist (the layer has {count})")]
    NoSuchExpert {
        layer: usize,
        expert: usize,
        count: usize,
    },
    #[error(
        "layer {layer}, expert {expert}: tensor {tensor} (bytes {start}..+{len} of the run at \
         offset {offset} of {path}) lies outside its expert run"
    )]
    SliceOutsideRun {
        layer: usize,
        expert: usize,
        tensor: &'static str,
        start: usize,
        len: usize,
        path: PathBuf,
        offset: u64,
    },
    #[error(
        "corrupt checkpoint: MXFP4 scale byte 255 (NaN) in layer {layer}, expert {expert}, \
         tensor {tensor}, row {row}, group {group} ({path}, byte offset {offset})"
    )]
    NanScale {
        layer: usize,
        expert: usize,
        tensor: &'static str,
        row: usize,
        group: usize,
        path: PathBuf,
        offset: u64,
    },
    #[error("token id {id} is outside the embedding table ({rows} rows)")]
    NoSuchRow { id: usize, rows: usize },
    #[error("{tensor}: slice {start}..+{len} does not fit its run of {run_len} bytes")]
    BadSlice {
        tensor: &'static str,
        start: usize,
        len: usize,
        run_len: u64,
    },
    #[error(
        "no free streaming slot for {what}: all {slots} ring slots are in use (a caller held \
         more streamed views than the plan allows)"
    )]
    RingExhausted { what: &'static str, slots: usize },
    #[error("a streaming ring needs at least 2 slots, {slots} asked (engine-lessons §3.1)")]
    SingleSlot { slots: usize },
    #[error(
        "{unit}: a row of {row_bytes} bytes does not fit a {chunk}-byte stream chunk (it holds \
         4096 bytes less than its size), or a tensor lies outside its run"
    )]
    RowExceedsChunk {
        row_bytes: usize,
        chunk: usize,
        unit: String,
    },
    #[error("{unit}: no streamed tensor starts at byte {start} of its run")]
    NotStreamed { unit: String, start: usize },
}

/// The three small model-level tensors (spec §3.3, shard 94), always resident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelTensorId {
    Norm,
    OutputAttnResNorm,
    OutputAttnResProj,
}

/// Bytes borrowed from a resident buffer or held in a ring slot until dropped.
pub struct Bytes<'s> {
    inner: BytesInner<'s>,
}

enum BytesInner<'s> {
    Resident(&'s [u8]),
    Streamed {
        run: Option<LoadedRun>,
        ring: &'s Ring,
    },
}

impl std::ops::Deref for Bytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.inner {
            BytesInner::Resident(b) => b,
            BytesInner::Streamed { run, .. } => run.as_ref().map_or(&[], |r| r.payload()),
        }
    }
}

impl Drop for Bytes<'_> {
    /// A streamed view gives its slot back to the ring.
    fn drop(&mut self) {
        if let BytesInner::Streamed { run, ring } = &mut self.inner
            && let Some(r) = run.take()
        {
            ring.give_back(r.into_buffer());
        }
    }
}

/// One layer's trunk: its run's bytes, or (chunk stream) a layer whose matrices are read by
/// row ranges as they are applied ([`WeightStore::trunk_rows`]).
pub enum TrunkView<'s> {
    Bytes(Bytes<'s>),
    Chunks,
}

/// One routed expert handed out by [`WeightStore::experts_each`]: its run bytes (held in its cache
/// slot while this view lives) and the layout of its six tensors within them.
pub struct ExpertView<'s> {
    pub expert: usize,
    run: Arc<LoadedRun>,
    pub layout: &'s ExpertLayout,
}

impl ExpertView<'_> {
    pub fn bytes(&self) -> &[u8] {
        self.run.payload()
    }
}

/// Expert reads issued before routing on a predicted routing ([`WeightStore::prefetch_experts`]).
/// Hand it to [`WeightStore::experts_each`] for the same layer, which adopts the reads the real
/// routing confirms and withdraws the others; dropped unused, its queued reads are skipped and
/// its reserved slots emptied.
pub struct ExpertPrefetch<'s> {
    layer: usize,
    batch: Batch,
    /// By batch id: the guessed expert, its reserved slot and its run length.
    reads: Vec<(usize, Ticket<'s>, u64)>,
    /// Guessed experts already resident, held so the guesses' own reservations cannot evict
    /// them before the routing's own lookup finds them (and counts the hit).
    held: Vec<(usize, Arc<LoadedRun>)>,
    /// Every expert guessed, read or not: what [`WeightStore::lookahead_by_layer`] scores.
    predicted: Vec<usize>,
    /// Guessed before an earlier layer ran ([`ExpertPrefetch::early`]).
    early: bool,
}

impl ExpertPrefetch<'_> {
    /// Marks the guess as made before an earlier layer ran (across a dense layer, issue 16)
    /// rather than before this layer's mixer: [`LayerGuesses::early_passes`] counts it.
    pub fn early(self) -> Self {
        Self {
            early: true,
            ..self
        }
    }

    /// Whether expert `e` is among the guesses (being read, or held resident).
    pub fn covers(&self, e: usize) -> bool {
        self.reads.iter().any(|(x, ..)| *x == e) || self.held.iter().any(|(x, _)| *x == e)
    }
}

/// One expert read a [`WeightStore::experts_each`] call waits for.
struct PendingRead<'s> {
    expert: usize,
    ticket: Ticket<'s>,
    len: u64,
    /// Issued ahead of routing.
    guessed: bool,
    /// The routing asked for it (a guess it did not confirm is withdrawn if still queued).
    wanted: bool,
}

/// Where a bad scale byte was found, remembered so later requests fail identically.
#[derive(Debug, Clone, Copy)]
struct BadScale {
    tensor: &'static str,
    row: usize,
    group: usize,
    offset: u64,
}

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
    /// Bytes of expert cache slots holding an expert now (of [`Plan::cache_bytes`]).
    pub cache_resident_bytes: u64,
}

/// How the routing lookahead's guesses for one MoE layer fared ([`WeightStore::lookahead_by_layer`]):
/// counted in experts, whether or not a guess needed a read, so it scores the prediction
/// itself rather than the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerGuesses {
    pub layer: usize,
    /// Routings of this layer that had a guess (one per forward pass over it).
    pub guessed_passes: u64,
    /// Of those, the ones guessed before an earlier layer ran ([`ExpertPrefetch::early`]).
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
struct GuessCounters {
    passes: AtomicU64,
    early: AtomicU64,
    predicted: AtomicU64,
    routed: AtomicU64,
    confirmed: AtomicU64,
}

/// Byte classes of [`StoreStats`].
#[derive(Debug, Clone, Copy)]
enum Class {
    Trunk,
    Experts,
    Embedding,
    Head,
}

#[derive(Debug, Default)]
struct Counters {
    read: [AtomicU64; 4],
    avoided: AtomicU64,
    io_nanos: AtomicU64,
    lookahead_read: AtomicU64,
    lookahead_unused: AtomicU64,
}

impl Counters {
    fn avoided(&self, n: usize) {
        self.avoided.fetch_add(n as u64, Ordering::Relaxed);
    }
    fn read(&self, class: Class, n: u64) {
        self.read[class as usize].fetch_add(n, Ordering::Relaxed);
    }
    /// Runs `f` (a wait on reads) and charges its wall time to I/O.
    fn waiting<T>(&self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        self.io_nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }
}

/// The trunk ring: spare slot buffers and the read in flight for the next streamed layer.
pub struct Ring {
    state: Mutex<RingState>,
    slots: usize,
    slot_bytes: usize,
}

struct RingState {
    spare: Vec<AlignedBuf>,
    /// The prefetch in flight: which layer, and its one-run batch.
    pending: Option<(usize, Batch)>,
}

impl Ring {
    /// `slots` buffers of `slot_bytes`; none when nothing streams (`slot_bytes` 0). A single
    /// slot is refused: the prefetch would overwrite the layer being computed (§3.1).
    fn new(slots: usize, slot_bytes: usize) -> Result<Self, StoreError> {
        if slot_bytes > 0 && slots < 2 {
            return Err(StoreError::SingleSlot { slots });
        }
        let spare = if slot_bytes == 0 {
            Vec::new()
        } else {
            (0..slots)
                .map(|_| AlignedBuf::zeroed(slot_bytes))
                .collect::<Result<_, _>>()?
        };
        Ok(Ring {
            state: Mutex::new(RingState {
                spare,
                pending: None,
            }),
            slots,
            slot_bytes,
        })
    }

    fn lock(&self) -> MutexGuard<'_, RingState> {
        // Critical sections only move buffers between fields: a panicking holder leaves them
        // consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn give_back(&self, buf: AlignedBuf) {
        self.lock().spare.push(buf);
    }

    fn take(&self, what: &'static str) -> Result<AlignedBuf, StoreError> {
        self.lock().spare.pop().ok_or(StoreError::RingExhausted {
            what,
            slots: self.slots,
        })
    }
}

/// Options of the store that are not part of the memory plan.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    pub direct: DirectPolicy,
    pub reader: ReaderConfig,
    /// Keep every routed-expert request in order ([`WeightStore::expert_trace`]), for
    /// replaying eviction policies against real routing (`k3d bench --policy-slots`).
    pub record_trace: bool,
    /// The expert cache's eviction policy. LFU with aging by default: on the trained
    /// fixture's real routing, with the lookahead on, it read as much as LRU with 16 slots and
    /// 8.5–13 / 26–27 % less with 32 / 64 (medians of 5 runs; 8 slots is below one token's
    /// experts, where the plan never grows a cache); ids identical (issue 17 item 3, figures in
    /// `docs/memory-plan.md`). `k3d bench --cache-policy` measures either in place.
    pub cache_policy: PolicyKind,
    /// Reads a test makes fail ([`fault`], feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub faults: Option<&'static fault::Faults>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            direct: DirectPolicy::Prefer,
            reader: ReaderConfig::default(),
            record_trace: false,
            cache_policy: PolicyKind::LfuAging { period: 0 },
            #[cfg(feature = "fault-injection")]
            faults: None,
        }
    }
}

/// Owns the weight bytes of the text model as its [`Plan`] says.
pub struct WeightStore {
    layout: ModelLayout,
    plan: Plan,
    pool: ReaderPool,
    /// `pinned[L]` is the trunk of layer L when the plan pins it.
    pinned: Vec<Option<LoadedRun>>,
    /// Streamed layers, ascending (the prefetch order).
    streamed: Vec<usize>,
    ring: Ring,
    /// With [`plan::StreamScheme::Chunks`] and something streaming: the chunk stream.
    chunks: Option<ChunkStream>,
    cache: ExpertCache,
    /// `verdicts[L][e]`: the scale check of expert e of layer L, once done.
    verdicts: Vec<Vec<OnceLock<Option<BadScale>>>>,
    embed_tokens: Option<LoadedRun>,
    /// One row's buffer when the embedding streams.
    row_buf: Mutex<Option<AlignedBuf>>,
    lm_head: Option<LoadedRun>,
    norm: LoadedRun,
    output_attn_res_norm: LoadedRun,
    output_attn_res_proj: LoadedRun,
    counters: Counters,
    /// `guesses[L]`: how the lookahead's guesses for layer L fared against its routing.
    guesses: Vec<GuessCounters>,
    /// With [`StoreOptions::record_trace`]: the (layer, expert) requests so far.
    trace: Option<Mutex<Vec<ExpertId>>>,
}

impl WeightStore {
    /// Opens the shards and allocates and fills exactly what `plan` keeps resident.
    /// `trunk_order` lists a layer's matrices in the order its consumer applies them: what a
    /// chunk stream reads them in (unused with a ring).
    pub fn open(
        layout: ModelLayout,
        shards: &[PathBuf],
        plan: Plan,
        options: StoreOptions,
        trunk_order: &dyn Fn(&LayerLayout) -> Vec<Slice>,
    ) -> Result<Self, StoreError> {
        Self::open_reporting(layout, shards, plan, options, trunk_order, &mut |_, _| {})
    }

    /// [`Self::open`], calling `progress(done, total)` with the resident bytes read so far
    /// ([`resident_load_bytes`] in all) once before the first read and after each run (or each
    /// layer's preloaded experts): a run is one layer's trunk or one table, so a caller gets a
    /// figure at least every few hundred MiB without the reads being split for it.
    pub fn open_reporting(
        layout: ModelLayout,
        shards: &[PathBuf],
        plan: Plan,
        options: StoreOptions,
        trunk_order: &dyn Fn(&LayerLayout) -> Vec<Slice>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self, StoreError> {
        let set = ShardSet::open(shards, options.direct)?;
        #[cfg(feature = "fault-injection")]
        let set = set.with_faults(options.faults);
        let set = Arc::new(set);
        let pool = ReaderPool::new(set, options.reader)?;
        let counters = Counters::default();
        let guesses = (0..layout.layers.len())
            .map(|_| GuessCounters::default())
            .collect();
        let total = resident_load_bytes(&layout, &plan);
        progress(0, total);
        let mut done = 0u64;
        let mut read_new = |run: ByteRun, class: Class| -> Result<LoadedRun, StoreError> {
            let buf = AlignedBuf::zeroed(window_capacity(run)?)?;
            let loaded = pool.read(run, buf).map_err(|f| f.error)?;
            counters.read(class, run.len);
            done += run.len;
            progress(done, total);
            Ok(loaded)
        };
        let n = layout.layers.len();
        let mut pinned: Vec<Option<LoadedRun>> = (0..n).map(|_| None).collect();
        for &l in &plan.pinned_layers {
            if let (Some(slot), Some(ll)) = (pinned.get_mut(l), layout.layers.get(l)) {
                *slot = Some(read_new(ll.trunk, Class::Trunk)?);
            }
        }
        let streamed: Vec<usize> = (0..n).filter(|&l| pinned[l].is_none()).collect();
        let largest_trunk = streamed
            .iter()
            .map(|&l| any_offset(layout.layers[l].trunk.len))
            .try_fold(0usize, |a, b| b.map(|b| a.max(b)))?;
        let head_piece = match plan.lm_head {
            Residency::Resident => 0,
            Residency::Streamed => {
                let s = &layout.lm_head.slice;
                any_offset((head_block_rows(s) * head_row_bytes(s)) as u64)?
            }
        };
        let (ring, chunks) = match plan.scheme {
            plan::StreamScheme::Ring { slots } => {
                (Ring::new(slots, largest_trunk.max(head_piece))?, None)
            }
            plan::StreamScheme::Chunks { chunk, in_flight } => {
                let mut units: Vec<(Unit, ByteRun, Vec<Slice>)> = streamed
                    .iter()
                    .map(|&l| {
                        let ll = &layout.layers[l];
                        (Unit::Layer(l), ll.trunk, trunk_order(ll))
                    })
                    .collect();
                if plan.lm_head == Residency::Streamed {
                    let t = &layout.lm_head;
                    units.push((Unit::LmHead, t.run, vec![t.slice.clone()]));
                }
                let stream = (!units.is_empty())
                    .then(|| {
                        let chunk = usize::try_from(chunk).unwrap_or(usize::MAX);
                        ChunkStream::new(units, chunk, in_flight + 1)
                    })
                    .transpose()?;
                (Ring::new(2, 0)?, stream)
            }
        };
        let slot_bytes = usize::try_from(plan.cache_slot_bytes).unwrap_or(usize::MAX);
        // The policy is the options' (LFU-aging by default, see `StoreOptions::cache_policy`).
        // On synthetic routing, which is flat, LRU had won at small caches (6.8 vs 5.7 MB/token
        // avoided at 14 % of small's pool) and LFU-aging only from ~1/3 of the pool; flat
        // routing has no popular experts to keep, so the trained model's real routing decides.
        let cache = ExpertCache::new(plan.cache_slots.max(1), slot_bytes, options.cache_policy)?;
        let verdicts = layout
            .layers
            .iter()
            .map(|l| match &l.ffn {
                FfnLayout::Moe(m) => m.experts.iter().map(|_| OnceLock::new()).collect(),
                FfnLayout::Dense(_) => Vec::new(),
            })
            .collect();
        let (embed_tokens, row_buf) = match plan.embedding {
            Residency::Resident => (
                Some(read_new(layout.embed_tokens.run, Class::Embedding)?),
                None,
            ),
            Residency::Streamed => {
                let row = head_row_bytes(&layout.embed_tokens.slice) as u64;
                (None, Some(AlignedBuf::zeroed(any_offset(row)?)?))
            }
        };
        let lm_head = match plan.lm_head {
            Residency::Resident => Some(read_new(layout.lm_head.run, Class::Head)?),
            Residency::Streamed => None,
        };
        let norm = read_new(layout.norm.run, Class::Trunk)?;
        let output_attn_res_norm = read_new(layout.output_attn_res_norm.run, Class::Trunk)?;
        let output_attn_res_proj = read_new(layout.output_attn_res_proj.run, Class::Trunk)?;
        let vectors_done = done;
        let store = WeightStore {
            layout,
            plan,
            pool,
            pinned,
            streamed,
            ring,
            chunks,
            cache,
            verdicts,
            embed_tokens,
            row_buf: Mutex::new(row_buf),
            lm_head,
            norm,
            output_attn_res_norm,
            output_attn_res_proj,
            counters,
            guesses,
            trace: options.record_trace.then(|| Mutex::new(Vec::new())),
        };
        store.preload_experts(&mut |layer_bytes| {
            progress((vectors_done + layer_bytes).min(total), total)
        })?;
        if let Some(c) = &store.chunks {
            c.top_up(&store.pool);
        }
        Ok(store)
    }

    /// With a cache that holds every expert (the `max` plan) all are read at load, layer by
    /// layer, so a run never waits on an expert read.
    /// `progress` gets the expert bytes read so far after each layer.
    fn preload_experts(&self, progress: &mut dyn FnMut(u64)) -> Result<(), StoreError> {
        if !preloads_experts(&self.layout, &self.plan) {
            return Ok(());
        }
        let mut read = 0u64;
        for (l, v) in self.verdicts.iter().enumerate() {
            if !v.is_empty() {
                let ids: Vec<usize> = (0..v.len()).collect();
                self.fetch_each(l, &ids, None, || {}, |_| Ok::<(), StoreError>(()))?;
                read += expert_bytes(&self.layout.layers[l]);
                progress(read);
            }
        }
        Ok(())
    }

    /// The routed-expert requests so far, in order, if the store records them.
    pub fn expert_trace(&self) -> Option<Vec<ExpertId>> {
        let trace = self.trace.as_ref()?;
        Some(trace.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// The plan the store follows.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Weight traffic so far.
    pub fn stats(&self) -> StoreStats {
        let r = |c: Class| self.counters.read[c as usize].load(Ordering::Relaxed);
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
            bytes_avoided: self.counters.avoided.load(Ordering::Relaxed),
            io_seconds: self.counters.io_nanos.load(Ordering::Relaxed) as f64 * 1e-9,
            read_busy_seconds: pool.busy_nanos as f64 * 1e-9,
            window_bytes_read: pool.bytes,
            lookahead_bytes_read: self.counters.lookahead_read.load(Ordering::Relaxed),
            lookahead_unused_bytes: self.counters.lookahead_unused.load(Ordering::Relaxed),
            cache: self.cache.counters(),
            cache_resident_bytes: self.cache.resident_bytes(),
        }
    }

    /// The layout the store serves.
    pub fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    /// Layer `layer`'s trunk run if the plan pins it, else `None`. Unlike
    /// [`WeightStore::trunk`] it counts no bytes avoided: a look that replaces no read (the
    /// routing lookahead reaching a later layer's router across a dense layer, issue 16).
    pub fn pinned_trunk(&self, layer: usize) -> Option<&[u8]> {
        self.pinned.get(layer)?.as_ref().map(LoadedRun::payload)
    }

    /// The bytes of layer `layer`'s trunk run (all its non-expert tensors). A ring-streamed
    /// layer occupies a ring slot until the view is dropped; the next streamed layer (wrapping
    /// to the first, for the next token) is read into another slot meanwhile. A chunk-streamed
    /// layer is [`TrunkView::Chunks`]: its matrices come through [`WeightStore::trunk_rows`].
    pub fn trunk(&self, layer: usize) -> Result<TrunkView<'_>, StoreError> {
        let count = self.layout.layers.len();
        let Some(pinned) = self.pinned.get(layer) else {
            return Err(StoreError::NoSuchLayer { layer, count });
        };
        if let Some(run) = pinned {
            self.counters.avoided(run.payload().len());
            return Ok(TrunkView::Bytes(Bytes {
                inner: BytesInner::Resident(run.payload()),
            }));
        }
        if self
            .chunks
            .as_ref()
            .is_some_and(|c| c.has(Unit::Layer(layer)))
        {
            return Ok(TrunkView::Chunks);
        }
        let run = self.layout.layers[layer].trunk;
        let pending = self.ring.lock().pending.take();
        let loaded = match pending {
            Some((l, mut batch)) if l == layer => {
                self.counters
                    .waiting(|| batch.wait(0))
                    .ok_or(ReadError::BufferLost {
                        shard: run.shard,
                        offset: run.offset,
                        len: run.len,
                    })?
            }
            other => {
                // A prefetch of another layer (the caller skipped around) is abandoned; its
                // buffer is lost with the batch and replaced.
                if other.is_some() {
                    self.ring
                        .give_back(AlignedBuf::zeroed(self.ring.slot_bytes)?);
                }
                drop(other);
                let buf = self.ring.take("a trunk layer")?;
                self.counters.waiting(|| self.pool.read(run, buf))
            }
        };
        let loaded = match loaded {
            Ok(r) => r,
            Err(f) => {
                if let Some(b) = f.buf {
                    self.ring.give_back(b);
                }
                return Err(StoreError::from(f.error).reading(Weights::Trunk { layer }));
            }
        };
        self.counters.read(Class::Trunk, run.len);
        self.prefetch_after(layer);
        Ok(TrunkView::Bytes(Bytes {
            inner: BytesInner::Streamed {
                run: Some(loaded),
                ring: &self.ring,
            },
        }))
    }

    /// The rows of the matrix at byte `start` of chunk-streamed layer `layer`'s run, handed to
    /// `f` as `(first_row, their bytes)` in row order as each piece lands, while the next
    /// pieces of the cycle are read.
    pub fn trunk_rows<E: From<StoreError>>(
        &self,
        layer: usize,
        start: usize,
        f: impl FnMut(usize, &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        match &self.chunks {
            Some(c) => c.rows(&self.pool, &self.counters, Unit::Layer(layer), start, f),
            None => Err(StoreError::NotStreamed {
                unit: format!("layer {layer}"),
                start,
            }
            .into()),
        }
    }

    /// The bytes of `slices` of layer `layer`'s trunk (small tensors: one read each), by slice
    /// start. For decoding a chunk-streamed layer's vectors at load without its whole run.
    pub fn trunk_tensors(
        &self,
        layer: usize,
        slices: &[&Slice],
    ) -> Result<Vec<(usize, Vec<u8>)>, StoreError> {
        let count = self.layout.layers.len();
        let trunk = self
            .layout
            .layers
            .get(layer)
            .ok_or(StoreError::NoSuchLayer { layer, count })?
            .trunk;
        let mut out = Vec::with_capacity(slices.len());
        for s in slices {
            if (s.start + s.len) as u64 > trunk.len {
                return Err(StoreError::BadSlice {
                    tensor: "a trunk vector",
                    start: s.start,
                    len: s.len,
                    run_len: trunk.len,
                });
            }
            let run = ByteRun {
                shard: trunk.shard,
                offset: trunk.offset + s.start as u64,
                len: s.len as u64,
            };
            let buf = AlignedBuf::zeroed(any_offset(run.len)?)?;
            let loaded = self
                .counters
                .waiting(|| self.pool.read(run, buf))
                .map_err(|f| StoreError::from(f.error).reading(Weights::Trunk { layer }))?;
            self.counters.read(Class::Trunk, run.len);
            out.push((s.start, loaded.payload().to_vec()));
        }
        Ok(out)
    }

    /// Starts reading the streamed layer after `layer` into a spare slot, if one is free.
    fn prefetch_after(&self, layer: usize) {
        let next = self
            .streamed
            .iter()
            .copied()
            .find(|&l| l > layer)
            .or_else(|| self.streamed.first().copied());
        let Some(next) = next else { return };
        let mut ring = self.ring.lock();
        if ring.pending.is_some() {
            return;
        }
        if let Some(buf) = ring.spare.pop() {
            let batch = self.pool.submit_as(
                vec![(self.layout.layers[next].trunk, buf)],
                reader::Priority::Prefetch,
            );
            ring.pending = Some((next, batch));
        }
    }

    /// How a layer's experts `needed` split into [`WeightStore::experts_each`] requests: every
    /// expert of one request is held in a cache slot at once, so a request names at most the
    /// slots beside the lookahead's — plus the experts `ahead` already reads, which hold
    /// lookahead slots and all ride with the first request (a guess a later request needs is
    /// then not mistaken for a wrong one).
    pub fn expert_groups(
        &self,
        needed: &[usize],
        ahead: Option<&ExpertPrefetch<'_>>,
    ) -> Vec<Vec<usize>> {
        let per_group = (self.plan.cache_slots - self.plan.lookahead_slots).max(1);
        let (guessed, others): (Vec<usize>, Vec<usize>) = needed
            .iter()
            .partition(|&&e| ahead.is_some_and(|a| a.covers(e)));
        let mut groups: Vec<Vec<usize>> = others.chunks(per_group).map(<[usize]>::to_vec).collect();
        match groups.first_mut() {
            Some(first) => first.extend(guessed),
            None if !guessed.is_empty() => groups.push(guessed),
            None => {}
        }
        groups
    }

    /// The MoE layout of layer `layer`.
    fn moe_layout(&self, layer: usize) -> Result<&MoeLayout, StoreError> {
        let count = self.layout.layers.len();
        match &self
            .layout
            .layers
            .get(layer)
            .ok_or(StoreError::NoSuchLayer { layer, count })?
            .ffn
        {
            FfnLayout::Moe(m) => Ok(m),
            FfnLayout::Dense(_) => Err(StoreError::NotMoe { layer }),
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

    /// Routing lookahead (plan rule 4): starts reading the experts `predicted` for layer `layer`
    /// (most likely first) before its routing is known, into the plan's lookahead slots. `None` when the plan has
    /// no lookahead slots or `predicted` needs more; a guess that finds no free slot, or whose
    /// expert is being read already, is skipped. The bytes handed out later are the stored
    /// bytes either way: a guess changes when an expert is read, never what is computed.
    ///
    /// Measured on `bench` at 8.5 GiB (trunk resident): routing the mixer's input predicted
    /// 92–99 % of each layer's 16 experts (`Model::read_ahead`), and the reads then run while
    /// the mixer computes.
    pub fn prefetch_experts(
        &self,
        layer: usize,
        predicted: &[usize],
    ) -> Result<Option<ExpertPrefetch<'_>>, StoreError> {
        if self.plan.lookahead_slots == 0 || predicted.len() > self.plan.lookahead_slots {
            return Ok(None);
        }
        let moe = self.moe_layout(layer)?;
        let mut reads = Vec::new();
        let mut runs = Vec::new();
        let mut held = Vec::new();
        for &e in predicted {
            let run = self.expert_run(layer, moe, e)?;
            let key = ExpertId {
                layer: layer as u32,
                expert: e as u32,
            };
            match self.cache.acquire_ahead(key, run)? {
                Some(Acquired::Ready(a)) => held.push((e, a)),
                Some(Acquired::Read { ticket, run, buf }) => {
                    reads.push((e, ticket, run.len));
                    runs.push((run, buf));
                }
                None => {}
            }
        }
        Ok(Some(ExpertPrefetch {
            layer,
            batch: self.pool.submit_ranked(runs),
            reads,
            held,
            predicted: predicted.to_vec(),
            early: false,
        }))
    }

    fn expert_run(&self, layer: usize, moe: &MoeLayout, e: usize) -> Result<ByteRun, StoreError> {
        match moe.experts.get(e) {
            Some((run, _)) => Ok(*run),
            None => Err(StoreError::NoSuchExpert {
                layer,
                expert: e,
                count: moe.experts.len(),
            }),
        }
    }

    /// The routed experts `ids` of layer `layer` (one of [`WeightStore::expert_groups`]),
    /// handed to `compute` as they become available: first every resident one in one call,
    /// then each read as it lands (the misses are read as one batch, §4.4), so compute overlaps
    /// the remaining reads. `ahead`, the layer's [`ExpertPrefetch`], supplies reads already in
    /// flight; its guesses `ids` does not name are withdrawn. `meanwhile` runs once, right
    /// after the misses are issued: work that needs no expert (the shared MLP) hides under the
    /// reads. Each expert's scale bytes are verified on its first hand-out; a corrupt or
    /// unreadable expert — guessed or not — fails the request (no expert is skipped).
    pub fn experts_each<E: From<StoreError>>(
        &self,
        layer: usize,
        ids: &[usize],
        ahead: Option<ExpertPrefetch<'_>>,
        meanwhile: impl FnOnce(),
        mut compute: impl FnMut(Vec<ExpertView<'_>>) -> Result<(), E>,
    ) -> Result<(), E> {
        let moe = self.moe_layout(layer)?;
        if let Some(trace) = &self.trace {
            trace
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(ids.iter().map(|&e| ExpertId {
                    layer: layer as u32,
                    expert: e as u32,
                }));
        }
        self.fetch_each(layer, ids, ahead, meanwhile, |got| {
            let mut views = Vec::with_capacity(got.len());
            for (e, run) in got {
                let (stored, layout) = &moe.experts[e];
                self.verify(layer, e, *stored, layout, run.payload())?;
                views.push(ExpertView {
                    expert: e,
                    run,
                    layout,
                });
            }
            compute(views)
        })
    }

    /// The cache's runs of experts `ids` of `layer` as `(expert, run)`: the resident ones in one
    /// call of `f`, then each read as it lands (a read of `ahead` included); `meanwhile` runs
    /// once the misses are issued.
    fn fetch_each<E: From<StoreError>>(
        &self,
        layer: usize,
        ids: &[usize],
        ahead: Option<ExpertPrefetch<'_>>,
        meanwhile: impl FnOnce(),
        mut f: impl FnMut(Vec<(usize, Arc<LoadedRun>)>) -> Result<(), E>,
    ) -> Result<(), E> {
        let moe = self.moe_layout(layer)?;
        // A prefetch for another layer is dropped: its queued reads are skipped.
        let ahead = ahead.filter(|a| a.layer == layer);
        if let (Some(a), Some(g)) = (&ahead, self.guesses.get(layer)) {
            let confirmed = a.predicted.iter().filter(|e| ids.contains(e)).count();
            g.passes.fetch_add(1, Ordering::Relaxed);
            g.early.fetch_add(u64::from(a.early), Ordering::Relaxed);
            g.predicted
                .fetch_add(a.predicted.len() as u64, Ordering::Relaxed);
            g.routed.fetch_add(ids.len() as u64, Ordering::Relaxed);
            g.confirmed.fetch_add(confirmed as u64, Ordering::Relaxed);
        }
        let (mut batch, mut pending, held) = match ahead {
            Some(a) => {
                let pending: Vec<Option<PendingRead<'_>>> = a
                    .reads
                    .into_iter()
                    .map(|(expert, ticket, len)| {
                        let wanted = ids.contains(&expert);
                        if wanted {
                            ticket.count_demand();
                        }
                        Some(PendingRead {
                            expert,
                            ticket,
                            len,
                            guessed: true,
                            wanted,
                        })
                    })
                    .collect();
                // Withdraw the wrong guesses no reader has started, before the misses queue.
                for (id, p) in pending.iter().enumerate() {
                    if p.as_ref().is_some_and(|p| !p.wanted) {
                        self.pool.unqueue(&a.batch, id);
                    }
                }
                (Some(a.batch), pending, a.held)
            }
            None => (None, Vec::new(), Vec::new()),
        };
        let mut ready = Vec::new();
        let mut reads = Vec::new();
        for &e in ids {
            if pending.iter().flatten().any(|p| p.expert == e) {
                continue; // its read is in flight already
            }
            let run = self.expert_run(layer, moe, e)?;
            let key = ExpertId {
                layer: layer as u32,
                expert: e as u32,
            };
            match self.cache.acquire(key, run).map_err(StoreError::from)? {
                Acquired::Ready(a) => {
                    self.counters.avoided(a.payload().len());
                    ready.push((e, a));
                }
                Acquired::Read { ticket, run, buf } => {
                    pending.push(Some(PendingRead {
                        expert: e,
                        ticket,
                        len: run.len,
                        guessed: false,
                        wanted: true,
                    }));
                    reads.push((run, buf));
                }
            }
        }
        // The routing's own lookups hold what they use now.
        drop(held);
        // Issue the misses before computing the resident experts.
        if !reads.is_empty() {
            match &mut batch {
                Some(b) => self.pool.extend(b, reads, Priority::Demand),
                None => batch = Some(self.pool.submit(reads)),
            }
        }
        meanwhile();
        if !ready.is_empty() {
            f(ready)?;
        }
        let Some(batch) = &mut batch else {
            return Ok(());
        };
        while let Some((id, result)) = self.counters.waiting(|| batch.wait_any()) {
            let Some(p) = pending.get_mut(id).and_then(Option::take) else {
                continue;
            };
            match result {
                // A withdrawn guess: its slot and buffer go back, nothing was read.
                Err(ReadFailure {
                    error: ReadError::Cancelled { .. },
                    buf,
                }) if !p.wanted => p.ticket.release(buf),
                result => {
                    // Publishing a failure empties the slot; the error names file, offset,
                    // errno.
                    let run = p.ticket.publish(result).map_err(StoreError::from)?;
                    self.counters.read(Class::Experts, p.len);
                    if p.guessed {
                        self.counters
                            .lookahead_read
                            .fetch_add(p.len, Ordering::Relaxed);
                    }
                    if p.wanted {
                        f(vec![(p.expert, run)])?;
                    } else {
                        self.counters
                            .lookahead_unused
                            .fetch_add(p.len, Ordering::Relaxed);
                    }
                }
            }
        }
        Ok(())
    }

    fn verify(
        &self,
        layer: usize,
        e: usize,
        stored: ByteRun,
        layout: &ExpertLayout,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let Some(cell) = self.verdicts.get(layer).and_then(|v| v.get(e)) else {
            return Err(StoreError::NoSuchExpert {
                layer,
                expert: e,
                count: 0,
            });
        };
        let verdict = match cell.get() {
            Some(v) => *v,
            None => {
                let v = self.check_scales(layer, e, stored, layout, bytes)?;
                *cell.get_or_init(|| v)
            }
        };
        match verdict {
            None => Ok(()),
            Some(bad) => Err(StoreError::NanScale {
                layer,
                expert: e,
                tensor: bad.tensor,
                row: bad.row,
                group: bad.group,
                path: self.shard_path(stored.shard),
                offset: bad.offset,
            }),
        }
    }

    /// The stored bytes of embedding row `id`.
    pub fn embedding_row(&self, id: usize) -> Result<Vec<u8>, StoreError> {
        let t = &self.layout.embed_tokens;
        let row_bytes = head_row_bytes(&t.slice);
        let rows = t.slice.shape.first().copied().unwrap_or(0);
        if id >= rows || row_bytes == 0 {
            return Err(StoreError::NoSuchRow { id, rows });
        }
        let start = t.slice.start + id * row_bytes;
        if let Some(table) = &self.embed_tokens {
            let row = table
                .payload()
                .get(start..start + row_bytes)
                .ok_or(StoreError::NoSuchRow { id, rows })?;
            self.counters.avoided(row.len());
            return Ok(row.to_vec());
        }
        let run = ByteRun {
            shard: t.run.shard,
            offset: t.run.offset + start as u64,
            len: row_bytes as u64,
        };
        let mut slot = self.row_buf.lock().unwrap_or_else(|e| e.into_inner());
        let buf = match slot.take() {
            Some(b) => b,
            None => AlignedBuf::zeroed(any_offset(run.len)?)?,
        };
        let loaded = match self.counters.waiting(|| self.pool.read(run, buf)) {
            Ok(r) => r,
            Err(f) => {
                *slot = f.buf;
                return Err(StoreError::from(f.error).reading(Weights::Embedding));
            }
        };
        self.counters.read(Class::Embedding, run.len);
        let row = loaded.payload().to_vec();
        *slot = Some(loaded.into_buffer());
        Ok(row)
    }

    /// lm_head in blocks of whole rows, in row order: `f(first_row, bytes)` gets each block
    /// (the bytes of rows `first_row..`, stored format). Resident: one block.
    pub fn lm_head_blocks<E: From<StoreError>>(
        &self,
        mut f: impl FnMut(usize, &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let t = &self.layout.lm_head;
        let row_bytes = head_row_bytes(&t.slice);
        let rows = t.slice.shape.first().copied().unwrap_or(0);
        let bad = || StoreError::BadSlice {
            tensor: "lm_head.weight",
            start: t.slice.start,
            len: t.slice.len,
            run_len: t.run.len,
        };
        if let Some(head) = &self.lm_head {
            let bytes = slice_of(head.payload(), &t.slice).ok_or_else(bad)?;
            self.counters.avoided(bytes.len());
            return f(0, bytes);
        }
        if let Some(c) = self.chunks.as_ref().filter(|c| c.has(Unit::LmHead)) {
            return c.rows(&self.pool, &self.counters, Unit::LmHead, t.slice.start, f);
        }
        let block = head_block_rows(&t.slice);
        let mut first = 0;
        while first < rows {
            let n = block.min(rows - first);
            let run = ByteRun {
                shard: t.run.shard,
                offset: t.run.offset + (t.slice.start + first * row_bytes) as u64,
                len: (n * row_bytes) as u64,
            };
            let buf = self.ring.take("an lm_head block")?;
            let loaded = match self.counters.waiting(|| self.pool.read(run, buf)) {
                Ok(r) => r,
                Err(fail) => {
                    if let Some(b) = fail.buf {
                        self.ring.give_back(b);
                    }
                    return Err(StoreError::from(fail.error).reading(Weights::LmHead).into());
                }
            };
            self.counters.read(Class::Head, run.len);
            let result = f(first, loaded.payload());
            self.ring.give_back(loaded.into_buffer());
            result?;
            first += n;
        }
        Ok(())
    }

    /// A small model-level tensor's run.
    pub fn model_tensor(&self, which: ModelTensorId) -> &[u8] {
        let run = match which {
            ModelTensorId::Norm => &self.norm,
            ModelTensorId::OutputAttnResNorm => &self.output_attn_res_norm,
            ModelTensorId::OutputAttnResProj => &self.output_attn_res_proj,
        };
        run.payload()
    }

    fn shard_path(&self, shard: usize) -> PathBuf {
        self.pool
            .shards()
            .shard(shard)
            .map(|s| s.path().to_path_buf())
            .unwrap_or_default()
    }

    /// Scans the three scale tensors of one expert for the NaN byte (spec §3.5).
    fn check_scales(
        &self,
        layer: usize,
        expert: usize,
        stored: ByteRun,
        layout: &ExpertLayout,
        run: &[u8],
    ) -> Result<Option<BadScale>, StoreError> {
        for (tensor, slice) in [
            ("w1.weight_scale", &layout.w1_scale),
            ("w2.weight_scale", &layout.w2_scale),
            ("w3.weight_scale", &layout.w3_scale),
        ] {
            let bytes = slice_of(run, slice).ok_or_else(|| StoreError::SliceOutsideRun {
                layer,
                expert,
                tensor,
                start: slice.start,
                len: slice.len,
                path: self.shard_path(stored.shard),
                offset: stored.offset,
            })?;
            let groups = slice.shape.get(1).copied().unwrap_or(0).max(1);
            if let Some((row, group)) = mxfp4::find_nan_scale(bytes, groups) {
                let offset = stored.offset + (slice.start + row * groups + group) as u64;
                return Ok(Some(BadScale {
                    tensor,
                    row,
                    group,
                    offset,
                }));
            }
        }
        Ok(None)
    }
}

fn slice_of<'a>(run: &'a [u8], s: &Slice) -> Option<&'a [u8]> {
    run.get(s.start..s.start.checked_add(s.len)?)
}

/// Bytes of one row of a `[rows, cols]` table.
fn head_row_bytes(s: &Slice) -> usize {
    let rows = s.shape.first().copied().unwrap_or(0);
    s.len.checked_div(rows).unwrap_or(0)
}

/// Rows per streamed lm_head block: at most [`direct_io::MAX_CHUNK`] bytes (the plan's piece),
/// at least one row.
fn head_block_rows(s: &Slice) -> usize {
    (direct_io::MAX_CHUNK / head_row_bytes(s).max(1)).max(1)
}

/// The aligned buffer a run needs at its own offset.
/// Whether [`WeightStore::open`] reads every routed expert into the cache: the cache holds
/// them all (the `max` plan), so a run never waits on an expert read.
fn preloads_experts(layout: &ModelLayout, plan: &Plan) -> bool {
    let pool: usize = layout
        .layers
        .iter()
        .map(|l| match &l.ffn {
            FfnLayout::Moe(m) => m.experts.len(),
            FfnLayout::Dense(_) => 0,
        })
        .sum();
    pool > 0 && plan.cache_slots >= pool
}

/// The routed experts' bytes of one layer (0 for a dense one).
fn expert_bytes(layer: &LayerLayout) -> u64 {
    match &layer.ffn {
        FfnLayout::Moe(m) => m.experts.iter().map(|(run, _)| run.len).sum(),
        FfnLayout::Dense(_) => 0,
    }
}

/// The bytes [`WeightStore::open`] reads into memory that stays resident under `plan`: pinned
/// trunk layers, a resident embedding and lm_head, the model vectors and, when the cache holds
/// every expert, the experts. What a load's progress counts to; streamed weights are read
/// later, as tokens need them.
pub fn resident_load_bytes(layout: &ModelLayout, plan: &Plan) -> u64 {
    let pinned: u64 = plan
        .pinned_layers
        .iter()
        .filter_map(|&l| layout.layers.get(l))
        .map(|l| l.trunk.len)
        .sum();
    let resident = |r: Residency, run: ByteRun| match r {
        Residency::Resident => run.len,
        Residency::Streamed => 0,
    };
    let experts = if preloads_experts(layout, plan) {
        layout.layers.iter().map(expert_bytes).sum()
    } else {
        0
    };
    pinned
        + resident(plan.embedding, layout.embed_tokens.run)
        + resident(plan.lm_head, layout.lm_head.run)
        + layout.norm.run.len
        + layout.output_attn_res_norm.run.len
        + layout.output_attn_res_proj.run.len
        + experts
}

fn window_capacity(run: ByteRun) -> Result<usize, StoreError> {
    Ok(Window::of(run)?.len)
}

/// The aligned buffer that holds a run of `len` bytes at any offset (ring slots and the row
/// buffer serve runs at many offsets).
fn any_offset(len: u64) -> Result<usize, StoreError> {
    Window::capacity_for(len)
        .and_then(|c| usize::try_from(c).ok())
        .ok_or(StoreError::Read(ReadError::RunOverflow {
            shard: 0,
            offset: 0,
            len,
        }))
}
