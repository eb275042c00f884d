//! `k3d serve` generating over gRPC, end to end (a real daemon on a real Unix socket): a warm
//! second request, Cancel and a dropped stream stopping the compute, concurrent and batched
//! requests each equal to their solo run, `--max-batch`, and chat's channels and tools.

#[path = "e2e_support.rs"]
mod support;

use k3proto::v1 as pb;
use std::time::{Duration, Instant};
use support::*;
use tokio_stream::StreamExt;

#[tokio::test]
async fn loads_once_and_the_second_request_is_warm() {
    let (d, mut c) = ready_daemon("warm", &[]).await;
    let ready = wait_ready(&mut c).await;
    assert!(ready.model.is_some(), "status names the model");
    let first = generate(&mut c, ids_request(prompt(0), 8)).await;
    let t = Instant::now();
    let second = generate(&mut c, ids_request(prompt(0), 8)).await;
    let warm = t.elapsed();
    assert!(
        first.error.is_none() && second.error.is_none(),
        "{first:?} {second:?}"
    );
    assert_eq!(first.ids.len(), 8);
    assert_eq!(first.ids, second.ids, "greedy output is reproducible");
    let done = second.done.expect("Done event");
    assert_eq!(done.generated_tokens, 8);
    assert_eq!(
        done.bytes_read, 0,
        "a warm request re-reads no resident weight"
    );
    assert!(matches!(
        second.events.first(),
        Some(pb::event::Event::Accepted(_))
    ));
    // The daemon's memory plan, pinned layers and expert cache, as the engine reports them.
    let s = status(&mut c).await;
    assert!(s.plan.starts_with("memory plan"), "{}", s.plan);
    let n = s.pinned_layers.len() as u32;
    assert!(n > 0 && s.pinned_layers == (0..n).collect::<Vec<_>>());
    assert!(
        s.plan.contains(&format!("{n} of {n} layers pinned")),
        "{}",
        s.plan
    );
    let cache = s.cache.expect("cache figures");
    assert!(cache.capacity_bytes > 0);
    assert_eq!(
        cache.used_bytes, cache.capacity_bytes,
        "the default (max) plan holds every expert"
    );
    assert!(cache.hits > 0, "{cache:?}");
    assert_eq!(
        d.log_text().matches("] loaded ").count(),
        1,
        "the model is loaded once:\n{}",
        d.log_text()
    );
    eprintln!("warm request of 8 tokens: {warm:?}");
}

