//! Who may hold a connection, and for how long without saying anything (issue 19.7: one user
//! could exhaust the daemon's descriptors).
//!
//! Every connection, on the gRPC socket and on each HTTP endpoint, passes one [`Gate`]:
//!
//! * **Per-peer cap**: a peer (a Unix socket client's uid from SO_PEERCRED, a TCP client's IP
//!   address) holds at most `per_peer` connections across all listeners. One over is refused
//!   at once, before any byte is read, with a log line (at most one per [`REFUSAL_LOG_EVERY`],
//!   with a count of those left unsaid), so the accept loop never waits on it and another peer
//!   is still served; a task of its own tells the client why in its protocol and closes it
//!   ([`super::refusal`]).
//! * **Handshake deadline**: a connection must send its greeting within `handshake`: the
//!   24-byte HTTP/2 client preface on the gRPC socket, a complete request head on HTTP/1.1.
//!   Until then it holds a descriptor and a task for nothing; past it the next read fails
//!   (`TimedOut`), so hyper closes the connection. After the greeting no deadline applies: a
//!   stream whose reader is paused (Ctrl-Z) or a `k3 chat` waiting for its user's next line is
//!   legitimate, and bounded by the cap instead.
//!
//! hyper's own `header_read_timeout` covers only HTTP/1 and needs a timer that `axum::serve`
//! does not configure; tonic offers no preface deadline. Hence a wrapper around the stream.

use super::refusal::Http1Refusal;
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// Connections one peer may hold when the configuration does not say
/// (`max_connections_per_peer`): far above what one person's clients use (a `k3` command
/// holds one), far below a process's usual 1,024 descriptors.
pub const DEFAULT_PER_PEER: usize = 64;
/// How long a new connection may take to send its greeting (`handshake_timeout`).
pub const DEFAULT_HANDSHAKE: Duration = Duration::from_secs(10);
/// At most one refusal or timeout line per this interval: a peer hammering the socket must not
/// fill the journal.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(5);

/// The HTTP/2 client connection preface (RFC 9113 §3.4): "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".
const HTTP2_PREFACE_LEN: usize = 24;

#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub per_peer: usize,
    pub handshake: Duration,
}

/// What a connection is counted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerKey {
    Uid(u32),
    /// A Unix socket client whose credentials the kernel did not give: all such share a cap.
    UnknownUid,
    Ip(IpAddr),
}

impl fmt::Display for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerKey::Uid(uid) => write!(f, "uid {uid}"),
            PeerKey::UnknownUid => write!(f, "a peer without credentials"),
            PeerKey::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// What a client must send first, which ends its handshake deadline.
#[derive(Debug, Clone, Copy)]
pub enum Greeting {
    /// gRPC: the HTTP/2 client preface.
    Http2Preface,
    /// HTTP/1.1: a request head, ended by an empty line.
    Http1Head,
}

pub struct Gate {
    limits: ConnectionLimits,
    open: Mutex<HashMap<PeerKey, usize>>,
    quiet: Mutex<RateLimit>,
    /// Refusals being written ([`super::refusal::tell`]).
    refusing: Arc<AtomicUsize>,
    /// How a refused HTTP/1.1 client is told (the HTTP API's error shape).
    http1_refusal: Http1Refusal,
}

/// A connection over its peer's cap, and why, in words for the client.
pub struct Refused<S> {
    pub stream: S,
    pub reason: String,
}

/// When the last line was logged and how many were left unsaid since.
struct RateLimit {
    last: Option<Instant>,
    unsaid: u64,
}

impl Gate {
    pub fn new(limits: ConnectionLimits, http1_refusal: Http1Refusal) -> Arc<Gate> {
        Arc::new(Gate {
            limits,
            http1_refusal,
            open: Mutex::new(HashMap::new()),
            quiet: Mutex::new(RateLimit {
                last: None,
                unsaid: 0,
            }),
            refusing: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The connection wrapped with its slot and deadline, or [`Refused`] when `peer` already
    /// holds its cap (for [`Gate::refuse`]).
    pub fn admit<S>(
        self: &Arc<Gate>,
        stream: S,
        peer: PeerKey,
        greeting: Greeting,
    ) -> Result<Guarded<S>, Refused<S>> {
        let admitted = {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            let held = open.entry(peer).or_insert(0);
            let room = *held < self.limits.per_peer;
            if room {
                *held += 1;
            }
            room
        };
        if !admitted {
            let reason = format!(
                "refused a connection from {peer}: it holds {} already \
                 (max_connections_per_peer)",
                self.limits.per_peer
            );
            self.note(format_args!("{reason}"));
            return Err(Refused { stream, reason });
        }
        Ok(Guarded {
            inner: stream,
            slot: PeerSlot {
                gate: Arc::clone(self),
                peer,
            },
            handshake: Some(Handshake {
                deadline: Box::pin(tokio::time::sleep(self.limits.handshake)),
                greeting: GreetingProgress::new(greeting),
                expired: false,
            }),
        })
    }

    /// Tells a refused connection why, in `greeting`'s protocol, and closes it.
    pub fn refuse<S>(&self, refused: Refused<S>, greeting: Greeting)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let words = super::refusal::words(
            greeting,
            &format!("k3d {}", refused.reason),
            self.http1_refusal,
        );
        super::refusal::tell(refused.stream, greeting, words, &self.refusing);
    }

    fn release(&self, peer: PeerKey) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(held) = open.get_mut(&peer) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                open.remove(&peer);
            }
        }
    }

    /// Logs `line` unless one was logged within [`REFUSAL_LOG_EVERY`].
    fn note(&self, line: fmt::Arguments<'_>) {
        let mut quiet = self.quiet.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if quiet
            .last
            .is_some_and(|last| now.duration_since(last) < REFUSAL_LOG_EVERY)
        {
            quiet.unsaid += 1;
            return;
        }
        match std::mem::take(&mut quiet.unsaid) {
            0 => log_warn!("{line}"),
            n => log_warn!("{line} ({n} more refused or timed out since the last such line)"),
        }
        quiet.last = Some(now);
    }
}

