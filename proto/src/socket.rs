//! Where the API is served when nobody says: one rule for the daemon (`k3d serve` without
//! `--socket`) and the client, so both find the same socket.
//!
//! `K3_SOCKET`, else `$XDG_RUNTIME_DIR/k3d.sock` (the user's runtime directory, XDG base
//! directories), else `/run/k3d/k3d.sock` (the system service's, `packaging/k3d.socket`).

use std::path::{Path, PathBuf};

/// The system service's socket (owned by `k3d.socket`).
pub const SYSTEM_SOCKET: &str = "/run/k3d/k3d.sock";

/// The default socket path and what decided it (for messages: "from K3_SOCKET").
pub fn default_path() -> (PathBuf, &'static str) {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(path) = set("K3_SOCKET") {
        return (path.into(), "K3_SOCKET");
    }
    if let Some(dir) = set("XDG_RUNTIME_DIR") {
        return (Path::new(&dir).join("k3d.sock"), "$XDG_RUNTIME_DIR");
    }
    (SYSTEM_SOCKET.into(), "the default")
}
