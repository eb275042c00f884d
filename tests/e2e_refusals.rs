//! What a real `k3d serve` refuses over gRPC and how it says so: a full queue, malformed
//! requests and bodies that are not protobuf (the daemon stays up), huge inputs quoted cut
//! short, and refusals counted as rejected, never as failed.

#[path = "e2e_support.rs"]
mod support;

use k3proto::v1 as pb;
use std::time::Duration;
use support::*;
use tokio_stream::StreamExt;

#[tokio::test]
async fn a_full_queue_refuses_with_resource_exhausted() {
    let (_d, mut c) = ready_daemon("busy", &["--max-queue", "1", "--max-active", "1"]).await;
    // Wait until it computes, so the next one queues rather than starts.
    let running = computing(&mut c, prompt(0)).await;
    let mut waiting = c
        .generate(ids_request(prompt(1), 4))
        .await
        .expect("second is queued")
        .into_inner();
    let mut position = None;
    while position.is_none() {
        if let Some(pb::event::Event::Queued(q)) =
            waiting.next().await.expect("event").expect("ok").event
        {
            position = Some(q.position);
        }
    }
    assert_eq!(position, Some(1));
    let err = c
        .generate(ids_request(prompt(2), 4))
        .await
        .expect_err("third is refused");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(err.message().contains("busy"), "{}", err.message());
    drop(running);
    let second = collect(waiting).await;
    assert!(
        second.error.is_none(),
        "the queued request runs once the slot frees: {:?}",
        second.error
    );
    assert_eq!(second.ids.len(), 4);
}

#[tokio::test]
async fn malformed_requests_get_clear_statuses_and_the_daemon_stays_up() {
    let (d, mut c) = ready_daemon("malformed", &[]).await;
    let ready = wait_ready(&mut c).await;
    let baseline = generate(&mut c, ids_request(prompt(3), 5)).await.ids;

    let empty = c
        .generate(ids_request(vec![], 5))
        .await
        .expect_err("empty prompt");
    assert_eq!(empty.code(), tonic::Code::InvalidArgument);
    assert!(empty.message().contains("empty"), "{}", empty.message());

    let none = c
        .generate(pb::GenerateRequest {
            prompt: None,
            options: None,
            session: String::new(),
        })
        .await
        .expect_err("no prompt");
    assert_eq!(none.code(), tonic::Code::InvalidArgument);

    // An id beyond the vocabulary: refused at submission, before any compute (the serve core
    // validates every rule before queueing).
    let err = c
        .generate(ids_request(vec![1, u32::MAX - 1], 5))
        .await
        .expect_err("id out of range is an error");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("vocabulary"), "{}", err.message());

    // `max_tokens` is a ceiling, clamped to the daemon's cap (issue 34.4), never refused: an
    // absurd one starts generating like any other.
    let mut clamped = c
        .generate(ids_request(prompt(0), u32::MAX))
        .await
        .expect("an absurd max_tokens is clamped, not refused")
        .into_inner();
    let first = clamped.message().await.expect("a first event");
    assert!(first.is_some(), "the stream ended at once");
    drop(clamped);

    let mut bad = ids_request(prompt(0), 5);
    bad.options.as_mut().expect("options").sampling = Some(pb::Sampling {
        temperature: f32::NAN,
        ..Default::default()
    });
    let err = c
        .generate(bad)
        .await
        .expect_err("NaN temperature is an error");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("temperature"), "{}", err.message());

    // Logit bias and penalties: OpenAI's ranges, refused naming the field; a +100 bias makes
    // greedy take that id every time.
    let mut biased = ids_request(prompt(0), 4);
    let sampling = |bias: f32, presence: f32| pb::Sampling {
        logit_bias: [(7, bias)].into_iter().collect(),
        presence_penalty: presence,
        ..Default::default()
    };
    biased.options.as_mut().expect("options").sampling = Some(sampling(100.0, 0.0));
    let out = collect(
        c.generate(biased.clone())
            .await
            .expect("biased")
            .into_inner(),
    )
    .await;
    assert_eq!(out.ids, vec![7; 4], "{:?}", out.error);
    for (bias, presence, field) in [(100.5, 0.0, "logit_bias"), (1.0, 2.5, "presence_penalty")] {
        biased.options.as_mut().expect("options").sampling = Some(sampling(bias, presence));
        let err = c.generate(biased.clone()).await.expect_err(field);
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains(field), "{}", err.message());
    }

    let chat = c
        .chat(pb::ChatRequest::default())
        .await
        .expect_err("no messages");
    assert_eq!(chat.code(), tonic::Code::InvalidArgument);

    // Over the 16 MiB message limit.
    let huge = pb::GenerateRequest {
        prompt: Some(pb::generate_request::Prompt::Text("x".repeat(17 << 20))),
        options: None,
        session: String::new(),
    };
    let err = c.generate(huge).await.expect_err("oversized message");
    assert!(
        matches!(
            err.code(),
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
        ),
        "{err:?}"
    );
    assert!(
        err.message().contains("too large") || err.message().contains("length"),
        "{}",
        err.message()
    );

    let err = c
        .detokenize(pb::DetokenizeRequest {
            ids: vec![u32::MAX],
        })
        .await
        .expect_err("bad id");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    // Garbage on the socket: that connection dies, nothing else notices.
    {
        use std::io::{Read, Write};
        let mut raw = std::os::unix::net::UnixStream::connect(&d.socket).expect("raw connect");
        raw.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let _ = raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\xff\xfe garbage garbage\r\n");
        let mut sink = Vec::new();
        let _ = raw.read_to_end(&mut sink);
    }
    let after = generate(&mut client(&d.socket).await, ids_request(prompt(3), 5)).await;
    assert!(after.error.is_none(), "{:?}", after.error);
    assert_eq!(
        after.ids, baseline,
        "requests after all the bad ones are unaffected"
    );
    let s = status(&mut c).await;
    assert_eq!(s.state, "ready");
    assert_eq!(s.model, ready.model);
}

