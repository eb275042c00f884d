//! A short measurement of the machine's memory read bandwidth, the yardstick for decode where
//! the weights come from RAM (issue 31): one decoded token reads every trunk matrix, the LM
//! head and its routed experts once, so their bytes ÷ this rate is the least time a token can
//! take. `k3d bench` measures it on the engine's thread count right before each budget's runs,
//! `kernel_bench` before its kernels, so each ratio is against the rate of the same hour.
//!
//! The probe sums a buffer far larger than any cache ([`DEFAULT_BYTES`]) as 64-bit integers,
//! split in one contiguous part per thread, each with eight independent sums so the loop is
//! bound by loads, not by the latency of its additions: the "stream read" figure of STREAM-like
//! benchmarks, the rate a matrix-vector product reading its weights once could at best reach.

use std::time::{Duration, Instant};

use rayon::ThreadPoolBuildError;
use rayon::prelude::*;
use serde::Serialize;

/// The buffer the probe reads: 256 MiB, many times any L3 cache.
pub const DEFAULT_BYTES: usize = 256 << 20;

/// What the probe measured.
#[derive(Debug, Clone, Serialize)]
pub struct StreamProbe {
    /// Bytes read per second (wall clock) over the timed passes.
    pub bytes_per_second: f64,
    /// Bytes of one pass.
    pub bytes: usize,
    pub passes: u64,
    pub seconds: f64,
    /// Threads of the pool it ran on.
    pub threads: usize,
}

/// A buffer of `bytes` (rounded down to whole 64-byte lines) of varied words, every page
/// written so no pass meets a page fault.
pub fn buffer(bytes: usize) -> Vec<u64> {
    let words = bytes / 64 * 8;
    (0..words as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect()
}

/// One pass over `buf` on the current rayon pool: each thread sums its contiguous part.
/// Returns the sum so the reads cannot be optimised away.
pub fn pass(buf: &[u64]) -> u64 {
    // Parts of whole 64-byte lines, so no two threads share a cache line.
    let threads = rayon::current_num_threads().max(1);
    buf.par_chunks(buf.len().div_ceil(threads).next_multiple_of(8).max(8))
        .map(|part| {
            let mut s = [0u64; 8];
            let lines = part.chunks_exact(8);
            let tail = lines.remainder();
            for c in lines {
                for k in 0..8 {
                    s[k] = s[k].wrapping_add(c[k]);
                }
            }
            s.iter().chain(tail).fold(0u64, |a, &b| a.wrapping_add(b))
        })
        .reduce(|| 0, u64::wrapping_add)
}

/// Reads a [`DEFAULT_BYTES`] buffer repeatedly for at least `duration` (and at least twice)
/// on a pool of `threads` threads of its own, after one untimed pass; returns the rate.
pub fn measure(threads: usize, duration: Duration) -> Result<StreamProbe, ThreadPoolBuildError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    Ok(pool.install(|| measure_bytes(DEFAULT_BYTES, duration)))
}

/// [`measure`] over a buffer of `bytes` on the current rayon pool.
pub fn measure_bytes(bytes: usize, duration: Duration) -> StreamProbe {
    let buf = buffer(bytes);
    std::hint::black_box(pass(&buf)); // warm-up: the pool's threads, the TLB
    let started = Instant::now();
    let mut passes = 0u64;
    while passes < 2 || started.elapsed() < duration {
        std::hint::black_box(pass(&buf));
        passes += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    let bytes = buf.len() * 8;
    StreamProbe {
        bytes_per_second: bytes as f64 * passes as f64 / seconds,
        bytes,
        passes,
        seconds,
        threads: rayon::current_num_threads(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_sums_every_word_on_any_thread_count() {
        let mut buf = buffer(1 << 16);
        assert_eq!(buf.len(), 8192);
        buf.push(7); // a word past the last whole line

        let want = buf.iter().fold(0u64, |a, &b| a.wrapping_add(b));
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            assert_eq!(pool.install(|| pass(&buf)), want, "{threads} threads");
        }
    }

    #[test]
    fn the_probe_reports_what_it_read() {
        let p = measure_bytes(1 << 20, Duration::from_millis(20));
        assert_eq!(p.bytes, 1 << 20);
        assert!(p.passes >= 2 && p.seconds > 0.0);
        let rate = p.bytes as f64 * p.passes as f64 / p.seconds;
        assert!((p.bytes_per_second - rate).abs() <= 1e-6 * rate);
    }
}
