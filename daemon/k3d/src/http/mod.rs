//! The OpenAI-compatible HTTP API (`k3d serve --http unix:PATH | IP:PORT`): HTTP/1.1 with
//! Server-Sent Events, served by axum on the daemon's tokio runtime beside gRPC, as a thin
//! mapping onto the same serve core (`k3_engine::serve::Core`: validation, admission queue,
//! batching, sessions), exactly as the gRPC service is.
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/responses`
//! ([`responses`], what Codex speaks), `GET /v1/models`, `GET /` (a pointer to the rest),
//! `GET /health`, `GET /metrics`, and Anthropic's `POST /v1/messages` and
//! `POST /v1/messages/count_tokens` ([`anthropic`], issue 15 point 9); anything else is a 404
//! in OpenAI's error shape.
//!
//! Who may connect: on a Unix socket, whoever the socket's file mode lets in, identified by
//! uid (SO_PEERCRED) exactly as on the gRPC socket; on TCP, with `http_api_keys` in the config
//! file, only requests bearing one (`Authorization: Bearer KEY`, or `x-api-key: KEY` as
//! Anthropic's clients send it); `/health` and `/` need no key so supervisors and clients can
//! probe them.

pub mod anthropic;
pub mod body;
mod completions;
mod error;
mod error_log;
mod listen;
mod metrics;
mod reader;
#[cfg(test)]
mod replay;
pub mod responses;
mod server;
mod stream;
mod unique;

pub use listen::{Bound, Endpoint, Peer, bind, check_exposure};

use axum::Router;
use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use error::ApiError;
use k3_engine::echo::Echo;
use k3_engine::serve::{Caller, Core, Health, Reservation, Turn};
use serde_json::json;
use server::Connection;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Largest request body accepted when the config does not say (`http_body_limit`).
pub const DEFAULT_BODY_LIMIT: usize = 8 << 20;
/// `--idle-timeout`: longer than the clients' own keep-alive expiry (httpx 5 s, Node's 4 s),
/// so they close an idle connection before k3d does and never reuse one k3d is closing.
pub const DEFAULT_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// `--body-timeout`: the largest body (8 MiB) at 300 KB/s, far slower than any local client.
pub const DEFAULT_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The HTTP API's settings, from the command line and the config file.
pub struct Settings {
    /// Bearer keys accepted on TCP (config file only: a command line is visible to every user).
    pub keys: Vec<String>,
    pub body_limit: usize,
    /// The id `/v1/models` lists and requests must name.
    pub model_id: String,
    /// The RAM budget the model is planned in, for `/metrics`.
    pub budget_bytes: Option<u64>,
    /// How long a kept-alive connection may wait for its next request head, head included
    /// (`--idle-timeout`).
    pub idle_timeout: std::time::Duration,
    /// How long a request's body may take to arrive (`--body-timeout`).
    pub body_timeout: std::time::Duration,
}

pub struct App {
    core: Arc<Core>,
    settings: Settings,
    /// When the daemon started (`/v1/models`' `created`).
    created: u64,
    metrics: metrics::Metrics,
    /// Error answers in the daemon's log, rate-limited.
    errors: error_log::ErrorLog,
}

impl App {
    pub fn new(core: Arc<Core>, settings: Settings) -> Arc<App> {
        let metrics = metrics::Metrics::new(Arc::clone(&core), settings.budget_bytes);
        Arc::new(App {
            core,
            settings,
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            metrics,
            errors: error_log::ErrorLog::new(),
        })
    }

    /// A request names the served model by its id (the checkpoint directory's name) or by
    /// [`MODEL_ALIAS`]; any other name is a 404, so a client set up for another server or
    /// model (a Claude or GPT name) learns it at once instead of getting K3's words.
    fn check_model(&self, model: &str) -> Result<(), ApiError> {
        if model == self.settings.model_id || is_alias(model) {
            Ok(())
        } else {
            Err(ApiError::unknown_model(model, &self.settings.model_id))
        }
    }

    /// Generation needs the model loaded: 503 (with Retry-After, which SDKs honour) before.
    fn check_ready(&self) -> Result<(), ApiError> {
        match self.core.health() {
            Health::Ready => Ok(()),
            Health::Loading(figures) => Err(ApiError::unavailable(format!(
                "the model is loading ({figures}); retry shortly"
            ))),
            Health::Failed(e) => Err(ApiError::unavailable(format!(
                "the model failed to load, so k3d cannot generate: {e}"
            ))),
        }
    }
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route(
            "/v1/chat/completions",
            post(|State(app): State<Arc<App>>, request| {
                complete(app, request, completions::CompletionKind::Chat)
            }),
        )
        .route(
            "/v1/completions",
            post(|State(app): State<Arc<App>>, request| {
                complete(app, request, completions::CompletionKind::Text)
            }),
        )
        .route(
            "/v1/responses",
            post(|State(app): State<Arc<App>>, request| responses::responses(app, request)),
        )
        .route(
            "/v1/messages",
            post(|State(app): State<Arc<App>>, request| anthropic::messages(app, request)),
        )
        .route(
            "/v1/messages/count_tokens",
            post(|State(app): State<Arc<App>>, request| anthropic::count_tokens(app, request)),
        )
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/", get(root))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(|| async { ApiError::not_found("no such route (see GET /v1/models)") })
        .layer(middleware::from_fn_with_state(Arc::clone(&app), guard))
        .with_state(app)
}

/// Authentication and per-request accounting, around every route.
async fn guard(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    request: Request,
    next: Next,
) -> Response {
    let endpoint = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    // The log names the route (an unmatched path as the client sent it: quoted, bounded).
    let called = match request.extensions().get::<MatchedPath>() {
        Some(route) => format!("{} {}", request.method(), route.as_str()),
        None => format!("{} {}", request.method(), Echo(request.uri().path())),
    };
    let mut request = request;
    let authorised = authorise(&app, peer, request.headers(), &endpoint).and_then(|caller| {
        // Issue 35 point 1: a keyed caller is one peer per key, whatever address it uses.
        if let (Caller::Key { key, .. }, Some(connection)) =
            (&caller, request.extensions().get::<Connection>())
        {
            connection
                .0
                .rekey(crate::net::gate::PeerKey::Key(*key))
                .map_err(|reason| ApiError::too_many_connections(format!("k3d {reason}")))?;
        }
        Ok(caller)
    });
    let response = match authorised {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(e) => {
            // A refused connection is closed once told (it would be refused again).
            let close = e.code == Some("too_many_connections");
            // Anthropic's clients read errors in Anthropic's shape.
            let mut response = if endpoint.starts_with("/v1/messages") {
                error::Anthropic(e).into_response()
            } else {
                e.into_response()
            };
            if close {
                response.headers_mut().insert(
                    header::CONNECTION,
                    header::HeaderValue::from_static("close"),
                );
            }
            response
        }
    };
    app.metrics.request(&endpoint, response.status().as_u16());
    let status = response.status();
    if status.is_client_error() || status.is_server_error() {
        let reason = response.extensions().get::<error::Reason>().map_or_else(
            || status.canonical_reason().unwrap_or("no reason given"),
            |r| r.0.as_str(),
        );
        app.errors.answered(&called, status, reason);
    }
    response
}

/// Who the request is from ([`Caller`]): the API key it presented when the daemon has keys
/// (a TCP caller must present one), else the account the kernel names for its connection —
/// a Unix peer's credentials, a loopback TCP peer's socket owner. A caller neither names is
/// [`Caller::Unknown`]: nothing is kept for it (issue 35 point 7).
fn authorise(
    app: &App,
    peer: Peer,
    headers: &HeaderMap,
    endpoint: &str,
) -> Result<Caller, ApiError> {
    let by_account = peer.uid().map_or(Caller::Unknown, Caller::Uid);
    let keys = &app.settings.keys;
    if matches!(peer, Peer::Unix { .. }) || keys.is_empty() || ["/health", "/"].contains(&endpoint)
    {
        return Ok(by_account);
    }
    let header_text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let given = header_text(header::AUTHORIZATION)
        .and_then(bearer_token)
        .or_else(|| header_text(X_API_KEY))
        .ok_or_else(|| {
            ApiError::unauthorized(
                "an API key is required: Authorization: Bearer KEY (or x-api-key: KEY)",
            )
        })?;
    // Every key is compared, so the time taken does not say which one matched.
    let matched = keys.iter().enumerate().fold(None, |found, (index, k)| {
        let equal = constant_time_eq(k.as_bytes(), given.trim().as_bytes());
        found.or(equal.then_some(index))
    });
    match matched {
        Some(key) => Ok(Caller::Key { key, scope: None }),
        None => Err(ApiError::unauthorized(
            "the API key is not one of this daemon's keys",
        )),
    }
}

/// The credentials of an `Authorization: Bearer KEY` header; the scheme's name is
/// case-insensitive (RFC 9110 §11.1), so `bearer KEY` is the same header.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

/// The header Anthropic's clients carry their key in (Claude Code's `ANTHROPIC_API_KEY`;
/// its `ANTHROPIC_AUTH_TOKEN` goes out as a bearer token).
const X_API_KEY: header::HeaderName = header::HeaderName::from_static("x-api-key");

/// Compares without an early exit, so timing does not reveal how much of a key matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The body, at most `http_body_limit` bytes, within `--body-timeout`. A declared length
/// over the limit is refused before a byte of the body is read (413), a longer body as soon
/// as it passes the limit, a slow one at its deadline (408).
async fn body(app: &App, request: Request) -> Result<axum::body::Bytes, ApiError> {
    let limit = app.settings.body_limit;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let timeout = app.settings.body_timeout;
    match tokio::time::timeout(timeout, axum::body::to_bytes(request.into_body(), limit)).await {
        Ok(read) => read.map_err(|_| ApiError::too_large(limit)),
        Err(_) => Err(ApiError::body_timeout(timeout)),
    }
}

/// `POST /v1/chat/completions` and `/v1/completions`.
async fn complete(
    app: Arc<App>,
    request: Request,
    shape: completions::CompletionKind,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let caller = request.extensions().get::<Caller>().cloned();
    let (reservation, bytes) = reserve(&app, caller.as_ref(), request).await?;
    completions::complete(app, caller, shape, bytes, reservation, arrived).await
}

/// A place in the serve core's queue for `caller`'s request (its account's: [`Caller`]),
/// taken before its body is read (issue 35 point 2), then the body ([`body`]). A queue or an
/// account's share that is full refuses the request (429) before anything is kept of it: its
/// body is then only read to be dropped, so that a client still writing it gets the answer
/// rather than a broken pipe.
async fn reserve(
    app: &App,
    caller: Option<&Caller>,
    request: Request,
) -> Result<(Reservation, axum::body::Bytes), ApiError> {
    match app.core.reserve(caller.unwrap_or(&Caller::Unknown)) {
        Ok(reservation) => Ok((reservation, body(app, request).await?)),
        Err(e) => {
            discard(app, request).await;
            Err(ApiError::from_serve(&e, None))
        }
    }
}

/// Reads and drops a body the daemon will not use, within the body limit and deadline.
async fn discard(app: &App, request: Request) {
    use tokio_stream::StreamExt;
    let mut left = app.settings.body_limit;
    let mut data = request.into_body().into_data_stream();
    let _ = tokio::time::timeout(app.settings.body_timeout, async {
        while let Some(Ok(chunk)) = data.next().await {
            left = left.saturating_sub(chunk.len());
            if left == 0 {
                break;
            }
        }
    })
    .await;
}

/// Runs `prepare` — parse the body, build the core's request, render, tokenise, submit — on
/// a blocking thread once the core gives the reserved request its preparation turn: at most
/// a few requests are prepared at once, in turns fair across users, so the memory a flood of
/// bodies can take is a few bodies' (`serve::Core::turn`). After a large body the memory its
/// preparation freed is given back to the system ([`give_back_freed_memory`]).
async fn prepare<T, E>(
    app: &Arc<App>,
    reservation: Reservation,
    body: axum::body::Bytes,
    prepare: impl FnOnce(&App, Turn, axum::body::Bytes) -> Result<T, E> + Send + 'static,
) -> Result<T, E>
where
    T: Send + 'static,
    E: From<ApiError> + Send + 'static,
{
    let app = Arc::clone(app);
    tokio::task::spawn_blocking(move || {
        let large = body.len() >= LARGE_BODY;
        let turn = app.core.turn(reservation);
        let prepared = prepare(&app, turn, body);
        if large {
            give_back_freed_memory();
        }
        prepared
    })
    .await
    .map_err(|e| {
        E::from(ApiError::internal(format!(
            "the request's task failed: {e}"
        )))
    })?
}

/// A body from this size on is large: its preparation allocates and frees enough that the
/// freed memory is worth giving back at once.
const LARGE_BODY: usize = 1 << 20;

/// Gives the heap's free memory back to the system. glibc keeps what a thread's arena freed
/// for its next allocations (and serves a large body from an arena once one was freed, its
/// mmap threshold having risen), so without this each large preparation would leave the
/// daemon's resident memory at its peak.
fn give_back_freed_memory() {
    // SAFETY: `malloc_trim` takes no pointer; it walks glibc's own arenas under their locks
    // and returns free pages to the kernel, so it is sound from any thread at any time.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The name every daemon answers to beside its directory's, whatever that is called: k3d
/// serves only Kimi K3 checkpoints, so the README's and docs' examples run as written against
/// any of them (issue 46.1), the tiny fixture (`model`) and `/var/lib/k3d/models/kimi-k3`
/// alike. Hugging Face's repository id and any letter case are the same name.
pub const MODEL_ALIAS: &str = "Kimi-K3";

fn is_alias(model: &str) -> bool {
    let name = model.strip_prefix("moonshotai/").unwrap_or(model);
    name.eq_ignore_ascii_case(MODEL_ALIAS)
}

/// An OpenAI model object, with the model fingerprint (`k3 status`'s) once it is loaded.
fn model_entry(app: &App) -> serde_json::Value {
    // The limits clients size requests by (issue 34 point 4): the context under the names
    // OpenRouter/aider (`context_length`) and vLLM (`max_model_len`) read, and the daemon's
    // cap on new tokens per reply (a larger `max_tokens` is clamped to it, never refused).
    let context = app.core.context_length();
    let mut entry = json!({
        "id": app.settings.model_id,
        "object": "model",
        "created": app.created,
        "owned_by": "k3d",
        "context_length": context,
        "max_model_len": context,
        "max_tokens_cap": app.core.limits().max_tokens_cap,
        // The longest prompt a request may have, after rendering (--max-prompt-tokens).
        "max_prompt_tokens": app.core.limits().max_prompt_tokens,
    });
    if let Some(info) = app.core.status().admission.info {
        entry["fingerprint"] = info.fingerprint.into();
    }
    entry
}

async fn models(State(app): State<Arc<App>>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_entry(&app)]})).into_response()
}

async fn model(
    State(app): State<Arc<App>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    app.check_model(&id)?;
    Ok(axum::Json(model_entry(&app)).into_response())
}

/// The root answers that k3d is here and where its APIs are, to anyone: clients probe it (Claude
/// Code sends `HEAD /` to warm its connection before its first request), and a 404 there
/// would read as a failure in the log.
async fn root() -> Response {
    (
        StatusCode::OK,
        "k3d: OpenAI and Anthropic APIs under /v1 (see GET /v1/models)\n",
    )
        .into_response()
}

/// `{"status": "loading", "progress": {"done", "total", "bytes_per_second", "eta_seconds",
/// "text"}}` (503: bytes of the resident weights read), `{"status": "ready"}` (200),
/// `{"status": "failed", "error"}` (503), `{"status": "shutting_down"}` (503).
async fn health(State(app): State<Arc<App>>) -> Response {
    let status = app.core.status();
    let (status, body) = match (&status.admission.health, status.admission.accepting) {
        (_, false) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "shutting_down"}),
        ),
        (Health::Ready, true) => (
            StatusCode::OK,
            json!({"status": "ready", "model": app.settings.model_id}),
        ),
        (Health::Loading(p), true) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "loading", "progress": {
                "done": p.done, "total": p.total,
                "bytes_per_second": p.bytes_per_second, "eta_seconds": p.eta_seconds,
                "text": p.to_string(),
            }}),
        ),
        (Health::Failed(e), true) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "failed", "error": e.to_string()}),
        ),
    };
    (status, axum::Json(body)).into_response()
}

