//! What the plan must hold at once besides the weights: the context every state is sized for,
//! the rows of one forward pass, the sequences held together, the drafts a speculative step
//! journals, and (for a daemon) the memory kept for sessions.
//!
//! A daemon keeps its callers' recent conversation states between their requests (sessions and
//! automatic prefix reuse), and an agent's next turn resends everything: without a state to
//! continue from, every turn prefills the whole conversation again — on K3, hours at 40,000
//! tokens. So by default the plan reserves, before any weight is placed, one conversation state
//! of the planned context per active request (the states the running requests hold are
//! reserved apart), as much of it as the budget holds beside the model's floor; the printed
//! plan says what it reserved. A GiB reserved there costs the decode at most a GiB of pinned
//! trunk (under 1 % of a K3 token's reads) and saves whole prefills (issue 34 point 5).

use super::{Budget, Census, PackPlan, Plan, PlanError, SessionPlan, StateShape, StreamScheme};
use crate::checkpoint::config::ModelConfig;
use crate::checkpoint::layout::ModelLayout;

/// The plan's inputs beyond the checkpoint. The default is the `max` budget (everything
/// resident) for one sequence of 4,096 positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanInputs {
    pub budget: Budget,
    pub scheme: StreamScheme,
    /// Positions of conversation state the plan reserves memory for.
    pub max_context: u64,
    /// Prompt tokens per forward the plan reserves scratch memory for (all rows of a batched
    /// pass).
    pub max_tokens_per_call: u64,
    /// Prompt tokens one layer-major prefill pass should feed (issue 30): the plan holds their
    /// activations, halving the count until the budget allows (down to none; see
    /// [`Plan::prefill_tokens`]). 0: no such passes, prompts are fed in calls of
    /// `max_tokens_per_call`.
    pub prefill_tokens: u64,
    /// Sequences whose states are held at once (a daemon's active requests, a batch's
    /// members): the plan reserves a full-context state for each.
    pub sequences: u64,
    /// Drafted ids per speculative step the plan reserves a rollback journal for, per sequence
    /// (0 = none: speculation is unavailable). The journal holds a copy of every KDA layer's
    /// state plus the recurrence inputs of the step's tokens — 465 MB and up per sequence at
    /// K3's sizes, so it is budgeted, never assumed. The engine clamps each request's
    /// `speculate` to this.
    pub speculate: u64,
    /// What a daemon keeps beside the model for sessions and kept conversation states.
    pub sessions: SessionReserve,
    /// A trunk pack will be offered to the store: reserve its decode buffer ([`PackPlan`]).
    pub trunk_pack: bool,
}

/// The budget a daemon keeps for sessions and kept conversation states (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SessionReserve {
    /// None: not a daemon (a one-shot run, a benchmark).
    #[default]
    None,
    /// Exactly this many bytes (`--session-gb`).
    Bytes(u64),
    /// One conversation state of the planned context per held sequence, as much of it as the
    /// budget holds beside the model's floor; the headroom adds to it.
    Default,
}

impl Default for PlanInputs {
    fn default() -> Self {
        PlanInputs {
            budget: Budget::default(),
            scheme: StreamScheme::default(),
            max_context: 4096,
            max_tokens_per_call: 32,
            prefill_tokens: 0,
            sequences: 1,
            speculate: 0,
            sessions: SessionReserve::None,
            trunk_pack: false,
        }
    }
}

/// What a serving daemon holds at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Serving {
    /// Requests computed at once, each with its own state (and journal).
    pub max_active: usize,
    /// Requests stepped together through one forward pass.
    pub max_batch: usize,
    /// Prompt tokens one member feeds per pass at most (the engine's prefill chunk).
    pub tokens_per_member: usize,
    /// Drafts per speculative step any request may get.
    pub speculate: usize,
    /// Bytes of the budget kept for in-memory sessions (`--session-gb`); the model is planned
    /// in the rest. `None`: the default reserve ([`SessionReserve::Default`]).
    pub session_bytes: Option<u64>,
}

