//! The logit transform (issue 34 point 3: OpenAI's `logit_bias`, `frequency_penalty`,
//! `presence_penalty`): each generated id is the one the formula of `docs/decoding.md` picks
//! from the model's own logits (recorded untransformed and re-derived here independently), and
//! a transformed request gives the same ids at 1 and 2 threads, in a batch and alone, and with
//! exact speculation on; the default transform changes nothing, bit for bit.

mod model_support;

use k3_engine::engine::request::MAX_SPECULATE;
use k3_engine::engine::{
    Engine, GenerateRequest, LogitTransform, RequestError, Sampling, Step, Summary,
};
use k3_engine::plan::PlanInputs;
use model_support::{Rng, bits, open_engine, synth};

fn engine(dir: &std::path::Path, threads: usize) -> Engine {
    // Journal memory for the largest speculation, and two sequences for the batched run.
    let plan = PlanInputs {
        speculate: MAX_SPECULATE as u64,
        sequences: 2,
        ..PlanInputs::default()
    };
    open_engine(dir, threads, plan)
}

fn run(engine: &Engine, request: GenerateRequest) -> Summary {
    let mut g = engine.start(request).expect("start");
    loop {
        match engine.step(&mut g, &|| false).expect("step") {
            Step::Finished(s) => return s,
            _ => continue,
        }
    }
}

/// Both requests stepped through shared forwards until both end.
fn run_pair(engine: &Engine, a: GenerateRequest, b: GenerateRequest) -> (Summary, Summary) {
    let mut ga = engine.start(a).expect("start a");
    let mut gb = engine.start(b).expect("start b");
    let (mut sa, mut sb) = (None, None);
    while sa.is_none() || sb.is_none() {
        let mut members = Vec::new();
        if sa.is_none() {
            members.push(&mut ga);
        }
        if sb.is_none() {
            members.push(&mut gb);
        }
        let a_in = sa.is_none();
        let results = engine.step_batch(&mut members, &[]);
        for (k, r) in results.into_iter().enumerate() {
            if let Step::Finished(s) = r.expect("batched step") {
                if k == 0 && a_in {
                    sa = Some(s);
                } else {
                    sb = Some(s);
                }
            }
        }
    }
    (sa.unwrap(), sb.unwrap())
}

/// The transform re-derived from its definition: for id j generated c times so far,
/// `(l + bias) - (c * frequency + [c > 0] * presence)` in f32; then the first maximum.
fn expected_choice(row: &[f32], t: &LogitTransform, generated: &[u32]) -> u32 {
    let mut best = 0usize;
    let mut best_value = f32::NEG_INFINITY;
    for (j, &l) in row.iter().enumerate() {
        let bias = t
            .bias
            .iter()
            .find(|(id, _)| *id as usize == j)
            .map_or(0.0, |(_, b)| *b);
        let c = generated.iter().filter(|&&g| g as usize == j).count();
        let mut v = if bias != 0.0 { l + bias } else { l };
        if c > 0 {
            v -= c as f32 * t.frequency_penalty + t.presence_penalty;
        }
        if v > best_value {
            best_value = v;
            best = j;
        }
    }
    best as u32
}

fn prompt(vocab: usize, len: usize, seed: u64) -> Vec<u32> {
    let mut r = Rng::new(seed);
    (0..len)
        .map(|_| (r.next_u64() % vocab as u64) as u32)
        .collect()
}

#[test]
fn each_id_is_the_formulas_choice_and_the_same_at_1_and_2_threads_batched_and_speculating() {
    let ck = synth("tiny", 3);
    let one = engine(&ck.dir, 1);
    let two = engine(&ck.dir, 2);
    let vocab = one.model().config().vocab_size;
    let plain = GenerateRequest {
        prompt: prompt(vocab, 9, 5),
        max_tokens: 24,
        record_logits: true,
        ..GenerateRequest::default()
    };
    let untransformed = run(&one, plain.clone());
    // Bias toward two ids the model did not pick and against its first choice; penalties that
    // change which id wins once something repeats.
    let first = untransformed.generated[0];
    let transform = LogitTransform {
        bias: vec![(first, -100.0), (7, 2.5), (11, 1.25)],
        frequency_penalty: 0.75,
        presence_penalty: 0.5,
    };
    let request = GenerateRequest {
        transform: transform.clone(),
        ..plain.clone()
    };
    let s = run(&one, request.clone());
    assert_ne!(
        s.generated, untransformed.generated,
        "the transform changed nothing"
    );
    assert!(
        !s.generated.contains(&first),
        "a -100 bias still chose the id"
    );
    // Recorded logits are the model's own: one row per fed position; the rows after the
    // prompt's last one each decided the next id.
    let prompt_len = request.prompt.len();
    for (i, &id) in s.generated.iter().enumerate() {
        let row_index = prompt_len - 1 + i;
        let row = &s.logits[row_index * vocab..(row_index + 1) * vocab];
        assert_eq!(
            id,
            expected_choice(row, &transform, &s.generated[..i]),
            "generated id {i}"
        );
    }
    // Thread count, batch composition and speculation change nothing.
    let s2 = run(&two, request.clone());
    assert_eq!(s2.generated, s.generated, "2 threads");
    assert_eq!(bits(&s2.logits), bits(&s.logits), "2 threads, logits");
    let other = GenerateRequest {
        prompt: prompt(vocab, 4, 9),
        max_tokens: 30,
        ..GenerateRequest::default()
    };
    let (batched, _) = run_pair(&two, request.clone(), other);
    assert_eq!(batched.generated, s.generated, "batched");
    assert_eq!(bits(&batched.logits), bits(&s.logits), "batched, logits");
    let spec = run(
        &one,
        GenerateRequest {
            speculate: 4,
            ..request.clone()
        },
    );
    assert_eq!(spec.generated, s.generated, "speculating");
    assert_eq!(bits(&spec.logits), bits(&s.logits), "speculating, logits");
    // Two ids lifted far above the rest and a strong frequency penalty: the output alternates
    // between them as their counts grow, so n-gram drafts are proposed and verified, and each
    // verified row must see the counts of the drafts confirmed before it.
    let alternating = GenerateRequest {
        transform: LogitTransform {
            bias: vec![(7, 100.0), (11, 100.0)],
            frequency_penalty: 2.0,
            presence_penalty: 0.0,
        },
        ..plain.clone()
    };
    let plain_alt = run(&one, alternating.clone());
    let spec_alt = run(
        &one,
        GenerateRequest {
            speculate: 4,
            ..alternating
        },
    );
    assert!(
        spec_alt.drafts_accepted > 0,
        "no draft confirmed: {:?}",
        plain_alt.generated
    );
    assert_eq!(
        spec_alt.generated, plain_alt.generated,
        "speculating, alternating"
    );
    assert_eq!(bits(&spec_alt.logits), bits(&plain_alt.logits));

    // The default transform is the untransformed run, bit for bit (ids and logits).
    let again = run(
        &two,
        GenerateRequest {
            transform: LogitTransform::default(),
            ..plain
        },
    );
    assert_eq!(again.generated, untransformed.generated);
    assert_eq!(bits(&again.logits), bits(&untransformed.logits));
}

