//! `k3d serve`: load a model once and serve it over a Unix socket (see `daemon.rs`).
//!
//! Settings come from the command line and, with `--config FILE`, from a TOML file whose keys
//! are the long flag names with `-` written as `_` (`packaging/k3d.toml` documents them). A flag
//! given on the command line overrides the file; unknown keys in the file are refused.
use crate::exit::{CliError, CliResult, Exit};
use crate::{daemon, net};
use k3_engine::plan::{Budget, Serving};
use k3_engine::serve::Limits;
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
    /// start. Below --max-active, so one user never holds every compute slot
    /// [default: half of --max-active, at least 1].
    #[arg(long)]
    max_active_per_uid: Option<usize>,
    /// Requests of one user (uid) that may wait for a compute slot (counted from the moment
    /// a request arrives, before its body is read); more are refused with RESOURCE_EXHAUSTED
    /// (HTTP 429) [default: half of --max-queue, at least 1].
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
    /// Most new tokens one request generates: a larger `max_tokens` is clamped to it, and a chat
    /// that leaves `max_tokens` unset runs up to it, so one request cannot hold the machine for
    /// hours [default: 4096].
    #[arg(long)]
    max_tokens_cap: Option<usize>,
    /// Ids a chat reply may think (its think channel) before k3d closes the thinking and the
    /// model answers, for requests that do not set their own budget; `none` = unbounded
    /// [default: 512].
    #[arg(long, value_name = "N|none", value_parser = parse_thinking_budget)]
    thinking_budget: Option<ThinkingBudget>,
    /// Most prompt tokens one request may have, counted after rendering (a chat's tools and
    /// template included); a longer prompt is refused, naming this limit, before anything is
    /// computed. The memory plan sizes every conversation state for it plus --max-tokens-cap
    /// [default: the largest context the plan holds at this budget for --max-active requests
    /// and as many kept conversation states, up to the model's, less --max-tokens-cap].
    #[arg(long)]
    max_prompt_tokens: Option<usize>,
    /// Seconds a streamed request's reader may take nothing while others wait for a compute
    /// slot; then the request gives its slot back: its state is kept if the session
    /// allowance has room (it resumes when its reader reads again), else it is cancelled
    /// [default: 10].
    #[arg(long)]
    stall_timeout: Option<f64>,
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
    /// GiB of session files one user (uid) may have in the session directory, its named
    /// sessions and its kept prefix states (`UID@DIGEST.k3p`, written after replies so its
    /// next session starts warm, across restarts) together: a save beyond is refused, a spill
    /// beyond drops that user's session from memory, and its least recently used kept states
    /// make room, those ending a prelude last [default: 16].
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
    /// Seconds a new connection may take to send its HTTP/2 preface and first request's
    /// headers (gRPC) or its first request head (HTTP) before it is closed [default: 10].
    #[arg(long)]
    handshake_timeout: Option<f64>,
    /// Seconds a kept-alive HTTP connection may wait for its next request, its head
    /// included, before it is closed: the idle timeout, and the deadline of every head after
    /// the first [default: 10].
    #[arg(long)]
    idle_timeout: Option<f64>,
    /// Seconds an HTTP request's body may take to arrive; a slower one is refused with 408
    /// [default: 30].
    #[arg(long)]
    body_timeout: Option<f64>,
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
    max_prompt_tokens: Option<usize>,
    stall_timeout: Option<f64>,
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
    idle_timeout: Option<f64>,
    body_timeout: Option<f64>,
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
        let what = match std::fs::metadata(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist".to_string(),
            Err(e) => format!("cannot be read ({e})"),
            Ok(_) => "is not a directory".to_string(),
        };
        return Err(refuse(format!(
            "--model {} {what} (a checkpoint directory holds {}; `k3d check DIR` tells whether \
             one is complete)",
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
    let max_queue = args.max_queue.or(file.max_queue).unwrap_or(16);
    let per_uid = k3_engine::serve::UidLimits {
        max_active: match args.max_active_per_uid.or(file.max_active_per_uid) {
            Some(0) => return Err(usage("max_active_per_uid must be at least 1".into())),
            Some(n) => n,
            None => k3_engine::serve::UidLimits::share_of(max_active),
        },
        max_queued: args
            .max_queued_per_uid
            .or(file.max_queued_per_uid)
            .unwrap_or_else(|| k3_engine::serve::UidLimits::share_of(max_queue)),
    };
    let speculate = Limits::check_speculate(args.speculate.or(file.speculate))
        .map_err(|e| usage(e.to_string()))?;
    // The cap is needed before the limits are: the memory plan sizes states for the longest
    // reply; the prompt limit, when unset, comes from the plan.
    let max_tokens_cap = Limits::check_tokens_cap(args.max_tokens_cap.or(file.max_tokens_cap))
        .map_err(|e| usage(e.to_string()))?;
    let max_prompt_tokens =
        Limits::check_prompt_tokens(args.max_prompt_tokens.or(file.max_prompt_tokens))
            .map_err(|e| usage(e.to_string()))?;
    let stall_timeout = seconds(
        "stall_timeout",
        args.stall_timeout.or(file.stall_timeout),
        k3_engine::serve::DEFAULT_STALL_TIMEOUT,
    )?;
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
    // A checkpoint that cannot be read here fails its load anyway, with the reason.
    let checkpoint = k3_engine::checkpoint::Checkpoint::open(&model).ok();
    let prompt_limit = match max_prompt_tokens {
        Some(n) => PromptLimit {
            tokens: n,
            why: "--max-prompt-tokens".into(),
        },
        None => PromptLimit::planned(
            checkpoint.as_ref(),
            &model_options.plan,
            max_active,
            max_tokens_cap,
        ),
    };
    // Every state the plan reserves holds the longest prompt and the longest reply: a plan
    // sized for less would overspend the budget, or keep no agent's conversation (issue 35
    // point 3).
    model_options.plan.max_context = (prompt_limit.tokens + max_tokens_cap) as u64;
    if let Some(checkpoint) = &checkpoint {
        check_budget(checkpoint, &model_options.plan, &prompt_limit)?;
    }
    let thinking_budget = args
        .thinking_budget
        .or(file.thinking_budget)
        .map(|ThinkingBudget(budget)| budget);
    let limits = Limits::new(
        max_tokens_cap,
        speculate,
        thinking_budget,
        prompt_limit.tokens,
    );
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
    let start_warnings: Vec<String> = match &args.config {
        Some(path) if !keys.is_empty() => keys_file_exposure(path).into_iter().collect(),
        _ => Vec::new(),
    };
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
    let handshake = seconds(
        "handshake_timeout",
        args.handshake_timeout.or(file.handshake_timeout),
        net::gate::DEFAULT_HANDSHAKE,
    )?;
    let idle_timeout = seconds(
        "idle_timeout",
        args.idle_timeout.or(file.idle_timeout),
        crate::http::DEFAULT_IDLE_TIMEOUT,
    )?;
    let body_timeout = seconds(
        "body_timeout",
        args.body_timeout.or(file.body_timeout),
        crate::http::DEFAULT_BODY_TIMEOUT,
    )?;
    let http_settings = crate::http::Settings {
        keys,
        body_limit,
        model_id: model_id(&model),
        budget_bytes: model_options.plan.budget.ram,
        idle_timeout,
        body_timeout,
    };
    let connection_total = connection_budget(&model)?;
    daemon::run(daemon::Options {
        model,
        socket: net::SocketSpec {
            path: socket,
            mode,
            group: args.socket_group.or(file.socket_group),
            flag: "--socket",
        },
        threads,
        model_options,
        capacity: k3_engine::serve::Capacity {
            max_active,
            max_batch,
            max_queue,
            per_uid,
        },
        limits,
        prompt_limit: prompt_limit.why,
        stall_timeout,
        grace: Duration::from_secs_f64(shutdown_grace),
        session_dir,
        session_bytes,
        session_quota,
        http,
        http_settings,
        connections: net::gate::ConnectionLimits {
            per_peer,
            total: connection_total,
            handshake,
        },
        start_warnings,
    })
}

/// The longest prompt a request may have, and why (the daemon's start line says both).
struct PromptLimit {
    tokens: usize,
    why: String,
}

impl PromptLimit {
    /// The default `--max-prompt-tokens`: the largest context, up to the model's, that the
    /// plan at this budget holds for `--max-active` requests and as many kept conversation
    /// states (the default session reserve, so that an agent's next turn finds its state),
    /// less `--max-tokens-cap` for the reply. Where no context above the cap holds the whole
    /// reserve, the largest that holds the active requests' states (the reserve cut). A
    /// checkpoint that cannot be read here keeps the model's context; its load fails anyway,
    /// with the reason, as a load does.
    fn planned(
        checkpoint: Option<&k3_engine::checkpoint::Checkpoint>,
        inputs: &k3_engine::plan::PlanInputs,
        max_active: usize,
        cap: usize,
    ) -> PromptLimit {
        use k3_engine::plan::context::{Holds, largest_context};
        let released = k3_engine::serve::limits::MAX_PROMPT_TOKENS;
        let Some(checkpoint) = checkpoint else {
            return PromptLimit {
                tokens: released - cap.min(released - 1),
                why: "the checkpoint could not be read to plan it".into(),
            };
        };
        let context = checkpoint
            .config
            .max_position_embeddings
            .unwrap_or(released)
            .min(released) as u64;
        let probe = |holds| {
            largest_context(
                &checkpoint.config,
                &checkpoint.layout,
                inputs,
                context,
                holds,
            )
            .filter(|c| *c > cap as u64)
        };
        let (planned, held) = match probe(Holds::StatesAndReserve) {
            Some(c) => (Some(c), "and as many kept conversation states"),
            None => (
                probe(Holds::States),
                "(too little for kept conversation states)",
            ),
        };
        let budget = inputs.budget.ram.map_or_else(
            || "max".to_string(),
            |b| format!("{:.2} GiB", b as f64 / GIB),
        );
        match planned {
            Some(c) if c == context => PromptLimit {
                tokens: (c - cap as u64) as usize,
                why: format!(
                    "the model's context, {context}, less --max-tokens-cap {cap}: the plan at \
                     --ram-gb {budget} holds it for {max_active} active requests {held}"
                ),
            },
            Some(c) => PromptLimit {
                tokens: (c - cap as u64) as usize,
                why: format!(
                    "the largest context the plan at --ram-gb {budget} holds for {max_active} \
                     active requests {held}, {c}, less --max-tokens-cap {cap}"
                ),
            },
            // Not even the reply fits beside the floor: the load refuses the budget, naming it.
            None => PromptLimit {
                tokens: 1,
                why: format!(
                    "the plan at --ram-gb {budget} holds no context above --max-tokens-cap {cap}"
                ),
            },
        }
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// Refuses a budget below the model's floor before any socket is bound (issue 46.4: the
/// refusal came after "listening on …", from the model load, and was printed three times).
/// The plan is the load's own (a trunk pack only adds its buffer, so a budget refused here is
/// refused by the load too).
fn check_budget(
    checkpoint: &k3_engine::checkpoint::Checkpoint,
    inputs: &k3_engine::plan::PlanInputs,
    prompt_limit: &PromptLimit,
) -> Result<(), CliError> {
    match k3_engine::plan::Plan::for_model(&checkpoint.config, &checkpoint.layout, inputs) {
        Err(e @ k3_engine::plan::PlanError::BudgetTooSmall { .. }) => Err(CliError::new(
            Exit::Resources,
            anyhow::anyhow!(
                "--model {}: {e} (the plan holds a context of {} positions: prompts of up to \
                 {} tokens plus --max-tokens-cap {}; a larger budget holds longer prompts)",
                checkpoint.dir.display(),
                inputs.max_context,
                prompt_limit.tokens,
                inputs
                    .max_context
                    .saturating_sub(prompt_limit.tokens as u64),
            ),
        )),
        _ => Ok(()),
    }
}

/// A timeout setting `name` in seconds (0.1 to 3600), or `default` when not given.
fn seconds(name: &str, given: Option<f64>, default: Duration) -> Result<Duration, CliError> {
    match given {
        None => Ok(default),
        Some(s) if s.is_finite() && (0.1..=3600.0).contains(&s) => Ok(Duration::from_secs_f64(s)),
        Some(_) => Err(usage(format!(
            "{name} must be between 0.1 and 3600 seconds"
        ))),
    }
}

/// How many connections all peers together may hold: the descriptor limit (its soft value
/// raised to the hard one first) less a reserve for the checkpoint's shards and the rest.
fn connection_budget(model: &Path) -> Result<usize, CliError> {
    let limit = net::gate::raise_descriptor_limit().map_err(|e| {
        CliError::new(
            Exit::Failure,
            anyhow::anyhow!("reading or raising the descriptor limit (RLIMIT_NOFILE): {e}"),
        )
    })?;
    // Counted from the directory, not the index: a shard the index misses is refused at load.
    let shards = std::fs::read_dir(model).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
            .count()
    });
    Ok(net::gate::descriptor_budget(limit, shards))
}

/// A warning when the config file holding `http_api_keys` can be read by other users (its
/// group or everyone): anyone who reads a key is that caller to the daemon — its limits, its
/// kept conversation states (issue 35 point 9). Not a refusal: the owner may mean it (a group
/// of admins), and the daemon already runs with it; the log says which file and mode to fix.
fn keys_file_exposure(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    let readers = match (mode & 0o040 != 0, mode & 0o004 != 0) {
        (_, true) => "every user",
        (true, false) => "its group",
        (false, false) => return None,
    };
    Some(format!(
        "--config {} holds http_api_keys and is readable by {readers} (mode {mode:04o}); \
         anyone who reads a key is that caller: chmod 600 it",
        path.display()
    ))
}

/// The model's id in the HTTP API: the checkpoint directory's name (`tiny`, `Kimi-K3`).
fn model_id(dir: &Path) -> String {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    dir.file_name()
        .map_or_else(|| "k3".to_string(), |n| n.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::keys_file_exposure;
    use k3_engine::serve::limits::{DEFAULT_MAX_TOKENS_CAP, DEFAULT_THINKING_BUDGET};
    use std::os::unix::fs::PermissionsExt;

    /// The request defaults `--help` states are the core's (`serve::limits`), the one place
    /// they are defined: the help is prose, so this holds it to the numbers.
    #[test]
    fn the_help_states_the_request_defaults_of_serve_limits() {
        use clap::Args as _;
        let command = super::Args::augment_args(clap::Command::new("serve"));
        let default_of = |flag: &str| {
            let arg = command
                .get_arguments()
                .find(|a| a.get_long() == Some(flag))
                .unwrap_or_else(|| panic!("--{flag} exists"));
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            let start = help.find("[default: ").expect("a stated default") + "[default: ".len();
            help[start..]
                .split(']')
                .next()
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(
            default_of("max-tokens-cap"),
            DEFAULT_MAX_TOKENS_CAP.to_string()
        );
        assert_eq!(
            default_of("thinking-budget"),
            DEFAULT_THINKING_BUDGET.to_string()
        );
        assert_eq!(default_of("speculate"), "0");
    }

    #[test]
    fn a_keys_file_others_can_read_is_named_with_its_mode() {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let path = dir.path().join("k3d.toml");
        std::fs::write(&path, "http_api_keys = [\"secret\"]\n").expect("write the config");
        let set = |mode| {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod")
        };
        for (mode, readers) in [
            (0o644, "every user"),
            (0o640, "its group"),
            (0o604, "every user"),
        ] {
            set(mode);
            let warning = keys_file_exposure(&path).expect("a warning");
            assert!(
                warning.contains(&path.display().to_string())
                    && warning.contains(&format!("mode {mode:04o}"))
                    && warning.contains(readers),
                "{warning}"
            );
        }
        for private in [0o600, 0o400, 0o620, 0o700] {
            set(private);
            assert_eq!(keys_file_exposure(&path), None, "mode {private:o}");
        }
    }
}
