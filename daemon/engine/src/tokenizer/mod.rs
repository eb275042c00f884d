//! The K3 tokenizer (spec §7) and chat template (spec §8).
//!
//! * [`files`] reads `tiktoken.model` and `tokenizer_config.json`;
//! * [`pretokenize`] holds the K3 split pattern and the piece / run guards;
//! * [`bpe`] is tiktoken-style rank BPE; [`added`] finds added-token strings;
//! * [`stream`] releases decoded text only as complete UTF-8;
//! * [`chat`] renders conversations (XTML) and parses replies.
//!
//! Encoding is our own rank BPE on `fancy_regex`, not the `tokenizers` crate: measured in one
//! run (`examples/tokenizer_bench.rs`, 163,840 ids), it loads in about a tenth of the time
//! and encodes about three times faster, at the speed of tiktoken-rs's CoreBPE; and the spec's
//! piece / run guards, per-call specials switch and whole-piece fast path are explicit in
//! [`Tokenizer::encode`] rather than reconstructed around a third-party pipeline.

mod added;
mod bpe;
pub mod chat;
mod error;
mod files;
pub mod pretokenize;
mod stream;

use std::path::Path;

use rustc_hash::FxHashMap;

pub use error::TokenizerError;
pub use files::{ADDED_SLOTS, CONFIG_FILE, RANKS_FILE};
pub use stream::StreamDecoder;

use added::{AddedTokens, Part};

/// Whether added-token strings in the text become their ids (spec §7.4). There is no default:
/// every raw encode says which, and user text is always [`Specials::Plain`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Specials {
    /// `<|open|>` etc. in the text become their ids.
    Recognised,
    /// Added-token strings are ordinary bytes.
    Plain,
}

/// Names of the added tokens the chat template and end-of-turn detection use (spec §7.2).
pub const OPEN: &str = "<|open|>";
pub const CLOSE: &str = "<|close|>";
pub const SEP: &str = "<|sep|>";
pub const END_OF_MSG: &str = "<|end_of_msg|>";
pub const EOS: &str = "[EOS]";

/// Ids of the structural added tokens, resolved by name at load (synthetic checkpoints place
/// the added slots right after their small BPE vocabulary, so ids are never assumed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Controls {
    pub open: u32,
    pub close: u32,
    pub sep: u32,
    pub end_of_msg: u32,
    pub eos: u32,
}

impl Controls {
    /// Whether `id` is one of the structural ids.
    pub fn contains(&self, id: u32) -> bool {
        [self.open, self.close, self.sep, self.end_of_msg, self.eos].contains(&id)
    }
}

/// A loaded K3-format tokenizer: BPE ranks, then `ADDED_SLOTS` added tokens.
pub struct Tokenizer {
    ranks: FxHashMap<Vec<u8>, u32>,
    byte_rank: [u32; 256],
    /// Bytes of every id: the BPE ranks, then the added tokens' contents.
    tokens: Vec<Vec<u8>>,
    added: AddedTokens,
    pattern: fancy_regex::Regex,
    controls: Controls,
}

impl Tokenizer {
    /// Loads `tiktoken.model` and `tokenizer_config.json` from a model directory.
    pub fn load(dir: &Path) -> Result<Tokenizer, TokenizerError> {
        Self::from_files(&dir.join(files::RANKS_FILE), &dir.join(files::CONFIG_FILE))
    }

    /// Loads the tokenizer of a checkpoint whose embedding and lm_head have `vocab_size` rows
    /// (`config.json`, spec §2.2). Fewer ids than rows is a padded embedding (converted and
    /// fine-tuned checkpoints round the rows up) and loads: encoding never produces the padding
    /// ids. More ids than rows is refused, since those ids would have no row.
    pub fn load_for_vocab(dir: &Path, vocab_size: usize) -> Result<Tokenizer, TokenizerError> {
        let tokenizer = Self::load(dir)?;
        tokenizer.check_vocab(dir, vocab_size)?;
        Ok(tokenizer)
    }

    /// The rule of [`Self::load_for_vocab`] for a tokenizer already loaded from `dir`.
    pub fn check_vocab(&self, dir: &Path, vocab_size: usize) -> Result<(), TokenizerError> {
        if self.vocab_size() > vocab_size {
            return Err(TokenizerError::MoreIdsThanVocabulary {
                path: dir.join(files::RANKS_FILE),
                ids: self.vocab_size(),
                ranks: self.rank_count(),
                added: ADDED_SLOTS,
                vocab_size,
            });
        }
        Ok(())
    }

