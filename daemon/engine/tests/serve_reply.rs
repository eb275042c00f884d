//! The serve core's reply reader (spec §8.4): every generated id gets its channel and its text,
//! tool calls stream as OpenAI-style deltas and arrive whole at the end, a reply cut short is
//! not malformed, and a broken one is reported with its raw text.

mod tokenizer_support;

use std::sync::OnceLock;

use k3_engine::serve::{Channel, Kind, TokenReader};
use k3_engine::tokenizer::{Specials, Tokenizer};
use tokenizer_support::fixtures;

fn tiny() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::load(&fixtures().join("tiny")).expect("tiny"))
}

/// A reply written in the template's own notation (`<|open|>` etc. become their ids).
fn script(s: &str) -> Vec<u32> {
    tiny().encode(s, Specials::Recognised).expect("encode")
}

/// The text of the ids in `want`.
fn text_of(reader: &mut TokenReader<'_>, ids: &[u32], want: Channel) -> String {
    ids.iter()
        .map(|&id| reader.read(id))
        .filter(|p| p.channel == want)
        .map(|p| p.text)
        .collect()
}

#[test]
fn a_thinking_reply_splits_into_reasoning_response_and_control() {
    let ids = script(
        "ab<|close|>think<|sep|><|open|>response<|sep|>cd\
         <|close|>response<|sep|><|close|>message<|sep|>",
    );
    let kind = Kind::Chat { thinking: true };
    let picked = |want| text_of(&mut TokenReader::new(tiny(), kind), &ids, want);
    assert_eq!(picked(Channel::Reasoning), "ab");
    assert_eq!(picked(Channel::Response), "cd");
    assert_eq!(
        picked(Channel::Control),
        "<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|close|>message<|sep|>"
    );
    let mut reader = TokenReader::new(tiny(), kind);
    for &id in &ids {
        reader.read(id);
    }
    let ending = reader.finish(Some(tiny().controls().end_of_msg));
    assert_eq!(ending.malformed, None);
    assert!(ending.tool_calls.is_empty());
}

#[test]
fn plain_continuations_are_text_throughout() {
    let ids = script("hi<|sep|>there");
    let mut reader = TokenReader::new(tiny(), Kind::Text);
    let pieces: Vec<_> = ids.iter().map(|&id| reader.read(id)).collect();
    assert!(
        pieces
            .iter()
            .all(|p| p.channel == Channel::Text && p.tool_call.is_none())
    );
    let text: String = pieces.iter().map(|p| p.text.as_str()).collect();
    assert_eq!(text, "hi<|sep|>there");
    // A stop id of a plain continuation is not read as an end of turn.
    let ending = reader.finish(None);
    assert_eq!(ending.malformed, None);
}

#[test]
fn tool_calls_stream_as_deltas_and_arrive_whole_at_the_end() {
    let ids = script(
        "<|close|>response<|sep|><|open|>tools<|sep|>\
         <|open|>call tool=\"f\" index=\"1\"<|sep|>\
         <|open|>argument key=\"a\" type=\"number\"<|sep|>12<|close|>argument<|sep|>\
         <|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>",
    );
    let mut reader = TokenReader::new(tiny(), Kind::Chat { thinking: false });
    let pieces: Vec<_> = ids.iter().map(|&id| reader.read(id)).collect();
    let deltas: Vec<_> = pieces.iter().filter_map(|p| p.tool_call.as_ref()).collect();
    let start = deltas[0]
        .start
        .as_ref()
        .expect("the first delta starts the call");
    assert_eq!((start.id.as_str(), start.name.as_str()), ("call_0", "f"));
    assert!(deltas.iter().all(|d| d.index == 0));
    assert!(deltas[1..].iter().all(|d| d.start.is_none()));
    let arguments: String = deltas.iter().map(|d| d.arguments.as_str()).collect();
    assert_eq!(arguments, r#"{"a":12}"#);
    let value: String = pieces
        .iter()
        .filter(|p| p.channel == Channel::ToolCall)
        .map(|p| p.text.as_str())
        .collect();
    assert_eq!(value, "12");
    let ending = reader.finish(Some(tiny().controls().end_of_msg));
    assert_eq!(ending.malformed, None);
    assert_eq!(ending.tool_calls.len(), 1);
    assert_eq!(ending.tool_calls[0].name, "f");
    assert_eq!(ending.tool_calls[0].arguments, arguments);
}

#[test]
fn a_reply_cut_short_is_not_malformed_and_a_broken_one_is_reported() {
    let mut cut = TokenReader::new(tiny(), Kind::Chat { thinking: false });
    for id in tiny().encode("partial", Specials::Plain).expect("encode") {
        cut.read(id);
    }
    let ending = cut.finish(None);
    assert_eq!((ending.tool_calls.len(), ending.malformed), (0, None));

    let mut bad = TokenReader::new(tiny(), Kind::Chat { thinking: false });
    for id in script("a<|sep|>b") {
        bad.read(id);
    }
    let malformed = bad
        .finish(Some(tiny().controls().end_of_msg))
        .malformed
        .expect("malformed");
    assert_eq!(malformed.raw, "a<|sep|>b<|end_of_msg|>");
    assert!(
        malformed.error.contains("position 1"),
        "{}",
        malformed.error
    );
}
