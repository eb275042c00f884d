//! What a caller asks for, and what it gets back at the end.

use std::sync::Arc;

use super::guide::Guide;

/// Longest generation one request may ask for; larger values are refused, not clamped.
pub const MAX_TOKENS_LIMIT: usize = 1 << 20;

/// Most drafted ids one speculative step may verify. A step feeds 1 + this many tokens, which
/// must stay within the tokens per call the memory plan reserves scratch for (32 by default).
pub const MAX_SPECULATE: usize = 16;

/// Sampling parameters. `temperature == 0` (the default) is greedy: the first index of the
/// maximum logit (spec §6.1 rule 12), independent of `seed`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 disables it.
    pub top_p: f32,
    /// Keep only the k most likely ids; 0 disables it.
    pub top_k: usize,
    /// Seed of the request's private random stream: same seed ⇒ same output.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        }
    }
}

impl Sampling {
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// Most `logit_bias` entries one request may carry (OpenAI's own limit).
pub const MAX_LOGIT_BIAS: usize = 300;
/// `logit_bias` values lie in [-100, 100] (OpenAI's range: ±100 bans or forces an id in
/// practice, as logits are far smaller).
pub const LOGIT_BIAS_LIMIT: f32 = 100.0;
/// `frequency_penalty` and `presence_penalty` lie in [-2, 2] (OpenAI's range).
pub const PENALTY_LIMIT: f32 = 2.0;

/// The deterministic changes to each row of logits before an id is chosen (OpenAI's
/// `logit_bias`, `frequency_penalty`, `presence_penalty`). For id `j` that was generated `c[j]`
/// times so far in this generation, in f32, in this order:
///
/// `l'[j] = (l[j] + bias[j]) - (c[j] * frequency_penalty + [c[j] > 0] * presence_penalty)`
///
/// Ids without a bias and not yet generated keep their logit bit for bit; the default changes
/// nothing (see `docs/decoding.md`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitTransform {
    /// Added to the logit of each listed id; each id at most once.
    pub bias: Vec<(u32, f32)>,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
}

impl LogitTransform {
    /// True when the transform leaves every logit as it is.
    pub fn is_identity(&self) -> bool {
        self.bias.is_empty() && self.frequency_penalty == 0.0 && self.presence_penalty == 0.0
    }

    fn validate(&self, vocab_size: usize) -> Result<(), RequestError> {
        if self.bias.len() > MAX_LOGIT_BIAS {
            return Err(RequestError::TooManyBiases {
                given: self.bias.len(),
            });
        }
        let mut seen = std::collections::HashSet::with_capacity(self.bias.len());
        for &(id, value) in &self.bias {
            if id as usize >= vocab_size {
                return Err(RequestError::BiasIdOutsideVocabulary { id, vocab_size });
            }
            if !(value.is_finite() && value.abs() <= LOGIT_BIAS_LIMIT) {
                return Err(RequestError::BiasValue { id, value });
            }
            if !seen.insert(id) {
                return Err(RequestError::BiasTwice { id });
            }
        }
        for (name, value) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !(value.is_finite() && value.abs() <= PENALTY_LIMIT) {
                return Err(RequestError::Penalty { name, value });
            }
        }
        Ok(())
    }
}

/// One generation request in token ids (text is tokenized by the caller).
#[derive(Debug, Clone, Default)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: Sampling,
    /// Generation stops when one of these ids is produced; the id itself is not emitted.
    pub stop_ids: Vec<u32>,
    /// Generation stops after the token that completes one of these strings in the output.
    pub stop_strings: Vec<String>,
    /// Keep every fed position's logits (offline checks: `k3d run --dump-logits`).
    pub record_logits: bool,
    /// Exact speculative decoding: at most this many n-gram drafted ids verified per decode
    /// step; 0 = off. Greedy requests only (ignored when sampling); the output is identical
    /// either way, only the speed differs (see the generation module).
    pub speculate: usize,
    /// Prompt positions (ascending, from 1 to the prompt's length) at which the generation
    /// keeps a copy of its state for the caller ([`super::Generation::take_kept`]): a later
    /// prompt that shares exactly these first ids continues from there. The prefill feeds
    /// its chunks so that each of these ends one; chunking never changes a bit (spec §6).
    pub keep_at: Vec<usize>,
    /// Changes to the logits before each id is chosen (bias, penalties).
    pub transform: LogitTransform,
    /// Restricts which ids may come next (constrained decoding, the thinking budget): the
    /// model's choice among the allowed ids is unchanged (greedy takes the best allowed id);
    /// `None` allows every id.
    pub guide: Option<Arc<dyn Guide>>,
}

