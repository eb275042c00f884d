//! The chunk stream (plan [`crate::plan::StreamScheme::Chunks`]): unpinned trunk and a streamed
//! lm_head pass through a small fixed set of aligned buffers instead of whole-layer slots.
//!
//! Every streamed matrix is cut into **pieces** of whole rows, each at most one buffer's
//! payload (`chunk − 4096`: the aligned window of a run at any offset needs one page more than
//! its length). The pieces of every streamed layer, in the order the forward pass consumes its
//! matrices (given by the model), then those of a streamed lm_head, form one **cycle** — the
//! bytes one token reads. `in_flight` buffers are always being read, following the cycle across
//! tensor and layer boundaries and wrapping to the next token; the one being consumed is the
//! `in_flight + 1`-th. A consumer asks for a tensor's pieces ([`ChunkStream::rows`]) and gets
//! each as it lands, as `(first_row, bytes)`.
//!
//! The pieces read are the stored bytes whatever the chunk size, and a consumer that computes
//! each output row from its weight row alone gets the same bits as from the whole matrix. A
//! request that is not the next in the cycle (a forward cancelled mid-layer, a caller that
//! skips around) waits out the reads in flight, keeps their buffers and restarts the cycle at
//! the piece asked for: slower, never wrong. The bytes those abandoned reads moved are counted
//! as trunk reads, so a consumer whose order differs from the cycle shows up as more bytes per
//! token than the plan predicts.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use super::aligned::AlignedBuf;
use super::direct_io::{LoadedRun, ReadError};
use super::reader::{Priority, ReadBatch, ReaderPool};
use super::{Class, StoreError, Traffic, Weights};
use crate::checkpoint::layout::{ByteRun, Slice};
use crate::plan::buffers::ALIGN;

/// What a stream unit is: a streamed trunk layer or the lm_head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Layer(usize),
    LmHead,
}

/// One read: whole rows `first_row..` of one tensor.
#[derive(Debug, Clone, Copy)]
struct ChunkRead {
    first_row: usize,
    run: ByteRun,
    class: Class,
}

/// A streamed tensor: where its run starts within its unit's run (its key) and its pieces.
#[derive(Debug, Clone)]
struct StreamedTensor {
    start: usize,
    pieces: Range<usize>,
}

/// The tensors of one unit, in consumption order.
#[derive(Debug, Clone)]
struct UnitPieces {
    unit: Unit,
    tensors: Vec<StreamedTensor>,
}

struct StreamState {
    spare: Vec<AlignedBuf>,
    /// Reads in flight, in cycle order: (piece, one-run batch).
    in_flight: VecDeque<(usize, ReadBatch)>,
    /// The next piece to issue.
    next: usize,
}

/// The pieces of one cycle and the buffers they pass through.
pub(super) struct ChunkStream {
    pieces: Vec<ChunkRead>,
    units: Vec<UnitPieces>,
    state: Mutex<StreamState>,
    chunk: usize,
    buffers: usize,
}

impl ChunkStream {
    /// The cycle of `units` (each with the run its slices are relative to and its tensors —
    /// `[rows, …]`, row-major — in consumption order) through `buffers` buffers of `chunk`
    /// bytes. Fails if a row does not fit one buffer.
    pub(super) fn new(
        units: Vec<(Unit, ByteRun, Vec<Slice>)>,
        chunk: usize,
        buffers: usize,
    ) -> Result<Self, StoreError> {
        let payload = chunk.saturating_sub(ALIGN);
        let mut pieces = Vec::new();
        let mut out = Vec::with_capacity(units.len());
        for (unit, run, tensors) in units {
            let class = match unit {
                Unit::Layer(_) => Class::Trunk,
                Unit::LmHead => Class::Head,
            };
            let mut ts = Vec::with_capacity(tensors.len());
            for s in &tensors {
                let rows = s.shape.first().copied().unwrap_or(0);
                let row_bytes = s.len.checked_div(rows).unwrap_or(0);
                if row_bytes == 0 || row_bytes > payload || s.start + s.len > run.len as usize {
                    return Err(StoreError::RowExceedsChunk {
                        row_bytes,
                        chunk,
                        unit: format!("{unit:?}"),
                    });
                }
                let per = payload / row_bytes;
                let first = pieces.len();
                let mut r = 0;
                while r < rows {
                    let n = per.min(rows - r);
                    pieces.push(ChunkRead {
                        first_row: r,
                        run: ByteRun {
                            shard: run.shard,
                            offset: run.offset + (s.start + r * row_bytes) as u64,
                            len: (n * row_bytes) as u64,
                        },
                        class,
                    });
                    r += n;
                }
                ts.push(StreamedTensor {
                    start: s.start,
                    pieces: first..pieces.len(),
                });
            }
            out.push(UnitPieces { unit, tensors: ts });
        }
        let spare = (0..buffers)
            .map(|_| AlignedBuf::zeroed(chunk))
            .collect::<Result<_, _>>()?;
        Ok(ChunkStream {
            pieces,
            units: out,
            state: Mutex::new(StreamState {
                spare,
                in_flight: VecDeque::new(),
                next: 0,
            }),
            chunk,
            buffers,
        })
    }

