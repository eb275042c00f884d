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
//!    cache gets everything left, up to the whole pool, but only if what is left holds at least
//!    one token's routed experts (top-k × MoE layers slots, from the checkpoint's census). The
//!    layers run in a fixed cycle, so an LRU cache smaller than one token's experts evicts each
//!    before the next token could reuse it; on K3 (1,472 slots, 25.8 GB) that is where the C
//!    engine's ladder first retained anything (nothing at 23.6 GB, 29.9 % at 36.4 GB, §4.1). Per
//!    GiB a cache avoids at most top-k ÷ experts-per-layer of what pinning a GiB of trunk does
//!    (flat routing), which is why pinning comes first. The embedding (one row per token) is
//!    resident only when memory would otherwise go unused; what is then left is the plan's
//!    headroom, which a daemon keeps for in-memory sessions (`--session-gb` defaults to it).
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
//! 5. While trunk streams through chunks, the spare budget left after pinning and lm_head
//!    buys **read-ahead**: more chunk buffers, until the reads in flight cover the largest
//!    streamed layer's matrices (`--read-ahead-gb` sets another cap), before the expert cache
//!    may grow. The stream reads ahead only as far as its buffers reach; once all have landed
//!    the drive idles until the forward pass frees one, i.e. through every pinned layer's
//!    compute. Measured with `k3d bench` on `bench` at 4.75 GiB (cgroup-limited, medians of 3,
//!    three interleaved rounds; issue 17): 8 × 32 MiB of read-ahead kept the drive busy 83–90 %
//!    of each token, 31 × 32 MiB (1.04 GB, all the spare) 96–98 %, and s/token fell 13–18 %
//!    (2.68–3.09 → 2.35–2.59) at the same bytes per token; in the first round 16 × 32 MiB,
//!    15 × 64 MiB and 14 × 16 MiB (smaller chunks pin one more layer and read ahead less) were
//!    between the two.
//!
//! Unpinned trunk streams through [`StreamScheme`]: fixed chunks consumed by row ranges as they
//! land (the default; `store::chunks`) or a ring of ≥ 2 whole-layer slots. Measured with
//! `examples/read_bench.rs`, both reach the same direct-read bandwidth once buffers sit on huge
//! pages (`store::direct_buffer`), so bandwidth does not decide; the chunks take ~0.33 GB instead of
//! two K3 layers (2.5–4.7 GB), which lowers the floor for the released model to 1.28 GiB at
//! 4,096 positions and pins one to two more layers at any budget that streams. A chunk stream
//! reads only a streamed layer's matrices per token (its vectors are decoded at load), and MLA's
//! `kv_b_proj` is gathered whole into a buffer the plan counts ([`Census::gather_bytes`]).
//! The ring's measurements below predate the chunk stream.
//! Against the alternatives at one budget, `k3d bench` on the synthetic `bench` model at 7 GiB
//! (medians of 4 interleaved runs, cgroup-limited): this plan (3 of 6 layers pinned, 4.75 GB
//! read per token) 2.50 s/token; a 3-slot ring (2 pinned, 6.00 GB) 2.83; a 2.4 GiB expert cache
//! instead of pinning (1 pinned, 6.03 GB measured) 2.57 — fewest bytes is at least as fast.
//! A streamed lm_head passes through the same buffers in row blocks of at most 64 MiB: its rows
//! are independent. A single whole-layer slot is unrepresentable: the C engine's prefetcher
//! overwrote the layer being computed and emitted wrong tokens without an error (§3.1).
//!
//! Submodules: [`sizes`] (the bytes the plan is computed from), [`state_geometry`] (the state
//! geometry), [`budget`] (what the user asks), [`inputs`] (what a loader or a daemon must hold
//! at once: context, batch, speculation, sessions), `rules` (the rules above, one step each,
//! which [`Plan::new`] applies in order), [`buffers`] (the store's buffer sizes) and
//! [`context`] (the largest context a budget holds: a daemon's default prompt limit).
//!
//! The plan sits between the checkpoint and the store (checkpoint → plan → store → model →
//! engine): it is computed from the checkpoint's layout and configuration alone, before
//! anything is opened, and the store allocates exactly what it says.

