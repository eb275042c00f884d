//! `k3d serve` end to end: a real daemon process on a real Unix socket, driven over gRPC.

#[path = "e2e_support.rs"]
mod support;

use k3proto::v1 as pb;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};
use support::command_support::run_ok;
use support::*;
use tokio_stream::StreamExt;

#[tokio::test]
async fn loads_once_and_the_second_request_is_warm() {
    let (d, mut c) = ready_daemon("warm", &[]).await;
    let ready = wait_ready(&mut c).await;
    assert!(ready.model.is_some(), "status names the model");
    let first = generate(&mut c, ids_request(prompt(0), 8)).await;
    let t = Instant::now();
    let second = generate(&mut c, ids_request(prompt(0), 8)).await;
    let warm = t.elapsed();
    assert!(
        first.error.is_none() && second.error.is_none(),
        "{first:?} {second:?}"
    );
    assert_eq!(first.ids.len(), 8);
    assert_eq!(first.ids, second.ids, "greedy output is reproducible");
    let done = second.done.expect("Done event");
    assert_eq!(done.generated_tokens, 8);
    assert_eq!(
        done.bytes_read, 0,
        "a warm request re-reads no resident weight"
    );
    assert!(matches!(
        second.events.first(),
        Some(pb::event::Event::Accepted(_))
    ));
    // The daemon's memory plan, pinned layers and expert cache, as the engine reports them.
    let s = status(&mut c).await;
    assert!(s.plan.starts_with("memory plan"), "{}", s.plan);
    let n = s.pinned_layers.len() as u32;
    assert!(n > 0 && s.pinned_layers == (0..n).collect::<Vec<_>>());
    assert!(
        s.plan.contains(&format!("{n} of {n} layers pinned")),
        "{}",
        s.plan
    );
    let cache = s.cache.expect("cache figures");
    assert!(cache.capacity_bytes > 0);
    assert_eq!(
        cache.used_bytes, cache.capacity_bytes,
        "the default (max) plan holds every expert"
    );
    assert!(cache.hits > 0, "{cache:?}");
    assert_eq!(
        d.log_text().matches("] loaded ").count(),
        1,
        "the model is loaded once:\n{}",
        d.log_text()
    );
    eprintln!("warm request of 8 tokens: {warm:?}");
}

