//! The plan's rules (the module doc's list), one step each, applied in order by [`Plan::new`]
//! to a [`Choices`] that starts at the minimum: [`Costs::check_minimum`] (rule 1),
//! [`Costs::pin_trunk`] (rule 2), [`Costs::resident_lm_head`] (rule 3), [`Costs::lookahead`]
//! (rule 4), [`Costs::read_ahead`] (rule 5), then [`Costs::grow_cache`] and
//! [`Costs::resident_embedding`] with what is left (rule 3), and [`Costs::plan`] writes the
//! result down. Each step sees the budget and what the steps before it chose, and asks
//! [`Costs::needs`] what a choice would cost.

use super::buffers::{MAX_CHUNK, window_capacity};
use super::{
    Census, DenseLookahead, Lookahead, Plan, PlanError, ReadsPerToken, Residency, SessionPlan,
    StreamScheme, expert_reads,
};

/// What the plan has chosen so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Choices {
    /// `pinned[l]`: trunk layer `l` is resident.
    pub pinned: Vec<bool>,
    pub lm_head: Residency,
    pub embedding: Residency,
    /// Expert cache slots, the lookahead's included.
    pub cache_slots: usize,
    /// Of those, the slots for reads issued ahead of routing (rule 4).
    pub lookahead_slots: usize,
}

/// What choices cost for one model and stream scheme.
pub(super) struct Costs<'c> {
    census: &'c Census,
    /// The stream scheme as fitted to the model, before rule 5 adds read-ahead to it.
    scheme: StreamScheme,
    /// The fixed costs: conversation state, scratch and the model vectors.
    base: u64,
    /// One embedding row's read window (a streamed embedding).
    row_window: u64,
    /// The largest piece of a streamed lm_head.
    lm_piece: u64,
    /// Bytes of one expert cache slot.
    slot: u64,
}

