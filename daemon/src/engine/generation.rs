//! One request's progress through prefill and decode, one [`Step`] at a time.

use std::time::Instant;

use super::EngineError;
use super::request::{GenerateRequest, StopReason, Summary};
use super::sampler::Sampler;
use crate::model::{Logits, State};
use crate::tokenizer::Tokenizer;

/// What one step of a generation ([`super::Engine::step`], [`super::Engine::step_batch`]) did.
#[derive(Debug, Clone)]
pub enum Step {
    /// A prefill chunk was fed: `done` of `total` prompt tokens are now in the state.
    Prefill { done: usize, total: usize },
    /// The next token (never a stop id).
    Token { id: u32 },
    /// The generation is over; further steps return [`EngineError::Finished`].
    Finished(Summary),
}

/// A request in flight: its model state, sampler and bookkeeping.
pub struct Generation {
    request: GenerateRequest,
    state: State,
    sampler: Sampler,
    /// Prompt tokens fed so far.
    fed: usize,
    /// Logits of the last fed position, not yet sampled from.
    next_logits: Option<Vec<f32>>,
    generated: Vec<u32>,
    /// Decoded output so far, kept only when stop strings must be matched.
    output_text: Vec<u8>,
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
            Feed::Nothing => None,
        }
    }
}

impl Generation {
    pub(super) fn new(request: GenerateRequest, state: State) -> Self {
        let sampler = Sampler::new(request.sampling.clone());
        Generation {
            request,
            state,
            sampler,
            fed: 0,
            next_logits: None,
            generated: Vec::new(),
            output_text: Vec::new(),
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

    /// Tokens generated so far.
    pub fn generated(&self) -> &[u32] {
        &self.generated
    }

    pub fn is_finished(&self) -> bool {
        self.done
    }

    /// The state the generation continues (for checks and snapshots).
    pub fn state(&self) -> &State {
        &self.state
    }

    /// What the next step feeds the model. Deciding this is separate from consuming the
    /// logits ([`Generation::consume`]) so one forward can serve several generations
    /// ([`super::Engine::step_batch`]).
    pub fn next_feed(&self, prefill_chunk: usize) -> Result<Feed, EngineError> {
        if self.done {
            return Err(EngineError::Finished);
        }
        let total = self.request.prompt.len();
        if self.fed < total {
            let end = (self.fed + prefill_chunk.max(1)).min(total);
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
        if self.finish.is_some() || self.next_logits.is_some() {
            return Ok(Feed::Nothing);
        }
        let last = *self.generated.last().ok_or(EngineError::Finished)?;
        Ok(Feed::Token { id: last })
    }

    /// The state a forward of `feed` must advance.
    pub(super) fn state_mut(&mut self) -> &mut State {
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
                if self.request.record_logits {
                    self.logits_log.extend_from_slice(&logits);
                }
                if self.fed == total {
                    let last = logits.len().checked_sub(vocab).ok_or_else(|| {
                        EngineError::InvalidRequest("the model returned no logits".into())
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
                })
            }
            (Feed::Token { .. }, Some(logits)) => {
                if self.request.record_logits {
                    self.logits_log.extend_from_slice(&logits);
                }
                self.decode_seconds += seconds;
                self.sample(logits, tokenizer)
            }
            (Feed::Nothing, None) => {
                if let Some(reason) = self.finish.take() {
                    return Ok(self.finished(reason));
                }
                let logits = self.next_logits.take().ok_or(EngineError::Finished)?;
                self.sample(logits, tokenizer)
            }
            _ => Err(EngineError::InvalidRequest(
                "logits do not match what the step fed".into(),
            )),
        }
    }

    /// Draws the next token from `logits` and applies the stop rules.
    fn sample(&mut self, logits: Vec<f32>, tokenizer: &Tokenizer) -> Result<Step, EngineError> {
        let started = Instant::now();
        let id = self
            .sampler
            .sample(&logits)
            .ok_or_else(|| EngineError::InvalidRequest("the model produced NaN logits".into()))?;
        self.decode_seconds += started.elapsed().as_secs_f64();
        if self.request.stop_ids.contains(&id) {
            return Ok(self.finished(StopReason::StopId(id)));
        }
        self.generated.push(id);
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
        Ok(Step::Token { id })
    }

    fn finished(&mut self, stop_reason: StopReason) -> Step {
        self.done = true;
        Step::Finished(Summary {
            stop_reason,
            prompt_tokens: self.request.prompt.len(),
            generated_tokens: self.generated.len(),
            prefill_seconds: self.prefill_seconds,
            decode_seconds: self.decode_seconds,
            bytes_read: self.io.read,
            bytes_avoided: self.io.avoided,
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

#[cfg(test)]
mod tests {
    use super::first_completed_stop;

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