#[tokio::test]
async fn cancel_stops_a_generation_in_the_middle() {
    let (d, mut c) = ready_daemon("cancel", &[]).await;
    // Warm up once so every thread the daemon keeps exists before counting.
    assert!(
        generate(&mut c, ids_request(prompt(9), 2))
            .await
            .error
            .is_none()
    );
    let threads_before = threads(&d);
    let mut latencies = Vec::new();
    for round in 0..5 {
        let mut stream = c
            .generate(ids_request(prompt(round), 4000))
            .await
            .expect("accepted")
            .into_inner();
        let mut id = None;
        let mut tokens = 0;
        while tokens < 3 {
            match stream.next().await.expect("event").expect("no error").event {
                Some(pb::event::Event::Accepted(a)) => id = Some(a.request_id),
                Some(pb::event::Event::Token(_)) => tokens += 1,
                _ => {}
            }
        }
        let t = Instant::now();
        c.cancel(pb::CancelRequest {
            request_id: id.expect("accepted first"),
        })
        .await
        .expect("cancel");
        let rest = collect(stream).await;
        latencies.push(t.elapsed());
        let err = rest.error.expect("the stream ends with an error status");
        assert_eq!(err.code(), tonic::Code::Cancelled, "{err:?}");
        assert!(rest.done.is_none());
        assert!(rest.ids.len() < 3990, "the generation stopped early");
    }
    latencies.sort();
    eprintln!(
        "cancel latency (Cancel sent → stream closed), median of 5: {:?}, max {:?}",
        latencies[2], latencies[4]
    );
    assert!(latencies[4] < Duration::from_secs(2), "{latencies:?}");
    // Cancelling something finished is NOT_FOUND; nothing is left running.
    let s = status(&mut c).await;
    assert_eq!(s.active_requests, 0);
    assert_eq!(s.requests_cancelled, 5);
    assert_eq!(
        threads(&d),
        threads_before,
        "cancelled requests leave no threads behind"
    );
    let err = c
        .cancel(pb::CancelRequest { request_id: 1 })
        .await
        .expect_err("finished");
    assert_eq!(err.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn a_dropped_stream_stops_its_compute() {
    let (_d, mut c) = ready_daemon("drop", &[]).await;
    let mut stream = c
        .generate(ids_request(prompt(1), 4000))
        .await
        .expect("accepted")
        .into_inner();
    let mut tokens = 0;
    while tokens < 2 {
        if let Some(pb::event::Event::Token(_)) =
            stream.next().await.expect("event").expect("ok").event
        {
            tokens += 1;
        }
    }
    let t = Instant::now();
    drop(stream);
    loop {
        let s = status(&mut c).await;
        if s.active_requests == 0 {
            assert_eq!(s.requests_cancelled, 1);
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "compute still running after the client left"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    eprintln!("dropped stream → compute stopped within {:?}", t.elapsed());
}

#[tokio::test]
async fn sixteen_concurrent_clients_get_what_they_get_alone() {
    let (d, mut c) = ready_daemon(
        "concurrent",
        // One account (root) sends all 16: the test is of the slots, not of their fair share.
        &[
            "--max-queue",
            "16",
            "--max-active",
            "4",
            "--max-active-per-uid",
            "4",
            "--max-queued-per-uid",
            "16",
        ],
    )
    .await;
    let requests: Vec<_> = (0..16).map(|i| ids_request(prompt(i), 12)).collect();
    let alone = solo_ids(&mut c, &requests).await;
    let mut queued_seen = false;
    for r in concurrently_as_alone(&d.socket, &requests, &alone).await {
        queued_seen |= r
            .events
            .iter()
            .any(|e| matches!(e, pb::event::Event::Queued(_)));
    }
    assert!(
        queued_seen,
        "with 4 compute slots some of 16 clients must have been queued"
    );
}

/// Batched decoding (issue 7 item 4): four concurrent requests with different prompt lengths
/// (one longer than a prefill chunk) are stepped through shared forward passes — Status shows
/// passes serving all four — and each gets exactly the ids it gets alone.
#[tokio::test]
async fn four_concurrent_batched_requests_each_equal_their_solo_runs() {
    let (d, mut c) = ready_daemon(
        "batched",
        &[
            "--max-active",
            "4",
            "--max-batch",
            "4",
            "--max-active-per-uid",
            "4",
        ],
    )
    .await;
    let prompts: Vec<Vec<u32>> = vec![
        prompt(1),
        (0..45).map(|i| 3 + (i * 7) % 90).collect(),
        vec![77],
        prompt(2).repeat(3),
    ];
    let lengths = [160, 120, 200, 140];
    let requests: Vec<_> = prompts
        .into_iter()
        .zip(lengths)
        .map(|(p, n)| ids_request(p, n))
        .collect();
    let alone = solo_ids(&mut c, &requests).await;
    for (ids, n) in alone.iter().zip(lengths) {
        assert_eq!(ids.len(), n as usize);
    }
    let before = wait_ready(&mut c).await;
    assert_eq!(before.max_batch, 4);
    assert_eq!(before.widest_batch, 1, "solo runs are passes of one");
    concurrently_as_alone(&d.socket, &requests, &alone).await;
    let after = wait_ready(&mut c).await;
    assert_eq!(after.widest_batch, 4, "a pass served all four requests");
    assert!(
        after.batched_passes > before.batched_passes + 50,
        "most steps were shared: {} batched passes of {}",
        after.batched_passes - before.batched_passes,
        after.forward_passes - before.forward_passes
    );
}

/// `--max-batch` caps how many requests share a pass; the others wait their turn (first in the
/// next round) and every output is still exactly as alone.
#[tokio::test]
async fn max_batch_caps_the_requests_per_pass() {
    let (d, mut c) = ready_daemon(
        "batch-cap",
        &[
            "--max-active",
            "4",
            "--max-batch",
            "2",
            "--max-active-per-uid",
            "4",
        ],
    )
    .await;
    let requests: Vec<_> = (0..4).map(|i| ids_request(prompt(i), 100)).collect();
    let alone = solo_ids(&mut c, &requests).await;
    concurrently_as_alone(&d.socket, &requests, &alone).await;
    let status = wait_ready(&mut c).await;
    assert_eq!(status.max_batch, 2);
    assert_eq!(
        status.widest_batch, 2,
        "never more than --max-batch per pass"
    );
    assert!(status.batched_passes > 0);
}

#[tokio::test]
async fn a_full_queue_refuses_with_resource_exhausted() {
    let (_d, mut c) = ready_daemon("busy", &["--max-queue", "1", "--max-active", "1"]).await;
    // Wait until it computes, so the next one queues rather than starts.
    let running = computing(&mut c, prompt(0)).await;
    let mut waiting = c
        .generate(ids_request(prompt(1), 4))
        .await
        .expect("second is queued")
        .into_inner();
    let mut position = None;
    while position.is_none() {
        if let Some(pb::event::Event::Queued(q)) =
            waiting.next().await.expect("event").expect("ok").event
        {
            position = Some(q.position);
        }
    }
    assert_eq!(position, Some(1));
    let err = c
        .generate(ids_request(prompt(2), 4))
        .await
        .expect_err("third is refused");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(err.message().contains("busy"), "{}", err.message());
    drop(running);
    let second = collect(waiting).await;
    assert!(
        second.error.is_none(),
        "the queued request runs once the slot frees: {:?}",
        second.error
    );
    assert_eq!(second.ids.len(), 4);
}

#[tokio::test]
async fn malformed_requests_get_clear_statuses_and_the_daemon_stays_up() {
    let (d, mut c) = ready_daemon("malformed", &[]).await;
    let ready = wait_ready(&mut c).await;
    let baseline = generate(&mut c, ids_request(prompt(3), 5)).await.ids;

    let empty = c
        .generate(ids_request(vec![], 5))
        .await
        .expect_err("empty prompt");
    assert_eq!(empty.code(), tonic::Code::InvalidArgument);
    assert!(empty.message().contains("empty"), "{}", empty.message());

    let none = c
        .generate(pb::GenerateRequest {
            prompt: None,
            options: None,
            session: String::new(),
        })
        .await
        .expect_err("no prompt");
    assert_eq!(none.code(), tonic::Code::InvalidArgument);

    // An id beyond the vocabulary: refused at submission, before any compute (the serve core
    // validates every rule before queueing).
    let err = c
        .generate(ids_request(vec![1, u32::MAX - 1], 5))
        .await
        .expect_err("id out of range is an error");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("vocabulary"), "{}", err.message());

    // `max_tokens` is a ceiling, clamped to the daemon's cap (issue 34.4), never refused: an
    // absurd one starts generating like any other.
    let mut clamped = c
        .generate(ids_request(prompt(0), u32::MAX))
        .await
        .expect("an absurd max_tokens is clamped, not refused")
        .into_inner();
    let first = clamped.message().await.expect("a first event");
    assert!(first.is_some(), "the stream ended at once");
    drop(clamped);

    let mut bad = ids_request(prompt(0), 5);
    bad.options.as_mut().expect("options").sampling = Some(pb::Sampling {
        temperature: f32::NAN,
        ..Default::default()
    });
    let err = c
        .generate(bad)
        .await
        .expect_err("NaN temperature is an error");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("temperature"), "{}", err.message());

    // Logit bias and penalties: OpenAI's ranges, refused naming the field; a +100 bias makes
    // greedy take that id every time.
    let mut biased = ids_request(prompt(0), 4);
    let sampling = |bias: f32, presence: f32| pb::Sampling {
        logit_bias: [(7, bias)].into_iter().collect(),
        presence_penalty: presence,
        ..Default::default()
    };
    biased.options.as_mut().expect("options").sampling = Some(sampling(100.0, 0.0));
    let out = collect(
        c.generate(biased.clone())
            .await
            .expect("biased")
            .into_inner(),
    )
    .await;
    assert_eq!(out.ids, vec![7; 4], "{:?}", out.error);
    for (bias, presence, field) in [(100.5, 0.0, "logit_bias"), (1.0, 2.5, "presence_penalty")] {
        biased.options.as_mut().expect("options").sampling = Some(sampling(bias, presence));
        let err = c.generate(biased.clone()).await.expect_err(field);
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains(field), "{}", err.message());
    }

    let chat = c
        .chat(pb::ChatRequest::default())
        .await
        .expect_err("no messages");
    assert_eq!(chat.code(), tonic::Code::InvalidArgument);

    // Over the 16 MiB message limit.
    let huge = pb::GenerateRequest {
        prompt: Some(pb::generate_request::Prompt::Text("x".repeat(17 << 20))),
        options: None,
        session: String::new(),
    };
    let err = c.generate(huge).await.expect_err("oversized message");
    assert!(
        matches!(
            err.code(),
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
        ),
        "{err:?}"
    );
    assert!(
        err.message().contains("too large") || err.message().contains("length"),
        "{}",
        err.message()
    );

    let err = c
        .detokenize(pb::DetokenizeRequest {
            ids: vec![u32::MAX],
        })
        .await
        .expect_err("bad id");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    // Garbage on the socket: that connection dies, nothing else notices.
    {
        use std::io::{Read, Write};
        let mut raw = std::os::unix::net::UnixStream::connect(&d.socket).expect("raw connect");
        raw.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let _ = raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\xff\xfe garbage garbage\r\n");
        let mut sink = Vec::new();
        let _ = raw.read_to_end(&mut sink);
    }
    let after = generate(&mut client(&d.socket).await, ids_request(prompt(3), 5)).await;
    assert!(after.error.is_none(), "{:?}", after.error);
    assert_eq!(
        after.ids, baseline,
        "requests after all the bad ones are unaffected"
    );
    let s = status(&mut c).await;
    assert_eq!(s.state, "ready");
    assert_eq!(s.model, ready.model);
}

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

#[test]
fn socket_is_0660_with_its_group_and_a_live_socket_is_not_stolen() {
    let tmp = scratch("mode");
    let dir = tmp.path();
    let socket = dir.join("k3d.sock");
    let group = ensure_group("k3e2e");
    let d = Daemon::start(tiny_model(), &socket, &["--socket-group", "k3e2e"]);
    let meta = std::fs::metadata(&socket).expect("socket exists");
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), group);
    let out = std::process::Command::new(bin("k3d"))
        .args(["serve", "--model"])
        .arg(tiny_model())
        .arg("--socket")
        .arg(&socket)
        .output()
        .expect("second k3d");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::os::unix::net::UnixStream::connect(&d.socket).is_ok(),
        "the first daemon still serves"
    );
    drop(d);
    let d = Daemon::start(
        tiny_model(),
        &dir.join("private.sock"),
        &["--socket-mode", "0600"],
    );
    let meta = std::fs::metadata(&d.socket).expect("socket exists");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
}

