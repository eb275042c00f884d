//! Counters a metrics endpoint reads: tokens in and out, time to first token and per-token
//! decode time, as running sums and counts (a scraper derives rates and means). Queue depth,
//! batch sizes, store bytes and cache figures come from admission's snapshot and the engine's
//! [`crate::engine::EngineStats`]; [`super::Core::metrics`] puts them all together.

use std::sync::{Mutex, MutexGuard};

use crate::engine::Summary;

/// Sums since the core started.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Timings {
    /// Prompt tokens of finished jobs (those a session already held included).
    pub prompt_tokens: u64,
    /// Prompt tokens actually prefilled (not reused from a session).
    pub prefilled_tokens: u64,
    /// Generated tokens of finished jobs.
    pub generated_tokens: u64,
    /// Seconds from admission to the first generated token, summed over `first_tokens` jobs.
    pub ttft_seconds_sum: f64,
    pub first_tokens: u64,
    /// Decode seconds of finished jobs, summed (÷ `generated_tokens` = seconds per token).
    pub decode_seconds_sum: f64,
    pub prefill_seconds_sum: f64,
    /// History tokens fed after a reply to warm the caller's next turn (automatic prefix
    /// reuse, [`super::prefix`]): compute spent off every request's critical path.
    pub warmed_tokens: u64,
}

#[derive(Default)]
pub(crate) struct TimingTotals {
    sums: Mutex<Timings>,
}

impl TimingTotals {
    fn lock(&self) -> MutexGuard<'_, Timings> {
        self.sums.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn first_token(&self, seconds: f64) {
        let mut t = self.lock();
        t.ttft_seconds_sum += seconds;
        t.first_tokens += 1;
    }

    pub fn finished(&self, s: &Summary) {
        let mut t = self.lock();
        t.prompt_tokens += s.prompt_tokens as u64;
        t.prefilled_tokens += s.prompt_tokens.saturating_sub(s.reused_tokens) as u64;
        t.generated_tokens += s.generated_tokens as u64;
        t.decode_seconds_sum += s.decode_seconds;
        t.prefill_seconds_sum += s.prefill_seconds;
    }

    pub fn warmed(&self, tokens: usize) {
        self.lock().warmed_tokens += tokens as u64;
    }

    pub fn timings(&self) -> Timings {
        *self.lock()
    }
}
