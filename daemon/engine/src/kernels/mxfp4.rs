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
    fn scale_zero_is_subnormal_not_zero() {
        assert_eq!(scale(0) as f32, f32::from_bits(0x0040_0000));
        assert_eq!(scale(127), 1.0);
        assert_eq!(scale(254), 2.0f64.powi(127));
    }
}
