//! The layout binding: which bytes of which shard are which tensor of the model (spec §3.3–§3.4).
//!
//! Weights are addressed by **runs**: each layer's non-expert tensors form one contiguous byte
//! range in one shard (the trunk run), and each routed expert's six tensors another (the expert
//! run). Tensors inside a run are [`Slice`]s relative to the run's start, so whoever holds a run's
//! bytes — pinned in RAM, streamed, cached — can find every tensor without another lookup.

use std::fmt;

use super::config::{MixerKind, ModelConfig};
use super::inventory::{
    self, DimOverflow, IGNORED_PREFIXES, ShapeRule, Want, expert_name, layer_prefix, model_level,
    names::*,
};
use super::safetensors::{Dtype, TensorIndex};

/// A contiguous byte range of one shard file. `offset` is absolute within the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ByteRun {
    pub shard: usize,
    pub offset: u64,
    pub len: u64,
}

/// One tensor inside a run: byte range relative to the run start, dtype and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    pub start: usize,
    pub len: usize,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl Slice {
    /// The tensor's bytes within the bytes of its run.
    pub fn bytes<'a>(&self, run: &'a [u8]) -> &'a [u8] {
        &run[self.start..self.start + self.len]
    }
}

/// The six AttnRes/norm vectors every layer has (spec §3.3).
#[derive(Debug, Clone)]
pub struct LayerVectors {
    pub input_layernorm: Slice,
    pub post_attention_layernorm: Slice,
    pub self_attention_res_norm: Slice,
    pub self_attention_res_proj: Slice,
    pub mlp_res_norm: Slice,
    pub mlp_res_proj: Slice,
}

/// KDA mixer tensors (spec §3.3, §4.5).
#[derive(Debug, Clone)]
pub struct KdaLayout {
    pub q_proj: Slice,
    pub k_proj: Slice,
    pub v_proj: Slice,
    pub g_proj: Slice,
    pub o_proj: Slice,
    pub q_conv1d: Slice,
    pub k_conv1d: Slice,
    pub v_conv1d: Slice,
    pub f_a_proj: Slice,
    pub f_b_proj: Slice,
    pub b_proj: Slice,
    /// Padded: only the first `num_heads` entries are used (spec §3.3).
    pub a_log: Slice,
    pub dt_bias: Slice,
    pub o_norm: Slice,
}

/// Gated MLA mixer tensors (spec §3.3, §4.6).
#[derive(Debug, Clone)]
pub struct MlaLayout {
    pub q_a_proj: Slice,
    pub q_a_layernorm: Slice,
    pub q_b_proj: Slice,
    pub kv_a_proj_with_mqa: Slice,
    pub kv_a_layernorm: Slice,
    pub kv_b_proj: Slice,
    pub o_proj: Slice,
    /// Present iff `mla_use_output_gate`.
    pub g_proj: Option<Slice>,
}

// One value per layer, built once at open: boxing the larger variant would save a few hundred
// bytes per layer and add an indirection to every lookup.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum MixerLayout {
    Kda(KdaLayout),
    Mla(MlaLayout),
}

/// A SiTU-GLU MLP: the layer-0 dense MLP or the shared experts (spec §4.8–§4.9).
#[derive(Debug, Clone)]
pub struct MlpLayout {
    pub gate_proj: Slice,
    pub up_proj: Slice,
    pub down_proj: Slice,
}

/// The six tensors of one routed expert, relative to the expert's run (spec §3.4–§3.5).
/// `w1` = gate, `w3` = up, `w2` = down.
#[derive(Debug, Clone)]
pub struct ExpertLayout {
    pub w1_packed: Slice,
    pub w1_scale: Slice,
    pub w2_packed: Slice,
    pub w2_scale: Slice,
    pub w3_packed: Slice,
    pub w3_scale: Slice,
}

