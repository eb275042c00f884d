//! Prompts in, tokens out: generation over a loaded model.
//!
//! An [`Engine`] is a loaded checkpoint (model + tokenizer) with its compute thread pool. Work is
//! done in [`Generation`]s advanced by [`Engine::step`]: each step is one prefill chunk or one
//! decoded token, so a scheduler can interleave many requests fairly, check for cancellation
//! between steps (and, inside the model, between layers), and report progress.
//!
//! Exactness: a generation's tokens depend only on its request (prompt, sampling, seed) — never
//! on the thread count, the prefill chunk size or what else the engine is doing (spec §6).

mod generation;
mod info;
pub mod measure;
pub mod request;
pub mod sampler;

pub use generation::{Generation, Step};
pub use info::{EngineInfo, EngineStats, LoadProgress, peak_rss_bytes};
pub use request::{GenerateRequest, Sampling, StopReason, Summary};

use std::path::Path;

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::model::{LoadOptions, Model, ModelError};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// How an engine is set up.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Compute threads (the rayon pool). Results do not depend on it.
    pub threads: usize,
    /// Prompt tokens fed per prefill step: the granularity of progress, fairness and
    /// cancellation. Results do not depend on it.
    pub prefill_chunk: usize,
    /// Passed through to the model (memory plan etc.).
    pub model: LoadOptions,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            prefill_chunk: 32,
            model: LoadOptions::default(),
        }
    }
}

/// Everything that can go wrong in the engine, classified for callers (exit codes, gRPC codes).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Model(ModelError),
    /// The request itself is unacceptable (empty prompt, id out of range, …).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The caller's cancel check returned true; the generation is abandoned.
    #[error("cancelled")]
    Cancelled,
    #[error("reading {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("generation already finished")]
    Finished,
    #[error("could not build the compute thread pool: {0}")]
    ThreadPool(String),
}

impl From<ModelError> for EngineError {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Cancelled => EngineError::Cancelled,
            other => EngineError::Model(other),
        }
    }
}

/// A loaded model ready to generate.
pub struct Engine {
    model: Model,
    tokenizer: Tokenizer,
    pool: rayon::ThreadPool,
    options: EngineOptions,
    info: EngineInfo,
}

impl Engine {
    /// Opens the checkpoint in `dir`, loads the model and tokenizer, and builds the thread pool.
    pub fn open(
        dir: &Path,
        options: EngineOptions,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Engine, EngineError> {
        progress(LoadProgress::Checking);
        let checkpoint = Checkpoint::open(dir)?;
        let info = EngineInfo::describe(&checkpoint)?;
        let tokenizer = Tokenizer::load(dir)?;
        if tokenizer.vocab_size() > checkpoint.config.vocab_size {
            return Err(EngineError::InvalidRequest(format!(
                "tokenizer has {} ids but config.json vocab_size is {}",
                tokenizer.vocab_size(),
                checkpoint.config.vocab_size
            )));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(options.threads.max(1))
            .thread_name(|i| format!("k3d-compute-{i}"))
            .build()
            .map_err(|e| EngineError::ThreadPool(e.to_string()))?;
        progress(LoadProgress::Weights);
        let model = pool.install(|| Model::load(&checkpoint, options.model))?;
        progress(LoadProgress::Ready);
        let info = EngineInfo {
            plan: model.plan().to_string(),
            ..info
        };
        Ok(Engine {
            model,
            tokenizer,
            pool,
            options,
            info,
        })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// Counters since the engine was opened.
    pub fn stats(&self) -> EngineStats {
        EngineStats::from_store(self.model.store_stats())
    }

    /// Validates a request and prepares its generation (no compute yet).
    pub fn start(&self, request: GenerateRequest) -> Result<Generation, EngineError> {
        request.validate(self.model.config().vocab_size)?;
        Ok(Generation::new(request, self.model.new_state()))
    }

    /// Advances `generation` by one prefill chunk or one token. `cancel` is polled between
    /// layers; when it returns true the step stops with [`EngineError::Cancelled`].
    pub fn step(
        &self,
        generation: &mut Generation,
        cancel: &(dyn Fn() -> bool + Sync),
    ) -> Result<Step, EngineError> {
        self.pool.install(|| {
            generation.advance(
                &self.model,
                &self.tokenizer,
                self.options.prefill_chunk,
                cancel,
            )
        })
    }
}
