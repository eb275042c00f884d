//! The routed-expert cache: whole experts in their stored MXFP4 form, one aligned buffer per
//! slot (engine-lessons §2.3, §4).
//!
//! Protocol (§4.4): [`ExpertCache::acquire`] either returns the resident expert or reserves a
//! slot as in-flight *under the lock* and hands out its buffer; the caller reads without the
//! lock (through `store::reader`) and [`Ticket::publish`]es the outcome. Only a successful read
//! becomes visible; a failure empties the slot and is returned, never served (§8.2).
//!
//! Eviction is pluggable ([`EvictionPolicy`]): [`Lru`] and [`LfuAging`] (frequency with
//! periodic halving). A slot whose expert is still held by a caller (its `Arc` shared) is never
//! evicted. Counters report bytes read and bytes avoided, not a hit rate (§4.2), and
//! [`replay`] runs the same bookkeeping over a recorded (layer, expert) trace at any capacity
//! and policy without allocating slot buffers (§4.3).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::direct_buffer::{AlignedBuf, AllocError};
use super::direct_io::{LoadedRun, ReadError, ReadFailure};
use crate::checkpoint::layout::ByteRun;

/// One routed expert of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpertId {
    pub layer: u32,
    pub expert: u32,
}

/// What the cache did, in requests and bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheCounters {
    /// Demand lookups that hit or reserved a slot, and reads issued ahead of routing
    /// ([`ExpertCache::acquire_ahead`]) once the routing asked for them ([`Ticket::count_demand`];
    /// the others count in `reads` only).
    pub requests: u64,
    /// Requests served without a read of their own.
    pub hits: u64,
    /// Reads issued.
    pub reads: u64,
    pub bytes_read: u64,
    /// Bytes of requests served without a read.
    pub bytes_avoided: u64,
    pub evictions: u64,
    pub read_errors: u64,
}

impl CacheCounters {
    /// Requests that needed a read of their own.
    pub fn misses(&self) -> u64 {
        self.requests - self.hits
    }

    /// Fraction of requested bytes served without a read (engine-lessons §4.2).
    pub fn retention(&self) -> f64 {
        let total = self.bytes_read + self.bytes_avoided;
        if total == 0 {
            0.0
        } else {
            self.bytes_avoided as f64 / total as f64
        }
    }
}

/// Chooses which resident slot to evict. Slots are indices `0..capacity`; the cache calls
/// `insert` when a slot is published, `touch` on a hit, `remove` when it leaves.
pub trait EvictionPolicy: Send {
    fn name(&self) -> &'static str;
    fn insert(&mut self, slot: usize);
    fn touch(&mut self, slot: usize);
    fn remove(&mut self, slot: usize);
    /// The least valuable resident slot for which `evictable` holds.
    fn victim(&self, evictable: &dyn Fn(usize) -> bool) -> Option<usize>;
}

/// The built-in policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    Lru,
    /// LFU whose counts halve every `period` requests (0: every 8 × capacity).
    LfuAging {
        period: u64,
    },
}

impl PolicyKind {
    /// The name `k3d bench --cache-policy` takes (`lfu-aging` is the default period).
    pub fn name(self) -> &'static str {
        match self {
            Self::Lru => "lru",
            Self::LfuAging { .. } => "lfu-aging",
        }
    }

    pub fn build(self, capacity: usize) -> Box<dyn EvictionPolicy> {
        match self {
            Self::Lru => Box::new(Lru::new(capacity)),
            Self::LfuAging { period } => {
                let period = if period == 0 {
                    8 * capacity as u64
                } else {
                    period
                };
                Box::new(LfuAging::new(capacity, period.max(1)))
            }
        }
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = CacheError;
    fn from_str(s: &str) -> Result<Self, CacheError> {
        [Self::Lru, Self::LfuAging { period: 0 }]
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| CacheError::UnknownPolicy(s.into()))
    }
}

/// Least recently used.
pub struct Lru {
    clock: u64,
    stamp: Vec<u64>,
    order: BTreeSet<(u64, usize)>,
}

impl Lru {
    pub fn new(capacity: usize) -> Self {
        Self {
            clock: 0,
            stamp: vec![0; capacity],
            order: BTreeSet::new(),
        }
    }
}

