//! The memory plan: one RAM budget decides what is resident, what streams, and how many bytes
//! each token reads (issue 4; engine-lessons §1, §3, §4.1, §8.1).
//!
//! Rules, in order:
//! 1. Fixed costs: model-level vectors, conversation state for the maximum context, scratch,
//!    the minimum expert cache (top-k + 1 slots, the in-flight reads of one layer plus one), and
//!    the streaming buffers for whatever is not resident. A budget below that is refused with
//!    both numbers.
//! 2. Trunk first (§3.3): pin trunk layers **largest first** (§3.1, c#65) while they fit; each
//!    pinned byte is one byte less to read per token. LRU over the layer cycle is useless
//!    (§3.2), so pinning is static.
//! 3. lm_head next (read in full every token), then the expert cache: beyond its minimum the
//!    cache gets memory only if at least ~36 GB is left (§4.1: below that K3's flat routing
//!    leaves nothing to retain), and the embedding (one row per token) is resident only when
//!    memory would otherwise go unused.
//! 4. When nothing streams (the whole trunk and lm_head resident), top-k more cache slots per
//!    sequence a pass decodes (or, if those do not fit, for one) for **routing lookahead**: each MoE layer routes its mixer's *input* with its own
//!    router and issues those experts' reads before the mixer runs, so the drive works while the
//!    mixer computes instead of idling until routing; guesses the real routing does not confirm
//!    are withdrawn if still queued. Only there: while trunk streams the drive is already busy
//!    during compute, and a guess could only add bytes. The slots hold reads in flight, not
//!    retention, so the predicted bytes per token do not count them.
//!    Measured with `k3d bench` on the synthetic `bench` model at 8.5 GiB (trunk resident;
//!    cgroup-limited, medians of 3): 0.93 → 0.75 s/token, the compute thread's wait for reads
//!    0.40 → 0.22 s/token, for 0.024 GB/token of wrong guesses read (1.7 %). Spending the same
//!    280 MB on cache instead would retain ~5 % of bench's pool under flat routing, and ~0 %
//!    under LRU's cyclic layer order.
//!
//! Unpinned trunk streams through [`StreamScheme`]: a ring of ≥ 2 whole-layer slots (the
//! default) or fixed chunks consumed as they land. Measured with `examples/read_bench.rs`, both
//! reach the same direct-read bandwidth once buffers sit on huge pages (`store::aligned`), so
//! bandwidth does not decide; the ring is the default because the forward pass can use a whole
//! layer's tensor slices as they are, while chunks need weights consumed by row ranges in read
//! order, for ~2.2 GB less memory (one more pinned layer, ~1% of a token's bytes at 8 GiB).
//! (The forward pass does not consume chunks yet, so the store refuses a plan that streams in
//! [`StreamScheme::Chunks`] rather than spend more than it counts.)
//! Against the alternatives at one budget, `k3d bench` on the synthetic `bench` model at 7 GiB
//! (medians of 4 interleaved runs, cgroup-limited): this plan (3 of 6 layers pinned, 4.75 GB
//! read per token) 2.50 s/token; a 3-slot ring (2 pinned, 6.00 GB) 2.83; a 2.4 GiB expert cache
//! instead of pinning (1 pinned, 6.03 GB measured) 2.57 — fewest bytes is at least as fast.
//! A streamed lm_head passes through the same buffers in row blocks of at most 64 MiB: its rows
//! are independent. A single whole-layer slot is unrepresentable: the C engine's prefetcher
//! overwrote the layer being computed and emitted wrong tokens without an error (§3.1).

use std::fmt;

use super::direct_io::{MAX_CHUNK, Window};
use super::reader::{DEFAULT_CHUNK, DEFAULT_QUEUE_DEPTH};
use crate::checkpoint::config::{MixerKind, ModelConfig};
use crate::checkpoint::layout::{FfnLayout, ModelLayout};

pub const GIB: u64 = 1 << 30;
/// Below this much memory left after the trunk, a bigger expert cache retained nothing on K3
/// (engine-lessons §4.1: first retention at a 36.4 GB cache).
pub const CACHE_WORTHWHILE: u64 = 36_000_000_000;

