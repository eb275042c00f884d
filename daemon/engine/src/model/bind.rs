//! Binding weights: a tensor's [`Slice`] cut out of its run's bytes, with dtype and shape
//! compared against what the op expects (a disagreement is an error, never a reshape — spec
//! §2.3 rule 6), and every layer's and the model's tensors bound by their inventory names
//! ([`crate::checkpoint::inventory::names`], spec §3.3) into the ops' matrices and decoded
//! vectors.

use std::fmt;

use super::ModelError;
use super::attn_res::fold_query;
use super::kda::{KdaDims, KdaMatrices, KdaParams};
use super::mla::{MlaDims, MlaMatrices, MlaParams};
use super::mlp::{Matrix, Mlp, Situ, StreamedMatrix};
use super::moe::{Expert, MoeDims, MoeMatrices, MoeParams};
use super::router::RouterConfig;
use crate::checkpoint::config::{MixerKind, ModelConfig};
use crate::checkpoint::inventory::{VECTOR_DTYPES, names as n};
use crate::checkpoint::layout::{
    FfnLayout, KdaLayout, LayerLayout, MixerLayout, MlaLayout, MlpLayout, ModelLayout, ModelTensor,
    MoeLayout, Slice,
};
use crate::checkpoint::safetensors::Dtype;
use crate::kernels::matrix::{bf16_vector, f32_vector};
use crate::kernels::{Bf16Matrix, Mxfp4Matrix, mxfp4};
use crate::store::{ExpertView, ModelTensorId, TrunkView, WeightStore};

/// Names a tensor in errors: its layer (`None` = model level), routed expert if any, and name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorName {
    pub layer: Option<usize>,
    pub expert: Option<usize>,
    pub name: &'static str,
}

impl TensorName {
    pub fn layer(layer: usize, name: &'static str) -> Self {
        TensorName {
            layer: Some(layer),
            expert: None,
            name,
        }
    }

    pub fn model(name: &'static str) -> Self {
        TensorName {
            layer: None,
            expert: None,
            name,
        }
    }

    pub fn expert(layer: usize, expert: usize, name: &'static str) -> Self {
        TensorName {
            layer: Some(layer),
            expert: Some(expert),
            name,
        }
    }
}

impl fmt::Display for TensorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.layer, self.expert) {
            (Some(l), Some(e)) => write!(f, "layer {l}, expert {e}, tensor {}", self.name),
            (Some(l), None) => write!(f, "layer {l}, tensor {}", self.name),
            _ => write!(f, "model tensor {}", self.name),
        }
    }
}

fn problem(tensor: TensorName, problem: String) -> ModelError {
    ModelError::Tensor { tensor, problem }
}

/// A slice's dtype and shape against what the op expects.
fn check_meta(s: &Slice, dtype: Dtype, shape: &[usize], t: TensorName) -> Result<(), ModelError> {
    if s.dtype != dtype {
        return Err(problem(
            t,
            format!("dtype {:?}, expected {dtype:?}", s.dtype),
        ));
    }
    if s.shape != shape {
        return Err(problem(
            t,
            format!("shape {:?}, expected {shape:?}", s.shape),
        ));
    }
    Ok(())
}

/// The tensor's bytes, after checking dtype and shape.
fn checked<'a>(
    run: &'a [u8],
    s: &Slice,
    dtype: Dtype,
    shape: &[usize],
    t: TensorName,
) -> Result<&'a [u8], ModelError> {
    check_meta(s, dtype, shape, t)?;
    let n: usize = shape.iter().product();
    let range = s.start..s.start.saturating_add(s.len);
    match run.get(range) {
        Some(b) if b.len() == n * dtype.size() => Ok(b),
        _ => Err(problem(
            t,
            format!(
                "bytes {}..+{} do not hold {n} elements inside its {}-byte run",
                s.start,
                s.len,
                run.len()
            ),
        )),
    }
}

/// A BF16 matrix `[rows, cols]`.
pub fn bf16_matrix<'a>(
    run: &'a [u8],
    s: &Slice,
    rows: usize,
    cols: usize,
    t: TensorName,
) -> Result<Bf16Matrix<'a>, ModelError> {
    let b = checked(run, s, Dtype::Bf16, &[rows, cols], t)?;
    Ok(Bf16Matrix::new(b, rows, cols))
}

