//! `k3d serve`: load a model once and serve it over a Unix socket (see `daemon.rs`).
//!
//! Settings come from the command line and, with `--config FILE`, from a TOML file whose keys
//! are the long flag names with `-` written as `_` (`packaging/k3d.toml` documents them). A flag
//! given on the command line overrides the file; unknown keys in the file are refused.
use crate::exit::{CliError, CliResult, Exit};
use crate::{daemon, net};
use k3_engine::plan::{Budget, Serving};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (config.json, shards, tokenizer files). Required here or in --config.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Where to create the socket. Ignored when systemd passes one (socket activation)
    /// [default: $K3_SOCKET, else $XDG_RUNTIME_DIR/k3d.sock, else /run/k3d/k3d.sock — where
    /// `k3` looks].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Compute threads (default: all cores).
    #[arg(long, value_parser = super::threads)]
    threads: Option<usize>,
    /// TOML file with any of these settings (keys = flag names with `_`); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Requests that may wait for a compute slot; more are refused with RESOURCE_EXHAUSTED
    /// [default: 16].
    #[arg(long)]
    max_queue: Option<usize>,
    /// Requests computed at once (each holds its own state) [default: 4].
    #[arg(long)]
    max_active: Option<usize>,
    /// Requests of one user (uid) computed at once; their others wait while other users'
    /// start [default: no limit but --max-active].
    #[arg(long)]
    max_active_per_uid: Option<usize>,
    /// Requests of one user (uid) that may wait for a compute slot; more are refused with
    /// RESOURCE_EXHAUSTED (HTTP 429) [default: no limit but --max-queue].
    #[arg(long)]
    max_queued_per_uid: Option<usize>,
    /// Requests stepped together through one forward pass: they share each layer's weights
    /// and the union of their experts, each output exactly what it would be alone
    /// [default: max_active].
    #[arg(long)]
    max_batch: Option<usize>,
    /// Permissions of the socket file: 0660 (owner and group) or 0600 (owner only)
    /// [default: 0660].
    #[arg(long, value_parser = ["0660", "0600"])]
    socket_mode: Option<String>,
    /// Group owning the socket; its members may connect (with --socket-mode 0660).
    #[arg(long)]
    socket_group: Option<String>,
    /// On SIGTERM/SIGINT, seconds to let running requests finish before cancelling them
    /// [default: 10].
    #[arg(long)]
    shutdown_grace: Option<f64>,
    /// Exact speculative decoding for greedy requests that do not set it: at most N ids drafted
    /// from the context verified per decode step (0 = off, at most 16) [default: 0]. Also the
    /// most any request gets: the memory plan reserves each active request's rollback journal
    /// for N drafts.
    #[arg(long)]
    speculate: Option<usize>,
    /// Most new tokens one request may ask for (`max_tokens`); more is refused as invalid, so
    /// one request cannot hold the machine for hours [default: 4096].
    #[arg(long)]
    max_tokens_cap: Option<usize>,
    /// Ids a chat reply may think (its think channel) before k3d closes the thinking and the
    /// model answers, for requests that do not set their own budget; `none` = unbounded
    /// [default: 512].
    #[arg(long, value_name = "N|none", value_parser = parse_thinking_budget)]
    thinking_budget: Option<ThinkingBudget>,
    /// Directory where sessions are saved, spilled and found again after a restart
    /// [default: $XDG_STATE_HOME/k3d/sessions, else ~/.local/state/k3d/sessions].
    #[arg(long)]
    session_dir: Option<PathBuf>,
    /// GiB of the memory budget kept for in-memory sessions and each caller's kept conversation
    /// states; the model is planned in the rest. Idle sessions beyond it are written to the
    /// session directory [default: one conversation state of the planned context per active
    /// request, as much as the budget holds beside the model, plus the plan's headroom].
    #[arg(long)]
    session_gb: Option<f64>,
    /// Sessions one user (uid) may have; creating more is refused (RESOURCE_EXHAUSTED)
    /// [default: 64].
    #[arg(long)]
    sessions_per_uid: Option<usize>,
    /// GiB of session files one user (uid) may have in the session directory; a save beyond
    /// is refused, a spill beyond drops that user's session from memory [default: 16].
    #[arg(long)]
    session_disk_gb_per_uid: Option<f64>,
    /// Also serve the OpenAI-compatible HTTP API here: unix:PATH (same access rules as
    /// --socket; callers identified by uid) or IP:PORT (loopback unless `http_api_keys` is set
    /// in --config). Repeatable.
    #[arg(long = "http", value_name = "unix:PATH|IP:PORT")]
    http: Vec<crate::http::Endpoint>,
    /// Connections one peer may hold at once, over the gRPC socket and every HTTP endpoint
    /// together (a Unix socket peer is a uid, a TCP one an IP address); more are closed at
    /// once [default: 64].
    #[arg(long)]
    max_connections_per_peer: Option<usize>,
    /// Seconds a new connection may take to send its HTTP/2 preface (gRPC) or its first
    /// request head (HTTP) before it is closed [default: 10].
    #[arg(long)]
    handshake_timeout: Option<f64>,
    #[command(flatten)]
    budget: super::budget::BudgetArgs,
}

