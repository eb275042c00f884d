//! One request's progress through prefill and decode, one [`Step`] at a time.
//!
//! Speculative decoding (engine-lessons §6.2), for greedy requests with `speculate > 0`: when a
//! decode step needs a forward, [`super::speculate::propose`] drafts up to `speculate` ids from
//! the context and the step feeds `[last, d1..dk]` with every position's logits
//! ([`Feed::Verify`]). It accepts the drafts while each equals the argmax of the position
//! before it, plus the model's own next token, and rolls the state back
//! ([`State::rollback_to`]) to exactly the positions plain greedy would have fed. Every decided
//! token passes the same stop-id / stop-string / max-tokens bookkeeping as a plain token, in
//! order, so the run ends where plain greedy would; the tokens are emitted one [`Step::Token`]
//! per step from a queue (queued tokens need no compute). Output and recorded logits are those
//! of plain greedy by construction. Sampled requests ignore the setting: exact-in-distribution
//! verification for sampling is a different algorithm (§6.2) and is not built.
//!
//! Each id is decided from its row of logits after the request's logit transform (bias,
//! penalties: [`super::request::LogitTransform`]) and among the ids its guide allows
//! ([`super::guide`]). Both depend only on the ids decided before, and speculation decides its
//! rows in order through the same bookkeeping, so it stays exact with them. Ids the guide
//! forces (exactly one allowed) are decided at once, without logits, and fed together with the
//! id before them in one forward ([`Feed::Tokens`]): a prefill-like chunk, bit-identical to
//! feeding them one by one (chunking never changes the state, spec §6).

use std::collections::VecDeque;
use std::time::Instant;

use super::EngineError;
use super::guide::{Allowed, Guiding};
use super::logits::Counts;
use super::passes::PassTokens;
use super::request::{DecodeSteps, GenerateRequest, MAX_SPECULATE, StopReason, Summary};
use super::sampler::Sampler;
use super::speculate;
use crate::model::{Logits, Model, ModelError, Pass, Sequence, State};
use crate::tokenizer::Tokenizer;

/// What one step of a generation ([`super::Engine::step`], [`super::Engine::step_batch`]) did.
#[derive(Debug, Clone)]
pub enum Step {
    /// Prefill progressed: `done` of `total` prompt tokens are in the state. While a
    /// layer-major pass over the next tokens runs, `pass` says how far it has come (the state
    /// holds them only once the pass completes).
    Prefill {
        done: usize,
        total: usize,
        pass: Option<PassProgress>,
    },
    /// The next token (never a stop id).
    Token { id: u32 },
    /// The generation is over; further steps return [`EngineError::Finished`].
    Finished(Summary),
}

/// How far a layer-major prefill pass has come (issue 30): it feeds `tokens` prompt tokens and
/// has run `layers_done` of the model's `layers` layers over all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassProgress {
    pub tokens: usize,
    pub layers_done: usize,
    pub layers: usize,
}

impl PassProgress {
    /// Prompt tokens' worth of work done: `tokens × layers_done / layers`, for a progress bar
    /// and a rate in tokens per second that move every layer.
    pub fn token_equivalent(&self) -> usize {
        (self.tokens * self.layers_done)
            .checked_div(self.layers)
            .unwrap_or(0)
    }
}

/// A prompt feed running as a layer-major pass, between two of its layers.
struct PromptPass {
    ids: Vec<u32>,
    want: Logits,
    pass: Pass,
    /// Its share of the plan's pass activations, given back when it ends.
    _held: PassTokens,
}

/// Most ids one forward feeds after the prompt: the last decided id and the ids forced after
/// it, or the last id and its drafts (the memory plan reserves scratch for 1 + this many).
const MAX_DECODE_FEED: usize = 1 + MAX_SPECULATE;

