//! When `k3d pull` tries again: after a 5xx, 408 or 429 (waiting what `Retry-After` asks), a
//! refused or reset connection, a timeout or a body cut short. Delays double from
//! [`FIRST_DELAY`] up to [`MAX_DELAY`]; after [`MAX_ATTEMPTS`] failed attempts in a row with no
//! byte gained between them the file (or API call) is given up, named. An attempt that brought
//! bytes starts the count again, so a long file on a flaky link is not lost to drops spread
//! over hours.

use super::error::PullError;
use std::time::Duration;

/// Failed attempts in a row, without progress, before giving up (docs/reference.md).
pub const MAX_ATTEMPTS: u32 = 8;
pub const FIRST_DELAY: Duration = Duration::from_secs(1);
pub const MAX_DELAY: Duration = Duration::from_secs(30);
/// The longest `Retry-After` obeyed: a server asking for more is waited on this long.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// Why an attempt failed in a way that another attempt may not.
#[derive(Debug)]
pub enum Transient {
    /// A 5xx, 408 or 429, with the `Retry-After` it carried.
    Status(u16, Option<Duration>),
    /// Connecting, sending, or reading the body failed (reset, timeout, cut short).
    Network(String),
    /// The body ended cleanly before the size the listing gives.
    Short { got: u64, want: u64 },
}

impl std::fmt::Display for Transient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transient::Status(code, _) => write!(f, "HTTP {code}"),
            Transient::Network(e) => write!(f, "{e}"),
            Transient::Short { got, want } => {
                write!(f, "the body ended at byte {got} of {want}")
            }
        }
    }
}

/// Why one attempt stopped short: worth another, or not.
pub enum Stop {
    Again(Transient),
    Fatal(PullError),
}

impl From<PullError> for Stop {
    fn from(e: PullError) -> Self {
        Stop::Fatal(e)
    }
}

/// Whether `status` is worth another attempt.
pub fn transient_status(status: u16) -> bool {
    status >= 500 || status == 408 || status == 429
}

/// `Retry-After` in seconds (the form the Hub and its CDN send); an HTTP date is not parsed and
/// falls back to the doubling delay.
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

/// The failures in a row of one file or call.
pub struct Backoff {
    what: String,
    failures: u32,
}

impl Backoff {
    /// `what` names the file or call in the error that gives up.
    pub fn new(what: impl Into<String>) -> Backoff {
        Backoff {
            what: what.into(),
            failures: 0,
        }
    }

    /// An attempt brought bytes: the count of failures in a row starts again.
    pub fn progressed(&mut self) {
        self.failures = 0;
    }

    /// After an attempt that brought `got` of `want` bytes (`gained`: some of them this time):
    /// a fatal error ends, a transient one or a body that ended short waits for the next.
    pub async fn settle(
        &mut self,
        gained: bool,
        outcome: Result<(), Stop>,
        got: u64,
        want: u64,
    ) -> Result<(), PullError> {
        if gained {
            self.progressed();
        }
        match outcome {
            Err(Stop::Fatal(e)) => Err(e),
            Err(Stop::Again(cause)) => self.failed(cause).await,
            Ok(()) if got < want => self.failed(Transient::Short { got, want }).await,
            Ok(()) => Ok(()),
        }
    }

    /// Counts a failed attempt and waits before the next one, or gives up past the limit.
    pub async fn failed(&mut self, cause: Transient) -> Result<(), PullError> {
        self.failures += 1;
        if self.failures >= MAX_ATTEMPTS {
            return Err(PullError::Unreachable {
                what: self.what.clone(),
                attempts: self.failures,
                last: cause.to_string(),
            });
        }
        let doubling = FIRST_DELAY.saturating_mul(1 << (self.failures - 1).min(16));
        let delay = match cause {
            Transient::Status(_, Some(asked)) => asked,
            _ => doubling.min(MAX_DELAY),
        };
        eprintln!(
            "k3d pull: {}: {cause}; attempt {} of {MAX_ATTEMPTS} in {:.0} s",
            self.what,
            self.failures + 1,
            delay.as_secs_f64()
        );
        tokio::time::sleep(delay).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_in_seconds_is_capped_and_dates_are_ignored() {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(reqwest::header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert(reqwest::header::RETRY_AFTER, "86400".parse().unwrap());
        assert_eq!(retry_after(&h), Some(MAX_RETRY_AFTER));
        h.insert(
            reqwest::header::RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn which_statuses_are_retried() {
        for s in [500, 502, 503, 504, 408, 429] {
            assert!(transient_status(s), "{s}");
        }
        for s in [200, 206, 302, 400, 401, 403, 404, 416] {
            assert!(!transient_status(s), "{s}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_the_limit_and_progress_resets_the_count() {
        let mut b = Backoff::new("f.safetensors");
        for _ in 0..MAX_ATTEMPTS - 1 {
            b.failed(Transient::Network("reset".into())).await.unwrap();
        }
        b.progressed();
        for _ in 0..MAX_ATTEMPTS - 1 {
            b.failed(Transient::Status(503, None)).await.unwrap();
        }
        let e = b
            .failed(Transient::Short { got: 3, want: 9 })
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("f.safetensors") && text.contains("byte 3 of 9"),
            "{text}"
        );
    }
}
