//! What the user asks of memory: the budget (`--ram-gb`, presets, trunk and cache caps), the
//! routing lookahead switch and how streamed weights pass through memory.

use super::buffers::{ALIGN, DEFAULT_CHUNK, DEFAULT_QUEUE_DEPTH, round_up, window_capacity};
use super::{GIB, PlanError};

/// How unpinned trunk (and a streamed lm_head) passes through memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum StreamScheme {
    /// Buffers of `chunk` bytes (a multiple of 4096) consumed in order as they land:
    /// `in_flight` reads plus the one being consumed; the forward pass applies each matrix by
    /// the row ranges they hold. The plan may shrink `chunk` for a small model
    /// (`StreamScheme::fitted`), never grow it.
    Chunks { chunk: u64, in_flight: usize },
    /// Whole runs in `slots` ≥ 2 slots, each sized for the largest streamed run.
    Ring { slots: usize },
}

/// The default is the chunk stream: a few hundred MiB instead of two whole layers, at the same
/// measured read bandwidth (plan module doc).
impl Default for StreamScheme {
    fn default() -> Self {
        Self::default_chunks()
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
    /// The scheme as the store will run it for a model whose streamed rows are at most
    /// `row_bytes` wide and whose largest streamable run is `largest` bytes: a chunk must hold
    /// one row in its payload (a chunk's payload is a page less than its size), and a model
    /// smaller than the chunks gets chunks of about `largest / (in_flight + 1)`, so a small
    /// model's layers still pass through many chunks and the stream never takes more memory
    /// than its largest run.
    pub(super) fn fitted(self, row_bytes: u64, largest: u64) -> Result<Self, PlanError> {
        match self {
            Self::Ring { slots } if slots < 2 => Err(PlanError::RingNeedsTwoSlots { slots }),
            Self::Chunks { chunk, in_flight } => {
                let least = window_capacity(row_bytes).unwrap_or(u64::MAX);
                if in_flight == 0 || !chunk.is_multiple_of(ALIGN as u64) || chunk < least {
                    return Err(PlanError::BadChunks {
                        chunk,
                        in_flight,
                        least,
                    });
                }
                let scaled = round_up(largest / (in_flight as u64 + 1)).unwrap_or(u64::MAX);
                Ok(Self::Chunks {
                    chunk: chunk.min(scaled.max(least)),
                    in_flight,
                })
            }
            s => Ok(s),
        }
    }

    /// Rule 5 (issue 17): a chunk stream reads ahead only as far as its buffers reach, and once
    /// they have all landed the drive idles until the forward pass frees one — through every
    /// pinned layer's compute. So the spare budget left after pinning (`spare`) buys more
    /// buffers, until the reads in flight cover `cap` bytes (the plan's default: the largest
    /// streamed layer's matrices, i.e. a whole layer read ahead). `largest` is the largest
    /// streamed run, as for [`Self::bytes`] (0: nothing streams). Returns the scheme and the
    /// bytes it added. A ring, or nothing streaming, is left as it is.
    pub(super) fn read_ahead(self, spare: u64, cap: u64, largest: u64) -> (Self, u64) {
        match self {
            Self::Chunks { chunk, in_flight } if largest > 0 && chunk > 0 => {
                let reach = in_flight as u64 * chunk;
                let extra = (cap.saturating_sub(reach).min(spare) / chunk) as usize;
                let in_flight = in_flight + extra;
                (Self::Chunks { chunk, in_flight }, extra as u64 * chunk)
            }
            s => (s, 0),
        }
    }

    /// Buffer bytes when `largest` is the largest streamed run (0: nothing streams); `gather`
    /// is the largest matrix a chunk-streamed forward needs whole ([`super::Census::gather_bytes`]).
    pub(super) fn bytes(self, largest: u64, gather: u64) -> u64 {
        if largest == 0 {
            return 0;
        }
        match self {
            Self::Chunks { chunk, in_flight } => (in_flight as u64 + 1) * chunk + gather,
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
/// ([`super::Plan::lookahead_slots`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lookahead {
    /// When the rules allow it (the default).
    #[default]
    Auto,
    /// Never (`--no-lookahead`: for comparisons).
    Off,
}

/// Whether the first MoE layer after a dense one is guessed across that dense layer (issue 16
/// item 4): its experts start reading while the dense layer computes, on its router applied to
/// the dense layer's input or its MLP's input, instead of while its own mixer computes. It
/// uses the same lookahead slots, so it applies only where [`Lookahead`] grants them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DenseLookahead {
    /// The MoE layer guesses before its own mixer, like every other (for comparisons).
    Off,
    /// From the dense layer's input, before its mixer: the default, as it named 96.5–96.9 % of
    /// layer 1's routing on the trained fixture model (`Model::read_across_dense`).
    #[default]
    Input,
    /// From the dense layer's MLP input, after its mixer.
    MlpInput,
}

impl DenseLookahead {
    /// The name `--dense-lookahead` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Input => "input",
            Self::MlpInput => "mlp-input",
        }
    }
}

