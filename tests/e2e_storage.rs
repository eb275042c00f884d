//! Sessions on a small or read-only filesystem (issue 45 points 1, 3 and 5), with the real
//! `k3d` and `k3` binaries, real accounts and a real tmpfs: a turn whose state cannot be
//! written fails with the storage exit code (10) naming the session and the cause, never exit
//! 0 with the session gone; `k3 sessions save` says "saved" only for a write that happened;
//! and one user filling the filesystem is refused at its share, so another user's new session
//! is still written.

#[path = "e2e_support.rs"]
mod support;

use std::path::Path;
use std::process::{Command, Output};
use support::*;

/// The in-memory allowance (GiB): about 1 KB, below one session of the tiny model, so every
/// session spills to its file as its turn ends — what the disk does is what the client sees.
const SPILL_AT_ONCE: &str = "0.000001";

/// Accounts of the shared-filesystem test: `SQUATTER` fills, `NEWCOMER` comes after.
const SQUATTER: &str = "k3e2e-b";
const NEWCOMER: &str = "k3e2e-a";
const GROUP: &str = "k3e2e";

fn k3(socket: &Path, user: Option<&str>, args: &[&str]) -> Output {
    k3_command(socket, user)
        .args(args)
        .output()
        .expect("run k3")
}

/// `k3 run` of the ids `prompt` on `session`, four tokens.
fn run_on(socket: &Path, user: Option<&str>, session: &str, prompt: &str) -> Output {
    k3(
        socket,
        user,
        &[
            "run",
            "--ids",
            "--max-tokens",
            "4",
            "--session",
            session,
            prompt,
        ],
    )
}

fn remount(at: &Path, options: &str) {
    let out = Command::new("mount")
        .args(["-o", &format!("remount,{options}")])
        .arg(at)
        .output()
        .expect("mount");
    assert!(out.status.success(), "remount: {}", text(&out.stderr));
}

