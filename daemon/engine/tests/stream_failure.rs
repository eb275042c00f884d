//! A weight read that fails during a run fails the forward loudly (issue 4, engine-lessons
//! §8.2): a shard truncated on disk after load, under a budget that streams trunk layers, gives
//! a read error naming the file and offset — no panic, no token presented as valid. (`k3d run`
//! maps this engine error, `EngineError::Model`, to exit 4.)

use k3_engine::engine::{Engine, EngineError, EngineOptions, GenerateRequest, Step};
use k3_engine::model::ModelError;
use k3_engine::plan::Plan;
use k3_engine::store::{StoreError, Weights};

mod synth_support;
use synth_support::tiny_at_minimum_budget;

#[test]
fn shard_truncated_during_a_run_fails_the_step_with_file_and_offset() {
    // The minimum budget: every trunk layer but the largest streams.
    let (dir, checkpoint, model) = tiny_at_minimum_budget("stream-fail");
    let plan = Plan::for_model(&checkpoint.config, &checkpoint.layout, &model.plan).expect("plan");
    let streamed: Vec<usize> = (0..plan.layer_count)
        .filter(|l| !plan.pinned_layers.contains(l))
        .collect();
    assert!(
        streamed.len() >= 2,
        "the minimum budget streams trunk layers"
    );
    let options = EngineOptions {
        threads: 1,
        model,
        ..EngineOptions::default()
    };
    let engine = Engine::open(dir.path(), options, &mut |_| {}).expect("engine");
    let mut generation = engine
        .start(GenerateRequest {
            prompt: vec![1, 2, 3],
            max_tokens: 8,
            ..GenerateRequest::default()
        })
        .expect("start");
    if let Err(e) = engine.step(&mut generation, &|| false) {
        panic!("first step before the truncation: {e}");
    }
    // Cut the shard of the last streamed layer just before its trunk run.
    let victim = *streamed.last().expect("a streamed layer");
    let run = checkpoint.layout.layers[victim].trunk;
    let path = checkpoint.shards[run.shard].path.clone();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(run.offset))
        .expect("truncate shard");
    let mut failure = None;
    for _ in 0..8 {
        match engine.step(&mut generation, &|| false) {
            Ok(Step::Finished(_)) => break,
            Ok(_) => {}
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let e = failure.expect("a step after the truncation fails");
    let text = e.to_string();
    assert!(
        matches!(
            e,
            EngineError::Model(ModelError::Store(StoreError::WeightRead {
                what: Weights::Trunk { .. },
                ..
            }))
        ),
        "a read error, got {e:?}"
    );
    assert!(
        text.contains(&path.display().to_string()),
        "names the file: {text}"
    );
    assert!(text.contains("offset"), "names the offset: {text}");
    assert!(
        text.contains(&format!("the trunk of layer {victim}")),
        "names the class: {text}"
    );
}