impl EvictionPolicy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }
    fn insert(&mut self, slot: usize) {
        self.touch(slot);
    }
    fn touch(&mut self, slot: usize) {
        let Some(s) = self.stamp.get_mut(slot) else {
            return;
        };
        self.order.remove(&(*s, slot));
        self.clock += 1;
        *s = self.clock;
        self.order.insert((self.clock, slot));
    }
    fn remove(&mut self, slot: usize) {
        if let Some(&s) = self.stamp.get(slot) {
            self.order.remove(&(s, slot));
        }
    }
    fn victim(&self, evictable: &dyn Fn(usize) -> bool) -> Option<usize> {
        self.order.iter().map(|&(_, s)| s).find(|&s| evictable(s))
    }
}

/// Least frequently used with aging: every `period` accesses all counts halve, so experts hot
/// in an earlier conversation fade. Ties go to the least recently used.
pub struct LfuAging {
    clock: u64,
    period: u64,
    /// (count, last use) per slot.
    meta: Vec<(u32, u64)>,
    resident: Vec<bool>,
    order: BTreeSet<(u32, u64, usize)>,
}

impl LfuAging {
    pub fn new(capacity: usize, period: u64) -> Self {
        Self {
            clock: 0,
            period,
            meta: vec![(0, 0); capacity],
            resident: vec![false; capacity],
            order: BTreeSet::new(),
        }
    }

    fn bump(&mut self, slot: usize, count: impl Fn(u32) -> u32) {
        let Some(&(c, t)) = self.meta.get(slot) else {
            return;
        };
        self.order.remove(&(c, t, slot));
        self.clock += 1;
        let m = (count(c), self.clock);
        self.meta[slot] = m;
        self.resident[slot] = true;
        self.order.insert((m.0, m.1, slot));
        if self.clock.is_multiple_of(self.period) {
            self.age();
        }
    }

    fn age(&mut self) {
        for m in &mut self.meta {
            m.0 /= 2;
        }
        self.order = (0..self.meta.len())
            .filter(|&s| self.resident[s])
            .map(|s| (self.meta[s].0, self.meta[s].1, s))
            .collect();
    }
}

impl EvictionPolicy for LfuAging {
    fn name(&self) -> &'static str {
        "lfu-aging"
    }
    fn insert(&mut self, slot: usize) {
        self.bump(slot, |_| 1);
    }
    fn touch(&mut self, slot: usize) {
        self.bump(slot, |c| c.saturating_add(1));
    }
    fn remove(&mut self, slot: usize) {
        if let Some(&(c, t)) = self.meta.get(slot) {
            self.order.remove(&(c, t, slot));
            self.resident[slot] = false;
        }
    }
    fn victim(&self, evictable: &dyn Fn(usize) -> bool) -> Option<usize> {
        self.order
            .iter()
            .map(|&(_, _, s)| s)
            .find(|&s| evictable(s))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotContent {
    Empty,
    Filling(ExpertId),
    Ready(ExpertId),
    /// Lent to a prefill pass's activations ([`ExpertCache::lend`]): no buffer, never used.
    Lent,
}

/// What [`Directory::lookup`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lookup {
    Hit(usize),
    /// Someone else is reading this expert into the slot.
    InFlight(usize),
    /// SlotBuffer reserved for reading this expert.
    Miss(usize),
    /// Every slot is in flight or in use.
    Full,
}

/// Which expert is where, the policy and the counters: the cache's bookkeeping without the
/// buffers, shared by [`ExpertCache`] and [`replay`].
struct Directory {
    entries: Vec<SlotContent>,
    map: HashMap<ExpertId, usize>,
    policy: Box<dyn EvictionPolicy>,
    counters: CacheCounters,
}

impl Directory {
    fn new(capacity: usize, policy: PolicyKind) -> Self {
        Self {
            entries: vec![SlotContent::Empty; capacity],
            map: HashMap::with_capacity(capacity),
            policy: policy.build(capacity),
            counters: CacheCounters::default(),
        }
    }

