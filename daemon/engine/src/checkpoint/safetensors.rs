//! safetensors shard headers → one validated tensor index (spec §3.1–§3.2).
//!
//! Only headers are read (one positioned read per shard); tensor data is never touched. The
//! index is compact because the release has 497,220 tensors: names live in one string arena,
//! shapes in one `u64` arena, and each tensor costs a fixed 40-byte `TensorRecord` on top of its
//! name and dims.
//!
//! Headers are read with `pread` rather than a memory map: a map would need `unsafe`, and a
//! shard truncated while mapped would kill the process with SIGBUS instead of giving an error.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};

mod header;

use header::{Key, ParsedShard, header_len, parse_shard, read_shard};

/// Element types the engine knows. K3 uses exactly these three (spec §3.2 rule 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bf16,
    /// IEEE half: accepted for the small vectors only (see [`super::inventory::Want::vector`]).
    F16,
    F32,
    U8,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::F32 => 4,
            Dtype::U8 => 1,
        }
    }

    /// The dtype's spelling in a safetensors header.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "BF16",
            Dtype::F16 => "F16",
            Dtype::F32 => "F32",
            Dtype::U8 => "U8",
        }
    }

    fn from_name(name: &str) -> Option<Dtype> {
        match name {
            "BF16" => Some(Dtype::Bf16),
            "F16" => Some(Dtype::F16),
            "F32" => Some(Dtype::F32),
            "U8" => Some(Dtype::U8),
            _ => None,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Largest header the reader accepts (spec §3.2 rule 1; the reference library's limit).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// The file name of the optional cross-check index (spec §3.1).
pub const INDEX_FILE_NAME: &str = "model.safetensors.index.json";

/// One shard file: where it is, how big, and where its data region starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardFile {
    pub path: PathBuf,
    pub size: u64,
    /// `8 + N`: absolute file offset of the first data byte.
    pub data_start: u64,
    /// sha256 of the header as stored (the 8 length bytes and the JSON): part of the model's
    /// identity, taken while indexing so nothing re-reads headers to fingerprint a checkpoint.
    pub header_sha256: [u8; 32],
}

impl ShardFile {
    /// The file name as it appears in `weight_map` and in messages.
    pub fn name(&self) -> String {
        file_name(&self.path)
    }

    /// Bytes of tensor data: everything after the header.
    pub fn data_len(&self) -> u64 {
        self.size - self.data_start
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Why a shard set was refused. Every variant names the file and, where there is one, the tensor.
#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    /// The I/O error is part of the message, not a `source`, so a `{:#}` chain shows it once.
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{dir}: no *.safetensors files")]
    NoShards { dir: PathBuf },
    #[error("{file}: {size} bytes, too short for the 8-byte header length")]
    TooShort { file: String, size: u64 },
    #[error("{file}: header length {header_len} exceeds the limit of {MAX_HEADER_LEN}")]
    HeaderTooLong { file: String, header_len: u64 },
    #[error("{file}: header length {header_len} runs past the end of the {size}-byte file")]
    HeaderPastEnd {
        file: String,
        header_len: u64,
        size: u64,
    },
    #[error("{file}: header is not valid UTF-8 (at header byte {offset})")]
    NotUtf8 { file: String, offset: usize },
    #[error("{file}: header does not start with '{{'")]
    NotObject { file: String },
    #[error("{file}: header is not valid JSON: {message}")]
    Json { file: String, message: String },
    #[error("{file}: tensor {tensor}: malformed entry: {message}")]
    Entry {
        file: String,
        tensor: String,
        message: String,
    },
    #[error("{file}: __metadata__ must be an object of strings: {message}")]
    Metadata { file: String, message: String },
    #[error("{file}: tensor {tensor}: unknown dtype {dtype:?} (known: BF16, F32, U8)")]
    UnknownDtype {
        file: String,
        tensor: String,
        dtype: String,
    },
    #[error("{file}: tensor {tensor}: shape entry {value} is not a non-negative integer")]
    BadShape {
        file: String,
        tensor: String,
        value: String,
    },
    #[error("{file}: tensor {tensor}: data offset {value} is not a non-negative integer")]
    BadOffset {
        file: String,
        tensor: String,
        value: String,
    },
    #[error("{file}: tensor {tensor}: data_offsets [{begin}, {end}] end before they begin")]
    ReversedOffsets {
        file: String,
        tensor: String,
        begin: u64,
        end: u64,
    },
    #[error("{file}: tensor {tensor}: byte size of the shape overflows 64 bits")]
    SizeOverflow { file: String, tensor: String },
    #[error(
        "{file}: tensor {tensor}: data_offsets span {actual} bytes, shape × dtype size is {expected}"
    )]
    SizeMismatch {
        file: String,
        tensor: String,
        expected: u64,
        actual: u64,
    },
    #[error(
        "{file}: tensor {tensor}: data starts at {begin}, overlapping the previous tensor {previous} which ends at {previous_end}"
    )]
    Overlap {
        file: String,
        tensor: String,
        begin: u64,
        previous: String,
        previous_end: u64,
    },
    #[error(
        "{file}: tensor {tensor}: data starts at {begin}, leaving a gap after byte {expected} (the previous tensor's end)"
    )]
    Gap {
        file: String,
        tensor: String,
        begin: u64,
        expected: u64,
    },
    #[error(
        "{file}: tensor data ends at {data_end} but the data region (file size − 8 − header) is {data_len} bytes"
    )]
    DataLenMismatch {
        file: String,
        data_end: u64,
        data_len: u64,
    },
    #[error("{file}: tensor {tensor} appears twice in the header")]
    DuplicateInFile { file: String, tensor: String },
    #[error("tensor {tensor} appears in two shards: {first} and {second}")]
    DuplicateAcrossShards {
        tensor: String,
        first: String,
        second: String,
    },
    #[error("{file}: index too large for this reader ({what})")]
    TooLarge { file: String, what: &'static str },
    #[error("{file}: {message}")]
    IndexJson { file: String, message: String },
    #[error("{file}: weight_map lists {tensor} twice")]
    IndexDuplicate { file: String, tensor: String },
    #[error("{file}: weight_map maps {tensor} to {listed}, but it is in {actual}")]
    IndexWrongShard {
        file: String,
        tensor: String,
        listed: String,
        actual: String,
    },
    #[error("{file}: weight_map lists {tensor} (in {listed}), which no shard holds")]
    IndexExtraName {
        file: String,
        tensor: String,
        listed: String,
    },
    #[error("{file}: weight_map omits {tensor} (held by {actual}) and {more} other tensors")]
    IndexMissingName {
        file: String,
        tensor: String,
        actual: String,
        more: usize,
    },
}