/// A layer's trunk as the binder sees it.
pub(super) enum Trunk<'a> {
    /// The whole run in memory (pinned, or a ring slot).
    Whole(&'a [u8]),
    /// The run streams in chunks: matrices bind as [`StreamedMatrix`] handles that read their
    /// rows as they are applied; `small` holds the small tensors ([`LayerLayout::small_tensors`]) read once
    /// at load, by slice start (empty after load: their values are decoded by then).
    Streamed {
        store: &'a WeightStore,
        layer: usize,
        run_len: u64,
        small: Vec<(usize, Vec<u8>)>,
    },
}

impl<'a> Trunk<'a> {
    /// Layer `layer`'s trunk at forward time.
    pub(super) fn of(view: &'a TrunkView<'_>, store: &'a WeightStore, layer: usize) -> Self {
        match view {
            TrunkView::Bytes(b) => Trunk::Whole(b),
            TrunkView::Chunks => Trunk::Streamed {
                store,
                layer,
                run_len: store.layout().layers[layer].trunk.len,
                small: Vec::new(),
            },
        }
    }

    /// The BF16 matrix `[rows, cols]` at `s`.
    fn matrix(
        &self,
        s: &Slice,
        rows: usize,
        cols: usize,
        t: TensorName,
    ) -> Result<Matrix<'a>, ModelError> {
        match self {
            Trunk::Whole(run) => Ok(bf16_matrix(run, s, rows, cols, t)?.into()),
            Trunk::Streamed {
                store,
                layer,
                run_len,
                ..
            } => {
                check_meta(s, Dtype::Bf16, &[rows, cols], t)?;
                if s.len != rows * cols * 2 || (s.start + s.len) as u64 > *run_len {
                    return Err(problem(
                        t,
                        format!(
                            "bytes {}..+{} do not hold {} elements inside its {run_len}-byte run",
                            s.start,
                            s.len,
                            rows * cols
                        ),
                    ));
                }
                Ok(Matrix::Streamed(StreamedMatrix {
                    store,
                    layer: *layer,
                    start: s.start,
                    rows,
                    cols,
                }))
            }
        }
    }

    /// The small tensor at `s` as a vector of `shape` ([`vector_values`]).
    fn vector(&self, s: &Slice, shape: &[usize], t: TensorName) -> Result<Vec<f32>, ModelError> {
        match self {
            Trunk::Whole(run) => vector_values(run, s, shape, t),
            Trunk::Streamed { small, .. } => {
                let bytes = small
                    .iter()
                    .find(|(start, _)| *start == s.start)
                    .map(|(_, b)| b.as_slice())
                    .ok_or_else(|| problem(t, "not read at load".into()))?;
                let own = Slice {
                    start: 0,
                    ..s.clone()
                };
                vector_values(bytes, &own, shape, t)
            }
        }
    }
}

/// A small vector of the given shape, widened exactly to f32 from whichever of
/// [`VECTOR_DTYPES`] it is stored in (the inventory's [`crate::checkpoint::inventory::Want::vector`]
/// entries): BF16 and F16 widen exactly, F32 is read as is, so equal values give equal bits.
pub fn vector_values(
    run: &[u8],
    s: &Slice,
    shape: &[usize],
    t: TensorName,
) -> Result<Vec<f32>, ModelError> {
    if !VECTOR_DTYPES.contains(&s.dtype) {
        return Err(problem(
            t,
            format!("dtype {}, expected one of F32, BF16, F16", s.dtype),
        ));
    }
    let bytes = checked(run, s, s.dtype, shape, t)?;
    Ok(match s.dtype {
        Dtype::Bf16 => bf16_vector(bytes),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => f32_vector(bytes),
    })
}

/// An MXFP4 matrix `[rows, cols]` from its packed `[rows, cols/2]` and scale `[rows, cols/32]`
/// tensors (spec §3.5).
pub fn mxfp4_matrix<'a>(
    run: &'a [u8],
    packed: &Slice,
    scales: &Slice,
    rows: usize,
    cols: usize,
    t: (TensorName, TensorName),
) -> Result<Mxfp4Matrix<'a>, ModelError> {
    if !cols.is_multiple_of(mxfp4::GROUP) {
        return Err(problem(
            t.0,
            format!("input width {cols} is not a multiple of {}", mxfp4::GROUP),
        ));
    }
    let p = checked(run, packed, Dtype::U8, &[rows, cols / 2], t.0)?;
    let s = checked(run, scales, Dtype::U8, &[rows, cols / mxfp4::GROUP], t.1)?;
    Ok(Mxfp4Matrix::new(p, s, rows, cols))
}

