//! The tensors of a synthetic checkpoint, shard by shard, with the value distribution of each
//! (spec §3.1 placement, §3.3 names/shapes/dtypes, §9.1 values).

use super::shape::Shape;
use crate::checkpoint::config::MixerKind;
use crate::checkpoint::safetensors::Dtype;

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

#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub init: Init,
}

impl TensorSpec {
    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }

    pub fn nbytes(&self) -> u64 {
        self.numel() * self.dtype.size() as u64
    }
}

/// One shard: its tensors in no particular order (the writer orders them, spec §3.2).
#[derive(Debug, Clone)]
pub struct ShardSpec {
    pub tensors: Vec<TensorSpec>,
}

/// Std of an ordinary matrix: well-conditioned `0.5/√fan_in` (spec §9.1, §6.2).
const MATRIX_GAIN: f64 = 0.5;
/// Std of the dense and shared-expert gate projections, as `GATE_GAIN/√fan_in`. Spec §9.1
/// gives N(0, 0.75²) at H = 64, i.e. 6/√64: pre-activations of std ≈ 6 so that the SiTU
/// gate cap (β₁ = 4) engages often. Scaling with fan-in keeps that true for every shape.
const GATE_GAIN: f64 = 6.0;
const GAIN_LO: f64 = 0.8;
const GAIN_HI: f64 = 1.2;
/// AttnRes pseudo-queries (spec §9.1).
const PSEUDO_QUERY_STD: f64 = 0.15;
/// `dt_bias` and conv taps (spec §9.1).
const DT_CONV_STD: f64 = 0.5;
/// Router bias (spec §9.1).
const ROUTER_BIAS_STD: f64 = 0.1;
/// E8M0 scale bytes 122–125: multipliers 2^−5 … 2^−2 (spec §9.1).
const SCALE_LO: u8 = 122;
const SCALE_SPAN: u8 = 4;

struct Builder {
    tensors: Vec<TensorSpec>,
}

impl Builder {
    fn push(&mut self, name: String, dtype: Dtype, shape: Vec<usize>, init: Init) {
        self.tensors.push(TensorSpec {
            name,
            dtype,
            shape,
            init,
        });
    }

    /// A BF16 `[out, in]` matrix with std `gain/√in`.
    fn matrix(&mut self, name: String, out: usize, inp: usize, gain: f64) {
        let std = gain / (inp as f64).sqrt();
        self.push(name, Dtype::Bf16, vec![out, inp], Init::Normal { std });
    }

    /// A norm gain vector.
    fn gain(&mut self, name: String, dtype: Dtype, n: usize) {
        let init = Init::Uniform {
            lo: GAIN_LO,
            hi: GAIN_HI,
        };
        self.push(name, dtype, vec![n], init);
    }

    /// A SiTU-GLU MLP (dense or shared experts): gate/up `[width, h]`, down `[h, width]`.
    fn mlp(&mut self, prefix: &str, h: usize, width: usize) {
        self.matrix(format!("{prefix}gate_proj.weight"), width, h, GATE_GAIN);
        self.matrix(format!("{prefix}up_proj.weight"), width, h, MATRIX_GAIN);
        self.matrix(format!("{prefix}down_proj.weight"), h, width, MATRIX_GAIN);
    }
}

/// All shards: one per layer (shard `k+1` = layer `k`), then the model-level shard.
pub fn shards(s: &Shape, vocab_size: usize) -> Vec<ShardSpec> {
    let kinds = s.layer_kinds();
    let mut out: Vec<ShardSpec> = kinds
        .iter()
        .enumerate()
        .map(|(l, &kind)| layer_shard(s, l, kind))
        .collect();
    out.push(model_shard(s, vocab_size));
    out
}

/// The model-level tensors (spec §3.3, shard 94 in the release).
fn model_shard(s: &Shape, vocab: usize) -> ShardSpec {
    let h = s.hidden_size;
    let mut b = Builder {
        tensors: Vec::new(),
    };
    let p = "language_model.";
    b.push(
        format!("{p}model.embed_tokens.weight"),
        Dtype::Bf16,
        vec![vocab, h],
        Init::Normal { std: 1.0 },
    );
    b.matrix(format!("{p}lm_head.weight"), vocab, h, MATRIX_GAIN);
    b.gain(format!("{p}model.norm.weight"), Dtype::Bf16, h);
    b.gain(
        format!("{p}model.output_attn_res_norm.weight"),
        Dtype::Bf16,
        h,
    );
    b.push(
        format!("{p}model.output_attn_res_proj.weight"),
        Dtype::Bf16,
        vec![1, h],
        Init::Normal {
            std: PSEUDO_QUERY_STD,
        },
    );
    ShardSpec { tensors: b.tensors }
}