/// The non-routed MoE tensors (in the trunk run) plus where every routed expert lives.
#[derive(Debug, Clone)]
pub struct MoeLayout {
    pub gate: Slice,
    pub e_score_correction_bias: Slice,
    pub routed_expert_down_proj: Slice,
    pub routed_expert_up_proj: Slice,
    /// Present iff `latent_moe_use_norm`.
    pub routed_expert_norm: Option<Slice>,
    pub shared: MlpLayout,
    /// `experts[e]` = run of expert `e` (numeric index), each with its own sub-slices.
    pub experts: Vec<(ByteRun, ExpertLayout)>,
}

// One value per layer, as for `MixerLayout`.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum FfnLayout {
    Dense(MlpLayout),
    Moe(MoeLayout),
}

/// Everything of one decoder layer.
#[derive(Debug, Clone)]
pub struct LayerLayout {
    pub index: usize,
    /// The layer's non-expert tensors: one contiguous run in one shard.
    pub trunk: ByteRun,
    pub vectors: LayerVectors,
    pub mixer: MixerLayout,
    pub ffn: FfnLayout,
}

impl LayerLayout {
    /// The matrices of a layer's trunk in the order the forward pass applies them — the order a
    /// chunk-streamed layer is read in (`crate::store`'s chunk stream). Every op below consumes
    /// its matrices in this order: KDA `f_a, f_b, b, q, k, v, g` then `o`
    /// (`model::kda`); MLA `q_a, q_b, kv_a, g` then `kv_b` (gathered whole) and `o`
    /// (`model::mla`); the dense MLP `gate, up, down`; MoE `latent_down, router`, the shared MLP
    /// while the experts are read, then `latent_up` (`model::moe`). A consumer that strays from
    /// it still computes the same bits, but rereads (and the bytes per token show it).
    pub fn stream_order(&self) -> Vec<Slice> {
        let mut out: Vec<&Slice> = match &self.mixer {
            MixerLayout::Kda(k) => vec![
                &k.f_a_proj,
                &k.f_b_proj,
                &k.b_proj,
                &k.q_proj,
                &k.k_proj,
                &k.v_proj,
                &k.g_proj,
                &k.o_proj,
            ],
            MixerLayout::Mla(a) => {
                let mut v = vec![&a.q_a_proj, &a.q_b_proj, &a.kv_a_proj_with_mqa];
                v.extend(&a.g_proj);
                v.extend([&a.kv_b_proj, &a.o_proj]);
                v
            }
        };
        match &self.ffn {
            FfnLayout::Dense(d) => out.extend([&d.gate_proj, &d.up_proj, &d.down_proj]),
            FfnLayout::Moe(m) => out.extend([
                &m.routed_expert_down_proj,
                &m.gate,
                &m.shared.gate_proj,
                &m.shared.up_proj,
                &m.shared.down_proj,
                &m.routed_expert_up_proj,
            ]),
        }
        out.into_iter().cloned().collect()
    }

    /// The small tensors of a layer's trunk (norms, AttnRes vectors, conv taps, decay parameters,
    /// biases): decoded once at load (`model::bind`), never streamed by a forward. With
    /// [`Self::stream_order`] they are every tensor of the trunk.
    pub fn small_tensors(&self) -> Vec<&Slice> {
        let v = &self.vectors;
        let mut out = vec![
            &v.input_layernorm,
            &v.post_attention_layernorm,
            &v.self_attention_res_norm,
            &v.self_attention_res_proj,
            &v.mlp_res_norm,
            &v.mlp_res_proj,
        ];
        match &self.mixer {
            MixerLayout::Kda(k) => out.extend([
                &k.q_conv1d,
                &k.k_conv1d,
                &k.v_conv1d,
                &k.a_log,
                &k.dt_bias,
                &k.o_norm,
            ]),
            MixerLayout::Mla(a) => out.extend([&a.q_a_layernorm, &a.kv_a_layernorm]),
        }
        if let FfnLayout::Moe(m) = &self.ffn {
            out.push(&m.e_score_correction_bias);
            out.extend(&m.routed_expert_norm);
        }
        out
    }
}

