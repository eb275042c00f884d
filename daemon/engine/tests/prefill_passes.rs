//! Layer-major prefill (issue 30): a long prompt runs as ONE pass over the model's layers —
//! each weight read once for all its tokens — advanced a layer at a time so other sequences'
//! decode steps run in between. Pinned here:
//!
//! * a ≥ 300-token prompt crossing many chunks gives the same logit bytes (every position) as
//!   the chunked forward, with another sequence decoding between every two layers, at three
//!   budgets (everything resident, trunk partly pinned, the minimum with everything streamed)
//!   and 1 and 2 threads;
//! * the engine feeds it as one pass (one step per layer, progress in layers), generates the
//!   same ids as chunked prefill at every budget and thread count, and reads fewer weight
//!   bytes for it than chunked prefill where the trunk streams;
//! * a decoding request keeps getting tokens while the pass runs; a cancelled pass gives its
//!   share of the plan's pass memory back;
//! * in the batch loop a short request beside a pass waits for none of its layers, and a
//!   stream of short requests still leaves the pass a layer every few rounds.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use k3_engine::checkpoint::Checkpoint;
use k3_engine::engine::{Engine, EngineError, EngineOptions, GenerateRequest, Step};
use k3_engine::model::{LoadOptions, Logits, Model, Sequence};
use k3_engine::plan::inputs::pass_bytes_per_token;
use k3_engine::plan::{Budget, Plan, PlanError, PlanInputs};
use k3_engine::serve::batch::{Batch, MOST_HELD_ROUNDS};

mod synth_support;
use synth_support::synth;

/// Prompt tokens: more than nine 32-token chunks.
const PROMPT_TOKENS: usize = 300;
/// Tokens the plan is asked to hold a pass for.
const PASS_TOKENS: u64 = 512;

fn prompt(vocab: usize, seed: u64, n: usize) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| (k3_engine::rng::splitmix64(&mut s) % vocab as u64) as u32)
        .collect()
}

fn inputs(budget: Budget, prefill_tokens: u64) -> PlanInputs {
    PlanInputs {
        budget,
        prefill_tokens,
        sequences: 2,
        ..PlanInputs::default()
    }
}

/// `ram` with at most `trunk` bytes pinned and no read-ahead beyond the stream's own: the
/// plan then has a known place for everything else, and the pass (which comes after the
/// trunk, lm_head and read-ahead) gets the rest.
fn capped(ram: u64, trunk: u64) -> Budget {
    Budget {
        ram: Some(ram),
        trunk: Some(trunk),
        read_ahead: Some(0),
        ..Budget::default()
    }
}

/// The smallest budget whose plan holds a whole pass of [`PASS_TOKENS`] with nothing pinned:
/// the floor without passes, a resident lm_head (placed before the pass) and the pass's
/// activations.
fn minimum_with_pass(c: &Checkpoint) -> u64 {
    let lm_head = Plan::for_model(&c.config, &c.layout, &inputs(Budget::default(), 0))
        .expect("max plan")
        .lm_head_bytes;
    match Plan::for_model(&c.config, &c.layout, &inputs(capped(1, 0), 0)) {
        Err(PlanError::BudgetTooSmall { needed, .. }) => {
            needed + lm_head + PASS_TOKENS * pass_bytes_per_token(&c.config)
        }
        other => panic!("a 1-byte budget must be refused, got {other:?}"),
    }
}

/// Three budgets: everything resident; half the trunk pinned; the minimum (nothing pinned).
fn budgets(c: &Checkpoint) -> Vec<(String, Budget)> {
    let min = minimum_with_pass(c);
    let half = Plan::for_model(
        &c.config,
        &c.layout,
        &inputs(Budget::default(), PASS_TOKENS),
    )
    .expect("max plan")
    .pinned_trunk_bytes
        / 2;
    vec![
        ("max".into(), Budget::default()),
        (
            format!("half the trunk, {}", min + half),
            capped(min + half, half),
        ),
        (format!("minimum {min}"), capped(min, 0)),
    ]
}

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
        .install(f)
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Every position's logits of `ids` fed in 32-token chunks.
fn chunked(model: &Model, ids: &[u32]) -> Vec<u32> {
    let mut state = model.new_state();
    let mut out = Vec::new();
    for chunk in ids.chunks(32) {
        let logits = model
            .forward(&mut state, chunk, Logits::All, &|| false)
            .expect("chunk");
        out.extend(bits(&logits));
    }
    out
}