/// The byte census the plan needs (spec §1.2, §5.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Census {
    /// Trunk run length of every layer, by layer index.
    pub trunk_layers: Vec<u64>,
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
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error(
        "a RAM budget of {budget} bytes ({:.2} GiB) is below the minimum of {needed} bytes \
         ({:.2} GiB) for this model and context",
        *budget as f64 / GIB as f64, *needed as f64 / GIB as f64
    )]
    BudgetTooSmall { needed: u64, budget: u64 },
    #[error(
        "a trunk ring needs at least 2 slots (got {slots}): with one, prefetch overwrites \
             the layer being computed"
    )]
    RingNeedsTwoSlots { slots: usize },
    #[error(
        "a chunk stream needs chunks of at least 4096 bytes and 1 in flight \
             (got {chunk} bytes, {in_flight} in flight)"
    )]
    BadChunks { chunk: u64, in_flight: usize },
    #[error("the census is unusable: {0}")]
    BadCensus(String),
    #[error("budget {what} is not a finite positive number of GiB: {value}")]
    BadBudget { what: &'static str, value: String },
    #[error("unknown memory preset {0:?} (laptop, desktop, workstation, server, max)")]
    UnknownPreset(String),
}

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
        let census = Self {
            trunk_layers: layout.layers.iter().map(|l| l.trunk.len).collect(),
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
        };
        census.validate()?;
        Ok(census)
    }

    fn validate(&self) -> Result<(), PlanError> {
        let bad = |m: &str| Err(PlanError::BadCensus(m.into()));
        if self.trunk_layers.is_empty() {
            return bad("no layers");
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
            .and_then(|t| t.checked_add(self.expert_slot_bytes().checked_mul(self.pool() as u64)?));
        if total.is_none() {
            return bad("sizes overflow");
        }
        Ok(())
    }

    /// Buffer bytes of one expert cache slot: the aligned window of an expert at any offset.
    pub fn expert_slot_bytes(&self) -> u64 {
        Window::capacity_for(self.expert_bytes).unwrap_or(u64::MAX)
    }

    /// All routed experts of the model.
    pub fn pool(&self) -> usize {
        self.moe_layers * self.experts_per_layer
    }

    /// Expert bytes one token routes to (25,829,572,608 for K3).
    pub fn expert_bytes_per_token(&self) -> u64 {
        (self.moe_layers * self.top_k) as u64 * self.expert_bytes
    }

    pub fn trunk_bytes(&self) -> u64 {
        self.trunk_layers.iter().sum()
    }
}

/// How unpinned trunk (and a streamed lm_head) passes through memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum StreamScheme {
    /// Fixed requests consumed in order as they land: `in_flight` reads plus the one being
    /// consumed. Needs the forward pass to consume weights by row ranges.
    Chunks { chunk: u64, in_flight: usize },
    /// Whole runs in `slots` ≥ 2 slots, each sized for the largest streamed run.
    Ring { slots: usize },
}

impl Default for StreamScheme {
    fn default() -> Self {
        Self::Ring { slots: 2 }
    }
}

impl StreamScheme {
    /// The chunk stream with the reader pool's default request size and depth.
    pub fn default_chunks() -> Self {
        Self::Chunks {
            chunk: DEFAULT_CHUNK as u64,
            in_flight: DEFAULT_QUEUE_DEPTH,
        }
    }
}

impl StreamScheme {
    fn validate(self) -> Result<Self, PlanError> {
        match self {
            Self::Ring { slots } if slots < 2 => Err(PlanError::RingNeedsTwoSlots { slots }),
            Self::Chunks { chunk, in_flight } if chunk < 4096 || in_flight == 0 => {
                Err(PlanError::BadChunks { chunk, in_flight })
            }
            s => Ok(s),
        }
    }

    /// Buffer bytes when `largest` is the largest streamed run (0: nothing streams).
    fn bytes(self, largest: u64) -> u64 {
        if largest == 0 {
            return 0;
        }
        match self {
            Self::Chunks { chunk, in_flight } => (in_flight as u64 + 1) * chunk,
            Self::Ring { slots } => {
                slots as u64 * Window::capacity_for(largest).unwrap_or(u64::MAX / 4)
            }
        }
    }
}

/// Named budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    Laptop,
    Desktop,
    Workstation,
    Server,
    /// Everything resident: trunk, both tables and every expert.
    Max,
}

impl Preset {
    /// The budget in GiB; `None` for [`Preset::Max`].
    pub fn ram_gib(self) -> Option<u64> {
        match self {
            Self::Laptop => Some(8),
            Self::Desktop => Some(32),
            Self::Workstation => Some(96),
            Self::Server => Some(128),
            Self::Max => None,
        }
    }
}

