//! Who may hold a connection, and for how long without saying anything (issue 19.7: one user
//! could exhaust the daemon's descriptors).
//!
//! Every connection, on the gRPC socket and on each HTTP endpoint, passes one [`Gate`]:
//!
//! * **Per-peer cap**: a peer ([`PeerKey`]: a Unix socket client's uid from SO_PEERCRED; a
//!   TCP client by its address, every loopback address being one peer; a keyed HTTP caller
//!   by its key once its request named it, [`PeerSlot::rekey`]) holds at most `per_peer`
//!   connections across all listeners. One over is refused at once, before any byte is read,
//!   with a log line (at most one per [`REFUSAL_LOG_EVERY`], with a count of those left
//!   unsaid), so the accept loop never waits on it and another peer is still served; a task
//!   of its own tells the client why in its protocol and closes it ([`super::refusal`]).
//! * **Daemon-wide cap**: all peers together hold at most `total` connections, derived from
//!   the descriptor limit less a reserve for the model's shards, sessions and sockets
//!   ([`descriptor_budget`]), so that no number of peers can take the descriptors the daemon
//!   needs to serve the ones it has (issue 35 point 1).
//! * **Handshake deadline**: a connection must send its greeting within `handshake`: the
//!   24-byte HTTP/2 client preface and then its first request's headers on the gRPC socket,
//!   a complete request head on HTTP/1.1.
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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
    /// Connections of all peers together ([`descriptor_budget`]).
    pub total: usize,
    pub handshake: Duration,
}

/// What a connection is counted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerKey {
    Uid(u32),
    /// A Unix socket client whose credentials the kernel did not give: all such share a cap.
    UnknownUid,
    /// Every TCP client on a loopback address (127.0.0.0/8, ::1, their IPv4-mapped forms):
    /// one machine, so one peer, however many aliases it connects from (issue 35 point 1).
    Loopback,
    Ip(IpAddr),
    /// An HTTP caller that named API key N (0-based, in `http_api_keys` order): its
    /// connection counts against the key once its request was authenticated.
    Key(usize),
}

impl PeerKey {
    /// A TCP client by its address: all loopback addresses are one peer.
    pub fn of_ip(ip: IpAddr) -> PeerKey {
        let loopback = match ip {
            IpAddr::V4(v4) => v4.is_loopback(),
            IpAddr::V6(v6) => {
                v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
        };
        if loopback {
            PeerKey::Loopback
        } else {
            PeerKey::Ip(ip)
        }
    }
}

impl fmt::Display for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerKey::Uid(uid) => write!(f, "uid {uid}"),
            PeerKey::UnknownUid => write!(f, "a peer without credentials"),
            PeerKey::Loopback => write!(f, "loopback TCP (every 127.x.x.x and ::1 address)"),
            PeerKey::Ip(ip) => write!(f, "{ip}"),
            PeerKey::Key(index) => write!(f, "API key #{}", index + 1),
        }
    }
}

/// Descriptors kept back from connections for everything else the daemon opens: per shard
/// file two (buffered and direct reads), and this many for session files being read or
/// written, the listening sockets, the runtime's and the logger's own.
pub const DESCRIPTOR_RESERVE: usize = 256;

/// How many connections all peers together may hold when the process may open `limit`
/// descriptors and the checkpoint has `shards` shard files: what is left after
/// [`DESCRIPTOR_RESERVE`] and two per shard, and at least one.
pub fn descriptor_budget(limit: u64, shards: usize) -> usize {
    let reserve = DESCRIPTOR_RESERVE.saturating_add(shards.saturating_mul(2)) as u64;
    usize::try_from(limit.saturating_sub(reserve))
        .unwrap_or(usize::MAX)
        .max(1)
}

/// Raises the soft descriptor limit to the hard one (a daemon serving many users needs more
/// than the usual 1,024, and only the hard limit is the administrator's choice); the limit
/// now in force.
pub fn raise_descriptor_limit() -> std::io::Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(hard.max(soft))
}

