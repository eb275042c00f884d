//! Aggregate decode throughput of N requests stepped together ([`Engine::step_batch`], issue 7
//! item 4) against the same engine stepping them one pass each, plus the weight bytes each pass
//! reads (the trunk once, the union of the members' experts).
//!
//! One process measures one `--concurrent N`: it loads the engine (its memory plan reserving
//! `--sequences` states, default N, and one prefill chunk of rows), prefills N different prompts in one pass, then decodes `--gen` tokens for each, all N through one pass per step. The decode
//! phase is timed from the first step in which every member decodes to the last token; the
//! aggregate rate is `N · tokens / seconds`. Run it in a fresh process per measurement after
//! dropping the page cache (and under a memory cgroup equal to the budget) so runs start equal.
//!
//! ```text
//! cargo run --release -p k3-engine --example batch_bench -- MODEL_DIR [--concurrent N] [--gen T]
//!     [--prompt-len P] [--ram-gb G | --ram-bytes B] [--threads N] [--sequences S]
//!     [--no-lookahead]
//! ```
//! Prints one JSON object.

use std::path::PathBuf;
use std::time::Instant;

use k3_engine::engine::{
    Engine, EngineOptions, Feed, GenerateRequest, Generation, PREFILL_CHUNK, Step,
};
use k3_engine::model::LoadOptions;
use k3_engine::plan::{Budget, PlanInputs};
use k3_engine::serve::Batch;
use k3_engine::store::StoreStats;

struct Args {
    model: PathBuf,
    concurrent: usize,
    generate: usize,
    prompt_len: usize,
    budget: Budget,
    threads: Option<usize>,
    /// States the memory plan reserves (default: `--concurrent`).
    sequences: Option<usize>,
}

fn usage(why: &str) -> ! {
    eprintln!(
        "batch_bench: {why}\nusage: batch_bench MODEL_DIR [--concurrent N] [--gen T] \
         [--prompt-len P] [--ram-gb G | --ram-bytes B] [--threads N] [--sequences S] \
         [--no-lookahead]"
    );
    std::process::exit(2)
}

fn parse<T: std::str::FromStr>(flag: &str, value: Option<String>) -> T {
    value
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| usage(&format!("{flag} needs a number")))
}

fn args() -> Args {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        model: PathBuf::new(),
        concurrent: 4,
        generate: 16,
        prompt_len: 8,
        budget: Budget::default(),
        threads: None,
        sequences: None,
    };
    let mut model = None;
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--concurrent" => a.concurrent = parse(&arg, it.next()),
            "--gen" => a.generate = parse(&arg, it.next()),
            "--prompt-len" => a.prompt_len = parse(&arg, it.next()),
            "--threads" => a.threads = Some(parse(&arg, it.next())),
            "--sequences" => a.sequences = Some(parse(&arg, it.next())),
            "--ram-gb" => {
                let g: f64 = parse(&arg, it.next());
                a.budget.ram =
                    Some(Budget::gib("--ram-gb", g).unwrap_or_else(|e| usage(&e.to_string())));
            }
            "--ram-bytes" => a.budget.ram = Some(parse(&arg, it.next())),
            "--no-lookahead" => a.budget.lookahead = k3_engine::plan::Lookahead::Off,
            s if s.starts_with("--") => usage(&format!("unknown flag {s}")),
            _ => model = Some(PathBuf::from(arg)),
        }
    }
    a.model = model.unwrap_or_else(|| usage("no model directory"));
    if a.concurrent == 0 || a.generate < 2 || a.prompt_len == 0 {
        usage("--concurrent ≥ 1, --gen ≥ 2 and --prompt-len ≥ 1 are needed");
    }
    a
}

/// Prompt `i`: distinct ids per member, so their routes (and experts) differ.
fn prompt(i: usize, len: usize, vocab: usize) -> Vec<u32> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i as u64 + 1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

