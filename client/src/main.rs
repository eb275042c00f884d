//! `k3`: the thin client of the k3d daemon (issue 8 fills this in).
fn main() {
    eprintln!("k3: the client is not built yet (issue 8)");
    std::process::exit(2);
}
