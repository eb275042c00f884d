//! Who owns the other end of a loopback TCP connection (issue 34 point 5, issue 35 point 7).
//!
//! A Unix socket tells its server the peer's uid (`SO_PEERCRED`); TCP does not. But a loopback
//! connection's client socket lives in this machine's own socket table, and the kernel lists
//! every TCP socket with the uid that created it in `/proc/net/tcp` and `/proc/net/tcp6`: the
//! socket whose local address is the peer's and whose remote address is ours is the client's,
//! and its uid column is the client's account — the same answer `identd` gives, from the
//! kernel, which the client cannot forge. So keyless agents on 127.0.0.1 (which cannot speak
//! to a Unix socket) are told apart by account, and each keeps its own conversation state.
//!
//! Only loopback peers are looked up: a remote machine's socket is not in our table. The look-up
//! runs once per accepted connection, while it is established (its 4-tuple is unique then); any
//! failure — no `/proc`, a table line that does not parse, the client already gone — answers
//! `None`, and the caller is then unknown (nothing is kept for it).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The uid owning the client socket of the loopback TCP connection from `peer` to our `local`
/// address (`None` if `peer` is not a loopback address or the kernel's table does not say).
pub fn loopback_peer_uid(local: SocketAddr, peer: SocketAddr) -> Option<u32> {
    if !peer.ip().to_canonical().is_loopback() {
        return None;
    }
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .into_iter()
        .find_map(|table| {
            let text = std::fs::read_to_string(table).ok()?;
            owner_in(&text, local, peer)
        })
}

/// The uid column of the line of `table` (a `/proc/net/tcp{,6}` listing) whose local address is
/// `peer` and whose remote address is `local`: the client's end of the connection.
fn owner_in(table: &str, local: SocketAddr, peer: SocketAddr) -> Option<u32> {
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid ...
        let (ours, theirs, uid) = (fields.get(1)?, fields.get(2)?, fields.get(7)?);
        let same =
            |text: &str, want: SocketAddr| parse_address(text).is_some_and(|a| same_end(a, want));
        (same(ours, peer) && same(theirs, local)).then(|| uid.parse().ok())?
    })
}

/// Two ends are the same when their ports match and their addresses do once an IPv4-mapped
/// IPv6 address is read as the IPv4 one (a v4 client of a dual-stack listener).
fn same_end(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && a.ip().to_canonical() == b.ip().to_canonical()
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6). The kernel prints each 32-bit word
/// of the address as the number the machine reads from its network-order bytes (`%08X`), so
/// the bytes are that number's native-endian bytes; the port is in host order.
fn parse_address(text: &str) -> Option<SocketAddr> {
    let (address, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = address.get(8 * i..8 * i + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip = match address.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[4 * i..4 * i + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The word as the kernel prints it on this machine.
    fn printed(bytes: [u8; 4]) -> String {
        format!("{:08X}", u32::from_ne_bytes(bytes))
    }

    #[test]
    fn the_clients_end_is_found_by_its_addresses_never_the_servers() {
        let server: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let client: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let lo = printed([127, 0, 0, 1]);
        let table = format!(
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
             0: {lo}:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000   998        0 1 1\n\
             1: {lo}:1F90 {lo}:9C40 01 00000000:00000000 00:00000000 00000000   998        0 2 1\n\
             2: {lo}:9C40 {lo}:1F90 01 00000000:00000000 00:00000000 00000000  1001        0 3 1\n"
        );
        assert_eq!(owner_in(&table, server, client), Some(1001));
        // Another client port: not in the table.
        assert_eq!(
            owner_in(&table, server, "127.0.0.1:40001".parse().unwrap()),
            None
        );
        assert_eq!(owner_in("garbage\nnot a table line", server, client), None);
    }

    #[test]
    fn ipv6_and_ipv4_mapped_addresses_parse() {
        let mapped = format!(
            "{}{}{}{}:9C40",
            printed([0, 0, 0, 0]),
            printed([0, 0, 0, 0]),
            printed([0, 0, 0xff, 0xff]),
            printed([127, 0, 0, 1])
        );
        let parsed = parse_address(&mapped).unwrap();
        assert!(same_end(parsed, "127.0.0.1:40000".parse().unwrap()));
        let v6_lo = format!(
            "{}{}{}{}:0050",
            printed([0; 4]),
            printed([0; 4]),
            printed([0; 4]),
            printed([0, 0, 0, 1])
        );
        assert_eq!(parse_address(&v6_lo), Some("[::1]:80".parse().unwrap()));
        assert_eq!(parse_address("0100007F"), None);
        assert_eq!(parse_address("XYZ:0050"), None);
    }

    /// The real table: a loopback connection made by this process is ours.
    #[test]
    fn a_loopback_connection_of_this_process_is_this_uid() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server_end, peer) = listener.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        let me = nix::unistd::getuid().as_raw();
        assert_eq!(
            loopback_peer_uid(listener.local_addr().unwrap(), peer),
            Some(me)
        );
        // Not a loopback peer: never looked up.
        assert_eq!(
            loopback_peer_uid(
                listener.local_addr().unwrap(),
                "192.0.2.1:5".parse().unwrap()
            ),
            None
        );
    }
}
