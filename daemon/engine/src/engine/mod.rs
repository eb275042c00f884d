//! Prompts in, tokens out: generation over a loaded model.
//!
//! An [`Engine`] is a loaded checkpoint (model + tokenizer) with its compute thread pool. Work is
//! done in [`Generation`]s advanced by [`Engine::step`]: each step is one prefill chunk or one
//! decoded token, so a scheduler can interleave many requests fairly, check for cancellation
//! between steps (and, inside the model, between layers), and report progress.
//! [`Engine::step_batch`] steps several generations through one forward pass (they share its
//! weight reads): each step is split into what a generation feeds ([`Generation::next_feed`])
//! and what it does with the logits, so one pass can serve them all.
//!
//! Exactness: a generation's tokens depend only on its request (prompt, sampling, seed) — never
//! on the thread count, the prefill chunk size or what else the engine is doing (spec §6).

mod generation;
pub mod guide;
mod info;
mod logits;
pub mod measure;
mod passes;
pub mod request;
pub mod sampler;
pub mod speculate;

use generation::IoTally;
pub use generation::{Feed, Generation, PassProgress, Step};
use info::BatchCounters;
pub use info::{EngineInfo, EngineStats, LoadProgress};
use passes::{PassBytes, PassTokens, PassTokensHeld};
pub use request::{
    Admit, DecodeSteps, GenerateRequest, LogitTransform, RequestError, Sampling, StopReason,
    Summary, ValidRequest,
};

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::model::{LoadOptions, Logits, Model, ModelError, Sequence, State};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// Most compute threads an engine accepts. Threads only ever split independent outputs, so
/// beyond the cores they add nothing but stacks and scheduling; 1024 is above the logical CPU
/// count of any machine this runs on and far below where spawning them would exhaust memory
/// or the process's thread limit. `--threads 100000` is a typo, not a configuration.
pub const MAX_THREADS: usize = 1024;

/// `threads` if an engine accepts that many compute threads (1..=[`MAX_THREADS`]), else why not.
pub fn check_threads(threads: usize) -> Result<usize, String> {
    if (1..=MAX_THREADS).contains(&threads) {
        Ok(threads)
    } else {
        Err(format!(
            "{threads} threads: use 1 to {MAX_THREADS} (default: one per usable core)"
        ))
    }
}

/// The default prompt tokens per prefill step that shares the forward with other members: a
/// longer prompt feed runs as its own layer-major pass (up to the plan's
/// [`crate::plan::Plan::prefill_tokens`]), one layer per step.
pub const PREFILL_CHUNK: usize = 32;

/// Layers a layer-major prefill pass runs per step: one, so the other members' decode steps
/// (and cancellation, and progress) come between any two layers of a long prompt.
const LAYERS_PER_PASS_STEP: usize = 1;

/// How an engine is set up.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Compute threads (the rayon pool). Results do not depend on it.
    pub threads: usize,
    /// Prompt tokens fed per prefill step in the forward shared with other members (a longer
    /// prompt runs as a layer-major pass of up to the plan's `prefill_tokens`, one layer per
    /// step). Results do not depend on it.
    pub prefill_chunk: usize,
    /// Passed through to the model (memory plan etc.).
    pub model: LoadOptions,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            prefill_chunk: PREFILL_CHUNK,
            model: LoadOptions::default(),
        }
    }
}

/// Everything that can go wrong in the engine, classified for callers (exit codes, gRPC codes).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Not `#[from]`: that would also make it the `source`, and a `{:#}` chain would print the
    /// tokenizer's message twice (see the `From` impl below).
    #[error("tokenizer: {0}")]
    Tokenizer(TokenizerError),
    #[error(transparent)]
    Model(ModelError),
    /// The request itself is unacceptable (empty prompt, id out of range, …).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The engine broke one of its own rules (logits missing or not matching the step fed, a
    /// caller's starting state it cannot continue): a failure of the daemon, never the
    /// request's fault, so it must not be reported as a refusal (issue 19.7).
    #[error("internal error: {0}")]
    Internal(String),
    /// The caller's cancel check returned true; the generation is abandoned.
    #[error("cancelled")]
    Cancelled,
    #[error("reading {path}: {error}")]
    Io {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
    #[error("generation already finished")]
    Finished,
    #[error("could not build the compute thread pool: {0}")]
    ThreadPool(String),
    /// The batched forward pass this generation was part of failed (every member's state is
    /// poisoned); the same error is reported to every member.
    #[error("a batched step failed: {0}")]
    Batch(Arc<EngineError>),
}