/// A layer's AttnRes and norm vectors, decoded once.
pub(super) struct DecodedVectors {
    pub(super) input_norm: Vec<f32>,
    pub(super) post_norm: Vec<f32>,
    /// `self_attention_res_norm ⊙ self_attention_res_proj`.
    pub(super) attn_res: Vec<f32>,
    /// `mlp_res_norm ⊙ mlp_res_proj`.
    pub(super) mlp_res: Vec<f32>,
}

pub(super) enum MixerParams {
    Kda(KdaParams),
    Mla(MlaParams),
}

pub(super) enum FfnParams {
    Dense,
    Moe(MoeParams),
}

/// A layer's small tensors, decoded once at load.
pub(super) struct LayerParams {
    pub(super) vectors: DecodedVectors,
    pub(super) mixer: MixerParams,
    pub(super) ffn: FfnParams,
}

/// The model-level vectors, decoded once.
pub(super) struct ModelVectors {
    pub(super) final_norm: Vec<f32>,
    /// `output_attn_res_norm ⊙ output_attn_res_proj`.
    pub(super) output_res: Vec<f32>,
}

/// The op dimensions derived from the config.
#[derive(Debug, Clone, Copy)]
pub(super) struct ModelDims {
    pub(super) kda: KdaDims,
    pub(super) mla: MlaDims,
    pub(super) moe: MoeDims,
}

impl ModelDims {
    pub(super) fn of(config: &ModelConfig, layout: &ModelLayout) -> Self {
        let kda_rank = layout
            .layers
            .iter()
            .find_map(|l| match &l.mixer {
                MixerLayout::Kda(k) => k.f_a_proj.shape.first().copied(),
                MixerLayout::Mla(_) => None,
            })
            .unwrap_or(0);
        let act = Situ {
            beta1: config.activation_situ_beta,
            beta2: config.activation_situ_linear_beta,
        };
        let h = config.hidden_size;
        ModelDims {
            kda: KdaDims {
                hidden: h,
                heads: config.kda.num_heads,
                head_dim: config.kda.head_dim,
                conv: config.kda.short_conv_kernel_size,
                rank: kda_rank,
                lower_bound: config.kda.gate_lower_bound,
                eps: config.rms_norm_eps,
            },
            mla: MlaDims {
                hidden: h,
                heads: config.num_attention_heads,
                q_lora: config.q_lora_rank,
                kv_lora: config.kv_lora_rank,
                nope: config.qk_nope_head_dim,
                rope: config.qk_rope_head_dim,
                v: config.v_head_dim,
            },
            moe: MoeDims {
                hidden: h,
                latent: config.routed_expert_hidden_size,
                act,
                router: RouterConfig {
                    top_k: config.num_experts_per_token,
                    renormalize: config.moe_renormalize,
                    scaling_factor: config.routed_scaling_factor,
                },
                eps: config.rms_norm_eps,
            },
        }
    }
}

pub(super) enum MixerMatrices<'a> {
    Kda(KdaMatrices<'a>),
    Mla(MlaMatrices<'a>),
}

/// Binds a layer's tensors in its trunk bytes and the model-level tensors, checking every
/// dtype and shape against the config.
pub(super) struct Binder<'c> {
    pub(super) config: &'c ModelConfig,
    pub(super) dims: &'c ModelDims,
}