/// A model-level tensor: its own run (the single tensor) and shape.
#[derive(Debug, Clone)]
pub struct ModelTensor {
    pub run: ByteRun,
    pub slice: Slice,
}

/// The whole text model bound to shard bytes.
#[derive(Debug, Clone)]
pub struct ModelLayout {
    pub layers: Vec<LayerLayout>,
    pub embed_tokens: ModelTensor,
    pub lm_head: ModelTensor,
    pub norm: ModelTensor,
    pub output_attn_res_norm: ModelTensor,
    pub output_attn_res_proj: ModelTensor,
    /// The tensors bound in another dtype than the release's ([`DtypeVariant`]), in binding
    /// order; empty for a checkpoint in exactly the released layout.
    pub variants: Vec<DtypeVariant>,
}

/// A tensor accepted in another dtype than the one the release stores it in: a small vector
/// ([`inventory::Want::vector`]) that the model widens exactly to f32, so it computes the same
/// bits as the released dtype would for the same values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DtypeVariant {
    pub tensor: String,
    pub release: Dtype,
    pub stored: Dtype,
}

/// The accepted variants of one kind (release dtype → stored dtype), for reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariantGroup {
    pub release: Dtype,
    pub stored: Dtype,
    pub tensors: usize,
    /// The first tensor of the group, in binding order.
    pub example: String,
}

impl ModelLayout {
    /// [`Self::variants`] grouped by release and stored dtype, in order of first appearance.
    pub fn variant_groups(&self) -> Vec<VariantGroup> {
        let mut groups: Vec<VariantGroup> = Vec::new();
        for v in &self.variants {
            match groups
                .iter_mut()
                .find(|g| (g.release, g.stored) == (v.release, v.stored))
            {
                Some(g) => g.tensors += 1,
                None => groups.push(VariantGroup {
                    release: v.release,
                    stored: v.stored,
                    tensors: 1,
                    example: v.tensor.clone(),
                }),
            }
        }
        groups
    }
}

// Slices hold byte positions as `usize`; on a 64-bit target every `u64` file offset fits.
const _: () = assert!(usize::BITS == 64, "k3d supports 64-bit targets only");

/// What is wrong with one tensor, relative to the inventory the config implies (spec §3.2
/// rule 6, §3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IssueKind {
    /// The config implies it; no shard holds it.
    Missing,
    /// A shard holds it; the config does not imply it (config and files disagree).
    Unexpected,
    /// Stored in a dtype the entry does not accept; `supported` says what it does.
    Dtype {
        expected: Dtype,
        found: Dtype,
        supported: String,
    },
    Shape {
        expected: ShapeRule,
        found: Vec<u64>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorIssue {
    pub tensor: String,
    /// The shard holding the tensor, when one does.
    pub file: Option<String>,
    pub kind: IssueKind,
}

impl fmt::Display for TensorIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.tensor)?;
        if let Some(file) = &self.file {
            write!(f, " ({file})")?;
        }
        match &self.kind {
            IssueKind::Missing => write!(f, " missing"),
            IssueKind::Unexpected => write!(f, " unexpected for this config"),
            IssueKind::Dtype {
                found, supported, ..
            } => write!(f, " is {found}; supported: {supported}"),
            IssueKind::Shape { expected, found } => {
                write!(f, " shape {found:?}, config implies {expected}")
            }
        }
    }
}

/// How many tensor issues are kept for the message; the total is always counted.
const KEPT_ISSUES: usize = 64;
/// How many of them the message shows.
const SHOWN_ISSUES: usize = 8;