pub mod budget;
pub mod buffers;
pub mod context;
pub mod inputs;
pub mod pack;
mod rules;
pub mod sizes;
pub mod state_geometry;

use std::fmt;

pub use budget::{Budget, DenseLookahead, Lookahead, Preset, StreamScheme};
pub use inputs::{PlanInputs, Serving, SessionReserve};
pub use pack::{PackFigures, PackMeasure, PackPlan, PackRefusal};
pub use sizes::Census;
pub use state_geometry::StateShape;

use buffers::MAX_CHUNK;

pub const GIB: u64 = 1 << 30;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    /// Both figures in GiB to four significant digits (two budgets a few MiB apart read
    /// apart) and in bytes, and the shortest `--ram-gb` value that holds the minimum (issue
    /// 46.4: "0.01 GiB is below the minimum of 0.01 GiB" left the user guessing).
    #[error(
        "a RAM budget of {} GiB ({budget} bytes) is below the minimum of {} GiB ({needed} \
         bytes) for this model and context: give --ram-gb {} or more",
        budget::gib_figure(*budget), budget::gib_figure(*needed), budget::gib_to_ask(*needed)
    )]
    BudgetTooSmall { needed: u64, budget: u64 },
    #[error(
        "a trunk ring needs at least 2 slots (got {slots}): with one, prefetch overwrites \
             the layer being computed"
    )]
    RingNeedsTwoSlots { slots: usize },
    #[error(
        "a chunk stream needs chunks that are a multiple of 4096 bytes, hold the widest \
         streamed row plus a page ({least} bytes for this model) and 1 in flight \
         (got {chunk} bytes, {in_flight} in flight)"
    )]
    BadChunks {
        chunk: u64,
        in_flight: usize,
        least: u64,
    },
    #[error("the census is unusable: {0}")]
    BadCensus(String),
    #[error("budget {what} is not a finite positive number of GiB: {value}")]
    BadBudget { what: &'static str, value: String },
    #[error("unknown memory preset {0:?} (laptop, desktop, workstation, server, max)")]
    UnknownPreset(String),
    #[error("unknown dense lookahead {0:?} (off, input, mlp-input)")]
    UnknownDenseLookahead(String),
    #[error("--session-gb ({sessions} B) leaves nothing of the RAM budget ({ram} B)")]
    SessionsTakeBudget { sessions: u64, ram: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Residency {
    Resident,
    Streamed,
}

/// Predicted disk bytes per decoded token, by class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    /// Whether the first MoE layer after a dense one guesses across it (issue 16): the budget's
    /// wish where lookahead slots are granted, else off.
    pub dense_lookahead: DenseLookahead,
    pub cache_slot_bytes: u64,
    pub state_bytes: u64,
    pub scratch_bytes: u64,
    /// Prompt tokens one layer-major prefill pass may feed (issue 30): the most of the
    /// requested [`PlanInputs::prefill_tokens`] whose activations (counted in
    /// `scratch_bytes`) leave every decode choice as it is ([`Plan::for_model`]), 0 when none
    /// was asked for or none fits: prompts are then fed in chunks. A prompt of T tokens takes
    /// ⌈T / prefill_tokens⌉ passes, each reading the weights once.
    pub prefill_tokens: u64,
    /// Of `scratch_bytes`, what those passes' activations take.
    pub prefill_bytes: u64,
    /// The pass asked for ([`PlanInputs::prefill_tokens`]), for the printout.
    pub prefill_asked: u64,
    /// Expert-cache slots that hold experts in `prefill_bytes` while no pass holds its
    /// activations there (issue 41.5): the cache has `cache_slots` + these, and gives back
    /// what a pass of T tokens needs beyond the rest of `prefill_bytes` when the pass starts
    /// (`engine::passes`), so a short prompt's prefill, and decode, keep the larger cache. The
    /// budget is never exceeded: cache slots × slot bytes + pass activations never pass
    /// `cache_bytes() + prefill_bytes`.
    pub pass_cache_slots: usize,
    pub model_vectors_bytes: u64,
    pub reads: ReadsPerToken,
    /// The smallest trunk layer left streaming (0: none): headroom below it could not pin one.
    pub smallest_streamed_layer: u64,
    /// What the expert cache needs left to grow beyond its minimum (rule 3): one token's
    /// routed experts' slots.
    pub cache_threshold: u64,
    /// The budget a daemon keeps beside the model for sessions and kept conversation states.
    pub sessions: SessionPlan,
    /// A trunk pack's decode buffer (counted in `scratch_bytes`) and whether it is read.
    pub pack: PackPlan,
}

/// What a daemon's plan keeps for sessions and kept conversation states
/// ([`inputs::SessionReserve`]): bytes of the budget the model does not use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SessionPlan {
    /// Bytes of the budget reserved (beside [`Plan::total`], which the model allocates).
    pub reserved: u64,
    /// What the default reserve asked for: one conversation state of the planned context per
    /// active request (0 with `--session-gb`, which is `reserved` exactly).
    pub wanted: u64,
    /// Set by `--session-gb`: the allowance is exactly `reserved`; by default the headroom
    /// adds to it.
    pub explicit: bool,
}

