//! Real accounts on one `k3d serve` socket, end to end: the socket's mode and group, users
//! outside it refused by permissions with advice that fits, only a request's owner (or root)
//! may cancel it, and one user's flood does not starve another user's request.

#[path = "e2e_support.rs"]
mod support;

use k3proto::v1 as pb;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};
use support::command_support::run_ok;
use support::*;

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
