//! One shard's header: its length prefix, the JSON parsed in one pass into the index's compact
//! records (no per-tensor allocation beyond the arenas), and the check that the tensors tile
//! the data section exactly. Split from [`super`] so the index and its queries read apart from
//! the parsing.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde_json::error::Category;
use sha2::{Digest, Sha256};

use super::{
    Dtype, MAX_HEADER_LEN, SafetensorsError, ShardFile, TensorRecord, entry_name, file_name,
};

/// One shard's header, parsed and validated, with shard-local arena offsets.
pub(super) struct ParsedShard {
    pub(super) shard: ShardFile,
    pub(super) names: String,
    pub(super) dims: Vec<u64>,
    /// Sorted by name.
    pub(super) entries: Vec<TensorRecord>,
}

pub(super) fn read_shard(path: &Path) -> Result<ParsedShard, SafetensorsError> {
    let io = |error| SafetensorsError::Io {
        path: path.to_path_buf(),
        error,
    };
    let file = crate::input_file::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    let mut len_bytes = [0u8; 8];
    if size >= 8 {
        file.read_exact_at(&mut len_bytes, 0).map_err(io)?;
    }
    let header_len = header_len(path, size, &len_bytes)?;
    // header_len ≤ MAX_HEADER_LEN, so the cast cannot truncate.
    let mut header = vec![0u8; header_len as usize];
    file.read_exact_at(&mut header, 8).map_err(io)?;
    parse_shard(path.to_path_buf(), size, &header)
}

/// Rule 1's length checks: returns `N`, known to satisfy `N ≤ MAX_HEADER_LEN` and `8+N ≤ size`.
pub(super) fn header_len(path: &Path, size: u64, bytes: &[u8]) -> Result<u64, SafetensorsError> {
    let file = || file_name(path);
    let prefix: [u8; 8] = match bytes.get(..8).and_then(|b| b.try_into().ok()) {
        Some(p) if size >= 8 => p,
        _ => return Err(SafetensorsError::TooShort { file: file(), size }),
    };
    let header_len = u64::from_le_bytes(prefix);
    if header_len > MAX_HEADER_LEN {
        return Err(SafetensorsError::HeaderTooLong {
            file: file(),
            header_len,
        });
    }
    if 8 + header_len > size {
        return Err(SafetensorsError::HeaderPastEnd {
            file: file(),
            header_len,
            size,
        });
    }
    Ok(header_len)
}