impl Binder<'_> {
    /// Layer `ll`'s small tensors decoded, after binding every matrix once so that a bad dtype
    /// or shape fails the load, not a later forward.
    pub(super) fn layer(
        &self,
        ll: &LayerLayout,
        run: &Trunk<'_>,
    ) -> Result<LayerParams, ModelError> {
        let params = layer_params(self.config, self.dims, ll, run)?;
        self.mixer(ll, run)?;
        match &ll.ffn {
            FfnLayout::Dense(d) => {
                self.dense(ll.index, d, run)?;
            }
            FfnLayout::Moe(m) => {
                self.moe(ll.index, m, run)?;
            }
        }
        Ok(params)
    }

    /// The final norm and the output AttnRes query (spec §4.10), decoded once.
    pub(super) fn model_vectors(&self, store: &WeightStore) -> Result<ModelVectors, ModelError> {
        let h = self.config.hidden_size;
        let layout = store.layout();
        let vector = |t: &ModelTensor, which, shape: &[usize], name| {
            vector_values(
                store.model_tensor(which),
                &t.slice,
                shape,
                TensorName::model(name),
            )
        };
        let final_norm = vector(&layout.norm, ModelTensorId::Norm, &[h], n::NORM)?;
        let out_norm = vector(
            &layout.output_attn_res_norm,
            ModelTensorId::OutputAttnResNorm,
            &[h],
            n::OUTPUT_ATTN_RES_NORM,
        )?;
        let out_proj = vector(
            &layout.output_attn_res_proj,
            ModelTensorId::OutputAttnResProj,
            &[1, h],
            n::OUTPUT_ATTN_RES_PROJ,
        )?;
        Ok(ModelVectors {
            final_norm,
            output_res: fold_query(&out_norm, &out_proj),
        })
    }

    /// Checks the embedding and lm_head slices without reading them (they may stream).
    pub(super) fn tables(&self, layout: &ModelLayout) -> Result<(), ModelError> {
        let (vocab, h) = (self.config.vocab_size, self.config.hidden_size);
        table_shape(
            &layout.embed_tokens,
            vocab,
            h,
            TensorName::model(n::EMBED_TOKENS),
        )?;
        table_shape(&layout.lm_head, vocab, h, TensorName::model(n::LM_HEAD))
    }

    pub(super) fn mixer<'a>(
        &self,
        ll: &LayerLayout,
        run: &Trunk<'a>,
    ) -> Result<MixerMatrices<'a>, ModelError> {
        let l = ll.index;
        let h = self.config.hidden_size;
        let m = |s, rows, cols, name| run.matrix(s, rows, cols, TensorName::layer(l, name));
        Ok(match &ll.mixer {
            MixerLayout::Kda(k) => {
                let d = &self.dims.kda;
                let pw = d.width();
                MixerMatrices::Kda(KdaMatrices {
                    q_proj: m(&k.q_proj, pw, h, n::Q_PROJ)?,
                    k_proj: m(&k.k_proj, pw, h, n::K_PROJ)?,
                    v_proj: m(&k.v_proj, pw, h, n::V_PROJ)?,
                    g_proj: m(&k.g_proj, pw, h, n::G_PROJ)?,
                    o_proj: m(&k.o_proj, h, pw, n::O_PROJ)?,
                    f_a_proj: m(&k.f_a_proj, d.rank, h, n::F_A_PROJ)?,
                    f_b_proj: m(&k.f_b_proj, pw, d.rank, n::F_B_PROJ)?,
                    b_proj: m(&k.b_proj, d.heads, h, n::B_PROJ)?,
                })
            }
            MixerLayout::Mla(a) => {
                let d = &self.dims.mla;
                let g_proj = match (&a.g_proj, self.config.mla_use_output_gate) {
                    (Some(g), true) => Some(m(g, d.heads * d.v, h, n::G_PROJ)?),
                    (None, false) => None,
                    (g, _) => {
                        return Err(ModelError::LayoutMismatch(format!(
                            "layer {l}: mla_use_output_gate is {} but g_proj is {}",
                            self.config.mla_use_output_gate,
                            if g.is_some() { "present" } else { "absent" }
                        )));
                    }
                };
                MixerMatrices::Mla(MlaMatrices {
                    q_a_proj: m(&a.q_a_proj, d.q_lora, h, n::Q_A_PROJ)?,
                    q_b_proj: m(&a.q_b_proj, d.heads * d.qk(), d.q_lora, n::Q_B_PROJ)?,
                    kv_a_proj: m(
                        &a.kv_a_proj_with_mqa,
                        d.kv_lora + d.rope,
                        h,
                        n::KV_A_PROJ_WITH_MQA,
                    )?,
                    kv_b_proj: m(
                        &a.kv_b_proj,
                        d.heads * (d.nope + d.v),
                        d.kv_lora,
                        n::KV_B_PROJ,
                    )?,
                    o_proj: m(&a.o_proj, h, d.heads * d.v, n::O_PROJ)?,
                    g_proj,
                })
            }
        })
    }

    pub(super) fn dense<'a>(
        &self,
        l: usize,
        d: &MlpLayout,
        run: &Trunk<'a>,
    ) -> Result<Mlp<Matrix<'a>>, ModelError> {
        self.mlp(
            l,
            d,
            self.config.intermediate_size,
            run,
            [n::MLP_GATE_PROJ, n::MLP_UP_PROJ, n::MLP_DOWN_PROJ],
        )
    }

    fn mlp<'a>(
        &self,
        l: usize,
        d: &MlpLayout,
        width: usize,
        run: &Trunk<'a>,
        names: [&'static str; 3],
    ) -> Result<Mlp<Matrix<'a>>, ModelError> {
        let h = self.config.hidden_size;
        let t = |name| TensorName::layer(l, name);
        Ok(Mlp {
            gate: run.matrix(&d.gate_proj, width, h, t(names[0]))?,
            up: run.matrix(&d.up_proj, width, h, t(names[1]))?,
            down: run.matrix(&d.down_proj, h, width, t(names[2]))?,
        })
    }

    pub(super) fn moe<'a>(
        &self,
        l: usize,
        m: &MoeLayout,
        run: &Trunk<'a>,
    ) -> Result<MoeMatrices<'a>, ModelError> {
        let c = self.config;
        let h = c.hidden_size;
        let latent = c.routed_expert_hidden_size;
        let t = |name| TensorName::layer(l, name);
        Ok(MoeMatrices {
            router: run.matrix(&m.gate, c.num_experts, h, t(n::MOE_GATE))?,
            latent_down: run.matrix(
                &m.routed_expert_down_proj,
                latent,
                h,
                t(n::ROUTED_DOWN_PROJ),
            )?,
            latent_up: run.matrix(&m.routed_expert_up_proj, h, latent, t(n::ROUTED_UP_PROJ))?,
            shared: self.mlp(
                l,
                &m.shared,
                c.num_shared_experts * c.moe_intermediate_size,
                run,
                [n::SHARED_GATE_PROJ, n::SHARED_UP_PROJ, n::SHARED_DOWN_PROJ],
            )?,
        })
    }

    pub(super) fn expert<'a>(
        &self,
        l: usize,
        v: &'a ExpertView<'_>,
    ) -> Result<Expert<'a>, ModelError> {
        let latent = self.config.routed_expert_hidden_size;
        let width = self.config.moe_intermediate_size;
        let e = v.expert;
        let x = &v.layout;
        let t = |a, b| (TensorName::expert(l, e, a), TensorName::expert(l, e, b));
        Ok(Mlp {
            gate: mxfp4_matrix(
                v.bytes(),
                &x.w1_packed,
                &x.w1_scale,
                width,
                latent,
                t(n::W1_PACKED, n::W1_SCALE),
            )?,
            up: mxfp4_matrix(
                v.bytes(),
                &x.w3_packed,
                &x.w3_scale,
                width,
                latent,
                t(n::W3_PACKED, n::W3_SCALE),
            )?,
            down: mxfp4_matrix(
                v.bytes(),
                &x.w2_packed,
                &x.w2_scale,
                latent,
                width,
                t(n::W2_PACKED, n::W2_SCALE),
            )?,
        })
    }
}

