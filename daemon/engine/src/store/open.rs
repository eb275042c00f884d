//! Opening the store: the shards opened, the reader pool started, and exactly what the plan
//! keeps resident allocated and read — pinned trunk layers, a resident embedding and lm_head,
//! the model vectors and, when the cache holds every expert, the experts — with the load's
//! progress reported in resident bytes read ([`resident_load_bytes`]).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use super::chunks::{ChunkStream, StreamPack, Unit};
use super::direct_buffer::AlignedBuf;
use super::direct_io::{DirectPolicy, LoadedRun, ShardSet};
use super::expert_cache::{ExpertCache, PolicyKind};
use super::experts::BadScale;
use super::reader::{ReaderConfig, ReaderPool};
use super::stats::{Class, GuessCounters, Traffic};
use super::trunk::Ring;
use super::{
    StoreError, WeightStore, any_offset, head_block_rows, head_row_bytes, window_capacity,
};
use crate::checkpoint::layout::{ByteRun, FfnLayout, LayerLayout, ModelLayout, Slice};
use crate::pack::{self, PackFile};
use crate::plan::{self, Plan, Residency};

/// Options of the store that are not part of the memory plan.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    pub direct: DirectPolicy,
    pub reader: ReaderConfig,
    /// Keep every routed-expert request in order ([`WeightStore::expert_trace`]), for
    /// replaying eviction policies against real routing (`k3d bench --policy-slots`).
    pub record_trace: bool,
    /// The expert cache's eviction policy. LFU with aging by default: on the trained
    /// fixture's real routing, with the lookahead on, it read as much as LRU with 16 slots and
    /// 8.5–13 / 26–27 % less with 32 / 64 (medians of 5 runs; 8 slots is below one token's
    /// experts, where the plan never grows a cache); ids identical (issue 17 item 3, figures in
    /// `docs/memory-plan.md`). `k3d bench --cache-policy` measures either in place.
    pub cache_policy: PolicyKind,
    /// Reads a test makes fail ([`fault`], feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub faults: Option<&'static super::fault::Faults>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            direct: DirectPolicy::Prefer,
            reader: ReaderConfig::default(),
            record_trace: false,
            cache_policy: PolicyKind::LfuAging { period: 0 },
            #[cfg(feature = "fault-injection")]
            faults: None,
        }
    }
}

/// A trunk pack offered to the store ([`crate::pack`]): read where the plan finds that it
/// pays ([`Plan::price_pack`]), or whenever it can be read (`always`).
#[derive(Debug)]
pub struct PackOffer {
    pub file: PackFile,
    pub always: bool,
}

/// At most this many pack bytes are read and decoded at open to measure the drive and the
/// decoder (a quarter of a second of a 1 GB/s drive).
const PACK_SAMPLE_BYTES: u64 = 256 << 20;

impl WeightStore {
    /// Opens the shards and allocates and fills exactly what `plan` keeps resident.
    /// `trunk_order` lists a layer's matrices in the order its consumer applies them: what a
    /// chunk stream reads them in (unused with a ring).
    pub fn open(
        layout: ModelLayout,
        shards: &[PathBuf],
        plan: Plan,
        options: StoreOptions,
        trunk_order: &dyn Fn(&LayerLayout) -> Vec<Slice>,
    ) -> Result<Self, StoreError> {
        Self::open_reporting(
            layout,
            shards,
            plan,
            options,
            trunk_order,
            None,
            &mut |_, _| {},
        )
    }

