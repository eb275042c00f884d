//! `k3d run`: one offline greedy generation — the stable entry point of tests and benchmarks.
//!
//! `--dump-logits FILE` writes one little-endian f32 row of `vocab_size` logits per **fed**
//! position: the prompt, then every generated token fed back (so `prompt_len + gen − 1` rows;
//! row i predicts token i+1; `--gen 0` gives `prompt_len` rows).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use k3_engine::engine::{Engine, EngineOptions, GenerateRequest, Step};
use k3_engine::system::ProcessMemory;

use super::budget::BudgetArgs;
use crate::exit::{CliError, CliResult, Exit};

#[derive(clap::Args)]
pub struct Args {
    /// The checkpoint directory.
    model_dir: PathBuf,
    /// Prompt token ids, comma-separated (e.g. 1,2,3).
    #[arg(
        long,
        value_delimiter = ',',
        conflicts_with = "prompt",
        required_unless_present = "prompt"
    )]
    ids: Vec<u32>,
    /// Prompt text, tokenized with the checkpoint's tokenizer (no special tokens).
    #[arg(long)]
    prompt: Option<String>,
    /// Number of tokens to generate greedily.
    #[arg(long = "gen", id = "gen", default_value_t = 16)]
    generate: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Write every fed position's logits to FILE (little-endian f32 rows).
    #[arg(long, value_name = "FILE")]
    dump_logits: Option<PathBuf>,
    /// Compute threads (default: all cores). Output does not depend on it.
    #[arg(long, value_parser = super::threads)]
    threads: Option<usize>,
    /// Prompt tokens per prefill step. Output does not depend on it.
    #[arg(long, default_value_t = 32)]
    prefill_chunk: usize,
    /// Exact speculative decoding: verify at most N ids drafted from the context per decode
    /// step (0 = off, at most 16). Output does not depend on it; `--json` reports the
    /// acceptance.
    #[arg(long, default_value_t = 0)]
    speculate: usize,
    #[command(flatten)]
    budget: BudgetArgs,
}

