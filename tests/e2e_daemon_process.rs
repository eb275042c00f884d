//! `k3d serve` as a process, end to end: what it refuses at start (a directory that is not a
//! model), its TOML config, socket activation by systemd, its log lines' priorities, SIGTERM's
//! grace (and what `k3` says when the shutdown cancels its request), and a full descriptor
//! table.

#[path = "e2e_support.rs"]
mod support;

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};
use support::command_support::run_ok;
use support::*;

#[test]
fn a_model_directory_without_model_files_is_refused_at_start() {
    let tmp = scratch("nomodel");
    let dir = tmp.path();
    let out = std::process::Command::new(bin("k3d"))
        .args(["serve", "--model"])
        .arg(dir.join("missing"))
        .arg("--socket")
        .arg(dir.join("k3d.sock"))
        .output()
        .expect("run k3d");
    assert_eq!(out.status.code(), Some(3), "checkpoint errors exit 3");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing"), "names the directory: {err}");
    assert!(!dir.join("k3d.sock").exists());
}

#[tokio::test]
async fn sigterm_lets_a_generation_finish_within_the_grace_then_exits_0() {
    let (mut d, mut c) = ready_daemon("sigterm-grace", &["--shutdown-grace", "30"]).await;
    let rest = sigterm_while_computing(&d, &mut c, ids_request(prompt(2), 24)).await;
    assert!(
        rest.error.is_none(),
        "finished within the grace: {:?}",
        rest.error
    );
    assert!(rest.done.is_some());
    let status = d.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{}", d.log_text());
    assert!(!d.socket.exists(), "the socket is removed");
    assert!(d.log_text().contains("SIGTERM"));
}

#[tokio::test]
async fn sigterm_cancels_what_outlives_the_grace() {
    let (mut d, mut c) = ready_daemon(
        "sigterm-cancel",
        &["--shutdown-grace", "0.2", "--max-active", "1"],
    )
    .await;
    let stream = computing(&mut c, prompt(2)).await;
    // A second request waits for the only compute slot.
    let queued = queued(&mut c, ids_request(prompt(3), 4)).await;
    let t = Instant::now();
    d.signal(libc::SIGTERM);
    for (what, events) in [("running", stream), ("queued", queued)] {
        let rest = collect(events).await;
        let err = rest
            .error
            .unwrap_or_else(|| panic!("{what}: cancelled by the shutdown"));
        assert_eq!(err.code(), tonic::Code::Cancelled, "{what}");
        assert!(
            err.message().contains("shutting down"),
            "{what}: {}",
            err.message()
        );
    }
    let status = d.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{}", d.log_text());
    assert!(!d.socket.exists());
    eprintln!(
        "SIGTERM → exit with a running generation and 0.2 s grace: {:?}",
        t.elapsed()
    );
    // New connections are refused once it is down.
    assert!(std::os::unix::net::UnixStream::connect(&d.socket).is_err());
}

#[tokio::test]
async fn systemd_socket_activation_serves_the_passed_socket() {
    let tmp = scratch("activation");
    let dir = tmp.path();
    let path = dir.join("activated.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let fd = listener.as_raw_fd();
    let log = dir.join("k3d.log");
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg("LISTEN_PID=$$ LISTEN_FDS=1 exec \"$@\"")
        .arg("sh")
        .arg(bin("k3d"))
        .args(["serve", "--threads", "1", "--model"])
        .arg(tiny_model())
        .arg("--socket")
        .arg(dir.join("unused.sock"))
        .arg("--session-dir")
        .arg(dir.join("sessions"))
        .stderr(std::fs::File::create(&log).expect("log"));
    // SAFETY: dup2 is async-signal-safe and touches only the child's descriptor table; `fd`
    // stays open in the parent until the child has exec'd (we hold `listener` below).
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn");
    let mut c = client(&path).await;
    wait_ready(&mut c).await;
    let r = generate(&mut c, ids_request(prompt(0), 3)).await;
    assert!(r.error.is_none(), "{:?}", r.error);
    assert!(
        !dir.join("unused.sock").exists(),
        "with activation nothing is bound at --socket"
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0));
    assert!(
        path.exists(),
        "systemd's socket file is systemd's to remove"
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("systemd"), "{text}");
    drop(listener);
}

