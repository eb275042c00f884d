//! The pack file: which trunk tensors it holds, where their blocks are, and whose checkpoint
//! it was made from.
//!
//! ```text
//! 0 … 4095       header: magic "K3TRUNK\0", version, the checkpoint's fingerprint, where the
//!                index is and its SHA-256, the file's length, the header's own SHA-256
//! 4096 …         each tensor's blocks, one after another (a tensor starts 4096-aligned, so
//!                its reads share no page with another tensor's)
//! index          u64 JSON length, the JSON tensor list, then every block's length (u32 LE),
//!                tensor after tensor
//! ```
//!
//! A tensor is named by the bytes it replaces — shard file, absolute offset, length — so the
//! store finds the pack's copy of a streamed matrix by where the matrix is, and a pack can
//! never be applied to other bytes than those it was made from: opening it checks the
//! checkpoint's fingerprint (config and every shard header, [`Checkpoint::fingerprint`]) and
//! that each tensor is one of the checkpoint's BF16 matrices. Each tensor's SHA-256 (of the
//! original bytes) is recorded for [`super::decode_check`].

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::block::{self, BlockError};
use super::simd::Path as DecodePath;
use crate::checkpoint::Checkpoint;
use crate::checkpoint::safetensors::Dtype;

pub const MAGIC: [u8; 8] = *b"K3TRUNK\0";
pub const VERSION: u32 = 1;
/// The header's size, and the alignment of every tensor's first block.
pub const HEADER_LEN: u64 = 4096;
/// The default pack file name inside a model directory.
pub const DEFAULT_NAME: &str = "trunk.k3pack";
/// Values a block aims at: 64 KiB of BF16. A block is whole rows — at least one — so a row
/// wider than this is a block of its own (rows over [`block::MAX_VALUES`] cannot be packed).
pub const BLOCK_VALUES: usize = 32 << 10;

/// Rows per block for a matrix `cols` wide, or `None` if a row is too wide for a block.
pub fn rows_per_block(cols: usize) -> Option<usize> {
    (cols > 0 && cols <= block::MAX_VALUES).then(|| (BLOCK_VALUES / cols).max(1))
}

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path} is not a k3 trunk pack (no K3TRUNK header)")]
    NotAPack { path: PathBuf },
    #[error("{path}: pack format version {found}, this k3 reads version {VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error("{path}: the header is damaged (its SHA-256 does not match)")]
    HeaderDamaged { path: PathBuf },
    #[error(
        "{path} was packed from another checkpoint (fingerprint {pack}, this checkpoint's is \
         {checkpoint}): pack this one with `k3d pack`"
    )]
    Fingerprint {
        path: PathBuf,
        pack: String,
        checkpoint: String,
    },
    #[error("{path} is {found} bytes, its header says {expected}: truncated or appended to")]
    Length {
        path: PathBuf,
        found: u64,
        expected: u64,
    },
    #[error("{path}: the index at byte offset {offset} is damaged (its SHA-256 does not match)")]
    IndexDamaged { path: PathBuf, offset: u64 },
    #[error("{path}: invalid index: {reason}")]
    Index { path: PathBuf, reason: String },
    /// A block failed to decode: which file, tensor, block and byte offset.
    #[error(
        "{path}: tensor {tensor}, block {block} (rows {first_row}..{end_row}) at byte offset \
         {offset}: {error}"
    )]
    Block {
        path: PathBuf,
        tensor: String,
        block: usize,
        first_row: usize,
        end_row: usize,
        offset: u64,
        error: BlockError,
    },
    #[error(
        "{path}: tensor {tensor} decodes to bytes whose SHA-256 is not the one recorded when it \
         was packed"
    )]
    Digest { path: PathBuf, tensor: String },
    #[error(
        "{path}: tensor {tensor}, block {block} at byte offset {offset} decodes to bytes that \
         differ from {shard} at byte offset {shard_offset}"
    )]
    Differs {
        path: PathBuf,
        tensor: String,
        block: usize,
        offset: u64,
        shard: String,
        shard_offset: u64,
    },
    #[error("{path}: {what}")]
    Write { path: PathBuf, what: String },
}

