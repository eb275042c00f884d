//! Building a pack from a checkpoint (`k3d pack`): every packable matrix ([`super::format::packable`])
//! is read from its shard, cut into blocks of whole rows, encoded on `threads` threads, each
//! block decoded again and compared with its original bytes before it is written, and the
//! tensor's SHA-256 recorded.
//!
//! **Resumable.** The file is written as `OUT.partial`; after each tensor its index entry and
//! block lengths are appended as one JSON line to `OUT.partial.log` and both files are synced.
//! A run that finds them (for the same checkpoint fingerprint) keeps the tensors the log lists
//! — truncating whatever a killed run wrote after the last one — and continues with the next.
//! The header and index are written last, then `OUT.partial` is renamed to `OUT`: a file named
//! `OUT` is always complete.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::block;
use super::format::{
    HEADER_LEN, Header, IndexEntry, IndexJson, PackError, encode_index, packable, rows_per_block,
};
use super::simd::Path as DecodePath;
use crate::checkpoint::Checkpoint;
use crate::checkpoint::safetensors::TensorIndex;
use crate::checkpoint::verify::ByteProgress;

/// Blocks encoded per batch: bounds memory (about 16 MiB of original bytes) while giving
/// every thread many blocks.
const BATCH_BLOCKS: usize = 256;

/// What a finished `pack` did.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub tensors: usize,
    /// Tensors kept from an interrupted run.
    pub resumed: usize,
    pub original_bytes: u64,
    pub packed_bytes: u64,
    /// Order-0 entropy, in bits, of the high bytes (sign, exponent) and the low bytes of the
    /// BF16 values packed in this run (resumed tensors are not re-read): the bound a
    /// per-symbol coder of either byte could reach, beside what the dictionary reached.
    pub high_entropy: f64,
    pub low_entropy: f64,
}

/// Byte counts of the high and low bytes of BF16 values.
struct Histograms {
    high: [u64; 256],
    low: [u64; 256],
}

impl Histograms {
    fn add(&mut self, raw: &[u8]) {
        for pair in raw.chunks_exact(2) {
            self.low[pair[0] as usize] += 1;
            self.high[pair[1] as usize] += 1;
        }
    }

    fn entropy(counts: &[u64; 256]) -> f64 {
        let total: u64 = counts.iter().sum();
        counts
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let p = c as f64 / total as f64;
                -p * p.log2()
            })
            .sum()
    }
}

/// One line of the resume log.
#[derive(Debug, Serialize, Deserialize)]
struct LogLine {
    fingerprint: String,
    entry: IndexEntry,
    block_lens: Vec<u32>,
}

fn partial_paths(out: &Path) -> (PathBuf, PathBuf) {
    let mut p = out.as_os_str().to_owned();
    p.push(".partial");
    let mut l = p.clone();
    l.push(".log");
    (PathBuf::from(p), PathBuf::from(l))
}

