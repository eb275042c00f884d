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
//!   first token;
//! * the ends of a chat prompt's prelude ([`chat::Prelude`], issue 42 point 1): the end of
//!   its tool declaration, which comes first (spec §8.2) and so survives a system prompt that
//!   changes with the date, and the end of the tool declaration, effort note and leading
//!   system messages. An agent's next *session* shares nothing else with this one, and its
//!   prelude is most of its prompt (Claude Code's is about 40,000 ids): it then prefills only
//!   its conversation. These prelude states are the last of a caller's to give way.
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
//! Bounded twice: [`PER_CALLER`] states per caller besides [`PRELUDES_PER_CALLER`] prelude
//! states, and all callers' states together within a byte allowance (what the named sessions
//! leave of the session allowance, checked at every insert). Over the allowance, the account
//! holding the most bytes gives way first — its least recently used state that is not a
//! prelude's, then its least recently used prelude state — so one account's traffic never
//! evicts another's states while it holds more than they do (issue 35 point 6). Callers are
//! [`Caller`]s: one caller's conversation is never continued from another's state, and a
//! caller nobody vouches for keeps nothing. A local account's states also outlive the daemon
//! in the session directory ([`super::prefix_files`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::caller::Caller;
use crate::model::State;
use crate::session::Snapshot;
use crate::session::snapshot::best;
use crate::tokenizer::Tokenizer;
use crate::tokenizer::chat::{self, Conversation, Message, ResponseFormat, ToolChoice};

/// Message starts kept per prompt besides the prompt less its last id ([`keep_points`]).
pub const BOUNDARIES: usize = 2;

/// States kept per caller besides its prelude states: a turn keeps up to five
/// ([`keep_points`]' three besides the prelude's, the end of its generation and its warmed
/// next turn), so this holds the latest turn's and most of the one before it.
pub const PER_CALLER: usize = 8;

/// Prelude states kept per caller ([`prelude_points`]): two preludes' two each — an agent's
/// main conversation and its subagents', say.
pub const PRELUDES_PER_CALLER: usize = 4;

/// The prompt positions a request with reuse keeps its state at (see the module docs): the
/// ends of its prelude ([`prelude_points`]), the starts of its last [`BOUNDARIES`] messages —
/// positions right after an `end_of_message` id — and the prompt less its last id.
/// Ascending, each from 1 to `prompt.len() - 1`.
pub fn keep_points(
    prompt: &[u32],
    end_of_message: Option<u32>,
    prelude: &chat::Prelude,
) -> Vec<usize> {
    let last = prompt.len().saturating_sub(1);
    let mut points: Vec<usize> = prompt[..last]
        .iter()
        .enumerate()
        .filter(|&(_, id)| Some(*id) == end_of_message)
        .map(|(i, _)| i + 1)
        .filter(|&p| p < last)
        .collect();
    points.drain(..points.len().saturating_sub(BOUNDARIES));
    points.extend(prelude_points(prompt.len(), prelude));
    if last > 0 {
        points.push(last);
    }
    points.sort_unstable();
    points.dedup();
    points
}

