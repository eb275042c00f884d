//! Batched decoding (issue 7 item 4): generations stepped together through one forward pass
//! ([`Engine::step_batch`], [`Model::forward_batch`]) give byte-identical ids **and logits** to
//! each run alone — with members joining and leaving at different steps, prefill chunks next to
//! decode tokens, at 1 and 2 threads, at the minimum budget and at max — and a cancelled or
//! failing member leaves the others exact.

mod model_support;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use k3_engine::engine::{
    Engine, EngineError, EngineOptions, Feed, GenerateRequest, Generation, Step, Summary,
};
use k3_engine::model::{LoadOptions, Logits, ModelError, Sequence};
use k3_engine::plan::{Budget, Plan, PlanError, PlanInputs};
use k3_engine::serve::batch::{Batch, Cancel, Member, Never};
use model_support::*;

/// Prompt tokens per prefill step: small, so the long prompts take several steps and overlap
/// other members' decoding.
const CHUNK: usize = 4;
/// Members of a batch at most.
const MEMBERS: usize = 4;

/// Four requests with different prompts, prompt lengths and generation lengths.
fn requests(vocab: usize) -> Vec<GenerateRequest> {
    let mut r = Rng::new(11);
    [(3, 6), (11, 3), (1, 9), (7, 5)]
        .into_iter()
        .map(|(len, tokens)| GenerateRequest {
            prompt: (0..len)
                .map(|_| (r.next_u64() % vocab as u64) as u32)
                .collect(),
            max_tokens: tokens,
            record_logits: true,
            ..GenerateRequest::default()
        })
        .collect()
}

/// The round at which request i joins the batch.
const JOIN: [usize; MEMBERS] = [0, 1, 1, 4];

fn options(threads: usize, budget: Budget) -> EngineOptions {
    EngineOptions {
        threads,
        prefill_chunk: CHUNK,
        model: LoadOptions {
            plan: PlanInputs {
                budget,
                max_tokens_per_call: (CHUNK * MEMBERS) as u64,
                sequences: MEMBERS as u64,
                ..PlanInputs::default()
            },
            ..LoadOptions::default()
        },
    }
}

fn open(dir: &Path, threads: usize, budget: Budget) -> Engine {
    Engine::open(dir, options(threads, budget), &mut |_| {})
        .unwrap_or_else(|e| panic!("open {}: {e}", dir.display()))
}

/// The smallest RAM budget the plan accepts for these options (from the refusal of 1 byte).
fn minimum_budget(dir: &Path) -> Budget {
    let ck = k3_engine::checkpoint::Checkpoint::open(dir).expect("open checkpoint");
    let tiny = Budget {
        ram: Some(1),
        ..Budget::default()
    };
    match Plan::for_model(&ck.config, &ck.layout, &options(1, tiny).model.plan) {
        Err(PlanError::BudgetTooSmall { needed, .. }) => Budget {
            ram: Some(needed),
            ..Budget::default()
        },
        other => panic!("a 1-byte budget should be refused, got {other:?}"),
    }
}

/// Just below `max` for these options: the whole trunk resident, the minimum cache (which cannot hold
/// every expert) and the routing lookahead's slots for every member (plan rule 4).
fn trunk_resident_budget(dir: &Path) -> Budget {
    let ck = k3_engine::checkpoint::Checkpoint::open(dir).expect("open checkpoint");
    let max = Plan::for_model(
        &ck.config,
        &ck.layout,
        &options(1, Budget::default()).model.plan,
    )
    .expect("max plan");
    // The cache capped at its minimum: left to the plan it would take the spare (a token of
    // experts fits) and hold nearly every expert, so no guess would need a read.
    let budget = Budget {
        ram: Some(max.total() - 4096),
        cache: Some(1),
        ..Budget::default()
    };
    let plan =
        Plan::for_model(&ck.config, &ck.layout, &options(1, budget).model.plan).expect("plan");
    assert_eq!(
        plan.lookahead_slots,
        MEMBERS * ck.config.num_experts_per_token,
        "top-k lookahead slots per member"
    );
    budget
}

fn run_alone(engine: &Engine, request: GenerateRequest) -> Summary {
    let mut g = engine.start(request).expect("start");
    loop {
        match engine.step(&mut g, &|| false) {
            Ok(Step::Finished(s)) => return s,
            Ok(_) => {}
            Err(e) => panic!("solo step: {e}"),
        }
    }
}

