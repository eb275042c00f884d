//! `k3d synth`.
use crate::exit::{CliError, CliResult, Exit};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> CliResult {
    Err(CliError::new(
        Exit::Failure,
        anyhow::anyhow!("not built yet"),
    ))
}