/// Per-tensor record. 40 bytes; names and dims live in the index's arenas.
#[derive(Debug, Clone, Copy)]
struct TensorRecord {
    name_start: u32,
    name_len: u32,
    dims_start: u32,
    shard: u32,
    /// Absolute file offset of the first byte.
    offset: u64,
    len: u64,
    rank: u8,
    dtype: Dtype,
}

/// A tensor as the index knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorRef<'a> {
    pub name: &'a str,
    /// Index into [`TensorIndex::shards`].
    pub shard: usize,
    pub dtype: Dtype,
    pub shape: &'a [u64],
    /// Absolute file offset of the tensor's first byte.
    pub offset: u64,
    pub len: u64,
}

/// Every tensor of a checkpoint directory, validated, sorted bytewise by name.
#[derive(Debug, Default)]
pub struct TensorIndex {
    shards: Vec<ShardFile>,
    names: String,
    dims: Vec<u64>,
    /// Sorted bytewise by name; names are unique.
    entries: Vec<TensorRecord>,
}

impl TensorIndex {
    /// Index every `*.safetensors` file in `dir`, in bytewise file-name order (spec §3.1).
    pub fn open_dir(dir: &Path) -> Result<TensorIndex, SafetensorsError> {
        let io = |error| SafetensorsError::Io {
            path: dir.to_path_buf(),
            error,
        };
        let mut paths = Vec::new();
        for item in std::fs::read_dir(dir).map_err(io)? {
            let item = item.map_err(io)?;
            let name = item.file_name();
            if name.as_encoded_bytes().ends_with(b".safetensors") {
                paths.push(item.path());
            }
        }
        if paths.is_empty() {
            return Err(SafetensorsError::NoShards {
                dir: dir.to_path_buf(),
            });
        }
        paths.sort_by(|a, b| {
            let a = a.file_name().map(|n| n.as_encoded_bytes());
            let b = b.file_name().map(|n| n.as_encoded_bytes());
            a.cmp(&b)
        });
        TensorIndex::from_files(paths)
    }

    /// Index the given shard files, in the given order (shard numbers are positions here).
    pub fn from_files(paths: Vec<PathBuf>) -> Result<TensorIndex, SafetensorsError> {
        let parsed: Vec<ParsedShard> = paths
            .into_par_iter()
            .map(|path| read_shard(&path))
            .collect::<Result<_, _>>()?;
        TensorIndex::merge(parsed)
    }

