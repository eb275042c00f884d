//! The `k3.v1.Engine` gRPC service: turns requests into jobs for the scheduler and answers the
//! cheap calls (tokenizer, status, cancel) directly. Runs on tokio; never computes.

use super::admission::{Job, Kind, Shared};
use super::scheduler::uid_text;
use super::sessions::Sessions;
use super::{chat, convert, status};
use k3_engine::tokenizer::Specials;
use k3_engine::tokenizer::Tokenizer;
use k3proto::v1 as pb;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

/// Events buffered per stream: small, so a client that stops reading is noticed quickly and
/// holds little memory (rust-stack §3).
const STREAM_BUFFER: usize = 8;
/// Largest prompt accepted, in tokens (text is tokenised first). The gRPC message size limit
/// (`MAX_MESSAGE_BYTES`) bounds it too.
const MAX_PROMPT_TOKENS: usize = 1 << 20;

pub type EventStream = ReceiverStream<Result<pb::Event, Status>>;

pub struct Service {
    pub shared: Arc<Shared>,
    /// The model's tokenizer, loaded before serving so tokenizer calls and text prompts work
    /// while the engine is still loading.
    pub tokenizer: Tokenizer,
    pub threads: usize,
    /// Draft ids per speculative step for requests that leave it 0 (`--speculate`).
    pub speculate: usize,
    pub sessions: Arc<Sessions>,
}

fn peer_uid<T>(req: &Request<T>) -> Option<u32> {
    req.extensions()
        .get::<UdsConnectInfo>()
        .and_then(|c| c.peer_cred)
        .map(|c| c.uid())
}

impl Service {
    /// `Generate` for any transport: `uid` is the caller's (SO_PEERCRED), `None` when unknown.
    pub fn generate_events(
        &self,
        uid: Option<u32>,
        req: pb::GenerateRequest,
    ) -> Result<EventStream, Status> {
        let prompt = match req.prompt {
            Some(pb::generate_request::Prompt::Ids(ids)) => ids.ids,
            Some(pb::generate_request::Prompt::Text(text)) => {
                self.tokenizer.encode(&text, Specials::Plain).map_err(|e| {
                    Status::invalid_argument(format!("cannot tokenise the prompt: {e}"))
                })?
            }
            None => return Err(Status::invalid_argument("no prompt: give text or ids")),
        };
        self.admit(
            "Generate",
            uid,
            prompt,
            req.options,
            Kind::Text,
            req.session,
        )
    }

    /// `Chat` for any transport (see `generate_events`).
    pub fn chat_events(
        &self,
        uid: Option<u32>,
        req: pb::ChatRequest,
    ) -> Result<EventStream, Status> {
        let rendered = chat::render(&self.tokenizer, &req)?;
        let kind = Kind::Chat {
            thinking: rendered.thinking,
        };
        // The reply ends where the model ends its turn (spec §8.4).
        let mut options = req.options.unwrap_or_default();
        options.stop_ids.extend(self.tokenizer.end_of_turn_ids());
        self.admit("Chat", uid, rendered.ids, Some(options), kind, req.session)
    }

    /// Admit a generation: its stream starts with Accepted, then the scheduler takes over.
    fn admit(
        &self,
        rpc: &str,
        uid: Option<u32>,
        prompt: Vec<u32>,
        options: Option<pb::GenerationOptions>,
        kind: Kind,
        session: String,
    ) -> Result<EventStream, Status> {
        if prompt.is_empty() {
            return Err(Status::invalid_argument("the prompt is empty"));
        }
        if prompt.len() > MAX_PROMPT_TOKENS {
            return Err(Status::invalid_argument(format!(
                "the prompt has {} tokens; at most {MAX_PROMPT_TOKENS} are accepted",
                prompt.len()
            )));
        }
        let request = convert::request(prompt, options, self.speculate)?;
        let id = self.shared.next_id();
        let session = (!session.is_empty()).then_some(session);
        if let Some(name) = &session {
            // Before Accepted: a session another uid owns, or one in use, is refused outright.
            self.sessions.reserve(name, uid, id)?;
        }
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let accepted = pb::Event {
            event: Some(pb::event::Event::Accepted(pb::Accepted {
                request_id: id,
                prompt_tokens: convert::count(request.prompt.len()),
            })),
        };
        // A fresh channel has room: this cannot fail.
        let _ = tx.try_send(Ok(accepted));
        log!(
            "request {id}: {rpc} from uid {} ({} prompt tokens, max {} new{})",
            uid_text(uid),
            request.prompt.len(),
            request.max_tokens,
            session
                .as_ref()
                .map_or_else(String::new, |n| format!(", session {n:?}"))
        );
        let mut job = Job::new(id, request, kind, tx, uid);
        job.session = session.clone();
        if let Err(status) = self.shared.submit(job) {
            log!("request {id} refused: {}", status.message());
            if let Some(name) = &session {
                self.sessions.release(name);
            }
            return Err(status);
        }
        Ok(ReceiverStream::new(rx))
    }
}

