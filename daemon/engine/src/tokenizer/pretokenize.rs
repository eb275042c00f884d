//! Pre-tokenisation (spec §7.3, §7.4): the K3 split pattern and the two guards that bound the
//! text any single regex search sees — 400,000-character pieces, then runs capped at 25,000.

/// The K3 pre-tokenisation pattern, byte for byte (spec §7.3). It needs class intersection
/// (`&&`, "these letter categories except Han") and a negative look-ahead, so it runs on
/// `fancy_regex`; the plain `regex` crate rejects the look-ahead.
pub const PATTERN: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+",
    r"|\s+(?!\S)",
    r"|\s+",
);

/// Longest text handed to one encode pass, in characters (spec §7.4).
pub const PIECE_CHARS: usize = 400_000;

/// Longest run of all-whitespace or all-non-whitespace characters (spec §7.4, `cap_runs`).
pub const MAX_RUN: usize = 25_000;

/// Python's `str.isspace`, which the official run guard uses; it differs from Rust's
/// `char::is_whitespace` (it includes U+001C..U+001F), so the list is spelled out (spec §7.4).
pub fn is_python_space(c: char) -> bool {
    matches!(c,
        '\u{9}'..='\u{d}'
        | '\u{1c}'..='\u{20}'
        | '\u{85}'
        | '\u{a0}'
        | '\u{1680}'
        | '\u{2000}'..='\u{200a}'
        | '\u{2028}'
        | '\u{2029}'
        | '\u{202f}'
        | '\u{205f}'
        | '\u{3000}')
}

/// Splits `text` into pieces of at most `piece_chars` characters, then each piece with
/// [`cap_runs`]; regex matches and added-token matches never cross the resulting cuts.
pub fn slices(text: &str, piece_chars: usize, max_run: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let cut = rest
            .char_indices()
            .nth(piece_chars)
            .map_or(rest.len(), |(i, _)| i);
        let (piece, tail) = rest.split_at(cut);
        cap_runs(piece, max_run, &mut out);
        rest = tail;
    }
    out
}

/// The official long-run guard (spec §7.4): count the current run of whitespace or
/// non-whitespace characters; when it would exceed `max_run`, cut before the current character.
fn cap_runs<'a>(piece: &'a str, max_run: usize, out: &mut Vec<&'a str>) {
    let mut start = 0;
    let mut run = 0usize;
    let mut run_is_space = piece.chars().next().is_some_and(is_python_space);
    for (i, c) in piece.char_indices() {
        let space = is_python_space(c);
        if space != run_is_space {
            run_is_space = space;
            run = 1;
        } else {
            run += 1;
            if run > max_run {
                out.push(&piece[start..i]);
                start = i;
                run = 1;
            }
        }
    }
    if start < piece.len() {
        out.push(&piece[start..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_space_classes() {
        let spaces: Vec<u32> = (0..0x11000)
            .filter_map(char::from_u32)
            .filter(|&c| is_python_space(c))
            .map(u32::from)
            .collect();
        // Python: [i for i in range(0x110000) if chr(i).isspace()]
        let python = [
            0x9, 0xa, 0xb, 0xc, 0xd, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0, 0x1680, 0x2000,
            0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028,
            0x2029, 0x202f, 0x205f, 0x3000,
        ];
        assert_eq!(spaces, python);
    }

    #[test]
    fn runs_are_capped_and_counters_restart() {
        let text = format!("{}{}x", "a".repeat(7), " ".repeat(3));
        assert_eq!(slices(&text, 100, 3), ["aaa", "aaa", "a   x"]);
        // The piece cut restarts the run count: 5 chars per piece, runs of 3.
        assert_eq!(slices("aaaaaaaa", 5, 3), ["aaa", "aa", "aaa"]);
        assert_eq!(slices("", 5, 3), Vec::<&str>::new());
        // Characters, not bytes.
        assert_eq!(slices("ééé", 2, 10), ["éé", "é"]);
    }
}
