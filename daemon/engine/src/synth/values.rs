//! Tensor element values as stored bytes. A tensor's elements are cut into chunks of
//! [`CHUNK`] elements and each chunk draws from its own stream, seeded by (checkpoint seed,
//! tensor name, chunk index): output is independent of the order and the thread that
//! generates the chunks.

use super::tensors::{Init, Tensor};
use crate::checkpoint::safetensors::Dtype;
use crate::rng::{Rng, derive_seed, fnv1a64};

/// Elements per independent stream (even, so Box–Muller pairs never straddle chunks).
pub const CHUNK: u64 = 1 << 16;

/// The per-tensor seed: every tensor of a checkpoint gets an unrelated stream family.
pub fn tensor_seed(seed: u64, name: &str) -> u64 {
    derive_seed(&[seed, fnv1a64(name.as_bytes())])
}

/// Appends the stored bytes of elements `[first, first + n)` of `t` to `out`. `first` must be
/// a multiple of [`CHUNK`] and `n ≤ CHUNK` (one chunk per call).
pub fn chunk_bytes(t: &Tensor, tseed: u64, first: u64, n: usize, out: &mut Vec<u8>) {
    let mut rng = Rng::new(derive_seed(&[tseed, first / CHUNK]));
    match t.init {
        Init::Bytes => {
            out.extend((0..n).map(|_| (rng.next_u64() >> 56) as u8));
        }
        Init::ScaleBytes { lo, span } => {
            out.extend((0..n).map(|_| lo + (rng.next_u64() % u64::from(span)) as u8));
        }
        Init::Normal { std } => {
            let mut i = 0;
            while i < n {
                let (a, b) = rng.normal_pair();
                push_float(t.spec.dtype, a * std, out);
                if i + 1 < n {
                    push_float(t.spec.dtype, b * std, out);
                }
                i += 2;
            }
        }
        Init::Uniform { lo, hi } => {
            for _ in 0..n {
                push_float(t.spec.dtype, lo + (hi - lo) * rng.next_f64(), out);
            }
        }
        Init::LogUniformPadded { live } => {
            for k in 0..n as u64 {
                let idx = first + k;
                let v = if idx < live as u64 {
                    libm::log(1.0 + 15.0 * rng.next_f64())
                } else {
                    0.0
                };
                push_float(t.spec.dtype, v, out);
            }
        }
    }
}

/// One value in the tensor's float dtype, little-endian. BF16 rounds to nearest-even from f64
/// (`half`'s software conversion: identical on every platform).
fn push_float(dtype: Dtype, v: f64, out: &mut Vec<u8>) {
    match dtype {
        Dtype::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
        Dtype::Bf16 => out.extend_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
        Dtype::F16 => out.extend_from_slice(&half::f16::from_f64(v).to_le_bytes()),
        // Unreachable for inventories: U8 tensors always carry byte inits (tested in
        // inventory.rs). Kept total so that every element still yields exactly one byte.
        Dtype::U8 => out.push(v as u8),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::checkpoint::safetensors::TensorSpec;

    fn spec(dtype: Dtype, n: u64, init: Init) -> Tensor {
        Tensor {
            spec: TensorSpec {
                name: "t".into(),
                dtype,
                shape: vec![n],
            },
            init,
        }
    }

    #[test]
    fn scale_bytes_stay_in_range_and_cover_it() {
        let t = spec(Dtype::U8, 1000, Init::ScaleBytes { lo: 122, span: 4 });
        let mut out = Vec::new();
        chunk_bytes(&t, 1, 0, 1000, &mut out);
        assert_eq!(out.len(), 1000);
        for b in 122..=125u8 {
            assert!(out.contains(&b));
        }
        assert!(out.iter().all(|b| (122..=125).contains(b)));
    }

    #[test]
    fn a_log_is_padded_with_zeros() {
        let t = spec(Dtype::F32, 8, Init::LogUniformPadded { live: 4 });
        let mut out = Vec::new();
        chunk_bytes(&t, 1, 0, 8, &mut out);
        let v: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert!(v[..4].iter().all(|&x| (0.0..=16f32.ln()).contains(&x)));
        assert!(v[4..].iter().all(|&x| x == 0.0));
    }

    #[test]
    fn odd_lengths_and_chunks_are_reproducible() {
        let t = spec(Dtype::Bf16, 7, Init::Normal { std: 1.0 });
        let (mut a, mut b) = (Vec::new(), Vec::new());
        chunk_bytes(&t, 9, 0, 7, &mut a);
        chunk_bytes(&t, 9, 0, 7, &mut b);
        assert_eq!(a.len(), 14);
        assert_eq!(a, b);
        let mut c = Vec::new();
        chunk_bytes(&t, 9, CHUNK, 7, &mut c);
        assert_ne!(a, c);
    }
}
