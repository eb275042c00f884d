//! The largest context a plan holds (issue 35 point 3): what a daemon's default
//! `--max-prompt-tokens` is derived from.
//!
//! Every active request holds a conversation state sized for the planned context, and by
//! default the daemon reserves as many again for the states it keeps between an agent's turns
//! ([`super::inputs::SessionReserve::Default`]). A context the budget cannot hold for all of
//! them would be a plan that quietly overspends, or one whose kept states are evicted at once
//! (an agent's next turn then prefills everything again). So the probe asks the plan itself:
//! the largest context, up to the model's, for which [`Plan::for_model`] succeeds with the
//! same inputs — and, when asked, with the whole default reserve kept
//! ([`Holds::StatesAndReserve`]).
//!
//! A larger context never needs less memory (a state grows with it and nothing else shrinks),
//! so the contexts that fit are the ones up to some largest: a binary search finds it in
//! about twenty plans, each computed from the layout alone (milliseconds).

use super::{Plan, PlanInputs};
use crate::checkpoint::config::ModelConfig;
use crate::checkpoint::layout::ModelLayout;

/// What a context must leave room for to count as held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    /// The active requests' states (the default session reserve may be cut to what is left).
    States,
    /// The active requests' states and the whole default session reserve (with an explicit
    /// `--session-gb` the reserve is exact whatever the context, so this is `States`).
    StatesAndReserve,
}

/// The largest context of at most `limit` positions whose plan, with `inputs` otherwise as
/// given, holds what `holds` asks; `None` if not even one position does (the budget is below
/// the model's floor).
pub fn largest_context(
    config: &ModelConfig,
    layout: &ModelLayout,
    inputs: &PlanInputs,
    limit: u64,
    holds: Holds,
) -> Option<u64> {
    let fits = |context: u64| {
        let inputs = PlanInputs {
            max_context: context,
            ..*inputs
        };
        match Plan::for_model(config, layout, &inputs) {
            Ok(plan) => {
                holds == Holds::States
                    || plan.sessions.explicit
                    || plan.sessions.reserved >= plan.sessions.wanted
            }
            Err(_) => false,
        }
    };
    if limit == 0 || !fits(1) {
        return None;
    }
    // fits(low) holds, fits(high + 1) does not (or high is the limit).
    let (mut low, mut high) = (1, limit);
    while low < high {
        let mid = low + (high - low).div_ceil(2);
        if fits(mid) {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    Some(low)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::census::released;
    use crate::checkpoint::layout::bind;
    use crate::plan::inputs::Serving;
    use crate::plan::{Budget, GIB};

    fn daemon(ram: Option<u64>) -> PlanInputs {
        PlanInputs {
            budget: Budget {
                ram,
                ..Budget::default()
            },
            ..PlanInputs::default()
        }
        .serving(Serving {
            max_active: 4,
            max_batch: 4,
            tokens_per_member: 512,
            speculate: 0,
            session_bytes: None,
        })
        .expect("serving inputs")
    }

    /// On the released model: the context found holds the active states and the whole
    /// reserve, one more position does not, and a larger budget holds a larger context; with
    /// no budget the model's whole context is held.
    #[test]
    fn the_largest_context_is_the_last_that_plans() {
        let config = released::config();
        let layout = bind(&config, &released::index(&config)).expect("binds");
        let limit = 1 << 20;
        let probe = |ram, holds| largest_context(&config, &layout, &daemon(ram), limit, holds);
        assert_eq!(probe(None, Holds::StatesAndReserve), Some(limit));
        let at = |ram: u64, context: u64| {
            Plan::for_model(
                &config,
                &layout,
                &PlanInputs {
                    max_context: context,
                    ..daemon(Some(ram))
                },
            )
        };
        let mut found = Vec::new();
        for ram in [24 * GIB, 48 * GIB] {
            let context = probe(Some(ram), Holds::StatesAndReserve).expect("fits");
            assert!(context < limit, "{ram}: {context}");
            let plan = at(ram, context).expect("plans");
            assert_eq!(plan.sessions.reserved, plan.sessions.wanted);
            let over_holds = match at(ram, context + 1) {
                Ok(p) => p.sessions.reserved >= p.sessions.wanted,
                Err(_) => false,
            };
            assert!(
                !over_holds,
                "one more position still holds the reserve at {ram}"
            );
            // Without the reserve whole, the active states alone hold more.
            assert!(probe(Some(ram), Holds::States).expect("fits") > context);
            found.push(context);
        }
        assert!(found[1] > found[0], "{found:?}");
        assert_eq!(
            probe(Some(GIB / 1024), Holds::States),
            None,
            "below the floor"
        );
    }
}
