//! The store reading the trunk pack (issue 31.1): with a pack, the chunk stream reads the
//! streamed matrices' packed blocks through the same reader threads and decodes them before
//! the forward pass sees them. Logits and ids are bit-identical to the shards' at every budget
//! that streams (nothing pinned, some pinned, lm_head streamed or not) and thread count; each
//! token reads the pack's bytes the plan predicts, fewer than the shards'; the plan says when
//! a pack is not read and why; a pack of another checkpoint is refused at load.

mod synth_support;

use std::path::{Path, PathBuf};

use k3_engine::checkpoint::Checkpoint;
use k3_engine::checkpoint::verify::ByteProgress;
use k3_engine::model::{LoadOptions, Logits, Model, TrunkPack};
use k3_engine::pack;
use k3_engine::plan::{Budget, PackPlan, PackRefusal, Plan, PlanError, PlanInputs};

const PROMPT: [u32; 5] = [1, 7, 3, 12, 5];

/// A prompt, then decode steps fed the previous argmax: (every logit's bits, the ids chosen).
fn run(model: &Model, steps: usize) -> (Vec<u32>, Vec<u32>) {
    let mut state = model.new_state();
    let mut bits = Vec::new();
    let mut ids = Vec::new();
    let mut logits = model
        .forward(&mut state, &PROMPT, Logits::All, &|| false)
        .expect("prompt");
    let vocab = model.config().vocab_size;
    for _ in 0..steps {
        bits.extend(logits.iter().map(|v| v.to_bits()));
        let last = &logits[logits.len() - vocab..];
        let next = (0..vocab)
            .max_by(|&a, &b| last[a].total_cmp(&last[b]).then(b.cmp(&a)))
            .expect("a vocabulary") as u32;
        ids.push(next);
        logits = model
            .forward(&mut state, &[next], Logits::Last, &|| false)
            .expect("decode step");
    }
    bits.extend(logits.iter().map(|v| v.to_bits()));
    (bits, ids)
}

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
        .install(f)
}

fn options(ram: Option<u64>, pack: Option<(&Path, bool)>) -> LoadOptions {
    LoadOptions {
        plan: PlanInputs {
            budget: Budget {
                ram,
                ..Budget::default()
            },
            ..PlanInputs::default()
        },
        trunk_pack: pack.map(|(path, always)| TrunkPack {
            path: path.to_path_buf(),
            always,
        }),
        ..LoadOptions::default()
    }
}

/// The smallest budget a load with a pack accepts (its decode buffer included).
fn minimum(c: &Checkpoint) -> u64 {
    let inputs = PlanInputs {
        trunk_pack: true,
        ..options(Some(1), None).plan
    };
    match Plan::for_model(&c.config, &c.layout, &inputs) {
        Err(PlanError::BudgetTooSmall { needed, .. }) => needed,
        other => panic!("a 1-byte budget must be refused, got {other:?}"),
    }
}

fn load(c: &Checkpoint, o: LoadOptions) -> Model {
    Model::load(c, o).unwrap_or_else(|e| panic!("load: {e}"))
}

fn packed(shape: &str, dir: &Path) -> (Checkpoint, PathBuf) {
    let model = dir.join(shape);
    synth_support::synth(shape, &model);
    let c = Checkpoint::open(&model).expect("synthesised checkpoint opens");
    let out = dir.join(format!("{shape}.k3pack"));
    pack::write::pack(&c, &out, 2, &ByteProgress::default()).expect("packs");
    (c, out)
}

