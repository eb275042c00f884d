//! The vocabulary as the matcher sees it: each id's symbols (its bytes, or one control), the
//! text ids as a byte trie, and precomputed sets for the states where nearly every id is
//! allowed (inside free text or a string), so the allowed set of an id position costs a walk
//! of the trie only where the grammar prunes it early.
//!
//! Built once per tokenizer ([`Vocab::new`], ~0.1 s for K3's 163,840 ids) and shared by every
//! constrained request (the serve core keeps it).

use super::json::Scan;
use super::matcher::{self, Ctl, Sym, Thread};
use super::{Grammar, json, reply_grammar};
use crate::engine::guide::IdSet;
use crate::tokenizer::Tokenizer;

/// The vocabulary's symbols and the trie of its text ids.
pub struct Vocab {
    size: usize,
    /// Each id's bytes (controls' and other added ids' too), flat.
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    /// The control ids of each [`Ctl`].
    controls: [(Ctl, Vec<u32>); 4],
    /// Text ids: the tokenizer's ranks (added ids are never constrained output).
    text: IdSet,
    trie: Trie,
    /// Text ids a JSON string (`json`) or a raw string (`raw`) takes whole from a neutral
    /// position, and the text ids that need a check (they may end the string, open an escape,
    /// or hold part of a character).
    json_plain: IdSet,
    json_other: Vec<u32>,
    raw_plain: IdSet,
    raw_other: Vec<u32>,
    /// Characters of each id (only meaningful for the plain ones).
    chars: Vec<u8>,
    /// The most characters of any plain id.
    max_plain_chars: u32,
}

impl std::fmt::Debug for Vocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocab")
            .field("size", &self.size)
            .field("trie_nodes", &self.trie.byte.len())
            .finish()
    }
}

/// Text ids by byte prefix, in pre-order: node `i`'s children follow it, each child's subtree
/// contiguous, `end[i]` one past its subtree.
struct Trie {
    byte: Vec<u8>,
    /// The id whose bytes end here, or `u32::MAX`.
    id: Vec<u32>,
    end: Vec<u32>,
}

const NO_ID: u32 = u32::MAX;

