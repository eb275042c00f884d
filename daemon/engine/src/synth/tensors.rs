//! The tensors of a synthetic checkpoint, shard by shard: the checkpoint inventory of the
//! shape's config (spec §3.1 placement, §3.3 names/shapes/dtypes, from
//! [`crate::checkpoint::inventory`]) with the value distribution of each (spec §9.1).

use crate::checkpoint::config::ModelConfig;
use crate::checkpoint::inventory::{self, DimOverflow, Want, names};
use crate::checkpoint::safetensors::TensorSpec;

/// How a tensor's elements are drawn (spec §9.1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// N(0, std²).
    Normal { std: f64 },
    /// U[lo, hi) — norm gains.
    Uniform { lo: f64, hi: f64 },
    /// `ln U[1, 16)` for the first `live` entries, zero after (the padded `A_log`).
    LogUniformPadded { live: usize },
    /// Uniform bytes: two uniform nibbles each (MXFP4 `weight_packed`).
    Bytes,
    /// Uniform over `lo ..= lo + span − 1` (MXFP4 E8M0 `weight_scale`).
    ScaleBytes { lo: u8, span: u8 },
}

/// One tensor to write: what the release stores and how its values are drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub spec: TensorSpec,
    pub init: Init,
}

impl Tensor {
    /// Element count. Callers have checked [`TensorSpec::byte_len`] (the header encoding
    /// does), so the product fits.
    pub fn numel(&self) -> u64 {
        self.spec.shape.iter().product()
    }
}

/// One shard: its tensors in no particular order (the writer orders them, spec §3.2).
#[derive(Debug, Clone)]
pub struct ShardSpec {
    pub tensors: Vec<Tensor>,
}

/// Std of an ordinary matrix: well-conditioned `0.5/√fan_in` (spec §9.1, §6.2).
const MATRIX_GAIN: f64 = 0.5;
/// Std of the dense and shared-expert gate projections, as `GATE_GAIN/√fan_in`. Spec §9.1
/// gives N(0, 0.75²) at H = 64, i.e. 6/√64: pre-activations of std ≈ 6 so that the SiTU
/// gate cap (β₁ = 4) engages often. Scaling with fan-in keeps that true for every shape.
const GATE_GAIN: f64 = 6.0;
/// Norm gains: U[0.8, 1.2) (spec §9.1).
const GAIN: Init = Init::Uniform { lo: 0.8, hi: 1.2 };
/// Token embeddings: N(0, 1) (spec §9.1).
const EMBEDDING: Init = Init::Normal { std: 1.0 };
/// AttnRes pseudo-queries (spec §9.1).
const PSEUDO_QUERY: Init = Init::Normal { std: 0.15 };
/// `dt_bias` and conv taps (spec §9.1).
const DT_CONV: Init = Init::Normal { std: 0.5 };
/// Router bias (spec §9.1).
const ROUTER_BIAS: Init = Init::Normal { std: 0.1 };
/// E8M0 scale bytes 122–125: multipliers 2^−5 … 2^−2 (spec §9.1).
const SCALE_BYTES: Init = Init::ScaleBytes { lo: 122, span: 4 };

/// The distribution of the inventory entry `w` (a layer-relative, expert-relative or
/// model-level name of [`names`]) stored with `shape`.
fn init(c: &ModelConfig, w: &Want, shape: &[u64]) -> Init {
    let matrix = |gain: f64| {
        // Every matrix is `[out, in]` (checked by `projections_are_matrices`).
        let fan_in = shape.get(1).copied().unwrap_or(1);
        Init::Normal {
            std: gain / (fan_in as f64).sqrt(),
        }
    };
    match w.name {
        names::MLP_GATE_PROJ | names::SHARED_GATE_PROJ => matrix(GATE_GAIN),
        name => special_init(c, name).unwrap_or_else(|| matrix(MATRIX_GAIN)),
    }
}

/// The distribution of every tensor that is not a BF16 projection matrix; `None` for those.
fn special_init(c: &ModelConfig, name: &str) -> Option<Init> {
    use names::*;
    Some(match name {
        EMBED_TOKENS => EMBEDDING,
        INPUT_LAYERNORM
        | POST_ATTENTION_LAYERNORM
        | SELF_ATTENTION_RES_NORM
        | MLP_RES_NORM
        | O_NORM
        | Q_A_LAYERNORM
        | KV_A_LAYERNORM
        | ROUTED_NORM
        | NORM
        | OUTPUT_ATTN_RES_NORM => GAIN,
        SELF_ATTENTION_RES_PROJ | MLP_RES_PROJ | OUTPUT_ATTN_RES_PROJ => PSEUDO_QUERY,
        Q_CONV1D | K_CONV1D | V_CONV1D | DT_BIAS => DT_CONV,
        A_LOG => Init::LogUniformPadded {
            live: c.kda.num_heads,
        },
        MOE_BIAS => ROUTER_BIAS,
        W1_PACKED | W2_PACKED | W3_PACKED => Init::Bytes,
        W1_SCALE | W2_SCALE | W3_SCALE => SCALE_BYTES,
        _ => return None,
    })
}

