//! Speculation rollback (spec §5.2): after a verification forward of T tokens, rolling back to
//! any of the T+1 positions since the speculation began must leave a state bit-identical to one
//! fed only the kept tokens, and the next forward's logits must be bit-identical too.

mod model_support;

use k3_engine::model::state::LayerState;
use k3_engine::model::{Logits, Model, ModelError, State};
use model_support::*;

fn run(model: &Model, state: &mut State, ids: &[u32], want: Logits) -> Vec<f32> {
    model
        .forward(state, ids, want, &no_cancel)
        .unwrap_or_else(|e| panic!("forward: {e}"))
}

fn random_ids(model: &Model, n: usize, seed: u64) -> Vec<u32> {
    let vocab = model.config().vocab_size as u64;
    let mut r = Rng::new(seed);
    (0..n).map(|_| (r.next_u64() % vocab) as u32).collect()
}

/// Every carried value's bit pattern, layer by layer, plus the position count: equality of
/// these is bitwise equality of the states (`PartialEq` on f32 would let −0 equal +0).
fn state_bits(state: &State) -> (usize, Vec<Vec<u32>>) {
    let layers = state
        .layers()
        .iter()
        .map(|l| match l {
            LayerState::Kda(k) => {
                let mut all = bits(&k.s);
                for h in &k.history {
                    all.extend(bits(h));
                }
                all
            }
            LayerState::Mla(m) => bits(&m.rows),
        })
        .collect();
    (state.positions(), layers)
}

fn fed(model: &Model, ids: &[u32]) -> State {
    let mut s = model.new_state();
    if !ids.is_empty() {
        run(model, &mut s, ids, Logits::Last);
    }
    s
}

#[test]
fn rollback_to_every_position_equals_feeding_only_the_kept_tokens() {
    for shape in ["tiny", "tiny-b", "tiny-c", "small"] {
        println!("{shape}");
        rollback_matches(shape);
    }
}

fn rollback_matches(shape: &str) {
    let ck = synth(shape, 3);
    let model = load(&ck.dir);
    let prefix = random_ids(&model, 6, 11);
    // The verification input: the last emitted token and k = 4 drafts.
    let verify = random_ids(&model, 5, 12);
    let next = random_ids(&model, 1, 13);
    let base = fed(&model, &prefix);
    for keep in 0..=verify.len() {
        let mut spec = base.clone();
        spec.begin_speculation().expect("begin");
        assert_eq!(spec.speculation_base(), Some(prefix.len()));
        run(&model, &mut spec, &verify, Logits::All);
        assert_eq!(spec.positions(), prefix.len() + verify.len());
        spec.rollback_to(prefix.len() + keep).expect("rollback");

        let kept: Vec<u32> = prefix.iter().chain(&verify[..keep]).copied().collect();
        let mut plain = fed(&model, &kept);
        assert_eq!(spec.speculation_base(), None);
        assert_eq!(
            state_bits(&spec),
            state_bits(&plain),
            "{shape}: state after keeping {keep} of {} differs from feeding only them",
            verify.len()
        );
        assert!(spec == plain, "{shape}: PartialEq disagrees at keep {keep}");
        assert_eq!(
            bits(&run(&model, &mut spec, &next, Logits::All)),
            bits(&run(&model, &mut plain, &next, Logits::All)),
            "{shape}: next logits differ after keeping {keep}"
        );
    }
    // A rollback that undoes nothing is not a no-op on the bits by luck: the state did move.
    let mut spec = base.clone();
    spec.begin_speculation().expect("begin");
    run(&model, &mut spec, &verify, Logits::Last);
    assert_ne!(state_bits(&spec), state_bits(&base));
    spec.rollback_to(prefix.len()).expect("rollback");
    assert_eq!(state_bits(&spec), state_bits(&base));
}

/// A speculation may span several forwards (e.g. chunked verification); commit keeps all.
#[test]
fn speculation_over_several_forwards_and_commit() {
    let ck = synth("tiny-c", 4);
    let model = load(&ck.dir);
    let prefix = random_ids(&model, 4, 21);
    let more = random_ids(&model, 6, 22);
    let mut spec = fed(&model, &prefix);
    spec.begin_speculation().expect("begin");
    run(&model, &mut spec, &more[..2], Logits::Last);
    run(&model, &mut spec, &more[2..], Logits::Last);
    let mut committed = spec.clone();
    spec.rollback_to(prefix.len() + 3).expect("rollback");
    let kept: Vec<u32> = prefix.iter().chain(&more[..3]).copied().collect();
    assert_eq!(state_bits(&spec), state_bits(&fed(&model, &kept)));

    committed.commit();
    let all: Vec<u32> = prefix.iter().chain(&more).copied().collect();
    assert_eq!(state_bits(&committed), state_bits(&fed(&model, &all)));
    assert!(committed == fed(&model, &all));
}

#[test]
fn misuse_is_refused_with_typed_errors() {
    let ck = synth("tiny", 5);
    let model = load(&ck.dir);
    let ids = random_ids(&model, 5, 31);
    let mut s = fed(&model, &ids[..2]);
    assert!(matches!(s.rollback_to(1), Err(ModelError::Speculation(_))));
    s.begin_speculation().expect("begin");
    assert!(matches!(
        s.begin_speculation(),
        Err(ModelError::Speculation(_))
    ));
    run(&model, &mut s, &ids[2..], Logits::Last);
    // Before the speculation's start, and past the current position.
    assert!(matches!(s.rollback_to(1), Err(ModelError::Speculation(_))));
    assert!(matches!(s.rollback_to(6), Err(ModelError::Speculation(_))));
    // A refused rollback leaves the speculation open and usable.
    assert_eq!(s.speculation_base(), Some(2));
    s.rollback_to(2).expect("rollback");
    assert_eq!(state_bits(&s), state_bits(&fed(&model, &ids[..2])));

    // A forward cancelled mid-way poisons the state; rollback refuses it.
    s.begin_speculation().expect("begin");
    let polls = std::cell::Cell::new(0);
    let cancel = || {
        polls.set(polls.get() + 1);
        polls.get() > 1
    };
    assert!(matches!(
        model.forward(&mut s, &ids[2..], Logits::Last, &cancel),
        Err(ModelError::Cancelled)
    ));
    assert!(matches!(s.rollback_to(2), Err(ModelError::StatePoisoned)));
}
