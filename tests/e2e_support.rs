//! Shared by the `e2e_*` tests: a real `k3d serve` process on a real socket, a gRPC client for
//! it, and the paths of the built binaries. Included with `#[path]` by each test file.
#![allow(dead_code)] // each test file uses a different subset

use hyper_util::rt::TokioIo;
use k3proto::v1 as pb;
use k3proto::v1::engine_client::EngineClient;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tokio::net::UnixStream;
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint, Uri};

#[path = "command_support.rs"]
pub mod command_support;

/// `target/<profile>/NAME`: the tests run from `target/<profile>/deps/`.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the binaries first (`cargo build -p k3d -p k3`, same profile as the tests)",
        path.display()
    );
    path
}

/// The subcommands a `--help` text lists under `Commands:` (not `help`): what
/// `tests/reference.rs` generates the reference from and `tests/docs_examples.rs` holds the
/// docs to, read one way.
pub fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("    "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// A fresh scratch directory for one test, removed on drop, world-traversable so other uids can
/// reach sockets.
pub fn scratch(name: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix(&format!("k3-e2e-{name}-"))
        .tempdir()
        .expect("create scratch dir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod scratch");
    dir
}

/// The tiny test checkpoint, written once per test process by `k3d synth --shape tiny` into a
/// scratch directory of its own. A static is never dropped, so that directory is removed when
/// the process exits instead.
pub fn tiny_model() -> &'static Path {
    static MODEL: OnceLock<tempfile::TempDir> = OnceLock::new();
    extern "C" fn remove_tiny_model() {
        if let Some(dir) = MODEL.get() {
            let _ = std::fs::remove_dir_all(dir.path());
        }
    }
    MODEL
        .get_or_init(|| {
            let dir = scratch("tiny-model");
            synth_model("tiny", dir.path());
            // SAFETY: atexit(3) only records the address of a function that takes nothing.
            let rc = unsafe { libc::atexit(remove_tiny_model) };
            assert_eq!(rc, 0, "atexit failed");
            dir
        })
        .path()
}

/// Writes `k3d synth --shape SHAPE --seed 0` into `dir` through the real binary; a failure
/// fails the test with synth's message.
/// A copy of the tiny model in `dir/broken` whose shards are cut in half: refused when the
/// engine loads them.
pub fn broken_model(dir: &Path) -> PathBuf {
    let model = dir.join("broken");
    std::fs::create_dir_all(&model).expect("mkdir");
    for entry in std::fs::read_dir(tiny_model()).expect("model dir") {
        let entry = entry.expect("entry");
        let name = entry.file_name();
        let to = model.join(&name);
        if name.to_string_lossy().ends_with(".safetensors") {
            let bytes = std::fs::read(entry.path()).expect("read shard");
            std::fs::write(&to, &bytes[..bytes.len() / 2]).expect("write");
        } else {
            std::fs::copy(entry.path(), &to).expect("copy");
        }
    }
    model
}

pub fn synth_model(shape: &str, dir: &Path) -> PathBuf {
    command_support::synth(&bin("k3d"), shape, dir);
    dir.to_path_buf()
}

pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub log: PathBuf,
    /// The scratch directory holding its socket when the daemon owns it ([`ready_daemon`]);
    /// removed after the daemon is stopped (fields drop after `Drop::drop`).
    pub scratch: Option<tempfile::TempDir>,
}

