//! A layer's trunk (every non-expert tensor): pinned at load, or streamed — through a ring of
//! whole-layer slots, the next streamed layer read while the current one computes, or through
//! the chunk stream by row ranges ([`WeightStore::trunk_rows`]).

use std::sync::{Mutex, MutexGuard};

use super::chunks::Unit;
use super::direct_buffer::AlignedBuf;
use super::direct_io::{LoadedRun, ReadError};
use super::reader::{self, ReadBatch};
use super::stats::Class;
use super::{StoreError, WeightStore, Weights, any_offset};
use crate::checkpoint::layout::{ByteRun, Slice};

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

/// The trunk ring: spare slot buffers and the read in flight for the next streamed layer.
pub struct Ring {
    state: Mutex<RingState>,
    slots: usize,
    pub(super) slot_bytes: usize,
}

struct RingState {
    spare: Vec<AlignedBuf>,
    /// The prefetch in flight: which layer, and its one-run batch.
    pending: Option<(usize, ReadBatch)>,
}

impl Ring {
    /// `slots` buffers of `slot_bytes`; none when nothing streams (`slot_bytes` 0). A single
    /// slot is refused: the prefetch would overwrite the layer being computed (§3.1).
    pub(super) fn new(slots: usize, slot_bytes: usize) -> Result<Self, StoreError> {
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

    pub(super) fn give_back(&self, buf: AlignedBuf) {
        self.lock().spare.push(buf);
    }

    pub(super) fn take(&self, what: &'static str) -> Result<AlignedBuf, StoreError> {
        self.lock().spare.pop().ok_or(StoreError::RingExhausted {
            what,
            slots: self.slots,
        })
    }
}

impl WeightStore {
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
            self.traffic.avoided(run.payload().len());
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
                self.traffic
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
                self.traffic.waiting(|| self.pool.read(run, buf))
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
        self.traffic.read(Class::Trunk, run.len);
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
            Some(c) => c.rows(&self.pool, &self.traffic, Unit::Layer(layer), start, f),
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
                .traffic
                .waiting(|| self.pool.read(run, buf))
                .map_err(|f| StoreError::from(f.error).reading(Weights::Trunk { layer }))?;
            self.traffic.read(Class::Trunk, run.len);
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
}