/// `ids` as one layer-major pass advanced one layer at a time, with `other` (a sequence being
/// decoded: its prompt, then its argmax fed back) taking a whole decode step between every two
/// layers. Returns the pass's logits bits and the other sequence's.
fn one_pass_interleaved(model: &Model, ids: &[u32], other: &[u32]) -> (Vec<u32>, Vec<u32>) {
    let vocab = model.config().vocab_size;
    let mut state = model.new_state();
    let mut o_state = model.new_state();
    let mut o_bits = Vec::new();
    let mut next = model
        .forward(&mut o_state, other, Logits::Last, &|| false)
        .expect("other's prompt");
    let mut seqs = [Sequence {
        state: &mut state,
        ids,
        want: Logits::All,
    }];
    let mut pass = model.begin(&mut seqs, &|| false).expect("begin");
    loop {
        let done = model
            .advance(&mut pass, &mut seqs, 1, &|| false)
            .expect("advance");
        if let Some(mut logits) = done {
            assert_eq!(pass.layers_done(), pass.layers());
            return (bits(&logits.pop().expect("one member")), o_bits);
        }
        // Another user's decode step between two layers of the pass.
        o_bits.extend(bits(&next));
        let id = (0..vocab)
            .max_by(|&a, &b| next[a].total_cmp(&next[b]).then(b.cmp(&a)))
            .expect("a vocabulary") as u32;
        next = model
            .forward(&mut o_state, &[id], Logits::Last, &|| false)
            .expect("other's decode step");
    }
}

/// The other sequence's logits decoded alone, as many steps as it took inside the pass.
fn other_alone(model: &Model, other: &[u32], steps: usize) -> Vec<u32> {
    let vocab = model.config().vocab_size;
    let mut state = model.new_state();
    let mut out = Vec::new();
    let mut next = model
        .forward(&mut state, other, Logits::Last, &|| false)
        .expect("other's prompt");
    for _ in 0..steps {
        out.extend(bits(&next));
        let id = (0..vocab)
            .max_by(|&a, &b| next[a].total_cmp(&next[b]).then(b.cmp(&a)))
            .expect("a vocabulary") as u32;
        next = model
            .forward(&mut state, &[id], Logits::Last, &|| false)
            .expect("decode");
    }
    out
}

#[test]
fn a_long_prompt_in_one_pass_gives_the_chunked_logit_bytes_at_every_budget_and_thread_count() {
    let dir = tempfile::tempdir().expect("temp dir");
    synth("tiny", dir.path());
    let c = Checkpoint::open(dir.path()).expect("open");
    let ids = prompt(c.config.vocab_size, 30, PROMPT_TOKENS);
    let other = prompt(c.config.vocab_size, 31, 5);
    let reference = {
        let model = Model::load(&c, LoadOptions::default()).expect("load");
        in_pool(1, || chunked(&model, &ids))
    };
    assert_eq!(reference.len(), PROMPT_TOKENS * c.config.vocab_size);
    let mut other_reference = None;
    for (name, budget) in budgets(&c) {
        let options = LoadOptions {
            plan: inputs(budget, PASS_TOKENS),
            ..LoadOptions::default()
        };
        let model = Model::load(&c, options).unwrap_or_else(|e| panic!("{name}: {e}"));
        for threads in [1, 2] {
            let (got, o_got) = in_pool(threads, || one_pass_interleaved(&model, &ids, &other));
            assert!(got == reference, "{name}, {threads} threads: logits differ");
            let o_want = other_reference.get_or_insert_with(|| {
                in_pool(1, || {
                    other_alone(&model, &other, o_got.len() / c.config.vocab_size)
                })
            });
            assert!(
                o_got == *o_want,
                "{name}, {threads} threads: the interleaved decode differs from decoding alone"
            );
        }
    }
}

