//! Issue #19 point 4, load: 64 concurrent clients against one real `k3d serve` for a bounded
//! time, on `tiny` and `small`, mixing gRPC Generate and Chat, named sessions (created,
//! continued, deleted), Cancel calls, dropped streams, real `k3` processes SIGKILLed
//! mid-stream and HTTP completions. Each client has its own connection. On `small`, whose
//! requests take seconds on a shared 2-core machine, 16 of the 64 compute (two of each kind)
//! and the other 48 hold their connections asking for Status, so the run stays bounded.
//! Checked:
//!
//! * every completed request's output equals its solo output (computed first, one request at
//!   a time on the same daemon), and every cut-short one streamed a prefix of it;
//! * the small queue (`--max-queue`) refuses with RESOURCE_EXHAUSTED (429 over HTTP, exit 5
//!   from `k3`), and nothing else goes wrong;
//! * the daemon's peak RSS (VmHWM) stays within the budget plus the documented overhead;
//! * afterwards Status shows nothing running or queued and no leased session, the sessions are
//!   gone, and the daemon's thread count returns to its idle value.

#[path = "e2e_support.rs"]
mod support;

use k3proto::v1 as pb;
use k3proto::v1::engine_client::EngineClient;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;
use tonic::transport::Channel;

/// Clients at once (issue #19 point 4).
const CLIENTS: usize = 64;
/// Memory beyond the budget that the budget does not count (binary, thread stacks, allocator
/// slack, buffers): the figure README documents for `k3d serve` (section "Load").
const OVERHEAD_BYTES: u64 = 256 << 20;
/// New tokens asked by a request that is cut short (cancelled, dropped, killed): never reached.
const LONG: u32 = 4000;
/// Compute slots and queue places: far fewer than the clients, so the queue overflows.
const MAX_ACTIVE: &str = "4";
const MAX_QUEUE: &str = "8";
/// How long a refused client waits before it tries again.
const BACKOFF: Duration = Duration::from_millis(100);

/// What each client does, by its index modulo the list (two of every eight generate).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum RequestKind {
    Generate,
    Chat,
    Session,
    Cancel,
    Drop,
    Kill,
    Http,
    /// Holds its connection and asks for Status (the clients beyond `Load::busy`).
    Status,
}

const KINDS: [RequestKind; 8] = [
    RequestKind::Generate,
    RequestKind::Generate,
    RequestKind::Chat,
    RequestKind::Session,
    RequestKind::Cancel,
    RequestKind::Drop,
    RequestKind::Kill,
    RequestKind::Http,
];

/// How one request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum RequestEnd {
    /// Ran to its end with its solo output.
    Completed,
    /// Refused because the queue was full.
    Refused,
    /// Cancelled, dropped or killed mid-stream after a prefix of its solo output.
    Cut,
}

type Tally = BTreeMap<(RequestKind, RequestEnd), usize>;

/// One load run's size.
struct Load {
    name: &'static str,
    model: PathBuf,
    /// `--ram-gb`, GiB.
    ram_gib: f64,
    /// New tokens of every request that runs to its end.
    max_tokens: u32,
    /// How long clients keep starting requests (each goes on until one got past the queue).
    duration: Duration,
    /// Distinct prompts per kind of request: clients share them, so each has a solo output.
    variants: usize,
    /// Clients that compute (their kinds in the order of `KINDS`); the other connections of
    /// the 64 ask for Status, so a slower model still has 64 clients in a bounded time.
    busy: usize,
}

/// The outputs of requests run alone, one after another, before the load.
struct Solo {
    generate: Vec<(Vec<u32>, Vec<u32>)>,
    chat: Vec<(pb::ChatRequest, Vec<u32>)>,
    /// A session's two turns: the second prompt extends the first with its reply.
    session: Vec<[(Vec<u32>, Vec<u32>); 2]>,
    /// Prompt ids and the completion text of `POST /v1/completions`.
    http: Vec<(Vec<u32>, String)>,
    /// The id `/v1/models` lists.
    model_id: String,
}

/// What every client shares.
struct Ctx {
    socket: PathBuf,
    http: PathBuf,
    solo: Solo,
    max_tokens: u32,
    variants: usize,
    busy: usize,
    deadline: Instant,
}

