//! Where weight bytes live, under one RAM budget (issue 4; engine-lessons §1–§4, §8).
//!
//! The model never touches a file: it asks the [`WeightStore`] for the bytes of one layer's
//! trunk run ([`WeightStore::trunk`]), for a *set* of routed experts right after routing
//! ([`WeightStore::experts_each`]), for embedding rows and for the model-level tensors. The
//! [`Plan`] (computed by [`crate::plan`]) decides, before anything is allocated, what is resident:
//!
//! * pinned trunk layers are read once at load into aligned buffers; the others stream through
//!   a ring of ≥ 2 whole-layer slots, the next streamed layer read while the current computes,
//!   or through the `chunks` stream: a few aligned chunks of whole rows, read ahead across
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
//!
//! The store by concern: `open` (opening, the resident reads and the load's progress),
//! `trunk` (pinned, ring- and chunk-streamed trunk layers), `experts` (routed experts
//! through the cache, the routing lookahead's reads, the scale check), `stats` (the
//! accounting: bytes read and avoided, I/O waits, the lookahead's guesses) and `error`; this
//! file holds the store itself, the embedding and lm_head. Below them: [`direct_io`] (aligned
//! reads of the shard files), [`reader`] (the reader threads), [`expert_cache`], `chunks` (the
//! chunk stream) and [`direct_buffer`] (aligned buffers).

mod chunks;
pub mod direct_buffer;
pub mod direct_io;
mod error;
pub mod expert_cache;
mod experts;
#[cfg(feature = "fault-injection")]
pub mod fault;
mod open;
pub mod reader;
mod stats;
mod trunk;

pub use error::{StoreError, Weights};
pub use experts::{ExpertPrefetch, ExpertView};
pub use open::{PackOffer, StoreOptions, resident_load_bytes};
pub use stats::{LayerGuesses, StoreStats};
pub use trunk::{Bytes, Ring, TrunkView};

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use crate::checkpoint::layout::{ByteRun, ModelLayout, Slice};
use crate::plan::Plan;
use chunks::{ChunkStream, Unit};
use direct_buffer::AlignedBuf;
use direct_io::{LoadedRun, ReadError, Window};
use expert_cache::{ExpertCache, ExpertId};
use experts::BadScale;
use reader::ReaderPool;
use stats::{Class, GuessCounters, Traffic};

/// The three small model-level tensors (spec §3.3, shard 94), always resident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelTensorId {
    Norm,
    OutputAttnResNorm,
    OutputAttnResProj,
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
    traffic: Traffic,
    /// `guesses[L]`: how the lookahead's guesses for layer L fared against its routing.
    guesses: Vec<GuessCounters>,
    /// With [`StoreOptions::record_trace`]: the (layer, expert) requests so far.
    trace: Option<Mutex<Vec<ExpertId>>>,
}

impl WeightStore {
    /// The plan the store follows.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Frees up to `n` expert-cache slots for a prefill pass's activations and returns how
    /// many ([`ExpertCache::lend`]; at most the plan's `pass_cache_slots` are out at once).
    pub fn lend_cache_slots(&self, n: usize) -> usize {
        self.cache.lend(n)
    }

    /// Takes back `n` slots lent by [`WeightStore::lend_cache_slots`].
    pub fn give_back_cache_slots(&self, n: usize) {
        self.cache.give_back(n)
    }

    /// The layout the store serves.
    pub fn layout(&self) -> &ModelLayout {
        &self.layout
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
            self.traffic.avoided(row.len());
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
        let loaded = match self.traffic.waiting(|| self.pool.read(run, buf)) {
            Ok(r) => r,
            Err(f) => {
                *slot = f.buf;
                return Err(StoreError::from(f.error).reading(Weights::Embedding));
            }
        };
        self.traffic.read(Class::Embedding, run.len);
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
            tensor: "language_model.lm_head.weight",
            start: t.slice.start,
            len: t.slice.len,
            run_len: t.run.len,
        };
        if let Some(head) = &self.lm_head {
            let bytes = slice_of(head.payload(), &t.slice).ok_or_else(bad)?;
            self.traffic.avoided(bytes.len());
            return f(0, bytes);
        }
        if let Some(c) = self.chunks.as_ref().filter(|c| c.has(Unit::LmHead)) {
            return c.rows(&self.pool, &self.traffic, Unit::LmHead, t.slice.start, f);
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
            let loaded = match self.traffic.waiting(|| self.pool.read(run, buf)) {
                Ok(r) => r,
                Err(fail) => {
                    if let Some(b) = fail.buf {
                        self.ring.give_back(b);
                    }
                    return Err(StoreError::from(fail.error).reading(Weights::LmHead).into());
                }
            };
            self.traffic.read(Class::Head, run.len);
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