impl std::str::FromStr for DenseLookahead {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self, PlanError> {
        [Self::Off, Self::Input, Self::MlpInput]
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| PlanError::UnknownDenseLookahead(s.into()))
    }
}

/// The user's budget: `--ram-gb` (GiB; `None` = max) and optional caps for trunk and cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Budget {
    pub ram: Option<u64>,
    pub trunk: Option<u64>,
    pub cache: Option<u64>,
    pub lookahead: Lookahead,
    pub dense_lookahead: DenseLookahead,
    /// Bytes a chunk stream may read ahead of the forward pass, spare budget permitting
    /// (`--read-ahead-gb`; `None`: the plan's rule 5, one streamed layer's matrices).
    pub read_ahead: Option<u64>,
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

/// `bytes` in GiB to four significant digits (at least two decimals): `0.01000`, `0.01058`,
/// `1.300`, `137.00`.
pub fn gib_figure(bytes: u64) -> String {
    let gib = bytes as f64 / GIB as f64;
    let magnitude = if gib > 0.0 {
        gib.log10().floor() as i32
    } else {
        0
    };
    let mut decimals = (3 - magnitude).clamp(2, 12);
    // 0.0099999 rounds to 0.010000: one digit fewer keeps it at four significant digits.
    let scale = 10f64.powi(decimals);
    if decimals > 2 && (gib * scale).round() / scale >= 10f64.powi(magnitude + 1) {
        decimals -= 1;
    }
    format!("{gib:.*}", decimals as usize)
}

/// The shortest GiB figure — two significant digits, at least one decimal — that
/// [`Budget::gib`] turns into at least `bytes`: what to pass as `--ram-gb` to hold them.
pub fn gib_to_ask(bytes: u64) -> String {
    let gib = bytes as f64 / GIB as f64;
    let magnitude = if gib > 0.0 {
        gib.log10().floor() as i32
    } else {
        0
    };
    let decimals = (1 - magnitude).clamp(1, 12);
    let scale = 10f64.powi(decimals);
    let mut units = (gib * scale).ceil();
    // The float round trip may land a byte short: one more unit then.
    while Budget::gib("--ram-gb", units / scale).is_ok_and(|b| b < bytes) {
        units += 1.0;
    }
    format!("{:.*}", decimals as usize, units / scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_read_apart_and_the_value_to_ask_holds_the_bytes() {
        // Issue 46.4: 10,737,418 and 11,358,848 bytes both printed as "0.01 GiB".
        assert_eq!(gib_figure(10_737_418), "0.01000");
        assert_eq!(gib_figure(11_358_848), "0.01058");
        assert_eq!(gib_figure(3 * GIB / 2), "1.500");
        assert_eq!(gib_figure(137 * GIB), "137.00");
        assert_eq!(gib_to_ask(11_358_848), "0.011");
        assert_eq!(gib_to_ask(1_395_864_371), "1.3");
        assert_eq!(gib_to_ask(1_395_864_372), "1.4");
        assert_eq!(gib_to_ask(8 * GIB), "8.0");
        assert_eq!(gib_to_ask(8 * GIB + 1), "8.1");
        assert_eq!(gib_to_ask(100 * GIB + 1), "100.1");
        for bytes in [
            1,
            4095,
            11_358_848,
            1_395_864_372,
            8 * GIB + 1,
            1_600_000_000_000,
        ] {
            let asked: f64 = gib_to_ask(bytes).parse().expect("a number");
            assert!(
                Budget::gib("--ram-gb", asked).expect("valid") >= bytes,
                "{bytes}"
            );
        }
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