async fn metrics_text(State(app): State<Arc<App>>) -> Result<Response, ApiError> {
    let text = app
        .metrics
        .render()
        .map_err(|e| ApiError::internal(format!("encoding the metrics: {e}")))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// What an HTTP/1.1 client refused by the connection gate is told (`net::refusal`, handed
/// this by the daemon): a 429 in OpenAI's error shape, as a whole response.
pub fn refusal_response(reason: &str) -> Vec<u8> {
    ApiError::too_many_connections(reason).http1_bytes()
}

/// Serves every bound endpoint until `stop` turns true, then lets open responses finish
/// (the serve core cancels what the shutdown grace does not allow).
pub async fn serve(
    app: Arc<App>,
    bound: Vec<Bound>,
    gate: Arc<crate::net::gate::Gate>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let mut tasks = tokio::task::JoinSet::new();
    for b in bound {
        let router = router(Arc::clone(&app));
        let stop = stop.clone();
        let gate = Arc::clone(&gate);
        let idle = app.settings.idle_timeout;
        match b {
            Bound::Unix { socket, .. } => {
                let listener = tokio::net::UnixListener::from_std(socket)
                    .context("registering the HTTP Unix socket")?;
                tasks.spawn(server::serve_on(listener, gate, router, idle, stop));
            }
            Bound::Tcp(socket) => {
                let listener = tokio::net::TcpListener::from_std(socket)
                    .context("registering the HTTP socket")?;
                tasks.spawn(server::serve_on(listener, gate, router, idle, stop));
            }
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.context("the HTTP server task")?
            .context("serving HTTP")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_http1_refusal_is_a_complete_429_with_an_openai_error_body() {
        let w = String::from_utf8(refusal_response("too many")).expect("text");
        let (head, body) = w.split_once("\r\n\r\n").expect("head and body");
        assert!(
            head.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
            "{head}"
        );
        assert!(head.contains("retry-after: 1\r\n"), "{head}");
        assert!(head.contains("connection: close\r\n"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let json: serde_json::Value = serde_json::from_str(body).expect("JSON body");
        assert_eq!(json["error"]["message"], "too many");
        assert_eq!(json["error"]["type"], "rate_limit_error");
        assert_eq!(json["error"]["code"], "too_many_connections");
    }

    #[test]
    fn kimi_k3_names_any_served_checkpoint_and_other_models_do_not() {
        for name in ["Kimi-K3", "kimi-k3", "moonshotai/Kimi-K3", "KIMI-K3"] {
            assert!(is_alias(name), "{name}");
        }
        for name in [
            "gpt-4o",
            "claude-sonnet-4-5",
            "Kimi-K2",
            "other/Kimi-K3",
            "",
        ] {
            assert!(!is_alias(name), "{name}");
        }
    }
}
