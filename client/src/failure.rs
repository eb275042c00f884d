//! How `k3` fails: one message on stderr saying what to do, and an exit code scripts can test.
//!
//! Exit codes:
//! * 0 — success, also when whoever reads stdout stopped reading (`k3 run … | head`);
//! * 1 — anything not below;
//! * 2 — bad command line or input;
//! * 3 — the daemon is not running (nothing listens on the socket);
//! * 4 — permission denied on the socket (not in the socket's group);
//! * 5 — the daemon is busy (its queue is full), shutting down, or refused the connection
//!   because this user already holds as many as it allows one peer: retry later;
//! * 6 — the daemon refused the request as invalid (its message says why);
//! * 7 — the model failed (or failed to load): the daemon's message says why;
//! * 8 — a session was refused: not found, owned by another user, in use by another request,
//!   or its file is damaged or made for another model (the message names the file and field);
//! * 10 — the daemon's session storage failed (its disk is full, or unwritable): the session's
//!   new state was not written; the model is fine;
//! * 9 — the connection to k3d failed mid-request (a transport error: the daemon died, or
//!   the HTTP/2 connection was torn down); the output is cut short; nothing was refused;
//! * 130 — the generation was cancelled: Ctrl-C, or by the daemon (a Cancel call of its owner or
//!   root, or shutdown), which `k3` then says.

use tonic::{Code as Grpc, Status};

/// How the daemon begins a session storage failure's message (`k3_engine::serve::STORAGE_FAILED`;
/// the client does not link the engine).
const STORAGE_FAILED: &str = "k3d could not store the session";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// stdout was closed by its reader: stop quietly, as standard tools do.
    OutputClosed = 0,
    Other = 1,
    Usage = 2,
    NotRunning = 3,
    Permission = 4,
    Busy = 5,
    Invalid = 6,
    Model = 7,
    Session = 8,
    Transport = 9,
    Storage = 10,
    Cancelled = 130,
}

#[derive(Debug)]
pub struct Failure {
    pub code: Code,
    pub message: String,
}

impl Failure {
    pub fn new(code: Code, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// A failure already reported to the user where it happened: only the exit code is left.
    pub fn said(code: Code) -> Failure {
        Failure::new(code, "")
    }

    pub fn usage(message: impl Into<String>) -> Failure {
        Failure::new(Code::Usage, message)
    }

    /// A failed write to stdout; a closed pipe is not an error of ours.
    pub fn output(e: std::io::Error) -> Failure {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Failure::new(Code::OutputClosed, "stdout closed")
        } else {
            Failure::new(Code::Other, format!("writing the output: {e}"))
        }
    }
}