pub fn run(args: Args) -> CliResult {
    let mut model = args.budget.load_options()?;
    // A speculative step feeds the last token and its drafts in one call.
    model.plan.max_tokens_per_call = args.prefill_chunk.max(1 + args.speculate) as u64;
    model.plan.speculate = args.speculate as u64;
    let mut options = EngineOptions {
        prefill_chunk: args.prefill_chunk,
        model,
        ..EngineOptions::default()
    };
    // The plan, before anything is allocated: printed, or the budget refused (exit 5).
    let checkpoint = k3_engine::checkpoint::Checkpoint::open(&args.model_dir)
        .map_err(|e| CliError::from(k3_engine::engine::EngineError::from(e)))?;
    let plan = k3_engine::plan::Plan::for_model(
        &checkpoint.config,
        &checkpoint.layout,
        &options.model.plan,
    )
    .map_err(|e| CliError::new(Exit::Resources, e))?;
    drop(checkpoint);
    eprintln!("{plan}");
    if let Some(t) = args.threads {
        options.threads = t;
    }
    let engine = Engine::open(&args.model_dir, options, &mut |_| {})?;
    let prompt = match &args.prompt {
        Some(text) => engine
            .tokenizer()
            .encode(text, k3_engine::tokenizer::Specials::Plain)
            .map_err(|e| CliError::new(Exit::Usage, e))?,
        None => args.ids.clone(),
    };
    let request = GenerateRequest {
        prompt: prompt.clone(),
        max_tokens: args.generate,
        record_logits: args.dump_logits.is_some(),
        speculate: args.speculate,
        ..GenerateRequest::default()
    };
    let mut generation = engine.start(request)?;
    let summary = loop {
        match engine.step(&mut generation, &|| false)? {
            Step::Finished(summary) => break summary,
            Step::Token { id } if !args.json => {
                let mut out = std::io::stdout().lock();
                let bytes = engine.tokenizer().token_bytes(id).unwrap_or_default();
                out.write_all(bytes).context("writing to stdout")?;
                out.flush().context("writing to stdout")?;
            }
            _ => {}
        }
    };
    if let Some(path) = &args.dump_logits {
        let bytes: Vec<u8> = summary
            .logits
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        std::fs::write(path, bytes)
            .with_context(|| format!("writing logits to {}", path.display()))
            .map_err(|e| CliError::new(Exit::Failure, e))?;
    }
    let decoded = summary.generated_tokens.saturating_sub(1);
    let seconds_per_token = if decoded > 0 {
        summary.decode_seconds / decoded as f64
    } else {
        summary.prefill_seconds / summary.prompt_tokens.max(1) as f64
    };
    let store = engine.model().store_stats();
    let plan = engine.model().plan();
    if args.json {
        let report = serde_json::json!({
            "prompt_ids": prompt,
            "generated_ids": summary.generated,
            "seconds_per_token": seconds_per_token,
            "prefill_seconds": summary.prefill_seconds,
            "decode_seconds": summary.decode_seconds,
            "peak_rss_bytes": ProcessMemory::now().peak_rss,
            "bytes_read": summary.bytes_read,
            "bytes_avoided": summary.bytes_avoided,
            "speculate": args.speculate,
            "drafts_proposed": summary.drafts_proposed,
            "drafts_accepted": summary.drafts_accepted,
            // Per step (issue 16 item 4): [d] = decode forwards carrying d drafts, [a] = verify
            // steps accepting a of them.
            "decode_forwards": summary.decode_steps.forwards(),
            "drafts_per_forward": summary.decode_steps.by_drafts,
            "accepted_per_verify": summary.decode_steps.by_accepted,
            "store": {
                "bytes_read": store.bytes_read,
                "trunk_bytes_read": store.trunk_bytes_read,
                "expert_bytes_read": store.expert_bytes_read,
                "embedding_bytes_read": store.embedding_bytes_read,
                "head_bytes_read": store.head_bytes_read,
                "lookahead_bytes_read": store.lookahead_bytes_read,
                "lookahead_unused_bytes": store.lookahead_unused_bytes,
                // Per MoE layer, in experts: `confirmed / routed` of the routing was guessed.
                "lookahead_by_layer": engine.model().lookahead_by_layer().iter().map(|g| {
                    serde_json::json!({
                        "layer": g.layer,
                        "guessed_passes": g.guessed_passes,
                        "early_passes": g.early_passes,
                        "predicted": g.predicted,
                        "routed": g.routed,
                        "confirmed": g.confirmed,
                    })
                }).collect::<Vec<_>>(),
                "bytes_avoided": store.bytes_avoided,
                "io_seconds": store.io_seconds,
                "compute_seconds": engine.model().compute_seconds(),
            },
            "plan": {
                "budget_bytes": plan.budget,
                "allocated_bytes": plan.total(),
                "pinned_layers": plan.pinned_layers,
                "layers": plan.layer_count,
                "lm_head_resident": plan.lm_head == k3_engine::plan::Residency::Resident,
                "embedding_resident": plan.embedding == k3_engine::plan::Residency::Resident,
                "cache_slots": plan.cache_slots,
                "lookahead_slots": plan.lookahead_slots,
                "dense_lookahead": plan.dense_lookahead.name(),
                "predicted_bytes_per_token": plan.reads.total(),
                "predicted_trunk_bytes_per_token": plan.reads.trunk,
                "predicted_expert_bytes_per_token": plan.reads.experts,
                "predicted_head_bytes_per_token": plan.reads.lm_head,
                "predicted_embedding_bytes_per_token": plan.reads.embedding,
            },
            "threads": engine.options().threads,
            "fingerprint": engine.info().fingerprint,
        });
        println!("{report}");
    } else {
        println!();
        eprintln!(
            "k3d: {} prompt + {} generated tokens, {:.4} s/token, peak RSS {:.1} MB",
            summary.prompt_tokens,
            summary.generated_tokens,
            seconds_per_token,
            ProcessMemory::now().peak_rss as f64 / 1e6
        );
    }
    Ok(())
}