/// A request in flight: its model state, sampler and bookkeeping.
pub struct Generation {
    request: GenerateRequest,
    state: State,
    sampler: Sampler,
    /// The request's guide at the current position (`None`: every id allowed).
    guiding: Option<Box<dyn Guiding>>,
    /// Generated ids counted, for the penalties (empty when the request has none).
    counts: Counts,
    /// Prompt tokens in the state so far (reused ones included).
    fed: usize,
    /// The layer-major pass feeding the next prompt tokens, while it runs.
    pass: Option<PromptPass>,
    /// Prompt tokens the starting state already held (a session's snapshot); never re-fed.
    reused: usize,
    /// Logits of the last fed position, not yet sampled from.
    next_logits: Option<Vec<f32>>,
    /// Copies of the state at the request's `keep_at` positions, not yet taken.
    kept: Vec<State>,
    /// Generated ids already in the state (fed back); the rest await the next decode feed.
    generated_fed: usize,
    generated: Vec<u32>,
    /// Decoded output so far, kept only when stop strings must be matched.
    output_text: Vec<u8>,
    /// Tokens decided by a speculative step (already in `generated`), not yet emitted.
    queued: VecDeque<u32>,
    /// Drafted ids sent for verification / confirmed by it.
    drafts_proposed: usize,
    drafts_accepted: usize,
    /// Per-step accounting of the decode phase (issue 16 item 4): forwards by drafts carried,
    /// verify steps by drafts accepted.
    decode_steps: DecodeSteps,
    /// Why the speculation for the step in flight could not be opened (reported by `consume`).
    speculation_refused: Option<ModelError>,
    /// Set once the end is known; reported by the following step.
    finish: Option<StopReason>,
    done: bool,
    prefill_seconds: f64,
    decode_seconds: f64,
    logits_log: Vec<f32>,
    io: IoTally,
}

/// Weight bytes read / avoided charged to a generation (its share of the steps it was in).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct IoTally {
    pub read: u64,
    pub avoided: u64,
}

/// What a generation's next step feeds the model ([`Generation::next_feed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Feed {
    /// The next prefill chunk of the prompt.
    Prompt { ids: Vec<u32>, want: Logits },
    /// The last generated token, to get the logits of the one after it.
    Token { id: u32 },
    /// The last generated token and the ids a guide forced after it (decided without logits),
    /// to get the logits after the last of them.
    Tokens { ids: Vec<u32>, want: Logits },
    /// Speculative decoding: the last generated token then the drafted ids, every position's
    /// logits wanted (`ids[0]` is the last token).
    Verify { ids: Vec<u32> },
    /// No compute: the step samples logits already held (the end of the prompt's) or reports
    /// the end of the generation.
    Nothing,
}

impl Feed {
    /// The ids to run and which of their logits the step needs; `None` for [`Feed::Nothing`].
    pub fn forward(&self) -> Option<(&[u32], Logits)> {
        match self {
            Feed::Prompt { ids, want } => Some((ids, *want)),
            Feed::Token { id } => Some((std::slice::from_ref(id), Logits::Last)),
            Feed::Tokens { ids, want } => Some((ids, *want)),
            Feed::Verify { ids } => Some((ids, Logits::All)),
            Feed::Nothing => None,
        }
    }
}

impl Generation {
    /// A generation whose `state` already consumed the first `state.positions()` prompt tokens
    /// (0 for a fresh state); feeding resumes after them.
    pub(super) fn new(request: GenerateRequest, state: State) -> Self {
        let sampler = Sampler::new(request.sampling.clone());
        let guiding = request.guide.as_ref().map(|g| g.start());
        let reused = state.positions();
        Generation {
            request,
            state,
            sampler,
            guiding,
            counts: Counts::default(),
            fed: reused,
            pass: None,
            reused,
            next_logits: None,
            kept: Vec::new(),
            generated_fed: 0,
            generated: Vec::new(),
            output_text: Vec::new(),
            queued: VecDeque::new(),
            drafts_proposed: 0,
            drafts_accepted: 0,
            decode_steps: DecodeSteps::default(),
            speculation_refused: None,
            finish: None,
            done: false,
            prefill_seconds: 0.0,
            decode_seconds: 0.0,
            logits_log: Vec::new(),
            io: IoTally::default(),
        }
    }

    pub fn request(&self) -> &GenerateRequest {
        &self.request
    }

