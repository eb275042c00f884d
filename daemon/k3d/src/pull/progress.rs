//! What `k3d pull` shows while it fetches: on a terminal one bar with bytes, rate and ETA
//! (indicatif) and the per-file lines above it; otherwise (logs, CI) the same lines and a plain
//! progress line every [`PLAIN_EVERY`].

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub const PLAIN_EVERY: Duration = Duration::from_secs(10);

struct Counts {
    done: AtomicU64,
    total: AtomicU64,
    stop: AtomicBool,
}

pub struct Progress {
    counts: Arc<Counts>,
    bar: Option<ProgressBar>,
    plain: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    /// Progress over `total` bytes to fetch.
    pub fn start(total: u64) -> Progress {
        let counts = Arc::new(Counts {
            done: AtomicU64::new(0),
            total: AtomicU64::new(total),
            stop: AtomicBool::new(false),
        });
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "k3d pull {wide_bar} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}",
                )
                .expect("a valid template"),
            );
            bar.enable_steady_tick(Duration::from_millis(250));
            return Progress {
                counts,
                bar: Some(bar),
                plain: None,
            };
        }
        let c = counts.clone();
        let plain = std::thread::spawn(move || {
            let start = Instant::now();
            let mut last = Instant::now();
            while !c.stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                if last.elapsed() >= PLAIN_EVERY {
                    last = Instant::now();
                    eprintln!("{}", plain_line(&c, start.elapsed()));
                }
            }
        });
        Progress {
            counts,
            bar: None,
            plain: Some(plain),
        }
    }

    /// `n` more bytes written.
    pub fn add(&self, n: u64) {
        self.counts.done.fetch_add(n, Ordering::Relaxed);
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    /// A file's bytes must come again (a checksum mismatch, or a server that ignored a range):
    /// `n` more bytes to fetch.
    pub fn refetch(&self, n: u64) {
        let total = self.counts.total.fetch_add(n, Ordering::Relaxed) + n;
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
        self.counts.done.load(Ordering::Relaxed)
    }
}

fn plain_line(c: &Counts, elapsed: Duration) -> String {
    let done = c.done.load(Ordering::Relaxed);
    let total = c.total.load(Ordering::Relaxed).max(1);
    let rate = done as f64 / elapsed.as_secs_f64().max(1e-9);
    let eta = total.saturating_sub(done) as f64 / rate.max(1.0);
    format!(
        "k3d pull: {:.2} / {:.2} GB ({:.0}%), {:.1} MB/s, ETA {}:{:02}",
        done as f64 / 1e9,
        total as f64 / 1e9,
        100.0 * done as f64 / total as f64,
        rate / 1e6,
        eta as u64 / 60,
        eta as u64 % 60
    )
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.counts.stop.store(true, Ordering::Relaxed);
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        if let Some(t) = self.plain.take() {
            let _ = t.join();
        }
    }
}