fn tensor(c: &ModelConfig, (spec, w): (TensorSpec, Want)) -> Tensor {
    let init = init(c, &w, &spec.shape);
    Tensor { spec, init }
}

/// All shards of `config`: one per layer (shard `k+1` = layer `k`), then the model-level
/// shard. `a_log_len` is the stored `A_log` length.
pub fn shards(config: &ModelConfig, a_log_len: usize) -> Result<Vec<ShardSpec>, DimOverflow> {
    let mut out = Vec::with_capacity(config.num_hidden_layers + 1);
    for l in 0..config.num_hidden_layers {
        let entries = inventory::layer_entries(config, l, a_log_len as u64)?;
        out.push(ShardSpec {
            tensors: entries.into_iter().map(|e| tensor(config, e)).collect(),
        });
    }
    let entries = inventory::model_entries(config);
    out.push(ShardSpec {
        tensors: entries.into_iter().map(|e| tensor(config, e)).collect(),
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::safetensors::Dtype;
    use crate::synth::shape::{SHAPE_NAMES, Shape};

    fn shape_shards(name: &str) -> Vec<ShardSpec> {
        let s = Shape::named(name).unwrap();
        let c = ModelConfig {
            vocab_size: 300,
            ..s.config
        };
        shards(&c, s.a_log_len).unwrap()
    }

    /// Released tensor counts per layer kind (spec §3.1): layer 0 23, KDA+MoE 28 + 6E,
    /// MLA+MoE 22 + 6E, model level 5.
    #[test]
    fn tensor_counts_match_the_release() {
        let c: Vec<usize> = shape_shards("tiny")
            .iter()
            .map(|s| s.tensors.len())
            .collect();
        assert_eq!(c[0], 23);
        assert_eq!(c[1], 28 + 6 * 8);
        assert_eq!(c[3], 22 + 6 * 8);
        assert_eq!(c[9], 5);
        assert_eq!(c.len(), 10);
    }

    /// Byte inits go with U8 tensors and float inits with F32/BF16 ones, in every shape.
    #[test]
    fn inits_match_dtypes() {
        for name in SHAPE_NAMES {
            for t in shape_shards(name).iter().flat_map(|sh| &sh.tensors) {
                let bytes = matches!(t.init, Init::Bytes | Init::ScaleBytes { .. });
                assert_eq!(bytes, t.spec.dtype == Dtype::U8, "{name}: {}", t.spec.name);
            }
        }
    }

    /// What [`special_init`] leaves to the matrix rule is a BF16 `[out, in]` matrix.
    #[test]
    fn projections_are_matrices() {
        let s = Shape::named("tiny").unwrap();
        let c = &s.config;
        let mut entries = inventory::model_entries(c);
        for l in 0..c.num_hidden_layers {
            entries.extend(inventory::layer_entries(c, l, s.a_log_len as u64).unwrap());
        }
        for (t, w) in entries {
            if special_init(c, w.name).is_none() {
                assert_eq!((t.dtype, t.shape.len()), (Dtype::Bf16, 2), "{}", t.name);
            }
        }
    }

    /// The bench shape reproduces released per-layer bytes exactly (spec §1.2), except the
    /// router, which has one row and one bias per expert (64 instead of 896).
    #[test]
    fn bench_has_released_layer_bytes() {
        let sh = shape_shards("bench");
        let bytes = |i: usize, experts: bool| -> u64 {
            sh[i]
                .tensors
                .iter()
                .filter(|t| t.spec.name.contains(".experts.") == experts)
                .map(|t| t.spec.byte_len().unwrap())
                .sum()
        };
        assert_eq!(bytes(0, false), 2_341_213_184);
        let router_delta = (896 - 64) * (7168 * 2 + 4);
        assert_eq!(bytes(1, false) + router_delta, 1_267_744_256);
        assert_eq!(bytes(3, false) + router_delta, 844_335_616);
        assert_eq!(bytes(1, true), 64 * 17_547_264);
    }
}
