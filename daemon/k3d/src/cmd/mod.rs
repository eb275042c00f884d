//! One module per `k3d` subcommand.
pub mod bench;
pub mod budget;
pub mod check;
pub mod doctor;
pub mod run;
pub mod serve;
pub mod synth;
pub mod tokenize;
pub mod verify;
