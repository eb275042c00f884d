//! Errors in OpenAI's JSON shape (`{"error": {"message", "type", "param", "code"}}`) with the
//! status the SDKs map to their exception classes (OpenAI's API reference, "Error codes"), or,
//! on the Anthropic routes, in Anthropic's (`{"type": "error", "error": {"type", "message"}}`,
//! [`Anthropic`]) with the same status (issue 15 point 9). `from_serve` is the one place the
//! serve core's refusals and failures become HTTP.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use k3_engine::echo::{Echo, bounded};
use k3_engine::serve::{Invalid, ServeError};
use k3_engine::session::SessionStoreError;
use serde::Serialize;

/// Seconds a client is told to wait before retrying a 429 or 503.
const RETRY_AFTER_SECONDS: u32 = 1;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault (`messages[2].content`), for 400s.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Anthropic's own words for this error, where they differ from ours (its clients read
    /// them: Claude Code offers to compact on "prompt is too long").
    pub anthropic_message: Option<String>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Detail<'a>,
}

#[derive(Serialize)]
struct Detail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: Option<&'static str>,
}

impl ApiError {
    /// Every error goes through here: its message is bounded (a backstop for texts that
    /// quote input formatted elsewhere, such as serde's "invalid type: string …").
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: bounded(message.into()),
            param: None,
            code: None,
            anthropic_message: None,
        }
    }

    /// A 400 naming the field at fault.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.into()),
            ..ApiError::new(StatusCode::BAD_REQUEST, message)
        }
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(StatusCode::UNAUTHORIZED, message)
        }
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    pub fn unknown_model(model: &str, served: &str) -> ApiError {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..ApiError::not_found(format!(
                "the model {} does not exist here; this daemon serves {served:?}, also called \
                 \"Kimi-K3\" (GET /v1/models)",
                Echo(model)
            ))
        }
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body exceeds the limit of {limit} bytes (http_body_limit in the config)"
            ),
        )
    }

    /// The body did not arrive within `--body-timeout` (408).
    pub fn body_timeout(limit: std::time::Duration) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {:.1} s (body_timeout)",
                limit.as_secs_f64()
            ),
        )
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// The serve core refused or failed a request. `param` names the field a 400 is about
    /// when the transport knows it (the core's messages name the value, not our field names).
    pub fn from_serve(e: &ServeError, param: Option<&str>) -> ApiError {
        let message = e.to_string();
        let status = match e {
            ServeError::Invalid(invalid) => {
                if let Some(words) = over_the_prompt_limit(invalid) {
                    return ApiError {
                        param: param.map(str::to_string),
                        code: Some("context_length_exceeded"),
                        anthropic_message: Some(words),
                        ..ApiError::new(StatusCode::BAD_REQUEST, message)
                    };
                }
                return ApiError {
                    param: param.map(str::to_string),
                    ..ApiError::new(StatusCode::BAD_REQUEST, message)
                };
            }
            ServeError::Busy(_) | ServeError::UidBusy(_) => {
                return ApiError {
                    code: Some("queue_full"),
                    ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, message)
                };
            }
            ServeError::ShuttingDown | ServeError::ModelFailed(_) | ServeError::SessionsLoading => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            // 499 is nginx's "client closed request": only a log ever sees it.
            ServeError::Cancelled(_) | ServeError::CancelledQueued(_) | ServeError::Abandoned => {
                StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST)
            }
            // The server ended it, and a client still reads (a stream's error event): a
            // server-side error, to retry once the daemon is back (issue 45.5: it was typed
            // `invalid_request_error`) — OpenAI's `server_error`, Anthropic's
            // `overloaded_error`.
            ServeError::Shutdown => StatusCode::SERVICE_UNAVAILABLE,
            // Only a stream stalls: this is its error event, after its 200.
            ServeError::Stalled { .. } => StatusCode::REQUEST_TIMEOUT,
            ServeError::Session(s) => match s.as_ref() {
                e if e.is_out_of_space() => StatusCode::INSUFFICIENT_STORAGE,
                SessionStoreError::InvalidName(_) => StatusCode::BAD_REQUEST,
                SessionStoreError::NotFound(_) => StatusCode::NOT_FOUND,
                SessionStoreError::PermissionDenied { .. } => StatusCode::FORBIDDEN,
                SessionStoreError::Busy { .. } => StatusCode::CONFLICT,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            },
            ServeError::UnknownRequest(_) => StatusCode::NOT_FOUND,
            ServeError::NotYours(_) => StatusCode::FORBIDDEN,
            ServeError::SessionsUnavailable(_) | ServeError::Model(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        ApiError::new(status, message)
    }

    /// The `type` OpenAI gives each status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// A connection refused by the connection gate before any request was read
    /// (`max_connections_per_peer`).
    pub fn too_many_connections(message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("too_many_connections"),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, message)
        }
    }

    /// The whole HTTP/1.1 response as bytes — status line, `retry-after` as [`Self::respond`]
    /// sets it, `connection: close`, the JSON body — for a connection hyper never serves (one
    /// the connection gate refuses, `net::refusal`).
    pub fn http1_bytes(&self) -> Vec<u8> {
        let body = self.json().to_string();
        let retry = if self.retry_later() {
            format!("retry-after: {RETRY_AFTER_SECONDS}\r\n")
        } else {
            String::new()
        };
        format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\n{retry}connection: close\r\n\
             content-length: {}\r\n\r\n{body}",
            self.status.as_u16(),
            self.status.canonical_reason().unwrap_or(""),
            body.len()
        )
        .into_bytes()
    }

    /// Whether the client is told when to retry (a 429 or 503).
    fn retry_later(&self) -> bool {
        matches!(
            self.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        )
    }

    /// The JSON body alone, for errors that arrive inside an event stream.
    pub fn json(&self) -> serde_json::Value {
        serde_json::to_value(Body {
            error: Detail {
                message: &self.message,
                kind: self.kind(),
                param: self.param.as_deref(),
                code: self.code,
            },
        })
        .unwrap_or_default()
    }

    /// The error in Anthropic's shape: no `param`, so a 400's message starts with the field.
    pub fn anthropic_json(&self) -> serde_json::Value {
        let kind = match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            // Anthropic's name for "try again later" (its own status for it is 529).
            503 => "overloaded_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        };
        let message = match (&self.anthropic_message, &self.param) {
            (Some(words), _) => words.clone(),
            (None, Some(param)) if !param.is_empty() => format!("{param}: {}", self.message),
            (None, _) => self.message.clone(),
        };
        serde_json::json!({"type": "error", "error": {"type": kind, "message": message}})
    }

    /// The response with `body`, telling the client when to retry a 429 or 503.
    fn respond(&self, body: serde_json::Value) -> Response {
        let mut response = (self.status, axum::Json(body)).into_response();
        response.extensions_mut().insert(Reason(match &self.param {
            Some(param) => format!("{param}: {}", self.message),
            None => self.message.clone(),
        }));
        if self.retry_later() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        response
    }
}

