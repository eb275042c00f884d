//! `k3 run PROMPT`: continue a prompt and stream the continuation.

use crate::connect::{self, SocketPath};
use crate::failure::{Code, Failure};
use crate::stream::{self, Format, Reasoning, Show};
use k3proto::v1 as pb;

#[derive(clap::Args)]
pub struct Args {
    /// The prompt; `-` reads it from stdin.
    prompt: String,
    /// The prompt is token ids (spaces or commas between them) and the output is ids too.
    #[arg(long)]
    ids: bool,
    /// One JSON object per event on stdout.
    #[arg(long, conflicts_with = "ids")]
    json: bool,
    /// Keep the state in this daemon session: a later prompt that extends this one (plus its
    /// output) is not prefilled again. Created on first use; only you can use it.
    #[arg(long)]
    session: Option<String>,
    #[command(flatten)]
    pub options: Options,
}

/// Generation options shared by `run` and `chat`.
#[derive(clap::Args, Clone)]
pub struct Options {
    /// Most tokens to generate (default: the daemon's: 256 for `run`, up to its cap for
    /// `chat`; more than the cap is clamped to it).
    #[arg(long, default_value_t = 0)]
    max_tokens: u32,
    /// Sampling temperature; 0 = greedy (the default).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// Nucleus sampling threshold in (0, 1]; 0 or 1 = off.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    top_p: f32,
    /// Keep only the k most likely tokens; 0 = off.
    #[arg(long, default_value_t = 0)]
    top_k: u32,
    /// Random seed: the same seed gives the same output.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop after this id (repeatable).
    #[arg(long = "stop-id")]
    stop_ids: Vec<u32>,
    /// Stop once the output contains this text (repeatable).
    #[arg(long = "stop")]
    stop_strings: Vec<String>,
    /// Exact speculative decoding (greedy only): verify up to N ids drafted from the context
    /// per step; same output, faster on repetitive text. 0 = the daemon's default.
    #[arg(long, default_value_t = 0)]
    speculate: u32,
    /// Add BIAS (in [-100, 100]) to the logit of token ID before each choice, as ID=BIAS
    /// (repeatable): -100 bans the id, +100 all but forces it.
    #[arg(long = "logit-bias", value_name = "ID=BIAS", value_parser = parse_bias, allow_hyphen_values = true)]
    logit_bias: Vec<(u32, f32)>,
    /// Lower the logit of an id by this much per time it was generated so far, in [-2, 2].
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// Lower the logit of an id generated at least once so far by this much, in [-2, 2].
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
}

/// `ID=BIAS` of `--logit-bias`; the daemon checks the ranges.
fn parse_bias(s: &str) -> Result<(u32, f32), String> {
    let (id, bias) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: give ID=BIAS, e.g. 42=-100"))?;
    let id = id
        .trim()
        .parse()
        .map_err(|_| format!("{id:?} is not a token id"))?;
    let bias = bias
        .trim()
        .parse()
        .map_err(|_| format!("{bias:?} is not a number"))?;
    Ok((id, bias))
}

impl Options {
    pub fn to_wire(&self) -> pb::GenerationOptions {
        pb::GenerationOptions {
            max_tokens: self.max_tokens,
            sampling: Some(pb::Sampling {
                temperature: self.temperature,
                top_p: self.top_p,
                top_k: self.top_k,
                seed: self.seed,
                logit_bias: self.logit_bias.iter().copied().collect(),
                frequency_penalty: self.frequency_penalty,
                presence_penalty: self.presence_penalty,
            }),
            stop_ids: self.stop_ids.clone(),
            stop_strings: self.stop_strings.clone(),
            speculate: self.speculate,
        }
    }
}

pub async fn run(socket: &SocketPath, args: Args) -> Result<(), Failure> {
    let text = crate::argument_or_stdin(args.prompt)?;
    let prompt = if args.ids {
        pb::generate_request::Prompt::Ids(pb::TokenIds {
            ids: parse_ids(&text)?,
        })
    } else {
        pb::generate_request::Prompt::Text(text)
    };
    let mut interrupts = stream::interrupts()?;
    let mut client = connect::connect(socket).await?;
    let events = client
        .generate(pb::GenerateRequest {
            prompt: Some(prompt),
            options: Some(args.options.to_wire()),
            session: args.session.unwrap_or_default(),
        })
        .await?
        .into_inner();
    let format = match (args.ids, args.json) {
        (true, _) => Format::Ids,
        (false, true) => Format::Json,
        (false, false) => Format::Text,
    };
    let show = Show {
        format,
        reasoning: Reasoning::Show,
        stats: true,
    };
    let outcome = stream::show(&mut client, events, &show, &mut interrupts).await?;
    if outcome.cancelled {
        // `show` printed "[cancelled]" already.
        return Err(Failure::said(Code::Cancelled));
    }
    Ok(())
}

pub fn parse_ids(text: &str) -> Result<Vec<u32>, Failure> {
    text.split(|c: char| c.is_whitespace() || c == ',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>()
                .map_err(|_| Failure::usage(format!("{s:?} is not a token id")))
        })
        .collect()
}