impl From<Status> for Failure {
    fn from(s: Status) -> Failure {
        let msg = s.message();
        // A status the daemon sent arrives as headers and carries no error source; one made
        // here from a failed connection (an h2 GOAWAY, a reset, EOF) does. Its code is
        // tonic's guess from the HTTP/2 reason (ENHANCE_YOUR_CALM reads RESOURCE_EXHAUSTED),
        // not a refusal by k3d — except the GOAWAY k3d sends a connection over its peer's cap
        // ([`refused_connection`]; h2's own flood guard, by contrast, is not the remote's).
        if let Some(source) = std::error::Error::source(&s) {
            if let Some(refused) = refused_connection(source) {
                return refused;
            }
            return Failure::new(
                Code::Transport,
                format!(
                    "the connection to k3d failed mid-request ({source}); any output is cut short"
                ),
            );
        }
        match s.code() {
            // Before the codes: a full disk comes as RESOURCE_EXHAUSTED, another storage
            // failure as INTERNAL; neither is a busy daemon nor a failing model.
            _ if msg.starts_with(STORAGE_FAILED) => Failure::new(
                Code::Storage,
                format!(
                    "{msg}\nThe daemon's session directory needs room (or repair); the model is fine."
                ),
            ),
            Grpc::PermissionDenied if msg.starts_with("session") => Failure::new(
                Code::Session,
                format!("{msg}: it is another user's; pick another session name"),
            ),
            Grpc::Aborted if msg.starts_with("session") => Failure::new(Code::Session, msg),
            Grpc::NotFound if msg.starts_with("no session") => Failure::new(
                Code::Session,
                format!("{msg} (`k3 sessions list` shows yours)"),
            ),
            Grpc::FailedPrecondition if msg.starts_with("session") => {
                Failure::new(Code::Session, msg)
            }
            Grpc::ResourceExhausted if msg.contains("k3d is busy") => Failure::new(
                Code::Busy,
                format!("{msg}\nRetry in a little while (`k3 status` shows the queue)."),
            ),
            // Other size limits (a message over the gRPC limit) are the request's fault.
            Grpc::ResourceExhausted | Grpc::OutOfRange | Grpc::InvalidArgument => {
                Failure::new(Code::Invalid, format!("k3d refused the request: {msg}"))
            }
            Grpc::Unavailable if msg.contains("failed to load") => {
                Failure::new(Code::Model, format!("k3d cannot generate: {msg}"))
            }
            Grpc::Unavailable => Failure::new(
                Code::Busy,
                format!("k3d is unavailable: {msg}\nRetry once it is up (`k3 status`)."),
            ),
            Grpc::Internal | Grpc::FailedPrecondition | Grpc::DataLoss => {
                Failure::new(Code::Model, format!("the model failed: {msg}"))
            }
            // Not ours (our own Ctrl-C is reported as it happens): say who and why.
            Grpc::Cancelled => {
                Failure::new(Code::Cancelled, format!("k3d cancelled the request: {msg}"))
            }
            Grpc::NotFound => Failure::new(Code::Invalid, msg.to_string()),
            _ => Failure::new(Code::Other, format!("k3d: {:?}: {msg}", s.code())),
        }
    }
}

/// The daemon's connection gate refused this connection — its peer (this user) holds as many
/// as `max_connections_per_peer` allows — if `e` or one of its sources is the HTTP/2 GOAWAY
/// with ENHANCE_YOUR_CALM that k3d sends then (its debug data says the same in words).
pub fn refused_connection(e: &(dyn std::error::Error + 'static)) -> Option<Failure> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(h2) = e.downcast_ref::<h2::Error>()
            && h2.is_go_away()
            && h2.is_remote()
            && h2.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM)
        {
            return Some(Failure::new(
                Code::Busy,
                "k3d refused the connection: this user already holds as many connections as it \
                 allows one peer (max_connections_per_peer in its configuration).\n\
                 Close other k3 clients or editor sessions, or retry in a little while.",
            ));
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_down_connection_is_a_transport_failure_not_a_refusal() {
        // What h2 reports when its frame budget runs out: tonic reads it RESOURCE_EXHAUSTED.
        let calm = Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection error received: too_many_data_frames",
        )));
        let f = Failure::from(calm);
        assert_eq!(f.code, Code::Transport, "{}", f.message);
        assert!(f.message.contains("too_many_data_frames"), "{}", f.message);
        assert!(!f.message.contains("refused"), "{}", f.message);
    }

    #[test]
    fn a_full_disk_is_a_storage_failure_not_the_model() {
        let full = Status::resource_exhausted(
            "k3d could not store the session: session file /s/a.k3s: No space left on device (os error 28)",
        );
        let f = Failure::from(full);
        assert_eq!(f.code, Code::Storage, "{}", f.message);
        assert!(!f.message.contains("model failed"), "{}", f.message);
        let other = Status::internal("k3d could not store the session: session directory /s: EIO");
        assert_eq!(Failure::from(other).code, Code::Storage);
    }

    #[test]
    fn statuses_the_daemon_sent_keep_their_meaning() {
        let f = Failure::from(Status::resource_exhausted(
            "k3d is busy: 4 requests running",
        ));
        assert_eq!(f.code, Code::Busy);
        let f = Failure::from(Status::invalid_argument("the prompt is empty"));
        assert_eq!(f.code, Code::Invalid);
        assert!(f.message.contains("refused"), "{}", f.message);
    }
}
