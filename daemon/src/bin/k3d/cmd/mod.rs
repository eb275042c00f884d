//! One module per `k3d` subcommand.
pub mod check;
pub mod run;
pub mod synth;
pub mod tokenize;
pub mod serve;