    /// [`Self::open`], calling `progress(done, total)` with the resident bytes read so far
    /// ([`resident_load_bytes`] in all) once before the first read and after each run (or each
    /// layer's preloaded experts): a run is one layer's trunk or one table, so a caller gets a
    /// figure at least every few hundred MiB without the reads being split for it.
    ///
    /// With a `pack` (checked against this checkpoint by [`PackFile::open`]) the chunk stream
    /// reads the matrices it holds from it, through the same reader threads, if the plan
    /// prices it as paying: the store measures the drive and the decoder on the first packed
    /// pieces and records the outcome in its plan ([`WeightStore::plan`]'s `pack`).
    pub fn open_reporting(
        layout: ModelLayout,
        shards: &[PathBuf],
        mut plan: Plan,
        options: StoreOptions,
        trunk_order: &dyn Fn(&LayerLayout) -> Vec<Slice>,
        pack: Option<PackOffer>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self, StoreError> {
        // The pack is one more file of the reader pool's, after the shards.
        let mut files = shards.to_vec();
        if let Some(p) = &pack {
            files.push(p.file.path.clone());
        }
        let set = ShardSet::open(&files, options.direct)?;
        #[cfg(feature = "fault-injection")]
        let set = set.with_faults(options.faults);
        let set = Arc::new(set);
        let pool = ReaderPool::new(set, options.reader)?;
        let traffic = Traffic::default();
        let guesses = (0..layout.layers.len())
            .map(|_| GuessCounters::default())
            .collect();
        let total = resident_load_bytes(&layout, &plan);
        progress(0, total);
        let mut done = 0u64;
        let mut read_new = |run: ByteRun, class: Class| -> Result<LoadedRun, StoreError> {
            let buf = AlignedBuf::zeroed(window_capacity(run)?)?;
            let loaded = pool.read(run, buf).map_err(|f| f.error)?;
            traffic.read(class, run.len);
            done += run.len;
            progress(done, total);
            Ok(loaded)
        };
        let n = layout.layers.len();
        let mut pinned: Vec<Option<LoadedRun>> = (0..n).map(|_| None).collect();
        for &l in &plan.pinned_layers {
            if let (Some(slot), Some(ll)) = (pinned.get_mut(l), layout.layers.get(l)) {
                *slot = Some(read_new(ll.trunk, Class::Trunk)?);
            }
        }
        let streamed: Vec<usize> = (0..n).filter(|&l| pinned[l].is_none()).collect();
        let (pack, always) = match pack {
            Some(offer) => match plan.pack_refusal() {
                Some(why) => {
                    plan.refuse_pack(why);
                    (None, false)
                }
                None => (
                    Some(StreamPack {
                        file: offer.file,
                        shard: shards.len(),
                        path: pack::Path::detect(),
                    }),
                    offer.always,
                ),
            },
            None => (None, false),
        };
        let offered = pack.is_some();
        let (ring, mut chunks) = stream_buffers(&layout, &plan, &streamed, trunk_order, pack)?;
        if offered {
            price_pack(&mut plan, chunks.as_mut(), &pool, always)?;
        }
        let slot_bytes = usize::try_from(plan.cache_slot_bytes).unwrap_or(usize::MAX);
        // The policy is the options' (LFU-aging by default, see `StoreOptions::cache_policy`).
        // On synthetic routing, which is flat, LRU had won at small caches (6.8 vs 5.7 MB/token
        // avoided at 14 % of small's pool) and LFU-aging only from ~1/3 of the pool; flat
        // routing has no popular experts to keep, so the trained model's real routing decides.
        // With a prefill pass planned, the cache also holds the slots of the pass's bytes
        // until a pass needs them (issue 41.5; `engine::passes` borrows them).
        let cache = ExpertCache::new(
            plan.idle_cache_slots().max(1),
            slot_bytes,
            options.cache_policy,
        )?
        .lending(plan.pass_cache_slots);
        let verdicts = unchecked_scales(&layout);
        let (embed_tokens, row_buf) = match plan.embedding {
            Residency::Resident => (
                Some(read_new(layout.embed_tokens.run, Class::Embedding)?),
                None,
            ),
            Residency::Streamed => {
                let row = head_row_bytes(&layout.embed_tokens.slice) as u64;
                (None, Some(AlignedBuf::zeroed(any_offset(row)?)?))
            }
        };
        let lm_head = match plan.lm_head {
            Residency::Resident => Some(read_new(layout.lm_head.run, Class::Head)?),
            Residency::Streamed => None,
        };
        let norm = read_new(layout.norm.run, Class::Trunk)?;
        let output_attn_res_norm = read_new(layout.output_attn_res_norm.run, Class::Trunk)?;
        let output_attn_res_proj = read_new(layout.output_attn_res_proj.run, Class::Trunk)?;
        let vectors_done = done;
        let store = WeightStore {
            layout,
            plan,
            pool,
            pinned,
            streamed,
            ring,
            chunks,
            cache,
            verdicts,
            embed_tokens,
            row_buf: Mutex::new(row_buf),
            lm_head,
            norm,
            output_attn_res_norm,
            output_attn_res_proj,
            traffic,
            guesses,
            trace: options.record_trace.then(|| Mutex::new(Vec::new())),
        };
        store.preload_experts(&mut |layer_bytes| {
            progress((vectors_done + layer_bytes).min(total), total)
        })?;
        if let Some(c) = &store.chunks {
            c.top_up(&store.pool);
        }
        Ok(store)
    }

    /// With a cache that holds every expert (the `max` plan) all are read at load, layer by
    /// layer, so a run never waits on an expert read.
    /// `progress` gets the expert bytes read so far after each layer.
    fn preload_experts(&self, progress: &mut dyn FnMut(u64)) -> Result<(), StoreError> {
        if !preloads_experts(&self.layout, &self.plan) {
            return Ok(());
        }
        let mut read = 0u64;
        for (l, v) in self.verdicts.iter().enumerate() {
            if !v.is_empty() {
                let ids: Vec<usize> = (0..v.len()).collect();
                self.fetch_each(l, &ids, None, || {}, |_| Ok::<(), StoreError>(()))?;
                read += expert_bytes(&self.layout.layers[l]);
                progress(read);
            }
        }
        Ok(())
    }
}

/// Measures the drive and the decoder on `chunks`' first packed pieces and prices the pack in
/// `plan`; a pack the plan does not use is dropped from the stream before its first read.
fn price_pack(
    plan: &mut Plan,
    chunks: Option<&mut ChunkStream>,
    pool: &ReaderPool,
    always: bool,
) -> Result<(), StoreError> {
    let Some(stream) = chunks.filter(|c| c.reads_pack()) else {
        plan.refuse_pack(plan::PackRefusal::NoPackedMatrix);
        return Ok(());
    };
    let Some((drive_rate, decode_rate)) = stream.measure_pack(pool, PACK_SAMPLE_BYTES)? else {
        plan.refuse_pack(plan::PackRefusal::NoPackedMatrix);
        return Ok(());
    };
    let cycle = stream.cycle_bytes();
    let measure = plan::PackMeasure {
        trunk_read: cycle.trunk,
        lm_head_read: cycle.lm_head,
        figures: plan::PackFigures {
            read: cycle.packed,
            decoded: cycle.decoded,
            buffer: stream.decode_buffer_bytes() as u64,
            decode_rate,
            drive_rate,
            threads: rayon::current_num_threads(),
        },
    };
    if !plan.price_pack(measure, always) {
        stream.unpack()?;
    }
    Ok(())
}

/// What the plan streams through: a ring of whole-layer slots (each as large as the largest
/// streamed trunk layer or lm_head block), or a chunk stream over the `streamed` layers (their
/// matrices in `trunk_order`, read from `pack` where it holds them) and a streamed lm_head,
/// beside an empty ring.
fn stream_buffers(
    layout: &ModelLayout,
    plan: &Plan,
    streamed: &[usize],
    trunk_order: &dyn Fn(&LayerLayout) -> Vec<Slice>,
    pack: Option<StreamPack>,
) -> Result<(Ring, Option<ChunkStream>), StoreError> {
    match plan.scheme {
        plan::StreamScheme::Ring { slots } => {
            let largest_trunk = streamed
                .iter()
                .map(|&l| any_offset(layout.layers[l].trunk.len))
                .try_fold(0usize, |a, b| b.map(|b| a.max(b)))?;
            let head_piece = match plan.lm_head {
                Residency::Resident => 0,
                Residency::Streamed => {
                    let s = &layout.lm_head.slice;
                    any_offset((head_block_rows(s) * head_row_bytes(s)) as u64)?
                }
            };
            Ok((Ring::new(slots, largest_trunk.max(head_piece))?, None))
        }
        plan::StreamScheme::Chunks { chunk, in_flight } => {
            let mut units: Vec<(Unit, ByteRun, Vec<Slice>)> = streamed
                .iter()
                .map(|&l| {
                    let ll = &layout.layers[l];
                    (Unit::Layer(l), ll.trunk, trunk_order(ll))
                })
                .collect();
            if plan.lm_head == Residency::Streamed {
                let t = &layout.lm_head;
                units.push((Unit::LmHead, t.run, vec![t.slice.clone()]));
            }
            let stream = (!units.is_empty())
                .then(|| {
                    let chunk = usize::try_from(chunk).unwrap_or(usize::MAX);
                    ChunkStream::new(units, chunk, in_flight + 1, pack)
                })
                .transpose()?;
            Ok((Ring::new(2, 0)?, stream))
        }
    }
}

/// One unchecked scale verdict per routed expert of each layer (none for a dense layer).
fn unchecked_scales(layout: &ModelLayout) -> Vec<Vec<OnceLock<Option<BadScale>>>> {
    layout
        .layers
        .iter()
        .map(|l| match &l.ffn {
            FfnLayout::Moe(m) => m.experts.iter().map(|_| OnceLock::new()).collect(),
            FfnLayout::Dense(_) => Vec::new(),
        })
        .collect()
}

/// Whether [`WeightStore::open`] reads every routed expert into the cache: the cache holds
/// them all while no prefill pass runs (the `max` plan, or a budget whose pass lends the cache
/// the rest: issue 41.5), so a run never waits on an expert read until a pass takes slots.
fn preloads_experts(layout: &ModelLayout, plan: &Plan) -> bool {
    let pool: usize = layout
        .layers
        .iter()
        .map(|l| match &l.ffn {
            FfnLayout::Moe(m) => m.experts.len(),
            FfnLayout::Dense(_) => 0,
        })
        .sum();
    pool > 0 && plan.idle_cache_slots() >= pool
}

/// The routed experts' bytes of one layer (0 for a dense one).
fn expert_bytes(layer: &LayerLayout) -> u64 {
    match &layer.ffn {
        FfnLayout::Moe(m) => m.experts.iter().map(|(run, _)| run.len).sum(),
        FfnLayout::Dense(_) => 0,
    }
}

/// The bytes [`WeightStore::open`] reads into memory that stays resident under `plan`: pinned
/// trunk layers, a resident embedding and lm_head, the model vectors and, when the cache holds
/// every expert, the experts. What a load's progress counts to; streamed weights are read
/// later, as tokens need them.
pub fn resident_load_bytes(layout: &ModelLayout, plan: &Plan) -> u64 {
    let pinned: u64 = plan
        .pinned_layers
        .iter()
        .filter_map(|&l| layout.layers.get(l))
        .map(|l| l.trunk.len)
        .sum();
    let resident = |r: Residency, run: ByteRun| match r {
        Residency::Resident => run.len,
        Residency::Streamed => 0,
    };
    let experts = if preloads_experts(layout, plan) {
        layout.layers.iter().map(expert_bytes).sum()
    } else {
        0
    };
    pinned
        + resident(plan.embedding, layout.embed_tokens.run)
        + resident(plan.lm_head, layout.lm_head.run)
        + layout.norm.run.len
        + layout.output_attn_res_norm.run.len
        + layout.output_attn_res_proj.run.len
        + experts
}
