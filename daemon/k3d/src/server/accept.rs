//! The accept loop's connections, with a pause when the process is out of descriptors.
//!
//! tonic retries a failed accept at once. With the descriptor table full (EMFILE) the pending
//! connection stays in the backlog, so every retry fails the same way: the loop spun at ~60%
//! of a core and starved the runtime. Here such a failure waits [`BACKOFF`] before the next
//! accept (connections closing meanwhile free descriptors), says so once per episode, and
//! never reaches tonic.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};
use tokio::time::Sleep;
use tokio_stream::Stream;

/// How long to wait after an accept failed for want of descriptors or memory.
pub const BACKOFF: Duration = Duration::from_millis(100);

pub struct Accepting {
    listener: UnixListener,
    /// Set while backing off.
    pause: Option<Pin<Box<Sleep>>>,
    /// An accept failed for want of resources and none has succeeded since.
    exhausted: bool,
}

impl Accepting {
    pub fn new(listener: UnixListener) -> Accepting {
        Accepting {
            listener,
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

impl Stream for Accepting {
    type Item = io::Result<UnixStream>;

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
                Poll::Ready(Ok((stream, _))) => {
                    if std::mem::take(&mut self.exhausted) {
                        log!("accepting connections again");
                    }
                    return Poll::Ready(Some(Ok(stream)));
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