    /// Prompt tokens the starting state already held (never fed by this generation).
    pub fn reused(&self) -> usize {
        self.reused
    }

    /// Tokens decided so far (with speculation, possibly a few not yet returned by a step).
    pub fn generated(&self) -> &[u32] {
        &self.generated
    }

    pub fn is_finished(&self) -> bool {
        self.done
    }

    /// The model state as of now: after the last prefill step it holds exactly the prompt,
    /// after the end the prompt and every generated id that was fed (see [`Self::consumed`]).
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The states kept at the request's `keep_at` positions since the last call, each
    /// having consumed exactly the first `positions()` prompt ids.
    pub fn take_kept(&mut self) -> Vec<State> {
        std::mem::take(&mut self.kept)
    }

    /// The ids the state has consumed: the prompt, then the generated ids fed back. The last
    /// generated id is fed only if another token was asked for, and a stop id never is.
    pub fn consumed(&self) -> Vec<u32> {
        let n = self.state.positions();
        let mut ids: Vec<u32> = self.request.prompt.iter().take(n).copied().collect();
        ids.extend(self.generated.iter().take(n.saturating_sub(ids.len())));
        ids
    }

    /// What the next step feeds the model. Deciding this is separate from consuming the
    /// logits ([`Generation::consume`]) so one forward can serve several generations
    /// ([`super::Engine::step_batch`]).
    pub fn next_feed(&self, prefill_chunk: usize) -> Result<Feed, EngineError> {
        if self.done {
            return Err(EngineError::Finished);
        }
        if self.pass.is_some() {
            return Err(EngineError::Internal(
                "a prefill pass is running: it is advanced, not fed again".into(),
            ));
        }
        let total = self.request.prompt.len();
        if self.fed < total {
            let mut end = (self.fed + prefill_chunk.max(1)).min(total);
            // A chunk ends where a state is to be kept (chunking changes no bit, spec §6).
            if let Some(&keep) = self.request.keep_at.iter().find(|&&p| p > self.fed) {
                end = end.min(keep);
            }
            let want = if self.request.record_logits {
                Logits::All
            } else {
                Logits::Last
            };
            return Ok(Feed::Prompt {
                ids: self.request.prompt[self.fed..end].to_vec(),
                want,
            });
        }
        if self.finish.is_some() || self.next_logits.is_some() || !self.queued.is_empty() {
            return Ok(Feed::Nothing);
        }
        let unfed = &self.generated[self.generated_fed.min(self.generated.len())..];
        let &[last] = unfed else {
            if unfed.is_empty() {
                return Err(EngineError::Finished);
            }
            return Ok(Feed::Tokens {
                ids: unfed.to_vec(),
                want: if self.request.record_logits {
                    Logits::All
                } else {
                    Logits::Last
                },
            });
        };
        let drafts = self.drafts();
        if drafts.is_empty() {
            return Ok(Feed::Token { id: last });
        }
        let mut ids = Vec::with_capacity(1 + drafts.len());
        ids.push(last);
        ids.extend(drafts);
        Ok(Feed::Verify { ids })
    }

    /// Whether a layer-major prefill pass is between two of its layers.
    pub fn in_pass(&self) -> bool {
        self.pass.is_some()
    }

    /// Whether the next step costs little and ends something a client waits for: it feeds
    /// the rest of the prompt in one chunk of at most `chunk` ids (the first token comes
    /// next), samples logits already held, or reports a token already decided or the end.
    /// The batch loop lets such a step run without a pass's layer beside it
    /// ([`crate::serve::batch::Batch::round`]).
    pub fn next_step_is_short(&self, chunk: usize) -> bool {
        if self.done || self.pass.is_some() {
            return false;
        }
        let left = self.request.prompt.len().saturating_sub(self.fed);
        if left > 0 {
            return left <= chunk;
        }
        self.finish.is_some() || self.next_logits.is_some() || !self.queued.is_empty()
    }

    /// Gives up the running pass (cancelled): the state stays poisoned, as after a cancelled
    /// forward.
    pub(super) fn drop_pass(&mut self) {
        self.pass = None;
    }

