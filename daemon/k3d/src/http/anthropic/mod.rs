//! Anthropic's Messages API (issue 15 point 9): `POST /v1/messages`, streamed or whole, and
//! `POST /v1/messages/count_tokens`, so that agents which speak only Anthropic's API (Claude
//! Code) can use k3d. A thin mapping onto the same serve core as the OpenAI routes, sharing
//! their keys, limits, prefix reuse by caller and metrics by endpoint; errors come in
//! Anthropic's shape with the same statuses. The `anthropic-version` header is accepted and not
//! checked: the mapping follows the one version of the API there is.

mod message;
pub mod messages_body;

use super::body::Fields;
use super::error::{Anthropic, ApiError};
use super::stream::{Route, Timer, submit};
use super::{App, prepare, reserve};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use k3_engine::serve::Caller;
use std::sync::Arc;
use std::time::Instant;

const MESSAGES: Route = Route {
    endpoint: "POST /v1/messages",
    prompt_field: "messages",
    stop_field: "stop_sequences",
    chat: true,
};

/// `POST /v1/messages`.
pub async fn messages(app: Arc<App>, request: Request) -> Result<Response, Anthropic> {
    let arrived = Instant::now();
    let caller = request.extensions().get::<Caller>().cloned();
    let (reservation, bytes) = reserve(&app, caller.as_ref(), request).await?;
    let (shape, show_thinking, reader) =
        prepare(&app, reservation, bytes, move |app, turn, bytes| {
            let submitted = submit(app, turn, caller, &MESSAGES, bytes, |fields| {
                let parsed = messages_body::messages(fields)?;
                Ok((parsed.submission, parsed.show_thinking))
            });
            Ok::<_, Anthropic>(submitted?)
        })
        .await?;
    let head = message::MessageHead {
        id: format!("msg_{}", reader.request_id),
        request: reader.request_id,
        model: shape.model,
        show_thinking,
    };
    Ok(message::respond(app, head, reader, shape.stream, Timer::new(arrived)).await?)
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens"}`, the rendered prompt's length — what
/// `/v1/messages` reports as `input_tokens` plus `cache_read_input_tokens` for the same body.
/// Held to the same limits as a request (issue 35 point 2): a place in the queue before the
/// body is read, a preparation turn to render it, `--max-prompt-tokens`.
pub async fn count_tokens(app: Arc<App>, request: Request) -> Result<Response, Anthropic> {
    let caller = request.extensions().get::<Caller>().cloned();
    let (reservation, bytes) = reserve(&app, caller.as_ref(), request).await?;
    let tokens = prepare(&app, reservation, bytes, move |app, turn, bytes| {
        let fields = Fields::parse(&bytes, app.core.limits().max_prompt_tokens)?;
        let (model, conversation) = messages_body::count_tokens(&fields)?;
        drop(fields);
        drop(bytes);
        app.check_model(&model)?;
        app.core
            .count_tokens(turn, conversation)
            .map_err(|e| Anthropic(ApiError::from_serve(&e, MESSAGES.param(&e, "max_tokens"))))
    })
    .await?;
    Ok(axum::Json(serde_json::json!({"input_tokens": tokens})).into_response())
}