/// Decodes a layer's small tensors (vectors, conv taps, decay parameters, biases) once.
fn layer_params(
    config: &ModelConfig,
    dims: &ModelDims,
    ll: &LayerLayout,
    run: &Trunk<'_>,
) -> Result<LayerParams, ModelError> {
    let l = ll.index;
    let h = config.hidden_size;
    let t = |name| TensorName::layer(l, name);
    let v = &ll.vectors;
    let vec_h = |s, name| run.vector(s, &[h], t(name));
    let proj = |s, name| run.vector(s, &[1, h], t(name));
    let vectors = DecodedVectors {
        input_norm: vec_h(&v.input_layernorm, n::INPUT_LAYERNORM)?,
        post_norm: vec_h(&v.post_attention_layernorm, n::POST_ATTENTION_LAYERNORM)?,
        attn_res: fold_query(
            &vec_h(&v.self_attention_res_norm, n::SELF_ATTENTION_RES_NORM)?,
            &proj(&v.self_attention_res_proj, n::SELF_ATTENTION_RES_PROJ)?,
        ),
        mlp_res: fold_query(
            &vec_h(&v.mlp_res_norm, n::MLP_RES_NORM)?,
            &proj(&v.mlp_res_proj, n::MLP_RES_PROJ)?,
        ),
    };
    let kind_matches = matches!(
        (&ll.mixer, config.layer_kinds.get(l)),
        (MixerLayout::Kda(_), Some(MixerKind::Kda)) | (MixerLayout::Mla(_), Some(MixerKind::Mla))
    );
    if !kind_matches {
        return Err(ModelError::LayoutMismatch(format!(
            "layer {l}: the layout's mixer differs from the config's layer map"
        )));
    }
    let mixer = match &ll.mixer {
        MixerLayout::Kda(k) => MixerParams::Kda(kda_params(&dims.kda, k, run, l)?),
        MixerLayout::Mla(a) => MixerParams::Mla(mla_params(&dims.mla, a, run, l)?),
    };
    let ffn = match (&ll.ffn, config.is_moe_layer(l)) {
        (FfnLayout::Dense(_), false) => FfnParams::Dense,
        (FfnLayout::Moe(m), true) => {
            let score_bias = run.vector(
                &m.e_score_correction_bias,
                &[config.num_experts],
                t(n::MOE_BIAS),
            )?;
            let routed_norm = match (&m.routed_expert_norm, config.latent_moe_use_norm) {
                (Some(s), true) => {
                    Some(run.vector(s, &[config.routed_expert_hidden_size], t(n::ROUTED_NORM))?)
                }
                (None, false) => None,
                _ => {
                    return Err(ModelError::LayoutMismatch(format!(
                        "layer {l}: latent_moe_use_norm disagrees with the presence of \
                         routed_expert_norm"
                    )));
                }
            };
            FfnParams::Moe(MoeParams {
                score_bias,
                routed_norm,
            })
        }
        _ => {
            return Err(ModelError::LayoutMismatch(format!(
                "layer {l}: the layout's feed-forward kind differs from first_k_dense_replace / \
                 moe_layer_freq"
            )));
        }
    };
    Ok(LayerParams {
        vectors,
        mixer,
        ffn,
    })
}

