//! Why the serve core refused or ended a job, typed so each transport maps it to its own status
//! (gRPC codes now, HTTP statuses next) without reading message text.

use std::sync::Arc;

use super::validate::Invalid;
use crate::engine::EngineError;
use crate::session::SessionStoreError;

/// How full the admission queue was when a job was refused ([`ServeError::Busy`]): enough for
/// a transport to say when to retry (HTTP 429 `Retry-After`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueState {
    pub running: usize,
    pub queued: usize,
    pub max_queue: usize,
}

/// One account's jobs when its job was refused ([`ServeError::UidBusy`]), with its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UidQueueState {
    /// The account whose share is full ([`super::Caller::account`]).
    pub account: super::Caller,
    pub running: usize,
    pub waiting: usize,
    /// `usize::MAX`: no limit of its own.
    pub max_active: usize,
    pub max_queued: usize,
}

/// Every way a job can be refused at submission or end without a [`super::Done`].
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServeError {
    /// The request itself is wrong (gRPC `INVALID_ARGUMENT`, HTTP 400).
    #[error("{0}")]
    Invalid(#[from] Invalid),
    /// The queue is full (gRPC `RESOURCE_EXHAUSTED`, HTTP 429).
    #[error(
        "k3d is busy: {} requests running and {} waiting (--max-queue {}); retry when one finishes",
        .0.running, .0.queued, .0.max_queue
    )]
    Busy(QueueState),
    /// The caller's uid has as many jobs waiting as it may (issue 19 point 5; gRPC
    /// `RESOURCE_EXHAUSTED`, HTTP 429); others may still be admitted.
    #[error("{}", uid_busy_text(.0))]
    UidBusy(UidQueueState),
    /// Shutdown has begun: nothing new is admitted (`UNAVAILABLE`, 503).
    #[error("k3d is shutting down and accepts no new requests")]
    ShuttingDown,
    /// The model could not be loaded (`UNAVAILABLE`, 503).
    #[error("the model failed to load, so k3d cannot generate: {0}")]
    ModelFailed(Arc<EngineError>),
    /// [`super::Core::cancel`] reached the job while it ran (`CANCELLED`).
    #[error("request {0} was cancelled by a Cancel call (its owner's or root's)")]
    Cancelled(u64),
    /// [`super::Core::cancel`] reached the job while it waited in the queue (`CANCELLED`).
    #[error("request {0} cancelled before it started")]
    CancelledQueued(u64),
    /// The receiver was dropped while the job ran (`CANCELLED`; nobody reads it).
    #[error("the client went away")]
    Abandoned,
    /// The shutdown grace ran out before the job finished (`CANCELLED`).
    #[error("k3d is shutting down: the request was cancelled after the grace period")]
    Shutdown,
    /// The job's reader took no event for `--stall-timeout` seconds while other requests
    /// waited for a compute slot, and the session allowance had no room to keep its state
    /// until the reader came back (issue 35 point 4; gRPC `ABORTED`, an HTTP stream's error
    /// event). A reader with room kept is parked instead and gets its whole reply.
    #[error(
        "request {id} was cancelled: its reader took nothing for {seconds:.1} s \
         (--stall-timeout) while others waited for a compute slot, and the session allowance \
         had no room to keep its state"
    )]
    Stalled { id: u64, seconds: f64 },
    /// A session refusal (not found, another user's, in use, its file damaged), or a failure
    /// of the session storage ([`SessionStoreError::is_storage_failure`]), which says so first.
    #[error("{}", session_text(.0))]
    Session(Arc<SessionStoreError>),
    /// Sessions are not open yet: the model is still loading (`UNAVAILABLE`).
    #[error("the daemon is loading its model; sessions are available once it is ready")]
    SessionsLoading,
    /// The session directory could not be opened (`FAILED_PRECONDITION`).
    #[error("sessions are unavailable: {0}")]
    SessionsUnavailable(String),
    /// The model failed while computing the job (`INTERNAL`, HTTP 500).
    #[error("the model failed: {0}")]
    Model(Arc<EngineError>),
    /// [`super::Core::cancel`] of an id neither queued nor running (`NOT_FOUND`).
    #[error("no queued or running request {0} (it may have finished)")]
    UnknownRequest(u64),
    /// [`super::Core::cancel`] of another user's job (`PERMISSION_DENIED`, HTTP 403): ids are
    /// sequential, so anyone could otherwise cancel everyone's work by counting.
    #[error("request {0} is another user's: only its owner or root may cancel it")]
    NotYours(u64),
}

/// Names both per-uid limits with their values (the active one when it is set), so the
/// caller sees which setting turned them away. Begins like [`ServeError::Busy`]'s text, which
/// clients read as "retry later".
fn uid_busy_text(s: &UidQueueState) -> String {
    let active = if s.max_active == usize::MAX {
        String::new()
    } else {
        format!(" (--max-active-per-uid {})", s.max_active)
    };
    format!(
        "k3d is busy for {}: {} of its requests running{active} and {} waiting \
         (--max-queued-per-uid {}); retry when one of them finishes",
        s.account, s.running, s.waiting, s.max_queued
    )
}

