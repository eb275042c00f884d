//! Every limit and default a request is held to, in one place: what `k3d serve` may set
//! ([`Limits`], checked by [`Limits::new`]), what a request may ask for, what it gets when it
//! asks nothing, and where the APIs' own ranges differ ([`Api`]). Transports read them here and
//! decide nothing themselves; [`super::validate`] applies them, once.
//!
//! The engine's own rules (the absolute `max_tokens` limit, the drafts one step may verify, the
//! logit bias and penalty ranges) belong to the engine, which checks them in
//! [`GenerateRequest::validate`](crate::engine::GenerateRequest::validate); they are re-exported
//! here so this module lists every number a request meets.
//!
//! `max_tokens` is a ceiling the client sets, not a promise k3d must refuse to break: as on
//! OpenAI's API, unset means "as much as the context allows" (for a chat; a plain continuation,
//! which has no end of its own, keeps [`DEFAULT_MAX_TOKENS`]), and any value is clamped to the
//! daemon's cap (`--max-tokens-cap`: well below the context, so one request cannot hold the
//! machine for hours) and to the room the prompt leaves in the context. Agents send large
//! values (Claude Code 32,000) and never expect a 400 for them; the reply's finish reason
//! (`length`) and usage say where it stopped.

pub use crate::engine::request::{
    LOGIT_BIAS_LIMIT, MAX_LOGIT_BIAS, MAX_SPECULATE, MAX_TOKENS_LIMIT, PENALTY_LIMIT,
};
use crate::tokenizer::chat::Effort;

/// Largest `--max-prompt-tokens` a daemon may set, and its default: the released model's
/// context (spec §2.2); a model with a shorter one refuses longer prompts by its context.
pub const MAX_PROMPT_TOKENS: usize = 1 << 20;
/// `max_tokens` of a plain continuation (no chat template) that leaves it unset (capped by
/// [`Limits::max_tokens_cap`]); a chat left unset runs up to the cap.
pub const DEFAULT_MAX_TOKENS: usize = 256;
/// Default daemon-side cap on `max_tokens`: 4,096 new tokens is minutes of decoding on a
/// streamed model, not the hours the 1,048,576-token context would allow.
pub const DEFAULT_MAX_TOKENS_CAP: usize = 4096;
/// Stop strings beyond this many, or longer than this, are refused (each is matched against
/// the output after every token).
pub const MAX_STOP_STRINGS: usize = 16;
pub const MAX_STOP_STRING_BYTES: usize = 256;
pub const MAX_STOP_IDS: usize = 256;
/// Ids a chat reply may spend in its think channel when neither the request nor the daemon
/// (`--thinking-budget`) says otherwise; then the think channel is closed and the model
/// answers. On a CPU at seconds per token (4 s/token reading 25.8 GB per token with the trunk
/// resident; far more on a small budget), 512 ids of thinking are already half an hour before
/// the first word of the answer — `docs/decoding.md` argues the number.
pub const DEFAULT_THINKING_BUDGET: usize = 512;

/// The daemon's request limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most new tokens one request may ask for (`--max-tokens-cap`).
    pub max_tokens_cap: usize,
    /// Draft ids per speculative step for requests that leave it unset (`--speculate`).
    pub speculate: usize,
    /// Think-channel ids of a chat reply whose request leaves it unset (`--thinking-budget`);
    /// `None` = unbounded.
    pub thinking_budget: Option<usize>,
    /// Most prompt tokens one request may have, counted after rendering
    /// (`--max-prompt-tokens`).
    pub max_prompt_tokens: usize,
}

/// A daemon setting out of its range, naming the setting (as `--config` spells it) and the range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("speculate {0} exceeds the limit {MAX_SPECULATE}")]
    Speculate(usize),
    #[error("max_tokens_cap must be between 1 and {MAX_TOKENS_LIMIT}")]
    MaxTokensCap,
    #[error("max_prompt_tokens must be between 1 and {MAX_PROMPT_TOKENS}")]
    MaxPromptTokens,
}

impl Limits {
    /// The daemon's limits from its settings, each checked by its `check_` function first;
    /// `thinking_budget` is `None` where the operator set nothing, `Some(None)` for
    /// "unbounded".
    pub fn new(
        max_tokens_cap: usize,
        speculate: usize,
        thinking_budget: Option<Option<usize>>,
        max_prompt_tokens: usize,
    ) -> Limits {
        Limits {
            max_tokens_cap,
            speculate,
            thinking_budget: thinking_budget.unwrap_or(Some(DEFAULT_THINKING_BUDGET)),
            max_prompt_tokens,
        }
    }

    /// `--speculate` within 0..=[`MAX_SPECULATE`], 0 (off) when unset.
    pub fn check_speculate(given: Option<usize>) -> Result<usize, LimitError> {
        match given.unwrap_or(0) {
            n if n <= MAX_SPECULATE => Ok(n),
            n => Err(LimitError::Speculate(n)),
        }
    }

    /// `--max-tokens-cap` within 1..=[`MAX_TOKENS_LIMIT`], [`DEFAULT_MAX_TOKENS_CAP`] when unset
    /// (needed before the limits are: the memory plan sizes states for the longest reply).
    pub fn check_tokens_cap(given: Option<usize>) -> Result<usize, LimitError> {
        match given.unwrap_or(DEFAULT_MAX_TOKENS_CAP) {
            n if (1..=MAX_TOKENS_LIMIT).contains(&n) => Ok(n),
            _ => Err(LimitError::MaxTokensCap),
        }
    }