fn chat_request(variant: usize, max_tokens: u32) -> pb::ChatRequest {
    pb::ChatRequest {
        messages: vec![pb::ChatMessage {
            role: pb::Role::User.into(),
            content: format!("Load test, message {variant}: count to ten."),
            ..Default::default()
        }],
        thinking: pb::Thinking::Off.into(),
        options: Some(pb::GenerationOptions {
            max_tokens,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn session_request(prompt: Vec<u32>, max_tokens: u32, session: &str) -> pb::GenerateRequest {
    pb::GenerateRequest {
        session: session.to_string(),
        ..ids_request(prompt, max_tokens)
    }
}

/// `POST /v1/completions` of `prompt` ids, greedy: the text, or the status when not 200.
fn http_completion(
    socket: &Path,
    model_id: &str,
    prompt: &[u32],
    max_tokens: u32,
) -> Result<String, (u16, String)> {
    let body = serde_json::json!({"model": model_id, "prompt": prompt, "max_tokens": max_tokens});
    let (status, _, body) = http(socket, "POST", "/v1/completions", &body.to_string());
    if status != 200 {
        return Err((status, body));
    }
    let reply: serde_json::Value = serde_json::from_str(&body).expect("a JSON completion");
    Ok(reply["choices"][0]["text"]
        .as_str()
        .expect("choices[0].text")
        .to_string())
}

async fn solo(c: &mut EngineClient<Channel>, http_socket: &Path, load: &Load) -> Solo {
    let (max_tokens, variants) = (load.max_tokens, load.variants as u32);
    let prompts: Vec<Vec<u32>> = (0..variants).map(prompt).collect();
    let requests: Vec<_> = prompts
        .iter()
        .map(|p| ids_request(p.clone(), max_tokens))
        .collect();
    let generate = prompts
        .into_iter()
        .zip(solo_ids(c, &requests).await)
        .collect();
    let mut chat = Vec::new();
    for v in 0..load.variants {
        let req = chat_request(v, max_tokens);
        let r = collect(c.chat(req.clone()).await.expect("chat").into_inner()).await;
        assert!(r.error.is_none(), "{:?}", r.error);
        chat.push((req, r.ids));
    }
    let mut session = Vec::new();
    for v in 0..variants {
        let first = prompt(10 + v);
        let reply = solo_ids(c, &[ids_request(first.clone(), max_tokens)]).await;
        let second: Vec<u32> = [first.clone(), reply[0].clone(), vec![50 + v, 60]].concat();
        let again = solo_ids(c, &[ids_request(second.clone(), max_tokens)]).await;
        session.push([(first, reply[0].clone()), (second, again[0].clone())]);
    }
    let (status, _, models) = http(http_socket, "GET", "/v1/models", "");
    assert_eq!(status, 200, "{models}");
    let models: serde_json::Value = serde_json::from_str(&models).expect("JSON");
    let model_id = models["data"][0]["id"]
        .as_str()
        .expect("a model id")
        .to_string();
    let http = (0..variants)
        .map(|v| {
            let p = prompt(20 + v);
            let text =
                http_completion(http_socket, &model_id, &p, max_tokens).expect("a solo completion");
            (p, text)
        })
        .collect();
    Solo {
        generate,
        chat,
        session,
        http,
        model_id,
    }
}

/// A refusal must be the full queue's, nothing else.
fn refused(status: &tonic::Status) -> RequestEnd {
    assert_eq!(
        status.code(),
        tonic::Code::ResourceExhausted,
        "only a full queue may refuse: {status:?}"
    );
    RequestEnd::Refused
}

/// `got` is a prefix of `solo` as far as both go (a request cut short, or asking for more
/// tokens than the solo run, continues it greedily).
fn assert_prefix(got: &[u32], solo: &[u32], what: &str) {
    let n = got.len().min(solo.len());
    assert_eq!(&got[..n], &solo[..n], "{what}: not its solo output");
}

/// A Generate or Chat that runs to its end with `expected`.
async fn complete(
    call: Result<tonic::Response<tonic::Streaming<pb::Event>>, tonic::Status>,
    expected: &[u32],
    what: &str,
) -> RequestEnd {
    match call {
        Err(status) => refused(&status),
        Ok(stream) => {
            let r = collect(stream.into_inner()).await;
            assert!(r.error.is_none(), "{what}: {:?}", r.error);
            assert!(r.done.is_some(), "{what}: no Done");
            assert_eq!(r.ids, expected, "{what}: not its solo output");
            RequestEnd::Completed
        }
    }
}

/// Created with the first turn, continued with the second, deleted: each turn is retried
/// until the queue takes it (refusals are counted).
async fn session(
    c: &mut EngineClient<Channel>,
    ctx: &Ctx,
    name: &str,
    v: usize,
    tally: &mut Tally,
) {
    for (turn, (prompt, expected)) in ctx.solo.session[v].iter().enumerate() {
        loop {
            let req = session_request(prompt.clone(), ctx.max_tokens, name);
            let what = format!("session {name} turn {turn}");
            let outcome = complete(c.generate(req).await, expected, &what).await;
            *tally.entry((RequestKind::Session, outcome)).or_default() += 1;
            if outcome == RequestEnd::Completed {
                break;
            }
            tokio::time::sleep(BACKOFF).await;
        }
    }
    c.delete_session(pb::DeleteSessionRequest {
        name: name.to_string(),
    })
    .await
    .expect("the finished session deletes");
}

/// A long generation cancelled by a Cancel call once its first token arrived.
async fn cancel(c: &mut EngineClient<Channel>, expected: &[u32], prompt: Vec<u32>) -> RequestEnd {
    let mut stream = match c.generate(ids_request(prompt, LONG)).await {
        Err(status) => return refused(&status),
        Ok(r) => r.into_inner(),
    };
    let (id, mut ids) = first_tokens(&mut stream, 1).await;
    c.cancel(pb::CancelRequest { request_id: id })
        .await
        .expect("a running request cancels");
    let rest = collect(stream).await;
    let err = rest.error.expect("a cancelled stream ends with a status");
    assert_eq!(err.code(), tonic::Code::Cancelled, "{err:?}");
    ids.extend(rest.ids);
    assert_prefix(&ids, expected, "cancelled generation");
    RequestEnd::Cut
}

/// A long generation whose client drops the stream after two tokens.
async fn drop_stream(
    c: &mut EngineClient<Channel>,
    expected: &[u32],
    prompt: Vec<u32>,
) -> RequestEnd {
    let mut stream = match c.generate(ids_request(prompt, LONG)).await {
        Err(status) => return refused(&status),
        Ok(r) => r.into_inner(),
    };
    let (_, ids) = first_tokens(&mut stream, 2).await;
    drop(stream);
    assert_prefix(&ids, expected, "dropped generation");
    RequestEnd::Cut
}

/// A real `k3 run --ids` SIGKILLed once it printed two whole ids; a `k3` the full queue
/// refused exits 5 without output.
fn kill_k3(socket: &Path, expected: &[u32], prompt: &[u32]) -> RequestEnd {
    let ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let mut child = Command::new(bin("k3"))
        .arg("--socket")
        .arg(socket)
        .args([
            "run",
            "--ids",
            "--max-tokens",
            &LONG.to_string(),
            &ids.join(" "),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn k3 run");
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut out = Vec::new();
    let mut buf = [0u8; 256];
    // Ids are printed space-separated as they stream: two spaces mean two whole ids.
    while out.iter().filter(|&&b| b == b' ').count() < 2 {
        match stdout.read(&mut buf).expect("read k3's output") {
            0 => break,
            n => out.extend_from_slice(&buf[..n]),
        }
    }
    if out.is_empty() {
        let done = child.wait_with_output().expect("k3 exits");
        assert_eq!(
            done.status.code(),
            Some(5),
            "k3 ended without output, not refused as busy: {}",
            text(&done.stderr)
        );
        return RequestEnd::Refused;
    }
    child.kill().expect("SIGKILL k3");
    child.wait().expect("reap k3");
    let text = String::from_utf8(out).expect("ids are ASCII");
    let whole = text.rsplit_once(' ').map_or("", |(whole, _)| whole);
    let got: Vec<u32> = whole
        .split(' ')
        .map(|id| id.parse().expect("an id"))
        .collect();
    assert_prefix(&got, expected, "k3 run killed mid-stream");
    RequestEnd::Cut
}

/// One client: its own connection, requests of its kind until the deadline, and at least one
/// that the queue took (so every kind is exercised however the queue favoured the others).
async fn client_loop(i: usize, ctx: Arc<Ctx>) -> Tally {
    let kind = if i < ctx.busy {
        KINDS[i % KINDS.len()]
    } else {
        RequestKind::Status
    };
    let mut c = client(&ctx.socket).await;
    let mut tally = Tally::new();
    let mut round = 0;
    let mut got_in = false;
    while Instant::now() < ctx.deadline || !got_in {
        let v = (i + round) % ctx.variants;
        let (prompt, expected) = &ctx.solo.generate[v];
        let outcome = match kind {
            RequestKind::Status => {
                status(&mut c).await;
                tokio::time::sleep(BACKOFF).await;
                RequestEnd::Completed
            }
            RequestKind::Generate => {
                let req = ids_request(prompt.clone(), ctx.max_tokens);
                complete(c.generate(req).await, expected, "generate").await
            }
            RequestKind::Chat => {
                let (req, expected) = &ctx.solo.chat[v];
                complete(c.chat(req.clone()).await, expected, "chat").await
            }
            RequestKind::Session => {
                session(&mut c, &ctx, &format!("load-{i}-{round}"), v, &mut tally).await;
                round += 1;
                got_in = true;
                continue;
            }
            RequestKind::Cancel => cancel(&mut c, expected, prompt.clone()).await,
            RequestKind::Drop => drop_stream(&mut c, expected, prompt.clone()).await,
            RequestKind::Kill => {
                let (socket, prompt, expected) =
                    (ctx.socket.clone(), prompt.clone(), expected.clone());
                tokio::task::spawn_blocking(move || kill_k3(&socket, &expected, &prompt))
                    .await
                    .expect("k3 task")
            }
            RequestKind::Http => {
                let ctx = Arc::clone(&ctx);
                tokio::task::spawn_blocking(move || {
                    let (prompt, expected) = &ctx.solo.http[v];
                    match http_completion(&ctx.http, &ctx.solo.model_id, prompt, ctx.max_tokens) {
                        Ok(got) => {
                            assert_eq!(&got, expected, "HTTP completion: not its solo output");
                            RequestEnd::Completed
                        }
                        Err((429, _)) => RequestEnd::Refused,
                        Err((status, body)) => panic!("HTTP completion: {status} {body}"),
                    }
                })
                .await
                .expect("HTTP task")
            }
        };
        *tally.entry((kind, outcome)).or_default() += 1;
        if outcome == RequestEnd::Refused {
            tokio::time::sleep(BACKOFF).await;
        } else {
            got_in = true;
        }
        round += 1;
    }
    tally
}

/// `/proc/PID/status` field `name` (`VmHWM`, `Threads`): its number (kB for sizes).
fn proc_status(pid: u32, name: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
}

/// Waits (at most `limit`) until `ok` holds of the daemon's Status; the last Status.
async fn status_until(
    c: &mut EngineClient<Channel>,
    limit: Duration,
    ok: impl Fn(&pb::StatusReply) -> bool,
) -> pb::StatusReply {
    let deadline = Instant::now() + limit;
    loop {
        let s = status(c).await;
        if ok(&s) || Instant::now() > deadline {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn run_load(load: Load) {
    let dir = scratch(&format!("load-{}", load.name));
    let socket = dir.path().join("k3d.sock");
    let http_socket = dir.path().join("k3d-http.sock");
    let ram = load.ram_gib.to_string();
    let http_arg = format!("unix:{}", http_socket.display());
    let d = Daemon::start(
        &load.model,
        &socket,
        &[
            "--ram-gb",
            &ram,
            "--session-gb",
            "0.01",
            "--max-active",
            MAX_ACTIVE,
            "--max-queue",
            MAX_QUEUE,
            // One account sends everything: the test is of the slots and the queue, not of
            // one user's share of them.
            "--max-active-per-uid",
            MAX_ACTIVE,
            "--max-queued-per-uid",
            MAX_QUEUE,
            // Every client here is one account (root), which the per-peer connection cap
            // (default 64) would otherwise meet: the test is of 64 clients, not of that cap.
            "--max-connections-per-peer",
            "256",
            "--http",
            &http_arg,
        ],
    );
    let pid = d.child.id();
    let mut c = client(&socket).await;
    wait_ready(&mut c).await;
    let solo = solo(&mut c, &http_socket, &load).await;
    // Idle: loaded, having served requests one at a time.
    let idle_threads = proc_status(pid, "Threads");

    let started = Instant::now();
    let ctx = Arc::new(Ctx {
        socket: socket.clone(),
        http: http_socket,
        solo,
        max_tokens: load.max_tokens,
        variants: load.variants,
        busy: load.busy,
        deadline: started + load.duration,
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| tokio::spawn(client_loop(i, Arc::clone(&ctx))))
        .collect();
    let mut tally = Tally::new();
    for client in clients {
        for (key, n) in client.await.expect("a client task panicked") {
            *tally.entry(key).or_default() += n;
        }
    }
    let elapsed = started.elapsed();

    // Cut requests stop within a layer; allow them a bounded moment.
    let s = status_until(&mut c, Duration::from_secs(10), |s| {
        s.active_requests == 0
            && s.queued_requests == 0
            && s.sessions.as_ref().is_some_and(|x| x.leased == 0)
    })
    .await;
    let sessions = s.sessions.clone().expect("session figures");
    eprintln!(
        "{}: {CLIENTS} clients for {elapsed:.1?}: {tally:?}; daemon counters: completed {}, \
         cancelled {}, rejected {}, failed {}, widest batch {}",
        load.name,
        s.requests_completed,
        s.requests_cancelled,
        s.requests_rejected,
        s.requests_failed,
        s.widest_batch
    );
    assert_eq!(s.active_requests, 0, "requests still running");
    assert_eq!(s.queued_requests, 0, "requests still queued");
    assert_eq!(sessions.leased, 0, "sessions still leased");
    assert_eq!(sessions.count, 0, "every session was deleted");
    assert_eq!(s.requests_failed, 0, "no request failed");
    for kind in KINDS {
        let done = if matches!(
            kind,
            RequestKind::Cancel | RequestKind::Drop | RequestKind::Kill
        ) {
            RequestEnd::Cut
        } else {
            RequestEnd::Completed
        };
        assert!(
            tally.get(&(kind, done)).is_some_and(|&n| n > 0),
            "no {kind:?} request {done:?}: {tally:?}"
        );
    }
    let refusals: usize = tally
        .iter()
        .filter(|((_, o), _)| *o == RequestEnd::Refused)
        .map(|(_, n)| n)
        .sum();
    assert!(refusals > 0, "the queue never overflowed: {tally:?}");

    let peak = proc_status(pid, "VmHWM") << 10;
    let budget = (load.ram_gib * (1u64 << 30) as f64) as u64;
    eprintln!(
        "{}: peak RSS {:.1} MiB, budget {:.1} MiB + overhead {} MiB",
        load.name,
        peak as f64 / (1 << 20) as f64,
        budget as f64 / (1 << 20) as f64,
        OVERHEAD_BYTES >> 20
    );
    assert!(
        peak <= budget + OVERHEAD_BYTES,
        "peak RSS {peak} B over budget {budget} B + overhead {OVERHEAD_BYTES} B"
    );

    // The runtime's blocking pool lets an idle thread go after 10 s (tokio's keep-alive).
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut threads = proc_status(pid, "Threads");
    while threads > idle_threads && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        threads = proc_status(pid, "Threads");
    }
    eprintln!(
        "{}: threads idle {idle_threads}, after the load {threads}",
        load.name
    );
    assert!(
        threads <= idle_threads,
        "{threads} threads 15 s after the load, {idle_threads} when idle before it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_clients_on_tiny_get_their_solo_outputs_and_leave_nothing_behind() {
    run_load(Load {
        name: "tiny",
        model: tiny_model().to_path_buf(),
        ram_gib: 0.02,
        max_tokens: 8,
        duration: Duration::from_secs(8),
        variants: 4,
        busy: CLIENTS,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_clients_on_small_get_their_solo_outputs_and_leave_nothing_behind() {
    let dir = scratch("load-small-model");
    let model = synth_model("small", &dir.path().join("small"));
    run_load(Load {
        name: "small",
        model,
        ram_gib: 0.12,
        max_tokens: 2,
        duration: Duration::from_secs(2),
        variants: 2,
        busy: 2 * KINDS.len(),
    })
    .await;
}
