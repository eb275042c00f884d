//! `store::reader`: batches complete every run exactly once, in any order, with the right bytes;
//! failures are reported, not served; idle threads sleep.

mod store_util;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k3_engine::checkpoint::layout::ByteRun;
use k3_engine::store::direct_buffer::AlignedBuf;
use k3_engine::store::direct_io::{DirectPolicy, MIN_CHUNK, ReadError, ShardSet, Window};
use k3_engine::store::reader::{ReaderConfig, ReaderPool};
use store_util::{assert_bytes, pattern_file};

fn pool(name: &str, len: u64, qd: usize) -> ReaderPool {
    let (_a_dir, a) = pattern_file(&format!("{name}-a.bin"), len);
    let (_b_dir, b) = pattern_file(&format!("{name}-b.bin"), len / 2);
    // Open files stay readable after their directories are removed at return.
    let set = Arc::new(ShardSet::open(&[a, b], DirectPolicy::Prefer).unwrap());
    ReaderPool::new(
        set,
        ReaderConfig {
            queue_depth: qd,
            chunk: MIN_CHUNK,
        },
    )
    .unwrap()
}

fn buf_for(len: u64) -> AlignedBuf {
    AlignedBuf::zeroed(Window::capacity_for(len).unwrap() as usize).unwrap()
}

/// `len` bytes of shard `shard` from `offset`, with a buffer that fits them.
fn run(shard: usize, offset: u64, len: u64) -> (ByteRun, AlignedBuf) {
    (ByteRun { shard, offset, len }, buf_for(len))
}

#[test]
fn batch_completes_every_run_once_with_the_right_bytes() {
    let len = 24 << 20;
    let p = pool("batch", len, 3);
    let runs = [
        (0, 20 << 20, 333),        // long: split into three requests
        (1, 1 << 20, 777),         // second shard
        (0, 17_547, 5_000_001),    // expert-like
        (0, 4096, 0),              // aligned
        (1, 100, (len / 2) - 100), // last bytes of the second shard
        (0, 1000, len + 4096),     // beyond end of file: fails
    ];
    let submitted: Vec<(ByteRun, AlignedBuf)> = runs
        .iter()
        .map(|&(shard, l, off)| run(shard, off, l))
        .collect();
    let mut batch = p.submit(submitted);
    assert_eq!(batch.len(), runs.len());
    let mut seen = BTreeSet::new();
    while let Some((id, result)) = batch.wait_any() {
        assert!(seen.insert(id), "id {id} completed twice");
        let (_, l, off) = runs[id];
        if id == 5 {
            let f = result.unwrap_err();
            assert!(
                matches!(f.error, ReadError::ShortRead { .. }),
                "{}",
                f.error
            );
            continue;
        }
        let loaded = result.unwrap_or_else(|f| panic!("run {id}: {}", f.error));
        assert_eq!(loaded.payload().len() as u64, l);
        // Both files hold the same pattern from their own offset 0.
        assert_bytes(loaded.payload(), off);
    }
    assert_eq!(seen.len(), runs.len());
    assert!(batch.wait_any().is_none());
    assert!(batch.wait(0).is_none(), "taken ids are not returned twice");
    let stats = p.stats();
    assert!(stats.bytes >= (20 << 20) + (1 << 20));
}

#[test]
fn wait_for_a_specific_run() {
    let p = pool("specific", 4 << 20, 2);
    let runs: Vec<_> = (0..6u64)
        .map(|i| run(0, i * 500_000 + 3, 400_000))
        .collect();
    let mut batch = p.submit(runs);
    let r4 = batch.wait(4).unwrap().unwrap();
    assert_bytes(r4.payload(), 4 * 500_000 + 3);
    assert!(batch.wait(99).is_none());
    assert_eq!(batch.outstanding(), 5);
    let rest: BTreeSet<usize> = std::iter::from_fn(|| batch.wait_any().map(|(i, _)| i)).collect();
    assert_eq!(rest, [0, 1, 2, 3, 5].into_iter().collect());
}

#[test]
fn submit_refuses_bad_runs_without_reading() {
    let p = pool("refuse", 1 << 20, 1);
    let mut batch = p.submit(vec![
        run(9, 0, 10),
        (
            ByteRun {
                shard: 0,
                offset: 1,
                len: 9000,
            },
            AlignedBuf::zeroed(4096).unwrap(),
        ),
    ]);
    let e0 = batch.wait(0).unwrap().unwrap_err();
    assert!(matches!(e0.error, ReadError::NoSuchShard { shard: 9, .. }));
    let e1 = batch.wait(1).unwrap().unwrap_err();
    assert!(matches!(e1.error, ReadError::BufferTooSmall { .. }));
    assert!(e1.buf.is_some());
}

#[test]
fn dropping_a_batch_and_the_pool_does_not_hang() {
    let p = pool("drop", 16 << 20, 2);
    let runs: Vec<_> = (0..8u64).map(|i| run(0, i << 20, 1 << 20)).collect();
    drop(p.submit(runs));
    let (r, buf) = run(0, 7, 70);
    let one = p.read(r, buf).unwrap();
    assert_bytes(one.payload(), 7);
    drop(p);
}

