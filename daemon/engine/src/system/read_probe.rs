//! A short measurement of how fast the model's drive delivers bytes the way the engine asks for
//! them: aligned reads of one routed expert's size (17,547,264 B, spec §1.2) at random offsets
//! within the shards, several in flight on plain threads (engine-lessons §2.2: queue depth
//! matters), with `O_DIRECT` where the filesystem allows it (§2.1) — through the store's own
//! shard reader, so the fallback to buffered reads is the engine's, and as loud.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::rng::splitmix64;
use crate::store::aligned::{AlignedBuf, round_up};
use crate::store::direct_io::{DirectPolicy, ReadError, ReadMode, Shard};

/// One routed expert, the engine's typical random read (spec §1.2).
pub const EXPERT_READ: usize = 17_547_264;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("no non-empty shard files to read")]
    NoFiles,
    #[error("cannot read {path}: {error}")]
    Metadata {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot allocate a {len}-byte aligned read buffer")]
    Buffer { len: usize },
    #[error(transparent)]
    Read(#[from] ReadError),
}

#[derive(Debug, Clone, Copy)]
pub struct ProbeOptions {
    /// Bytes per request (rounded up to the 4096-byte alignment).
    pub request: usize,
    /// Requests in flight: one thread each.
    pub in_flight: usize,
    /// Stop issuing reads after this long.
    pub duration: Duration,
    pub policy: DirectPolicy,
}

/// What the probe measured.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeResult {
    /// Payload bytes delivered (short reads at a file's end count what arrived).
    pub bytes: u64,
    pub reads: u64,
    pub seconds: f64,
    pub request: usize,
    pub in_flight: usize,
    /// Every file was read with `O_DIRECT`.
    pub direct: bool,
    /// Why files were read buffered, one line per file that was.
    pub buffered: Vec<String>,
}

impl ProbeResult {
    /// Bytes per second.
    pub fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Read random aligned windows of `files` for `opts.duration`, `opts.in_flight` at a time.
pub fn measure(files: &[PathBuf], opts: ProbeOptions) -> Result<ProbeResult, ProbeError> {
    let mut shards = Vec::new();
    for path in files {
        let size = std::fs::metadata(path)
            .map_err(|error| ProbeError::Metadata {
                path: path.clone(),
                error,
            })?
            .len();
        if size > 0 {
            shards.push((Shard::open(path, opts.policy)?, size));
        }
    }
    let total: u64 = shards.iter().map(|(_, s)| *s).sum();
    if total == 0 {
        return Err(ProbeError::NoFiles);
    }
    let request = round_up(opts.request.max(1) as u64)
        .and_then(|r| usize::try_from(r).ok())
        .ok_or(ProbeError::Buffer { len: opts.request })?;
    let in_flight = opts.in_flight.max(1);
    let bytes = AtomicU64::new(0);
    let reads = AtomicU64::new(0);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let start = Instant::now();
    let deadline = start + opts.duration;
    let outcome: Result<(), ProbeError> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..in_flight)
            .map(|t| {
                let (shards, bytes, reads) = (&shards, &bytes, &reads);
                scope.spawn(move || -> Result<(), ProbeError> {
                    let mut buf = AlignedBuf::zeroed(request)
                        .map_err(|_| ProbeError::Buffer { len: request })?;
                    // The offsets only need to be spread, not unpredictable.
                    let mut rng = seed ^ (t as u64).wrapping_mul(0xA24B_AED4_963E_E407);
                    // At least one read per worker, however late it was scheduled.
                    loop {
                        // A file chosen in proportion to its size, then an aligned offset in it.
                        let mut at = splitmix64(&mut rng) % total;
                        let Some((shard, size)) = shards.iter().find(|(_, s)| {
                            let hit = at < *s;
                            if !hit {
                                at -= s;
                            }
                            hit
                        }) else {
                            break;
                        };
                        let span = size.saturating_sub(request as u64);
                        let offset = if span == 0 {
                            0
                        } else {
                            (splitmix64(&mut rng) % (span + 1)) & !4095
                        };
                        let want = (size - offset).min(request as u64) as usize;
                        shard.read_chunk(offset, buf.as_mut_slice(), want)?;
                        bytes.fetch_add(want as u64, Ordering::Relaxed);
                        reads.fetch_add(1, Ordering::Relaxed);
                        if Instant::now() >= deadline {
                            break;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| {
            w.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    });
    outcome?;
    let seconds = start.elapsed().as_secs_f64();
    let buffered: Vec<String> = shards
        .iter()
        .filter_map(|(s, _)| match s.mode() {
            ReadMode::Direct => None,
            ReadMode::Buffered { reason } => Some(format!("{}: {reason}", s.path().display())),
        })
        .collect();
    Ok(ProbeResult {
        bytes: bytes.into_inner(),
        reads: reads.into_inner(),
        seconds,
        request,
        in_flight,
        direct: buffered.is_empty(),
        buffered,
    })
}