impl PlanInputs {
    /// These inputs for a daemon: a batched pass carries up to one prefill chunk per member,
    /// every active request holds its own state and, with speculation, its rollback journal,
    /// and sessions count against the budget.
    pub fn serving(self, s: Serving) -> Result<Self, PlanError> {
        let sessions = match s.session_bytes {
            Some(bytes) => SessionReserve::Bytes(bytes),
            None => SessionReserve::Default,
        };
        if let (Some(ram), SessionReserve::Bytes(sessions)) = (self.budget.ram, sessions)
            && sessions >= ram
        {
            return Err(PlanError::SessionsTakeBudget { sessions, ram });
        }
        Ok(PlanInputs {
            max_tokens_per_call: s.tokens_per_member.saturating_mul(s.max_batch) as u64,
            sequences: s.max_active as u64,
            speculate: s.speculate as u64,
            sessions,
            ..self
        })
    }
}

impl Plan {
    /// The memory plan for loading `config`/`layout` with `inputs`, computed before anything is
    /// allocated.
    ///
    /// The prefill pass (issue 30) comes after everything decode reads with: the plan is first
    /// made without it — exactly the plan of a daemon feeding prompts in chunks, whose call
    /// scratch holds one chunk (`max_tokens_per_call`): that chunk is the pass's documented
    /// minimum, and costs nothing on top (a pass of a chunk or fewer tokens is not held). The pass then gets the most of the requested
    /// [`PlanInputs::prefill_tokens`] whose activations leave that plan's decode choices as they
    /// are (pinned trunk, lm_head, lookahead, the session reserve and the trunk pack:
    /// [`Plan::decodes_as`]); it grows only into what the stream's read-ahead beyond its
    /// minimum, the expert cache, the resident embedding and the spare would take. So a larger pass never makes a token
    /// read more trunk (at 6 GiB on `bench` a 2,048-token pass reserved first had unpinned
    /// two trunk layers: 3.49 → 5.58 GB read per decoded token). A smaller pass only means
    /// more passes, each reading the weights once; a budget below the floor is refused either
    /// way.
    pub fn for_model(
        config: &ModelConfig,
        layout: &ModelLayout,
        inputs: &PlanInputs,
    ) -> Result<Plan, PlanError> {
        let per_token = pass_bytes_per_token(config);
        let chunked = Plan {
            prefill_asked: inputs.prefill_tokens,
            ..Plan::with_scratch(config, layout, inputs, 0)?
        };
        // The largest pass whose plan decodes as the chunked one (more pass bytes only take
        // room from the choices made after decode's), by bisection over the tokens.
        let mut plan = chunked.clone();
        let (mut held, mut refused) = (0, inputs.prefill_tokens.saturating_add(1));
        while refused - held > 1 {
            let tokens = held + (refused - held) / 2;
            let pass = tokens.saturating_mul(per_token);
            match Plan::with_scratch(config, layout, inputs, pass) {
                Ok(with_pass) if with_pass.decodes_as(&chunked) => {
                    held = tokens;
                    plan = Plan {
                        prefill_tokens: tokens,
                        prefill_bytes: pass,
                        prefill_asked: inputs.prefill_tokens,
                        ..with_pass
                    };
                }
                Ok(_) | Err(PlanError::BudgetTooSmall { .. }) => refused = tokens,
                Err(e) => return Err(e),
            }
        }
        // A pass no longer than a chunk is fed as a chunk (`engine::passes`): hold none.
        if held <= inputs.max_tokens_per_call {
            return Ok(chunked);
        }
        let census = Census::from_layout(layout, config, inputs.max_context, 0)?;
        Ok(plan.lending_pass_to_cache(&chunked, &census))
    }

    /// `self` (a plan holding a pass) with the expert-cache slots the chunked plan `chunked`
    /// had and the pass took given back where they can be (issue 41.5): first from the spare
    /// (rule 3 leaves it unused when what is left beside the pass holds less than one token's
    /// experts), for good; then from the pass's own bytes, lent to the cache while no pass runs
    /// ([`Plan::pass_cache_slots`]). The cache the pass took them from is the one a short prompt
    /// and every decoded token use: on `bench` at 13 GiB a 2,048-token pass had cut it from 320
    /// slots (the whole pool) to 242 for every prompt. Rule 3 still holds (the cache grows beyond its minimum only
    /// by at least one token's experts), and what a decoded token reads is predicted with the
    /// idle cache.
    fn lending_pass_to_cache(mut self, chunked: &Plan, census: &Census) -> Plan {
        let slot = self.cache_slot_bytes.max(1);
        let whole = |bytes: u64| usize::try_from(bytes / slot).unwrap_or(usize::MAX);
        let taken = chunked.cache_slots.saturating_sub(self.cache_slots);
        let spare = taken.min(whole(self.headroom()));
        let loan = (taken - spare).min(whole(self.prefill_bytes));
        let at_minimum = self.cache_slots - self.lookahead_slots <= self.cache_min_slots;
        if at_minimum && spare + loan < census.token_expert_slots() {
            return self;
        }
        self.cache_slots += spare;
        self.pass_cache_slots = loan;
        self.reads.experts = super::expert_reads(
            census,
            self.idle_cache_slots() - self.lookahead_slots,
            self.cache_min_slots,
        );
        self
    }

