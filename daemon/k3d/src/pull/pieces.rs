//! Byte ranges of one large file fetched in parallel: a file larger than `--piece-mib` is cut
//! into pieces of that size, fetched at once as far as the connections (`--jobs`, shared by
//! files and pieces) allow, each written at its offset into `NAME.k3d-partial` (sized to the
//! whole file at the start). A piece is recorded in `NAME.k3d-partial.pieces` only after its
//! bytes are synced, so a re-run fetches exactly the pieces not recorded. Ranges arrive out of
//! order, so the whole file is hashed once all are in, then checked as any file.

use super::checksum::Digest;
use super::error::PullError;
use super::retry::{Backoff, Stop};
use super::transfer::{Fetch, content_range_start, network};
use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

fn sidecar(part: &Path) -> PathBuf {
    let mut name = part.as_os_str().to_owned();
    name.push(".pieces");
    PathBuf::from(name)
}

/// Removes the piece record of `part`; whether there was one.
pub fn forget(part: &Path) -> Result<bool, PullError> {
    let side = sidecar(part);
    match std::fs::remove_file(&side) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(PullError::write(&side, e)),
    }
}

/// The pieces recorded complete for a partial file of `size` cut every `piece` bytes: none
/// unless the record names this piece size and the partial file has the whole size.
fn recorded(part: &Path, size: u64, piece: u64) -> BTreeSet<u64> {
    let Ok(text) = std::fs::read_to_string(sidecar(part)) else {
        return BTreeSet::new();
    };
    let mut lines = text.lines();
    let sized = std::fs::metadata(part).is_ok_and(|m| m.len() == size);
    if !sized || lines.next() != Some(format!("piece {piece}").as_str()) {
        return BTreeSet::new();
    }
    let count = size.div_ceil(piece);
    lines
        .filter_map(|l| l.trim().parse::<u64>().ok())
        .filter(|i| *i < count)
        .collect()
}

/// Bytes `start..end` of piece `i` of a file of `size`.
fn bounds(i: u64, piece: u64, size: u64) -> (u64, u64) {
    (i * piece, ((i + 1) * piece).min(size))
}

/// Bytes of the file already in recorded pieces.
pub fn have(part: &Path, size: u64, piece: u64) -> u64 {
    recorded(part, size, piece)
        .into_iter()
        .map(|i| {
            let (start, end) = bounds(i, piece, size);
            end - start
        })
        .sum()
}

impl Fetch<'_> {
    /// Brings every piece of the partial file in; returns the digests of the whole file.
    pub async fn download_pieces(&self, part: &Path, piece: u64) -> Result<Digest, PullError> {
        let size = self.file.size;
        let done = recorded(part, size, piece);
        let side = sidecar(part);
        if done.is_empty() {
            let out = std::fs::File::create(part).map_err(|e| PullError::write(part, e))?;
            out.set_len(size).map_err(|e| PullError::write(part, e))?;
            std::fs::write(&side, format!("piece {piece}\n"))
                .map_err(|e| PullError::write(&side, e))?;
        }
        let out = std::fs::OpenOptions::new()
            .write(true)
            .open(part)
            .map_err(|e| PullError::write(part, e))?;
        let log = Mutex::new(
            std::fs::OpenOptions::new()
                .append(true)
                .open(&side)
                .map_err(|e| PullError::write(&side, e))?,
        );
        let pieces = (0..size.div_ceil(piece))
            .filter(|i| !done.contains(i))
            .map(|i| {
                let (out, log, side) = (&out, &log, &side);
                async move {
                    let (start, end) = bounds(i, piece, size);
                    self.fetch_piece(part, out, start, end).await?;
                    out.sync_data().map_err(|e| PullError::write(part, e))?;
                    let mut log = log.lock().expect("piece log lock");
                    writeln!(log, "{i}").map_err(|e| PullError::write(side, e))?;
                    log.sync_data().map_err(|e| PullError::write(side, e))
                }
            });
        for result in futures_util::future::join_all(pieces).await {
            result?;
        }
        let (file, path) = (self.file.clone(), part.to_path_buf());
        let digest = tokio::task::spawn_blocking(move || Digest::of_prefix(&file, &path, size))
            .await
            .map_err(|e| PullError::Usage(format!("hashing task failed: {e}")))?
            .map_err(|e| PullError::write(part, e))?;
        forget(part)?;
        Ok(digest)
    }

    /// Bytes `start..end` of the file, written at their offsets; each attempt asks for the
    /// bytes still missing.
    async fn fetch_piece(
        &self,
        part: &Path,
        out: &std::fs::File,
        start: u64,
        end: u64,
    ) -> Result<(), PullError> {
        let mut at = start;
        let mut backoff = Backoff::new(format!("{} bytes {start}-{}", self.file.path, end - 1));
        while at < end {
            let before = at;
            let outcome = async {
                let _permit = self.connections.acquire().await.expect("never closed");
                let range = format!("bytes={at}-{}", end - 1);
                let mut response = self.request(&range).await?;
                if response.status() != reqwest::StatusCode::PARTIAL_CONTENT
                    || content_range_start(&response) != Some(at)
                {
                    return Err(Stop::Fatal(PullError::Protocol {
                        url: response.url().to_string(),
                        detail: format!("asked for {range}, got {} without it", response.status()),
                    }));
                }
                while let Some(chunk) = response.chunk().await.map_err(network)? {
                    let keep = chunk.len().min((end - at) as usize);
                    out.write_all_at(&chunk[..keep], at)
                        .map_err(|e| PullError::write(part, e))?;
                    at += keep as u64;
                    self.progress.add(keep as u64);
                    if at == end {
                        break;
                    }
                }
                Ok(())
            }
            .await;
            backoff
                .settle(at > before, outcome, at - start, end - start)
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_counts_only_for_its_piece_size_and_a_whole_size_file() {
        let scratch = tempfile::tempdir().unwrap();
        let part = super::super::transfer::partial_path(&scratch.path().join("m.safetensors"));
        std::fs::write(&part, [0u8; 25]).unwrap();
        std::fs::write(sidecar(&part), "piece 10\n0\n2\n7\nx\n").unwrap();
        // Pieces 0 (10 bytes) and 2 (the last, 5 bytes); 7 is beyond the file.
        assert_eq!(have(&part, 25, 10), 15);
        assert_eq!(have(&part, 25, 5), 0, "another piece size");
        assert_eq!(have(&part, 30, 10), 0, "a partial file of another size");
        assert!(forget(&part).unwrap());
        assert!(!forget(&part).unwrap());
        assert_eq!(have(&part, 25, 10), 0);
    }
}