impl Vocab {
    pub fn new(tokenizer: &Tokenizer) -> Vocab {
        let size = tokenizer.vocab_size();
        let c = tokenizer.controls();
        let control_ids = [c.open, c.close, c.sep, c.end_of_msg, c.eos];
        let mut bytes = Vec::new();
        let mut offsets = vec![0u32];
        for id in 0..size as u32 {
            bytes.extend_from_slice(tokenizer.token_bytes(id).unwrap_or_default());
            offsets.push(bytes.len() as u32);
        }
        let ranks = tokenizer.rank_count();
        let mut text = IdSet::new(size);
        let mut ids: Vec<u32> = Vec::with_capacity(ranks);
        for id in 0..ranks.min(size) as u32 {
            let b = &bytes[offsets[id as usize] as usize..offsets[id as usize + 1] as usize];
            if !b.is_empty() && !control_ids.contains(&id) {
                text.insert(id);
                ids.push(id);
            }
        }
        let token =
            |id: u32| &bytes[offsets[id as usize] as usize..offsets[id as usize + 1] as usize];
        ids.sort_by(|a, b| token(*a).cmp(token(*b)));
        let trie = Trie::build(&ids, token);
        let mut chars = vec![0u8; size];
        let (mut json_plain, mut raw_plain) = (IdSet::new(size), IdSet::new(size));
        let (mut json_other, mut raw_other) = (Vec::new(), Vec::new());
        let mut max_plain_chars = 0;
        for &id in &ids {
            let b = token(id);
            let plain = |json: bool| {
                let scan = b.iter().try_fold(Scan::default(), |s, &x| {
                    (!(json && x == b'"'))
                        .then(|| s.step(x, json, None))
                        .flatten()
                });
                scan.filter(|s| s.is_neutral() && !(json && b.contains(&b'\\')))
            };
            match plain(true) {
                Some(s) => {
                    json_plain.insert(id);
                    chars[id as usize] = s.chars.min(255) as u8;
                    max_plain_chars = max_plain_chars.max(s.chars);
                }
                None => json_other.push(id),
            }
            match plain(false) {
                Some(s) => {
                    raw_plain.insert(id);
                    chars[id as usize] = s.chars.min(255) as u8;
                    max_plain_chars = max_plain_chars.max(s.chars);
                }
                None => raw_other.push(id),
            }
        }
        Vocab {
            size,
            controls: [
                (Ctl::Open, vec![c.open]),
                (Ctl::Close, vec![c.close]),
                (Ctl::Sep, vec![c.sep]),
                (Ctl::End, vec![c.end_of_msg, c.eos]),
            ],
            bytes,
            offsets,
            text,
            trie,
            json_plain,
            json_other,
            raw_plain,
            raw_other,
            chars,
            max_plain_chars,
        }
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// The symbols of `id`: one control, or its bytes.
    pub fn symbols(&self, id: u32) -> Vec<Sym> {
        if let Some((ctl, _)) = self.controls.iter().find(|(_, ids)| ids.contains(&id)) {
            return vec![Sym::Ctl(*ctl)];
        }
        matcher::bytes(self.token(id)).collect()
    }

    /// Whether `id` is a control id.
    pub fn is_control(&self, id: u32) -> bool {
        self.controls.iter().any(|(_, ids)| ids.contains(&id))
    }

    /// The id of `ctl` (the first, for `End`).
    pub fn control(&self, ctl: Ctl) -> u32 {
        self.controls
            .iter()
            .find(|(c, _)| *c == ctl)
            .map_or(0, |(_, ids)| ids[0])
    }

    fn token(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i >= self.size {
            return &[];
        }
        &self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// Every text id (for the think channel's free text).
    pub fn text(&self) -> &IdSet {
        &self.text
    }

    /// Into `out`, every id some thread of `threads` can take next.
    pub fn allowed(&self, g: &Grammar, threads: &[Thread], out: &mut IdSet) {
        out.clear();
        for (ctl, ids) in &self.controls {
            if !matcher::advance(g, threads, Sym::Ctl(*ctl)).is_empty() {
                for &id in ids {
                    out.insert(id);
                }
            }
        }
        if let Some((plain, other, room)) = self.string_state(threads) {
            match room {
                Some(room) if room < self.max_plain_chars => {
                    for id in plain.iter() {
                        if self.chars[id as usize] as u32 <= room {
                            out.insert(id);
                        }
                    }
                }
                _ => out.union_with(plain),
            }
            for &id in other {
                let syms: Vec<Sym> = matcher::bytes(self.token(id)).collect();
                if !matcher::advance_all(g, threads, &syms).is_empty() {
                    out.insert(id);
                }
            }
            return;
        }
        self.walk(g, 0, threads, out);
    }

    /// When the only thread is inside string text at a character boundary: the ids it takes
    /// whole, the ids to check one by one, and the characters it has room for.
    fn string_state(&self, threads: &[Thread]) -> Option<(&IdSet, &[u32], Option<u32>)> {
        let [thread] = threads else {
            return None;
        };
        match thread.last()? {
            matcher::Frame::Json(json::JsonFrame::Str { max, scan, .. }) if scan.is_neutral() => {
                Some((
                    &self.json_plain,
                    &self.json_other,
                    max.map(|m| m - scan.chars),
                ))
            }
            matcher::Frame::Reply(reply_grammar::ReplyFrame::RawStr { max, scan, .. })
                if scan.is_neutral() =>
            {
                Some((
                    &self.raw_plain,
                    &self.raw_other,
                    max.map(|m| m - scan.chars),
                ))
            }
            _ => None,
        }
    }

    fn walk(&self, g: &Grammar, node: usize, threads: &[Thread], out: &mut IdSet) {
        let t = &self.trie;
        let mut child = node + 1;
        let end = t.end[node] as usize;
        while child < end {
            let next = matcher::advance(g, threads, Sym::Byte(t.byte[child]));
            if !next.is_empty() {
                if t.id[child] != NO_ID {
                    out.insert(t.id[child]);
                }
                self.walk(g, child, &next, out);
            }
            child = t.end[child] as usize;
        }
    }
}

impl Trie {
    /// The trie of `ids` (sorted by their bytes).
    fn build<'a>(ids: &[u32], token: impl Fn(u32) -> &'a [u8]) -> Trie {
        let mut trie = Trie {
            byte: vec![0],
            id: vec![NO_ID],
            end: vec![0],
        };
        // The open path: node index per depth (depth 0 = the root).
        let mut path: Vec<usize> = vec![0];
        let mut previous: &[u8] = &[];
        for &id in ids {
            let b = token(id);
            let common = b.iter().zip(previous).take_while(|(x, y)| x == y).count();
            while path.len() > common + 1 {
                let done = path.pop().unwrap_or(0);
                trie.end[done] = trie.byte.len() as u32;
            }
            for &byte in &b[common..] {
                trie.byte.push(byte);
                trie.id.push(NO_ID);
                trie.end.push(0);
                path.push(trie.byte.len() - 1);
            }
            let last = *path.last().unwrap_or(&0);
            trie.id[last] = id;
            previous = b;
        }
        let len = trie.byte.len() as u32;
        for done in path {
            trie.end[done] = len;
        }
        trie
    }
}