#[tonic::async_trait]
impl pb::engine_server::Engine for Service {
    type GenerateStream = EventStream;
    type ChatStream = EventStream;

    async fn generate(
        &self,
        req: Request<pb::GenerateRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let uid = peer_uid(&req);
        self.generate_events(uid, req.into_inner())
            .map(Response::new)
    }

    async fn chat(&self, req: Request<pb::ChatRequest>) -> Result<Response<EventStream>, Status> {
        let uid = peer_uid(&req);
        self.chat_events(uid, req.into_inner()).map(Response::new)
    }

    async fn tokenize(
        &self,
        req: Request<pb::TokenizeRequest>,
    ) -> Result<Response<pb::TokenizeReply>, Status> {
        let req = req.into_inner();
        let specials = if req.allow_special {
            Specials::Recognised
        } else {
            Specials::Plain
        };
        let ids = self
            .tokenizer
            .encode(&req.text, specials)
            .map_err(|e| Status::invalid_argument(format!("cannot tokenise: {e}")))?;
        Ok(Response::new(pb::TokenizeReply { ids }))
    }

    async fn detokenize(
        &self,
        req: Request<pb::DetokenizeRequest>,
    ) -> Result<Response<pb::DetokenizeReply>, Status> {
        let req = req.into_inner();
        let bytes = self
            .tokenizer
            .decode(&req.ids)
            .map_err(|e| Status::invalid_argument(format!("cannot detokenise: {e}")))?;
        Ok(Response::new(pb::DetokenizeReply {
            text: String::from_utf8_lossy(&bytes).into_owned(),
        }))
    }

    async fn status(
        &self,
        _req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusReply>, Status> {
        Ok(Response::new(status::reply(
            &self.shared,
            self.threads,
            self.sessions.figures(),
        )))
    }

    async fn cancel(
        &self,
        req: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelReply>, Status> {
        let uid = peer_uid(&req);
        let id = req.into_inner().request_id;
        if self.shared.cancel(id) {
            log!("request {id}: cancel from uid {}", uid_text(uid));
            Ok(Response::new(pb::CancelReply {}))
        } else {
            Err(Status::not_found(format!(
                "no queued or running request {id} (it may have finished)"
            )))
        }
    }

    async fn list_sessions(
        &self,
        req: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsReply>, Status> {
        let uid = peer_uid(&req);
        let sessions = Arc::clone(&self.sessions);
        blocking(move || sessions.list(uid)).await
    }

    async fn delete_session(
        &self,
        req: Request<pb::DeleteSessionRequest>,
    ) -> Result<Response<pb::DeleteSessionReply>, Status> {
        let uid = peer_uid(&req);
        let name = req.into_inner().name;
        let sessions = Arc::clone(&self.sessions);
        blocking(move || {
            sessions
                .delete(&name, uid)
                .map(|()| pb::DeleteSessionReply {})
        })
        .await
    }

    async fn save_session(
        &self,
        req: Request<pb::SaveSessionRequest>,
    ) -> Result<Response<pb::SaveSessionReply>, Status> {
        let uid = peer_uid(&req);
        let name = req.into_inner().name;
        let sessions = Arc::clone(&self.sessions);
        blocking(move || sessions.save(&name, uid)).await
    }
}

/// Runs session bookkeeping that may touch the disk off the RPC workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<Response<T>, Status> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map(Response::new),
        Err(e) => Err(Status::internal(format!("session task failed: {e}"))),
    }
}
