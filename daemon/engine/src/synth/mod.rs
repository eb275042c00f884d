//! Synthetic random-weight checkpoints in exactly the released layout (spec §9.1), written by
//! `k3d synth`: the tests and benches run on these, since no real weights exist here.
//!
//! * [`shape`] — the named shapes (`tiny`, `tiny-b`, `tiny-c`, `small`, `bench`).
//! * [`tensors`] — every tensor of every shard, with its value distribution (spec §3.3, §9.1).
//! * [`values`] — element values as stored bytes, from per-chunk deterministic streams.
//! * [`crate::rng`] — the fully specified PRNG: same shape + seed ⇒ same bytes on every machine.
//! * [`writer`] — safetensors shards in the released byte layout (spec §3.2), streamed.
//! * [`tokenizer_files`] — a small real BPE vocabulary and the K3 added tokens (spec §7).
//! * [`config_files`] — `config.json`, `generation_config.json`, the index.
//!
//! The checkpoint's **content digest** ([`content_sha256`]) identifies its exact bytes: the
//! SHA-256 of the manifest
//! made of one line `<sha256 hex of the file>  <file name>\n` per written file, lines sorted
//! by file name (the format of `sha256sum`; reproduce with
//! `sha256sum * | sort -k2 | sha256sum` in the directory). Committed reference fixtures
//! record it (as `fingerprint` in their `meta.json`), so a change to anything written here
//! shows up as stale fixtures. It is not the model fingerprint: that one
//! ([`crate::checkpoint::Checkpoint::fingerprint`]) reads no tensor data, and `k3d synth`
//! prints both.

pub mod config_files;
pub mod shape;
pub mod tensors;
pub mod tokenizer_files;
pub mod values;
pub mod writer;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use self::config_files::SpecialIds;
use self::shape::Shape;
use self::tokenizer_files::{ADDED_SLOTS, Vocab};
use self::writer::PlannedShard;
use crate::checkpoint::config::ModelConfig;
use crate::checkpoint::inventory::DimOverflow;

/// Disk space kept free beyond the checkpoint itself, so a synth never fills the disk.
const DISK_HEADROOM: u64 = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "{path} is not empty (first entry: {first}); pass --force to overwrite its checkpoint files"
    )]
    NotEmpty { path: PathBuf, first: String },
    #[error(
        "not enough free disk space in {path}: the checkpoint needs {need} bytes (+{headroom} headroom), {avail} available"
    )]
    NoSpace {
        path: PathBuf,
        need: u64,
        headroom: u64,
        avail: u64,
    },
    #[error("statvfs {path}: {error}")]
    Statvfs { path: PathBuf, error: nix::Error },
    #[error("shape {shape}: {error}")]
    Dims {
        shape: &'static str,
        error: DimOverflow,
    },
    #[error("a vocabulary of {vocab_size} has token ids beyond 32 bits")]
    VocabTooLarge { vocab_size: usize },
    #[error("{file}: the tensor data length overflows 64 bits")]
    DataOverflow { file: String },
}

/// Everything to be written, computed before any byte hits the disk.
#[derive(Debug, Clone)]
pub struct Blueprint {
    pub shape: Shape,
    /// The shape's config with the learned tokenizer's vocabulary size and special ids: what
    /// the written `config.json` says.
    pub config: ModelConfig,
    pub vocab: Vocab,
    pub shards: Vec<PlannedShard>,
    /// The small files: (name, contents).
    pub small_files: Vec<(String, Vec<u8>)>,
}

impl Blueprint {
    /// Bytes of all files this plan writes.
    pub fn total_bytes(&self) -> u64 {
        let shards: u64 = self.shards.iter().map(PlannedShard::file_size).sum();
        let small: u64 = self.small_files.iter().map(|(_, c)| c.len() as u64).sum();
        shards + small
    }

    /// Tensor data bytes (the index's `total_size`).
    pub fn data_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.data_len).sum()
    }
}