/// What a client must send first, which ends its handshake deadline.
#[derive(Debug, Clone, Copy)]
pub enum Greeting {
    /// gRPC: the HTTP/2 client preface, then frames until the first request's headers are
    /// whole (a HEADERS frame, or its last CONTINUATION, flagged END_HEADERS).
    Http2Preface,
    /// HTTP/1.1: a request head, ended by an empty line.
    Http1Head,
}

pub struct Gate {
    limits: ConnectionLimits,
    open: Mutex<Open>,
    /// The next connection's id ([`PeerSlot::id`]).
    next_id: AtomicU64,
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

/// The connections held now: by peer, and in all.
#[derive(Default)]
struct Open {
    by_peer: HashMap<PeerKey, usize>,
    total: usize,
}

impl Open {
    fn held(&self, peer: PeerKey) -> usize {
        self.by_peer.get(&peer).copied().unwrap_or(0)
    }

    fn release(&mut self, peer: PeerKey) {
        if let Some(held) = self.by_peer.get_mut(&peer) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                self.by_peer.remove(&peer);
            }
        }
    }
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
            open: Mutex::new(Open::default()),
            next_id: AtomicU64::new(1),
            quiet: Mutex::new(RateLimit {
                last: None,
                unsaid: 0,
            }),
            refusing: Arc::new(AtomicUsize::new(0)),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        // No panic while holding it; a poisoned count is still consistent.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why `peer` may not hold one more connection now, if so.
    fn over_cap(&self, open: &Open, peer: PeerKey) -> Option<String> {
        if open.held(peer) >= self.limits.per_peer {
            Some(format!(
                "refused a connection from {peer}: it holds {} already \
                 (max_connections_per_peer)",
                self.limits.per_peer
            ))
        } else if open.total >= self.limits.total {
            Some(format!(
                "refused a connection from {peer}: k3d holds {} connections, all its \
                 descriptor limit allows (RLIMIT_NOFILE less a reserve for shards and sessions)",
                self.limits.total
            ))
        } else {
            None
        }
    }

    /// The connection wrapped with its slot and deadline, or [`Refused`] when `peer` already
    /// holds its cap or the daemon all it may hold (for [`Gate::refuse`]).
    pub fn admit<S>(
        self: &Arc<Gate>,
        stream: S,
        peer: PeerKey,
        greeting: Greeting,
    ) -> Result<Guarded<S>, Refused<S>> {
        let refused = {
            let mut open = self.lock();
            let refused = self.over_cap(&open, peer);
            if refused.is_none() {
                *open.by_peer.entry(peer).or_insert(0) += 1;
                open.total += 1;
            }
            refused
        };
        if let Some(reason) = refused {
            self.note(format_args!("{reason}"));
            return Err(Refused { stream, reason });
        }
        Ok(Guarded {
            inner: stream,
            slot: Arc::new(PeerSlot {
                gate: Arc::clone(self),
                peer: Mutex::new(peer),
                id: self.next_id.fetch_add(1, Ordering::Relaxed),
            }),
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

    /// Connections held now by `peer`, and by all.
    #[cfg(test)]
    fn held(&self, peer: PeerKey) -> (usize, usize) {
        let open = self.lock();
        (open.held(peer), open.total)
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

/// One connection's place in its peer's count and in the daemon's, given back when the
/// connection is dropped. The HTTP API holds it too, to count a keyed caller's connection
/// against its key ([`PeerSlot::rekey`]).
pub struct PeerSlot {
    gate: Arc<Gate>,
    /// Whom the connection counts against now.
    peer: Mutex<PeerKey>,
    id: u64,
}

impl PeerSlot {
    /// This connection's number, unique for the daemon's life.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whom the connection counts against now.
    pub fn peer(&self) -> PeerKey {
        *self.peer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts the connection against `to` from now on (an HTTP caller that named an API
    /// key: one peer per key, whatever address it comes from), or says why not: `to` holds
    /// its cap already (the refusal's words, logged like every refusal).
    pub fn rekey(&self, to: PeerKey) -> Result<(), String> {
        let mut open = self.gate.lock();
        let mut peer = self.peer.lock().unwrap_or_else(|p| p.into_inner());
        if *peer == to {
            return Ok(());
        }
        if open.held(to) >= self.gate.limits.per_peer {
            drop((peer, open));
            let reason = format!(
                "refused a request from {to}: it holds {} connections already \
                 (max_connections_per_peer)",
                self.gate.limits.per_peer
            );
            self.gate.note(format_args!("{reason}"));
            return Err(reason);
        }
        open.release(*peer);
        *open.by_peer.entry(to).or_insert(0) += 1;
        *peer = to;
        Ok(())
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let peer = self.peer();
        let mut open = self.gate.lock();
        open.release(peer);
        open.total = open.total.saturating_sub(1);
    }
}

/// An HTTP/2 frame's header: 24-bit length, type, flags, stream id (RFC 9113 §4.1).
const FRAME_HEADER_LEN: usize = 9;
/// The frame types that carry a request's header block (RFC 9113 §6.2, §6.10).
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
/// The flag on the frame that ends a header block.
const END_HEADERS: u8 = 0x4;

/// Where a connection is in its greeting.
enum GreetingProgress {
    /// Preface bytes still to come.
    Preface { left: usize },
    /// After the preface, the frames before the first request's headers are whole (SETTINGS,
    /// WINDOW_UPDATE, the HEADERS frame itself): `header` holds `got` bytes of the current
    /// frame's header, then `payload` bytes of its payload are still to come, and `ends`
    /// says whether the frame ends the first header block (issue 45.5: a HEADERS frame
    /// trickled a byte a second after the preface held its connection forever).
    Frames {
        header: [u8; FRAME_HEADER_LEN],
        got: usize,
        payload: usize,
        ends: bool,
    },
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
                let taken = (*left).min(bytes.len());
                *left -= taken;
                if *left > 0 {
                    return false;
                }
                *self = GreetingProgress::Frames {
                    header: [0; FRAME_HEADER_LEN],
                    got: 0,
                    payload: 0,
                    ends: false,
                };
                self.read(&bytes[taken..])
            }
            GreetingProgress::Frames {
                header,
                got,
                payload,
                ends,
            } => {
                let mut rest = bytes;
                loop {
                    if *got < FRAME_HEADER_LEN {
                        let taken = (FRAME_HEADER_LEN - *got).min(rest.len());
                        header[*got..*got + taken].copy_from_slice(&rest[..taken]);
                        *got += taken;
                        rest = &rest[taken..];
                        if *got < FRAME_HEADER_LEN {
                            return false;
                        }
                        *payload = usize::from(header[0]) << 16
                            | usize::from(header[1]) << 8
                            | usize::from(header[2]);
                        let (kind, flags) = (header[3], header[4]);
                        *ends = matches!(kind, HEADERS | CONTINUATION) && flags & END_HEADERS != 0;
                    }
                    let taken = (*payload).min(rest.len());
                    *payload -= taken;
                    rest = &rest[taken..];
                    if *payload > 0 {
                        return false;
                    }
                    if *ends {
                        return true;
                    }
                    *got = 0;
                    if rest.is_empty() {
                        return false;
                    }
                }
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
    slot: Arc<PeerSlot>,
    /// `None` once the greeting arrived.
    handshake: Option<Handshake>,
}

impl<S> Guarded<S> {
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The connection's place in the counts.
    pub fn slot(&self) -> &Arc<PeerSlot> {
        &self.slot
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
                    this.slot.peer(),
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

    /// A frame's header: `len` bytes of payload, `kind`, `flags`, on stream 1.
    fn frame(len: usize, kind: u8, flags: u8) -> Vec<u8> {
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend([0, 0, 0, 1]);
        f.extend(std::iter::repeat_n(0xAB, len));
        f
    }

    #[test]
    fn the_http2_greeting_ends_with_the_first_requests_headers_however_split() {
        const SETTINGS: u8 = 0x4;
        const WINDOW_UPDATE: u8 = 0x8;
        let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        wire.extend(frame(0, SETTINGS, 0));
        wire.extend(frame(4, WINDOW_UPDATE, 0));
        // A header block in a HEADERS frame without END_HEADERS and a CONTINUATION with it.
        wire.extend(frame(20, HEADERS, 0));
        wire.extend(frame(3, CONTINUATION, END_HEADERS));
        for split in [1, 2, 7, 24, 33, wire.len()] {
            let mut p = GreetingProgress::new(Greeting::Http2Preface);
            let chunks: Vec<&[u8]> = wire.chunks(split).collect();
            let (last, before) = chunks.split_last().expect("chunks");
            for c in before {
                assert!(!p.read(c), "done before the last byte (chunks of {split})");
            }
            assert!(p.read(last), "done at the last byte (chunks of {split})");
        }
        // The preface alone, or a HEADERS frame short of its last byte, is not the greeting.
        let mut p = GreetingProgress::new(Greeting::Http2Preface);
        assert!(!p.read(&wire[..24]));
        let headers = frame(5, HEADERS, END_HEADERS);
        assert!(!p.read(&headers[..headers.len() - 1]));
        assert!(p.read(&headers[headers.len() - 1..]));
    }

    fn gate(per_peer: usize, total: usize) -> Arc<Gate> {
        Gate::new(
            ConnectionLimits {
                per_peer,
                total,
                handshake: DEFAULT_HANDSHAKE,
            },
            |_| Vec::new(),
        )
    }

    #[tokio::test]
    async fn a_peer_over_its_cap_is_refused_and_its_slot_comes_back() {
        let gate = gate(2, 100);
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

    /// Issue 35 point 1: loopback aliases are one peer, IPv4-mapped ones included.
    #[test]
    fn every_loopback_address_is_one_peer() {
        for ip in [
            "127.0.0.1",
            "127.0.0.2",
            "127.255.0.18",
            "::1",
            "::ffff:127.0.0.9",
        ] {
            let ip: IpAddr = ip.parse().expect("an address");
            assert_eq!(PeerKey::of_ip(ip), PeerKey::Loopback, "{ip}");
        }
        let lan: IpAddr = "192.168.1.5".parse().expect("an address");
        assert_eq!(PeerKey::of_ip(lan), PeerKey::Ip(lan));
    }

    /// The daemon-wide cap refuses whoever comes once it is reached, whatever the peer.
    #[tokio::test]
    async fn the_daemon_wide_cap_holds_across_peers() {
        let gate = gate(2, 3);
        let held: Vec<_> = (0..3)
            .map(|uid| gate.admit((), PeerKey::Uid(uid), Greeting::Http1Head))
            .collect();
        assert!(held.iter().all(Result::is_ok));
        let refused = gate
            .admit((), PeerKey::Uid(9), Greeting::Http1Head)
            .err()
            .expect("over the daemon's cap");
        assert!(
            refused.reason.contains("RLIMIT_NOFILE"),
            "{}",
            refused.reason
        );
        drop(held);
        assert_eq!(gate.held(PeerKey::Uid(0)), (0, 0));
    }

    /// A keyed caller's connection moves from its address's count to its key's; a key at its
    /// cap refuses the move and the connection stays where it was.
    #[tokio::test]
    async fn a_connection_counts_against_its_key_once_named() {
        let gate = gate(2, 100);
        let conns: Vec<_> = (0..3)
            .map(|_| gate.admit((), PeerKey::Loopback, Greeting::Http1Head))
            .collect();
        assert!(conns[2].is_err(), "loopback holds its cap");
        let first = conns[0].as_ref().ok().expect("admitted").slot();
        first.rekey(PeerKey::Key(0)).expect("moved to its key");
        assert_eq!(gate.held(PeerKey::Loopback), (1, 2));
        assert!(
            gate.admit((), PeerKey::Loopback, Greeting::Http1Head)
                .is_ok(),
            "the address's slot came back"
        );
        let second = conns[1].as_ref().ok().expect("admitted").slot();
        second.rekey(PeerKey::Key(0)).expect("a second on the key");
        let third = gate
            .admit(
                (),
                PeerKey::Ip("10.0.0.2".parse().expect("ip")),
                Greeting::Http1Head,
            )
            .ok()
            .expect("admitted");
        let refused = third
            .slot()
            .rekey(PeerKey::Key(0))
            .expect_err("key at its cap");
        assert!(refused.contains("API key #1"), "{refused}");
        assert_eq!(gate.held(PeerKey::Key(0)).0, 2);
    }
}