impl Daemon {
    /// Start `k3d serve` on `socket` with extra arguments; waits until the socket accepts.
    pub fn start(model: &Path, socket: &Path, extra: &[&str]) -> Daemon {
        let log = socket.with_extension("log");
        let child = Command::new(bin("k3d"))
            .arg("serve")
            .arg("--model")
            .arg(model)
            .arg("--socket")
            .arg(socket)
            // One engine thread unless the test picks: tests run side by side.
            .args(if extra.contains(&"--threads") {
                &[][..]
            } else {
                &["--threads", "1"][..]
            })
            // Sessions stay in the test's scratch directory unless the test picks a place.
            .args(if extra.contains(&"--session-dir") {
                Vec::new()
            } else {
                vec!["--session-dir".into(), socket.with_extension("sessions")]
            })
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("daemon log file"))
            .spawn()
            .expect("spawn k3d serve");
        let mut d = Daemon {
            child,
            socket: socket.to_path_buf(),
            log,
            scratch: None,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            if let Ok(Some(status)) = d.child.try_wait() {
                panic!("k3d serve exited early ({status}):\n{}", d.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "k3d serve did not listen within 30 s:\n{}",
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        d
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to `limit` for the daemon's log to contain `needle`; fails the test, quoting the
    /// log, if it does not.
    pub fn wait_for_log(&self, needle: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.log_text().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in the daemon log within {limit:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The TCP address it logged for `--http 127.0.0.1:0` (`http://127.0.0.1:PORT`).
    pub fn tcp_url(&self) -> String {
        self.wait_for_log("HTTP API on http://", Duration::from_secs(10));
        let log = self.log_text();
        let at = log.find("HTTP API on http://").expect("logged") + "HTTP API on ".len();
        log[at..].lines().next().expect("a line").trim().to_string()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        let rc = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(rc, 0, "kill({sig}) failed");
    }

    /// Wait for the daemon to exit by itself; its exit status.
    pub fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for k3d") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "k3d did not exit within {limit:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One HTTP/1.1 exchange over a Unix socket: (status, headers, body).
pub fn http(socket: &Path, method: &str, path: &str, body: &str) -> (u16, String, String) {
    let mut s =
        std::os::unix::net::UnixStream::connect(socket).expect("connect to the HTTP socket");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: k3d\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read the response");
    let (head, body) = out.split_once("\r\n\r\n").expect("a response head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    (status, head.to_ascii_lowercase(), body.to_string())
}

/// An HTTP/2 channel to the daemon's socket (for calls the generated client cannot make).
pub async fn channel(socket: &Path) -> Channel {
    let path = socket.to_path_buf();
    Endpoint::from_static("http://k3d.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .expect("connect to k3d")
}

pub async fn client(socket: &Path) -> EngineClient<Channel> {
    EngineClient::new(channel(socket).await)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

/// One Status call.
pub async fn status(c: &mut EngineClient<Channel>) -> pb::StatusReply {
    c.status(pb::StatusRequest {})
        .await
        .expect("status")
        .into_inner()
}

/// Wait until Status says ready (the model is loaded).
pub async fn wait_ready(c: &mut EngineClient<Channel>) -> pb::StatusReply {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = status(c).await;
        if s.state == "ready" {
            return s;
        }
        assert!(
            !s.state.starts_with("failed"),
            "model failed to load: {}",
            s.state
        );
        assert!(
            Instant::now() < deadline,
            "not ready after 60 s: {}",
            s.state
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn ids_request(ids: Vec<u32>, max_tokens: u32) -> pb::GenerateRequest {
    pb::GenerateRequest {
        prompt: Some(pb::generate_request::Prompt::Ids(pb::TokenIds { ids })),
        options: Some(pb::GenerationOptions {
            max_tokens,
            ..Default::default()
        }),
        session: String::new(),
    }
}

/// Everything one generation streamed.
#[derive(Debug, Default)]
pub struct Collected {
    pub events: Vec<pb::event::Event>,
    pub ids: Vec<u32>,
    pub text: String,
    pub done: Option<pb::Done>,
    pub error: Option<tonic::Status>,
}

pub async fn collect(mut stream: tonic::Streaming<pb::Event>) -> Collected {
    let mut out = Collected::default();
    while let Some(item) = stream.next().await {
        match item {
            Ok(pb::Event { event: Some(e) }) => {
                match &e {
                    pb::event::Event::Token(t) => {
                        out.ids.push(t.id);
                        out.text.push_str(&t.text);
                    }
                    pb::event::Event::Done(d) => out.done = Some(d.clone()),
                    _ => {}
                }
                out.events.push(e);
            }
            Ok(_) => {}
            Err(status) => {
                out.error = Some(status);
                break;
            }
        }
    }
    out
}

/// Generate and collect; the RPC itself must be accepted.
pub async fn generate(c: &mut EngineClient<Channel>, req: pb::GenerateRequest) -> Collected {
    collect(
        c.generate(req)
            .await
            .expect("generate accepted")
            .into_inner(),
    )
    .await
}

/// The ids of each request run alone, one after another on `c`; each must succeed.
pub async fn solo_ids(
    c: &mut EngineClient<Channel>,
    requests: &[pb::GenerateRequest],
) -> Vec<Vec<u32>> {
    let mut alone = Vec::new();
    for req in requests {
        let r = generate(c, req.clone()).await;
        assert!(r.error.is_none(), "{:?}", r.error);
        alone.push(r.ids);
    }
    alone
}

/// All `requests` at once, each from its own client on `socket`; each must succeed with the ids
/// it got alone (`alone`, from [`solo_ids`]). The results in request order.
pub async fn concurrently_as_alone(
    socket: &Path,
    requests: &[pb::GenerateRequest],
    alone: &[Vec<u32>],
) -> Vec<Collected> {
    let tasks: Vec<_> = requests
        .iter()
        .map(|req| {
            let (socket, req) = (socket.to_path_buf(), req.clone());
            tokio::spawn(async move { generate(&mut client(&socket).await, req).await })
        })
        .collect();
    let mut out = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        let r = task.await.expect("client task");
        assert!(r.error.is_none(), "client {i}: {:?}", r.error);
        assert_eq!(r.ids, alone[i], "client {i} got other tokens than alone");
        out.push(r);
    }
    out
}

/// A distinct, valid prompt for client `i` (ids well inside any test vocabulary).
pub fn prompt(i: u32) -> Vec<u32> {
    vec![10 + i, 20 + 2 * i, 30 + 3 * i, 40]
}

/// Read a stream until its first Token (the request is computing); returns its request id.
pub async fn until_token(stream: &mut tonic::Streaming<pb::Event>) -> u64 {
    first_tokens(stream, 1).await.0
}

/// Reads `stream` until `tokens` tokens arrived: the request id and those ids.
pub async fn first_tokens(
    stream: &mut tonic::Streaming<pb::Event>,
    tokens: usize,
) -> (u64, Vec<u32>) {
    let (mut id, mut ids) = (0, Vec::new());
    while ids.len() < tokens {
        match stream
            .next()
            .await
            .expect("an event")
            .expect("no error")
            .event
        {
            Some(pb::event::Event::Accepted(a)) => id = a.request_id,
            Some(pb::event::Event::Token(t)) => ids.push(t.id),
            _ => {}
        }
    }
    (id, ids)
}

/// Starts `req`, sends the daemon SIGTERM once its first token has come, and collects the rest.
pub async fn sigterm_while_computing(
    d: &Daemon,
    c: &mut EngineClient<Channel>,
    req: pb::GenerateRequest,
) -> Collected {
    let mut stream = c.generate(req).await.expect("accepted").into_inner();
    until_token(&mut stream).await;
    d.signal(libc::SIGTERM);
    collect(stream).await
}

/// A daemon serving the tiny model in a fresh scratch directory, and a client once it is ready.
pub async fn ready_daemon(name: &str, extra: &[&str]) -> (Daemon, EngineClient<Channel>) {
    let dir = scratch(name);
    let mut d = Daemon::start(tiny_model(), &dir.path().join("k3d.sock"), extra);
    d.scratch = Some(dir);
    let mut c = client(&d.socket).await;
    wait_ready(&mut c).await;
    (d, c)
}

/// Start a long generation (4000 tokens) and return its stream once it is computing.
pub async fn computing(
    c: &mut EngineClient<Channel>,
    ids: Vec<u32>,
) -> tonic::Streaming<pb::Event> {
    let mut stream = c
        .generate(ids_request(ids, 4000))
        .await
        .expect("generation accepted")
        .into_inner();
    until_token(&mut stream).await;
    stream
}

/// Lossy UTF-8 of a process's output.
/// Submits `req` and waits until the daemon says it is queued (every compute slot is taken).
pub async fn queued(
    c: &mut EngineClient<Channel>,
    req: pb::GenerateRequest,
) -> tonic::Streaming<pb::Event> {
    let mut stream = c.generate(req).await.expect("accepted").into_inner();
    while !matches!(
        stream.next().await.expect("event").expect("ok").event,
        Some(pb::event::Event::Queued(_))
    ) {}
    stream
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `k3 --socket SOCKET`, run as account `user` (through runuser) or as this process's.
pub fn k3_command(socket: &Path, user: Option<&str>) -> Command {
    let mut cmd = match user {
        Some(u) => {
            let mut c = Command::new("runuser");
            c.args(["-u", u, "--"]).arg(bin("k3"));
            c
        }
        None => Command::new(bin("k3")),
    };
    cmd.arg("--socket").arg(socket);
    cmd
}

/// The uid of account `name` (`id -u`).
pub fn uid_of(name: &str) -> String {
    text(
        &std::process::Command::new("id")
            .args(["-u", name])
            .output()
            .expect("id")
            .stdout,
    )
    .trim()
    .to_string()
}

/// groupadd/useradd lock /etc files: tests running in parallel take turns.
static ACCOUNTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Create a group if it does not exist (needs root: fails loudly otherwise); its gid.
pub fn ensure_group(name: &str) -> u32 {
    let _turn = ACCOUNTS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(gid) = gid_of(name) {
        return gid;
    }
    command_support::run_ok(std::process::Command::new("groupadd").arg(name));
    gid_of(name).expect("group created")
}

fn gid_of(name: &str) -> Option<u32> {
    let out = std::process::Command::new("getent")
        .args(["group", name])
        .output()
        .ok()?;
    let line = String::from_utf8_lossy(&out.stdout).to_string();
    line.split(':').nth(2)?.trim().parse().ok()
}

/// Create a user (with an optional supplementary group) if missing; needs root.
pub fn ensure_user(name: &str, group: Option<&str>) {
    let _turn = ACCOUNTS.lock().unwrap_or_else(|p| p.into_inner());
    let exists = std::process::Command::new("id")
        .arg(name)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !exists {
        let mut cmd = std::process::Command::new("useradd");
        cmd.args(["--no-create-home", "--shell", "/usr/sbin/nologin"]);
        if let Some(g) = group {
            cmd.args(["-G", g]);
        }
        command_support::run_ok(cmd.arg(name));
    }
}

/// A small tmpfs mounted for one test, unmounted when dropped (also when the test fails).
pub struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    pub fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).expect("mount point");
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "mount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Fills the filesystem of `dir` to the last byte.
pub fn fill(dir: &Path) {
    use std::io::Write;
    let mut filler = std::fs::File::create(dir.join("filler")).expect("filler");
    let block = [0u8; 4096];
    while filler.write_all(&block).is_ok() {}
    let _ = filler.write_all(&[0u8; 1]);
}

/// `k3 run` of a 4,000-token generation (as `user`, with runuser), its stderr piped.
pub fn long_k3_run(socket: &std::path::Path, user: Option<&str>) -> std::process::Child {
    k3_run(socket, user, 4000)
}

/// `k3 run` of a `max_tokens` generation (as `user`, with runuser), its stderr piped.
pub fn k3_run(
    socket: &std::path::Path,
    user: Option<&str>,
    max_tokens: u32,
) -> std::process::Child {
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