/// Shard file name: five digits, then six (`model-00001-of-000010.safetensors`, spec §3.1).
pub fn shard_file_name(i: usize, n: usize) -> String {
    format!("model-{i:05}-of-{n:06}.safetensors")
}

/// Plans the checkpoint of `shape`: learns the tokenizer, lays out every shard.
pub fn blueprint(shape: &Shape) -> Result<Blueprint, SynthError> {
    let vocab = Vocab::learn(shape.bpe_merges);
    let vocab_size = vocab.n_ranks() + ADDED_SLOTS;
    let ids = SpecialIds::after_ranks(vocab.n_ranks());
    let id = |v: usize| {
        u32::try_from(v)
            .map(Some)
            .map_err(|_| SynthError::VocabTooLarge { vocab_size })
    };
    let config = ModelConfig {
        vocab_size,
        bos_token_id: id(ids.bos)?,
        eos_token_id: id(ids.eos)?,
        pad_token_id: id(ids.pad)?,
        ..shape.config.clone()
    };
    let specs = tensors::shards(&config, shape.a_log_len).map_err(|error| SynthError::Dims {
        shape: shape.name,
        error,
    })?;
    let n = specs.len();
    let shards: Vec<PlannedShard> = specs
        .into_iter()
        .enumerate()
        .map(|(i, spec)| writer::plan(shard_file_name(i + 1, n), spec))
        .collect::<Result<_, _>>()?;
    let mut weight_map = BTreeMap::new();
    for s in &shards {
        for t in &s.tensors {
            weight_map.insert(t.spec.name.clone(), s.file_name.clone());
        }
    }
    let data_bytes = shards.iter().map(|s| s.data_len).sum();
    let pretty = |v: &serde_json::Value| {
        // Serializing a `Value` cannot fail (every map key is a string).
        let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
        s.push('\n');
        s.into_bytes()
    };
    let small_files = vec![
        (
            "config.json".to_string(),
            pretty(&config_files::config_json(&config, ids)),
        ),
        (
            "generation_config.json".to_string(),
            pretty(&config_files::generation_config_json(ids)),
        ),
        (
            "model.safetensors.index.json".to_string(),
            pretty(&config_files::index_json(data_bytes, &weight_map)),
        ),
        (
            "tiktoken.model".to_string(),
            vocab.tiktoken_model().into_bytes(),
        ),
        (
            "tokenizer_config.json".to_string(),
            pretty(&vocab.tokenizer_config()),
        ),
    ];
    Ok(Blueprint {
        shape: shape.clone(),
        config,
        vocab,
        shards,
        small_files,
    })
}