    /// Find or reserve the slot of `key`. `evictable(slot)` says whether a ready slot is free
    /// of users. Counts nothing: see [`Directory::count`].
    fn lookup(&mut self, key: ExpertId, evictable: &dyn Fn(usize) -> bool) -> Lookup {
        if let Some(&slot) = self.map.get(&key) {
            match self.entries.get(slot) {
                Some(SlotContent::Ready(_)) => {
                    self.policy.touch(slot);
                    return Lookup::Hit(slot);
                }
                Some(SlotContent::Filling(_)) => return Lookup::InFlight(slot),
                _ => {}
            }
        }
        let slot = match self.entries.iter().position(|e| *e == SlotContent::Empty) {
            Some(s) => s,
            None => match self.policy.victim(evictable) {
                Some(s) => s,
                None => return Lookup::Full,
            },
        };
        if let Some(SlotContent::Ready(old)) = self.entries.get(slot).copied() {
            self.map.remove(&old);
            self.policy.remove(slot);
            self.counters.evictions += 1;
        }
        self.entries[slot] = SlotContent::Filling(key);
        self.map.insert(key, slot);
        Lookup::Miss(slot)
    }

    /// Count a demand lookup of `bytes` bytes. A wait for someone else's read is counted when
    /// it is retried after the read lands.
    fn count(&mut self, outcome: Lookup, bytes: u64) {
        match outcome {
            Lookup::Hit(_) => {
                self.counters.requests += 1;
                self.counters.hits += 1;
                self.counters.bytes_avoided += bytes;
            }
            Lookup::Miss(_) => self.counters.requests += 1,
            Lookup::InFlight(_) | Lookup::Full => {}
        }
    }

    /// Takes `slot` (empty, or resident and evictable) out of use for a loan: a resident
    /// expert is evicted.
    fn withdraw(&mut self, slot: usize) {
        if let Some(SlotContent::Ready(old)) = self.entries.get(slot).copied() {
            self.map.remove(&old);
            self.policy.remove(slot);
            self.counters.evictions += 1;
        }
        self.entries[slot] = SlotContent::Lent;
    }

    /// The reservation of `slot` was given up before any read finished: empty it.
    fn abandon(&mut self, slot: usize, key: ExpertId) {
        self.entries[slot] = SlotContent::Empty;
        self.map.remove(&key);
    }

    /// The read into `slot` finished: publish it, or empty the slot.
    fn finish(&mut self, slot: usize, key: ExpertId, bytes: u64, ok: bool) {
        self.counters.reads += 1;
        if ok {
            self.counters.bytes_read += bytes;
            self.entries[slot] = SlotContent::Ready(key);
            self.policy.insert(slot);
        } else {
            self.counters.read_errors += 1;
            self.entries[slot] = SlotContent::Empty;
            self.map.remove(&key);
        }
    }
}

/// Counters after replaying `trace` (each request `expert_bytes` bytes) through a cache of
/// `capacity` slots with `policy`, every read succeeding and nothing held between requests.
pub fn replay(
    trace: &[ExpertId],
    expert_bytes: u64,
    capacity: usize,
    policy: PolicyKind,
) -> CacheCounters {
    let mut d = Directory::new(capacity, policy);
    for &key in trace {
        let outcome = d.lookup(key, &|_| true);
        d.count(outcome, expert_bytes);
        if let Lookup::Miss(slot) = outcome {
            d.finish(slot, key, expert_bytes, true);
        }
    }
    d.counters
}

