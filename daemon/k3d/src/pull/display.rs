//! What `k3d pull` shows while it fetches: on a terminal one bar with bytes, rate and ETA
//! (indicatif) with the per-file lines above it; otherwise the same lines, and the byte counts
//! go to the caller's [`ByteProgress`] (which `k3d pull` reports as plain lines, as `verify`
//! does).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use k3_engine::checkpoint::verify::ByteProgress;
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

pub struct Progress {
    bytes: Arc<ByteProgress>,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// Progress over `total` bytes to fetch, counted in `bytes`.
    pub fn start(bytes: Arc<ByteProgress>, total: u64) -> Progress {
        bytes.total.store(total, Ordering::Relaxed);
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "k3d pull {wide_bar} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}",
                )
                .expect("a valid template"),
            );
            bar.enable_steady_tick(Duration::from_millis(250));
            bar
        });
        Progress { bytes, bar }
    }

    /// `n` more bytes written.
    pub fn add(&self, n: u64) {
        self.bytes.done.fetch_add(n, Ordering::Relaxed);
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    /// A file's bytes must come again (a checksum mismatch, or a server that ignored a range):
    /// `n` more bytes to fetch.
    pub fn refetch(&self, n: u64) {
        let total = self.bytes.total.fetch_add(n, Ordering::Relaxed) + n;
        if let Some(b) = &self.bar {
            b.set_length(total);
        }
    }

    /// A line of its own (above the bar on a terminal).
    pub fn line(&self, text: &str) {
        match &self.bar {
            Some(b) => b.println(format!("k3d pull: {text}")),
            None => eprintln!("k3d pull: {text}"),
        }
    }

    pub fn done(&self) -> u64 {
        self.bytes.done.load(Ordering::Relaxed)
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}