/// Why a request cannot be served: one variant per rule of [`GenerateRequest::validate`], so
/// callers can tell them apart (the serve core wraps them in its own refusals).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("prompt id {id} at position {position} is outside the vocabulary (0..{vocab_size})")]
    IdOutsideVocabulary {
        id: u32,
        position: usize,
        vocab_size: usize,
    },
    #[error("max_tokens {asked} exceeds the limit {MAX_TOKENS_LIMIT}")]
    MaxTokens { asked: usize },
    #[error("speculate {asked} exceeds the limit {MAX_SPECULATE}")]
    Speculate { asked: usize },
    #[error("temperature {0} must be a finite number ≥ 0")]
    Temperature(f32),
    #[error("top_p {0} must be in (0, 1]")]
    TopP(f32),
    #[error("stop strings must not be empty")]
    EmptyStopString,
    #[error(
        "states to keep at prompt positions {0:?}: they must ascend, each from 1 to the prompt's length"
    )]
    KeepAt(Vec<usize>),
    #[error("{given} logit_bias entries given; at most {MAX_LOGIT_BIAS} are accepted")]
    TooManyBiases { given: usize },
    #[error("logit_bias names id {id}, outside the vocabulary (0..{vocab_size})")]
    BiasIdOutsideVocabulary { id: u32, vocab_size: usize },
    #[error("logit_bias {value} for id {id} must be a number in [-100, 100]")]
    BiasValue { id: u32, value: f32 },
    #[error("logit_bias names id {id} twice")]
    BiasTwice { id: u32 },
    #[error("{name} {value} must be a number in [-2, 2]")]
    Penalty { name: &'static str, value: f32 },
}

impl GenerateRequest {
    /// Checks every rule of the engine once and returns the request as the one type the engine
    /// runs ([`ValidRequest`]), or the first rule it breaks.
    pub fn validate(self, vocab_size: usize) -> Result<ValidRequest, RequestError> {
        self.check(vocab_size)?;
        Ok(ValidRequest(self))
    }

    /// Refuses what cannot be served, with a message that says what is wrong.
    fn check(&self, vocab_size: usize) -> Result<(), RequestError> {
        if self.prompt.is_empty() {
            return Err(RequestError::EmptyPrompt);
        }
        if let Some((position, &id)) = self
            .prompt
            .iter()
            .enumerate()
            .find(|(_, id)| **id as usize >= vocab_size)
        {
            return Err(RequestError::IdOutsideVocabulary {
                id,
                position,
                vocab_size,
            });
        }
        if self.max_tokens > MAX_TOKENS_LIMIT {
            return Err(RequestError::MaxTokens {
                asked: self.max_tokens,
            });
        }
        if self.speculate > MAX_SPECULATE {
            return Err(RequestError::Speculate {
                asked: self.speculate,
            });
        }
        let s = &self.sampling;
        if !(s.temperature.is_finite() && s.temperature >= 0.0) {
            return Err(RequestError::Temperature(s.temperature));
        }
        if !(s.top_p > 0.0 && s.top_p <= 1.0) {
            return Err(RequestError::TopP(s.top_p));
        }
        if self.stop_strings.iter().any(|s| s.is_empty()) {
            return Err(RequestError::EmptyStopString);
        }
        let ascending = self.keep_at.windows(2).all(|w| w[0] < w[1]);
        let within = |p: &usize| (1..=self.prompt.len()).contains(p);
        if !(ascending && self.keep_at.iter().all(within)) {
            return Err(RequestError::KeepAt(self.keep_at.clone()));
        }
        self.transform.validate(vocab_size)
    }
}

/// A [`GenerateRequest`] that passed [`GenerateRequest::validate`]: only that function builds
/// one, so whoever holds one holds a request every rule was checked on, once, and
/// [`super::Engine::start`] runs it without checking again. The serve core validates a
/// transport's request into one at its edge (`serve::validate`); a library caller hands the
/// engine a plain [`GenerateRequest`], which is validated on the way in ([`Admit`]).
#[derive(Debug, Clone)]
pub struct ValidRequest(GenerateRequest);

