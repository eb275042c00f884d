//! OpenAI's Responses API (issue 34 point 2): `POST /v1/responses`, streamed or whole, the API
//! current Codex speaks (only it: Codex refuses `wire_api = "chat"`). A thin mapping onto the
//! same serve core as the chat-completions route, sharing its keys, limits, prefix reuse by
//! caller, metrics and error shape: the same conversation renders the same prompt and gets the
//! same reply. k3d keeps no responses (`store` is accepted and nothing is kept;
//! `previous_response_id` is refused, naming it).

pub mod input;
mod response;

use super::error::ApiError;
use super::stream::{Route, Timer, submit};
use super::{App, prepare, reserve};
use axum::extract::Request;
use axum::response::Response;
use k3_engine::serve::Caller;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

const RESPONSES: Route = Route {
    endpoint: "POST /v1/responses",
    prompt_field: "input",
    // The Responses API has no stop strings.
    stop_field: "stop",
    chat: true,
};

/// `POST /v1/responses`.
pub async fn responses(app: Arc<App>, request: Request) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let caller = request.extensions().get::<Caller>().cloned();
    let (reservation, bytes) = reserve(&app, caller.as_ref(), request).await?;
    let (shape, echoed, reader) = prepare(&app, reservation, bytes, move |app, turn, bytes| {
        submit(app, turn, caller, &RESPONSES, bytes, |fields| {
            let parsed = input::responses(fields)?;
            if !parsed.hosted_tools.is_empty() {
                log!(
                    "POST /v1/responses: hosted tools not declared to the model (k3d has none): {}",
                    parsed.hosted_tools.join(", ")
                );
            }
            Ok((parsed.submission, parsed.echoed))
        })
    })
    .await?;
    let head = response::ResponseHead {
        request: reader.request_id,
        created_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        shape,
        echoed,
    };
    response::respond(app, head, reader, Timer::new(arrived)).await
}