fn engine(dir: &Path, threads: usize, budget: Budget, prefill_tokens: u64) -> Engine {
    let options = EngineOptions {
        threads,
        model: LoadOptions {
            plan: inputs(budget, prefill_tokens),
            ..LoadOptions::default()
        },
        ..EngineOptions::default()
    };
    Engine::open(dir, options, &mut |_| {}).unwrap_or_else(|e| panic!("engine: {e}"))
}

/// What a greedy generation of `ids` did: its ids, the prefill steps' progress, and the weight
/// bytes read while prefilling.
struct Run {
    generated: Vec<u32>,
    prefill_steps: Vec<Step>,
    prefill_bytes: u64,
}

fn generate(engine: &Engine, ids: &[u32], max_tokens: usize) -> Run {
    let mut g = engine
        .start(GenerateRequest {
            prompt: ids.to_vec(),
            max_tokens,
            ..GenerateRequest::default()
        })
        .expect("start");
    let before = engine.stats().store.bytes_read;
    let mut prefill_steps = Vec::new();
    let mut prefill_bytes = 0;
    loop {
        match engine.step(&mut g, &|| false).expect("step") {
            s @ Step::Prefill { done, total, .. } => {
                prefill_steps.push(s);
                if done == total {
                    prefill_bytes = engine.stats().store.bytes_read - before;
                }
            }
            Step::Token { .. } => {}
            Step::Finished(summary) => {
                return Run {
                    generated: summary.generated,
                    prefill_steps,
                    prefill_bytes,
                };
            }
        }
    }
}

#[test]
fn the_engine_feeds_a_long_prompt_as_one_pass_with_the_chunked_ids() {
    let dir = tempfile::tempdir().expect("temp dir");
    synth("tiny", dir.path());
    let c = Checkpoint::open(dir.path()).expect("open");
    let layers = c.config.num_hidden_layers;
    let ids = prompt(c.config.vocab_size, 40, PROMPT_TOKENS);
    let chunked = generate(&engine(dir.path(), 1, Budget::default(), 0), &ids, 6);
    assert_eq!(chunked.prefill_steps.len(), PROMPT_TOKENS.div_ceil(32));
    for (name, budget) in budgets(&c) {
        for threads in [1, 2] {
            let e = engine(dir.path(), threads, budget, PASS_TOKENS);
            assert_eq!(
                e.pass_tokens(),
                PASS_TOKENS as usize,
                "{name}: the plan holds the pass"
            );
            let run = generate(&e, &ids, 6);
            assert_eq!(
                run.generated, chunked.generated,
                "{name}, {threads} threads"
            );
            // One step per layer: progress in layers, the tokens in the state at the last.
            let progress: Vec<(usize, Option<usize>)> = run
                .prefill_steps
                .iter()
                .map(|s| match s {
                    Step::Prefill { done, pass, .. } => (*done, pass.map(|p| p.layers_done)),
                    _ => unreachable!(),
                })
                .collect();
            let mut want: Vec<(usize, Option<usize>)> = (1..layers).map(|l| (0, Some(l))).collect();
            want.push((PROMPT_TOKENS, None));
            assert_eq!(progress, want, "{name}, {threads} threads");
        }
    }
    // Where the trunk streams, chunked prefill reads it once per chunk; one pass reads it once.
    // The same plan but for the pass's activations: the minimum with them, and without.
    let min = minimum_with_pass(&c);
    let pass_bytes = PASS_TOKENS * pass_bytes_per_token(&c.config);
    let one = generate(&engine(dir.path(), 1, capped(min, 0), PASS_TOKENS), &ids, 1);
    let many = generate(
        &engine(dir.path(), 1, capped(min - pass_bytes, 0), 0),
        &ids,
        1,
    );
    assert_eq!(one.generated, many.generated);
    assert!(
        one.prefill_bytes * 5 < many.prefill_bytes,
        "one pass read {} B, chunks {} B",
        one.prefill_bytes,
        many.prefill_bytes
    );
}

