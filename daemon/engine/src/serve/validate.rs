//! Request validation: every limit a job must meet before it is queued, so a refused request
//! costs nothing and every transport refuses the same things with the same words. The one
//! exception is a range an API documents differently from the engine's (Anthropic's
//! `temperature` ends at 1, OpenAI's at 2): `k3d`'s `http/request.rs` checks those first, so
//! the refusal names that API's parameter; what it lets through is checked here again.
//!
//! The engine's own rules ([`GenerateRequest::validate`]: ids in the vocabulary, sampling
//! ranges, speculate, the engine's absolute `max_tokens` limit) run here too, at submission;
//! on top of them come the limits of a shared daemon: prompt length, stop lists (matched after
//! every token), and a prompt that leaves room in the model's advertised context
//! (`max_position_embeddings`, spec §2.2).
//!
//! `max_tokens` is a ceiling the client sets, not a promise k3d must refuse to break: as on
//! OpenAI's API, unset means "as much as the context allows" (for a chat; a plain continuation,
//! which has no end of its own, keeps [`DEFAULT_MAX_TOKENS`]), and any value is clamped to the
//! daemon's cap (`--max-tokens-cap`: well below the context, so one request cannot hold the
//! machine for hours) and to the room the prompt leaves in the context. Agents send large
//! values (Claude Code 32,000) and never expect a 400 for them; the reply's finish reason
//! (`length`) and usage say where it stopped.

use std::sync::{Arc, OnceLock};

use crate::constrain::{self, ReplyRules, Vocab};
use crate::engine::{GenerateRequest, LogitTransform, RequestError, Sampling};
use crate::tokenizer::chat::{self, Conversation};
use crate::tokenizer::{Specials, Tokenizer};

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

impl Limits {
    /// The most messages a conversation may have: more render to over `max_prompt_tokens`
    /// whatever they say ([`chat::LEAST_IDS_PER_MESSAGE`] each), so a reader refuses the
    /// conversation as soon as it has read one more, and what it keeps of a request stays
    /// proportional to what the daemon can admit (issue 35 point 2).
    pub fn most_messages(&self) -> usize {
        chat::most_messages(self.max_prompt_tokens)
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

/// What to generate from.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Token ids, continued as they are.
    Ids(Vec<u32>),
    /// Text, tokenised with special tokens off (typed control strings stay text).
    Text(String),
    /// A conversation rendered with the K3 chat template (spec §8.2); the reply ends where the
    /// model ends its turn (spec §8.4) and its ids are classified into channels.
    /// `generation_prompt` is set by the core.
    Chat(Conversation),
}

/// One request as a transport hands it to [`super::Core::submit`].
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Prompt,
    /// New tokens at most, clamped to the cap and to the context's room; `None` = up to the
    /// cap for a chat, [`DEFAULT_MAX_TOKENS`] for a plain continuation.
    pub max_tokens: Option<usize>,
    pub sampling: Sampling,
    /// Logit bias and penalties, applied before each id is chosen.
    pub transform: LogitTransform,
    pub stop_ids: Vec<u32>,
    pub stop_strings: Vec<String>,
    /// Draft ids per speculative step; `None` = the daemon's default.
    pub speculate: Option<usize>,
    /// Most ids of a chat reply's think channel before it is closed and the model answers;
    /// `None` = the daemon's default ([`Limits::thinking_budget`]).
    pub thinking_budget: Option<usize>,
    /// The session this request continues and updates.
    pub session: Option<String>,
    /// Continue from the longest kept state of the same caller that prefixes the prompt, and
    /// keep this request's states for the caller's next one (automatic prefix reuse, see
    /// [`super::prefix`]); `false` = compute the prompt afresh. Ignored with a session.
    pub reuse: bool,
}

impl Request {
    /// A request for `prompt` with every option at its default.
    pub fn new(prompt: Prompt) -> Request {
        Request {
            prompt,
            max_tokens: None,
            sampling: Sampling::default(),
            transform: LogitTransform::default(),
            stop_ids: Vec::new(),
            stop_strings: Vec::new(),
            speculate: None,
            thinking_budget: None,
            session: None,
            reuse: false,
        }
    }
}