/// [`replay`] through one cache per MoE layer instead of one shared cache (issue 17 item 3):
/// the `capacity` slots split evenly over the layers the trace names (the first layers take the
/// remainder), so one layer's experts never evict another's. A layer left without a slot reads
/// every request. The counters are the layers' sums.
pub fn replay_per_layer(
    trace: &[ExpertId],
    expert_bytes: u64,
    capacity: usize,
    policy: PolicyKind,
) -> CacheCounters {
    let layers: BTreeSet<u32> = trace.iter().map(|k| k.layer).collect();
    let share = |i: usize| capacity / layers.len() + usize::from(i < capacity % layers.len());
    let mut total = CacheCounters::default();
    for (i, &layer) in layers.iter().enumerate() {
        let own: Vec<ExpertId> = trace.iter().copied().filter(|k| k.layer == layer).collect();
        let c = match share(i) {
            0 => CacheCounters {
                requests: own.len() as u64,
                reads: own.len() as u64,
                bytes_read: own.len() as u64 * expert_bytes,
                ..CacheCounters::default()
            },
            slots => replay(&own, expert_bytes, slots, policy),
        };
        total.requests += c.requests;
        total.hits += c.hits;
        total.reads += c.reads;
        total.bytes_read += c.bytes_read;
        total.bytes_avoided += c.bytes_avoided;
        total.evictions += c.evictions;
        total.read_errors += c.read_errors;
    }
    total
}

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("expert cache needs at least one slot")]
    NoSlots,
    #[error("unknown cache policy {0:?} (lru, lfu-aging)")]
    UnknownPolicy(String),
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error(
        "no free expert slot for layer {layer} expert {expert}: all {capacity} slots are \
             being read or used (the plan's minimum is top-k + 1)"
    )]
    Full {
        layer: u32,
        expert: u32,
        capacity: usize,
    },
    #[error("reading layer {layer} expert {expert}: {error}")]
    Read {
        layer: u32,
        expert: u32,
        error: ReadError,
    },
}

enum SlotBuffer {
    /// A free buffer (`None` after a failed read lost it: reallocated on next use).
    Spare(Option<AlignedBuf>),
    /// The buffer is out with a reader.
    Lent,
    Loaded(Arc<LoadedRun>),
}

struct Inner {
    dir: Directory,
    slots: Vec<SlotBuffer>,
    /// Slots lent out now ([`ExpertCache::lend`]), at most `lendable`.
    lent: usize,
}

/// The expert cache; share it by reference between the threads of a forward pass.
pub struct ExpertCache {
    inner: Mutex<Inner>,
    landed: Condvar,
    slot_bytes: usize,
    /// Slots the cache may lend to prefill passes (the plan's `pass_cache_slots`): the
    /// capacity never falls below `capacity − lendable`.
    lendable: usize,
}

/// Result of [`ExpertCache::acquire`].
pub enum Acquired<'a> {
    /// Resident; the expert stays in its slot while this `Arc` lives.
    Ready(Arc<LoadedRun>),
    /// Not resident: read `run` into `buf` (without holding anything) and publish the outcome.
    Read {
        ticket: Ticket<'a>,
        run: ByteRun,
        buf: AlignedBuf,
    },
}