/// WriteProgress of a write, reported after every batch of data.
#[derive(Debug, Clone, Copy)]
pub struct WriteProgress {
    /// One-based shard being written, and the shard count.
    pub shard: usize,
    pub shards: usize,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Written {
    /// (file name, SHA-256 hex), sorted by name.
    pub files: Vec<(String, String)>,
    /// [`content_sha256`] of `files`: the bytes' identity, which the reference fixtures record
    /// (their `meta.json` calls it `fingerprint`). Not the model fingerprint
    /// ([`crate::checkpoint::Checkpoint::fingerprint`]) the daemon reports.
    pub content_sha256: String,
    pub total_bytes: u64,
    pub vocab_size: usize,
}

/// The content digest of a set of (file name, SHA-256 hex): SHA-256 of their `sha256sum`-style
/// manifest, sorted by name (see the module docs).
pub fn content_sha256(files: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = files.iter().collect();
    sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut h = Sha256::new();
    for (name, digest) in sorted {
        h.update(format!("{digest}  {name}\n").as_bytes());
    }
    writer::hex(&h.finalize())
}

/// Makes `dir` ready: created if missing; if it has entries, refused unless `force`, and with
/// `force` the files a checkpoint consists of (our names and any `model*.safetensors`, which
/// loaders pick up by pattern) are removed so no stale shard survives. Other files stay.
fn prepare_dir(dir: &Path, plan: &Blueprint, force: bool) -> Result<(), SynthError> {
    let io = |error| SynthError::Io {
        path: dir.to_path_buf(),
        error,
    };
    fs::create_dir_all(dir).map_err(io)?;
    let mut entries: Vec<String> = fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()
        .map_err(io)?;
    entries.sort();
    let Some(first) = entries.first() else {
        return Ok(());
    };
    if !force {
        return Err(SynthError::NotEmpty {
            path: dir.to_path_buf(),
            first: first.clone(),
        });
    }
    let ours = |name: &str| {
        (name.starts_with("model") && name.ends_with(".safetensors"))
            || plan.small_files.iter().any(|(n, _)| n == name)
    };
    for name in entries.iter().filter(|n| ours(n)) {
        let path = dir.join(name);
        fs::remove_file(&path).map_err(|error| SynthError::Io { path, error })?;
    }
    Ok(())
}

/// Refuses when the file system holding `dir` lacks room for `need` bytes plus headroom.
fn check_space(dir: &Path, need: u64) -> Result<(), SynthError> {
    let st = nix::sys::statvfs::statvfs(dir).map_err(|error| SynthError::Statvfs {
        path: dir.to_path_buf(),
        error,
    })?;
    let avail = st.blocks_available() as u64 * st.fragment_size() as u64;
    if avail < need.saturating_add(DISK_HEADROOM) {
        return Err(SynthError::NoSpace {
            path: dir.to_path_buf(),
            need,
            headroom: DISK_HEADROOM,
            avail,
        });
    }
    Ok(())
}

/// Writes the checkpoint of `plan` into `dir` (see [`prepare_dir`] for `force`).
pub fn write(
    plan: &Blueprint,
    dir: &Path,
    seed: u64,
    force: bool,
    progress: &mut dyn FnMut(WriteProgress),
) -> Result<Written, SynthError> {
    prepare_dir(dir, plan, force)?;
    let bytes_total = plan.total_bytes();
    check_space(dir, bytes_total)?;
    let mut files = Vec::new();
    let mut done = 0u64;
    for (name, contents) in &plan.small_files {
        let path = dir.join(name);
        fs::write(&path, contents).map_err(|error| SynthError::Io { path, error })?;
        files.push((name.clone(), writer::hex(&Sha256::digest(contents))));
        done += contents.len() as u64;
    }
    let shards = plan.shards.len();
    for (i, s) in plan.shards.iter().enumerate() {
        let mut report = |n: u64| {
            done += n;
            progress(WriteProgress {
                shard: i + 1,
                shards,
                bytes_done: done,
                bytes_total,
            });
        };
        let digest = writer::write(s, dir, seed, &mut report)?;
        files.push((s.file_name.clone(), digest));
    }
    files.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(Written {
        content_sha256: content_sha256(&files),
        files,
        total_bytes: bytes_total,
        vocab_size: plan.config.vocab_size,
    })
}

/// Recomputes the [`content_sha256`] of the checkpoint files a plan would write, from the files in
/// `dir` (e.g. to check a checkpoint against a fixture without rewriting it).
pub fn content_sha256_dir(plan: &Blueprint, dir: &Path) -> Result<String, SynthError> {
    let names = plan
        .small_files
        .iter()
        .map(|(n, _)| n)
        .chain(plan.shards.iter().map(|s| &s.file_name));
    let mut files = Vec::new();
    for name in names {
        let path = dir.join(name);
        let mut f = fs::File::open(&path).map_err(|error| SynthError::Io {
            path: path.clone(),
            error,
        })?;
        let mut h = Sha256::new();
        std::io::copy(&mut f, &mut h).map_err(|error| SynthError::Io { path, error })?;
        files.push((name.clone(), writer::hex(&h.finalize())));
    }
    Ok(content_sha256(&files))
}

#[cfg(test)]
mod tests;
