//! The daemon's log: one line per event on stderr through `tracing`, stamped with seconds since
//! the daemon started so a log read alone still shows how long loads and requests took.
//!
//! * Levels: `log!` is info, `log_warn!` a warning, `log_err!` an error (its line reads
//!   `error: …`). `RUST_LOG` filters with the usual directives (`RUST_LOG=debug`,
//!   `RUST_LOG=k3d=warn`); unset, k3d logs info and up and its libraries warnings and up.
//! * journald: when stderr is the journal (`JOURNAL_STREAM` names stderr's device and inode,
//!   systemd.exec(5)), each line starts with its syslog priority (`<3>` error, `<4>` warning,
//!   `<6>` info, `<7>` debug; sd-daemon(3)), which journald strips and stores, so
//!   `journalctl -u k3d -p err` shows the errors alone. The journal adds the wall-clock time.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;
use std::time::Instant;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

static START: OnceLock<Instant> = OnceLock::new();

/// Without `RUST_LOG`: k3d's own events from info up, its libraries' (tonic, h2) warnings.
const DEFAULT_FILTER: &str = "warn,k3d=info";

/// Fix the log's time origin and install the subscriber (once; later calls do nothing).
pub fn start() {
    START.get_or_init(Instant::now);
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.trim().is_empty() => EnvFilter::builder()
            .with_default_directive(LevelFilter::INFO.into())
            .parse_lossy(directives),
        _ => EnvFilter::new(DEFAULT_FILTER),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .event_format(Line {
            journal: stderr_is_journal(),
        })
        .try_init();
}

/// systemd sets `JOURNAL_STREAM=DEV:INODE` for a service whose stderr goes to the journal; it
/// is ours only if stderr still is that stream (a child started from a shell inherits it).
fn stderr_is_journal() -> bool {
    let Ok(value) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = value.split_once(':') else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// `k3d [   1.234s] message`, with `error: ` / `warning: ` before errors and warnings, and the
/// syslog priority first when writing to the journal.
struct Line {
    journal: bool,
}

impl<S, N> FormatEvent<S, N> for Line
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let level = *event.metadata().level();
        if self.journal {
            write!(writer, "<{}>", priority(level))?;
        }
        let t = START.get_or_init(Instant::now).elapsed().as_secs_f64();
        write!(writer, "k3d [{t:9.3}s] ")?;
        match level {
            Level::ERROR => write!(writer, "error: ")?,
            Level::WARN => write!(writer, "warning: ")?,
            _ => {}
        }
        ctx.format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// syslog(3) priorities as sd-daemon(3) prefixes spell them.
fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// The serve core's log (`k3_engine::serve::Log`): its lines at their levels, with the
/// daemon's own.
pub fn core_line(level: k3_engine::serve::Level, line: fmt::Arguments<'_>) {
    match level {
        k3_engine::serve::Level::Info => tracing::info!("{line}"),
        k3_engine::serve::Level::Warn => tracing::warn!("{line}"),
        k3_engine::serve::Level::Error => tracing::error!("{line}"),
    }
}

/// `log!("request {id} started")`: an info line in the daemon's log.
macro_rules! log {
    ($($arg:tt)*) => {
        ::tracing::info!("{}", format_args!($($arg)*))
    };
}

/// `log_warn!(...)`: something went wrong that the daemon works around.
macro_rules! log_warn {
    ($($arg:tt)*) => {
        ::tracing::warn!("{}", format_args!($($arg)*))
    };
}

/// `log_err!(...)`: a failure the operator must see (`journalctl -p err`).
macro_rules! log_err {
    ($($arg:tt)*) => {
        ::tracing::error!("{}", format_args!($($arg)*))
    };
}
