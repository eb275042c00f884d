//! `k3d serve`'s start-up refusals name the fix (issue 46.4), through the real binary: a budget
//! below the model's floor gives the minimum in GiB with digits enough to read it apart from
//! the budget and the `--ram-gb` to use — before anything listens, once — and that value then
//! serves; a socket path that cannot be created names the path, who may write its directory
//! and the flag to choose another; a port in use names the port and another; a model path that
//! does not exist says so.

mod cli_support;

use cli_support::K3D;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/trained/model")
}

/// `k3d serve ARGS` that must fail: its exit code and stderr. Killed (and failed) after 60 s.
fn refused(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(K3D)
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn k3d serve");
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("k3d serve {args:?} still running after 60 s: it was not refused");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("k3d output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The one `k3d: error:` line of a refusal that exited with `code`.
fn one_error(code: Option<i32>, stderr: &str, want: i32) -> String {
    assert_eq!(code, Some(want), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("error:") || l.contains("ERROR"))
        .collect();
    assert_eq!(errors.len(), 1, "exactly one error line:\n{stderr}");
    errors[0].to_string()
}

#[test]
fn a_budget_below_the_floor_names_the_minimum_and_the_value_that_serves() {
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("k3d.sock");
    let model = fixture();
    let base = |ram: &str| {
        vec![
            "--model".to_string(),
            model.display().to_string(),
            "--socket".to_string(),
            socket.display().to_string(),
            "--session-dir".to_string(),
            tmp.path().join("sessions").display().to_string(),
            "--ram-gb".to_string(),
            ram.to_string(),
        ]
    };
    let mut asked = None;
    for ram in ["0.01", "0.0001"] {
        let args = base(ram);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stderr) = refused(&args);
        let error = one_error(code, &stderr, 5);
        assert!(
            !stderr.contains("listening"),
            "refused before listening:\n{stderr}"
        );
        assert!(!socket.exists(), "no socket was bound");
        assert!(
            error.contains("is below the minimum of 0.01") && error.contains("GiB"),
            "{error}"
        );
        // Four significant digits: the budget and the minimum read apart.
        let budget_shown = if ram == "0.01" {
            "0.01000 GiB"
        } else {
            "0.0001000 GiB"
        };
        assert!(error.contains(budget_shown), "{error}");
        let value = error
            .split("give --ram-gb ")
            .nth(1)
            .and_then(|rest| rest.split(" or more").next())
            .unwrap_or_else(|| panic!("no value to use in: {error}"))
            .to_string();
        assert!(value.parse::<f64>().is_ok(), "{value:?} in {error}");
        asked = Some(value);
    }
    // The value the refusal names serves.
    let value = asked.expect("a value");
    let mut child = Command::new(K3D)
        .arg("serve")
        .args(base(&value))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn k3d serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut seen = Vec::new();
    let mut listening = false;
    for line in BufReader::new(stderr).lines() {
        let line = line.expect("a log line");
        listening |= line.contains("listening on");
        seen.push(line);
        if listening {
            break;
        }
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let status = child.wait().expect("wait");
    assert!(
        listening,
        "--ram-gb {value} did not serve ({status}):\n{}",
        seen.join("\n")
    );
}

#[test]
fn a_model_path_that_does_not_exist_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-model");
    let socket = tmp.path().join("k3d.sock");
    let (code, stderr) = refused(&[
        "--model",
        missing.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
    ]);
    let error = one_error(code, &stderr, 3);
    assert!(
        error.contains(&format!("--model {} does not exist", missing.display())),
        "{error}"
    );
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let (code, stderr) = refused(&[
        "--model",
        file.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
    ]);
    let error = one_error(code, &stderr, 3);
    assert!(error.contains("is not a directory"), "{error}");
}

#[test]
fn a_socket_path_that_cannot_be_created_names_the_path_the_directory_and_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture();
    // /sys takes no new files, not even root's (EPERM), whoever runs the test.
    let (code, stderr) = refused(&[
        "--model",
        model.to_str().unwrap(),
        "--socket",
        "/sys/k3d-test.sock",
        "--session-dir",
        tmp.path().join("sessions").to_str().unwrap(),
    ]);
    let error = one_error(code, &stderr, 1);
    assert!(
        error.contains("--socket /sys/k3d-test.sock: permission denied")
            && error.contains("may not create it in /sys (root:root")
            && error.contains("with --socket PATH"),
        "{error}"
    );
    assert!(!stderr.contains("listening"), "{stderr}");
    // The HTTP API's Unix socket says which flag named it.
    let socket = tmp.path().join("k3d.sock");
    let (code, stderr) = refused_with_http(tmp.path(), "unix:/sys/k3d-test-http.sock");
    let error = one_error(code, &stderr, 1);
    assert!(
        error.contains("--http unix:/sys/k3d-test-http.sock: permission denied")
            && error.contains("with --http unix:PATH"),
        "{error}"
    );
    assert!(!socket.exists(), "the gRPC socket is removed again");
}

/// `k3d serve` on the fixture, its socket and sessions in `dir`, with `--http ENDPOINT`.
fn refused_with_http(dir: &Path, endpoint: &str) -> (Option<i32>, String) {
    let model = fixture();
    let socket = dir.join("k3d.sock");
    let sessions = dir.join("sessions");
    refused(&[
        "--model",
        model.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
        "--session-dir",
        sessions.to_str().unwrap(),
        "--http",
        endpoint,
    ])
}

#[test]
fn a_port_in_use_names_the_port_and_another_to_use() {
    let tmp = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let socket = tmp.path().join("k3d.sock");
    let (code, stderr) = refused_with_http(tmp.path(), &format!("127.0.0.1:{port}"));
    let error = one_error(code, &stderr, 1);
    assert!(
        error.contains(&format!("port {port} is already in use"))
            && error.contains(&format!("--http 127.0.0.1:{}", port + 1)),
        "{error}"
    );
    assert!(!stderr.contains("listening"), "{stderr}");
    assert!(!socket.exists(), "the gRPC socket is removed again");
    drop(taken);
}
