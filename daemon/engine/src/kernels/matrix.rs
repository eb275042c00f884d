//! Weight matrices viewed in their stored bytes (spec §3.3, §3.5): the types every matmul path
//! takes, below the instruction-set code that reads them.
//!
//! Weights stay in their stored form — BF16 bytes (little-endian, unaligned is fine) or MXFP4
//! packed nibbles + scale bytes — and are decoded on the fly, never widened into a copy.

use super::mxfp4;

/// A row-major BF16 matrix `[rows, cols]` viewed in its stored bytes.
#[derive(Clone, Copy, Debug)]
pub struct Bf16Matrix<'a> {
    pub bytes: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

impl<'a> Bf16Matrix<'a> {
    pub fn new(bytes: &'a [u8], rows: usize, cols: usize) -> Self {
        assert_eq!(bytes.len(), rows * cols * 2, "bf16 matrix byte length");
        Bf16Matrix { bytes, rows, cols }
    }

    /// Element (r, i) widened exactly to f32.
    #[inline]
    pub fn get(&self, r: usize, i: usize) -> f32 {
        let p = 2 * (r * self.cols + i);
        bf16_to_f32(self.bytes[p], self.bytes[p + 1])
    }
}

/// Widens one little-endian BF16 value exactly.
#[inline]
pub fn bf16_to_f32(lo: u8, hi: u8) -> f32 {
    f32::from_bits((u16::from_le_bytes([lo, hi]) as u32) << 16)
}

/// Widens a BF16 byte vector to f32 (small vectors only: gains, pseudo-queries).
pub fn bf16_vector(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|b| bf16_to_f32(b[0], b[1]))
        .collect()
}

/// Reads an F32 little-endian byte vector.
pub fn f32_vector(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// A row-major MXFP4 matrix `[rows, cols]`: `packed` is `[rows, cols/2]`, `scales` `[rows, cols/32]`.
#[derive(Clone, Copy, Debug)]
pub struct Mxfp4Matrix<'a> {
    pub packed: &'a [u8],
    pub scales: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

impl<'a> Mxfp4Matrix<'a> {
    pub fn new(packed: &'a [u8], scales: &'a [u8], rows: usize, cols: usize) -> Self {
        assert_eq!(
            cols % mxfp4::GROUP,
            0,
            "MXFP4 input width must be a multiple of 32"
        );
        assert_eq!(packed.len(), rows * cols / 2, "MXFP4 packed byte length");
        assert_eq!(
            scales.len(),
            rows * cols / mxfp4::GROUP,
            "MXFP4 scale byte length"
        );
        Mxfp4Matrix {
            packed,
            scales,
            rows,
            cols,
        }
    }
}