    /// Starts a layer-major pass ([`Model::begin`]) over the prompt feed `ids` (issue 30).
    pub(super) fn begin_pass(
        &mut self,
        model: &Model,
        ids: Vec<u32>,
        want: Logits,
        held: PassTokens,
        cancel: &dyn Fn() -> bool,
    ) -> Result<(), ModelError> {
        let mut seqs = [Sequence {
            state: &mut self.state,
            ids: &ids,
            want,
        }];
        let pass = model.begin(&mut seqs, cancel)?;
        self.pass = Some(PromptPass {
            ids,
            want,
            pass,
            _held: held,
        });
        Ok(())
    }

    /// Runs the next `layers` layers of the pass begun by [`Generation::begin_pass`]
    /// ([`Model::advance`]). Before its end: the progress. At its end the pass is consumed like
    /// a prompt feed run whole ([`Generation::consume`]). A failure ends the pass (the state
    /// stays poisoned, as after a failed forward).
    pub(super) fn advance_pass(
        &mut self,
        model: &Model,
        layers: usize,
        cancel: &dyn Fn() -> bool,
        io: impl FnOnce() -> IoTally,
        seconds: impl FnOnce() -> f64,
        tokenizer: &Tokenizer,
    ) -> Result<Step, EngineError> {
        let Some(p) = self.pass.as_mut() else {
            return Err(EngineError::Internal("no prefill pass to advance".into()));
        };
        let mut seqs = [Sequence {
            state: &mut self.state,
            ids: &p.ids,
            want: p.want,
        }];
        let outcome = model.advance(&mut p.pass, &mut seqs, layers, cancel);
        let progress = PassProgress {
            tokens: p.ids.len(),
            layers_done: p.pass.layers_done(),
            layers: p.pass.layers(),
        };
        match outcome {
            Ok(None) => {
                let io = io();
                self.io.read += io.read;
                self.io.avoided += io.avoided;
                self.prefill_seconds += seconds();
                Ok(Step::Prefill {
                    done: self.fed,
                    total: self.request.prompt.len(),
                    pass: Some(progress),
                })
            }
            Ok(Some(mut logits)) => {
                let p = self.pass.take().ok_or_else(|| {
                    EngineError::Internal("the prefill pass vanished while it ran".into())
                })?;
                let feed = Feed::Prompt {
                    ids: p.ids,
                    want: p.want,
                };
                let vocab = model.config().vocab_size;
                self.consume(&feed, logits.pop(), io(), seconds(), vocab, tokenizer)
            }
            Err(e) => {
                self.pass = None;
                Err(e.into())
            }
        }
    }

    /// Ids to verify after the last generated one: none unless the request is greedy with
    /// speculation on; never more than could still be emitted after the model's own token.
    fn drafts(&self) -> Vec<u32> {
        if self.request.speculate == 0 || !self.request.sampling.is_greedy() {
            return Vec::new();
        }
        let room = self
            .request
            .max_tokens
            .saturating_sub(self.generated.len() + 1);
        let context: Vec<u32> = self
            .request
            .prompt
            .iter()
            .chain(&self.generated)
            .copied()
            .collect();
        speculate::propose(&context, self.request.speculate.min(room))
    }

    /// The state a forward of `feed` must advance. For [`Feed::Verify`] this opens the
    /// speculation that `consume` closes; a refusal (only possible for a poisoned state, which
    /// the forward refuses too) is reported by `consume`.
    pub(super) fn state_for(&mut self, feed: &Feed) -> &mut State {
        if matches!(feed, Feed::Verify { .. }) {
            self.speculation_refused = self.state.begin_speculation().err();
        }
        &mut self.state
    }

