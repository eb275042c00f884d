//! The plan's prefill-pass activations, handed out to the layer-major passes in flight.
//!
//! The memory plan holds the activations of one pass of `prefill_tokens` prompt tokens
//! ([`crate::plan::Plan::prefill_tokens`]). A pass holds its share from its first layer to its
//! last (its running sums live between the steps of the batch loop), so several prompts
//! prefilling at once share that reservation: a pass takes what is free, and a prompt that
//! finds too little free feeds chunks in the forward shared with the other members until a
//! pass ends. The budget is never exceeded, and each pass still reads the weights once.
//!
//! While no pass holds them, whole expert-cache slots' worth of those bytes hold experts
//! ([`crate::plan::Plan::pass_cache_slots`], issue 41.5): a pass is sized to its prompt, and
//! takes back from the cache only the slots its tokens' activations need beyond the rest of
//! the reservation, before it allocates them; the slots return to the cache at the first
//! engine step after the pass ends. So a short prompt, or decode, keeps the larger cache.
//! A pass's size changes no number (spec §6.1 rule 5), only how many passes a prompt takes.

use std::sync::{Arc, Mutex, MutexGuard};

/// Bytes of the plan's pass reservation, as tokens and as lendable cache slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct PassBytes {
    /// Activation bytes of one pass token (`prefill_bytes ÷ prefill_tokens`).
    pub per_token: u64,
    /// Bytes of the reservation not lent to the expert cache.
    pub kept: u64,
    /// One cache slot's bytes.
    pub slot: u64,
}

impl PassBytes {
    /// The plan's reservation: `prefill_bytes` for `prefill_tokens`, of which
    /// `pass_cache_slots` slots of `slot_bytes` are lent to the cache.
    pub(super) fn of(plan: &crate::plan::Plan) -> PassBytes {
        let lent = plan.pass_cache_slots as u64 * plan.cache_slot_bytes;
        PassBytes {
            per_token: plan
                .prefill_bytes
                .checked_div(plan.prefill_tokens)
                .unwrap_or(0),
            kept: plan.prefill_bytes.saturating_sub(lent),
            slot: plan.cache_slot_bytes,
        }
    }

    /// Cache slots passes of `tokens` tokens in all must have taken back.
    fn slots_for(&self, tokens: usize) -> usize {
        let need = (tokens as u64).saturating_mul(self.per_token);
        let beyond = need.saturating_sub(self.kept);
        usize::try_from(beyond.div_ceil(self.slot.max(1))).unwrap_or(usize::MAX)
    }

    /// Tokens `slots` slots taken back and the kept bytes hold.
    fn tokens_with(&self, slots: usize) -> usize {
        let bytes = self
            .kept
            .saturating_add((slots as u64).saturating_mul(self.slot));
        usize::try_from(bytes.checked_div(self.per_token).unwrap_or(u64::MAX)).unwrap_or(usize::MAX)
    }
}

/// Tokens held by passes in flight and cache slots taken back for them.
#[derive(Debug, Default)]
struct Held {
    tokens: usize,
    slots: usize,
}

/// Prompt tokens held by passes in flight.
#[derive(Debug)]
pub(super) struct PassTokensHeld {
    held: Arc<Mutex<Held>>,
    bytes: PassBytes,
}

/// Every critical section leaves `Held` consistent: poisoning is not an error.
fn lock(m: &Mutex<Held>) -> MutexGuard<'_, Held> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PassTokensHeld {
    pub(super) fn new(bytes: PassBytes) -> Self {
        PassTokensHeld {
            held: Arc::default(),
            bytes,
        }
    }

    /// Takes up to `wanted` tokens of the `limit` the plan holds, if more than `least` are
    /// free (a pass of `least` tokens or fewer runs as a chunk in the shared forward instead).
    /// The cache slots their activations need are taken back first through `lend` (which
    /// frees up to the slots asked for and says how many): a pass gets only the tokens the
    /// memory freed holds.
    pub(super) fn reserve(
        &self,
        wanted: usize,
        least: usize,
        limit: usize,
        lend: &dyn Fn(usize) -> usize,
    ) -> Option<PassTokens> {
        let mut held = lock(&self.held);
        let mut take = wanted.min(limit.saturating_sub(held.tokens));
        if take <= least {
            return None;
        }
        let need = self.bytes.slots_for(held.tokens + take);
        if need > held.slots {
            held.slots += lend(need - held.slots);
            take = take.min(
                self.bytes
                    .tokens_with(held.slots)
                    .saturating_sub(held.tokens),
            );
        }
        if take <= least {
            // The slots taken stay out until the next `settle`.
            return None;
        }
        held.tokens += take;
        Some(PassTokens {
            held: Arc::clone(&self.held),
            tokens: take,
        })
    }

    /// Gives the cache back, through `give_back`, the slots the passes still in flight do not
    /// need (called at every engine step, after the passes that ended were dropped).
    pub(super) fn settle(&self, give_back: &dyn Fn(usize)) {
        let mut held = lock(&self.held);
        let spare = held.slots.saturating_sub(self.bytes.slots_for(held.tokens));
        if spare > 0 {
            give_back(spare);
            held.slots -= spare;
        }
    }
}

