//! Automatic prefix reuse: OpenAI-style clients resend the whole conversation every turn, so the
//! core keeps each caller's recent states (the end of a prompt's prefill and the end of its
//! generation) and starts a later request of the same caller from the longest one whose ids
//! are a strict prefix of its prompt — the session reuse rule of [`crate::session::snapshot`],
//! so a state is only ever continued at the exact position it was taken (KDA's recurrent
//! state has no partial match). The output is bit-identical to computing the prompt afresh:
//! a state is the exact result of feeding its ids (spec §6), and feeding the rest of the
//! prompt to it is what a fresh generation does after those ids.
//!
//! A chat's next prompt re-renders this turn's reply from its message (spec §8.4), and those
//! ids need not be the ones generated: the client sends the content back without its
//! reasoning, and a tokenizer re-encodes text its own way (a model may emit a non-canonical
//! split). So after a chat reply has gone out, the scheduler *warms* the next turn: it renders
//! [`next_turn`] — the conversation with the reply as history — and feeds it from the caller's
//! best kept state, keeping the result. The next request then prefills only what the user
//! added. That work was the next turn's anyway; it is done after the reply, off the critical
//! path, and yields its compute slot to any request that waits for one.
//!
//! Bounded twice: [`PER_CALLER`] states per caller, and all callers' states together within a
//! byte allowance (what the named sessions leave of the session allowance, checked at every
//! insert); the least recently used state goes first. Callers are keyed by uid (or API key, as
//! a transport decides): one user's conversation is never continued from another's state.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::model::State;
use crate::session::Snapshot;
use crate::session::snapshot::best;
use crate::tokenizer::Tokenizer;
use crate::tokenizer::chat::{self, Conversation, Message, ResponseFormat, ToolChoice};

/// States kept per caller: a turn keeps up to three (the end of its prefill, of its generation,
/// and its warmed next turn), so this holds the latest turn's and the one before it.
pub const PER_CALLER: usize = 6;

/// The ids every next prompt of this chat starts with: `conversation` (as rendered for this
/// turn) with `reply` appended as history, the way OpenAI clients send it back — content and
/// tool calls, without the reasoning — and without this turn's one-shot notes or the generation
/// prompt, which a next request renders after its own messages (spec §8.2 steps 4-5).
/// `None` if the reply cannot be rendered as history (then there is nothing to warm).
pub fn next_turn(
    tokenizer: &Tokenizer,
    conversation: &Conversation,
    reply: Message,
) -> Option<Vec<u32>> {
    let mut messages = conversation.messages.clone();
    messages.push(Message {
        reasoning: None,
        ..reply
    });
    let history = Conversation {
        messages,
        thinking: conversation.thinking,
        generation_prompt: false,
        tools: conversation.tools.clone(),
        tool_choice: ToolChoice::Auto,
        response_format: ResponseFormat::Text,
        parallel_tool_calls: conversation.parallel_tool_calls,
    };
    chat::render(tokenizer, &history).ok()
}

/// Who a kept state belongs to: only that caller's requests may continue it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Caller {
    Uid(Option<u32>),
    /// A transport's own key (e.g. an HTTP API key's digest).
    Key(String),
}

struct Entry {
    caller: Caller,
    snapshot: Snapshot,
    bytes: u64,
}

/// Every caller's kept states, least recently used first.
#[derive(Default)]
pub struct PrefixCache {
    entries: Mutex<VecDeque<Entry>>,
}

/// What [`PrefixCache::figures`] reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixFigures {
    pub states: usize,
    pub bytes: u64,
}

impl PrefixCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Entry>> {
        // No method panics while holding the lock; a poisoned deque is still consistent.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state `caller`'s `prompt` continues from (a copy: the kept one stays for the next
    /// turn), marked most recently used; `None` if no kept state is a strict prefix.
    pub fn find(&self, caller: &Caller, prompt: &[u32]) -> Option<State> {
        let mut entries = self.lock();
        let mine: Vec<usize> = (0..entries.len())
            .filter(|&i| entries[i].caller == *caller)
            .collect();
        let snapshots: Vec<&Snapshot> = mine.iter().map(|&i| &entries[i].snapshot).collect();
        let chosen = best(&snapshots, prompt)?;
        let entry = entries.remove(mine[chosen])?;
        let state = entry.snapshot.state.clone();
        entries.push_back(entry);
        Some(state)
    }

    /// Keeps `snapshots` for `caller` as its newest states, then evicts (least recently used
    /// first) until at most [`PER_CALLER`] are the caller's and all fit in `allowance` bytes.
    pub fn keep(&self, caller: &Caller, snapshots: Vec<Snapshot>, allowance: u64) {
        let mut entries = self.lock();
        for snapshot in snapshots {
            entries.retain(|e| !(e.caller == *caller && e.snapshot.history == snapshot.history));
            let bytes = snapshot.state.size_bytes() as u64;
            entries.push_back(Entry {
                caller: caller.clone(),
                snapshot,
                bytes,
            });
        }
        while entries.iter().filter(|e| e.caller == *caller).count() > PER_CALLER {
            let Some(oldest) = entries.iter().position(|e| e.caller == *caller) else {
                break;
            };
            entries.remove(oldest);
        }
        while entries.iter().map(|e| e.bytes).sum::<u64>() > allowance {
            entries.pop_front();
        }
    }

    pub fn figures(&self) -> PrefixFigures {
        let entries = self.lock();
        PrefixFigures {
            states: entries.len(),
            bytes: entries.iter().map(|e| e.bytes).sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::snapshot::tests::state_for;

    fn snap(history: &[u32]) -> Snapshot {
        Snapshot {
            history: history.to_vec(),
            state: state_for(history),
        }
    }

    #[test]
    fn the_longest_strict_prefix_of_the_callers_own_states_is_continued() {
        let cache = PrefixCache::default();
        let me = Caller::Uid(Some(1));
        let other = Caller::Uid(Some(2));
        cache.keep(&me, vec![snap(&[1, 2]), snap(&[1, 2, 3, 4])], u64::MAX);
        cache.keep(&other, vec![snap(&[1, 2, 3, 4, 5])], u64::MAX);
        assert_eq!(
            cache.find(&me, &[1, 2, 3, 4, 5, 6]),
            Some(state_for(&[1, 2, 3, 4]))
        );
        // Equal to a kept history: not a strict prefix, so the shorter one.
        assert_eq!(cache.find(&me, &[1, 2, 3, 4]), Some(state_for(&[1, 2])));
        // Diverges after the first id: nothing.
        assert_eq!(cache.find(&me, &[1, 9, 3]), None);
        // Another caller never gets my states.
        assert_eq!(cache.find(&Caller::Uid(Some(3)), &[1, 2, 3, 4, 5, 6]), None);
    }

    #[test]
    fn states_are_bounded_per_caller_and_by_bytes_least_recently_used_first() {
        let cache = PrefixCache::default();
        let me = Caller::Uid(Some(1));
        for n in 1..=PER_CALLER as u32 + 2 {
            cache.keep(&me, vec![snap(&(0..n).collect::<Vec<_>>())], u64::MAX);
        }
        assert_eq!(cache.figures().states, PER_CALLER);
        // The two oldest (1 and 2 ids) went.
        assert_eq!(cache.find(&me, &[0, 1, 7]), None);
        let one = state_for(&[0, 1, 2]).size_bytes() as u64;
        cache.keep(&Caller::Key("k".into()), vec![snap(&[9])], one);
        assert_eq!(
            cache.figures().states,
            1,
            "the byte allowance evicts the rest"
        );
    }
}
