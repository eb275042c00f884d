//! The accept loops' connections (gRPC socket and HTTP endpoints): each passes the connection
//! [`Gate`] (per-peer cap, handshake deadline), with a pause when the process is out of
//! descriptors.
//!
//! tonic retries a failed accept at once. With the descriptor table full (EMFILE) the pending
//! connection stays in the backlog, so every retry fails the same way: the loop spun at ~60%
//! of a core and starved the runtime. Here such a failure waits [`BACKOFF`] before the next
//! accept (connections closing meanwhile free descriptors), says so once per episode, and
//! never reaches tonic.

use super::gate::{Gate, Greeting, Guarded, PeerKey};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::time::Sleep;
use tokio_stream::Stream;

/// How long to wait after an accept failed for want of descriptors or memory.
pub const BACKOFF: Duration = Duration::from_millis(100);

/// A listening socket whose connections are counted by peer.
pub trait Listen {
    type Io;
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Io>>;
    fn peer(io: &Self::Io) -> PeerKey;
}

impl Listen for UnixListener {
    type Io = UnixStream;

    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<UnixStream>> {
        UnixListener::poll_accept(self, cx).map_ok(|(stream, _)| stream)
    }

    fn peer(io: &UnixStream) -> PeerKey {
        io.peer_cred()
            .map_or(PeerKey::UnknownUid, |c| PeerKey::Uid(c.uid()))
    }
}

impl Listen for TcpListener {
    type Io = TcpStream;

    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<TcpStream>> {
        TcpListener::poll_accept(self, cx).map_ok(|(stream, _)| stream)
    }

    /// A loopback client by the account owning its socket when the kernel's socket table
    /// names it ([`super::loopback_peer_uid`]: the same count as that account's Unix
    /// connections, so one user's aliases never take another's share), else by address.
    fn peer(io: &TcpStream) -> PeerKey {
        // A TCP connection always has a peer address; one torn down meanwhile is counted with
        // the unidentified, and its first read fails anyway.
        match (io.local_addr(), io.peer_addr()) {
            (Ok(local), Ok(peer)) => super::loopback_peer_uid(local, peer)
                .map_or_else(|| PeerKey::of_ip(peer.ip()), PeerKey::Uid),
            _ => PeerKey::UnknownUid,
        }
    }
}

pub struct Accepting<L> {
    listener: L,
    gate: Arc<Gate>,
    greeting: Greeting,
    /// Set while backing off.
    pause: Option<Pin<Box<Sleep>>>,
    /// An accept failed for want of resources and none has succeeded since.
    exhausted: bool,
}

impl<L: Listen> Accepting<L> {
    pub fn new(listener: L, gate: Arc<Gate>, greeting: Greeting) -> Accepting<L> {
        Accepting {
            listener,
            gate,
            greeting,
            pause: None,
            exhausted: false,
        }
    }
}

/// Failures that retrying at once cannot cure: the process or system is out of descriptors,
/// or the kernel out of buffer memory.
fn out_of_resources(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

impl<L> Stream for Accepting<L>
where
    L: Listen + Unpin,
    L::Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Item = io::Result<Guarded<L::Io>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(pause) = self.pause.as_mut() {
                if pause.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.pause = None;
            }
            match self.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(stream)) => {
                    if std::mem::take(&mut self.exhausted) {
                        log!("accepting connections again");
                    }
                    let peer = L::peer(&stream);
                    // Over its peer's cap the stream is handed to a task that says why and
                    // closes it, and the loop goes on to the next connection without waiting.
                    match self.gate.admit(stream, peer, self.greeting) {
                        Ok(admitted) => return Poll::Ready(Some(Ok(admitted))),
                        Err(refused) => self.gate.refuse(refused, self.greeting),
                    }
                }
                Poll::Ready(Err(e)) if out_of_resources(&e) => {
                    if !std::mem::replace(&mut self.exhausted, true) {
                        log_warn!(
                            "cannot accept connections: {e}; retrying every {} ms",
                            BACKOFF.as_millis()
                        );
                    }
                    self.pause = Some(Box::pin(tokio::time::sleep(BACKOFF)));
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(e))),
            }
        }
    }
}
