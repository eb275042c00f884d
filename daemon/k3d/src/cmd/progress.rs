//! Progress of long byte-counting work (`k3d verify`, `k3d pack`, `k3d pull` in logs) on stderr.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k3_engine::checkpoint::verify::ByteProgress;

/// Prints "done / total, rate, ETA" to stderr until dropped: in place on a terminal, one line
/// every few seconds otherwise (logs).
pub struct Reporter {
    stop: std::sync::mpsc::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reporter {
    pub fn start(
        progress: Arc<ByteProgress>,
        command: &'static str,
        verb: &'static str,
    ) -> Reporter {
        let (stop, rx) = std::sync::mpsc::channel::<()>();
        let tty = std::io::stderr().is_terminal();
        let every = if tty {
            Duration::from_millis(500)
        } else {
            Duration::from_secs(5)
        };
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let line = |end: &str| {
                let done = progress.done.load(Ordering::Relaxed);
                let total = progress.total.load(Ordering::Relaxed).max(1);
                let secs = start.elapsed().as_secs_f64();
                let rate = done as f64 / secs.max(1e-9);
                let eta = (total.saturating_sub(done)) as f64 / rate.max(1.0);
                eprint!(
                    "{command}: {verb} {:.2} / {:.2} GB ({:.0}%), {:.0} MB/s, ETA {}:{:02}{end}",
                    done as f64 / 1e9,
                    total as f64 / 1e9,
                    100.0 * done as f64 / total as f64,
                    rate / 1e6,
                    eta as u64 / 60,
                    eta as u64 % 60
                );
            };
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(every) {
                line(if tty { "\r" } else { "\n" });
            }
            line("\n");
        });
        Reporter {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