#[test]
fn users_outside_the_socket_group_are_refused_by_permissions() {
    let tmp = scratch("users");
    let dir = tmp.path();
    ensure_group("k3e2e");
    ensure_user("k3e2e-member", Some("k3e2e"));
    ensure_user("k3e2e-outsider", None);
    let d = Daemon::start(
        tiny_model(),
        &dir.join("k3d.sock"),
        &["--socket-group", "k3e2e"],
    );
    let run_as = |user: &str| {
        std::process::Command::new("runuser")
            .args(["-u", user, "--"])
            .arg(bin("k3"))
            .arg("--socket")
            .arg(&d.socket)
            .arg("status")
            .output()
            .expect("runuser")
    };
    let member = run_as("k3e2e-member");
    assert!(
        member.status.success(),
        "group member: {}",
        String::from_utf8_lossy(&member.stderr)
    );
    let outsider = run_as("k3e2e-outsider");
    assert_eq!(
        outsider.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&outsider.stderr)
    );
    let msg = String::from_utf8_lossy(&outsider.stderr);
    assert!(
        msg.contains("permission denied") && msg.contains("k3e2e"),
        "says which group to join: {msg}"
    );
    // A generation as the member: the daemon logs its peer uid (SO_PEERCRED).
    run_ok(
        std::process::Command::new("runuser")
            .args(["-u", "k3e2e-member", "--"])
            .arg(bin("k3"))
            .arg("--socket")
            .arg(&d.socket)
            .args(["run", "--ids", "--max-tokens", "2", "5 6 7"]),
    );
    let uid = uid_of("k3e2e-member");
    assert!(
        d.log_text().contains(&format!("from uid {uid} ")),
        "{}",
        d.log_text()
    );
}

