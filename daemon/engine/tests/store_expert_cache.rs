//! `store::expert_cache` with real reads through the reader pool: payloads, counters equal to
//! the trace replay's, failed reads never published, held experts never evicted.

mod store_util;

use std::sync::Arc;

use k3_engine::checkpoint::layout::ByteRun;
use k3_engine::store::direct_io::{DirectPolicy, MIN_CHUNK, ShardSet, Window};
use k3_engine::store::expert_cache::{
    Acquired, CacheCounters, CacheError, ExpertCache, ExpertId, PolicyKind, replay,
};
use k3_engine::store::reader::{ReaderConfig, ReaderPool};
use store_util::{assert_bytes, pattern_file};

/// A small "expert": not a multiple of 4096, stored at unaligned offsets like the real ones.
const EXPERT: u64 = 50_000;
const SHIFT: u64 = 1_234;
const EXPERTS: u64 = 12;

/// Expert `expert` of layer `layer`.
fn expert(layer: u32, expert: u32) -> ExpertId {
    ExpertId { layer, expert }
}

fn run_of(e: u32) -> ByteRun {
    ByteRun {
        shard: 0,
        offset: SHIFT + e as u64 * EXPERT,
        len: EXPERT,
    }
}

fn setup(name: &str) -> ReaderPool {
    let (_dir, path) = pattern_file(name, SHIFT + EXPERTS * EXPERT);
    // The open file stays readable after its directory is removed at return.
    let set = Arc::new(ShardSet::open(&[path], DirectPolicy::Prefer).unwrap());
    let config = ReaderConfig {
        queue_depth: 2,
        chunk: MIN_CHUNK,
    };
    ReaderPool::new(set, config).unwrap()
}

fn cache(slots: usize, policy: PolicyKind) -> ExpertCache {
    let slot = Window::capacity_for(EXPERT).unwrap() as usize;
    ExpertCache::new(slots, slot, policy).unwrap()
}

/// Acquire `id`, reading it through `pool` on a miss; check its bytes.
fn fetch(c: &ExpertCache, pool: &ReaderPool, id: ExpertId) -> Result<(), CacheError> {
    let run = run_of(id.expert);
    let data = match c.acquire(id, run)? {
        Acquired::Ready(d) => d,
        Acquired::Read { ticket, run, buf } => ticket.publish(pool.read(run, buf))?,
    };
    assert_bytes(data.payload(), run.offset);
    Ok(())
}

fn trace() -> Vec<ExpertId> {
    // Three "tokens" over two layers, top-2, with some reuse.
    [
        (1, 3),
        (1, 7),
        (2, 3),
        (2, 11),
        (1, 3),
        (1, 5),
        (2, 11),
        (2, 0),
        (1, 7),
        (1, 3),
    ]
    .into_iter()
    .map(|(layer, e)| expert(layer, e))
    .collect()
}

#[test]
fn real_cache_counts_what_the_replay_predicts() {
    let pool = setup("cache-trace.bin");
    for policy in [PolicyKind::Lru, PolicyKind::LfuAging { period: 0 }] {
        for slots in [3, 4, 10] {
            let c = cache(slots, policy);
            for &id in &trace() {
                fetch(&c, &pool, id).unwrap();
            }
            let got = c.counters();
            assert_eq!(
                got,
                replay(&trace(), EXPERT, slots, policy),
                "{policy:?} {slots}"
            );
            assert_eq!(got.bytes_read + got.bytes_avoided, 10 * EXPERT);
        }
    }
    // With room for all six distinct experts, exactly those are read.
    let c = cache(10, PolicyKind::Lru);
    for &id in &trace() {
        fetch(&c, &pool, id).unwrap();
    }
    assert_eq!(
        c.counters(),
        CacheCounters {
            requests: 10,
            hits: 4,
            reads: 6,
            bytes_read: 6 * EXPERT,
            bytes_avoided: 4 * EXPERT,
            evictions: 0,
            read_errors: 0,
        }
    );
}

#[test]
fn a_failed_read_is_not_published() {
    let pool = setup("cache-fail.bin");
    let c = cache(3, PolicyKind::Lru);
    let id = expert(1, 99);
    // Expert 99 lies beyond end of file.
    let Acquired::Read { ticket, run, buf } = c.acquire(id, run_of(99)).unwrap() else {
        panic!("an empty cache cannot hit");
    };
    let e = ticket.publish(pool.read(run, buf)).unwrap_err();
    assert!(matches!(e, CacheError::Read { expert: 99, .. }), "{e}");
    // The next request reads again instead of being served the failed bytes.
    assert!(matches!(
        c.acquire(id, run_of(99)).unwrap(),
        Acquired::Read { .. }
    ));
    let k = c.counters();
    // Two requests, one read (failed), the second reservation abandoned unread.
    assert_eq!(
        (k.requests, k.reads, k.read_errors, k.bytes_read, k.hits),
        (2, 1, 1, 0, 0)
    );
}

