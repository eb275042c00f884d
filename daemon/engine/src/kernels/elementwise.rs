//! Elementwise functions (spec §4.1, §6.1 rule 6): evaluated in f64 with the pure-Rust `libm`
//! (never the platform libm, never a SIMD approximation) and rounded to f32 once. The slice
//! form of SiTU-GLU evaluates libm's own algorithms on vector lanes ([`super::exp`],
//! [`super::tanh`]): the same operations in the same order, so the same bits.

use rayon::prelude::*;

use super::exp::{self, LANES};
use super::isa::{Isa, IsaKind};
use super::tanh;

/// Elements from which [`situ_glu_into`] splits its slices among the rayon pool's threads.
/// Each element is independent, so the split changes no bit; a prefill's MLP calls (a routed
/// expert's `tokens × 3,072` elements, a dense layer's `tokens × 33,792`) would otherwise run
/// on one core while the other waits (issue 30), and decode's one-token calls stay on the
/// calling thread.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 14;
/// Elements per parallel piece (a multiple of [`LANES`]).
const PIECE: usize = 1 << 12;

/// σ(x) = 1 / (1 + e^(−x)), in f64.
#[inline]
pub fn sigmoid(x: f64) -> f64 {
    sigmoid_of(libm::exp(-x))
}

/// σ from its exponential e^(−x): the one formula the scalar functions and the callers that
/// compute their exponentials on vector lanes ([`exp::exp_in_place`]) round alike.
#[inline(always)]
pub fn sigmoid_of(exp_minus_x: f64) -> f64 {
    1.0 / (1.0 + exp_minus_x)
}

/// SiLU(x) = x·σ(x), rounded to f32.
#[inline]
pub fn silu(x: f32) -> f32 {
    silu_of(x, libm::exp(-(x as f64)))
}

/// SiLU from x and e^(−x) (what [`silu`] and [`silu_in_place`] share).
#[inline(always)]
fn silu_of(x: f32, exp_minus_x: f64) -> f32 {
    (x as f64 * sigmoid_of(exp_minus_x)) as f32
}

/// Applies [`silu`] to every element in place, with its bits: the sigmoid's `exp` runs on
/// vector lanes ([`exp::exp_in_place`]: libm's bits), the rest as [`silu`] writes it.
pub fn silu_in_place(xs: &mut [f32]) {
    let mut e: Vec<f64> = xs.iter().map(|&x| -(x as f64)).collect();
    exp::exp_in_place(&mut e);
    for (x, &e) in xs.iter_mut().zip(&e) {
        *x = silu_of(*x, e);
    }
}

/// SiTU-GLU(g, u) = β₁·tanh(g/β₁)·σ(g) · β₂·tanh(u/β₂) (spec §4.1): σ takes the **uncapped**
/// gate; one rounding at the end.
#[inline]
pub fn situ_glu(g: f32, u: f32, beta1: f64, beta2: f64) -> f32 {
    let g = g as f64;
    let u = u as f64;
    situ_glu_of(
        libm::tanh(g / beta1),
        libm::exp(-g),
        libm::tanh(u / beta2),
        beta1,
        beta2,
    )
}

/// SiTU-GLU from its three transcendental parts, tanh(g/β₁), e^(−g) and tanh(u/β₂): the one
/// formula both the scalar function and the lanes round, so they cannot drift apart.
#[inline(always)]
fn situ_glu_of(tanh_g: f64, exp_minus_g: f64, tanh_u: f64, beta1: f64, beta2: f64) -> f32 {
    let a = beta1 * tanh_g * sigmoid_of(exp_minus_g);
    let c = beta2 * tanh_u;
    (a * c) as f32
}

/// Applies [`situ_glu`] pairwise: `out[i] = SiTU-GLU(gate[i], up[i])`, with its bits.
pub fn situ_glu_into(gate: &[f32], up: &[f32], beta1: f64, beta2: f64, out: &mut [f32]) {
    situ_glu_into_with(Isa::detect(), gate, up, beta1, beta2, out)
}

