//! The daemon's Unix socket: either handed over by systemd (socket activation) or bound here
//! with the access rules of `--socket-mode` / `--socket-group`.
//!
//! File permissions are the access control (engine-lessons §9: UDS, mode 0660 + group): the
//! socket is created under a restrictive umask so it is never reachable by others, even for the
//! instant between `bind` and `chmod`.
//!
//! With systemd, a socket unit owns the file and its access rules, e.g.
//!
//! ```text
//! # k3d.socket                          # k3d.service
//! [Socket]                              [Service]
//! ListenStream=/run/k3d/k3d.sock        ExecStart=/usr/bin/k3d serve --model /srv/k3 \
//! SocketMode=0660                           --socket /run/k3d/k3d.sock
//! SocketGroup=k3
//! ```
//!
//! and `k3d serve` takes descriptor 3 instead of binding (`--socket` is then unused).

use super::bind_error;
use anyhow::{Context, bail};
use nix::sys::socket::{AddressFamily, SockaddrLike, SockaddrStorage, getsockname};
use nix::sys::stat::{Mode, umask};
use nix::unistd::{Group, Pid, chown, getpid};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The first descriptor systemd passes (sd_listen_fds(3)).
const SD_LISTEN_FDS_START: i32 = 3;

/// How to create the socket when systemd did not pass one.
pub struct SocketSpec {
    pub path: PathBuf,
    /// Permission bits of the socket file (0o660 or 0o600).
    pub mode: u32,
    /// Group that owns the socket file; members may connect when `mode` is 0o660.
    pub group: Option<String>,
    /// The flag that named the path (`--socket`, or `--http` for `unix:PATH`), for errors.
    pub flag: &'static str,
}

/// Where the listening socket came from, which decides who removes it.
pub enum Origin {
    /// We bound it at this path and remove it on exit.
    Bound(PathBuf),
    /// systemd owns it (and its file): we only use the descriptor.
    Activated,
}

pub struct Listener {
    pub socket: UnixListener,
    pub origin: Origin,
    /// Set once the socket file is removed, so a second call cannot remove the socket of a
    /// daemon started since at the same path.
    removed: AtomicBool,
}

impl Listener {
    /// Take systemd's socket if one was passed to this process, else bind `spec`.
    pub fn open(spec: &SocketSpec) -> anyhow::Result<Listener> {
        match activated()? {
            Some(socket) => Ok(Listener {
                socket,
                origin: Origin::Activated,
                removed: AtomicBool::new(false),
            }),
            None => Ok(Listener {
                socket: bind(spec)?,
                origin: Origin::Bound(spec.path.clone()),
                removed: AtomicBool::new(false),
            }),
        }
    }

    /// What to print in logs and Status about where we listen.
    pub fn describe(&self) -> String {
        match &self.origin {
            Origin::Bound(path) => path.display().to_string(),
            Origin::Activated => "systemd socket (fd 3)".to_string(),
        }
    }

    /// Remove the socket file if we created it; a shut-down daemon leaves nothing behind.
    pub fn remove(&self) {
        if let Origin::Bound(path) = &self.origin
            && !self.removed.swap(true, Ordering::Relaxed)
        {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// systemd's protocol (sd_listen_fds(3)): `LISTEN_PID` names this process and `LISTEN_FDS`
/// counts descriptors starting at 3. We serve exactly one, so more is a configuration error.
fn activated() -> anyhow::Result<Option<UnixListener>> {
    let (Ok(pid), Ok(fds)) = (std::env::var("LISTEN_PID"), std::env::var("LISTEN_FDS")) else {
        return Ok(None);
    };
    let pid: i32 = pid
        .parse()
        .with_context(|| format!("LISTEN_PID={pid:?} is not a process id"))?;
    if Pid::from_raw(pid) != getpid() {
        // Meant for another process (e.g. inherited through a shell): not ours to take.
        return Ok(None);
    }
    let fds: u32 = fds
        .parse()
        .with_context(|| format!("LISTEN_FDS={fds:?} is not a count"))?;
    match fds {
        0 => return Ok(None),
        1 => {}
        n => bail!("systemd passed {n} sockets (LISTEN_FDS); k3d serves exactly one"),
    }
    let addr: SockaddrStorage = getsockname(SD_LISTEN_FDS_START)
        .context("LISTEN_FDS=1 but descriptor 3 is not a socket")?;
    if addr.family() != Some(AddressFamily::Unix) {
        bail!("the socket systemd passed (fd 3) is not a Unix socket; use ListenStream=/path");
    }
    // SAFETY: sd_listen_fds(3) hands fd 3 to this process (LISTEN_PID matched our pid) and
    // nothing else in k3d opens, uses or closes it; getsockname just proved it is an open
    // socket. Taking ownership here makes this the only owner.
    let fd = unsafe { OwnedFd::from_raw_fd(SD_LISTEN_FDS_START) };
    let socket = UnixListener::from(fd);
    socket
        .set_nonblocking(true)
        .context("setting the systemd socket non-blocking")?;
    Ok(Some(socket))
}

/// Binds a Unix socket at `spec.path` with its access rules (also the HTTP API's `unix:PATH`).
pub fn bind(spec: &SocketSpec) -> anyhow::Result<UnixListener> {
    let path = &spec.path;
    let gid = match &spec.group {
        None => None,
        Some(name) => Some(
            Group::from_name(name)
                .with_context(|| format!("looking up group {name:?}"))?
                .with_context(|| format!("--socket-group {name:?}: no such group"))?
                .gid,
        ),
    };
    remove_stale(path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| bind_error::unix_socket(spec.flag, path, &e))?;
    }
    // Only the owner may touch the file until chown/chmod below set the intended access.
    let old = umask(Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    umask(old);
    let socket = bound.map_err(|e| bind_error::unix_socket(spec.flag, path, &e))?;
    let finish = || -> anyhow::Result<()> {
        if let (Some(gid), Some(name)) = (gid, &spec.group) {
            chown(path, None, Some(gid)).map_err(|e| bind_error::socket_group(path, name, &e))?;
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(spec.mode))
            .with_context(|| format!("setting mode {:o} on {}", spec.mode, path.display()))?;
        socket
            .set_nonblocking(true)
            .context("setting the socket non-blocking")
    };
    if let Err(e) = finish() {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(socket)
}

/// A socket file left by a crashed daemon is removed; a live one (something accepts on it) or a
/// file that is not a socket is an error, never silently replaced.
fn remove_stale(path: &Path) -> anyhow::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("inspecting {}", path.display())),
    };
    if !meta.file_type().is_socket() {
        bail!(
            "{} exists and is not a socket; refusing to replace it",
            path.display()
        );
    }
    if UnixStream::connect(path).is_ok() {
        bail!(
            "{} is in use: another k3d is serving there (stop it or choose another --socket)",
            path.display()
        );
    }
    std::fs::remove_file(path)
        .with_context(|| format!("removing the stale socket {}", path.display()))
}
