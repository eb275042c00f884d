//! `config.json` → [`ModelConfig`] (spec §2). Every semantic key is required; all failures are
//! collected with their JSON paths and reported at once. Never a silent default.
//!
//! Two shapes are read (spec §2.1): the released nested one (root wrapper, the text model in
//! `text_config`, KDA settings in `text_config.linear_attn_config`, `quantization_config` in
//! `text_config` or at the root) and the flat one, where the root *is* the text config.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// Which token mixer a layer uses (spec §1, §2.2 layer lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MixerKind {
    /// Kimi Delta Attention, spec §4.5.
    Kda,
    /// Gated MLA with NoPE, spec §4.6.
    Mla,
}

/// KDA settings from `text_config.linear_attn_config`.
#[derive(Debug, Clone, PartialEq)]
pub struct KdaConfig {
    pub num_heads: usize,
    pub head_dim: usize,
    pub short_conv_kernel_size: usize,
    pub gate_lower_bound: f64,
}

/// The validated semantic configuration of the text model (spec §2.2). Field names follow the
/// config keys; `layer_kinds` is the zero-based map derived from the one-based lists.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    /// β₁, the SiTU gate cap.
    pub activation_situ_beta: f64,
    /// β₂, the SiTU up cap.
    pub activation_situ_linear_beta: f64,
    pub intermediate_size: usize,
    pub first_k_dense_replace: usize,
    pub moe_layer_freq: usize,
    pub num_experts: usize,
    pub num_experts_per_token: usize,
    pub num_shared_experts: usize,
    pub moe_intermediate_size: usize,
    pub routed_expert_hidden_size: usize,
    pub latent_moe_use_norm: bool,
    pub moe_renormalize: bool,
    pub routed_scaling_factor: f64,
    pub num_attention_heads: usize,
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub mla_use_output_gate: bool,
    pub attn_res_block_size: usize,
    pub kda: KdaConfig,
    /// Zero-based: `layer_kinds[L]` is layer L's mixer.
    pub layer_kinds: Vec<MixerKind>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    /// The advertised context, `max_position_embeddings` (spec §2.2: informational, NoPE has
    /// no position tables); `None` when absent or null.
    pub max_position_embeddings: Option<usize>,
}

impl ModelConfig {
    /// Whether layer `l` (zero-based) has a MoE feed-forward (spec §2.2 `moe_layer_freq`).
    pub fn is_moe_layer(&self, l: usize) -> bool {
        l >= self.first_k_dense_replace && l.is_multiple_of(self.moe_layer_freq)
    }

    /// Read and validate `path` (normally `MODEL_DIR/config.json`).
    pub fn from_file(path: &Path) -> Result<ModelConfig, ConfigError> {
        let text = crate::input_file::read_to_string(path).map_err(|error| ConfigError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        ModelConfig::from_json(&text).map_err(|e| e.in_file(path))
    }

    /// Parse and validate config text (spec §2.3).
    pub fn from_json(text: &str) -> Result<ModelConfig, ConfigError> {
        let root: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json {
            path: None,
            message: e.to_string(),
        })?;
        let Value::Object(root) = root else {
            return Err(ConfigError::Json {
                path: None,
                message: "the top level is not a JSON object".into(),
            });
        };
        let mut r = KeyReader::default();
        let config = read(&mut r, &root);
        match config {
            Some(c) if r.issues.is_empty() => Ok(c),
            _ => Err(ConfigError::Invalid {
                path: None,
                issues: r.issues,
            }),
        }
    }
}

/// One failed rule, at a JSON path such as `text_config.linear_attn_config.gate_lower_bound`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    pub path: String,
    pub problem: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.problem)
    }
}

