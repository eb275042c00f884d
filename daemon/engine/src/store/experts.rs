//! Routed experts: each layer's experts a routing asks for, handed out as they become
//! available through the expert cache — resident ones at once, misses read as one batch while
//! the resident ones compute (engine-lessons §4.4) — and the routing lookahead's reads issued
//! before the routing is known ([`WeightStore::prefetch_experts`]). Each expert's MXFP4 scale
//! bytes are checked the first time it is handed out (spec §3.5).

use std::sync::Arc;

use super::direct_buffer::AlignedBuf;
use super::direct_io::{LoadedRun, ReadError, ReadFailure};
use super::expert_cache::{Acquired, ExpertId, Ticket};
use super::reader::{Priority, ReadBatch};
use super::{StoreError, WeightStore, slice_of};
use crate::checkpoint::layout::{ByteRun, ExpertLayout, FfnLayout, MoeLayout};
use crate::kernels::mxfp4;

/// One routed expert handed out by [`WeightStore::experts_each`]: its run bytes (held in its cache
/// slot while this view lives) and the layout of its six tensors within them.
pub struct ExpertView<'s> {
    pub expert: usize,
    run: Arc<LoadedRun>,
    pub layout: &'s ExpertLayout,
}

impl ExpertView<'_> {
    pub fn bytes(&self) -> &[u8] {
        self.run.payload()
    }
}

/// Expert reads issued before routing on a predicted routing ([`WeightStore::prefetch_experts`]).
/// Hand it to [`WeightStore::experts_each`] for the same layer, which adopts the reads the real
/// routing confirms and withdraws the others; dropped unused, its queued reads are skipped and
/// its reserved slots emptied.
pub struct ExpertPrefetch<'s> {
    layer: usize,
    batch: ReadBatch,
    /// By batch id: the guessed expert, its reserved slot and its run length.
    reads: Vec<(usize, Ticket<'s>, u64)>,
    /// Guessed experts already resident, held so the guesses' own reservations cannot evict
    /// them before the routing's own lookup finds them (and counts the hit).
    held: Vec<(usize, Arc<LoadedRun>)>,
    /// Every expert guessed, read or not: what [`WeightStore::lookahead_by_layer`] scores.
    predicted: Vec<usize>,
    /// Guessed before an earlier layer ran ([`ExpertPrefetch::early`]).
    early: bool,
}

impl ExpertPrefetch<'_> {
    /// Marks the guess as made before an earlier layer ran (across a dense layer, issue 16)
    /// rather than before this layer's mixer: [`super::LayerGuesses::early_passes`] counts it.
    pub fn early(self) -> Self {
        Self {
            early: true,
            ..self
        }
    }

    /// Whether expert `e` is among the guesses (being read, or held resident).
    pub fn covers(&self, e: usize) -> bool {
        self.reads.iter().any(|(x, ..)| *x == e) || self.held.iter().any(|(x, _)| *x == e)
    }
}

/// One expert read a [`WeightStore::experts_each`] call waits for.
struct PendingRead<'s> {
    expert: usize,
    ticket: Ticket<'s>,
    len: u64,
    /// Issued ahead of routing.
    guessed: bool,
    /// The routing asked for it (a guess it did not confirm is withdrawn if still queued).
    wanted: bool,
}

/// Where a bad scale byte was found, remembered so later requests fail identically.
#[derive(Debug, Clone, Copy)]
pub(super) struct BadScale {
    tensor: &'static str,
    row: usize,
    group: usize,
    offset: u64,
}

impl WeightStore {
    /// How a layer's experts `needed` split into [`WeightStore::experts_each`] requests: every
    /// expert of one request is held in a cache slot at once, so a request names at most the
    /// slots beside the lookahead's — plus the experts `ahead` already reads, which hold
    /// lookahead slots and all ride with the first request (a guess a later request needs is
    /// then not mistaken for a wrong one).
    pub fn expert_groups(
        &self,
        needed: &[usize],
        ahead: Option<&ExpertPrefetch<'_>>,
    ) -> Vec<Vec<usize>> {
        let per_group = (self.plan.cache_slots - self.plan.lookahead_slots).max(1);
        let (guessed, others): (Vec<usize>, Vec<usize>) = needed
            .iter()
            .partition(|&&e| ahead.is_some_and(|a| a.covers(e)));
        let mut groups: Vec<Vec<usize>> = others.chunks(per_group).map(<[usize]>::to_vec).collect();
        match groups.first_mut() {
            Some(first) => first.extend(guessed),
            None if !guessed.is_empty() => groups.push(guessed),
            None => {}
        }
        groups
    }