/// What the batched run saw, to prove it really batched.
#[derive(Default)]
struct Seen {
    widest: usize,
    /// A pass fed a prefill chunk and a decode token together.
    mixed: bool,
}

/// Request `index` being computed.
struct Indexed {
    index: usize,
    generation: Generation,
}

impl Member for Indexed {
    fn split(&mut self) -> (&mut Generation, &(dyn Cancel + Sync)) {
        (&mut self.generation, &Never)
    }
    fn generation(&self) -> &Generation {
        &self.generation
    }
}

/// Runs the requests through the serve core's batch loop ([`Batch`], the one the daemon
/// uses), request i joining at round `JOIN[i]` and leaving when it finishes; returns each
/// one's summary.
fn run_batched(engine: &Engine, requests: &[GenerateRequest]) -> (Vec<Summary>, Seen) {
    let mut waiting: Vec<(usize, GenerateRequest)> = requests.iter().cloned().enumerate().collect();
    let mut batch: Batch<Indexed> = Batch::new(MEMBERS);
    let mut done: Vec<Option<Summary>> = vec![None; requests.len()];
    let mut seen = Seen::default();
    for round in 0.. {
        let (joining, rest): (Vec<_>, Vec<_>) =
            waiting.into_iter().partition(|(i, _)| JOIN[*i] <= round);
        waiting = rest;
        for (index, r) in joining {
            batch.push(Indexed {
                index,
                generation: engine.start(r).expect("start"),
            });
        }
        if batch.is_empty() && waiting.is_empty() {
            break;
        }
        let feeds: Vec<Feed> = batch
            .iter()
            .map(|m| m.generation.next_feed(CHUNK).expect("feed"))
            .collect();
        let prompt = feeds.iter().any(|f| matches!(f, Feed::Prompt { .. }));
        let token = feeds.iter().any(|f| matches!(f, Feed::Token { .. }));
        seen.mixed |= prompt && token;
        seen.widest = seen
            .widest
            .max(feeds.iter().filter(|f| f.forward().is_some()).count());
        for (m, r) in batch.round(engine) {
            match r {
                Ok(Step::Finished(s)) => done[m.index] = Some(s),
                Ok(_) => batch.push(m),
                Err(e) => panic!("batched step: {e}"),
            }
        }
    }
    let summaries = done
        .into_iter()
        .map(|s| s.expect("every request finished"))
        .collect();
    (summaries, seen)
}

fn assert_same(alone: &Summary, batched: &Summary, what: &str) {
    assert_eq!(batched.generated, alone.generated, "{what}: ids differ");
    assert!(!alone.logits.is_empty(), "{what}: logits were recorded");
    assert_eq!(
        bits(&batched.logits),
        bits(&alone.logits),
        "{what}: logits differ"
    );
    assert_eq!(batched.stop_reason, alone.stop_reason, "{what}");
}

fn batched_equals_alone(shape: &str) {
    let ck = synth(shape, 3);
    let reference = open(&ck.dir, 1, Budget::default());
    let reqs = requests(reference.model().config().vocab_size);
    let alone: Vec<Summary> = reqs
        .iter()
        .map(|r| run_alone(&reference, r.clone()))
        .collect();
    // The members must not all be the same run (the comparison would prove less).
    assert_ne!(alone[0].generated, alone[2].generated);
    drop(reference);
    let min = minimum_budget(&ck.dir);
    let resident = trunk_resident_budget(&ck.dir);
    for (threads, budget, name) in [
        (1, Budget::default(), "max"),
        (2, Budget::default(), "max"),
        (1, min, "minimum"),
        (2, min, "minimum"),
        (2, resident, "trunk-resident"),
    ] {
        let engine = open(&ck.dir, threads, budget);
        let before = engine.stats().store.bytes_read;
        let (batched, seen) = run_batched(&engine, &reqs);
        assert_eq!(seen.widest, MEMBERS, "{shape}: all four ran in one pass");
        assert!(seen.mixed, "{shape}: a pass mixed prefill and decode");
        for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
            assert_same(
                a,
                b,
                &format!("{shape}, {threads} threads, {name} budget, request {i}"),
            );
        }
        // Traffic is charged to members, all of it: the shares add up to what the store read.
        let charged: u64 = batched.iter().map(|s| s.bytes_read).sum();
        let read = engine.stats().store.bytes_read - before;
        assert_eq!(charged, read, "{shape} {name}: bytes charged");
        if name == "minimum" {
            assert!(read > 0, "{shape}: the minimum budget streams");
        }
        if name == "trunk-resident" {
            assert!(
                engine.model().store_stats().lookahead_bytes_read > 0,
                "{shape}: batched decode passes read experts ahead of routing"
            );
        }
    }
}

