//! The codec's two hot loops — expanding dictionary codes to BF16 bytes and the block
//! checksum — on the portable path and on AVX-512 VBMI, chosen at run time. Both paths give the
//! same bytes (tests in `block.rs` and `tests/pack_codec.rs` compare them on every input).
//!
//! The VBMI expansion of 64 values: one byte shuffle spreads the `8w` code bytes so that
//! each 64-bit lane holds the `w` bytes of its eight codes, one multishift cuts the eight `w`-bit
//! fields into bytes, one shuffle looks them up in the 64-byte table (the dictionary repeated,
//! so bits above `w` need no masking), and two two-source shuffles interleave them with the low
//! bytes into 128 output bytes.

use super::block::{Fletcher, expand_portable};

/// A decode path the running CPU supports (the only constructors check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Portable,
    /// AVX-512 F + BW + VBMI.
    Avx512Vbmi,
}

impl Path {
    /// The fastest path this CPU has.
    pub fn detect() -> Path {
        if Self::vbmi() {
            Path::Avx512Vbmi
        } else {
            Path::Portable
        }
    }

    /// Every path this CPU has, portable first.
    pub fn all_supported() -> Vec<Path> {
        let mut v = vec![Path::Portable];
        if Self::vbmi() {
            v.push(Path::Avx512Vbmi);
        }
        v
    }

    #[cfg(target_arch = "x86_64")]
    fn vbmi() -> bool {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vbmi")
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn vbmi() -> bool {
        false
    }

    pub fn name(self) -> &'static str {
        match self {
            Path::Portable => "portable",
            Path::Avx512Vbmi => "avx512vbmi",
        }
    }
}

/// `out[2i] = low[i]`, `out[2i+1] = table[code i]` for every value (`out.len() == 2·low.len()`).
pub(super) fn expand(
    path: Path,
    codes: &[u8],
    width: u32,
    table: &[u8; 64],
    low: &[u8],
    out: &mut [u8],
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        Path::Avx512Vbmi => {
            // SAFETY: a `Path::Avx512Vbmi` is only constructed by `Path::detect` /
            // `all_supported` after detecting AVX-512 F, BW and VBMI.
            let done = unsafe { x86::expand(codes, width, table, low, out) };
            let bytes = done * width as usize / 8;
            expand_portable(
                &codes[bytes..],
                width,
                table,
                &low[done..],
                &mut out[2 * done..],
            );
        }
        _ => expand_portable(codes, width, table, low, out),
    }
}

/// Adds whole 64-byte groups to `state` on `path`; false if `path` has no vector loop (the
/// caller then runs the portable one).
pub(super) fn fletcher_groups(path: Path, state: &mut Fletcher, bytes: &[u8]) -> bool {
    match path {
        #[cfg(target_arch = "x86_64")]
        Path::Avx512Vbmi => {
            // SAFETY: as in `expand`.
            unsafe { x86::fletcher(state, bytes) };
            true
        }
        _ => false,
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Fletcher;

    /// Expands the first `64·⌊n/64⌋` values; returns how many. `codes` holds at least
    /// `ceil(n·w/8)` bytes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    pub(super) fn expand(
        codes: &[u8],
        width: u32,
        table: &[u8; 64],
        low: &[u8],
        out: &mut [u8],
    ) -> usize {
        let w = width as usize;
        let groups = low.len() / 64;
        assert!(
            (1..=6).contains(&w) && codes.len() >= groups * 8 * w && out.len() >= 128 * groups,
            "expand bounds"
        );
        let mut spread = [0u8; 64];
        let mut shifts = [0u8; 64];
        for j in 0..8 {
            for b in 0..8 {
                // Lane j holds bytes w·j … w·j + 7 (codes 8j … 8j + 7 start in its first w);
                // code 8j + b starts at bit b·w of the lane.
                spread[8 * j + b] = (w * j + b) as u8;
                shifts[8 * j + b] = (b * w) as u8;
            }
        }
        let mut weave_lo = [0u8; 64];
        let mut weave_hi = [0u8; 64];
        for k in 0..32 {
            weave_lo[2 * k] = k as u8;
            weave_lo[2 * k + 1] = 64 + k as u8;
            weave_hi[2 * k] = 32 + k as u8;
            weave_hi[2 * k + 1] = 96 + k as u8;
        }
        // SAFETY: each array is exactly 64 bytes; unaligned loads.
        let (spread, shifts, weave_lo, weave_hi, table) = unsafe {
            (
                _mm512_loadu_si512(spread.as_ptr().cast()),
                _mm512_loadu_si512(shifts.as_ptr().cast()),
                _mm512_loadu_si512(weave_lo.as_ptr().cast()),
                _mm512_loadu_si512(weave_hi.as_ptr().cast()),
                _mm512_loadu_si512(table.as_ptr().cast()),
            )
        };
        // The 8w code bytes of a group: a masked load never touches the bytes masked off.
        let load_mask: __mmask64 = (1u64 << (8 * w)) - 1;
        for g in 0..groups {
            // SAFETY: bytes 8w·g … 8w·g + 8w − 1 lie in `codes` (asserted), and only those are
            // loaded; the 64 low bytes at 64g and the 128 output bytes at 128g lie in `low` and
            // `out` (g < groups = low.len() / 64, out.len() ≥ 128·groups).
            unsafe {
                let packed =
                    _mm512_maskz_loadu_epi8(load_mask, codes.as_ptr().add(8 * w * g).cast());
                let lanes = _mm512_permutexvar_epi8(spread, packed);
                let fields = _mm512_multishift_epi64_epi8(shifts, lanes);
                let high = _mm512_permutexvar_epi8(fields, table);
                let lo = _mm512_loadu_si512(low.as_ptr().add(64 * g).cast());
                let dst = out.as_mut_ptr().add(128 * g);
                _mm512_storeu_si512(dst.cast(), _mm512_permutex2var_epi8(lo, weave_lo, high));
                _mm512_storeu_si512(
                    dst.add(64).cast(),
                    _mm512_permutex2var_epi8(lo, weave_hi, high),
                );
            }
        }
        64 * groups
    }

    /// The Fletcher sums of whole 64-byte groups, lane k = word k of each group.
    #[target_feature(enable = "avx512f")]
    pub(super) fn fletcher(state: &mut Fletcher, bytes: &[u8]) {
        // SAFETY: both arrays are exactly 8 u64.
        let (mut a, mut b) = unsafe {
            (
                _mm512_loadu_si512(state.a.as_ptr().cast()),
                _mm512_loadu_si512(state.b.as_ptr().cast()),
            )
        };
        for group in bytes.chunks_exact(64) {
            // SAFETY: `group` is 64 bytes; unaligned load.
            let w = unsafe { _mm512_loadu_si512(group.as_ptr().cast()) };
            a = _mm512_add_epi64(a, w);
            b = _mm512_add_epi64(b, a);
        }
        // SAFETY: as above.
        unsafe {
            _mm512_storeu_si512(state.a.as_mut_ptr().cast(), a);
            _mm512_storeu_si512(state.b.as_mut_ptr().cast(), b);
        }
    }
}
