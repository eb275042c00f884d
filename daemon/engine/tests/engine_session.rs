//! A generation continued from a session snapshot (issue 7 item 1) gives exactly the tokens of
//! one long run that prefills everything, feeds only the new prompt ids, reports how many it
//! reused, and the state it ends with is the state of its `consumed()` ids — also after the
//! snapshot went through a session file.

mod synth_support;

use k3_engine::engine::{Engine, EngineError, EngineOptions, GenerateRequest, Step, Summary};
use k3_engine::model::{Logits, State};
use k3_engine::session::{FileHeader, SessionDir, Snapshot, file};

fn run(
    engine: &Engine,
    prompt: &[u32],
    from: Option<State>,
    max: usize,
) -> (Summary, Vec<Snapshot>) {
    let request = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens: max,
        ..GenerateRequest::default()
    };
    let mut g = match from {
        Some(s) => engine.start_from(request, s).expect("start_from"),
        None => engine.start(request).expect("start"),
    };
    let mut snaps = Vec::new();
    let mut fed = Vec::new();
    loop {
        match engine.step(&mut g, &|| false).expect("step") {
            Step::Prefill { done, total, .. } => {
                fed.push(done);
                if done == total {
                    snaps.push(Snapshot {
                        history: g.consumed(),
                        state: g.state().clone(),
                    });
                }
            }
            Step::Token { .. } => {}
            Step::Finished(summary) => {
                snaps.push(Snapshot {
                    history: g.consumed(),
                    state: g.state().clone(),
                });
                return (summary, snaps);
            }
        }
    }
}

#[test]
fn continuing_a_snapshot_equals_one_long_run() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path();
    let fingerprint = synth_support::synth("tiny", dir);
    let options = EngineOptions {
        threads: 1,
        prefill_chunk: 3,
        ..EngineOptions::default()
    };
    let engine = Engine::open(dir, options, &mut |_| {}).expect("engine");
    let turn1: Vec<u32> = vec![5, 17, 99, 3, 250, 41, 7];
    let (s1, snaps1) = run(&engine, &turn1, None, 6);
    assert_eq!(s1.reused_tokens, 0);
    let end = snaps1.last().expect("end snapshot");
    // max_tokens ended it: the last generated id was never fed.
    assert_eq!(end.history.len(), turn1.len() + s1.generated.len() - 1);
    assert_eq!(end.history[..turn1.len()], turn1[..]);
    // The end state is exactly a fresh prefill of the consumed ids.
    let mut fresh = engine.model().new_state();
    engine
        .model()
        .forward(&mut fresh, &end.history, Logits::Last, &|| false)
        .expect("forward");
    assert_eq!(&fresh, &end.state);

    // Turn 2 extends the history: through a session file, then continued.
    let sessions = SessionDir::open(&dir.join("sessions")).expect("session dir");
    let header = FileHeader {
        fingerprint: fingerprint.clone(),
        name: "t".into(),
        owner: None,
        tokens: end.history.len() as u64,
        state_bytes: end.state.size_bytes() as u64,
    };
    file::save(&sessions, &header, &snaps1).expect("save");
    let (_, loaded) =
        file::load(&file::path_of(sessions.path(), None, "t"), &fingerprint).expect("load");
    assert_eq!(loaded, snaps1);
    let mut turn2 = end.history.clone();
    turn2.extend([11, 12, 13, 14]);
    let held = loaded.last().expect("snapshot").state.clone();
    let (resumed, _) = run(&engine, &turn2, Some(held), 8);
    let (whole, _) = run(&engine, &turn2, None, 8);
    assert_eq!(resumed.generated, whole.generated);
    assert_eq!(resumed.reused_tokens, end.history.len());
    assert_eq!(resumed.prompt_tokens, turn2.len());

    // The state must be strictly shorter than the prompt: the caller's contract (the serve
    // core picks such a state), so breaking it is an internal error, not the request's fault.
    let too_long = GenerateRequest {
        prompt: end.history.clone(),
        max_tokens: 1,
        ..GenerateRequest::default()
    };
    assert!(matches!(
        engine.start_from(too_long, end.state.clone()),
        Err(EngineError::Internal(_))
    ));
}
