//! What a connection refused by the [`super::gate::Gate`] (its peer holds its cap) is told
//! before it is closed, in its own protocol, so the client can say why instead of reporting
//! a bare "transport error":
//!
//! * **gRPC** (HTTP/2): the server's connection preface (an empty SETTINGS frame) and a GOAWAY
//!   with last stream 0 and error code ENHANCE_YOUR_CALM (RFC 9113 §6.8, §7), its debug data
//!   the reason in words, sent once the client's first request has arrived (its HEADERS
//!   frame): h2 then fails that request with the GOAWAY, which `k3` reports (exit 5, busy).
//!   Sent any earlier, the client's channel drops the connection before its request and
//!   reports only that it was lost.
//! * **HTTP/1.1**: a whole response written by the HTTP API, which owns its error shape: the
//!   daemon hands the [`Gate`](super::gate::Gate) an [`Http1Refusal`] (a `429 Too Many
//!   Requests` with `retry-after` and an error body in OpenAI's shape, which OpenAI's clients
//!   retry after a pause). This module knows the HTTP/2 frames, not the HTTP API.
//!
//! The words are written by a task of their own, never by the accept loop, with a deadline,
//! and at most [`MAX_IN_FLIGHT`] such tasks live at once: beyond that a refused connection is
//! closed without a word, as before, so a peer hammering the socket cannot turn refusals into
//! held descriptors.

use super::gate::Greeting;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Refusals being written at once, at most.
pub const MAX_IN_FLIGHT: usize = 16;
/// How long a refused HTTP/2 client may take to send its first request, and then any refused
/// connection to take its refusal and close its side.
const DEADLINE: Duration = Duration::from_secs(1);
/// HTTP/2 frame types and the error code used (RFC 9113 §6.5, §6.8, §7).
const FRAME_SETTINGS: u8 = 0x4;
const FRAME_GOAWAY: u8 = 0x7;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// The whole HTTP/1.1 response that tells a client it was refused for `reason`.
pub type Http1Refusal = fn(reason: &str) -> Vec<u8>;

/// The bytes that tell a client of `greeting`'s protocol it was refused for `reason`
/// (`http1` words it for an HTTP/1.1 client).
pub fn words(greeting: Greeting, reason: &str, http1: Http1Refusal) -> Vec<u8> {
    match greeting {
        Greeting::Http2Preface => {
            let mut out = frame_header(0, FRAME_SETTINGS);
            let debug = reason.as_bytes();
            out.extend(frame_header(8 + debug.len(), FRAME_GOAWAY));
            out.extend(0u32.to_be_bytes()); // last stream id: none was processed
            out.extend(ENHANCE_YOUR_CALM.to_be_bytes());
            out.extend(debug);
            out
        }
        Greeting::Http1Head => http1(reason),
    }
}

/// A 9-byte HTTP/2 frame header on stream 0 with no flags.
fn frame_header(length: usize, kind: u8) -> Vec<u8> {
    let mut h = (length as u32).to_be_bytes()[1..].to_vec();
    h.extend([kind, 0, 0, 0, 0, 0]);
    h
}

/// Reads an HTTP/2 client's preface and frames until the header of its first HEADERS frame
/// (a request) has arrived, or the stream ends; at most `LIMIT` bytes.
async fn until_first_request<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<()> {
    const PREFACE: usize = 24;
    const FRAME_HEADERS: u8 = 0x1;
    const LIMIT: usize = 1 << 16;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // Walk the complete frame headers after the preface.
        let mut at = PREFACE;
        while at + 9 <= seen.len() {
            if seen[at + 3] == FRAME_HEADERS {
                return Ok(());
            }
            let length = u32::from_be_bytes([0, seen[at], seen[at + 1], seen[at + 2]]) as usize;
            at += 9 + length;
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 || seen.len() >= LIMIT {
            return Ok(());
        }
        seen.extend_from_slice(&buf[..n]);
    }
}

