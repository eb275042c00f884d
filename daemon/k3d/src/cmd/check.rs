//! `k3d check MODEL_DIR`: validate a checkpoint (config, every shard header, the layout
//! binding, the tokenizer files against `vocab_size`), say which accepted variants of the
//! released layout it uses, and print its byte census. Reads headers and tokenizer files only.

use std::path::PathBuf;

use k3_engine::checkpoint::config::MixerKind;
use k3_engine::checkpoint::layout::VariantGroup;
use k3_engine::checkpoint::{ByteCensus, Checkpoint};
use k3_engine::tokenizer::{ADDED_SLOTS, Tokenizer};

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
    let checkpoint = Checkpoint::open(&args.model_dir).map_err(CliError::from)?;
    // The tokenizer files are part of the checkpoint: malformed, or more ids than the
    // embedding has rows, is a checkpoint error (exit 3).
    let tokenizer = Tokenizer::load_for_vocab(&args.model_dir, checkpoint.config.vocab_size)
        .map_err(|e| CliError::new(Exit::Checkpoint, e))?;
    let tokens = TokenizerFigures::of(&tokenizer, checkpoint.config.vocab_size);
    let variants = checkpoint.layout.variant_groups();
    let fingerprint = checkpoint.fingerprint().map_err(CliError::from)?;
    if args.json {
        let json = json_report(&checkpoint, &fingerprint, &tokens, &variants)
            .map_err(|e| CliError::new(Exit::Failure, e))?;
        println!("{json}");
    } else {
        print!("{}", report(&checkpoint, &fingerprint, &tokens, &variants));
    }
    // The first hour (docs/running-k3.md): pull → verify → check → doctor → serve.
    eprintln!("next: k3d doctor {}", args.model_dir.display());
    Ok(())
}

/// What `check` says about the tokenizer.
struct TokenizerFigures {
    ids: usize,
    ranks: usize,
    /// Embedding rows no tokenizer id names (`vocab_size` − ids).
    padding_rows: usize,
}

impl TokenizerFigures {
    fn of(tokenizer: &Tokenizer, vocab_size: usize) -> Self {
        TokenizerFigures {
            ids: tokenizer.vocab_size(),
            ranks: tokenizer.rank_count(),
            padding_rows: vocab_size - tokenizer.vocab_size(),
        }
    }
}

/// The census, with the tokenizer figures and the accepted variants beside its fields.
fn json_report(
    ck: &Checkpoint,
    fingerprint: &str,
    tokens: &TokenizerFigures,
    variants: &[VariantGroup],
) -> serde_json::Result<String> {
    let mut json = serde_json::to_value(&ck.census)?;
    json["fingerprint"] = fingerprint.into();
    json["tokenizer"] = serde_json::json!({
        "ids": tokens.ids,
        "ranks": tokens.ranks,
        "added_slots": ADDED_SLOTS,
        "padding_rows": tokens.padding_rows,
    });
    json["accepted_variants"] = variants
        .iter()
        .map(|g| {
            serde_json::json!({
                "release_dtype": g.release.name(),
                "stored_dtype": g.stored.name(),
                "tensors": g.tensors,
                "example": g.example,
            })
        })
        .collect();
    serde_json::to_string_pretty(&json)
}

/// The variant lines of the report: what differs from the released layout and why it is safe.
fn variant_lines(tokens: &TokenizerFigures, variants: &[VariantGroup]) -> String {
    let mut out = String::new();
    for g in variants {
        out.push_str(&format!(
            "accepted variant: {} small vector(s) stored {} where the release stores {} \
             (widened exactly to f32; e.g. {})\n",
            g.tensors, g.stored, g.release, g.example
        ));
    }
    if tokens.padding_rows > 0 {
        out.push_str(&format!(
            "accepted variant: {} padding row(s) in the embedding and lm_head beyond the \
             tokenizer's {} ids (never produced by encoding)\n",
            tokens.padding_rows, tokens.ids
        ));
    }
    out
}

/// Exit 2 for a refused config.json, exit 3 for anything wrong with the files (exit.rs).
fn report(
    ck: &Checkpoint,
    fingerprint: &str,
    tokens: &TokenizerFigures,
    variants: &[VariantGroup],
) -> String {
    let c: &ByteCensus = &ck.census;
    let gb = |b: u64| format!("{b:>19} B  {:>10.3} GB", b as f64 / 1e9);
    let mut out = format!(
        "checkpoint {}: OK\n\
         fingerprint           {fingerprint}\n{}\
         tokenizer             {:>19}  ids ({} ranks + {} added slots; vocab_size {})\n\
         shards                {:>19}\n\
         layers                {:>19}  ({} KDA, {} MLA; {} dense, {} MoE)\n",
        ck.dir.display(),
        variant_lines(tokens, variants),
        tokens.ids,
        tokens.ranks,
        ADDED_SLOTS,
        ck.config.vocab_size,
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
