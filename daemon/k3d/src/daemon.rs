//! `k3d serve`'s lifecycle: start, load, signals, shutdown. The serve core
//! (`k3_engine::serve`) owns the engine on its scheduler thread, the admission queue, sessions
//! and every request rule; this module opens the sockets (`net`), starts the core and tokio,
//! serves the `k3.v1` gRPC API (`grpc`) on the Unix socket and, with `--http`, the OpenAI- and
//! Anthropic-compatible HTTP API (`http`) on the same core, and ends them all on a signal.
//!
//! Lifecycle: a model that cannot be loaded ends the daemon with its one-line error and the
//! exit code of its class (so systemd's `Restart=` and `systemctl status` see it). On
//! SIGTERM/SIGINT: stop accepting connections and requests, let admitted requests finish for up
//! to the grace period, then cancel the rest (each stops within one layer), let the scheduler
//! write every session, remove the socket and return so the process exits 0 — or 6 when a
//! session could not be written (each is logged by name). A signal during
//! the model load exits at once: nothing is running and no session is open yet.

use crate::exit::{CliError, CliResult, Exit};
use crate::net::{SocketSpec, accept, gate, listener::Listener};
use crate::{grpc, logging};
use anyhow::Context;
use k3_engine::engine::EngineOptions;
use k3_engine::serve::{Capacity, Core, Health, Limits};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};

/// After the grace period, how long cancelled requests get to unwind (and the scheduler to
/// write sessions) before we exit anyway.
const UNWIND_LIMIT: Duration = Duration::from_secs(5);
/// How often the model's state is checked for a failed load.
const HEALTH_POLL: Duration = Duration::from_millis(20);

pub struct Options {
    pub model: PathBuf,
    pub socket: SocketSpec,
    pub threads: usize,
    /// Memory plan options (`--ram-gb` etc.).
    pub model_options: k3_engine::model::LoadOptions,
    pub capacity: Capacity,
    /// Request limits: `--max-tokens-cap`, `--speculate`, `--max-prompt-tokens`.
    pub limits: Limits,
    /// Why `limits.max_prompt_tokens` is what it is (the flag, or what the plan holds), for
    /// the start line.
    pub prompt_limit: String,
    /// `--stall-timeout`.
    pub stall_timeout: Duration,
    pub grace: Duration,
    /// Where sessions are saved and spilled.
    pub session_dir: PathBuf,
    /// In-memory session allowance in bytes (`--session-gb`); `None` = from the plan.
    pub session_bytes: Option<u64>,
    /// Sessions and bytes of session files one uid may have (`--sessions-per-uid`,
    /// `--session-disk-gb-per-uid`).
    pub session_quota: k3_engine::session::store::Quota,
    /// The HTTP API's endpoints (`--http`, none = no HTTP) and settings.
    pub http: Vec<crate::http::Endpoint>,
    pub http_settings: crate::http::Settings,
    /// Per-peer connection cap and handshake deadline, on every listener.
    pub connections: gate::ConnectionLimits,
    /// What reading the settings found worth a warning (a keys file others can read), logged
    /// once logging is up.
    pub start_warnings: Vec<String>,
}

