//! One line per event on stderr (journald adds wall-clock time), stamped with seconds since the
//! daemon started so a log read alone still shows how long loads and requests took.

use std::sync::OnceLock;
use std::time::Instant;

static START: OnceLock<Instant> = OnceLock::new();

/// Fix the log's time origin; the first log line does so if this is never called.
pub fn start() {
    START.get_or_init(Instant::now);
}

pub fn line(args: std::fmt::Arguments<'_>) {
    let t = START.get_or_init(Instant::now).elapsed().as_secs_f64();
    eprintln!("k3d [{t:9.3}s] {args}");
}

/// `log!("request {id} started")`: a line in the daemon's log.
macro_rules! log {
    ($($arg:tt)*) => {
        $crate::server::logging::line(format_args!($($arg)*))
    };
}
