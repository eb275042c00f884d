//! Reading a Kimi K3 checkpoint directory: headers, config and layout — never tensor data.
//!
//! * [`safetensors`] — parse and validate every shard header (spec §3.2) into one tensor index.
//! * [`config`] — parse and validate `config.json` (spec §2), nested or flat.
//! * [`inventory`] — the names, dtypes and shapes a config implies (spec §3.3).
//! * [`layout`] — bind the index to the model: per-layer trunk runs, expert runs, tensor slices
//!   (spec §3.3–§3.4).
//! * [`census`] — the byte census of a bound model (spec §1.2).
//!
//! [`Checkpoint::open`] does all of it for a model directory.
//!
//! Accepted variants of the released layout: the small vectors of the inventory
//! ([`inventory::Want::vector`]: norms, AttnRes projections, conv taps, `A_log`, `dt_bias`,
//! the router bias) may be stored in any of [`inventory::VECTOR_DTYPES`] (F32, BF16, F16); the
//! model widens them exactly to f32, so the same values compute the same bits. Matrices must be
//! BF16 and experts MXFP4 as released; anything else is refused naming the tensor, its dtype
//! and what is supported.

pub mod census;
pub mod config;
pub mod inventory;
pub mod layout;
pub mod manifest;
pub mod safetensors;
pub mod verify;

use std::path::{Path, PathBuf};

pub use census::ByteCensus;
pub use config::{ConfigError, ModelConfig};
pub use layout::{LayoutError, ModelLayout};
pub use safetensors::{SafetensorsError, ShardFile, TensorIndex};

/// The version of the numerics contract: what bits the forward pass computes from a
/// checkpoint's bytes (spec §6: the kernels' order of operations and precisions). Bump it with
/// any change that alters one output bit. A model state is the exact result of feeding its
/// ids only under the contract it was computed with, so a state kept on disk is bound to it
/// together with the model's [`Checkpoint::fingerprint`] (`session::kept`, issue 42): after a
/// bump no earlier state is continued, whose continuation would differ from a fresh prefill.
///
/// 1: every reduction in f64 (before issue 41). 2: weight products in f32 by fused
/// multiply-add with the weight tree (spec §6.1 rule 2 as amended, issue 41).
pub const NUMERICS_CONTRACT: u32 = 2;

/// A validated checkpoint directory: config, shard files and the layout binding.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: ModelConfig,
    /// In bytewise file-name order; [`layout::ByteRun::shard`] indexes this.
    pub shards: Vec<ShardFile>,
    pub layout: ModelLayout,
    pub census: ByteCensus,
}

/// Why a checkpoint directory was refused.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Files(#[from] SafetensorsError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

impl CheckpointError {
    /// A checkpoint file at `path` could not be read.
    pub fn io(path: &Path, error: std::io::Error) -> CheckpointError {
        CheckpointError::Files(SafetensorsError::Io {
            path: path.to_path_buf(),
            error,
        })
    }

    /// Whether `config.json` was read and refused (a usage problem, exit 2), as opposed to a
    /// missing, corrupt or disagreeing checkpoint file (exit 3).
    pub fn is_config(&self) -> bool {
        matches!(self, CheckpointError::Config(e) if !e.is_io())
    }
}

impl Checkpoint {
    /// Read `dir/config.json`, index every `*.safetensors` header, cross-check
    /// `model.safetensors.index.json` if present, and bind. Reads no tensor data.
    pub fn open(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let index = TensorIndex::open_dir(dir)?;
        let index_file = dir.join(safetensors::INDEX_FILE_NAME);
        if index_file.exists() {
            index.check_index_file(&index_file)?;
        }
        let layout = layout::bind(&config, &index)?;
        let census = ByteCensus::of(&config, &layout);
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config,
            shards: index.shards().to_vec(),
            layout,
            census,
        })
    }

    /// The model's fingerprint, the one every output shows (`k3d synth`, `k3d check`, `k3d run
    /// --json`, `k3 status`, `/v1/models`) and session files are bound to: sha256 of
    /// `config.json`'s bytes, then per shard (in index order) its file name, size and the
    /// digest of its header taken while indexing. Two checkpoints with the same fingerprint
    /// bind the same tensors to the same byte positions; it reads no tensor data, so it is
    /// cheap for a 1.5 TB checkpoint (`k3d verify` checks the bytes themselves).
    pub fn fingerprint(&self) -> Result<String, CheckpointError> {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        let config_path = self.dir.join("config.json");
        let config = crate::input_file::read(&config_path)
            .map_err(|error| CheckpointError::io(&config_path, error))?;
        h.update(&config);
        for shard in &self.shards {
            h.update(
                shard
                    .path
                    .file_name()
                    .map(|n| n.as_encoded_bytes())
                    .unwrap_or_default(),
            );
            h.update(shard.size.to_le_bytes());
            h.update(shard.header_sha256);
        }
        Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
    }
}