    /// Whether `unit` streams here.
    pub(super) fn has(&self, unit: Unit) -> bool {
        self.units.iter().any(|u| u.unit == unit)
    }

    fn lock(&self) -> MutexGuard<'_, StreamState> {
        // Critical sections only move buffers and batches between fields.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts reads into every spare buffer, following the cycle (wrapping to the next token).
    pub(super) fn top_up(&self, pool: &ReaderPool) {
        let mut st = self.lock();
        self.issue(&mut st, pool);
    }

    fn issue(&self, st: &mut StreamState, pool: &ReaderPool) {
        if self.pieces.is_empty() {
            return;
        }
        while let Some(buf) = st.spare.pop() {
            let p = st.next;
            let batch = pool.submit_as(vec![(self.pieces[p].run, buf)], Priority::Prefetch);
            st.in_flight.push_back((p, batch));
            st.next = (p + 1) % self.pieces.len();
        }
    }

    /// The pieces of the tensor at `start` within `unit`'s run, each handed to `f` as
    /// `(first_row, bytes of those rows)` as it lands, in row order.
    pub(super) fn rows<E: From<StoreError>>(
        &self,
        pool: &ReaderPool,
        traffic: &Traffic,
        unit: Unit,
        start: usize,
        mut f: impl FnMut(usize, &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let pieces = self
            .units
            .iter()
            .find(|u| u.unit == unit)
            .and_then(|u| u.tensors.iter().find(|t| t.start == start))
            .map(|t| t.pieces.clone())
            .ok_or(StoreError::NotStreamed {
                unit: format!("{unit:?}"),
                start,
            })?;
        let what = match unit {
            Unit::Layer(layer) => Weights::Trunk { layer },
            Unit::LmHead => Weights::LmHead,
        };
        for p in pieces {
            let loaded = self.take(pool, traffic, p).map_err(|e| e.reading(what))?;
            let result = f(self.pieces[p].first_row, loaded.payload());
            self.give_back(pool, loaded.into_buffer());
            result?;
        }
        Ok(())
    }

    /// ChunkRead `p`'s bytes: the oldest read in flight if it is `p`, else (out of order) the cycle
    /// restarts at `p` once the reads in flight have finished.
    fn take(
        &self,
        pool: &ReaderPool,
        traffic: &Traffic,
        p: usize,
    ) -> Result<LoadedRun, StoreError> {
        let mut batch = {
            let mut st = self.lock();
            if st.in_flight.front().map(|(q, _)| *q) != Some(p) {
                let abandoned: Vec<_> = st.in_flight.drain(..).collect();
                for (q, mut b) in abandoned {
                    match traffic.waiting(|| b.wait(0)) {
                        Some(Ok(r)) => {
                            traffic.read(self.pieces[q].class, self.pieces[q].run.len);
                            st.spare.push(r.into_buffer());
                        }
                        Some(Err(f)) => st.spare.push(match f.buf {
                            Some(b) => b,
                            None => AlignedBuf::zeroed(self.chunk)?,
                        }),
                        None => st.spare.push(AlignedBuf::zeroed(self.chunk)?),
                    }
                }
                st.next = p;
                self.issue(&mut st, pool);
            }
            match st.in_flight.pop_front() {
                Some((_, b)) => b,
                None => {
                    return Err(StoreError::RingExhausted {
                        what: "a trunk chunk",
                        slots: self.buffers,
                    });
                }
            }
        };
        let piece = self.pieces[p];
        match traffic.waiting(|| batch.wait(0)) {
            Some(Ok(r)) => {
                traffic.read(piece.class, piece.run.len);
                Ok(r)
            }
            Some(Err(f)) => {
                let buf = match f.buf {
                    Some(b) => b,
                    None => AlignedBuf::zeroed(self.chunk)?,
                };
                self.give_back(pool, buf);
                Err(f.error.into())
            }
            None => {
                self.give_back(pool, AlignedBuf::zeroed(self.chunk)?);
                Err(ReadError::BufferLost {
                    shard: piece.run.shard,
                    offset: piece.run.offset,
                    len: piece.run.len,
                }
                .into())
            }
        }
    }

    fn give_back(&self, pool: &ReaderPool, buf: AlignedBuf) {
        let mut st = self.lock();
        st.spare.push(buf);
        self.issue(&mut st, pool);
    }
}
