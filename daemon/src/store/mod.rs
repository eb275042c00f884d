//! Where weight bytes live.
//!
//! The model never touches a file: it asks the [`WeightStore`] for the bytes of one layer's
//! trunk run ([`WeightStore::trunk`]), for a *set* of routed experts right after routing
//! ([`WeightStore::experts`]), and for the model-level tensors. Each call returns a view whose
//! lifetime bounds the use of the bytes, so a later store can stream a trunk layer through a
//! ring slot or issue an expert set as parallel reads without changing the model.
//!
//! Phase 1 (this file) is fully resident: every run is read at load with positioned reads into
//! owned buffers. MXFP4 scale bytes of an expert are verified the first time the expert is
//! handed out (spec §3.5): a 255 fails the forward with layer, expert, tensor, row and group.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::checkpoint::layout::{ByteRun, ExpertLayout, FfnLayout, ModelLayout, Slice};
use crate::kernels::mxfp4;

/// Failures of the weight store. Every variant names the file and offset it concerns.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("layout refers to shard #{shard}, but only {count} shard files were given")]
    NoSuchShard { shard: usize, count: usize },
    #[error("cannot open shard {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading {len} bytes at offset {offset} of {path}: {source}")]
    Read {
        path: PathBuf,
        offset: u64,
        len: u64,
        source: std::io::Error,
    },
    #[error("run of {len} bytes at offset {offset} of {path} does not fit in memory")]
    TooLarge {
        path: PathBuf,
        offset: u64,
        len: u64,
    },
    #[error("layer {layer} does not exist (the model has {count} layers)")]
    NoSuchLayer { layer: usize, count: usize },
    #[error("layer {layer} has no routed experts")]
    NotMoe { layer: usize },
    #[error("layer {layer}: expert {expert} does not exist (the layer has {count})")]
    NoSuchExpert {
        layer: usize,
        expert: usize,
        count: usize,
    },
    #[error(
        "layer {layer}, expert {expert}: tensor {tensor} (bytes {start}..+{len} of the run at \
         offset {offset} of {path}) lies outside its expert run"
    )]
    SliceOutsideRun {
        layer: usize,
        expert: usize,
        tensor: &'static str,
        start: usize,
        len: usize,
        path: PathBuf,
        offset: u64,
    },
    #[error(
        "corrupt checkpoint: MXFP4 scale byte 255 (NaN) in layer {layer}, expert {expert}, \
         tensor {tensor}, row {row}, group {group} ({path}, byte offset {offset})"
    )]
    NanScale {
        layer: usize,
        expert: usize,
        tensor: &'static str,
        row: usize,
        group: usize,
        path: PathBuf,
        offset: u64,
    },
    #[error("token id {id} is outside the embedding table ({rows} rows)")]
    NoSuchRow { id: usize, rows: usize },
}

/// The five model-level tensors (spec §3.3, shard 94).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelTensorId {
    EmbedTokens,
    LmHead,
    Norm,
    OutputAttnResNorm,
    OutputAttnResProj,
}

/// Bytes of one layer's trunk run, borrowed from the store.
pub struct TrunkView<'s> {
    bytes: &'s [u8],
}

impl std::ops::Deref for TrunkView<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

/// One routed expert handed out by [`WeightStore::experts`]: its run bytes and the layout of
/// its six tensors within them.
pub struct ExpertView<'s> {
    pub expert: usize,
    pub bytes: &'s [u8],
    pub layout: &'s ExpertLayout,
}

/// The experts of one request, in the order they were asked for.
pub struct ExpertSet<'s> {
    pub experts: Vec<ExpertView<'s>>,
}

/// Where a bad scale byte was found, remembered so later requests fail identically.
#[derive(Debug, Clone, Copy)]
struct BadScale {
    tensor: &'static str,
    row: usize,
    group: usize,
    offset: u64,
}

struct ResidentExpert {
    run: ByteRun,
    bytes: Vec<u8>,
    /// `Some(verdict)` once the scale bytes were checked; `None` verdict = clean.
    verified: OnceLock<Option<BadScale>>,
}

/// Owns the weight bytes of the text model (phase 1: everything resident).
pub struct WeightStore {
    layout: ModelLayout,
    shards: Vec<PathBuf>,
    trunks: Vec<Vec<u8>>,
    /// `experts[L]` is empty for dense layers.
    experts: Vec<Vec<ResidentExpert>>,
    embed_tokens: Vec<u8>,
    lm_head: Vec<u8>,
    norm: Vec<u8>,
    output_attn_res_norm: Vec<u8>,
    output_attn_res_proj: Vec<u8>,
    counters: Counters,
}