fn kda_params(
    d: &KdaDims,
    k: &KdaLayout,
    run: &Trunk<'_>,
    l: usize,
) -> Result<KdaParams, ModelError> {
    let pw = d.width();
    let t = |name| TensorName::layer(l, name);
    let conv = |s, name| run.vector(s, &[pw, 1, d.conv], t(name));
    // A_log is stored padded (spec §3.3): any length ≥ heads; only the first `heads` are used.
    let a_log_len = k.a_log.shape.first().copied().unwrap_or(0);
    if k.a_log.shape.len() != 1 || a_log_len < d.heads {
        return Err(ModelError::Tensor {
            tensor: t(n::A_LOG),
            problem: format!(
                "shape {:?}, expected [n] with n ≥ {}",
                k.a_log.shape, d.heads
            ),
        });
    }
    let a_log = run.vector(&k.a_log, &[a_log_len], t(n::A_LOG))?;
    Ok(KdaParams::new(
        d,
        [
            conv(&k.q_conv1d, n::Q_CONV1D)?,
            conv(&k.k_conv1d, n::K_CONV1D)?,
            conv(&k.v_conv1d, n::V_CONV1D)?,
        ],
        &a_log,
        run.vector(&k.dt_bias, &[pw], t(n::DT_BIAS))?,
        run.vector(&k.o_norm, &[d.head_dim], t(n::O_NORM))?,
    ))
}

fn mla_params(
    d: &MlaDims,
    a: &MlaLayout,
    run: &Trunk<'_>,
    l: usize,
) -> Result<MlaParams, ModelError> {
    let t = |name| TensorName::layer(l, name);
    Ok(MlaParams {
        q_a_norm: run.vector(&a.q_a_layernorm, &[d.q_lora], t(n::Q_A_LAYERNORM))?,
        kv_a_norm: run.vector(&a.kv_a_layernorm, &[d.kv_lora], t(n::KV_A_LAYERNORM))?,
    })
}

/// Checks a `[vocab, hidden]` BF16 table's slice without reading it (it may stream).
fn table_shape(
    t: &ModelTensor,
    vocab: usize,
    h: usize,
    name: TensorName,
) -> Result<(), ModelError> {
    let s = &t.slice;
    let fits = s
        .start
        .checked_add(s.len)
        .is_some_and(|e| e as u64 <= t.run.len);
    if s.dtype != Dtype::Bf16 || s.shape != [vocab, h] || s.len != vocab * h * 2 || !fits {
        return Err(ModelError::Tensor {
            tensor: name,
            problem: format!(
                "{:?} {:?} at {}..+{} of a {}-byte run, expected BF16 [{vocab}, {h}]",
                s.dtype, s.shape, s.start, s.len, t.run.len
            ),
        });
    }
    Ok(())
}
