//! Refusals of the safetensors header reader (spec §3.2) and the index cross-check (§3.1).
//! Each test builds a tiny shard set by hand and asserts the specific error and that its
//! message names the file and, where there is one, the tensor.

mod checkpoint_support;

use checkpoint_support::*;
use k3_engine::checkpoint::safetensors::{Dtype, SafetensorsError, TensorIndex};

const A: &str = "a.weight";
const B: &str = "b.weight";

/// Two BF16 tensors [2, 2] (8 bytes each), back to back.
fn good_header() -> String {
    format!(
        "{{{},{}}}",
        entry(A, "BF16", &[2, 2], 0, 8),
        entry(B, "BF16", &[2, 2], 8, 16)
    )
}

fn index_one(header: &str, data_len: u64) -> (TempDir, Result<TensorIndex, SafetensorsError>) {
    let dir = temp_dir("st");
    write_raw(
        &dir.path().join("model-00001-of-000001.safetensors"),
        header,
        data_len,
    );
    let result = TensorIndex::open_dir(dir.path());
    (dir, result)
}

fn refused(header: &str, data_len: u64) -> SafetensorsError {
    let (_dir, result) = index_one(header, data_len);
    result.expect_err("the shard must be refused")
}

fn assert_names(e: &SafetensorsError, parts: &[&str]) {
    let message = e.to_string();
    for p in parts {
        assert!(
            message.contains(p),
            "message {message:?} does not name {p:?}"
        );
    }
}

const FILE: &str = "model-00001-of-000001.safetensors";

/// The fingerprint's per-shard part is the digest of the header exactly as stored (length
/// prefix and JSON), taken while indexing.
#[test]
fn header_digest_covers_the_stored_header_bytes() {
    use sha2::{Digest, Sha256};
    let (dir, index) = index_one(&good_header(), 16);
    let index = index.expect("well-formed");
    let shard = &index.shards()[0];
    let bytes = std::fs::read(dir.path().join(FILE)).expect("read shard");
    let stored: [u8; 32] = Sha256::digest(&bytes[..shard.data_start as usize]).into();
    assert_eq!(shard.header_sha256, stored);
    // One changed header byte (same length) changes the digest.
    let (_other_dir, changed) = index_one(&good_header().replace("a.weight", "c.weight"), 16);
    let changed = changed.expect("well-formed");
    assert_ne!(changed.shards()[0].header_sha256, shard.header_sha256);
}

#[test]
fn well_formed_shard_is_indexed_by_name() {
    let (_dir, index) = index_one(&good_header(), 16);
    let index = index.expect("well-formed");
    assert_eq!(index.len(), 2);
    let b = index.get(B).expect("b indexed");
    let data_start = 8 + good_header().len() as u64;
    assert_eq!(
        (b.dtype, b.shape, b.offset, b.len),
        (Dtype::Bf16, &[2u64, 2][..], data_start + 8, 8)
    );
    assert_eq!(index.shards()[0].data_start, data_start);
    assert!(index.get("c.weight").is_none());
}

#[test]
fn metadata_and_space_padding_are_accepted() {
    let header = format!(
        "{{\"__metadata__\":{{\"format\":\"pt\"}},{}}}        ",
        entry(A, "F32", &[3], 0, 12)
    );
    let (_dir, index) = index_one(&header, 12);
    assert_eq!(index.expect("valid").len(), 1);
}

#[test]
fn empty_tensors_tile_at_any_position() {
    let header = format!(
        "{{{},{},{}}}",
        entry(A, "U8", &[4], 0, 4),
        entry("empty", "F32", &[0, 5], 4, 4),
        entry(B, "U8", &[2], 4, 6)
    );
    let (_dir, index) = index_one(&header, 6);
    assert_eq!(index.expect("valid").len(), 3);
}

#[test]
fn file_shorter_than_eight_bytes() {
    let dir = temp_dir("short");
    std::fs::write(dir.path().join(FILE), [1u8, 2, 3]).unwrap();
    let e = TensorIndex::open_dir(dir.path()).unwrap_err();
    assert!(
        matches!(e, SafetensorsError::TooShort { size: 3, .. }),
        "{e}"
    );
    assert_names(&e, &[FILE]);
}

#[test]
fn truncated_shard() {
    // The data region is 4 bytes short of where the last tensor ends.
    let e = refused(&good_header(), 12);
    assert!(
        matches!(
            e,
            SafetensorsError::DataLenMismatch {
                data_end: 16,
                data_len: 12,
                ..
            }
        ),
        "{e}"
    );
    assert_names(&e, &[FILE]);
}

