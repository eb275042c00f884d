//! Guided generation on a real engine (issue 34 points 4 and 6): a constrained reply takes, at
//! every position, the best id its guide allows (the first maximum of the model's own logits
//! over the allowed set, re-derived here from the recorded logits and a fresh matcher), forced
//! runs fed in one forward give the logits of feeding them one by one, and all of it is the
//! same at 1 and 2 threads, at the minimum memory budget and at max, in a batch and alone, and
//! with exact speculation; a guide that allows everything changes nothing, bit for bit.

mod model_support;

use std::sync::Arc;

use k3_engine::constrain::{self, ReplyRules, Vocab};
use k3_engine::engine::guide::{Allowed, Guide, Guiding};
use k3_engine::engine::request::MAX_SPECULATE;
use k3_engine::engine::{Engine, GenerateRequest, Step, Summary};
use k3_engine::plan::{Budget, Plan, PlanError, PlanInputs};
use k3_engine::tokenizer::chat::{
    self, Conversation, Message, ResponseFormat, Role, Thinking, Tool, ToolChoice,
};
use model_support::{bits, open_engine, synth};
use serde_json::json;

fn plan(budget: Budget) -> PlanInputs {
    PlanInputs {
        budget,
        speculate: MAX_SPECULATE as u64,
        sequences: 2,
        ..PlanInputs::default()
    }
}

/// The smallest RAM budget the plan accepts (from the refusal of 1 byte).
fn minimum_budget(dir: &std::path::Path) -> Budget {
    let ck = k3_engine::checkpoint::Checkpoint::open(dir).expect("open checkpoint");
    let tiny = Budget {
        ram: Some(1),
        ..Budget::default()
    };
    match Plan::for_model(&ck.config, &ck.layout, &plan(tiny)) {
        Err(PlanError::BudgetTooSmall { needed, .. }) => Budget {
            ram: Some(needed),
            ..Budget::default()
        },
        other => panic!("a 1-byte budget should be refused, got {other:?}"),
    }
}

fn run(engine: &Engine, request: GenerateRequest) -> Summary {
    let mut g = engine.start(request).expect("start");
    loop {
        if let Step::Finished(s) = engine.step(&mut g, &|| false).expect("step") {
            return s;
        }
    }
}

fn weather_call(choice: ToolChoice) -> Conversation {
    Conversation {
        messages: vec![Message::new(Role::User, "Weather in Paris for 3 days?")],
        thinking: Thinking::On(None),
        generation_prompt: true,
        tools: vec![Tool {
            name: "get_weather".into(),
            description: None,
            parameters: Some(json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "days": {"type": "integer", "minimum": 1, "maximum": 14}
                },
                "required": ["city", "days"],
                "additionalProperties": false
            })),
        }],
        tool_choice: choice,
        response_format: ResponseFormat::Text,
        ..Conversation::default()
    }
}

/// Asserts each generated id is the one the guide allows and the logits prefer: forced where
/// one id is allowed, else the first maximum over the allowed ids of the row before it.
fn assert_best_allowed(s: &Summary, guide: &constrain::ReplyGuide, prompt: usize, vocab: usize) {
    let mut m = guide.matcher();
    let mut masked = 0;
    for (i, &id) in s.generated.iter().enumerate() {
        let row = prompt + i - 1;
        // A forced id needs no logits (and its row may never have been computed).
        let logits = || &s.logits[row * vocab..(row + 1) * vocab];
        match m.allowed() {
            Allowed::Any => assert_eq!(id, argmax(logits(), |_| true), "id {i}"),
            Allowed::Forced(f) => assert_eq!(id, f, "id {i} is forced"),
            Allowed::Only(set) => {
                masked += 1;
                assert!(set.contains(id), "id {i} is not allowed");
                assert_eq!(id, argmax(logits(), |j| set.contains(j)), "id {i}");
            }
        }
        m.accept(id);
    }
    assert!(masked > 0, "nothing was masked: the test proves nothing");
}

/// The first maximum among the ids `keep` keeps.
fn argmax(row: &[f32], keep: impl Fn(u32) -> bool) -> u32 {
    let mut best: Option<u32> = None;
    for (j, &v) in row.iter().enumerate() {
        let j = j as u32;
        if keep(j) && best.is_none_or(|b| v > row[b as usize]) {
            best = Some(j);
        }
    }
    best.expect("an allowed id")
}

