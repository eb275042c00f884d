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
//!
//! With a trunk pack ([`crate::pack`]) a matrix the pack holds is read from the pack instead:
//! its pieces are whole pack blocks (packed bytes at most a buffer's payload, decoded bytes at
//! most a payload too), read into the same buffers by the same reader threads with the same
//! direct I/O, and decoded — the blocks of a piece spread over the compute threads — into one
//! scratch buffer of a payload's size before the consumer sees the rows. The decoder returns
//! the exact bytes of the shards or refuses the block, naming file, tensor, block and offset;
//! so the rows handed on are the same bytes either way, and so is every result.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use rayon::prelude::*;

use super::direct_buffer::AlignedBuf;
use super::direct_io::{LoadedRun, ReadError};
use super::reader::{Priority, ReadBatch, ReaderPool};
use super::{Class, StoreError, Traffic, Weights};
use crate::checkpoint::layout::{ByteRun, Slice};
use crate::pack::{self, PackFile, PackedTensor};
use crate::plan::buffers::ALIGN;

/// What a stream unit is: a streamed trunk layer or the lm_head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Layer(usize),
    LmHead,
}

/// One read: whole rows `first_row..` of one tensor, from the shards or (`packed`) the pack.
#[derive(Debug, Clone, Copy)]
struct ChunkRead {
    first_row: usize,
    run: ByteRun,
    class: Class,
    packed: Option<PackedPiece>,
}

/// A piece read from the pack: blocks `first_block..end_block` of pack tensor `tensor`,
/// `decoded` bytes once decoded.
#[derive(Debug, Clone, Copy)]
struct PackedPiece {
    tensor: usize,
    first_block: usize,
    end_block: usize,
    decoded: usize,
}

/// The pack the stream reads packed matrices from: the file (its tensors and block table),
/// its index in the reader pool's files, and the decoder's path.
pub(super) struct StreamPack {
    pub file: PackFile,
    pub shard: usize,
    pub path: pack::Path,
}

/// What one cycle (one token's streamed trunk and lm_head) moves: bytes read from the drive
/// per class, and how much of it comes from the pack.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct CycleBytes {
    pub trunk: u64,
    pub lm_head: u64,
    /// Pack bytes read (included in `trunk` and `lm_head`).
    pub packed: u64,
    /// Their decoded bytes: the shard bytes they replace.
    pub decoded: u64,
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
    pack: Option<StreamPack>,
    /// Where a packed piece is decoded (a payload's bytes; empty without a pack).
    decoded: Mutex<Vec<u8>>,
    /// The units as given, to cut again without the pack ([`ChunkStream::unpack`]).
    source: Vec<(Unit, ByteRun, Vec<Slice>)>,
}

impl ChunkStream {
    /// The cycle of `units` (each with the run its slices are relative to and its tensors —
    /// `[rows, …]`, row-major — in consumption order) through `buffers` buffers of `chunk`
    /// bytes. Fails if a row does not fit one buffer. A matrix `pack` holds whose blocks fit a
    /// buffer is read from the pack.
    pub(super) fn new(
        units: Vec<(Unit, ByteRun, Vec<Slice>)>,
        chunk: usize,
        buffers: usize,
        pack: Option<StreamPack>,
    ) -> Result<Self, StoreError> {
        let payload = chunk.saturating_sub(ALIGN);
        let (pieces, cut) = cut(&units, chunk, pack.as_ref())?;
        let spare = (0..buffers)
            .map(|_| AlignedBuf::zeroed(chunk))
            .collect::<Result<_, _>>()?;
        let uses_pack = pieces.iter().any(|p| p.packed.is_some());
        Ok(ChunkStream {
            pieces,
            units: cut,
            state: Mutex::new(StreamState {
                spare,
                in_flight: VecDeque::new(),
                next: 0,
            }),
            chunk,
            buffers,
            pack: pack.filter(|_| uses_pack),
            decoded: Mutex::new(if uses_pack {
                vec![0; payload]
            } else {
                Vec::new()
            }),
            source: if uses_pack { units } else { Vec::new() },
        })
    }

    /// Stops reading the pack: every matrix is read from the shards again. Only before the
    /// first read (the cycle is cut anew).
    pub(super) fn unpack(&mut self) -> Result<(), StoreError> {
        let (pieces, cut) = cut(&self.source, self.chunk, None)?;
        self.pieces = pieces;
        self.units = cut;
        self.pack = None;
        *lock(&self.decoded) = Vec::new();
        Ok(())
    }