    /// `--max-prompt-tokens` within 1..=[`MAX_PROMPT_TOKENS`] when given.
    pub fn check_prompt_tokens(given: Option<usize>) -> Result<Option<usize>, LimitError> {
        match given {
            Some(n) if !(1..=MAX_PROMPT_TOKENS).contains(&n) => Err(LimitError::MaxPromptTokens),
            given => Ok(given),
        }
    }

    /// The think-channel ids of a reply whose request asked for `asked`: its tokens, an
    /// effort's share of the daemon's budget (low a quarter, high half, max all of it; an
    /// unbounded daemon leaves every effort unbounded), or the daemon's budget.
    pub fn thinking_budget(&self, asked: Option<ThinkingBudget>) -> Option<usize> {
        match asked {
            None => self.thinking_budget,
            Some(ThinkingBudget::Tokens(n)) => Some(n),
            Some(ThinkingBudget::Effort(effort)) => self.thinking_budget.map(|d| {
                let share = match effort {
                    Effort::Low => d / 4,
                    Effort::High => d / 2,
                    Effort::Max => d,
                };
                share.max(1)
            }),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_tokens_cap: DEFAULT_MAX_TOKENS_CAP,
            speculate: 0,
            thinking_budget: Some(DEFAULT_THINKING_BUDGET),
            max_prompt_tokens: MAX_PROMPT_TOKENS,
        }
    }
}

/// How long a chat reply may think, as its request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkingBudget {
    /// This many think-channel ids (Anthropic's `thinking.budget_tokens`).
    Tokens(usize),
    /// An effort level's share of the daemon's `--thinking-budget` ([`Limits::thinking_budget`]).
    Effort(Effort),
}

/// The API a request came in by: where the APIs' documented rules differ, the serve core
/// applies each one's, so a client gets what its API promises whatever transport carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// OpenAI's Chat Completions, Completions and Responses.
    OpenAi,
    /// Anthropic's Messages.
    Anthropic,
    /// k3's own gRPC API.
    K3,
}

impl Api {
    /// The largest `temperature` the API documents: OpenAI's range ends at 2, Anthropic's at 1;
    /// k3's own takes any finite value ≥ 0 (the engine's rule).
    pub fn temperature_max(self) -> f32 {
        match self {
            Api::OpenAi => 2.0,
            Api::Anthropic => 1.0,
            Api::K3 => f32::MAX,
        }
    }

    /// Whether a request continues from its caller's longest kept prefix unless it says
    /// otherwise: OpenAI and Anthropic clients resend the whole conversation every turn; gRPC
    /// clients keep state explicitly, in named sessions.
    pub fn reuses_prefixes(self) -> bool {
        match self {
            Api::OpenAi | Api::Anthropic => true,
            Api::K3 => false,
        }
    }

    /// What a chat with thinking on gets when `tool_choice` forces a call (issue 45.4): the call
    /// is the reply, so the thinking is skipped — except on Anthropic's API, which refuses the
    /// combination, as Anthropic's own does.
    pub fn refuses_thinking_with_a_forced_call(self) -> bool {
        self == Api::Anthropic
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_effort_is_a_share_of_the_daemons_budget_and_tokens_are_taken_as_given() {
        let limits = Limits::default();
        let budget = |asked| limits.thinking_budget(asked);
        assert_eq!(budget(None), Some(DEFAULT_THINKING_BUDGET));
        assert_eq!(budget(Some(ThinkingBudget::Tokens(7))), Some(7));
        assert_eq!(budget(Some(ThinkingBudget::Effort(Effort::Low))), Some(128));
        assert_eq!(
            budget(Some(ThinkingBudget::Effort(Effort::High))),
            Some(256)
        );
        assert_eq!(budget(Some(ThinkingBudget::Effort(Effort::Max))), Some(512));
        let unbounded = Limits {
            thinking_budget: None,
            ..limits
        };
        assert_eq!(
            unbounded.thinking_budget(Some(ThinkingBudget::Effort(Effort::Low))),
            None
        );
        let tiny = Limits {
            thinking_budget: Some(2),
            ..limits
        };
        assert_eq!(
            tiny.thinking_budget(Some(ThinkingBudget::Effort(Effort::Low))),
            Some(1)
        );
    }

    #[test]
    fn the_daemons_settings_are_refused_outside_their_ranges() {
        assert_eq!(Limits::check_tokens_cap(None), Ok(DEFAULT_MAX_TOKENS_CAP));
        assert_eq!(Limits::check_speculate(None), Ok(0));
        assert_eq!(Limits::check_prompt_tokens(None), Ok(None));
        let refusals = [
            (
                Limits::check_tokens_cap(Some(0)).err(),
                LimitError::MaxTokensCap,
            ),
            (
                Limits::check_tokens_cap(Some(MAX_TOKENS_LIMIT + 1)).err(),
                LimitError::MaxTokensCap,
            ),
            (
                Limits::check_speculate(Some(MAX_SPECULATE + 1)).err(),
                LimitError::Speculate(MAX_SPECULATE + 1),
            ),
            (
                Limits::check_prompt_tokens(Some(0)).err(),
                LimitError::MaxPromptTokens,
            ),
            (
                Limits::check_prompt_tokens(Some(MAX_PROMPT_TOKENS + 1)).err(),
                LimitError::MaxPromptTokens,
            ),
        ];
        for (got, refusal) in refusals {
            assert_eq!(got, Some(refusal));
        }
        assert_eq!(Limits::new(8, 0, Some(None), 8).thinking_budget, None);
        assert_eq!(
            Limits::new(8, 0, None, 8).thinking_budget,
            Some(DEFAULT_THINKING_BUDGET)
        );
    }
}
