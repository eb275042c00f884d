//! Checking a pack (`k3d verify`): every block of every tensor decodes (lengths, structure,
//! checksum), the decoded tensor's SHA-256 is the one recorded when it was packed, and the
//! decoded bytes equal the shard's bytes at the place the tensor names — so a pack that
//! verifies gives the forward pass exactly the bytes the shards would.

use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use sha2::{Digest, Sha256};

use super::format::{PackError, PackFile, PackedTensor};
use super::simd::Path as DecodePath;
use crate::checkpoint::Checkpoint;
use crate::checkpoint::verify::ByteProgress;

/// Blocks read and compared at once.
const BATCH_BLOCKS: usize = 256;

/// What a verification checked.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub tensors: usize,
    pub blocks: usize,
    pub original_bytes: u64,
    pub packed_bytes: u64,
}

/// Verifies `pack` against `checkpoint`'s shards; the first failure is the error, naming the
/// file, tensor, block and offset. `progress` counts original bytes.
pub fn verify(
    pack: &PackFile,
    checkpoint: &Checkpoint,
    path: DecodePath,
    progress: &ByteProgress,
) -> Result<Summary, PackError> {
    progress
        .total
        .store(pack.original_bytes(), Ordering::Relaxed);
    let file = crate::input_file::open(&pack.path).map_err(|e| PackError::io(&pack.path, e))?;
    let mut summary = Summary::default();
    for t in &pack.tensors {
        verify_tensor(pack, &file, checkpoint, t, path, progress)?;
        summary.tensors += 1;
        summary.blocks += t.blocks();
        summary.original_bytes += t.len();
        summary.packed_bytes += t.packed_len();
    }
    Ok(summary)
}

fn verify_tensor(
    pack: &PackFile,
    file: &std::fs::File,
    checkpoint: &Checkpoint,
    t: &PackedTensor,
    path: DecodePath,
    progress: &ByteProgress,
) -> Result<(), PackError> {
    let shard = &checkpoint.shards[t.shard];
    let source = crate::input_file::open(&shard.path).map_err(|e| PackError::io(&shard.path, e))?;
    let row_bytes = 2 * t.cols;
    let mut sha = Sha256::new();
    let (mut packed, mut decoded, mut original) = (Vec::new(), Vec::new(), Vec::new());
    for first in (0..t.blocks()).step_by(BATCH_BLOCKS) {
        let blocks = first..(first + BATCH_BLOCKS).min(t.blocks());
        let (offset, len) = t.byte_range(blocks.clone());
        packed.resize(len as usize, 0);
        file.read_exact_at(&mut packed, offset)
            .map_err(|e| PackError::io(&pack.path, e))?;
        let rows = t.block_rows(blocks.start).start..t.block_rows(blocks.end - 1).end;
        decoded.resize(rows.len() * row_bytes, 0);
        pack.decode(path, t, blocks.clone(), &packed, &mut decoded)?;
        sha.update(&decoded);
        original.resize(decoded.len(), 0);
        let shard_offset = t.offset + (rows.start * row_bytes) as u64;
        source
            .read_exact_at(&mut original, shard_offset)
            .map_err(|e| PackError::io(&shard.path, e))?;
        if original != decoded {
            let b = blocks
                .clone()
                .find(|&b| {
                    let r = t.block_rows(b);
                    let s = (r.start - rows.start) * row_bytes..(r.end - rows.start) * row_bytes;
                    original[s.clone()] != decoded[s]
                })
                .unwrap_or(blocks.start);
            return Err(PackError::Differs {
                path: pack.path.clone(),
                tensor: t.name.clone(),
                block: b,
                offset: t.block_offsets[b],
                shard: shard.name(),
                shard_offset: t.offset + (t.block_rows(b).start * row_bytes) as u64,
            });
        }
        progress
            .done
            .fetch_add(decoded.len() as u64, Ordering::Relaxed);
    }
    if sha.finalize()[..] != t.sha256 {
        return Err(PackError::Digest {
            path: pack.path.clone(),
            tensor: t.name.clone(),
        });
    }
    Ok(())
}