/// CPU time (utime + stime, clock ticks) of this process's threads named `k3d-reader-*`.
fn reader_cpu_ticks() -> u64 {
    let mut total = 0;
    for t in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = t.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.starts_with("k3d-reader-") {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        // Fields after the ")" of the command: state is field 3, utime 14, stime 15.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        total += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    }
    total
}

#[test]
fn idle_reader_threads_sleep() {
    let p = pool("idle", 1 << 20, 4);
    std::thread::sleep(Duration::from_millis(50));
    let before = reader_cpu_ticks();
    std::thread::sleep(Duration::from_millis(500));
    let used = reader_cpu_ticks() - before;
    // Spinning threads would burn ~200 ticks (4 threads × 0.5 s at 100 Hz).
    assert!(used <= 2, "idle reader threads used {used} ticks");
    drop(p);
}

#[test]
fn busy_time_covers_the_reads_and_not_the_idle_time_around_them() {
    let len = 24 << 20;
    let p = pool("busy", len, 4);
    assert_eq!(p.stats().busy_nanos, 0, "nothing read yet");
    let t = std::time::Instant::now();
    let (r, buf) = run(0, 0, 20 << 20);
    p.read(r, buf).unwrap();
    let busy = p.stats().busy_nanos;
    let wall = t.elapsed().as_nanos() as u64;
    assert!(busy > 0, "a read was in flight for some time");
    assert!(
        busy <= wall,
        "busy {busy} ns within the {wall} ns the read took"
    );
    // Idle: the busy time does not grow while nothing is in flight.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(p.stats().busy_nanos, busy, "idle time is not busy time");
}

#[test]
fn demand_reads_go_ahead_of_queued_prefetch() {
    use k3_engine::store::reader::Priority;
    let chunk = MIN_CHUNK as u64;
    let len = 24 * chunk;
    // One reader thread: requests are served strictly one at a time, in queue order.
    let p = pool("priority", len, 1);
    let mut prefetch = p.submit_as(vec![run(0, 0, 20 * chunk)], Priority::Prefetch);
    let mut demand = p.submit(vec![run(0, 22 * chunk, 4096)]);
    let got = demand.wait(0).expect("demand run").expect("demand read");
    assert_bytes(got.payload(), 22 * chunk);
    // FIFO would have served all 20 prefetch requests first; the worker may have been inside
    // one (and may have started the next) when the demand read arrived.
    let served = p.stats().requests;
    assert!(
        served <= 4,
        "{served} requests served by the time the demand read completed"
    );
    let ahead_run = prefetch
        .wait(0)
        .expect("prefetch run")
        .expect("prefetch read");
    assert_bytes(ahead_run.payload(), 0);
}

/// `n` runs of `chunk` bytes, one request each, at consecutive offsets of shard 0.
fn one_request_runs(n: u64, chunk: u64) -> Vec<(ByteRun, AlignedBuf)> {
    (0..n).map(|i| run(0, i * chunk, chunk)).collect()
}

#[test]
fn ranked_runs_start_in_the_order_given() {
    let chunk = MIN_CHUNK as u64;
    // One reader: completions come in queue order.
    let p = pool("ranked", 8 * chunk, 1);
    let mut runs = one_request_runs(8, chunk);
    runs.reverse(); // highest offset first: a sweep would start at offset 0
    let mut batch = p.submit_ranked(runs);
    let order: Vec<usize> = std::iter::from_fn(|| {
        batch.wait_any().map(|(id, r)| {
            assert_bytes(r.expect("read").payload(), (7 - id as u64) * chunk);
            id
        })
    })
    .collect();
    assert_eq!(order, (0..8).collect::<Vec<_>>());
}

#[test]
fn extended_batch_numbers_new_runs_after_the_old() {
    use k3_engine::store::reader::Priority;
    let chunk = MIN_CHUNK as u64;
    let p = pool("extend", 6 * chunk, 2);
    let mut runs = one_request_runs(6, chunk);
    let later = runs.split_off(4);
    let mut batch = p.submit(runs);
    p.extend(&mut batch, later, Priority::Demand);
    assert_eq!(batch.len(), 6);
    let mut seen = BTreeSet::new();
    while let Some((id, r)) = batch.wait_any() {
        assert_bytes(r.expect("read").payload(), id as u64 * chunk);
        assert!(seen.insert(id));
    }
    assert_eq!(seen.len(), 6);
}

#[test]
fn unqueued_runs_come_back_cancelled_with_their_buffer() {
    let chunk = MIN_CHUNK as u64;
    let n = 48;
    // One reader and 48 requests: most are still queued right after submitting.
    let p = pool("unqueue", n * chunk, 1);
    let mut batch = p.submit_ranked(one_request_runs(n, chunk));
    let withdrawn: Vec<bool> = (n / 2..n)
        .map(|id| p.unqueue(&batch, id as usize))
        .collect();
    assert!(
        withdrawn.iter().filter(|&&w| w).count() > 1,
        "requests still queued were withdrawn"
    );
    let mut completed = 0;
    while let Some((id, result)) = batch.wait_any() {
        completed += 1;
        let was_withdrawn = id as u64 >= n / 2 && withdrawn[id - n as usize / 2];
        match result {
            Ok(run) => {
                assert!(!was_withdrawn, "run {id} was withdrawn but read");
                assert_bytes(run.payload(), id as u64 * chunk);
            }
            Err(f) => {
                assert!(was_withdrawn, "run {id} failed: {}", f.error);
                assert!(
                    matches!(f.error, ReadError::Cancelled { .. }),
                    "{}",
                    f.error
                );
                assert!(f.buf.is_some(), "a withdrawn run hands its buffer back");
            }
        }
    }
    assert_eq!(completed, n, "every run completes once, withdrawn or not");
    assert!(
        p.stats().requests < n,
        "withdrawn requests were never executed"
    );
}
