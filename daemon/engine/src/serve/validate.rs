//! Request validation, once, at the serve core's edge: every rule a job must meet before it is
//! queued, so a refused request costs nothing and every transport refuses the same things with
//! the same words. A transport reads its wire into one [`Request`] and decides nothing; here
//! it becomes the engine's [`ValidRequest`] — the one type the engine runs, which only a
//! validator can build — with the daemon's defaults applied and its limits enforced
//! ([`super::limits`], where every number lives). Where the APIs document different rules
//! (Anthropic's `temperature` ends at 1, OpenAI's at 2), the request's [`Api`] says which apply.
//!
//! The engine's own rules ([`GenerateRequest::validate`]: ids in the vocabulary, sampling
//! ranges, logit bias and penalties, speculate, the absolute `max_tokens` limit) run here too,
//! as the last step; on top of them come the limits of a shared daemon: prompt length, stop
//! lists (matched after every token), a prompt that leaves room in the model's advertised
//! context (`max_position_embeddings`, spec §2.2), and the tool-choice rules. Each refusal
//! names its request [`Field`], which a transport turns into its own parameter's name.

use std::sync::{Arc, OnceLock};

use super::Caller;
use super::limits::{
    Api, DEFAULT_MAX_TOKENS, Limits, MAX_STOP_IDS, MAX_STOP_STRING_BYTES, MAX_STOP_STRINGS,
    ThinkingBudget,
};
use super::prefix;
use crate::constrain::{self, ReplyRules, Vocab};
use crate::engine::{GenerateRequest, LogitTransform, RequestError, Sampling, ValidRequest};
use crate::tokenizer::chat::{self, Conversation};
use crate::tokenizer::{Specials, Tokenizer};

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

/// One request as a transport hands it to [`super::Core::submit`]: what the client asked,
/// read from its wire and nothing more (`None` = the client said nothing: the default here
/// applies).
#[derive(Debug, Clone)]
pub struct Request {
    /// The API the request came in by (whose documented rules apply where APIs differ).
    pub api: Api,
    pub prompt: Prompt,
    /// New tokens at most, at least 1, clamped to the cap and to the context's room; `None` =
    /// up to the cap for a chat, [`DEFAULT_MAX_TOKENS`] for a plain continuation.
    pub max_tokens: Option<usize>,
    pub sampling: Sampling,
    /// Logit bias and penalties, applied before each id is chosen.
    pub transform: LogitTransform,
    pub stop_ids: Vec<u32>,
    pub stop_strings: Vec<String>,
    /// Draft ids per speculative step; `None` = the daemon's default.
    pub speculate: Option<usize>,
    /// How long a chat reply may think before its think channel is closed and the model
    /// answers; `None` = the daemon's default ([`Limits::thinking_budget`]).
    pub thinking_budget: Option<ThinkingBudget>,
    /// The session this request continues and updates.
    pub session: Option<String>,
    /// Continue from the longest kept state of the same caller that prefixes the prompt, and
    /// keep this request's states for the caller's next one (automatic prefix reuse, see
    /// [`super::prefix`]); `false` = compute the prompt afresh; `None` = the API's default
    /// ([`Api::reuses_prefixes`]). Never with a session, nor for an unknown caller.
    pub reuse: Option<bool>,
    /// A name the client gives its conversation (`prompt_cache_key`, Anthropic's
    /// `metadata.user_id`): under an API key, whose holders may be many, kept states are
    /// shared only under the same name ([`Caller::scoped`]).
    pub cache_scope: Option<String>,
}

impl Request {
    /// A request of k3's own API for `prompt` with every option at its default.
    pub fn new(prompt: Prompt) -> Request {
        Request {
            api: Api::K3,
            prompt,
            max_tokens: None,
            sampling: Sampling::default(),
            transform: LogitTransform::default(),
            stop_ids: Vec::new(),
            stop_strings: Vec::new(),
            speculate: None,
            thinking_budget: None,
            session: None,
            reuse: None,
            cache_scope: None,
        }
    }
}