/// [`situ_glu_into`] on a chosen path; every path gives the bits of [`situ_glu`].
pub fn situ_glu_into_with(
    isa: Isa,
    gate: &[f32],
    up: &[f32],
    beta1: f64,
    beta2: f64,
    out: &mut [f32],
) {
    assert!(
        gate.len() == up.len() && up.len() == out.len(),
        "situ_glu length mismatch"
    );
    if out.len() < PARALLEL_MIN_ELEMENTS {
        return situ_on(isa, gate, up, beta1, beta2, out);
    }
    out.par_chunks_mut(PIECE)
        .zip(gate.par_chunks(PIECE).zip(up.par_chunks(PIECE)))
        .for_each(|(out, (gate, up))| situ_on(isa, gate, up, beta1, beta2, out));
}

/// [`situ_glu_into_with`] on the calling thread.
fn situ_on(isa: Isa, gate: &[f32], up: &[f32], beta1: f64, beta2: f64, out: &mut [f32]) {
    match isa.kind() {
        // SAFETY: an `Isa` of kind Avx512 is only constructed after `IsaKind::is_supported`
        // detected AVX-512F, AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx512 => unsafe { situ_avx512(gate, up, beta1, beta2, out) },
        // SAFETY: an `Isa` of kind Avx2 is only constructed after `IsaKind::is_supported`
        // detected AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx2 => unsafe { situ_avx2(gate, up, beta1, beta2, out) },
        _ => situ_steps(gate, up, beta1, beta2, out),
    }
}

/// # Safety
/// The running CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn situ_avx512(gate: &[f32], up: &[f32], beta1: f64, beta2: f64, out: &mut [f32]) {
    situ_steps(gate, up, beta1, beta2, out)
}

/// # Safety
/// The running CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn situ_avx2(gate: &[f32], up: &[f32], beta1: f64, beta2: f64, out: &mut [f32]) {
    situ_steps(gate, up, beta1, beta2, out)
}

/// Whole steps of [`LANES`] elements on the lanes when every argument is in their domain
/// (`−g` within exp's, `g/β₁` and `u/β₂` within tanh's), the rest one by one through
/// [`situ_glu`]. Inlined into each target-feature wrapper, as [`exp::exp_in_place`]'s steps.
#[inline(always)]
fn situ_steps(gate: &[f32], up: &[f32], beta1: f64, beta2: f64, out: &mut [f32]) {
    let mut outs = out.chunks_exact_mut(LANES);
    let mut pairs = gate.chunks_exact(LANES).zip(up.chunks_exact(LANES));
    for (o, (g, u)) in (&mut outs).zip(&mut pairs) {
        let g: [f64; LANES] = std::array::from_fn(|i| g[i] as f64);
        let u: [f64; LANES] = std::array::from_fn(|i| u[i] as f64);
        let minus_g = g.map(|g| -g);
        let capped_g = g.map(|g| g / beta1);
        let capped_u = u.map(|u| u / beta2);
        let on_lanes = minus_g.iter().all(|&v| (exp::LOW..=exp::HIGH).contains(&v))
            && capped_g
                .iter()
                .chain(&capped_u)
                .all(|&v| tanh::in_domain(v));
        if !on_lanes {
            for (i, o) in o.iter_mut().enumerate() {
                *o = situ_glu(g[i] as f32, u[i] as f32, beta1, beta2);
            }
            continue;
        }
        let (e, tg, tu) = (
            exp::lanes(minus_g),
            tanh::lanes(capped_g),
            tanh::lanes(capped_u),
        );
        for i in 0..LANES {
            o[i] = situ_glu_of(tg[i], e[i], tu[i], beta1, beta2);
        }
    }
    let done = gate.len() - gate.len() % LANES;
    for ((o, &g), &u) in outs
        .into_remainder()
        .iter_mut()
        .zip(&gate[done..])
        .zip(&up[done..])
    {
        *o = situ_glu(g, u, beta1, beta2);
    }
}