/// The permission advice names what really stands in the way, for each way a socket can be
/// closed to a user: a socket private to its owner, one whose group is root (the daemon started
/// without --socket-group: joining root is not the fix), a directory on the way that is closed,
/// and a group the user is not in.
#[test]
fn permission_advice_fits_each_way_the_socket_is_closed() {
    let dir = scratch("advice");
    let gid = ensure_group("k3e2e");
    ensure_user("k3e2e-outsider", None);
    let advice = |socket: &std::path::Path| {
        let out = std::process::Command::new("runuser")
            .args(["-u", "k3e2e-outsider", "--"])
            .arg(bin("k3"))
            .arg("--socket")
            .arg(socket)
            .arg("status")
            .output()
            .expect("runuser");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(4), "{err}");
        err
    };
    let private = Daemon::start(
        tiny_model(),
        &dir.path().join("private.sock"),
        &["--socket-mode", "0600"],
    );
    let msg = advice(&private.socket);
    assert!(
        msg.contains("private to its owner root (mode 0600)")
            && msg.contains("--socket-mode 0660 --socket-group"),
        "{msg}"
    );
    drop(private);

    let root_group = Daemon::start(tiny_model(), &dir.path().join("rootgroup.sock"), &[]);
    let msg = advice(&root_group.socket);
    assert!(
        msg.contains("belongs to group root")
            && msg.contains("--socket-group k3")
            && !msg.contains("usermod -aG root"),
        "{msg}"
    );
    drop(root_group);

    let closed = dir.path().join("closed");
    std::fs::create_dir(&closed).expect("mkdir");
    let in_closed = Daemon::start(
        tiny_model(),
        &closed.join("k3d.sock"),
        &["--socket-group", "k3e2e"],
    );
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let msg = advice(&in_closed.socket);
    assert!(
        msg.contains(&format!(
            "the directory {} (owner root, group root, mode 0700) is closed to you",
            closed.display()
        )) && msg.contains("chmod 0755")
            && !msg.contains("usermod"),
        "{msg}"
    );
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o750)).expect("chmod");
    std::os::unix::fs::chown(&closed, None, Some(gid)).expect("chown");
    let msg = advice(&in_closed.socket);
    assert!(
        msg.contains("group k3e2e, mode 0750) is closed to you")
            && msg.contains("usermod -aG k3e2e $USER"),
        "{msg}"
    );
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let msg = advice(&in_closed.socket);
    assert!(
        msg.contains("for the members of group k3e2e") && msg.contains("usermod -aG k3e2e $USER"),
        "{msg}"
    );
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

/// Threads of the daemon process right now.
fn threads(d: &Daemon) -> usize {
    std::fs::read_dir(format!("/proc/{}/task", d.child.id()))
        .expect("/proc/PID/task")
        .count()
}

