//! The daemon's lifecycle end to end (issue 14 item 4), with real `k3d serve` processes: a
//! model that cannot load ends the daemon non-zero with its one-line error; a session whose
//! request is cancelled or abandoned while queued is usable again at once; SIGTERM while the
//! model loads, with requests queued, prefilling, decoding and a session being written exits
//! 0 within the grace, removes the socket and keeps the session.

#[path = "e2e_support.rs"]
mod support;

use k3proto::v1 as pb;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;
use tokio_stream::StreamExt;

/// Runs `k3d serve` to its end (it must end by itself within 60 s): exit code and stderr.
fn serve_until_exit(model: &Path, socket: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(bin("k3d"))
        .arg("serve")
        .arg("--model")
        .arg(model)
        .arg("--socket")
        .arg(socket)
        .arg("--session-dir")
        .arg(socket.with_extension("sessions"))
        .args(["--threads", "1"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn k3d serve");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("k3d serve with an unloadable model did not exit within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    (out.status.code(), text(&out.stderr))
}

/// The last line of the log is the one-line error, `k3d: error: …`.
fn last_line(log: &str) -> &str {
    log.lines().last().unwrap_or("")
}

#[test]
fn a_corrupt_shard_ends_the_daemon_with_exit_3_and_one_line() {
    let tmp = scratch("life-corrupt");
    let dir = tmp.path();
    let model = broken_model(dir);
    let socket = dir.join("k3d.sock");
    let (code, log) = serve_until_exit(&model, &socket, &[]);
    assert_eq!(code, Some(3), "a checkpoint error exits 3:\n{log}");
    let line = last_line(&log);
    assert!(
        line.starts_with("k3d: error: loading") && line.contains(".safetensors"),
        "one line naming the shard: {line:?}\n{log}"
    );
    assert!(!socket.exists(), "the socket is removed");
}

#[test]
fn a_budget_below_the_minimum_ends_the_daemon_with_exit_5() {
    let tmp = scratch("life-budget");
    let dir = tmp.path();
    let socket = dir.join("k3d.sock");
    let (code, log) = serve_until_exit(tiny_model(), &socket, &["--ram-gb", "0.0001"]);
    assert_eq!(
        code,
        Some(5),
        "a budget too small is a resource error:\n{log}"
    );
    // Refused before anything listens (issue 46.4), naming the value to give.
    let line = last_line(&log);
    assert!(
        line.starts_with("k3d: error:")
            && line.contains("RAM budget")
            && line.contains("give --ram-gb"),
        "{line:?}\n{log}"
    );
    assert!(!socket.exists(), "the socket is removed");
}

/// A request on session `name`, queued behind a running one (`--max-active 1`); returns its
/// stream and id once it was told its queue position.
async fn queued_on_session(
    c: &mut k3proto::v1::engine_client::EngineClient<tonic::transport::Channel>,
    name: &str,
) -> (tonic::Streaming<pb::Event>, u64) {
    let mut req = ids_request(prompt(5), 4);
    req.session = name.into();
    let mut stream = c.generate(req).await.expect("queued").into_inner();
    let mut id = 0;
    loop {
        match stream.next().await.expect("event").expect("ok").event {
            Some(pb::event::Event::Accepted(a)) => id = a.request_id,
            Some(pb::event::Event::Queued(_)) => return (stream, id),
            other => panic!("expected Accepted then Queued, got {other:?}"),
        }
    }
}

/// The session's next request is accepted (not ABORTED "in use") right away.
async fn session_usable(
    c: &mut k3proto::v1::engine_client::EngineClient<tonic::transport::Channel>,
    name: &str,
    what: &str,
) {
    let mut req = ids_request(prompt(5), 4);
    req.session = name.into();
    // The abandon reaches the daemon when the client's stream reset does: allow for that
    // network round trip, nothing more.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match c.generate(req.clone()).await {
            Ok(stream) => {
                drop(stream);
                return;
            }
            Err(e) if e.code() == tonic::Code::Aborted && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("{what}: the session is still refused: {e:?}"),
        }
    }
}

