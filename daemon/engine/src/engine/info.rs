//! What an engine is (identity, fingerprint, configuration) and what it has done (counters).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use super::EngineError;
use crate::checkpoint::Checkpoint;
use crate::checkpoint::config::MixerKind;
use crate::store::StoreStats;

/// Load progress reported while [`super::Engine::open`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadProgress {
    /// Reading and validating config and shard headers.
    Checking,
    /// `done` of `total` bytes of the weights the memory plan keeps resident are read
    /// ([`crate::store::resident_load_bytes`]). Reported once at 0, then at most once per
    /// [`super::LOAD_REPORT_BYTES`] read, and at `total`.
    Weights {
        done: u64,
        total: u64,
    },
    Ready,
}

/// Identity and shape of the loaded model.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    /// The model directory's name.
    pub name: String,
    pub dir: PathBuf,
    /// [`Checkpoint::fingerprint`].
    pub fingerprint: String,
    /// One line: layers, mixers, width, experts, vocabulary.
    pub summary: String,
    pub num_layers: usize,
    pub vocab_size: usize,
    /// The memory plan the weights were loaded with (multi-line text).
    pub plan: String,
    /// Trunk layers the plan pins (the others stream).
    pub pinned_layers: Vec<usize>,
    /// The expert cache's size.
    pub cache_capacity_bytes: u64,
}

impl EngineInfo {
    pub(super) fn describe(checkpoint: &Checkpoint) -> Result<EngineInfo, EngineError> {
        let c = &checkpoint.config;
        let kda = c
            .layer_kinds
            .iter()
            .filter(|k| **k == MixerKind::Kda)
            .count();
        let summary = format!(
            "{} layers ({} KDA, {} MLA), hidden {}, {} experts top-{} (+{} shared), vocab {}",
            c.num_hidden_layers,
            kda,
            c.num_hidden_layers - kda,
            c.hidden_size,
            c.num_experts,
            c.num_experts_per_token,
            c.num_shared_experts,
            c.vocab_size
        );
        Ok(EngineInfo {
            name: checkpoint.dir.file_name().map_or_else(
                || checkpoint.dir.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            ),
            dir: checkpoint.dir.clone(),
            fingerprint: checkpoint.fingerprint()?,
            summary,
            num_layers: c.num_hidden_layers,
            vocab_size: c.vocab_size,
            plan: String::new(),
            pinned_layers: Vec::new(),
            cache_capacity_bytes: 0,
        })
    }
}

/// Counters since the engine was opened: the store's own figures as the store reports them
/// (one struct from the store to every surface; the transports convert it once, gRPC in
/// `k3d`'s `grpc/status.rs`, Prometheus in `http/metrics.rs`) plus the engine's batching.
#[derive(Debug, Clone, Copy, Default)]
pub struct EngineStats {
    /// Weight bytes read and avoided by class, read time, the expert cache's counters.
    pub store: StoreStats,
    /// Forward passes run by steps ([`super::Engine::step_batch`]).
    pub forward_passes: u64,
    /// Of those, passes that served two or more generations at once.
    pub batched_passes: u64,
    /// The most generations one pass has served.
    pub widest_batch: u64,
}

/// How many generations the engine's forward passes served, counted as they run.
#[derive(Debug, Default)]
pub(super) struct BatchCounters {
    passes: AtomicU64,
    batched: AtomicU64,
    widest: AtomicU64,
}

impl BatchCounters {
    /// Counts one pass serving `members` generations.
    pub(super) fn record(&self, members: usize) {
        let members = members as u64;
        self.passes.fetch_add(1, Ordering::Relaxed);
        if members > 1 {
            self.batched.fetch_add(1, Ordering::Relaxed);
        }
        self.widest.fetch_max(members, Ordering::Relaxed);
    }
}

impl EngineStats {
    pub(super) fn new(store: StoreStats, batches: &BatchCounters) -> Self {
        EngineStats {
            store,
            forward_passes: batches.passes.load(Ordering::Relaxed),
            batched_passes: batches.batched.load(Ordering::Relaxed),
            widest_batch: batches.widest.load(Ordering::Relaxed),
        }
    }
}