impl<'c> Costs<'c> {
    pub fn new(census: &'c Census, scheme: StreamScheme) -> Costs<'c> {
        Costs {
            census,
            scheme,
            base: census.state_bytes + census.scratch_bytes + census.model_vectors_bytes,
            row_window: window_capacity(census.embedding_row_bytes).unwrap_or(u64::MAX),
            lm_piece: census.lm_head_bytes.min(MAX_CHUNK as u64),
            slot: census.expert_slot_bytes(),
        }
    }

    /// The fewest cache slots a MoE model runs with: one layer's reads in flight plus one.
    pub fn min_slots(&self) -> usize {
        if self.census.moe_layers > 0 {
            self.census.top_k + 1
        } else {
            0
        }
    }

    /// Rule 1's choices: nothing resident, the cache at its minimum or at the slots `cache`
    /// bytes hold (`--cache-gb`: never below the minimum, even for a model whose pool is
    /// smaller than top-k + 1).
    pub fn minimum(&self, cache: Option<u64>) -> Choices {
        let min_slots = self.min_slots();
        Choices {
            pinned: vec![false; self.census.trunk_layers.len()],
            lm_head: Residency::Streamed,
            embedding: Residency::Streamed,
            cache_slots: match cache {
                Some(c) => ((c / self.slot) as usize)
                    .min(self.census.pool())
                    .max(min_slots),
                None => min_slots,
            },
            lookahead_slots: 0,
        }
    }

    /// The largest run that streams under `c` (0: nothing streams).
    pub fn largest_streamed(&self, c: &Choices) -> u64 {
        let census = self.census;
        let trunk = census
            .trunk_layers
            .iter()
            .zip(&c.pinned)
            .filter(|(_, p)| !**p);
        trunk
            .map(|(b, _)| *b)
            .chain((c.lm_head == Residency::Streamed).then_some(self.lm_piece))
            .max()
            .unwrap_or(0)
    }

    /// Bytes the plan allocates with choices `c` (read-ahead aside).
    pub fn needs(&self, c: &Choices) -> u64 {
        let census = self.census;
        let pinned: u64 = census
            .trunk_layers
            .iter()
            .zip(&c.pinned)
            .filter(|(_, p)| **p)
            .map(|(b, _)| *b)
            .sum();
        let lm_head = match c.lm_head {
            Residency::Resident => census.lm_head_bytes,
            Residency::Streamed => 0,
        };
        let embedding = match c.embedding {
            Residency::Resident => census.embedding_bytes,
            Residency::Streamed => self.row_window,
        };
        self.base
            + pinned
            + self
                .scheme
                .bytes(self.largest_streamed(c), census.gather_bytes)
            + lm_head
            + embedding
            + c.cache_slots as u64 * self.slot
    }

    /// Rule 1: a budget below the minimum is refused with both numbers.
    pub fn check_minimum(&self, c: &Choices, ram: u64) -> Result<(), PlanError> {
        let needed = self.needs(c);
        if ram < needed {
            return Err(PlanError::BudgetTooSmall {
                needed,
                budget: ram,
            });
        }
        Ok(())
    }

    /// Rule 2: pins trunk layers largest first (ties by index) while they fit in `ram`,
    /// skipping any that would take the pinned bytes past `cap` (`--trunk-gb`).
    pub fn pin_trunk(&self, c: &mut Choices, ram: u64, cap: u64) {
        let sizes = &self.census.trunk_layers;
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        order.sort_by_key(|&l| (std::cmp::Reverse(sizes[l]), l));
        let mut pinned = 0u64;
        for l in order {
            if pinned + sizes[l] > cap {
                continue;
            }
            c.pinned[l] = true;
            if self.needs(c) <= ram {
                pinned += sizes[l];
            } else {
                c.pinned[l] = false;
            }
        }
    }

    /// Rule 3, first: lm_head is resident if it fits.
    pub fn resident_lm_head(&self, c: &mut Choices, ram: u64) {
        let resident = Choices {
            lm_head: Residency::Resident,
            ..c.clone()
        };
        if self.needs(&resident) <= ram {
            *c = resident;
        }
    }

    /// Rule 4: when nothing streams (and `lookahead` is on, the model has MoE layers and the
    /// cache does not already hold the pool), top-k more slots per sequence a pass decodes, or
    /// if those do not fit for one, for reads issued ahead of routing.
    pub fn lookahead(&self, c: &mut Choices, ram: u64, lookahead: Lookahead) {
        let census = self.census;
        let wanted = lookahead == Lookahead::Auto
            && census.moe_layers > 0
            && self.largest_streamed(c) == 0
            && c.cache_slots < census.pool();
        if !wanted {
            return;
        }
        let per_batch = census.sequences.max(1).saturating_mul(census.top_k);
        let fits = |slots: usize| {
            let more = Choices {
                cache_slots: c.cache_slots + slots,
                ..c.clone()
            };
            self.needs(&more) <= ram
        };
        if let Some(slots) = [per_batch, census.top_k].into_iter().find(|&s| fits(s)) {
            c.cache_slots += slots;
            c.lookahead_slots = slots;
        }
    }

    /// Rule 5: while trunk streams through chunks, what is left of `ram` buys read-ahead up to
    /// `cap` (`--read-ahead-gb`; by default the largest streamed layer's matrices). Returns the
    /// scheme with its read-ahead, and the bytes that added.
    pub fn read_ahead(&self, c: &Choices, ram: u64, cap: Option<u64>) -> (StreamScheme, u64) {
        let census = self.census;
        let streamed_matrices = (0..c.pinned.len())
            .filter(|&l| !c.pinned[l])
            .map(|l| census.trunk_matrix_bytes[l])
            .max()
            .unwrap_or(0);
        let left = ram - self.needs(c);
        self.scheme.read_ahead(
            left,
            cap.unwrap_or(streamed_matrices),
            self.largest_streamed(c),
        )
    }

    /// Rule 3, then: without `--cache-gb` (`sized`), the cache grows into what is left of
    /// `ram` (read-ahead already taken from it), up to the whole pool, but only if that holds
    /// at least one token's routed experts.
    pub fn grow_cache(&self, c: &mut Choices, ram: u64, sized: bool) {
        let left = ram - self.needs(c);
        let token = self.census.token_expert_slots() as u64 * self.slot;
        if !sized && left >= token {
            c.cache_slots = (c.cache_slots + (left / self.slot) as usize)
                .min(self.census.pool())
                .max(c.cache_slots);
        }
    }

    /// Rule 3, last: the embedding is resident only when memory would otherwise go unused.
    pub fn resident_embedding(&self, c: &mut Choices, ram: u64) {
        let resident = Choices {
            embedding: Residency::Resident,
            ..c.clone()
        };
        if self.needs(&resident) <= ram {
            *c = resident;
        }
    }

    /// The plan of choices `c` under budget `ram`, streaming through `scheme` (with its
    /// read-ahead); the dense lookahead only where lookahead slots were granted.
    pub fn plan(
        &self,
        c: Choices,
        ram: u64,
        scheme: StreamScheme,
        dense_lookahead: DenseLookahead,
    ) -> Plan {
        let census = self.census;
        let layers = c.pinned.len();
        let streamed = || (0..layers).filter(|&l| !c.pinned[l]);
        let min_slots = self.min_slots();
        Plan {
            budget: ram,
            pinned_layers: (0..layers).filter(|&l| c.pinned[l]).collect(),
            pinned_trunk_bytes: (0..layers)
                .filter(|&l| c.pinned[l])
                .map(|l| census.trunk_layers[l])
                .sum(),
            layer_count: layers,
            scheme,
            stream_bytes: scheme.bytes(self.largest_streamed(&c), census.gather_bytes),
            lm_head: c.lm_head,
            lm_head_bytes: census.lm_head_bytes,
            embedding: c.embedding,
            embedding_bytes: match c.embedding {
                Residency::Resident => census.embedding_bytes,
                Residency::Streamed => self.row_window,
            },
            cache_slots: c.cache_slots,
            cache_min_slots: min_slots,
            lookahead_slots: c.lookahead_slots,
            dense_lookahead: if c.lookahead_slots > 0 {
                dense_lookahead
            } else {
                DenseLookahead::Off
            },
            cache_slot_bytes: self.slot,
            state_bytes: census.state_bytes,
            scratch_bytes: census.scratch_bytes,
            // Set by `Plan::for_model`, which sizes the passes.
            prefill_tokens: 0,
            prefill_bytes: 0,
            prefill_asked: 0,
            pass_cache_slots: 0,
            model_vectors_bytes: census.model_vectors_bytes,
            reads: ReadsPerToken {
                // A chunk stream reads a streamed layer's matrices; a ring its whole run.
                trunk: streamed()
                    .map(|l| match scheme {
                        StreamScheme::Chunks { .. } => census.trunk_matrix_bytes[l],
                        StreamScheme::Ring { .. } => census.trunk_layers[l],
                    })
                    .sum(),
                lm_head: match c.lm_head {
                    Residency::Resident => 0,
                    Residency::Streamed => census.lm_head_bytes,
                },
                embedding: match c.embedding {
                    Residency::Resident => 0,
                    Residency::Streamed => census.embedding_row_bytes,
                },
                // Lookahead slots only hold reads in flight: no retention.
                experts: expert_reads(census, c.cache_slots - c.lookahead_slots, min_slots),
            },
            smallest_streamed_layer: streamed()
                .map(|l| census.trunk_layers[l])
                .min()
                .unwrap_or(0),
            cache_threshold: census.token_expert_slots() as u64 * self.slot,
            // A daemon's reserve is set around the plan (`Plan::for_model`).
            sessions: SessionPlan::default(),
            pack: super::PackPlan::None,
        }
    }
}

#[cfg(test)]
mod tests {
    //! Each step alone, on a tiny census (4 trunk layers of 100–300 kB, 24 experts of 8 KiB in
    //! 12,288-byte slots, top-2 over 3 MoE layers, 8 KiB chunks with 3 in flight); `Plan::new`'s
    //! tests in `mod.rs` check the steps together.

