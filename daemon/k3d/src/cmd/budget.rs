//! The memory-budget flags shared by `k3d run` and `k3d serve` (issue 4): `--ram-gb X|preset`
//! and the plan overrides `--trunk-gb`, `--cache-gb`, `--no-lookahead`, `--dense-lookahead`,
//! `--read-ahead-gb`, `--prefill-tokens`, `--trunk-pack` (which `k3d bench` also takes, for every
//! budget it measures). Figures are GiB and may be fractional (tiny test models need budgets of
//! a few MiB).

use std::path::PathBuf;

use k3_engine::model::{LoadOptions, TrunkPack};
use k3_engine::plan::{Budget, DenseLookahead, Lookahead, PlanInputs, Preset};

use crate::exit::{CliError, Exit};

/// Overrides of the automatic plan, for experiments.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PlanArgs {
    /// Cap on pinned trunk, GiB.
    #[arg(long, value_name = "GIB")]
    trunk_gb: Option<f64>,
    /// Expert cache size, GiB.
    #[arg(long, value_name = "GIB")]
    cache_gb: Option<f64>,
    /// Never read experts ahead of routing on a predicted routing (for comparisons; the plan
    /// uses lookahead only when the whole trunk is resident). Output does not depend on it.
    #[arg(long)]
    no_lookahead: bool,
    /// Guess the first MoE layer's experts across the dense layer before it, from that
    /// layer's `input` (the default) or its `mlp-input`, or `off`: before its own mixer
    /// (issue 16; only where the plan grants lookahead). Output does not depend on it.
    #[arg(long, value_name = "FROM", default_value = "input")]
    dense_lookahead: DenseLookahead,
    /// How far a chunk-streamed trunk may be read ahead of the forward pass, GiB, spare budget
    /// permitting (default: one streamed layer's matrices). Output does not depend on it.
    #[arg(long, value_name = "GIB")]
    read_ahead_gb: Option<f64>,
    /// Prompt tokens one prefill pass feeds, reading every weight once for all of them: the
    /// plan holds their activations, or half as many until the budget allows (the plan says
    /// how many it holds); 0 = prompts fed in chunks of 32 (default 2048). Output does not
    /// depend on it.
    #[arg(long, value_name = "TOKENS")]
    pub prefill_tokens: Option<u64>,
    /// Read streamed trunk matrices from this trunk pack (`k3d pack`) where the plan measures
    /// that it pays: the decoder keeps up with the drive (the plan says which). Refused if it
    /// was packed from another checkpoint. Output does not depend on it.
    #[arg(long, value_name = "FILE")]
    trunk_pack: Option<PathBuf>,
    /// With --trunk-pack: read the pack wherever the chunk stream can, without the check that
    /// it pays (for measurements and tests).
    #[arg(long, requires = "trunk_pack")]
    trunk_pack_always: bool,
}

/// Prompt tokens of one prefill pass unless `--prefill-tokens` says otherwise (issue 30): an
/// editor's file context and most agent turns in one pass; ~1.6 GB of activations at K3's
/// widths (`plan::pass_bytes_per_token`), fewer tokens when the budget is tighter.
pub const DEFAULT_PREFILL_TOKENS: u64 = 2048;

impl PlanArgs {
    /// These flags as command-line arguments (to hand them to a child process).
    pub fn to_args(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(t) = self.trunk_gb {
            out.extend(["--trunk-gb".to_string(), t.to_string()]);
        }
        if let Some(c) = self.cache_gb {
            out.extend(["--cache-gb".to_string(), c.to_string()]);
        }
        if self.no_lookahead {
            out.push("--no-lookahead".to_string());
        }
        if let Some(r) = self.read_ahead_gb {
            out.extend(["--read-ahead-gb".to_string(), r.to_string()]);
        }
        if let Some(p) = self.prefill_tokens {
            out.extend(["--prefill-tokens".to_string(), p.to_string()]);
        }
        if let Some(p) = &self.trunk_pack {
            out.extend(["--trunk-pack".to_string(), p.display().to_string()]);
        }
        if self.trunk_pack_always {
            out.push("--trunk-pack-always".to_string());
        }
        if self.dense_lookahead != DenseLookahead::default() {
            out.extend([
                "--dense-lookahead".to_string(),
                self.dense_lookahead.name().to_string(),
            ]);
        }
        out
    }
}

#[derive(clap::Args, Debug, Clone, Default)]
pub struct BudgetArgs {
    /// RAM budget in GiB (fractional allowed) or a preset: laptop, desktop, workstation,
    /// server, max (default: max, everything resident).
    #[arg(long, value_name = "GIB|PRESET")]
    ram_gb: Option<String>,
    #[command(flatten)]
    plan: PlanArgs,
}

impl BudgetArgs {
    /// `--ram-gb ram` with `plan`'s overrides.
    pub fn new(ram: &str, plan: &PlanArgs) -> Self {
        BudgetArgs {
            ram_gb: Some(ram.to_string()),
            plan: plan.clone(),
        }
    }

    pub fn budget(&self) -> Result<Budget, CliError> {
        let usage = |e| CliError::new(Exit::Usage, e);
        let mut budget = match self.ram_gb.as_deref() {
            None => Budget::default(),
            Some(s) => match s.parse::<f64>() {
                Ok(v) => Budget {
                    ram: Some(Budget::gib("--ram-gb", v).map_err(usage)?),
                    ..Budget::default()
                },
                Err(_) => Budget::preset(s.parse::<Preset>().map_err(usage)?),
            },
        };
        if let Some(t) = self.plan.trunk_gb {
            budget.trunk = Some(Budget::gib("--trunk-gb", t).map_err(usage)?);
        }
        if let Some(c) = self.plan.cache_gb {
            budget.cache = Some(Budget::gib("--cache-gb", c).map_err(usage)?);
        }
        if self.plan.no_lookahead {
            budget.lookahead = Lookahead::Off;
        }
        budget.dense_lookahead = self.plan.dense_lookahead;
        if let Some(r) = self.plan.read_ahead_gb {
            budget.read_ahead = Some(Budget::gib("--read-ahead-gb", r).map_err(usage)?);
        }
        Ok(budget)
    }

    /// These flags, with any flag not given taken from a config file's values.
    pub fn or_from_file(
        &self,
        ram_gb: Option<String>,
        trunk_gb: Option<f64>,
        cache_gb: Option<f64>,
    ) -> Self {
        BudgetArgs {
            ram_gb: self.ram_gb.clone().or(ram_gb),
            plan: PlanArgs {
                trunk_gb: self.plan.trunk_gb.or(trunk_gb),
                cache_gb: self.plan.cache_gb.or(cache_gb),
                no_lookahead: self.plan.no_lookahead,
                dense_lookahead: self.plan.dense_lookahead,
                read_ahead_gb: self.plan.read_ahead_gb,
                prefill_tokens: self.plan.prefill_tokens,
                trunk_pack: self.plan.trunk_pack.clone(),
                trunk_pack_always: self.plan.trunk_pack_always,
            },
        }
    }

    /// Load options with this budget.
    pub fn load_options(&self) -> Result<LoadOptions, CliError> {
        Ok(LoadOptions {
            plan: PlanInputs {
                budget: self.budget()?,
                prefill_tokens: self.plan.prefill_tokens.unwrap_or(DEFAULT_PREFILL_TOKENS),
                ..PlanInputs::default()
            },
            trunk_pack: self.plan.trunk_pack.as_ref().map(|path| TrunkPack {
                path: path.clone(),
                always: self.plan.trunk_pack_always,
            }),
            ..LoadOptions::default()
        })
    }
}
