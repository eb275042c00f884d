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
    match flag {
        Some(path) => SocketPath {
            path,
            source: "--socket",
        },
        None => {
            let (path, source) = k3proto::socket::default_path();
            SocketPath { path, source }
        }
    }
}

/// See [`connect`]: a paused reader must be flow-controlled before h2's frame budget runs out.
const STREAM_WINDOW: u32 = 64 << 10;
const CONNECTION_WINDOW: u32 = 5 << 20;

pub async fn connect(socket: &SocketPath) -> Result<EngineClient<Channel>, Failure> {
    let stream = UnixStream::connect(&socket.path)
        .await
        .map_err(|e| connect_failure(socket, e))?;
    // tonic asks its connector for a connection; the first ask gets the one made above, a
    // later one (after k3d closed a connection that sent no request within its handshake
    // deadline: `k3 chat` waiting for the first line) a new one.
    let slot = Arc::new(Mutex::new(Some(stream)));
    let path = socket.path.clone();
    let channel = Endpoint::from_static("http://k3d.invalid")
        // h2 guards its receiver against floods of small DATA frames: each buffered frame
        // under 256 bytes costs up to 256 of a budget of half the connection window, and the
        // connection dies (GOAWAY ENHANCE_YOUR_CALM, "too_many_data_frames") when it runs
        // out. A token is one small frame, so a paused `k3` (Ctrl-Z) with hyper's 2 MiB
        // stream window could buffer enough of them to be cut off. With a 64 KiB stream
        // window the daemon stops sending (flow control, its stream waits) after at most
        // 64 Ki frames' worth of bytes: ≤ 6,554 frames of ≥ 10 bytes, ≤ 1.7 MB of budget,
        // below the 2.5 MiB that a 5 MiB connection window gives.
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let taken = slot.lock().ok().and_then(|mut s| s.take());
            let path = path.clone();
            async move {
                let stream = match taken {
                    Some(stream) => stream,
                    None => UnixStream::connect(&path).await?,
                };
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|e| {
            crate::failure::refused_connection(&e).unwrap_or_else(|| {
                Failure::new(
                    Code::Other,
                    format!("cannot talk gRPC over {}: {e}", socket.path.display()),
                )
            })
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
        std::io::ErrorKind::PermissionDenied => Failure::new(
            Code::Permission,
            format!(
                "permission denied on {path}: {}",
                permission_advice(&socket.path)
            ),
        ),
        _ => Failure::new(Code::NotRunning, format!("cannot connect to {path}: {e}")),
    }
}

/// Why the kernel refused us the socket and what would change that, from the modes and
/// owners of the socket and of its directories (connecting needs search permission on every
/// directory on the way and write permission on the socket).
fn permission_advice(path: &Path) -> String {
    let closed_dir = path
        .ancestors()
        .skip(1)
        .filter(|d| !d.as_os_str().is_empty())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .find(|d| nix::unistd::access(*d, nix::unistd::AccessFlags::X_OK).is_err());
    if let Some(dir) = closed_dir {
        let Ok(meta) = std::fs::metadata(dir) else {
            return format!("the directory {} is closed to you.", dir.display());
        };
        let owner = user_name(meta.uid());
        let group = group_name(meta.gid());
        let mode = meta.mode() & 0o777;
        let how = if mode & 0o010 != 0 && meta.gid() != 0 {
            join_advice(&group, meta.gid())
        } else {
            format!(
                "only {owner} may enter it; its owner can open it to others \
                 (`chmod 0755 {}`: the socket's own mode then decides who connects).",
                dir.display()
            )
        };
        return format!(
            "the directory {} (owner {owner}, group {group}, mode {mode:04o}) is closed to you: \
             {how}",
            dir.display()
        );
    }
    let Ok(meta) = std::fs::metadata(path) else {
        return "the socket cannot be inspected.".to_string();
    };
    let owner = user_name(meta.uid());
    let group = group_name(meta.gid());
    let mode = meta.mode() & 0o777;
    if mode & 0o020 == 0 {
        return format!(
            "the socket is private to its owner {owner} (mode {mode:04o}). Connect as {owner}, \
             or ask whoever runs the daemon to open it to a group you are in: \
             `k3d serve --socket-mode 0660 --socket-group GROUP` (or `socket_mode`/`socket_group` \
             in its --config file)."
        );
    }
    if meta.gid() == 0 {
        return format!(
            "the socket (mode {mode:04o}) belongs to group root, because the daemon was started \
             without --socket-group. Do not join group root for this: ask whoever runs the \
             daemon ({owner}) to restart it with `--socket-group k3` (the installed service's \
             group) and to add you to that group."
        );
    }
    format!(
        "the daemon's socket is for the members of group {group}. {}",
        join_advice(&group, meta.gid())
    )
}

/// How to get into `group`: already listed as a member (only this login predates it), or not.
fn join_advice(group: &str, gid: u32) -> String {
    let me = nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten();
    let listed = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
        .ok()
        .flatten()
        .is_some_and(|g| me.as_ref().is_some_and(|u| g.mem.contains(&u.name)));
    if listed {
        format!(
            "you are a member of group {group}, but this login session started before you were \
             added: log in again (or run `newgrp {group}`)."
        )
    } else {
        format!(
            "ask an administrator to add you to group {group} (`usermod -aG {group} $USER`), \
             then log in again."
        )
    }
}

fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(user)) => user.name,
        _ => format!("uid {uid}"),
    }
}

fn group_name(gid: u32) -> String {
    match nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid)) {
        Ok(Some(group)) => group.name,
        _ => format!("gid {gid}"),
    }
}
