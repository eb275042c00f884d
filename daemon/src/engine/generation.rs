//! One request's progress through prefill and decode, one [`Step`] at a time.

use std::time::Instant;

use super::EngineError;
use super::request::{GenerateRequest, StopReason, Summary};
use super::sampler::Sampler;
use crate::model::{Logits, Model, State};
use crate::tokenizer::Tokenizer;

/// What one call of [`super::Engine::step`] did.
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
    /// Prompt tokens in the state so far (reused ones included).
    fed: usize,
    /// Prompt tokens the starting state already held (a session's snapshot); never re-fed.
    reused: usize,
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

/// Weight bytes read / avoided while this generation's own steps ran.
#[derive(Debug, Default, Clone, Copy)]
struct IoTally {
    read: u64,
    avoided: u64,
}

impl Generation {
    /// A generation whose `state` already consumed the first `state.positions()` prompt tokens
    /// (0 for a fresh state); feeding resumes after them.
    pub(super) fn new(request: GenerateRequest, state: State) -> Self {
        let sampler = Sampler::new(request.sampling.clone());
        let reused = state.positions();
        Generation {
            request,
            state,
            sampler,
            fed: reused,
            reused,
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

    /// The model state as of now: after the last prefill step it holds exactly the prompt,
    /// after the end the prompt and every generated id that was fed (see [`Self::consumed`]).
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The ids the state has consumed: the prompt, then the generated ids fed back. The last
    /// generated id is fed only if another token was asked for, and a stop id never is.
    pub fn consumed(&self) -> Vec<u32> {
        let n = self.state.positions();
        let mut ids: Vec<u32> = self.request.prompt.iter().take(n).copied().collect();
        ids.extend(self.generated.iter().take(n.saturating_sub(ids.len())));
        ids
    }

    pub(super) fn advance(
        &mut self,
        model: &Model,
        tokenizer: &Tokenizer,
        prefill_chunk: usize,
        cancel: &(dyn Fn() -> bool + Sync),
    ) -> Result<Step, EngineError> {
        if self.done {
            return Err(EngineError::Finished);
        }
        let total = self.request.prompt.len();
        if self.fed < total {
            let started = Instant::now();
            let end = (self.fed + prefill_chunk.max(1)).min(total);
            let want = if self.request.record_logits {
                Logits::All
            } else {
                Logits::Last
            };
            let prompt = &self.request.prompt[self.fed..end];
            let state = &mut self.state;
            let logits = counted(model, &mut self.io, || {
                model.forward(state, prompt, want, cancel)
            })?;
            self.fed = end;
            let vocab = model.config().vocab_size;
            if self.request.record_logits {
                self.logits_log.extend_from_slice(&logits);
            }
            if self.fed == total {
                self.next_logits = Some(logits[logits.len() - vocab..].to_vec());
                if self.request.max_tokens == 0 {
                    self.finish = Some(StopReason::MaxTokens);
                }
            }
            self.prefill_seconds += started.elapsed().as_secs_f64();
            return Ok(Step::Prefill {
                done: self.fed,
                total,
            });
        }
        if let Some(reason) = self.finish.take() {
            return Ok(self.finished(reason));
        }
        let started = Instant::now();
        let logits = match self.next_logits.take() {
            Some(l) => l,
            None => {
                let last = *self.generated.last().ok_or(EngineError::Finished)?;
                let state = &mut self.state;
                let l = counted(model, &mut self.io, || {
                    model.forward(state, &[last], Logits::Last, cancel)
                })?;
                if self.request.record_logits {
                    self.logits_log.extend_from_slice(&l);
                }
                l
            }
        };
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
            reused_tokens: self.reused,
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

/// Runs one forward, charging `io` with the store traffic it caused. Steps of different
/// generations never overlap (one engine thread steps them), so the difference is this one's.
fn counted<T>(
    model: &Model,
    io: &mut IoTally,
    forward: impl FnOnce() -> Result<T, crate::model::ModelError>,
) -> Result<T, EngineError> {
    let before = model.store_stats();
    let result = forward();
    let after = model.store_stats();
    io.read += after.bytes_read - before.bytes_read;
    io.avoided += after.bytes_avoided - before.bytes_avoided;
    Ok(result?)
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
