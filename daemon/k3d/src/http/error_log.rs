//! Every HTTP error answer in the daemon's log, once, with its endpoint, status and reason
//! (issue 34 point 9): a client that gets a 400 sees only its own copy, and an operator must
//! be able to read why an agent's turn failed without reproducing it. A client looping on a
//! bad request must not flood the journal, so at most [`LINES_PER_WINDOW`] lines are written
//! per [`WINDOW`]; the rest are counted and the count is logged when the next window opens
//! (every answer, logged or not, is counted in `/metrics` by endpoint and status).

use axum::http::StatusCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Error lines written per window at most.
pub const LINES_PER_WINDOW: u32 = 60;
/// The rate limit's window.
pub const WINDOW: Duration = Duration::from_secs(10);

pub struct ErrorLog {
    window: Mutex<Window>,
}

struct Window {
    opened: Instant,
    written: u32,
    /// Error answers not logged in this window.
    unlogged: u64,
}

/// What to write for one error answer.
#[derive(Debug, PartialEq)]
pub enum Entry {
    /// The answer's line, after how many answers the previous window left unlogged (0: none).
    Line { unlogged_before: u64 },
    /// Over the window's limit: counted, not written.
    Counted,
}

impl ErrorLog {
    pub fn new() -> ErrorLog {
        ErrorLog {
            window: Mutex::new(Window {
                opened: Instant::now(),
                written: 0,
                unlogged: 0,
            }),
        }
    }

    /// Decides whether the error answered at `now` is written.
    pub fn admit(&self, now: Instant) -> Entry {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let mut unlogged_before = 0;
        if now.duration_since(w.opened) >= WINDOW {
            unlogged_before = w.unlogged;
            *w = Window {
                opened: now,
                written: 0,
                unlogged: 0,
            };
        }
        if w.written < LINES_PER_WINDOW {
            w.written += 1;
            Entry::Line { unlogged_before }
        } else {
            w.unlogged += 1;
            Entry::Counted
        }
    }

    /// Logs an error answer (`status` ≥ 400) of `endpoint` (`POST /v1/messages`) for `reason`,
    /// within the rate limit: a warning for the daemon's own failures (5xx), else information.
    pub fn answered(&self, endpoint: &str, status: StatusCode, reason: &str) {
        match self.admit(Instant::now()) {
            Entry::Counted => {}
            Entry::Line { unlogged_before } => {
                if unlogged_before > 0 {
                    log!(
                        "{unlogged_before} more HTTP error answers were not logged in the last {} s (see /metrics)",
                        WINDOW.as_secs()
                    );
                }
                if status.is_server_error() {
                    log_warn!("HTTP {} on {endpoint}: {reason}", status.as_u16());
                } else {
                    log!("HTTP {} on {endpoint}: {reason}", status.as_u16());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_writes_its_lines_then_counts_and_the_next_one_tells_the_count() {
        let log = ErrorLog::new();
        let start = Instant::now();
        for _ in 0..LINES_PER_WINDOW {
            assert_eq!(log.admit(start), Entry::Line { unlogged_before: 0 });
        }
        for _ in 0..5 {
            assert_eq!(log.admit(start + WINDOW / 2), Entry::Counted);
        }
        assert_eq!(
            log.admit(start + WINDOW),
            Entry::Line { unlogged_before: 5 }
        );
        assert_eq!(
            log.admit(start + WINDOW),
            Entry::Line { unlogged_before: 0 }
        );
    }
}
