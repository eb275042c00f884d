//! The model load's figures: resident bytes read of the total, the mean rate since the first
//! weight read and the time left at that rate. Computed here, once, from the engine's
//! [`crate::engine::LoadProgress`]; `Status`, `/health`, the log and systemd's status line
//! show these same numbers, in the one text [`LoadFigures`]' `Display` gives them (which gRPC
//! carries to `k3`, so the client words a load exactly as the daemon does).

use std::fmt;
use std::time::Duration;

/// Where a load is. `done == total == 0` while the checkpoint is being checked (no weight read
/// yet).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LoadFigures {
    /// Bytes of the resident weights read.
    pub done: u64,
    /// Bytes of the resident weights the memory plan reads at load.
    pub total: u64,
    /// Mean bytes per second since the first weight read (0 until any time has passed).
    pub bytes_per_second: f64,
    /// Seconds left at that rate: `None` until a rate is known, 0 once everything is read.
    pub eta_seconds: Option<f64>,
}

impl LoadFigures {
    /// `done` of `total` bytes read in `elapsed` since the weights' first read. The mean rate
    /// over the whole load, not the last interval's: reports come per run (a layer's trunk or
    /// a table), whose sizes differ by orders of magnitude, so a per-interval rate would jump.
    pub fn measure(done: u64, total: u64, elapsed: Duration) -> LoadFigures {
        let seconds = elapsed.as_secs_f64();
        let bytes_per_second = if seconds > 0.0 {
            done as f64 / seconds
        } else {
            0.0
        };
        let left = total.saturating_sub(done);
        let eta_seconds = if left == 0 {
            Some(0.0)
        } else if bytes_per_second > 0.0 {
            Some(left as f64 / bytes_per_second)
        } else {
            None
        };
        LoadFigures {
            done,
            total,
            bytes_per_second,
            eta_seconds,
        }
    }

    /// Whether the weights' reads have begun (false while the checkpoint is checked).
    pub fn reading(&self) -> bool {
        self.total > 0
    }
}

/// `"loaded 1.2 GiB of 3.4 GiB, 250.0 MB/s, ETA 9s"`; `"checking the checkpoint"` before the
/// first weight read. Sizes in binary units (the plan's), the rate in decimal ones (a disk's).
impl fmt::Display for LoadFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.reading() {
            return f.write_str("checking the checkpoint");
        }
        let size = |b: u64| bytesize::ByteSize::b(b).display().iec().to_string();
        write!(f, "loaded {} of {}", size(self.done), size(self.total))?;
        if self.bytes_per_second > 0.0 {
            let rate = bytesize::ByteSize::b(self.bytes_per_second as u64)
                .display()
                .si();
            write!(f, ", {rate}/s")?;
        }
        if let Some(eta) = self.eta_seconds.filter(|_| self.done < self.total) {
            write!(f, ", ETA {}", duration(eta))?;
        }
        Ok(())
    }
}

/// Whole seconds as `9s`, `3m 20s`, `2h 05m`.
fn duration(seconds: f64) -> String {
    let s = seconds.max(0.0).ceil() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_and_eta_follow_the_mean_rate() {
        // 1 GiB of 4 GiB in 2 s: 512 MiB/s, 3 GiB left = 6 s.
        let f = LoadFigures::measure(1 << 30, 4 << 30, Duration::from_secs(2));
        assert_eq!(f.bytes_per_second, (512u64 << 20) as f64);
        assert_eq!(f.eta_seconds, Some(6.0));
        assert!(f.reading());
    }

    #[test]
    fn no_eta_before_a_rate_and_zero_once_read() {
        let start = LoadFigures::measure(0, 4 << 30, Duration::ZERO);
        assert_eq!((start.bytes_per_second, start.eta_seconds), (0.0, None));
        let stalled = LoadFigures::measure(0, 4 << 30, Duration::from_secs(3));
        assert_eq!((stalled.bytes_per_second, stalled.eta_seconds), (0.0, None));
        let done = LoadFigures::measure(4 << 30, 4 << 30, Duration::from_secs(8));
        assert_eq!(done.eta_seconds, Some(0.0));
        assert_eq!(done.bytes_per_second, (512u64 << 20) as f64);
        // Checking the checkpoint: nothing to read yet.
        assert!(!LoadFigures::default().reading());
    }

    #[test]
    fn the_load_in_words() {
        let load = |done, total, bytes_per_second, eta_seconds| {
            LoadFigures {
                done,
                total,
                bytes_per_second,
                eta_seconds,
            }
            .to_string()
        };
        assert_eq!(load(0, 0, 0.0, None), "checking the checkpoint");
        assert_eq!(
            load(1 << 30, 4 << 30, 250e6, Some(8.2)),
            "loaded 1.0 GiB of 4.0 GiB, 250.0 MB/s, ETA 9s"
        );
        assert_eq!(load(0, 4 << 30, 0.0, None), "loaded 0 B of 4.0 GiB");
        assert_eq!(
            load(4 << 30, 4 << 30, 5e8, Some(0.0)),
            "loaded 4.0 GiB of 4.0 GiB, 500.0 MB/s"
        );
        assert_eq!(duration(200.0), "3m 20s");
        assert_eq!(duration(7500.0), "2h 05m");
    }
}
