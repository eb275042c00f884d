//! Between the wire (`k3.v1`) and the serve core's types: requests and conversations in; events,
//! summaries, sessions and errors out. No rule lives here: the core validates every request.

use k3_engine::engine::{LogitTransform, PassProgress};
use k3_engine::serve::{
    Channel, Done, Event, FinishReason, LoadFigures, Prompt, Request, ServeError, SessionFigures,
    ThinkingBudget,
};
use k3_engine::session::{FileError, SessionInfo, SessionStoreError};
use k3_engine::tokenizer::chat::{
    Conversation, Effort, Message, ResponseFormat, Role, Thinking, Tool, ToolCall, ToolChoice,
};
use k3proto::v1 as pb;
use std::time::UNIX_EPOCH;
use tonic::Status;

/// A `Generate` call's prompt: ids or text, one of them required.
pub fn prompt(prompt: Option<pb::generate_request::Prompt>) -> Result<Prompt, Status> {
    match prompt {
        Some(pb::generate_request::Prompt::Ids(ids)) => Ok(Prompt::Ids(ids.ids)),
        Some(pb::generate_request::Prompt::Text(text)) => Ok(Prompt::Text(text)),
        None => Err(Status::invalid_argument("no prompt: give text or ids")),
    }
}

/// A core request from the wire's options; `0` on the wire means "the default". A chat's
/// `thinking_budget` is given by [`chat_request`].
pub fn request(prompt: Prompt, options: Option<pb::GenerationOptions>, session: String) -> Request {
    let o = options.unwrap_or_default();
    let s = o.sampling.unwrap_or_default();
    Request {
        max_tokens: (o.max_tokens != 0).then_some(o.max_tokens as usize),
        sampling: k3_engine::engine::Sampling {
            temperature: s.temperature,
            top_p: if s.top_p == 0.0 {
                k3_engine::engine::Sampling::default().top_p
            } else {
                s.top_p
            },
            top_k: s.top_k as usize,
            seed: s.seed,
        },
        transform: transform(&s),
        stop_ids: o.stop_ids,
        stop_strings: o.stop_strings,
        speculate: (o.speculate != 0).then_some(o.speculate as usize),
        session: (!session.is_empty()).then_some(session),
        ..Request::new(prompt)
    }
}

/// A `Chat` call's core request: its conversation, options and thinking budget.
pub fn chat_request(req: &mut pb::ChatRequest) -> Result<Request, Status> {
    let conversation = conversation(req)?;
    Ok(Request {
        thinking_budget: req
            .thinking_budget
            .map(|n| ThinkingBudget::Tokens(n as usize)),
        ..request(
            Prompt::Chat(conversation),
            req.options.take(),
            std::mem::take(&mut req.session),
        )
    })
}

/// The wire's logit bias and penalties; ids in ascending order (a map has none of its own).
fn transform(s: &pb::Sampling) -> LogitTransform {
    let mut bias: Vec<(u32, f32)> = s.logit_bias.iter().map(|(&id, &b)| (id, b)).collect();
    bias.sort_by_key(|&(id, _)| id);
    LogitTransform {
        bias,
        frequency_penalty: s.frequency_penalty,
        presence_penalty: s.presence_penalty,
    }
}

/// The wire's conversation, tools, tool choice and response format as the chat layer's typed
/// request, thinking on with effort `max` by default. Errors name the message index and field.
pub fn conversation(req: &pb::ChatRequest) -> Result<Conversation, Status> {
    let messages = req
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let thinking_on = match pb::Thinking::try_from(req.thinking) {
        Ok(pb::Thinking::Default | pb::Thinking::On) => true,
        Ok(pb::Thinking::Off) => false,
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "unknown thinking value {}",
                req.thinking
            )));
        }
    };
    let effort = match pb::Effort::try_from(req.effort) {
        Ok(pb::Effort::Default | pb::Effort::Max) => Effort::Max,
        Ok(pb::Effort::Low) => Effort::Low,
        Ok(pb::Effort::High) => Effort::High,
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "unknown effort {} (low, high or max)",
                req.effort
            )));
        }
    };
    Ok(Conversation {
        messages,
        thinking: if thinking_on {
            Thinking::On(Some(effort))
        } else {
            Thinking::Off
        },
        generation_prompt: true,
        tools: req
            .tools
            .iter()
            .enumerate()
            .map(|(i, t)| tool(i, t))
            .collect::<Result<_, _>>()?,
        tool_choice: match (
            pb::ToolChoice::try_from(req.tool_choice),
            req.tool_choice_function.as_str(),
        ) {
            (Ok(pb::ToolChoice::Auto | pb::ToolChoice::Required), name) if !name.is_empty() => {
                ToolChoice::Function(name.to_owned())
            }
            (Ok(pb::ToolChoice::Auto), _) => ToolChoice::Auto,
            (Ok(pb::ToolChoice::None), "") => ToolChoice::None,
            (Ok(pb::ToolChoice::Required), _) => ToolChoice::Required,
            (Ok(pb::ToolChoice::None), _) => {
                return Err(Status::invalid_argument(
                    "tool_choice_function names a function but tool_choice is NONE",
                ));
            }
            (Err(_), _) => {
                return Err(Status::invalid_argument(format!(
                    "unknown tool_choice {}",
                    req.tool_choice
                )));
            }
        },
        response_format: response_format(req)?,
        parallel_tool_calls: !req.single_tool_call,
    })
}

