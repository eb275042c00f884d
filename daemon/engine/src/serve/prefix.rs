//! Automatic prefix reuse: agents and OpenAI-style clients resend the whole conversation every
//! turn, so the core keeps each caller's recent states and starts a later request of the same
//! caller from the longest one whose ids are a strict prefix of its prompt — the session reuse
//! rule of [`crate::session::snapshot`], so a state is only ever continued at the exact position
//! it was taken (KDA's recurrent state has no partial match). The output is bit-identical to
//! computing the prompt afresh: a state is the exact result of feeding its ids (spec §6), and
//! feeding the rest of the prompt to it is what a fresh generation does after those ids.
//!
//! Which states (issue 34 point 5). A KDA state cannot be cut back, so a later prompt can only
//! continue at a position where a state was kept; [`keep_points`] chooses them during the
//! prefill (the engine ends a prefill chunk there, [`crate::engine::GenerateRequest::keep_at`]):
//! * the prompt less its last id: an identical retry feeds one id, and the next turn of a
//!   chat — which starts with this prompt whenever the reply is sent back as generated, the
//!   generation prompt included — continues there too;
//! * the starts of the prompt's last [`BOUNDARIES`] messages (after an `<|end_of_msg|>`): a
//!   retry whose last message changed (an edited question, a different reminder appended by
//!   the agent, a truncated history) prefills from the message that changed, not from the
//!   first token.
//!
//! Then, once the reply is out, the end of the generation. A chat's next prompt re-renders
//! this turn's reply from its message (spec §8.4), and those ids need not be the ones
//! generated: a client may send the content back without its reasoning, and a tokenizer
//! re-encodes text its own way (a model may emit a non-canonical split). So after a chat reply
//! has gone out, the scheduler *warms* the next turn: it renders [`next_turn`] — the
//! conversation with the reply as history — and feeds it from the caller's best kept state,
//! keeping the result. The next request then prefills only what the user added. That work was
//! the next turn's anyway; it is done after the reply, off the critical path, and yields its
//! compute slot to any request that waits for one.
//!
//! Bounded twice: [`PER_CALLER`] states per caller, and all callers' states together within a
//! byte allowance (what the named sessions leave of the session allowance, checked at every
//! insert). Over the allowance, the account holding the most bytes loses its least recently
//! used state first, so one account's traffic never evicts another's states while it holds
//! more than they do (issue 35 point 6). Callers are [`Caller`]s: one caller's conversation is
//! never continued from another's state, and a caller nobody vouches for keeps nothing.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::caller::Caller;
use crate::model::State;
use crate::session::Snapshot;
use crate::session::snapshot::best;
use crate::tokenizer::Tokenizer;
use crate::tokenizer::chat::{self, Conversation, Message, ResponseFormat, ToolChoice};

/// Message starts kept per prompt besides the prompt less its last id ([`keep_points`]).
pub const BOUNDARIES: usize = 2;

/// States kept per caller: a turn keeps up to five ([`keep_points`]' three, the end of its
/// generation and its warmed next turn), so this holds the latest turn's and most of the one
/// before it.
pub const PER_CALLER: usize = 8;

