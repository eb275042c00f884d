//! The incremental reply reader (spec §8.4): scripted replies built with the tiny tokenizer give
//! exact events and tool calls; malformed ones are reported with their raw text; arbitrary id
//! sequences never panic.

mod tokenizer_support;

use std::sync::OnceLock;

use k3_engine::tokenizer::chat::{
    Conversation, Message, ReplyChannel, ReplyError, ReplyEvent, ReplyReader, Role, Thinking,
    ToolCall, parse_reply, render,
};
use k3_engine::tokenizer::{Specials, Tokenizer};
use tokenizer_support::fixtures;

fn tiny() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::load(&fixtures().join("tiny")).expect("tiny"))
}

/// A reply written in the template's own notation: `<|open|>` etc. become their ids, the
/// rest is text (how the model's output looks once decoded).
fn script(s: &str) -> Vec<u32> {
    tiny().encode(s, Specials::Recognised).unwrap()
}

/// Pushes every id; returns the events with adjacent text pieces of one kind merged, and the
/// reader.
fn read(ids: &[u32], thinking: bool) -> (Vec<ReplyEvent>, Vec<ReplyChannel>, ReplyReader<'static>) {
    let mut reader = ReplyReader::new(tiny(), thinking);
    let mut events: Vec<ReplyEvent> = Vec::new();
    let mut channels = Vec::new();
    for &id in ids {
        let pushed = reader.push(id);
        channels.push(pushed.channel);
        for event in pushed.events {
            match (events.last_mut(), event) {
                (Some(ReplyEvent::Reasoning(a)), ReplyEvent::Reasoning(b))
                | (Some(ReplyEvent::Content(a)), ReplyEvent::Content(b)) => a.push_str(&b),
                (
                    Some(ReplyEvent::ToolCallArguments { index: i, fragment }),
                    ReplyEvent::ToolCallArguments {
                        index,
                        fragment: more,
                    },
                ) if *i == index => fragment.push_str(&more),
                (_, event) => events.push(event),
            }
        }
    }
    (events, channels, reader)
}

const WEATHER: &str = "let me check 中<|close|>think<|sep|><|open|>response<|sep|>On it.\
    <|close|>response<|sep|><|open|>tools<|sep|>\
    <|open|>call tool=\"get_weather\" index=\"1\"<|sep|>\
    <|open|>argument key=\"city\" type=\"string\"<|sep|>Pa\"ris\n<|close|>argument<|sep|>\
    <|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|>\
    <|open|>argument key=\"opts\" type=\"object\"<|sep|>{\"a\": [true, null]}<|close|>argument<|sep|>\
    <|close|>call<|sep|>\
    <|open|>call tool=\"n&amp;w\" index=\"2\"<|sep|><|close|>call<|sep|>\
    <|open|>call tool=\"raw\" index=\"3\"<|sep|><|open|>json type=\"object\"<|sep|>{\"x\":1}\
    <|close|>json<|sep|><|close|>call<|sep|>\
    <|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";

