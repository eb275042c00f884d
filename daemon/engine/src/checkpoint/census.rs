//! The byte census of a bound checkpoint (spec §1.2): what is stored where, and how many bytes
//! one decoded token must touch.

use serde::Serialize;

use super::config::{MixerKind, ModelConfig};
use super::layout::{FfnLayout, ModelLayout};

/// Byte counts of a bound model. All figures are stored bytes as laid out in the shards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ByteCensus {
    pub layers: usize,
    pub kda_layers: usize,
    pub mla_layers: usize,
    pub dense_layers: usize,
    pub moe_layers: usize,
    /// `trunk_bytes_per_layer[L]`: the bytes of layer L's trunk run (all non-expert tensors).
    pub trunk_bytes_per_layer: Vec<u64>,
    pub trunk_bytes: u64,
    /// Bytes of one routed expert (six tensors); every expert has the same shapes.
    pub expert_bytes: u64,
    pub experts: u64,
    pub all_expert_bytes: u64,
    pub embedding_bytes: u64,
    /// One embedding row: what a token's lookup reads.
    pub embedding_row_bytes: u64,
    pub lm_head_bytes: u64,
    /// Embedding, lm_head and the three model-level vectors.
    pub model_level_bytes: u64,
    /// Every bound text tensor: trunk + experts + model level.
    pub text_bytes: u64,
    /// Routed experts one token evaluates: top-k in every MoE layer.
    pub experts_per_token: u64,
    /// Bytes one decode step touches with nothing cached (spec §1.2 "Bytes per generated
    /// token"): the whole trunk, top-k experts per MoE layer, one embedding row, the lm_head.
    pub decode_token_bytes: u64,
}

impl ByteCensus {
    pub fn of(config: &ModelConfig, layout: &ModelLayout) -> ByteCensus {
        let count = |kind| config.layer_kinds.iter().filter(|&&k| k == kind).count();
        let trunk_bytes_per_layer: Vec<u64> = layout.layers.iter().map(|l| l.trunk.len).collect();
        let mut expert_bytes = 0;
        let mut experts = 0u64;
        let mut all_expert_bytes = 0u64;
        let mut moe_layers = 0;
        for layer in &layout.layers {
            if let FfnLayout::Moe(moe) = &layer.ffn {
                moe_layers += 1;
                for (run, _) in &moe.experts {
                    expert_bytes = expert_bytes.max(run.len);
                    experts += 1;
                    all_expert_bytes = all_expert_bytes.saturating_add(run.len);
                }
            }
        }
        let trunk_bytes = trunk_bytes_per_layer
            .iter()
            .fold(0u64, |a, &b| a.saturating_add(b));
        let embedding_bytes = layout.embed_tokens.run.len;
        let embedding_row_bytes = embedding_bytes / (config.vocab_size as u64).max(1);
        let lm_head_bytes = layout.lm_head.run.len;
        let model_level_bytes = [
            &layout.embed_tokens,
            &layout.lm_head,
            &layout.norm,
            &layout.output_attn_res_norm,
            &layout.output_attn_res_proj,
        ]
        .iter()
        .fold(0u64, |a, t| a.saturating_add(t.run.len));
        let experts_per_token =
            (moe_layers as u64).saturating_mul(config.num_experts_per_token as u64);
        ByteCensus {
            layers: layout.layers.len(),
            kda_layers: count(MixerKind::Kda),
            mla_layers: count(MixerKind::Mla),
            dense_layers: layout.layers.len() - moe_layers,
            moe_layers,
            trunk_bytes_per_layer,
            trunk_bytes,
            expert_bytes,
            experts,
            all_expert_bytes,
            embedding_bytes,
            embedding_row_bytes,
            lm_head_bytes,
            model_level_bytes,
            text_bytes: trunk_bytes
                .saturating_add(all_expert_bytes)
                .saturating_add(model_level_bytes),
            experts_per_token,
            decode_token_bytes: trunk_bytes
                .saturating_add(experts_per_token.saturating_mul(expert_bytes))
                .saturating_add(embedding_row_bytes)
                .saturating_add(lm_head_bytes),
        }
    }
}

/// The released checkpoint as tests see it: its config and its tensor index, headers only and
/// in memory (what the released dims imply is tested here and in `crate::plan`).
#[cfg(test)]
pub(crate) mod released {
    use super::ModelConfig;
    use crate::checkpoint::inventory::{layer_tensors, model_tensors};
    use crate::checkpoint::safetensors::{TensorIndex, encode_header};
    use std::path::PathBuf;

    pub fn config() -> ModelConfig {
        ModelConfig::from_json(include_str!("testdata/released_config.json"))
            .expect("released config is valid")
    }

    /// Headers only, in memory: one shard per layer plus one for the model level, as released.
    pub fn index(config: &ModelConfig) -> TensorIndex {
        let mut shards: Vec<Vec<_>> = (0..config.num_hidden_layers)
            .map(|l| layer_tensors(config, l, 128).expect("released dims fit"))
            .collect();
        shards.push(model_tensors(config));
        let n = shards.len();
        let parts = shards
            .iter()
            .enumerate()
            .map(|(i, tensors)| {
                let (header, data_len) = encode_header(tensors).expect("encodable");
                let size = header.len() as u64 + data_len;
                let name = format!("model-{:05}-of-{n:06}.safetensors", i + 1);
                (PathBuf::from(name), size, header)
            })
            .collect();
        TensorIndex::from_header_bytes(parts).expect("a well-formed synthetic index")
    }
}

#[cfg(test)]
mod tests {
    use super::released::index as released_index;
    use super::*;
    use crate::checkpoint::layout::bind;

    /// Every figure of spec §1.2 that the text model determines, from the released dims.
    #[test]
    fn released_dims_match_spec_byte_census() {
        let config = super::released::config();
        let index = released_index(&config);
        assert_eq!(index.len(), 497_220 - 168, "text tensors of §3.1");
        let layout = bind(&config, &index).expect("binds");
        let c = ByteCensus::of(&config, &layout);
        assert_eq!((c.kda_layers, c.mla_layers), (69, 24));
        assert_eq!((c.dense_layers, c.moe_layers), (1, 92));
        assert_eq!(c.expert_bytes, 17_547_264);
        assert_eq!(c.experts, 82_432);
        assert_eq!(c.all_expert_bytes, 1_446_456_066_048);
        assert_eq!(c.trunk_bytes, 108_811_877_376);
        assert_eq!(c.trunk_bytes_per_layer[0], 2_341_213_184);
        assert_eq!(c.trunk_bytes_per_layer[1], 1_267_744_256, "KDA + MoE");
        assert_eq!(c.trunk_bytes_per_layer[3], 844_335_616, "MLA + MoE");
        assert_eq!(c.model_level_bytes, 4_697_663_488);
        assert_eq!(c.text_bytes, 1_559_965_606_912);
        assert_eq!(c.experts_per_token, 1_472);
        assert_eq!(c.embedding_row_bytes, 14_336);
        assert_eq!(c.lm_head_bytes, 2_348_810_240);
        assert_eq!(
            c.decode_token_bytes,
            108_811_877_376 + 25_829_572_608 + 14_336 + 2_348_810_240
        );
        // Shard sizes of §3.1 follow from the released header encoding.
        let size = |i: usize| index.shards()[i].size;
        assert_eq!(size(0), 2_341_216_112);
        assert_eq!(size(1), 16_990_911_504);
        assert_eq!(size(10), 16_990_916_912);
        assert_eq!(size(3), 16_567_501_776);
        assert_eq!(size(11), 16_567_507_176);
        assert_eq!(size(93), 4_697_664_072);
    }
}