impl From<TokenizerError> for EngineError {
    fn from(e: TokenizerError) -> Self {
        EngineError::Tokenizer(e)
    }
}

impl From<ModelError> for EngineError {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Cancelled => EngineError::Cancelled,
            other => EngineError::Model(other),
        }
    }
}

/// Bytes read between two [`LoadProgress::Weights`] reports: each report may take the
/// caller's locks and log, so they are kept rare beside the reads (a 64 MiB read is tens of
/// milliseconds even from a fast NVMe drive).
pub const LOAD_REPORT_BYTES: u64 = 64 << 20;

/// A loaded model ready to generate.
pub struct Engine {
    model: Model,
    /// Shared with whoever loaded it first (the serve core tokenises while the model loads).
    tokenizer: Arc<Tokenizer>,
    pool: rayon::ThreadPool,
    options: EngineOptions,
    info: EngineInfo,
    batches: BatchCounters,
    /// Prompt tokens of the layer-major passes between their layers, against the plan's
    /// `prefill_tokens`.
    passes: PassTokensHeld,
}

impl Engine {
    /// Opens the checkpoint in `dir`, loads the model and tokenizer, and builds the thread pool.
    pub fn open(
        dir: &Path,
        options: EngineOptions,
        progress: &mut (dyn FnMut(LoadProgress) + Send),
    ) -> Result<Engine, EngineError> {
        let tokenizer = Arc::new(Tokenizer::load(dir)?);
        Engine::open_with_tokenizer(dir, options, tokenizer, progress)
    }

