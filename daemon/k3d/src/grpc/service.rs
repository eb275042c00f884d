//! The `k3.v1.Engine` gRPC service: protobuf ↔ the serve core's types, the caller's peer
//! credentials, status codes. Runs on tokio; never computes and holds no rule of its own.

use super::{convert, status};
use k3_engine::serve::{Caller, Core, JobHandle, Request as CoreRequest, ServeError};
use k3_engine::tokenizer::Specials;
use k3proto::v1 as pb;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio_stream::Stream;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

pub struct Service {
    pub core: Arc<Core>,
    pub threads: usize,
}

/// A job's events on the wire: Accepted first, then the core's events; a failure ends the
/// stream with its status. Dropping it (the client went away) drops the core's receiver, which
/// abandons the job.
pub struct EventStream {
    accepted: Option<pb::Event>,
    job: Option<JobHandle>,
}

impl Stream for EventStream {
    type Item = Result<pb::Event, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(accepted) = self.accepted.take() {
            return Poll::Ready(Some(Ok(accepted)));
        }
        let Some(job) = self.job.as_mut() else {
            return Poll::Ready(None);
        };
        match job.events.poll_recv(cx) {
            Poll::Ready(Some(event)) => {
                let item = convert::event(event);
                if item.is_err() {
                    self.job = None;
                }
                Poll::Ready(Some(item))
            }
            Poll::Ready(None) => {
                self.job = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

fn peer_uid<T>(req: &Request<T>) -> Option<u32> {
    req.extensions()
        .get::<UdsConnectInfo>()
        .and_then(|c| c.peer_cred)
        .map(|c| c.uid())
}

impl Service {
    /// Submits a job; its stream starts with Accepted. Submission validates, and so tokenises
    /// and renders the prompt: off the RPC workers.
    async fn admit(
        &self,
        uid: Option<u32>,
        request: CoreRequest,
    ) -> Result<Response<EventStream>, Status> {
        let job = self
            .off_runtime(move |core| {
                let caller = uid.map_or(Caller::Unknown, Caller::Uid);
                core.submit(caller, request)
                    .map_err(|e| convert::status(&e))
            })
            .await?;
        let accepted = pb::Event {
            event: Some(pb::event::Event::Accepted(pb::Accepted {
                request_id: job.id,
                prompt_tokens: convert::count(job.prompt_tokens),
            })),
        };
        Ok(Response::new(EventStream {
            accepted: Some(accepted),
            job: Some(job),
        }))
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
        let req = req.into_inner();
        let prompt = convert::prompt(req.prompt)?;
        self.admit(uid, convert::request(prompt, req.options, req.session))
            .await
    }

    async fn chat(&self, req: Request<pb::ChatRequest>) -> Result<Response<EventStream>, Status> {
        let uid = peer_uid(&req);
        let request = convert::chat_request(&mut req.into_inner())?;
        self.admit(uid, request).await
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
            .off_runtime(move |core| {
                core.tokenizer()
                    .encode(&req.text, specials)
                    .map_err(|e| Status::invalid_argument(format!("cannot tokenise: {e}")))
            })
            .await?;
        Ok(Response::new(pb::TokenizeReply { ids }))
    }

    async fn detokenize(
        &self,
        req: Request<pb::DetokenizeRequest>,
    ) -> Result<Response<pb::DetokenizeReply>, Status> {
        let req = req.into_inner();
        let bytes = self
            .off_runtime(move |core| {
                core.tokenizer()
                    .decode(&req.ids)
                    .map_err(|e| Status::invalid_argument(format!("cannot detokenise: {e}")))
            })
            .await?;
        Ok(Response::new(pb::DetokenizeReply {
            text: String::from_utf8_lossy(&bytes).into_owned(),
        }))
    }

    async fn status(
        &self,
        _req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusReply>, Status> {
        Ok(Response::new(status::reply(
            &self.core.status(),
            self.threads,
        )))
    }

    async fn cancel(
        &self,
        req: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelReply>, Status> {
        let uid = peer_uid(&req);
        let id = req.into_inner().request_id;
        self.core.cancel(id, uid).map_err(|e| convert::status(&e))?;
        log!(
            "request {id}: cancel from uid {}",
            k3_engine::serve::uid_text(uid)
        );
        Ok(Response::new(pb::CancelReply {}))
    }

    async fn list_sessions(
        &self,
        req: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsReply>, Status> {
        let uid = peer_uid(&req);
        self.blocking(move |core| {
            Ok(pb::ListSessionsReply {
                sessions: core
                    .sessions()
                    .list(uid)?
                    .iter()
                    .map(convert::session_info)
                    .collect(),
            })
        })
        .await
    }

    async fn delete_session(
        &self,
        req: Request<pb::DeleteSessionRequest>,
    ) -> Result<Response<pb::DeleteSessionReply>, Status> {
        let uid = peer_uid(&req);
        let name = req.into_inner().name;
        self.blocking(move |core| {
            core.sessions()
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
        self.blocking(move |core| {
            let saved = core.sessions().save(&name, uid)?;
            Ok(pb::SaveSessionReply {
                session: Some(convert::session_info(&saved.info)),
                path: saved.path.display().to_string(),
                written: saved.written,
            })
        })
        .await
    }
}

impl Service {
    /// Runs session bookkeeping that may touch the disk off the RPC workers.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Core) -> Result<T, ServeError> + Send + 'static,
    ) -> Result<Response<T>, Status> {
        self.off_runtime(move |core| f(core).map_err(|e| convert::status(&e)))
            .await
            .map(Response::new)
    }

    /// Runs `f` on tokio's blocking pool. The runtime has two workers: tokenising a 16 MiB
    /// text (Tokenize, or a prompt at submission) or touching the disk takes long enough on a
    /// worker to stall every other call it serves, Status and Cancel included.
    async fn off_runtime<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Core) -> Result<T, Status> + Send + 'static,
    ) -> Result<T, Status> {
        let core = Arc::clone(&self.core);
        match tokio::task::spawn_blocking(move || f(&core)).await {
            Ok(result) => result,
            Err(e) => Err(Status::internal(format!("the request's task failed: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k3proto::v1::engine_server::Engine;
    use std::sync::Mutex;

    /// A service on the tiny synthetic model's tokenizer (the model is never loaded).
    fn service(dir: &std::path::Path) -> Service {
        let shape = k3_engine::synth::shape::Shape::named("tiny").expect("the tiny shape");
        let plan = k3_engine::synth::blueprint(&shape).expect("plan");
        let model = dir.join("model");
        k3_engine::synth::write(&plan, &model, 0, false, &mut |_| {}).expect("synth");
        let config = k3_engine::serve::Config::new(model, dir.join("sessions"));
        Service {
            core: Arc::new(Core::new(config).expect("core")),
            threads: 1,
        }
    }

    /// A huge Tokenize yields its RPC worker while it tokenises: on one worker, a Status that
    /// arrives behind it is answered first. (Tokenising on the worker, the call ran to its end
    /// before anything else on that worker was polled.)
    #[tokio::test(flavor = "current_thread")]
    async fn a_huge_tokenize_leaves_the_worker_to_other_calls() {
        let dir = tempfile::tempdir().expect("scratch");
        let svc = service(dir.path());
        let text = "the quick brown fox, 123 jumps! ".repeat((4 << 20) / 32);
        let order = Mutex::new(Vec::new());
        let tokenize = async {
            let reply = svc
                .tokenize(Request::new(pb::TokenizeRequest {
                    text,
                    allow_special: false,
                }))
                .await;
            order.lock().expect("order").push("tokenize");
            reply
        };
        let status = async {
            let reply = svc.status(Request::new(pb::StatusRequest {})).await;
            order.lock().expect("order").push("status");
            reply
        };
        let (tokenized, status) = tokio::join!(tokenize, status);
        assert!(!tokenized.expect("tokenize").into_inner().ids.is_empty());
        assert!(status.is_ok());
        assert_eq!(*order.lock().expect("order"), ["status", "tokenize"]);
    }
}
