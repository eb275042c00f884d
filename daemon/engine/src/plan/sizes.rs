//! The byte census the plan is computed from: run sizes of the bound checkpoint (spec §1.2),
//! the state for the planned context (spec §5.1) and the forward pass's scratch.

use super::buffers::window_capacity;
use super::{PlanError, StateShape};
use crate::checkpoint::config::ModelConfig;
use crate::checkpoint::layout::{FfnLayout, LayerLayout, MixerLayout, ModelLayout, Slice};

/// The byte census the plan needs (spec §1.2, §5.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Census {
    /// Trunk run length of every layer, by layer index.
    pub trunk_layers: Vec<u64>,
    /// Bytes of every layer's trunk matrices, by layer index: what a chunk stream reads of the
    /// layer per token (its small vectors are decoded once at load).
    pub trunk_matrix_bytes: Vec<u64>,
    /// One routed expert's run (17,547,264 for K3).
    pub expert_bytes: u64,
    pub experts_per_layer: usize,
    pub moe_layers: usize,
    /// Routed experts per token and MoE layer.
    pub top_k: usize,
    pub embedding_bytes: u64,
    pub embedding_row_bytes: u64,
    pub lm_head_bytes: u64,
    /// Final norm and output AttnRes vectors: always resident.
    pub model_vectors_bytes: u64,
    /// KDA and conv state plus the MLA cache at the maximum context.
    pub state_bytes: u64,
    /// Activations, logits and kernel workspaces (supplied by the forward pass).
    pub scratch_bytes: u64,
    /// Sequences one forward pass may decode together (a daemon's batch): the routing
    /// lookahead wants top-k slots for each (rule 4).
    pub sequences: usize,
    /// The widest row of any matrix that may stream (trunk matrices, lm_head): a stream chunk
    /// must hold one plus a page.
    pub trunk_row_bytes: u64,
    /// The largest trunk matrix a forward needs whole at once when it streams in chunks (MLA's
    /// `kv_b_proj`, read per head for every sequence): gathered into one buffer.
    pub gather_bytes: u64,
}

impl Census {
    /// The census of a bound checkpoint.
    pub fn from_layout(
        layout: &ModelLayout,
        cfg: &ModelConfig,
        max_context: u64,
        scratch_bytes: u64,
    ) -> Result<Self, PlanError> {
        let mut expert_bytes = 0;
        let mut experts_per_layer = 0;
        let mut moe_layers = 0;
        for l in &layout.layers {
            if let FfnLayout::Moe(m) = &l.ffn {
                moe_layers += 1;
                experts_per_layer = experts_per_layer.max(m.experts.len());
                expert_bytes = m
                    .experts
                    .iter()
                    .fold(expert_bytes, |a, (r, _)| a.max(r.len));
            }
        }
        let rows = layout
            .embed_tokens
            .slice
            .shape
            .first()
            .copied()
            .unwrap_or(0) as u64;
        let embedding_bytes = layout.embed_tokens.run.len;
        let state = StateShape::of(cfg)
            .bytes(max_context)
            .ok_or_else(|| PlanError::BadCensus("state size overflows".into()))?;
        let row = |s: &Slice| match s.shape.as_slice() {
            [rows, ..] if *rows > 0 => (s.len / rows) as u64,
            _ => 0,
        };
        let lm_head_row = row(&layout.lm_head.slice);
        let trunk_row_bytes = layout
            .layers
            .iter()
            .flat_map(LayerLayout::stream_order)
            .map(|s| row(&s))
            .fold(lm_head_row, u64::max);
        let gather_bytes = layout
            .layers
            .iter()
            .filter_map(|l| match &l.mixer {
                MixerLayout::Mla(a) => Some(a.kv_b_proj.len as u64),
                MixerLayout::Kda(_) => None,
            })
            .max()
            .unwrap_or(0);
        let census = Self {
            trunk_layers: layout.layers.iter().map(|l| l.trunk.len).collect(),
            trunk_matrix_bytes: layout
                .layers
                .iter()
                .map(|l| {
                    let order = l.stream_order();
                    order.iter().map(|s| s.len as u64).sum()
                })
                .collect(),
            expert_bytes,
            experts_per_layer,
            moe_layers,
            top_k: cfg.num_experts_per_token,
            embedding_bytes,
            embedding_row_bytes: embedding_bytes.checked_div(rows).unwrap_or(0),
            lm_head_bytes: layout.lm_head.run.len,
            model_vectors_bytes: layout.norm.run.len
                + layout.output_attn_res_norm.run.len
                + layout.output_attn_res_proj.run.len,
            state_bytes: state,
            scratch_bytes,
            sequences: 1,
            trunk_row_bytes,
            gather_bytes,
        };
        census.validate()?;
        Ok(census)
    }

