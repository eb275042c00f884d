//! `store::direct_io` against real files: aligned windows, end of file, typed errors, read mode.

mod store_util;

use k3_engine::checkpoint::layout::ByteRun;
use k3_engine::store::direct_buffer::AlignedBuf;
use k3_engine::store::direct_io::{DirectPolicy, MIN_CHUNK, ReadError, ReadMode, ShardSet, Window};
use store_util::{assert_bytes, pattern_file};

const LEN: u64 = 3 * (1 << 20) + 12_345; // not a multiple of 4096

fn run(offset: u64, len: u64) -> ByteRun {
    ByteRun {
        shard: 0,
        offset,
        len,
    }
}

fn buf_for(len: u64) -> AlignedBuf {
    AlignedBuf::zeroed(Window::capacity_for(len).unwrap() as usize).unwrap()
}

#[test]
fn unaligned_runs_read_exactly_with_o_direct() {
    let (_dir, path) = pattern_file("direct.bin", LEN);
    let set = ShardSet::open(&[path], DirectPolicy::Prefer).unwrap();
    // The scratch directory is on the build filesystem; it must take O_DIRECT here.
    assert!(set.read_mode().all_direct(), "{}", set.read_mode());
    assert_eq!(set.shard(0).unwrap().mode(), &ReadMode::Direct);
    for (off, len) in [
        (0, 4096),
        (1, 10),
        (4095, 2),
        (5000, 17_547),
        (8192, 1 << 20),
        (123_457, 2 << 20),
        // Ends exactly at end of file: the window reaches past it, the short read covers it.
        (LEN - 777, 777),
        (LEN - 3 * 4096 - 5, 3 * 4096 + 5),
    ] {
        let loaded = set
            .read_run(run(off, len), buf_for(len), MIN_CHUNK)
            .unwrap();
        assert_eq!(loaded.payload().len() as u64, len);
        assert_bytes(loaded.payload(), off);
    }
}

#[test]
fn long_run_in_several_requests() {
    let (_dir, path) = pattern_file("long.bin", 20 << 20);
    let set = ShardSet::open(&[path], DirectPolicy::Prefer).unwrap();
    let r = run(4097, (20 << 20) - 4097);
    let loaded = set.read_run(r, buf_for(r.len), MIN_CHUNK).unwrap();
    assert_bytes(loaded.payload(), r.offset);
}

#[test]
fn past_end_of_file_is_a_short_read_naming_file_and_offset() {
    let (_dir, path) = pattern_file("short.bin", LEN);
    let set = ShardSet::open(std::slice::from_ref(&path), DirectPolicy::Prefer).unwrap();
    let f = set
        .read_run(run(LEN - 100, 200), buf_for(200), MIN_CHUNK)
        .unwrap_err();
    match &f.error {
        ReadError::ShortRead {
            path: p,
            got,
            required,
            ..
        } => {
            assert_eq!(p, &path);
            assert!(got < required);
        }
        e => panic!("expected ShortRead, got {e}"),
    }
    let msg = f.error.to_string();
    assert!(msg.contains("short.bin") && msg.contains("offset"), "{msg}");
    assert!(f.buf.is_some(), "buffer returned for reuse");
}

#[test]
fn bad_inputs_are_typed_errors() {
    let (_dir, path) = pattern_file("errors.bin", 8192);
    let set = ShardSet::open(&[path], DirectPolicy::Prefer).unwrap();
    let e = set.read_run(
        ByteRun {
            shard: 5,
            offset: 0,
            len: 1,
        },
        buf_for(1),
        MIN_CHUNK,
    );
    assert!(matches!(
        e.unwrap_err().error,
        ReadError::NoSuchShard { shard: 5, count: 1 }
    ));
    let e = set.read_run(run(100, 8000), AlignedBuf::zeroed(4096).unwrap(), MIN_CHUNK);
    assert!(matches!(
        e.unwrap_err().error,
        ReadError::BufferTooSmall { needed: 8192, .. }
    ));
    let e = set.read_run(run(0, 10), buf_for(10), 4096);
    assert!(matches!(e.unwrap_err().error, ReadError::BadChunk { .. }));
    let missing = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-such-shard");
    let e = ShardSet::open(&[missing], DirectPolicy::Prefer).unwrap_err();
    assert!(
        matches!(e, ReadError::Open { errno, .. } if errno == libc::ENOENT),
        "{e}"
    );
}

#[test]
fn buffered_mode_is_reported_and_reads_the_same_bytes() {
    let (_dir, path) = pattern_file("buffered.bin", LEN);
    let set = ShardSet::open(&[path], DirectPolicy::Off).unwrap();
    assert!(!set.read_mode().all_direct());
    assert!(matches!(
        set.shard(0).unwrap().mode(),
        ReadMode::Buffered { .. }
    ));
    assert!(set.read_mode().to_string().contains("BUFFERED"));
    let loaded = set
        .read_run(run(5000, 17_547), buf_for(17_547), MIN_CHUNK)
        .unwrap();
    assert_bytes(loaded.payload(), 5000);
}