#[tokio::test]
async fn a_session_cancelled_or_abandoned_while_queued_is_usable_at_once() {
    let (d, mut c) = ready_daemon("life-queued-session", &["--max-active", "1"]).await;
    let running = computing(&mut c, prompt(0)).await;

    let (mut queued, id) = queued_on_session(&mut c, "qs").await;
    c.cancel(pb::CancelRequest { request_id: id })
        .await
        .expect("cancel");
    let end = collect_rest(&mut queued).await;
    assert_eq!(end.map(|e| e.code()), Some(tonic::Code::Cancelled));
    session_usable(&mut c, "qs", "after a cancel while queued").await;

    let (queued, _) = queued_on_session(&mut c, "qa").await;
    drop(queued);
    session_usable(&mut c, "qa", "after an abandon while queued").await;
    drop(running);
    drop(d);
}

/// The status that ends a stream, if it ends with one.
async fn collect_rest(stream: &mut tonic::Streaming<pb::Event>) -> Option<tonic::Status> {
    while let Some(item) = stream.next().await {
        if let Err(status) = item {
            return Some(status);
        }
    }
    None
}

#[test]
fn sigterm_while_the_model_loads_exits_0_at_once() {
    let tmp = scratch("life-sigterm-load");
    let dir = tmp.path();
    // The `small` shape takes seconds to load: long enough for a signal to land during it.
    let model = synth_model("small", &dir.join("small"));
    let socket = dir.join("k3d.sock");
    let mut d = Daemon::start(&model, &socket, &["--shutdown-grace", "2"]);
    d.wait_for_log("] loading ", Duration::from_secs(30));
    // "] loaded NAME in": the end of the load (progress lines read "…: loaded X of Y").
    assert!(
        !d.log_text().contains("] loaded "),
        "the model loaded before the signal:\n{}",
        d.log_text()
    );
    let t = Instant::now();
    d.signal(libc::SIGTERM);
    let status = d.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{}", d.log_text());
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    assert!(!socket.exists(), "the socket is removed");
}