/// Why the files could not be bound to the config.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(transparent)]
    Dims(#[from] DimOverflow),
    /// Every missing, unexpected or mis-shaped tensor (the first 64 kept) and their total.
    #[error("{total} tensor(s) disagree with config.json: {}", show(issues, *total))]
    Tensors {
        issues: Vec<TensorIssue>,
        total: usize,
    },
    #[error(
        "config.json implies {implied} tensors but the shards hold {present}: config and files disagree"
    )]
    FarTooMany { implied: u64, present: usize },
    #[error(
        "layer {layer}{}: tensors are split across shards: {first} is in {first_file}, {other} in {other_file}",
        expert_label(*expert)
    )]
    RunSplit {
        layer: usize,
        /// `None` for the trunk run, `Some(e)` for routed expert `e`.
        expert: Option<usize>,
        first: String,
        first_file: String,
        other: String,
        other_file: String,
    },
    #[error(
        "layer {layer}{}: tensors in {file} are not one contiguous run: they span {span} bytes from offset {offset} but total {sum} bytes (first after a hole: {tensor})",
        expert_label(*expert)
    )]
    RunNotContiguous {
        layer: usize,
        expert: Option<usize>,
        file: String,
        offset: u64,
        span: u64,
        sum: u64,
        tensor: String,
    },
}

fn expert_label(expert: Option<usize>) -> String {
    match expert {
        Some(e) => format!(" expert {e}"),
        None => " trunk".into(),
    }
}

fn show(issues: &[TensorIssue], total: usize) -> String {
    let mut parts: Vec<String> = issues
        .iter()
        .take(SHOWN_ISSUES)
        .map(|i| i.to_string())
        .collect();
    let shown = parts.len();
    if total > shown {
        parts.push(format!("… and {} more", total - shown));
    }
    parts.join("; ")
}

/// A required tensor found with the right dtype and shape.
struct Found<'a> {
    name: &'a str,
    shard: usize,
    offset: u64,
    len: u64,
    dtype: Dtype,
    shape: &'a [u64],
}

impl Found<'_> {
    fn slice(&self, run: &ByteRun) -> Slice {
        Slice {
            start: (self.offset - run.offset) as usize,
            len: self.len as usize,
            dtype: self.dtype,
            shape: self.shape.iter().map(|&d| d as usize).collect(),
        }
    }
}

/// Bind `index` to `config`: every tensor of §3.3 found with the implied dtype and shape, each
/// layer's trunk and each expert one contiguous run, and nothing left over except the vision
/// model. Never guesses: any disagreement is a refusal.
pub fn bind(config: &ModelConfig, index: &TensorIndex) -> Result<ModelLayout, LayoutError> {
    let mut b = IndexBinder {
        index,
        covered: vec![false; index.len()],
        issues: Vec::new(),
        total: 0,
        variants: Vec::new(),
    };
    // Checking tensor by tensor costs time in what the config implies; an absurd config (say,
    // 10^12 experts) must be refused by arithmetic, not by a loop that never ends.
    let implied = implied_tensors(config)?;
    let limit = (index.len() as u64)
        .saturating_mul(4)
        .saturating_add(1 << 20);
    if implied > limit {
        return Err(LayoutError::FarTooMany {
            implied,
            present: index.len(),
        });
    }
    let model_wants = model_level(config);
    let model: Vec<Option<Found>> = model_wants.iter().map(|w| b.find(w.name, w)).collect();
    // Names, dtypes and shapes first, for the whole model: a disagreement between config and
    // files is the root cause of any broken run it would also produce.
    let mut found = Vec::with_capacity(config.num_hidden_layers);
    for l in 0..config.num_hidden_layers {
        found.push(b.find_layer(config, l)?);
    }
    b.refuse_unexpected();
    if b.total > 0 {
        return Err(b.into_error());
    }
    let mut layers = Vec::with_capacity(found.len());
    for (l, f) in found.into_iter().enumerate() {
        let f = f.ok_or_else(|| missing(&layer_prefix(l)))?;
        layers.push(b.assemble(config, l, f)?);
    }
    let mut model = model.into_iter().flatten().map(|f| ModelTensor {
        run: ByteRun {
            shard: f.shard,
            offset: f.offset,
            len: f.len,
        },
        slice: f.slice(&ByteRun {
            shard: f.shard,
            offset: f.offset,
            len: f.len,
        }),
    });
    // `model_level` lists exactly these five, in this order, and all were found.
    let mut next = || model.next().ok_or_else(|| missing("model-level tensor"));
    Ok(ModelLayout {
        layers,
        embed_tokens: next()?,
        lm_head: next()?,
        norm: next()?,
        output_attn_res_norm: next()?,
        output_attn_res_proj: next()?,
        variants: b.variants,
    })
}

