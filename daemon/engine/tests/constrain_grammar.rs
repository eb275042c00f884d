//! Constrained decoding's grammar (issue 34 points 4 and 6), on the tiny tokenizer fixture: the
//! allowed ids at each position of a reply — the thinking budget's forced close, tool calls
//! and arguments against their schemas (tags, keys, types, enums, bounds, nested JSON, strings
//! with escapes and multi-byte characters split across ids), JSON output — and the reader of
//! replies (`tokenizer::chat::parse_reply`) accepting every reply the grammar lets through.

use std::path::Path;
use std::sync::Arc;

use k3_engine::constrain::{self, Matcher, ReplyRules, Vocab};
use k3_engine::engine::guide::{Allowed, Guiding, IdSet};
use k3_engine::tokenizer::chat::{
    Conversation, Message, ResponseFormat, Role, Thinking, Tool, ToolChoice, parse_reply,
};
use k3_engine::tokenizer::{Specials, Tokenizer};
use serde_json::{Value, json};

fn tokenizer() -> Tokenizer {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer/tiny");
    Tokenizer::from_files(
        &dir.join("tiktoken.model"),
        &dir.join("tokenizer_config.json"),
    )
    .expect("tiny tokenizer")
}

fn weather() -> Tool {
    Tool {
        name: "get_weather".into(),
        description: Some("Weather".into()),
        parameters: Some(json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "unit": {"enum": ["C", "F"]},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}
            },
            "required": ["city"],
            "additionalProperties": false
        })),
    }
}

fn conversation(tools: Vec<Tool>, choice: ToolChoice, format: ResponseFormat) -> Conversation {
    Conversation {
        messages: vec![Message::new(Role::User, "hi")],
        thinking: Thinking::On(None),
        generation_prompt: true,
        tools,
        tool_choice: choice,
        response_format: format,
        ..Conversation::default()
    }
}

struct Fixture {
    tok: Tokenizer,
    vocab: Arc<Vocab>,
}

impl Fixture {
    fn new() -> Fixture {
        let tok = tokenizer();
        let vocab = Arc::new(Vocab::new(&tok));
        Fixture { tok, vocab }
    }

    fn matcher(&self, c: &Conversation, rules: ReplyRules) -> Matcher {
        constrain::guide(&self.vocab, c, rules)
            .expect("guide")
            .expect("a constraint")
            .matcher()
    }

    /// The reply's ids: control strings recognised, the rest as the tokenizer splits it.
    fn ids(&self, text: &str) -> Vec<u32> {
        self.tok.encode(text, Specials::Recognised).expect("encode")
    }

    /// The same reply with every text byte its own id (a split no tokenizer would choose:
    /// the grammar works on bytes, so it must not matter).
    fn byte_ids(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        for id in self.ids(text) {
            let bytes = self.tok.token_bytes(id).expect("bytes");
            if self.tok.controls().contains(id) {
                out.push(id);
            } else {
                out.extend(bytes.iter().map(|b| self.tok.byte_id(*b)));
            }
        }
        out
    }
}

fn allows(m: &mut Matcher, id: u32) -> bool {
    match m.allowed() {
        Allowed::Any => true,
        Allowed::Forced(f) => f == id,
        Allowed::Only(set) => set.contains(id),
    }
}

/// Feeds `ids`; `Err(position)` at the first one the matcher does not allow.
fn walk(m: &mut Matcher, ids: &[u32]) -> Result<(), usize> {
    for (i, &id) in ids.iter().enumerate() {
        if !allows(m, id) {
            return Err(i);
        }
        m.accept(id);
    }
    Ok(())
}

const THINK_OPEN: &str = "<|close|>think<|sep|><|open|>response<|sep|>";

fn call_reply(arguments: &str) -> String {
    format!(
        "ok{THINK_OPEN}<|close|>response<|sep|><|open|>tools<|sep|>\
         <|open|>call tool=\"get_weather\" index=\"1\"<|sep|>{arguments}<|close|>call<|sep|>\
         <|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
    )
}

fn arg(key: &str, ty: &str, value: &str) -> String {
    format!("<|open|>argument key=\"{key}\" type=\"{ty}\"<|sep|>{value}<|close|>argument<|sep|>")
}

const ON: ReplyRules = ReplyRules {
    thinking: true,
    budget: None,
};

