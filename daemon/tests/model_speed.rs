//! Throughput of the resident forward on synth checkpoints (a measurement, not a gate):
//! `cargo test -p k3d --test model_speed -- --ignored --nocapture`. Prints the median of
//! several runs for prefill (one call of `PREFILL` tokens) and decode (one token per call).

mod model_support;

use std::time::Instant;

use k3d::model::Logits;
use model_support::*;

const PREFILL: usize = 32;
const DECODE: usize = 16;
const RUNS: usize = 3;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn measure(shape: &str) {
    let ck = synth(shape, 0);
    let t0 = Instant::now();
    let model = load(&ck.dir);
    println!("{shape}: load {:.2} s", t0.elapsed().as_secs_f64());
    let vocab = model.config().vocab_size as u32;
    let ids: Vec<u32> = (0..PREFILL as u32).map(|i| (i * 37 + 11) % vocab).collect();
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    for _ in 0..RUNS {
        let mut state = model.new_state();
        let t = Instant::now();
        let mut logits = model
            .forward(&mut state, &ids, Logits::Last, &no_cancel)
            .expect("prefill");
        prefill.push(PREFILL as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        for _ in 0..DECODE {
            let next = logits
                .iter()
                .enumerate()
                .fold(0, |b, (i, &v)| if v > logits[b] { i } else { b })
                as u32;
            logits = model
                .forward(&mut state, &[next], Logits::Last, &no_cancel)
                .expect("decode");
        }
        decode.push(DECODE as f64 / t.elapsed().as_secs_f64());
    }
    println!(
        "{shape}: prefill {PREFILL} tokens: {:.1} tok/s; decode {DECODE} tokens after it: {:.1} tok/s \
         (median of {RUNS}, {} rayon threads)",
        median(prefill),
        median(decode),
        rayon::current_num_threads()
    );
}

#[test]
#[ignore = "measurement; run explicitly"]
fn tokens_per_second_tiny() {
    measure("tiny");
}

#[test]
#[ignore = "measurement; run explicitly"]
fn tokens_per_second_small() {
    measure("small");
}