#[test]
fn a_scripted_reply_gives_exact_events_and_tool_calls() {
    let ids = script(WEATHER);
    let (events, channels, reader) = read(&ids, true);
    let start = |index: usize, name: &str| ReplyEvent::ToolCallStart {
        index,
        id: format!("call_{index}"),
        name: name.into(),
    };
    let args = |index: usize, fragment: &str| ReplyEvent::ToolCallArguments {
        index,
        fragment: fragment.into(),
    };
    let eom = tiny().controls().end_of_msg;
    assert_eq!(
        events,
        [
            ReplyEvent::Reasoning("let me check 中".into()),
            ReplyEvent::Content("On it.".into()),
            start(0, "get_weather"),
            args(
                0,
                r#"{"city":"Pa\"ris\n","days":3,"opts":{"a": [true, null]}}"#
            ),
            start(1, "n&w"),
            args(1, "{}"),
            start(2, "raw"),
            args(2, r#"{"x":1}"#),
            ReplyEvent::End { end_id: eom },
        ]
    );
    let reply = reader.finish().unwrap();
    assert_eq!(reply.reasoning.as_deref(), Some("let me check 中"));
    assert_eq!(reply.content, "On it.");
    assert_eq!(reply.end_id, Some(eom));
    let call = |id: &str, name: &str, arguments: &str| ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
    };
    assert_eq!(
        reply.tool_calls,
        [
            call(
                "call_0",
                "get_weather",
                r#"{"city":"Pa\"ris\n","days":3,"opts":{"a": [true, null]}}"#
            ),
            call("call_1", "n&w", "{}"),
            call("call_2", "raw", r#"{"x":1}"#),
        ]
    );
    // Every id is classified: text by its channel, the rest as structure.
    let picked = |want: ReplyChannel| -> String {
        let ids: Vec<u32> = ids
            .iter()
            .zip(&channels)
            .filter(|(_, c)| **c == want)
            .map(|(id, _)| *id)
            .collect();
        tiny().decode_text(&ids).unwrap()
    };
    assert_eq!(picked(ReplyChannel::Reasoning), "let me check 中");
    assert_eq!(picked(ReplyChannel::Content), "On it.");
    assert_eq!(
        picked(ReplyChannel::ToolCall),
        "Pa\"ris\n3{\"a\": [true, null]}{\"x\":1}"
    );
}

#[test]
fn text_is_released_as_whole_utf8_only() {
    // The tiny vocabulary splits CJK into single bytes: no piece may hold a broken character.
    let ids = script(
        "思考中<|close|>think<|sep|><|open|>response<|sep|>答え<|close|>response<|sep|>\
         <|close|>message<|sep|>[EOS]",
    );
    assert!(ids.len() > 20, "multi-byte characters span several ids");
    let mut reader = ReplyReader::new(tiny(), true);
    let mut pieces = Vec::new();
    for &id in &ids {
        for event in reader.push(id).events {
            match event {
                ReplyEvent::Reasoning(t) | ReplyEvent::Content(t) => pieces.push(t),
                _ => {}
            }
        }
    }
    assert!(
        pieces
            .iter()
            .all(|p| !p.is_empty() && !p.contains('\u{fffd}'))
    );
    assert_eq!(pieces.concat(), "思考中答え");
    let reply = reader.finish().unwrap();
    assert_eq!(reply.end_id, Some(tiny().controls().eos));
}

#[test]
fn an_instruct_reply_has_no_reasoning() {
    let ids = script("hi<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>");
    let reply = parse_reply(tiny(), &ids, false).unwrap();
    assert_eq!(reply.reasoning, None);
    assert_eq!(reply.content, "hi");
    assert!(reply.tool_calls.is_empty());
    // Control strings typed as text stay text.
    let mut ids = tiny().encode("<|open|>x", Specials::Plain).unwrap();
    ids.extend(script(
        "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>",
    ));
    assert_eq!(
        parse_reply(tiny(), &ids, false).unwrap().content,
        "<|open|>x"
    );
    // Empty channels are well-formed: reasoning is then Some(""), not None.
    let ids = script(
        "<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>\
         <|close|>message<|sep|>[EOS]",
    );
    let reply = parse_reply(tiny(), &ids, true).unwrap();
    assert_eq!(
        (reply.reasoning.as_deref(), reply.content.as_str()),
        (Some(""), "")
    );
}

#[test]
fn a_rendered_turn_with_tool_calls_reads_back_as_the_same_message() {
    let t = tiny();
    let mut message = Message::new(Role::Assistant, "calling");
    message.reasoning = Some("why".into());
    message.tool_calls = vec![ToolCall {
        id: "call_0".into(),
        name: "f".into(),
        arguments: r#"{"s":"a\"b","n":-1.5,"b":false,"z":null,"l":[1, "x"],"o":{}}"#.into(),
    }];
    for thinking in [Thinking::On(None), Thinking::Off] {
        let prompt = render(
            t,
            &Conversation {
                thinking,
                generation_prompt: true,
                ..Conversation::default()
            },
        )
        .unwrap();
        let full = render(
            t,
            &Conversation {
                messages: vec![message.clone()],
                thinking,
                ..Conversation::default()
            },
        )
        .unwrap();
        assert_eq!(full[..prompt.len()], prompt[..]);
        let reply = parse_reply(t, &full[prompt.len()..], thinking.is_on()).unwrap();
        let back = reply.into_message();
        assert_eq!(back.content, message.content);
        assert_eq!(back.tool_calls[0].name, "f");
        // Argument text is re-serialised; as JSON it is the same value.
        let json = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        assert_eq!(
            json(&back.tool_calls[0].arguments),
            json(&message.tool_calls[0].arguments)
        );
        assert_eq!(back.reasoning.as_deref(), thinking.is_on().then_some("why"));
        // And re-renders to the same ids.
        let again = render(
            t,
            &Conversation {
                messages: vec![back],
                thinking,
                ..Conversation::default()
            },
        )
        .unwrap();
        assert_eq!(again, full);
    }
}

/// The error of a malformed reply, checking that it was reported exactly once as an event,
/// that everything after it is `Control`, and that the raw text is the whole output.
fn malformed(text: &str, thinking: bool) -> ReplyError {
    let ids = script(text);
    let (events, channels, reader) = read(&ids, thinking);
    let reported: Vec<&ReplyError> = events
        .iter()
        .filter_map(|e| match e {
            ReplyEvent::Malformed(e) => Some(e),
            _ => None,
        })
        .collect();
    let failure = reader.finish().expect_err(text);
    assert_eq!(
        failure.raw, text,
        "raw text is everything the model produced"
    );
    match reported.as_slice() {
        [] => assert!(matches!(failure.error, ReplyError::Truncated { .. })),
        [one] => {
            assert_eq!(**one, failure.error);
            let at = match one {
                ReplyError::ControlInPayload { position, .. }
                | ReplyError::Unexpected { position, .. }
                | ReplyError::BadTag { position, .. }
                | ReplyError::BadToolCall { position, .. }
                | ReplyError::UnknownId { position, .. }
                | ReplyError::Trailing { position, .. }
                | ReplyError::Truncated { position, .. } => *position,
            };
            assert!(channels[at..].iter().all(|c| *c == ReplyChannel::Control));
        }
        more => panic!("reported {} times: {more:?}", more.len()),
    }
    failure.error
}

const END: &str = "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>";

#[test]
fn malformed_replies_are_reported_not_repaired() {
    let e = malformed(&format!("a<|sep|>b{END}"), false);
    assert!(matches!(
        e,
        ReplyError::ControlInPayload {
            position: 1,
            channel: "response",
            ..
        }
    ));
    let e = malformed("a<|close|>think<|sep|>", false);
    assert!(
        matches!(
            e,
            ReplyError::BadTag {
                expected: "response",
                ..
            }
        ),
        "{e}"
    );
    let e = malformed(&format!("r<|close|>think<|sep|>x{END}"), true);
    assert!(matches!(e, ReplyError::Unexpected { .. }), "{e}");
    let e = malformed(&format!("a{END}z"), false);
    assert!(matches!(e, ReplyError::Trailing { .. }), "{e}");
    let e = malformed(
        "a<|close|>response<|sep|><|close|>message<|sep|><|open|>",
        false,
    );
    assert!(matches!(e, ReplyError::Unexpected { .. }), "{e}");
    // Stopped early (max_tokens): truncated, with what was read so far.
    let e = malformed("some reasoning", true);
    assert!(matches!(
        e,
        ReplyError::Truncated {
            expected: "<|close|> ending the think channel",
            ..
        }
    ));
    let ids = script("r<|close|>think<|sep|><|open|>response<|sep|>half");
    let failure = parse_reply(tiny(), &ids, true).unwrap_err();
    assert_eq!(
        (
            failure.partial.reasoning.as_deref(),
            failure.partial.content.as_str()
        ),
        (Some("r"), "half")
    );
    // A control id inside a tag.
    let e = malformed(&format!("a<|close|>resp<|open|>onse<|sep|>{END}"), false);
    assert!(
        matches!(e, ReplyError::ControlInPayload { channel: "tag", .. }),
        "{e}"
    );
}

const TOOLS: &str = "<|close|>response<|sep|><|open|>tools<|sep|>";
const TOOLS_END: &str = "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";

fn tool_error(calls: &str) -> String {
    let e = malformed(&format!("{TOOLS}{calls}{TOOLS_END}"), false);
    assert!(
        matches!(
            e,
            ReplyError::BadToolCall { .. } | ReplyError::BadTag { .. }
        ),
        "{e}"
    );
    e.to_string()
}

#[test]
fn malformed_tool_calls_are_reported_with_the_reason() {
    let arg = |key: &str, ty: &str, value: &str| {
        format!(
            "<|open|>argument key=\"{key}\" type=\"{ty}\"<|sep|>{value}<|close|>argument<|sep|>"
        )
    };
    let call =
        |attrs: &str, body: &str| format!("<|open|>call {attrs}<|sep|>{body}<|close|>call<|sep|>");
    let ok = "tool=\"f\" index=\"1\"";
    assert!(tool_error(&call("tool=\"f\" index=\"2\"", "")).contains("index=\"2\""));
    assert!(tool_error(&call("index=\"1\" tool=\"f\"", "")).contains("tool=\"…\" index"));
    assert!(tool_error(&call("tool=\"\" index=\"1\"", "")).contains("empty"));
    assert!(tool_error(&call(ok, &arg("n", "number", "abc"))).contains("is not JSON"));
    assert!(tool_error(&call(ok, &arg("n", "number", "true"))).contains("is boolean"));
    assert!(tool_error(&call(ok, &arg("n", "integer", "1"))).contains("unknown type"));
    assert!(
        tool_error(&call(
            ok,
            &format!("{}{}", arg("k", "string", "a"), arg("k", "string", "b"))
        ))
        .contains("twice")
    );
    let json = |raw: &str| format!("<|open|>json type=\"object\"<|sep|>{raw}<|close|>json<|sep|>");
    assert!(tool_error(&call(ok, &json("[1]"))).contains("not a JSON object"));
    assert!(tool_error(&call(ok, &json("{bad"))).contains("not a JSON object"));
    assert!(
        tool_error(&call(
            ok,
            &format!("{}{}", arg("k", "string", "a"), json("{}"))
        ))
        .contains("only content")
    );
    // After a json block only the call's end may follow.
    tool_error(&call(
        ok,
        &format!("{}{}", json("{}"), arg("k", "string", "a")),
    ));
    // Not a call at all, or a bad attribute syntax.
    tool_error("<|open|>cal tool=\"f\" index=\"1\"<|sep|><|close|>call<|sep|>");
    tool_error(&call("tool=f index=\"1\"", ""));
    tool_error(&call("tool=\"a&b\" index=\"1\"", ""));
}

/// A small deterministic generator (xorshift64*), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Whatever ids arrive, the reader never panics; a reply it accepts has arguments that are JSON
/// objects, and its events add up to its final fields.
#[test]
fn arbitrary_id_sequences_never_panic() {
    let t = tiny();
    let good = script(WEATHER);
    // Ids worth hitting often: the controls, the tag and attribute ids of a real reply, and
    // ids outside the vocabulary.
    let mut pool: Vec<u32> = good.clone();
    pool.extend([t.vocab_size() as u32, u32::MAX]);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut accepted = 0;
    for round in 0..4000 {
        let ids: Vec<u32> = if round % 2 == 0 {
            // Random sequences over the pool and the whole vocabulary.
            let len = rng.below(60);
            (0..len)
                .map(|_| match rng.below(4) {
                    0 => rng.below(t.vocab_size() + 4) as u32,
                    _ => pool[rng.below(pool.len())],
                })
                .collect()
        } else {
            // A well-formed reply with a few ids replaced, deleted or inserted.
            let mut ids = good.clone();
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(ids.len());
                match rng.below(3) {
                    0 => ids[at] = pool[rng.below(pool.len())],
                    1 => {
                        ids.remove(at);
                    }
                    _ => ids.insert(at, pool[rng.below(pool.len())]),
                }
            }
            ids
        };
        let thinking = rng.below(2) == 0;
        let (events, _, reader) = read(&ids, thinking);
        if let Ok(reply) = reader.finish() {
            accepted += 1;
            let content: String = events
                .iter()
                .filter_map(|e| match e {
                    ReplyEvent::Content(s) => Some(s.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(content, reply.content);
            for (i, call) in reply.tool_calls.iter().enumerate() {
                let value: serde_json::Value = serde_json::from_str(&call.arguments)
                    .unwrap_or_else(|e| panic!("{ids:?}: call {i}: {e}: {}", call.arguments));
                assert!(value.is_object());
                let streamed: String = events
                    .iter()
                    .filter_map(|e| match e {
                        ReplyEvent::ToolCallArguments { index, fragment } if *index == i => {
                            Some(fragment.as_str())
                        }
                        _ => None,
                    })
                    .collect();
                assert_eq!(streamed, call.arguments);
            }
        }
    }
    // Some mutations keep the reply well-formed (e.g. a changed text id), so both paths ran.
    assert!(accepted > 0);
}
