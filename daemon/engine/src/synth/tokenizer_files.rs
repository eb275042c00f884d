//! The tokenizer files of a synthetic checkpoint (spec §7.1–§7.2): a small real byte-level BPE
//! vocabulary learned from an embedded English/code text, written as `tiktoken.model`, and
//! `tokenizer_config.json` with the K3 added tokens placed right after the ranks.
//!
//! Ranks follow merge order (the 256 single bytes first, then merge `i` at rank `256 + i`),
//! so tiktoken's rank-based BPE — always merge the adjacent pair whose concatenation has the
//! lowest rank — reproduces the learned segmentation.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::{Value, json};

/// Added-token slots after the ranks (spec §7.1: ids 163584..163839 in the release).
pub const ADDED_SLOTS: usize = 256;

/// The named added tokens as (offset from the first added id, content, `special`) (spec §7.2).
pub const NAMED_ADDED: [(usize, &str, bool); 16] = [
    (0, "[BOS]", true),
    (1, "[EOS]", true),
    (2, "<|end_of_msg|>", true),
    (3, "<|open|>", false),
    (4, "<|close|>", false),
    (5, "<|sep|>", false),
    (6, "[start_header_id]", true),
    (7, "[end_header_id]", true),
    (9, "[EOT]", true),
    (18, "<|media_begin|>", true),
    (19, "<|media_content|>", true),
    (20, "<|media_end|>", true),
    (21, "<|media_pad|>", true),
    (65, "<osagent_mode>", true),
    (254, "[UNK]", true),
    (255, "[PAD]", true),
];

/// Offsets of the ids the configs name (spec §2.1).
pub const BOS_OFFSET: usize = 0;
pub const EOS_OFFSET: usize = 2;
pub const PAD_OFFSET: usize = 255;
pub const MEDIA_PAD_OFFSET: usize = 21;

const CORPUS: &str = include_str!("corpus.txt");

/// A learned vocabulary: `ranks[r]` = the bytes of rank `r`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocab {
    pub ranks: Vec<Vec<u8>>,
}

impl Vocab {
    /// Learns up to `merges` merges from the embedded corpus (fewer if no pair occurs twice).
    pub fn learn(merges: usize) -> Vocab {
        learn_from(CORPUS, merges)
    }

    /// First id after the ranks: the `[BOS]` slot.
    pub fn n_ranks(&self) -> usize {
        self.ranks.len()
    }

    /// `tiktoken.model`: one line `<base64 of the bytes> <rank>` per rank (spec §7.1).
    pub fn tiktoken_model(&self) -> String {
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut out = String::new();
        for (rank, bytes) in self.ranks.iter().enumerate() {
            out.push_str(&b64.encode(bytes));
            out.push(' ');
            out.push_str(&rank.to_string());
            out.push('\n');
        }
        out
    }

    /// `tokenizer_config.json` (spec §7.1): the 16 named added tokens at `n_ranks + offset`.
    pub fn tokenizer_config(&self) -> Value {
        let base = self.n_ranks();
        let decoder: serde_json::Map<String, Value> = NAMED_ADDED
            .iter()
            .map(|&(off, content, special)| {
                let entry = json!({
                    "content": content,
                    "lstrip": false,
                    "normalized": false,
                    "rstrip": false,
                    "single_word": false,
                    "special": special,
                });
                ((base + off).to_string(), entry)
            })
            .collect();
        json!({
            "added_tokens_decoder": decoder,
            "bos_token": "[BOS]",
            "eos_token": "[EOS]",
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "model_max_length": 1048576,
            "tokenizer_class": "TikTokenTokenizer",
        })
    }
}

/// The 256 single bytes in the byte-level BPE order (printable bytes first), so that rank 0
/// is `!` as in the release (`IQ== 0`, spec §7.1).
fn byte_order() -> Vec<u8> {
    let mut order: Vec<u8> = (b'!'..=b'~')
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let rest: Vec<u8> = (0..=255u8).filter(|b| !order.contains(b)).collect();
    order.extend(rest);
    order
}

/// Splits ASCII training text into pieces shaped like the K3 pre-tokeniser's (spec §7.3):
/// an optional leading space or punctuation mark glued to a letter run, digit runs of at most
/// three, punctuation runs with an optional leading space and trailing newlines, whitespace
/// runs that leave their last space to the next word. Only used for learning merges; encoding
/// uses the real pattern in the tokenizer module.
fn pieces(text: &str) -> Vec<&[u8]> {
    let b = text.as_bytes();
    let is_punct = |c: u8| !c.is_ascii_alphanumeric() && !c.is_ascii_whitespace();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        let c = b[i];
        let next = b.get(i + 1).copied().unwrap_or(b'\n');
        if c.is_ascii_alphabetic() || ((c == b' ' || is_punct(c)) && next.is_ascii_alphabetic()) {
            i += 1;
            while i < b.len() && b[i].is_ascii_alphabetic() {
                i += 1;
            }
        } else if c.is_ascii_digit() {
            while i < b.len() && i - start < 3 && b[i].is_ascii_digit() {
                i += 1;
            }
        } else if is_punct(c) || (c == b' ' && is_punct(next)) {
            i += 1;
            while i < b.len() && is_punct(b[i]) {
                i += 1;
            }
            while i < b.len() && (b[i] == b'\n' || b[i] == b'\r') {
                i += 1;
            }
        } else {
            // Whitespace: up to the last newline if any, else all but a final space that
            // precedes a non-space (it belongs to the next piece).
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            let run = &b[start..i];
            if let Some(nl) = run.iter().rposition(|&x| x == b'\n' || x == b'\r') {
                i = start + nl + 1;
            } else if i < b.len() && i - start > 1 {
                i -= 1;
            }
        }
        out.push(&b[start..i]);
    }
    out
}