/// Every tensor of decoder layer `l` (spec §3.3).
fn layer_shard(s: &Shape, l: usize, kind: MixerKind) -> ShardSpec {
    let h = s.hidden_size;
    let p = format!("language_model.model.layers.{l}.");
    let mut b = Builder {
        tensors: Vec::new(),
    };
    for v in [
        "input_layernorm",
        "post_attention_layernorm",
        "self_attention_res_norm",
        "mlp_res_norm",
    ] {
        b.gain(format!("{p}{v}.weight"), Dtype::Bf16, h);
    }
    for v in ["self_attention_res_proj", "mlp_res_proj"] {
        let init = Init::Normal {
            std: PSEUDO_QUERY_STD,
        };
        b.push(format!("{p}{v}.weight"), Dtype::Bf16, vec![1, h], init);
    }
    let a = format!("{p}self_attn.");
    match kind {
        MixerKind::Kda => kda(&mut b, s, &a),
        MixerKind::Mla => mla(&mut b, s, &a),
    }
    if s.is_moe_layer(l) {
        moe(&mut b, s, &format!("{p}block_sparse_moe."));
    } else {
        b.mlp(&format!("{p}mlp."), h, s.intermediate_size);
    }
    ShardSpec { tensors: b.tensors }
}

fn kda(b: &mut Builder, s: &Shape, a: &str) {
    let h = s.hidden_size;
    let d = s.kda_head_dim;
    let pw = s.kda_num_heads * d;
    for m in ["q_proj", "k_proj", "v_proj", "g_proj"] {
        b.matrix(format!("{a}{m}.weight"), pw, h, MATRIX_GAIN);
    }
    b.matrix(format!("{a}o_proj.weight"), h, pw, MATRIX_GAIN);
    for c in ["q_conv1d", "k_conv1d", "v_conv1d"] {
        let init = Init::Normal { std: DT_CONV_STD };
        let shape = vec![pw, 1, s.short_conv_kernel_size];
        b.push(format!("{a}{c}.weight"), Dtype::F32, shape, init);
    }
    // The decay low-rank pair has rank = head_dim (128 released, spec §3.3).
    b.matrix(format!("{a}f_a_proj.weight"), d, h, MATRIX_GAIN);
    b.matrix(format!("{a}f_b_proj.weight"), pw, d, MATRIX_GAIN);
    b.matrix(format!("{a}b_proj.weight"), s.kda_num_heads, h, MATRIX_GAIN);
    let live = s.kda_num_heads;
    b.push(
        format!("{a}A_log"),
        Dtype::F32,
        vec![s.a_log_len],
        Init::LogUniformPadded { live },
    );
    let init = Init::Normal { std: DT_CONV_STD };
    b.push(format!("{a}dt_bias"), Dtype::F32, vec![pw], init);
    b.gain(format!("{a}o_norm.weight"), Dtype::F32, d);
}

fn mla(b: &mut Builder, s: &Shape, a: &str) {
    let h = s.hidden_size;
    let nh = s.num_attention_heads;
    let qh = s.qk_nope_head_dim + s.qk_rope_head_dim;
    b.matrix(format!("{a}q_a_proj.weight"), s.q_lora_rank, h, MATRIX_GAIN);
    b.gain(
        format!("{a}q_a_layernorm.weight"),
        Dtype::Bf16,
        s.q_lora_rank,
    );
    b.matrix(
        format!("{a}q_b_proj.weight"),
        nh * qh,
        s.q_lora_rank,
        MATRIX_GAIN,
    );
    let kva_rows = s.kv_lora_rank + s.qk_rope_head_dim;
    b.matrix(
        format!("{a}kv_a_proj_with_mqa.weight"),
        kva_rows,
        h,
        MATRIX_GAIN,
    );
    b.gain(
        format!("{a}kv_a_layernorm.weight"),
        Dtype::Bf16,
        s.kv_lora_rank,
    );
    let kvb_rows = nh * (s.qk_nope_head_dim + s.v_head_dim);
    b.matrix(
        format!("{a}kv_b_proj.weight"),
        kvb_rows,
        s.kv_lora_rank,
        MATRIX_GAIN,
    );
    let vw = nh * s.v_head_dim;
    b.matrix(format!("{a}o_proj.weight"), h, vw, MATRIX_GAIN);
    b.matrix(format!("{a}g_proj.weight"), vw, h, MATRIX_GAIN);
}