#[test]
fn a_decode_runs_between_the_layers_of_a_pass_and_a_cancelled_pass_frees_its_tokens() {
    let dir = tempfile::tempdir().expect("temp dir");
    synth("tiny", dir.path());
    let c = Checkpoint::open(dir.path()).expect("open");
    let layers = c.config.num_hidden_layers;
    let e = engine(dir.path(), 2, Budget::default(), PASS_TOKENS);
    let long = prompt(c.config.vocab_size, 50, PROMPT_TOKENS);
    let short = prompt(c.config.vocab_size, 51, 4);
    let alone = generate(&e, &short, 4).generated;
    let request = |ids: &[u32], max_tokens| GenerateRequest {
        prompt: ids.to_vec(),
        max_tokens,
        ..GenerateRequest::default()
    };
    let mut decoder = e.start(request(&short, 4)).expect("start");
    let mut prefiller = e.start(request(&long, 1)).expect("start");
    // Rounds of the batch loop with both members: the decoder has its 4 tokens while the
    // pass is still running.
    let never = || false;
    let mut tokens = Vec::new();
    let mut rounds = 0;
    while tokens.len() < 4 {
        rounds += 1;
        let out = e.step_batch(&mut [&mut decoder, &mut prefiller], &[&never, &never]);
        if let Ok(Step::Token { id }) = &out[0] {
            tokens.push(*id);
        }
        assert!(
            matches!(out[1], Ok(Step::Prefill { pass: Some(_), .. })),
            "round {rounds}: {:?}",
            out[1]
        );
    }
    assert_eq!(tokens, alone);
    assert!(rounds < layers, "the decoder waited for the pass");
    // Cancel the pass between two layers: it ends, and a new prompt gets the whole pass.
    let cancelled = AtomicBool::new(true);
    let cancel = || cancelled.load(Ordering::Relaxed);
    let out = e.step_batch(&mut [&mut prefiller], &[&cancel]);
    assert!(
        matches!(out[0], Err(EngineError::Cancelled)),
        "{:?}",
        out[0]
    );
    drop(prefiller);
    let mut next = e.start(request(&long, 1)).expect("start");
    match e.step(&mut next, &|| false) {
        Ok(Step::Prefill { pass: Some(p), .. }) => assert_eq!(p.tokens, PROMPT_TOKENS),
        other => panic!("expected a pass of the whole prompt, got {other:?}"),
    }
}

/// Issue 41.5: where the pass's bytes come out of the expert cache, the cache holds them while
/// no pass runs. At such a budget a short prompt (no pass) and its decode read exactly the
/// expert bytes they read without any pass planned — the same cache — and a long prompt runs as
/// one pass, taking its slots back, with the same ids as chunked prefill.
#[test]
fn a_short_prompt_reads_with_the_cache_the_pass_lends_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    synth("tiny", dir.path());
    let c = Checkpoint::open(dir.path()).expect("open");
    let plan = |budget, tokens| Plan::for_model(&c.config, &c.layout, &inputs(budget, tokens));
    let total = plan(Budget::default(), 0).expect("max plan").total();
    let min = minimum_with_pass(&c);
    let budget = (0..200u64)
        .map(|i| capped(min + total * i / 200, 0))
        .find(|&b| match (plan(b, 0), plan(b, PASS_TOKENS)) {
            (Ok(chunked), Ok(pass)) => {
                pass.prefill_tokens == PASS_TOKENS
                    && pass.cache_slots < chunked.cache_slots
                    && pass.idle_cache_slots() == chunked.cache_slots
            }
            _ => false,
        })
        .expect("a budget where the pass takes expert-cache slots");
    let pass = plan(budget, PASS_TOKENS).expect("plans");
    assert!(pass.pass_cache_slots > 0, "{pass}");
    // Expert bytes: the embedding may stream in one plan and not the other (the pass takes
    // from its residency too).
    let bytes_read = |e: &Engine| e.stats().store.expert_bytes_read;
    let short = prompt(c.config.vocab_size, 60, 8);
    let (lending, without) = (
        engine(dir.path(), 1, budget, PASS_TOKENS),
        engine(dir.path(), 1, budget, 0),
    );
    let (before_l, before_w) = (bytes_read(&lending), bytes_read(&without));
    let a = generate(&lending, &short, 6);
    let b = generate(&without, &short, 6);
    assert_eq!(a.generated, b.generated);
    assert_eq!(
        bytes_read(&lending) - before_l,
        bytes_read(&without) - before_w,
        "the short prompt and its decode read with the same cache"
    );
    let long = prompt(c.config.vocab_size, 61, PROMPT_TOKENS);
    let one = generate(&lending, &long, 3);
    assert_eq!(
        one.prefill_steps.len(),
        c.config.num_hidden_layers,
        "one pass"
    );
    assert_eq!(one.generated, generate(&without, &long, 3).generated);
    // The slots came back: another short prompt still reads with the whole cache.
    assert_eq!(
        generate(&lending, &short, 6).generated,
        generate(&without, &short, 6).generated
    );
}

