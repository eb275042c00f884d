//! `Chat` requests to prompt ids: the wire's conversation, tools, tool choice and response
//! format become the chat layer's typed request, rendered with the K3 template (spec §8.2),
//! thinking on with effort `max` by default. The chat layer's errors name the message index
//! and field.

use k3_engine::tokenizer::Tokenizer;
use k3_engine::tokenizer::chat::{
    self, Conversation, Effort, Message, ResponseFormat, Role, Thinking, Tool, ToolCall, ToolChoice,
};
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
            "the conversation ends with an assistant message; the last must be user, system or tool",
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
        tools: req
            .tools
            .iter()
            .enumerate()
            .map(|(i, t)| tool(i, t))
            .collect::<Result<_, _>>()?,
        tool_choice: match pb::ToolChoice::try_from(req.tool_choice) {
            Ok(pb::ToolChoice::Auto) => ToolChoice::Auto,
            Ok(pb::ToolChoice::None) => ToolChoice::None,
            Ok(pb::ToolChoice::Required) => ToolChoice::Required,
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "unknown tool_choice {}",
                    req.tool_choice
                )));
            }
        },
        response_format: response_format(req)?,
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
    serde_json::from_str(text)
        .map_err(|e| Status::invalid_argument(format!("{field} is not JSON: {e}")))
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
