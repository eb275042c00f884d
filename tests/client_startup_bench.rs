//! How fast `k3` reaches the daemon's socket: from process start to the first byte it writes on
//! a Unix socket (a listener that only accepts and reads), against the floor of starting any
//! process (`/bin/true`, start to exit). A benchmark, not a test: the machine is shared and
//! noisy, so figures are medians of many runs reported as a ratio measured in one run.
//!
//! ```sh
//! cargo build -p k3 && cargo run -p k3-tests --example client_startup_bench [RUNS]
//! ```

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("RUNS is a number"))
        .unwrap_or(21)
        .max(1);
    // target/<profile>/examples/this → target/<profile>/k3
    let exe = std::env::current_exe().expect("own path");
    let k3 = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("examples live in target/<profile>/examples")
        .join("k3");
    assert!(
        k3.exists(),
        "{} is missing: `cargo build -p k3` first",
        k3.display()
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("fake.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    let mut first_byte = Vec::with_capacity(runs);
    let mut floor = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        let status = Command::new("/bin/true").status().expect("/bin/true");
        floor.push(t.elapsed());
        assert!(status.success());

        let t = Instant::now();
        let mut child = Command::new(&k3)
            .arg("--socket")
            .arg(&path)
            .arg("status")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("k3");
        let (mut conn, _) = listener.accept().expect("accept");
        let mut byte = [0u8; 1];
        conn.read_exact(&mut byte).expect("first byte");
        first_byte.push(t.elapsed());
        drop(conn);
        let _ = child.kill();
        let _ = child.wait();
    }
    let (k3_median, floor_median) = (median(first_byte), median(floor));
    println!(
        "k3 start → first byte on the socket: median {k3_median:?} over {runs} runs \
         (target < 20 ms); process start → exit floor (/bin/true): median {floor_median:?}; \
         ratio {:.2}×",
        k3_median.as_secs_f64() / floor_median.as_secs_f64()
    );
}
