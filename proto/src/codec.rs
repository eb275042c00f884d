//! The protobuf codec of the `k3.v1` service: prost's, except that a request that is not a
//! valid message is the caller's fault.
//!
//! tonic-prost answers every decode failure `INTERNAL`, which `k3.v1` reserves for a model that
//! failed while computing; a client sending garbage would be told the model broke. The server
//! is the only side that decodes request messages (`*Request`), so a failure to decode one is
//! answered `INVALID_ARGUMENT`. A reply that does not decode (on the client) keeps `INTERNAL`:
//! the daemon, not the caller, sent it.

use prost::Message;
use std::marker::PhantomData;
use tonic::codec::{BufferSettings, Codec as TonicCodec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// What the generated client and server use in place of `tonic_prost::ProstCodec`.
#[derive(Debug, Clone)]
pub struct Codec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec { _pd: PhantomData }
    }
}

impl<T, U> TonicCodec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestAware<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestAware {
            inner: ProstCodec::<T, U>::raw_decoder(BufferSettings::default()),
        }
    }
}

/// prost's decoder, with decode failures of request messages answered `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct RequestAware<U> {
    inner: ProstDecoder<U>,
}

impl<U: Message + Default> Decoder for RequestAware<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.inner.decode(buf).map_err(|status| refine::<U>(status))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}

/// The status of a message of type `U` that did not decode.
fn refine<U>(status: Status) -> Status {
    if status.code() == Code::Internal && is_request::<U>() {
        Status::invalid_argument(format!(
            "the request is not a valid {}: {}",
            message_name::<U>(),
            status.message()
        ))
    } else {
        status
    }
}

/// The message's name in `k3.v1` (the Rust type's last path segment).
fn message_name<U>() -> &'static str {
    let full = std::any::type_name::<U>();
    full.rsplit("::").next().unwrap_or(full)
}

/// Every message a client sends is named `…Request` in `k3/v1/k3.proto` (and no reply is).
fn is_request<U>() -> bool {
    message_name::<U>().ends_with("Request")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1 as pb;

    #[test]
    fn request_messages_are_told_from_replies() {
        assert!(is_request::<pb::GenerateRequest>());
        assert!(is_request::<pb::ChatRequest>());
        assert!(is_request::<pb::CancelRequest>());
        assert!(!is_request::<pb::Event>());
        assert!(!is_request::<pb::StatusReply>());
        assert_eq!(message_name::<pb::TokenizeRequest>(), "TokenizeRequest");
    }

    #[test]
    fn a_request_that_does_not_decode_is_invalid_a_reply_internal() {
        let failed = || Status::internal("failed to decode Protobuf message: buffer underflow");
        let req = refine::<pb::GenerateRequest>(failed());
        assert_eq!(req.code(), Code::InvalidArgument);
        assert!(
            req.message().contains("GenerateRequest"),
            "{}",
            req.message()
        );
        assert!(
            req.message().contains("buffer underflow"),
            "{}",
            req.message()
        );
        assert_eq!(refine::<pb::Event>(failed()).code(), Code::Internal);
    }
}