/// How many text tensors `config` implies (spec §3.3).
fn implied_tensors(config: &ModelConfig) -> Result<u64, DimOverflow> {
    let overflow = DimOverflow {
        what: "the number of tensors",
    };
    let per_expert = inventory::expert(config).len() as u64;
    let mut n = model_level(config).len() as u64;
    for l in 0..config.num_hidden_layers {
        let experts = if config.is_moe_layer(l) {
            (config.num_experts as u64)
                .checked_mul(per_expert)
                .ok_or(overflow.clone())?
        } else {
            0
        };
        n = n
            .checked_add(inventory::trunk(config, l)?.len() as u64)
            .and_then(|n| n.checked_add(experts))
            .ok_or(overflow.clone())?;
    }
    Ok(n)
}

/// A tensor the assembly needed but the checks did not provide (they always do).
fn missing(tensor: &str) -> LayoutError {
    LayoutError::Tensors {
        issues: vec![TensorIssue {
            tensor: tensor.to_owned(),
            file: None,
            kind: IssueKind::Missing,
        }],
        total: 1,
    }
}

/// Every tensor of one layer, found and checked, runs not yet verified.
struct FoundLayer<'a> {
    prefix: String,
    wants: Vec<Want>,
    trunk: Vec<Found<'a>>,
    /// `experts[e]`: the six parts in [`inventory::expert`] order.
    experts: Vec<[Found<'a>; 6]>,
}

struct IndexBinder<'a> {
    index: &'a TensorIndex,
    /// Which index positions some requirement named.
    covered: Vec<bool>,
    issues: Vec<TensorIssue>,
    total: usize,
    variants: Vec<DtypeVariant>,
}

impl<'a> IndexBinder<'a> {
    fn issue(&mut self, tensor: &str, file: Option<String>, kind: IssueKind) {
        self.total += 1;
        if self.issues.len() < KEPT_ISSUES {
            self.issues.push(TensorIssue {
                tensor: tensor.to_owned(),
                file,
                kind,
            });
        }
    }

    fn into_error(self) -> LayoutError {
        LayoutError::Tensors {
            issues: self.issues,
            total: self.total,
        }
    }

    fn file(&self, shard: usize) -> String {
        self.index.shards()[shard].name()
    }

