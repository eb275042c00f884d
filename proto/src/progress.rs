//! The one text of a model load's progress, for every place that shows it (`k3 status`, the
//! client's wait, `k3d serve`'s log, systemd's status line, `/health`'s 503 message): the
//! figures come from the serve core (`k3_engine::serve::LoadFigures`), the words from here.

use crate::v1::Progress;

/// `"loaded 1.2 GiB of 3.4 GiB, 250.0 MB/s, ETA 9s"`; `"checking the checkpoint"` before the
/// first weight read. Sizes in binary units (the plan's), the rate in decimal ones (a disk's).
pub fn load_text(p: &Progress) -> String {
    if p.total == 0 {
        return "checking the checkpoint".to_string();
    }
    let size = |b: u64| bytesize::ByteSize::b(b).display().iec().to_string();
    let mut text = format!("loaded {} of {}", size(p.done), size(p.total));
    if p.bytes_per_second > 0.0 {
        let rate = bytesize::ByteSize::b(p.bytes_per_second as u64)
            .display()
            .si();
        text.push_str(&format!(", {rate}/s"));
    }
    if let Some(eta) = p.eta_seconds.filter(|_| p.done < p.total) {
        text.push_str(&format!(", ETA {}", duration(eta)));
    }
    text
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
    use crate::v1::Phase;

    fn load(done: u64, total: u64, rate: f64, eta: Option<f64>) -> Progress {
        Progress {
            phase: Phase::Load.into(),
            done,
            total,
            bytes_per_second: rate,
            eta_seconds: eta,
            ..Progress::default()
        }
    }

    #[test]
    fn load_lines() {
        assert_eq!(load_text(&load(0, 0, 0.0, None)), "checking the checkpoint");
        assert_eq!(
            load_text(&load(1 << 30, 4 << 30, 250e6, Some(8.2))),
            "loaded 1.0 GiB of 4.0 GiB, 250.0 MB/s, ETA 9s"
        );
        assert_eq!(
            load_text(&load(0, 4 << 30, 0.0, None)),
            "loaded 0 B of 4.0 GiB"
        );
        assert_eq!(
            load_text(&load(4 << 30, 4 << 30, 5e8, Some(0.0))),
            "loaded 4.0 GiB of 4.0 GiB, 500.0 MB/s"
        );
        assert_eq!(duration(200.0), "3m 20s");
        assert_eq!(duration(7500.0), "2h 05m");
    }
}
