//! Dedicated reader threads: blocking `pread` on direct descriptors, fed from one queue
//! (engine-lessons §2.2: queue depth matters more than io_uring; not tokio, not the compute
//! pool).
//!
//! The caller submits a [`ReadBatch`] of runs (for example every routed expert of a layer), each
//! with the aligned buffer it should land in. Runs longer than one request are split into
//! 8–64 MiB requests that different threads fill in parallel; requests are queued sorted by
//! (shard, offset) so the drive sweeps forward (§2.3). The caller then takes completions as they
//! land ([`ReadBatch::wait_any`]: compute can start on whichever expert arrives first, §4.4) or waits
//! for a particular one ([`ReadBatch::wait`]). A run completes only when all its requests succeeded;
//! a failure hands back the error and the buffer, never the buffer as data (§8.2).
//!
//! The pool has `threads` workers, each with one `pread` in flight: the thread count is the
//! queue depth. Idle workers sleep on a condition variable (never spin, §8.3).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use super::direct_buffer::{AlignedBuf, BufPart, Lender};
use super::direct_io::{Chunk, LoadedRun, ReadError, ReadFailure, ShardSet, Window, check_chunk};
use crate::checkpoint::layout::ByteRun;

pub use crate::plan::buffers::{DEFAULT_CHUNK, DEFAULT_QUEUE_DEPTH};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReaderConfig {
    /// Reader threads, i.e. reads in flight.
    pub queue_depth: usize,
    /// Bytes per request when a run is split (a multiple of 4096 in 8–64 MiB).
    pub chunk: usize,
}

impl Default for ReaderConfig {
    fn default() -> Self {
        Self {
            queue_depth: DEFAULT_QUEUE_DEPTH,
            chunk: DEFAULT_CHUNK,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("a reader pool needs at least one thread")]
    NoThreads,
    #[error(transparent)]
    Chunk(#[from] ReadError),
    #[error("cannot start reader thread {index}: {error}")]
    Spawn { index: usize, error: std::io::Error },
}

/// Lock a mutex whose data stays consistent even if a holder panicked (every critical section
/// here only moves values between fields), so poisoning is not an error.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct ReadJob {
    batch: Arc<BatchState>,
    slot: usize,
    /// The run this request is part of.
    run: ByteRun,
    chunk: Chunk,
    part: BufPart,
}

struct Queue {
    /// Reads the compute thread is (or is about to be) waiting for.
    jobs: VecDeque<ReadJob>,
    /// Speculative reads ([`Priority::Prefetch`]): taken only when no demand read is queued.
    prefetch: VecDeque<ReadJob>,
    shutdown: bool,
}

/// Which queue a batch joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Needed now: routed experts right after routing, a trunk layer not prefetched in time.
    Demand,
    /// Read ahead of need (the next streamed trunk layer). Queued behind every demand read, so
    /// a layer's expert misses do not wait for a whole-layer prefetch to drain first.
    Prefetch,
}

struct PoolShared {
    shards: Arc<ShardSet>,
    queue: Mutex<Queue>,
    work: Condvar,
    requests: AtomicU64,
    bytes: AtomicU64,
    busy: Mutex<Busy>,
}

/// Wall time during which at least one read was executing: the device's busy time as the
/// engine sees it, the denominator of an achieved bandwidth that is not diluted by the time
/// compute left the drive idle (issue 4's bench targets).
#[derive(Default)]
struct Busy {
    running: usize,
    since: Option<Instant>,
    nanos: u64,
}

impl Busy {
    fn start(&mut self) {
        if self.running == 0 {
            self.since = Some(Instant::now());
        }
        self.running += 1;
    }

    fn stop(&mut self) {
        self.running = self.running.saturating_sub(1);
        if self.running == 0
            && let Some(t) = self.since.take()
        {
            self.nanos += t.elapsed().as_nanos() as u64;
        }
    }

    /// Closed intervals plus the one still open.
    fn total_nanos(&self) -> u64 {
        self.nanos + self.since.map_or(0, |t| t.elapsed().as_nanos() as u64)
    }
}

/// Totals since the pool started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReaderStats {
    /// Requests completed (successfully or not).
    pub requests: u64,
    /// Bytes that arrived from the files (whole aligned windows).
    pub bytes: u64,
    /// Nanoseconds during which at least one read was executing.
    pub busy_nanos: u64,
}

/// The reader threads.
pub struct ReaderPool {
    shared: Arc<PoolShared>,
    config: ReaderConfig,
    threads: Vec<JoinHandle<()>>,
}