/// A gRPC codec that sends its bytes as they are: a message body no protobuf decoder accepts.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        buf: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(buf, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(buf);
        Ok(Some(bytes::Buf::copy_to_bytes(buf, n).to_vec()))
    }
}

/// A body that is not protobuf is the caller's fault (`INVALID_ARGUMENT`), not a model failure
/// (`INTERNAL`, which `k3` reports as "the model failed"), on unary and streaming calls alike.
#[tokio::test]
async fn a_request_that_is_not_protobuf_is_invalid_argument() {
    let (d, mut c) = ready_daemon("not_protobuf", &[]).await;
    let mut grpc = tonic::client::Grpc::new(channel(&d.socket).await);
    // Field 1, length-delimited, then a length varint that never ends.
    let garbage = vec![0x0a, 0xff, 0xff, 0xff];
    for method in [
        "/k3.v1.Engine/Tokenize",
        "/k3.v1.Engine/Generate",
        "/k3.v1.Engine/Cancel",
    ] {
        grpc.ready().await.expect("channel ready");
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(method);
        let err = if method.ends_with("Generate") {
            grpc.server_streaming(tonic::Request::new(garbage.clone()), path, RawCodec)
                .await
                .map(|_| ())
                .expect_err("garbage generate")
        } else {
            grpc.unary(tonic::Request::new(garbage.clone()), path, RawCodec)
                .await
                .map(|_| ())
                .expect_err("garbage unary call")
        };
        assert_eq!(
            err.code(),
            tonic::Code::InvalidArgument,
            "{method}: {err:?}"
        );
        assert!(
            err.message().contains("not a valid"),
            "{method}: {}",
            err.message()
        );
    }
    assert_eq!(status(&mut c).await.state, "ready", "the daemon stays up");
}

/// Errors quote what they refuse, but a bounded excerpt of it: a 100 KB session name is
/// refused as an invalid argument (before, quoting it whole overflowed the reply's header and
/// the client saw a transport error instead of the refusal).
#[tokio::test]
async fn an_error_quotes_a_huge_input_cut_short_with_its_length() {
    let (_d, mut c) = ready_daemon("huge_echo", &[]).await;
    let name = "n".repeat(100_000);
    let mut req = ids_request(prompt(0), 2);
    req.session = name.clone();
    let err = c.generate(req).await.expect_err("invalid session name");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    let msg = err.message();
    assert!(msg.contains("invalid session name"), "{msg}");
    assert!(msg.contains("… (100000 bytes)"), "{msg}");
    assert!(msg.len() < 512, "{} bytes: {msg}", msg.len());

    let err = c
        .delete_session(pb::DeleteSessionRequest { name: name.clone() })
        .await
        .expect_err("invalid session name");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().len() < 512, "{}", err.message().len());

    // A conversation quoting a 100 KB tool-call id it does not know.
    let chat = pb::ChatRequest {
        messages: vec![
            pb::ChatMessage {
                role: pb::Role::User.into(),
                content: "hi".into(),
                ..Default::default()
            },
            pb::ChatMessage {
                role: pb::Role::Assistant.into(),
                tool_calls: vec![pb::ToolCall {
                    id: "call_0".into(),
                    name: "f".into(),
                    arguments: "{}".into(),
                }],
                ..Default::default()
            },
            pb::ChatMessage {
                role: pb::Role::Tool.into(),
                content: "result".into(),
                tool_call_id: name,
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let err = c.chat(chat).await.expect_err("unknown tool call id");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("… (100000 bytes)"),
        "{}",
        err.message()
    );
    assert!(err.message().len() < 512, "{}", err.message().len());
}

/// Refused requests (nothing computed) are counted as rejected, never as failed: `failed` is
/// the model's (or the storage's) failures only, which an operator alerts on.
#[tokio::test]
async fn refusals_are_counted_as_rejected_not_failed() {
    let (_d, mut c) =
        ready_daemon("refusal_counts", &["--max-active", "1", "--max-queue", "0"]).await;
    let before = status(&mut c).await;
    let mut bad_session = ids_request(prompt(0), 2);
    bad_session.session = "..".into();
    let mut many_stops = ids_request(prompt(0), 2);
    many_stops.options.as_mut().expect("options").stop_strings = vec!["x".into(); 17];
    let refused = [
        ids_request(vec![], 2),
        many_stops,
        ids_request(vec![u32::MAX - 1], 2),
        bad_session,
    ];
    let n = refused.len() as u64;
    for req in refused {
        let err = c.generate(req).await.expect_err("refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    }
    let err = c
        .chat(pb::ChatRequest::default())
        .await
        .expect_err("no messages");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    let ok = generate(&mut c, ids_request(prompt(1), 2)).await;
    assert!(ok.error.is_none(), "{:?}", ok.error);
    // The one compute slot taken and no queue: the next request is refused as busy.
    let running = computing(&mut c, prompt(2)).await;
    let err = c
        .generate(ids_request(prompt(3), 2))
        .await
        .expect_err("queue full");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    drop(running);
    let after = status(&mut c).await;
    assert_eq!(after.requests_failed, before.requests_failed, "{after:?}");
    assert_eq!(after.requests_rejected, before.requests_rejected + n + 2);
    assert_eq!(after.requests_completed, before.requests_completed + 1);
}
