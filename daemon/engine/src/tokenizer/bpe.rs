//! Rank BPE (spec §7.4): starting from single bytes, repeatedly merge the adjacent pair whose
//! concatenation has the lowest rank (ties: leftmost) until no adjacent pair is a token.
//!
//! A binary heap of candidate pairs keeps this O(n log n), so the 25,000-character runs the
//! run guard allows (e.g. a line of 25,000 `=`) cost milliseconds, not minutes.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

/// Appends the ranks of `bytes` after rank BPE to `out`. `byte_rank[b]` is the rank of the
/// single byte `b`; every key of `ranks` merged here is a token by construction.
pub fn rank_bpe(
    bytes: &[u8],
    ranks: &FxHashMap<Vec<u8>, u32>,
    byte_rank: &[u32; 256],
    out: &mut Vec<u32>,
) {
    let n = bytes.len();
    // Parts are identified by their start offset; `next[s]` is the end of the part at `s`
    // (= the start of the following part), `prev[s]` the start of the part before it.
    let mut next: Vec<usize> = (1..=n).collect();
    let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
    let mut alive = vec![true; n];
    let mut part_rank: Vec<u32> = bytes.iter().map(|&b| byte_rank[b as usize]).collect();
    // Candidate merges (rank, left start, right end); entries go stale as parts merge and are
    // re-validated when popped. A stale entry whose (left, end) still spans two live parts is
    // the same merge (same bytes, same rank), so it is valid to apply.
    let mut heap = BinaryHeap::with_capacity(n);
    let candidate = |left: usize, end: usize| {
        ranks
            .get(&bytes[left..end])
            .map(|&rank| Reverse((rank, left, end)))
    };
    heap.extend((0..n.saturating_sub(1)).filter_map(|i| candidate(i, i + 2)));
    while let Some(Reverse((rank, left, end))) = heap.pop() {
        if !alive[left] {
            continue;
        }
        let mid = next[left];
        if mid >= end || next[mid] != end {
            continue;
        }
        alive[mid] = false;
        next[left] = end;
        part_rank[left] = rank;
        if end < n {
            prev[end] = left;
            heap.extend(candidate(left, next[end]));
        }
        if left > 0 {
            heap.extend(candidate(prev[left], end));
        }
    }
    let mut start = 0;
    while start < n {
        out.push(part_rank[start]);
        start = next[start];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(extra: &[&[u8]]) -> (FxHashMap<Vec<u8>, u32>, [u32; 256]) {
        let mut ranks = FxHashMap::default();
        let mut byte_rank = [0; 256];
        for b in 0..=255u8 {
            byte_rank[b as usize] = b as u32;
            ranks.insert(vec![b], b as u32);
        }
        for (i, t) in extra.iter().enumerate() {
            ranks.insert(t.to_vec(), 256 + i as u32);
        }
        (ranks, byte_rank)
    }

    fn bpe(text: &[u8], extra: &[&[u8]]) -> Vec<u32> {
        let (ranks, byte_rank) = vocab(extra);
        let mut out = Vec::new();
        rank_bpe(text, &ranks, &byte_rank, &mut out);
        out
    }

    #[test]
    fn lowest_rank_first_then_leftmost() {
        // "bc" (256) beats "ab" (257): a + bc, then "abc" is not a token.
        assert_eq!(bpe(b"abc", &[b"bc", b"ab"]), [97, 256]);
        // Equal pairs: leftmost wins, "aa" "a".
        assert_eq!(bpe(b"aaa", &[b"aa"]), [256, 97]);
        // Merges chain: aa aa -> aaaa.
        assert_eq!(bpe(b"aaaa", &[b"aa", b"aaaa"]), [257]);
        assert_eq!(bpe(b"", &[]), Vec::<u32>::new());
        assert_eq!(bpe(b"x", &[]), [120]);
    }

    #[test]
    fn long_runs_are_fast_and_exact() {
        let text = vec![b'='; 25_000];
        let out = bpe(&text, &[b"==", b"====", b"========"]);
        assert_eq!(out, vec![258; 25_000 / 8]);
    }
}