fn main() {
    let a = args();
    // Every N plans the same activation memory (one default prefill chunk of rows); the N
    // prompts are prefilled in one pass. `--sequences 4` with N = 1 plans exactly like N = 4.
    if a.prompt_len * a.concurrent > PREFILL_CHUNK {
        usage(&format!(
            "--prompt-len × --concurrent must be at most {PREFILL_CHUNK} (the planned rows)"
        ));
    }
    let chunk = a.prompt_len;
    let mut options = EngineOptions {
        prefill_chunk: chunk,
        model: LoadOptions {
            plan: PlanInputs {
                budget: a.budget,
                max_tokens_per_call: PREFILL_CHUNK as u64,
                sequences: a.sequences.unwrap_or(a.concurrent) as u64,
                ..PlanInputs::default()
            },
            ..LoadOptions::default()
        },
        ..EngineOptions::default()
    };
    if let Some(t) = a.threads {
        options.threads = t;
    }
    let threads = options.threads;
    let loaded = Instant::now();
    let engine = Engine::open(&a.model, options, &mut |_| {}).unwrap_or_else(|e| {
        eprintln!("batch_bench: {e}");
        std::process::exit(1)
    });
    let load_seconds = loaded.elapsed().as_secs_f64();
    let vocab = engine.model().config().vocab_size;
    let gens: Vec<Generation> = (0..a.concurrent)
        .map(|i| {
            engine
                .start(GenerateRequest {
                    prompt: prompt(i, a.prompt_len, vocab),
                    max_tokens: a.generate,
                    ..GenerateRequest::default()
                })
                .unwrap_or_else(|e| {
                    eprintln!("batch_bench: {e}");
                    std::process::exit(1)
                })
        })
        .collect();
    let mut batch: Batch<Generation> = Batch::new(a.concurrent);
    for g in gens {
        batch.push(g);
    }
    let mut decode: Option<(Instant, StoreStats, u64)> = None;
    let mut tokens = 0u64;
    let mut passes = 0u64;
    let mut ids: Vec<Vec<u32>> = vec![Vec::new(); a.concurrent];
    let prefill = Instant::now();
    let mut prefill_seconds = 0.0;
    // The batch keeps its members in turn order; each is tagged with its request index by
    // the order it was pushed, tracked here through the rounds.
    let mut order: std::collections::VecDeque<usize> = (0..a.concurrent).collect();
    while !batch.is_empty() {
        let all_decoding = batch
            .iter()
            .all(|g| matches!(g.next_feed(chunk), Ok(Feed::Token { .. })));
        if decode.is_none() && all_decoding && batch.len() == a.concurrent {
            prefill_seconds = prefill.elapsed().as_secs_f64();
            decode = Some((Instant::now(), engine.model().store_stats(), 0));
        }
        let computes = batch
            .iter()
            .any(|g| g.next_feed(chunk).is_ok_and(|f| f.forward().is_some()));
        let stepped = batch.round(&engine);
        if decode.is_some() && computes {
            passes += 1;
        }
        // Every member is ready and the cap is the member count: all are stepped, in order.
        let round: Vec<usize> = order.drain(..).collect();
        for (i, (g, r)) in round.into_iter().zip(stepped) {
            match r {
                Ok(Step::Token { id }) => {
                    ids[i].push(id);
                    if decode.is_some() {
                        tokens += 1;
                    }
                }
                Ok(Step::Finished(_)) => continue,
                Ok(_) => {}
                Err(e) => {
                    eprintln!("batch_bench: request {i}: {e}");
                    std::process::exit(1)
                }
            }
            batch.push(g);
            order.push_back(i);
        }
    }
    let Some((started, before, _)) = decode else {
        eprintln!("batch_bench: the members never decoded together (--gen too small?)");
        std::process::exit(1)
    };
    let seconds = started.elapsed().as_secs_f64();
    let after = engine.model().store_stats();
    let per_pass = |x: u64| x as f64 / passes.max(1) as f64;
    let report = serde_json::json!({
        "concurrent": a.concurrent,
        "threads": threads,
        "budget_bytes": engine.model().plan().budget,
        "load_seconds": load_seconds,
        "prefill_seconds": prefill_seconds,
        "decode_seconds": seconds,
        "decode_tokens": tokens,
        "decode_passes": passes,
        "aggregate_tokens_per_second": tokens as f64 / seconds,
        "bytes_read_per_pass": per_pass(after.bytes_read - before.bytes_read),
        "trunk_bytes_read_per_pass": per_pass(after.trunk_bytes_read - before.trunk_bytes_read),
        "expert_bytes_read_per_pass": per_pass(after.expert_bytes_read - before.expert_bytes_read),
        "head_bytes_read_per_pass": per_pass(after.head_bytes_read - before.head_bytes_read),
        "bytes_avoided_per_pass": per_pass(after.bytes_avoided - before.bytes_avoided),
        "lookahead_slots": engine.model().plan().lookahead_slots,
        "lookahead_unused_bytes_per_pass": per_pass(
            after.lookahead_unused_bytes - before.lookahead_unused_bytes
        ),
        "io_seconds": after.io_seconds - before.io_seconds,
        "generated_ids": ids,
    });
    println!("{report}");
}
