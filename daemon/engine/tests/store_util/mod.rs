//! Shared by the `store_*` tests: scratch files of known bytes.

#![allow(dead_code)] // each test binary uses a subset

use std::path::PathBuf;

/// The byte at file position `p` of every test file.
pub fn byte_at(p: u64) -> u8 {
    (p.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 ^ (p >> 9) as u8
}

/// A file of `len` pattern bytes in a fresh directory of its own (removed when the returned
/// guard drops) under the cargo test scratch directory: a real filesystem that accepts
/// `O_DIRECT`; tmpfs would not prove the direct path everywhere.
pub fn pattern_file(name: &str, len: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("store-test-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("scratch dir");
    let path = dir.path().join(name);
    let data: Vec<u8> = (0..len).map(byte_at).collect();
    std::fs::write(&path, data).expect("write scratch file");
    (dir, path)
}

/// Assert `payload` holds the file bytes starting at `offset`.
pub fn assert_bytes(payload: &[u8], offset: u64) {
    for (i, &b) in payload.iter().enumerate() {
        assert_eq!(
            b,
            byte_at(offset + i as u64),
            "byte {i} of payload at {offset}"
        );
    }
}
