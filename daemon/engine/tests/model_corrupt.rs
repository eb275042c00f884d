//! Corrupt weights must fail the forward loudly, naming where (spec §3.5, §6.1 rule 12).

mod model_support;

use std::os::unix::fs::FileExt;

use k3_engine::checkpoint::Checkpoint;
use k3_engine::checkpoint::layout::FfnLayout;
use k3_engine::model::{Logits, ModelError};
use k3_engine::store::StoreError;
use model_support::*;

fn patch(path: &std::path::Path, offset: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open shard for patching");
    f.write_all_at(bytes, offset).expect("patch shard");
}

#[test]
fn nan_scale_byte_fails_the_forward_naming_the_expert() {
    let ck = synth("tiny", 0);
    let opened = Checkpoint::open(&ck.dir).expect("open");
    let FfnLayout::Moe(moe) = &opened.layout.layers[1].ffn else {
        panic!("layer 1 of tiny is MoE");
    };
    // Every expert of layer 1 gets a 255 at w2 scale row 3, group 0, so routing cannot avoid it.
    for (run, e) in &moe.experts {
        let groups = e.w2_scale.shape[1];
        let at = run.offset + (e.w2_scale.start + 3 * groups) as u64;
        patch(&opened.shards[run.shard].path, at, &[255]);
    }
    let model = load(&ck.dir);
    let mut state = model.new_state();
    let err = model
        .forward(&mut state, &[1, 2], Logits::Last, &no_cancel)
        .expect_err("a NaN scale must fail the forward");
    println!("{err}");
    match err {
        ModelError::Store(StoreError::NanScale {
            layer: 1,
            tensor: "w2.weight_scale",
            row: 3,
            group: 0,
            ..
        }) => {}
        other => panic!("wrong error: {other:?}"),
    }
}

#[test]
fn nan_in_the_logits_is_an_error() {
    let ck = synth("tiny", 0);
    let opened = Checkpoint::open(&ck.dir).expect("open");
    let head = &opened.layout.lm_head;
    // Row 5, column 0 of lm_head becomes a BF16 NaN: logit 5 of every position is NaN.
    let h = opened.config.hidden_size as u64;
    patch(
        &opened.shards[head.run.shard].path,
        head.run.offset + head.slice.start as u64 + 5 * h * 2,
        &[0xff, 0x7f],
    );
    let model = load(&ck.dir);
    let mut state = model.new_state();
    match model.forward(&mut state, &[1, 2, 3], Logits::All, &no_cancel) {
        Err(ModelError::NanLogits { row: 0, index: 5 }) => {}
        other => panic!("expected NanLogits at row 0 index 5, got {other:?}"),
    }
}