    use super::*;

    fn tiny() -> Census {
        Census {
            trunk_layers: vec![100_000, 300_000, 200_000, 300_000],
            trunk_matrix_bytes: vec![90_000, 280_000, 190_000, 290_000],
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
            sequences: 2,
            trunk_row_bytes: 1000,
            gather_bytes: 0,
        }
    }

    const SCHEME: StreamScheme = StreamScheme::Chunks {
        chunk: 8192,
        in_flight: 3,
    };
    const SLOT: u64 = 12_288;
    /// State, scratch and vectors; 3 cache slots; 4 chunks; the embedding's row window.
    const FLOOR: u64 = 30_100 + 3 * SLOT + 4 * 8192 + 8192;

    #[test]
    fn the_minimum_costs_the_floor_and_a_cache_size_never_goes_below_it() {
        let census = tiny();
        let costs = Costs::new(&census, SCHEME);
        let floor = costs.minimum(None);
        assert_eq!((floor.cache_slots, costs.needs(&floor)), (3, FLOOR));
        assert_eq!(
            costs.minimum(Some(SLOT)).cache_slots,
            3,
            "top-k + 1 at least"
        );
        assert_eq!(costs.minimum(Some(10 * SLOT)).cache_slots, 10);
        assert_eq!(
            costs.minimum(Some(100 * SLOT)).cache_slots,
            24,
            "the pool at most"
        );
        assert!(costs.check_minimum(&floor, FLOOR).is_ok());
        assert_eq!(
            costs.check_minimum(&floor, FLOOR - 1),
            Err(PlanError::BudgetTooSmall {
                needed: FLOOR,
                budget: FLOOR - 1
            })
        );
    }