#[test]
fn a_constrained_reply_takes_the_best_allowed_id_everywhere_and_exactly() {
    let ck = synth("tiny", 5);
    let one = open_engine(&ck.dir, 1, plan(Budget::default()));
    let vocab_size = one.model().config().vocab_size;
    let tokenizer = one.tokenizer();
    let vocab = Arc::new(Vocab::new(tokenizer));
    let conversation = weather_call(ToolChoice::Required);
    let prompt = chat::render(tokenizer, &conversation).expect("render");
    // A budget of 2 think ids: the random model would not close the channel itself.
    let rules = ReplyRules {
        thinking: true,
        budget: Some(2),
    };
    let guide = constrain::guide(&vocab, &conversation, rules)
        .expect("guide")
        .expect("constrained");
    let request = GenerateRequest {
        prompt: prompt.clone(),
        max_tokens: 120,
        record_logits: true,
        stop_ids: tokenizer.end_of_turn_ids().to_vec(),
        guide: Some(Arc::clone(&guide) as Arc<dyn Guide>),
        ..GenerateRequest::default()
    };
    let s = run(&one, request.clone());
    assert_best_allowed(&s, &guide, prompt.len(), vocab_size);
    // The reply so far follows the template: the think channel closed after 2 ids.
    let text =
        String::from_utf8_lossy(&tokenizer.decode(&s.generated).expect("decode")).into_owned();
    assert!(
        text.contains("<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"),
        "{text}"
    );

    // Forced runs were fed in one forward: their logits are those of feeding every id alone,
    // i.e. of a plain prefill of the same ids (chunking never changes the bits, spec §6).
    let rows = s.logits.len() / vocab_size;
    let fed: Vec<u32> = prompt
        .iter()
        .chain(&s.generated)
        .copied()
        .take(rows)
        .collect();
    let plain = run(
        &one,
        GenerateRequest {
            prompt: fed,
            max_tokens: 0,
            record_logits: true,
            ..GenerateRequest::default()
        },
    );
    assert_eq!(
        bits(&plain.logits),
        bits(&s.logits),
        "forced runs changed the logits"
    );

    // Threads, memory budget, batch composition and speculation change nothing.
    let two_min = open_engine(&ck.dir, 2, plan(minimum_budget(&ck.dir)));
    for (what, other) in [
        (
            "2 threads at the minimum budget",
            run(&two_min, request.clone()),
        ),
        (
            "speculating",
            run(
                &one,
                GenerateRequest {
                    speculate: 4,
                    ..request.clone()
                },
            ),
        ),
    ] {
        assert_eq!(other.generated, s.generated, "{what}");
        let (x, y) = (bits(&other.logits), bits(&s.logits));
        let first = x.iter().zip(&y).position(|(a, b)| a != b);
        assert!(
            x == y,
            "{what}: logits: lengths {} {}, first difference at row {:?} of {} prompt rows; {:?}",
            x.len() / vocab_size,
            y.len() / vocab_size,
            first.map(|f| f / vocab_size),
            prompt.len(),
            other.decode_steps
        );
    }
    let mut a = two_min.start(request.clone()).expect("start");
    let mut b = two_min
        .start(GenerateRequest {
            prompt: vec![1, 2, 3],
            max_tokens: 40,
            ..GenerateRequest::default()
        })
        .expect("start");
    let mut batched = None;
    while batched.is_none() {
        let results = two_min.step_batch(&mut [&mut a, &mut b], &[]);
        if let Ok(Step::Finished(s)) = &results[0] {
            batched = Some(s.clone());
        }
        if b.is_finished() {
            b = two_min
                .start(GenerateRequest {
                    prompt: vec![4, 5],
                    max_tokens: 40,
                    ..GenerateRequest::default()
                })
                .expect("start");
        }
    }
    let batched = batched.expect("finished");
    assert_eq!(batched.generated, s.generated, "batched");
    assert_eq!(bits(&batched.logits), bits(&s.logits), "batched: logits");
}

#[test]
fn a_guide_that_allows_everything_changes_nothing_bit_for_bit() {
    let ck = synth("tiny", 6);
    for threads in [1, 2] {
        let engine = open_engine(&ck.dir, threads, plan(Budget::default()));
        let tokenizer = engine.tokenizer();
        let vocab = Arc::new(Vocab::new(tokenizer));
        let conversation = weather_call(ToolChoice::Auto);
        let prompt = chat::render(tokenizer, &conversation).expect("render");
        // A thinking budget the reply never reaches: a guide is present, nothing is masked.
        let rules = ReplyRules {
            thinking: true,
            budget: Some(1000),
        };
        let guide = constrain::guide(&vocab, &conversation, rules)
            .expect("guide")
            .expect("a budget guide");
        let plain = GenerateRequest {
            prompt,
            max_tokens: 30,
            record_logits: true,
            ..GenerateRequest::default()
        };
        let guided = GenerateRequest {
            guide: Some(guide as Arc<dyn Guide>),
            ..plain.clone()
        };
        let (p, g) = (run(&engine, plain), run(&engine, guided));
        assert_eq!(g.generated, p.generated, "{threads} threads");
        assert_eq!(
            bits(&g.logits),
            bits(&p.logits),
            "{threads} threads: logits"
        );
    }
}
