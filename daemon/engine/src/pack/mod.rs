//! The trunk pack: an optional, losslessly compressed copy of a checkpoint's BF16 trunk
//! matrices, read instead of the shards to move fewer bytes per token (issue 31).
//!
//! At small budgets every token reads the whole unpinned trunk from the drive, so the drive is
//! the limit and only fewer bytes help. Trained BF16 weights are not incompressible: their
//! high bytes (sign and exponent) take few values. `k3d pack MODEL_DIR [OUT]` writes a pack
//! file ([`format`]) of every streamed trunk matrix and lm_head cut into blocks of whole rows,
//! each coded by [`block`]; the store reads a piece's blocks with the same direct I/O as the
//! shards and decodes them to the exact original bytes before the forward pass sees them.
//!
//! * [`block`] — one block: format, encoder, checked decoder (fuzzed), checksum.
//! * [`simd`] — the decoder's hot loops on the portable path and AVX-512 VBMI.
//! * [`format`] — the pack file: header, tensor index, block table; opening checks it against
//!   the checkpoint's fingerprint and layout.
//! * [`write`] — building a pack from a checkpoint, resumably, with progress.
//! * [`decode_check`] — checking a pack: every block decodes and equals the shard bytes.
//!
//! Without a pack, nothing changes: the store reads the released shards.

pub mod block;
pub mod decode_check;
pub mod format;
pub mod simd;
pub mod write;

pub use format::{PackError, PackFile, PackedTensor};
pub use simd::Path;
