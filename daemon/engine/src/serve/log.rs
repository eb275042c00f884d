//! Where the serve core writes its log lines (request started, done, cancelled; sessions; the
//! model load) and tells its embedder about the model's state changes. The embedding binary
//! decides the format and the destination (k3d: `tracing` on stderr, sd_notify for systemd).

use super::Health;
use crate::engine::EngineInfo;

/// How much a log line matters (the embedder maps it to its own levels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    /// Something failed but nothing was lost (a session file not indexed, a spill retried).
    Warn,
    /// A request, a save or the model load failed.
    Error,
}

/// The core's log: one line per call, without its trailing newline.
#[derive(Debug, Clone, Copy)]
pub struct Log(pub fn(Level, std::fmt::Arguments<'_>));

impl Log {
    /// Discards everything (tests, benches).
    pub const QUIET: Log = Log(|_, _| {});

    pub fn info(&self, line: std::fmt::Arguments<'_>) {
        (self.0)(Level::Info, line)
    }
    pub fn warn(&self, line: std::fmt::Arguments<'_>) {
        (self.0)(Level::Warn, line)
    }
    pub fn error(&self, line: std::fmt::Arguments<'_>) {
        (self.0)(Level::Error, line)
    }
}

/// Called on the scheduler thread whenever the model's state changes (each load phase, ready,
/// failed), with the loaded model's info once there is one: a service manager's status line.
pub type OnHealth = fn(&Health, Option<&EngineInfo>);

/// An [`OnHealth`] that does nothing.
pub fn ignore_health(_: &Health, _: Option<&EngineInfo>) {}
