//! Finding and connecting to the daemon's socket, with errors a person can act on.
//!
//! The socket path comes from `--socket`, then `K3_SOCKET`, then `$XDG_RUNTIME_DIR/k3d.sock`,
//! then `/run/k3d/k3d.sock`. The Unix connection is made here (so its failure can be named
//! precisely) and handed to tonic, which never resolves the placeholder URI.

use crate::failure::{Code, Failure};
use hyper_util::rt::TokioIo;
use k3proto::v1::engine_client::EngineClient;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// Largest gRPC message either way (the daemon uses the same limit).
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// Where to look, and why there (for messages).
pub struct SocketPath {
    pub path: PathBuf,
    pub source: &'static str,
}

pub fn resolve(flag: Option<PathBuf>) -> SocketPath {
    if let Some(path) = flag {
        return SocketPath {
            path,
            source: "--socket",
        };
    }
    if let Some(path) = std::env::var_os("K3_SOCKET").filter(|v| !v.is_empty()) {
        return SocketPath {
            path: path.into(),
            source: "K3_SOCKET",
        };
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        return SocketPath {
            path: Path::new(&dir).join("k3d.sock"),
            source: "$XDG_RUNTIME_DIR",
        };
    }
    SocketPath {
        path: "/run/k3d/k3d.sock".into(),
        source: "the default",
    }
}

pub async fn connect(socket: &SocketPath) -> Result<EngineClient<Channel>, Failure> {
    let stream = UnixStream::connect(&socket.path)
        .await
        .map_err(|e| connect_failure(socket, e))?;
    // tonic asks its connector for a connection; the first ask gets the one made above.
    let slot = Arc::new(Mutex::new(Some(stream)));
    let channel = Endpoint::from_static("http://k3d.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let taken = slot.lock().ok().and_then(|mut s| s.take());
            async move {
                taken.map(TokioIo::new).ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "the connection to k3d was lost",
                    )
                })
            }
        }))
        .await
        .map_err(|e| {
            Failure::new(
                Code::Other,
                format!("cannot talk gRPC over {}: {e}", socket.path.display()),
            )
        })?;
    Ok(EngineClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

fn connect_failure(socket: &SocketPath, e: std::io::Error) -> Failure {
    let path = socket.path.display();
    match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => Failure::new(
            Code::NotRunning,
            format!(
                "k3d is not running: nothing listens on {path} (from {}).\n\
                 Start it with `k3d serve --model DIR --socket {path}`, or point k3 at a running \
                 daemon with --socket PATH or K3_SOCKET.",
                socket.source
            ),
        ),
        std::io::ErrorKind::PermissionDenied => {
            let group = group_of(&socket.path);
            Failure::new(
                Code::Permission,
                format!(
                    "permission denied on {path}: the daemon's socket is for the members of \
                     group {group}.\nAsk an administrator to add you (`usermod -aG {group} \
                     $USER`), then log in again."
                ),
            )
        }
        _ => Failure::new(Code::NotRunning, format!("cannot connect to {path}: {e}")),
    }
}

/// The socket file's group name (or number), for the permission message.
fn group_of(path: &Path) -> String {
    let gid = match std::fs::metadata(path) {
        Ok(meta) => meta.gid(),
        // The directory itself may be closed to us.
        Err(_) => return "that owns it (the directory is not readable either)".to_string(),
    };
    match nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid)) {
        Ok(Some(group)) => group.name,
        _ => gid.to_string(),
    }
}