impl ValidRequest {
    /// The request, read-only: changing it would bypass the rules it was checked against.
    pub fn get(&self) -> &GenerateRequest {
        &self.0
    }

    /// The prompt ids.
    pub fn prompt(&self) -> &[u32] {
        &self.0.prompt
    }

    /// At most `reserved` drafted ids per step: the drafts the memory plan reserved a rollback
    /// journal for. Fewer drafts never change an output (exact speculation), so this is a
    /// capacity, not a rule: a request within [`MAX_SPECULATE`] stays valid.
    pub(super) fn limit_speculation(mut self, reserved: usize) -> ValidRequest {
        self.0.speculate = self.0.speculate.min(reserved);
        self
    }

    pub(super) fn into_inner(self) -> GenerateRequest {
        self.0
    }
}

/// What [`super::Engine::start`] takes: a request already validated ([`ValidRequest`], passed
/// through) or a plain one (validated here, once).
pub trait Admit {
    fn admit(self, vocab_size: usize) -> Result<ValidRequest, RequestError>;
}

impl Admit for ValidRequest {
    fn admit(self, _vocab_size: usize) -> Result<ValidRequest, RequestError> {
        Ok(self)
    }
}

impl Admit for GenerateRequest {
    fn admit(self, vocab_size: usize) -> Result<ValidRequest, RequestError> {
        self.validate(vocab_size)
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    MaxTokens,
    /// A stop id was produced (not emitted).
    StopId(u32),
    /// The output now ends with this stop string (its last token was emitted).
    StopString(String),
}

/// For logs: "max tokens reached", "stop id 7", "stop string \"\\n\"".
impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::MaxTokens => write!(f, "max tokens reached"),
            StopReason::StopId(id) => write!(f, "stop id {id}"),
            StopReason::StopString(s) => write!(f, "stop string {s:?}"),
        }
    }
}

/// The end-of-generation report.
#[derive(Debug, Clone)]
pub struct Summary {
    pub stop_reason: StopReason,
    pub prompt_tokens: usize,
    /// Prompt tokens the starting state already held (a session's snapshot), not prefilled.
    pub reused_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// Weight bytes read from disk while this generation ran.
    pub bytes_read: u64,
    /// Weight bytes the caches served without a read while this generation ran.
    pub bytes_avoided: u64,
    /// Speculation: drafted ids sent for verification, and how many of them the model
    /// confirmed (acceptance rate = accepted / proposed).
    pub drafts_proposed: usize,
    pub drafts_accepted: usize,
    /// The decode phase's forwards counted per step (speculation's cost model). Boxed: the
    /// summary travels in every serve core `Done` event, which should stay small.
    pub decode_steps: Box<DecodeSteps>,
    /// Generated ids in order (stop ids excluded).
    pub generated: Vec<u32>,
    /// With `record_logits`: one row of `vocab` logits per fed position.
    pub logits: Vec<f32>,
}

/// The forwards of a generation's decode phase, counted per step (issue 16 item 4): what a
/// speed-up estimate needs, since a forward's cost depends on how many drafts it carries
/// (`tools/speculation_speedup.py` prices each count with a measured c(d)). The first generated
/// token is sampled from the prompt's logits and needs no decode forward, nor do tokens a
/// verify step decided ahead.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DecodeSteps {
    /// `by_drafts[d]`: decode forwards that carried `d` drafted ids (`d = 0`: a plain token
    /// forward). Sums to the decode forwards; Σ d·`by_drafts[d]` is the drafts proposed.
    pub by_drafts: Vec<usize>,
    /// `by_accepted[a]`: verify steps (forwards with d ≥ 1) whose first `a` drafts the model
    /// confirmed. Sums to the forwards with d ≥ 1; Σ a·`by_accepted[a]` is the drafts accepted.
    pub by_accepted: Vec<usize>,
}

impl DecodeSteps {
    /// Decode forwards in all.
    pub fn forwards(&self) -> usize {
        self.by_drafts.iter().sum()
    }

    pub(super) fn forward(&mut self, drafts: usize) {
        bump(&mut self.by_drafts, drafts);
    }

    pub(super) fn verified(&mut self, accepted: usize) {
        bump(&mut self.by_accepted, accepted);
    }
}

/// Adds one to `counts[index]`, growing the histogram as needed.
fn bump(counts: &mut Vec<usize>, index: usize) {
    if counts.len() <= index {
        counts.resize(index + 1, 0);
    }
    counts[index] += 1;
}