    #[test]
    fn the_trunk_is_pinned_largest_first_within_the_budget_and_the_cap() {
        let census = tiny();
        let costs = Costs::new(&census, SCHEME);
        let pinned = |ram, cap| {
            let mut c = costs.minimum(None);
            costs.pin_trunk(&mut c, ram, cap);
            (0..4).filter(|&l| c.pinned[l]).collect::<Vec<_>>()
        };
        // 300k + 300k fit, 200k does not, 100k still does.
        assert_eq!(pinned(FLOOR + 700_000, u64::MAX), [0, 1, 3]);
        assert_eq!(pinned(FLOOR + 650_000, u64::MAX), [1, 3]);
        assert_eq!(
            pinned(FLOOR + 700_000, 400_000),
            [0, 1],
            "the cap skips layer 3"
        );
        assert_eq!(pinned(FLOOR, u64::MAX), Vec::<usize>::new());
    }

    #[test]
    fn lookahead_slots_only_when_nothing_streams_per_sequence_else_for_one() {
        let census = tiny();
        let costs = Costs::new(&census, SCHEME);
        let all_resident = Choices {
            pinned: vec![true; 4],
            lm_head: Residency::Resident,
            ..costs.minimum(None)
        };
        let base = costs.needs(&all_resident);
        let granted = |c: &Choices, ram, lookahead| {
            let mut c = c.clone();
            costs.lookahead(&mut c, ram, lookahead);
            assert_eq!(c.cache_slots, 3 + c.lookahead_slots);
            c.lookahead_slots
        };
        // Two sequences × top-2, or top-2 when only that fits.
        assert_eq!(granted(&all_resident, base + 4 * SLOT, Lookahead::Auto), 4);
        assert_eq!(granted(&all_resident, base + 3 * SLOT, Lookahead::Auto), 2);
        assert_eq!(granted(&all_resident, base + SLOT, Lookahead::Auto), 0);
        assert_eq!(granted(&all_resident, base + 4 * SLOT, Lookahead::Off), 0);
        let streaming = Choices {
            lm_head: Residency::Streamed,
            ..all_resident.clone()
        };
        assert_eq!(granted(&streaming, base + 8 * SLOT, Lookahead::Auto), 0);
    }

    #[test]
    fn read_ahead_buys_chunks_up_to_the_largest_streamed_layers_matrices() {
        let census = tiny();
        let costs = Costs::new(&census, SCHEME);
        let mut c = costs.minimum(None);
        c.pinned = vec![true, true, false, true];
        let needs = costs.needs(&c);
        // Layer 2 streams: 190,000 bytes of matrices, 3 × 8192 read ahead already.
        let (scheme, added) = costs.read_ahead(&c, needs + (1 << 20), None);
        assert_eq!(
            scheme,
            StreamScheme::Chunks {
                chunk: 8192,
                in_flight: 23
            }
        );
        assert_eq!(added, 20 * 8192);
        let (_, capped) = costs.read_ahead(&c, needs + (1 << 20), Some(5 * 8192));
        assert_eq!(capped, 2 * 8192, "--read-ahead-gb caps it");
        let (_, poor) = costs.read_ahead(&c, needs + 8192, None);
        assert_eq!(poor, 8192, "no more than is left");
    }

    #[test]
    fn the_cache_grows_only_by_at_least_one_tokens_experts_and_the_embedding_last() {
        let census = tiny();
        let costs = Costs::new(&census, SCHEME);
        let floor = costs.minimum(None);
        let grown = |ram, sized| {
            let mut c = floor.clone();
            costs.grow_cache(&mut c, ram, sized);
            c.cache_slots
        };
        // One token's experts: 3 MoE layers × top-2 = 6 slots.
        assert_eq!(grown(FLOOR + 6 * SLOT - 1, false), 3);
        assert_eq!(grown(FLOOR + 6 * SLOT, false), 9);
        assert_eq!(
            grown(FLOOR + 6 * SLOT, true),
            3,
            "--cache-gb fixes the cache"
        );
        assert_eq!(grown(FLOOR + 100 * SLOT, false), 24, "at most the pool");
        let mut c = floor.clone();
        costs.resident_embedding(&mut c, FLOOR + 50_000 - 8192 - 1);
        assert_eq!(c.embedding, Residency::Streamed);
        costs.resident_embedding(&mut c, FLOOR + 50_000 - 8192);
        assert_eq!(c.embedding, Residency::Resident);
    }
}