/// Why `config.json` was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The I/O error is part of the message, not a `source`, so a `{:#}` chain shows it once.
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}not valid JSON: {message}", prefix(path))]
    Json {
        path: Option<PathBuf>,
        message: String,
    },
    /// Every failed rule, in a fixed order (spec §2.3 rule 1).
    #[error("{}{} problem(s): {}", prefix(path), issues.len(), join(issues))]
    Invalid {
        path: Option<PathBuf>,
        issues: Vec<ConfigIssue>,
    },
}

impl ConfigError {
    /// Whether the file itself could not be read (as opposed to read and refused).
    pub fn is_io(&self) -> bool {
        matches!(self, ConfigError::Io { .. })
    }

    /// The collected rule failures (empty for I/O and JSON syntax errors).
    pub fn issues(&self) -> &[ConfigIssue] {
        match self {
            ConfigError::Invalid { issues, .. } => issues,
            _ => &[],
        }
    }

    fn in_file(self, file: &Path) -> ConfigError {
        let path = Some(file.to_path_buf());
        match self {
            ConfigError::Json { message, .. } => ConfigError::Json { path, message },
            ConfigError::Invalid { issues, .. } => ConfigError::Invalid { path, issues },
            io @ ConfigError::Io { .. } => io,
        }
    }
}

fn prefix(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .map(|p| format!("{}: ", p.display()))
        .unwrap_or_default()
}

fn join(issues: &[ConfigIssue]) -> String {
    let parts: Vec<String> = issues.iter().map(ConfigIssue::to_string).collect();
    parts.join("; ")
}

/// An object being read, with its JSON path for messages.
#[derive(Clone)]
struct Obj<'a> {
    map: &'a Map<String, Value>,
    /// `""` for the root, else `text_config.` etc. (with the trailing dot).
    path: String,
}

/// Collects issues while typed getters read required keys.
#[derive(Default)]
struct KeyReader {
    issues: Vec<ConfigIssue>,
}

impl KeyReader {
    fn issue(&mut self, path: String, problem: impl Into<String>) {
        self.issues.push(ConfigIssue {
            path,
            problem: problem.into(),
        });
    }

