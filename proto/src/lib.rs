//! The `k3.v1` gRPC API: generated messages, the `Engine` server trait and client.
//! The contract lives in `proto/k3/v1/k3.proto`; read it for field semantics.
pub mod v1 {
    tonic::include_proto!("k3.v1");
}

pub mod codec;
pub mod socket;
