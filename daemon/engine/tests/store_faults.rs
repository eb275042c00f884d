//! Weight reads failing mid-generation (issue 19 point 3), through the store's real error
//! path: the `fault-injection` switch (this crate's own tests turn the feature on, see
//! Cargo.toml) makes every read of one class of weights — a streamed layer's trunk, or the
//! routed experts — fail with `EIO` or come back short. Each failure ends the step with an error
//! naming the class, the file and the offset; that step emits no token and the tokens before it
//! are the fault-free run's; and the same engine then serves the request again with the ids it
//! gave before the fault.

mod synth_support;

use k3_engine::checkpoint::Checkpoint;
use k3_engine::checkpoint::layout::{ByteRun, FfnLayout};
use k3_engine::engine::{Engine, EngineError, EngineOptions, GenerateRequest, Generation, Step};
use k3_engine::model::ModelError;
use k3_engine::store::expert_cache::CacheError;
use k3_engine::store::fault::{FaultKind, Faults};
use k3_engine::store::{StoreError, Weights};
use synth_support::tiny_at_minimum_budget;

/// Tokens generated fault-free before the fault is armed: the failure is mid-generation.
const TOKENS_BEFORE: usize = 2;
/// Steps allowed after arming before a failure is required (the routed experts of a step may
/// all be cached; with every expert armed a few steps always miss one).
const STEPS_AFTER: usize = 6;

/// `tiny` at its minimum budget (trunk layers stream every token, few experts fit the cache),
/// opened with a fault switch.
struct Faulty {
    _dir: tempfile::TempDir,
    checkpoint: Checkpoint,
    engine: Engine,
    faults: &'static Faults,
}

fn faulty(name: &str) -> Faulty {
    let (dir, checkpoint, mut model) = tiny_at_minimum_budget(name);
    // Leaked: the store keeps a `&'static` so its options stay `Copy`; one per test.
    let faults: &'static Faults = Box::leak(Box::new(Faults::new()));
    model.store.faults = Some(faults);
    let options = EngineOptions {
        threads: 1,
        model,
        ..EngineOptions::default()
    };
    let engine = Engine::open(dir.path(), options, &mut |_| {}).expect("engine");
    Faulty {
        _dir: dir,
        checkpoint,
        engine,
        faults,
    }
}

fn request() -> GenerateRequest {
    GenerateRequest {
        prompt: vec![1, 2, 3],
        max_tokens: 8,
        ..GenerateRequest::default()
    }
}

/// One step; a token's id is pushed onto `ids`. `Ok(true)` once finished.
fn step(engine: &Engine, g: &mut Generation, ids: &mut Vec<u32>) -> Result<bool, EngineError> {
    match engine.step(g, &|| false)? {
        Step::Token { id } => ids.push(id),
        Step::Finished(_) => return Ok(true),
        Step::Prefill { .. } => {}
    }
    Ok(false)
}

fn generate(engine: &Engine) -> Vec<u32> {
    let mut g = engine.start(request()).expect("start");
    let mut ids = Vec::new();
    while !step(engine, &mut g, &mut ids).expect("a fault-free step") {}
    ids
}

/// Arms `runs` as `kind` after [`TOKENS_BEFORE`] tokens and steps until the error, which is
/// returned with the ids emitted; then checks the recovery.
fn fail_mid_generation(f: &Faulty, runs: Vec<ByteRun>, kind: FaultKind) -> EngineError {
    let reference = generate(&f.engine);
    assert!(reference.len() > TOKENS_BEFORE + 1, "{reference:?}");
    let mut g = f.engine.start(request()).expect("start");
    let mut ids = Vec::new();
    while ids.len() < TOKENS_BEFORE {
        assert!(!step(&f.engine, &mut g, &mut ids).expect("before the fault"));
    }
    f.faults.arm(runs, kind);
    let mut error = None;
    for _ in 0..STEPS_AFTER {
        let before = ids.len();
        match step(&f.engine, &mut g, &mut ids) {
            Ok(finished) => assert!(!finished, "finished without meeting the fault"),
            Err(e) => {
                assert_eq!(ids.len(), before, "the failing step emitted no token");
                error = Some(e);
                break;
            }
        }
    }
    let error = error.unwrap_or_else(|| panic!("no step failed; ids {ids:?}"));
    assert!(f.faults.hits() > 0, "the fault fired");
    assert_eq!(
        ids[..],
        reference[..ids.len()],
        "every token emitted before the failure is the fault-free one"
    );
    assert_eq!(
        g.generated(),
        &ids[..],
        "no token computed beyond those emitted"
    );
    f.faults.disarm();
    assert_eq!(
        generate(&f.engine),
        reference,
        "the engine serves the request again after the fault"
    );
    error
}

fn assert_names_the_read(text: &str, f: &Faulty, kind: FaultKind) {
    assert!(
        f.checkpoint
            .shards
            .iter()
            .any(|s| text.contains(&s.path.display().to_string())),
        "names the file: {text}"
    );
    assert!(text.contains("at offset"), "names the offset: {text}");
    let how = match kind {
        FaultKind::Eio => "errno 5",
        FaultKind::Short => "end of file after",
    };
    assert!(text.contains(how), "says how it failed ({how}): {text}");
}

fn trunk_failure(name: &str, kind: FaultKind) {
    let f = faulty(name);
    let plan = f.engine.model().plan();
    let victim = (0..plan.layer_count)
        .rfind(|l| !plan.pinned_layers.contains(l))
        .expect("the minimum budget streams a trunk layer");
    let run = f.checkpoint.layout.layers[victim].trunk;
    let e = fail_mid_generation(&f, vec![run], kind);
    let text = e.to_string();
    match &e {
        EngineError::Model(ModelError::Store(StoreError::WeightRead {
            what: Weights::Trunk { layer },
            ..
        })) => assert_eq!(*layer, victim, "{text}"),
        other => panic!("a trunk read error, got {other:?}"),
    }
    assert!(
        text.contains(&format!("the trunk of layer {victim}")),
        "names the class: {text}"
    );
    assert_names_the_read(&text, &f, kind);
}

fn expert_failure(name: &str, kind: FaultKind) {
    let f = faulty(name);
    let experts: Vec<ByteRun> = f
        .checkpoint
        .layout
        .layers
        .iter()
        .filter_map(|l| match &l.ffn {
            FfnLayout::Moe(m) => Some(m.experts.iter().map(|(run, _)| *run)),
            FfnLayout::Dense(_) => None,
        })
        .flatten()
        .collect();
    let e = fail_mid_generation(&f, experts, kind);
    let text = e.to_string();
    assert!(
        matches!(
            &e,
            EngineError::Model(ModelError::Store(StoreError::Expert(
                CacheError::Read { .. }
            )))
        ),
        "an expert read error, got {e:?}"
    );
    assert!(text.contains("expert"), "names the class: {text}");
    assert_names_the_read(&text, &f, kind);
}

#[test]
fn a_trunk_read_failing_with_eio_fails_the_step_and_the_engine_recovers() {
    trunk_failure("fault-trunk-eio", FaultKind::Eio);
}

#[test]
fn a_short_trunk_read_fails_the_step_and_the_engine_recovers() {
    trunk_failure("fault-trunk-short", FaultKind::Short);
}

#[test]
fn an_expert_read_failing_with_eio_fails_the_step_and_the_engine_recovers() {
    expert_failure("fault-expert-eio", FaultKind::Eio);
}

#[test]
fn a_short_expert_read_fails_the_step_and_the_engine_recovers() {
    expert_failure("fault-expert-short", FaultKind::Short);
}