/// While the `small` model (327 MiB, all resident) loads, Status reports bytes: increasing, of
/// one total, with a rate and an ETA once reading; the total is what the load read (Status's
/// `bytes_read` once ready, before any request), and the log words the same figures.
#[tokio::test]
async fn status_reports_load_progress_in_bytes_with_rate_and_eta() {
    let tmp = scratch("life-progress");
    let dir = tmp.path();
    let model = synth_model("small", &dir.join("small"));
    let d = Daemon::start(&model, &dir.join("k3d.sock"), &[]);
    let mut c = client(&d.socket).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen: Vec<pb::Progress> = Vec::new();
    let ready = loop {
        let s = status(&mut c).await;
        if s.state == "ready" {
            break s;
        }
        assert_eq!(s.state, "loading", "{s:?}");
        let p = s
            .load_progress
            .expect("a loading daemon reports its progress");
        assert_eq!(p.phase, pb::Phase::Load as i32);
        let figures = k3_engine::serve::LoadFigures {
            done: p.done,
            total: p.total,
            bytes_per_second: p.bytes_per_second,
            eta_seconds: p.eta_seconds,
        };
        assert_eq!(p.text, figures.to_string(), "the core's words on the wire");
        if p.total > 0 {
            seen.push(p);
        }
        assert!(Instant::now() < deadline, "not ready after 60 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(!seen.is_empty(), "no byte figure seen while loading");
    let total = seen[0].total;
    assert_eq!(
        total, ready.bytes_read,
        "the total is the bytes the load reads (every layer of `small` is pinned)"
    );
    for w in seen.windows(2) {
        assert_eq!(w[1].total, total, "one total throughout");
        assert!(
            w[1].done >= w[0].done,
            "monotone: {:?} then {:?}",
            w[0],
            w[1]
        );
    }
    let distinct: std::collections::BTreeSet<u64> = seen.iter().map(|p| p.done).collect();
    assert!(
        distinct.len() >= 2 && seen.iter().any(|p| p.done > 0 && p.done < total),
        "the figure advanced while loading: {distinct:?} of {total}"
    );
    for p in seen.iter().filter(|p| p.done > 0 && p.done < total) {
        assert!(p.bytes_per_second > 0.0, "{p:?}");
        let eta = p.eta_seconds.expect("an ETA once a rate is known");
        let expected = (total - p.done) as f64 / p.bytes_per_second;
        assert!((eta - expected).abs() < 1e-6 * expected.max(1.0), "{p:?}");
    }
    let log = d.log_text();
    let line = |done| {
        let figures = k3_engine::serve::LoadFigures {
            done,
            total,
            ..Default::default()
        };
        format!("loading the model: {figures}")
    };
    assert!(
        log.contains(&line(0)) && log.contains(&format!("{}, ", line(total))),
        "the log words the first and the last figure:\n{log}"
    );
}

/// One model fingerprint everywhere: what `k3d synth` prints is what `k3d check --json`, the
/// daemon's Status and `k3 status` report for the checkpoint it wrote.
#[tokio::test]
async fn synth_check_and_status_print_one_fingerprint() {
    let tmp = scratch("life-fingerprint");
    let dir = tmp.path();
    let model = dir.join("tiny");
    let printed = command_support::synth_printed(&bin("k3d"), "tiny", &model, "fingerprint");
    let content = command_support::synth(&bin("k3d"), "tiny", &model);
    assert_ne!(
        printed, content,
        "the content digest is another value, printed apart"
    );
    let check = Command::new(bin("k3d"))
        .args(["check", "--json"])
        .arg(&model)
        .output()
        .expect("k3d check");
    let check: serde_json::Value = serde_json::from_slice(&check.stdout).expect("check JSON");
    assert_eq!(check["fingerprint"].as_str(), Some(printed.as_str()));
    let d = Daemon::start(&model, &dir.join("k3d.sock"), &[]);
    let mut c = client(&d.socket).await;
    let ready = wait_ready(&mut c).await;
    let reported = ready
        .model
        .expect("a ready daemon names its model")
        .fingerprint;
    assert_eq!(reported, printed, "Status reports synth's fingerprint");
    let status = Command::new(bin("k3"))
        .arg("--socket")
        .arg(&d.socket)
        .arg("status")
        .output()
        .expect("k3 status");
    let text = text(&status.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("fingerprint") && l.ends_with(&printed)),
        "{text}"
    );
}

#[tokio::test]
async fn sigterm_with_requests_queued_prefilling_and_decoding_keeps_the_session() {
    let (mut d, mut c) = ready_daemon(
        "life-phases",
        &[
            "--max-active",
            "2",
            "--max-active-per-uid",
            "2",
            "--shutdown-grace",
            "0.5",
        ],
    )
    .await;
    // A completed turn on a session: acknowledged, so it must survive the shutdown.
    let mut turn = ids_request(prompt(1), 3);
    turn.session = "kept".into();
    let first = generate(&mut c, turn).await;
    assert!(first.done.is_some(), "{:?}", first.error);
    // Decoding, on the same session, when the signal lands.
    let mut req = ids_request(prompt(1), 4000);
    req.session = "kept".into();
    let mut decoding = c.generate(req).await.expect("accepted").into_inner();
    until_token(&mut decoding).await;
    // Prefilling: a long prompt in chunks.
    let long: Vec<u32> = (0..2000).map(|i| 10 + (i % 50)).collect();
    let mut prefilling = c
        .generate(ids_request(long, 4))
        .await
        .expect("accepted")
        .into_inner();
    // Queued behind both.
    let mut queued = queued(&mut c, ids_request(prompt(3), 4)).await;
    let t = Instant::now();
    d.signal(libc::SIGTERM);
    for (what, stream) in [
        ("decoding", &mut decoding),
        ("prefilling", &mut prefilling),
        ("queued", &mut queued),
    ] {
        let end = collect_rest(stream).await;
        let code = end.as_ref().map(|s| s.code());
        assert!(
            code == Some(tonic::Code::Cancelled) || code.is_none(),
            "{what}: {end:?}"
        );
    }
    let status = d.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{}", d.log_text());
    assert!(t.elapsed() < Duration::from_secs(7), "{:?}", t.elapsed());
    assert!(!d.socket.exists(), "the socket is removed");
    let file = d.socket.with_extension("sessions").join("0@kept.k3s");
    assert!(
        file.exists(),
        "the session was written at shutdown:\n{}",
        d.log_text()
    );
}
