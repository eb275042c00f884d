//! One block of the trunk codec: whole rows of a BF16 matrix, coded losslessly.
//!
//! A BF16 value is two bytes, little-endian: the **low byte** (the exponent's last bit and the
//! seven mantissa bits) is close to uniformly distributed in trained and random weights alike
//! (7.97 bits of entropy measured, `docs/memory-plan.md`), so it is stored raw; the **high
//! byte** (sign and the exponent's top seven bits) takes few values — a matrix's weights span
//! a handful of binades — so it is coded with a per-block **dictionary**: the `2^w` most
//! frequent high bytes get `w`-bit codes, and the rare others are stored as exceptions
//! (position, byte). A block whose coding would not be smaller is stored raw. The choice of
//! this coding over Huffman or rANS is measured in `docs/memory-plan.md`: within 3–5 points of
//! the high byte's entropy, decoded with three byte shuffles per 64 values.
//!
//! Layout (little-endian), [`HEADER`] bytes then the body:
//!
//! ```text
//! 0   u8   kind        0 = raw, 1 = dictionary
//! 1   u8   width       dictionary: bits per code, 1..=6; raw: 0
//! 2   u16  reserved    0
//! 4   u32  values      n, the BF16 values the block decodes to (≤ 65,536)
//! 8   u32  exceptions  e (dictionary), 0 (raw)
//! 12  u32  reserved    0
//! 16  u64  check       [`checksum`] of bytes 0..16 and of the body
//! body, raw:        2n bytes, the stored BF16 bytes
//! body, dictionary: 2^w dictionary bytes (code k decodes to dict[k])
//!                   codes: n codes of w bits, least significant bit first, in
//!                          round_up(ceil(n·w / 8), 8) bytes (the padding is zero)
//!                   e exception positions, u16 each, strictly increasing, < n
//!                   e exception bytes (the high byte at that position; its code is 0)
//!                   n low bytes
//! ```
//!
//! Every field is checked before it is used: a damaged or forged block is refused with what
//! is wrong, never decoded into wrong bytes silently (the checksum) and never read out of
//! bounds (the lengths). The parser is fuzzed (`fuzz/`, target `pack_block`).

use super::simd::Path;

/// Bytes of a block's header.
pub const HEADER: usize = 24;

/// The most values one block holds: exception positions are u16.
pub const MAX_VALUES: usize = 1 << 16;

/// The widest dictionary code: a 64-entry table is what one byte shuffle looks up.
pub const MAX_WIDTH: u32 = 6;

const KIND_RAW: u8 = 0;
const KIND_DICT: u8 = 1;

/// Why a block was refused. The caller adds which file, tensor, block and offset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error("the block is {have} bytes, shorter than its {need}-byte {what}")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("unknown block kind {0} (0 = raw, 1 = dictionary)")]
    Kind(u8),
    #[error("dictionary code width {0} is outside 1..=6")]
    Width(u8),
    #[error("a raw block has width {0}, not 0")]
    RawWidth(u8),
    #[error("reserved header bytes are not zero")]
    Reserved,
    #[error("the block says {found} values where {expected} were expected")]
    Values { found: usize, expected: usize },
    #[error("{exceptions} exceptions in a block of {values} values")]
    Exceptions { exceptions: usize, values: usize },
    #[error("a raw block lists {0} exceptions")]
    RawExceptions(usize),
    #[error(
        "exception {index} at position {position} is not after the previous one, or not below {values}"
    )]
    ExceptionOrder {
        index: usize,
        position: usize,
        values: usize,
    },
    #[error("padding after the codes is not zero")]
    Padding,
    #[error(
        "checksum mismatch: the block's bytes are damaged (stored {stored:#018x}, computed {computed:#018x})"
    )]
    Checksum { stored: u64, computed: u64 },
    #[error("output space is {have} bytes, the block decodes to {need}")]
    Output { need: usize, have: usize },
}

/// The parsed header fields of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    kind: u8,
    width: u32,
    values: usize,
    exceptions: usize,
    check: u64,
}

