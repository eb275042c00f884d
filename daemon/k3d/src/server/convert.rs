//! Between the wire (`k3.v1`) and the engine's types: request options in, summaries and errors
//! out. The engine validates requests (prompt, ids, max_tokens, sampling values); the limits
//! here only bound what one request may make the daemon hold (stop lists).

use k3_engine::engine::{EngineError, GenerateRequest, Sampling, StopReason, Summary};
use k3proto::v1 as pb;
use tonic::Status;

/// `max_tokens` when the request leaves it 0.
pub const DEFAULT_MAX_TOKENS: usize = 256;
/// Stop strings beyond this many, or longer than this, are refused (each is matched against
/// the output after every token).
const MAX_STOP_STRINGS: usize = 16;
const MAX_STOP_STRING_BYTES: usize = 256;
const MAX_STOP_IDS: usize = 256;

/// `default_speculate` is the daemon's `--speculate`, used when the request leaves it 0.
pub fn request(
    prompt: Vec<u32>,
    options: Option<pb::GenerationOptions>,
    default_speculate: usize,
) -> Result<GenerateRequest, Status> {
    let options = options.unwrap_or_default();
    if options.stop_ids.len() > MAX_STOP_IDS {
        return Err(Status::invalid_argument(format!(
            "{} stop ids given; at most {MAX_STOP_IDS} are accepted",
            options.stop_ids.len()
        )));
    }
    if options.stop_strings.len() > MAX_STOP_STRINGS {
        return Err(Status::invalid_argument(format!(
            "{} stop strings given; at most {MAX_STOP_STRINGS} are accepted",
            options.stop_strings.len()
        )));
    }
    if let Some(s) = options
        .stop_strings
        .iter()
        .find(|s| s.len() > MAX_STOP_STRING_BYTES)
    {
        return Err(Status::invalid_argument(format!(
            "a stop string of {} bytes: at most {MAX_STOP_STRING_BYTES} are accepted",
            s.len()
        )));
    }
    Ok(GenerateRequest {
        prompt,
        max_tokens: match options.max_tokens {
            0 => DEFAULT_MAX_TOKENS,
            n => n as usize,
        },
        sampling: sampling(options.sampling.unwrap_or_default()),
        record_logits: false,
        speculate: match options.speculate {
            0 => default_speculate,
            n => n as usize,
        },
        stop_ids: options.stop_ids,
        stop_strings: options.stop_strings,
    })
}

/// The engine validates the values; only the wire's "0 = off" for top_p needs translating.
fn sampling(s: pb::Sampling) -> Sampling {
    Sampling {
        temperature: s.temperature,
        top_p: if s.top_p == 0.0 { 1.0 } else { s.top_p },
        top_k: s.top_k as usize,
        seed: s.seed,
    }
}

/// The gRPC status a client gets for an engine error.
pub fn engine_error(e: &EngineError) -> Status {
    match e {
        EngineError::Cancelled => Status::cancelled(e.to_string()),
        EngineError::InvalidRequest(why) => Status::invalid_argument(why.clone()),
        _ => Status::internal(format!("the model failed: {e}")),
    }
}

/// The Done event. `end_of_turn` lists the ids the server itself made stop ids (Chat's
/// end-of-turn ids): stopping on one of those is the model ending its turn.
pub fn done(
    s: &Summary,
    end_of_turn: &[u32],
    queued_seconds: f64,
    trailing_text: String,
) -> pb::Done {
    let (reason, stop_id, stop_string) = match &s.stop_reason {
        StopReason::MaxTokens => (pb::StopReason::MaxTokens, 0, String::new()),
        StopReason::StopId(id) if end_of_turn.contains(id) => {
            (pb::StopReason::EndOfTurn, *id, String::new())
        }
        StopReason::StopId(id) => (pb::StopReason::StopId, *id, String::new()),
        StopReason::StopString(text) => (pb::StopReason::StopString, 0, text.clone()),
    };
    pb::Done {
        stop_reason: reason.into(),
        stop_id,
        stop_string,
        prompt_tokens: count(s.prompt_tokens),
        generated_tokens: count(s.generated_tokens),
        timings: Some(pb::Timings {
            queued_seconds,
            prefill_seconds: s.prefill_seconds,
            decode_seconds: s.decode_seconds,
        }),
        bytes_read: s.bytes_read,
        bytes_avoided: s.bytes_avoided,
        trailing_text,
        draft_tokens_proposed: count(s.drafts_proposed),
        draft_tokens_accepted: count(s.drafts_accepted),
        reused_prompt_tokens: count(s.reused_tokens),
        // A Chat's reply reader fills these (scheduler, from `Channels::finish`).
        tool_calls: Vec::new(),
        malformed: None,
    }
}

/// Token counts on the wire are u32; a count beyond that saturates rather than wraps.
pub fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