/// Weight traffic since the store was created (engine-lessons §4.2: bytes, not hit rates).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Bytes read from the shard files.
    pub bytes_read: u64,
    /// Bytes handed to the model from memory that a store without them resident would have
    /// had to read.
    pub bytes_avoided: u64,
}

#[derive(Debug, Default)]
struct Counters {
    read: AtomicU64,
    avoided: AtomicU64,
}

impl Counters {
    fn avoided(&self, n: usize) {
        self.avoided.fetch_add(n as u64, Ordering::Relaxed);
    }
}

impl WeightStore {
    /// Reads every run of `layout` from `shards` (indexed by [`ByteRun::shard`]).
    pub fn load_resident(layout: ModelLayout, shards: Vec<PathBuf>) -> Result<Self, StoreError> {
        let mut files: Vec<Option<File>> = (0..shards.len()).map(|_| None).collect();
        let mut read = |run: &ByteRun| read_run(&shards, &mut files, run);
        let mut trunks = Vec::with_capacity(layout.layers.len());
        let mut experts = Vec::with_capacity(layout.layers.len());
        for layer in &layout.layers {
            trunks.push(read(&layer.trunk)?);
            let mut resident = Vec::new();
            if let FfnLayout::Moe(moe) = &layer.ffn {
                // Sweep each shard forward: read in (shard, offset) order, store by expert id.
                let mut order: Vec<usize> = (0..moe.experts.len()).collect();
                order.sort_by_key(|&e| (moe.experts[e].0.shard, moe.experts[e].0.offset));
                let mut slots: Vec<Option<ResidentExpert>> =
                    (0..moe.experts.len()).map(|_| None).collect();
                for e in order {
                    let run = moe.experts[e].0;
                    slots[e] = Some(ResidentExpert {
                        run,
                        bytes: read(&run)?,
                        verified: OnceLock::new(),
                    });
                }
                resident = slots.into_iter().flatten().collect();
            }
            experts.push(resident);
        }
        let embed_tokens = read(&layout.embed_tokens.run)?;
        let lm_head = read(&layout.lm_head.run)?;
        let norm = read(&layout.norm.run)?;
        let output_attn_res_norm = read(&layout.output_attn_res_norm.run)?;
        let output_attn_res_proj = read(&layout.output_attn_res_proj.run)?;
        let counters = Counters::default();
        let loaded = trunks.iter().map(Vec::len).sum::<usize>()
            + experts
                .iter()
                .flatten()
                .map(|e| e.bytes.len())
                .sum::<usize>()
            + [
                &embed_tokens,
                &lm_head,
                &norm,
                &output_attn_res_norm,
                &output_attn_res_proj,
            ]
            .iter()
            .map(|b| b.len())
            .sum::<usize>();
        counters.read.store(loaded as u64, Ordering::Relaxed);
        Ok(WeightStore {
            layout,
            shards,
            trunks,
            experts,
            embed_tokens,
            lm_head,
            norm,
            output_attn_res_norm,
            output_attn_res_proj,
            counters,
        })
    }

