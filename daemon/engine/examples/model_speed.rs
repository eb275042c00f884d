//! Throughput of the resident forward on synth checkpoints (a measurement, not a test): the
//! median over runs of prefill tokens/s (one call of 32 tokens) and decode tokens/s (16
//! one-token calls after it, greedy).
//!
//! `cargo run --release -p k3-engine --example model_speed [shape|dir ...]`
//!
//! Each argument is a synth shape name (written once, seed 0, under the system temp directory
//! as `k3d-model-speed-<shape>`) or a checkpoint directory; the default is `tiny small`.

use std::path::PathBuf;
use std::time::Instant;

use k3_engine::checkpoint::Checkpoint;
use k3_engine::engine::sampler::argmax;
use k3_engine::model::{LoadOptions, Logits, Model};
use k3_engine::synth::shape::Shape;

const PREFILL: usize = 32;
const DECODE: usize = 16;
const RUNS: usize = 3;

type Error = Box<dyn std::error::Error>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The checkpoint directory for an argument: a shape is synthesised on first use.
fn checkpoint_dir(arg: &str) -> Result<PathBuf, Error> {
    let Some(shape) = Shape::named(arg) else {
        return Ok(PathBuf::from(arg));
    };
    let dir = std::env::temp_dir().join(format!("k3d-model-speed-{arg}"));
    if !dir.join("config.json").exists() {
        eprintln!("writing the {arg} checkpoint to {}", dir.display());
        k3_engine::synth::write(
            &k3_engine::synth::blueprint(&shape)?,
            &dir,
            0,
            false,
            &mut |_| {},
        )?;
    }
    Ok(dir)
}

fn measure(arg: &str) -> Result<(), Error> {
    let dir = checkpoint_dir(arg)?;
    let t0 = Instant::now();
    let model = Model::load(&Checkpoint::open(&dir)?, LoadOptions::default())?;
    println!("{arg}: load {:.2} s", t0.elapsed().as_secs_f64());
    let vocab = model.config().vocab_size as u32;
    let ids: Vec<u32> = (0..PREFILL as u32).map(|i| (i * 37 + 11) % vocab).collect();
    let never = || false;
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let mut state = model.new_state();
        let t = Instant::now();
        let mut logits = model.forward(&mut state, &ids, Logits::Last, &never)?;
        prefill.push(PREFILL as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        for _ in 0..DECODE {
            let next = argmax(&logits).ok_or("NaN logits")?;
            logits = model.forward(&mut state, &[next], Logits::Last, &never)?;
        }
        decode.push(DECODE as f64 / t.elapsed().as_secs_f64());
    }
    println!(
        "{arg}: prefill {PREFILL} tokens: {:.1} tok/s; decode {DECODE} tokens after it: {:.1} tok/s \
         (median of {RUNS}, {} rayon threads)",
        median(prefill),
        median(decode),
        rayon::current_num_threads()
    );
    Ok(())
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = if args.is_empty() {
        vec!["tiny".to_string(), "small".to_string()]
    } else {
        args
    };
    for arg in &args {
        measure(arg)?;
    }
    Ok(())
}
