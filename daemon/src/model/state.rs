//! What a sequence carries between forward calls (spec §5.1): per KDA layer the matrix state and
//! the conv histories, per MLA layer the latent cache, and the number of positions consumed.
//! AttnRes snapshots are per token and never carried.

use super::kda::KdaState;
use super::mla::MlaCache;

/// One layer's carried state.
#[derive(Debug, Clone, PartialEq)]
pub enum LayerState {
    Kda(KdaState),
    Mla(MlaCache),
}

/// The state of one sequence. `Clone` gives a snapshot (e.g. to branch a conversation).
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub(crate) layers: Vec<LayerState>,
    pub(crate) positions: usize,
    /// Set while a forward is in flight; left set if it failed part-way (layers disagree).
    pub(crate) poisoned: bool,
}

impl State {
    pub(crate) fn new(layers: Vec<LayerState>) -> Self {
        State {
            layers,
            positions: 0,
            poisoned: false,
        }
    }

    /// Number of positions (tokens) consumed so far.
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// The per-layer states, layer 0 first.
    pub fn layers(&self) -> &[LayerState] {
        &self.layers
    }

    /// Whether an earlier forward on this state failed part-way; such a state is refused.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Bytes held: f32 KDA matrices and histories plus f32 MLA latent rows (spec §5.1 sizes).
    pub fn size_bytes(&self) -> usize {
        let values: usize = self
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Kda(k) => k.s.len() + k.history.iter().map(Vec::len).sum::<usize>(),
                LayerState::Mla(m) => m.rows.len(),
            })
            .sum();
        values * std::mem::size_of::<f32>()
    }
}