#[test]
fn batched_equals_alone_tiny() {
    batched_equals_alone("tiny");
}

#[test]
fn batched_equals_alone_tiny_b() {
    batched_equals_alone("tiny-b");
}

#[test]
fn batched_equals_alone_tiny_c() {
    batched_equals_alone("tiny-c");
}

#[test]
fn batched_equals_alone_small() {
    batched_equals_alone("small");
}

/// `forward_batch` directly: members feeding different numbers of ids with different logits
/// wishes get exactly their solo logits and states.
#[test]
fn forward_batch_members_equal_solo_forwards() {
    let ck = synth("tiny-c", 5);
    let model = load(&ck.dir);
    let vocab = model.config().vocab_size as u64;
    let mut r = Rng::new(2);
    let mut ids =
        |n: usize| -> Vec<u32> { (0..n).map(|_| (r.next_u64() % vocab) as u32).collect() };
    let (history, feeds) = ([ids(5), ids(0), ids(2)], [ids(3), ids(6), ids(1)]);
    let wants = [Logits::All, Logits::Last, Logits::Last];
    let mut states = Vec::new();
    for h in &history {
        let mut s = model.new_state();
        if !h.is_empty() {
            model
                .forward(&mut s, h, Logits::Last, &no_cancel)
                .expect("history");
        }
        states.push(s);
    }
    let mut solo_states = states.clone();
    let solo: Vec<Vec<f32>> = solo_states
        .iter_mut()
        .zip(&feeds)
        .zip(wants)
        .map(|((s, f), w)| model.forward(s, f, w, &no_cancel).expect("solo"))
        .collect();
    let mut seqs: Vec<Sequence<'_>> = states
        .iter_mut()
        .zip(&feeds)
        .zip(wants)
        .map(|((state, ids), want)| Sequence { state, ids, want })
        .collect();
    let batched = model.forward_batch(&mut seqs, &no_cancel).expect("batch");
    drop(seqs);
    for (k, (a, b)) in solo.iter().zip(&batched).enumerate() {
        assert_eq!(bits(a), bits(b), "member {k}: logits");
    }
    assert_eq!(solo[0].len(), 3 * vocab as usize);
    assert_eq!(states, solo_states, "states advance exactly as alone");
}

/// A member refused before compute fails the batch without touching any state.
#[test]
fn forward_batch_checks_every_member_first() {
    let ck = synth("tiny", 5);
    let model = load(&ck.dir);
    let vocab = model.config().vocab_size as u32;
    let (mut a, mut b) = (model.new_state(), model.new_state());
    let (good, bad) = ([1, 2], [3, vocab]);
    let mut seqs = [
        Sequence {
            state: &mut a,
            ids: &good,
            want: Logits::Last,
        },
        Sequence {
            state: &mut b,
            ids: &bad,
            want: Logits::Last,
        },
    ];
    match model.forward_batch(&mut seqs, &no_cancel) {
        Err(ModelError::Member { index: 1, error }) => {
            assert!(matches!(
                *error,
                ModelError::TokenOutOfVocab { index: 1, .. }
            ))
        }
        other => panic!("expected member 1 refused, got {other:?}"),
    }
    for s in [&a, &b] {
        assert_eq!(s.positions(), 0);
        assert!(!s.is_poisoned());
    }
}

/// Steps `g` alone to the end and returns its summary.
fn finish(engine: &Engine, g: &mut Generation) -> Summary {
    loop {
        match engine.step(g, &|| false) {
            Ok(Step::Finished(s)) => return s,
            Ok(_) => {}
            Err(e) => panic!("step: {e}"),
        }
    }
}