    /// The MoE layout of layer `layer`.
    fn moe_layout(&self, layer: usize) -> Result<&MoeLayout, StoreError> {
        let count = self.layout.layers.len();
        match &self
            .layout
            .layers
            .get(layer)
            .ok_or(StoreError::NoSuchLayer { layer, count })?
            .ffn
        {
            FfnLayout::Moe(m) => Ok(m),
            FfnLayout::Dense(_) => Err(StoreError::NotMoe { layer }),
        }
    }

    /// Routing lookahead (plan rule 4): starts reading the experts `predicted` for layer `layer`
    /// (most likely first) before its routing is known, into the plan's lookahead slots. `None` when the plan has
    /// no lookahead slots or `predicted` needs more; a guess that finds no free slot, or whose
    /// expert is being read already, is skipped. The bytes handed out later are the stored
    /// bytes either way: a guess changes when an expert is read, never what is computed.
    ///
    /// Measured on `bench` at 8.5 GiB (trunk resident): routing the mixer's input predicted
    /// 92–99 % of each layer's 16 experts (`Model::read_ahead`), and the reads then run while
    /// the mixer computes.
    pub fn prefetch_experts(
        &self,
        layer: usize,
        predicted: &[usize],
    ) -> Result<Option<ExpertPrefetch<'_>>, StoreError> {
        if self.plan.lookahead_slots == 0 || predicted.len() > self.plan.lookahead_slots {
            return Ok(None);
        }
        let moe = self.moe_layout(layer)?;
        let mut reads = Vec::new();
        let mut runs = Vec::new();
        let mut held = Vec::new();
        for &e in predicted {
            let run = self.expert_run(layer, moe, e)?;
            let key = ExpertId {
                layer: layer as u32,
                expert: e as u32,
            };
            match self.cache.acquire_ahead(key, run)? {
                Some(Acquired::Ready(a)) => held.push((e, a)),
                Some(Acquired::Read { ticket, run, buf }) => {
                    reads.push((e, ticket, run.len));
                    runs.push((run, buf));
                }
                None => {}
            }
        }
        Ok(Some(ExpertPrefetch {
            layer,
            batch: self.pool.submit_ranked(runs),
            reads,
            held,
            predicted: predicted.to_vec(),
            early: false,
        }))
    }

    fn expert_run(&self, layer: usize, moe: &MoeLayout, e: usize) -> Result<ByteRun, StoreError> {
        match moe.experts.get(e) {
            Some((run, _)) => Ok(*run),
            None => Err(StoreError::NoSuchExpert {
                layer,
                expert: e,
                count: moe.experts.len(),
            }),
        }
    }

    /// The routed experts `ids` of layer `layer` (one of [`WeightStore::expert_groups`]),
    /// handed to `compute` as they become available: first every resident one in one call,
    /// then each read as it lands (the misses are read as one batch, §4.4), so compute overlaps
    /// the remaining reads. `ahead`, the layer's [`ExpertPrefetch`], supplies reads already in
    /// flight; its guesses `ids` does not name are withdrawn. `meanwhile` runs once, right
    /// after the misses are issued: work that needs no expert (the shared MLP) hides under the
    /// reads. Each expert's scale bytes are verified on its first hand-out; a corrupt or
    /// unreadable expert — guessed or not — fails the request (no expert is skipped).
    pub fn experts_each<E: From<StoreError>>(
        &self,
        layer: usize,
        ids: &[usize],
        ahead: Option<ExpertPrefetch<'_>>,
        meanwhile: impl FnOnce(),
        mut compute: impl FnMut(Vec<ExpertView<'_>>) -> Result<(), E>,
    ) -> Result<(), E> {
        let moe = self.moe_layout(layer)?;
        if let Some(trace) = &self.trace {
            trace
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(ids.iter().map(|&e| ExpertId {
                    layer: layer as u32,
                    expert: e as u32,
                }));
        }
        self.fetch_each(layer, ids, ahead, meanwhile, |got| {
            let mut views = Vec::with_capacity(got.len());
            for (e, run) in got {
                let (stored, layout) = &moe.experts[e];
                self.verify(layer, e, *stored, layout, run.payload())?;
                views.push(ExpertView {
                    expert: e,
                    run,
                    layout,
                });
            }
            compute(views)
        })
    }

    /// The cache's runs of experts `ids` of `layer` as `(expert, run)`: the resident ones in one
    /// call of `f`, then each read as it lands (a read of `ahead` included); `meanwhile` runs
    /// once the misses are issued.
    pub(super) fn fetch_each<E: From<StoreError>>(
        &self,
        layer: usize,
        ids: &[usize],
        ahead: Option<ExpertPrefetch<'_>>,
        meanwhile: impl FnOnce(),
        mut f: impl FnMut(Vec<(usize, Arc<LoadedRun>)>) -> Result<(), E>,
    ) -> Result<(), E> {
        let moe = self.moe_layout(layer)?;
        // A prefetch for another layer is dropped: its queued reads are skipped.
        let (mut batch, mut pending, held) = match ahead.filter(|a| a.layer == layer) {
            Some(a) => {
                if let Some(g) = self.guesses.get(layer) {
                    g.score(&a.predicted, a.early, ids);
                }
                self.adopt(a, ids)
            }
            None => (None, Vec::new(), Vec::new()),
        };
        let (ready, reads) = self.acquire(layer, moe, ids, &mut pending)?;
        // The routing's own lookups hold what they use now.
        drop(held);
        // Issue the misses before computing the resident experts.
        if !reads.is_empty() {
            match &mut batch {
                Some(b) => self.pool.extend(b, reads, Priority::Demand),
                None => batch = Some(self.pool.submit(reads)),
            }
        }
        meanwhile();
        if !ready.is_empty() {
            f(ready)?;
        }
        match &mut batch {
            Some(batch) => self.land(batch, pending, &mut f),
            None => Ok(()),
        }
    }

    /// Takes over the reads `ahead` issued: each becomes a pending read (by its batch id),
    /// wanted when the routing asked for its expert (`ids`); the wrong guesses no reader has
    /// started are withdrawn at once, before the misses queue. Also the experts `ahead` holds
    /// resident, held until the routing's own lookups hold them.
    #[allow(clippy::type_complexity)]
    fn adopt<'a>(
        &self,
        ahead: ExpertPrefetch<'a>,
        ids: &[usize],
    ) -> (
        Option<ReadBatch>,
        Vec<Option<PendingRead<'a>>>,
        Vec<(usize, Arc<LoadedRun>)>,
    ) {
        let pending: Vec<Option<PendingRead<'_>>> = ahead
            .reads
            .into_iter()
            .map(|(expert, ticket, len)| {
                let wanted = ids.contains(&expert);
                if wanted {
                    ticket.count_demand();
                }
                Some(PendingRead {
                    expert,
                    ticket,
                    len,
                    guessed: true,
                    wanted,
                })
            })
            .collect();
        for (id, p) in pending.iter().enumerate() {
            if p.as_ref().is_some_and(|p| !p.wanted) {
                self.pool.unqueue(&ahead.batch, id);
            }
        }
        (Some(ahead.batch), pending, ahead.held)
    }

    /// Looks up experts `ids` of `layer` not already `pending`: the resident ones (as
    /// `(expert, run)`, their bytes counted as avoided), and the misses, each given a cache
    /// slot, added to `pending` and returned as the reads to issue.
    #[allow(clippy::type_complexity)]
    fn acquire<'s>(
        &'s self,
        layer: usize,
        moe: &MoeLayout,
        ids: &[usize],
        pending: &mut Vec<Option<PendingRead<'s>>>,
    ) -> Result<(Vec<(usize, Arc<LoadedRun>)>, Vec<(ByteRun, AlignedBuf)>), StoreError> {
        let mut ready = Vec::new();
        let mut reads = Vec::new();
        for &e in ids {
            if pending.iter().flatten().any(|p| p.expert == e) {
                continue; // its read is in flight already
            }
            let run = self.expert_run(layer, moe, e)?;
            let key = ExpertId {
                layer: layer as u32,
                expert: e as u32,
            };
            match self.cache.acquire(key, run)? {
                Acquired::Ready(a) => {
                    self.traffic.avoided(a.payload().len());
                    ready.push((e, a));
                }
                Acquired::Read { ticket, run, buf } => {
                    pending.push(Some(PendingRead {
                        expert: e,
                        ticket,
                        len: run.len,
                        guessed: false,
                        wanted: true,
                    }));
                    reads.push((run, buf));
                }
            }
        }
        Ok((ready, reads))
    }

    /// Waits for `batch`'s reads (`pending`, by batch id) as they land: each is published to
    /// the cache and counted, and one the routing asked for goes to `f`; a withdrawn guess
    /// gives its slot and buffer back, nothing read.
    fn land<E: From<StoreError>>(
        &self,
        batch: &mut ReadBatch,
        mut pending: Vec<Option<PendingRead<'_>>>,
        f: &mut impl FnMut(Vec<(usize, Arc<LoadedRun>)>) -> Result<(), E>,
    ) -> Result<(), E> {
        while let Some((id, result)) = self.traffic.waiting(|| batch.wait_any()) {
            let Some(p) = pending.get_mut(id).and_then(Option::take) else {
                continue;
            };
            match result {
                Err(ReadFailure {
                    error: ReadError::Cancelled { .. },
                    buf,
                }) if !p.wanted => p.ticket.release(buf),
                result => {
                    // Publishing a failure empties the slot; the error names file, offset,
                    // errno.
                    let run = p.ticket.publish(result).map_err(StoreError::from)?;
                    self.traffic.expert_read(p.len, p.guessed, p.wanted);
                    if p.wanted {
                        f(vec![(p.expert, run)])?;
                    }
                }
            }
        }
        Ok(())
    }

    fn verify(
        &self,
        layer: usize,
        e: usize,
        stored: ByteRun,
        layout: &ExpertLayout,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let Some(cell) = self.verdicts.get(layer).and_then(|v| v.get(e)) else {
            return Err(StoreError::NoSuchExpert {
                layer,
                expert: e,
                count: 0,
            });
        };
        let verdict = match cell.get() {
            Some(v) => *v,
            None => {
                let v = self.check_scales(layer, e, stored, layout, bytes)?;
                *cell.get_or_init(|| v)
            }
        };
        match verdict {
            None => Ok(()),
            Some(bad) => Err(StoreError::NanScale {
                layer,
                expert: e,
                tensor: bad.tensor,
                row: bad.row,
                group: bad.group,
                path: self.shard_path(stored.shard),
                offset: bad.offset,
            }),
        }
    }

    /// Scans the three scale tensors of one expert for the NaN byte (spec §3.5).
    fn check_scales(
        &self,
        layer: usize,
        expert: usize,
        stored: ByteRun,
        layout: &ExpertLayout,
        run: &[u8],
    ) -> Result<Option<BadScale>, StoreError> {
        for (tensor, slice) in [
            ("w1.weight_scale", &layout.w1_scale),
            ("w2.weight_scale", &layout.w2_scale),
            ("w3.weight_scale", &layout.w3_scale),
        ] {
            let bytes = slice_of(run, slice).ok_or_else(|| StoreError::SliceOutsideRun {
                layer,
                expert,
                tensor,
                start: slice.start,
                len: slice.len,
                path: self.shard_path(stored.shard),
                offset: stored.offset,
            })?;
            let groups = slice.shape.get(1).copied().unwrap_or(0).max(1);
            if let Some((row, group)) = mxfp4::find_nan_scale(bytes, groups) {
                let offset = stored.offset + (slice.start + row * groups + group) as u64;
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
