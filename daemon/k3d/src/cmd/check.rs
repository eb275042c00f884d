//! `k3d check MODEL_DIR`: validate a checkpoint (config, every shard header, the layout
//! binding) and print its byte census. Reads headers only.

use std::path::PathBuf;

use k3_engine::checkpoint::config::MixerKind;
use k3_engine::checkpoint::{Census, Checkpoint, CheckpointError};

use crate::exit::{CliError, CliResult, Exit};

#[derive(clap::Args)]
pub struct Args {
    /// The model directory: config.json and the *.safetensors shards.
    model_dir: PathBuf,
    /// Print the census as one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> CliResult {
    let checkpoint = Checkpoint::open(&args.model_dir).map_err(classify)?;
    if args.json {
        let json = serde_json::to_string_pretty(&checkpoint.census)
            .map_err(|e| CliError::new(Exit::Failure, e))?;
        println!("{json}");
    } else {
        print!("{}", report(&checkpoint));
    }
    Ok(())
}

/// Exit 2 for a refused config.json, exit 3 for anything wrong with the files (exit.rs).
fn classify(e: CheckpointError) -> CliError {
    let exit = if e.is_config() {
        Exit::Usage
    } else {
        Exit::Checkpoint
    };
    CliError::new(exit, e)
}

fn report(ck: &Checkpoint) -> String {
    let c: &Census = &ck.census;
    let gb = |b: u64| format!("{b:>19} B  {:>10.3} GB", b as f64 / 1e9);
    let mut out = format!(
        "checkpoint {}: OK\n\
         shards                {:>19}\n\
         layers                {:>19}  ({} KDA, {} MLA; {} dense, {} MoE)\n",
        ck.dir.display(),
        ck.shards.len(),
        c.layers,
        c.kda_layers,
        c.mla_layers,
        c.dense_layers,
        c.moe_layers,
    );
    let lines = [
        ("trunk (all layers)", c.trunk_bytes),
        ("one routed expert", c.expert_bytes),
        ("all routed experts", c.all_expert_bytes),
        ("embedding", c.embedding_bytes),
        ("lm_head", c.lm_head_bytes),
        ("model-level tensors", c.model_level_bytes),
        ("all text tensors", c.text_bytes),
        ("per decoded token", c.decode_token_bytes),
    ];
    for (label, bytes) in lines {
        out.push_str(&format!("{label:<22}{}\n", gb(bytes)));
    }
    out.push_str(&format!(
        "routed experts        {:>19}  ({} evaluated per token)\n",
        c.experts, c.experts_per_token
    ));
    out.push_str("trunk bytes per layer:\n");
    for (l, bytes) in c.trunk_bytes_per_layer.iter().enumerate() {
        let mixer = match ck.config.layer_kinds.get(l) {
            Some(MixerKind::Kda) => "KDA",
            Some(MixerKind::Mla) => "MLA",
            None => "?",
        };
        let ffn = if ck.config.is_moe_layer(l) {
            "MoE"
        } else {
            "dense"
        };
        out.push_str(&format!("  layer {l:>3} {mixer}+{ffn:<6}{}\n", gb(*bytes)));
    }
    out
}