/// Cancellation per member: one cancelled while a pass runs is dropped at the boundary and the
/// others stay exact; when every member is cancelled the pass stops and poisons all states; a
/// poisoned member then fails alone while its batch-mates go on.
#[test]
fn cancelled_and_failing_members() {
    let ck = synth("tiny", 4);
    let engine = open(&ck.dir, 2, Budget::default());
    let reqs = requests(engine.model().config().vocab_size);
    let alone: Vec<Summary> = reqs.iter().map(|r| run_alone(&engine, r.clone())).collect();
    let start = |i: usize| engine.start(reqs[i].clone()).expect("start");

    // Member 1's flag rises once the pass has begun: its first poll is the engine's pre-check,
    // and the pass polls it only if member 0 were cancelled too.
    let (mut g0, mut g1, mut g2) = (start(0), start(1), start(2));
    let late_polls = AtomicUsize::new(0);
    let late = || late_polls.fetch_add(1, Ordering::Relaxed) >= 1;
    let never = || false;
    let out = engine.step_batch(&mut [&mut g0, &mut g1, &mut g2], &[&never, &late, &never]);
    assert!(
        matches!(out[1], Err(EngineError::Cancelled)),
        "{:?}",
        out[1]
    );
    assert!(out[0].is_ok() && out[2].is_ok());
    assert_same(
        &alone[0],
        &finish(&engine, &mut g0),
        "after a cancelled mate, request 0",
    );
    assert_same(
        &alone[2],
        &finish(&engine, &mut g2),
        "after a cancelled mate, request 2",
    );

    // Every member cancelled once the first layer ran: the pass stops between layers and every
    // state is poisoned. Polls: two pre-checks, then two before the first layer, then true.
    let (mut g0, mut g3) = (start(0), start(3));
    let polls = AtomicUsize::new(0);
    let later = || polls.fetch_add(1, Ordering::Relaxed) >= 4;
    let out = engine.step_batch(&mut [&mut g0, &mut g3], &[&later, &later]);
    assert!(
        out.iter().all(|r| matches!(r, Err(EngineError::Cancelled))),
        "{out:?}"
    );
    assert!(g0.state().is_poisoned() && g3.state().is_poisoned());

    // A poisoned member fails alone; the fresh one beside it is exact.
    let mut g2 = start(2);
    let out = engine.step_batch(&mut [&mut g0, &mut g2], &[&never, &never]);
    assert!(
        matches!(out[0], Err(EngineError::Model(ModelError::StatePoisoned))),
        "{:?}",
        out[0]
    );
    assert!(out[1].is_ok(), "{:?}", out[1]);
    assert_same(
        &alone[2],
        &finish(&engine, &mut g2),
        "beside a poisoned mate",
    );
}

/// The memory plan reserves one full-context state per sequence held at once: the minimum
/// budget grows by exactly the extra states.
#[test]
fn the_plan_reserves_a_state_per_sequence() {
    let ck = synth("small", 6);
    let c = k3_engine::checkpoint::Checkpoint::open(&ck.dir).expect("open checkpoint");
    let plan = |sequences: u64| {
        let inputs = PlanInputs {
            sequences,
            ..PlanInputs::default()
        };
        Plan::for_model(&c.config, &c.layout, &inputs).expect("plan at max")
    };
    let (one, four) = (plan(1), plan(4));
    assert!(one.state_bytes > 0);
    assert_eq!(four.state_bytes, 4 * one.state_bytes);
    assert_eq!(four.total() - one.total(), 3 * one.state_bytes);
}

#[test]
fn the_plan_reserves_a_speculation_journal_per_sequence() {
    let ck = synth("small", 6);
    let c = k3_engine::checkpoint::Checkpoint::open(&ck.dir).expect("open checkpoint");
    let plan = |speculate: u64| {
        let inputs = PlanInputs {
            sequences: 3,
            speculate,
            ..PlanInputs::default()
        };
        Plan::for_model(&c.config, &c.layout, &inputs).expect("plan at max")
    };
    let shape = k3_engine::plan::StateShape::of(&c.config);
    let journal = shape.journal_bytes(1 + 4).expect("journal size");
    // Per KDA layer: S and the histories, then 6 P-wide rows and β per fed token.
    let p = shape.kda_heads * shape.kda_head_dim;
    let copy = p * shape.kda_head_dim + 3 * (shape.conv_kernel - 1) * p;
    assert_eq!(
        journal,
        4 * shape.kda_layers * (copy + 5 * (6 * p + shape.kda_heads))
    );
    assert_eq!(plan(4).state_bytes - plan(0).state_bytes, 3 * journal);
}
