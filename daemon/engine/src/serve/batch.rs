//! The batch loop: round after round, up to `max_batch` members that can take a step go
//! through **one** forward pass ([`Engine::step_batch`]), sharing each layer's weights and the
//! union of their experts; each member has its own [`Generation`], so its output is exactly
//! what it would be alone.
//!
//! Fairness is round robin: members left out of a round (not ready, or over the cap) keep their
//! place ahead of the stepped ones, which the caller puts back at the end ([`Batch::push`]), so
//! every member is stepped within a few rounds whatever the cap. This is the only batch loop:
//! the serve core's scheduler, the batching tests and `batch_bench` all step through it.
//!
//! A round's results come back together, so every member of a round waits for its slowest
//! step — and a layer of a long prompt's pass is far slower than anything else. A new short
//! request needs three cheap steps (the end of its prompt, its first token, its end): were each
//! in a round with a layer, its reply would wait for three layers of another user's prompt. So a
//! round that has such a short step leaves the members between layers of a pass out, at most
//! [`MOST_HELD_ROUNDS`] rounds in a row, so a pass still runs a layer every few rounds however
//! many short steps arrive (issue 35 point 8).

use std::collections::VecDeque;

use crate::engine::{Engine, EngineError, Generation, Step};

/// One member of a batch: a generation and what decides whether it may run.
pub trait Member {
    /// The generation to step, and this member's cancel check (polled between layers; the
    /// pass stops early only when every member's check is true).
    fn split(&mut self) -> (&mut Generation, &(dyn Cancel + Sync));
    /// The generation, to look at.
    fn generation(&self) -> &Generation;
    /// Whether the member may be stepped this round (e.g. its reader has room for the event).
    fn ready(&self) -> bool {
        true
    }
}

/// A cancel check.
pub trait Cancel {
    fn cancelled(&self) -> bool;
}

/// Never cancelled.
pub struct Never;

impl Cancel for Never {
    fn cancelled(&self) -> bool {
        false
    }
}

/// A bare generation is a member that is always ready and never cancelled.
impl Member for Generation {
    fn split(&mut self) -> (&mut Generation, &(dyn Cancel + Sync)) {
        (self, &Never)
    }
    fn generation(&self) -> &Generation {
        self
    }
}

/// Rounds in a row whose short steps may leave the passes out: the three steps of a short
/// request (see the module's comment).
pub const MOST_HELD_ROUNDS: usize = 3;

/// The members being computed, in turn order.
pub struct Batch<M> {
    members: VecDeque<M>,
    max_batch: usize,
    /// Rounds in a row that left the passes out.
    held: usize,
}

impl<M: Member> Batch<M> {
    /// An empty batch stepping at most `max_batch` members per round (at least one).
    pub fn new(max_batch: usize) -> Batch<M> {
        Batch {
            members: VecDeque::new(),
            max_batch: max_batch.max(1),
            held: 0,
        }
    }

    /// Adds a member at the end of the turn order.
    pub fn push(&mut self, member: M) {
        self.members.push_back(member);
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The members in turn order.
    pub fn iter(&self) -> impl Iterator<Item = &M> {
        self.members.iter()
    }

    /// The members in turn order, mutably (between rounds).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut M> {
        self.members.iter_mut()
    }

    /// Takes every member out (shutdown, tests).
    pub fn drain(&mut self) -> impl Iterator<Item = M> + '_ {
        self.members.drain(..)
    }

    /// One round: the first `max_batch` ready members, in turn order, take one step each (a
    /// prefill chunk or a token) through one forward pass. They are handed back with their
    /// results; the caller [`Self::push`]es back those still running. Empty when no member
    /// was ready. Members between layers of a pass sit out a round that has a short step
    /// (see the module's comment).
    pub fn round(&mut self, engine: &Engine) -> Vec<(M, Result<Step, EngineError>)> {
        let chunk = engine.prefill_chunk();
        let hold = self.held < MOST_HELD_ROUNDS
            && self.members.iter().any(|m| m.generation().in_pass())
            && self
                .members
                .iter()
                .any(|m| m.ready() && m.generation().next_step_is_short(chunk));
        self.held = if hold { self.held + 1 } else { 0 };
        let mut picked = Vec::new();
        let mut rest = VecDeque::with_capacity(self.members.len());
        for m in self.members.drain(..) {
            let held = hold && m.generation().in_pass();
            if picked.len() < self.max_batch && m.ready() && !held {
                picked.push(m);
            } else {
                rest.push_back(m);
            }
        }
        self.members = rest;
        if picked.is_empty() {
            return Vec::new();
        }
        let results = {
            let (mut gens, checks): (Vec<&mut Generation>, Vec<&(dyn Cancel + Sync)>) =
                picked.iter_mut().map(|m| m.split()).unzip();
            let closures: Vec<_> = checks.iter().map(|c| move || c.cancelled()).collect();
            let cancels: Vec<&(dyn Fn() -> bool + Sync)> = closures
                .iter()
                .map(|c| c as &(dyn Fn() -> bool + Sync))
                .collect();
            engine.step_batch(&mut gens, &cancels)
        };
        picked.into_iter().zip(results).collect()
    }
}
