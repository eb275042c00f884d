//! Which `--ram-gb` to run a checkpoint with on this machine, and the decode speed to expect.
//!
//! The budget is planned by the engine's own memory planner ([`crate::plan`]), so the
//! advice pins exactly the trunk layers the engine would pin. The largest budget that leaves
//! [`headroom`] of the usable memory free is recommended, capped at what the model needs with
//! every byte resident (more would be unused). The speed estimate is the planner's disk bytes
//! per token divided by the measured read rate, which assumes compute overlaps the reads
//! (engine-lessons §1: decode floors "from drive bandwidth alone"); it is a floor, not a promise.

use serde::Serialize;

use crate::plan::{Budget, Census, GIB, Plan, PlanError, StreamScheme};

/// Memory left to the OS, other processes and allocator slack: a tenth of what is usable, and
/// at least 1 GiB (engine-lessons §8.1: plans understated peak RSS by up to 1.84 GB).
pub fn headroom(usable: u64) -> u64 {
    (usable / 10).max(GIB)
}

/// The recommendation for one machine and checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct Advice {
    /// Memory a new process may use (MemAvailable, or the cgroup's remaining limit).
    pub usable_bytes: u64,
    pub headroom_bytes: u64,
    /// The `--ram-gb` value to pass (GiB, one decimal, rounded so the plan fits).
    pub ram_gb: f64,
    pub budget_bytes: u64,
    /// The budget that holds every byte of the model (no reads at all after load).
    pub max_plan_bytes: u64,
    pub pinned_layers: usize,
    pub layers: usize,
    /// Disk bytes per decoded token at the recommended budget.
    pub read_bytes_per_token: u64,
    pub read_trunk_bytes: u64,
    pub read_expert_bytes: u64,
    pub read_lm_head_bytes: u64,
    /// `read_bytes_per_token / bandwidth`, if a bandwidth was given.
    pub seconds_per_token: Option<f64>,
}

/// Why no budget can be recommended.
#[derive(Debug, thiserror::Error)]
pub enum AdviceError {
    #[error(
        "this machine can give the model {usable} bytes ({:.2} GiB) after {headroom} bytes of \
         headroom, below the smallest plan for this model: {needed} bytes ({:.2} GiB)",
        *usable as f64 / GIB as f64, *needed as f64 / GIB as f64
    )]
    NotEnoughMemory {
        usable: u64,
        headroom: u64,
        needed: u64,
    },
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// GiB to one decimal, rounded down (a budget must not exceed what is free).
fn tenth_gib_floor(bytes: u64) -> f64 {
    (bytes as f64 * 10.0 / GIB as f64).floor() / 10.0
}

/// GiB to one decimal, rounded up (a budget must hold everything it is meant to hold).
fn tenth_gib_ceil(bytes: u64) -> f64 {
    (bytes as f64 * 10.0 / GIB as f64).ceil() / 10.0
}

/// The smallest budget the planner accepts for `census` (it reports it when refusing zero).
fn minimum(census: &Census, scheme: StreamScheme) -> u64 {
    let zero = Budget {
        ram: Some(0),
        ..Budget::default()
    };
    match Plan::new(census, zero, scheme) {
        Err(PlanError::BudgetTooSmall { needed, .. }) => needed,
        _ => 0,
    }
}

