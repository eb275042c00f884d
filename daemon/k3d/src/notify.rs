//! The sd_notify(3) protocol, for a `Type=notify` unit: `READY=1` once the model is loaded,
//! `STATUS=…` while it loads (shown by `systemctl status`), `STOPPING=1` at shutdown.
//!
//! systemd names its socket in `NOTIFY_SOCKET` (a path, or `@name` for the abstract
//! namespace); each message is one datagram of `KEY=VALUE` lines. Outside systemd the variable
//! is unset and every call does nothing. Failures are ignored on purpose: the service manager
//! is the one that would care, and it cannot be told.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Sends `state` (newline-separated assignments) to the service manager, if there is one.
pub fn send(state: &str) {
    if let Some(target) = std::env::var_os("NOTIFY_SOCKET").filter(|v| !v.is_empty()) {
        send_to(&target, state);
    }
}

/// One datagram to the socket `target` names (`@name`: abstract namespace).
fn send_to(target: &std::ffi::OsStr, state: &str) {
    let bytes = target.as_encoded_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name),
        None => SocketAddr::from_pathname(std::path::Path::new(&target)),
    };
    let (Ok(addr), Ok(socket)) = (addr, UnixDatagram::unbound()) else {
        return;
    };
    let _ = socket.send_to_addr(state.as_bytes(), &addr);
}

/// A one-line status for `systemctl status` (newlines would end the assignment).
pub fn status(text: &str) {
    send(&format!("STATUS={}", text.replace('\n', " ")));
}

/// The model is loaded and requests are served.
pub fn ready(text: &str) {
    send(&ready_message(text));
}

/// The serve core's state changes (`k3_engine::serve::OnHealth`) as systemd status lines.
pub fn health(health: &k3_engine::serve::Health, info: Option<&k3_engine::engine::EngineInfo>) {
    use k3_engine::serve::Health;
    match health {
        Health::Loading(figures) => status(&format!("loading: {figures}")),
        Health::Ready => ready(&format!(
            "serving {}",
            info.map_or("the model", |i| i.name.as_str())
        )),
        Health::Failed(e) => status(&format!("loading failed: {e}")),
    }
}

fn ready_message(text: &str) -> String {
    format!("READY=1\nSTATUS={}", text.replace('\n', " "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A datagram socket standing in for systemd's receives exactly what was sent.
    #[test]
    fn messages_reach_the_notify_socket() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("notify.sock");
        let receiver = UnixDatagram::bind(&path).expect("bind the stand-in socket");
        send_to(path.as_os_str(), &ready_message("serving tiny\n(2 layers)"));
        let mut buf = [0u8; 256];
        let n = receiver.recv(&mut buf).expect("a datagram");
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving tiny (2 layers)");
    }
}
