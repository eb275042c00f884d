//! What a listening socket that could not be opened tells the user (issue 46.4): which path or
//! port, why in words (who may write the directory, who holds the port) and what to do (another
//! path or port, the group, `--socket`), instead of a bare `Permission denied (os error 13)` or
//! `Address already in use`.

use nix::unistd::{Gid, Group, Uid, User};
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The name of a uid, or the number when the user database does not know it.
fn user_name(uid: u32) -> String {
    User::from_uid(Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {uid}"), |u| u.name)
}

fn group_name(gid: u32) -> String {
    Group::from_gid(Gid::from_raw(gid))
        .ok()
        .flatten()
        .map_or_else(|| format!("gid {gid}"), |g| g.name)
}

/// `dir`'s owner, group and mode, as `ls -ld` would say them (`root:root 0755`).
fn describe_dir(dir: &Path) -> String {
    match std::fs::metadata(dir) {
        Ok(m) => format!(
            "{}:{} {:04o}",
            user_name(m.uid()),
            group_name(m.gid()),
            m.mode() & 0o7777
        ),
        Err(e) => format!("unreadable: {e}"),
    }
}

/// The nearest existing ancestor of `path` (the directory where a file or folder would be
/// created), `/` at the least.
fn existing_parent(path: &Path) -> &Path {
    path.ancestors()
        .skip(1)
        .find(|a| !a.as_os_str().is_empty() && a.exists())
        .unwrap_or(Path::new("/"))
}

/// How the user gave a socket path: `--socket PATH` or `--http unix:PATH`.
fn given(flag: &str, path: &Path) -> String {
    match flag {
        "--http" => format!("--http unix:{}", path.display()),
        _ => format!("{flag} {}", path.display()),
    }
}

/// `flag PATH` (`--socket`, or `--http` for `unix:PATH`) could not be bound as a Unix socket
/// (or its directory created): `err` said why.
pub fn unix_socket(flag: &str, path: &Path, err: &io::Error) -> anyhow::Error {
    let me = user_name(nix::unistd::geteuid().as_raw());
    let shown = given(flag, path);
    let with = given(flag, Path::new("PATH"));
    match err.kind() {
        io::ErrorKind::PermissionDenied => {
            let dir = existing_parent(path);
            anyhow::anyhow!(
                "{shown}: permission denied: {me} may not create it in {} ({}). Choose a path \
                 {me} can write with {with} (`k3` looks at $XDG_RUNTIME_DIR/k3d.sock by \
                 default), or run k3d as a user who may write there (packaging/install.sh's \
                 k3d.socket creates /run/k3d/k3d.sock for the k3d user)",
                dir.display(),
                describe_dir(dir)
            )
        }
        io::ErrorKind::ReadOnlyFilesystem => anyhow::anyhow!(
            "{shown}: the file system is read-only; choose a path on a writable one with {with}"
        ),
        _ if err.raw_os_error() == Some(nix::libc::ENAMETOOLONG)
            || err.kind() == io::ErrorKind::InvalidInput =>
        {
            anyhow::anyhow!(
                "{shown}: a Unix socket path must be shorter than 108 bytes; choose a shorter \
                 one with {with}"
            )
        }
        _ => anyhow::anyhow!("{shown}: cannot bind: {err}"),
    }
}

/// The socket file could not be given to `--socket-group GROUP`.
pub fn socket_group(path: &Path, group: &str, err: &nix::Error) -> anyhow::Error {
    let me = user_name(nix::unistd::geteuid().as_raw());
    if *err == nix::Error::EPERM {
        anyhow::anyhow!(
            "--socket-group {group}: {} cannot be given to group {group}: only root or a \
             member of {group} may, and {me} is not one (add it with `usermod -aG {group} \
             {me}` and log in again, or leave --socket-group out to keep {me}'s group)",
            path.display()
        )
    } else {
        anyhow::anyhow!(
            "--socket-group {group}: giving {} to the group: {err}",
            path.display()
        )
    }
}

/// `--http ADDR` could not be bound: which port, why, what to do.
pub fn tcp(addr: &SocketAddr, err: &io::Error) -> anyhow::Error {
    let port = addr.port();
    let other = port.checked_add(1).unwrap_or(port - 1);
    let mut next = *addr;
    next.set_port(other);
    match err.kind() {
        io::ErrorKind::AddrInUse => anyhow::anyhow!(
            "--http {addr}: port {port} is already in use by another program (`ss -ltnp \
             'sport = :{port}'` shows which); stop it, or choose another port: --http {next}"
        ),
        io::ErrorKind::PermissionDenied => anyhow::anyhow!(
            "--http {addr}: permission denied: ports below 1024 need root or \
             CAP_NET_BIND_SERVICE; choose a port from 1024 up (--http {}:8080)",
            if addr.is_ipv6() {
                format!("[{}]", addr.ip())
            } else {
                addr.ip().to_string()
            }
        ),
        io::ErrorKind::AddrNotAvailable => anyhow::anyhow!(
            "--http {addr}: {} is not an address of this machine; use 127.0.0.1 (loopback) \
             or one `ip -brief address` lists",
            addr.ip()
        ),
        _ => anyhow::anyhow!("--http {addr}: cannot bind: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_in_use_names_the_port_and_another() {
        let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let e = tcp(&addr, &io::Error::from(io::ErrorKind::AddrInUse)).to_string();
        assert!(e.contains("port 8080 is already in use"), "{e}");
        assert!(e.contains("--http 127.0.0.1:8081"), "{e}");
        let e = tcp(&addr, &io::Error::from(io::ErrorKind::PermissionDenied)).to_string();
        assert!(e.contains("below 1024"), "{e}");
    }

    #[test]
    fn a_socket_path_denied_names_the_directory_its_owner_and_the_flag() {
        let e = unix_socket(
            "--socket",
            Path::new("/proc/k3d-test/k3d.sock"),
            &io::Error::from(io::ErrorKind::PermissionDenied),
        )
        .to_string();
        assert!(
            e.starts_with("--socket /proc/k3d-test/k3d.sock: permission denied"),
            "{e}"
        );
        assert!(e.contains("in /proc (root:root"), "{e}");
        assert!(e.contains("with --socket PATH"), "{e}");
        let e = unix_socket(
            "--http",
            Path::new("/proc/h.sock"),
            &io::Error::from(io::ErrorKind::PermissionDenied),
        )
        .to_string();
        assert!(
            e.starts_with("--http unix:/proc/h.sock: permission denied"),
            "{e}"
        );
        assert!(e.contains("with --http unix:PATH"), "{e}");
    }
}