#[cfg(test)]
mod tests {
    use super::super::exp::xorshift;
    use super::*;

    /// Every path against [`situ_glu`] element by element, bit for bit (NaN as NaN).
    fn check(gate: &[f32], up: &[f32], beta1: f64, beta2: f64) {
        for isa in Isa::all_supported() {
            let mut out = vec![0.0f32; gate.len()];
            situ_glu_into_with(isa, gate, up, beta1, beta2, &mut out);
            for ((&g, &u), &y) in gate.iter().zip(up).zip(&out) {
                let want = situ_glu(g, u, beta1, beta2);
                // A NaN is a NaN: Rust (like IEEE 754) leaves a NaN result's sign and payload
                // to the code generated, which differs between target-feature builds.
                assert!(
                    y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                    "{isa:?}: SiTU-GLU({g:e}, {u:e}) = {y:e}, scalar {want:e}"
                );
            }
        }
    }

    /// The high halves of an xorshift stream.
    fn stream(seed: u64) -> impl FnMut() -> u32 {
        let mut next = xorshift(seed);
        move || (next() >> 32) as u32
    }

    #[test]
    fn activations_of_every_magnitude_match_the_scalar_function() {
        // Random f32 bit patterns (every exponent, ±∞, NaN) and values where an MLP's
        // projections lie, at the released caps and at others; 1,000,003 so a tail remains.
        let mut next = stream(0x9e37_79b9_7f4a_7c15);
        let mut unit = stream(0x6a09_e667_f3bc_c908);
        let n = 1_000_003;
        let bits: Vec<f32> = (0..2 * n).map(|_| f32::from_bits(next())).collect();
        let near: Vec<f32> = (0..2 * n)
            .map(|_| (unit() as f64 / u32::MAX as f64 * 120.0 - 60.0) as f32)
            .collect();
        for (beta1, beta2) in [(4.0, 25.0), (1.0, 1.0), (0.3, 1e6)] {
            check(&bits[..n], &bits[n..], beta1, beta2);
            check(&near[..n], &near[n..], beta1, beta2);
        }
    }

    #[test]
    fn silu_in_place_matches_the_scalar_function() {
        // Random f32 bit patterns (every exponent, ±∞, NaN), values where a short conv's sums
        // lie, and exp's lane bounds ±708 with their neighbours.
        let mut next = stream(0xbb67_ae85_84ca_a73b);
        let mut unit = stream(0x3c6e_f372_fe94_f82b);
        let mut xs: Vec<f32> = (0..1_000_003).map(|_| f32::from_bits(next())).collect();
        xs.extend((0..1_000_003).map(|_| (unit() as f64 / u32::MAX as f64 * 60.0 - 30.0) as f32));
        for at in [708.0f32, -708.0] {
            xs.extend((0..16).map(|k| f32::from_bits(at.to_bits() - 8 + k)));
        }
        let mut ys = xs.clone();
        silu_in_place(&mut ys);
        for (&x, &y) in xs.iter().zip(&ys) {
            assert_eq!(
                y.to_bits(),
                silu(x).to_bits(),
                "silu({x:e}) = {y:e}, scalar {:e}",
                silu(x)
            );
        }
    }

    #[test]
    fn gates_at_the_sigmoids_domain_edge_match_the_scalar_function() {
        // −g at exp's lane bounds ±708 and its neighbours, mixed into steps of ordinary values.
        let mut gate = Vec::new();
        for at in [708.0f32, -708.0] {
            let mut v = at;
            for _ in 0..8 {
                gate.extend([v, 1.0, -2.0, 0.5]);
                v = f32::from_bits(v.to_bits() + 1);
            }
            let mut v = at;
            for _ in 0..8 {
                gate.extend([v, 1.0, -2.0, 0.5]);
                v = f32::from_bits(v.to_bits() - 1);
            }
        }
        gate.extend([
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            1e-45,
            20.0,
            -20.0,
        ]);
        let up: Vec<f32> = gate.iter().rev().copied().collect();
        check(&gate, &up, 4.0, 25.0);
    }
}