/// A reserved, in-flight slot. Publishing consumes it; dropping it unpublished empties the slot.
pub struct Ticket<'a> {
    cache: &'a ExpertCache,
    slot: usize,
    key: ExpertId,
    bytes: u64,
    done: bool,
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    // Critical sections only move values between fields; a panicking holder leaves them
    // consistent, so poisoning is not an error.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ExpertCache {
    /// `capacity` slots of `slot_bytes` each (`Window::capacity_for(expert bytes)`), all
    /// allocated now so the memory plan's number is the real one.
    pub fn new(capacity: usize, slot_bytes: usize, policy: PolicyKind) -> Result<Self, CacheError> {
        if capacity == 0 {
            return Err(CacheError::NoSlots);
        }
        let slots = (0..capacity)
            .map(|_| AlignedBuf::zeroed(slot_bytes).map(|b| SlotBuffer::Spare(Some(b))))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            inner: Mutex::new(Inner {
                dir: Directory::new(capacity, policy),
                slots,
                lent: 0,
            }),
            landed: Condvar::new(),
            slot_bytes,
            lendable: 0,
        })
    }

    /// The cache, of which up to `lendable` slots (fewer than its capacity) may be lent to
    /// prefill passes' activations ([`ExpertCache::lend`]).
    pub fn lending(self, lendable: usize) -> Self {
        let capacity = lock(&self.inner).slots.len();
        Self {
            lendable: lendable.min(capacity.saturating_sub(1)),
            ..self
        }
    }

    /// Frees up to `n` slots' buffers for a prefill pass's activations (issue 41.5) and
    /// returns how many: empty slots first, then resident experts no caller holds, least
    /// valuable first (counted as evictions). Slots being read or held are not taken, so a
    /// pass may get fewer than it asked for (it then holds fewer tokens), and never more than
    /// the cache's `lendable` are out at once.
    pub fn lend(&self, n: usize) -> usize {
        let mut inner = lock(&self.inner);
        let Inner { dir, slots, lent } = &mut *inner;
        let mut taken = 0;
        while taken < n && *lent < self.lendable {
            let evictable = |s: usize| matches!(slots.get(s), Some(SlotBuffer::Loaded(a)) if Arc::strong_count(a) == 1);
            let empty = dir.entries.iter().position(|e| *e == SlotContent::Empty);
            let Some(slot) = empty.or_else(|| dir.policy.victim(&evictable)) else {
                break;
            };
            dir.withdraw(slot);
            // Dropping the buffer gives its pages back (a mapping of its own: store::direct_buffer).
            slots[slot] = SlotBuffer::Spare(None);
            *lent += 1;
            taken += 1;
        }
        taken
    }

    /// Takes back `n` slots lent by [`ExpertCache::lend`] (at most those out); each gets a
    /// buffer again when it is next filled.
    pub fn give_back(&self, n: usize) {
        let mut inner = lock(&self.inner);
        let Inner { dir, lent, .. } = &mut *inner;
        let mut left = n.min(*lent);
        for e in dir.entries.iter_mut().filter(|e| **e == SlotContent::Lent) {
            if left == 0 {
                break;
            }
            *e = SlotContent::Empty;
            left -= 1;
            *lent -= 1;
        }
    }

    /// Slots usable now: the capacity less the slots lent out.
    pub fn usable_slots(&self) -> usize {
        let inner = lock(&self.inner);
        inner.slots.len() - inner.lent
    }

    pub fn counters(&self) -> CacheCounters {
        lock(&self.inner).dir.counters
    }

    pub fn policy_name(&self) -> &'static str {
        lock(&self.inner).dir.policy.name()
    }

    /// Bytes of slot buffers holding a published expert now.
    pub fn resident_bytes(&self) -> u64 {
        let inner = lock(&self.inner);
        let loaded = inner
            .slots
            .iter()
            .filter(|s| matches!(s, SlotBuffer::Loaded(_)))
            .count();
        loaded as u64 * self.slot_bytes as u64
    }

    /// The resident expert, or a reserved slot to read it into. Waits while another caller is
    /// reading the same expert.
    pub fn acquire(&self, key: ExpertId, run: ByteRun) -> Result<Acquired<'_>, CacheError> {
        let mut inner = lock(&self.inner);
        loop {
            match self.take(&mut inner, key, run, true)? {
                Some(acquired) => return Ok(acquired),
                None => inner = self.landed.wait(inner).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }

    /// [`ExpertCache::acquire`] for a read issued ahead of need, on a predicted routing: never
    /// waits (`None` when the expert is being read already or no slot is free) and counts no
    /// request, so a later demand for the expert is not mistaken for a hit (engine-lessons
    /// §4.2: the C engine's counter read 100 % hits at 0 % retention that way).
    pub fn acquire_ahead(
        &self,
        key: ExpertId,
        run: ByteRun,
    ) -> Result<Option<Acquired<'_>>, CacheError> {
        let mut inner = lock(&self.inner);
        match self.take(&mut inner, key, run, false) {
            Err(CacheError::Full { .. }) => Ok(None),
            other => other,
        }
    }

    /// One lookup under the lock: `Ok(None)` while another caller reads the same expert.
    fn take(
        &self,
        inner: &mut MutexGuard<'_, Inner>,
        key: ExpertId,
        run: ByteRun,
        demand: bool,
    ) -> Result<Option<Acquired<'_>>, CacheError> {
        let Inner { dir, slots, lent } = &mut **inner;
        let evictable = |s: usize| matches!(slots.get(s), Some(SlotBuffer::Loaded(a)) if Arc::strong_count(a) == 1);
        let outcome = dir.lookup(key, &evictable);
        if demand {
            dir.count(outcome, run.len);
        }
        match outcome {
            Lookup::Hit(slot) => {
                if let Some(SlotBuffer::Loaded(a)) = slots.get(slot) {
                    return Ok(Some(Acquired::Ready(Arc::clone(a))));
                }
            }
            Lookup::InFlight(_) => return Ok(None),
            Lookup::Full => {}
            Lookup::Miss(slot) => {
                let buf = match std::mem::replace(&mut slots[slot], SlotBuffer::Lent) {
                    SlotBuffer::Spare(Some(b)) => Ok(b),
                    SlotBuffer::Loaded(a) => Arc::try_unwrap(a)
                        .map(LoadedRun::into_buffer)
                        .or_else(|_| AlignedBuf::zeroed(self.slot_bytes)),
                    SlotBuffer::Spare(None) | SlotBuffer::Lent => {
                        AlignedBuf::zeroed(self.slot_bytes)
                    }
                };
                return match buf {
                    Ok(buf) => Ok(Some(Acquired::Read {
                        ticket: Ticket {
                            cache: self,
                            slot,
                            key,
                            bytes: run.len,
                            done: false,
                        },
                        run,
                        buf,
                    })),
                    Err(e) => {
                        // No ticket exists yet: undo the reservation here, under the lock.
                        slots[slot] = SlotBuffer::Spare(None);
                        dir.abandon(slot, key);
                        Err(e.into())
                    }
                };
            }
        }
        // Full, or a hit whose slot holds no data (which cannot happen).
        Err(CacheError::Full {
            layer: key.layer,
            expert: key.expert,
            capacity: slots.len() - *lent,
        })
    }

    fn finish(
        &self,
        slot: usize,
        key: ExpertId,
        bytes: u64,
        result: Result<LoadedRun, ReadFailure>,
    ) -> Result<Arc<LoadedRun>, CacheError> {
        let mut inner = lock(&self.inner);
        let out = match result {
            Ok(run) => {
                let a = Arc::new(run);
                inner.slots[slot] = SlotBuffer::Loaded(Arc::clone(&a));
                inner.dir.finish(slot, key, bytes, true);
                Ok(a)
            }
            Err(f) => {
                inner.slots[slot] = SlotBuffer::Spare(f.buf);
                inner.dir.finish(slot, key, bytes, false);
                Err(CacheError::Read {
                    layer: key.layer,
                    expert: key.expert,
                    error: f.error,
                })
            }
        };
        drop(inner);
        self.landed.notify_all();
        out
    }
}

