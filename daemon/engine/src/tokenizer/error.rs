//! Typed errors of the tokenizer: every one names the file and line, JSON key, id or text
//! position it is about, so a bad checkpoint or bad input is diagnosable from the message alone.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The I/O error is part of the message, not a `source`, so a `{:#}` chain shows it once.
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },

    #[error("{}:{line}: {reason}", path.display())]
    ModelLine {
        path: PathBuf,
        line: usize,
        reason: String,
    },

    #[error("{}:{line}: rank {rank} already given on line {first_line}", path.display())]
    DuplicateRank {
        path: PathBuf,
        line: usize,
        rank: u32,
        first_line: usize,
    },

    #[error("{}:{line}: token bytes already given rank {first_rank}", path.display())]
    DuplicateToken {
        path: PathBuf,
        line: usize,
        first_rank: u32,
    },

    /// Ranks must be exactly 0..n-1 (spec §7.1): they are the ids.
    #[error(
        "{}:{line}: rank {rank} is not contiguous: the file has {count} ranks, so ranks must be 0..{count}",
        path.display()
    )]
    RanksNotContiguous {
        path: PathBuf,
        line: usize,
        rank: u32,
        count: usize,
    },

    #[error("{}: no ranks", path.display())]
    EmptyModel { path: PathBuf },

    /// Rank BPE starts from single bytes, so all 256 must be keys (spec §7.4).
    #[error("{}: byte 0x{byte:02x} is not a token; all 256 single bytes must be", path.display())]
    MissingByte { path: PathBuf, byte: u8 },

    #[error("{}: {reason}", path.display())]
    Config { path: PathBuf, reason: String },

    #[error(
        "{}: added_tokens_decoder key \"{key}\": id {id} is outside the added-token slots {first}..{end}",
        path.display()
    )]
    AddedIdOutOfRange {
        path: PathBuf,
        key: String,
        id: u64,
        first: u32,
        end: u32,
    },

    #[error(
        "{}: added tokens {first} and {second} share the content {content:?}",
        path.display()
    )]
    DuplicateAddedContent {
        path: PathBuf,
        content: String,
        first: u32,
        second: u32,
    },

    /// The chat template (spec §8) and end-of-turn detection need these names.
    #[error("{}: no added token is named {name:?}", path.display())]
    MissingControlToken { path: PathBuf, name: &'static str },

    /// The embedding and lm_head have `vocab_size` rows (spec §2.2): an id at or beyond it has
    /// no row, so the checkpoint's files disagree. Fewer ids than rows is a padded embedding
    /// and loads.
    #[error(
        "{}: the tokenizer has {ids} ids ({ranks} ranks + {added} added slots) but config.json \
         vocab_size is {vocab_size}: ids {vocab_size}..{ids} would have no embedding row",
        path.display()
    )]
    MoreIdsThanVocabulary {
        path: PathBuf,
        ids: usize,
        ranks: usize,
        added: u32,
        vocab_size: usize,
    },

    #[error("the pre-tokeniser pattern does not compile: {0}")]
    Pattern(String),

    #[error("pre-tokeniser regex failed at byte {offset} of the text: {reason}")]
    Regex { offset: usize, reason: String },

    #[error("token id {id} at position {position} is outside the vocabulary (size {vocab_size})")]
    UnknownId {
        id: u32,
        position: usize,
        vocab_size: usize,
    },
}
