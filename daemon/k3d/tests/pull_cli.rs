//! `k3d pull` against a Hub lookalike on loopback (tests/hub/hub_lookalike.py, run by the
//! venv tests/run.sh creates): the Hub's API shapes (repo info, a paged tree listing, `resolve`
//! with `X-Repo-Commit`/`ETag`/`X-Linked-Etag`/`X-Linked-Size`, LFS files redirected to a CDN on
//! 127.0.0.2 with Range), which the official `huggingface_hub` downloads from byte for byte.
//! Faults: a connection cut mid-file, 503s, a flipped byte (once, then twice), a wrong token, a
//! tmpfs too small, SIGKILL mid-way and a re-run. After every pull that succeeds, the lookalike
//! is stopped and the pulled checkpoint generates the source's ids (`k3d run`) and passes
//! `k3d verify` from the manifest pull wrote.
//!
//! Python rather than a Rust server: the faults need a raw socket (a body cut after an exact
//! byte, a response that lies about its length), which `http.server` gives in a few lines and
//! hyper deliberately does not; and the venv with the official client is needed anyway.

mod cli_support;
use cli_support::command_support::run_ok;
use cli_support::{K3D, synth};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const REPO: &str = "moonshotai/Kimi-K3-tiny";
const PROMPT: &str = "The river flows";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The venv tests/run.sh creates; the tests refuse to run without it rather than skip.
fn python() -> PathBuf {
    let python = root().join("target/venv-http/bin/python");
    assert!(
        python.exists(),
        "{} is missing: the pull tests run the Hub lookalike and the official `huggingface_hub` \
         in that venv; run ./tests/run.sh (it creates it)",
        python.display()
    );
    python
}

/// A running lookalike; killed on drop.
struct Hub {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Hub {
    fn start(source: &Path, work: &Path, extra: &[&str]) -> Hub {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let url_file = work.join(format!("hub-url-{n}"));
        let log = work.join(format!("hub-log-{n}"));
        let child = Command::new(python())
            .arg(root().join("tests/hub/hub_lookalike.py"))
            .arg("--root")
            .arg(source)
            .args(["--repo", REPO, "--url-file"])
            .arg(&url_file)
            .arg("--log")
            .arg(&log)
            .args(extra)
            .stdin(Stdio::null())
            .spawn()
            .expect("start the Hub lookalike");
        let deadline = Instant::now() + Duration::from_secs(30);
        let line = loop {
            if let Ok(text) = std::fs::read_to_string(&url_file) {
                break text;
            }
            assert!(Instant::now() < deadline, "the Hub lookalike did not start");
            std::thread::sleep(Duration::from_millis(50));
        };
        let url = line.split_whitespace().next().expect("a URL").to_string();
        Hub { child, url, log }
    }