    /// Completes the step `feed` (from [`Generation::next_feed`]) given the forward's outcome:
    /// `logits` are what the model returned for `feed`'s ids (`None` for [`Feed::Nothing`]),
    /// `io` the weight traffic charged to this generation and `seconds` the step's wall time.
    pub(super) fn consume(
        &mut self,
        feed: &Feed,
        logits: Option<Vec<f32>>,
        io: IoTally,
        seconds: f64,
        vocab: usize,
        tokenizer: &Tokenizer,
    ) -> Result<Step, EngineError> {
        self.io.read += io.read;
        self.io.avoided += io.avoided;
        match (feed, logits) {
            (Feed::Prompt { ids, .. }, Some(logits)) => {
                let total = self.request.prompt.len();
                self.fed += ids.len();
                if self.request.keep_at.contains(&self.fed) {
                    self.kept.push(self.state.clone());
                }
                if self.request.record_logits {
                    self.logits_log.extend_from_slice(&logits);
                }
                if self.fed == total {
                    let last = logits.len().checked_sub(vocab).ok_or_else(|| {
                        EngineError::Internal("the model returned no logits".into())
                    })?;
                    self.next_logits = Some(logits[last..].to_vec());
                    if self.request.max_tokens == 0 {
                        self.finish = Some(StopReason::MaxTokens);
                    }
                }
                self.prefill_seconds += seconds;
                Ok(Step::Prefill {
                    done: self.fed,
                    total,
                    pass: None,
                })
            }
            (Feed::Token { .. }, Some(logits)) => {
                if self.request.record_logits {
                    self.logits_log.extend_from_slice(&logits);
                }
                self.generated_fed += 1;
                self.decode_seconds += seconds;
                self.decode_steps.forward(0);
                self.sample(logits, tokenizer)
            }
            (Feed::Tokens { ids, .. }, Some(logits)) => {
                if self.request.record_logits {
                    self.logits_log.extend_from_slice(&logits);
                }
                self.generated_fed += ids.len();
                self.decode_seconds += seconds;
                self.decode_steps.forward(0);
                let last = logits
                    .len()
                    .checked_sub(vocab)
                    .ok_or_else(|| EngineError::Internal("the model returned no logits".into()))?;
                self.sample(logits[last..].to_vec(), tokenizer)
            }
            (Feed::Verify { ids }, Some(logits)) => {
                if let Some(e) = self.speculation_refused.take() {
                    return Err(e.into());
                }
                self.verify(&ids[1..], &logits, vocab, tokenizer)?;
                self.force(tokenizer);
                self.decode_seconds += seconds;
                // The verification decided at least one token or the end.
                self.decided()
                    .ok_or_else(|| EngineError::Internal("the model returned no logits".into()))
            }
            (Feed::Nothing, None) => {
                if let Some(step) = self.decided() {
                    return Ok(step);
                }
                let logits = self.next_logits.take().ok_or(EngineError::Finished)?;
                self.sample(logits, tokenizer)
            }
            _ => Err(EngineError::Internal(
                "logits do not match what the step fed".into(),
            )),
        }
    }

    /// A token decided earlier but not yet emitted, else the end once known.
    fn decided(&mut self) -> Option<Step> {
        if let Some(id) = self.queued.pop_front() {
            return Some(Step::Token { id });
        }
        let reason = self.finish.take()?;
        Some(self.finished(reason))
    }

    /// Completes a [`Feed::Verify`] step: walks the positions' argmaxes while they confirm the
    /// drafts, taking each decided token through the plain bookkeeping ([`Generation::take`]:
    /// queued, or `finish` set), records the logits of the positions plain greedy would have
    /// fed, and rolls the state back to those positions.
    fn verify(
        &mut self,
        drafts: &[u32],
        logits: &[f32],
        vocab: usize,
        tokenizer: &Tokenizer,
    ) -> Result<(), EngineError> {
        let base = self
            .state
            .speculation_base()
            .ok_or_else(|| ModelError::Speculation("no speculation open after a verify".into()))?;
        self.drafts_proposed += drafts.len();
        let accepted_before = self.drafts_accepted;
        // Fed positions whose logits plain greedy would also have computed.
        let mut consumed = 0;
        for (i, row) in logits.chunks_exact(vocab.max(1)).enumerate() {
            // Plain decoding decides a forced id without the row before it (see `force`):
            // stop here, so the rows recorded and the state kept are plain decoding's.
            if i > 0 && self.forced().is_some() {
                break;
            }
            let id = self.decide(row, i)?;
            consumed += 1;
            let confirmed = drafts.get(i) == Some(&id);
            if confirmed {
                self.drafts_accepted += 1;
            }
            match self.take(id, tokenizer) {
                Some(id) => self.queued.push_back(id),
                None => self.finish = Some(StopReason::StopId(id)),
            }
            if self.finish.is_some() || !confirmed {
                break;
            }
        }
        if self.request.record_logits {
            self.logits_log
                .extend_from_slice(&logits[..consumed * vocab]);
        }
        self.decode_steps.forward(drafts.len());
        self.decode_steps
            .verified(self.drafts_accepted - accepted_before);
        // The last position fed before the verify, then one per decided id but the last.
        self.generated_fed += consumed;
        Ok(self.state.rollback_to(base + consumed)?)
    }

