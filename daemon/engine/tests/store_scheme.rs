//! Chunked trunk streaming (plan `StreamScheme::Chunks`): streamed layers and a streamed lm_head
//! pass through a few aligned chunks that the forward pass consumes by row ranges as they land.
//! The logits are bit-identical to the whole-layer ring and to everything resident, at every
//! chunk size, reads in flight and thread count; the bytes read per token are the plan's
//! prediction (the forward consumes pieces in the order they are read ahead: no rereads); a
//! forward cancelled mid-cycle leaves the stream able to serve the next one, bit for bit.

use k3_engine::checkpoint::Checkpoint;
use k3_engine::model::{LoadOptions, Logits, Model, ModelError};
use k3_engine::plan::{Budget, Plan, PlanError, PlanInputs, Residency, StreamScheme};

mod synth_support;
use synth_support::synth;

/// A prompt, then decode steps fed the previous argmax: (every logit's bits, the ids chosen).
fn run(model: &Model, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<u32>) {
    let mut state = model.new_state();
    let mut bits = Vec::new();
    let mut ids = Vec::new();
    let mut logits = model
        .forward(&mut state, prompt, Logits::All, &|| false)
        .expect("prompt");
    for _ in 0..steps {
        bits.extend(logits.iter().map(|v| v.to_bits()));
        let vocab = model.config().vocab_size;
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

fn options(ram: Option<u64>, trunk: Option<u64>, scheme: StreamScheme) -> LoadOptions {
    LoadOptions {
        plan: PlanInputs {
            budget: Budget {
                ram,
                trunk,
                ..Budget::default()
            },
            scheme,
            ..PlanInputs::default()
        },
        ..LoadOptions::default()
    }
}

/// The smallest budget `scheme`'s plan accepts: nothing pinned, lm_head and embedding stream.
fn minimum(c: &Checkpoint, scheme: StreamScheme) -> u64 {
    match Plan::for_model(&c.config, &c.layout, &options(Some(1), None, scheme).plan) {
        Err(PlanError::BudgetTooSmall { needed, .. }) => needed,
        other => panic!("a 1-byte budget must be refused, got {other:?}"),
    }
}

fn load(c: &Checkpoint, o: LoadOptions) -> Model {
    let scheme = o.plan.scheme;
    Model::load(c, o).unwrap_or_else(|e| panic!("load {scheme:?}: {e}"))
}

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
        .install(f)
}

const PROMPT: [u32; 5] = [1, 7, 3, 12, 5];

#[test]
fn chunks_are_bit_identical_to_the_ring_and_to_resident() {
    for shape in ["tiny", "tiny-b", "tiny-c"] {
        let dir = tempfile::tempdir().expect("temp dir");
        synth(shape, dir.path());
        let c = Checkpoint::open(dir.path()).expect("checkpoint");
        let resident = in_pool(2, || run(&load(&c, LoadOptions::default()), &PROMPT, 4));
        // A trunk cap of one byte pins nothing: every trunk layer streams through the ring.
        let ring = options(Some(2 << 30), Some(1), StreamScheme::Ring { slots: 2 });
        assert_eq!(in_pool(2, || run(&load(&c, ring), &PROMPT, 4)), resident);
        // Chunks from one row plus a page (pieces of a few rows, many per matrix) up to the
        // default, fitted to the model; at the minimum budget lm_head streams through them too.
        for (chunk, in_flight, threads) in [
            (8192, 1, 1),
            (8192, 3, 2),
            (12_288, 2, 2),
            (65_536, 4, 1),
            (1 << 25, 8, 2),
        ] {
            let scheme = StreamScheme::Chunks { chunk, in_flight };
            let at_min = options(Some(minimum(&c, scheme)), None, scheme);
            let model = load(&c, at_min);
            let plan = model.plan();
            assert!(plan.pinned_layers.is_empty(), "{shape}: {plan}");
            assert_eq!(plan.lm_head, Residency::Streamed, "{shape}: {plan}");
            let got = in_pool(threads, || run(&model, &PROMPT, 4));
            assert!(
                got == resident,
                "{shape}, {chunk}-byte chunks, {in_flight} in flight, {threads} threads: \
                 logits or ids differ from resident"
            );
            let streaming = options(Some(2 << 30), Some(1), scheme);
            assert_eq!(
                in_pool(threads, || run(&load(&c, streaming), &PROMPT, 4)),
                resident
            );
        }
    }
}

#[test]
fn each_token_reads_what_the_plan_predicts_through_the_chunks() {
    let dir = tempfile::tempdir().expect("temp dir");
    synth("tiny", dir.path());
    let c = Checkpoint::open(dir.path()).expect("checkpoint");
    let scheme = StreamScheme::Chunks {
        chunk: 8192,
        in_flight: 3,
    };
    let model = load(&c, options(Some(minimum(&c, scheme)), None, scheme));
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
    // Each read is whole rows of one matrix, so the trunk's pieces cover exactly its matrices:
    // a token reads every streamed matrix once (the small vectors were decoded at load).
    let matrices: u64 = c
        .layout
        .layers
        .iter()
        .flat_map(k3_engine::checkpoint::layout::LayerLayout::stream_order)
        .map(|s| s.len as u64)
        .sum();
    assert_eq!(
        (after.trunk_bytes_read - before.trunk_bytes_read) / steps as u64,
        matrices,
        "trunk bytes per token: every matrix once, none reread out of order"
    );
    assert_eq!(
        (after.head_bytes_read - before.head_bytes_read) / steps as u64,
        plan.reads.lm_head
    );
    assert_eq!(
        plan.reads.trunk, matrices,
        "the plan predicts the matrices' bytes"
    );
}

#[test]
fn a_forward_cancelled_mid_cycle_leaves_the_stream_serving_the_next() {
    let dir = tempfile::tempdir().expect("temp dir");
    synth("tiny", dir.path());
    let c = Checkpoint::open(dir.path()).expect("checkpoint");
    let resident = run(&load(&c, LoadOptions::default()), &PROMPT, 2);
    let scheme = StreamScheme::Chunks {
        chunk: 8192,
        in_flight: 2,
    };
    let model = load(&c, options(Some(minimum(&c, scheme)), None, scheme));
    let polls = std::sync::atomic::AtomicUsize::new(0);
    let cancel_at_layer_4 = || polls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= 4;
    let mut state = model.new_state();
    match model.forward(&mut state, &PROMPT, Logits::Last, &cancel_at_layer_4) {
        Err(ModelError::Cancelled) => {}
        other => panic!("expected a cancellation, got {:?}", other.map(|l| l.len())),
    }
    assert_eq!(run(&model, &PROMPT, 2), resident);
}

#[test]
fn chunks_too_small_for_a_row_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    synth("tiny", dir.path());
    let c = Checkpoint::open(dir.path()).expect("checkpoint");
    for chunk in [4096, 8192 + 1] {
        let scheme = StreamScheme::Chunks {
            chunk,
            in_flight: 2,
        };
        match Plan::for_model(
            &c.config,
            &c.layout,
            &options(Some(1 << 30), None, scheme).plan,
        ) {
            Err(PlanError::BadChunks { least, .. }) => assert_eq!(least, 8192),
            other => panic!("{chunk}-byte chunks: expected BadChunks, got {other:?}"),
        }
    }
    // Nothing streams at max: the chunks are not allocated at all.
    let max = load(&c, options(None, None, StreamScheme::default()));
    assert_eq!(max.plan().stream_bytes, 0);
}
