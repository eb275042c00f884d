//! The Kimi K3 forward pass (spec §4), one concern per module:
//!
//! * [`attn_res`] — the AttnRes aggregator and the block schedule (§4.3–§4.4).
//! * [`kda`] — Kimi Delta Attention (§4.5); [`mla`] — gated MLA with NoPE (§4.6).
//! * [`router`] — sigmoid top-k routing (§4.7); [`moe`] — Stable LatentMoE (§4.8).
//! * [`mlp`] — the SiTU-GLU MLP: layer-0 dense, shared experts, routed experts (§4.8–§4.9).
//! * [`state`] — what is carried between calls (§5.1).
//! * [`forward`] — the top-level loop: embedding → layers → model-level AR → norm → lm_head,
//!   and the routing lookahead.
//! * [`bind`] — binding weights by their inventory names into checked views and decoded
//!   vectors.
//!
//! Every op takes `T` token rows at once (prefill and decode share one code path) and computes
//! each output element with the same reduction as a one-token call would (spec §6.1 rule 5).

pub mod attn_res;
pub mod bind;
pub mod forward;
pub mod kda;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod router;
pub mod state;

pub use bind::TensorName;
pub use forward::{LoadOptions, Logits, Model, Pass, Sequence, TrunkPack};
pub use state::State;

use crate::store::StoreError;

/// Multiply-adds below which splitting work across threads costs more than it saves. Only
/// scheduling depends on it: every output element is computed the same way either way.
const PARALLEL_MIN_WORK: usize = 1 << 15;

/// Minimum number of items per parallel job (rayon `with_min_len`) for items of
/// `work_per_item` multiply-adds each, so small layers stay on one thread.
fn grain(work_per_item: usize) -> usize {
    (PARALLEL_MIN_WORK / work_per_item.max(1)).max(1)
}

impl From<crate::plan::PlanError> for ModelError {
    fn from(e: crate::plan::PlanError) -> Self {
        ModelError::Plan(e)
    }
}

/// Failures of loading or running the model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Its message includes the plan error's, so it is not also the `source` (which `#[from]`
    /// would make it): a `{:#}` chain says each cause once.
    #[error("memory plan: {0}")]
    Plan(crate::plan::PlanError),
    #[error("{tensor}: {problem}")]
    Tensor { tensor: TensorName, problem: String },
    #[error("layout and config disagree: {0}")]
    LayoutMismatch(String),
    #[error("no input tokens")]
    EmptyInput,
    #[error("token id {id} at input position {index} is outside the vocabulary (size {vocab})")]
    TokenOutOfVocab { id: u32, index: usize, vocab: usize },
    #[error("cancelled")]
    Cancelled,
    #[error(
        "this state cannot be continued: an earlier forward on it failed or was cancelled \
         part-way, leaving its layers at different positions"
    )]
    StatePoisoned,
    #[error("speculation: {0}")]
    Speculation(String),
    #[error("the state was made for a different model ({0})")]
    StateMismatch(String),
    /// Member `index` of a [`Model::forward_batch`] was refused before any compute.
    #[error("batch member {index}: {error}")]
    Member {
        index: usize,
        error: Box<ModelError>,
    },
    /// A caller broke the contract of [`Model::advance`] (other members than the pass began
    /// with, or a pass already complete): the engine's fault, never the request's.
    #[error("forward pass misuse: {0}")]
    PassMismatch(String),
    #[error("NaN in the logits at output row {row}, vocabulary index {index} (spec §6.1 rule 12)")]
    NanLogits { row: usize, index: usize },
}