    /// Whether a token decodes with the same reads under `self` as under `other`: the same
    /// trunk pinned, lm_head placed alike, the same lookahead, session reserve and trunk pack.
    /// The stream's read-ahead beyond its minimum (rule 5: how early reads start, not how
    /// many bytes), the expert cache beyond its minimum, the embedding's residency and the
    /// spare may differ: on K3 rule 5 takes every byte pinning leaves (up to a 1.2 GB layer),
    /// so a pass placed after it would never exist where the trunk streams.
    fn decodes_as(&self, other: &Plan) -> bool {
        self.pinned_layers == other.pinned_layers
            && self.lm_head == other.lm_head
            && self.lookahead_slots == other.lookahead_slots
            && self.dense_lookahead == other.dense_lookahead
            && self.sessions == other.sessions
            && self.pack == other.pack
    }

    /// The plan with `pass` bytes of prefill-pass activations on top of the call scratch.
    fn with_scratch(
        config: &ModelConfig,
        layout: &ModelLayout,
        inputs: &PlanInputs,
        pass: u64,
    ) -> Result<Plan, PlanError> {
        let mut census = Census::from_layout(
            layout,
            config,
            inputs.max_context,
            scratch_bytes(config, inputs.max_tokens_per_call).saturating_add(pass),
        )?;
        // Only a budget that streams can read a pack; `max` holds everything.
        let pack_buffer = match inputs.budget.ram {
            Some(_) if inputs.trunk_pack => PackPlan::reserve(census.fitted(inputs.scheme)?),
            _ => 0,
        };
        census.scratch_bytes = census.scratch_bytes.saturating_add(pack_buffer);
        let journal = match inputs.speculate {
            0 => 0,
            k => StateShape::of(config)
                .journal_bytes(1 + k)
                .ok_or_else(|| PlanError::BadCensus("speculation journal size overflows".into()))?,
        };
        census.state_bytes = census
            .state_bytes
            .saturating_add(journal)
            .saturating_mul(inputs.sequences.max(1));
        census.sequences = usize::try_from(inputs.sequences.max(1)).unwrap_or(usize::MAX);
        let one_state = StateShape::of(config)
            .bytes(inputs.max_context)
            .ok_or_else(|| PlanError::BadCensus("the state size overflows".into()))?;
        let (wanted, explicit) = match inputs.sessions {
            SessionReserve::None => (0, false),
            SessionReserve::Bytes(bytes) => (bytes, true),
            SessionReserve::Default => (one_state.saturating_mul(inputs.sequences.max(1)), false),
        };
        let plan_in = |reserved: u64| {
            let mut budget = inputs.budget;
            budget.ram = budget.ram.map(|ram| ram - reserved);
            let mut plan = Plan::new(&census, budget, inputs.scheme)?;
            // The budget printed and checked is the caller's: the model's part and the reserve.
            plan.budget += reserved;
            plan.sessions = SessionPlan {
                reserved,
                wanted: if explicit { 0 } else { wanted },
                explicit,
            };
            if inputs.trunk_pack {
                plan.pack = PackPlan::Reserved {
                    buffer: pack_buffer,
                };
            }
            Ok(plan)
        };
        match inputs.budget.ram {
            // `serving` refused an explicit reserve the budget cannot hold.
            Some(ram) if explicit && wanted >= ram => Err(PlanError::SessionsTakeBudget {
                sessions: wanted,
                ram,
            }),
            Some(ram) if !explicit => match plan_in(wanted.min(ram)) {
                // The default reserve takes only what the budget holds beside the model's floor.
                Err(PlanError::BudgetTooSmall { needed, .. }) if wanted > 0 => {
                    plan_in(ram.saturating_sub(needed).min(wanted))
                }
                planned => planned,
            },
            _ => plan_in(wanted),
        }
    }
}

