//! What the user asks of memory: the budget (`--ram-gb`, presets, trunk and cache caps), the
//! routing lookahead switch and how streamed weights pass through memory.

use super::buffers::{DEFAULT_CHUNK, DEFAULT_QUEUE_DEPTH, window_capacity};
use super::{GIB, PlanError};

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
    pub(super) fn validate(self) -> Result<Self, PlanError> {
        match self {
            Self::Ring { slots } if slots < 2 => Err(PlanError::RingNeedsTwoSlots { slots }),
            Self::Chunks { chunk, in_flight } if chunk < 4096 || in_flight == 0 => {
                Err(PlanError::BadChunks { chunk, in_flight })
            }
            s => Ok(s),
        }
    }

    /// Buffer bytes when `largest` is the largest streamed run (0: nothing streams).
    pub(super) fn bytes(self, largest: u64) -> u64 {
        if largest == 0 {
            return 0;
        }
        match self {
            Self::Chunks { chunk, in_flight } => (in_flight as u64 + 1) * chunk,
            Self::Ring { slots } => slots as u64 * window_capacity(largest).unwrap_or(u64::MAX / 4),
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

#[cfg(test)]
mod tests {
    use super::*;

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