fn learn_from(text: &str, merges: usize) -> Vocab {
    let order = byte_order();
    let mut rank_of_byte = [0u32; 256];
    for (r, &byte) in order.iter().enumerate() {
        rank_of_byte[usize::from(byte)] = r as u32;
    }
    let mut ranks: Vec<Vec<u8>> = order.iter().map(|&b| vec![b]).collect();
    let mut index: BTreeMap<Vec<u8>, u32> = ranks
        .iter()
        .enumerate()
        .map(|(r, b)| (b.clone(), r as u32))
        .collect();

    // Unique pieces with their counts; BTreeMap keeps every step deterministic.
    let mut counts: BTreeMap<&[u8], u64> = BTreeMap::new();
    for p in pieces(text) {
        *counts.entry(p).or_insert(0) += 1;
    }
    let mut words: Vec<(Vec<u32>, u64)> = counts
        .into_iter()
        .map(|(p, n)| (p.iter().map(|&b| rank_of_byte[usize::from(b)]).collect(), n))
        .collect();

    for _ in 0..merges {
        let mut pairs: BTreeMap<(u32, u32), u64> = BTreeMap::new();
        for (w, n) in &words {
            for pair in w.windows(2) {
                *pairs.entry((pair[0], pair[1])).or_insert(0) += n;
            }
        }
        // Most frequent pair; ties → the smallest (left rank, right rank).
        let Some((&(a, b), &n)) = pairs.iter().max_by(|x, y| x.1.cmp(y.1).then(y.0.cmp(x.0)))
        else {
            break;
        };
        if n < 2 {
            break;
        }
        let mut bytes = ranks[a as usize].clone();
        bytes.extend_from_slice(&ranks[b as usize]);
        // A concatenation reached earlier through another split keeps its rank (keys unique).
        let id = *index.entry(bytes.clone()).or_insert_with(|| {
            ranks.push(bytes);
            (ranks.len() - 1) as u32
        });
        for (w, _) in &mut words {
            let mut merged = Vec::with_capacity(w.len());
            let mut i = 0;
            while i < w.len() {
                if i + 1 < w.len() && w[i] == a && w[i + 1] == b {
                    merged.push(id);
                    i += 2;
                } else {
                    merged.push(w[i]);
                    i += 1;
                }
            }
            *w = merged;
        }
    }
    Vocab { ranks }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Test oracle: tiktoken's rank BPE (spec §7.4 `rank_bpe`) over this vocabulary.
    fn rank_bpe(v: &Vocab, piece: &[u8]) -> Vec<Vec<u8>> {
        let index: BTreeMap<&[u8], usize> = v
            .ranks
            .iter()
            .enumerate()
            .map(|(r, b)| (b.as_slice(), r))
            .collect();
        let mut parts: Vec<Vec<u8>> = piece.iter().map(|&b| vec![b]).collect();
        loop {
            let best = (0..parts.len().saturating_sub(1))
                .filter_map(|i| {
                    let cat = [parts[i].as_slice(), parts[i + 1].as_slice()].concat();
                    index.get(cat.as_slice()).map(|&r| (r, i))
                })
                .min();
            let Some((_, i)) = best else { break };
            let right = parts.remove(i + 1);
            parts[i].extend(right);
        }
        parts
    }

    #[test]
    fn ranks_are_unique_and_start_with_bang() {
        let v = Vocab::learn(128);
        assert_eq!(v.ranks[0], b"!".to_vec());
        assert_eq!(v.n_ranks(), 256 + 128);
        let unique: std::collections::BTreeSet<_> = v.ranks.iter().collect();
        assert_eq!(unique.len(), v.n_ranks());
        assert!(v.tiktoken_model().starts_with("IQ== 0\n"));
    }

    /// Every merged token is reachable by rank BPE: applied to its own bytes, rank BPE yields
    /// exactly that one token.
    #[test]
    fn rank_bpe_reproduces_every_token() {
        let v = Vocab::learn(1024);
        for t in &v.ranks {
            assert_eq!(
                rank_bpe(&v, t),
                vec![t.clone()],
                "{:?}",
                String::from_utf8_lossy(t)
            );
        }
    }

    #[test]
    fn pieces_cover_the_text() {
        let text = "Hello world,  it's 12345 (ok)\n\n  fn x() {}\n";
        let p = pieces(text);
        assert_eq!(p.concat(), text.as_bytes());
        assert!(p.contains(&b" world".as_slice()));
        assert!(p.contains(&b"123".as_slice()));
    }

    #[test]
    fn added_tokens_follow_the_ranks() {
        let v = Vocab::learn(16);
        let c = v.tokenizer_config();
        let base = v.n_ranks();
        let dec = &c["added_tokens_decoder"];
        assert_eq!(dec[(base + 2).to_string()]["content"], "<|end_of_msg|>");
        assert_eq!(dec[(base + 3).to_string()]["special"], false);
        assert_eq!(dec[(base + 255).to_string()]["content"], "[PAD]");
        assert_eq!(dec.as_object().unwrap().len(), 16);
    }
}