/// f32 activations of one call of `t` tokens: the widest live set is a handful of `[t, width]`
/// buffers per op plus the logits; eight of the widest per token bounds it.
fn scratch_bytes(c: &ModelConfig, t: u64) -> u64 {
    let widest = [
        c.hidden_size,
        c.intermediate_size,
        c.num_shared_experts * c.moe_intermediate_size,
        c.num_attention_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim),
        c.kda.num_heads * c.kda.head_dim,
        c.num_experts,
    ]
    .into_iter()
    .max()
    .unwrap_or(0) as u64;
    t * 4 * (8 * widest + c.vocab_size as u64)
}

/// Bytes one prompt token of a layer-major prefill pass holds at the widest point of a layer
/// (issue 30), in f32 values of the forward pass (`model::forward` and the ops it calls):
///
/// * carried between layers: the running sum and every AttnRes snapshot the model banks
///   (⌈layers / block⌉ + 1 rows of `hidden`), and within a layer the partial sum, the AttnRes
///   mix, the normed input and the sub-layer's output (4 more);
/// * the widest sub-layer: KDA's q, k, v, gate and decay plus its head outputs by head and by
///   row (7 × heads·head_dim); MLA's queries, per-head outputs (twice) and gate; the dense
///   MLP's gate, up and activation (3 × intermediate); a MoE layer's latent input, router
///   logits, the top-k expert outputs kept for the ordered sum and their gathered copy
///   (2 × top-k × latent), the shared MLP (3 × its width);
/// * one matmul output's transposition copy of the widest matrix.
///
/// The last row's logits and the kernels' per-call workspaces are in the call scratch.
pub fn pass_bytes_per_token(c: &ModelConfig) -> u64 {
    let h = c.hidden_size;
    let carried = (c.num_hidden_layers.div_ceil(c.attn_res_block_size.max(1)) + 1) * h + 4 * h;
    let kda = 7 * c.kda.num_heads * c.kda.head_dim + c.kda.num_heads;
    let qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
    let mla = c.num_attention_heads * (qk + 3 * c.v_head_dim) + c.q_lora_rank + c.kv_lora_rank + qk;
    let dense = 3 * c.intermediate_size;
    let shared = c.num_shared_experts * c.moe_intermediate_size;
    let moe = 2 * c.routed_expert_hidden_size
        + c.num_experts
        + 2 * c.num_experts_per_token * c.routed_expert_hidden_size
        + 3 * shared;
    let widest_matrix = [
        c.intermediate_size,
        c.kda.num_heads * c.kda.head_dim,
        c.num_attention_heads * (qk + c.v_head_dim),
        shared,
        h,
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let layer = [kda, mla, dense, moe].into_iter().max().unwrap_or(0);
    4 * (carried + layer + widest_matrix) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::census::released;
    use crate::checkpoint::layout::bind;
    use crate::plan::GIB;

    fn daemon(ram: Option<u64>, session_bytes: Option<u64>) -> Result<PlanInputs, PlanError> {
        let base = PlanInputs {
            budget: Budget {
                ram,
                ..Budget::default()
            },
            ..PlanInputs::default()
        };
        base.serving(Serving {
            max_active: 4,
            max_batch: 2,
            tokens_per_member: 512,
            speculate: 3,
            session_bytes,
        })
    }

    /// The released model's plan for a daemon with `ram` and `session_bytes`.
    fn released_plan(ram: Option<u64>, session_bytes: Option<u64>) -> Result<Plan, PlanError> {
        let config = released::config();
        let layout = bind(&config, &released::index(&config)).expect("binds");
        Plan::for_model(&config, &layout, &daemon(ram, session_bytes)?)
    }

    /// One released state at the default 4,096 positions (spec §5.1).
    const ONE_STATE: u64 = 464_633_856 + 55_296 * 4096;

    /// The released model's plan for one sequence at `ram`, asking for a pass of `tokens`.
    fn released_pass(ram: Option<u64>, tokens: u64) -> Result<Plan, PlanError> {
        let config = released::config();
        let layout = bind(&config, &released::index(&config)).expect("binds");
        let inputs = PlanInputs {
            budget: Budget {
                ram,
                ..Budget::default()
            },
            prefill_tokens: tokens,
            ..PlanInputs::default()
        };
        Plan::for_model(&config, &layout, &inputs)
    }

    /// Issue 30's regression: a 2,048-token pass reserved before the trunk was pinned took
    /// pinned trunk at tight budgets (`bench` at 6 GiB: 3.49 → 5.58 GB read per decoded
    /// token). At every budget from the floor to everything resident, the plan with the pass
    /// must decode exactly as the plan without one — same trunk pinned, same reads per token,
    /// same lookahead — and the pass grows from nothing at the floor to what was asked, paid
    /// for by the read-ahead beyond its minimum, the expert cache and the spare.
    #[test]
    fn the_prefill_pass_never_takes_room_a_decoded_token_reads_with() {
        let per_token = pass_bytes_per_token(&released::config());
        let floor = match released_pass(Some(1), 2048) {
            Err(PlanError::BudgetTooSmall { needed, .. }) => needed,
            other => panic!("a 1-byte budget must be refused: {other:?}"),
        };
        let (mut cut, mut whole) = (0, 0);
        let budgets = (0..12u64).map(|i| Some(floor + i * 3 * GIB)).chain([None]);
        for ram in budgets {
            let chunked = released_pass(ram, 0).expect("plans");
            let plan = released_pass(ram, 2048).expect("plans");
            assert_eq!(plan.pinned_layers, chunked.pinned_layers, "{ram:?}\n{plan}");
            assert_eq!(plan.reads.trunk, chunked.reads.trunk, "{ram:?}");
            assert_eq!(plan.reads.lm_head, chunked.reads.lm_head, "{ram:?}");
            assert_eq!(plan.lm_head, chunked.lm_head, "{ram:?}");
            assert_eq!(plan.lookahead_slots, chunked.lookahead_slots, "{ram:?}");
            assert!(plan.prefill_tokens <= 2048);
            assert!(
                plan.prefill_tokens == 0 || plan.prefill_tokens > 32,
                "a pass of a chunk or fewer is not held"
            );
            assert_eq!(plan.prefill_bytes, plan.prefill_tokens * per_token);
            assert_eq!(plan.prefill_asked, 2048);
            assert_eq!(chunked.prefill_tokens, 0);
            if let Some(ram) = ram {
                assert!(plan.total() <= ram, "{plan}");
            }
            assert!(plan.cache_slots <= chunked.cache_slots, "the cache pays");
            match plan.prefill_tokens {
                0 => assert!(plan.to_string().contains("in chunks"), "{plan}"),
                2048 => whole += 1,
                _ => {
                    cut += 1;
                    assert!(plan.to_string().contains("2048 asked"), "{plan}");
                }
            }
        }
        assert_eq!(released_pass(Some(floor), 2048).unwrap().prefill_tokens, 0);
        assert!(cut > 0 && whole > 0, "cut {cut}, whole {whole}");
    }

    /// Issue 41.5, on the `bench` shape (`k3d synth --shape bench`: six released-size layers,
    /// 64 experts a MoE layer) at 13 GiB: the 2,048-token pass takes expert-cache slots, which
    /// the cache holds while no pass runs — as many as without a pass — and what the cache may
    /// hold and a pass may take never exceeds what the plan counts.
    #[test]
    fn the_pass_lends_its_bytes_to_the_expert_cache_while_no_pass_runs() {
        use crate::checkpoint::config::MixerKind::{Kda, Mla};
        let config = ModelConfig {
            num_hidden_layers: 6,
            layer_kinds: vec![Kda, Kda, Kda, Mla, Kda, Mla],
            attn_res_block_size: 3,
            num_experts: 64,
            // The vocabulary `k3d synth` learns for `bench` (its lm_head is 12.8 MB).
            vocab_size: 893,
            ..released::config()
        };
        let layout = bind(&config, &released::index(&config)).expect("binds");
        let plan = |tokens| {
            let inputs = PlanInputs {
                budget: Budget {
                    ram: Some(13 * GIB),
                    ..Budget::default()
                },
                prefill_tokens: tokens,
                ..PlanInputs::default()
            };
            Plan::for_model(&config, &layout, &inputs).expect("plans")
        };
        let (chunked, pass) = (plan(0), plan(2048));
        assert_eq!(pass.prefill_tokens, 2048, "{pass}");
        assert_eq!(chunked.cache_slots, 320, "the whole pool: {chunked}");
        assert!(
            pass.cache_slots < chunked.cache_slots,
            "the pass pays: {pass}"
        );
        assert_eq!(pass.idle_cache_slots(), chunked.cache_slots, "{pass}");
        assert_eq!(pass.reads.experts, chunked.reads.experts);
        assert!(pass.pass_cache_slots as u64 * pass.cache_slot_bytes <= pass.prefill_bytes);
        assert!(pass.total() <= 13 * GIB);
        assert!(
            pass.to_string()
                .contains("slots in the prefill pass's bytes"),
            "{pass}"
        );
        assert_eq!(chunked.pass_cache_slots, 0);
    }

    #[test]
    fn serving_reserves_every_active_request_and_the_batch_rows() {
        let i = daemon(Some(8 * GIB), Some(GIB)).unwrap();
        assert_eq!(i.max_tokens_per_call, 1024);
        assert_eq!(i.sequences, 4);
        assert_eq!(i.speculate, 3);
        assert_eq!(i.sessions, SessionReserve::Bytes(GIB));
        assert_eq!(
            daemon(None, None).unwrap().sessions,
            SessionReserve::Default
        );
    }

    #[test]
    fn sessions_that_take_the_whole_budget_are_refused() {
        assert_eq!(
            daemon(Some(GIB), Some(GIB)),
            Err(PlanError::SessionsTakeBudget {
                sessions: GIB,
                ram: GIB
            })
        );
    }

    /// Issue 34 point 5: `--ram-gb max` left 0 bytes for kept states, so no agent turn reused
    /// anything. By default the plan now reserves one state per active request at every
    /// budget that holds it, within the budget, and prints it.
    #[test]
    fn a_daemon_reserves_kept_states_by_default_within_its_budget() {
        let wanted = 4 * ONE_STATE;
        for ram in [Some(16 * GIB), Some(64 * GIB), None] {
            let plan = released_plan(ram, None).unwrap();
            assert_eq!(
                plan.sessions,
                SessionPlan {
                    reserved: wanted,
                    wanted,
                    explicit: false
                },
                "{ram:?}"
            );
            assert!(
                plan.total() + plan.sessions.reserved <= plan.budget,
                "{plan}"
            );
            assert_eq!(plan.session_allowance(), wanted + plan.headroom());
            if let Some(ram) = ram {
                assert_eq!(plan.budget, ram);
            }
            let text = plan.to_string();
            assert!(
                text.contains("sessions   2.57 GiB: kept conversation states"),
                "{text}"
            );
        }
        // The max budget holds everything and the reserve on top.
        let max = released_plan(None, None).unwrap();
        assert_eq!(max.budget, max.total() + wanted);
        assert_eq!(max.headroom(), 0);
    }

    #[test]
    fn the_default_reserve_is_cut_to_what_the_budget_holds_beside_the_model() {
        let floor = match released_plan(Some(1), None) {
            Err(PlanError::BudgetTooSmall { needed, .. }) => needed,
            other => panic!("a 1-byte budget must be refused: {other:?}"),
        };
        let plan = released_plan(Some(floor + GIB), None).unwrap();
        assert_eq!(plan.sessions.reserved, GIB);
        assert_eq!(plan.sessions.wanted, 4 * ONE_STATE);
        assert!(plan.pinned_layers.is_empty());
        assert!(plan.to_string().contains("cut to what the budget holds"));
        // At the floor nothing is left: the model plans, nothing is reserved.
        let bare = released_plan(Some(floor), None).unwrap();
        assert_eq!(bare.sessions.reserved, 0);
    }

    #[test]
    fn session_gb_reserves_exactly_what_it_says() {
        let plan = released_plan(Some(16 * GIB), Some(GIB)).unwrap();
        assert_eq!(
            plan.sessions,
            SessionPlan {
                reserved: GIB,
                wanted: 0,
                explicit: true
            }
        );
        assert_eq!(plan.session_allowance(), GIB);
        assert!(plan.total() + GIB <= 16 * GIB);
        let max = released_plan(None, Some(GIB)).unwrap();
        assert_eq!(max.budget, max.total() + GIB);
        assert!(max.to_string().contains("(--session-gb)"));
    }
}