    /// Draws the next token from `logits` and applies the stop rules; then decides the ids the
    /// guide forces after it.
    fn sample(&mut self, logits: Vec<f32>, tokenizer: &Tokenizer) -> Result<Step, EngineError> {
        let started = Instant::now();
        let id = self.decide(&logits, 0)?;
        self.decode_seconds += started.elapsed().as_secs_f64();
        match self.take(id, tokenizer) {
            Some(id) => {
                self.force(tokenizer);
                Ok(Step::Token { id })
            }
            None => Ok(self.finished(StopReason::StopId(id))),
        }
    }

    /// The id chosen from output row `row` (`logits`): the one id the guide forces, else the
    /// sampler's choice among the allowed ids after the logit transform.
    fn decide(&mut self, logits: &[f32], row: usize) -> Result<u32, EngineError> {
        let allowed = match self.guiding.as_mut().map(|g| g.allowed()) {
            None | Some(Allowed::Any) => None,
            Some(Allowed::Forced(id)) => return Ok(id),
            Some(Allowed::Only(set)) => match set.single() {
                Some(id) => return Ok(id),
                None => Some(set),
            },
        };
        let transformed = self.request.transform.apply(logits, &self.counts);
        self.sampler
            .sample(&transformed, allowed)
            .ok_or_else(|| choice_failed(logits, row, allowed.is_some()))
    }

    /// The id the guide forces next (the only one it allows), if it does.
    fn forced(&mut self) -> Option<u32> {
        match self.guiding.as_mut()?.allowed() {
            Allowed::Forced(id) => Some(id),
            Allowed::Only(set) => set.single(),
            Allowed::Any => None,
        }
    }

    /// Decides, after the last decided id, every id the guide forces (one allowed id), each
    /// through the plain bookkeeping, while the run fits one decode feed. They are queued for
    /// emission and fed together with the id before them ([`Feed::Tokens`]).
    fn force(&mut self, tokenizer: &Tokenizer) {
        while self.finish.is_none() && self.generated.len() - self.generated_fed < MAX_DECODE_FEED {
            let Some(forced) = self.forced() else {
                return;
            };
            match self.take(forced, tokenizer) {
                Some(id) => self.queued.push_back(id),
                None => self.finish = Some(StopReason::StopId(forced)),
            }
        }
    }

    /// The bookkeeping of one decided token, shared by plain and speculative steps: a stop id
    /// ends the run unemitted (returns `None`); otherwise the id joins the output, may complete
    /// a stop string or reach `max_tokens` (setting `finish`), and is returned to be emitted.
    fn take(&mut self, id: u32, tokenizer: &Tokenizer) -> Option<u32> {
        if self.request.stop_ids.contains(&id) {
            return None;
        }
        self.generated.push(id);
        if let Some(guiding) = self.guiding.as_mut() {
            guiding.accept(id);
        }
        if self.request.transform.counts_ids() {
            self.counts.add(id);
        }
        if !self.request.stop_strings.is_empty() {
            let before = self.output_text.len();
            // An id without bytes in the tokenizer (possible only if the config's vocabulary is
            // larger than the tokenizer's) contributes no text.
            self.output_text
                .extend_from_slice(tokenizer.token_bytes(id).unwrap_or_default());
            if let Some(s) =
                first_completed_stop(&self.request.stop_strings, &self.output_text, before)
            {
                self.finish = Some(StopReason::StopString(s.to_owned()));
            }
        }
        if self.finish.is_none() && self.generated.len() >= self.request.max_tokens {
            self.finish = Some(StopReason::MaxTokens);
        }
        Some(id)
    }