impl PackError {
    pub(super) fn io(path: &Path, error: std::io::Error) -> PackError {
        PackError::Io {
            path: path.to_path_buf(),
            error,
        }
    }

    fn index(path: &Path, reason: impl Into<String>) -> PackError {
        PackError::Index {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }
}

/// A tensor as the index stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct IndexEntry {
    pub name: String,
    /// Shard file name.
    pub shard: String,
    /// Absolute byte offset of the tensor in the shard.
    pub offset: u64,
    pub rows: u64,
    pub cols: u64,
    pub rows_per_block: u64,
    /// Absolute byte offset of its first block in the pack.
    pub pack_offset: u64,
    /// Lower-case hex SHA-256 of the original bytes.
    pub sha256: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct IndexJson {
    pub tensors: Vec<IndexEntry>,
}

/// One packed matrix: where its original bytes are, and where its blocks are.
#[derive(Debug, Clone)]
pub struct PackedTensor {
    pub name: String,
    /// Index into the checkpoint's shards.
    pub shard: usize,
    /// Absolute byte offset in the shard.
    pub offset: u64,
    pub rows: usize,
    pub cols: usize,
    pub rows_per_block: usize,
    /// Absolute byte offset of block `b` in the pack; one more entry for the end.
    pub block_offsets: Vec<u64>,
    pub sha256: [u8; 32],
}

impl PackedTensor {
    /// Bytes of the original tensor.
    pub fn len(&self) -> u64 {
        (self.rows * self.cols * 2) as u64
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    pub fn blocks(&self) -> usize {
        self.block_offsets.len() - 1
    }

    /// Bytes the pack holds for the tensor.
    pub fn packed_len(&self) -> u64 {
        self.block_offsets[self.blocks()] - self.block_offsets[0]
    }

    /// Rows of block `b`.
    pub fn block_rows(&self, b: usize) -> std::ops::Range<usize> {
        let first = b * self.rows_per_block;
        first..(first + self.rows_per_block).min(self.rows)
    }

    /// The blocks that hold rows `rows` (which must start on a block boundary and end on one
    /// or at the last row).
    pub fn blocks_for_rows(&self, rows: std::ops::Range<usize>) -> Option<std::ops::Range<usize>> {
        let aligned = |r: usize| r.is_multiple_of(self.rows_per_block) || r == self.rows;
        (rows.start <= rows.end
            && rows.end <= self.rows
            && aligned(rows.start)
            && aligned(rows.end))
        .then(|| rows.start / self.rows_per_block..rows.end.div_ceil(self.rows_per_block))
    }

    /// Pack bytes of blocks `blocks`: (absolute offset, length).
    pub fn byte_range(&self, blocks: std::ops::Range<usize>) -> (u64, u64) {
        let start = self.block_offsets[blocks.start];
        (start, self.block_offsets[blocks.end] - start)
    }
}

/// An opened, checked pack file.
#[derive(Debug)]
pub struct PackFile {
    pub path: PathBuf,
    pub tensors: Vec<PackedTensor>,
    /// (shard, offset) → index into `tensors`.
    by_place: HashMap<(usize, u64), usize>,
}

/// Header fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Header {
    pub fingerprint: String,
    pub index_offset: u64,
    pub index_len: u64,
    pub index_sha256: [u8; 32],
    pub file_len: u64,
}

impl Header {
    pub fn encode(&self) -> Vec<u8> {
        let mut h = vec![0u8; HEADER_LEN as usize];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        let fp = self.fingerprint.as_bytes();
        h[16..16 + fp.len().min(64)].copy_from_slice(&fp[..fp.len().min(64)]);
        h[80..88].copy_from_slice(&self.index_offset.to_le_bytes());
        h[88..96].copy_from_slice(&self.index_len.to_le_bytes());
        h[96..128].copy_from_slice(&self.index_sha256);
        h[128..136].copy_from_slice(&self.file_len.to_le_bytes());
        let digest = Sha256::digest(&h[..136]);
        h[136..168].copy_from_slice(&digest);
        h
    }

