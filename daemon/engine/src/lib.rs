//! # k3-engine — the Kimi K3 engine
//!
//! This crate is the engine as a library; the `k3d` binary crate (`daemon/k3d`) wraps it in its
//! transports. The library computes the official Kimi K3 mathematics exactly (spec
//! `k3-model.md`) on the CPU, streaming weights from the released safetensors shards. It knows
//! nothing about RPC: its `Cargo.toml` has no tokio, tonic or protobuf dependency.
//!
//! Data flows one way:
//!
//! ```text
//! checkpoint ──► plan ──► store ──► model ──► engine ──► serve ──► (transports, in k3d) ──► client
//!  files,        what is    bytes      the        generation,  admission,
//!  config,       resident   in RAM     forward    sampling,    batching,
//!  layout                   or read    pass       sessions     leases
//! ```
//!
//! * [`checkpoint`] — safetensors headers, `config.json`, the layout binding (which bytes are
//!   which tensor) and the byte census. Reads headers only.
//! * [`pack`] — the trunk pack: an optional losslessly compressed copy of the BF16 trunk
//!   (`k3d pack`), read instead of the shards to move fewer bytes per token.
//! * [`plan`] — the memory plan: from the checkpoint's sizes, the budget and what must be held
//!   at once (context, batch, speculation, sessions), what is resident and what streams.
//! * [`store`] — where weight bytes live: direct-I/O reads, pinned trunk layers, the expert cache.
//! * [`kernels`] — the numerics contract (spec §6): fixed f64 reduction trees, bf16 / MXFP4
//!   matvecs, norms and elementwise functions; SIMD paths bit-identical to the portable one.
//! * [`model`] — the forward pass: AttnRes, KDA, MLA, router, LatentMoE, dense MLP, head.
//! * [`tokenizer`] — tiktoken-style BPE, the K3 pre-tokeniser, chat template, streaming detok.
//! * [`echo`] — quoting a caller's text in error messages, bounded.
//! * [`input_file`] — opens input files so that a FIFO or device in their place is refused,
//!   never blocked on.
//! * [`engine`] — prompts in, tokens out: greedy/sampled generation over a loaded model.
//! * [`constrain`] — guides for chat replies: the thinking budget and constrained decoding
//!   (tool calls and JSON valid against a schema), masks over the vocabulary.
//! * [`session`] — named conversations: state snapshots, reuse rule, files, ownership, spill.
//! * [`serve`] — the transport-neutral serve core: validation, the admission queue, session
//!   leases, the batch loop and the scheduler thread; transports (in k3d) map onto it.
//! * [`rng`] — small deterministic random streams (SplitMix64, xoshiro) shared by sampling and
//!   synthesis: identical on every platform.
//! * [`synth`] — writes random-weight checkpoints in exactly the released layout (tests, benches).
//! * [`system`] — machine facts (CPU features, RAM, cgroup limit, disk) and a drive read probe.
//! * [`advice`] — the `--ram-gb` to recommend for a machine and checkpoint, and its expected speed.

pub mod advice;
pub mod checkpoint;
pub mod constrain;
pub mod echo;
pub mod engine;
pub mod input_file;
pub mod kernels;
pub mod model;
pub mod pack;
pub mod plan;
pub mod rng;
pub mod serve;
pub mod session;
pub mod store;
pub mod synth;
pub mod system;
pub mod tokenizer;
