//! Checkpoint variants that hold the same numbers load and compute the same bits (issue 19):
//! a synthetic checkpoint whose small vectors (spec §3.3: norms, AttnRes projections, conv taps,
//! `A_log`, `dt_bias`, router bias) are rewritten from BF16 to F32, or to F16, gives logits
//! bit-identical to the original at every position.

use std::path::Path;

use k3_engine::checkpoint::Checkpoint;
use k3_engine::checkpoint::safetensors::Dtype;
use k3_engine::model::{LoadOptions, Logits, Model};

mod synth_support;
use synth_support::synth;
mod variant_support;
use variant_support::convert;

fn logits(dir: &Path, ids: &[u32]) -> Vec<u32> {
    let model = Model::load(
        &Checkpoint::open(dir).expect("opens"),
        LoadOptions::default(),
    )
    .expect("loads");
    let mut state = model.new_state();
    let all = model
        .forward(&mut state, ids, Logits::All, &|| false)
        .expect("forward");
    all.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn small_vectors_stored_f32_or_f16_give_the_same_bits() {
    let scratch = tempfile::tempdir().expect("temp dir");
    let base = scratch.path();
    let original = base.join("original");
    synth("tiny", &original);
    let ids: Vec<u32> = vec![1, 17, 42, 5, 39, 3, 25, 7];
    let expected = logits(&original, &ids);
    for dtype in [Dtype::F32, Dtype::F16] {
        let dir = base.join(dtype.name());
        let converted = convert(&original, &dir, dtype);
        assert!(converted > 10, "only {converted} vectors converted");
        let ck = Checkpoint::open(&dir).expect("the variant binds");
        assert_eq!(
            ck.layout.norm.slice.dtype, dtype,
            "the model-level norm was converted"
        );
        assert!(
            expected == logits(&dir, &ids),
            "{dtype} vectors changed the logits"
        );
    }
}
