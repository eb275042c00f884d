//! How `k3` fails: one message on stderr saying what to do, and an exit code scripts can test.
//!
//! Exit codes:
//! * 0 — success, also when whoever reads stdout stopped reading (`k3 run … | head`);
//! * 1 — anything not below;
//! * 2 — bad command line or input;
//! * 3 — the daemon is not running (nothing listens on the socket);
//! * 4 — permission denied on the socket (not in the socket's group);
//! * 5 — the daemon is busy (its queue is full) or shutting down: retry later;
//! * 6 — the daemon refused the request as invalid (its message says why);
//! * 7 — the model failed (or failed to load): the daemon's message says why;
//! * 8 — a session was refused: not found, owned by another user, in use by another request,
//!   or its file is damaged or made for another model (the message names the file and field);
//! * 130 — the generation was cancelled: Ctrl-C, or by the daemon (a Cancel call of its owner or
//!   root, or shutdown), which `k3` then says.

use tonic::{Code as Grpc, Status};

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
        match s.code() {
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