    /// Measures, before the first token, how fast the pack's bytes arrive and decode: the
    /// first packed pieces of the cycle (as many as there are buffers, at most `max_bytes`)
    /// read at once through the reader threads, then decoded on the current thread pool. Gives
    /// (drive, decoder) in pack bytes per second; `None` without packed pieces.
    pub(super) fn measure_pack(
        &self,
        pool: &ReaderPool,
        max_bytes: u64,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        let Some(pack) = &self.pack else {
            return Ok(None);
        };
        let mut st = self.lock();
        let mut chosen = Vec::new();
        let mut bytes = 0;
        for (i, p) in self.pieces.iter().enumerate() {
            if chosen.len() == st.spare.len() || bytes >= max_bytes {
                break;
            }
            if p.packed.is_some() {
                chosen.push(i);
                bytes += p.run.len;
            }
        }
        if chosen.is_empty() {
            return Ok(None);
        }
        let runs: Vec<_> = chosen
            .iter()
            .map(|&i| {
                Ok((
                    self.pieces[i].run,
                    st.spare.pop().ok_or(StoreError::RingExhausted {
                        what: "a pack measurement",
                        slots: self.buffers,
                    })?,
                ))
            })
            .collect::<Result<_, StoreError>>()?;
        let started = std::time::Instant::now();
        let mut batch = pool.submit(runs);
        let mut loaded = Vec::with_capacity(chosen.len());
        for (k, &i) in chosen.iter().enumerate() {
            match batch.wait(k) {
                Some(Ok(r)) => loaded.push((i, r)),
                Some(Err(f)) => {
                    st.spare.extend(f.buf);
                    st.spare
                        .extend(loaded.into_iter().map(|(_, r)| r.into_buffer()));
                    return Err(f.error.into());
                }
                None => {
                    let p = self.pieces[i].run;
                    return Err(ReadError::BufferLost {
                        shard: p.shard,
                        offset: p.offset,
                        len: p.len,
                    }
                    .into());
                }
            }
        }
        let read_secs = started.elapsed().as_secs_f64();
        let started = std::time::Instant::now();
        let mut out = lock(&self.decoded);
        let mut result = Ok(());
        for (i, r) in &loaded {
            if let Some(k) = self.pieces[*i].packed {
                result =
                    result.and_then(|()| decode_piece(pack, k, r.payload(), &mut out[..k.decoded]));
            }
        }
        let decode_secs = started.elapsed().as_secs_f64();
        st.spare
            .extend(loaded.into_iter().map(|(_, r)| r.into_buffer()));
        result.map_err(|e| StoreError::Pack(Box::new(e)))?;
        let per_second = |secs: f64| (bytes as f64 / secs.max(1e-9)) as u64;
        Ok(Some((per_second(read_secs), per_second(decode_secs))))
    }

    /// The bytes one cycle reads, and the pack's share of them.
    pub(super) fn cycle_bytes(&self) -> CycleBytes {
        let mut c = CycleBytes::default();
        for p in &self.pieces {
            match p.class {
                Class::Head => c.lm_head += p.run.len,
                _ => c.trunk += p.run.len,
            }
            if let Some(k) = p.packed {
                c.packed += p.run.len;
                c.decoded += k.decoded as u64;
            }
        }
        c
    }

    /// The decode buffer's bytes (0 when nothing streams from a pack).
    pub(super) fn decode_buffer_bytes(&self) -> usize {
        lock(&self.decoded).len()
    }

    /// Whether any piece comes from the pack.
    pub(super) fn reads_pack(&self) -> bool {
        self.pack.is_some()
    }

    /// Whether `unit` streams here.
    pub(super) fn has(&self, unit: Unit) -> bool {
        self.units.iter().any(|u| u.unit == unit)
    }