    /// Weight traffic so far.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            bytes_read: self.counters.read.load(Ordering::Relaxed),
            bytes_avoided: self.counters.avoided.load(Ordering::Relaxed),
        }
    }

    /// The layout the store serves.
    pub fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    /// The bytes of layer `layer`'s trunk run (all its non-expert tensors).
    pub fn trunk(&self, layer: usize) -> Result<TrunkView<'_>, StoreError> {
        let bytes = self.trunks.get(layer).ok_or(StoreError::NoSuchLayer {
            layer,
            count: self.trunks.len(),
        })?;
        self.counters.avoided(bytes.len());
        Ok(TrunkView { bytes })
    }

    /// The routed experts `ids` of layer `layer`, in the order given. Each expert's scale bytes
    /// are verified on its first request; a corrupt expert fails the whole request.
    pub fn experts(&self, layer: usize, ids: &[usize]) -> Result<ExpertSet<'_>, StoreError> {
        let resident = self.experts.get(layer).ok_or(StoreError::NoSuchLayer {
            layer,
            count: self.experts.len(),
        })?;
        let FfnLayout::Moe(moe) = &self.layout.layers[layer].ffn else {
            return Err(StoreError::NotMoe { layer });
        };
        let mut out = Vec::with_capacity(ids.len());
        for &e in ids {
            let (Some(r), Some((_, layout))) = (resident.get(e), moe.experts.get(e)) else {
                return Err(StoreError::NoSuchExpert {
                    layer,
                    expert: e,
                    count: resident.len(),
                });
            };
            let verdict = match r.verified.get() {
                Some(v) => *v,
                None => {
                    let v = self.check_scales(layer, e, r, layout)?;
                    *r.verified.get_or_init(|| v)
                }
            };
            if let Some(bad) = verdict {
                return Err(StoreError::NanScale {
                    layer,
                    expert: e,
                    tensor: bad.tensor,
                    row: bad.row,
                    group: bad.group,
                    path: self.shard_path(r.run.shard),
                    offset: bad.offset,
                });
            }
            self.counters.avoided(r.bytes.len());
            out.push(ExpertView {
                expert: e,
                bytes: &r.bytes,
                layout,
            });
        }
        Ok(ExpertSet { experts: out })
    }

    /// The stored bytes of embedding row `id`, `row_bytes` long.
    pub fn embedding_row(&self, id: usize, row_bytes: usize) -> Result<&[u8], StoreError> {
        let rows = self.embed_tokens.len().checked_div(row_bytes).unwrap_or(0);
        let range = id
            .checked_mul(row_bytes)
            .and_then(|s| Some(s..s.checked_add(row_bytes)?));
        match range.and_then(|r| self.embed_tokens.get(r)) {
            Some(row) if row_bytes > 0 => {
                self.counters.avoided(row.len());
                Ok(row)
            }
            _ => Err(StoreError::NoSuchRow { id, rows }),
        }
    }

    /// A whole model-level tensor.
    pub fn model_tensor(&self, which: ModelTensorId) -> &[u8] {
        let bytes = match which {
            ModelTensorId::EmbedTokens => &self.embed_tokens,
            ModelTensorId::LmHead => &self.lm_head,
            ModelTensorId::Norm => &self.norm,
            ModelTensorId::OutputAttnResNorm => &self.output_attn_res_norm,
            ModelTensorId::OutputAttnResProj => &self.output_attn_res_proj,
        };
        self.counters.avoided(bytes.len());
        bytes
    }

    fn shard_path(&self, shard: usize) -> PathBuf {
        self.shards.get(shard).cloned().unwrap_or_default()
    }

    /// Scans the three scale tensors of one expert for the NaN byte (spec §3.5).
    fn check_scales(
        &self,
        layer: usize,
        expert: usize,
        r: &ResidentExpert,
        layout: &ExpertLayout,
    ) -> Result<Option<BadScale>, StoreError> {
        for (tensor, slice) in [
            ("w1.weight_scale", &layout.w1_scale),
            ("w2.weight_scale", &layout.w2_scale),
            ("w3.weight_scale", &layout.w3_scale),
        ] {
            let bytes = slice_of(&r.bytes, slice).ok_or_else(|| StoreError::SliceOutsideRun {
                layer,
                expert,
                tensor,
                start: slice.start,
                len: slice.len,
                path: self.shard_path(r.run.shard),
                offset: r.run.offset,
            })?;
            let groups = slice.shape.get(1).copied().unwrap_or(0).max(1);
            if let Some((row, group)) = mxfp4::find_nan_scale(bytes, groups) {
                let offset = r.run.offset + (slice.start + row * groups + group) as u64;
                return Ok(Some(BadScale {
                    tensor,
                    row,
                    group,
                    offset,
                }));
            }
        }
        Ok(None)
    }
}

fn slice_of<'a>(run: &'a [u8], s: &Slice) -> Option<&'a [u8]> {
    run.get(s.start..s.start.checked_add(s.len)?)
}

/// One positioned read of a whole run into an owned buffer.
fn read_run(
    shards: &[PathBuf],
    files: &mut [Option<File>],
    run: &ByteRun,
) -> Result<Vec<u8>, StoreError> {
    let path: &Path = shards.get(run.shard).ok_or(StoreError::NoSuchShard {
        shard: run.shard,
        count: shards.len(),
    })?;
    let file = match &mut files[run.shard] {
        Some(f) => f,
        slot => slot.insert(File::open(path).map_err(|source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        })?),
    };
    let len = usize::try_from(run.len).map_err(|_| StoreError::TooLarge {
        path: path.to_path_buf(),
        offset: run.offset,
        len: run.len,
    })?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, run.offset)
        .map_err(|source| StoreError::Read {
            path: path.to_path_buf(),
            offset: run.offset,
            len: run.len,
            source,
        })?;
    Ok(buf)
}