    /// Look `name` up and check it against `want`; records an issue and returns `None` on failure.
    fn find(&mut self, name: &str, want: &Want) -> Option<Found<'a>> {
        let Some(pos) = self.index.position(name) else {
            self.issue(name, None, IssueKind::Missing);
            return None;
        };
        self.covered[pos] = true;
        let t = self.index.at(pos);
        let mut ok = true;
        if !want.accepts_dtype(t.dtype) {
            let kind = IssueKind::Dtype {
                expected: want.dtype,
                found: t.dtype,
                supported: want.supported(),
            };
            self.issue(name, Some(self.file(t.shard)), kind);
            ok = false;
        } else if t.dtype != want.dtype {
            self.variants.push(DtypeVariant {
                tensor: name.to_owned(),
                release: want.dtype,
                stored: t.dtype,
            });
        }
        if !want.shape.accepts(t.shape) {
            let kind = IssueKind::Shape {
                expected: want.shape.clone(),
                found: t.shape.to_vec(),
            };
            self.issue(name, Some(self.file(t.shard)), kind);
            ok = false;
        }
        ok.then_some(Found {
            name: t.name,
            shard: t.shard,
            offset: t.offset,
            len: t.len,
            dtype: t.dtype,
            shape: t.shape,
        })
    }

    /// Find and check every tensor of layer `l`; `None` if any had an issue (recorded).
    fn find_layer(
        &mut self,
        c: &ModelConfig,
        l: usize,
    ) -> Result<Option<FoundLayer<'a>>, DimOverflow> {
        let prefix = layer_prefix(l);
        let wants = inventory::trunk(c, l)?;
        let mut trunk = Vec::with_capacity(wants.len());
        let mut name = String::new();
        for w in &wants {
            name.clear();
            name.push_str(&prefix);
            name.push_str(w.name);
            trunk.push(self.find(&name, w));
        }
        let parts = inventory::expert(c);
        let expert_count = if c.is_moe_layer(l) { c.num_experts } else { 0 };
        let mut experts = Vec::new();
        for e in 0..expert_count {
            let [a, b, c, d, e2, f] = parts
                .each_ref()
                .map(|w| self.find(&expert_name(&prefix, e, w.name), w));
            experts.push(
                a.zip(b)
                    .zip(c.zip(d))
                    .zip(e2.zip(f))
                    .map(|(((a, b), (c, d)), (e, f))| [a, b, c, d, e, f]),
            );
        }
        let trunk = trunk.into_iter().collect::<Option<Vec<_>>>();
        let experts = experts.into_iter().collect::<Option<Vec<_>>>();
        Ok(trunk.zip(experts).map(|(trunk, experts)| FoundLayer {
            prefix,
            wants,
            trunk,
            experts,
        }))
    }

    /// Check layer `l`'s runs (trunk first, then each expert) and build its layout.
    fn assemble(
        &self,
        c: &ModelConfig,
        l: usize,
        f: FoundLayer,
    ) -> Result<LayerLayout, LayoutError> {
        let trunk = self.run(&f.trunk, l, None)?;
        let get = |suffix: &str| -> Result<Slice, LayoutError> {
            f.wants
                .iter()
                .zip(&f.trunk)
                .find(|(w, _)| w.name == suffix)
                .map(|(_, t)| t.slice(&trunk))
                .ok_or_else(|| missing(&format!("{}{suffix}", f.prefix)))
        };
        let vectors = LayerVectors {
            input_layernorm: get(INPUT_LAYERNORM)?,
            post_attention_layernorm: get(POST_ATTENTION_LAYERNORM)?,
            self_attention_res_norm: get(SELF_ATTENTION_RES_NORM)?,
            self_attention_res_proj: get(SELF_ATTENTION_RES_PROJ)?,
            mlp_res_norm: get(MLP_RES_NORM)?,
            mlp_res_proj: get(MLP_RES_PROJ)?,
        };
        let mixer = match c.layer_kinds.get(l) {
            Some(MixerKind::Kda) => MixerLayout::Kda(KdaLayout {
                q_proj: get(Q_PROJ)?,
                k_proj: get(K_PROJ)?,
                v_proj: get(V_PROJ)?,
                g_proj: get(G_PROJ)?,
                o_proj: get(O_PROJ)?,
                q_conv1d: get(Q_CONV1D)?,
                k_conv1d: get(K_CONV1D)?,
                v_conv1d: get(V_CONV1D)?,
                f_a_proj: get(F_A_PROJ)?,
                f_b_proj: get(F_B_PROJ)?,
                b_proj: get(B_PROJ)?,
                a_log: get(A_LOG)?,
                dt_bias: get(DT_BIAS)?,
                o_norm: get(O_NORM)?,
            }),
            _ => MixerLayout::Mla(MlaLayout {
                q_a_proj: get(Q_A_PROJ)?,
                q_a_layernorm: get(Q_A_LAYERNORM)?,
                q_b_proj: get(Q_B_PROJ)?,
                kv_a_proj_with_mqa: get(KV_A_PROJ_WITH_MQA)?,
                kv_a_layernorm: get(KV_A_LAYERNORM)?,
                kv_b_proj: get(KV_B_PROJ)?,
                o_proj: get(O_PROJ)?,
                g_proj: c.mla_use_output_gate.then(|| get(G_PROJ)).transpose()?,
            }),
        };
        let ffn = if c.is_moe_layer(l) {
            let mut experts = Vec::with_capacity(f.experts.len());
            for (e, parts) in f.experts.iter().enumerate() {
                let run = self.run(parts, l, Some(e))?;
                // `inventory::expert` lists the six parts in ExpertLayout's field order.
                let [w1p, w1s, w2p, w2s, w3p, w3s] = parts;
                experts.push((
                    run,
                    ExpertLayout {
                        w1_packed: w1p.slice(&run),
                        w1_scale: w1s.slice(&run),
                        w2_packed: w2p.slice(&run),
                        w2_scale: w2s.slice(&run),
                        w3_packed: w3p.slice(&run),
                        w3_scale: w3s.slice(&run),
                    },
                ));
            }
            FfnLayout::Moe(MoeLayout {
                gate: get(MOE_GATE)?,
                e_score_correction_bias: get(MOE_BIAS)?,
                routed_expert_down_proj: get(ROUTED_DOWN_PROJ)?,
                routed_expert_up_proj: get(ROUTED_UP_PROJ)?,
                routed_expert_norm: c
                    .latent_moe_use_norm
                    .then(|| get(ROUTED_NORM))
                    .transpose()?,
                shared: MlpLayout {
                    gate_proj: get(SHARED_GATE_PROJ)?,
                    up_proj: get(SHARED_UP_PROJ)?,
                    down_proj: get(SHARED_DOWN_PROJ)?,
                },
                experts,
            })
        } else {
            FfnLayout::Dense(MlpLayout {
                gate_proj: get(MLP_GATE_PROJ)?,
                up_proj: get(MLP_UP_PROJ)?,
                down_proj: get(MLP_DOWN_PROJ)?,
            })
        };
        Ok(LayerLayout {
            index: l,
            trunk,
            vectors,
            mixer,
            ffn,
        })
    }

    /// The one contiguous run in one shard that `found` must form (spec §3.4).
    fn run(
        &self,
        found: &[Found],
        layer: usize,
        expert: Option<usize>,
    ) -> Result<ByteRun, LayoutError> {
        let Some(first) = found.iter().min_by_key(|f| f.offset) else {
            return Err(missing(&format!("layer {layer} run")));
        };
        if let Some(other) = found.iter().find(|f| f.shard != first.shard) {
            return Err(LayoutError::RunSplit {
                layer,
                expert,
                first: first.name.to_owned(),
                first_file: self.file(first.shard),
                other: other.name.to_owned(),
                other_file: self.file(other.shard),
            });
        }
        // Headers were validated to tile their data, so tensors never overlap: the run is
        // contiguous exactly when the span equals the sum of the sizes.
        let end = found
            .iter()
            .map(|f| f.offset + f.len)
            .max()
            .unwrap_or(first.offset);
        let sum: u64 = found.iter().map(|f| f.len).sum();
        let span = end - first.offset;
        if span != sum {
            let mut by_offset: Vec<&Found> = found.iter().collect();
            by_offset.sort_by_key(|f| f.offset);
            let after_hole = by_offset
                .windows(2)
                .find(|w| w[0].offset + w[0].len != w[1].offset)
                .map_or("", |w| w[1].name);
            return Err(LayoutError::RunNotContiguous {
                layer,
                expert,
                file: self.file(first.shard),
                offset: first.offset,
                span,
                sum,
                tensor: after_hole.to_owned(),
            });
        }
        Ok(ByteRun {
            shard: first.shard,
            offset: first.offset,
            len: span,
        })
    }

    /// Every indexed tensor no requirement named, except the vision model's, is an error.
    fn refuse_unexpected(&mut self) {
        let index = self.index;
        for (pos, covered) in std::mem::take(&mut self.covered).into_iter().enumerate() {
            let t = index.at(pos);
            if !covered && !IGNORED_PREFIXES.iter().any(|p| t.name.starts_with(p)) {
                self.issue(t.name, Some(self.file(t.shard)), IssueKind::Unexpected);
            }
        }
    }
}
