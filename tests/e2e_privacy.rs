//! Many users, one daemon, nobody reads or costs another's state (issue 35 points 6 and 7): real
//! accounts against a real daemon. Attack 7: a keyless TCP caller sending another account's
//! prompt plus more learns nothing (`cached_tokens: 0`), while each account still reuses its
//! own. Attack 6: one account filling the session directory never costs another account's saved
//! session — it stays intact and saveable, also at shutdown.

#[path = "e2e_support.rs"]
mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

const ALICE: &str = "k3e2e-priv-a";
const BOB: &str = "k3e2e-priv-b";
const CAROL: &str = "k3e2e-priv-c";
/// The group whose members may reach the daemon's socket.
const GROUP: &str = "k3e2e";

/// The three accounts, members of [`GROUP`] (created once, by whichever test comes first).
fn accounts() {
    ensure_group(GROUP);
    for user in [ALICE, BOB, CAROL] {
        ensure_user(user, Some(GROUP));
    }
}

/// `POST /v1/chat/completions` with `message` as the user's message, sent with curl as account
/// `user` over loopback TCP and no key: the reply's `prompt_tokens` and `cached_tokens`.
fn chat_as(user: &str, url: &str, model: &str, message: &str) -> (u64, u64) {
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": message}],
        "max_tokens": 2,
        "temperature": 0,
    })
    .to_string();
    let out = Command::new("runuser")
        .args(["-u", user, "--", "curl", "-sS", "--max-time", "60"])
        .args([
            "-H",
            "content-type: application/json",
            "--data-binary",
            &body,
        ])
        .arg(format!("{url}/v1/chat/completions"))
        .output()
        .expect("run curl (tests/run.sh installs it)");
    assert!(out.status.success(), "curl: {}", text(&out.stderr));
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));
    let usage = &reply["usage"];
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens told: {reply}"));
    (
        usage["prompt_tokens"].as_u64().expect("prompt_tokens"),
        cached,
    )
}

/// Attack 7 of issue 35: A sends a secret prompt; B sends the same text plus more, C the same
/// text, and each is told `cached_tokens: 0` — nothing of A's was continued for them. A's own
/// repeat does reuse (so the zeros are not reuse switched off), since the daemon names each
/// keyless loopback caller by the uid owning its socket.
#[tokio::test]
async fn a_keyless_tcp_caller_never_learns_another_accounts_prompt() {
    accounts();
    let dir = scratch("privacy-tcp");
    let d = Daemon::start(
        tiny_model(),
        &dir.path().join("k3d.sock"),
        &["--http", "127.0.0.1:0"],
    );
    wait_ready(&mut client(&d.socket).await).await;
    let url = d.tcp_url();
    let models = Command::new("curl")
        .args(["-sS", &format!("{url}/v1/models")])
        .output()
        .expect("curl");
    let models: serde_json::Value = serde_json::from_slice(&models.stdout).expect("models");
    let model = models["data"][0]["id"]
        .as_str()
        .expect("a model id")
        .to_string();
    let chat_as = |user: &str, message: &str| chat_as(user, &url, &model, message);
    let secret = "The vault code is 4711-0815. Keep it secret.";
    let started = Instant::now();
    let (prompt, cached) = chat_as(ALICE, secret);
    assert_eq!(cached, 0, "A's first request");
    let (again, cached) = chat_as(ALICE, secret);
    assert_eq!(again, prompt);
    assert_eq!(
        cached,
        prompt - 1,
        "A reuses its own prompt (all but its last id)"
    );
    // Each other account's first request, the probe and the plain copy: nothing reused. (An
    // account's later requests may reuse its own earlier ones, e.g. the shared template.)
    let probe = format!("{secret} What is the code?");
    assert_eq!(chat_as(BOB, &probe).1, 0, "B's probe reused A's state");
    assert_eq!(chat_as(CAROL, secret).1, 0, "C's copy reused A's state");
    assert!(started.elapsed() < Duration::from_secs(60));
    // The log names each caller by its account.
    let log = d.log_text();
    for user in [ALICE, BOB, CAROL] {
        let uid = uid_of(user);
        assert!(
            log.contains(&format!("from uid {uid} (")),
            "{user} not named:\n{log}"
        );
    }
}

fn k3(socket: &Path, user: Option<&str>, args: &[&str]) -> std::process::Output {
    k3_command(socket, user)
        .args(args)
        .output()
        .expect("run k3")
}

/// A turn of `user` on its session `name` with the ids `prompt`: `k3 run`'s output.
fn turn(socket: &Path, user: &str, name: &str, prompt: &str) -> std::process::Output {
    let args = [
        "run",
        "--ids",
        "--max-tokens",
        "2",
        "--session",
        name,
        prompt,
    ];
    k3(socket, Some(user), &args)
}