impl ReaderPool {
    pub fn new(shards: Arc<ShardSet>, config: ReaderConfig) -> Result<Self, PoolError> {
        if config.queue_depth == 0 {
            return Err(PoolError::NoThreads);
        }
        check_chunk(config.chunk)?;
        let shared = Arc::new(PoolShared {
            shards,
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                prefetch: VecDeque::new(),
                shutdown: false,
            }),
            work: Condvar::new(),
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            busy: Mutex::new(Busy::default()),
        });
        let mut pool = Self {
            shared,
            config,
            threads: Vec::with_capacity(config.queue_depth),
        };
        for index in 0..config.queue_depth {
            let shared = Arc::clone(&pool.shared);
            let handle = std::thread::Builder::new()
                .name(format!("k3d-reader-{index}"))
                .spawn(move || worker(&shared))
                .map_err(|error| PoolError::Spawn { index, error })?;
            pool.threads.push(handle);
        }
        Ok(pool)
    }

    pub fn config(&self) -> ReaderConfig {
        self.config
    }

    pub fn shards(&self) -> &ShardSet {
        &self.shared.shards
    }

    pub fn stats(&self) -> ReaderStats {
        ReaderStats {
            requests: self.shared.requests.load(Ordering::Relaxed),
            bytes: self.shared.bytes.load(Ordering::Relaxed),
            busy_nanos: lock(&self.shared.busy).total_nanos(),
        }
    }

    /// Queue every run for reading into its buffer as a demand read; completion ids are indices
    /// into `runs`.
    pub fn submit(&self, runs: Vec<(ByteRun, AlignedBuf)>) -> ReadBatch {
        self.submit_as(runs, Priority::Demand)
    }

    /// [`ReaderPool::submit`] with an explicit [`Priority`].
    pub fn submit_as(&self, runs: Vec<(ByteRun, AlignedBuf)>, priority: Priority) -> ReadBatch {
        let mut batch = ReadBatch::with_capacity(runs.len());
        self.enqueue(&mut batch, runs, priority, true);
        batch
    }

    /// A demand batch whose runs start in the order given rather than sweeping the file
    /// forward: for guesses ranked by likelihood, so the least likely are the ones still queued
    /// (and cheap to [`ReaderPool::unqueue`]) when the guess is checked.
    pub fn submit_ranked(&self, runs: Vec<(ByteRun, AlignedBuf)>) -> ReadBatch {
        let mut batch = ReadBatch::with_capacity(runs.len());
        self.enqueue(&mut batch, runs, Priority::Demand, false);
        batch
    }

    /// Adds runs to a batch already in flight; their completion ids continue after the batch's
    /// current ones (the first new run gets id `batch.len()` as it was before the call). Lets a
    /// caller wait on reads issued early (a predicted routing) and on the ones issued once the
    /// need is known with one [`ReadBatch::wait_any`].
    pub fn extend(
        &self,
        batch: &mut ReadBatch,
        runs: Vec<(ByteRun, AlignedBuf)>,
        priority: Priority,
    ) {
        self.enqueue(batch, runs, priority, true);
    }

    /// Queues `runs` as requests of `batch`; `sweep` orders them by (shard, offset) so the
    /// drive reads forward (§2.3), otherwise they keep the order given.
    fn enqueue(
        &self,
        batch: &mut ReadBatch,
        runs: Vec<(ByteRun, AlignedBuf)>,
        priority: Priority,
        sweep: bool,
    ) {
        let state = &batch.state;
        batch.len += runs.len();
        let mut jobs = Vec::new();
        {
            let mut inner = lock(&state.inner);
            for (run, buf) in runs {
                let slot = inner.slots.len();
                let window = match self.shared.shards.window_for(run, &buf) {
                    Ok(w) => w,
                    Err(error) => {
                        inner.fail_now(slot, error, Some(buf));
                        continue;
                    }
                };
                let chunks = match window.chunks(self.config.chunk) {
                    Ok(c) => c,
                    Err(error) => {
                        inner.fail_now(slot, error, Some(buf));
                        continue;
                    }
                };
                let (lender, parts) = match buf.into_parts(window.len, self.config.chunk) {
                    Ok(lp) => lp,
                    // Unreachable after `window_for` and `chunks` accepted the sizes; report it
                    // as the buffer being too small rather than panic.
                    Err(buf) => {
                        let error = ReadError::BufferTooSmall {
                            shard: run.shard,
                            offset: run.offset,
                            len: run.len,
                            needed: window.len as u64,
                            capacity: buf.capacity(),
                        };
                        inner.fail_now(slot, error, Some(buf));
                        continue;
                    }
                };
                inner.slots.push(RunSlot::Pending {
                    run,
                    window,
                    lender,
                    remaining: parts.len(),
                    error: None,
                });
                for (chunk, part) in chunks.into_iter().zip(parts) {
                    jobs.push(ReadJob {
                        batch: Arc::clone(state),
                        slot,
                        run,
                        chunk,
                        part,
                    });
                }
            }
        }
        if sweep {
            jobs.sort_by_key(|j| (j.run.shard, j.chunk.file_offset));
        }
        let n = jobs.len();
        if n > 0 {
            let mut q = lock(&self.shared.queue);
            match priority {
                Priority::Demand => q.jobs.extend(jobs),
                Priority::Prefetch => q.prefetch.extend(jobs),
            }
            drop(q);
            // Wake only as many workers as there are new requests: on an oversubscribed CPU a
            // herd of woken threads delays the one that gets the work.
            if n >= self.config.queue_depth {
                self.shared.work.notify_all();
            } else {
                (0..n).for_each(|_| self.shared.work.notify_one());
            }
        }
    }

    /// Withdraws the requests of run `id` of `batch` that no reader has started. The run still
    /// completes through the batch: as `Err` [`ReadError::Cancelled`] with its buffer once any
    /// request already running has finished, or as `Ok` if every request had already landed
    /// (the bytes are then real data). Returns whether any request was withdrawn.
    pub fn unqueue(&self, batch: &ReadBatch, id: usize) -> bool {
        let mut withdrawn = Vec::new();
        {
            let mut q = lock(&self.shared.queue);
            let Queue { jobs, prefetch, .. } = &mut *q;
            for queue in [jobs, prefetch] {
                let mut kept = VecDeque::with_capacity(queue.len());
                for job in queue.drain(..) {
                    if job.slot == id && Arc::ptr_eq(&job.batch, &batch.state) {
                        withdrawn.push(job);
                    } else {
                        kept.push_back(job);
                    }
                }
                *queue = kept;
            }
        }
        let any = !withdrawn.is_empty();
        for job in withdrawn {
            let ReadJob {
                batch, slot, part, ..
            } = job;
            // The part must be gone before the last completion rejoins the buffer.
            drop(part);
            batch.complete(slot, Err(None));
        }
        any
    }

    /// Read one run and wait for it.
    pub fn read(&self, run: ByteRun, buf: AlignedBuf) -> Result<LoadedRun, ReadFailure> {
        let mut batch = self.submit(vec![(run, buf)]);
        match batch.wait(0) {
            Some(r) => r,
            // A one-run batch always has slot 0 untaken.
            None => Err(ReadFailure {
                error: ReadError::BufferLost {
                    shard: run.shard,
                    offset: run.offset,
                    len: run.len,
                },
                buf: None,
            }),
        }
    }
}

