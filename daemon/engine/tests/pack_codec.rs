//! The trunk pack (issue 31.1) on real files: packing `tiny` and `small` (written by the
//! synthesiser) covers every packable matrix, and every tensor decodes — on every decode path
//! the CPU has — to exactly the bytes its shard holds; a damaged block is refused naming the
//! file, tensor, block and byte offset; a pack of another checkpoint, a truncated pack and a
//! damaged header or index are refused when opened. (`bench`'s pack was checked the same way
//! by `k3d verify --trunk-pack`; `docs/memory-plan.md` has the run.)

mod synth_support;

use std::os::unix::fs::FileExt;
use std::path::Path;

use k3_engine::checkpoint::Checkpoint;
use k3_engine::checkpoint::verify::ByteProgress;
use k3_engine::pack::format::packable;
use k3_engine::pack::{self, PackError, PackFile};

fn packed(shape: &str, dir: &Path) -> (Checkpoint, std::path::PathBuf) {
    let model = dir.join(shape);
    synth_support::synth(shape, &model);
    let checkpoint = Checkpoint::open(&model).expect("synthesised checkpoint opens");
    let out = dir.join(format!("{shape}.k3pack"));
    pack::write::pack(&checkpoint, &out, 2, &ByteProgress::default()).expect("packs");
    (checkpoint, out)
}

fn shard_bytes(checkpoint: &Checkpoint, shard: usize, offset: u64, len: u64) -> Vec<u8> {
    let f = std::fs::File::open(&checkpoint.shards[shard].path).expect("shard opens");
    let mut out = vec![0u8; len as usize];
    f.read_exact_at(&mut out, offset).expect("shard reads");
    out
}

fn every_tensor_decodes_to_its_shard_bytes(shape: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (checkpoint, out) = packed(shape, dir.path());
    let file = PackFile::open(&out, &checkpoint).expect("pack opens");
    let wanted = packable(&checkpoint);
    assert!(!wanted.is_empty());
    assert_eq!(
        file.tensors.len(),
        wanted.len(),
        "{shape}: every packable matrix is packed"
    );
    let bytes = std::fs::read(&out).expect("pack reads");
    for m in &wanted {
        let len = (m.rows * m.cols * 2) as u64;
        let t = file
            .find(m.shard, m.offset, len)
            .expect("packed tensor found by its place");
        let original = shard_bytes(&checkpoint, m.shard, m.offset, len);
        let (at, n) = t.byte_range(0..t.blocks());
        for path in pack::Path::all_supported() {
            let mut decoded = vec![0u8; len as usize];
            file.decode(
                path,
                t,
                0..t.blocks(),
                &bytes[at as usize..(at + n) as usize],
                &mut decoded,
            )
            .unwrap_or_else(|e| panic!("{shape} {} on {path:?}: {e}", t.name));
            assert!(
                decoded == original,
                "{shape}: {} on {path:?} differs",
                t.name
            );
        }
    }
    // Smaller than the shards: the random synthetic weights are Gaussian, so their high bytes
    // take few values (docs/memory-plan.md: 72 % of the shards' bytes for `small`).
    assert!(
        file.packed_bytes() * 100 < file.original_bytes() * 76,
        "{shape}"
    );
    let summary = pack::decode_check::verify(
        &file,
        &checkpoint,
        pack::Path::detect(),
        &ByteProgress::default(),
    )
    .expect("verifies");
    assert_eq!(summary.tensors, wanted.len());
}

#[test]
fn tiny_decodes_to_the_shard_bytes() {
    every_tensor_decodes_to_its_shard_bytes("tiny");
}

#[test]
fn small_decodes_to_the_shard_bytes() {
    every_tensor_decodes_to_its_shard_bytes("small");
}

#[test]
fn a_damaged_block_is_refused_naming_file_tensor_block_and_offset() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (checkpoint, out) = packed("tiny", dir.path());
    let file = PackFile::open(&out, &checkpoint).expect("pack opens");
    let t = file
        .tensors
        .iter()
        .max_by_key(|t| t.blocks())
        .expect("a packed tensor");
    assert!(t.blocks() >= 2, "tiny has a tensor of several blocks");
    let b = t.blocks() - 1;
    let at = t.block_offsets[b] + (t.block_offsets[b + 1] - t.block_offsets[b]) / 2;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&out)
        .unwrap();
    let mut byte = [0u8];
    f.read_exact_at(&mut byte, at).unwrap();
    f.write_all_at(&[byte[0] ^ 0x04], at).unwrap();
    drop(f);
    // The index is intact, so the pack opens; reading the block refuses it.
    let file = PackFile::open(&out, &checkpoint).expect("opens: only a block is damaged");
    let e = pack::decode_check::verify(
        &file,
        &checkpoint,
        pack::Path::detect(),
        &ByteProgress::default(),
    )
    .expect_err("a damaged block is refused");
    let text = e.to_string();
    match &e {
        PackError::Block {
            tensor,
            block,
            offset,
            ..
        } => {
            assert_eq!(
                (tensor.as_str(), *block, *offset),
                (t.name.as_str(), b, t.block_offsets[b]),
                "{text}"
            );
        }
        other => panic!("expected a block error, got {other}"),
    }
    for needle in [
        out.display().to_string(),
        t.name.clone(),
        format!("block {b}"),
        format!("byte offset {}", t.block_offsets[b]),
        "checksum".to_string(),
    ] {
        assert!(text.contains(&needle), "{text:?} lacks {needle:?}");
    }
}

#[test]
fn a_pack_of_another_checkpoint_and_a_damaged_file_are_refused_on_open() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, out) = packed("tiny", dir.path());
    let other = dir.path().join("tiny-b");
    synth_support::synth("tiny-b", &other);
    let other = Checkpoint::open(&other).unwrap();
    match PackFile::open(&out, &other) {
        Err(e @ PackError::Fingerprint { .. }) => {
            assert!(e.to_string().contains("another checkpoint"), "{e}");
        }
        other => panic!("expected a fingerprint refusal, got {other:?}"),
    }
    let tiny = Checkpoint::open(&dir.path().join("tiny")).unwrap();
    let bytes = std::fs::read(&out).unwrap();
    let damaged = |name: &str, edit: &dyn Fn(&mut Vec<u8>)| {
        let mut b = bytes.clone();
        edit(&mut b);
        let p = dir.path().join(name);
        std::fs::write(&p, b).unwrap();
        PackFile::open(&p, &tiny).expect_err(name)
    };
    assert!(matches!(
        damaged("truncated", &|b| b.truncate(b.len() - 1)),
        PackError::Length { .. }
    ));
    assert!(matches!(
        damaged("header", &|b| b[100] ^= 1),
        PackError::HeaderDamaged { .. }
    ));
    assert!(matches!(
        damaged("index", &|b| *b.last_mut().unwrap() ^= 1),
        PackError::IndexDamaged { .. }
    ));
    assert!(matches!(
        damaged("magic", &|b| b[0] = b'X'),
        PackError::NotAPack { .. }
    ));
}