#[test]
fn logits_and_ids_are_bit_identical_with_and_without_the_pack_at_every_budget() {
    for shape in ["tiny", "small"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let (c, pack) = packed(shape, dir.path());
        let least = minimum(&c);
        let trunk: u64 = c.layout.layers.iter().map(|l| l.trunk.len).sum();
        let resident = in_pool(2, || run(&load(&c, LoadOptions::default()), 3));
        // Nothing pinned and lm_head streamed; about half the trunk pinned; most of it.
        for ram in [least, least + trunk / 2, least + trunk - trunk / 8] {
            for threads in [1, 2] {
                let shards = in_pool(threads, || load(&c, options(Some(ram), None)));
                let with = in_pool(threads, || {
                    load(&c, options(Some(ram), Some((&pack, true))))
                });
                let plan = with.plan();
                let PackPlan::Used(figures) = plan.pack else {
                    panic!("{shape} at {ram} B: the pack is not read: {plan}");
                };
                assert!(
                    figures.read < figures.decoded,
                    "{shape} at {ram} B: the pack reads fewer bytes: {plan}"
                );
                let want = in_pool(threads, || run(&shards, 3));
                assert!(
                    want == resident,
                    "{shape} at {ram} B: shards differ from resident"
                );
                let before = with.store_stats();
                let got = in_pool(threads, || run(&with, 3));
                let after = with.store_stats();
                assert!(
                    got == want,
                    "{shape} at {ram} B, {threads} threads: logits or ids differ with the pack"
                );
                assert!(
                    after.pack_decoded_bytes > before.pack_decoded_bytes
                        && after.pack_bytes_read > before.pack_bytes_read,
                    "{shape} at {ram} B: nothing was read from the pack"
                );
            }
        }
        // Where the plan decides (the decoder against the drive), either outcome is exact.
        let decided = load(&c, options(Some(least), Some((&pack, false))));
        assert!(
            matches!(
                decided.plan().pack,
                PackPlan::Used(_)
                    | PackPlan::NotUsed {
                        why: PackRefusal::DoesNotPay(_),
                        ..
                    }
            ),
            "{shape}: {}",
            decided.plan()
        );
        assert!(in_pool(2, || run(&decided, 3)) == resident, "{shape}");
    }
}

#[test]
fn each_token_reads_the_pack_bytes_the_plan_predicts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (c, pack) = packed("tiny", dir.path());
    let model = load(&c, options(Some(minimum(&c)), Some((&pack, true))));
    let mut state = model.new_state();
    model
        .forward(&mut state, &PROMPT, Logits::Last, &|| false)
        .expect("prompt");
    let before = model.store_stats();
    let steps = 3;
    for id in 0..steps {
        model
            .forward(&mut state, &[id], Logits::Last, &|| false)
            .expect("decode");
    }
    let after = model.store_stats();
    let plan = model.plan();
    let PackPlan::Used(figures) = plan.pack else {
        panic!("the pack is not read: {plan}");
    };
    let per_token = |a: u64, b: u64| (a - b) / steps as u64;
    assert_eq!(
        per_token(after.trunk_bytes_read, before.trunk_bytes_read),
        plan.reads.trunk
    );
    assert_eq!(
        per_token(after.head_bytes_read, before.head_bytes_read),
        plan.reads.lm_head
    );
    assert_eq!(
        per_token(after.pack_bytes_read, before.pack_bytes_read),
        figures.read
    );
    assert_eq!(
        per_token(after.pack_decoded_bytes, before.pack_decoded_bytes),
        figures.decoded
    );
    assert!(plan.to_string().contains("trunk pack read:"), "{plan}");
}

#[test]
fn a_pack_is_not_read_where_nothing_streams_and_another_checkpoints_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (c, pack) = packed("tiny", dir.path());
    let everything = load(&c, options(None, Some((&pack, true))));
    assert!(
        matches!(
            everything.plan().pack,
            PackPlan::NotUsed {
                why: PackRefusal::NothingStreams,
                ..
            }
        ),
        "{}",
        everything.plan()
    );
    assert!(everything.plan().to_string().contains("nothing streams"));
    let (other, _) = packed("tiny-b", dir.path());
    let err = Model::load(&other, options(Some(minimum(&other)), Some((&pack, true))))
        .err()
        .expect("a pack of another checkpoint is refused")
        .to_string();
    assert!(
        err.contains("packed from another checkpoint") && err.contains("tiny.k3pack"),
        "{err}"
    );
}