#[test]
fn held_experts_are_not_evicted_and_a_full_cache_is_an_error() {
    let pool = setup("cache-held.bin");
    let c = cache(2, PolicyKind::Lru);
    let mut held = Vec::new();
    for e in 0..2 {
        let id = expert(1, e);
        let Acquired::Read { ticket, run, buf } = c.acquire(id, run_of(e)).unwrap() else {
            panic!("miss expected");
        };
        held.push(ticket.publish(pool.read(run, buf)).unwrap());
    }
    let third = expert(1, 2);
    assert!(matches!(
        c.acquire(third, run_of(2)),
        Err(CacheError::Full { capacity: 2, .. })
    ));
    // Release expert 0: now it can be evicted, and expert 1 (still held) survives.
    held.remove(0);
    fetch(&c, &pool, third).unwrap();
    assert!(matches!(
        c.acquire(expert(1, 1), run_of(1)).unwrap(),
        Acquired::Ready(_)
    ));
    assert_bytes(held[0].payload(), run_of(1).offset);
}

#[test]
fn abandoned_ticket_frees_its_slot() {
    let c = cache(1, PolicyKind::Lru);
    let id = expert(1, 0);
    match c.acquire(id, run_of(0)).unwrap() {
        Acquired::Read { ticket, .. } => drop(ticket),
        Acquired::Ready(_) => panic!("miss expected"),
    }
    assert!(matches!(
        c.acquire(id, run_of(0)).unwrap(),
        Acquired::Read { .. }
    ));
}

#[test]
fn concurrent_requests_for_one_expert_read_it_once() {
    let pool = setup("cache-concurrent.bin");
    let c = cache(4, PolicyKind::Lru);
    let id = expert(3, 5);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| fetch(&c, &pool, id).unwrap());
        }
    });
    let k = c.counters();
    assert_eq!((k.requests, k.reads, k.hits), (4, 1, 3));
}

#[test]
fn reads_ahead_count_no_request_and_never_wait() {
    let pool = setup("cache-ahead.bin");
    let c = cache(3, PolicyKind::Lru);
    let id = |e| expert(1, e);
    // A guess reserves a slot without counting a request.
    let Some(Acquired::Read { ticket, run, buf }) = c.acquire_ahead(id(0), run_of(0)).unwrap()
    else {
        panic!("a guess for an absent expert reserves a slot");
    };
    assert_eq!(c.counters().requests, 0);
    // While it is in flight another guess for it does not wait (and reserves nothing).
    assert!(c.acquire_ahead(id(0), run_of(0)).unwrap().is_none());
    let data = ticket.publish(pool.read(run, buf)).unwrap();
    assert_bytes(data.payload(), run.offset);
    drop(data);
    assert_eq!(c.counters().reads, 1);
    // A guess for a resident expert hands it out without counting a hit.
    assert!(matches!(
        c.acquire_ahead(id(0), run_of(0)).unwrap(),
        Some(Acquired::Ready(_))
    ));
    assert_eq!((c.counters().requests, c.counters().hits), (0, 0));
    // No free slot: a guess is skipped, not an error.
    let mut held = Vec::new();
    for e in 1..3 {
        match c.acquire(id(e), run_of(e)).unwrap() {
            Acquired::Read { ticket, run, buf } => held.push(ticket.publish(pool.read(run, buf))),
            Acquired::Ready(_) => panic!("miss expected"),
        }
    }
    let resident = c.acquire(id(0), run_of(0)).unwrap();
    assert!(c.acquire_ahead(id(9), run_of(9)).unwrap().is_none());
    drop((held, resident));
}

#[test]
fn a_released_guess_frees_its_slot_and_counts_nothing() {
    let pool = setup("cache-release.bin");
    let c = cache(1, PolicyKind::Lru);
    let id = |e| expert(1, e);
    let Some(Acquired::Read { ticket, buf, .. }) = c.acquire_ahead(id(0), run_of(0)).unwrap()
    else {
        panic!("miss expected");
    };
    ticket.release(Some(buf));
    assert_eq!(c.counters(), CacheCounters::default());
    // The only slot is free again, for another expert.
    fetch(&c, &pool, id(5)).unwrap();
    assert_eq!(c.counters().reads, 1);
}