#[test]
fn a_required_call_accepts_valid_arguments_in_any_split_and_the_reader_parses_them() {
    let f = Fixture::new();
    let c = conversation(vec![weather()], ToolChoice::Required, ResponseFormat::Text);
    let good = [
        arg("city", "string", "Paris"),
        format!(
            "{}{}{}",
            arg("days", "number", "14"),
            arg("city", "string", "Zürich \"Altstadt\" 😀"),
            arg("unit", "string", "F")
        ),
        format!(
            "{}{}",
            arg("city", "string", "x"),
            arg("tags", "array", r#"["a\n\u00e9", "b"]"#)
        ),
        // The json block form of the same arguments.
        r#"<|open|>json type="object"<|sep|>{"city": "Oslo", "days": 2}<|close|>json<|sep|>"#
            .to_string(),
    ];
    for args in &good {
        let reply = call_reply(args);
        for ids in [f.ids(&reply), f.byte_ids(&reply)] {
            let mut m = f.matcher(&c, ON);
            assert_eq!(walk(&mut m, &ids), Ok(()), "{reply}");
            assert!(m.is_finished(), "{reply}");
            let parsed = parse_reply(&f.tok, &ids, true).expect("the reader parses it");
            let call = &parsed.tool_calls[0];
            assert_eq!(call.name, "get_weather");
            let value: Value = serde_json::from_str(&call.arguments).expect("arguments are JSON");
            assert!(value["city"].is_string(), "{value}");
        }
    }
}

#[test]
fn a_required_call_refuses_what_the_schema_or_the_reader_would_not_take() {
    let f = Fixture::new();
    let c = conversation(vec![weather()], ToolChoice::Required, ResponseFormat::Text);
    // A valid city and one more argument.
    let city_and = |key: &str, ty: &str, value: &str| {
        format!("{}{}", arg("city", "string", "a"), arg(key, ty, value))
    };
    let bad = [
        // Out of the bounds, wrong type, not an enum value, an unknown key, a key twice.
        city_and("days", "number", "15"),
        city_and("days", "number", "0"),
        city_and("days", "number", "2.5"),
        city_and("days", "string", "2"),
        city_and("unit", "string", "K"),
        city_and("country", "string", "FR"),
        city_and("city", "string", "b"),
        // The required key missing; an empty city (minLength 1); four tags (maxItems 3).
        arg("days", "number", "3"),
        arg("city", "string", ""),
        format!(
            "{}{}",
            arg("city", "string", "a"),
            arg("tags", "array", r#"["1","2","3","4"]"#)
        ),
        // Invalid JSON inside a JSON-typed value; a bad escape.
        format!(
            "{}{}",
            arg("city", "string", "a"),
            arg("tags", "array", r#"["a",]"#)
        ),
        format!(
            "{}{}",
            arg("city", "string", "a"),
            arg("tags", "array", r#"["\q"]"#)
        ),
    ];
    for args in &bad {
        let reply = call_reply(args);
        let mut m = f.matcher(&c, ON);
        assert!(walk(&mut m, &f.ids(&reply)).is_err(), "accepted: {reply}");
    }
    // Not a call at all: content instead, or another tool's name.
    let mut m = f.matcher(&c, ON);
    assert!(walk(&mut m, &f.ids(&format!("ok{THINK_OPEN}Hello"))).is_err());
    let mut m = f.matcher(&c, ON);
    let other = call_reply(&arg("city", "string", "a")).replace("get_weather", "get_time");
    assert!(walk(&mut m, &f.ids(&other)).is_err());
}

#[test]
fn a_named_function_is_the_only_callable_and_parallel_off_allows_one_call() {
    let f = Fixture::new();
    let time = Tool {
        name: "get_time".into(),
        description: None,
        parameters: None,
    };
    let mut c = conversation(
        vec![time, weather()],
        ToolChoice::Function("get_weather".into()),
        ResponseFormat::Text,
    );
    let reply = call_reply(&arg("city", "string", "Rome"));
    let mut m = f.matcher(&c, ON);
    assert_eq!(walk(&mut m, &f.ids(&reply)), Ok(()));
    let other = reply
        .replace("get_weather", "get_time")
        .replace(&arg("city", "string", "Rome"), "");
    assert!(walk(&mut f.matcher(&c, ON), &f.ids(&other)).is_err());
    // Two calls: fine by default, refused with parallel calls off.
    let two = reply.replace(
        "<|close|>tools",
        &format!(
            "<|open|>call tool=\"get_weather\" index=\"2\"<|sep|>{}<|close|>call<|sep|><|close|>tools",
            arg("city", "string", "Oslo")
        ),
    );
    assert_eq!(walk(&mut f.matcher(&c, ON), &f.ids(&two)), Ok(()));
    c.parallel_tool_calls = false;
    assert!(walk(&mut f.matcher(&c, ON), &f.ids(&two)).is_err());
}

#[test]
fn the_thinking_budget_forces_the_close_then_lets_the_model_answer() {
    let f = Fixture::new();
    let c = conversation(Vec::new(), ToolChoice::Auto, ResponseFormat::Text);
    let rules = ReplyRules {
        thinking: true,
        budget: Some(3),
    };
    let mut m = f.matcher(&c, rules);
    let a = f.ids("a")[0];
    for _ in 0..3 {
        assert!(matches!(m.allowed(), Allowed::Any));
        m.accept(a);
    }
    let close = f.tok.controls().close;
    assert!(matches!(m.allowed(), Allowed::Forced(id) if id == close));
    m.accept(close);
    // `think` follows, in any split the vocabulary has; then the channel switch, forced.
    let rest = f.ids("think<|sep|><|open|>response<|sep|>");
    assert_eq!(walk(&mut m, &rest), Ok(()));
    // Then nothing is constrained.
    assert!(matches!(m.allowed(), Allowed::Any));
    // Without a budget and without a constraint there is no guide at all.
    let none = constrain::guide(&f.vocab, &c, ON).expect("no error");
    assert!(none.is_none());
    // A budget with thinking off does not apply either.
    let off = ReplyRules {
        thinking: false,
        budget: Some(3),
    };
    assert!(
        constrain::guide(&f.vocab, &c, off)
            .expect("no error")
            .is_none()
    );
}

#[test]
fn json_output_follows_the_schema_and_json_object_any_object() {
    let f = Fixture::new();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "scores": {"type": "array", "items": {"type": "number"}},
            "meta": {"type": ["object", "null"], "additionalProperties": {"type": "boolean"}}
        },
        "required": ["name", "scores"],
        "additionalProperties": false
    });
    let c = conversation(
        Vec::new(),
        ToolChoice::Auto,
        ResponseFormat::JsonSchema(schema),
    );
    let reply = |content: &str| {
        format!(
            "ok{THINK_OPEN}{content}<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
        )
    };
    for good in [
        r#"{"name": "a", "scores": [1, -2.5e3]}"#,
        "{\n  \"scores\": [],\n  \"name\": \"\\u00e9\",\n  \"meta\": {\"x\": true}\n}",
        r#"{"name":"b","scores":[0],"meta":null}"#,
    ] {
        let r = reply(good);
        for ids in [f.ids(&r), f.byte_ids(&r)] {
            let mut m = f.matcher(&c, ON);
            assert_eq!(walk(&mut m, &ids), Ok(()), "{good}");
            let parsed = parse_reply(&f.tok, &ids, true).expect("parses");
            let v: Value = serde_json::from_str(&parsed.content).expect("content is JSON");
            assert!(v["name"].is_string());
        }
    }
    for bad in [
        r#"{"name": "a"}"#,
        r#"{"name": "a", "scores": [1], "extra": 1}"#,
        r#"{"name": "a", "scores": ["1"]}"#,
        r#"{"name": "a", "scores": [], "meta": {"x": 1}}"#,
        r#"["name"]"#,
        r#"{"name": "a", "name": "b", "scores": []}"#,
    ] {
        let mut m = f.matcher(&c, ON);
        assert!(walk(&mut m, &f.ids(&reply(bad))).is_err(), "accepted {bad}");
    }
    // json_object: any object, nothing else.
    let c = conversation(Vec::new(), ToolChoice::Auto, ResponseFormat::JsonObject);
    let mut m = f.matcher(&c, ON);
    assert_eq!(
        walk(
            &mut m,
            &f.ids(&reply(r#"{"a": [1, {"b": null}], "c": "d"}"#))
        ),
        Ok(())
    );
    assert!(walk(&mut f.matcher(&c, ON), &f.ids(&reply("42"))).is_err());
    assert!(walk(&mut f.matcher(&c, ON), &f.ids(&reply("Sure! {"))).is_err());
}

#[test]
fn allowed_sets_equal_trying_every_id() {
    // The trie walk and the string fast paths give exactly the ids that a brute-force trial of
    // every id of the vocabulary allows, at every position of a few replies.
    let f = Fixture::new();
    let c = conversation(vec![weather()], ToolChoice::Required, ResponseFormat::Text);
    let reply = call_reply(&format!(
        "{}{}",
        arg("tags", "array", r#"["é\"x", "b"]"#),
        arg("city", "string", "Zürich")
    ));
    let ids = f.byte_ids(&reply);
    let mut m = f.matcher(&c, ON);
    for (i, &id) in ids.iter().enumerate() {
        let fast: Vec<u32> = match m.allowed() {
            Allowed::Any => panic!("position {i}: a constrained reply is never unconstrained"),
            Allowed::Forced(x) => vec![x],
            Allowed::Only(set) => set.iter().collect(),
        };
        let brute: Vec<u32> = (0..f.vocab.size() as u32)
            .filter(|&t| m.would_take(t))
            .collect();
        assert_eq!(fast, brute, "position {i}");
        m.accept(id);
    }
}

#[test]
fn schemas_outside_the_subset_are_refused_naming_the_field_and_path() {
    let f = Fixture::new();
    let mut tool = weather();
    tool.parameters = Some(json!({"type": "object", "properties": {
        "id": {"type": "string", "pattern": "^wf_"}}}));
    let c = conversation(
        vec![weather(), tool],
        ToolChoice::Required,
        ResponseFormat::Text,
    );
    let e = constrain::guide(&f.vocab, &c, ON).expect_err("refused");
    assert_eq!(
        e.to_string(),
        "the parameters schema of tools[1] (`get_weather`) at /properties/id: pattern is not \
         supported by k3's constrained decoding"
    );
    assert_eq!(e.field(), "tools");
    let c = conversation(
        Vec::new(),
        ToolChoice::Auto,
        ResponseFormat::JsonSchema(json!({"type": "string", "oneOf": []})),
    );
    let e = constrain::guide(&f.vocab, &c, ON).expect_err("refused");
    assert!(
        e.to_string()
            .starts_with("the response format's schema at /"),
        "{e}"
    );
    assert_eq!(e.field(), "response_format");
    // A schema that is not an object cannot be a tool's arguments.
    let mut scalar = weather();
    scalar.parameters = Some(json!({"type": "string"}));
    let c = conversation(vec![scalar], ToolChoice::Required, ResponseFormat::Text);
    let e = constrain::guide(&f.vocab, &c, ON).expect_err("refused");
    assert!(e.to_string().contains("object schema"), "{e}");
    let _ = IdSet::new(1);
}

/// Issue 45.4: the fewest ids a forced call takes is a lower bound on every call the grammar
/// accepts — one id per control token, one per run of text — so a `max_tokens` below it can
/// be refused as holding no call, and one at it refused nothing the grammar would take.
#[test]
fn the_least_ids_of_a_forced_call_bound_every_accepted_call() {
    let f = Fixture::new();
    let now = Tool {
        name: "now".into(),
        description: None,
        parameters: Some(json!({"type": "object", "properties": {}})),
    };
    let off = ReplyRules {
        thinking: false,
        budget: None,
    };
    let least = |tools: Vec<Tool>, rules: ReplyRules| {
        let c = conversation(tools, ToolChoice::Required, ResponseFormat::Text);
        constrain::guide(&f.vocab, &c, rules)
            .expect("guide")
            .expect("a constraint")
            .grammar()
            .least_call_ids()
            .expect("a forced call")
    };
    // Empty response (1), tools open (5), call: open, tag (2), close, end (2); tools end (1 + 5),
    // the end id (1).
    assert_eq!(least(vec![now.clone()], off), 19);
    // A required argument: open, tag (2), value (maybe no id), end (3).
    assert_eq!(least(vec![weather()], off), 25);
    // The cheaper tool decides; a reply opening in thinking adds its close and tail (6).
    assert_eq!(least(vec![weather(), now.clone()], off), 19);
    assert_eq!(least(vec![now.clone()], ON), 25);
    let shortest = "<|close|>response<|sep|><|open|>tools<|sep|>\
         <|open|>call tool=\"now\" index=\"1\"<|sep|><|close|>call<|sep|>\
         <|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
    let with_city = format!(
        "<|close|>response<|sep|><|open|>tools<|sep|>\
         <|open|>call tool=\"get_weather\" index=\"1\"<|sep|>{}<|close|>call<|sep|>\
         <|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>",
        arg("city", "string", "P")
    );
    for (tools, reply) in [
        (vec![now], shortest.to_string()),
        (vec![weather()], with_city),
    ] {
        let bound = least(tools.clone(), off);
        let c = conversation(tools, ToolChoice::Required, ResponseFormat::Text);
        for ids in [f.ids(&reply), f.byte_ids(&reply)] {
            let mut m = f.matcher(&c, off);
            assert_eq!(walk(&mut m, &ids), Ok(()), "{reply}");
            assert!(m.is_finished());
            assert!(ids.len() >= bound, "{} ids < {bound}: {reply}", ids.len());
        }
    }
}