/// The batch loop with a long prompt's pass running: a short request (its prompt's one chunk,
/// its first token, its end) is stepped in rounds the pass sits out, so its reply waits for no
/// layer; and however many short requests keep arriving, the pass runs a layer at least every
/// `MOST_HELD_ROUNDS + 1` rounds, and ends with the same token as alone.
#[test]
fn a_short_request_beside_a_pass_waits_for_no_layer_and_the_pass_goes_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    synth("tiny", dir.path());
    let c = Checkpoint::open(dir.path()).expect("open");
    let e = engine(dir.path(), 1, Budget::default(), PASS_TOKENS);
    let long = prompt(c.config.vocab_size, 60, PROMPT_TOKENS);
    let short = prompt(c.config.vocab_size, 61, 4);
    let request = |ids: &[u32]| GenerateRequest {
        prompt: ids.to_vec(),
        max_tokens: 1,
        ..GenerateRequest::default()
    };
    let alone = generate(&e, &long, 1).generated;
    let is_long = |g: &k3_engine::engine::Generation| g.request().prompt.len() == PROMPT_TOKENS;
    let mut batch = Batch::new(8);
    batch.push(e.start(request(&long)).expect("start"));
    // The pass begins (and runs its first layer) alone.
    for (g, r) in batch.round(&e) {
        assert!(
            matches!(r, Ok(Step::Prefill { pass: Some(_), .. })),
            "{r:?}"
        );
        batch.push(g);
    }
    // A short request joins: its three steps come in the next three rounds, without the pass.
    batch.push(e.start(request(&short)).expect("start"));
    let mut short_steps = Vec::new();
    for round in 1..=3 {
        for (g, r) in batch.round(&e) {
            assert!(
                !is_long(&g),
                "round {round}: the short request waited for a layer"
            );
            let r = r.expect("a step");
            if !matches!(r, Step::Finished(_)) {
                batch.push(g);
            }
            short_steps.push(r);
        }
    }
    assert!(
        matches!(
            short_steps.as_slice(),
            [Step::Prefill { .. }, Step::Token { .. }, Step::Finished(_)]
        ),
        "{short_steps:?}"
    );
    // A new short request every round: the pass still runs a layer every few rounds.
    let (mut since_layer, mut longest_wait, mut generated) = (0, 0, None);
    while generated.is_none() {
        batch.push(e.start(request(&short)).expect("start"));
        since_layer += 1;
        for (g, r) in batch.round(&e) {
            let r = r.expect("a step");
            if is_long(&g) {
                longest_wait = longest_wait.max(since_layer);
                since_layer = 0;
                if let Step::Token { id } = r {
                    generated = Some(vec![id]);
                }
            }
            if !matches!(r, Step::Finished(_)) {
                batch.push(g);
            }
        }
    }
    assert!(
        longest_wait <= MOST_HELD_ROUNDS + 1,
        "the pass waited {longest_wait} rounds"
    );
    assert_eq!(generated.expect("a token"), alone);
}
