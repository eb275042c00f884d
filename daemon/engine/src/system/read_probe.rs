//! A short measurement of how fast the model's drive delivers bytes the way the engine asks for
//! them, through the store's own shard reader (so the fallback to buffered reads is the
//! engine's, and as loud), with `O_DIRECT` where the filesystem allows it (engine-lessons
//! §2.1), several requests in flight on plain threads (§2.2: queue depth matters).
//!
//! Two patterns ([`Pattern`]):
//! * [`Pattern::Decode`]: the reads a decoded token issues under a plan ([`decode_reads`]):
//!   each streamed layer's matrices in the forward pass's order, then `top_k` routed experts
//!   of each MoE layer sorted by offset, every run cut into the reader pool's requests
//!   ([`DEFAULT_CHUNK`]: one per 17,547,264-byte expert, up to 32 MiB per trunk piece), taken
//!   in that order by as many threads as the engine's queue depth
//!   ([`crate::plan::buffers::DEFAULT_QUEUE_DEPTH`]), one read in flight each. `k3d bench`
//!   sets decode against this (issue 41.3): a probe of random expert-sized reads over the
//!   whole checkpoint read 1.56 GB/s on the development box while decode at 3.62 GiB read
//!   3.77 GB/s, so a "floor" from it was no floor.
//! * [`Pattern::Random`]: aligned windows of one size at random offsets (`k3d doctor`, which
//!   has no plan).
//!
//! Both are timed after a **warm-up** ([`ProbeOptions::warmup`]): the bytes of the reads that
//! complete within the timed window, over the window — the steady rate, without the first
//! requests' start-up (thread start, a cold drive or host cache, the first seeks).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::checkpoint::layout::{ByteRun, FfnLayout, ModelLayout};
use crate::plan::buffers::DEFAULT_CHUNK;
use crate::rng::splitmix64;
use crate::store::direct_buffer::{AlignedBuf, round_up};
use crate::store::direct_io::{Chunk, DirectPolicy, ReadError, ReadMode, ShardSet, Window};

/// One routed expert, the engine's typical random read (spec §1.2).
pub const EXPERT_READ: usize = 17_547_264;

/// Tokens' worth of routed experts [`decode_reads`] draws, so the probe does not reread one
/// token's experts in a short cycle.
const PROBE_TOKENS: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("no non-empty shard files to read")]
    NoFiles,
    #[error("the read pattern names no bytes to read")]
    NoReads,
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

/// Which reads the probe issues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// Aligned windows of `request` bytes (rounded up to 4096) at random offsets.
    Random { request: usize },
    /// These runs of the shards (`ByteRun::shard` indexes the files), in this order, cycled;
    /// each cut into requests of at most [`DEFAULT_CHUNK`] bytes as the reader pool cuts it.
    Decode(Vec<ByteRun>),
}