/// How the serving loop ended.
enum Ended {
    /// SIGTERM or SIGINT (its name).
    Signal(&'static str),
    /// The model could not be loaded.
    LoadFailed(Arc<k3_engine::engine::EngineError>),
}

/// The serve core's state changes: a log line for each load report (the core sends one every
/// few seconds at most), and systemd's status line.
fn on_health(health: &Health, info: Option<&k3_engine::engine::EngineInfo>) {
    if let Health::Loading(figures) = health {
        log!("loading the model: {figures}");
    }
    crate::notify::health(health, info);
}

pub fn run(cfg: Options) -> CliResult {
    logging::start();
    for warning in &cfg.start_warnings {
        log_warn!("{warning}");
    }
    let core = Core::new(k3_engine::serve::Config {
        model: cfg.model.clone(),
        engine: EngineOptions {
            threads: cfg.threads,
            model: cfg.model_options,
            ..EngineOptions::default()
        },
        capacity: cfg.capacity,
        limits: cfg.limits,
        session_dir: cfg.session_dir,
        session_bytes: cfg.session_bytes,
        session_quota: cfg.session_quota,
        log: k3_engine::serve::Log(logging::core_line),
        on_health,
        stall_timeout: cfg.stall_timeout,
    })
    .map_err(|e| {
        let exit = match &e {
            k3_engine::serve::StartError::Config(c) if !c.is_io() => Exit::Usage,
            k3_engine::serve::StartError::Thread(_)
            | k3_engine::serve::StartError::AlreadyStarted => Exit::Failure,
            _ => Exit::Checkpoint,
        };
        CliError::new(exit, e)
    })?;
    let core = Arc::new(core);
    // Before any thread starts: binding changes the process umask for an instant.
    let listener = Listener::open(&cfg.socket)?;
    let http = crate::http::bind(&cfg.http, cfg.socket.mode, cfg.socket.group.as_deref())
        .inspect_err(|_| listener.remove())?;
    for b in &http {
        log!("HTTP API on {}", b.describe());
    }
    log!(
        "listening on {} (max {} active, {} per user; {} queued, {} per user; {} connections, \
         {} per peer; pid {})",
        listener.describe(),
        cfg.capacity.max_active,
        cfg.capacity.per_uid.max_active,
        cfg.capacity.max_queue,
        cfg.capacity.per_uid.max_queued,
        cfg.connections.total,
        cfg.connections.per_peer,
        std::process::id()
    );
    log!(
        "prompts up to {} tokens after rendering (--max-prompt-tokens: {})",
        cfg.limits.max_prompt_tokens,
        cfg.prompt_limit
    );
    // Two workers are plenty for socket I/O; compute threads belong to the engine.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("k3d-rpc")
        .enable_all()
        .build()
        .context("starting the RPC runtime")?;
    // Before the model starts loading: a signal that lands during the load must find its
    // handler installed (tokio keeps it until `recv`), not kill the process.
    let signals = runtime.block_on(async {
        anyhow::Ok(Signals {
            terminate: signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
            interrupt: signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
        })
    })?;
    core.start().context("starting the scheduler")?;
    let engine = grpc::engine(Arc::clone(&core), cfg.threads);
    let unix_http: Vec<_> = http.iter().filter_map(crate::http::Bound::path).collect();
    let app = crate::http::App::new(Arc::clone(&core), cfg.http_settings);
    let result = runtime.block_on(serve(
        &listener,
        engine,
        Http { app, bound: http },
        gate::Gate::new(cfg.connections, crate::http::refusal_response),
        &core,
        signals,
        cfg.grace,
    ));
    listener.remove();
    for path in unix_http {
        let _ = std::fs::remove_file(path);
    }
    if !core.join(UNWIND_LIMIT) && !matches!(core.health(), Health::Loading { .. }) {
        log!("the scheduler did not stop within {UNWIND_LIMIT:?}; exiting anyway");
    }
    let lost = core.sessions().lost();
    match result? {
        Ended::Signal(_) if !lost.is_empty() => {
            log_err!("exiting: {} sessions could not be written", lost.len());
            Err(CliError::new(
                Exit::SessionsLost,
                anyhow::anyhow!(
                    "{} sessions could not be written to {} at shutdown and their newest \
                     states are lost: {}",
                    lost.len(),
                    core.sessions().dir().display(),
                    lost.join(", ")
                ),
            ))
        }
        Ended::Signal(_) => {
            log!("stopped");
            Ok(())
        }
        Ended::LoadFailed(e) => {
            log_err!("exiting: the model could not be loaded");
            Err(CliError::new(
                crate::exit::engine_exit(&e),
                anyhow::anyhow!("loading {}: {e}", cfg.model.display()),
            ))
        }
    }
}

/// The shutdown signals, installed before the model starts loading.
struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

/// The HTTP API: its app on the core and its bound endpoints (none without `--http`).
struct Http {
    app: Arc<crate::http::App>,
    bound: Vec<crate::http::Bound>,
}

/// Resolves once the model's load has failed.
async fn load_failure(core: &Core) -> Arc<k3_engine::engine::EngineError> {
    loop {
        if let Health::Failed(e) = core.health() {
            return e;
        }
        tokio::time::sleep(HEALTH_POLL).await;
    }
}

async fn serve(
    listener: &Listener,
    engine: grpc::Engine,
    http: Http,
    gate: Arc<gate::Gate>,
    core: &Arc<Core>,
    mut signals: Signals,
    grace: Duration,
) -> anyhow::Result<Ended> {
    let socket = listener
        .socket
        .try_clone()
        .context("duplicating the listening socket")?;
    let incoming = accept::Accepting::new(
        tokio::net::UnixListener::from_std(socket).context("registering the socket")?,
        Arc::clone(&gate),
        gate::Greeting::Http2Preface,
    );
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    // Without endpoints the HTTP task ends at once: only a failure of a real one ends serving.
    let serving_http = !http.bound.is_empty();
    let mut http = tokio::spawn(crate::http::serve(
        http.app,
        http.bound,
        gate,
        stop_rx.clone(),
    ));
    let mut server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(engine)
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop_rx.wait_for(|stop| *stop).await;
            }),
    );
    let ended = tokio::select! {
        _ = signals.terminate.recv() => Ended::Signal("SIGTERM"),
        _ = signals.interrupt.recv() => Ended::Signal("SIGINT"),
        failed = load_failure(core) => Ended::LoadFailed(failed),
        finished = &mut server => {
            // The server never ends on its own unless it failed.
            return match finished {
                Ok(Ok(())) => Ok(Ended::Signal("the server ended")),
                Ok(Err(e)) => Err(e).context("serving"),
                Err(e) => Err(e).context("the server task"),
            };
        }
        finished = &mut http, if serving_http => {
            return match finished {
                Ok(Ok(())) => Ok(Ended::Signal("the HTTP server ended")),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(e).context("the HTTP server task"),
            };
        }
    };
    crate::notify::send("STOPPING=1\nSTATUS=shutting down");
    let status = core.status();
    match &ended {
        Ended::Signal(name) => log!(
            "{name}: shutting down ({} running, {} queued; grace {:.1}s)",
            status.admission.active,
            status.admission.queued,
            grace.as_secs_f64()
        ),
        Ended::LoadFailed(_) => log_err!("the model failed to load: shutting down"),
    }
    core.close();
    listener.remove();
    let _ = stop_tx.send(true);
    let deadline = tokio::time::Instant::now() + grace;
    while !core.drained() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if !core.drained() {
        log!("grace period over: cancelling what is still running");
        core.stop_all();
    }
    let unwound = tokio::time::timeout(UNWIND_LIMIT, async {
        let (grpc, http) = tokio::join!(server, http);
        match http {
            Ok(Ok(())) => {}
            Ok(Err(e)) => log_err!("HTTP: {e:#}"),
            Err(e) => log_err!("the HTTP server task: {e}"),
        }
        grpc
    });
    match unwound.await {
        Ok(Ok(Ok(()))) => Ok(ended),
        Ok(Ok(Err(e))) => Err(e).context("serving"),
        Ok(Err(e)) => Err(e).context("the server task"),
        Err(_) => {
            log_warn!("connections still open {UNWIND_LIMIT:?} after cancelling; exiting anyway");
            Ok(ended)
        }
    }
}