/// The `--config` file: every key optional, none unknown.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    model: Option<PathBuf>,
    socket: Option<PathBuf>,
    threads: Option<usize>,
    max_queue: Option<usize>,
    max_active: Option<usize>,
    max_active_per_uid: Option<usize>,
    max_queued_per_uid: Option<usize>,
    max_batch: Option<usize>,
    socket_mode: Option<String>,
    socket_group: Option<String>,
    shutdown_grace: Option<f64>,
    /// GiB (a number) or a preset name, as `--ram-gb`.
    ram_gb: Option<RamGb>,
    trunk_gb: Option<f64>,
    cache_gb: Option<f64>,
    speculate: Option<usize>,
    max_tokens_cap: Option<usize>,
    /// A number of ids, or "none" (unbounded), as `--thinking-budget`.
    thinking_budget: Option<ThinkingBudget>,
    session_dir: Option<PathBuf>,
    session_gb: Option<f64>,
    sessions_per_uid: Option<usize>,
    session_disk_gb_per_uid: Option<f64>,
    /// `--http` endpoints; the command line's replace the file's.
    http: Option<Vec<String>>,
    /// Bearer keys the HTTP API accepts on TCP. Only here, never on the command line, which
    /// every user of the machine can read (`ps`); keep the file mode 0600 or 0640.
    http_api_keys: Option<Vec<String>>,
    /// Largest HTTP request body in bytes (larger gets 413).
    http_body_limit: Option<usize>,
    max_connections_per_peer: Option<usize>,
    handshake_timeout: Option<f64>,
}

/// `--thinking-budget` / `thinking_budget`: a number of ids, or `none` for unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ThinkingBudget(Option<usize>);

fn parse_thinking_budget(s: &str) -> Result<ThinkingBudget, String> {
    match s {
        "none" => Ok(ThinkingBudget(None)),
        n => n
            .parse()
            .map(|n| ThinkingBudget(Some(n)))
            .map_err(|_| format!("{s:?}: give a number of ids or `none`")),
    }
}

impl<'de> serde::Deserialize<'de> for ThinkingBudget {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Given {
            Ids(usize),
            Word(String),
        }
        match Given::deserialize(d)? {
            Given::Ids(n) => Ok(ThinkingBudget(Some(n))),
            Given::Word(w) => parse_thinking_budget(&w).map_err(serde::de::Error::custom),
        }
    }
}

/// `ram_gb = 120` or `ram_gb = "laptop"`.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum RamGb {
    Gib(f64),
    Preset(String),
}

fn usage(message: String) -> CliError {
    CliError::new(Exit::Usage, anyhow::anyhow!(message))
}

/// `$XDG_STATE_HOME/k3d/sessions`, else `$HOME/.local/state/k3d/sessions` (XDG base dirs).
fn default_session_dir() -> Result<PathBuf, CliError> {
    use etcetera::BaseStrategy;
    etcetera::base_strategy::Xdg::new()
        .ok()
        .and_then(|xdg| xdg.state_dir())
        .map(|state| state.join("k3d/sessions"))
        .ok_or_else(|| {
            usage(
                "no session directory: pass --session-dir DIR or set `session_dir` in --config \
                 (there is no home directory for the XDG state directory)"
                    .into(),
            )
        })
}

/// The files every checkpoint directory has (spec §3; the shards the index names are checked
/// when the model loads).
const MODEL_FILES: [&str; 4] = [
    "config.json",
    k3_engine::checkpoint::safetensors::INDEX_FILE_NAME,
    "tiktoken.model",
    "tokenizer_config.json",
];

