//! Decode cost against context length (a measurement, not a test): milliseconds per decode
//! token on the `small` synth shape at contexts 16, 256 and 1024.
//!
//! `cargo run --release -p k3-engine --example mla_context [dir] [steps]`
//!
//! `dir` (default `/tmp/k3d-mla-context-small`) holds the checkpoint; it is written with
//! `k3d synth --shape small` semantics (seed 0) when it has no `config.json`. At each context
//! the state is prefilled up to that length, then `steps` (default 9) single-token decode calls
//! are timed one by one; the median wall time is printed, and the process CPU time (all
//! threads, from `/proc/self/stat`) per step averaged over the steps — the steadier figure on a
//! shared machine. Only the MLA layers see the context (KDA state
//! has a fixed size), so a flat row means MLA decode no longer re-expands the cache (spec §4.6).

use std::path::PathBuf;
use std::time::Instant;

use k3_engine::checkpoint::Checkpoint;
use k3_engine::model::{LoadOptions, Logits, Model};
use k3_engine::synth::shape::Shape;

const CONTEXTS: [usize; 3] = [16, 256, 1024];

/// Linux's user-space clock tick (`USER_HZ`), the unit of `/proc/<pid>/stat` times.
const USER_HZ: f64 = 100.0;

/// CPU seconds used so far by this process, all threads (utime + stime, fields 14 and 15).
fn cpu_seconds() -> Result<f64, Box<dyn std::error::Error>> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the parenthesised command name, which may itself contain spaces.
    let rest = stat.rsplit_once(')').ok_or("malformed /proc/self/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| -> Result<f64, Box<dyn std::error::Error>> {
        Ok(fields
            .get(i)
            .ok_or("short /proc/self/stat")?
            .parse::<f64>()?)
    };
    // `rest` starts at field 3 (state), so fields 14 and 15 are at indices 11 and 12.
    Ok((tick(11)? + tick(12)?) / USER_HZ)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "/tmp/k3d-mla-context-small".into()),
    );
    let steps: usize = match args.next() {
        Some(s) => s.parse()?,
        None => 9,
    };
    if !dir.join("config.json").exists() {
        let shape = Shape::named("small").ok_or("no synth shape `small`")?;
        let plan = k3_engine::synth::blueprint(&shape)?;
        eprintln!("writing the small checkpoint to {}", dir.display());
        k3_engine::synth::write(&plan, &dir, 0, false, &mut |_| {})?;
    }
    let model = Model::load(&Checkpoint::open(&dir)?, LoadOptions::default())?;
    let vocab = model.config().vocab_size as u32;
    let never = || false;
    let mut state = model.new_state();
    let mut next_id = 0u32;
    let mut id = || {
        next_id += 1;
        (next_id * 37 + 11) % vocab
    };
    println!(
        "small shape, {} rayon threads, median of {steps} decode steps",
        rayon::current_num_threads()
    );
    println!(
        "{:>8} {:>12} {:>16}",
        "context", "wall ms/token", "cpu ms/token"
    );
    for ctx in CONTEXTS {
        let fill: Vec<u32> = (state.positions()..ctx).map(|_| id()).collect();
        if !fill.is_empty() {
            model.forward(&mut state, &fill, Logits::Last, &never)?;
        }
        let mut times = Vec::with_capacity(steps);
        let cpu0 = cpu_seconds()?;
        for _ in 0..steps {
            let tok = [id()];
            let t = Instant::now();
            model.forward(&mut state, &tok, Logits::Last, &never)?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let cpu = (cpu_seconds()? - cpu0) * 1e3 / steps as f64;
        println!("{ctx:>8} {:>13.2} {cpu:>16.1}", median(times));
    }
    Ok(())
}