    /// A required key; records "missing" when absent.
    fn get<'a>(&mut self, o: &Obj<'a>, key: &str) -> Option<&'a Value> {
        let v = o.map.get(key);
        if v.is_none() {
            self.issue(format!("{}{key}", o.path), "missing");
        }
        v
    }

    fn wrong_type(&mut self, o: &Obj, key: &str, want: &str, v: &Value) {
        self.issue(
            format!("{}{key}", o.path),
            format!("must be {want}, found {}", describe(v)),
        );
    }

    /// A required JSON integer ≥ 0 (strict: `4.0` is not an integer).
    fn uint(&mut self, o: &Obj, key: &str) -> Option<usize> {
        let v = self.get(o, key)?;
        match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
            Some(n) => Some(n),
            None => {
                self.wrong_type(o, key, "a non-negative integer", v);
                None
            }
        }
    }

    /// A required JSON integer ≥ 1 (widths, counts).
    fn positive(&mut self, o: &Obj, key: &str) -> Option<usize> {
        let n = self.uint(o, key)?;
        if n == 0 {
            self.issue(format!("{}{key}", o.path), "must be at least 1");
            return None;
        }
        Some(n)
    }

    /// A required JSON number (any form), finite.
    fn number(&mut self, o: &Obj, key: &str) -> Option<f64> {
        let v = self.get(o, key)?;
        match v.as_f64() {
            Some(x) if x.is_finite() => Some(x),
            _ => {
                self.wrong_type(o, key, "a number", v);
                None
            }
        }
    }

    fn boolean(&mut self, o: &Obj, key: &str) -> Option<bool> {
        let v = self.get(o, key)?;
        match v.as_bool() {
            Some(b) => Some(b),
            None => {
                self.wrong_type(o, key, "true or false", v);
                None
            }
        }
    }

    /// A required nested object, as an [`Obj`] with its path.
    fn child<'a>(&mut self, o: &Obj<'a>, key: &str) -> Option<Obj<'a>> {
        let v = self.get(o, key)?;
        match v.as_object() {
            Some(map) => Some(Obj {
                map,
                path: format!("{}{key}.", o.path),
            }),
            None => {
                self.wrong_type(o, key, "an object", v);
                None
            }
        }
    }

    /// A required array of JSON integers (any sign; range checks come later).
    fn int_list(&mut self, o: &Obj, key: &str) -> Option<Vec<i64>> {
        let v = self.get(o, key)?;
        let list = v
            .as_array()
            .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<_>>>());
        if list.is_none() {
            self.wrong_type(o, key, "an array of integers", v);
        }
        list
    }

    /// A required value that must equal `want` exactly (a supported-value rule, §2.3 rule 3).
    fn exact(&mut self, o: &Obj, key: &str, want: &Value) {
        if let Some(v) = self.get(o, key)
            && v != want
        {
            self.issue(
                format!("{}{key}", o.path),
                format!("must be {want} (the only supported value), found {v}"),
            );
        }
    }

    /// An optional token id: absent or `null` is `None`; anything else must be a u32 integer.
    /// An optional positive integer, from the first of `objs` that has `key`; absent or null
    /// is `None`, anything else but a positive integer an issue.
    fn optional_positive(&mut self, objs: &[Obj], key: &str) -> Option<usize> {
        let (o, v) = objs.iter().find_map(|o| o.map.get(key).map(|v| (o, v)))?;
        if v.is_null() {
            return None;
        }
        match v
            .as_u64()
            .filter(|&n| n > 0)
            .and_then(|n| usize::try_from(n).ok())
        {
            Some(n) => Some(n),
            None => {
                self.wrong_type(o, key, "a positive integer or null", v);
                None
            }
        }
    }

    fn token_id(&mut self, objs: &[Obj], key: &str) -> Option<u32> {
        let (o, v) = objs.iter().find_map(|o| o.map.get(key).map(|v| (o, v)))?;
        if v.is_null() {
            return None;
        }
        match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) => Some(n),
            None => {
                self.wrong_type(o, key, "a token id (integer) or null", v);
                None
            }
        }
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// Every rule of §2.2–§2.3. Returns `None` if any required value could not be read; the issues
/// explain why. Validation continues past failures so that all of them are reported.
fn read(r: &mut KeyReader, root: &Map<String, Value>) -> Option<ModelConfig> {
    let root_obj = Obj {
        map: root,
        path: String::new(),
    };
    // Nested iff the root carries a `text_config` object; then every text key is read there.
    let t = match root.get("text_config") {
        Some(Value::Object(m)) => Obj {
            map: m,
            path: "text_config.".into(),
        },
        Some(v) => {
            r.wrong_type(&root_obj, "text_config", "an object", v);
            return None;
        }
        None => root_obj.clone(),
    };
    let nested = !t.path.is_empty();

    let hidden_size = r.positive(&t, "hidden_size");
    let num_hidden_layers = r.positive(&t, "num_hidden_layers");
    let vocab_size = r.positive(&t, "vocab_size");
    let rms_norm_eps = r.number(&t, "rms_norm_eps");
    r.exact(&t, "hidden_act", &Value::from("situ"));
    let activation_situ_beta = r.number(&t, "activation_situ_beta");
    let activation_situ_linear_beta = r.number(&t, "activation_situ_linear_beta");
    let intermediate_size = r.positive(&t, "intermediate_size");
    let first_k_dense_replace = r.uint(&t, "first_k_dense_replace");
    let moe_layer_freq = r.positive(&t, "moe_layer_freq");
    let num_experts = r.positive(&t, "num_experts");
    let num_experts_per_token = r.positive(&t, "num_experts_per_token");
    let num_shared_experts = r.positive(&t, "num_shared_experts");
    let moe_intermediate_size = r.positive(&t, "moe_intermediate_size");
    let routed_expert_hidden_size = r.positive(&t, "routed_expert_hidden_size");
    let latent_moe_use_norm = r.boolean(&t, "latent_moe_use_norm");
    r.exact(&t, "moe_router_activation_func", &Value::from("sigmoid"));
    let moe_renormalize = r.boolean(&t, "moe_renormalize");
    let routed_scaling_factor = r.number(&t, "routed_scaling_factor");
    r.boolean(&t, "use_grouped_topk");
    let num_expert_group = r.positive(&t, "num_expert_group");
    let topk_group = r.positive(&t, "topk_group");
    // The engine implements only the bias-corrected top-k; another method is another model.
    r.exact(&t, "topk_method", &Value::from("noaux_tc"));
    let num_attention_heads = r.positive(&t, "num_attention_heads");
    let num_key_value_heads = r.positive(&t, "num_key_value_heads");
    let q_lora_rank = match t.map.get("q_lora_rank") {
        Some(Value::Null) => {
            r.issue(
                format!("{}q_lora_rank", t.path),
                "must not be null (MLA without a query low-rank is unsupported)",
            );
            None
        }
        _ => r.positive(&t, "q_lora_rank"),
    };
    let kv_lora_rank = r.positive(&t, "kv_lora_rank");
    let qk_nope_head_dim = r.positive(&t, "qk_nope_head_dim");
    let qk_rope_head_dim = r.positive(&t, "qk_rope_head_dim");
    let v_head_dim = r.positive(&t, "v_head_dim");
    r.exact(&t, "mla_use_nope", &Value::Bool(true));
    let mla_use_output_gate = r.boolean(&t, "mla_use_output_gate");
    let attn_res_block_size = r.positive(&t, "attn_res_block_size");
    r.exact(&t, "tie_word_embeddings", &Value::Bool(false));
    r.exact(&t, "num_nextn_predict_layers", &Value::from(0));
    if nested && let Some(v) = root.get("tie_word_embeddings") {
        // The released wrapper repeats it at the root; a root `true` would contradict.
        if v != &Value::Bool(false) {
            r.issue(
                "tie_word_embeddings".into(),
                format!("must be false (the only supported value), found {v}"),
            );
        }
    }

    let kda = read_kda(r, &t, num_hidden_layers);
    read_quantization(r, &root_obj, &t);

    // §2.3 rules 3 and 5: relations between values.
    if let (Some(h), Some(kv)) = (num_attention_heads, num_key_value_heads)
        && h != kv
    {
        r.issue(
            format!("{}num_key_value_heads", t.path),
            format!("must equal num_attention_heads ({h}), found {kv}"),
        );
    }
    if let (Some(groups), Some(topk_groups)) = (num_expert_group, topk_group)
        && groups > 1
        && groups > topk_groups
    {
        r.issue(
            format!("{}num_expert_group", t.path),
            format!(
                "grouped routing must be inert: {groups} groups with topk_group {topk_groups} \
                 would restrict the experts a token can reach"
            ),
        );
    }
    if let (Some(k), Some(e)) = (num_experts_per_token, num_experts)
        && k > e
    {
        r.issue(
            format!("{}num_experts_per_token", t.path),
            format!("must be at most num_experts ({e}), found {k}"),
        );
    }
    if let (Some(f), Some(n)) = (first_k_dense_replace, num_hidden_layers)
        && f > n
    {
        r.issue(
            format!("{}first_k_dense_replace", t.path),
            format!("must be at most num_hidden_layers ({n}), found {f}"),
        );
    }
    // MXFP4 packs 32 inputs per scale byte (spec §3.5): the experts' input widths must divide.
    for (key, width) in [
        ("routed_expert_hidden_size", routed_expert_hidden_size),
        ("moe_intermediate_size", moe_intermediate_size),
    ] {
        if let Some(w) = width
            && !w.is_multiple_of(32)
        {
            r.issue(
                format!("{}{key}", t.path),
                format!("must be a multiple of 32 (an MXFP4 expert input width), found {w}"),
            );
        }
    }
    for (key, x) in [
        ("rms_norm_eps", rms_norm_eps),
        ("activation_situ_beta", activation_situ_beta),
        ("activation_situ_linear_beta", activation_situ_linear_beta),
    ] {
        if let Some(x) = x
            && x <= 0.0
        {
            r.issue(
                format!("{}{key}", t.path),
                format!("must be > 0, found {x}"),
            );
        }
    }

    let (kda, layer_kinds) = kda?;
    Some(ModelConfig {
        hidden_size: hidden_size?,
        num_hidden_layers: num_hidden_layers?,
        vocab_size: vocab_size?,
        rms_norm_eps: rms_norm_eps?,
        activation_situ_beta: activation_situ_beta?,
        activation_situ_linear_beta: activation_situ_linear_beta?,
        intermediate_size: intermediate_size?,
        first_k_dense_replace: first_k_dense_replace?,
        moe_layer_freq: moe_layer_freq?,
        num_experts: num_experts?,
        num_experts_per_token: num_experts_per_token?,
        num_shared_experts: num_shared_experts?,
        moe_intermediate_size: moe_intermediate_size?,
        routed_expert_hidden_size: routed_expert_hidden_size?,
        latent_moe_use_norm: latent_moe_use_norm?,
        moe_renormalize: moe_renormalize?,
        routed_scaling_factor: routed_scaling_factor?,
        num_attention_heads: num_attention_heads?,
        q_lora_rank: q_lora_rank?,
        kv_lora_rank: kv_lora_rank?,
        qk_nope_head_dim: qk_nope_head_dim?,
        qk_rope_head_dim: qk_rope_head_dim?,
        v_head_dim: v_head_dim?,
        mla_use_output_gate: mla_use_output_gate?,
        attn_res_block_size: attn_res_block_size?,
        kda,
        layer_kinds,
        bos_token_id: r.token_id(&[root_obj.clone(), t.clone()], "bos_token_id"),
        eos_token_id: r.token_id(&[root_obj.clone(), t.clone()], "eos_token_id"),
        pad_token_id: r.token_id(&[root_obj.clone(), t.clone()], "pad_token_id"),
        max_position_embeddings: r
            .optional_positive(&[t.clone(), root_obj.clone()], "max_position_embeddings"),
    })
}