/// Where each part of a dictionary block's body lies, relative to the block start.
#[derive(Debug, Clone, Copy)]
struct DictLayout {
    pub width: u32,
    pub values: usize,
    pub exceptions: usize,
    pub dict: usize,
    pub codes: usize,
    pub positions: usize,
    pub exception_bytes: usize,
    pub low: usize,
    pub end: usize,
}

impl DictLayout {
    fn new(width: u32, values: usize, exceptions: usize) -> DictLayout {
        let dict = HEADER;
        let codes = dict + (1usize << width);
        let positions = codes + codes_bytes(values, width);
        let exception_bytes = positions + 2 * exceptions;
        let low = exception_bytes + exceptions;
        DictLayout {
            width,
            values,
            exceptions,
            dict,
            codes,
            positions,
            exception_bytes,
            low,
            end: low + values,
        }
    }
}

/// Bytes of `values` codes of `width` bits, padded to a multiple of 8.
fn codes_bytes(values: usize, width: u32) -> usize {
    (values * width as usize).div_ceil(8).next_multiple_of(8)
}

/// The checksum of a block: two 64-bit sums per lane of eight (Fletcher's construction over
/// little-endian u64 words, word `i` into lane `i mod 8`: `a += w; b += a`), folded. It is
/// not cryptographic; it catches damaged bytes (any changed word changes `a`, any reordering
/// within a lane changes `b`) at a cost of two vector additions per 64 bytes. The tail (a
/// partial word) is zero-padded. `parts` are hashed as if concatenated.
pub fn checksum(path: Path, parts: &[&[u8]]) -> u64 {
    let mut state = Fletcher::default();
    for part in parts {
        state.update(path, part);
    }
    state.finish()
}

/// Running state of [`checksum`].
#[derive(Debug, Default, Clone)]
pub(super) struct Fletcher {
    pub a: [u64; 8],
    pub b: [u64; 8],
    /// Bytes of an incomplete 64-byte group carried to the next part.
    pending: Vec<u8>,
}

impl Fletcher {
    fn update(&mut self, path: Path, mut bytes: &[u8]) {
        if !self.pending.is_empty() {
            let take = (64 - self.pending.len()).min(bytes.len());
            self.pending.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.pending.len() == 64 {
                let group = std::mem::take(&mut self.pending);
                self.groups(path, &group);
            }
        }
        let whole = bytes.len() - bytes.len() % 64;
        self.groups(path, &bytes[..whole]);
        self.pending.extend_from_slice(&bytes[whole..]);
    }

    /// Whole 64-byte groups.
    fn groups(&mut self, path: Path, bytes: &[u8]) {
        debug_assert_eq!(bytes.len() % 64, 0);
        if !super::simd::fletcher_groups(path, self, bytes) {
            for group in bytes.chunks_exact(64) {
                for (k, word) in group.chunks_exact(8).enumerate() {
                    let w = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
                    self.a[k] = self.a[k].wrapping_add(w);
                    self.b[k] = self.b[k].wrapping_add(self.a[k]);
                }
            }
        }
    }

