//! The plan's prefill-pass activations, handed out to the layer-major passes in flight.
//!
//! The memory plan holds the activations of one pass of `prefill_tokens` prompt tokens
//! ([`crate::plan::Plan::prefill_tokens`]). A pass holds its share from its first layer to its
//! last (its running sums live between the steps of the batch loop), so several prompts
//! prefilling at once share that reservation: a pass takes what is free, and a prompt that
//! finds too little free feeds chunks in the forward shared with the other members until a
//! pass ends. The budget is never exceeded, and each pass still reads the weights once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Prompt tokens held by passes in flight.
#[derive(Debug, Default)]
pub(super) struct PassTokensHeld(Arc<AtomicUsize>);

impl PassTokensHeld {
    /// Takes up to `wanted` tokens of the `limit` the plan holds, if more than `least` are
    /// free (a pass of `least` tokens or fewer runs as a chunk in the shared forward instead).
    pub(super) fn reserve(&self, wanted: usize, least: usize, limit: usize) -> Option<PassTokens> {
        let mut held = self.0.load(Ordering::Acquire);
        loop {
            let take = wanted.min(limit.saturating_sub(held));
            if take <= least {
                return None;
            }
            match self
                .0
                .compare_exchange(held, held + take, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Some(PassTokens {
                        held: Arc::clone(&self.0),
                        tokens: take,
                    });
                }
                Err(now) => held = now,
            }
        }
    }
}

/// One pass's share, given back when the pass ends (completed, failed, cancelled, or its
/// generation dropped).
#[derive(Debug)]
pub(crate) struct PassTokens {
    held: Arc<AtomicUsize>,
    tokens: usize,
}

impl PassTokens {
    pub(super) fn tokens(&self) -> usize {
        self.tokens
    }
}

impl Drop for PassTokens {
    fn drop(&mut self) {
        self.held.fetch_sub(self.tokens, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_share_the_planned_tokens_and_give_them_back() {
        let held = PassTokensHeld::default();
        let a = held.reserve(700, 32, 1000).expect("room");
        assert_eq!(a.tokens(), 700);
        // 300 left: a second prompt gets them, a third finds too few and feeds chunks.
        let b = held.reserve(900, 32, 1000).expect("room");
        assert_eq!(b.tokens(), 300);
        assert!(held.reserve(500, 32, 1000).is_none());
        drop(a);
        assert_eq!(held.reserve(500, 32, 1000).map(|p| p.tokens()), Some(500));
        drop(b);
        // A pass no longer than a chunk is not a pass; nothing planned, nothing taken.
        assert!(held.reserve(30, 32, 1000).is_none());
        assert!(held.reserve(500, 32, 0).is_none());
        assert_eq!(held.0.load(Ordering::Acquire), 0);
    }
}