impl Drop for ReaderPool {
    fn drop(&mut self) {
        lock(&self.shared.queue).shutdown = true;
        self.shared.work.notify_all();
        for t in self.threads.drain(..) {
            // A worker that panicked has nothing left to clean up.
            let _ = t.join();
        }
    }
}

fn worker(shared: &PoolShared) {
    loop {
        let job = {
            let mut q = lock(&shared.queue);
            loop {
                if let Some(j) = q.jobs.pop_front().or_else(|| q.prefetch.pop_front()) {
                    break j;
                }
                if q.shutdown {
                    return;
                }
                q = shared.work.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let ReadJob {
            batch,
            slot,
            run,
            chunk,
            mut part,
        } = job;
        let result = if batch.cancelled.load(Ordering::Relaxed) {
            Err(None)
        } else {
            lock(&shared.busy).start();
            let r = shared
                .shards
                .read_chunk(run, &chunk, part.as_mut_slice())
                .map_err(Some);
            lock(&shared.busy).stop();
            r
        };
        shared.requests.fetch_add(1, Ordering::Relaxed);
        if result.is_ok() {
            shared.bytes.fetch_add(chunk.len as u64, Ordering::Relaxed);
        }
        // The part must be gone before the last completion rejoins the buffer.
        drop(part);
        batch.complete(slot, result);
    }
}

enum RunSlot {
    Pending {
        run: ByteRun,
        window: Window,
        lender: Lender,
        remaining: usize,
        /// First failure; `None` inside means cancelled.
        error: Option<Option<ReadError>>,
    },
    Done(Result<LoadedRun, ReadFailure>),
    Taken,
}

struct BatchInner {
    slots: Vec<RunSlot>,
    /// Completed slots not yet taken, in completion order.
    ready: VecDeque<usize>,
}

impl BatchInner {
    fn fail_now(&mut self, slot: usize, error: ReadError, buf: Option<AlignedBuf>) {
        self.slots
            .push(RunSlot::Done(Err(ReadFailure { error, buf })));
        self.ready.push_back(slot);
    }
}

struct BatchState {
    inner: Mutex<BatchInner>,
    landed: Condvar,
    cancelled: AtomicBool,
}

impl BatchState {
    /// Record one request's outcome (`Err(None)`: skipped because the batch was dropped).
    fn complete(&self, slot: usize, result: Result<(), Option<ReadError>>) {
        let mut inner = lock(&self.inner);
        let Some(s) = inner.slots.get_mut(slot) else {
            return;
        };
        let RunSlot::Pending {
            remaining, error, ..
        } = s
        else {
            return;
        };
        if let Err(e) = result {
            error.get_or_insert(e);
        }
        *remaining -= 1;
        if *remaining > 0 {
            return;
        }
        let RunSlot::Pending {
            run,
            window,
            lender,
            error,
            ..
        } = std::mem::replace(s, RunSlot::Taken)
        else {
            return;
        };
        let buf = lender.rejoin().ok();
        let lost = ReadError::BufferLost {
            shard: run.shard,
            offset: run.offset,
            len: run.len,
        };
        let cancelled = ReadError::Cancelled {
            shard: run.shard,
            offset: run.offset,
            len: run.len,
        };
        *s = RunSlot::Done(match (error, buf) {
            (None, Some(buf)) => Ok(LoadedRun::new(buf, &window)),
            (None, None) => Err(ReadFailure {
                error: lost,
                buf: None,
            }),
            (Some(e), buf) => Err(ReadFailure {
                error: e.unwrap_or(cancelled),
                buf,
            }),
        });
        inner.ready.push_back(slot);
        drop(inner);
        self.landed.notify_all();
    }
}

/// Runs in flight; take each completion once.
pub struct ReadBatch {
    state: Arc<BatchState>,
    len: usize,
    taken: usize,
}

impl ReadBatch {
    /// A batch with no runs yet, room for `capacity`.
    fn with_capacity(capacity: usize) -> Self {
        ReadBatch {
            state: Arc::new(BatchState {
                inner: Mutex::new(BatchInner {
                    slots: Vec::with_capacity(capacity),
                    ready: VecDeque::new(),
                }),
                landed: Condvar::new(),
                cancelled: AtomicBool::new(false),
            }),
            len: 0,
            taken: 0,
        }
    }

    /// Number of runs submitted.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Runs not yet taken.
    pub fn outstanding(&self) -> usize {
        self.len - self.taken
    }

    /// The next run to complete (in completion order) with its id, blocking until one does;
    /// `None` once every run has been taken.
    pub fn wait_any(&mut self) -> Option<(usize, Result<LoadedRun, ReadFailure>)> {
        if self.taken == self.len {
            return None;
        }
        let mut inner = lock(&self.state.inner);
        loop {
            while let Some(id) = inner.ready.pop_front() {
                if let Some(s) = inner.slots.get_mut(id)
                    && let RunSlot::Done(r) = std::mem::replace(s, RunSlot::Taken)
                {
                    self.taken += 1;
                    return Some((id, r));
                }
            }
            inner = self
                .state
                .landed
                .wait(inner)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Run `id`, blocking until it completes; `None` if `id` is out of range or already taken.
    pub fn wait(&mut self, id: usize) -> Option<Result<LoadedRun, ReadFailure>> {
        let mut inner = lock(&self.state.inner);
        loop {
            match inner.slots.get_mut(id)? {
                RunSlot::Taken => return None,
                RunSlot::Pending { .. } => {}
                s @ RunSlot::Done(_) => {
                    let RunSlot::Done(r) = std::mem::replace(s, RunSlot::Taken) else {
                        return None;
                    };
                    inner.ready.retain(|&r| r != id);
                    self.taken += 1;
                    return Some(r);
                }
            }
            inner = self
                .state
                .landed
                .wait(inner)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for ReadBatch {
    /// Requests still queued are skipped; reads already running finish into their buffers,
    /// which are freed with the batch state.
    fn drop(&mut self) {
        self.state.cancelled.store(true, Ordering::Relaxed);
    }
}