/// Rules 1–5 for one header.
pub(super) fn parse_shard(
    path: PathBuf,
    size: u64,
    header: &[u8],
) -> Result<ParsedShard, SafetensorsError> {
    let file = file_name(&path);
    let text = std::str::from_utf8(header).map_err(|e| SafetensorsError::NotUtf8 {
        file: file.clone(),
        offset: e.valid_up_to(),
    })?;
    if !text.starts_with('{') {
        return Err(SafetensorsError::NotObject { file });
    }
    let data_start = 8 + header.len() as u64;
    let mut state = HeaderState {
        file,
        names: String::new(),
        dims: Vec::new(),
        entries: Vec::new(),
        seen_metadata: false,
        failed_in: None,
        error: None,
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = HeaderSeed {
        state: &mut state,
        data_start,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    if let Some(e) = state.error.take() {
        return Err(e);
    }
    if let Err(e) = parsed {
        let file = state.file;
        let message = e.to_string();
        // A syntax error is bad JSON wherever it occurs; a well-formed value of the wrong
        // form is a malformed entry of the tensor (or metadata) being read.
        return Err(match (e.classify(), state.failed_in) {
            (Category::Data, Some(FailedIn::Tensor(tensor))) => SafetensorsError::Entry {
                file,
                tensor,
                message,
            },
            (Category::Data, Some(FailedIn::Metadata)) => {
                SafetensorsError::Metadata { file, message }
            }
            _ => SafetensorsError::Json { file, message },
        });
    }
    let HeaderState {
        file,
        names,
        dims,
        mut entries,
        ..
    } = state;

    entries.sort_by(|a, b| entry_name(&names, a).cmp(entry_name(&names, b)));
    if let Some(w) = entries
        .windows(2)
        .find(|w| entry_name(&names, &w[0]) == entry_name(&names, &w[1]))
    {
        return Err(SafetensorsError::DuplicateInFile {
            file,
            tensor: entry_name(&names, &w[0]).to_owned(),
        });
    }
    check_tiling(&file, &names, &entries, data_start, size)?;
    Ok(ParsedShard {
        shard: ShardFile {
            path,
            size,
            data_start,
            header_sha256: Sha256::new()
                .chain_update((header.len() as u64).to_le_bytes())
                .chain_update(header)
                .finalize()
                .into(),
        },
        names,
        dims,
        entries,
    })
}

/// Rule 5: sorted by start, the ranges tile `[0, data_len)` exactly.
fn check_tiling(
    file: &str,
    names: &str,
    entries: &[TensorRecord],
    data_start: u64,
    size: u64,
) -> Result<(), SafetensorsError> {
    let mut order: Vec<&TensorRecord> = entries.iter().collect();
    // Empty tensors sort before the tensor starting at the same offset, so they tile too.
    order.sort_unstable_by_key(|e| (e.offset, e.len));
    let mut expected = data_start;
    let mut previous: Option<&TensorRecord> = None;
    for e in order {
        if e.offset < expected {
            let previous = previous.map_or("", |p| entry_name(names, p)).to_owned();
            return Err(SafetensorsError::Overlap {
                file: file.to_owned(),
                tensor: entry_name(names, e).to_owned(),
                begin: e.offset - data_start,
                previous,
                previous_end: expected - data_start,
            });
        }
        if e.offset > expected {
            return Err(SafetensorsError::Gap {
                file: file.to_owned(),
                tensor: entry_name(names, e).to_owned(),
                begin: e.offset - data_start,
                expected: expected - data_start,
            });
        }
        expected = e.offset + e.len;
        previous = Some(e);
    }
    if expected != size {
        return Err(SafetensorsError::DataLenMismatch {
            file: file.to_owned(),
            data_end: expected - data_start,
            data_len: size - data_start,
        });
    }
    Ok(())
}

enum FailedIn {
    Metadata,
    Tensor(String),
}

/// Accumulates one header's tensors while serde walks its top-level object.
struct HeaderState {
    file: String,
    names: String,
    dims: Vec<u64>,
    entries: Vec<TensorRecord>,
    seen_metadata: bool,
    /// Which value serde was reading when it failed, to tell a malformed entry from bad JSON.
    failed_in: Option<FailedIn>,
    /// A typed refusal found mid-parse; the serde error that aborts the walk is then a carrier.
    error: Option<SafetensorsError>,
}

impl HeaderState {
    fn fail<E: de::Error>(&mut self, error: SafetensorsError) -> E {
        self.error = Some(error);
        E::custom("refused")
    }

    /// Rules 3–4 for one tensor, then record it.
    fn add(&mut self, name: &str, raw: RawTensor, data_start: u64) -> Result<(), SafetensorsError> {
        let file = || self.file.clone();
        let tensor = || name.to_owned();
        let dtype = match raw.dtype {
            DtypeField::Known(d) => d,
            DtypeField::Unknown(dtype) => {
                return Err(SafetensorsError::UnknownDtype {
                    file: file(),
                    tensor: tensor(),
                    dtype,
                });
            }
        };
        let dims_start = self.dims.len();
        let mut elements: Option<u64> = Some(1);
        for d in &raw.shape {
            let Some(d) = d.as_u64() else {
                return Err(SafetensorsError::BadShape {
                    file: file(),
                    tensor: tensor(),
                    value: d.to_string(),
                });
            };
            elements = elements.and_then(|n| n.checked_mul(d));
            self.dims.push(d);
        }
        let offset = |n: &serde_json::Number| {
            n.as_u64().ok_or_else(|| SafetensorsError::BadOffset {
                file: file(),
                tensor: tensor(),
                value: n.to_string(),
            })
        };
        let (begin, end) = (offset(&raw.data_offsets.0)?, offset(&raw.data_offsets.1)?);
        if begin > end {
            return Err(SafetensorsError::ReversedOffsets {
                file: file(),
                tensor: tensor(),
                begin,
                end,
            });
        }
        let expected = elements
            .and_then(|n| n.checked_mul(dtype.size() as u64))
            .ok_or_else(|| SafetensorsError::SizeOverflow {
                file: file(),
                tensor: tensor(),
            })?;
        if end - begin != expected {
            return Err(SafetensorsError::SizeMismatch {
                file: file(),
                tensor: tensor(),
                expected,
                actual: end - begin,
            });
        }
        // Offsets past the file end are caught by the tiling check; keep the absolute offsets
        // (start and end, `offset + len`) from wrapping.
        let offset = data_start
            .checked_add(begin)
            .filter(|_| data_start.checked_add(end).is_some())
            .ok_or_else(|| SafetensorsError::SizeOverflow {
                file: file(),
                tensor: tensor(),
            })?;
        let too_large = |what| SafetensorsError::TooLarge { file: file(), what };
        let entry = TensorRecord {
            name_start: u32::try_from(self.names.len()).map_err(|_| too_large("names"))?,
            name_len: u32::try_from(name.len()).map_err(|_| too_large("names"))?,
            dims_start: u32::try_from(dims_start).map_err(|_| too_large("dims"))?,
            shard: 0,
            offset,
            len: expected,
            rank: u8::try_from(raw.shape.len()).map_err(|_| too_large("rank"))?,
            dtype,
        };
        self.names.push_str(name);
        self.entries.push(entry);
        Ok(())
    }
}

struct HeaderSeed<'s> {
    state: &'s mut HeaderState,
    data_start: u64,
}

impl<'de> DeserializeSeed<'de> for HeaderSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for HeaderSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a safetensors header object")
    }

    // Walking the entries one by one (instead of collecting into a map) is what lets a
    // duplicate name be seen at all: a map would keep only the last one (rule 2).
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let state = self.state;
        while let Some(Key(name)) = map.next_key::<Key>()? {
            if name == "__metadata__" {
                if state.seen_metadata {
                    let file = state.file.clone();
                    return Err(state.fail(SafetensorsError::DuplicateInFile {
                        file,
                        tensor: name.into_owned(),
                    }));
                }
                state.seen_metadata = true;
                if let Err(e) = map.next_value::<BTreeMap<String, String>>() {
                    state.failed_in = Some(FailedIn::Metadata);
                    return Err(e);
                }
                continue;
            }
            let raw = match map.next_value::<RawTensor>() {
                Ok(raw) => raw,
                Err(e) => {
                    state.failed_in = Some(FailedIn::Tensor(name.into_owned()));
                    return Err(e);
                }
            };
            if let Err(e) = state.add(&name, raw, self.data_start) {
                return Err(state.fail(e));
            }
        }
        Ok(())
    }
}

/// A map key, borrowed from the header text when it has no escapes.
pub(super) struct Key<'de>(pub(super) Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// One tensor's header entry before validation. Unknown fields are refused: a format this
/// reader does not know is not one it should guess about.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTensor {
    dtype: DtypeField,
    shape: Vec<serde_json::Number>,
    data_offsets: (serde_json::Number, serde_json::Number),
}

enum DtypeField {
    Known(Dtype),
    Unknown(String),
}

impl<'de> Deserialize<'de> for DtypeField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DtypeField;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a dtype string")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<DtypeField, E> {
                Ok(Dtype::from_name(s)
                    .map(DtypeField::Known)
                    .unwrap_or_else(|| DtypeField::Unknown(s.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}