impl Pattern {
    fn name(&self) -> &'static str {
        match self {
            Pattern::Random { .. } => "random",
            Pattern::Decode(_) => "decode",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ProbeOptions {
    pub pattern: Pattern,
    /// Requests in flight: one thread each.
    pub in_flight: usize,
    /// Reads before the timed window, not counted.
    pub warmup: Duration,
    /// The timed window: reads completing in it count.
    pub duration: Duration,
    pub policy: DirectPolicy,
}

/// What the probe measured.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeResult {
    /// Payload bytes of the reads completed in the timed window (short reads at a file's end
    /// count what arrived).
    pub bytes: u64,
    /// Reads completed in the timed window.
    pub reads: u64,
    /// The timed window.
    pub seconds: f64,
    /// The warm-up before it.
    pub warmup_seconds: f64,
    /// `random` or `decode` ([`Pattern`]).
    pub pattern: &'static str,
    /// The largest request, bytes.
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

/// The runs a decoded token reads from the drive under a plan that streams the trunk of
/// `streamed` layers and reads routed experts from the drive (`experts`): per layer in order,
/// its matrices in [`crate::checkpoint::layout::LayerLayout::stream_order`] if it streams, then
/// `top_k` distinct routed experts of it (drawn from `seed`, sorted by offset as the reader
/// pool sorts a batch), for [`PROBE_TOKENS`] tokens. With nothing streamed and no experts
/// (everything resident) it is every layer's reads: the drive then limits nothing, and the
/// figure is the drive's at the tightest budget.
pub fn decode_reads(
    layout: &ModelLayout,
    streamed: &[usize],
    experts: bool,
    top_k: usize,
    seed: u64,
) -> Vec<ByteRun> {
    let all: Vec<usize> = (0..layout.layers.len()).collect();
    let (streamed, experts) = if streamed.is_empty() && !experts {
        (all.as_slice(), true)
    } else {
        (streamed, experts)
    };
    let mut rng = seed;
    let mut out = Vec::new();
    for _ in 0..PROBE_TOKENS {
        for layer in &layout.layers {
            if streamed.contains(&layer.index) {
                out.extend(layer.stream_order().iter().map(|s| ByteRun {
                    shard: layer.trunk.shard,
                    offset: layer.trunk.offset + s.start as u64,
                    len: s.len as u64,
                }));
            }
            if let (true, FfnLayout::Moe(m)) = (experts, &layer.ffn) {
                let mut picked: Vec<ByteRun> = Vec::with_capacity(top_k);
                let n = m.experts.len();
                while picked.len() < top_k.min(n) {
                    let e = (splitmix64(&mut rng) % n as u64) as usize;
                    let run = m.experts[e].0;
                    if !picked.contains(&run) {
                        picked.push(run);
                    }
                }
                picked.sort_by_key(|r| (r.shard, r.offset));
                out.extend(picked);
            }
        }
    }
    out
}

/// One request of the decode pattern: request `chunk` of `run`.
struct Request {
    run: ByteRun,
    chunk: Chunk,
}

/// Read `opts.pattern` from `files`, `opts.in_flight` at a time, for the warm-up and then the
/// timed window.
pub fn measure(files: &[PathBuf], opts: ProbeOptions) -> Result<ProbeResult, ProbeError> {
    let mut sizes = Vec::with_capacity(files.len());
    for path in files {
        let size = std::fs::metadata(path)
            .map_err(|error| ProbeError::Metadata {
                path: path.clone(),
                error,
            })?
            .len();
        sizes.push(size);
    }
    let total: u64 = sizes.iter().sum();
    if total == 0 {
        return Err(ProbeError::NoFiles);
    }
    let shards = ShardSet::open(files, opts.policy)?;
    let requests = match &opts.pattern {
        Pattern::Random { request } => {
            let request = round_up((*request).max(1) as u64)
                .and_then(|r| usize::try_from(r).ok())
                .ok_or(ProbeError::Buffer { len: *request })?;
            Requests::Random { request, sizes }
        }
        Pattern::Decode(runs) => {
            let mut list = Vec::new();
            for &run in runs {
                for chunk in Window::of(run)?.chunks(DEFAULT_CHUNK)? {
                    list.push(Request { run, chunk });
                }
            }
            if list.is_empty() {
                return Err(ProbeError::NoReads);
            }
            Requests::Listed {
                list,
                next: AtomicUsize::new(0),
            }
        }
    };
    let largest = requests.largest();
    let in_flight = opts.in_flight.max(1);
    let bytes = AtomicU64::new(0);
    let reads = AtomicU64::new(0);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let start = Instant::now();
    let timed = start + opts.warmup;
    let deadline = timed + opts.duration;
    let outcome: Result<(), ProbeError> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..in_flight)
            .map(|t| {
                let (shards, requests, bytes, reads) = (&shards, &requests, &bytes, &reads);
                scope.spawn(move || -> Result<(), ProbeError> {
                    let mut buf = AlignedBuf::zeroed(largest)
                        .map_err(|_| ProbeError::Buffer { len: largest })?;
                    // The offsets only need to be spread, not unpredictable.
                    let mut rng = seed ^ (t as u64).wrapping_mul(0xA24B_AED4_963E_E407);
                    while Instant::now() < deadline {
                        let (run, chunk) = requests.next(&mut rng);
                        shards.read_chunk(run, &chunk, &mut buf.as_mut_slice()[..chunk.len])?;
                        let done = Instant::now();
                        // Reads completing in the timed window count: the steady rate.
                        if done >= timed && done <= deadline {
                            bytes.fetch_add(chunk.required as u64, Ordering::Relaxed);
                            reads.fetch_add(1, Ordering::Relaxed);
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
    let buffered: Vec<String> = (0..shards.len())
        .filter_map(|i| shards.shard(i).ok())
        .filter_map(|s| match s.mode() {
            ReadMode::Direct => None,
            ReadMode::Buffered { reason } => Some(format!("{}: {reason}", s.path().display())),
        })
        .collect();
    Ok(ProbeResult {
        bytes: bytes.into_inner(),
        reads: reads.into_inner(),
        seconds: opts.duration.as_secs_f64(),
        warmup_seconds: opts.warmup.as_secs_f64(),
        pattern: opts.pattern.name(),
        request: largest,
        in_flight,
        direct: buffered.is_empty(),
        buffered,
    })
}

/// Where the workers' next request comes from.
enum Requests {
    /// A random aligned window of `request` bytes, in a file chosen in proportion to its size.
    Random { request: usize, sizes: Vec<u64> },
    /// The next of `list`, cycled, shared by the workers like the reader pool's queue.
    Listed {
        list: Vec<Request>,
        next: AtomicUsize,
    },
}

impl Requests {
    fn largest(&self) -> usize {
        match self {
            Requests::Random { request, .. } => *request,
            Requests::Listed { list, .. } => list.iter().map(|r| r.chunk.len).max().unwrap_or(0),
        }
    }

    fn next(&self, rng: &mut u64) -> (ByteRun, Chunk) {
        match self {
            Requests::Random { request, sizes } => {
                let total: u64 = sizes.iter().sum();
                let mut at = splitmix64(rng) % total.max(1);
                let (mut shard, mut size) = (0, 0);
                for (i, &s) in sizes.iter().enumerate() {
                    if at < s {
                        (shard, size) = (i, s);
                        break;
                    }
                    at -= s;
                }
                let span = size.saturating_sub(*request as u64);
                let offset = if span == 0 {
                    0
                } else {
                    (splitmix64(rng) % (span + 1)) & !4095
                };
                let want = (size - offset).min(*request as u64) as usize;
                let run = ByteRun {
                    shard,
                    offset,
                    len: want as u64,
                };
                let chunk = Chunk {
                    file_offset: offset,
                    buf_start: 0,
                    len: *request,
                    required: want,
                };
                (run, chunk)
            }
            Requests::Listed { list, next } => {
                let r = &list[next.fetch_add(1, Ordering::Relaxed) % list.len()];
                (r.run, r.chunk)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Checkpoint;

    /// The decode pattern names each streamed layer's matrices and `top_k` distinct experts of
    /// every MoE layer per token, sorted by offset; the probe reads them through the store's
    /// shard reader and counts only what completed in the timed window.
    #[test]
    fn the_decode_pattern_reads_a_tokens_runs_after_a_warm_up() {
        let dir = tempfile::Builder::new()
            .prefix("k3-read-probe-")
            .tempdir()
            .unwrap();
        let shape = crate::synth::shape::Shape::named("tiny").unwrap();
        let plan = crate::synth::blueprint(&shape).unwrap();
        crate::synth::write(&plan, dir.path(), 0, true, &mut |_| {}).unwrap();
        let c = Checkpoint::open(dir.path()).unwrap();
        let top_k = c.config.num_experts_per_token;
        let moe = |l: &crate::checkpoint::layout::LayerLayout| match &l.ffn {
            FfnLayout::Moe(m) => Some(m.experts.iter().map(|(r, _)| *r).collect::<Vec<_>>()),
            FfnLayout::Dense(_) => None,
        };
        let runs = decode_reads(&c.layout, &[0], true, top_k, 7);
        let first = &c.layout.layers[0];
        let matrices = first.stream_order().len();
        assert_eq!(
            runs[0].offset,
            first.trunk.offset + first.stream_order()[0].start as u64
        );
        // One token: layer 0's matrices and its experts (if MoE), then every other MoE
        // layer's experts, each layer's sorted and distinct.
        let mut at = matrices;
        for layer in &c.layout.layers {
            if let Some(pool) = moe(layer) {
                let picked = &runs[at..at + top_k];
                assert!(picked.iter().all(|r| pool.contains(r)));
                assert!(picked.windows(2).all(|w| w[0].offset < w[1].offset));
                at += top_k;
            }
        }
        assert_eq!(runs.len(), at * PROBE_TOKENS);
        // Everything resident: every layer's reads.
        assert!(decode_reads(&c.layout, &[], false, top_k, 7).len() > runs.len());
        let files: Vec<PathBuf> = c.shards.iter().map(|s| s.path.clone()).collect();
        let p = measure(
            &files,
            ProbeOptions {
                pattern: Pattern::Decode(runs),
                in_flight: 2,
                warmup: Duration::from_millis(50),
                duration: Duration::from_millis(200),
                policy: DirectPolicy::Prefer,
            },
        )
        .unwrap();
        assert_eq!((p.pattern, p.in_flight), ("decode", 2));
        assert!(p.reads > 0 && p.bytes > 0 && p.rate() > 0.0, "{p:?}");
        assert!(p.request <= DEFAULT_CHUNK);
        assert_eq!((p.seconds, p.warmup_seconds), (0.2, 0.05));
        assert!(matches!(
            measure(
                &files,
                ProbeOptions {
                    pattern: Pattern::Decode(Vec::new()),
                    in_flight: 1,
                    warmup: Duration::ZERO,
                    duration: Duration::from_millis(10),
                    policy: DirectPolicy::Prefer,
                },
            ),
            Err(ProbeError::NoReads)
        ));
    }
}
