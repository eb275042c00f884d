//! The state geometry: the dimensions that size a sequence's carried state and the rollback
//! journal of a speculative step (spec §5.1, §5.2).

use crate::checkpoint::config::{MixerKind, ModelConfig};

/// The dimensions that size the conversation state (spec §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateShape {
    pub kda_layers: u64,
    pub kda_heads: u64,
    pub kda_head_dim: u64,
    pub conv_kernel: u64,
    pub mla_layers: u64,
    /// Values per MLA cache row in latent form: kv_lora_rank + qk_rope_head_dim.
    pub mla_row_values: u64,
}

impl StateShape {
    pub fn of(cfg: &ModelConfig) -> Self {
        let count = |k| cfg.layer_kinds.iter().filter(|&&x| x == k).count() as u64;
        Self {
            kda_layers: count(MixerKind::Kda),
            kda_heads: cfg.kda.num_heads as u64,
            kda_head_dim: cfg.kda.head_dim as u64,
            conv_kernel: cfg.kda.short_conv_kernel_size as u64,
            mla_layers: count(MixerKind::Mla),
            mla_row_values: (cfg.kv_lora_rank + cfg.qk_rope_head_dim) as u64,
        }
    }

    /// f32 KDA state and conv histories (fixed) plus the f32 latent MLA cache for
    /// `max_context` positions: 464,633,856 + 55,296 × `max_context` for the released model.
    pub fn bytes(&self, max_context: u64) -> Option<u64> {
        let width = self.kda_heads.checked_mul(self.kda_head_dim)?;
        let kda_layer = width
            .checked_mul(self.kda_head_dim)?
            .checked_add(3 * self.conv_kernel.saturating_sub(1) * width)?
            .checked_mul(4)?;
        let mla = (self.mla_row_values * 4)
            .checked_mul(self.mla_layers)?
            .checked_mul(max_context)?;
        kda_layer.checked_mul(self.kda_layers)?.checked_add(mla)
    }

    /// The rollback journal of one speculative step of `tokens` fed ids (spec §5.2): per KDA
    /// layer a copy of S and the conv histories, plus per token the pre-conv q, k, v, the
    /// post-conv k, v and α (`P` values each) and β (one per head), all f32. MLA needs nothing
    /// (its rows are truncated).
    pub fn journal_bytes(&self, tokens: u64) -> Option<u64> {
        let width = self.kda_heads.checked_mul(self.kda_head_dim)?;
        let copy = width
            .checked_mul(self.kda_head_dim)?
            .checked_add(3 * self.conv_kernel.saturating_sub(1) * width)?;
        let per_token = width.checked_mul(6)?.checked_add(self.kda_heads)?;
        copy.checked_add(per_token.checked_mul(tokens)?)?
            .checked_mul(4)?
            .checked_mul(self.kda_layers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_state_matches_spec() {
        let k3 = StateShape {
            kda_layers: 69,
            kda_heads: 96,
            kda_head_dim: 128,
            conv_kernel: 4,
            mla_layers: 24,
            mla_row_values: 576,
        };
        assert_eq!(k3.bytes(0), Some(464_633_856));
        assert_eq!(k3.bytes(8192), Some(464_633_856 + 55_296 * 8192));
        assert_eq!(k3.bytes(u64::MAX), None);
        // A step verifying 4 drafts feeds 5 ids: a copy of every KDA layer's state (the
        // 464,633,856 bytes above) plus 20,375,424 bytes of recurrence inputs per id.
        assert_eq!(k3.journal_bytes(5), Some(464_633_856 + 5 * 20_375_424));
        // The synthetic `bench` shape: released layers, 4 of them KDA (README's figures).
        let bench = StateShape {
            kda_layers: 4,
            ..k3
        };
        assert_eq!(bench.journal_bytes(1), Some(26_935_296 + 1_181_184));
        assert_eq!(bench.journal_bytes(5), Some(32_841_216));
    }
}