impl std::str::FromStr for Preset {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self, PlanError> {
        Ok(match s {
            "laptop" => Self::Laptop,
            "desktop" => Self::Desktop,
            "workstation" => Self::Workstation,
            "server" => Self::Server,
            "max" => Self::Max,
            _ => return Err(PlanError::UnknownPreset(s.into())),
        })
    }
}

/// Whether the plan may reserve cache slots for expert reads issued on a predicted routing
/// ([`Plan::lookahead_slots`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lookahead {
    /// When the rules allow it (the default).
    #[default]
    Auto,
    /// Never (`--no-lookahead`: for comparisons).
    Off,
}

/// The user's budget: `--ram-gb` (GiB; `None` = max) and optional caps for trunk and cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Budget {
    pub ram: Option<u64>,
    pub trunk: Option<u64>,
    pub cache: Option<u64>,
    pub lookahead: Lookahead,
}

impl Budget {
    pub fn preset(p: Preset) -> Self {
        Self {
            ram: p.ram_gib().map(|g| g * GIB),
            ..Self::default()
        }
    }

    /// Bytes from a GiB figure given on the command line.
    pub fn gib(what: &'static str, value: f64) -> Result<u64, PlanError> {
        if value.is_finite() && value > 0.0 && value * (GIB as f64) < u64::MAX as f64 {
            Ok((value * GIB as f64) as u64)
        } else {
            Err(PlanError::BadBudget {
                what,
                value: value.to_string(),
            })
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Residency {
    Resident,
    Streamed,
}

/// Predicted disk bytes per decoded token, by class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ReadsPerToken {
    pub trunk: u64,
    pub lm_head: u64,
    pub embedding: u64,
    /// Upper estimate assuming flat routing: a cache beyond its minimum retains the fraction
    /// extra slots ÷ pool (engine-lessons §4.1); real conversations retain more.
    pub experts: u64,
}

impl ReadsPerToken {
    pub fn total(&self) -> u64 {
        self.trunk + self.lm_head + self.embedding + self.experts
    }
}

/// Where every byte goes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Plan {
    /// The budget planned for (for `max`, the total the plan needs).
    pub budget: u64,
    /// Pinned layers, ascending.
    pub pinned_layers: Vec<usize>,
    pub pinned_trunk_bytes: u64,
    pub layer_count: usize,
    pub scheme: StreamScheme,
    pub stream_bytes: u64,
    pub lm_head: Residency,
    pub lm_head_bytes: u64,
    pub embedding: Residency,
    /// The embedding table if resident, else one row's read window.
    pub embedding_bytes: u64,
    /// Expert cache slots, `lookahead_slots` of them included.
    pub cache_slots: usize,
    pub cache_min_slots: usize,
    /// Slots kept for the reads a MoE layer issues before its mixer on a routing predicted
    /// from the mixer's input (rule 4): top-k when granted, else 0.
    pub lookahead_slots: usize,
    pub cache_slot_bytes: u64,
    pub state_bytes: u64,
    pub scratch_bytes: u64,
    pub model_vectors_bytes: u64,
    pub reads: ReadsPerToken,
}

impl Plan {
    pub fn cache_bytes(&self) -> u64 {
        self.cache_slots as u64 * self.cache_slot_bytes
    }

    /// Every byte the plan allocates.
    pub fn total(&self) -> u64 {
        self.pinned_trunk_bytes
            + self.stream_bytes
            + if self.lm_head == Residency::Resident {
                self.lm_head_bytes
            } else {
                0
            }
            + self.embedding_bytes
            + self.cache_bytes()
            + self.state_bytes
            + self.scratch_bytes
            + self.model_vectors_bytes
    }

    /// Budget left unallocated.
    pub fn headroom(&self) -> u64 {
        self.budget.saturating_sub(self.total())
    }

