//! The store follows its plan's memory or refuses it: a plan that streams trunk in chunks (which
//! the forward pass cannot consume yet) is refused at open, instead of streaming whole layers
//! through buffers the plan never counted.

use k3_engine::model::{LoadOptions, Model, ModelError};
use k3_engine::plan::{Budget, PlanInputs, StreamScheme};
use k3_engine::store::StoreError;

mod synth_support;
use synth_support::synth;

#[test]
fn a_chunk_streaming_plan_is_refused_not_overspent() {
    let dir = tempfile::tempdir().expect("temp dir");
    synth("tiny", dir.path());
    let checkpoint = k3_engine::checkpoint::Checkpoint::open(dir.path()).expect("checkpoint");
    let streaming = |scheme| LoadOptions {
        plan: PlanInputs {
            // A trunk cap of one byte pins nothing: every trunk layer streams.
            budget: Budget {
                ram: Some(2 << 30),
                trunk: Some(1),
                ..Budget::default()
            },
            scheme,
            ..PlanInputs::default()
        },
        ..LoadOptions::default()
    };
    match Model::load(&checkpoint, streaming(StreamScheme::default_chunks())) {
        Err(ModelError::Store(StoreError::ChunksUnsupported { .. })) => {}
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a chunk-streaming plan was accepted"),
    }
    Model::load(&checkpoint, streaming(StreamScheme::default())).expect("the ring plan loads");
    // Nothing streams at max: the scheme does not matter.
    let max = LoadOptions {
        plan: PlanInputs {
            scheme: StreamScheme::default_chunks(),
            ..PlanInputs::default()
        },
        ..LoadOptions::default()
    };
    Model::load(&checkpoint, max).expect("a plan that streams nothing loads");
}
