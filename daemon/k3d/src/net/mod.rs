//! What both transports share below them: the daemon's Unix socket and systemd socket
//! activation (`listener`), the accept loops (`accept`), the connection gate every connection
//! passes (`gate`: per-peer cap, handshake deadline; `docs/connections.md`) and what a refused
//! connection is told (`refusal`). It knows sockets, connections and their first bytes, never
//! an API: it imports neither `grpc` nor `http` (the HTTP/1.1 refusal's words are handed in).

pub mod accept;
mod bind_error;
pub mod gate;
pub mod listener;
mod peer_uid;
mod refusal;

pub use bind_error::tcp as bind_tcp_error;
pub use listener::{SocketSpec, bind as bind_socket};
pub use peer_uid::loopback_peer_uid;
pub use refusal::Http1Refusal;