    fn decode(path: &Path, h: &[u8]) -> Result<Header, PackError> {
        if h.len() < HEADER_LEN as usize || h[0..8] != MAGIC {
            return Err(PackError::NotAPack {
                path: path.to_path_buf(),
            });
        }
        let u64_at = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&h[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let version = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
        if version != VERSION {
            return Err(PackError::Version {
                path: path.to_path_buf(),
                found: version,
            });
        }
        if Sha256::digest(&h[..136])[..] != h[136..168] {
            return Err(PackError::HeaderDamaged {
                path: path.to_path_buf(),
            });
        }
        let fingerprint = String::from_utf8_lossy(&h[16..80])
            .trim_end_matches('\0')
            .to_string();
        let mut index_sha256 = [0u8; 32];
        index_sha256.copy_from_slice(&h[96..128]);
        Ok(Header {
            fingerprint,
            index_offset: u64_at(80),
            index_len: u64_at(88),
            index_sha256,
            file_len: u64_at(128),
        })
    }
}

/// The index region's bytes: JSON length, JSON, block lengths.
pub(super) fn encode_index(json: &IndexJson, block_lens: &[u32]) -> Vec<u8> {
    let text = serde_json::to_vec(json).unwrap_or_default();
    let mut out = Vec::with_capacity(8 + text.len() + 4 * block_lens.len());
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(&text);
    for len in block_lens {
        out.extend_from_slice(&len.to_le_bytes());
    }
    out
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl PackFile {
    /// Opens `path` and checks it against `checkpoint`: header, fingerprint, length, index
    /// digest, and every tensor (a BF16 matrix of the checkpoint at the place it names, blocks
    /// of plausible lengths, inside the file and not overlapping). Reads no block.
    pub fn open(path: &Path, checkpoint: &Checkpoint) -> Result<PackFile, PackError> {
        let io = |e| PackError::io(path, e);
        let file = crate::input_file::open(path).map_err(io)?;
        let found = file.metadata().map_err(io)?.len();
        let mut head = vec![0u8; HEADER_LEN as usize];
        if found < HEADER_LEN {
            return Err(PackError::NotAPack {
                path: path.to_path_buf(),
            });
        }
        file.read_exact_at(&mut head, 0).map_err(io)?;
        let header = Header::decode(path, &head)?;
        let fingerprint = checkpoint.fingerprint().map_err(|e| PackError::Index {
            path: checkpoint.dir.clone(),
            reason: e.to_string(),
        })?;
        if header.fingerprint != fingerprint {
            return Err(PackError::Fingerprint {
                path: path.to_path_buf(),
                pack: header.fingerprint,
                checkpoint: fingerprint,
            });
        }
        if found != header.file_len {
            return Err(PackError::Length {
                path: path.to_path_buf(),
                found,
                expected: header.file_len,
            });
        }
        let index_end = header.index_offset.checked_add(header.index_len);
        if header.index_offset < HEADER_LEN || index_end != Some(found) || header.index_len < 8 {
            return Err(PackError::index(
                path,
                "the index is not at the end of the file",
            ));
        }
        let mut index = vec![0u8; header.index_len as usize];
        file.read_exact_at(&mut index, header.index_offset)
            .map_err(io)?;
        if Sha256::digest(&index)[..] != header.index_sha256 {
            return Err(PackError::IndexDamaged {
                path: path.to_path_buf(),
                offset: header.index_offset,
            });
        }
        Self::from_index(path, checkpoint, &index, header.index_offset)
    }

    fn from_index(
        path: &Path,
        checkpoint: &Checkpoint,
        index: &[u8],
        blocks_end: u64,
    ) -> Result<PackFile, PackError> {
        let bad = |reason: String| PackError::index(path, reason);
        let mut w = [0u8; 8];
        w.copy_from_slice(&index[..8]);
        let json_len = u64::from_le_bytes(w);
        let json_end = 8usize
            .checked_add(usize::try_from(json_len).unwrap_or(usize::MAX))
            .filter(|&e| e <= index.len())
            .ok_or_else(|| bad("the tensor list runs past the index".into()))?;
        let parsed: IndexJson = serde_json::from_slice(&index[8..json_end])
            .map_err(|e| bad(format!("tensor list: {e}")))?;
        let table = &index[json_end..];
        if !table.len().is_multiple_of(4) {
            return Err(bad("the block table is not whole u32 entries".into()));
        }
        let mut lens = table
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u64);
        let allowed: HashMap<(usize, u64), (usize, usize)> = packable(checkpoint)
            .into_iter()
            .map(|m| ((m.shard, m.offset), (m.rows, m.cols)))
            .collect();
        let mut tensors = Vec::with_capacity(parsed.tensors.len());
        let mut by_place = HashMap::new();
        let mut previous_end = HEADER_LEN;
        for e in parsed.tensors {
            let shard = checkpoint
                .shards
                .iter()
                .position(|s| s.name() == e.shard)
                .ok_or_else(|| {
                    bad(format!(
                        "{}: no shard {} in the checkpoint",
                        e.name, e.shard
                    ))
                })?;
            let (rows, cols) = (e.rows as usize, e.cols as usize);
            let rows_per_block = e.rows_per_block as usize;
            if Some(rows_per_block) != self::rows_per_block(cols) || rows == 0 {
                return Err(bad(format!(
                    "{}: {rows} rows of {cols} in blocks of {rows_per_block} rows",
                    e.name
                )));
            }
            if allowed.get(&(shard, e.offset)) != Some(&(rows, cols)) {
                return Err(bad(format!(
                    "{}: {} bytes at offset {} of {} are not a BF16 [{rows}, {cols}] matrix of \
                     this checkpoint",
                    e.name,
                    rows * cols * 2,
                    e.offset,
                    e.shard
                )));
            }
            if e.pack_offset < previous_end || !e.pack_offset.is_multiple_of(HEADER_LEN) {
                return Err(bad(format!(
                    "{}: blocks at offset {} overlap the previous tensor or are not 4096-aligned",
                    e.name, e.pack_offset
                )));
            }
            let blocks = rows.div_ceil(rows_per_block);
            let mut block_offsets = Vec::with_capacity(blocks + 1);
            let mut at = e.pack_offset;
            block_offsets.push(at);
            for b in 0..blocks {
                let values = (rows_per_block.min(rows - b * rows_per_block)) * cols;
                let len = lens
                    .next()
                    .ok_or_else(|| bad("the block table is shorter than the tensor list".into()))?;
                if len < block::HEADER as u64 || len > (block::HEADER + 2 * values) as u64 {
                    return Err(bad(format!(
                        "{}: block {b} is {len} bytes, outside {}..={} for {values} values",
                        e.name,
                        block::HEADER,
                        block::HEADER + 2 * values
                    )));
                }
                at += len;
                block_offsets.push(at);
            }
            if at > blocks_end {
                return Err(bad(format!("{}: blocks run past the index", e.name)));
            }
            previous_end = at;
            let sha256 = parse_hex32(&e.sha256)
                .ok_or_else(|| bad(format!("{}: sha256 is not 64 hex digits", e.name)))?;
            if by_place.insert((shard, e.offset), tensors.len()).is_some() {
                return Err(bad(format!("{}: listed twice", e.name)));
            }
            tensors.push(PackedTensor {
                name: e.name,
                shard,
                offset: e.offset,
                rows,
                cols,
                rows_per_block,
                block_offsets,
                sha256,
            });
        }
        if lens.next().is_some() {
            return Err(bad("the block table is longer than the tensor list".into()));
        }
        Ok(PackFile {
            path: path.to_path_buf(),
            tensors,
            by_place,
        })
    }

    /// The packed copy of the tensor at absolute `offset` of shard `shard`, `len` bytes long.
    pub fn find(&self, shard: usize, offset: u64, len: u64) -> Option<&PackedTensor> {
        self.find_index(shard, offset, len)
            .map(|i| &self.tensors[i])
    }

    /// [`PackFile::find`]'s index into `tensors`.
    pub fn find_index(&self, shard: usize, offset: u64, len: u64) -> Option<usize> {
        self.by_place
            .get(&(shard, offset))
            .copied()
            .filter(|&i| self.tensors[i].len() == len)
    }

    /// Original bytes of every packed tensor.
    pub fn original_bytes(&self) -> u64 {
        self.tensors.iter().map(PackedTensor::len).sum()
    }

    /// Pack bytes of every packed tensor.
    pub fn packed_bytes(&self) -> u64 {
        self.tensors.iter().map(PackedTensor::packed_len).sum()
    }

    /// Decodes blocks `blocks` of `t` from `src` (their pack bytes, starting at the first
    /// block) into `out` (their original bytes, rows × cols × 2), on `path`. A block that is
    /// refused is named by file, tensor, block and byte offset.
    pub fn decode(
        &self,
        path: DecodePath,
        t: &PackedTensor,
        blocks: std::ops::Range<usize>,
        src: &[u8],
        out: &mut [u8],
    ) -> Result<(), PackError> {
        let file = &self.path;
        let base = t.block_offsets[blocks.start];
        let row_bytes = 2 * t.cols;
        let first_row = blocks.start * t.rows_per_block;
        for b in blocks {
            let rows = t.block_rows(b);
            let at = (t.block_offsets[b] - base) as usize;
            let end = (t.block_offsets[b + 1] - base) as usize;
            let fail = |error| PackError::Block {
                path: file.to_path_buf(),
                tensor: t.name.clone(),
                block: b,
                first_row: rows.start,
                end_row: rows.end,
                offset: t.block_offsets[b],
                error,
            };
            let block_src = src.get(at..end).ok_or_else(|| {
                fail(BlockError::Truncated {
                    what: "block",
                    need: end - at,
                    have: src.len().saturating_sub(at),
                })
            })?;
            let o = (rows.start - first_row) * row_bytes;
            let have = out.len();
            let dst = out.get_mut(o..o + rows.len() * row_bytes).ok_or_else(|| {
                fail(BlockError::Output {
                    need: o + rows.len() * row_bytes,
                    have,
                })
            })?;
            let used = block::decode(path, block_src, rows.len() * t.cols, dst).map_err(fail)?;
            if used != end - at {
                return Err(fail(BlockError::Truncated {
                    what: "block (its length disagrees with the block table)",
                    need: end - at,
                    have: used,
                }));
            }
        }
        Ok(())
    }
}

/// A matrix the pack may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packable {
    pub shard: usize,
    pub offset: u64,
    pub rows: usize,
    pub cols: usize,
}

/// The matrices a pack may hold: every BF16 2-D tensor the forward pass streams
/// ([`crate::checkpoint::layout::LayerLayout::stream_order`] of every layer) and lm_head, in
/// that order, whose rows fit a block.
pub fn packable(checkpoint: &Checkpoint) -> Vec<Packable> {
    let layout = &checkpoint.layout;
    let mut out = Vec::new();
    let mut push = |shard: usize, offset: u64, slice: &crate::checkpoint::layout::Slice| {
        if slice.dtype == Dtype::Bf16
            && slice.shape.len() == 2
            && rows_per_block(slice.shape[1]).is_some()
        {
            out.push(Packable {
                shard,
                offset,
                rows: slice.shape[0],
                cols: slice.shape[1],
            });
        }
    };
    for layer in &layout.layers {
        for s in layer.stream_order() {
            push(layer.trunk.shard, layer.trunk.offset + s.start as u64, &s);
        }
    }
    let head = &layout.lm_head;
    push(
        head.run.shard,
        head.run.offset + head.slice.start as u64,
        &head.slice,
    );
    out
}
