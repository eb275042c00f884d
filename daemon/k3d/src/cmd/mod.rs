//! One module per `k3d` subcommand.
pub mod bench;
pub mod budget;
pub mod check;
pub mod doctor;
pub mod pack;
pub mod progress;
pub mod pull;
pub mod run;
pub mod serve;
pub mod synth;
pub mod tokenize;
pub mod verify;

/// The value parser of every `--threads`: 1 to [`k3_engine::engine::MAX_THREADS`], so `0` and
/// absurd counts are refused as usage errors (exit 2) before anything is loaded or spawned.
pub fn threads(text: &str) -> Result<usize, String> {
    let n = text
        .parse::<usize>()
        .map_err(|e| format!("{text:?} is not a thread count: {e}"))?;
    k3_engine::engine::check_threads(n)
}