/// Plan the budget to recommend for `census` with `usable` bytes of memory, and the expected
/// seconds per token at `bandwidth` bytes/s.
pub fn advise(census: &Census, usable: u64, bandwidth: Option<f64>) -> Result<Advice, AdviceError> {
    let scheme = StreamScheme::default();
    let max = Plan::new(census, Budget::default(), scheme)?;
    let headroom = headroom(usable);
    let room = usable.saturating_sub(headroom);
    let ram_gb = if max.total() <= room {
        tenth_gib_ceil(max.total())
    } else {
        tenth_gib_floor(room)
    };
    let budget_bytes =
        Budget::gib("--ram-gb", ram_gb).map_err(|_| AdviceError::NotEnoughMemory {
            usable,
            headroom,
            needed: minimum(census, scheme),
        })?;
    let plan = Plan::new(
        census,
        Budget {
            ram: Some(budget_bytes),
            ..Budget::default()
        },
        scheme,
    )
    .map_err(|e| match e {
        PlanError::BudgetTooSmall { needed, .. } => AdviceError::NotEnoughMemory {
            usable,
            headroom,
            needed,
        },
        e => AdviceError::Plan(e),
    })?;
    let reads = plan.reads.total();
    Ok(Advice {
        usable_bytes: usable,
        headroom_bytes: headroom,
        ram_gb,
        budget_bytes,
        max_plan_bytes: max.total(),
        pinned_layers: plan.pinned_layers.len(),
        layers: plan.layer_count,
        read_bytes_per_token: reads,
        read_trunk_bytes: plan.reads.trunk,
        read_expert_bytes: plan.reads.experts,
        read_lm_head_bytes: plan.reads.lm_head,
        seconds_per_token: bandwidth.filter(|b| *b > 0.0).map(|b| reads as f64 / b),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten 1 GiB trunk layers, 2 MoE layers of 64 experts (top-4) of 16 MiB, small tables.
    fn census() -> Census {
        Census {
            trunk_layers: vec![GIB; 10],
            trunk_matrix_bytes: vec![GIB; 10],
            expert_bytes: 16 << 20,
            experts_per_layer: 64,
            moe_layers: 2,
            top_k: 4,
            embedding_bytes: 64 << 20,
            embedding_row_bytes: 4096,
            lm_head_bytes: 64 << 20,
            model_vectors_bytes: 4096,
            state_bytes: 1 << 20,
            scratch_bytes: 0,
            sequences: 1,
            trunk_row_bytes: 8192,
            gather_bytes: 0,
        }
    }

    #[test]
    fn plenty_of_memory_recommends_everything_resident() {
        let a = advise(&census(), 64 * GIB, Some(2e9)).unwrap();
        assert!(a.budget_bytes >= a.max_plan_bytes);
        assert!(
            a.budget_bytes - a.max_plan_bytes < GIB / 10 + 1,
            "rounded up to 0.1 GiB only"
        );
        // Every trunk layer pinned; what remains is the planner's expert estimate at that
        // budget (a cache beyond its minimum only when one token's experts fit in what is left).
        assert_eq!(
            (a.pinned_layers, a.read_trunk_bytes, a.read_lm_head_bytes),
            (10, 0, 0)
        );
        let plan = Plan::new(
            &census(),
            Budget {
                ram: Some(a.budget_bytes),
                ..Budget::default()
            },
            StreamScheme::default(),
        )
        .unwrap();
        assert_eq!(a.read_bytes_per_token, plan.reads.total());
        assert_eq!(a.seconds_per_token, Some(plan.reads.total() as f64 / 2e9));
    }

    #[test]
    fn tight_memory_recommends_usable_minus_headroom_and_predicts_from_reads() {
        let usable = 6 * GIB;
        let a = advise(&census(), usable, Some(1e9)).unwrap();
        assert_eq!(a.headroom_bytes, GIB);
        assert!(a.budget_bytes <= usable - GIB && a.budget_bytes > usable - GIB - GIB / 10);
        assert!(a.pinned_layers < 10 && a.pinned_layers > 0, "{a:?}");
        let s = a.seconds_per_token.unwrap();
        assert!((s - a.read_bytes_per_token as f64 / 1e9).abs() < 1e-12);
        assert!(a.read_trunk_bytes >= (10 - a.pinned_layers as u64) * GIB);
        assert!(
            advise(&census(), usable, None)
                .unwrap()
                .seconds_per_token
                .is_none()
        );
    }

    #[test]
    fn too_little_memory_names_the_minimum() {
        let e = advise(&census(), GIB, Some(1e9)).unwrap_err();
        match e {
            AdviceError::NotEnoughMemory { needed, .. } => assert!(needed > 0),
            other => panic!("{other}"),
        }
    }
}
