//! One greedy generation measured phase by phase — prefill, then decode — for `k3d bench`
//! (issue 4 §8): wall time, weight bytes read by class, the compute thread's time waiting for
//! reads, the reader pool's busy time and compute time, each as the difference of the engine's
//! counters across the phase.
//!
//! With the store's expert trace on (`StoreOptions::record_trace`) the prefill also reports the
//! union of routed experts its tokens asked for: what reading each needed expert once costs
//! (issue 30.1), the yardstick for the expert bytes it did read.
//!
//! Decode is measured over the tokens that needed a forward pass: the first generated token is
//! sampled from the prompt's last logits, which prefill computed, so `decode.tokens` is
//! `generated − 1`.

use std::collections::HashSet;
use std::time::Instant;

use serde::Serialize;

use super::{Engine, EngineError, GenerateRequest, Step};
use crate::store::StoreStats;
use crate::store::expert_cache::ExpertId;

/// What one phase cost.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PhaseCost {
    /// Tokens the phase fed through the model.
    pub tokens: usize,
    /// Wall time of the phase.
    pub seconds: f64,
    pub trunk_bytes: u64,
    pub expert_bytes: u64,
    pub embedding_bytes: u64,
    pub head_bytes: u64,
    /// Whole aligned windows the reader threads moved (what the drive delivered).
    pub window_bytes: u64,
    /// Expert bytes read ahead of routing (included in `expert_bytes`), and the part the
    /// routing did not ask for.
    pub lookahead_bytes: u64,
    pub lookahead_unused_bytes: u64,
    /// Time the compute thread waited for reads.
    pub io_wait_seconds: f64,
    /// Time at least one read was executing.
    pub read_busy_seconds: f64,
    /// Time in the forward pass not waiting for reads.
    pub compute_seconds: f64,
    /// Bytes read from a trunk pack (included in `trunk_bytes` and `head_bytes`), the shard
    /// bytes they decoded to, and the compute threads' time decoding them (in
    /// `compute_seconds`).
    pub pack_bytes: u64,
    pub pack_decoded_bytes: u64,
    pub pack_decode_seconds: f64,
}

impl PhaseCost {
    fn between(a: &Mark, b: &Mark, tokens: usize) -> Self {
        let (s, t) = (&a.store, &b.store);
        PhaseCost {
            tokens,
            seconds: (b.at - a.at).as_secs_f64(),
            trunk_bytes: t.trunk_bytes_read - s.trunk_bytes_read,
            expert_bytes: t.expert_bytes_read - s.expert_bytes_read,
            embedding_bytes: t.embedding_bytes_read - s.embedding_bytes_read,
            head_bytes: t.head_bytes_read - s.head_bytes_read,
            window_bytes: t.window_bytes_read - s.window_bytes_read,
            lookahead_bytes: t.lookahead_bytes_read - s.lookahead_bytes_read,
            lookahead_unused_bytes: t.lookahead_unused_bytes - s.lookahead_unused_bytes,
            io_wait_seconds: t.io_seconds - s.io_seconds,
            read_busy_seconds: t.read_busy_seconds - s.read_busy_seconds,
            compute_seconds: b.compute - a.compute,
            pack_bytes: t.pack_bytes_read - s.pack_bytes_read,
            pack_decoded_bytes: t.pack_decoded_bytes - s.pack_decoded_bytes,
            pack_decode_seconds: t.pack_decode_seconds - s.pack_decode_seconds,
        }
    }

    /// Payload bytes read, all classes.
    pub fn bytes(&self) -> u64 {
        self.trunk_bytes + self.expert_bytes + self.embedding_bytes + self.head_bytes
    }
}

/// A measured generation.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    pub generated: Vec<u32>,
    pub prefill: PhaseCost,
    pub decode: PhaseCost,
    /// Distinct (layer, expert) pairs the prefill's routing asked for, when the store records
    /// its expert trace.
    pub prefill_experts: Option<u64>,
}

struct Mark {
    at: Instant,
    store: StoreStats,
    compute: f64,
}

impl Mark {
    fn of(engine: &Engine) -> Self {
        Mark {
            store: engine.model().store_stats(),
            compute: engine.model().compute_seconds(),
            at: Instant::now(),
        }
    }
}

/// Generates greedily from `prompt` until `decode_tokens` tokens have needed a forward pass of
/// their own (so `decode_tokens + 1` tokens are generated), measuring both phases.
pub fn measure(
    engine: &Engine,
    prompt: &[u32],
    decode_tokens: usize,
) -> Result<Measured, EngineError> {
    let request = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens: decode_tokens + 1,
        ..GenerateRequest::default()
    };
    let mut generation = engine.start(request)?;
    let traced = || engine.model().expert_trace();
    let trace_start = traced().map_or(0, |t| t.len());
    let start = Mark::of(engine);
    let mut prefilled: Option<Mark> = None;
    let mut prefill_experts = None;
    let summary = loop {
        match engine.step(&mut generation, &|| false)? {
            Step::Prefill { done, total, .. } if done == total => {
                prefilled = Some(Mark::of(engine));
                prefill_experts = traced().map(|t| {
                    let asked: HashSet<ExpertId> =
                        t[trace_start.min(t.len())..].iter().copied().collect();
                    asked.len() as u64
                });
            }
            Step::Finished(summary) => break summary,
            _ => {}
        }
    };
    let end = Mark::of(engine);
    // A validated prompt is non-empty, so its last prefill step always reports done == total.
    let prefilled =
        prefilled.ok_or_else(|| EngineError::Internal("the prompt was never fed".into()))?;
    Ok(Measured {
        prefill: PhaseCost::between(&start, &prefilled, prompt.len()),
        decode: PhaseCost::between(&prefilled, &end, summary.generated.len().saturating_sub(1)),
        generated: summary.generated,
        prefill_experts,
    })
}
