//! Finding added-token strings in text, for encodes that recognise them (spec §7.4).

use rustc_hash::FxHashMap;

/// A piece of a slice split at added-token strings.
#[derive(Debug, PartialEq, Eq)]
pub enum Part<'a> {
    Text(&'a str),
    Added(u32),
}

/// The 256 added-token strings, looked up by exact bytes at candidate positions.
pub struct AddedTokens {
    by_content: FxHashMap<Box<[u8]>, u32>,
    /// Distinct content lengths, longest first: at a position the longest match wins.
    lengths: Vec<usize>,
    /// Bytes that begin some content: only these positions need a lookup.
    starts: [bool; 256],
}

impl AddedTokens {
    pub fn new<'a>(tokens: impl IntoIterator<Item = (u32, &'a str)>) -> Self {
        let mut by_content = FxHashMap::default();
        let mut lengths = Vec::new();
        let mut starts = [false; 256];
        for (id, content) in tokens {
            if let Some(&first) = content.as_bytes().first() {
                starts[first as usize] = true;
                lengths.push(content.len());
                by_content.insert(content.as_bytes().into(), id);
            }
        }
        lengths.sort_unstable_by(|a, b| b.cmp(a));
        lengths.dedup();
        AddedTokens {
            by_content,
            lengths,
            starts,
        }
    }

    /// The id of the added token whose content is exactly `content`.
    pub fn id(&self, content: &str) -> Option<u32> {
        self.by_content.get(content.as_bytes()).copied()
    }

    /// Splits `text` at the leftmost added-token strings, longest at each position. Matches
    /// start on character boundaries because contents are UTF-8 and never start with a
    /// continuation byte; empty text parts are dropped.
    pub fn split<'a>(&self, text: &'a str) -> Vec<Part<'a>> {
        let bytes = text.as_bytes();
        let mut parts = Vec::new();
        let (mut start, mut i) = (0, 0);
        while i < bytes.len() {
            let found = if self.starts[bytes[i] as usize] {
                self.lengths.iter().find_map(|&len| {
                    let candidate = bytes.get(i..i + len)?;
                    self.by_content.get(candidate).map(|&id| (id, len))
                })
            } else {
                None
            };
            match found {
                Some((id, len)) => {
                    if start < i {
                        parts.push(Part::Text(&text[start..i]));
                    }
                    parts.push(Part::Added(id));
                    i += len;
                    start = i;
                }
                None => i += 1,
            }
        }
        if start < bytes.len() {
            parts.push(Part::Text(&text[start..]));
        }
        parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftmost_longest() {
        let added = AddedTokens::new([(10, "<|a|>"), (11, "<|a|>b"), (12, "[X]")]);
        assert_eq!(
            added.split("x<|a|>b<|a|>[X][X"),
            [
                Part::Text("x"),
                Part::Added(11),
                Part::Added(10),
                Part::Added(12),
                Part::Text("[X"),
            ]
        );
        assert_eq!(added.split("é<|a|"), [Part::Text("é<|a|")]);
    }
}