/// `linear_attn_config`: KDA dims and the two one-based layer lists (§2.3 rule 4).
fn read_kda(
    r: &mut KeyReader,
    t: &Obj,
    num_layers: Option<usize>,
) -> Option<(KdaConfig, Vec<MixerKind>)> {
    let o = r.child(t, "linear_attn_config")?;
    let path = o.path.clone();
    let num_heads = r.positive(&o, "num_heads");
    let head_dim = r.positive(&o, "head_dim");
    let short_conv_kernel_size = r.positive(&o, "short_conv_kernel_size");
    let gate_lower_bound = r.number(&o, "gate_lower_bound");
    r.exact(&o, "use_full_rank_gate", &Value::Bool(true));
    if let Some(b) = gate_lower_bound
        && b >= 0.0
    {
        r.issue(
            format!("{path}gate_lower_bound"),
            format!("must be < 0, found {b}"),
        );
    }
    let kda_layers = r.int_list(&o, "kda_layers");
    let full_attn_layers = r.int_list(&o, "full_attn_layers");
    let layer_kinds = layer_map(r, &path, num_layers?, kda_layers?, full_attn_layers?);
    Some((
        KdaConfig {
            num_heads: num_heads?,
            head_dim: head_dim?,
            short_conv_kernel_size: short_conv_kernel_size?,
            gate_lower_bound: gate_lower_bound?,
        },
        layer_kinds?,
    ))
}