/// Anthropic's words for a prompt over `--max-prompt-tokens` (on which Claude Code offers to
/// compact the conversation), for each way the core finds it over: counted after rendering,
/// or refused before by its message or tool count alone. `None`: not over the limit. (OpenAI's
/// code for all of them is `context_length_exceeded`; the message names k3d's own limit.)
fn over_the_prompt_limit(invalid: &Invalid) -> Option<String> {
    let (what, limit) = match invalid {
        Invalid::PromptTooLong { tokens, limit } => {
            return Some(format!(
                "prompt is too long: {tokens} tokens > {limit} maximum (--max-prompt-tokens)"
            ));
        }
        Invalid::TooManyMessages { messages, limit } => (format!("{messages} messages"), limit),
        Invalid::TooManyTools { tools, limit } => (format!("{tools} tools"), limit),
        _ => return None,
    };
    Some(format!(
        "prompt is too long: {what} or more render to over {limit} tokens maximum \
         (--max-prompt-tokens)"
    ))
}

/// Why a request was refused, carried on the response for the daemon's log line
/// ([`super::error_log`]): the field at fault and the message the client was sent.
#[derive(Clone)]
pub struct Reason(pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.respond(self.json())
    }
}

/// An error answered in Anthropic's shape (the `/v1/messages` routes).
#[derive(Debug)]
pub struct Anthropic(pub ApiError);

impl From<ApiError> for Anthropic {
    fn from(e: ApiError) -> Anthropic {
        Anthropic(e)
    }
}

impl IntoResponse for Anthropic {
    fn into_response(self) -> Response {
        self.0.respond(self.0.anthropic_json())
    }
}
