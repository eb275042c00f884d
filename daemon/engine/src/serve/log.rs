//! Where the serve core writes its log lines (request started, done, cancelled; sessions; the
//! model load). The embedding binary decides the format and the destination.

/// One log line, without its trailing newline.
pub type Log = fn(std::fmt::Arguments<'_>);

/// A [`Log`] that discards everything (tests, benches).
pub fn quiet(_: std::fmt::Arguments<'_>) {}