/// The two lists must partition `{1..N}` (they are one-based); returns the zero-based map.
fn layer_map(
    r: &mut KeyReader,
    path: &str,
    n: usize,
    kda: Vec<i64>,
    mla: Vec<i64>,
) -> Option<Vec<MixerKind>> {
    // Fewer entries than layers cannot partition them; checking first also keeps an absurd
    // `num_hidden_layers` from sizing an allocation (the map below is at most as long as the
    // lists, which the file bounds).
    if kda.len().saturating_add(mla.len()) < n {
        r.issue(
            format!("{path}kda_layers"),
            format!(
                "kda_layers and full_attn_layers together have {} entries, fewer than the {n} \
                 layers: the one-based lists must list every layer 1..={n} exactly once",
                kda.len() + mla.len()
            ),
        );
        return None;
    }
    let before = r.issues.len();
    let mut kinds: Vec<Option<(MixerKind, &str)>> = vec![None; n];
    for (key, list, kind) in [
        ("kda_layers", &kda, MixerKind::Kda),
        ("full_attn_layers", &mla, MixerKind::Mla),
    ] {
        for &entry in list {
            let slot = usize::try_from(entry)
                .ok()
                .filter(|&e| (1..=n).contains(&e))
                .and_then(|e| kinds.get_mut(e - 1));
            let Some(slot) = slot else {
                r.issue(
                    format!("{path}{key}"),
                    format!(
                        "entry {entry} is outside 1..={n}: the layer lists are one-based \
                         (layer L is listed as L+1)"
                    ),
                );
                continue;
            };
            match slot {
                Some((_, other)) if *other == key => r.issue(
                    format!("{path}{key}"),
                    format!("one-based layer {entry} is listed twice"),
                ),
                Some((_, other)) => r.issue(
                    format!("{path}{key}"),
                    format!("one-based layer {entry} is also listed in {other}"),
                ),
                None => *slot = Some((kind, key)),
            }
        }
    }
    let unlisted: Vec<String> = kinds
        .iter()
        .enumerate()
        .filter(|(_, k)| k.is_none())
        .map(|(l, _)| (l + 1).to_string())
        .collect();
    if !unlisted.is_empty() {
        r.issue(
            format!("{path}kda_layers"),
            format!(
                "kda_layers and full_attn_layers must together list every one-based layer \
                 1..={n} exactly once; missing: {}",
                unlisted.join(", ")
            ),
        );
    }
    if r.issues.len() > before {
        return None;
    }
    kinds.into_iter().map(|k| k.map(|(kind, _)| kind)).collect()
}