/// `k3d serve --config FILE`: the TOML file alone is enough to start; flags override it;
/// unknown keys, wrong types and missing required settings are refused with exit 2.
#[tokio::test]
async fn serve_reads_its_settings_from_a_toml_config() {
    let tmp = scratch("config");
    let dir = tmp.path();
    let socket = dir.join("from-file.sock");
    let config = dir.join("k3d.toml");
    std::fs::write(
        &config,
        format!(
            "model = {:?}\nsocket = {:?}\nsocket_mode = \"0600\"\nmax_queue = 2\nthreads = 1\n\
             max_batch = 3\n",
            tiny_model().display().to_string(),
            socket.display().to_string()
        ),
    )
    .expect("write config");
    let log = dir.join("config.log");
    let child = std::process::Command::new(bin("k3d"))
        .args(["serve", "--config"])
        .arg(&config)
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn k3d serve --config");
    let mut daemon = Daemon {
        child,
        socket: socket.clone(),
        log,
        scratch: None,
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "no socket from config:\n{}",
            daemon.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&socket)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "socket_mode from the file applies");
    let mut c = client(&socket).await;
    let status = wait_ready(&mut c).await;
    assert_eq!(status.max_batch, 3, "max_batch from the file applies");
    let out = generate(&mut c, ids_request(prompt(1), 4)).await;
    assert_eq!(out.ids.len(), 4, "a daemon configured from the file serves");
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait(std::time::Duration::from_secs(20)).success());

    let refuse = |text: &str, extra: &[&str], needle: &str| {
        std::fs::write(&config, text).expect("write config");
        let out = std::process::Command::new(bin("k3d"))
            .args(["serve", "--config"])
            .arg(&config)
            .args(extra)
            .output()
            .expect("run k3d");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{text:?} must be a usage error: {err}"
        );
        assert!(
            err.contains(needle) && !err.contains("panicked"),
            "{text:?}: {err}"
        );
    };
    refuse("modle = \"/x\"\n", &[], "modle");
    refuse("max_queue = \"many\"\n", &[], "max_queue");
    refuse(
        "model = \"/x\"\nmax_active_per_uid = 0\n",
        &[],
        "max_active_per_uid must be at least 1",
    );
    refuse("socket = \"/tmp/x.sock\"\n", &[], "--model");
    refuse(
        "model = \"/x\"\nsocket = \"/tmp/x.sock\"\nsocket_mode = \"0777\"\n",
        &[],
        "0777",
    );
    // A flag overrides the file: the file's bad mode is never consulted when the flag is given.
    let missing = dir.join("missing-model");
    std::fs::write(
        &config,
        "model = \"/nonexistent\"\nsocket = \"/tmp/unused.sock\"\n",
    )
    .expect("write");
    let out = std::process::Command::new(bin("k3d"))
        .args(["serve", "--config"])
        .arg(&config)
        .arg("--model")
        .arg(&missing)
        .arg("--socket")
        .arg(dir.join("flag.sock"))
        .output()
        .expect("run k3d");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("missing-model"),
        "--model overrides the file's model: {err}"
    );
}

