//! `k3d serve`: the daemon. The engine runs on its own thread (`scheduler`), which alone owns
//! it; tokio serves the gRPC layer (`service`) on a Unix socket (`listener`) and, with
//! `--http`, the OpenAI-compatible HTTP API (`crate::http`) over the same `Service`; they meet
//! the scheduler in `admission` (bounded queue, cancel registry, status figures).
//!
//! Shutdown (SIGTERM/SIGINT): stop accepting connections and requests, let admitted requests
//! finish for up to the grace period, then cancel the rest (each stops within one layer),
//! remove the socket and return so the process exits 0.

#[macro_use]
pub mod logging;
mod admission;
mod channels;
mod chat;
mod convert;
mod listener;
mod scheduler;
mod service;
mod sessions;
mod status;

pub use admission::{Limits, Phase, Shared};
pub use listener::{SocketSpec, bind as bind_socket};
pub use service::{EventStream, Service};
pub use status::memory;

use crate::exit::{CliError, CliResult, Exit};
use anyhow::Context;
use k3_engine::engine::EngineOptions;
use k3_engine::tokenizer::Tokenizer;
use k3proto::v1::engine_server::EngineServer;
use listener::Listener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::signal::unix::{SignalKind, signal};
use tokio_stream::wrappers::UnixListenerStream;

/// Largest gRPC message either way. Prompts are at most a few MB of text; anything larger is
/// refused by tonic with a status naming both sizes.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// After the grace period, how long cancelled requests get to unwind before we exit anyway.
const UNWIND_LIMIT: Duration = Duration::from_secs(5);

pub struct Config {
    pub model: PathBuf,
    pub socket: SocketSpec,
    pub threads: usize,
    /// Memory plan options (`--ram-gb` etc.).
    pub model_options: k3_engine::model::LoadOptions,
    pub limits: Limits,
    pub grace: Duration,
    /// Default draft ids per speculative step (0 = off), see `k3d serve --speculate`.
    pub speculate: usize,
    /// Where sessions are saved and spilled.
    pub session_dir: PathBuf,
    /// In-memory session allowance in bytes (`--session-gb`); `None` = from the plan.
    pub session_bytes: Option<u64>,
    /// The HTTP API's endpoints (`--http`, none = no HTTP) and settings.
    pub http: Vec<crate::http::Endpoint>,
    pub http_settings: crate::http::Settings,
}

pub fn run(cfg: Config) -> CliResult {
    logging::start();
    let tokenizer = Tokenizer::load(&cfg.model).map_err(|e| {
        CliError::new(
            Exit::Checkpoint,
            anyhow::anyhow!("loading the tokenizer of {}: {e}", cfg.model.display()),
        )
    })?;
    // Before any thread starts: binding changes the process umask for an instant.
    let listener = Listener::open(&cfg.socket)?;
    let http = crate::http::bind(&cfg.http, cfg.socket.mode, cfg.socket.group.as_deref())
        .inspect_err(|_| listener.remove())?;
    for b in &http {
        log!("HTTP API on {}", b.describe());
    }
    log!(
        "listening on {} (max {} active, {} queued; pid {})",
        listener.describe(),
        cfg.limits.max_active,
        cfg.limits.max_queue,
        std::process::id()
    );
    let shared = Arc::new(Shared::new(cfg.limits));
    let sessions = Arc::new(sessions::Sessions::new(cfg.session_dir, cfg.session_bytes));
    let scheduler = scheduler::spawn(
        Arc::clone(&shared),
        Arc::clone(&sessions),
        cfg.model.clone(),
        EngineOptions {
            threads: cfg.threads,
            model: cfg.model_options,
            ..EngineOptions::default()
        },
    )
    .context("starting the scheduler thread")?;
    // Two workers are plenty for socket I/O; compute threads belong to the engine.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("k3d-rpc")
        .enable_all()
        .build()
        .context("starting the RPC runtime")?;
    let service = Arc::new(service::Service {
        shared: Arc::clone(&shared),
        tokenizer,
        threads: cfg.threads,
        speculate: cfg.speculate,
        sessions,
    });
    let unix_http: Vec<_> = http.iter().map(crate::http::Bound::path).collect();
    let app = crate::http::App::new(Arc::clone(&service), cfg.http_settings);
    let result = runtime.block_on(serve(&listener, service, app, http, &shared, cfg.grace));
    listener.remove();
    for path in unix_http.into_iter().flatten() {
        let _ = std::fs::remove_file(path);
    }
    // A scheduler still loading the model cannot be interrupted; exiting the process ends it.
    let deadline = Instant::now() + UNWIND_LIMIT;
    while !scheduler.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if scheduler.is_finished() && scheduler.join().is_err() {
        log!("error: the scheduler thread panicked");
    }
    log!("stopped");
    Ok(result?)
}

async fn serve(
    listener: &Listener,
    service: Arc<service::Service>,
    app: Arc<crate::http::App>,
    http: Vec<crate::http::Bound>,
    shared: &Arc<Shared>,
    grace: Duration,
) -> anyhow::Result<()> {
    let socket = listener
        .socket
        .try_clone()
        .context("duplicating the listening socket")?;
    let incoming = UnixListenerStream::new(
        tokio::net::UnixListener::from_std(socket).context("registering the socket")?,
    );
    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    // Without endpoints the HTTP task ends at once: only a failure of a real one ends serving.
    let serving_http = !http.is_empty();
    let mut http = tokio::spawn(crate::http::serve(app, http, stop_rx.clone()));
    let svc = EngineServer::from_arc(service)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let mut server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop_rx.wait_for(|stop| *stop).await;
            }),
    );
    let name = tokio::select! {
        _ = terminate.recv() => "SIGTERM",
        _ = interrupt.recv() => "SIGINT",
        finished = &mut server => {
            // The server never ends on its own unless it failed.
            return match finished {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e).context("serving"),
                Err(e) => Err(e).context("the server task"),
            };
        }
        finished = &mut http, if serving_http => {
            return match finished {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(e).context("the HTTP server task"),
            };
        }
    };
    let snap = shared.snapshot();
    log!(
        "{name}: shutting down ({} running, {} queued; grace {:.1}s)",
        snap.active,
        snap.queued,
        grace.as_secs_f64()
    );
    shared.close();
    listener.remove();
    let _ = stop_tx.send(true);
    let deadline = tokio::time::Instant::now() + grace;
    while !shared.drained() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if !shared.drained() {
        log!("grace period over: cancelling what is still running");
        shared.stop_all();
    }
    let unwound = tokio::time::timeout(UNWIND_LIMIT, async {
        let (grpc, http) = tokio::join!(server, http);
        match http {
            Ok(Ok(())) => {}
            Ok(Err(e)) => log!("error: HTTP: {e:#}"),
            Err(e) => log!("error: the HTTP server task: {e}"),
        }
        grpc
    });
    match unwound.await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(e).context("serving"),
        Ok(Err(e)) => Err(e).context("the server task"),
        Err(_) => {
            log!("connections still open {UNWIND_LIMIT:?} after cancelling; exiting anyway");
            Ok(())
        }
    }
}