    /// Loads from explicit paths (the rank file may be any tiktoken-format file).
    pub fn from_files(model: &Path, config: &Path) -> Result<Tokenizer, TokenizerError> {
        let files::Ranks { mut tokens, ranks } = files::read_ranks(model)?;
        let first_added = u32::try_from(tokens.len())
            .ok()
            .filter(|n| n.checked_add(ADDED_SLOTS).is_some())
            .ok_or_else(|| TokenizerError::ModelLine {
                path: model.to_path_buf(),
                line: tokens.len(),
                reason: "too many ranks for 32-bit ids".into(),
            })?;
        let names = files::read_added(config, first_added)?;
        let added = AddedTokens::new((first_added..).zip(names.iter().map(String::as_str)));
        let mut byte_rank = [0u32; 256];
        for (byte, rank) in byte_rank.iter_mut().enumerate() {
            // read_ranks has checked that every single byte is a token.
            *rank = ranks.get([byte as u8].as_slice()).copied().unwrap_or(0);
        }
        let id_of = |name: &'static str| {
            added.id(name).ok_or(TokenizerError::MissingControlToken {
                path: config.to_path_buf(),
                name,
            })
        };
        let controls = Controls {
            open: id_of(OPEN)?,
            close: id_of(CLOSE)?,
            sep: id_of(SEP)?,
            end_of_msg: id_of(END_OF_MSG)?,
            eos: id_of(EOS)?,
        };
        tokens.extend(names.into_iter().map(String::into_bytes));
        let pattern = fancy_regex::Regex::new(pretokenize::PATTERN)
            .map_err(|e| TokenizerError::Pattern(e.to_string()))?;
        Ok(Tokenizer {
            ranks,
            byte_rank,
            tokens,
            added,
            pattern,
            controls,
        })
    }

    /// Number of ids: BPE ranks plus the 256 added slots.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// Number of BPE ranks; added-token ids start here.
    pub fn rank_count(&self) -> usize {
        self.tokens.len() - ADDED_SLOTS as usize
    }

    /// The id of the one-byte token `b` (every byte has one, spec §7.4).
    pub fn byte_id(&self, b: u8) -> u32 {
        self.byte_rank[b as usize]
    }

    /// The bytes an id decodes to (an added token's content as UTF-8).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.tokens.get(id as usize).map(Vec::as_slice)
    }

    /// The id of an added token by name, e.g. `<|end_of_msg|>` or `<|reserved_token_163700|>`.
    pub fn special_id(&self, name: &str) -> Option<u32> {
        self.added.id(name)
    }

    /// Generation stops at either (spec §7.4): `<|end_of_msg|>`, then `[EOS]`.
    pub fn end_of_turn_ids(&self) -> [u32; 2] {
        [self.controls.end_of_msg, self.controls.eos]
    }

    /// The structural ids the chat template and reply parser use.
    pub fn controls(&self) -> Controls {
        self.controls
    }

    /// Encodes text (spec §7.4). No BOS is ever prepended.
    pub fn encode(&self, text: &str, specials: Specials) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::with_capacity(text.len() / 3);
        let base = text.as_ptr() as usize;
        for slice in pretokenize::slices(text, pretokenize::PIECE_CHARS, pretokenize::MAX_RUN) {
            let parts = match specials {
                Specials::Recognised => self.added.split(slice),
                Specials::Plain => vec![Part::Text(slice)],
            };
            for part in parts {
                match part {
                    Part::Added(id) => ids.push(id),
                    Part::Text(segment) => {
                        // Offsets in errors are relative to the whole input text.
                        let offset = segment.as_ptr() as usize - base;
                        self.encode_segment(segment, offset, &mut ids)?;
                    }
                }
            }
        }
        Ok(ids)
    }

    fn encode_segment(
        &self,
        segment: &str,
        offset: usize,
        ids: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        for found in self.pattern.find_iter(segment) {
            let piece = found.map_err(|e| TokenizerError::Regex {
                offset,
                reason: e.to_string(),
            })?;
            let bytes = piece.as_str().as_bytes();
            // Whole-piece fast path (spec §7.4, required): a piece that is itself a token is
            // that token, even where merging would reach a different split.
            match self.ranks.get(bytes) {
                Some(&rank) => ids.push(rank),
                None => bpe::rank_bpe(bytes, &self.ranks, &self.byte_rank, ids),
            }
        }
        Ok(())
    }

    /// The bytes of a sequence of ids (not necessarily valid UTF-8).
    pub fn decode(&self, ids: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for (position, &id) in ids.iter().enumerate() {
            let bytes = self.token_bytes(id).ok_or(TokenizerError::UnknownId {
                id,
                position,
                vocab_size: self.vocab_size(),
            })?;
            out.extend_from_slice(bytes);
        }
        Ok(out)
    }

    /// Decoded text with invalid UTF-8 replaced by U+FFFD (spec §7.4).
    pub fn decode_text(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        Ok(String::from_utf8_lossy(&self.decode(ids)?).into_owned())
    }
}
