//! What can go wrong in the weight store: every variant names the file and offset (or the
//! layer, expert and tensor) it concerns (spec §8.2 of engine-lessons: errors say where).

use std::path::PathBuf;

use super::direct_io::ReadError;
use super::expert_cache::CacheError;
use super::{direct_buffer, reader};

/// Failures of the weight store. Every variant names the file and offset it concerns.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A read of streamed weights failed: which ones, then the read's file, offset and errno.
    #[error("reading {what}: {error}")]
    WeightRead { what: Weights, error: ReadError },
    #[error(transparent)]
    Expert(#[from] CacheError),
    /// These two include their cause's message, so they are not also its `source` (as
    /// `#[from]` would make them): a `{:#}` chain says each cause once.
    #[error("reader threads: {0}")]
    Pool(reader::PoolError),
    #[error("allocating a weight buffer: {0}")]
    Alloc(direct_buffer::AllocError),
    /// A trunk pack block refused by the decoder, or a pack that cannot be used: which file,
    /// tensor, block and byte offset.
    #[error("trunk pack: {0}")]
    Pack(Box<crate::pack::PackError>),
    #[error("layer {layer} does not exist (the model has {count} layers)")]
    NoSuchLayer { layer: usize, count: usize },
    #[error("layer {layer} has no routed experts")]
    NotMoe { layer: usize },
    #[error("layer {layer}: expert {expert} does not exist (the layer has {count})")]
    NoSuchExpert {
        layer: usize,
        expert: usize,
        count: usize,
    },
    #[error(
        "layer {layer}, expert {expert}: tensor {tensor} (bytes {start}..+{len} of the run at \
         offset {offset} of {path}) lies outside its expert run"
    )]
    SliceOutsideRun {
        layer: usize,
        expert: usize,
        tensor: &'static str,
        start: usize,
        len: usize,
        path: PathBuf,
        offset: u64,
    },
    #[error(
        "corrupt checkpoint: MXFP4 scale byte 255 (NaN) in layer {layer}, expert {expert}, \
         tensor {tensor}, row {row}, group {group} ({path}, byte offset {offset})"
    )]
    NanScale {
        layer: usize,
        expert: usize,
        tensor: &'static str,
        row: usize,
        group: usize,
        path: PathBuf,
        offset: u64,
    },
    #[error("token id {id} is outside the embedding table ({rows} rows)")]
    NoSuchRow { id: usize, rows: usize },
    #[error("{tensor}: slice {start}..+{len} does not fit its run of {run_len} bytes")]
    BadSlice {
        tensor: &'static str,
        start: usize,
        len: usize,
        run_len: u64,
    },
    #[error(
        "no free streaming slot for {what}: all {slots} ring slots are in use (a caller held \
         more streamed views than the plan allows)"
    )]
    RingExhausted { what: &'static str, slots: usize },
    #[error("a streaming ring needs at least 2 slots, {slots} asked (engine-lessons §3.1)")]
    SingleSlot { slots: usize },
    #[error(
        "{unit}: a row of {row_bytes} bytes does not fit a {chunk}-byte stream chunk (it holds \
         4096 bytes less than its size), or a tensor lies outside its run"
    )]
    RowExceedsChunk {
        row_bytes: usize,
        chunk: usize,
        unit: String,
    },
    #[error("{unit}: no streamed tensor starts at byte {start} of its run")]
    NotStreamed { unit: String, start: usize },
}

impl StoreError {
    /// A failed read of `what` names it; any other error passes unchanged.
    pub(super) fn reading(self, what: Weights) -> StoreError {
        match self {
            StoreError::Read(error) => StoreError::WeightRead { what, error },
            other => other,
        }
    }
}

impl From<reader::PoolError> for StoreError {
    fn from(e: reader::PoolError) -> Self {
        StoreError::Pool(e)
    }
}

impl From<direct_buffer::AllocError> for StoreError {
    fn from(e: direct_buffer::AllocError) -> Self {
        StoreError::Alloc(e)
    }
}

/// Which weights a failed read was for, so the error names its class beside the file and
/// offset (issue 19.3). Routed experts are named by [`CacheError::Read`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weights {
    Trunk { layer: usize },
    LmHead,
    Embedding,
}

impl std::fmt::Display for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Weights::Trunk { layer } => write!(f, "the trunk of layer {layer}"),
            Weights::LmHead => f.write_str("lm_head"),
            Weights::Embedding => f.write_str("an embedding row"),
        }
    }
}