#[test]
fn a_plus_100_bias_decides_greedy_output_and_sampling_is_seeded_and_thread_independent() {
    let ck = synth("tiny", 4);
    let one = engine(&ck.dir, 1);
    let two = engine(&ck.dir, 2);
    let vocab = one.model().config().vocab_size;
    let forced = GenerateRequest {
        prompt: prompt(vocab, 5, 1),
        max_tokens: 6,
        transform: LogitTransform {
            bias: vec![(42, 100.0)],
            ..LogitTransform::default()
        },
        ..GenerateRequest::default()
    };
    assert_eq!(run(&one, forced).generated, vec![42; 6]);
    // A frequency penalty rotates away from any repeated id: no id three times in a row.
    let sampled = GenerateRequest {
        prompt: prompt(vocab, 5, 2),
        max_tokens: 20,
        sampling: Sampling {
            temperature: 0.9,
            top_p: 0.95,
            top_k: 40,
            seed: 77,
        },
        transform: LogitTransform {
            bias: vec![(3, 4.0)],
            frequency_penalty: 2.0,
            presence_penalty: 1.0,
        },
        ..GenerateRequest::default()
    };
    let a = run(&one, sampled.clone());
    let b = run(&two, sampled.clone());
    assert_eq!(a.generated, b.generated, "sampled, 1 vs 2 threads");
    let other_seed = run(
        &one,
        GenerateRequest {
            sampling: Sampling {
                seed: 78,
                ..sampled.sampling.clone()
            },
            ..sampled
        },
    );
    assert_ne!(a.generated, other_seed.generated);
}

#[test]
fn out_of_range_transforms_are_refused_naming_the_rule() {
    let base = GenerateRequest {
        prompt: vec![1, 2],
        max_tokens: 1,
        ..GenerateRequest::default()
    };
    let refused = |t: LogitTransform| {
        GenerateRequest {
            transform: t,
            ..base.clone()
        }
        .validate(1000)
        .expect_err("refused")
    };
    let bias = |bias: Vec<(u32, f32)>| LogitTransform {
        bias,
        ..LogitTransform::default()
    };
    assert_eq!(
        refused(bias(vec![(5, 100.5)])),
        RequestError::BiasValue {
            id: 5,
            value: 100.5
        }
    );
    assert!(matches!(
        refused(bias(vec![(5, f32::NAN)])),
        RequestError::BiasValue { id: 5, .. }
    ));
    assert_eq!(
        refused(bias(vec![(1000, 1.0)])),
        RequestError::BiasIdOutsideVocabulary {
            id: 1000,
            vocab_size: 1000
        }
    );
    assert_eq!(
        refused(bias(vec![(5, 1.0), (5, 2.0)])),
        RequestError::BiasTwice { id: 5 }
    );
    assert_eq!(
        refused(bias((0..301).map(|i| (i, 1.0)).collect())),
        RequestError::TooManyBiases { given: 301 }
    );
    let e = refused(LogitTransform {
        presence_penalty: -2.5,
        ..LogitTransform::default()
    });
    assert_eq!(
        e.to_string(),
        "presence_penalty -2.5 must be a number in [-2, 2]"
    );
    // The ends of each range are accepted.
    GenerateRequest {
        transform: LogitTransform {
            bias: vec![(0, -100.0), (999, 100.0)],
            frequency_penalty: -2.0,
            presence_penalty: 2.0,
        },
        ..base
    }
    .validate(1000)
    .expect("the ends of the ranges");
}