fn moe(b: &mut Builder, s: &Shape, m: &str) {
    let h = s.hidden_size;
    let lat = s.routed_expert_hidden_size;
    let w = s.moe_intermediate_size;
    b.matrix(format!("{m}gate.weight"), s.num_experts, h, MATRIX_GAIN);
    let init = Init::Normal {
        std: ROUTER_BIAS_STD,
    };
    let name = format!("{m}gate.e_score_correction_bias");
    b.push(name, Dtype::F32, vec![s.num_experts], init);
    b.matrix(
        format!("{m}routed_expert_down_proj.weight"),
        lat,
        h,
        MATRIX_GAIN,
    );
    b.matrix(
        format!("{m}routed_expert_up_proj.weight"),
        h,
        lat,
        MATRIX_GAIN,
    );
    b.gain(format!("{m}routed_expert_norm.weight"), Dtype::Bf16, lat);
    let shared_width = s.num_shared_experts * w;
    b.mlp(&format!("{m}shared_experts."), h, shared_width);
    for e in 0..s.num_experts {
        // w1 = gate and w3 = up read the latent; w2 = down reads the expert width (spec §3.5).
        for (wn, rows, inp) in [("w1", w, lat), ("w2", lat, w), ("w3", w, lat)] {
            let t = format!("{m}experts.{e}.{wn}.");
            b.push(
                format!("{t}weight_packed"),
                Dtype::U8,
                vec![rows, inp / 2],
                Init::Bytes,
            );
            let init = Init::ScaleBytes {
                lo: SCALE_LO,
                span: SCALE_SPAN,
            };
            b.push(
                format!("{t}weight_scale"),
                Dtype::U8,
                vec![rows, inp / 32],
                init,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(shape: &str) -> Vec<usize> {
        let s = Shape::named(shape).unwrap();
        shards(&s, 300).iter().map(|sh| sh.tensors.len()).collect()
    }

    /// Released tensor counts per layer kind (spec §3.1): layer 0 23, KDA+MoE 28 + 6E,
    /// MLA+MoE 22 + 6E, model level 5.
    #[test]
    fn tensor_counts_match_the_release() {
        let c = count("tiny");
        assert_eq!(c[0], 23);
        assert_eq!(c[1], 28 + 6 * 8);
        assert_eq!(c[3], 22 + 6 * 8);
        assert_eq!(c[9], 5);
        assert_eq!(c.len(), 10);
    }

    /// Byte inits go with U8 tensors and float inits with F32/BF16 ones, in every shape.
    #[test]
    fn inits_match_dtypes() {
        for name in crate::synth::shape::SHAPE_NAMES {
            let s = Shape::named(name).unwrap();
            for t in shards(&s, 300).iter().flat_map(|sh| &sh.tensors) {
                let bytes = matches!(t.init, Init::Bytes | Init::ScaleBytes { .. });
                assert_eq!(bytes, t.dtype == Dtype::U8, "{name}: {}", t.name);
            }
        }
    }

    /// The bench shape reproduces released per-layer bytes exactly (spec §1.2), except the
    /// router, which has one row and one bias per expert (64 instead of 896).
    #[test]
    fn bench_has_released_layer_bytes() {
        let s = Shape::named("bench").unwrap();
        let sh = shards(&s, 300);
        let bytes = |i: usize, experts: bool| -> u64 {
            sh[i]
                .tensors
                .iter()
                .filter(|t| t.name.contains(".experts.") == experts)
                .map(TensorSpec::nbytes)
                .sum()
        };
        assert_eq!(bytes(0, false), 2_341_213_184);
        let router_delta = (896 - 64) * (7168 * 2 + 4);
        assert_eq!(bytes(1, false) + router_delta, 1_267_744_256);
        assert_eq!(bytes(3, false) + router_delta, 844_335_616);
        assert_eq!(bytes(1, true), 64 * 17_547_264);
    }
}