impl Plan {
    /// Bytes of the expert cache a prefill pass cannot take back (`cache_slots`).
    pub fn cache_bytes(&self) -> u64 {
        self.cache_slots as u64 * self.cache_slot_bytes
    }

    /// Expert-cache slots while no prefill pass holds its activations: `cache_slots` and the
    /// slots lent from the pass's bytes ([`Plan::pass_cache_slots`]).
    pub fn idle_cache_slots(&self) -> usize {
        self.cache_slots + self.pass_cache_slots
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

    /// Budget left unallocated (neither the model's nor reserved for sessions).
    pub fn headroom(&self) -> u64 {
        self.budget
            .saturating_sub(self.total())
            .saturating_sub(self.sessions.reserved)
    }

    /// The in-memory allowance of a daemon's sessions and kept conversation states: the
    /// reserve, and by default the headroom too (memory nothing else uses).
    pub fn session_allowance(&self) -> u64 {
        self.sessions.reserved
            + if self.sessions.explicit {
                0
            } else {
                self.headroom()
            }
    }

    /// Plan `budget` for `census`: the rules of the module doc, in order (`plan::rules`).
    pub fn new(census: &Census, budget: Budget, scheme: StreamScheme) -> Result<Self, PlanError> {
        census.validate()?;
        let scheme = census.fitted(scheme)?;
        let Some(ram) = budget.ram else {
            return Self::everything(census, scheme);
        };
        let costs = rules::Costs::new(census, scheme);
        let mut choices = costs.minimum(budget.cache);
        costs.check_minimum(&choices, ram)?;
        costs.pin_trunk(&mut choices, ram, budget.trunk.unwrap_or(u64::MAX));
        costs.resident_lm_head(&mut choices, ram);
        costs.lookahead(&mut choices, ram, budget.lookahead);
        let (scheme, read_ahead) = costs.read_ahead(&choices, ram, budget.read_ahead);
        costs.grow_cache(&mut choices, ram - read_ahead, budget.cache.is_some());
        costs.resident_embedding(&mut choices, ram - read_ahead);
        Ok(costs.plan(choices, ram, scheme, budget.dense_lookahead))
    }

    /// The `max` plan: exactly the budget that holds every byte, planned like any other.
    fn everything(census: &Census, scheme: StreamScheme) -> Result<Self, PlanError> {
        let cache = census.pool() as u64 * census.expert_slot_bytes();
        let all = census.state_bytes
            + census.scratch_bytes
            + census.model_vectors_bytes
            + census.trunk_bytes()
            + census.lm_head_bytes
            + census.embedding_bytes
            + cache;
        // Pinning is greedy and counts the ring of whatever still streams, so the last
        // layer only fits with that slack; the plan then allocates exactly `all`.
        let largest = census.trunk_layers.iter().copied().max().unwrap_or(0);
        let slack = scheme.bytes(
            largest.max(census.lm_head_bytes.min(MAX_CHUNK as u64)),
            census.gather_bytes,
        );
        let budget = Budget {
            ram: Some(all + slack),
            trunk: None,
            cache: Some(cache),
            lookahead: Lookahead::Off,
            dense_lookahead: DenseLookahead::Off,
            read_ahead: None,
        };
        let mut plan = Self::new(census, budget, scheme)?;
        plan.budget = plan.total();
        Ok(plan)
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

/// Bytes in the binary units `--ram-gb` and the budget line use (issue 46.5: one unit system,
/// and a tiny model's figures not all `0.00`): `2.26 GiB`, `832.0 MiB`, `40.0 KiB`, `384 B`.
fn gb(b: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    match UNITS.iter().find(|(size, _)| b >= *size) {
        Some((size, "GiB")) => format!("{:.2} GiB", b as f64 / *size as f64),
        Some((size, unit)) => format!("{:.1} {unit}", b as f64 / *size as f64),
        None => format!("{b} B"),
    }
}

impl Census {
    /// `scheme` as the store will run it for this model ([`StreamScheme::fitted`]).
    pub fn fitted(&self, scheme: StreamScheme) -> Result<StreamScheme, PlanError> {
        let largest_run = self
            .trunk_layers
            .iter()
            .copied()
            .chain([self.lm_head_bytes])
            .max()
            .unwrap_or(0);
        scheme.fitted(self.trunk_row_bytes, largest_run)
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "memory plan: budget {} ({} B): the model {}, kept conversation states {}, \
             unallocated {}",
            gb(self.budget),
            self.budget,
            gb(self.total()),
            gb(self.sessions.reserved),
            gb(self.headroom())
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
                "  streaming  {} × {} KiB chunks ({in_flight} read ahead, {}, + 1 being consumed){}: {}",
                in_flight + 1,
                chunk >> 10,
                gb(in_flight as u64 * chunk),
                match b - (in_flight as u64 + 1) * chunk {
                    0 => String::new(),
                    g => format!(" + {} to gather a matrix used whole", gb(g)),
                },
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
            "  experts    {} cache slots × {} = {} (minimum {} = top-k + 1{})",
            self.cache_slots,
            gb(self.cache_slot_bytes),
            gb(self.cache_bytes()),
            self.cache_min_slots,
            if self.lookahead_slots > 0 {
                format!(
                    "; {} for reads issued ahead on a predicted routing{}",
                    self.lookahead_slots,
                    match self.dense_lookahead {
                        DenseLookahead::Off => String::new(),
                        d => format!(" (across the dense layer: {})", d.name()),
                    }
                )
            } else {
                String::new()
            }
        )?;
        if self.pass_cache_slots > 0 {
            writeln!(
                f,
                "             + {} slots in the prefill pass's bytes while no pass runs                  (a pass of T tokens takes back only what its activations need)",
                self.pass_cache_slots
            )?;
        }
        writeln!(
            f,
            "  state {}, scratch {}, model vectors {} B",
            gb(self.state_bytes),
            gb(self.scratch_bytes),
            self.model_vectors_bytes
        )?;
        let cut = if self.prefill_tokens < self.prefill_asked {
            format!(
                "; {} asked, the rest of the budget goes first to what each decoded token reads",
                self.prefill_asked
            )
        } else {
            String::new()
        };
        if self.prefill_tokens > 0 {
            writeln!(
                f,
                "  prefill    passes of up to {} prompt tokens, each reading the weights once \
                 ({} of activations, in scratch); a longer prompt takes ⌈tokens / {}⌉ passes{cut}",
                self.prefill_tokens,
                gb(self.prefill_bytes),
                self.prefill_tokens
            )?;
        } else if self.prefill_asked > 0 {
            writeln!(
                f,
                "  prefill    in chunks, each reading the weights again: no pass fits beside \
                 what each decoded token reads ({} asked)",
                self.prefill_asked
            )?;
        }
        if self.pack != PackPlan::None {
            writeln!(f, "  trunk pack {}", self.pack)?;
        }
        let reserve = self.sessions;
        if reserve.reserved > 0 || reserve.wanted > 0 {
            writeln!(
                f,
                "  sessions   {}: kept conversation states and sessions between turns ({})",
                gb(reserve.reserved),
                if reserve.explicit {
                    "--session-gb".to_string()
                } else if reserve.reserved < reserve.wanted {
                    format!(
                        "the default, one state of the planned context per active request, \
                         {}, cut to what the budget holds beside the model",
                        gb(reserve.wanted)
                    )
                } else {
                    "the default: one state of the planned context per active request".into()
                }
            )?;
        }
        if self.headroom() > 0 {
            let mut why = Vec::new();
            if self.smallest_streamed_layer > 0 {
                why.push(format!(
                    "another layer needs {}",
                    gb(self.smallest_streamed_layer)
                ));
            }
            if self.cache_slots - self.lookahead_slots <= self.cache_min_slots
                && self.cache_min_slots > 0
            {
                why.push(format!(
                    "a cache beyond its minimum needs one token's experts, {}",
                    gb(self.cache_threshold)
                ));
            }
            writeln!(
                f,
                "  spare      {}{}: a daemon keeps it for sessions unless --session-gb is set",
                gb(self.headroom()),
                if why.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", why.join("; "))
                }
            )?;
        }
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
    use buffers::window_capacity;

    /// Released K3 (spec §1.2, §5.1) at an 8,192-position maximum context and 256 MiB scratch.
    pub(super) fn k3() -> Census {
        let trunk_layers: Vec<u64> = (0..93)
            .map(|l| match l {
                0 => 2_341_213_184,
                91 | 92 => 844_335_616,
                l if (l + 1) % 4 == 0 => 844_335_616,
                _ => 1_267_744_256,
            })
            .collect();
        Census {
            // The small vectors (tens of KB a layer) not subtracted: exact figures come from a
            // layout (checkpoint::census tests).
            trunk_matrix_bytes: trunk_layers.clone(),
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
            // The dense layer's down_proj row (33,792 BF16 values); MLA's kv_b_proj, 96 heads ×
            // 256 rows × 512 BF16 values.
            trunk_row_bytes: 67_584,
            gather_bytes: 25_165_824,
        }
    }

    /// The whole-layer ring the first plans used, for the tests of its rules.
    const RING: StreamScheme = StreamScheme::Ring { slots: 2 };

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
        let p = Plan::new(&c, Budget::preset(Preset::Laptop), RING).unwrap();
        assert!(p.total() <= p.budget);
        // Largest first: layer 0 (2.34 GB), then KDA+MoE layers in index order while they fit
        // beside two 1.27 GB ring slots, then a smaller MLA+MoE layer (3) that still fits.
        assert_eq!(p.pinned_layers, vec![0, 1, 3]);
        assert_eq!(p.stream_bytes, 2 * window_capacity(1_267_744_256).unwrap());
        // The chunk stream needs 0.30 GB instead of 2.54 and pins one layer more.
        let chunks = Plan::new(
            &c,
            Budget::preset(Preset::Laptop),
            StreamScheme::default_chunks(),
        );
        let chunks = chunks.unwrap();
        println!("{chunks}");
        assert_eq!(chunks.pinned_layers, vec![0, 1, 2, 4]);
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
        let p = Plan::new(&c, Budget::preset(Preset::Server), RING).unwrap();
        assert_eq!(p.pinned_layers.len(), 93);
        assert_eq!(p.reads.trunk, 0);
        assert_eq!(p.stream_bytes, 0);
        assert_eq!(p.lm_head, Residency::Resident);
        // ~24.5 GB left after trunk and head is below one token's experts (25.8 GB): the minimum
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
        let p = Plan::new(&c, off, RING).unwrap();
        assert_eq!((p.lookahead_slots, p.cache_slots), (0, 17));
    }

    #[test]
    fn lookahead_covers_every_sequence_of_a_batch_when_it_fits() {
        let mut c = k3();
        c.sequences = 4;
        let p = Plan::new(&c, Budget::preset(Preset::Server), RING).unwrap();
        assert_eq!((p.lookahead_slots, p.cache_slots), (64, 17 + 64));
        // A budget with room for one sequence's slots only gets those (the embedding, resident
        // only when memory is left over, streams at both).
        let one = p.total() - c.embedding_bytes - 40 * p.cache_slot_bytes;
        let b = Budget {
            ram: Some(one),
            ..Budget::default()
        };
        let p = Plan::new(&c, b, RING).unwrap();
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
            let across = Budget {
                dense_lookahead: DenseLookahead::Input,
                ..Budget::preset(preset)
            };
            let p = Plan::new(&c, across, RING).unwrap();
            assert_eq!(p.lookahead_slots, 0, "{preset:?}: {p}");
            assert_eq!(p.dense_lookahead, DenseLookahead::Off, "{preset:?}: {p}");
        }
    }

