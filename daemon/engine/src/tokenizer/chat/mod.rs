//! The K3 chat template, XTML (spec §8), and the reader of its replies (§8.4).
//!
//! * the typed request — messages (system, user, assistant with reasoning and tool
//!   calls, tool results), tools, `tool_choice`, `response_format`, thinking and effort — onto
//!   which an OpenAI chat-completions request maps field for field;
//! * [`render`](render()) and [`segments`]: the request as segments (spec §8.1), each encoded on its own —
//!   control segments with added tokens recognised, text segments never — and the ids
//!   concatenated, in the order of spec §8.2: tool declaration, effort note, the conversation,
//!   the one-shot notes (`tool_choice`, `response_format`), the generation prompt;
//! * [`ReplyReader`]: the one reader of generated replies (spec §8.4), id by id: classified
//!   ids, streamed events (reasoning, content, tool-call starts and argument fragments, end)
//!   and the final [`Reply`]; malformed output is reported with its raw text, never repaired.
//!
//! Choices where the spec is silent (docs/chat.md explains each):
//! * `tool_choice: auto` renders no note (§8.2 step 4 has notes for `required` and `none`
//!   only, and auto is what the model does without one); `none` keeps the tools declared and
//!   adds its note; a named function has no template form and is not representable.
//! * The tool-declare `{J}` is the `tools` list in OpenAI's own shape
//!   (`[{"type":"function","function":{…}}]`), keys sorted.
//! * `{S}` of the `json_schema` note is OpenAI's `json_schema.schema`.
//! * Tool results must directly follow the assistant message whose call they answer and name
//!   it by `tool_call_id` (OpenAI's own rule); so ids always allow reordering them to the call
//!   order, and each result's `tool` attribute is its call's function name.
//! * Arguments that parse as JSON but not as an object go raw into the `json` block, like
//!   unparsable ones: only an object has keys to render argument by argument.
//! * Dynamic tool declarations (a system message carrying `tools`) have no OpenAI
//!   counterpart and are not rendered.

mod model;
mod render;
mod reply;
mod template_json;

pub use model::{
    ChatError, Conversation, Effort, Message, ResponseFormat, Role, Thinking, Tool, ToolCall,
    ToolChoice,
};
pub use render::{
    LEAST_IDS_PER_MESSAGE, LEAST_IDS_PER_TOOL, Limited, Prelude, Segment, most_messages,
    most_tools, render, render_limited, render_with_prelude, segments,
};
pub use reply::{
    MalformedReply, Pushed, Reply, ReplyChannel, ReplyError, ReplyEvent, ReplyReader, parse_reply,
};