/// One pass's share, given back when the pass ends (completed, failed, cancelled, or its
/// generation dropped).
#[derive(Debug)]
pub(crate) struct PassTokens {
    held: Arc<Mutex<Held>>,
    tokens: usize,
}

impl PassTokens {
    pub(super) fn tokens(&self) -> usize {
        self.tokens
    }
}

impl Drop for PassTokens {
    fn drop(&mut self) {
        let mut held = lock(&self.held);
        held.tokens = held.tokens.saturating_sub(self.tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn no_loan(_: usize) -> usize {
        0
    }

    #[test]
    fn passes_share_the_planned_tokens_and_give_them_back() {
        // Nothing lent to the cache: the whole reservation is kept for passes.
        let held = PassTokensHeld::new(PassBytes {
            per_token: 10,
            kept: 10_000,
            slot: 100,
        });
        let a = held.reserve(700, 32, 1000, &no_loan).expect("room");
        assert_eq!(a.tokens(), 700);
        // 300 left: a second prompt gets them, a third finds too few and feeds chunks.
        let b = held.reserve(900, 32, 1000, &no_loan).expect("room");
        assert_eq!(b.tokens(), 300);
        assert!(held.reserve(500, 32, 1000, &no_loan).is_none());
        drop(a);
        assert_eq!(
            held.reserve(500, 32, 1000, &no_loan).map(|p| p.tokens()),
            Some(500)
        );
        drop(b);
        // A pass no longer than a chunk is not a pass; nothing planned, nothing taken.
        assert!(held.reserve(30, 32, 1000, &no_loan).is_none());
        assert!(held.reserve(500, 32, 0, &no_loan).is_none());
        assert_eq!(lock(&held.held).tokens, 0);
    }

    /// Issue 41.5: a pass takes back from the cache only the slots its own tokens need beyond
    /// the kept bytes, gets fewer tokens when the cache cannot free them all, and the slots go
    /// back once the passes that needed them ended; at no moment do the slots out and the
    /// tokens held exceed the reservation.
    #[test]
    fn a_pass_borrows_only_the_cache_slots_its_tokens_need() {
        // 1,000 tokens of 10 B: 10,000 B, of which 90 slots of 100 B lent to the cache.
        let bytes = PassBytes {
            per_token: 10,
            kept: 1_000,
            slot: 100,
        };
        let held = PassTokensHeld::new(bytes);
        let free = Cell::new(90usize);
        let out = Cell::new(0usize);
        let lend = |n: usize| {
            let k = n.min(free.get());
            free.set(free.get() - k);
            out.set(out.get() + k);
            k
        };
        let give_back = |n: usize| {
            free.set(free.get() + n);
            out.set(out.get() - n);
        };
        let within = |tokens: usize| tokens * 10 <= bytes.kept as usize + out.get() * 100;
        // 100 tokens fit in the kept 1,000 B: no slot taken.
        let a = held.reserve(100, 32, 1000, &lend).expect("room");
        assert_eq!((a.tokens(), out.get()), (100, 0));
        // 250 more need 2,500 B beyond the kept: 25 slots.
        let b = held.reserve(250, 32, 1000, &lend).expect("room");
        assert_eq!((b.tokens(), out.get()), (250, 25));
        assert!(within(350));
        // The cache can free only 5 more slots (the others are in use): 50 tokens.
        free.set(5);
        let c = held.reserve(400, 32, 1000, &lend).expect("room");
        assert_eq!((c.tokens(), out.get()), (50, 30));
        assert!(within(400));
        // None free: a prompt that needs slots feeds chunks.
        assert!(held.reserve(400, 32, 1000, &lend).is_none());
        drop(b);
        drop(c);
        held.settle(&give_back);
        assert_eq!(out.get(), 0, "100 tokens need no slot");
        drop(a);
        held.settle(&give_back);
        assert_eq!((out.get(), lock(&held.held).tokens), (0, 0));
    }
}