impl ExpertCache {
    /// Empties a reserved slot whose read will not be published; `buf` is its buffer if the
    /// caller has it back (otherwise the slot gets a new one when next filled).
    fn abandon(&self, slot: usize, key: ExpertId, buf: Option<AlignedBuf>) {
        let mut inner = lock(&self.inner);
        inner.slots[slot] = SlotBuffer::Spare(buf);
        inner.dir.abandon(slot, key);
        drop(inner);
        self.landed.notify_all();
    }
}

impl Ticket<'_> {
    pub fn key(&self) -> ExpertId {
        self.key
    }

    /// Publish the read's outcome: success makes the expert resident and returns it; failure
    /// empties the slot and returns the error.
    pub fn publish(
        mut self,
        result: Result<LoadedRun, ReadFailure>,
    ) -> Result<Arc<LoadedRun>, CacheError> {
        self.done = true;
        self.cache.finish(self.slot, self.key, self.bytes, result)
    }

    /// Counts the demand request a read issued ahead ([`ExpertCache::acquire_ahead`]) turned out
    /// to serve: it is a miss like any other read the routing needed.
    pub fn count_demand(&self) {
        lock(&self.cache.inner).dir.counters.requests += 1;
    }

    /// Gives the reservation up without publishing anything (a read cancelled before it ran),
    /// returning its buffer to the slot. Counts no read and no error.
    pub fn release(mut self, buf: Option<AlignedBuf>) {
        self.done = true;
        self.cache.abandon(self.slot, self.key, buf);
    }
}