    /// The requests served so far, one `METHOD HOST PATH RANGE STATUS` line each.
    fn log(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Data requests (CDN or a small file's resolve GET) for paths containing `name`.
    fn data_requests(&self, name: &str) -> Vec<String> {
        self.log()
            .into_iter()
            .filter(|l| l.starts_with("GET ") && (l.contains("/resolve/") || l.contains("/blobs/")))
            .filter(|l| name.is_empty() || l.contains(name))
            .collect()
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The source checkpoint, its generated ids, and a work directory.
struct Case {
    work: tempfile::TempDir,
    source: PathBuf,
    ids: serde_json::Value,
}

impl Case {
    fn new() -> Case {
        let work = tempfile::tempdir().expect("temp dir");
        let source = work.path().join("source");
        synth("tiny", &source);
        let ids = generated_ids(&source);
        Case { work, source, ids }
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.work.path().join(name)
    }

    /// The largest file of the source: an LFS shard.
    fn largest(&self) -> (String, u64) {
        files(&self.source)
            .into_iter()
            .map(|(name, bytes)| (name, bytes.len() as u64))
            .max_by_key(|(_, n)| *n)
            .expect("files")
    }

    fn hub(&self, extra: &[&str]) -> Hub {
        Hub::start(&self.source, self.work.path(), extra)
    }

    /// `k3d pull REPO DIR ARGS` against `hub`, with no token but what `args`/`env` give.
    fn pull_command(&self, hub: &Hub, dir: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new(K3D);
        cmd.arg("pull")
            .arg(REPO)
            .arg(dir)
            .args(args)
            .env("HF_ENDPOINT", &hub.url)
            .env("HF_HOME", self.work.path().join("hf-home"))
            .env_remove("HF_TOKEN")
            .env_remove("HF_TOKEN_PATH")
            .stdin(Stdio::null());
        for proxy in [
            "http_proxy",
            "https_proxy",
            "all_proxy",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
        ] {
            cmd.env_remove(proxy);
        }
        cmd
    }

    fn pull(&self, hub: &Hub, dir: &Path, args: &[&str]) -> Output {
        self.pull_command(hub, dir, args)
            .output()
            .expect("run k3d pull")
    }

    /// Stops `hub`, then: every source file is in `dir` byte for byte, no partial file is
    /// left, `k3d verify` passes and `k3d run` gives the source's ids, with the network gone.
    fn finish(&self, hub: Hub, dir: &Path) {
        hub.stop();
        let pulled = files(dir);
        for (name, bytes) in files(&self.source) {
            assert!(
                pulled.get(&name) == Some(&bytes),
                "{name} differs from the source"
            );
        }
        let leftovers: Vec<_> = pulled
            .keys()
            .filter(|n| n.contains(".k3d-partial") || n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
        // The first hour's next steps: verify (offline, from pull's manifest), then check.
        let verified = run_ok(
            Command::new(K3D)
                .arg("verify")
                .arg(dir)
                .env("XDG_STATE_HOME", self.work.path().join("state")),
        );
        let next = format!("next: k3d check {}", dir.display());
        assert!(String::from_utf8_lossy(&verified.stderr).contains(&next));
        let checked = run_ok(Command::new(K3D).arg("check").arg(dir));
        let next = format!("next: k3d doctor {}", dir.display());
        assert!(String::from_utf8_lossy(&checked.stderr).contains(&next));
        assert_eq!(
            generated_ids(dir),
            self.ids,
            "{} generates other ids",
            dir.display()
        );
    }
}

fn generated_ids(dir: &Path) -> serde_json::Value {
    let out = run_ok(
        Command::new(K3D)
            .arg("run")
            .arg(dir)
            .args(["--prompt", PROMPT, "--gen", "6", "--json"]),
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json");
    json["generated_ids"].clone()
}

/// Every regular file under `dir`, by relative path.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(base: &Path, at: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(at).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                let name = path
                    .strip_prefix(base)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.insert(name, std::fs::read(&path).expect("read"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Waits (60 s at most) until `path` holds more than `bytes` bytes.
fn wait_for_bytes(path: &Path, bytes: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::metadata(path).map_or(0, |m| m.len()) <= bytes {
        assert!(
            Instant::now() < deadline,
            "{} never held {bytes} bytes",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn assert_ok(out: &Output) -> String {
    let err = stderr(out);
    assert!(
        out.status.success(),
        "k3d pull failed ({}): {err}",
        out.status
    );
    err
}

fn assert_exit(out: &Output, code: i32, needles: &[&str]) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
    err
}

#[test]
fn pulls_what_the_official_client_downloads_and_a_rerun_fetches_nothing() {
    let case = Case::new();
    let hub = case.hub(&[]);
    let dir = case.dir("pulled");
    let err = assert_ok(&case.pull(&hub, &dir, &["--jobs", "3"]));
    assert!(
        err.contains(&format!("next: k3d verify {}", dir.display())),
        "{err}"
    );
    // The listing was read in pages (the lookalike pages by 3), and every LFS file came from
    // the CDN on the other loopback address.
    assert!(
        hub.log().iter().any(|l| l.contains("cursor=")),
        "{:?}",
        hub.log()
    );
    assert!(
        hub.data_requests("")
            .iter()
            .any(|l| l.contains(" 127.0.0.2 "))
    );

    // The official client, pointed at the same lookalike, gets the same bytes.
    let official = case.dir("official");
    let script = format!(
        "from huggingface_hub import snapshot_download; snapshot_download({REPO:?}, local_dir={:?})",
        official.display().to_string()
    );
    run_ok(
        Command::new(python())
            .args(["-c", &script])
            .env("HF_ENDPOINT", &hub.url)
            .env("HF_HOME", case.work.path().join("hf-home-official"))
            .env("HF_HUB_DISABLE_TELEMETRY", "1"),
    );
    let theirs = files(&official);
    for (name, bytes) in files(&case.source) {
        assert!(
            theirs.get(&name) == Some(&bytes),
            "huggingface_hub's {name} differs"
        );
    }

    // A re-run checks the listing and fetches nothing.
    let before = hub.data_requests("").len();
    let err = assert_ok(&case.pull(&hub, &dir, &[]));
    assert!(err.contains("continuing commit"), "{err}");
    assert_eq!(hub.data_requests("").len(), before, "{:?}", hub.log());
    case.finish(hub, &dir);
}

#[test]
fn a_cut_connection_and_503s_are_retried_from_the_bytes_on_disk() {
    let case = Case::new();
    let (shard, size) = case.largest();
    let cut = size / 2;
    let hub = case.hub(&["--fail-503", "2", "--cut", &format!("{shard}:{cut}")]);
    let dir = case.dir("pulled");
    let err = assert_ok(&case.pull(&hub, &dir, &["--jobs", "1"]));
    assert!(err.contains("HTTP 503"), "{err}");
    assert!(err.contains(&shard), "{err}");
    // After the cut, the shard was asked for from the first byte it lacked.
    let resumed = format!("bytes={cut}-");
    assert!(
        hub.data_requests(&shard)
            .iter()
            .any(|l| l.contains(&resumed)),
        "no request for {resumed}: {:?}",
        hub.log()
    );
    case.finish(hub, &dir);
}

#[test]
fn a_flipped_byte_is_fetched_again_once_and_twice_fails_naming_the_file() {
    let case = Case::new();
    let (shard, _) = case.largest();
    let hub = case.hub(&["--flip", &format!("{shard}:1000")]);
    let dir = case.dir("pulled");
    let err = assert_ok(&case.pull(&hub, &dir, &[]));
    assert!(err.contains(&format!("{shard}: sha256 mismatch")), "{err}");
    case.finish(hub, &dir);

    let hub = case.hub(&["--flip", &format!("{shard}:1000:2")]);
    let dir = case.dir("pulled-twice");
    let out = case.pull(&hub, &dir, &[]);
    assert_exit(&out, 3, &[&shard, "mismatch twice"]);
    assert!(!dir.join(&shard).exists() && !dir.join(format!("{shard}.k3d-partial")).exists());
}

#[test]
fn tokens_refusals_and_unusable_directories_are_named_with_their_exit_codes() {
    let case = Case::new();
    let hub = case.hub(&["--token", "hf_right"]);
    let dir = case.dir("pulled");
    // No token, then a wrong one: 7, naming the token's source and the licence page.
    assert_exit(
        &case.pull(&hub, &dir, &[]),
        7,
        &["401", "no token was sent", "gated"],
    );
    let licence = format!("{}/{REPO}", hub.url);
    assert_exit(
        &case.pull(&hub, &dir, &["--token", "hf_wrong"]),
        7,
        &["401", "came from --token", &licence],
    );
    // The file `huggingface-cli login` writes is read.
    let home = case.work.path().join("hf-home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("token"), "hf_right\n").unwrap();
    assert_ok(&case.pull(&hub, &dir, &[]));
    std::fs::remove_file(home.join("token")).unwrap();

    // 404s name the repository or the revision.
    let other = case.dir("other");
    let mut cmd = case.pull_command(&hub, &other, &["--token", "hf_right"]);
    cmd.args(["--revision", "no-such-branch"]);
    assert_exit(&cmd.output().unwrap(), 7, &["revision no-such-branch"]);
    let out = Command::new(K3D)
        .args(["pull", "nobody/nothing"])
        .arg(&other)
        .env("HF_ENDPOINT", &hub.url)
        .env("HF_TOKEN", "hf_right")
        .output()
        .unwrap();
    assert_exit(&out, 7, &["repository nobody/nothing"]);
    // A directory that cannot be created: 2.
    let blocked = case.dir("a-file");
    std::fs::write(&blocked, b"").unwrap();
    assert_exit(
        &case.pull(&hub, &blocked.join("dir"), &["--token", "hf_right"]),
        2,
        &["is not a directory this user can write"],
    );
    case.finish(hub, &dir);
}

/// A tmpfs of `bytes` at `dir`, unmounted on drop (the tests run as root: tests/run.sh).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: PathBuf, bytes: u64) -> Tmpfs {
        std::fs::create_dir_all(&dir).unwrap();
        let size = format!("size={}k", (bytes / 1024).max(64));
        run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", &size, "tmpfs"])
                .arg(&dir),
        );
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_disk_too_small_is_refused_before_the_first_byte_with_both_numbers() {
    let case = Case::new();
    let total: u64 = files(&case.source).values().map(|b| b.len() as u64).sum();
    let mount = Tmpfs::mount(case.dir("small"), total / 2);
    let hub = case.hub(&[]);
    let out = case.pull(&hub, &mount.0.join("model"), &[]);
    let err = assert_exit(&out, 5, &["bytes free", "are left to fetch"]);
    assert!(
        err.contains(&total.to_string()),
        "the need {total} is not named: {err}"
    );
    assert!(hub.data_requests("").is_empty(), "{:?}", hub.log());
}

#[test]
fn sigkill_midway_then_a_rerun_continues_from_the_partial_file() {
    let case = Case::new();
    let (shard, size) = case.largest();
    let dir = case.dir("pulled");
    let slow = case.hub(&["--rate", &(size / 4).to_string()]);
    let mut child = case
        .pull_command(&slow, &dir, &["--jobs", "1"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let partial = dir.join(format!("{shard}.k3d-partial"));
    wait_for_bytes(&partial, size / 8);
    child.kill().unwrap();
    child.wait().unwrap();
    slow.stop();
    let have = std::fs::metadata(&partial).unwrap().len();
    assert!(have > 0 && have < size, "{have} of {size}");
    assert!(
        !dir.join(&shard).exists(),
        "a partial shard under its final name"
    );

    let hub = case.hub(&[]);
    assert_ok(&case.pull(&hub, &dir, &[]));
    let requests = hub.data_requests(&shard);
    assert_eq!(requests.len(), 1, "{requests:?}");
    let start: u64 = requests[0]
        .split("bytes=")
        .nth(1)
        .and_then(|r| r.split('-').next())
        .and_then(|n| n.parse().ok())
        .expect("a range");
    assert_eq!(start, have, "re-fetched from {start}, had {have}");
    case.finish(hub, &dir);
}

#[test]
fn a_disk_that_fills_up_midway_stops_with_5_and_a_rerun_continues() {
    let case = Case::new();
    let total: u64 = files(&case.source).values().map(|b| b.len() as u64).sum();
    let mount = Tmpfs::mount(case.dir("filling"), total * 2);
    let dir = mount.0.join("model");
    let (shard, size) = case.largest();
    let slow = case.hub(&["--rate", &(size / 4).to_string()]);
    let child = case
        .pull_command(&slow, &dir, &["--jobs", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let partial = dir.join(format!("{shard}.k3d-partial"));
    wait_for_bytes(&partial, 0);
    // Something else takes the rest of the filesystem while the pull runs.
    let filler = mount.0.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let block = vec![1u8; 4096];
    while std::io::Write::write_all(&mut f, &block).is_ok() {}
    drop(f);
    let out = child.wait_with_output().unwrap();
    slow.stop();
    assert_exit(&out, 5, &["the disk is full", "run the same command again"]);

    std::fs::remove_file(&filler).unwrap();
    let hub = case.hub(&[]);
    assert_ok(&case.pull(&hub, &dir, &[]));
    case.finish(hub, &dir);
}

#[test]
fn large_files_come_in_parallel_pieces_and_a_rerun_fetches_only_the_missing_ones() {
    let case = Case::new();
    let (shard, size) = case.largest();
    let piece: u64 = 16384; // --piece-mib 1/64
    let dir = case.dir("pulled");
    // Slowly, with a cut and 503s, killed once some pieces are recorded.
    let slow = case.hub(&[
        "--rate",
        &(size / 2).to_string(),
        "--fail-503",
        "2",
        "--cut",
        &format!("{shard}:{}", piece + piece / 2),
    ]);
    let args = ["--jobs", "4", "--piece-mib", "0.015625"];
    let mut child = case
        .pull_command(&slow, &dir, &args)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let record = dir.join(format!("{shard}.k3d-partial.pieces"));
    // Its header line, then at least two recorded pieces (a digit and a newline each).
    wait_for_bytes(&record, format!("piece {piece}\n").len() as u64 + 3);
    child.kill().unwrap();
    child.wait().unwrap();
    // Several ranges of the shard were asked for at once, each with its end.
    let asked = slow.data_requests(&shard);
    slow.stop();
    let closed = |l: &&String| {
        l.split("bytes=")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|r| r.split_once('-'))
            .is_some_and(|(a, b)| a.parse::<u64>().is_ok() && b.parse::<u64>().is_ok())
    };
    assert!(asked.iter().filter(closed).count() >= 2, "{asked:?}");
    let text = std::fs::read_to_string(&record).unwrap();
    let done: Vec<u64> = text.lines().skip(1).map(|l| l.parse().unwrap()).collect();
    assert!(!dir.join(&shard).exists());

    let hub = case.hub(&[]);
    assert_ok(&case.pull(&hub, &dir, &args));
    let again = hub.data_requests(&shard);
    for i in &done {
        let range = format!("bytes={}-", i * piece);
        assert!(
            !again.iter().any(|l| l.contains(&range)),
            "piece {i} was recorded, yet fetched again: {again:?}"
        );
    }
    assert!(!record.exists());
    case.finish(hub, &dir);
}