    /// [`Engine::open`] with the checkpoint's tokenizer already loaded (by the caller, from
    /// the same `dir`), so it is read and held once.
    pub fn open_with_tokenizer(
        dir: &Path,
        options: EngineOptions,
        tokenizer: Arc<Tokenizer>,
        progress: &mut (dyn FnMut(LoadProgress) + Send),
    ) -> Result<Engine, EngineError> {
        progress(LoadProgress::Checking);
        let checkpoint = Checkpoint::open(dir)?;
        let info = EngineInfo::describe(&checkpoint)?;
        tokenizer.check_vocab(dir, checkpoint.config.vocab_size)?;
        let threads = check_threads(options.threads).map_err(EngineError::ThreadPool)?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("k3d-compute-{i}"))
            .build()
            .map_err(|e| EngineError::ThreadPool(e.to_string()))?;
        let mut reported: Option<u64> = None;
        let mut weights = |done: u64, total: u64| {
            let due = reported.is_none_or(|r| done >= r.saturating_add(LOAD_REPORT_BYTES))
                || (done == total && reported != Some(done));
            if due {
                reported = Some(done);
                progress(LoadProgress::Weights { done, total });
            }
        };
        let model = pool
            .install(|| Model::load_reporting(&checkpoint, options.model.clone(), &mut weights))?;
        progress(LoadProgress::Ready);
        let passes = PassTokensHeld::new(PassBytes::of(model.plan()));
        let info = EngineInfo {
            plan: model.plan().to_string(),
            pinned_layers: model.plan().pinned_layers.clone(),
            cache_capacity_bytes: model.plan().cache_bytes(),
            ..info
        };
        Ok(Engine {
            model,
            tokenizer,
            pool,
            options,
            info,
            batches: BatchCounters::default(),
            passes,
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
        EngineStats::new(self.model.store_stats(), &self.batches)
    }

    /// The machine's f32 and f64 GEMM rates, each measured for `duration` on this engine's
    /// compute threads ([`crate::system::gemm_probe`]): the yardsticks `k3d bench` sets prefill
    /// arithmetic against (weight products run in f32, spec §6.1 rule 2), measured in the same
    /// process as the prefill it compares.
    pub fn gemm_probes(
        &self,
        duration: std::time::Duration,
    ) -> [crate::system::gemm_probe::GemmProbe; 2] {
        use crate::system::gemm_probe::{measure, measure_f32};
        self.pool
            .install(|| [measure_f32(duration), measure(duration)])
    }

    /// Prompt tokens one layer-major prefill pass may feed: what the memory plan holds the
    /// activations for ([`crate::plan::Plan::prefill_tokens`]; 0 when it holds none, and
    /// prompts are then fed in chunks of [`EngineOptions::prefill_chunk`]).
    pub fn pass_tokens(&self) -> usize {
        usize::try_from(self.model.plan().prefill_tokens).unwrap_or(usize::MAX)
    }

    /// Prompt tokens fed per step in the forward shared with other members
    /// ([`EngineOptions::prefill_chunk`]); a longer remainder of a prompt runs as a pass.
    pub fn prefill_chunk(&self) -> usize {
        self.options.prefill_chunk.max(1)
    }

    /// Prepares the generation of `request` (no compute yet): a [`ValidRequest`] is taken as
    /// it is, a plain [`GenerateRequest`] is validated first ([`Admit`]).
    pub fn start(&self, request: impl Admit) -> Result<Generation, EngineError> {
        let request = self.admit(request)?;
        Ok(Generation::new(request, self.model.new_state()))
    }

    /// `request` as the engine runs it: validated (once: a [`ValidRequest`] already was), its
    /// `speculate` limited to the drafts the memory plan reserved a rollback journal for
    /// ([`crate::plan::PlanInputs::speculate`]); the output is the same either way.
    fn admit(&self, request: impl Admit) -> Result<GenerateRequest, EngineError> {
        let request = request
            .admit(self.model.config().vocab_size)
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        let reserved = usize::try_from(self.options.model.plan.speculate).unwrap_or(usize::MAX);
        Ok(request.limit_speculation(reserved).into_inner())
    }

    /// Like [`Self::start`], but continuing `state`, which has consumed exactly the first
    /// `state.positions()` ids of the prompt (the caller's contract: a session snapshot whose
    /// history is a prefix of the prompt). Those ids are not fed again; at least one prompt id
    /// must remain, since the state does not carry the logits of its last position.
    pub fn start_from(&self, request: impl Admit, state: State) -> Result<Generation, EngineError> {
        let request = self.admit(request)?;
        let held = state.positions();
        if held >= request.prompt.len() {
            return Err(EngineError::Internal(format!(
                "the starting state holds {held} positions; the prompt ({} tokens) must extend it",
                request.prompt.len()
            )));
        }
        if state.is_poisoned() {
            return Err(EngineError::Internal(
                "the starting state is from a failed forward".into(),
            ));
        }
        if request.record_logits && held > 0 {
            return Err(EngineError::InvalidRequest(
                "record_logits needs every prompt position computed; start from a fresh state"
                    .into(),
            ));
        }
        Ok(Generation::new(request, state))
    }

    /// Advances `generation` by one prefill chunk or one token. `cancel` is polled between
    /// layers; when it returns true the step stops with [`EngineError::Cancelled`].
    /// A batch of one ([`Engine::step_batch`]).
    pub fn step(
        &self,
        generation: &mut Generation,
        cancel: &(dyn Fn() -> bool + Sync),
    ) -> Result<Step, EngineError> {
        let mut out = self.step_batch(&mut [generation], &[cancel]);
        out.pop().unwrap_or(Err(EngineError::Finished))
    }

    /// Advances every generation of `gens` by one step (a prefill chunk or one token each)
    /// through **one** forward pass ([`Model::forward_batch`]): they share each layer's trunk
    /// and the union of their experts, and each one's tokens and logits are bit-identical to
    /// stepping it alone. Returns one result per generation, in order.
    ///
    /// `cancel_each[i]` is generation i's cancel check (a missing one counts as "never").
    /// Members already cancelled are left out of the pass. The pass itself polls "every
    /// member cancelled" between layers, so a member cancelled while the others go on is only
    /// noticed at the end of the pass — its latency to cancel is up to one whole batched step
    /// (one token for every member) rather than one layer; its result is then
    /// [`EngineError::Cancelled`] and its advanced state must be discarded.
    ///
    /// A member whose input is refused before compute (e.g. a poisoned state) fails alone. A
    /// failure of the pass itself fails every member (each state is poisoned): alone it is the
    /// error itself, in a batch each member gets [`EngineError::Batch`].
    ///
    /// Weight traffic of the pass is charged to the members in proportion to the rows (ids)
    /// each fed, exactly: the shares add up to the pass's bytes (see [`split_by_rows`]). Each
    /// member is charged the pass's full wall time: it is the latency each one saw.
    pub fn step_batch(
        &self,
        gens: &mut [&mut Generation],
        cancel_each: &[&(dyn Fn() -> bool + Sync)],
    ) -> Vec<Result<Step, EngineError>> {
        self.pool
            .install(|| self.step_batch_here(gens, cancel_each))
    }

    fn step_batch_here(
        &self,
        gens: &mut [&mut Generation],
        cancel_each: &[&(dyn Fn() -> bool + Sync)],
    ) -> Vec<Result<Step, EngineError>> {
        let started = Instant::now();
        let vocab = self.model.config().vocab_size;
        let cancelled = |i: usize| cancel_each.get(i).is_some_and(|c| c());
        let chunk = self.prefill_chunk();
        let pass_tokens = self.pass_tokens();
        // Cache slots lent to passes that have ended go back before anything reads.
        self.passes.settle(&|n| self.model.give_back_cache_slots(n));
        let mut results: Vec<Option<Result<Step, EngineError>>> = Vec::with_capacity(gens.len());
        let mut feeds = Vec::with_capacity(gens.len());
        // Members stepping a layer-major pass this round, with the prompt ids of a pass that
        // begins now (`None`: one between its layers).
        let mut layered: Vec<(usize, Option<NewPass>)> = Vec::new();
        for (i, g) in gens.iter_mut().enumerate() {
            if g.in_pass() {
                feeds.push(Feed::Nothing);
                if cancelled(i) {
                    g.drop_pass();
                    results.push(Some(Err(EngineError::Cancelled)));
                } else {
                    layered.push((i, None));
                    results.push(None);
                }
                continue;
            }
            // A prompt longer than a chunk runs as one layer-major pass of up to the planned
            // tokens; logits of every position (a test's record) only in chunks, since the
            // plan holds one row of logits per pass.
            let size = if g.request().record_logits {
                chunk
            } else {
                chunk.max(pass_tokens)
            };
            let feed = g.next_feed(size).and_then(|f| {
                if cancelled(i) {
                    return Err(EngineError::Cancelled);
                }
                if let Some((ids, _)) = f.forward() {
                    self.model.check_input(g.state(), ids)?;
                }
                Ok(f)
            });
            match feed {
                Ok(Feed::Prompt { mut ids, want }) if ids.len() > chunk => {
                    // The plan holds one pass of `pass_tokens`: a prompt that finds other
                    // passes holding them meanwhile feeds chunks in the shared forward.
                    let lend = |n| self.model.lend_cache_slots(n);
                    match self.passes.reserve(ids.len(), chunk, pass_tokens, &lend) {
                        Some(held) => {
                            ids.truncate(held.tokens());
                            feeds.push(Feed::Nothing);
                            layered.push((i, Some(NewPass { ids, want, held })));
                        }
                        None => {
                            ids.truncate(chunk);
                            feeds.push(Feed::Prompt { ids, want });
                        }
                    }
                    results.push(None);
                }
                Ok(f) => {
                    feeds.push(f);
                    results.push(None);
                }
                Err(e) => {
                    feeds.push(Feed::Nothing);
                    results.push(Some(Err(e)));
                }
            }
        }
        // The members that run: those with ids to feed and no early answer.
        let runs: Vec<usize> = (0..gens.len())
            .filter(|&i| results[i].is_none() && feeds[i].forward().is_some())
            .collect();
        let mut logits: Vec<Option<Vec<f32>>> = vec![None; gens.len()];
        let mut shares = vec![IoTally::default(); gens.len()];
        if !runs.is_empty() {
            let before = self.model.store_stats();
            let mut seqs: Vec<Sequence<'_>> = Vec::with_capacity(runs.len());
            let mut rows = Vec::with_capacity(runs.len());
            for (i, g) in gens.iter_mut().enumerate() {
                if let (true, Some((ids, want))) = (runs.contains(&i), feeds[i].forward()) {
                    rows.push(ids.len() as u64);
                    seqs.push(Sequence {
                        state: g.state_for(&feeds[i]),
                        ids,
                        want,
                    });
                }
            }
            self.batches.record(seqs.len());
            let all_cancelled = || runs.iter().all(|&i| cancelled(i));
            let outcome = self.model.forward_batch(&mut seqs, &all_cancelled);
            drop(seqs);
            let after = self.model.store_stats();
            let read = split_by_rows(after.bytes_read - before.bytes_read, &rows);
            let avoided = split_by_rows(after.bytes_avoided - before.bytes_avoided, &rows);
            for (k, &i) in runs.iter().enumerate() {
                shares[i] = IoTally {
                    read: read.get(k).copied().unwrap_or(0),
                    avoided: avoided.get(k).copied().unwrap_or(0),
                };
            }
            match outcome {
                Ok(out) => {
                    for (&i, l) in runs.iter().zip(out) {
                        logits[i] = Some(l);
                    }
                }
                Err(e) => match (runs.as_slice(), EngineError::from(e)) {
                    (&[only], e) => results[only] = Some(Err(e)),
                    (_, EngineError::Cancelled) => {
                        for &i in &runs {
                            results[i] = Some(Err(EngineError::Cancelled));
                        }
                    }
                    (_, e) => {
                        let shared = Arc::new(e);
                        for &i in &runs {
                            results[i] = Some(Err(EngineError::Batch(Arc::clone(&shared))));
                        }
                    }
                },
            }
        }
        // Each pass between its layers runs one more layer, after the shared forward: the
        // decoding members' tokens never wait for a whole prompt (issue 30.2).
        for (i, fresh) in layered {
            if cancelled(i) {
                gens[i].drop_pass();
                results[i] = Some(Err(EngineError::Cancelled));
                continue;
            }
            let cancel = || cancelled(i);
            let g = &mut *gens[i];
            let before = self.model.store_stats();
            let step = match fresh {
                Some(NewPass { ids, want, held }) => g
                    .begin_pass(&self.model, ids, want, held, &cancel)
                    .map_err(EngineError::from),
                None => Ok(()),
            }
            .and_then(|()| {
                g.advance_pass(
                    &self.model,
                    LAYERS_PER_PASS_STEP,
                    &cancel,
                    || {
                        let after = self.model.store_stats();
                        IoTally {
                            read: after.bytes_read - before.bytes_read,
                            avoided: after.bytes_avoided - before.bytes_avoided,
                        }
                    },
                    || started.elapsed().as_secs_f64(),
                    &self.tokenizer,
                )
            });
            results[i] = Some(step);
        }
        let seconds = started.elapsed().as_secs_f64();
        gens.iter_mut()
            .enumerate()
            .zip(results)
            .map(|((i, g), r)| match r {
                Some(r) => r,
                // Cancelled while the pass ran: dropped at the step boundary.
                None if cancelled(i) => Err(EngineError::Cancelled),
                None => g.consume(
                    &feeds[i],
                    logits[i].take(),
                    shares[i],
                    seconds,
                    vocab,
                    &self.tokenizer,
                ),
            })
            .collect()
    }
}

/// A prompt feed that begins its layer-major pass this step, with its share of the plan's
/// pass activations.
struct NewPass {
    ids: Vec<u32>,
    want: Logits,
    held: PassTokens,
}

/// Splits `total` bytes among members that fed `rows[k]` rows each, in proportion, exactly:
/// member k gets `⌊total·c_k/R⌋ − ⌊total·c_{k−1}/R⌋` with `c_k` the rows up to and including k,
/// so the shares add up to `total` and differ from the exact proportion by less than a byte.
fn split_by_rows(total: u64, rows: &[u64]) -> Vec<u64> {
    let all: u128 = rows.iter().map(|&r| r as u128).sum();
    if all == 0 {
        return vec![0; rows.len()];
    }
    let mut upto = 0u128;
    let mut given = 0u64;
    rows.iter()
        .map(|&r| {
            upto += r as u128;
            let cum = (total as u128 * upto / all) as u64;
            let share = cum - given;
            given = cum;
            share
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::split_by_rows;

    #[test]
    fn traffic_split_by_rows_is_exact_and_proportional() {
        assert_eq!(split_by_rows(10, &[1, 1, 1]), vec![3, 3, 4]);
        assert_eq!(split_by_rows(100, &[32, 1, 1, 2]), vec![88, 3, 3, 6]);
        assert_eq!(split_by_rows(7, &[5]), vec![7]);
        assert_eq!(split_by_rows(0, &[2, 3]), vec![0, 0]);
        let shares = split_by_rows(u64::MAX, &[3, 1, 4]);
        assert_eq!(
            shares.iter().map(|&s| s as u128).sum::<u128>(),
            u64::MAX as u128
        );
    }
}
