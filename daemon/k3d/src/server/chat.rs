//! `Chat` requests to prompt ids: the wire's conversation becomes the tokenizer's messages and
//! is rendered with the K3 template (spec §8.2), thinking on with effort `max` by default.

use k3_engine::tokenizer::Tokenizer;
use k3_engine::tokenizer::chat::{self, Conversation, Effort, Message, Role, Thinking};
use k3proto::v1 as pb;
use tonic::Status;

pub struct Rendered {
    pub ids: Vec<u32>,
    /// Whether the reply opens in the think channel.
    pub thinking: bool,
}

pub fn render(tokenizer: &Tokenizer, req: &pb::ChatRequest) -> Result<Rendered, Status> {
    if req.messages.is_empty() {
        return Err(Status::invalid_argument("the conversation has no messages"));
    }
    let messages = req
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    if matches!(messages.last().map(|m| m.role), Some(Role::Assistant)) {
        return Err(Status::invalid_argument(
            "the conversation ends with an assistant message; the last must be user or system",
        ));
    }
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
    let conversation = Conversation {
        messages,
        thinking: if thinking_on {
            Thinking::On(Some(effort))
        } else {
            Thinking::Off
        },
        generation_prompt: true,
        ..Conversation::default()
    };
    let ids = chat::render(tokenizer, &conversation)
        .map_err(|e| Status::invalid_argument(format!("cannot render the conversation: {e}")))?;
    Ok(Rendered {
        ids,
        thinking: thinking_on,
    })
}

fn message(index: usize, m: &pb::ChatMessage) -> Result<Message, Status> {
    let role = match pb::Role::try_from(m.role) {
        Ok(pb::Role::System) => Role::System,
        Ok(pb::Role::User) => Role::User,
        Ok(pb::Role::Assistant) => Role::Assistant,
        Ok(pb::Role::Unspecified) | Err(_) => {
            return Err(Status::invalid_argument(format!(
                "message {index} has no role (system, user or assistant)"
            )));
        }
    };
    let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_string());
    Ok(Message {
        reasoning: nonempty(&m.reasoning),
        name: nonempty(&m.name),
        ..Message::new(role, m.content.clone())
    })
}