    pub(super) fn validate(&self) -> Result<(), PlanError> {
        let bad = |m: &str| Err(PlanError::BadCensus(m.into()));
        if self.trunk_layers.is_empty() {
            return bad("no layers");
        }
        let mut matrices = self.trunk_matrix_bytes.iter().zip(&self.trunk_layers);
        if self.trunk_matrix_bytes.len() != self.trunk_layers.len() || matrices.any(|(m, l)| m > l)
        {
            return bad("trunk matrix bytes do not match the layers");
        }
        if self.moe_layers > 0 && (self.expert_bytes == 0 || self.top_k == 0) {
            return bad("MoE layers without expert size or top-k");
        }
        if self.top_k > self.experts_per_layer {
            return bad("top-k exceeds the experts per layer");
        }
        // Totals in u64 must not overflow anywhere below.
        let total = self
            .trunk_layers
            .iter()
            .try_fold(0u64, |a, &b| a.checked_add(b))
            .and_then(|t| t.checked_add(self.embedding_bytes))
            .and_then(|t| t.checked_add(self.lm_head_bytes))
            .and_then(|t| t.checked_add(self.state_bytes))
            .and_then(|t| t.checked_add(self.scratch_bytes))
            .and_then(|t| t.checked_add(self.model_vectors_bytes))
            .and_then(|t| t.checked_add(self.gather_bytes))
            .and_then(|t| t.checked_add(self.expert_slot_bytes().checked_mul(self.pool() as u64)?));
        if total.is_none() {
            return bad("sizes overflow");
        }
        Ok(())
    }

    /// Buffer bytes of one expert cache slot: the aligned window of an expert at any offset.
    pub fn expert_slot_bytes(&self) -> u64 {
        window_capacity(self.expert_bytes).unwrap_or(u64::MAX)
    }

    /// All routed experts of the model.
    pub fn pool(&self) -> usize {
        self.moe_layers * self.experts_per_layer
    }

    /// Cache slots one token's routed experts take (top-k × MoE layers; 1,472 for K3).
    pub fn token_expert_slots(&self) -> usize {
        self.moe_layers * self.top_k
    }

    /// Expert bytes one token routes to (25,829,572,608 for K3).
    pub fn expert_bytes_per_token(&self) -> u64 {
        (self.moe_layers * self.top_k) as u64 * self.expert_bytes
    }

    pub fn trunk_bytes(&self) -> u64 {
        self.trunk_layers.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use crate::checkpoint::census::released;
    use crate::checkpoint::layout::bind;
    use crate::plan::{Budget, GIB, Plan, PlanError, PlanInputs, Residency, StreamScheme};

    /// Issue 17: the released model's floor — nothing pinned, the minimum expert cache
    /// (top-k + 1), the state, scratch, the chunk stream (trunk and lm_head), one embedding
    /// row's window — is at most 2 GiB at 4,096 and 8,192 positions of context, where the
    /// two-slot whole-layer ring needs over 5 GiB.
    #[test]
    fn released_floor_is_at_most_2_gib_with_the_chunk_stream() {
        let config = released::config();
        let layout = bind(&config, &released::index(&config)).expect("binds");
        for max_context in [4096, 8192] {
            let floor = |scheme| {
                let inputs = PlanInputs {
                    budget: Budget {
                        ram: Some(1),
                        ..Budget::default()
                    },
                    scheme,
                    max_context,
                    ..PlanInputs::default()
                };
                match Plan::for_model(&config, &layout, &inputs) {
                    Err(PlanError::BudgetTooSmall { needed, .. }) => (needed, inputs),
                    other => panic!("a 1-byte budget must be refused, got {other:?}"),
                }
            };
            let (needed, mut inputs) = floor(StreamScheme::default());
            inputs.budget.ram = Some(needed);
            let plan = Plan::for_model(&config, &layout, &inputs).expect("the floor plans");
            println!("{max_context} positions:\n{plan}");
            assert!(
                needed <= 2 * GIB,
                "floor {needed} B ({:.2} GiB) is above 2 GiB:\n{plan}",
                needed as f64 / GIB as f64
            );
            assert_eq!(plan.total(), needed);
            assert!(plan.pinned_layers.is_empty());
            assert_eq!(
                (plan.lm_head, plan.embedding, plan.cache_slots),
                (Residency::Streamed, Residency::Streamed, 17)
            );
            assert_eq!(
                plan.scheme,
                StreamScheme::Chunks {
                    chunk: 32 << 20,
                    in_flight: 8
                }
            );
            let (ring, _) = floor(StreamScheme::Ring { slots: 2 });
            assert!(ring > 5 * GIB, "ring floor {ring}");
        }
    }
}
