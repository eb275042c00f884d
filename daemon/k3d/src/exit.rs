//! Exit codes of `k3d`, documented in README.md ("Exit codes"). Scripts rely on them.

use std::fmt;

/// Process exit status classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Anything not classified below.
    Failure = 1,
    /// Bad command line, bad or unsupported `config.json`, bad input on stdin.
    Usage = 2,
    /// The checkpoint's files are missing, corrupt or not in the released layout.
    Checkpoint = 3,
    /// A run failed midway (a weight read failed or was short): its output is not valid.
    RunInvalid = 4,
    /// Not enough memory budget or disk space for what was asked.
    Resources = 5,
    /// `serve` stopped, but sessions could not be written at shutdown (a full or unwritable
    /// session directory): their newest states are lost, each logged by name (issue 19.7).
    SessionsLost = 6,
    /// `pull`: the Hub refused (401/403: token or licence; 404: repo, revision or file).
    HubRefused = 7,
    /// `pull`: the Hub stayed unreachable or failing past the retry limit: run it again later.
    HubUnreachable = 8,
}

/// An error on its way out of `main`, with the exit class it maps to.
pub struct CliError {
    pub exit: Exit,
    pub error: anyhow::Error,
}

impl CliError {
    pub fn new(exit: Exit, error: impl Into<anyhow::Error>) -> Self {
        CliError {
            exit,
            error: error.into(),
        }
    }
}

impl fmt::Debug for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {:#}", self.exit, self.error)
    }
}

/// `?` on an untyped error: a generic failure.
impl From<anyhow::Error> for CliError {
    fn from(error: anyhow::Error) -> Self {
        CliError {
            exit: Exit::Failure,
            error,
        }
    }
}

pub type CliResult = Result<(), CliError>;

/// The exit class of an engine failure: bad requests and configs are usage errors, broken
/// files are checkpoint errors, a budget too small is a resource error, and a failure while
/// computing invalidates the run.
pub fn engine_exit(e: &k3_engine::engine::EngineError) -> Exit {
    use k3_engine::engine::EngineError as E;
    match e {
        E::Checkpoint(c) if c.is_config() => Exit::Usage,
        E::Checkpoint(_) | E::Tokenizer(_) | E::Io { .. } => Exit::Checkpoint,
        E::InvalidRequest(_) => Exit::Usage,
        E::Internal(_) => Exit::Failure,
        E::Model(k3_engine::model::ModelError::Plan(_)) => Exit::Resources,
        E::Model(_) | E::Batch(_) | E::Cancelled | E::Finished | E::ThreadPool(_) => {
            Exit::RunInvalid
        }
    }
}

/// A checkpoint refused on opening: a bad `config.json` is a usage error, anything else about
/// its files a checkpoint error.
impl From<k3_engine::checkpoint::CheckpointError> for CliError {
    fn from(e: k3_engine::checkpoint::CheckpointError) -> Self {
        let exit = if e.is_config() {
            Exit::Usage
        } else {
            Exit::Checkpoint
        };
        CliError::new(exit, e)
    }
}

impl From<k3_engine::engine::EngineError> for CliError {
    fn from(e: k3_engine::engine::EngineError) -> Self {
        CliError::new(engine_exit(&e), e)
    }
}
