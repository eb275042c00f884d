//! One module per `k3d` subcommand.
pub mod check;
pub mod run;
pub mod serve;
pub mod synth;
pub mod tokenize;