    fn lock(&self) -> MutexGuard<'_, StreamState> {
        lock(&self.state)
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
            let piece = self.pieces[p];
            let result = match (piece.packed, &self.pack) {
                (Some(k), Some(pack)) => {
                    let mut out = lock(&self.decoded);
                    let decoded = traffic.decoding(k.decoded as u64, || {
                        decode_piece(pack, k, loaded.payload(), &mut out[..k.decoded])
                    });
                    match decoded {
                        Ok(()) => f(piece.first_row, &out[..k.decoded]),
                        Err(e) => Err(E::from(StoreError::Pack(Box::new(e)))),
                    }
                }
                _ => f(piece.first_row, loaded.payload()),
            };
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
                            count(traffic, &self.pieces[q]);
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
                count(traffic, &piece);
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections only move buffers and batches between fields, or overwrite the decode
    // buffer whole before it is read: a panicking holder leaves nothing half-done that matters.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counts a piece's bytes read: as its class's, and a packed piece's also as pack bytes.
fn count(traffic: &Traffic, piece: &ChunkRead) {
    traffic.read(piece.class, piece.run.len);
    if piece.packed.is_some() {
        traffic.pack_read(piece.run.len);
    }
}

/// Whether every block of `t` fits a buffer's `payload`, packed and decoded.
fn fits(t: &PackedTensor, payload: usize) -> bool {
    (0..t.blocks()).all(|b| {
        let (_, len) = t.byte_range(b..b + 1);
        len as usize <= payload && t.block_rows(b).len() * t.cols * 2 <= payload
    })
}

/// Cuts pack tensor `index` (`t`, in pack file `shard`) into pieces of whole blocks, each as
/// many as fit a payload packed and decoded.
fn pack_pieces(
    pieces: &mut Vec<ChunkRead>,
    shard: usize,
    index: usize,
    t: &PackedTensor,
    payload: usize,
    class: Class,
) {
    let row_bytes = t.cols * 2;
    let mut b = 0;
    while b < t.blocks() {
        let rows_to = |end: usize| t.block_rows(end - 1).end - t.block_rows(b).start;
        let mut end = b + 1;
        while end < t.blocks()
            && t.byte_range(b..end + 1).1 as usize <= payload
            && rows_to(end + 1) * row_bytes <= payload
        {
            end += 1;
        }
        let (offset, len) = t.byte_range(b..end);
        pieces.push(ChunkRead {
            first_row: t.block_rows(b).start,
            run: ByteRun { shard, offset, len },
            class,
            packed: Some(PackedPiece {
                tensor: index,
                first_block: b,
                end_block: end,
                decoded: rows_to(end) * row_bytes,
            }),
        });
        b = end;
    }
}

/// Decodes piece `k` from its pack bytes `src` into `out` (its decoded bytes), its blocks
/// spread over the current rayon pool's threads: each block is decoded on its own into its own
/// rows, so the bytes are the same on any number of threads.
fn decode_piece(
    pack: &StreamPack,
    k: PackedPiece,
    src: &[u8],
    out: &mut [u8],
) -> Result<(), pack::PackError> {
    let t = &pack.file.tensors[k.tensor];
    let base = t.block_offsets[k.first_block];
    let row_bytes = t.cols * 2;
    let mut jobs = Vec::with_capacity(k.end_block - k.first_block);
    let mut rest = out;
    for b in k.first_block..k.end_block {
        let (dst, tail) = rest.split_at_mut(t.block_rows(b).len() * row_bytes);
        rest = tail;
        let from = (t.block_offsets[b] - base) as usize;
        let to = (t.block_offsets[b + 1] - base) as usize;
        jobs.push((b, src.get(from..to).unwrap_or(&[]), dst));
    }
    jobs.into_par_iter()
        .try_for_each(|(b, src, dst)| pack.file.decode(pack.path, t, b..b + 1, src, dst))
}

/// The cycle of `units` through chunks of `chunk` bytes: its pieces and each unit's tensors.
/// A matrix `pack` holds whose blocks fit a payload is read from the pack.
fn cut(
    units: &[(Unit, ByteRun, Vec<Slice>)],
    chunk: usize,
    pack: Option<&StreamPack>,
) -> Result<(Vec<ChunkRead>, Vec<UnitPieces>), StoreError> {
    let payload = chunk.saturating_sub(ALIGN);
    let mut pieces = Vec::new();
    let mut out = Vec::with_capacity(units.len());
    for (unit, run, tensors) in units {
        let (unit, run) = (*unit, *run);
        let class = match unit {
            Unit::Layer(_) => Class::Trunk,
            Unit::LmHead => Class::Head,
        };
        let mut ts = Vec::with_capacity(tensors.len());
        for s in tensors {
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
            let place = run.offset + s.start as u64;
            let packed = pack.and_then(|p| {
                let index = p.file.find_index(run.shard, place, s.len as u64)?;
                Some((p.shard, index, &p.file.tensors[index]))
            });
            match packed {
                Some((shard, index, t)) if fits(t, payload) => {
                    pack_pieces(&mut pieces, shard, index, t, payload, class);
                }
                _ => {
                    let mut r = 0;
                    while r < rows {
                        let n = per.min(rows - r);
                        pieces.push(ChunkRead {
                            first_row: r,
                            run: ByteRun {
                                shard: run.shard,
                                offset: place + (r * row_bytes) as u64,
                                len: (n * row_bytes) as u64,
                            },
                            class,
                            packed: None,
                        });
                        r += n;
                    }
                }
            }
            ts.push(StreamedTensor {
                start: s.start,
                pieces: first..pieces.len(),
            });
        }
        out.push(UnitPieces { unit, tensors: ts });
    }
    Ok((pieces, out))
}
