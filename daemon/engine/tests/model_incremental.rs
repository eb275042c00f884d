//! Incremental decoding (spec §5.2, §6.1): one call, token by token, chunks of 2 and 3, and full
//! recompute from a zero state for every prefix must give bit-identical logits, and so must 1
//! and 2 threads. Also the forward's error contract: bad ids, cancellation, poisoned state.

mod model_support;

use k3_engine::model::{Logits, Model, ModelError, State};
use model_support::*;

const PROMPT_LEN: usize = 11;

fn prompt(model: &Model) -> Vec<u32> {
    let vocab = model.config().vocab_size as u64;
    let mut r = Rng::new(7);
    (0..PROMPT_LEN)
        .map(|_| (r.next_u64() % vocab) as u32)
        .collect()
}

fn run(model: &Model, state: &mut State, ids: &[u32], want: Logits) -> Vec<f32> {
    model
        .forward(state, ids, want, &no_cancel)
        .unwrap_or_else(|e| panic!("forward: {e}"))
}

/// All positions' logits, feeding `ids` in chunks of `chunk`.
fn chunked(model: &Model, ids: &[u32], chunk: usize) -> Vec<f32> {
    let mut state = model.new_state();
    let mut out = Vec::new();
    for c in ids.chunks(chunk) {
        out.extend(run(model, &mut state, c, Logits::All));
    }
    assert_eq!(state.positions(), ids.len());
    out
}

/// Every tiny shape: tiny-c adds block size 1, an MLA first layer and a 2-tap conv.
#[test]
fn prefill_decode_chunks_and_recompute_are_bit_identical() {
    for shape in ["tiny", "tiny-b", "tiny-c"] {
        println!("{shape}");
        incremental_matches_one_call(shape);
    }
}

fn incremental_matches_one_call(shape: &str) {
    let ck = synth(shape, 0);
    let model = load(&ck.dir);
    let ids = prompt(&model);
    let vocab = model.config().vocab_size;

    let whole = chunked(&model, &ids, ids.len());
    assert_eq!(whole.len(), ids.len() * vocab);

    // Token by token, asking for the last position only.
    let mut state = model.new_state();
    let mut stepwise = Vec::new();
    for &id in &ids {
        stepwise.extend(run(&model, &mut state, &[id], Logits::Last));
    }
    assert_eq!(
        bits(&stepwise),
        bits(&whole),
        "token by token differs from one call"
    );

    for chunk in [2, 3] {
        assert_eq!(
            bits(&chunked(&model, &ids, chunk)),
            bits(&whole),
            "chunks of {chunk} differ from one call"
        );
    }

    // Full recompute from a zero state for each prefix.
    for p in 1..=ids.len() {
        let mut fresh = model.new_state();
        let last = run(&model, &mut fresh, &ids[..p], Logits::Last);
        assert_eq!(
            bits(&last),
            bits(&whole[(p - 1) * vocab..p * vocab]),
            "recompute of prefix {p} differs"
        );
    }

    // Sanity: the logits are not degenerate (distinct positions give distinct rows).
    assert_ne!(bits(&whole[..vocab]), bits(&whole[vocab..2 * vocab]));
}

#[test]
fn one_and_two_threads_are_bit_identical() {
    let ck = synth("tiny", 1);
    let model = load(&ck.dir);
    let ids = prompt(&model);
    let with_threads = |n: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .expect("thread pool");
        pool.install(|| {
            let mut all = chunked(&model, &ids, ids.len());
            all.extend(chunked(&model, &ids, 1));
            all
        })
    };
    assert_eq!(bits(&with_threads(1)), bits(&with_threads(2)));
}

#[test]
fn forward_rejects_bad_input_and_poisons_on_cancel() {
    let ck = synth("tiny", 0);
    let model = load(&ck.dir);
    let vocab = model.config().vocab_size as u32;

    let mut state = model.new_state();
    match model.forward(&mut state, &[1, vocab], Logits::Last, &no_cancel) {
        Err(ModelError::TokenOutOfVocab { id, index: 1, .. }) => assert_eq!(id, vocab),
        other => panic!("expected TokenOutOfVocab, got {other:?}"),
    }
    assert!(matches!(
        model.forward(&mut state, &[], Logits::Last, &no_cancel),
        Err(ModelError::EmptyInput)
    ));
    // Rejected inputs leave the state untouched and usable.
    assert_eq!(state.positions(), 0);
    assert!(!state.is_poisoned());

    // Cancel after two layer boundaries: the state is left part-way and must be refused.
    let polls = std::cell::Cell::new(0);
    let cancel = || {
        polls.set(polls.get() + 1);
        polls.get() > 2
    };
    assert!(matches!(
        model.forward(&mut state, &[1, 2, 3], Logits::Last, &cancel),
        Err(ModelError::Cancelled)
    ));
    assert!(state.is_poisoned());
    assert!(matches!(
        model.forward(&mut state, &[1], Logits::Last, &no_cancel),
        Err(ModelError::StatePoisoned)
    ));
    // A snapshot taken before a call continues exactly like the original.
    let mut a = model.new_state();
    run(&model, &mut a, &[5, 6], Logits::Last);
    let mut b = a.clone();
    assert_eq!(
        bits(&run(&model, &mut a, &[7], Logits::Last)),
        bits(&run(&model, &mut b, &[7], Logits::Last))
    );
}
