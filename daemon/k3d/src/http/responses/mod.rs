//! OpenAI's Responses API (issue 34 point 2): `POST /v1/responses`, streamed or whole, the API
//! current Codex speaks (only it: Codex refuses `wire_api = "chat"`). A thin mapping onto the
//! same serve core as the chat-completions route: the same conversation renders the same prompt
//! and gets the same reply.

pub mod request;