/// What a session error says: a storage failure is named as one, so that no transport or
/// client mistakes a full disk for a refusal or for the model failing.
fn session_text(e: &SessionStoreError) -> String {
    if e.is_storage_failure() {
        format!("{STORAGE_FAILED}: {e}")
    } else {
        e.to_string()
    }
}

/// How every session storage failure's message begins (clients match on it).
pub const STORAGE_FAILED: &str = "k3d could not store the session";

impl From<SessionStoreError> for ServeError {
    fn from(e: SessionStoreError) -> Self {
        ServeError::Session(Arc::new(e))
    }
}

impl ServeError {
    /// The request was turned away without anything computed (a bad request, a full queue,
    /// a session refused, k3d not serving), as opposed to a job that failed or was cancelled.
    /// The counters tell the two apart: refusals say nothing about the daemon's health.
    pub fn is_refusal(&self) -> bool {
        match self {
            ServeError::Invalid(_)
            | ServeError::Busy(_)
            | ServeError::UidBusy(_)
            | ServeError::ShuttingDown
            | ServeError::ModelFailed(_)
            | ServeError::SessionsLoading
            | ServeError::SessionsUnavailable(_)
            | ServeError::UnknownRequest(_)
            | ServeError::NotYours(_) => true,
            // A storage failure (reading or writing the session directory) is the daemon's.
            ServeError::Session(s) => !s.is_storage_failure(),
            ServeError::Model(_)
            | ServeError::Cancelled(_)
            | ServeError::CancelledQueued(_)
            | ServeError::Abandoned
            | ServeError::Shutdown
            | ServeError::Stalled { .. } => false,
        }
    }

    /// An engine error met while starting or stepping a job: the request's own fault or the
    /// model's. Only [`EngineError::InvalidRequest`] is the request's; NaN logits and the
    /// engine's internal errors are failures (issue 19.7), counted failed, `INTERNAL`/500.
    pub(crate) fn from_engine(e: EngineError) -> ServeError {
        match e {
            EngineError::InvalidRequest(why) => Invalid::Engine(why).into(),
            other => ServeError::Model(Arc::new(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_told_from_failures() {
        let refused = [
            ServeError::Invalid(Invalid::NoMessages),
            ServeError::Busy(QueueState {
                running: 1,
                queued: 1,
                max_queue: 1,
            }),
            ServeError::ShuttingDown,
            SessionStoreError::NotFound("s".into()).into(),
            SessionStoreError::InvalidName("..".into()).into(),
        ];
        for e in &refused {
            assert!(e.is_refusal(), "{e}");
        }
        let failed = [
            ServeError::Model(Arc::new(EngineError::InvalidRequest("x".into()))),
            SessionStoreError::Dir {
                path: "/sessions".into(),
                error: std::io::Error::from_raw_os_error(libc::ENOSPC),
            }
            .into(),
            ServeError::Cancelled(3),
            ServeError::Abandoned,
        ];
        for e in &failed {
            assert!(!e.is_refusal(), "{e}");
        }
    }
}

#[cfg(test)]
mod engine_tests {
    use super::*;
    use crate::model::ModelError;

    #[test]
    fn nan_logits_and_internal_errors_are_failures_of_the_model() {
        let failures = [
            EngineError::Model(ModelError::NanLogits { row: 0, index: 5 }),
            EngineError::Internal("the model returned no logits".into()),
        ];
        for e in failures {
            let served = ServeError::from_engine(e);
            assert!(matches!(served, ServeError::Model(_)), "{served:?}");
            assert!(!served.is_refusal(), "{served}");
        }
        let refused = ServeError::from_engine(EngineError::InvalidRequest("empty".into()));
        assert!(refused.is_refusal(), "{refused}");
    }
}

#[cfg(test)]
mod storage_tests {
    use super::*;
    use crate::session::FileError;

    #[test]
    fn a_full_disk_says_it_is_a_storage_failure() {
        let full: ServeError = SessionStoreError::File(FileError::Io {
            path: "/sessions/a.k3s".into(),
            error: std::io::Error::from_raw_os_error(libc::ENOSPC),
        })
        .into();
        let text = full.to_string();
        assert!(text.starts_with(STORAGE_FAILED), "{text}");
        assert!(!full.is_refusal(), "a storage failure is the daemon's");
        match &full {
            ServeError::Session(s) => assert!(s.is_out_of_space()),
            other => panic!("{other}"),
        }
        let refused: ServeError = SessionStoreError::NotFound("a".into()).into();
        assert!(!refused.to_string().starts_with(STORAGE_FAILED));
    }
}
