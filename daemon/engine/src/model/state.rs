//! What a sequence carries between forward calls (spec §5.1): per KDA layer the matrix state and
//! the conv histories, per MLA layer the latent cache, and the number of positions consumed.
//! AttnRes snapshots are per token and never carried.
//!
//! Speculation (spec §5.2 rollback): [`State::begin_speculation`] opens a journal in every KDA
//! layer (a snapshot of `S` and the conv histories, then each later token's recurrence inputs);
//! [`State::rollback_to`] returns to any position since, bit-identical to a state fed only the
//! kept tokens — KDA by restoring the snapshot and replaying just the recurrence for the kept
//! tokens, MLA by truncating rows; [`State::commit`] keeps everything.

use super::ModelError;
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
    /// `positions` when the open speculation began; `None` when none is open.
    pub(crate) speculation: Option<usize>,
}

impl State {
    pub(crate) fn new(layers: Vec<LayerState>) -> Self {
        State {
            layers,
            positions: 0,
            poisoned: false,
            speculation: None,
        }
    }

    /// Opens a speculation at the current position: later forwards can be undone back to any
    /// position from here with [`State::rollback_to`]. Costs one copy of every KDA layer's `S`
    /// and conv histories (spec §5.1 sizes) plus, per token fed, the recorded inputs.
    pub fn begin_speculation(&mut self) -> Result<(), ModelError> {
        if self.poisoned {
            return Err(ModelError::StatePoisoned);
        }
        if let Some(base) = self.speculation {
            return Err(ModelError::Speculation(format!(
                "a speculation is already open (since position {base})"
            )));
        }
        for layer in &mut self.layers {
            if let LayerState::Kda(k) = layer {
                k.begin_journal();
            }
        }
        self.speculation = Some(self.positions);
        Ok(())
    }

    /// The position the open speculation began at, if one is open.
    pub fn speculation_base(&self) -> Option<usize> {
        self.speculation
    }

    /// Closes the open speculation keeping every position fed since (no-op if none is open).
    pub fn commit(&mut self) {
        for layer in &mut self.layers {
            if let LayerState::Kda(k) = layer {
                k.commit();
            }
        }
        self.speculation = None;
    }

    /// Closes the open speculation keeping only positions `..positions`, which must lie between
    /// its start and the current position. The state is then bit-identical to one that was
    /// fed only those positions.
    pub fn rollback_to(&mut self, positions: usize) -> Result<(), ModelError> {
        if self.poisoned {
            return Err(ModelError::StatePoisoned);
        }
        let Some(base) = self.speculation else {
            return Err(ModelError::Speculation(
                "rollback without an open speculation".into(),
            ));
        };
        if positions < base || positions > self.positions {
            return Err(ModelError::Speculation(format!(
                "rollback to position {positions} outside the speculation's {base}..={}",
                self.positions
            )));
        }
        let fed = self.positions - base;
        // Every KDA journal must hold exactly the tokens fed since the start, or its replay
        // would not describe this sequence.
        if let Some(l) = self.layers.iter().position(|l| match l {
            LayerState::Kda(k) => k.journaled() != Some(fed),
            LayerState::Mla(m) => self.positions > 0 && m.rows.len() % self.positions != 0,
        }) {
            return Err(ModelError::StateMismatch(format!(
                "layer {l}: its speculation record does not cover the {fed} positions fed"
            )));
        }
        let keep = positions - base;
        for layer in &mut self.layers {
            match layer {
                LayerState::Kda(k) => k.rollback(keep),
                LayerState::Mla(m) => {
                    // Rows are per position (spec §5.2: MLA rows are simply truncated).
                    let width = m.rows.len().checked_div(self.positions).unwrap_or(0);
                    m.rows.truncate(positions * width);
                }
            }
        }
        self.positions = positions;
        self.speculation = None;
        Ok(())
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
                LayerState::Kda(k) => {
                    k.s.len() + k.history.iter().map(Vec::len).sum::<usize>() + k.journal_len()
                }
                LayerState::Mla(m) => m.rows.len(),
            })
            .sum();
        values * std::mem::size_of::<f32>()
    }
}