/// When stderr is the journal (JOURNAL_STREAM names it), every log line carries its syslog
/// priority, so `journalctl -p err` keeps the errors alone; RUST_LOG filters by level.
#[tokio::test]
async fn log_lines_carry_journald_priorities_and_follow_rust_log() {
    let dir = scratch("journal");
    let start = |log: &std::path::Path, rust_log: &str| {
        let file = std::fs::File::create(log).expect("log file");
        let meta = file.metadata().expect("stat log");
        std::process::Command::new(bin("k3d"))
            .args(["serve", "--threads", "1", "--model"])
            .arg(tiny_model())
            .arg("--socket")
            .arg(log.with_extension("sock"))
            // A file where the session directory should be: sessions are unavailable, an error.
            .arg("--session-dir")
            .arg(tiny_model().join("config.json"))
            .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
            .env("RUST_LOG", rust_log)
            .stderr(file)
            .spawn()
            .expect("spawn k3d")
    };
    let wait_for = |log: &std::path::Path, needle: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if text.contains(needle) {
                return text;
            }
            assert!(Instant::now() < deadline, "no {needle:?} in:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let log = dir.path().join("info.log");
    let mut child = start(&log, "");
    let text = wait_for(&log, "sessions unavailable");
    assert!(
        text.lines()
            .any(|l| l.starts_with("<6>k3d [") && l.contains("listening on")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("<3>k3d [") && l.contains("error: sessions unavailable")),
        "{text}"
    );
    assert!(
        text.lines().all(|l| l.starts_with('<')),
        "every line has a priority:\n{text}"
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();

    let log = dir.path().join("errors.log");
    let mut child = start(&log, "error");
    let text = wait_for(&log, "sessions unavailable");
    assert!(
        !text.contains("listening on"),
        "RUST_LOG=error drops info:\n{text}"
    );
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
}

/// A directory that is not a checkpoint is refused as such, naming every missing file.
#[test]
fn a_directory_that_is_not_a_model_says_which_files_are_missing() {
    let dir = scratch("notmodel");
    std::fs::write(dir.path().join("config.json"), "{}").expect("write");
    let out = std::process::Command::new(bin("k3d"))
        .args(["serve", "--model"])
        .arg(dir.path())
        .arg("--socket")
        .arg(dir.path().join("k3d.sock"))
        .output()
        .expect("run k3d");
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not a complete checkpoint directory")
            && err.contains("model.safetensors.index.json, tiktoken.model, tokenizer_config.json")
            && !err.contains("missing config.json"),
        "{err}"
    );
}

/// A `k3 run` cancelled by the daemon's shutdown says so (it used to exit 130 in silence,
/// like a Ctrl-C of its own).
#[tokio::test]
async fn k3_says_when_the_shutdown_cancelled_its_request() {
    let (mut d, _c) = ready_daemon("k3-shutdown-says", &["--shutdown-grace", "0.2"]).await;
    let run = long_k3_run(&d.socket, None);
    d.wait_for_log("started", Duration::from_secs(20));
    d.signal(libc::SIGTERM);
    let out = run.wait_with_output().expect("k3 run");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("k3d is shutting down"), "says why: {err}");
    assert_eq!(d.wait(Duration::from_secs(10)).code(), Some(0));
}

/// CPU ticks (utime + stime, in clock ticks: 1/100 s) process `pid` has used.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the command name (which may hold spaces), from field 3 on.
    let rest = stat.rsplit_once(')').expect("stat format").1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let at = |i: usize| fields[i].parse::<u64>().expect("a tick count");
    at(11) + at(12)
}

/// With its descriptor table full, the daemon pauses its accept loop instead of spinning on
/// EMFILE (~60% of a core before), says so, and accepts again once descriptors free up.
#[tokio::test]
async fn a_full_descriptor_table_pauses_the_accept_loop() {
    let (d, mut c) = ready_daemon("emfile", &[]).await;
    let pid = d.child.id();
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd dir")
        .count();
    let limit = (open + 4).to_string();
    run_ok(std::process::Command::new("prlimit").args([
        "--pid",
        &pid.to_string(),
        // The soft limit only: lowering the hard one could not be undone.
        &format!("--nofile={limit}:"),
    ]));
    // More connections than descriptors left: the rest wait in the backlog.
    let held: Vec<_> = (0..32)
        .map(|_| std::os::unix::net::UnixStream::connect(&d.socket).expect("connect"))
        .collect();
    d.wait_for_log("cannot accept connections", Duration::from_secs(10));
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(pid) - before;
    eprintln!("CPU with the descriptor table full: {used} ticks in 2 s");
    assert!(
        used < 40,
        "{used} ticks of CPU in 2 s with the table full: the accept loop spins"
    );
    drop(held);
    run_ok(std::process::Command::new("prlimit").args([
        "--pid",
        &pid.to_string(),
        "--nofile=512:",
    ]));
    // A new client is served once descriptors are free.
    let mut fresh = client(&d.socket).await;
    assert_eq!(status(&mut fresh).await.state, "ready");
    assert_eq!(status(&mut c).await.state, "ready");
    d.wait_for_log("accepting connections again", Duration::from_secs(10));
}
