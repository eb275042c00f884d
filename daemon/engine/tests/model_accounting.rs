//! Compute vs I/O accounting (issue 4 §7, `k3d bench`): `Model::compute_seconds` is forward
//! time not spent waiting for reads *during forwards*. Binding the layers at load reads every
//! streamed trunk layer and waits for it; that wait must not be subtracted from the first
//! forward's compute (it was, making `bench`'s prefill compute come out near zero).

use std::time::Instant;

use k3_engine::model::{Logits, Model};

mod synth_support;
use synth_support::tiny_at_minimum_budget;

#[test]
fn load_time_read_waits_are_not_charged_to_the_first_forward() {
    let (_dir, checkpoint, options) = tiny_at_minimum_budget("accounting");
    let model = Model::load(&checkpoint, options).expect("load at the minimum budget");
    let load_wait = model.store_stats().io_seconds;
    assert!(
        load_wait > 0.0,
        "binding streamed layers at load waits for their reads"
    );
    assert_eq!(model.compute_seconds(), 0.0, "no forward yet");

    let mut state = model.new_state();
    let t = Instant::now();
    model
        .forward(&mut state, &[1, 2, 3], Logits::Last, &|| false)
        .expect("forward");
    let wall = t.elapsed().as_secs_f64();
    let forward_wait = model.store_stats().io_seconds - load_wait;
    let accounted = model.compute_seconds() + forward_wait;
    // Accounted = the forward's own wall time (up to the clock reads around it); charging the
    // load's waits would make it short by `load_wait`.
    assert!(
        (wall - accounted).abs() < load_wait / 2.0,
        "compute {} + forward waits {forward_wait} = {accounted} s against {wall} s of forward \
         (load waited {load_wait} s)",
        model.compute_seconds()
    );
}