/// The field of a [`Request`] a refusal concerns: a transport names it as its API does
/// (`max_tokens`, `max_output_tokens`, `stop_sequences`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// The prompt, the messages or the ids.
    Prompt,
    MaxTokens,
    Temperature,
    TopP,
    Stop,
    LogitBias,
    FrequencyPenalty,
    PresencePenalty,
    Speculate,
    Tools,
    ToolChoice,
    ResponseFormat,
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
    /// The chat template refused the conversation (spec §8.2), naming the field it concerns:
    /// the tool choice (a forced call without tools, a function not among them) or the prompt.
    #[error("cannot render the conversation: {reason}")]
    Render { field: Field, reason: String },
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
    #[error("max_tokens must be at least 1")]
    NoTokens,
    /// Above the largest temperature the request's API documents ([`Api::temperature_max`]).
    #[error("temperature {value} must be between 0 and {max}")]
    Temperature { value: f32, max: f32 },
    /// Anthropic's rule ([`Api::refuses_thinking_with_a_forced_call`]).
    #[error(
        "thinking may not be enabled when tool_choice forces tool use: use tool_choice auto, \
         or thinking disabled (a forced call is made without thinking)"
    )]
    ThinkingWithForcedCall,
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

impl Invalid {
    /// The request field the refusal concerns.
    pub fn field(&self) -> Field {
        match self {
            Invalid::Request(e) => match e {
                RequestError::MaxTokens { .. } => Field::MaxTokens,
                RequestError::Speculate { .. } => Field::Speculate,
                RequestError::Temperature(_) => Field::Temperature,
                RequestError::TopP(_) => Field::TopP,
                RequestError::EmptyStopString => Field::Stop,
                RequestError::TooManyBiases { .. }
                | RequestError::BiasIdOutsideVocabulary { .. }
                | RequestError::BiasValue { .. }
                | RequestError::BiasTwice { .. } => Field::LogitBias,
                RequestError::Penalty { name, .. } if *name == "presence_penalty" => {
                    Field::PresencePenalty
                }
                RequestError::Penalty { .. } => Field::FrequencyPenalty,
                RequestError::EmptyPrompt
                | RequestError::IdOutsideVocabulary { .. }
                | RequestError::KeepAt(_) => Field::Prompt,
            },
            Invalid::NoTokens | Invalid::NoRoomForCall { .. } => Field::MaxTokens,
            Invalid::Temperature { .. } => Field::Temperature,
            Invalid::TooManyTools { .. } => Field::Tools,
            Invalid::ThinkingWithForcedCall => Field::ToolChoice,
            Invalid::Render { field, .. } => *field,
            Invalid::Constraint(c) => match c.field() {
                "response_format" => Field::ResponseFormat,
                "tool_choice" => Field::ToolChoice,
                _ => Field::Tools,
            },
            Invalid::TooManyStopIds { .. }
            | Invalid::TooManyStopStrings { .. }
            | Invalid::StopStringTooLong { .. } => Field::Stop,
            Invalid::PromptTooLong { .. }
            | Invalid::TooManyMessages { .. }
            | Invalid::Tokenize(_)
            | Invalid::NoMessages
            | Invalid::ContextFull { .. }
            | Invalid::Engine(_) => Field::Prompt,
        }
    }
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
    /// Checked once, here: the engine runs it as it is.
    pub request: ValidRequest,
    /// How its generated ids are presented (text, or a chat reply's channels).
    pub kind: Kind,
    /// The caller the job runs for (the transport's, narrowed by the request's cache scope),
    /// and the session the job continues and updates.
    pub caller: Caller,
    pub session: Option<String>,
    /// With automatic prefix reuse: the job continues from the caller's kept states and adds
    /// to them, and for a chat keeps the conversation its prompt was rendered from (reuse
    /// re-renders it with the reply as history, [`super::prefix::next_turn`]) with the prompt
    /// positions of its prelude ([`super::prefix::prelude_points`]); `None` without reuse.
    pub reuse: bool,
    pub conversation: Option<(Conversation, Vec<usize>)>,
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

/// Turns `caller`'s request into the engine's, refusing whatever breaks a rule.
pub fn validate(
    tokenizer: &Tokenizer,
    vocab: &VocabCache,
    model: ModelLimits,
    limits: &Limits,
    caller: Caller,
    request: Request,
) -> Result<Validated, Invalid> {
    let Request {
        api,
        prompt,
        max_tokens,
        sampling,
        transform,
        mut stop_ids,
        stop_strings,
        speculate,
        thinking_budget,
        session,
        reuse,
        cache_scope,
    } = request;
    if max_tokens == Some(0) {
        return Err(Invalid::NoTokens);
    }
    let temperature_max = api.temperature_max();
    if sampling.temperature > temperature_max {
        return Err(Invalid::Temperature {
            value: sampling.temperature,
            max: temperature_max,
        });
    }
    let caller = caller.scoped(cache_scope.as_deref());
    // A session's own states take precedence over automatic reuse; nothing is kept for a
    // caller nobody vouches for (issue 35 point 7).
    let reuse = reuse.unwrap_or(api.reuses_prefixes()) && session.is_none() && caller.is_known();
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
                if conversation.thinking.is_on() && api.refuses_thinking_with_a_forced_call() {
                    return Err(Invalid::ThinkingWithForcedCall);
                }
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
                budget: limits.thinking_budget(thinking_budget),
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
    // Reuse keeps states where later prompts may diverge: the prelude's ends and the ends of
    // messages ([`prefix::keep_points`]).
    let keep_at = if reuse {
        let end_of_message = tokenizer.special_id(crate::tokenizer::END_OF_MSG);
        prefix::keep_points(&prompt, end_of_message, &prelude)
    } else {
        Vec::new()
    };
    let prelude_points = prefix::prelude_points(prompt.len(), &prelude);
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
        keep_at,
    }
    .validate(model.vocab_size)?;
    Ok(Validated {
        request,
        kind,
        conversation: conversation.filter(|_| reuse).map(|c| (c, prelude_points)),
        caller,
        session,
        reuse,
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
    within_message_limit(limit, conversation.messages.len())?;
    within_tool_limit(limit, conversation.tools.len())?;
    // A conversation that ends with an assistant message gets a new assistant turn (OpenAI's
    // and vLLM's reading), unless that message is marked to be continued (`partial`).
    conversation.generation_prompt = true;
    let thinking = conversation.reply_opens_thinking();
    match chat::render_limited(tokenizer, &conversation, limit).map_err(|e| Invalid::Render {
        field: match e {
            chat::ChatError::RequiredWithoutTools | chat::ChatError::UnknownFunction(_) => {
                Field::ToolChoice
            }
            _ => Field::Prompt,
        },
        reason: e.to_string(),
    })? {
        chat::Limited::Within(ids, prelude) => Ok(Ok((ids, thinking, conversation, prelude))),
        chat::Limited::Over(count) => Ok(Err(count)),
    }
}

/// Refuses a conversation of `messages` messages when more than a prompt limit of `limit`
/// tokens could hold whatever they say ([`chat::LEAST_IDS_PER_MESSAGE`] ids each): a reader
/// calls it as it reads each message, and stops at the first refusal, keeping no more (issue 35
/// point 2).
pub fn within_message_limit(limit: usize, messages: usize) -> Result<(), Invalid> {
    if messages > chat::most_messages(limit) {
        return Err(Invalid::TooManyMessages { messages, limit });
    }
    Ok(())
}

/// Refuses a request declaring `tools` tools when more than a prompt limit of `limit` tokens
/// could hold whatever they declare ([`chat::LEAST_IDS_PER_TOOL`] ids each), as
/// [`within_message_limit`] does for messages (issue 35 points 2 and 5: 100,000 tiny tools
/// fit in a body).
pub fn within_tool_limit(limit: usize, tools: usize) -> Result<(), Invalid> {
    if tools > chat::most_tools(limit) {
        return Err(Invalid::TooManyTools { tools, limit });
    }
    Ok(())
}