#[tokio::test]
async fn chat_labels_each_token_with_its_channel() {
    let (_d, mut c) = ready_daemon("chat", &[]).await;
    let conversation = |thinking: pb::Thinking| pb::ChatRequest {
        messages: vec![
            pb::ChatMessage {
                role: pb::Role::System.into(),
                content: "You are helpful.".into(),
                ..Default::default()
            },
            pb::ChatMessage {
                role: pb::Role::User.into(),
                content: "Hello".into(),
                ..Default::default()
            },
        ],
        thinking: thinking.into(),
        effort: pb::Effort::Default.into(),
        options: Some(pb::GenerationOptions {
            max_tokens: 16,
            ..Default::default()
        }),
        session: String::new(),
        ..Default::default()
    };
    for thinking in [pb::Thinking::On, pb::Thinking::Off] {
        let r = collect(
            c.chat(conversation(thinking))
                .await
                .expect("chat accepted")
                .into_inner(),
        )
        .await;
        assert!(r.error.is_none(), "{:?}", r.error);
        let channels: Vec<pb::Channel> = r
            .events
            .iter()
            .filter_map(|e| match e {
                pb::event::Event::Token(t) => {
                    Some(pb::Channel::try_from(t.channel).expect("known channel"))
                }
                _ => None,
            })
            .collect();
        assert!(!channels.is_empty());
        assert!(
            !channels.contains(&pb::Channel::Text),
            "chat tokens carry chat channels"
        );
        if thinking == pb::Thinking::Off {
            assert!(!channels.contains(&pb::Channel::Reasoning));
        } else {
            // Until the model writes structure, the reply is in the think channel.
            assert_ne!(channels.first(), Some(&pb::Channel::Response));
        }
        let done = r.done.expect("done");
        if done.stop_reason == pb::StopReason::EndOfTurn as i32 {
            assert!(done.stop_id != 0);
        }
    }
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

/// Chat with tools: tools, tool_choice, response_format, an assistant's tool calls and tool
/// results all reach the template (each adds to the rendered prompt), mistakes in them are
/// INVALID_ARGUMENT naming the message and field, and a reply's streamed tool-call deltas add
/// up to Done's tool calls.
#[tokio::test]
async fn chat_renders_tools_and_names_bad_fields() {
    let (_d, mut c) = ready_daemon("chat-tools", &[]).await;
    let message = |role: pb::Role, content: &str| pb::ChatMessage {
        role: role.into(),
        content: content.into(),
        ..Default::default()
    };
    let history = || {
        let mut assistant = message(pb::Role::Assistant, "");
        assistant.tool_calls = vec![
            pb::ToolCall {
                id: "a".into(),
                name: "get_weather".into(),
                arguments: r#"{"city": "Paris"}"#.into(),
            },
            pb::ToolCall {
                id: "b".into(),
                name: "now".into(),
                arguments: "{}".into(),
            },
        ];
        let result = |id: &str, content: &str| pb::ChatMessage {
            tool_call_id: id.into(),
            ..message(pb::Role::Tool, content)
        };
        vec![
            message(pb::Role::User, "weather?"),
            assistant,
            result("b", "noon"),
            result("a", "sunny"),
        ]
    };
    let base = pb::ChatRequest {
        messages: history(),
        thinking: pb::Thinking::Off.into(),
        options: Some(pb::GenerationOptions {
            max_tokens: 8,
            ..Default::default()
        }),
        ..Default::default()
    };
    let tools = pb::ChatRequest {
        tools: vec![pb::Tool {
            name: "get_weather".into(),
            description: "Weather of a city".into(),
            parameters: r#"{"type": "object", "properties": {"city": {"type": "string"}}}"#.into(),
        }],
        ..base.clone()
    };
    // A forced call needs room for its tags: fewer is refused naming max_tokens (issue 45.4).
    let required = pb::ChatRequest {
        tool_choice: pb::ToolChoice::Required.into(),
        options: Some(pb::GenerationOptions {
            max_tokens: 40,
            ..Default::default()
        }),
        ..tools.clone()
    };
    let schema = pb::ChatRequest {
        response_format: pb::ResponseFormat::JsonSchema.into(),
        json_schema: r#"{"type": "object"}"#.into(),
        ..required.clone()
    };
    let mut prompt_tokens = Vec::new();
    for request in [base.clone(), tools.clone(), required.clone(), schema] {
        let r = collect(c.chat(request).await.expect("chat accepted").into_inner()).await;
        assert!(r.error.is_none(), "{:?}", r.error);
        let accepted = r.events.iter().find_map(|e| match e {
            pb::event::Event::Accepted(a) => Some(a.prompt_tokens),
            _ => None,
        });
        prompt_tokens.push(accepted.expect("accepted"));
        let done = r.done.expect("done");
        for (i, call) in done.tool_calls.iter().enumerate() {
            let streamed: String = r
                .events
                .iter()
                .filter_map(|e| match e {
                    pb::event::Event::Token(pb::Token {
                        tool_call: Some(d), ..
                    }) if d.index as usize == i => Some(d.arguments.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(streamed, call.arguments);
        }
    }
    assert!(
        prompt_tokens.windows(2).all(|w| w[0] < w[1]),
        "each construct adds to the prompt: {prompt_tokens:?}"
    );

    let refused = |request: pb::ChatRequest| {
        let mut c = c.clone();
        async move {
            let status = match c.chat(request).await {
                Err(status) => status,
                Ok(stream) => collect(stream.into_inner()).await.error.expect("refused"),
            };
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
            status.message().to_owned()
        }
    };
    let mut unknown = base.clone();
    unknown.messages[3].tool_call_id = "zz".into();
    assert!(refused(unknown).await.contains("messages[3].tool_call_id"));
    // OpenAI's types give `name` to every role but tool (an assistant's is not rendered).
    let mut named = base.clone();
    named.messages[3].name = "bot".into();
    assert!(refused(named).await.contains("messages[3].name"));
    let nothing = pb::ChatRequest {
        tool_choice: pb::ToolChoice::Required.into(),
        ..base.clone()
    };
    assert!(refused(nothing).await.contains("tool_choice"));
    let mut bad_parameters = tools.clone();
    bad_parameters.tools[0].parameters = "{oops".into();
    assert!(
        refused(bad_parameters)
            .await
            .contains("tools[0].parameters is not JSON")
    );
    let no_schema = pb::ChatRequest {
        response_format: pb::ResponseFormat::JsonSchema.into(),
        ..base
    };
    assert!(refused(no_schema).await.contains("json_schema"));
}

/// A gRPC codec that sends its bytes as they are: a message body no protobuf decoder accepts.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        buf: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(buf, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(buf);
        Ok(Some(bytes::Buf::copy_to_bytes(buf, n).to_vec()))
    }
}

/// A body that is not protobuf is the caller's fault (`INVALID_ARGUMENT`), not a model failure
/// (`INTERNAL`, which `k3` reports as "the model failed"), on unary and streaming calls alike.
#[tokio::test]
async fn a_request_that_is_not_protobuf_is_invalid_argument() {
    let (d, mut c) = ready_daemon("not_protobuf", &[]).await;
    let mut grpc = tonic::client::Grpc::new(channel(&d.socket).await);
    // Field 1, length-delimited, then a length varint that never ends.
    let garbage = vec![0x0a, 0xff, 0xff, 0xff];
    for method in [
        "/k3.v1.Engine/Tokenize",
        "/k3.v1.Engine/Generate",
        "/k3.v1.Engine/Cancel",
    ] {
        grpc.ready().await.expect("channel ready");
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(method);
        let err = if method.ends_with("Generate") {
            grpc.server_streaming(tonic::Request::new(garbage.clone()), path, RawCodec)
                .await
                .map(|_| ())
                .expect_err("garbage generate")
        } else {
            grpc.unary(tonic::Request::new(garbage.clone()), path, RawCodec)
                .await
                .map(|_| ())
                .expect_err("garbage unary call")
        };
        assert_eq!(
            err.code(),
            tonic::Code::InvalidArgument,
            "{method}: {err:?}"
        );
        assert!(
            err.message().contains("not a valid"),
            "{method}: {}",
            err.message()
        );
    }
    assert_eq!(status(&mut c).await.state, "ready", "the daemon stays up");
}

/// Errors quote what they refuse, but a bounded excerpt of it: a 100 KB session name is
/// refused as an invalid argument (before, quoting it whole overflowed the reply's header and
/// the client saw a transport error instead of the refusal).
#[tokio::test]
async fn an_error_quotes_a_huge_input_cut_short_with_its_length() {
    let (_d, mut c) = ready_daemon("huge_echo", &[]).await;
    let name = "n".repeat(100_000);
    let mut req = ids_request(prompt(0), 2);
    req.session = name.clone();
    let err = c.generate(req).await.expect_err("invalid session name");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    let msg = err.message();
    assert!(msg.contains("invalid session name"), "{msg}");
    assert!(msg.contains("… (100000 bytes)"), "{msg}");
    assert!(msg.len() < 512, "{} bytes: {msg}", msg.len());

    let err = c
        .delete_session(pb::DeleteSessionRequest { name: name.clone() })
        .await
        .expect_err("invalid session name");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().len() < 512, "{}", err.message().len());

    // A conversation quoting a 100 KB tool-call id it does not know.
    let chat = pb::ChatRequest {
        messages: vec![
            pb::ChatMessage {
                role: pb::Role::User.into(),
                content: "hi".into(),
                ..Default::default()
            },
            pb::ChatMessage {
                role: pb::Role::Assistant.into(),
                tool_calls: vec![pb::ToolCall {
                    id: "call_0".into(),
                    name: "f".into(),
                    arguments: "{}".into(),
                }],
                ..Default::default()
            },
            pb::ChatMessage {
                role: pb::Role::Tool.into(),
                content: "result".into(),
                tool_call_id: name,
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let err = c.chat(chat).await.expect_err("unknown tool call id");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("… (100000 bytes)"),
        "{}",
        err.message()
    );
    assert!(err.message().len() < 512, "{}", err.message().len());
}

/// Refused requests (nothing computed) are counted as rejected, never as failed: `failed` is
/// the model's (or the storage's) failures only, which an operator alerts on.
#[tokio::test]
async fn refusals_are_counted_as_rejected_not_failed() {
    let (_d, mut c) =
        ready_daemon("refusal_counts", &["--max-active", "1", "--max-queue", "0"]).await;
    let before = status(&mut c).await;
    let mut bad_session = ids_request(prompt(0), 2);
    bad_session.session = "..".into();
    let mut many_stops = ids_request(prompt(0), 2);
    many_stops.options.as_mut().expect("options").stop_strings = vec!["x".into(); 17];
    let refused = [
        ids_request(vec![], 2),
        many_stops,
        ids_request(vec![u32::MAX - 1], 2),
        bad_session,
    ];
    let n = refused.len() as u64;
    for req in refused {
        let err = c.generate(req).await.expect_err("refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    }
    let err = c
        .chat(pb::ChatRequest::default())
        .await
        .expect_err("no messages");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    let ok = generate(&mut c, ids_request(prompt(1), 2)).await;
    assert!(ok.error.is_none(), "{:?}", ok.error);
    // The one compute slot taken and no queue: the next request is refused as busy.
    let running = computing(&mut c, prompt(2)).await;
    let err = c
        .generate(ids_request(prompt(3), 2))
        .await
        .expect_err("queue full");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    drop(running);
    let after = status(&mut c).await;
    assert_eq!(after.requests_failed, before.requests_failed, "{after:?}");
    assert_eq!(after.requests_rejected, before.requests_rejected + n + 2);
    assert_eq!(after.requests_completed, before.requests_completed + 1);
}

/// `k3 run` of a 4,000-token generation (as `user`, with runuser), its stderr piped.
fn long_k3_run(socket: &std::path::Path, user: Option<&str>) -> std::process::Child {
    k3_run(socket, user, 4000)
}

/// `k3 run` of a `max_tokens` generation (as `user`, with runuser), its stderr piped.
fn k3_run(socket: &std::path::Path, user: Option<&str>, max_tokens: u32) -> std::process::Child {
    let mut cmd = match user {
        Some(user) => {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", user, "--"]).arg(bin("k3"));
            c
        }
        None => std::process::Command::new(bin("k3")),
    };
    cmd.arg("--socket")
        .arg(socket)
        .args([
            "run",
            "--ids",
            "--max-tokens",
            &max_tokens.to_string(),
            "5 6 7",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("k3 run")
}

/// Run by [`only_the_owner_or_root_may_cancel_a_request`] as a second account: cancels the
/// request `K3_TEST_CANCEL_ID` on the socket `K3_TEST_CANCEL_SOCKET` and prints the outcome.
#[tokio::test]
#[ignore = "a helper: run as another account by only_the_owner_or_root_may_cancel_a_request"]
async fn helper_cancel_as_this_account() {
    let socket = std::env::var("K3_TEST_CANCEL_SOCKET").expect("K3_TEST_CANCEL_SOCKET");
    let id: u64 = std::env::var("K3_TEST_CANCEL_ID")
        .expect("K3_TEST_CANCEL_ID")
        .parse()
        .expect("a request id");
    let mut c = client(std::path::Path::new(&socket)).await;
    match c.cancel(pb::CancelRequest { request_id: id }).await {
        Ok(_) => println!("cancel-outcome: Ok"),
        Err(s) => println!("cancel-outcome: {:?}: {}", s.code(), s.message()),
    }
}

/// Ids are sequential, so a Cancel of any id must be its owner's (or root's): another member
/// of the socket's group is refused and the request runs on; root's Cancel stops it, and the
/// owner's `k3` says why it stopped (it used to exit 130 in silence).
#[tokio::test]
async fn only_the_owner_or_root_may_cancel_a_request() {
    ensure_group("k3e2e");
    ensure_user("k3e2e-member", Some("k3e2e"));
    ensure_user("k3e2e-member2", Some("k3e2e"));
    let (d, mut c) = ready_daemon("cancel_owner", &["--socket-group", "k3e2e"]).await;
    let owner = uid_of("k3e2e-member");
    let run = long_k3_run(&d.socket, Some("k3e2e-member"));
    let said = format!(": Generate from uid {owner} ");
    d.wait_for_log(&said, Duration::from_secs(20));
    let log = d.log_text();
    let id: u64 = log
        .lines()
        .find(|l| l.contains(&said))
        .and_then(|l| l.split("request ").nth(1))
        .and_then(|rest| rest.split(':').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the request's id in the log:\n{log}"));
    d.wait_for_log(&format!("request {id} started"), Duration::from_secs(20));

    let other = std::process::Command::new("runuser")
        .args(["-u", "k3e2e-member2", "--"])
        .arg(std::env::current_exe().expect("this test binary"))
        .args([
            "--ignored",
            "--exact",
            "helper_cancel_as_this_account",
            "--nocapture",
        ])
        .env("K3_TEST_CANCEL_SOCKET", &d.socket)
        .env("K3_TEST_CANCEL_ID", id.to_string())
        .output()
        .expect("runuser helper");
    let out = text(&other.stdout);
    assert!(
        out.contains("cancel-outcome: PermissionDenied") && out.contains("only its owner or root"),
        "another user's cancel: {out}\n{}",
        text(&other.stderr)
    );
    let s = status(&mut c).await;
    assert_eq!(s.active_requests, 1, "the request runs on: {s:?}");
    assert!(
        !d.log_text().contains(&format!("request {id} cancelled")),
        "{}",
        d.log_text()
    );

    // Root may: the owner's k3 stops with 130 and says why.
    c.cancel(pb::CancelRequest { request_id: id })
        .await
        .expect("root's cancel");
    let out = run.wait_with_output().expect("k3 run");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        err.contains("k3d cancelled the request") && err.contains("Cancel call"),
        "says why: {err}"
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

/// The request id and uid of each "request N started (uid U, …" line of the log, in order.
fn starts(d: &Daemon) -> Vec<(u64, String)> {
    d.log_text()
        .lines()
        .filter_map(|line| {
            let (head, rest) = line.split_once(" started (uid ")?;
            let id = head.rsplit("request ").next()?.parse().ok()?;
            Some((id, rest.split(',').next()?.to_string()))
        })
        .collect()
}

/// Waits until the daemon has `n` requests queued.
async fn until_queued(c: &mut pb::engine_client::EngineClient<tonic::transport::Channel>, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while status(c).await.queued_requests != n {
        assert!(Instant::now() < deadline, "{n} never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Issue 19 point 5, with two real accounts: one user floods the queue, and another user's
/// single request still starts next, ahead of the first user's waiting ones (the old FIFO ran
/// it last); the flooder's request over `--max-queued-per-uid` is refused at once naming the
/// limit (RESOURCE_EXHAUSTED: `k3` exits 5) and counted as rejected.
#[tokio::test]
async fn one_users_flood_does_not_starve_another_users_request() {
    ensure_group("k3e2e");
    ensure_user("k3e2e-member", Some("k3e2e"));
    ensure_user("k3e2e-member2", Some("k3e2e"));
    let (d, mut c) = ready_daemon(
        "fair",
        &[
            "--socket-group",
            "k3e2e",
            "--max-active",
            "1",
            "--max-queued-per-uid",
            "2",
        ],
    )
    .await;
    let (heavy, light) = (Some("k3e2e-member"), Some("k3e2e-member2"));
    let (heavy_uid, light_uid) = (uid_of("k3e2e-member"), uid_of("k3e2e-member2"));
    let first = long_k3_run(&d.socket, heavy);
    d.wait_for_log(
        &format!(" started (uid {heavy_uid},"),
        Duration::from_secs(20),
    );
    let waiting: Vec<_> = (0..2).map(|_| k3_run(&d.socket, heavy, 2)).collect();
    until_queued(&mut c, 2).await;
    let before = status(&mut c).await;
    // Status says the per-user share: the queue limit set, the compute share its default
    // (half of --max-active, at least 1).
    assert_eq!(
        (before.max_active_per_uid, before.max_queued_per_uid),
        (Some(1), Some(2))
    );
    let shown = k3_command(&d.socket, light)
        .arg("status")
        .output()
        .expect("k3 status");
    assert!(
        text(&shown.stdout).contains("per user 1 running, 2 waiting"),
        "{}",
        text(&shown.stdout)
    );
    let over = k3_run(&d.socket, heavy, 2)
        .wait_with_output()
        .expect("k3 run");
    let err = text(&over.stderr);
    assert_eq!(over.status.code(), Some(5), "{err}");
    assert!(
        err.contains(&format!("uid {heavy_uid}")) && err.contains("--max-queued-per-uid 2"),
        "names the limit: {err}"
    );
    let single = k3_run(&d.socket, light, 2);
    until_queued(&mut c, 3).await;
    let (first_id, _) = starts(&d)[0];
    c.cancel(pb::CancelRequest {
        request_id: first_id,
    })
    .await
    .expect("root's cancel");
    assert_eq!(
        first.wait_with_output().expect("k3 run").status.code(),
        Some(130)
    );
    let out = single.wait_with_output().expect("k3 run");
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    let first_told = err
        .lines()
        .find(|l| l.contains("waiting for a compute slot"));
    assert!(
        first_told.is_some_and(|l| l.ends_with("(position 1)")),
        "told at once it is next: {err}"
    );
    for run in waiting {
        let out = run.wait_with_output().expect("k3 run");
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let uids: Vec<String> = starts(&d).into_iter().map(|(_, uid)| uid).collect();
    assert_eq!(
        uids,
        [heavy_uid.clone(), light_uid, heavy_uid.clone(), heavy_uid],
        "started in this order:\n{}",
        d.log_text()
    );
    let after = status(&mut c).await;
    assert_eq!(after.requests_rejected, before.requests_rejected + 1);
}