/// The sessions `user` sees, as `k3 sessions list --json` gives them.
fn listed(socket: &Path, user: Option<&str>) -> Vec<serde_json::Value> {
    let out = k3(socket, user, &["sessions", "list", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    reply["sessions"].as_array().cloned().unwrap_or_default()
}

fn tokens_of(sessions: &[serde_json::Value], name: &str) -> Option<u64> {
    sessions
        .iter()
        .find(|s| s["name"] == name)
        .map(|s| s["tokens"].as_u64().unwrap_or(0))
}

/// Asserts `out` is the storage failure (exit 10) naming `session`, with `cause` in its words.
fn assert_not_kept(out: &Output, session: &str, cause: &str, log: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(10), "{err}\n{log}");
    assert!(err.contains("could not store the session"), "{err}");
    assert!(
        err.contains(&format!("session {session:?}")),
        "names {session}: {err}"
    );
    assert!(err.contains(cause), "says {cause:?}: {err}");
}

/// A ready daemon on the tiny model whose session directory is a tmpfs of 2 MiB at
/// `dir/sessions`, spilling every session as its turn ends; `extra` are more flags.
async fn on_small_disk(dir: &Path, extra: &[&str]) -> (Daemon, Tmpfs, std::path::PathBuf) {
    let sessions = dir.join("sessions");
    let disk = Tmpfs::mount(&sessions, "2m");
    let mut args = vec![
        "--session-dir",
        sessions.to_str().expect("utf-8"),
        "--session-gb",
        SPILL_AT_ONCE,
    ];
    args.extend_from_slice(extra);
    let d = Daemon::start(tiny_model(), &dir.join("k3d.sock"), &args);
    wait_ready(&mut client(&d.socket).await).await;
    (d, disk, sessions)
}

/// Issue 45.3: on a read-only session filesystem a new session's turn exited 0 and the
/// session was gone; a continued one exited 0 and its newest state was dropped; and `k3
/// sessions save` then printed "saved". Now both turns exit 10 naming the session and the
/// cause, the continued session keeps its older state, and the save says it wrote nothing.
#[tokio::test]
async fn a_turn_whose_state_cannot_be_written_fails_naming_the_session_and_the_cause() {
    let tmp = scratch("storage-ro");
    let (d, _disk, sessions) = on_small_disk(tmp.path(), &[]).await;
    let first = run_on(&d.socket, None, "before", "5 6 7");
    assert!(first.status.success(), "{}", text(&first.stderr));
    let kept = tokens_of(&listed(&d.socket, None), "before").expect("before is listed");

    remount(&sessions, "ro");
    let during = run_on(&d.socket, None, "during", "5 6 7");
    assert_not_kept(&during, "during", "Read-only file system", &d.log_text());
    assert!(text(&during.stderr).contains("it is gone"));
    let continued = format!("5 6 7 {} 9", text(&first.stdout).trim());
    let again = run_on(&d.socket, None, "before", &continued);
    assert_not_kept(&again, "before", "Read-only file system", &d.log_text());
    assert!(text(&again.stderr).contains("its file keeps an older state"));

    let now = listed(&d.socket, None);
    assert_eq!(tokens_of(&now, "during"), None, "{now:?}");
    assert_eq!(tokens_of(&now, "before"), Some(kept), "its file's state");
    let save = k3(&d.socket, None, &["sessions", "save", "before"]);
    let said = text(&save.stdout);
    assert!(save.status.success(), "{}", text(&save.stderr));
    assert!(
        !said.starts_with("saved") && said.contains("already saved") && said.contains("nothing"),
        "{said}"
    );
    assert!(said.contains(&format!("({kept} tokens)")), "{said}");

    // Writable again: the same turn is kept, and the daemon served throughout.
    remount(&sessions, "rw");
    let after = run_on(&d.socket, None, "before", &continued);
    assert!(after.status.success(), "{}", text(&after.stderr));
    assert!(tokens_of(&listed(&d.socket, None), "before") > Some(kept));
}

/// Issue 45.3 on a full filesystem: a new session's turn is refused its state with exit 10,
/// naming it, and is not listed afterwards as if kept.
#[tokio::test]
async fn a_new_sessions_turn_on_a_full_filesystem_exits_10() {
    let tmp = scratch("storage-full");
    let (d, _disk, sessions) = on_small_disk(tmp.path(), &[]).await;
    fill(&sessions);
    let out = run_on(&d.socket, None, "late", "5 6 7");
    assert_not_kept(&out, "late", "No space left on device", &d.log_text());
    assert_eq!(tokens_of(&listed(&d.socket, None), "late"), None);
}

/// Issue 45.1, the issue's own scenario with two real accounts: user B runs `k3 run --session
/// squatN` until it is refused, then user A's new session is written and kept; B is refused
/// with a quota error naming its share (exit 10), never by the disk being full for A.
#[tokio::test]
async fn one_users_fill_is_refused_at_its_share_and_another_users_new_session_is_kept() {
    ensure_group(GROUP);
    for user in [SQUATTER, NEWCOMER] {
        ensure_user(user, Some(GROUP));
    }
    let tmp = scratch("storage-share");
    let (d, _disk, _) = on_small_disk(tmp.path(), &["--socket-group", GROUP]).await;
    let share_words = "more than one user's share of the session filesystem";
    let mut refused = None;
    for n in 0..40 {
        let out = run_on(&d.socket, Some(SQUATTER), &format!("squat{n}"), "5 6 7");
        if !out.status.success() {
            refused = Some((n, out));
            break;
        }
    }
    let (squatted, out) = refused.expect("B is refused before its 40th session");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(10), "{err}");
    assert!(err.contains(share_words), "names the limit: {err}");
    assert!(
        err.contains("1 users with sessions + 1"),
        "its arithmetic: {err}"
    );
    assert!(squatted >= 2, "B had room for some sessions: {err}");
    eprintln!("B's session {squatted} refused: {err}");

    let mine = run_on(&d.socket, Some(NEWCOMER), "mine", "5 6 7");
    assert!(
        mine.status.success(),
        "A's new session: {}\n{}",
        text(&mine.stderr),
        d.log_text()
    );
    let a_sees = listed(&d.socket, Some(NEWCOMER));
    let entry = a_sees
        .iter()
        .find(|s| s["name"] == "mine")
        .unwrap_or_else(|| panic!("A's session is kept: {a_sees:?}"));
    assert_eq!(entry["on_disk"], true, "written to its file: {entry}");
    let save = k3(&d.socket, Some(NEWCOMER), &["sessions", "save", "mine"]);
    assert!(save.status.success(), "{}", text(&save.stderr));

    // B again: refused at its share, which now counts A.
    let again = run_on(&d.socket, Some(SQUATTER), "squat-more", "5 6 7");
    let err = text(&again.stderr);
    assert_eq!(again.status.code(), Some(10), "{err}");
    assert!(err.contains(share_words), "{err}");
    assert!(err.contains("2 users with sessions + 1"), "{err}");
}