/// Refuses a directory that is not a checkpoint before anything starts, naming what is
/// missing, rather than failing later on whichever file is read first.
fn check_model_dir(dir: &Path) -> Result<(), CliError> {
    let refuse = |what: String| CliError::new(Exit::Checkpoint, anyhow::anyhow!(what));
    if !dir.is_dir() {
        return Err(refuse(format!(
            "--model {}: not a directory (a checkpoint directory holds {})",
            dir.display(),
            MODEL_FILES.join(", ")
        )));
    }
    let missing: Vec<&str> = MODEL_FILES
        .into_iter()
        .filter(|f| !dir.join(f).is_file())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let what = if missing.len() == MODEL_FILES.len() {
        "is not a checkpoint directory"
    } else {
        "is not a complete checkpoint directory"
    };
    Err(refuse(format!(
        "--model {} {what}: missing {}",
        dir.display(),
        missing.join(", ")
    )))
}

fn read_config(path: &Path) -> Result<ConfigFile, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| usage(format!("--config {}: {e}", path.display())))?;
    toml::from_str(&text).map_err(|e| usage(format!("--config {}: {e}", path.display())))
}

pub fn run(args: Args) -> CliResult {
    let file = match &args.config {
        Some(path) => read_config(path)?,
        None => ConfigFile::default(),
    };
    let model = args.model.or(file.model).ok_or_else(|| {
        usage("no model directory: pass --model DIR or set `model` in --config".into())
    })?;
    // The client's rule when neither says (K3_SOCKET, $XDG_RUNTIME_DIR, /run/k3d), so a
    // plain `k3d serve` and a plain `k3` meet.
    let socket = args
        .socket
        .or(file.socket)
        .unwrap_or_else(|| k3proto::socket::default_path().0);
    let shutdown_grace = args.shutdown_grace.or(file.shutdown_grace).unwrap_or(10.0);
    if !shutdown_grace.is_finite() || !(0.0..=3600.0).contains(&shutdown_grace) {
        return Err(usage(
            "shutdown_grace must be between 0 and 3600 seconds".into(),
        ));
    }
    let threads = match args.threads.or(file.threads) {
        Some(n) => k3_engine::engine::check_threads(n).map_err(usage)?,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let max_active = args.max_active.or(file.max_active).unwrap_or(4);
    if max_active == 0 {
        return Err(usage("max_active must be at least 1".into()));
    }
    let per_uid = k3_engine::serve::UidLimits {
        max_active: match args.max_active_per_uid.or(file.max_active_per_uid) {
            Some(0) => return Err(usage("max_active_per_uid must be at least 1".into())),
            Some(n) => n,
            None => usize::MAX,
        },
        max_queued: args
            .max_queued_per_uid
            .or(file.max_queued_per_uid)
            .unwrap_or(usize::MAX),
    };
    let speculate = args.speculate.or(file.speculate).unwrap_or(0);
    if speculate > k3_engine::engine::request::MAX_SPECULATE {
        return Err(usage(format!(
            "speculate {speculate} exceeds the limit {}",
            k3_engine::engine::request::MAX_SPECULATE
        )));
    }
    let max_tokens_cap = args
        .max_tokens_cap
        .or(file.max_tokens_cap)
        .unwrap_or(k3_engine::serve::validate::DEFAULT_MAX_TOKENS_CAP);
    if max_tokens_cap == 0 || max_tokens_cap > k3_engine::engine::request::MAX_TOKENS_LIMIT {
        return Err(usage(format!(
            "max_tokens_cap must be between 1 and {}",
            k3_engine::engine::request::MAX_TOKENS_LIMIT
        )));
    }
    let max_batch = args.max_batch.or(file.max_batch).unwrap_or(max_active);
    if max_batch == 0 {
        return Err(usage("max_batch must be at least 1".into()));
    }
    let mode = match args.socket_mode.or(file.socket_mode).as_deref() {
        None | Some("0660") => 0o660,
        Some("0600") => 0o600,
        Some(other) => {
            return Err(usage(format!(
                "socket_mode {other:?}: use \"0660\" or \"0600\""
            )));
        }
    };
    let session_dir = match args.session_dir.or(file.session_dir) {
        Some(dir) => dir,
        None => default_session_dir()?,
    };
    let session_bytes = args
        .session_gb
        .or(file.session_gb)
        .map(|g| Budget::gib("--session-gb", g))
        .transpose()
        .map_err(|e| usage(e.to_string()))?;
    let defaults = k3_engine::session::store::Quota::default();
    let session_quota = k3_engine::session::store::Quota {
        sessions: match args.sessions_per_uid.or(file.sessions_per_uid) {
            Some(0) => return Err(usage("sessions_per_uid must be at least 1".into())),
            Some(n) => n,
            None => defaults.sessions,
        },
        disk_bytes: args
            .session_disk_gb_per_uid
            .or(file.session_disk_gb_per_uid)
            .map(|g| Budget::gib("--session-disk-gb-per-uid", g))
            .transpose()
            .map_err(|e| usage(e.to_string()))?
            .unwrap_or(defaults.disk_bytes),
    };
    let mut model_options = args
        .budget
        .or_from_file(
            file.ram_gb.map(|r| match r {
                RamGb::Gib(v) => v.to_string(),
                RamGb::Preset(p) => p,
            }),
            file.trunk_gb,
            file.cache_gb,
        )
        .load_options()?;
    model_options.plan = model_options
        .plan
        .serving(Serving {
            max_active,
            max_batch,
            tokens_per_member: k3_engine::engine::PREFILL_CHUNK,
            speculate,
            session_bytes,
        })
        .map_err(|e| usage(e.to_string()))?;
    check_model_dir(&model)?;
    let http = if args.http.is_empty() {
        file.http
            .unwrap_or_default()
            .iter()
            .map(|e| e.parse().map_err(|m| usage(format!("--config: http {m}"))))
            .collect::<Result<Vec<_>, _>>()?
    } else {
        args.http
    };
    let keys = file.http_api_keys.unwrap_or_default();
    if keys.iter().any(|k| k.trim().is_empty() || k.trim() != k) {
        return Err(usage(
            "--config: http_api_keys holds an empty key or one with surrounding spaces".into(),
        ));
    }
    crate::http::check_exposure(&http, !keys.is_empty()).map_err(usage)?;
    let body_limit = file
        .http_body_limit
        .unwrap_or(crate::http::DEFAULT_BODY_LIMIT);
    if body_limit == 0 {
        return Err(usage("--config: http_body_limit must be at least 1".into()));
    }
    let per_peer = args
        .max_connections_per_peer
        .or(file.max_connections_per_peer)
        .unwrap_or(net::gate::DEFAULT_PER_PEER);
    if per_peer == 0 {
        return Err(usage("max_connections_per_peer must be at least 1".into()));
    }
    let handshake = match args.handshake_timeout.or(file.handshake_timeout) {
        None => net::gate::DEFAULT_HANDSHAKE,
        Some(s) if s.is_finite() && (0.1..=3600.0).contains(&s) => Duration::from_secs_f64(s),
        Some(_) => {
            return Err(usage(
                "handshake_timeout must be between 0.1 and 3600 seconds".into(),
            ));
        }
    };
    let http_settings = crate::http::Settings {
        keys,
        body_limit,
        model_id: model_id(&model),
        budget_bytes: model_options.plan.budget.ram,
    };
    daemon::run(daemon::Options {
        model,
        socket: net::SocketSpec {
            path: socket,
            mode,
            group: args.socket_group.or(file.socket_group),
        },
        threads,
        model_options,
        capacity: k3_engine::serve::Capacity {
            max_active,
            max_batch,
            max_queue: args.max_queue.or(file.max_queue).unwrap_or(16),
            per_uid,
        },
        limits: k3_engine::serve::Limits {
            max_tokens_cap,
            speculate,
            thinking_budget: match args.thinking_budget.or(file.thinking_budget) {
                Some(ThinkingBudget(budget)) => budget,
                None => Some(k3_engine::serve::validate::DEFAULT_THINKING_BUDGET),
            },
        },
        grace: Duration::from_secs_f64(shutdown_grace),
        session_dir,
        session_bytes,
        session_quota,
        http,
        http_settings,
        connections: net::gate::ConnectionLimits {
            per_peer,
            handshake,
        },
    })
}

/// The model's id in the HTTP API: the checkpoint directory's name (`tiny`, `Kimi-K3`).
fn model_id(dir: &Path) -> String {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    dir.file_name()
        .map_or_else(|| "k3".to_string(), |n| n.to_string_lossy().into_owned())
}