#[tokio::test]
async fn cancel_stops_a_generation_in_the_middle() {
    let (d, mut c) = ready_daemon("cancel", &[]).await;
    // Warm up once so every thread the daemon keeps exists before counting.
    assert!(
        generate(&mut c, ids_request(prompt(9), 2))
            .await
            .error
            .is_none()
    );
    let threads_before = threads(&d);
    let mut latencies = Vec::new();
    for round in 0..5 {
        let mut stream = c
            .generate(ids_request(prompt(round), 4000))
            .await
            .expect("accepted")
            .into_inner();
        let mut id = None;
        let mut tokens = 0;
        while tokens < 3 {
            match stream.next().await.expect("event").expect("no error").event {
                Some(pb::event::Event::Accepted(a)) => id = Some(a.request_id),
                Some(pb::event::Event::Token(_)) => tokens += 1,
                _ => {}
            }
        }
        let t = Instant::now();
        c.cancel(pb::CancelRequest {
            request_id: id.expect("accepted first"),
        })
        .await
        .expect("cancel");
        let rest = collect(stream).await;
        latencies.push(t.elapsed());
        let err = rest.error.expect("the stream ends with an error status");
        assert_eq!(err.code(), tonic::Code::Cancelled, "{err:?}");
        assert!(rest.done.is_none());
        assert!(rest.ids.len() < 3990, "the generation stopped early");
    }
    latencies.sort();
    eprintln!(
        "cancel latency (Cancel sent → stream closed), median of 5: {:?}, max {:?}",
        latencies[2], latencies[4]
    );
    assert!(latencies[4] < Duration::from_secs(2), "{latencies:?}");
    // Cancelling something finished is NOT_FOUND; nothing is left running.
    let s = status(&mut c).await;
    assert_eq!(s.active_requests, 0);
    assert_eq!(s.requests_cancelled, 5);
    assert_eq!(
        threads(&d),
        threads_before,
        "cancelled requests leave no threads behind"
    );
    let err = c
        .cancel(pb::CancelRequest { request_id: 1 })
        .await
        .expect_err("finished");
    assert_eq!(err.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn a_dropped_stream_stops_its_compute() {
    let (_d, mut c) = ready_daemon("drop", &[]).await;
    let mut stream = c
        .generate(ids_request(prompt(1), 4000))
        .await
        .expect("accepted")
        .into_inner();
    let mut tokens = 0;
    while tokens < 2 {
        if let Some(pb::event::Event::Token(_)) =
            stream.next().await.expect("event").expect("ok").event
        {
            tokens += 1;
        }
    }
    let t = Instant::now();
    drop(stream);
    loop {
        let s = status(&mut c).await;
        if s.active_requests == 0 {
            assert_eq!(s.requests_cancelled, 1);
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "compute still running after the client left"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    eprintln!("dropped stream → compute stopped within {:?}", t.elapsed());
}

#[tokio::test]
async fn sixteen_concurrent_clients_get_what_they_get_alone() {
    let (d, mut c) = ready_daemon(
        "concurrent",
        // One account (root) sends all 16: the test is of the slots, not of their fair share.
        &[
            "--max-queue",
            "16",
            "--max-active",
            "4",
            "--max-active-per-uid",
            "4",
            "--max-queued-per-uid",
            "16",
        ],
    )
    .await;
    let requests: Vec<_> = (0..16).map(|i| ids_request(prompt(i), 12)).collect();
    let alone = solo_ids(&mut c, &requests).await;
    let mut queued_seen = false;
    for r in concurrently_as_alone(&d.socket, &requests, &alone).await {
        queued_seen |= r
            .events
            .iter()
            .any(|e| matches!(e, pb::event::Event::Queued(_)));
    }
    assert!(
        queued_seen,
        "with 4 compute slots some of 16 clients must have been queued"
    );
}

/// Batched decoding (issue 7 item 4): four concurrent requests with different prompt lengths
/// (one longer than a prefill chunk) are stepped through shared forward passes — Status shows
/// passes serving all four — and each gets exactly the ids it gets alone.
#[tokio::test]
async fn four_concurrent_batched_requests_each_equal_their_solo_runs() {
    let (d, mut c) = ready_daemon(
        "batched",
        &[
            "--max-active",
            "4",
            "--max-batch",
            "4",
            "--max-active-per-uid",
            "4",
        ],
    )
    .await;
    let prompts: Vec<Vec<u32>> = vec![
        prompt(1),
        (0..45).map(|i| 3 + (i * 7) % 90).collect(),
        vec![77],
        prompt(2).repeat(3),
    ];
    let lengths = [160, 120, 200, 140];
    let requests: Vec<_> = prompts
        .into_iter()
        .zip(lengths)
        .map(|(p, n)| ids_request(p, n))
        .collect();
    let alone = solo_ids(&mut c, &requests).await;
    for (ids, n) in alone.iter().zip(lengths) {
        assert_eq!(ids.len(), n as usize);
    }
    let before = wait_ready(&mut c).await;
    assert_eq!(before.max_batch, 4);
    assert_eq!(before.widest_batch, 1, "solo runs are passes of one");
    concurrently_as_alone(&d.socket, &requests, &alone).await;
    let after = wait_ready(&mut c).await;
    assert_eq!(after.widest_batch, 4, "a pass served all four requests");
    assert!(
        after.batched_passes > before.batched_passes + 50,
        "most steps were shared: {} batched passes of {}",
        after.batched_passes - before.batched_passes,
        after.forward_passes - before.forward_passes
    );
}

/// `--max-batch` caps how many requests share a pass; the others wait their turn (first in the
/// next round) and every output is still exactly as alone.
#[tokio::test]
async fn max_batch_caps_the_requests_per_pass() {
    let (d, mut c) = ready_daemon(
        "batch-cap",
        &[
            "--max-active",
            "4",
            "--max-batch",
            "2",
            "--max-active-per-uid",
            "4",
        ],
    )
    .await;
    let requests: Vec<_> = (0..4).map(|i| ids_request(prompt(i), 100)).collect();
    let alone = solo_ids(&mut c, &requests).await;
    concurrently_as_alone(&d.socket, &requests, &alone).await;
    let status = wait_ready(&mut c).await;
    assert_eq!(status.max_batch, 2);
    assert_eq!(
        status.widest_batch, 2,
        "never more than --max-batch per pass"
    );
    assert!(status.batched_passes > 0);
}

/// Threads of the daemon process right now.
fn threads(d: &Daemon) -> usize {
    std::fs::read_dir(format!("/proc/{}/task", d.child.id()))
        .expect("/proc/PID/task")
        .count()
}

#[tokio::test]
async fn chat_labels_each_token_with_its_channel() {
    let (_d, mut c) = ready_daemon("chat", &[]).await;
    let conversation = |thinking: pb::Thinking| pb::ChatRequest {
        messages: vec![
            pb::ChatMessage {
                role: pb::Role::System.into(),
                content: "You are helpful.".into(),
                ..Default::default()
            },
            pb::ChatMessage {
                role: pb::Role::User.into(),
                content: "Hello".into(),
                ..Default::default()
            },
        ],
        thinking: thinking.into(),
        effort: pb::Effort::Default.into(),
        options: Some(pb::GenerationOptions {
            max_tokens: 16,
            ..Default::default()
        }),
        session: String::new(),
        ..Default::default()
    };
    for thinking in [pb::Thinking::On, pb::Thinking::Off] {
        let r = collect(
            c.chat(conversation(thinking))
                .await
                .expect("chat accepted")
                .into_inner(),
        )
        .await;
        assert!(r.error.is_none(), "{:?}", r.error);
        let channels: Vec<pb::Channel> = r
            .events
            .iter()
            .filter_map(|e| match e {
                pb::event::Event::Token(t) => {
                    Some(pb::Channel::try_from(t.channel).expect("known channel"))
                }
                _ => None,
            })
            .collect();
        assert!(!channels.is_empty());
        assert!(
            !channels.contains(&pb::Channel::Text),
            "chat tokens carry chat channels"
        );
        if thinking == pb::Thinking::Off {
            assert!(!channels.contains(&pb::Channel::Reasoning));
        } else {
            // Until the model writes structure, the reply is in the think channel.
            assert_ne!(channels.first(), Some(&pb::Channel::Response));
        }
        let done = r.done.expect("done");
        if done.stop_reason == pb::StopReason::EndOfTurn as i32 {
            assert!(done.stop_id != 0);
        }
    }
}

/// Chat with tools: tools, tool_choice, response_format, an assistant's tool calls and tool
/// results all reach the template (each adds to the rendered prompt), mistakes in them are
/// INVALID_ARGUMENT naming the message and field, and a reply's streamed tool-call deltas add
/// up to Done's tool calls.
#[tokio::test]
async fn chat_renders_tools_and_names_bad_fields() {
    let (_d, mut c) = ready_daemon("chat-tools", &[]).await;
    let message = |role: pb::Role, content: &str| pb::ChatMessage {
        role: role.into(),
        content: content.into(),
        ..Default::default()
    };
    let history = || {
        let mut assistant = message(pb::Role::Assistant, "");
        assistant.tool_calls = vec![
            pb::ToolCall {
                id: "a".into(),
                name: "get_weather".into(),
                arguments: r#"{"city": "Paris"}"#.into(),
            },
            pb::ToolCall {
                id: "b".into(),
                name: "now".into(),
                arguments: "{}".into(),
            },
        ];
        let result = |id: &str, content: &str| pb::ChatMessage {
            tool_call_id: id.into(),
            ..message(pb::Role::Tool, content)
        };
        vec![
            message(pb::Role::User, "weather?"),
            assistant,
            result("b", "noon"),
            result("a", "sunny"),
        ]
    };
    let base = pb::ChatRequest {
        messages: history(),
        thinking: pb::Thinking::Off.into(),
        options: Some(pb::GenerationOptions {
            max_tokens: 8,
            ..Default::default()
        }),
        ..Default::default()
    };
    let tools = pb::ChatRequest {
        tools: vec![pb::Tool {
            name: "get_weather".into(),
            description: "Weather of a city".into(),
            parameters: r#"{"type": "object", "properties": {"city": {"type": "string"}}}"#.into(),
        }],
        ..base.clone()
    };
    // A forced call needs room for its tags: fewer is refused naming max_tokens (issue 45.4).
    let required = pb::ChatRequest {
        tool_choice: pb::ToolChoice::Required.into(),
        options: Some(pb::GenerationOptions {
            max_tokens: 40,
            ..Default::default()
        }),
        ..tools.clone()
    };
    let schema = pb::ChatRequest {
        response_format: pb::ResponseFormat::JsonSchema.into(),
        json_schema: r#"{"type": "object"}"#.into(),
        ..required.clone()
    };
    let mut prompt_tokens = Vec::new();
    for request in [base.clone(), tools.clone(), required.clone(), schema] {
        let r = collect(c.chat(request).await.expect("chat accepted").into_inner()).await;
        assert!(r.error.is_none(), "{:?}", r.error);
        let accepted = r.events.iter().find_map(|e| match e {
            pb::event::Event::Accepted(a) => Some(a.prompt_tokens),
            _ => None,
        });
        prompt_tokens.push(accepted.expect("accepted"));
        let done = r.done.expect("done");
        for (i, call) in done.tool_calls.iter().enumerate() {
            let streamed: String = r
                .events
                .iter()
                .filter_map(|e| match e {
                    pb::event::Event::Token(pb::Token {
                        tool_call: Some(d), ..
                    }) if d.index as usize == i => Some(d.arguments.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(streamed, call.arguments);
        }
    }
    assert!(
        prompt_tokens.windows(2).all(|w| w[0] < w[1]),
        "each construct adds to the prompt: {prompt_tokens:?}"
    );

    let refused = |request: pb::ChatRequest| {
        let mut c = c.clone();
        async move {
            let status = match c.chat(request).await {
                Err(status) => status,
                Ok(stream) => collect(stream.into_inner()).await.error.expect("refused"),
            };
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
            status.message().to_owned()
        }
    };
    let mut unknown = base.clone();
    unknown.messages[3].tool_call_id = "zz".into();
    assert!(refused(unknown).await.contains("messages[3].tool_call_id"));
    // OpenAI's types give `name` to every role but tool (an assistant's is not rendered).
    let mut named = base.clone();
    named.messages[3].name = "bot".into();
    assert!(refused(named).await.contains("messages[3].name"));
    let nothing = pb::ChatRequest {
        tool_choice: pb::ToolChoice::Required.into(),
        ..base.clone()
    };
    assert!(refused(nothing).await.contains("tool_choice"));
    let mut bad_parameters = tools.clone();
    bad_parameters.tools[0].parameters = "{oops".into();
    assert!(
        refused(bad_parameters)
            .await
            .contains("tools[0].parameters is not JSON")
    );
    let no_schema = pb::ChatRequest {
        response_format: pb::ResponseFormat::JsonSchema.into(),
        ..base
    };
    assert!(refused(no_schema).await.contains("json_schema"));
}