/// Writes the pack of `checkpoint` to `out` (which must not exist), resuming an interrupted
/// run of the same checkpoint. `progress` counts original bytes (total = all packable bytes,
/// done includes resumed tensors).
pub fn pack(
    checkpoint: &Checkpoint,
    out: &Path,
    threads: usize,
    progress: &ByteProgress,
) -> Result<Summary, PackError> {
    let fingerprint = checkpoint.fingerprint().map_err(|e| PackError::Write {
        path: checkpoint.dir.clone(),
        what: e.to_string(),
    })?;
    let index = TensorIndex::open_dir(&checkpoint.dir).map_err(|e| PackError::Write {
        path: checkpoint.dir.clone(),
        what: e.to_string(),
    })?;
    let names: std::collections::HashMap<(usize, u64), String> = index
        .iter()
        .map(|t| ((t.shard, t.offset), t.name.to_string()))
        .collect();
    let wanted = packable(checkpoint);
    progress.total.store(
        wanted.iter().map(|m| (m.rows * m.cols * 2) as u64).sum(),
        Ordering::Relaxed,
    );
    let (partial, log) = partial_paths(out);
    let kept = resume_log(&log, &fingerprint, checkpoint, &wanted);
    let file = OpenOptions::new()
        .create(true)
        .write(true)
        .read(true)
        .truncate(false)
        .open(&partial)
        .map_err(|e| PackError::io(&partial, e))?;
    let mut end = kept.last().map_or(HEADER_LEN, |l| {
        l.entry.pack_offset + l.block_lens.iter().map(|&x| u64::from(x)).sum::<u64>()
    });
    let have = file
        .metadata()
        .map_err(|e| PackError::io(&partial, e))?
        .len();
    let kept = if have < end {
        // The log promises more than the file holds: start over.
        end = HEADER_LEN;
        Vec::new()
    } else {
        kept
    };
    file.set_len(end).map_err(|e| PackError::io(&partial, e))?;
    // The log from here on lists exactly the tensors kept.
    let mut text = Vec::new();
    for line in &kept {
        text.extend(serde_json::to_vec(line).unwrap_or_default());
        text.push(b'\n');
    }
    std::fs::write(&log, text).map_err(|e| PackError::io(&log, e))?;
    let mut log_file = OpenOptions::new()
        .append(true)
        .open(&log)
        .map_err(|e| PackError::io(&log, e))?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .map_err(|e| PackError::Write {
            path: partial.clone(),
            what: format!("starting {threads} encoder threads: {e}"),
        })?;
    let mut summary = Summary {
        resumed: kept.len(),
        ..Summary::default()
    };
    let mut lines = kept;
    let mut histograms = Histograms {
        high: [0; 256],
        low: [0; 256],
    };
    for line in &lines {
        progress
            .done
            .fetch_add(line.entry.rows * line.entry.cols * 2, Ordering::Relaxed);
    }
    for m in wanted.iter().skip(lines.len()) {
        let shard = &checkpoint.shards[m.shard];
        let name = names
            .get(&(m.shard, m.offset))
            .cloned()
            .unwrap_or_else(|| format!("{}@{}", shard.name(), m.offset));
        let pack_offset = end.next_multiple_of(HEADER_LEN);
        let source =
            crate::input_file::open(&shard.path).map_err(|e| PackError::io(&shard.path, e))?;
        let per = rows_per_block(m.cols).unwrap_or(1);
        let row_bytes = 2 * m.cols;
        let blocks = m.rows.div_ceil(per);
        let mut sha = Sha256::new();
        let mut block_lens = Vec::with_capacity(blocks);
        let mut at = pack_offset;
        let mut raw = Vec::new();
        for first in (0..blocks).step_by(BATCH_BLOCKS) {
            let last = (first + BATCH_BLOCKS).min(blocks);
            let rows = first * per..(last * per).min(m.rows);
            raw.resize(rows.len() * row_bytes, 0);
            let offset = m.offset + (rows.start * row_bytes) as u64;
            source
                .read_exact_at(&mut raw, offset)
                .map_err(|e| PackError::io(&shard.path, e))?;
            drop_cached(&source, offset, raw.len());
            sha.update(&raw);
            histograms.add(&raw);
            let encoded: Vec<Result<Vec<u8>, PackError>> = pool.install(|| {
                raw.par_chunks(per * row_bytes)
                    .enumerate()
                    .map(|(k, original)| {
                        let mut b = Vec::with_capacity(original.len() / 2 + block::HEADER);
                        block::encode(original, &mut b);
                        let mut back = vec![0u8; original.len()];
                        let checked =
                            block::decode(DecodePath::detect(), &b, original.len() / 2, &mut back);
                        if checked.is_err() || back != original {
                            return Err(PackError::Write {
                                path: partial.clone(),
                                what: format!(
                                    "{name}, block {}: the encoded block does not decode to its \
                                     original bytes ({checked:?})",
                                    first + k
                                ),
                            });
                        }
                        Ok(b)
                    })
                    .collect()
            });
            for b in encoded {
                let b = b?;
                file.write_all_at(&b, at)
                    .map_err(|e| PackError::io(&partial, e))?;
                at += b.len() as u64;
                block_lens.push(b.len() as u32);
            }
            progress.done.fetch_add(raw.len() as u64, Ordering::Relaxed);
        }
        file.sync_data().map_err(|e| PackError::io(&partial, e))?;
        let entry = IndexEntry {
            name,
            shard: shard.name(),
            offset: m.offset,
            rows: m.rows as u64,
            cols: m.cols as u64,
            rows_per_block: per as u64,
            pack_offset,
            sha256: sha.finalize().iter().map(|b| format!("{b:02x}")).collect(),
        };
        let line = LogLine {
            fingerprint: fingerprint.clone(),
            entry,
            block_lens,
        };
        let mut text = serde_json::to_vec(&line).unwrap_or_default();
        text.push(b'\n');
        log_file
            .write_all(&text)
            .and_then(|()| log_file.sync_data())
            .map_err(|e| PackError::io(&log, e))?;
        end = at;
        lines.push(line);
    }
    // Index, header, rename.
    let json = IndexJson {
        tensors: lines.iter().map(|l| l.entry.clone()).collect(),
    };
    let all_lens: Vec<u32> = lines
        .iter()
        .flat_map(|l| l.block_lens.iter().copied())
        .collect();
    let index = encode_index(&json, &all_lens);
    let index_offset = end;
    file.write_all_at(&index, index_offset)
        .map_err(|e| PackError::io(&partial, e))?;
    let file_len = index_offset + index.len() as u64;
    file.set_len(file_len)
        .map_err(|e| PackError::io(&partial, e))?;
    let header = Header {
        fingerprint,
        index_offset,
        index_len: index.len() as u64,
        index_sha256: Sha256::digest(&index).into(),
        file_len,
    };
    file.write_all_at(&header.encode(), 0)
        .and_then(|()| file.sync_all())
        .map_err(|e| PackError::io(&partial, e))?;
    std::fs::rename(&partial, out).map_err(|e| PackError::io(out, e))?;
    let _ = std::fs::remove_file(&log);
    summary.tensors = lines.len();
    summary.original_bytes = lines.iter().map(|l| l.entry.rows * l.entry.cols * 2).sum();
    summary.packed_bytes = all_lens.iter().map(|&l| u64::from(l)).sum();
    summary.high_entropy = Histograms::entropy(&histograms.high);
    summary.low_entropy = Histograms::entropy(&histograms.low);
    Ok(summary)
}