    fn finish(mut self) -> u64 {
        if !self.pending.is_empty() {
            let mut group = std::mem::take(&mut self.pending);
            group.resize(64, 0);
            // The padded group goes through the portable loop: one group, same arithmetic.
            self.groups(Path::Portable, &group);
        }
        let mut h = 0x243F_6A88_85A3_08D3u64;
        for k in 0..8 {
            for v in [self.a[k], self.b[k]] {
                h = (h ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                h ^= h >> 29;
            }
        }
        h
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn parse_header(block: &[u8]) -> Result<Header, BlockError> {
    if block.len() < HEADER {
        return Err(BlockError::Truncated {
            what: "header",
            need: HEADER,
            have: block.len(),
        });
    }
    if u16_at(block, 2) != 0 || u32_at(block, 12) != 0 {
        return Err(BlockError::Reserved);
    }
    Ok(Header {
        kind: block[0],
        width: u32::from(block[1]),
        values: u32_at(block, 4) as usize,
        exceptions: u32_at(block, 8) as usize,
        check: u64_at(block, 16),
    })
}

/// What a valid block is: its kind's layout, checked against `expected` values and the bytes
/// present. Returns the block's length. Does not verify the checksum or the exception order.
fn layout(block: &[u8], h: &Header, expected: usize) -> Result<Option<DictLayout>, BlockError> {
    if h.values != expected || h.values > MAX_VALUES {
        return Err(BlockError::Values {
            found: h.values,
            expected,
        });
    }
    let (need, dict) = match h.kind {
        KIND_RAW => {
            if h.width != 0 {
                return Err(BlockError::RawWidth(h.width as u8));
            }
            if h.exceptions != 0 {
                return Err(BlockError::RawExceptions(h.exceptions));
            }
            (HEADER + 2 * h.values, None)
        }
        KIND_DICT => {
            if !(1..=MAX_WIDTH).contains(&h.width) {
                return Err(BlockError::Width(h.width as u8));
            }
            if h.exceptions > h.values {
                return Err(BlockError::Exceptions {
                    exceptions: h.exceptions,
                    values: h.values,
                });
            }
            let l = DictLayout::new(h.width, h.values, h.exceptions);
            (l.end, Some(l))
        }
        other => return Err(BlockError::Kind(other)),
    };
    if block.len() < need {
        return Err(BlockError::Truncated {
            what: "body",
            need,
            have: block.len(),
        });
    }
    Ok(dict)
}

/// The length in bytes of the block at the start of `bytes`, which must decode to `expected`
/// values; checks the header only (for walking a file's blocks).
pub fn block_len(bytes: &[u8], expected: usize) -> Result<usize, BlockError> {
    let h = parse_header(bytes)?;
    Ok(match layout(bytes, &h, expected)? {
        Some(l) => l.end,
        None => HEADER + 2 * h.values,
    })
}

/// Decodes the block at the start of `block` — which must hold `expected` BF16 values — into
/// `out[..2·expected]` on `path`, after checking every field and the checksum. Returns the
/// block's length in bytes. `out` may not overlap `block`.
pub fn decode(
    path: Path,
    block: &[u8],
    expected: usize,
    out: &mut [u8],
) -> Result<usize, BlockError> {
    let h = parse_header(block)?;
    let dict = layout(block, &h, expected)?;
    let end = dict.map_or(HEADER + 2 * h.values, |l| l.end);
    let computed = checksum(path, &[&block[..16], &block[HEADER..end]]);
    if computed != h.check {
        return Err(BlockError::Checksum {
            stored: h.check,
            computed,
        });
    }
    if out.len() < 2 * h.values {
        return Err(BlockError::Output {
            need: 2 * h.values,
            have: out.len(),
        });
    }
    let out = &mut out[..2 * h.values];
    match dict {
        None => out.copy_from_slice(&block[HEADER..end]),
        Some(l) => decode_dict(path, &block[..end], &l, out)?,
    }
    Ok(end)
}

fn decode_dict(path: Path, block: &[u8], l: &DictLayout, out: &mut [u8]) -> Result<(), BlockError> {
    let codes = &block[l.codes..l.positions];
    let used = (l.values * l.width as usize).div_ceil(8);
    // Bits past the last code in its byte, and the padding bytes, must be zero: a canonical
    // encoding, so that damage there is refused like damage anywhere else.
    let tail_bits = (l.values * l.width as usize) % 8;
    if codes[used..].iter().any(|&b| b != 0)
        || (tail_bits != 0 && codes[used - 1] >> tail_bits != 0)
    {
        return Err(BlockError::Padding);
    }
    let mut previous: Option<usize> = None;
    for i in 0..l.exceptions {
        let position = u16_at(block, l.positions + 2 * i) as usize;
        if position >= l.values || previous.is_some_and(|p| position <= p) {
            return Err(BlockError::ExceptionOrder {
                index: i,
                position,
                values: l.values,
            });
        }
        previous = Some(position);
    }
    let mut table = [0u8; 64];
    let entries = 1usize << l.width;
    for (k, t) in table.iter_mut().enumerate() {
        *t = block[l.dict + k % entries];
    }
    let low = &block[l.low..l.end];
    super::simd::expand(path, codes, l.width, &table, low, out);
    for i in 0..l.exceptions {
        let position = u16_at(block, l.positions + 2 * i) as usize;
        out[2 * position + 1] = block[l.exception_bytes + i];
    }
    Ok(())
}

/// The portable expansion: value `i` is `low[i]`, then `table[code i]`.
pub(super) fn expand_portable(
    codes: &[u8],
    width: u32,
    table: &[u8; 64],
    low: &[u8],
    out: &mut [u8],
) {
    let mask = (1u64 << width) - 1;
    let (mut bits, mut have, mut next) = (0u64, 0u32, 0usize);
    for (i, &lo) in low.iter().enumerate() {
        if have < width {
            // Refill a byte at a time; `codes` holds at least ceil(n·w/8) bytes.
            while have <= 56 && next < codes.len() {
                bits |= u64::from(codes[next]) << have;
                have += 8;
                next += 1;
            }
        }
        let code = (bits & mask) as usize;
        bits >>= width;
        have = have.saturating_sub(width);
        out[2 * i] = lo;
        out[2 * i + 1] = table[code];
    }
}

/// Encodes `raw` (2n bytes of BF16, n ≤ [`MAX_VALUES`]) as one block appended to `out`: the
/// smallest of the raw form and the dictionary forms of widths 1..=6. Deterministic: the same
/// bytes always give the same block.
pub fn encode(raw: &[u8], out: &mut Vec<u8>) {
    assert!(
        raw.len().is_multiple_of(2) && raw.len() / 2 <= MAX_VALUES,
        "a block holds at most {MAX_VALUES} BF16 values"
    );
    let n = raw.len() / 2;
    let mut count = [0usize; 256];
    for pair in raw.chunks_exact(2) {
        count[pair[1] as usize] += 1;
    }
    // Most frequent first, ties to the smaller byte.
    let mut order: Vec<u8> = (0..=255u8).collect();
    order.sort_by_key(|&b| (std::cmp::Reverse(count[b as usize]), b));
    let mut best: Option<(usize, u32)> = None;
    for width in 1..=MAX_WIDTH {
        let covered: usize = order[..1usize << width]
            .iter()
            .map(|&b| count[b as usize])
            .sum();
        let size = DictLayout::new(width, n, n - covered).end;
        if best.is_none_or(|(s, _)| size < s) {
            best = Some((size, width));
        }
    }
    let start = out.len();
    match best {
        Some((size, width)) if size < HEADER + raw.len() => {
            let entries = 1usize << width;
            let mut code_of = [None::<u8>; 256];
            for (k, &b) in order[..entries].iter().enumerate() {
                code_of[b as usize] = Some(k as u8);
            }
            let covered: usize = order[..entries].iter().map(|&b| count[b as usize]).sum();
            let l = DictLayout::new(width, n, n - covered);
            out.resize(start + l.end, 0);
            let block = &mut out[start..];
            block[0] = KIND_DICT;
            block[1] = width as u8;
            block[4..8].copy_from_slice(&(n as u32).to_le_bytes());
            block[8..12].copy_from_slice(&(l.exceptions as u32).to_le_bytes());
            block[l.dict..l.dict + entries].copy_from_slice(&order[..entries]);
            let mut exception = 0;
            for (i, pair) in raw.chunks_exact(2).enumerate() {
                let code = match code_of[pair[1] as usize] {
                    Some(c) => c,
                    None => {
                        block[l.positions + 2 * exception..l.positions + 2 * exception + 2]
                            .copy_from_slice(&(i as u16).to_le_bytes());
                        block[l.exception_bytes + exception] = pair[1];
                        exception += 1;
                        0
                    }
                };
                let bit = i * width as usize;
                let v = u16::from(code) << (bit % 8);
                block[l.codes + bit / 8] |= v as u8;
                if bit % 8 + width as usize > 8 {
                    block[l.codes + bit / 8 + 1] |= (v >> 8) as u8;
                }
                block[l.low + i] = pair[0];
            }
        }
        _ => {
            out.resize(start + HEADER, 0);
            out.extend_from_slice(raw);
            out[start + 4..start + 8].copy_from_slice(&(n as u32).to_le_bytes());
        }
    }
    let block = &mut out[start..];
    let check = checksum(Path::Portable, &[&block[..16], &block[HEADER..]]);
    block[16..24].copy_from_slice(&check.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// BF16 bytes of `n` Gaussian-ish values of standard deviation `std`.
    pub(crate) fn weights(seed: u64, n: usize, std: f64) -> Vec<u8> {
        let mut rng = Rng::new(seed);
        let mut out = Vec::with_capacity(2 * n);
        while out.len() < 2 * n {
            let (a, b) = rng.normal_pair();
            for v in [a, b] {
                if out.len() < 2 * n {
                    out.extend_from_slice(&half::bf16::from_f64(v * std).to_le_bytes());
                }
            }
        }
        out
    }

    fn round_trip(raw: &[u8]) -> Vec<u8> {
        let mut block = Vec::new();
        encode(raw, &mut block);
        for path in Path::all_supported() {
            let mut out = vec![0u8; raw.len()];
            let len = decode(path, &block, raw.len() / 2, &mut out).expect("decodes");
            assert_eq!(len, block.len(), "{path:?}");
            assert_eq!(out, raw, "{path:?}");
        }
        block
    }

    #[test]
    fn gaussian_weights_round_trip_and_shrink() {
        for n in [1, 7, 63, 64, 65, 1000, 28672, MAX_VALUES] {
            let raw = weights(n as u64, n, 0.02);
            let block = round_trip(&raw);
            if n >= 1000 {
                assert!(
                    block.len() * 100 < raw.len() * 75,
                    "n {n}: {} of {}",
                    block.len(),
                    raw.len()
                );
            }
        }
    }

    #[test]
    fn incompressible_bytes_are_stored_raw() {
        let mut rng = Rng::new(7);
        let raw: Vec<u8> = (0..20000).map(|_| rng.next_u64() as u8).collect();
        let block = round_trip(&raw);
        assert_eq!(block[0], KIND_RAW);
        assert_eq!(block.len(), HEADER + raw.len());
    }

    #[test]
    fn every_width_round_trips() {
        // k distinct high bytes for k = 1 … 70: widths 1–6 with and without exceptions.
        for k in 1..=70usize {
            let raw: Vec<u8> = (0..5000usize)
                .flat_map(|i| [(i * 31) as u8, (i * 7 % k) as u8 ^ 0x3c])
                .collect();
            round_trip(&raw);
        }
    }

    #[test]
    fn damage_is_refused() {
        let raw = weights(3, 4096, 0.02);
        let mut block = Vec::new();
        encode(&raw, &mut block);
        let mut out = vec![0u8; raw.len()];
        for at in [0, 1, 4, 9, 17, 30, block.len() / 2, block.len() - 1] {
            let mut bad = block.clone();
            bad[at] ^= 0x10;
            for path in Path::all_supported() {
                assert!(
                    decode(path, &bad, 4096, &mut out).is_err(),
                    "byte {at} {path:?}"
                );
            }
        }
        assert!(matches!(
            decode(Path::Portable, &block[..block.len() - 1], 4096, &mut out),
            Err(BlockError::Truncated { .. })
        ));
        assert!(matches!(
            decode(Path::Portable, &block, 4095, &mut out),
            Err(BlockError::Values { .. })
        ));
    }

    #[test]
    fn checksum_paths_agree() {
        let mut rng = Rng::new(11);
        let bytes: Vec<u8> = (0..1000).map(|_| rng.next_u64() as u8).collect();
        for split in [0, 1, 63, 64, 65, 500, 999, 1000] {
            let (a, b) = bytes.split_at(split);
            let whole = checksum(Path::Portable, &[&bytes]);
            for path in Path::all_supported() {
                assert_eq!(checksum(path, &[a, b]), whole, "split {split} {path:?}");
            }
        }
    }
}