    /// Validate one shard's bytes as if read from a file of `size` bytes named `path`. The bytes
    /// need only cover the header (`8 + N`); `size` is the whole file's.
    pub fn from_header_bytes(
        shards: Vec<(PathBuf, u64, Vec<u8>)>,
    ) -> Result<TensorIndex, SafetensorsError> {
        let parsed = shards
            .into_iter()
            .map(|(path, size, bytes)| {
                let header_len = header_len(&path, size, &bytes)?;
                let header = bytes.get(8..8 + header_len as usize).ok_or_else(|| {
                    SafetensorsError::HeaderPastEnd {
                        file: file_name(&path),
                        header_len,
                        size: bytes.len() as u64,
                    }
                })?;
                parse_shard(path, size, header)
            })
            .collect::<Result<Vec<_>, _>>()?;
        TensorIndex::merge(parsed)
    }

    fn merge(parsed: Vec<ParsedShard>) -> Result<TensorIndex, SafetensorsError> {
        let mut index = TensorIndex {
            names: String::with_capacity(parsed.iter().map(|p| p.names.len()).sum()),
            dims: Vec::with_capacity(parsed.iter().map(|p| p.dims.len()).sum()),
            entries: Vec::with_capacity(parsed.iter().map(|p| p.entries.len()).sum()),
            shards: Vec::with_capacity(parsed.len()),
        };
        for (shard, p) in parsed.into_iter().enumerate() {
            let too_large = |what| SafetensorsError::TooLarge {
                file: p.shard.name(),
                what,
            };
            let name_base = u32::try_from(index.names.len()).map_err(|_| too_large("names"))?;
            let dims_base = u32::try_from(index.dims.len()).map_err(|_| too_large("dims"))?;
            let shard_no = u32::try_from(shard).map_err(|_| too_large("shards"))?;
            for e in &p.entries {
                index.entries.push(TensorRecord {
                    name_start: e
                        .name_start
                        .checked_add(name_base)
                        .ok_or_else(|| too_large("names"))?,
                    dims_start: e
                        .dims_start
                        .checked_add(dims_base)
                        .ok_or_else(|| too_large("dims"))?,
                    shard: shard_no,
                    ..*e
                });
            }
            index.names.push_str(&p.names);
            index.dims.extend_from_slice(&p.dims);
            index.shards.push(p.shard);
        }
        // Each shard's entries are already sorted by name, so this stable sort only merges runs.
        let names = &index.names;
        index
            .entries
            .sort_by(|a, b| entry_name(names, a).cmp(entry_name(names, b)));
        if let Some(w) = index
            .entries
            .windows(2)
            .find(|w| entry_name(names, &w[0]) == entry_name(names, &w[1]))
        {
            return Err(SafetensorsError::DuplicateAcrossShards {
                tensor: entry_name(names, &w[0]).to_owned(),
                first: index.shards[w[0].shard as usize].name(),
                second: index.shards[w[1].shard as usize].name(),
            });
        }
        Ok(index)
    }

    pub fn shards(&self) -> &[ShardFile] {
        &self.shards
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Heap bytes held by the index (for the memory budget; spec §3.1's 497,220 tensors).
    pub fn heap_bytes(&self) -> usize {
        self.names.capacity()
            + self.dims.capacity() * size_of::<u64>()
            + self.entries.capacity() * size_of::<TensorRecord>()
            + self
                .shards
                .iter()
                .map(|s| size_of::<ShardFile>() + s.path.capacity())
                .sum::<usize>()
    }

    /// The tensor called `name`, if any shard holds it.
    pub fn get(&self, name: &str) -> Option<TensorRef<'_>> {
        self.position(name).map(|i| self.at(i))
    }

    /// Position of `name` in [`TensorIndex::iter`] order, for callers that track coverage.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.entries
            .binary_search_by(|e| entry_name(&self.names, e).cmp(name))
            .ok()
    }