/// Why a request was refused: one variant per rule.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Invalid {
    /// One of the engine's rules (empty prompt, id outside the vocabulary, sampling ranges,
    /// speculate, the absolute max_tokens limit).
    #[error("{0}")]
    Request(#[from] RequestError),
    /// Counted after rendering: a chat's tools and template count as much as its messages.
    #[error(
        "the prompt has {tokens} tokens after rendering; this daemon accepts at most {limit} \
         (--max-prompt-tokens)"
    )]
    PromptTooLong { tokens: usize, limit: usize },
    /// More messages than [`Limits::most_messages`]: refused before rendering, by a reader
    /// as soon as it has read that many (so `messages` is then a lower bound).
    #[error(
        "the conversation has at least {messages} messages, and each renders to at least \
         {least} tokens: more than the {limit} this daemon accepts (--max-prompt-tokens)",
        least = chat::LEAST_IDS_PER_MESSAGE
    )]
    TooManyMessages { messages: usize, limit: usize },
    /// More tools than [`chat::most_tools`] allows: refused before rendering, by a reader as
    /// soon as it has read that many (so `tools` is then a lower bound).
    #[error(
        "the request declares at least {tools} tools, and each renders to at least {least} \
         tokens: more than the {limit} this daemon accepts (--max-prompt-tokens)",
        least = chat::LEAST_IDS_PER_TOOL
    )]
    TooManyTools { tools: usize, limit: usize },
    #[error("cannot tokenise the prompt: {0}")]
    Tokenize(String),
    #[error("the conversation has no messages")]
    NoMessages,
    #[error("cannot render the conversation: {0}")]
    Render(String),
    /// `tool_choice` / `response_format` cannot be enforced (a schema outside the supported
    /// subset, or one no value satisfies), naming the field and the schema path.
    #[error("cannot constrain the reply: {0}")]
    Constraint(#[from] constrain::ConstraintError),
    /// `tool_choice` forces a call and `max_tokens` (after the daemon's cap) is below the
    /// fewest ids any call of the allowed tools takes ([`crate::constrain::Grammar::least_call_ids`]):
    /// the reply could only be cut off before its call (issue 45.4).
    #[error(
        "max_tokens {max_tokens} is too small for the tool call tool_choice forces: the \
         shortest call of the allowed tools takes at least {least} tokens"
    )]
    NoRoomForCall { max_tokens: usize, least: usize },
    #[error("{given} stop ids given; at most {MAX_STOP_IDS} are accepted")]
    TooManyStopIds { given: usize },
    #[error("{given} stop strings given; at most {MAX_STOP_STRINGS} are accepted")]
    TooManyStopStrings { given: usize },
    #[error("a stop string of {bytes} bytes: at most {MAX_STOP_STRING_BYTES} are accepted")]
    StopStringTooLong { bytes: usize },
    #[error(
        "the prompt ({prompt} tokens) fills the model's context of {context} tokens: no room is left for a reply"
    )]
    ContextFull { prompt: usize, context: usize },
    /// Refused by the engine when the job started (e.g. a session state the prompt does not
    /// extend).
    #[error("{0}")]
    Engine(String),
}

/// How a job's generated ids are presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A plain continuation: every id is [`super::Channel::Text`].
    Text,
    /// A chat reply: `thinking` says whether it opens in the reasoning channel (spec §8.4;
    /// [`Conversation::reply_opens_thinking`]).
    Chat { thinking: bool },
}

/// A request that passed every check, ready to queue.
#[derive(Debug, Clone)]
pub struct Validated {
    pub request: GenerateRequest,
    pub kind: Kind,
    /// The conversation a chat prompt was rendered from (automatic prefix reuse re-renders it
    /// with the reply as history, [`super::prefix::next_turn`]); `None` for other prompts.
    pub conversation: Option<Conversation>,
    /// Where a chat prompt's prelude ends (automatic prefix reuse keeps states there,
    /// [`super::prefix::keep_points`]); empty for other prompts.
    pub prelude: chat::Prelude,
}

/// What validation needs to know about the model.
#[derive(Debug, Clone, Copy)]
pub struct ModelLimits {
    pub vocab_size: usize,
    /// `max_position_embeddings`.
    pub context: usize,
}

/// The vocabulary as constrained decoding sees it, built on the first request that needs it
/// and shared by all later ones.
#[derive(Default)]
pub struct VocabCache(OnceLock<Arc<Vocab>>);

impl VocabCache {
    fn get(&self, tokenizer: &Tokenizer) -> &Arc<Vocab> {
        self.0.get_or_init(|| Arc::new(Vocab::new(tokenizer)))
    }
}

