//! Reading a Kimi K3 checkpoint directory: headers, config and layout — never tensor data.
//!
//! * [`safetensors`] — parse and validate every shard header (spec §3.2) into one tensor index.
//! * [`config`] — parse and validate `config.json` (spec §2), nested or flat.
//! * [`layout`] — bind the index to the model: per-layer trunk runs, expert runs, tensor slices
//!   (spec §3.3–§3.4), and the byte census.

pub mod config;
pub mod layout;
pub mod safetensors;