/// `quantization_config` (in `text_config`, else at the root): compressed-tensors MXFP4,
/// group 32 (§2.2). If both places have one they must agree.
fn read_quantization(r: &mut KeyReader, root: &Obj, t: &Obj) {
    let inner = t.map.get("quantization_config");
    let outer = if t.path.is_empty() {
        None
    } else {
        root.map.get("quantization_config")
    };
    let o = match (inner, outer) {
        (Some(a), Some(b)) if a != b => {
            r.issue(
                "quantization_config".into(),
                format!("differs from {}quantization_config", t.path),
            );
            return;
        }
        (Some(_), _) => t,
        (None, Some(_)) => root,
        (None, None) => {
            r.issue(format!("{}quantization_config", t.path), "missing");
            return;
        }
    };
    let Some(q) = r.child(o, "quantization_config") else {
        return;
    };
    r.exact(&q, "quant_method", &Value::from("compressed-tensors"));
    r.exact(&q, "format", &Value::from("mxfp4-pack-quantized"));
    let Some(w) = r
        .child(&q, "config_groups")
        .and_then(|g| r.child(&g, "group_0"))
        .and_then(|g0| r.child(&g0, "weights"))
    else {
        return;
    };
    r.exact(&w, "num_bits", &Value::from(4));
    r.exact(&w, "type", &Value::from("float"));
    r.exact(&w, "strategy", &Value::from("group"));
    r.exact(&w, "group_size", &Value::from(32));
    r.exact(&w, "symmetric", &Value::Bool(true));
    r.exact(&w, "scale_dtype", &Value::from("torch.uint8"));
}