    fn finished(&mut self, stop_reason: StopReason) -> Step {
        self.done = true;
        Step::Finished(Summary {
            stop_reason,
            prompt_tokens: self.request.prompt.len(),
            reused_tokens: self.reused,
            generated_tokens: self.generated.len(),
            prefill_seconds: self.prefill_seconds,
            decode_seconds: self.decode_seconds,
            bytes_read: self.io.read,
            bytes_avoided: self.io.avoided,
            drafts_proposed: self.drafts_proposed,
            drafts_accepted: self.drafts_accepted,
            decode_steps: Box::new(self.decode_steps.clone()),
            generated: self.generated.clone(),
            logits: std::mem::take(&mut self.logits_log),
        })
    }
}

/// The first stop string that occurs in `text` and ends after byte `new_from` (i.e. was
/// completed by the bytes just appended), if any.
fn first_completed_stop<'a>(stops: &'a [String], text: &[u8], new_from: usize) -> Option<&'a str> {
    stops.iter().map(String::as_str).find(|s| {
        let needle = s.as_bytes();
        let start = new_from.saturating_sub(needle.len().saturating_sub(1));
        text[start..].windows(needle.len()).any(|w| w == needle)
    })
}

/// Why no id could be chosen from output row `row`'s logits. A row holding a NaN is the
/// model's failure (spec §6.1 rule 12), named by row and index like the forward's own check,
/// never the request's fault (issue 19.7: it was typed as an invalid request and reached
/// clients as a refusal); an empty row, or a mask that left no id, is the engine's own.
fn choice_failed(logits: &[f32], row: usize, masked: bool) -> EngineError {
    match logits.iter().position(|v| v.is_nan()) {
        Some(index) => EngineError::Model(ModelError::NanLogits { row, index }),
        None if masked => EngineError::Internal(format!(
            "output row {row}: the guide allows no id of the vocabulary"
        )),
        None => EngineError::Internal(format!("output row {row} has no logits")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::request::Sampling;

    #[test]
    fn nan_logits_are_the_models_failure_not_an_invalid_request() {
        let greedy = Sampler::new(Sampling::default()).sample(&[0.5, f32::NAN, 2.0], None);
        assert_eq!(greedy, None);
        let e = choice_failed(&[0.5, f32::NAN, 2.0], 3, false);
        assert!(
            matches!(
                e,
                EngineError::Model(ModelError::NanLogits { row: 3, index: 1 })
            ),
            "{e:?}"
        );
        let mut sampled = Sampler::new(Sampling {
            temperature: 0.7,
            top_p: 0.9,
            top_k: 0,
            seed: 1,
        });
        assert_eq!(sampled.sample(&[f32::NAN], None), None);
        let e = choice_failed(&[f32::NAN], 0, true);
        assert!(
            matches!(e, EngineError::Model(ModelError::NanLogits { .. })),
            "{e:?}"
        );
        let e = choice_failed(&[], 0, false);
        assert!(matches!(e, EngineError::Internal(_)), "{e:?}");
        let e = choice_failed(&[1.0], 0, true);
        assert!(e.to_string().contains("the guide allows no id"), "{e}");
    }

    #[test]
    fn stop_string_completed_across_tokens_and_mid_token() {
        let stops = vec!["END".to_string()];
        // "EN" earlier, "D!" just appended: completed by the new bytes.
        assert_eq!(first_completed_stop(&stops, b"xxEND!", 4), Some("END"));
        // Entirely inside earlier text: already handled before, not "completed now".
        assert_eq!(first_completed_stop(&stops, b"END..x", 5), None);
        assert_eq!(first_completed_stop(&stops, b"abc", 1), None);
    }
}
