//! States kept during a prefill (`GenerateRequest::keep_at`, issue 34 point 5): the prefill ends
//! a chunk at each asked position, the state kept there is exactly a fresh prefill of those
//! ids, continuing it gives the same logit bits as prefilling the whole prompt, and keeping
//! states changes nothing the generation computes — at every prefill chunk size. A kept state
//! written to the session directory and loaded by another store — a restarted daemon's —
//! continues to the same logit bits as a fresh prefill, at two thread counts and two budgets
//! (issue 42 point 4).

mod model_support;
mod synth_support;

use k3_engine::engine::{Engine, EngineError, EngineOptions, GenerateRequest, Step};
use k3_engine::model::{LoadOptions, Logits, State};
use k3_engine::session::{SessionStore, Snapshot};
use model_support::*;

/// Runs `request` to its end; the generated ids and every state it kept, in order.
fn run(engine: &Engine, request: GenerateRequest) -> (Vec<u32>, Vec<State>) {
    let mut g = engine.start(request).expect("start");
    let mut kept = Vec::new();
    loop {
        match engine.step(&mut g, &|| false).expect("step") {
            Step::Prefill { .. } => kept.extend(g.take_kept()),
            Step::Token { .. } => assert!(g.take_kept().is_empty(), "kept after the prefill"),
            Step::Finished(s) => return (s.generated, kept),
        }
    }
}

#[test]
fn kept_states_are_fresh_prefills_and_continue_to_the_same_logit_bits() {
    let ck = synth("tiny", 21);
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 37 + 5) % 250).collect();
    let keep_at = vec![1, 7, 8, 33, 39, 40];
    let mut outputs = Vec::new();
    for chunk in [1, 3, 32] {
        let options = EngineOptions {
            threads: 1,
            prefill_chunk: chunk,
            ..EngineOptions::default()
        };
        let engine = Engine::open(&ck.dir, options, &mut |_| {}).expect("engine");
        let model = engine.model();
        let vocab = model.config().vocab_size;
        let request = GenerateRequest {
            prompt: prompt.clone(),
            max_tokens: 6,
            ..GenerateRequest::default()
        };
        let (plain, none) = run(&engine, request.clone());
        assert!(none.is_empty());
        let (generated, kept) = run(
            &engine,
            GenerateRequest {
                keep_at: keep_at.clone(),
                ..request
            },
        );
        assert_eq!(
            generated, plain,
            "keeping states changed the output (chunk {chunk})"
        );
        let positions: Vec<usize> = kept.iter().map(State::positions).collect();
        assert_eq!(positions, keep_at, "chunk {chunk}");
        let mut whole = model.new_state();
        let all = model
            .forward(&mut whole, &prompt, Logits::All, &no_cancel)
            .expect("whole prompt");
        for state in kept {
            let p = state.positions();
            let mut fresh = model.new_state();
            model
                .forward(&mut fresh, &prompt[..p], Logits::Last, &no_cancel)
                .expect("fresh prefix");
            assert_eq!(fresh, state, "state at {p} (chunk {chunk})");
            if p < prompt.len() {
                let mut continued = state;
                let rest = model
                    .forward(&mut continued, &prompt[p..], Logits::All, &no_cancel)
                    .expect("continue");
                assert_eq!(
                    bits(&rest),
                    bits(&all[p * vocab..]),
                    "logits after continuing at {p} (chunk {chunk})"
                );
                assert_eq!(continued, whole);
            }
        }
        outputs.push(generated);
    }
    assert!(outputs.windows(2).all(|w| w[0] == w[1]), "{outputs:?}");
}

#[test]
fn keep_points_outside_the_prompt_or_out_of_order_are_refused() {
    let ck = synth("tiny", 22);
    let options = EngineOptions {
        threads: 1,
        ..EngineOptions::default()
    };
    let engine = Engine::open(&ck.dir, options, &mut |_| {}).expect("engine");
    for keep_at in [vec![0], vec![5], vec![3, 2], vec![2, 2]] {
        let request = GenerateRequest {
            prompt: vec![1, 2, 3, 4],
            max_tokens: 1,
            keep_at: keep_at.clone(),
            ..GenerateRequest::default()
        };
        match engine.start(request) {
            Err(EngineError::InvalidRequest(why)) => {
                assert!(why.contains("states to keep"), "{keep_at:?}: {why}")
            }
            Err(e) => panic!("{keep_at:?}: {e}"),
            Ok(_) => panic!("{keep_at:?} was accepted"),
        }
    }
}

#[test]
fn a_state_loaded_from_disk_continues_to_the_logit_bits_of_a_fresh_prefill() {
    let ck = synth("tiny", 23);
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 53 + 11) % 250).collect();
    let at = 29;
    let scratch = tempfile::tempdir().expect("scratch");
    let sessions = scratch.path().join("sessions");
    let owner = 1000;
    // Kept by one engine and written to disk as the serve core does.
    let fingerprint = {
        let options = EngineOptions {
            threads: 1,
            ..EngineOptions::default()
        };
        let engine = Engine::open(&ck.dir, options, &mut |_| {}).expect("engine");
        let request = GenerateRequest {
            prompt: prompt.clone(),
            max_tokens: 1,
            keep_at: vec![at],
            ..GenerateRequest::default()
        };
        let (_, mut kept) = run(&engine, request);
        let snapshot = Snapshot {
            history: prompt[..at].to_vec(),
            state: kept.pop().expect("the kept state"),
        };
        let fingerprint = engine.info().fingerprint.clone();
        let (mut store, _) = SessionStore::open(&sessions, &fingerprint, u64::MAX).expect("store");
        let write = store
            .reserve_kept(owner, &snapshot, true)
            .expect("room")
            .expect("not on disk yet");
        let written = write.write(&snapshot);
        store.commit_kept(&write, &written);
        written.expect("written");
        fingerprint
    };
    let checkpoint = k3_engine::checkpoint::Checkpoint::open(&ck.dir).expect("checkpoint");
    let minimum = synth_support::minimum_budget(&checkpoint);
    let mut continuations = Vec::new();
    for threads in [1, 2] {
        for model in [LoadOptions::default(), synth_support::ram_budget(minimum)] {
            let options = EngineOptions {
                threads,
                model,
                ..EngineOptions::default()
            };
            let engine = Engine::open(&ck.dir, options, &mut |_| {}).expect("engine");
            let model = engine.model();
            let vocab = model.config().vocab_size;
            // A restarted daemon's store: it finds the state by the prompt's ids.
            let (mut store, skipped) =
                SessionStore::open(&sessions, &fingerprint, u64::MAX).expect("store");
            assert!(skipped.is_empty(), "{skipped:?}");
            let (loaded, damaged) = store.load_kept(owner, &prompt, 0);
            assert!(damaged.is_empty(), "{damaged:?}");
            let (snapshot, prelude) = loaded.expect("the state on disk");
            assert!(prelude);
            assert_eq!(snapshot.history, prompt[..at]);
            let mut fresh = model.new_state();
            let all = model
                .forward(&mut fresh, &prompt, Logits::All, &no_cancel)
                .expect("fresh prefill");
            let mut continued = snapshot.state;
            let rest = model
                .forward(&mut continued, &prompt[at..], Logits::All, &no_cancel)
                .expect("continued");
            let at_threads = format!("{threads} threads, {:?}", engine.info().plan);
            assert_eq!(bits(&rest), bits(&all[at * vocab..]), "{at_threads}");
            assert_eq!(continued, fresh, "{at_threads}");
            continuations.push(bits(&rest));
        }
    }
    assert!(continuations.windows(2).all(|w| w[0] == w[1]));
}