fn message(index: usize, m: &pb::ChatMessage) -> Result<Message, Status> {
    let role = match pb::Role::try_from(m.role) {
        Ok(pb::Role::System) => Role::System,
        Ok(pb::Role::User) => Role::User,
        Ok(pb::Role::Assistant) => Role::Assistant,
        Ok(pb::Role::Tool) => Role::Tool,
        Ok(pb::Role::Unspecified) | Err(_) => {
            return Err(Status::invalid_argument(format!(
                "message {index} has no role (system, user, assistant or tool)"
            )));
        }
    };
    let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_string());
    Ok(Message {
        reasoning: nonempty(&m.reasoning),
        name: nonempty(&m.name),
        tool_calls: m
            .tool_calls
            .iter()
            .map(|c| ToolCall {
                id: c.id.clone(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect(),
        tool_call_id: nonempty(&m.tool_call_id),
        ..Message::new(role, m.content.clone())
    })
}

/// JSON text from the wire; `field` names it in the error.
fn json(field: &str, text: &str) -> Result<serde_json::Value, Status> {
    serde_json::from_str(text).map_err(|e| {
        Status::invalid_argument(k3_engine::echo::bounded(format!(
            "{field} is not JSON: {e}"
        )))
    })
}

fn tool(index: usize, t: &pb::Tool) -> Result<Tool, Status> {
    Ok(Tool {
        name: t.name.clone(),
        description: (!t.description.is_empty()).then(|| t.description.clone()),
        parameters: if t.parameters.is_empty() {
            None
        } else {
            Some(json(&format!("tools[{index}].parameters"), &t.parameters)?)
        },
    })
}

fn response_format(req: &pb::ChatRequest) -> Result<ResponseFormat, Status> {
    let format = match pb::ResponseFormat::try_from(req.response_format) {
        Ok(pb::ResponseFormat::Text) => ResponseFormat::Text,
        Ok(pb::ResponseFormat::JsonObject) => ResponseFormat::JsonObject,
        Ok(pb::ResponseFormat::JsonSchema) if req.json_schema.is_empty() => {
            return Err(Status::invalid_argument(
                "response_format JSON_SCHEMA needs json_schema",
            ));
        }
        Ok(pb::ResponseFormat::JsonSchema) => {
            ResponseFormat::JsonSchema(json("json_schema", &req.json_schema)?)
        }
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "unknown response_format {}",
                req.response_format
            )));
        }
    };
    if !req.json_schema.is_empty() && !matches!(format, ResponseFormat::JsonSchema(_)) {
        return Err(Status::invalid_argument(
            "json_schema is given but response_format is not JSON_SCHEMA",
        ));
    }
    Ok(format)
}

/// The gRPC status of a core refusal or failure.
pub fn status(e: &ServeError) -> Status {
    // Bounded: the message travels in a header (`grpc-message`), which a peer may refuse whole.
    let text = k3_engine::echo::bounded(e.to_string());
    match e {
        ServeError::Invalid(_) => Status::invalid_argument(text),
        ServeError::Busy(_) | ServeError::UidBusy(_) => Status::resource_exhausted(text),
        ServeError::ShuttingDown | ServeError::ModelFailed(_) | ServeError::SessionsLoading => {
            Status::unavailable(text)
        }
        ServeError::Cancelled(_)
        | ServeError::CancelledQueued(_)
        | ServeError::Abandoned
        | ServeError::Shutdown => Status::cancelled(text),
        ServeError::Stalled { .. } => Status::aborted(text),
        ServeError::Session(s) => session_status(s, text),
        ServeError::SessionsUnavailable(_) => Status::failed_precondition(text),
        ServeError::Model(_) => Status::internal(text),
        ServeError::UnknownRequest(_) => Status::not_found(text),
        ServeError::NotYours(_) => Status::permission_denied(text),
    }
}

fn session_status(e: &SessionStoreError, text: String) -> Status {
    match e {
        SessionStoreError::InvalidName(_) => Status::invalid_argument(text),
        SessionStoreError::NotFound(_) => Status::not_found(text),
        SessionStoreError::PermissionDenied { .. } => Status::permission_denied(text),
        SessionStoreError::Busy { .. } => Status::aborted(text),
        // The disk's fault: RESOURCE_EXHAUSTED when it is full (gRPC's code for "the file
        // system is out of space"), else INTERNAL; the text says "could not store" either way.
        e if e.is_out_of_space() => Status::resource_exhausted(text),
        // A quota or the room kept for other users (issue 35 point 6).
        SessionStoreError::Quota { .. } | SessionStoreError::Reserved { .. } => {
            Status::resource_exhausted(text)
        }
        SessionStoreError::File(FileError::Io { .. })
        | SessionStoreError::Dir { .. }
        | SessionStoreError::Dropped(_) => Status::internal(text),
        SessionStoreError::File(_) => Status::failed_precondition(format!(
            "{text}; the file was not loaded (remove it with `k3 sessions rm` as root, or delete the file)"
        )),
    }
}

