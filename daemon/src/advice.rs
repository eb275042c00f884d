//! Which `--ram-gb` to run a checkpoint with on this machine, and the decode speed to expect.
//!
//! The budget is planned by the engine's own memory planner ([`crate::store::plan`]), so the
//! advice pins exactly the trunk layers the engine would pin. The largest budget that leaves
//! [`headroom`] of the usable memory free is recommended, capped at what the model needs with
//! every byte resident (more would be unused). The speed estimate is the planner's disk bytes
//! per token divided by the measured read rate, which assumes compute overlaps the reads
//! (engine-lessons §1: decode floors "from drive bandwidth alone"); it is a floor, not a promise.

use serde::Serialize;

use crate::store::plan::{Budget, Census, GIB, Plan, PlanError, StreamScheme};

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
