//! Reading the two tokenizer files of a checkpoint (spec §7.1): `tiktoken.model` (the BPE ranks)
//! and `tokenizer_config.json` (the names of the 256 added-token slots after them).

use std::path::Path;

use base64::Engine as _;
use rustc_hash::FxHashMap;

use super::error::TokenizerError;

/// The tokenizer files of a checkpoint directory (spec §7.1).
pub const RANKS_FILE: &str = "tiktoken.model";
pub const CONFIG_FILE: &str = "tokenizer_config.json";

/// Number of added-token slots after the BPE ranks (spec §7.1): 163,584..163,839 in K3.
pub const ADDED_SLOTS: u32 = 256;

/// The BPE vocabulary: `tokens[rank]` are the bytes of a rank, `ranks` the inverse.
pub struct Ranks {
    pub tokens: Vec<Vec<u8>>,
    pub ranks: FxHashMap<Vec<u8>, u32>,
}

fn read(path: &Path) -> Result<Vec<u8>, TokenizerError> {
    crate::input_file::read(path).map_err(|error| TokenizerError::Io {
        path: path.to_path_buf(),
        error,
    })
}

/// Parses `<base64 bytes> <rank>` lines; `\r\n` and blank lines are tolerated. Ranks are the
/// ids, so they must be exactly 0..n-1 with no duplicates, and bytes must be unique.
pub fn read_ranks(path: &Path) -> Result<Ranks, TokenizerError> {
    let data = read(path)?;
    let line_error = |line: usize, reason: String| TokenizerError::ModelLine {
        path: path.to_path_buf(),
        line,
        reason,
    };
    // (rank, bytes, line number) in file order; placed by rank once the count is known.
    let mut entries: Vec<(u32, Vec<u8>, usize)> = Vec::with_capacity(data.len() / 12);
    for (index, raw) in data.split(|&b| b == b'\n').enumerate() {
        let line = index + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let mut fields = raw.split(|&b| b == b' ').filter(|f| !f.is_empty());
        let (Some(token), rank, None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(line_error(
                line,
                "expected two fields, `<base64> <rank>`".into(),
            ));
        };
        let Some(rank) = rank else {
            return Err(line_error(line, "missing rank".into()));
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(token)
            .map_err(|e| line_error(line, format!("bad base64: {e}")))?;
        if bytes.is_empty() {
            return Err(line_error(line, "empty token".into()));
        }
        let rank = std::str::from_utf8(rank)
            .ok()
            .and_then(|r| r.parse::<u32>().ok())
            .ok_or_else(|| {
                line_error(
                    line,
                    format!("rank {:?} is not a number", String::from_utf8_lossy(rank)),
                )
            })?;
        entries.push((rank, bytes, line));
    }
    if entries.is_empty() {
        return Err(TokenizerError::EmptyModel {
            path: path.to_path_buf(),
        });
    }
    let count = entries.len();
    let mut lines = vec![0usize; count];
    let mut tokens = vec![Vec::new(); count];
    let mut ranks = FxHashMap::with_capacity_and_hasher(count, Default::default());
    for (rank, bytes, line) in entries {
        let slot = rank as usize;
        let Some(&first_line) = lines.get(slot) else {
            return Err(TokenizerError::RanksNotContiguous {
                path: path.to_path_buf(),
                line,
                rank,
                count,
            });
        };
        if first_line != 0 {
            return Err(TokenizerError::DuplicateRank {
                path: path.to_path_buf(),
                line,
                rank,
                first_line,
            });
        }
        if let Some(&first_rank) = ranks.get(&bytes) {
            return Err(TokenizerError::DuplicateToken {
                path: path.to_path_buf(),
                line,
                first_rank,
            });
        }
        lines[slot] = line;
        ranks.insert(bytes.clone(), rank);
        tokens[slot] = bytes;
    }
    // `count` distinct ranks all below `count` cover 0..count exactly: no gap is possible here.
    for byte in 0..=u8::MAX {
        if !ranks.contains_key([byte].as_slice()) {
            return Err(TokenizerError::MissingByte {
                path: path.to_path_buf(),
                byte,
            });
        }
    }
    Ok(Ranks { tokens, ranks })
}

/// Reads `added_tokens_decoder` from `tokenizer_config.json` and names all `ADDED_SLOTS` slots
/// starting at id `first`: a named slot takes its `content`, every other slot is
/// `<|reserved_token_<id>|>` (spec §7.1). Names must be unique, since encoding maps them back.
pub fn read_added(path: &Path, first: u32) -> Result<Vec<String>, TokenizerError> {
    let data = read(path)?;
    let config_error = |reason: String| TokenizerError::Config {
        path: path.to_path_buf(),
        reason,
    };
    let json: serde_json::Value =
        serde_json::from_slice(&data).map_err(|e| config_error(format!("invalid JSON: {e}")))?;
    let decoder = json
        .get("added_tokens_decoder")
        .ok_or_else(|| config_error("no added_tokens_decoder".into()))?
        .as_object()
        .ok_or_else(|| config_error("added_tokens_decoder is not an object".into()))?;
    let end = first + ADDED_SLOTS;
    let mut names: Vec<String> = (first..end)
        .map(|id| format!("<|reserved_token_{id}|>"))
        .collect();
    for (key, entry) in decoder {
        let id: u64 = key.parse().map_err(|_| {
            config_error(format!(
                "added_tokens_decoder key {key:?} is not a decimal id"
            ))
        })?;
        let slot = u32::try_from(id)
            .ok()
            .filter(|id| (first..end).contains(id))
            .ok_or_else(|| TokenizerError::AddedIdOutOfRange {
                path: path.to_path_buf(),
                key: key.clone(),
                id,
                first,
                end,
            })?
            - first;
        let content = entry
            .get("content")
            .and_then(|c| c.as_str())
            .filter(|c| !c.is_empty())
            .ok_or_else(|| {
                config_error(format!(
                    "added_tokens_decoder[{key:?}] has no non-empty string \"content\""
                ))
            })?;
        names[slot as usize] = content.to_owned();
    }
    let mut seen: FxHashMap<&str, u32> = FxHashMap::default();
    for (id, name) in (first..end).zip(&names) {
        if let Some(&other) = seen.get(name.as_str()) {
            return Err(TokenizerError::DuplicateAddedContent {
                path: path.to_path_buf(),
                content: name.clone(),
                first: other,
                second: id,
            });
        }
        seen.insert(name, id);
    }
    Ok(names)
}