/// One core event on the wire: an event, or the status that ends the stream.
pub fn event(e: Event) -> Result<pb::Event, Status> {
    let event = match e {
        Event::Queued { position } => pb::event::Event::Queued(pb::Queued { position }),
        Event::Loading(figures) => pb::event::Event::Progress(load_progress(&figures)),
        Event::Prefill { done, total, pass } => prefill_progress(done, total, pass),
        Event::Token { id, piece } => pb::event::Event::Token(pb::Token {
            id,
            text: piece.text,
            channel: channel(piece.channel).into(),
            tool_call: piece.tool_call.map(|d| pb::ToolCallDelta {
                index: count(d.index),
                id: d.start.as_ref().map(|s| s.id.clone()).unwrap_or_default(),
                name: d.start.map(|s| s.name).unwrap_or_default(),
                arguments: d.arguments,
            }),
        }),
        Event::Done(d) => pb::event::Event::Done(done(&d)),
        Event::Failed(e) => return Err(status(&e)),
    };
    Ok(pb::Event { event: Some(event) })
}

/// Prefill progress on the wire: during a layer-major pass, `done` counts its tokens in
/// proportion to the layers run (a 1,000-token prompt is one pass, whose bar should move every
/// layer), and the layers are given as they are.
fn prefill_progress(done: usize, total: usize, pass: Option<PassProgress>) -> pb::event::Event {
    let ahead = pass.map_or(0, |p| p.token_equivalent());
    pb::event::Event::Progress(pb::Progress {
        phase: pb::Phase::Prefill.into(),
        done: (done + ahead) as u64,
        total: total as u64,
        layers_done: pass.map_or(0, |p| p.layers_done as u32),
        layers: pass.map_or(0, |p| p.layers as u32),
        ..pb::Progress::default()
    })
}

/// The serve core's load figures on the wire, with the core's words for them.
pub fn load_progress(f: &LoadFigures) -> pb::Progress {
    pb::Progress {
        phase: pb::Phase::Load.into(),
        done: f.done,
        total: f.total,
        bytes_per_second: f.bytes_per_second,
        eta_seconds: f.eta_seconds,
        text: f.to_string(),
        ..pb::Progress::default()
    }
}

fn channel(c: Channel) -> pb::Channel {
    match c {
        Channel::Text => pb::Channel::Text,
        Channel::Reasoning => pb::Channel::Reasoning,
        Channel::Response => pb::Channel::Response,
        Channel::ToolCall => pb::Channel::ToolCall,
        Channel::Control => pb::Channel::Control,
    }
}

fn done(d: &Done) -> pb::Done {
    let (reason, stop_id, stop_string) = match &d.finish {
        FinishReason::Length => (pb::StopReason::MaxTokens, 0, String::new()),
        FinishReason::EndOfTurn(id) => (pb::StopReason::EndOfTurn, *id, String::new()),
        FinishReason::StopId(id) => (pb::StopReason::StopId, *id, String::new()),
        FinishReason::StopString(text) => (pb::StopReason::StopString, 0, text.clone()),
    };
    let s = &d.summary;
    pb::Done {
        stop_reason: reason.into(),
        stop_id,
        stop_string,
        prompt_tokens: count(s.prompt_tokens),
        generated_tokens: count(s.generated_tokens),
        timings: Some(pb::Timings {
            queued_seconds: d.queued_seconds,
            prefill_seconds: s.prefill_seconds,
            decode_seconds: s.decode_seconds,
        }),
        bytes_read: s.bytes_read,
        bytes_avoided: s.bytes_avoided,
        trailing_text: d.trailing_text.clone(),
        draft_tokens_proposed: count(s.drafts_proposed),
        draft_tokens_accepted: count(s.drafts_accepted),
        reused_prompt_tokens: count(s.reused_tokens),
        tool_calls: d
            .tool_calls
            .iter()
            .map(|c| pb::ToolCall {
                id: c.id.clone(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect(),
        malformed: d.malformed.as_ref().map(|m| pb::MalformedReply {
            error: m.error.clone(),
            raw: m.raw.clone(),
        }),
    }
}

pub fn session_info(s: &SessionInfo) -> pb::SessionInfo {
    pb::SessionInfo {
        name: s.name.clone(),
        owner_uid: s.owner,
        tokens: s.tokens,
        state_bytes: s.state_bytes,
        in_memory: s.in_memory,
        on_disk: s.on_disk,
        in_use_by: s.in_use.unwrap_or(0),
        last_used: s
            .last_used
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
    }
}

pub fn session_figures(f: &SessionFigures) -> pb::SessionFigures {
    pb::SessionFigures {
        count: count(f.count),
        leased: count(f.leased),
        memory_bytes: f.memory_bytes,
        allowance_bytes: f.allowance_bytes,
        dir: f.dir.display().to_string(),
        error: f.error.clone().unwrap_or_default(),
    }
}

/// Token counts on the wire are u32; a count beyond that saturates rather than wraps.
pub fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