/// Attack 6 of issue 35: B fills the session directory (a small filesystem) with sessions. A's
/// saved session stays intact and saveable: A continues it and saves it, and at SIGTERM none of
/// A's state is among what could not be written — B's fill cost only B's own sessions.
#[tokio::test]
async fn one_users_fill_never_costs_another_users_saved_session() {
    accounts();
    let dir = scratch("privacy-fill");
    let sessions = dir.path().join("sessions");
    let _disk = Tmpfs::mount(&sessions, "4m");
    let dir_arg = sessions.to_str().expect("utf-8 path");
    // Sessions spill to the directory beyond a small allowance.
    let args = [
        "--session-dir",
        dir_arg,
        "--session-gb",
        "0.0002",
        "--socket-group",
        GROUP,
    ];
    let socket = dir.path().join("k3d.sock");
    let mut d = Daemon::start(tiny_model(), &socket, &args);
    wait_ready(&mut client(&d.socket).await).await;
    let started = Instant::now();
    let history = "5 6 7 8 9 10 11 12";
    let first = turn(&d.socket, ALICE, "work", history);
    assert!(
        first.status.success(),
        "{}\n{}",
        text(&first.stderr),
        d.log_text()
    );
    let saved = k3(&d.socket, Some(ALICE), &["sessions", "save", "work"]);
    assert!(saved.status.success(), "{}", text(&saved.stderr));
    let alice = uid_of(ALICE);
    let file = sessions.join(format!("{alice}@work.k3s"));
    let size = std::fs::metadata(&file).expect("A's file").len();
    // Leave room for about twenty sessions like A's, then let B fill it.
    let stat = Command::new("stat")
        .args(["-f", "--format=%a %S"])
        .arg(&sessions)
        .output()
        .expect("stat -f");
    let figures: Vec<u64> = text(&stat.stdout)
        .split_whitespace()
        .map(|n| n.parse().expect("a number"))
        .collect();
    let filler = (figures[0] * figures[1]).saturating_sub(20 * size);
    std::fs::write(sessions.join("filler"), vec![0u8; filler as usize]).expect("filler");
    let mut refused = 0;
    for i in 0..40 {
        let prompt: Vec<String> = (0..24).map(|t| (100 + i * 24 + t).to_string()).collect();
        let name = format!("b{i}");
        if turn(&d.socket, BOB, &name, &prompt.join(" "))
            .status
            .success()
        {
            let out = k3(&d.socket, Some(BOB), &["sessions", "save", &name]);
            refused += usize::from(!out.status.success());
        } else {
            refused += 1;
        }
    }
    assert!(
        refused > 0,
        "B never ran out of room: the test filled nothing"
    );
    // A's session is intact and saveable: continued from its state, then written.
    let longer = format!("{history} 13 14 15");
    let more = k3(
        &d.socket,
        Some(ALICE),
        &[
            "run",
            "--ids",
            "--max-tokens",
            "2",
            "--session",
            "work",
            &longer,
        ],
    );
    assert!(more.status.success(), "{}", text(&more.stderr));
    assert!(
        text(&more.stderr).contains("from the session"),
        "A's turn did not continue its session: {}",
        text(&more.stderr)
    );
    let saved = k3(&d.socket, Some(ALICE), &["sessions", "save", "work"]);
    assert!(
        saved.status.success(),
        "A's save after B's fill: {}\n{}",
        text(&saved.stderr),
        d.log_text()
    );
    // Shutdown: whatever of B's could not be written, nothing of A's is lost.
    d.signal(libc::SIGTERM);
    d.wait(Duration::from_secs(30));
    let log = d.log_text();
    assert!(
        !log.contains(&format!("\"work\" of uid {alice} could not be written")),
        "{log}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    // A restarted daemon finds A's session with its continued turn (11 prompt ids and the one
    // generated id fed back).
    let again = dir.path().join("k3d-again.sock");
    let d = Daemon::start(tiny_model(), &again, &args);
    wait_ready(&mut client(&d.socket).await).await;
    let listed = k3(&d.socket, Some(ALICE), &["sessions", "list", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    let work = listed["sessions"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["name"] == "work"))
        .unwrap_or_else(|| panic!("A's session is gone: {listed}"));
    assert_eq!(work["tokens"], 12, "{work}");
    assert!(file.exists());
}

/// Issue 35, "why" point 9: a keys file others can read is named at start with its mode; the
/// same file made private is not. Anyone who reads a key is that caller (its kept states).
#[tokio::test]
async fn a_keys_file_others_can_read_is_named_in_the_log() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("privacy-keys-file");
    let config = dir.path().join("k3d.toml");
    std::fs::write(
        &config,
        "http = [\"127.0.0.1:0\"]\nhttp_api_keys = [\"k3-e2e-key\"]\n",
    )
    .expect("write the config");
    let config_arg = config.display().to_string();
    let warning = format!("--config {config_arg} holds http_api_keys and is readable by");
    for (mode, warned) in [(0o640, true), (0o644, true), (0o600, false)] {
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(mode)).expect("chmod");
        let d = Daemon::start(
            tiny_model(),
            &dir.path().join(format!("k3d-{mode:o}.sock")),
            &["--config", &config_arg],
        );
        // The warning comes before the listening line; once that is logged it is there or not.
        d.wait_for_log("listening on", Duration::from_secs(30));
        let log = d.log_text();
        assert_eq!(
            log.contains(&warning) && log.contains(&format!("(mode {mode:04o})")),
            warned,
            "mode {mode:04o}:\n{log}"
        );
    }
}
