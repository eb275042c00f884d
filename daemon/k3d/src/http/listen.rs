//! Where the HTTP API listens: `unix:PATH` (the same access rules as the gRPC socket, and the
//! caller's uid from SO_PEERCRED) or `HOST:PORT` on TCP. A TCP address other than loopback is
//! refused unless API keys are configured: anything on the network could otherwise use the
//! model and read other callers' traffic.

use crate::net::SocketSpec;
use anyhow::Context;
use std::net::SocketAddr;
use std::path::PathBuf;

/// One `--http` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl std::str::FromStr for Endpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Endpoint, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a path (unix:/run/k3d/http.sock)".into());
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        s.parse::<SocketAddr>()
            .map(Endpoint::Tcp)
            .map_err(|_| format!("{s:?}: use unix:PATH or IP:PORT (127.0.0.1:8080, [::1]:8080)"))
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
            Endpoint::Tcp(addr) => write!(f, "http://{addr}"),
        }
    }
}

/// A bound listening socket (bound before any thread starts, like the gRPC socket).
pub enum Bound {
    Unix {
        socket: std::os::unix::net::UnixListener,
        path: PathBuf,
    },
    Tcp(std::net::TcpListener),
}

/// Refuses a TCP endpoint off loopback unless API keys are configured (`has_keys`).
pub fn check_exposure(endpoints: &[Endpoint], has_keys: bool) -> Result<(), String> {
    match endpoints.iter().find_map(|e| match e {
        Endpoint::Tcp(addr) if !addr.ip().is_loopback() => Some(addr),
        _ => None,
    }) {
        Some(addr) if !has_keys => Err(format!(
            "--http {addr} is not a loopback address and no API keys are configured: anyone \
             who can reach it could use the model. Add `http_api_keys = [\"...\"]` to the \
             --config file, or listen on 127.0.0.1 or unix:PATH"
        )),
        _ => Ok(()),
    }
}

/// Binds every endpoint. `mode`/`group` are the gRPC socket's (`--socket-mode`,
/// `--socket-group`).
pub fn bind(endpoints: &[Endpoint], mode: u32, group: Option<&str>) -> anyhow::Result<Vec<Bound>> {
    let mut bound = Vec::new();
    for e in endpoints {
        bound.push(match e {
            Endpoint::Unix(path) => Bound::Unix {
                socket: crate::net::bind_socket(&SocketSpec {
                    path: path.clone(),
                    mode,
                    group: group.map(str::to_string),
                    flag: "--http",
                })?,
                path: path.clone(),
            },
            Endpoint::Tcp(addr) => {
                let socket = std::net::TcpListener::bind(addr)
                    .map_err(|e| crate::net::bind_tcp_error(addr, &e))?;
                socket
                    .set_nonblocking(true)
                    .context("setting the HTTP socket non-blocking")?;
                Bound::Tcp(socket)
            }
        });
    }
    Ok(bound)
}

impl Bound {
    pub fn describe(&self) -> String {
        match self {
            Bound::Unix { path, .. } => format!("unix:{}", path.display()),
            Bound::Tcp(socket) => socket
                .local_addr()
                .map_or_else(|_| "tcp".to_string(), |a| format!("http://{a}")),
        }
    }

    /// The socket file of a Unix endpoint, removed at exit.
    pub fn path(&self) -> Option<PathBuf> {
        match self {
            Bound::Unix { path, .. } => Some(path.clone()),
            Bound::Tcp(_) => None,
        }
    }
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone, Copy)]
pub enum Peer {
    /// A Unix socket client: its uid (SO_PEERCRED), `None` if the kernel did not say.
    Unix { uid: Option<u32> },
    /// A TCP client: for a loopback peer the uid owning its socket, as the kernel's socket
    /// table says ([`crate::net::loopback_peer_uid`]); `None` for any other peer, or when the
    /// table did not say.
    Tcp { uid: Option<u32> },
}

impl Peer {
    /// The account the kernel names for this peer, if it does.
    pub fn uid(&self) -> Option<u32> {
        match self {
            Peer::Unix { uid } | Peer::Tcp { uid } => *uid,
        }
    }
}
