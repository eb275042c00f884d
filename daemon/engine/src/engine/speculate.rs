//! n-gram drafting for exact speculative decoding (engine-lessons §6.2): guess the next ids by
//! finding the sequence's last few ids earlier in the sequence and copying what followed them.
//! The guess is only a proposal — the model verifies every drafted id (see the generation's
//! speculative step), so drafting affects speed, never output.
//!
//! The rule: take the last 4 ids; if they occur earlier (an occurrence followed by at least one
//! id), that n decides, else try the last 3. With one earlier occurrence, propose what followed
//! it. With two or more, the two most recent must agree: propose only the ids on which their
//! continuations coincide (possibly none). An eager drafter without this agreement rule
//! proposed too many losers and ran slower than plain decoding (0.91× on code, §6.2); a failed
//! agreement at 4 does not fall back to 3, since a shorter context is even less reliable.

/// Context lengths tried, longest first.
const NGRAMS: [usize; 2] = [4, 3];

/// Up to `max` ids proposed to follow `context` (prompt + generated so far); empty when the
/// context gives no confident guess.
pub fn propose(context: &[u32], max: usize) -> Vec<u32> {
    if max == 0 {
        return Vec::new();
    }
    for n in NGRAMS {
        let Some(suffix_at) = context.len().checked_sub(n) else {
            continue;
        };
        let suffix = &context[suffix_at..];
        // Earlier occurrences, most recent first; each must be followed by at least one id,
        // which excludes the suffix itself.
        let mut matches = (0..suffix_at)
            .rev()
            .filter(|&i| &context[i..i + n] == suffix)
            .map(|i| &context[i + n..]);
        let Some(latest) = matches.next() else {
            continue;
        };
        let agreed = match matches.next() {
            None => latest.len(),
            Some(older) => latest.iter().zip(older).take_while(|(a, b)| a == b).count(),
        };
        return latest[..agreed.min(max)].to_vec();
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::propose;

    #[test]
    fn no_repetition_proposes_nothing() {
        assert!(propose(&[1, 2, 3, 4, 5, 6, 7, 8], 4).is_empty());
        assert!(propose(&[], 4).is_empty());
        assert!(propose(&[1, 2, 3], 4).is_empty());
    }

    #[test]
    fn one_earlier_four_gram_proposes_its_continuation_up_to_max() {
        let ctx = [1, 2, 3, 4, 9, 8, 7, 6, 5, 1, 2, 3, 4];
        assert_eq!(propose(&ctx, 3), vec![9, 8, 7]);
        // The continuation may run into the latest ids themselves.
        assert_eq!(propose(&ctx, 100), ctx[4..].to_vec());
        assert!(propose(&ctx, 0).is_empty());
    }

    #[test]
    fn three_gram_is_the_fallback_when_no_four_gram_matches() {
        // "2 3 4" occurred before, "1 2 3 4" never did (preceded by 7).
        let ctx = [7, 2, 3, 4, 5, 6, 1, 2, 3, 4];
        assert_eq!(propose(&ctx, 2), vec![5, 6]);
    }

    #[test]
    fn two_matches_must_agree() {
        // The last 4 ids [1 2 3 4] occurred twice, followed by 5 6 7 and 5 6 8: only 5 6 agree.
        let ctx = [1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 8, 0, 1, 2, 3, 4];
        assert_eq!(propose(&ctx, 8), vec![5, 6]);
        // Disagreeing on the first id: nothing, and no fallback to the last 3 ids.
        let ctx = [1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 6, 0, 1, 2, 3, 4];
        assert!(propose(&ctx, 8).is_empty());
        // The two most recent decide; an older disagreeing occurrence does not matter.
        let ctx = [
            1, 2, 3, 4, 9, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4,
        ];
        assert_eq!(propose(&ctx, 3), vec![5, 0, 1]);
    }

    #[test]
    fn a_run_of_one_id_continues_itself() {
        // Overlapping occurrences: the most recent earlier "7 7 7 7" is followed by one 7.
        assert_eq!(propose(&[7; 6], 4), vec![7]);
        assert_eq!(propose(&[7; 9], 4), vec![7]);
    }
}