/// Tells a refused connection `words` (for `greeting`'s protocol) and closes it, on a task of
/// its own; when [`MAX_IN_FLIGHT`] refusals are already in progress the stream is just
/// dropped (closed).
pub fn tell<S>(stream: S, greeting: Greeting, words: Vec<u8>, in_flight: &Arc<AtomicUsize>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    if in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT {
        in_flight.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    let in_flight = Arc::clone(in_flight);
    tokio::spawn(async move {
        let mut stream = stream;
        if let Greeting::Http2Preface = greeting {
            let _ = tokio::time::timeout(DEADLINE, until_first_request(&mut stream)).await;
        }
        let _ = tokio::time::timeout(DEADLINE, async {
            stream.write_all(&words).await?;
            stream.shutdown().await?;
            // Read what the client sent until it closes too: closing a TCP socket with unread
            // bytes resets it, and a reset can discard the refusal before the client reads it.
            let mut sink = [0u8; 4096];
            while stream.read(&mut sink).await? > 0 {}
            Ok::<(), std::io::Error>(())
        })
        .await;
        in_flight.fetch_sub(1, Ordering::AcqRel);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the refused side was told, read until the daemon's side closed.
    async fn until_closed(theirs: &mut tokio::io::DuplexStream) -> Vec<u8> {
        let mut got = Vec::new();
        theirs
            .read_to_end(&mut got)
            .await
            .expect("read until closed");
        got
    }

    #[test]
    fn the_http2_refusal_is_a_settings_frame_then_a_goaway_with_enhance_your_calm() {
        let w = words(Greeting::Http2Preface, "too many", |_| {
            unreachable!("HTTP/2")
        });
        assert_eq!(
            &w[..9],
            &[0, 0, 0, 4, 0, 0, 0, 0, 0],
            "empty SETTINGS on stream 0"
        );
        assert_eq!(
            &w[9..18],
            &[0, 0, 16, 7, 0, 0, 0, 0, 0],
            "GOAWAY of 8 + 8 bytes"
        );
        assert_eq!(&w[18..22], &[0, 0, 0, 0], "last stream id 0");
        assert_eq!(&w[22..26], &[0, 0, 0, 0xb], "ENHANCE_YOUR_CALM");
        assert_eq!(&w[26..], b"too many");
    }

    #[test]
    fn an_http1_refusal_is_the_response_the_http_api_hands_over() {
        let w = words(Greeting::Http1Head, "too many", |reason| {
            format!("HTTP/1.1 429 {reason}").into_bytes()
        });
        assert_eq!(w, b"HTTP/1.1 429 too many");
    }

    #[tokio::test]
    async fn a_refusal_is_written_whole_and_the_connection_closed() {
        let (ours, mut theirs) = tokio::io::duplex(1 << 16);
        let in_flight = Arc::new(AtomicUsize::new(0));
        tell(ours, Greeting::Http1Head, b"refused".to_vec(), &in_flight);
        assert_eq!(until_closed(&mut theirs).await, b"refused");
        drop(theirs);
        for _ in 0..100 {
            if in_flight.load(Ordering::Acquire) == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the refusal task never ended");
    }

    #[tokio::test]
    async fn an_http2_refusal_waits_for_the_clients_first_request() {
        let (ours, mut theirs) = tokio::io::duplex(1 << 16);
        let in_flight = Arc::new(AtomicUsize::new(0));
        tell(
            ours,
            Greeting::Http2Preface,
            b"refused".to_vec(),
            &in_flight,
        );
        // The preface and a SETTINGS frame with one setting: nothing is said yet.
        theirs
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .expect("preface");
        theirs
            .write_all(&[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0xff, 0xff])
            .await
            .expect("settings");
        let mut byte = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(200), theirs.read(&mut byte)).await;
        assert!(
            early.is_err(),
            "the refusal came before the request: {early:?}"
        );
        // A HEADERS frame header on stream 1: now the refusal comes, then the close.
        theirs
            .write_all(&[0, 0, 0, 1, 4, 0, 0, 0, 1])
            .await
            .expect("headers");
        assert_eq!(until_closed(&mut theirs).await, b"refused");
    }

    #[tokio::test]
    async fn beyond_the_in_flight_cap_a_refused_connection_is_closed_without_a_word() {
        let in_flight = Arc::new(AtomicUsize::new(MAX_IN_FLIGHT));
        let (ours, mut theirs) = tokio::io::duplex(1 << 16);
        tell(ours, Greeting::Http1Head, b"refused".to_vec(), &in_flight);
        assert!(until_closed(&mut theirs).await.is_empty());
        assert_eq!(in_flight.load(Ordering::Acquire), MAX_IN_FLIGHT);
    }
}