/// The positions of a `prompt_len`-id chat prompt where its prelude ends and a state is kept
/// ([`keep_points`]): the end of its tool declaration and the end of its prelude, those from 1
/// to `prompt_len - 2` (the prompt less its last id is kept anyway). Ascending.
pub fn prelude_points(prompt_len: usize, prelude: &chat::Prelude) -> Vec<usize> {
    let last = prompt_len.saturating_sub(1);
    let mut points: Vec<usize> = prelude
        .tools_end
        .into_iter()
        .chain([prelude.end])
        .filter(|&p| p > 0 && p < last)
        .collect();
    points.dedup();
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
    /// Shared with a write of it to the session directory ([`super::prefix_files`]).
    snapshot: Arc<Snapshot>,
    bytes: u64,
    /// It ends a prelude: it gives way after the caller's other states.
    prelude: bool,
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
        let snapshots: Vec<&Snapshot> = mine.iter().map(|&i| &*entries[i].snapshot).collect();
        let chosen = best(&snapshots, prompt)?;
        let entry = entries.remove(mine[chosen])?;
        let state = entry.snapshot.state.clone();
        entries.push_back(entry);
        Some(state)
    }

    /// Keeps `snapshots` for `caller` as its newest states — those whose length is one of
    /// `prelude` as prelude states —, then evicts until at most [`PER_CALLER`] states and
    /// [`PRELUDES_PER_CALLER`] prelude states are the caller's (its least recently used
    /// first) and all fit in `allowance` bytes (the account holding the most gives way: its
    /// least recently used state that is not a prelude's, else its least recently used).
    pub fn keep(
        &self,
        caller: &Caller,
        snapshots: Vec<Arc<Snapshot>>,
        prelude: &[usize],
        allowance: u64,
    ) {
        if !caller.is_known() {
            return;
        }
        let mut entries = self.lock();
        for snapshot in snapshots {
            let mut is_prelude = prelude.contains(&snapshot.history.len());
            entries.retain(|e| {
                let same = e.caller == *caller && e.snapshot.history == snapshot.history;
                is_prelude |= same && e.prelude;
                !same
            });
            let bytes = snapshot.state.size_bytes() as u64;
            entries.push_back(Entry {
                caller: caller.clone(),
                snapshot,
                bytes,
                prelude: is_prelude,
            });
        }
        for (kind, most) in [(false, PER_CALLER), (true, PRELUDES_PER_CALLER)] {
            let of_kind = |e: &Entry| e.caller == *caller && e.prelude == kind;
            while entries.iter().filter(|e| of_kind(e)).count() > most {
                let Some(oldest) = entries.iter().position(of_kind) else {
                    break;
                };
                entries.remove(oldest);
            }
        }
        while entries.iter().map(|e| e.bytes).sum::<u64>() > allowance {
            let Some(account) = heaviest_account(&entries) else {
                break;
            };
            let its = |e: &Entry| e.caller.account() == account;
            let Some(oldest) = entries
                .iter()
                .position(|e| its(e) && !e.prelude)
                .or_else(|| entries.iter().position(its))
            else {
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

    fn snap(history: &[u32]) -> Arc<Snapshot> {
        Arc::new(Snapshot {
            history: history.to_vec(),
            state: state_for(history),
        })
    }

    #[test]
    fn the_longest_strict_prefix_of_the_callers_own_states_is_continued() {
        let cache = PrefixCache::default();
        let me = Caller::Uid(1);
        let other = Caller::Uid(2);
        cache.keep(&me, vec![snap(&[1, 2]), snap(&[1, 2, 3, 4])], &[], u64::MAX);
        cache.keep(&other, vec![snap(&[1, 2, 3, 4, 5])], &[], u64::MAX);
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
        cache.keep(&scoped("a"), vec![snap(&[1, 2])], &[], u64::MAX);
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
        cache.keep(&Caller::Unknown, vec![snap(&[7, 8])], &[], u64::MAX);
        assert_eq!(cache.find(&Caller::Unknown, &[7, 8, 9]), None);
        assert_eq!(cache.figures().states, 1);
    }

    #[test]
    fn states_are_bounded_per_caller_and_by_bytes() {
        let cache = PrefixCache::default();
        let me = Caller::Uid(1);
        for n in 1..=PER_CALLER as u32 + 2 {
            cache.keep(&me, vec![snap(&(0..n).collect::<Vec<_>>())], &[], u64::MAX);
        }
        assert_eq!(cache.figures().states, PER_CALLER);
        // The two oldest (1 and 2 ids) went.
        assert_eq!(cache.find(&me, &[0, 1, 7]), None);
        let one = state_for(&[0, 1, 2]).size_bytes() as u64;
        cache.keep(&Caller::Uid(2), vec![snap(&[9])], &[], one);
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
        cache.keep(&a, vec![snap(&[1, 1])], &[], u64::MAX);
        cache.keep(&b, vec![snap(&[2, 1]), snap(&[2, 2])], &[], u64::MAX);
        let allowance = size(&[1, 1]) + size(&[2, 2]) + size(&[2, 3]);
        cache.keep(&b, vec![snap(&[2, 3])], &[], allowance);
        assert_eq!(cache.figures().states, 3);
        assert!(cache.find(&a, &[1, 1, 0]).is_some(), "A's state stays");
        assert_eq!(cache.find(&b, &[2, 1, 0]), None, "B's oldest went");
        // One key's scopes are one account: together they give way to a lighter uid.
        let scoped = |s: &str| Caller::Key {
            key: 0,
            scope: Some(s.into()),
        };
        let fresh = PrefixCache::default();
        fresh.keep(&a, vec![snap(&[1, 1])], &[], u64::MAX);
        fresh.keep(&scoped("x"), vec![snap(&[3, 1])], &[], u64::MAX);
        fresh.keep(&scoped("y"), vec![snap(&[3, 2])], &[], size(&[1, 1]) * 2);
        assert!(fresh.find(&a, &[1, 1, 0]).is_some());
        assert_eq!(fresh.find(&scoped("x"), &[3, 1, 0]), None);
    }

    #[test]
    fn states_are_kept_at_the_last_message_starts_and_before_the_last_id() {
        const EOM: u32 = 9;
        let none = chat::Prelude::default();
        // Three messages, then a generation prompt of two ids.
        let prompt = [1, 2, EOM, 3, EOM, 4, 4, EOM, 5, 6];
        assert_eq!(keep_points(&prompt, Some(EOM), &none), vec![5, 8, 9]);
        // A prompt ending in a message end keeps no second state at the same place.
        assert_eq!(keep_points(&[1, EOM, 2, EOM], Some(EOM), &none), vec![2, 3]);
        assert_eq!(keep_points(&[1, 2, 3], None, &none), vec![2]);
        assert_eq!(keep_points(&[1], Some(EOM), &none), Vec::<usize>::new());
        assert_eq!(keep_points(&[EOM, EOM], Some(EOM), &none), vec![1]);
    }

    #[test]
    fn the_prelude_ends_are_kept_too() {
        const EOM: u32 = 9;
        // Tool declaration (ids 0..3), a system message (3..5), then two user messages.
        let prompt = [1, 2, EOM, 3, EOM, 4, EOM, 5, EOM, 6, 6];
        let prelude = chat::Prelude {
            tools_end: Some(3),
            end: 5,
        };
        // The last two message starts are 7 and 9: without the prelude's, nothing of a new
        // conversation with the same prelude would be kept.
        assert_eq!(
            keep_points(&prompt, Some(EOM), &prelude),
            vec![3, 5, 7, 9, 10]
        );
        assert_eq!(prelude_points(prompt.len(), &prelude), vec![3, 5]);
        // No tools, no system message: nothing more. The two ends in one place: one point.
        assert!(prelude_points(11, &chat::Prelude::default()).is_empty());
        let one = chat::Prelude {
            tools_end: Some(3),
            end: 3,
        };
        assert_eq!(prelude_points(11, &one), vec![3]);
        // Beyond the prompt less its last id: kept as that one only.
        assert!(prelude_points(4, &one).is_empty());
    }

    #[test]
    fn prelude_states_give_way_last() {
        let cache = PrefixCache::default();
        let me = Caller::Uid(1);
        let prelude = snap(&[7, 7]);
        cache.keep(&me, vec![Arc::clone(&prelude)], &[2], u64::MAX);
        // A long conversation's worth of newer states: the prelude state outlives them all.
        for n in 3..3 + 2 * PER_CALLER as u32 {
            cache.keep(&me, vec![snap(&(0..n).collect::<Vec<_>>())], &[], u64::MAX);
        }
        assert_eq!(cache.figures().states, PER_CALLER + 1);
        assert!(
            cache.find(&me, &[7, 7, 1]).is_some(),
            "the prelude state stays"
        );
        // Over the byte allowance, the caller's other states go before its prelude state,
        // although the prelude state is the older one.
        let before = cache.figures().bytes;
        let conversation = snap(&[1, 1, 1]);
        cache.keep(
            &me,
            vec![conversation],
            &[],
            prelude.state.size_bytes() as u64 + 1,
        );
        assert!(cache.figures().bytes < before);
        assert!(
            cache.find(&me, &[7, 7, 1]).is_some(),
            "the prelude state stays"
        );
        assert_eq!(cache.figures().states, 1);
        // Its own bound: the oldest prelude states beyond it go.
        for n in 0..PRELUDES_PER_CALLER as u32 + 1 {
            cache.keep(&me, vec![snap(&[8, n])], &[2], u64::MAX);
        }
        assert_eq!(cache.figures().states, PRELUDES_PER_CALLER);
        assert_eq!(cache.find(&me, &[8, 0, 1]), None);
        assert!(cache.find(&me, &[8, 1, 1]).is_some());
    }
}