    /// Plan `budget` for `census`.
    pub fn new(census: &Census, budget: Budget, scheme: StreamScheme) -> Result<Self, PlanError> {
        census.validate()?;
        let scheme = scheme.validate()?;
        let min_slots = if census.moe_layers > 0 {
            census.top_k + 1
        } else {
            0
        };
        let slot = census.expert_slot_bytes();
        let row_window = Window::capacity_for(census.embedding_row_bytes).unwrap_or(u64::MAX);
        let base = census.state_bytes + census.scratch_bytes + census.model_vectors_bytes;

        let Some(ram) = budget.ram else {
            // Max: exactly the budget that holds every byte, planned like any other.
            let cache = census.pool() as u64 * slot;
            let all =
                base + census.trunk_bytes() + census.lm_head_bytes + census.embedding_bytes + cache;
            // Pinning is greedy and counts the ring of whatever still streams, so the last
            // layer only fits with that slack; the plan then allocates exactly `all`.
            let largest = census.trunk_layers.iter().copied().max().unwrap_or(0);
            let slack = scheme.bytes(largest.max(census.lm_head_bytes.min(MAX_CHUNK as u64)));
            let budget = Budget {
                ram: Some(all + slack),
                trunk: None,
                cache: Some(cache),
                lookahead: Lookahead::Off,
            };
            let mut plan = Self::new(census, budget, scheme)?;
            plan.budget = plan.total();
            return Ok(plan);
        };
        let cache_slots_wanted = match budget.cache {
            // Never below the minimum, even for a model whose pool is smaller than top-k + 1.
            Some(c) => ((c / slot) as usize).min(census.pool()).max(min_slots),
            None => min_slots,
        };
        let mut pinned = vec![false; census.trunk_layers.len()];
        let mut lm_head = Residency::Streamed;
        let mut embedding = Residency::Streamed;
        let lm_piece = census.lm_head_bytes.min(MAX_CHUNK as u64);
        let largest_streamed = |pinned: &[bool], lm: Residency| -> u64 {
            let trunk = census.trunk_layers.iter().zip(pinned).filter(|(_, p)| !**p);
            trunk
                .map(|(b, _)| *b)
                .chain((lm == Residency::Streamed).then_some(lm_piece))
                .max()
                .unwrap_or(0)
        };
        // Bytes the plan needs with the current choices.
        let needs = |pinned: &[bool], lm: Residency, emb: Residency, slots: usize| -> u64 {
            let trunk = census.trunk_layers.iter().zip(pinned).filter(|(_, p)| **p);
            base + trunk.map(|(b, _)| *b).sum::<u64>()
                + scheme.bytes(largest_streamed(pinned, lm))
                + if lm == Residency::Resident {
                    census.lm_head_bytes
                } else {
                    0
                }
                + if emb == Residency::Resident {
                    census.embedding_bytes
                } else {
                    row_window
                }
                + slots as u64 * slot
        };
        let minimum = needs(&pinned, lm_head, embedding, cache_slots_wanted);
        if ram < minimum {
            return Err(PlanError::BudgetTooSmall {
                needed: minimum,
                budget: ram,
            });
        }

        let mut order: Vec<usize> = (0..census.trunk_layers.len()).collect();
        order.sort_by_key(|&l| (std::cmp::Reverse(census.trunk_layers[l]), l));
        let trunk_cap = budget.trunk.unwrap_or(u64::MAX);
        let mut trunk = 0u64;
        for l in order {
            let size = census.trunk_layers[l];
            if trunk + size > trunk_cap {
                continue;
            }
            pinned[l] = true;
            if needs(&pinned, lm_head, embedding, cache_slots_wanted) <= ram {
                trunk += size;
            } else {
                pinned[l] = false;
            }
        }
        if needs(&pinned, Residency::Resident, embedding, cache_slots_wanted) <= ram {
            lm_head = Residency::Resident;
        }
        let mut cache_slots = cache_slots_wanted;
        // Rule 4: with nothing streaming, the drive idles while each layer's mixer computes.
        // Top-k slots per sequence a pass decodes, else for one (single-sequence decode).
        let wanted = budget.lookahead == Lookahead::Auto
            && census.moe_layers > 0
            && largest_streamed(&pinned, lm_head) == 0
            && cache_slots < census.pool();
        let per_batch = census.sequences.max(1).saturating_mul(census.top_k);
        let lookahead_slots = [per_batch, census.top_k]
            .into_iter()
            .find(|&slots| wanted && needs(&pinned, lm_head, embedding, cache_slots + slots) <= ram)
            .unwrap_or(0);
        cache_slots += lookahead_slots;
        let left = ram - needs(&pinned, lm_head, embedding, cache_slots);
        if budget.cache.is_none() && left >= CACHE_WORTHWHILE {
            cache_slots = (cache_slots + (left / slot) as usize)
                .min(census.pool())
                .max(cache_slots);
        }
        if needs(&pinned, lm_head, Residency::Resident, cache_slots) <= ram {
            embedding = Residency::Resident;
        }
        let stream_bytes = scheme.bytes(largest_streamed(&pinned, lm_head));
        Ok(Self {
            budget: ram,
            pinned_layers: (0..pinned.len()).filter(|&l| pinned[l]).collect(),
            pinned_trunk_bytes: trunk,
            layer_count: census.trunk_layers.len(),
            scheme,
            stream_bytes,
            lm_head,
            lm_head_bytes: census.lm_head_bytes,
            embedding,
            embedding_bytes: if embedding == Residency::Resident {
                census.embedding_bytes
            } else {
                row_window
            },
            cache_slots,
            cache_min_slots: min_slots,
            lookahead_slots,
            cache_slot_bytes: slot,
            state_bytes: census.state_bytes,
            scratch_bytes: census.scratch_bytes,
            model_vectors_bytes: census.model_vectors_bytes,
            reads: ReadsPerToken {
                trunk: census.trunk_bytes() - trunk,
                lm_head: if lm_head == Residency::Resident {
                    0
                } else {
                    census.lm_head_bytes
                },
                embedding: if embedding == Residency::Resident {
                    0
                } else {
                    census.embedding_row_bytes
                },
                // Lookahead slots only hold reads in flight: no retention.
                experts: expert_reads(census, cache_slots - lookahead_slots, min_slots),
            },
        })
    }
}

/// Flat-routing estimate of expert bytes read per token with `slots` cache slots.
fn expert_reads(census: &Census, slots: usize, min_slots: usize) -> u64 {
    let pool = census.pool();
    if pool == 0 || slots >= pool {
        return 0;
    }
    let per_token = census.expert_bytes_per_token() as u128;
    let kept = slots.saturating_sub(min_slots) as u128;
    (per_token * (pool as u128 - kept) / pool as u128) as u64
}

/// "0-3, 7, 9-12".
fn ranges(ls: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ls.len() {
        let mut j = i;
        while j + 1 < ls.len() && ls[j + 1] == ls[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ls[i].to_string()
        } else {
            format!("{}-{}", ls[i], ls[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

fn gb(b: u64) -> String {
    format!("{:.2} GB", b as f64 / 1e9)
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gib = |b: u64| b as f64 / GIB as f64;
        writeln!(
            f,
            "memory plan: budget {:.2} GiB ({} B), allocated {:.2} GiB, headroom {:.2} GiB",
            gib(self.budget),
            self.budget,
            gib(self.total()),
            gib(self.headroom())
        )?;
        let streamed = self.layer_count - self.pinned_layers.len();
        writeln!(
            f,
            "  trunk      {} of {} layers pinned ({}{}), {streamed} streamed ({} per token)",
            self.pinned_layers.len(),
            self.layer_count,
            gb(self.pinned_trunk_bytes),
            if self.pinned_layers.is_empty() {
                String::new()
            } else {
                format!(": layers {}", ranges(&self.pinned_layers))
            },
            gb(self.reads.trunk)
        )?;
        match (self.stream_bytes, self.scheme) {
            (0, _) => writeln!(f, "  streaming  none (nothing streams)")?,
            (b, StreamScheme::Chunks { chunk, in_flight }) => writeln!(
                f,
                "  streaming  {} × {} MiB chunks ({in_flight} in flight + 1 being consumed): {}",
                in_flight + 1,
                chunk >> 20,
                gb(b)
            )?,
            (b, StreamScheme::Ring { slots }) => {
                writeln!(f, "  streaming  ring of {slots} whole-run slots: {}", gb(b))?
            }
        }
        let res = |r: Residency| match r {
            Residency::Resident => "resident",
            Residency::Streamed => "streamed",
        };
        writeln!(
            f,
            "  lm_head    {} ({})",
            res(self.lm_head),
            gb(self.lm_head_bytes)
        )?;
        match self.embedding {
            Residency::Resident => {
                writeln!(f, "  embedding  resident ({})", gb(self.embedding_bytes))?
            }
            Residency::Streamed => writeln!(
                f,
                "  embedding  streamed (one row per token; {} B read window)",
                self.embedding_bytes
            )?,
        }
        writeln!(
            f,
            "  experts    {} cache slots × {:.2} MB = {} (minimum {} = top-k + 1{})",
            self.cache_slots,
            self.cache_slot_bytes as f64 / 1e6,
            gb(self.cache_bytes()),
            self.cache_min_slots,
            if self.lookahead_slots > 0 {
                format!(
                    "; {} for reads issued ahead on a predicted routing",
                    self.lookahead_slots
                )
            } else {
                String::new()
            }
        )?;
        writeln!(
            f,
            "  state {}, scratch {}, model vectors {} B",
            gb(self.state_bytes),
            gb(self.scratch_bytes),
            self.model_vectors_bytes
        )?;
        write!(
            f,
            "  reads per token: trunk {} + lm_head {} + embedding {} B + experts {} \
             (flat-routing upper estimate) = {}{}",
            gb(self.reads.trunk),
            gb(self.reads.lm_head),
            self.reads.embedding,
            gb(self.reads.experts),
            gb(self.reads.total()),
            if self.lookahead_slots > 0 {
                ", plus the lookahead's wrong guesses (measured: lookahead_unused_bytes)"
            } else {
                ""
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Released K3 (spec §1.2, §5.1) at an 8,192-position maximum context and 256 MiB scratch.
    fn k3() -> Census {
        let trunk_layers = (0..93)
            .map(|l| match l {
                0 => 2_341_213_184,
                91 | 92 => 844_335_616,
                l if (l + 1) % 4 == 0 => 844_335_616,
                _ => 1_267_744_256,
            })
            .collect();
        Census {
            trunk_layers,
            expert_bytes: 17_547_264,
            experts_per_layer: 896,
            moe_layers: 92,
            top_k: 16,
            embedding_bytes: 2_348_810_240,
            embedding_row_bytes: 14_336,
            lm_head_bytes: 2_348_810_240,
            model_vectors_bytes: 43_008,
            state_bytes: 464_633_856 + 55_296 * 8192,
            scratch_bytes: 256 << 20,
            sequences: 1,
        }
    }

    #[test]
    fn released_census_matches_spec_totals() {
        let c = k3();
        assert_eq!(c.trunk_bytes(), 108_811_877_376);
        assert_eq!(c.expert_bytes_per_token(), 25_829_572_608);
        assert_eq!(c.pool(), 82_432);
        assert_eq!(c.expert_slot_bytes(), 17_551_360);
        assert_eq!(
            c.lm_head_bytes + c.embedding_bytes + c.model_vectors_bytes,
            4_697_663_488
        );
    }

    #[test]
    fn laptop_streams_most_of_the_trunk() {
        let c = k3();
        let p = Plan::new(&c, Budget::preset(Preset::Laptop), StreamScheme::default()).unwrap();
        assert!(p.total() <= p.budget);
        // Largest first: layer 0 (2.34 GB), then KDA+MoE layers in index order while they fit
        // beside two 1.27 GB ring slots, then a smaller MLA+MoE layer (3) that still fits.
        assert_eq!(p.pinned_layers, vec![0, 1, 3]);
        assert_eq!(
            p.stream_bytes,
            2 * Window::capacity_for(1_267_744_256).unwrap()
        );
        // The chunk stream needs 0.30 GB instead of 2.54 and pins one layer more.
        let chunks = Plan::new(
            &c,
            Budget::preset(Preset::Laptop),
            StreamScheme::default_chunks(),
        );
        assert_eq!(chunks.unwrap().pinned_layers, vec![0, 1, 2, 4]);
        assert!(p.reads.trunk > c.trunk_bytes() * 9 / 10);
        assert_eq!(p.lm_head, Residency::Streamed);
        assert_eq!(p.embedding, Residency::Streamed);
        assert_eq!(p.cache_slots, 17);
        assert_eq!(p.reads.experts, c.expert_bytes_per_token());
        assert_eq!(
            p.reads.total(),
            c.trunk_bytes() - p.pinned_trunk_bytes + c.lm_head_bytes + 14_336 + 25_829_572_608
        );
        let text = p.to_string();
        println!("{text}");
        assert!(text.contains("layers 0-1, 3"), "{text}");
    }

    #[test]
    fn server_holds_the_trunk_and_tables_but_only_the_minimum_cache() {
        let c = k3();
        let p = Plan::new(&c, Budget::preset(Preset::Server), StreamScheme::default()).unwrap();
        assert_eq!(p.pinned_layers.len(), 93);
        assert_eq!(p.reads.trunk, 0);
        assert_eq!(p.stream_bytes, 0);
        assert_eq!(p.lm_head, Residency::Resident);
        // ~24 GB left after trunk and head is below the 36 GB threshold (§4.1): the minimum
        // cache, plus top-k slots for the routing lookahead since nothing streams (rule 4).
        assert_eq!(p.lookahead_slots, 16);
        assert_eq!(p.cache_slots, 17 + 16);
        assert_eq!(p.embedding, Residency::Resident);
        // Lookahead slots hold reads in flight: the prediction is the no-retention figure.
        assert_eq!(p.reads.total(), 25_829_572_608);
        assert!(p.total() <= p.budget);
        println!("{p}");
        let off = Budget {
            lookahead: Lookahead::Off,
            ..Budget::preset(Preset::Server)
        };
        let p = Plan::new(&c, off, StreamScheme::default()).unwrap();
        assert_eq!((p.lookahead_slots, p.cache_slots), (0, 17));
    }

    #[test]
    fn lookahead_covers_every_sequence_of_a_batch_when_it_fits() {
        let mut c = k3();
        c.sequences = 4;
        let p = Plan::new(&c, Budget::preset(Preset::Server), StreamScheme::default()).unwrap();
        assert_eq!((p.lookahead_slots, p.cache_slots), (64, 17 + 64));
        // A budget with room for one sequence's slots only gets those (the embedding, resident
        // only when memory is left over, streams at both).
        let one = p.total() - c.embedding_bytes - 40 * p.cache_slot_bytes;
        let b = Budget {
            ram: Some(one),
            ..Budget::default()
        };
        let p = Plan::new(&c, b, StreamScheme::default()).unwrap();
        assert_eq!(p.lookahead_slots, 16);
    }

    #[test]
    fn lookahead_only_when_nothing_streams() {
        let c = k3();
        for preset in [
            Preset::Laptop,
            Preset::Desktop,
            Preset::Workstation,
            Preset::Max,
        ] {
            let p = Plan::new(&c, Budget::preset(preset), StreamScheme::default()).unwrap();
            assert_eq!(p.lookahead_slots, 0, "{preset:?}: {p}");
        }
    }

    #[test]
    fn workstation_pins_most_and_larger_budgets_grow_the_cache() {
        let c = k3();
        let w = Plan::new(
            &c,
            Budget::preset(Preset::Workstation),
            StreamScheme::default(),
        );
        let w = w.unwrap();
        assert!(w.pinned_layers.len() > 70 && w.pinned_layers.len() < 93);
        assert!(w.pinned_layers.contains(&0));
        let big = Budget {
            ram: Some(256 * GIB),
            ..Budget::default()
        };
        let b = Plan::new(&c, big, StreamScheme::default()).unwrap();
        assert!(b.cache_slots > 17 + 5000);
        assert!(b.reads.experts < c.expert_bytes_per_token());
        assert!(b.total() <= b.budget && b.headroom() < b.cache_slot_bytes + c.embedding_bytes);
    }

    #[test]
    fn max_holds_everything() {
        let c = k3();
        let p = Plan::new(&c, Budget::preset(Preset::Max), StreamScheme::default()).unwrap();
        assert_eq!(p.reads.total(), 0);
        assert_eq!(p.cache_slots, 82_432);
        assert_eq!(p.budget, p.total());
        assert!(p.total() > 1_555_000_000_000);
    }

    #[test]
    fn too_small_budget_is_refused_with_both_numbers() {
        let c = k3();
        let b = Budget {
            ram: Some(GIB),
            ..Budget::default()
        };
        let e = Plan::new(&c, b, StreamScheme::default()).unwrap_err();
        let PlanError::BudgetTooSmall { needed, budget } = e else {
            panic!("{e}");
        };
        assert_eq!(budget, GIB);
        let min = c.state_bytes
            + c.scratch_bytes
            + 43_008
            + 17 * 17_551_360
            + 2 * Window::capacity_for(2_341_213_184).unwrap()
            + Window::capacity_for(14_336).unwrap();
        assert_eq!(needed, min);
        assert!(
            Plan::new(
                &c,
                Budget {
                    ram: Some(min),
                    ..b
                },
                StreamScheme::default()
            )
            .is_ok()
        );
        assert!(e.to_string().contains(&min.to_string()));
    }

    #[test]
    fn a_single_slot_ring_is_refused() {
        let c = k3();
        let e = Plan::new(
            &c,
            Budget::preset(Preset::Laptop),
            StreamScheme::Ring { slots: 1 },
        );
        assert_eq!(e.unwrap_err(), PlanError::RingNeedsTwoSlots { slots: 1 });
    }

    #[test]
    fn ring_slots_fit_the_largest_streamed_layer() {
        let c = k3();
        let ring = StreamScheme::Ring { slots: 3 };
        let p = Plan::new(&c, Budget::preset(Preset::Laptop), ring).unwrap();
        // Layer 0 pinned, so slots fit a KDA+MoE layer; the streamed lm_head passes through
        // them in 64 MiB row blocks and does not widen them.
        assert_eq!(p.pinned_layers[0], 0);
        assert_eq!(p.lm_head, Residency::Streamed);
        assert_eq!(
            p.stream_bytes,
            3 * Window::capacity_for(1_267_744_256).unwrap()
        );
    }

    fn tiny() -> Census {
        Census {
            trunk_layers: vec![100_000, 300_000, 200_000, 300_000],
            expert_bytes: 8192,
            experts_per_layer: 8,
            moe_layers: 3,
            top_k: 2,
            embedding_bytes: 50_000,
            embedding_row_bytes: 500,
            lm_head_bytes: 60_000,
            model_vectors_bytes: 100,
            state_bytes: 10_000,
            scratch_bytes: 20_000,
            sequences: 1,
        }
    }

    const TINY_SCHEME: StreamScheme = StreamScheme::Chunks {
        chunk: 4096,
        in_flight: 3,
    };

    #[test]
    fn tiny_pins_largest_first_and_skips_what_does_not_fit() {
        let c = tiny();
        // Fixed: 30,100 + 3 slots × 12,288 + 4 chunks × 4096 + row window 8192 = 91,540.
        let fixed = 30_100 + 3 * 12_288 + 4 * 4096 + 8192;
        let b = |ram| Budget {
            ram: Some(ram),
            ..Budget::default()
        };
        assert_eq!(
            Plan::new(&c, b(fixed - 1), TINY_SCHEME).unwrap_err(),
            PlanError::BudgetTooSmall {
                needed: fixed,
                budget: fixed - 1
            }
        );
        let p = Plan::new(&c, b(fixed + 650_000), TINY_SCHEME).unwrap();
        // 300k (layer 1) + 300k (layer 3) fit; 200k does not; 100k (layer 0) still does.
        assert_eq!(p.pinned_layers, vec![1, 3]);
        let p = Plan::new(&c, b(fixed + 700_000), TINY_SCHEME).unwrap();
        assert_eq!(p.pinned_layers, vec![0, 1, 3]);
        assert_eq!(p.reads.trunk, 200_000);
        assert_eq!(p.lm_head, Residency::Streamed);
        // Everything pinned: the streaming buffer disappears, lm_head and embedding fit.
        let p = Plan::new(&c, b(fixed + 900_000 + 60_000 + 50_000), TINY_SCHEME).unwrap();
        assert_eq!(p.pinned_layers.len(), 4);
        assert_eq!(
            (p.lm_head, p.embedding),
            (Residency::Resident, Residency::Resident)
        );
        assert_eq!(p.stream_bytes, 0);
        assert_eq!(p.reads.total(), 3 * 2 * 8192);
    }

    #[test]
    fn tiny_overrides_cap_trunk_and_size_cache() {
        let c = tiny();
        let budget = Budget {
            ram: Some(10_000_000),
            trunk: Some(450_000),
            cache: Some(10 * 12_288),
            ..Budget::default()
        };
        let p = Plan::new(&c, budget, TINY_SCHEME).unwrap();
        assert_eq!(p.pinned_layers, vec![0, 1]);
        assert_eq!(p.cache_slots, 10);
        // Flat routing: 7 slots beyond the minimum of 3 retain 7/24 of 6 experts' bytes.
        assert_eq!(p.reads.experts, 6 * 8192 * (24 - 7) / 24);
        let all = Budget {
            ram: Some(10_000_000),
            trunk: None,
            cache: Some(1 << 40),
            ..Budget::default()
        };
        let p = Plan::new(&c, all, TINY_SCHEME).unwrap();
        assert_eq!(p.cache_slots, 24);
        assert_eq!(p.reads.experts, 0);
    }

    #[test]
    fn a_pool_smaller_than_the_minimum_does_not_break_the_plan() {
        let mut c = tiny();
        c.moe_layers = 1;
        c.experts_per_layer = 2;
        let b = Budget {
            ram: Some(100_000_000),
            trunk: None,
            cache: Some(1),
            ..Budget::default()
        };
        let p = Plan::new(&c, b, TINY_SCHEME).unwrap();
        assert_eq!(p.cache_slots, 3);
        assert_eq!(p.reads.experts, 0);
    }

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
    }

    #[test]
    fn presets_parse() {
        assert_eq!("laptop".parse::<Preset>().unwrap().ram_gib(), Some(8));
        assert_eq!("max".parse::<Preset>().unwrap().ram_gib(), None);
        assert!("huge".parse::<Preset>().is_err());
        assert_eq!(Budget::gib("ram", 1.5).unwrap(), 3 * GIB / 2);
        assert!(Budget::gib("ram", -1.0).is_err());
        assert!(Budget::gib("ram", f64::NAN).is_err());
    }
}
