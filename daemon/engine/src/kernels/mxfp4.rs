//! MXFP4 decoding (spec §3.5): E2M1 nibbles with one E8M0 scale byte per 32 inputs.
//!
//! Element `i` of a row lives in byte `i/2`: the **low** nibble holds the even element, the
//! high nibble the odd one. Bit 3 is the sign, bits 0–2 index [`E2M1_MAGNITUDE`].

/// Magnitudes of the E2M1 codes 0–7; codes 8–15 are their negatives (8 is −0).
pub const E2M1_MAGNITUDE: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Inputs covered by one scale byte.
pub const GROUP: usize = 32;

/// The scale byte that OCP MX defines as NaN; a checkpoint containing it is corrupt.
pub const SCALE_NAN: u8 = 255;

/// Value of a 4-bit code.
#[inline]
pub fn e2m1(code: u8) -> f32 {
    let m = E2M1_MAGNITUDE[(code & 7) as usize];
    if code & 8 != 0 { -m } else { m }
}

/// `2^(s − 127)` exactly, for every `s` in 0..=254 (s = 0 is the subnormal 2^−127).
#[inline]
pub fn scale(s: u8) -> f64 {
    // f64 has the range for every E8M0 value; powi of 2 is exact.
    2.0f64.powi(s as i32 - 127)
}

/// Value of logical element `i` of one row given that row's packed bytes and scale bytes.
#[inline]
pub fn element(packed_row: &[u8], scale_row: &[u8], i: usize) -> f64 {
    let byte = packed_row[i / 2];
    let code = if i.is_multiple_of(2) {
        byte & 0x0f
    } else {
        byte >> 4
    };
    e2m1(code) as f64 * scale(scale_row[i / GROUP])
}

/// Value of logical element `i` as the f32 that weight products multiply (spec §6.1 rule 2):
/// [`element`] rounded to f32 — exact for every scale byte up to 252 (the subnormal range of
/// f32 reaches 2^−149, below every E2M1 value times 2^−127); from 253 on the largest codes
/// exceed f32's range and become ±∞, as in the f32 references.
#[inline]
pub fn weight(packed_row: &[u8], scale_row: &[u8], i: usize) -> f32 {
    element(packed_row, scale_row, i) as f32
}

/// `E2M1(code) · 2^(s − 127)` as f32 for every scale byte `s` (row) and code 0–15 (column),
/// exactly [`weight`]'s value: a 16 KiB table from which the SIMD kernels read a group's
/// sixteen values (one AVX-512 register; the AVX2 kernels use the eight magnitudes and set the
/// sign from bit 3). Only the rows of the scale bytes a checkpoint uses are ever touched.
pub(crate) static SCALED_E2M1_F32: [[f32; 16]; 256] = {
    let mut t = [[0.0f32; 16]; 256];
    let mut s = 0;
    while s < 256 {
        // 2^(s − 127) built in the f64 exponent field: exact for every byte.
        let scale = f64::from_bits((s as u64 + (1023 - 127)) << 52);
        let mut c = 0;
        while c < 8 {
            let v = (E2M1_MAGNITUDE[c] as f64 * scale) as f32;
            t[s][c] = v;
            t[s][c + 8] = -v;
            c += 1;
        }
        s += 1;
    }
    t
};

/// Position of the first NaN scale byte (255) in `scales`, as (row, group), if any.
pub fn find_nan_scale(scales: &[u8], groups_per_row: usize) -> Option<(usize, usize)> {
    scales
        .iter()
        .position(|&s| s == SCALE_NAN)
        .map(|p| (p / groups_per_row, p % groups_per_row))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_nibble_is_the_even_element() {
        // byte 0x71: low nibble 1 (0.5), high nibble 7 (6.0); scale 127 → ×1.
        let packed = [0x71u8];
        let scales = [127u8];
        assert_eq!(element(&packed, &scales, 0), 0.5);
        assert_eq!(element(&packed, &scales, 1), 6.0);
    }

    #[test]
    fn sign_bit_and_negative_zero() {
        assert_eq!(e2m1(0x9), -0.5);
        assert_eq!(e2m1(0x8).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn the_f32_table_is_the_reference_weight_for_every_scale_and_code() {
        for s in 0..=255u8 {
            for code in 0..16u8 {
                // Element 0 of a one-byte row is its low nibble.
                let want = weight(&[code], &[s], 0);
                assert_eq!(
                    SCALED_E2M1_F32[s as usize][code as usize].to_bits(),
                    want.to_bits(),
                    "s = {s}, code = {code}"
                );
            }
        }
        // Exact up to 252, and the subnormal end is not flushed.
        assert_eq!(weight(&[1], &[0], 0).to_bits(), 0x0020_0000);
        assert_eq!(weight(&[7], &[252], 0) as f64, 6.0 * 2.0f64.powi(125));
        assert!(weight(&[7], &[253], 0).is_infinite());
    }

    #[test]
    fn scale_zero_is_subnormal_not_zero() {
        assert_eq!(scale(0) as f32, f32::from_bits(0x0040_0000));
        assert_eq!(scale(127), 1.0);
        assert_eq!(scale(254), 2.0f64.powi(127));
    }
}