    #[test]
    fn dense_lookahead_rides_on_granted_lookahead_slots() {
        let c = k3();
        for dense in [DenseLookahead::Input, DenseLookahead::MlpInput] {
            let b = Budget {
                dense_lookahead: dense,
                ..Budget::preset(Preset::Server)
            };
            let p = Plan::new(&c, b, RING).unwrap();
            assert_eq!((p.lookahead_slots, p.dense_lookahead), (16, dense));
            assert!(p.to_string().contains(dense.name()), "{p}");
            let off = Budget {
                lookahead: Lookahead::Off,
                ..b
            };
            let p = Plan::new(&c, off, RING).unwrap();
            assert_eq!(
                (p.lookahead_slots, p.dense_lookahead),
                (0, DenseLookahead::Off)
            );
        }
        for name in ["off", "input", "mlp-input"] {
            assert_eq!(
                name.parse::<DenseLookahead>().map(DenseLookahead::name),
                Ok(name)
            );
        }
        assert_eq!(
            "mlp".parse::<DenseLookahead>(),
            Err(PlanError::UnknownDenseLookahead("mlp".into()))
        );
    }

    #[test]
    fn workstation_pins_most_and_larger_budgets_grow_the_cache() {
        let c = k3();
        let w = Plan::new(&c, Budget::preset(Preset::Workstation), RING);
        let w = w.unwrap();
        assert!(w.pinned_layers.len() > 70 && w.pinned_layers.len() < 93);
        assert!(w.pinned_layers.contains(&0));
        let big = Budget {
            ram: Some(256 * GIB),
            ..Budget::default()
        };
        let b = Plan::new(&c, big, RING).unwrap();
        assert!(b.cache_slots > 17 + 5000);
        assert!(b.reads.experts < c.expert_bytes_per_token());
        assert!(b.total() <= b.budget && b.headroom() < b.cache_slot_bytes + c.embedding_bytes);
    }

