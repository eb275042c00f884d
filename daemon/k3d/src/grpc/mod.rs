//! The `k3.v1` gRPC API (`proto/k3/v1/k3.proto`) as a thin mapping onto the serve core:
//! `service` (the calls, the caller's peer credentials), `convert` (protobuf ↔ core types,
//! status codes) and `status` (the Status reply). No rule lives here: the core validates,
//! admits and runs every request. The socket it is served on and the connection gate are
//! `net`'s; the daemon (`daemon.rs`) serves it.

pub mod convert;
mod service;
mod status;

use k3_engine::serve::Core;
use k3proto::v1::engine_server::EngineServer;
use std::sync::Arc;

/// Largest gRPC message either way. Prompts are at most a few MB of text; anything larger is
/// refused by tonic with a status naming both sizes.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// The `k3.v1.Engine` service, ready for tonic's server.
pub type Engine = EngineServer<service::Service>;

/// The `k3.v1.Engine` service on `core` (`threads`: the engine's, for the Status reply).
pub fn engine(core: Arc<Core>, threads: usize) -> Engine {
    EngineServer::new(service::Service { core, threads })
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}