/// Turns a transport's request into the engine's, refusing whatever breaks a rule.
pub fn validate(
    tokenizer: &Tokenizer,
    vocab: &VocabCache,
    model: ModelLimits,
    limits: &Limits,
    request: Request,
) -> Result<Validated, Invalid> {
    let Request {
        prompt,
        max_tokens,
        sampling,
        transform,
        mut stop_ids,
        stop_strings,
        speculate,
        thinking_budget,
        session: _,
        reuse: _,
    } = request;
    let mut guide = None;
    let too_long = |tokens| Invalid::PromptTooLong {
        tokens,
        limit: limits.max_prompt_tokens,
    };
    let mut prelude = chat::Prelude::default();
    let (prompt, kind, conversation) = match prompt {
        Prompt::Ids(ids) => (ids, Kind::Text, None),
        Prompt::Text(text) => (
            tokenizer
                .encode(&text, Specials::Plain)
                .map_err(|e| Invalid::Tokenize(e.to_string()))?,
            Kind::Text,
            None,
        ),
        Prompt::Chat(mut conversation) => {
            if conversation.forces_a_call() {
                // The call is the reply: thinking is skipped, so all of max_tokens is the
                // call's (issue 45.4: the reply thought until max_tokens and made no call).
                conversation.thinking = chat::Thinking::Off;
            }
            let (ids, thinking, conversation, ends) =
                render_chat(tokenizer, conversation, limits.max_prompt_tokens)?
                    .map_err(too_long)?;
            // The reply ends where the model ends its turn (spec §8.4).
            stop_ids.extend(tokenizer.end_of_turn_ids());
            let rules = ReplyRules {
                thinking,
                budget: thinking_budget.or(limits.thinking_budget),
            };
            guide = constrain::guide(vocab.get(tokenizer), &conversation, rules)?;
            prelude = ends;
            (ids, Kind::Chat { thinking }, Some(conversation))
        }
    };
    if prompt.len() > limits.max_prompt_tokens {
        return Err(too_long(prompt.len()));
    }
    if stop_ids.len() > MAX_STOP_IDS {
        return Err(Invalid::TooManyStopIds {
            given: stop_ids.len(),
        });
    }
    if stop_strings.len() > MAX_STOP_STRINGS {
        return Err(Invalid::TooManyStopStrings {
            given: stop_strings.len(),
        });
    }
    if let Some(s) = stop_strings
        .iter()
        .find(|s| s.len() > MAX_STOP_STRING_BYTES)
    {
        return Err(Invalid::StopStringTooLong { bytes: s.len() });
    }
    let room = model.context.saturating_sub(prompt.len());
    if room == 0 {
        return Err(Invalid::ContextFull {
            prompt: prompt.len(),
            context: model.context,
        });
    }
    let asked = max_tokens.unwrap_or(match kind {
        Kind::Text => DEFAULT_MAX_TOKENS,
        Kind::Chat { .. } => usize::MAX,
    });
    let max_tokens = asked.min(limits.max_tokens_cap).min(room);
    if let Some(least) = guide.as_ref().and_then(|g| g.grammar().least_call_ids())
        && max_tokens < least
    {
        return Err(Invalid::NoRoomForCall { max_tokens, least });
    }
    let request = GenerateRequest {
        max_tokens,
        sampling,
        stop_ids,
        stop_strings,
        record_logits: false,
        speculate: speculate.unwrap_or(limits.speculate),
        transform,
        guide: guide.map(|g| g as Arc<dyn crate::engine::guide::Guide>),
        prompt,
        keep_at: Vec::new(),
    };
    request.validate(model.vocab_size)?;
    Ok(Validated {
        request,
        kind,
        conversation,
        prelude,
    })
}

/// The ids of a chat prompt, whether its reply opens in the reasoning channel, the
/// conversation as rendered and where its prelude ends; or, past the limit, how many ids it
/// renders to.
type RenderedChat = Result<(Vec<u32>, bool, Conversation, chat::Prelude), usize>;

/// Renders a conversation with the library's template (spec §8.2), ending with the open
/// assistant message the reply continues (a new one, or the final message when it is
/// continued), keeping at most `limit` ids (a longer one is only counted, so its memory stays
/// bounded). A conversation with more messages than `limit` ids could hold is refused without
/// being rendered ([`Invalid::TooManyMessages`]), and so is one declaring more tools than
/// that ([`Invalid::TooManyTools`]).
pub fn render_chat(
    tokenizer: &Tokenizer,
    mut conversation: Conversation,
    limit: usize,
) -> Result<RenderedChat, Invalid> {
    if conversation.messages.is_empty() {
        return Err(Invalid::NoMessages);
    }
    let messages = conversation.messages.len();
    if messages > chat::most_messages(limit) {
        return Err(Invalid::TooManyMessages { messages, limit });
    }
    let tools = conversation.tools.len();
    if tools > chat::most_tools(limit) {
        return Err(Invalid::TooManyTools { tools, limit });
    }
    // A conversation that ends with an assistant message gets a new assistant turn (OpenAI's
    // and vLLM's reading), unless that message is marked to be continued (`partial`).
    conversation.generation_prompt = true;
    let thinking = conversation.reply_opens_thinking();
    match chat::render_limited(tokenizer, &conversation, limit)
        .map_err(|e| Invalid::Render(e.to_string()))?
    {
        chat::Limited::Within(ids, prelude) => Ok(Ok((ids, thinking, conversation, prelude))),
        chat::Limited::Over(count) => Ok(Err(count)),
    }
}