/// The tensors an interrupted run finished, if its log is for this checkpoint and lists a
/// prefix of `wanted` in order; nothing otherwise (a torn last line is dropped).
fn resume_log(
    log: &Path,
    fingerprint: &str,
    checkpoint: &Checkpoint,
    wanted: &[super::format::Packable],
) -> Vec<LogLine> {
    let Ok(f) = File::open(log) else {
        return Vec::new();
    };
    let mut out: Vec<LogLine> = Vec::new();
    for line in std::io::BufReader::new(f).lines() {
        let Ok(line) = line else { break };
        let Ok(l) = serde_json::from_str::<LogLine>(&line) else {
            break;
        };
        let Some(m) = wanted.get(out.len()) else {
            break;
        };
        let expected_blocks = (m.rows).div_ceil(rows_per_block(m.cols).unwrap_or(1));
        let same = l.fingerprint == fingerprint
            && l.entry.shard == checkpoint.shards[m.shard].name()
            && l.entry.offset == m.offset
            && l.entry.rows as usize == m.rows
            && l.entry.cols as usize == m.cols
            && l.block_lens.len() == expected_blocks
            && out.last().is_none_or(|p| {
                l.entry.pack_offset
                    >= p.entry.pack_offset + p.block_lens.iter().map(|&x| u64::from(x)).sum::<u64>()
            });
        if !same {
            break;
        }
        out.push(l);
    }
    out
}

/// Pages just read from a shard are not needed again: packing a 1.5 TB checkpoint should not
/// evict everything else from the page cache.
fn drop_cached(file: &File, offset: u64, len: usize) {
    use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
    // Advice only; a filesystem that ignores it changes nothing but cache use.
    let _ = posix_fadvise(
        file,
        offset as i64,
        len as i64,
        PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    );
}