    #[test]
    fn max_holds_everything() {
        let c = k3();
        let p = Plan::new(&c, Budget::preset(Preset::Max), RING).unwrap();
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
        let e = Plan::new(&c, b, RING).unwrap_err();
        let PlanError::BudgetTooSmall { needed, budget } = e else {
            panic!("{e}");
        };
        assert_eq!(budget, GIB);
        let min = c.state_bytes
            + c.scratch_bytes
            + 43_008
            + 17 * 17_551_360
            + 2 * window_capacity(2_341_213_184).unwrap()
            + window_capacity(14_336).unwrap();
        assert_eq!(needed, min);
        assert!(
            Plan::new(
                &c,
                Budget {
                    ram: Some(min),
                    ..b
                },
                RING
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
        assert_eq!(p.stream_bytes, 3 * window_capacity(1_267_744_256).unwrap());
    }

    #[test]
    fn spare_budget_reads_further_ahead_while_trunk_streams() {
        let c = k3();
        let laptop = Budget::preset(Preset::Laptop);
        let chunks = StreamScheme::default_chunks();
        let p = Plan::new(&c, laptop, chunks).unwrap();
        let StreamScheme::Chunks { chunk, in_flight } = p.scheme else {
            panic!("{p}")
        };
        // Rule 5: the 0.61 GB left after pinning buys 18 more 32 MiB buffers than the default
        // 8, within the cap of one streamed layer's matrices (1.27 GB) and the budget.
        assert_eq!((chunk, in_flight), (32 << 20, 26), "{p}");
        assert!(p.total() <= p.budget && p.headroom() < chunk, "{p}");
        assert!(p.to_string().contains("26 read ahead, 832.0 MiB"), "{p}");
        // The same pinning and cache either way: read-ahead takes only what they left.
        let none = Budget {
            read_ahead: Some(0),
            ..laptop
        };
        let q = Plan::new(&c, none, chunks).unwrap();
        assert_eq!(q.scheme, chunks);
        assert_eq!(
            (&q.pinned_layers, q.cache_slots),
            (&p.pinned_layers, p.cache_slots)
        );
        assert_eq!(q.headroom() - p.headroom(), 18 * chunk);
        // A cap below the default's reach (0, above) never shrinks the stream; one above it
        // takes whole buffers up to it.
        let capped = |gib: u64| Budget {
            read_ahead: Some(gib * GIB / 2),
            ..laptop
        };
        let half = Plan::new(&c, capped(1), chunks).unwrap();
        assert_eq!(
            half.scheme,
            StreamScheme::Chunks {
                chunk,
                in_flight: 16
            }
        );
        // Nothing streams at max, and a ring is a ring: no buffers added.
        let max = Plan::new(&c, Budget::default(), chunks).unwrap();
        assert_eq!(max.scheme, chunks);
        let ring = Plan::new(&c, laptop, RING).unwrap();
        assert_eq!(ring.scheme, RING);
    }

    #[test]
    fn spare_budget_pins_first_then_grows_the_cache_once_a_token_of_experts_fits() {
        let c = tiny();
        let base = 30_100 + 3 * 12_288;
        // Every layer pinned and lm_head resident, the embedding still one row's window.
        let pinned = base + 900_000 + 60_000 + 8192;
        let b = |ram| Budget {
            ram: Some(ram),
            ..Budget::default()
        };
        let off = |ram| Budget {
            lookahead: Lookahead::Off,
            ..b(ram)
        };
        // One token routes 2 experts in each of 3 MoE layers: 6 slots of 12,288 B.
        let token = 6 * 12_288;
        let p = Plan::new(&c, off(pinned + token - 1), TINY_SCHEME).unwrap();
        assert_eq!((p.pinned_layers.len(), p.cache_slots), (4, 3));
        assert_eq!(p.cache_threshold, token);
        // The embedding (50,000 B instead of the 8,192 B window) takes what the cache did not.
        assert_eq!(p.embedding, Residency::Resident);
        assert_eq!(p.headroom(), token - 1 - (50_000 - 8192));
        let text = p.to_string();
        assert!(
            text.contains("spare") && text.contains("one token's experts"),
            "{text}"
        );
        // One byte more and the cache takes everything left, in whole slots, before the
        // embedding.
        let p = Plan::new(&c, off(pinned + token), TINY_SCHEME).unwrap();
        assert_eq!((p.cache_slots, p.embedding), (3 + 6, Residency::Streamed));
        assert_eq!(p.headroom(), 0);
        assert!(!p.to_string().contains("spare"));
        // Not enough for every layer: pinning first, then lm_head (60,000 B) out of the token's
        // worth left over, so the cache stays at its minimum.
        let ram = base + 4 * 8192 + 8192 + 700_000 + token;
        let p = Plan::new(&c, off(ram), TINY_SCHEME).unwrap();
        assert_eq!(p.pinned_layers, vec![0, 1, 3]);
        assert_eq!((p.lm_head, p.cache_slots), (Residency::Resident, 3));
        assert!(p.to_string().contains("another layer needs"), "{p}");
    }

    fn tiny() -> Census {
        Census {
            trunk_layers: vec![100_000, 300_000, 200_000, 300_000],
            trunk_matrix_bytes: vec![100_000, 300_000, 200_000, 300_000],
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
            trunk_row_bytes: 1000,
            gather_bytes: 0,
        }
    }

    /// The smallest chunks tiny's 1000-byte rows allow: a row plus a page.
    const TINY_SCHEME: StreamScheme = StreamScheme::Chunks {
        chunk: 8192,
        in_flight: 3,
    };

    #[test]
    fn tiny_pins_largest_first_and_skips_what_does_not_fit() {
        let c = tiny();
        // Fixed: 30,100 + 3 slots × 12,288 + 4 chunks × 8192 + row window 8192 = 107,924.
        let fixed = 30_100 + 3 * 12_288 + 4 * 8192 + 8192;
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
}