    /// The tensor at `position` (0..len) in bytewise name order.
    pub fn at(&self, position: usize) -> TensorRef<'_> {
        self.view(&self.entries[position])
    }

    /// All tensors in bytewise name order.
    pub fn iter(&self) -> impl Iterator<Item = TensorRef<'_>> {
        self.entries.iter().map(|e| self.view(e))
    }

    fn view(&self, e: &TensorRecord) -> TensorRef<'_> {
        let dims = e.dims_start as usize;
        TensorRef {
            name: entry_name(&self.names, e),
            shard: e.shard as usize,
            dtype: e.dtype,
            shape: &self.dims[dims..dims + e.rank as usize],
            offset: e.offset,
            len: e.len,
        }
    }

    /// Cross-check `model.safetensors.index.json` (spec §3.1): every name it lists maps to the
    /// shard that holds it, and it lists every tensor exactly once. Only `weight_map` is read.
    pub fn check_index_file(&self, path: &Path) -> Result<(), SafetensorsError> {
        let file = file_name(path);
        let text =
            crate::input_file::read_to_string(path).map_err(|error| SafetensorsError::Io {
                path: path.to_path_buf(),
                error,
            })?;
        let parsed: IndexFile =
            serde_json::from_str(&text).map_err(|e| SafetensorsError::IndexJson {
                file: file.clone(),
                message: e.to_string(),
            })?;
        let mut listed = parsed.weight_map.0;
        listed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        if let Some(w) = listed.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(SafetensorsError::IndexDuplicate {
                file,
                tensor: w[0].0.to_string(),
            });
        }
        let shard_names: Vec<String> = self.shards.iter().map(ShardFile::name).collect();
        let mut seen = vec![false; self.entries.len()];
        for (tensor, shard) in listed {
            let Some(i) = self.position(&tensor) else {
                return Err(SafetensorsError::IndexExtraName {
                    file,
                    tensor: tensor.into_owned(),
                    listed: shard.into_owned(),
                });
            };
            let actual = &shard_names[self.entries[i].shard as usize];
            if actual.as_str() != shard {
                return Err(SafetensorsError::IndexWrongShard {
                    file,
                    tensor: tensor.into_owned(),
                    listed: shard.into_owned(),
                    actual: actual.clone(),
                });
            }
            seen[i] = true;
        }
        let mut missing = seen.iter().enumerate().filter(|(_, s)| !**s);
        if let Some((i, _)) = missing.next() {
            let t = self.at(i);
            return Err(SafetensorsError::IndexMissingName {
                file,
                tensor: t.name.to_owned(),
                actual: shard_names[t.shard].clone(),
                more: missing.count(),
            });
        }
        Ok(())
    }
}

fn entry_name<'a>(names: &'a str, e: &TensorRecord) -> &'a str {
    &names[e.name_start as usize..(e.name_start + e.name_len) as usize]
}

/// `model.safetensors.index.json`; `metadata` and other keys are not semantic here.
#[derive(Deserialize)]
struct IndexFile<'a> {
    #[serde(borrow)]
    weight_map: WeightMap<'a>,
}

/// `weight_map` as a list of entries, so that duplicates survive parsing and can be refused.
/// Names are borrowed from the file text unless they contain escapes.
struct WeightMap<'a>(Vec<(Cow<'a, str>, Cow<'a, str>)>);

impl<'de: 'a, 'a> Deserialize<'de> for WeightMap<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = WeightMap<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object mapping tensor names to shard file names")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WeightMap<'a>, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some((Key(name), Key(shard))) = map.next_entry::<Key, Key>()? {
                    entries.push((name, shard));
                }
                Ok(WeightMap(entries))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// A tensor to be written by [`encode_header`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
}

impl TensorSpec {
    /// Stored bytes: product(shape) × size(dtype), or `None` on overflow.
    pub fn byte_len(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(self.dtype.size() as u64, |n, &d| n.checked_mul(d))
    }
}

/// A tensor's place in the release's data order (spec §3.2): F32, then BF16, then U8, each
/// group by bytewise name (F16, absent from the release, after BF16). Sorting by this key gives the order [`encode_header`] lays out.
pub fn data_order(t: &TensorSpec) -> (u8, &[u8]) {
    let group = match t.dtype {
        Dtype::F32 => 0,
        Dtype::Bf16 => 1,
        Dtype::F16 => 2,
        Dtype::U8 => 3,
    };
    (group, t.name.as_bytes())
}

/// A shard header laid out as the release is (spec §3.2): data in [`data_order`]; compact JSON
/// without `__metadata__`, space-padded to a multiple of 8. Returns the 8-byte length prefix
/// plus header, and the data length.
pub fn encode_header(tensors: &[TensorSpec]) -> Option<(Vec<u8>, u64)> {
    let mut order: Vec<&TensorSpec> = tensors.iter().collect();
    order.sort_by(|a, b| data_order(a).cmp(&data_order(b)));
    let mut json = String::from("{");
    let mut at = 0u64;
    for (i, t) in order.iter().enumerate() {
        let end = at.checked_add(t.byte_len()?)?;
        if i > 0 {
            json.push(',');
        }
        json.push_str(&serde_json::to_string(&t.name).ok()?);
        let shape: Vec<String> = t.shape.iter().map(u64::to_string).collect();
        json.push_str(&format!(
            r#":{{"dtype":"{}","shape":[{}],"data_offsets":[{at},{end}]}}"#,
            t.dtype.name(),
            shape.join(",")
        ));
        at = end;
    }
    json.push('}');
    while json.len() % 8 != 0 {
        json.push(' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    Some((out, at))
}
