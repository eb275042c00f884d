//! The HTTP/1.1 connection loop under every `--http` endpoint: each accepted connection passes
//! the daemon's connection gate (`net::gate`: per-peer and daemon-wide caps, the first head's
//! deadline) and is then served by hyper with a timer, so that every later request head has
//! a deadline too (issue 35 point 1).
//!
//! hyper's `header_read_timeout` starts when a connection waits for a request head — right
//! after the previous response ended — and ends when the head is complete: one timer is both
//! the idle timeout of a kept-alive connection and the deadline of each head after the first
//! (`--idle-timeout`). `axum::serve` configures no timer, so an idle kept-alive connection
//! could be held forever; hence this loop instead of it. A response being written (a long
//! SSE stream) is not idle: hyper reads no head until it ends.

use super::listen::Peer;
use crate::net::accept::{Accepting, BACKOFF, Listen};
use crate::net::gate::{Gate, Greeting, Guarded, PeerKey, PeerSlot};
use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_stream::StreamExt;
use tower::ServiceExt;

/// The connection a request came on (a request extension): its place in the gate's counts,
/// which an API key moves to the key's count.
#[derive(Clone)]
pub struct Connection(pub Arc<PeerSlot>);

/// Who is on the other end, by the kind of socket and what the gate counted the connection
/// by at accept (`key`: a Unix peer's uid, a loopback TCP peer's socket owner, if named).
pub trait HttpPeer {
    fn http_peer(key: PeerKey) -> Peer;
}

fn named_uid(key: PeerKey) -> Option<u32> {
    match key {
        PeerKey::Uid(uid) => Some(uid),
        _ => None,
    }
}

impl HttpPeer for tokio::net::UnixStream {
    fn http_peer(key: PeerKey) -> Peer {
        Peer::Unix {
            uid: named_uid(key),
        }
    }
}

impl HttpPeer for tokio::net::TcpStream {
    fn http_peer(key: PeerKey) -> Peer {
        Peer::Tcp {
            uid: named_uid(key),
        }
    }
}

/// Serves `router` on `listener` until `stop` turns true, then stops accepting and lets the
/// open connections finish (idle ones close at once; the serve core cancels responses the
/// shutdown grace does not allow).
pub async fn serve_on<L>(
    listener: L,
    gate: Arc<Gate>,
    router: Router,
    idle_timeout: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()>
where
    L: Listen + Unpin + Send + 'static,
    L::Io: AsyncRead + AsyncWrite + HttpPeer + Unpin + Send + 'static,
{
    let mut accepting = Accepting::new(listener, gate, Greeting::Http1Head);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(idle_timeout)
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    let stopped = async move {
        // The guard `wait_for` returns is not Send: dropped here, not held by the loop.
        let _ = stop.wait_for(|s| *s).await;
    };
    tokio::pin!(stopped);
    loop {
        let io: Guarded<L::Io> = tokio::select! {
            next = accepting.next() => match next {
                Some(Ok(io)) => io,
                // A connection that failed between the kernel's accept and ours
                // (ECONNABORTED...); running out of descriptors already paused in `Accepting`.
                Some(Err(e)) => {
                    tracing::warn!("HTTP: accepting a connection: {e}");
                    tokio::time::sleep(BACKOFF).await;
                    continue;
                }
                // The listener's stream never ends: it would only end with the socket.
                None => break,
            },
            () = &mut stopped => break,
        };
        let peer = L::Io::http_peer(io.slot().peer());
        let connection = Connection(Arc::clone(io.slot()));
        let service = router
            .clone()
            .map_request(move |request: hyper::Request<Incoming>| {
                let mut request = request.map(Body::new);
                request.extensions_mut().insert(ConnectInfo(peer));
                request.extensions_mut().insert(connection.clone());
                request
            });
        let served = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
        let served = graceful.watch(served);
        tokio::spawn(async move {
            // A peer that misbehaves (a head past its deadline, garbage) is closed by hyper
            // with the reason; nothing to add but a trace.
            if let Err(e) = served.await {
                tracing::debug!("HTTP connection ended: {e}");
            }
        });
    }
    drop(accepting);
    graceful.shutdown().await;
    Ok(())
}