/// One connection's place in its peer's count, given back when the connection is dropped.
struct PeerSlot {
    gate: Arc<Gate>,
    peer: PeerKey,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        self.gate.release(self.peer);
    }
}

/// Where a connection is in its greeting.
enum GreetingProgress {
    /// Preface bytes still to come.
    Preface { left: usize },
    /// Whether the bytes read so far end with a line ending (`\n`, any `\r` after it aside): a
    /// second one ends the head. Counts `\r\n\r\n` and the bare `\n\n` hyper also accepts.
    Head { after_line_end: bool },
}

impl GreetingProgress {
    fn new(greeting: Greeting) -> GreetingProgress {
        match greeting {
            Greeting::Http2Preface => GreetingProgress::Preface {
                left: HTTP2_PREFACE_LEN,
            },
            Greeting::Http1Head => GreetingProgress::Head {
                after_line_end: false,
            },
        }
    }

    /// Takes in bytes the client sent; true once the greeting is complete.
    fn read(&mut self, bytes: &[u8]) -> bool {
        match self {
            GreetingProgress::Preface { left } => {
                *left = left.saturating_sub(bytes.len());
                *left == 0
            }
            GreetingProgress::Head { after_line_end } => {
                for &b in bytes {
                    match b {
                        b'\n' if *after_line_end => return true,
                        b'\n' => *after_line_end = true,
                        b'\r' => {}
                        _ => *after_line_end = false,
                    }
                }
                false
            }
        }
    }
}

struct Handshake {
    deadline: Pin<Box<Sleep>>,
    greeting: GreetingProgress,
    /// The deadline passed (and was logged).
    expired: bool,
}

/// A connection that holds a slot of its peer's cap while it lives and fails its reads once
/// its handshake deadline passes without the greeting.
pub struct Guarded<S> {
    inner: S,
    slot: PeerSlot,
    /// `None` once the greeting arrived.
    handshake: Option<Handshake>,
}

impl<S> Guarded<S> {
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(handshake) = this.handshake.as_mut()
            && handshake.deadline.as_mut().poll(cx).is_ready()
        {
            let limit = this.slot.gate.limits.handshake;
            // Every later read fails the same way; the line is written once.
            if !std::mem::replace(&mut handshake.expired, true) {
                this.slot.gate.note(format_args!(
                    "closed a connection from {}: no greeting within {:.1} s \
                     (handshake_timeout)",
                    this.slot.peer,
                    limit.as_secs_f64()
                ));
            }
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no greeting within {limit:?}"),
            )));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if let Some(handshake) = this.handshake.as_mut()
            && handshake.greeting.read(&buf.filled()[before..])
        {
            this.handshake = None;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// tonic reads the caller's credentials (`UdsConnectInfo`) through this, as on a bare socket.
impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Guarded<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> S::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_ends_at_an_empty_line_however_split() {
        let mut p = GreetingProgress::new(Greeting::Http1Head);
        assert!(!p.read(b"GET / HTTP/1.1\r\nHost: k3d\r"));
        assert!(!p.read(b"\n"));
        assert!(p.read(b"\r\n"));
        let mut bare = GreetingProgress::new(Greeting::Http1Head);
        assert!(bare.read(b"GET / HTTP/1.1\nHost: x\n\n"));
        let mut unfinished = GreetingProgress::new(Greeting::Http1Head);
        assert!(!unfinished.read(b"GET / HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n"));
    }

    #[test]
    fn the_preface_is_done_after_its_24_bytes() {
        let mut p = GreetingProgress::new(Greeting::Http2Preface);
        assert!(!p.read(b"PRI * HTTP/2.0\r\n"));
        assert!(!p.read(b"\r\nSM\r\n\r"));
        assert!(p.read(b"\n\x00\x00"));
    }

    #[tokio::test]
    async fn a_peer_over_its_cap_is_refused_and_its_slot_comes_back() {
        let gate = Gate::new(
            ConnectionLimits {
                per_peer: 2,
                handshake: DEFAULT_HANDSHAKE,
            },
            |_| Vec::new(),
        );
        let a = PeerKey::Uid(1000);
        let first = gate.admit((), a, Greeting::Http2Preface);
        let second = gate.admit((), a, Greeting::Http2Preface);
        assert!(first.is_ok() && second.is_ok());
        assert!(gate.admit((), a, Greeting::Http2Preface).is_err());
        assert!(
            gate.admit((), PeerKey::Uid(1001), Greeting::Http2Preface)
                .is_ok()
        );
        drop(first);
        assert!(gate.admit((), a, Greeting::Http2Preface).is_ok());
    }
}