/// The prompt positions a request with reuse keeps its state at (see the module docs): the
/// starts of its last [`BOUNDARIES`] messages — positions right after an `end_of_message` id
/// — and the prompt less its last id. Ascending, each from 1 to `prompt.len() - 1`.
pub fn keep_points(prompt: &[u32], end_of_message: Option<u32>) -> Vec<usize> {
    let last = prompt.len().saturating_sub(1);
    let mut points: Vec<usize> = prompt[..last]
        .iter()
        .enumerate()
        .filter(|&(_, id)| Some(*id) == end_of_message)
        .map(|(i, _)| i + 1)
        .filter(|&p| p < last)
        .collect();
    points.drain(..points.len().saturating_sub(BOUNDARIES));
    if last > 0 {
        points.push(last);
    }
    points
}

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

    /// Keeps `snapshots` for `caller` as its newest states, then evicts until at most
    /// [`PER_CALLER`] are the caller's (its least recently used first) and all fit in
    /// `allowance` bytes (the least recently used state of the account holding the most).
    pub fn keep(&self, caller: &Caller, snapshots: Vec<Snapshot>, allowance: u64) {
        if !caller.is_known() {
            return;
        }
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
            let Some(account) = heaviest_account(&entries) else {
                break;
            };
            let Some(oldest) = entries.iter().position(|e| e.caller.account() == account) else {
                break;
            };
            entries.remove(oldest);
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

/// The account whose states hold the most bytes (the first such in LRU order on a tie).
fn heaviest_account(entries: &VecDeque<Entry>) -> Option<Caller> {
    let mut totals: Vec<(Caller, u64)> = Vec::new();
    for e in entries {
        let account = e.caller.account();
        match totals.iter_mut().find(|(a, _)| *a == account) {
            Some((_, bytes)) => *bytes += e.bytes,
            None => totals.push((account, e.bytes)),
        }
    }
    // `max_by_key` keeps the last maximum: reversed, the first in LRU order wins a tie.
    totals
        .into_iter()
        .rev()
        .max_by_key(|(_, bytes)| *bytes)
        .map(|(account, _)| account)
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
        let me = Caller::Uid(1);
        let other = Caller::Uid(2);
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
        assert_eq!(cache.find(&Caller::Uid(3), &[1, 2, 3, 4, 5, 6]), None);
    }

    #[test]
    fn only_the_same_identity_continues_a_state_and_unknown_callers_keep_nothing() {
        let cache = PrefixCache::default();
        let scoped = |scope: &str| Caller::Key {
            key: 0,
            scope: Some(scope.into()),
        };
        cache.keep(&scoped("a"), vec![snap(&[1, 2])], u64::MAX);
        assert!(cache.find(&scoped("a"), &[1, 2, 3]).is_some());
        // Another name under the same key, the key alone, another key, a uid: none of them.
        for other in [
            scoped("b"),
            scoped("a").account(),
            Caller::Key {
                key: 1,
                scope: Some("a".into()),
            },
            Caller::Uid(0),
        ] {
            assert_eq!(cache.find(&other, &[1, 2, 3]), None, "{other}");
        }
        cache.keep(&Caller::Unknown, vec![snap(&[7, 8])], u64::MAX);
        assert_eq!(cache.find(&Caller::Unknown, &[7, 8, 9]), None);
        assert_eq!(cache.figures().states, 1);
    }

    #[test]
    fn states_are_bounded_per_caller_and_by_bytes() {
        let cache = PrefixCache::default();
        let me = Caller::Uid(1);
        for n in 1..=PER_CALLER as u32 + 2 {
            cache.keep(&me, vec![snap(&(0..n).collect::<Vec<_>>())], u64::MAX);
        }
        assert_eq!(cache.figures().states, PER_CALLER);
        // The two oldest (1 and 2 ids) went.
        assert_eq!(cache.find(&me, &[0, 1, 7]), None);
        let one = state_for(&[0, 1, 2]).size_bytes() as u64;
        cache.keep(&Caller::Uid(2), vec![snap(&[9])], one);
        assert_eq!(
            cache.figures().states,
            1,
            "the byte allowance evicts the rest"
        );
    }

    #[test]
    fn over_the_allowance_the_heaviest_account_gives_way_first() {
        let cache = PrefixCache::default();
        let (a, b) = (Caller::Uid(1), Caller::Uid(2));
        let size = |h: &[u32]| state_for(h).size_bytes() as u64;
        // A keeps one state, then B keeps three: B is over its share, so B's oldest goes
        // although A's is older.
        cache.keep(&a, vec![snap(&[1, 1])], u64::MAX);
        cache.keep(&b, vec![snap(&[2, 1]), snap(&[2, 2])], u64::MAX);
        let allowance = size(&[1, 1]) + size(&[2, 2]) + size(&[2, 3]);
        cache.keep(&b, vec![snap(&[2, 3])], allowance);
        assert_eq!(cache.figures().states, 3);
        assert!(cache.find(&a, &[1, 1, 0]).is_some(), "A's state stays");
        assert_eq!(cache.find(&b, &[2, 1, 0]), None, "B's oldest went");
        // One key's scopes are one account: together they give way to a lighter uid.
        let scoped = |s: &str| Caller::Key {
            key: 0,
            scope: Some(s.into()),
        };
        let fresh = PrefixCache::default();
        fresh.keep(&a, vec![snap(&[1, 1])], u64::MAX);
        fresh.keep(&scoped("x"), vec![snap(&[3, 1])], u64::MAX);
        fresh.keep(&scoped("y"), vec![snap(&[3, 2])], size(&[1, 1]) * 2);
        assert!(fresh.find(&a, &[1, 1, 0]).is_some());
        assert_eq!(fresh.find(&scoped("x"), &[3, 1, 0]), None);
    }

    #[test]
    fn states_are_kept_at_the_last_message_starts_and_before_the_last_id() {
        const EOM: u32 = 9;
        // Three messages, then a generation prompt of two ids.
        let prompt = [1, 2, EOM, 3, EOM, 4, 4, EOM, 5, 6];
        assert_eq!(keep_points(&prompt, Some(EOM)), vec![5, 8, 9]);
        // A prompt ending in a message end keeps no second state at the same place.
        assert_eq!(keep_points(&[1, EOM, 2, EOM], Some(EOM)), vec![2, 3]);
        assert_eq!(keep_points(&[1, 2, 3], None), vec![2]);
        assert_eq!(keep_points(&[1], Some(EOM)), Vec::<usize>::new());
        assert_eq!(keep_points(&[EOM, EOM], Some(EOM)), vec![1]);
    }
}