#[test]
fn trailing_bytes_after_the_last_tensor() {
    let e = refused(&good_header(), 20);
    assert!(
        matches!(
            e,
            SafetensorsError::DataLenMismatch {
                data_end: 16,
                data_len: 20,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn header_length_past_the_end_of_the_file() {
    let dir = temp_dir("lie");
    let header = good_header();
    let mut bytes = (1_000u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    write_file(&dir.path().join(FILE), &bytes, 16);
    let e = TensorIndex::open_dir(dir.path()).unwrap_err();
    assert!(
        matches!(
            e,
            SafetensorsError::HeaderPastEnd {
                header_len: 1000,
                ..
            }
        ),
        "{e}"
    );
    assert_names(&e, &[FILE]);
}

#[test]
fn header_length_that_cuts_the_json() {
    let dir = temp_dir("cut");
    let header = good_header();
    let mut bytes = (header.len() as u64 - 3).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    write_file(&dir.path().join(FILE), &bytes, 16);
    let e = TensorIndex::open_dir(dir.path()).unwrap_err();
    assert!(matches!(e, SafetensorsError::Json { .. }), "{e}");
    assert_names(&e, &[FILE]);
}

#[test]
fn header_length_over_the_limit() {
    let dir = temp_dir("huge");
    let mut bytes = (100_000_001u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    write_file(&dir.path().join(FILE), &bytes, 200_000_000);
    let e = TensorIndex::open_dir(dir.path()).unwrap_err();
    assert!(
        matches!(
            e,
            SafetensorsError::HeaderTooLong {
                header_len: 100_000_001,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn header_not_utf8() {
    let dir = temp_dir("utf8");
    let mut header = format!("{{{}}}", entry(A, "U8", &[1], 0, 1)).into_bytes();
    header[3] = 0xff; // inside the name
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    write_file(&dir.path().join(FILE), &bytes, 1);
    let e = TensorIndex::open_dir(dir.path()).unwrap_err();
    assert!(
        matches!(e, SafetensorsError::NotUtf8 { offset: 3, .. }),
        "{e}"
    );
    assert_names(&e, &[FILE]);
}

#[test]
fn header_not_starting_with_a_brace() {
    let e = refused(&format!(" {}", good_header()), 16);
    assert!(matches!(e, SafetensorsError::NotObject { .. }), "{e}");
    assert_names(&e, &[FILE]);
}

#[test]
fn header_not_json() {
    let e = refused("{\"a.weight\": nope}", 0);
    assert!(matches!(e, SafetensorsError::Json { .. }), "{e}");
    assert_names(&e, &[FILE]);
}

#[test]
fn overlapping_offsets() {
    let header = format!(
        "{{{},{},{}}}",
        entry(A, "U8", &[8], 0, 8),
        entry(B, "U8", &[8], 4, 12),
        entry("c", "U8", &[4], 12, 16)
    );
    let e = refused(&header, 16);
    match &e {
        SafetensorsError::Overlap {
            tensor,
            previous,
            begin: 4,
            previous_end: 8,
            ..
        } => {
            assert_eq!((tensor.as_str(), previous.as_str()), (B, A));
        }
        other => panic!("expected Overlap, got {other}"),
    }
    assert_names(&e, &[FILE, B]);
}

#[test]
fn gap_between_tensors() {
    let header = format!(
        "{{{},{}}}",
        entry(A, "U8", &[4], 0, 4),
        entry(B, "U8", &[4], 6, 10)
    );
    let e = refused(&header, 10);
    assert!(
        matches!(&e, SafetensorsError::Gap { tensor, begin: 6, expected: 4, .. } if tensor == B),
        "{e}"
    );
    assert_names(&e, &[FILE, B]);
}

#[test]
fn gap_before_the_first_tensor() {
    let header = format!("{{{}}}", entry(A, "U8", &[4], 2, 6));
    let e = refused(&header, 6);
    assert!(
        matches!(&e, SafetensorsError::Gap { tensor, begin: 2, expected: 0, .. } if tensor == A),
        "{e}"
    );
}

#[test]
fn unknown_dtype() {
    // F16 is a known dtype now (small vectors may be stored in it); F64 is not.
    let header = format!("{{{}}}", entry(A, "F64", &[2], 0, 16));
    let e = refused(&header, 16);
    assert!(
        matches!(&e, SafetensorsError::UnknownDtype { tensor, dtype, .. } if tensor == A && dtype == "F64"),
        "{e}"
    );
    assert_names(&e, &[FILE, A, "F64"]);
}

#[test]
fn negative_shape_entry() {
    let header = format!("{{{}}}", entry(A, "U8", &[-2], 0, 2));
    let e = refused(&header, 2);
    assert!(
        matches!(&e, SafetensorsError::BadShape { tensor, value, .. } if tensor == A && value == "-2"),
        "{e}"
    );
    assert_names(&e, &[FILE, A]);
}

#[test]
fn fractional_shape_entry() {
    let header = format!("{{\"{A}\":{{\"dtype\":\"U8\",\"shape\":[2.0],\"data_offsets\":[0,2]}}}}");
    let e = refused(&header, 2);
    assert!(
        matches!(&e, SafetensorsError::BadShape { tensor, .. } if tensor == A),
        "{e}"
    );
}

#[test]
fn negative_offset() {
    let header = format!("{{{}}}", entry(A, "U8", &[2], -2, 0));
    let e = refused(&header, 2);
    assert!(
        matches!(&e, SafetensorsError::BadOffset { tensor, .. } if tensor == A),
        "{e}"
    );
}

#[test]
fn offsets_in_reverse() {
    let header = format!("{{{}}}", entry(A, "U8", &[0], 4, 2));
    let e = refused(&header, 4);
    assert!(
        matches!(&e, SafetensorsError::ReversedOffsets { tensor, begin: 4, end: 2, .. } if tensor == A),
        "{e}"
    );
}

#[test]
fn shape_times_size_mismatch() {
    // BF16 [2, 3] is 12 bytes; the offsets claim 10.
    let header = format!("{{{}}}", entry(A, "BF16", &[2, 3], 0, 10));
    let e = refused(&header, 10);
    assert!(
        matches!(&e, SafetensorsError::SizeMismatch { tensor, expected: 12, actual: 10, .. } if tensor == A),
        "{e}"
    );
    assert_names(&e, &[FILE, A]);
}

#[test]
fn shape_size_overflow() {
    let big = i64::MAX;
    let header = format!("{{{}}}", entry(A, "F32", &[big, 4], 0, 8));
    let e = refused(&header, 8);
    assert!(
        matches!(&e, SafetensorsError::SizeOverflow { tensor, .. } if tensor == A),
        "{e}"
    );
}

#[test]
fn duplicate_name_within_a_file() {
    // Disjoint offsets that tile: only the duplicate name is wrong. A parser keeping the last
    // entry would see a gap at 0 instead; this reader must name the duplicate.
    let header = format!(
        "{{{},{}}}",
        entry(A, "U8", &[4], 0, 4),
        entry(A, "U8", &[4], 4, 8)
    );
    let e = refused(&header, 8);
    assert!(
        matches!(&e, SafetensorsError::DuplicateInFile { tensor, .. } if tensor == A),
        "{e}"
    );
    assert_names(&e, &[FILE, A]);
}

#[test]
fn duplicate_metadata_within_a_file() {
    let header = format!(
        "{{\"__metadata__\":{{}},\"__metadata__\":{{}},{}}}",
        entry(A, "U8", &[4], 0, 4)
    );
    let e = refused(&header, 4);
    assert!(
        matches!(&e, SafetensorsError::DuplicateInFile { tensor, .. } if tensor == "__metadata__"),
        "{e}"
    );
}

#[test]
fn duplicate_name_across_shards() {
    let dir = temp_dir("dup2");
    let one = format!("{{{}}}", entry(A, "U8", &[4], 0, 4));
    let two = format!(
        "{{{},{}}}",
        entry(B, "U8", &[4], 0, 4),
        entry(A, "U8", &[2], 4, 6)
    );
    write_raw(
        &dir.path().join("model-00001-of-000002.safetensors"),
        &one,
        4,
    );
    write_raw(
        &dir.path().join("model-00002-of-000002.safetensors"),
        &two,
        6,
    );
    let e = TensorIndex::open_dir(dir.path()).unwrap_err();
    match &e {
        SafetensorsError::DuplicateAcrossShards {
            tensor,
            first,
            second,
        } => {
            assert_eq!(tensor, A);
            assert_eq!(first, "model-00001-of-000002.safetensors");
            assert_eq!(second, "model-00002-of-000002.safetensors");
        }
        other => panic!("expected DuplicateAcrossShards, got {other}"),
    }
}

#[test]
fn metadata_must_map_strings_to_strings() {
    let header = format!(
        "{{\"__metadata__\":{{\"n\":1}},{}}}",
        entry(A, "U8", &[4], 0, 4)
    );
    let e = refused(&header, 4);
    assert!(matches!(e, SafetensorsError::Metadata { .. }), "{e}");
    assert_names(&e, &[FILE]);
}

#[test]
fn unknown_field_in_a_tensor_entry() {
    let header = format!(
        "{{\"{A}\":{{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4],\"stride\":[1]}}}}"
    );
    let e = refused(&header, 4);
    assert!(
        matches!(&e, SafetensorsError::Entry { tensor, .. } if tensor == A),
        "{e}"
    );
    assert_names(&e, &[FILE, A, "stride"]);
}

#[test]
fn no_shards_at_all() {
    let dir = temp_dir("none");
    let e = TensorIndex::open_dir(dir.path()).unwrap_err();
    assert!(matches!(e, SafetensorsError::NoShards { .. }), "{e}");
}

#[test]
fn shards_are_numbered_in_bytewise_name_order() {
    let dir = temp_dir("order");
    for (name, tensor) in [
        ("model-b.safetensors", B),
        ("model-A.safetensors", A),
        ("model-a.safetensors", "c"),
    ] {
        write_raw(
            &dir.path().join(name),
            &format!("{{{}}}", entry(tensor, "U8", &[1], 0, 1)),
            1,
        );
    }
    std::fs::write(dir.path().join("notes.txt"), "not a shard").unwrap();
    let index = TensorIndex::open_dir(dir.path()).unwrap();
    let names: Vec<String> = index.shards().iter().map(|s| s.name()).collect();
    assert_eq!(
        names,
        [
            "model-A.safetensors",
            "model-a.safetensors",
            "model-b.safetensors"
        ]
    );
    assert_eq!(index.get(A).unwrap().shard, 0);
    assert_eq!(index.get(B).unwrap().shard, 2);
}

/// Two shards, `a` in the first and `b` in the second, plus an index file with `weight_map`.
fn with_index(weight_map: &str) -> SafetensorsError {
    let dir = temp_dir("idx");
    write_raw(
        &dir.path().join("s1.safetensors"),
        &format!("{{{}}}", entry(A, "U8", &[1], 0, 1)),
        1,
    );
    write_raw(
        &dir.path().join("s2.safetensors"),
        &format!("{{{}}}", entry(B, "U8", &[1], 0, 1)),
        1,
    );
    let path = dir.path().join("model.safetensors.index.json");
    std::fs::write(
        &path,
        format!("{{\"metadata\":{{\"total_size\":2}},\"weight_map\":{weight_map}}}"),
    )
    .unwrap();
    let index = TensorIndex::open_dir(dir.path()).expect("shards are valid");
    index
        .check_index_file(&path)
        .expect_err("the index must be refused")
}

#[test]
fn index_file_that_agrees() {
    let dir = temp_dir("idx-ok");
    write_raw(
        &dir.path().join("s1.safetensors"),
        &format!("{{{}}}", entry(A, "U8", &[1], 0, 1)),
        1,
    );
    let path = dir.path().join("model.safetensors.index.json");
    std::fs::write(
        &path,
        format!("{{\"weight_map\":{{\"{A}\":\"s1.safetensors\"}}}}"),
    )
    .unwrap();
    let index = TensorIndex::open_dir(dir.path()).unwrap();
    index.check_index_file(&path).expect("agrees");
}

#[test]
fn index_file_maps_a_tensor_to_the_wrong_shard() {
    let e = with_index(&format!(
        "{{\"{A}\":\"s2.safetensors\",\"{B}\":\"s2.safetensors\"}}"
    ));
    assert!(
        matches!(&e, SafetensorsError::IndexWrongShard { tensor, listed, actual, .. }
        if tensor == A && listed == "s2.safetensors" && actual == "s1.safetensors"),
        "{e}"
    );
    assert_names(&e, &["model.safetensors.index.json", A]);
}

#[test]
fn index_file_lists_a_tensor_no_shard_has() {
    let e = with_index(&format!(
        "{{\"{A}\":\"s1.safetensors\",\"{B}\":\"s2.safetensors\",\"ghost\":\"s2.safetensors\"}}"
    ));
    assert!(
        matches!(&e, SafetensorsError::IndexExtraName { tensor, .. } if tensor == "ghost"),
        "{e}"
    );
}

#[test]
fn index_file_omits_a_tensor() {
    let e = with_index(&format!("{{\"{A}\":\"s1.safetensors\"}}"));
    assert!(
        matches!(&e, SafetensorsError::IndexMissingName { tensor, actual, more: 0, .. }
        if tensor == B && actual == "s2.safetensors"),
        "{e}"
    );
}

#[test]
fn index_file_lists_a_tensor_twice() {
    let e = with_index(&format!(
        "{{\"{A}\":\"s1.safetensors\",\"{B}\":\"s2.safetensors\",\"{A}\":\"s2.safetensors\"}}"
    ));
    assert!(
        matches!(&e, SafetensorsError::IndexDuplicate { tensor, .. } if tensor == A),
        "{e}"
    );
}

#[test]
fn index_file_without_weight_map() {
    let e = with_index("0}, \"x\": {");
    assert!(matches!(&e, SafetensorsError::IndexJson { .. }), "{e}");
}

#[test]
fn offsets_near_u64_max_do_not_wrap() {
    let end = u64::MAX - 2;
    let header =
        format!("{{\"{A}\":{{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[{end},{end}]}}}}");
    let e = refused(&header, 0);
    assert!(
        matches!(&e, SafetensorsError::SizeOverflow { tensor, .. } if tensor == A),
        "{e}"
    );
}