impl Drop for Ticket<'_> {
    /// An unpublished reservation (caller gave up, or allocation failed) frees its slot so
    /// waiters on the same expert retry instead of waiting forever.
    fn drop(&mut self) {
        if !self.done {
            self.cache.abandon(self.slot, self.key, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(s: &str) -> Vec<ExpertId> {
        s.bytes()
            .map(|c| ExpertId {
                layer: 1,
                expert: (c - b'A') as u32,
            })
            .collect()
    }

    #[test]
    fn lru_replay_counts() {
        // Capacity 3: A B A C D A B → misses A B C D(evicts B) B(evicts C); hits A A.
        let c = replay(&ids("ABACDAB"), 100, 3, PolicyKind::Lru);
        assert_eq!(
            c,
            CacheCounters {
                requests: 7,
                hits: 2,
                reads: 5,
                bytes_read: 500,
                bytes_avoided: 200,
                evictions: 2,
                read_errors: 0,
            }
        );
        assert!((c.retention() - 2.0 / 7.0).abs() < 1e-12);
    }

    #[test]
    fn a_per_layer_cache_keeps_a_quiet_layer_from_being_evicted_by_a_busy_one() {
        let at = |layer, expert| ExpertId { layer, expert };
        // Layer 0 reuses expert 1 every few requests; layer 1 streams new experts between.
        let mut trace = Vec::new();
        for round in 0..6u32 {
            trace.push(at(0, 1));
            trace.extend((0..3).map(|e| at(1, 10 + 3 * round + e)));
        }
        // Shared, 2 slots: layer 1's three misses per round push expert (0, 1) out every time.
        let shared = replay(&trace, 10, 2, PolicyKind::Lru);
        assert_eq!(shared.hits, 0);
        // One slot per layer: (0, 1) stays and hits in rounds 2-6.
        let split = replay_per_layer(&trace, 10, 2, PolicyKind::Lru);
        assert_eq!(
            (split.requests, split.hits, split.bytes_avoided),
            (24, 5, 50)
        );
        assert_eq!(split.bytes_read + split.bytes_avoided, 240);
        // One slot for two layers: the second layer gets none and reads every request.
        let starved = replay_per_layer(&trace, 10, 1, PolicyKind::Lru);
        assert_eq!((starved.requests, starved.hits, starved.reads), (24, 5, 19));
        assert_eq!(
            replay_per_layer(&[], 10, 4, PolicyKind::Lru),
            CacheCounters::default()
        );
    }

    #[test]
    fn lfu_keeps_the_frequent_expert_where_lru_drops_it() {
        // Capacity 2: AAABCDA. LRU evicts A at C and misses it again at the end;
        // LFU keeps A (count 3) and hits.
        let t = ids("AAABCDA");
        let lru = replay(&t, 10, 2, PolicyKind::Lru);
        let lfu = replay(&t, 10, 2, PolicyKind::LfuAging { period: 1000 });
        assert_eq!((lru.hits, lru.reads, lru.evictions), (2, 5, 3));
        assert_eq!((lfu.hits, lfu.reads, lfu.evictions), (3, 4, 2));
        assert_eq!(lfu.bytes_avoided, 30);
    }

    #[test]
    fn aging_lets_a_stale_favourite_go() {
        // A is hot early, then B and C alternate. With halving every 4 accesses A's count
        // decays and B/C share the cache; without aging A squats in one of two slots forever.
        let t = ids("AAAAAAAABCBCBCBCBCBC");
        let aged = replay(&t, 1, 2, PolicyKind::LfuAging { period: 4 });
        let sticky = replay(&t, 1, 2, PolicyKind::LfuAging { period: 1 << 40 });
        assert!(aged.hits > sticky.hits, "{aged:?} vs {sticky:?}");
    }

    #[test]
    fn replay_with_capacity_of_the_whole_trace_reads_each_once() {
        let t = ids("ABCDABCDABCD");
        for p in [PolicyKind::Lru, PolicyKind::LfuAging { period: 0 }] {
            let c = replay(&t, 7, 4, p);
            assert_eq!((c.reads, c.hits, c.evictions), (4, 8, 0));
            // A cyclic scan one larger than the cache never hits under LRU (§3.2).
        }
        assert_eq!(replay(&t, 7, 3, PolicyKind::Lru).hits, 0);
    }

    #[test]
    fn policies_parse_from_their_names_and_unknown_names_are_refused() {
        for p in [PolicyKind::Lru, PolicyKind::LfuAging { period: 0 }] {
            assert!(matches!(p.name().parse::<PolicyKind>(), Ok(q) if q == p));
        }
        assert!(matches!(
            "lfu".parse::<PolicyKind>(),
            Err(CacheError::UnknownPolicy(name)) if name == "lfu"
        ));
    }
}
